#include "yaml_values.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "slime/common/strings.h"

namespace slime::config::internal {

std::string FormatDouble(double v) {
  if (std::isnan(v)) return ".nan";
  if (std::isinf(v)) return v > 0 ? ".inf" : "-.inf";
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

std::string DescribeNode(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) return "null";
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a mapping";
  return fmt::format("'{}'", node.Scalar());
}

namespace {

Status TypeError(const std::string& where, const YAML::Node& node, const std::string& expected) {
  return absl::InvalidArgumentError(
      fmt::format("{}: expected {}, got {}", where, expected, DescribeNode(node)));
}

StatusOr<bool> ParseBool(const YAML::Node& node, const std::string& where) {
  bool v = false;
  if (!node.IsScalar() || !YAML::convert<bool>::decode(node, v)) {
    return TypeError(where, node, "a bool (true or false)");
  }
  return v;
}

StatusOr<int64_t> ParseInt(const YAML::Node& node, const std::string& where) {
  if (!node.IsScalar()) return TypeError(where, node, "an integer");
  const std::string& text = node.Scalar();
  const char* begin = text.data();
  const char* end = text.data() + text.size();
  if (begin != end && *begin == '+') ++begin;
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(begin, end, v);
  if (ec == std::errc::result_out_of_range) {
    return absl::InvalidArgumentError(
        fmt::format("{}: '{}' does not fit a 64-bit integer", where, text));
  }
  if (ec != std::errc() || ptr != end || begin == end) {
    return TypeError(where, node, "an integer");
  }
  return v;
}

StatusOr<double> ParseDouble(const YAML::Node& node, const std::string& where) {
  if (!node.IsScalar()) return TypeError(where, node, "a number");
  const std::string& text = node.Scalar();
  if (text == ".inf" || text == "+.inf" || text == ".Inf" || text == ".INF") {
    return std::numeric_limits<double>::infinity();
  }
  if (text == "-.inf" || text == "-.Inf" || text == "-.INF") {
    return -std::numeric_limits<double>::infinity();
  }
  // strtod also accepts "nan", "inf" and hex floats; require a plain decimal literal.
  if (text.empty() || text.find_first_not_of("0123456789+-.eE") != std::string::npos) {
    return TypeError(where, node, "a number");
  }
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size()) return TypeError(where, node, "a number");
  if (std::isinf(v)) {
    return absl::InvalidArgumentError(fmt::format("{}: '{}' is too large", where, text));
  }
  return v;
}

StatusOr<std::string> ParseString(const YAML::Node& node, const std::string& where) {
  if (!node.IsScalar()) return TypeError(where, node, "a string");
  return node.Scalar();
}

// A sequence, or a single scalar taken as a one-element sequence.
std::vector<YAML::Node> ListItems(const YAML::Node& node) {
  std::vector<YAML::Node> items;
  if (node.IsSequence()) {
    for (const auto& item : node) items.push_back(item);
  } else {
    items.push_back(node);
  }
  return items;
}

StatusOr<std::vector<EvalDatasetConfig>> ParseDatasets(const YAML::Node& node,
                                                       const std::string& where) {
  if (!node.IsSequence()) {
    return TypeError(where, node, "a list of datasets ({name: ..., path: ..., ...})");
  }
  std::vector<std::string> keys;
  for (const auto& field : EvalDatasetFields()) keys.push_back(field.key);
  std::vector<EvalDatasetConfig> datasets;
  for (size_t i = 0; i < node.size(); ++i) {
    const YAML::Node entry = node[i];
    std::string at = fmt::format("{}[{}]", where, i);
    if (!entry.IsMap()) return TypeError(at, entry, "a mapping with at least name and path");
    EvalDatasetConfig dataset;
    for (const auto& kv : entry) {
      std::string key = kv.first.Scalar();
      const FieldSpec<EvalDatasetConfig>* spec = nullptr;
      for (const auto& field : EvalDatasetFields()) {
        if (field.key == key) spec = &field;
      }
      if (spec == nullptr) {
        std::string message = fmt::format("unknown key '{}.{}'", at, key);
        if (auto guess = ClosestMatch(key, keys)) {
          message += fmt::format("; did you mean '{}'?", *guess);
        }
        message += fmt::format(" Dataset keys: {}", JoinQuoted(keys));
        return absl::InvalidArgumentError(message);
      }
      std::string sub = fmt::format("{}.{}", at, key);
      SLIME_ASSIGN_OR_RETURN(FieldValue value, ParseFieldValue(*spec, kv.second, sub));
      SLIME_RETURN_IF_ERROR(CheckFieldValue(*spec, value, sub));
      spec->set(dataset, value);
    }
    for (const auto& field : EvalDatasetFields()) {
      SLIME_RETURN_IF_ERROR(
          CheckFieldValue(field, field.get(dataset), fmt::format("{}.{}", at, field.key)));
    }
    datasets.push_back(std::move(dataset));
  }
  return datasets;
}

}  // namespace

StatusOr<FieldValue> ParseFieldValue(const FieldInfo& field, const YAML::Node& node,
                                     const std::string& where) {
  if (!node.IsDefined() || node.IsNull()) {
    if (field.optional) return FieldValue(std::monostate{});
    return TypeError(where, node, FieldTypeName(field) + " (this key cannot be null)");
  }
  switch (field.type) {
    case FieldType::kBool: {
      SLIME_ASSIGN_OR_RETURN(bool v, ParseBool(node, where));
      return FieldValue(v);
    }
    case FieldType::kInt: {
      SLIME_ASSIGN_OR_RETURN(int64_t v, ParseInt(node, where));
      return FieldValue(v);
    }
    case FieldType::kDouble: {
      SLIME_ASSIGN_OR_RETURN(double v, ParseDouble(node, where));
      return FieldValue(v);
    }
    case FieldType::kString: {
      SLIME_ASSIGN_OR_RETURN(std::string v, ParseString(node, where));
      return FieldValue(std::move(v));
    }
    case FieldType::kStringList: {
      if (node.IsMap()) return TypeError(where, node, "a list of strings");
      std::vector<std::string> out;
      std::vector<YAML::Node> items = ListItems(node);
      for (size_t i = 0; i < items.size(); ++i) {
        SLIME_ASSIGN_OR_RETURN(std::string v,
                               ParseString(items[i], fmt::format("{}[{}]", where, i)));
        out.push_back(std::move(v));
      }
      return FieldValue(std::move(out));
    }
    case FieldType::kIntList: {
      if (node.IsMap()) return TypeError(where, node, "a list of integers");
      std::vector<int64_t> out;
      std::vector<YAML::Node> items = ListItems(node);
      for (size_t i = 0; i < items.size(); ++i) {
        SLIME_ASSIGN_OR_RETURN(int64_t v, ParseInt(items[i], fmt::format("{}[{}]", where, i)));
        out.push_back(v);
      }
      return FieldValue(std::move(out));
    }
    case FieldType::kStringMap: {
      if (!node.IsMap()) return TypeError(where, node, "a mapping of name: value");
      std::map<std::string, std::string> out;
      for (const auto& kv : node) {
        if (!kv.first.IsScalar()) return TypeError(where, kv.first, "scalar keys");
        std::string key = kv.first.Scalar();
        SLIME_ASSIGN_OR_RETURN(std::string v,
                               ParseString(kv.second, fmt::format("{}.{}", where, key)));
        out[key] = std::move(v);
      }
      return FieldValue(std::move(out));
    }
    case FieldType::kEvalDatasets: {
      SLIME_ASSIGN_OR_RETURN(std::vector<EvalDatasetConfig> v, ParseDatasets(node, where));
      return FieldValue(std::move(v));
    }
  }
  return absl::InternalError("unhandled field type");
}

namespace {

std::string EscapeInterpolation(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '$' && i + 1 < s.size() && s[i + 1] == '{') out += '$';
    out += s[i];
  }
  return out;
}

void EmitString(YAML::Emitter& out, const std::string& s) {
  out << YAML::DoubleQuoted << EscapeInterpolation(s);
}

}  // namespace

void EmitFieldValue(YAML::Emitter& out, const FieldValue& value) {
  if (std::holds_alternative<std::monostate>(value)) {
    out << YAML::Null;
  } else if (const auto* b = std::get_if<bool>(&value)) {
    out << *b;
  } else if (const auto* i = std::get_if<int64_t>(&value)) {
    out << static_cast<long long>(*i);
  } else if (const auto* d = std::get_if<double>(&value)) {
    out << FormatDouble(*d);
  } else if (const auto* s = std::get_if<std::string>(&value)) {
    EmitString(out, *s);
  } else if (const auto* list = std::get_if<std::vector<std::string>>(&value)) {
    out << YAML::Flow << YAML::BeginSeq;
    for (const auto& item : *list) EmitString(out, item);
    out << YAML::EndSeq;
  } else if (const auto* ints = std::get_if<std::vector<int64_t>>(&value)) {
    out << YAML::Flow << YAML::BeginSeq;
    for (int64_t item : *ints) out << static_cast<long long>(item);
    out << YAML::EndSeq;
  } else if (const auto* map = std::get_if<std::map<std::string, std::string>>(&value)) {
    out << YAML::Flow << YAML::BeginMap;
    for (const auto& [k, v] : *map) {
      out << YAML::Key;
      EmitString(out, k);
      out << YAML::Value;
      EmitString(out, v);
    }
    out << YAML::EndMap;
  } else if (const auto* datasets = std::get_if<std::vector<EvalDatasetConfig>>(&value)) {
    if (datasets->empty()) {
      out << YAML::Flow << YAML::BeginSeq << YAML::EndSeq;
      return;
    }
    out << YAML::BeginSeq;
    for (const auto& dataset : *datasets) {
      out << YAML::BeginMap;
      for (const auto& field : EvalDatasetFields()) {
        FieldValue v = field.get(dataset);
        if (std::holds_alternative<std::monostate>(v)) continue;
        out << YAML::Key << field.key << YAML::Value;
        EmitFieldValue(out, v);
      }
      out << YAML::EndMap;
    }
    out << YAML::EndSeq;
  }
}

std::string SuggestKey(const std::string& section, const std::string& key) {
  std::vector<std::string> same_section;
  std::vector<std::string> all_paths;
  std::string elsewhere;
  for (const auto& field : ConfigFields()) {
    if (field.section == section) same_section.push_back(field.key);
    if (field.section != section && field.key == key && elsewhere.empty()) {
      elsewhere = field.Path();
    }
    all_paths.push_back(field.Path());
  }
  if (auto guess = ClosestMatch(key, same_section)) return section + "." + *guess;
  if (!elsewhere.empty()) return elsewhere;
  if (auto guess = ClosestMatch(section + "." + key, all_paths)) return *guess;
  return "";
}

Status UnknownKeyError(const std::string& section, const std::string& key) {
  std::string message = fmt::format("unknown key '{}.{}'", section, key);
  std::string guess = SuggestKey(section, key);
  if (!guess.empty()) message += fmt::format("; did you mean '{}'?", guess);
  message += fmt::format(" (docs/config.md lists the keys of section '{}')", section);
  return absl::InvalidArgumentError(message);
}

Status UnknownSectionError(const std::string& name) {
  std::vector<std::string> names;
  for (const auto& section : ConfigSections()) names.push_back(section.name);
  std::string message = fmt::format("unknown section '{}'", name);
  if (auto guess = ClosestMatch(name, names)) {
    message += fmt::format("; did you mean '{}'?", *guess);
  } else {
    for (const auto& field : ConfigFields()) {
      if (field.key == name) {
        message +=
            fmt::format("; did you mean '{}' (keys belong inside their section)?", field.Path());
        break;
      }
    }
  }
  message += fmt::format(" Sections: {}", JoinQuoted(names));
  return absl::InvalidArgumentError(message);
}

}  // namespace slime::config::internal
