// The field tables (assembled from fields_*.cc) and the generic per-value checks and formatting.
#include "slime/config/fields.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <unordered_map>

#include "field_builder.h"
#include "slime/common/strings.h"
#include "yaml_values.h"

namespace slime::config {

const std::vector<SectionInfo>& ConfigSections() {
  static const std::vector<SectionInfo> kSections = {
      {"cluster",
       "Where processes run: nodes, GPUs or CPU slots, placement, colocation and "
       "offload."},
      {"model", "The model being trained."},
      {"rollout",
       "Generation on the inference engines: sampling, lengths, over-sampling, "
       "dynamic filtering and partial rollout."},
      {"data", "The prompt dataset and how many prompts and samples each rollout uses."},
      {"eval", "Periodic evaluation: datasets and their sampling parameters."},
      {"reward", "How samples are scored."},
      {"algorithm",
       "Advantage estimator, policy-loss terms, KL, importance sampling and "
       "distillation."},
      {"train",
       "Optimizer, learning-rate schedule, batching and model parallelism of the "
       "trainers."},
      {"weight_sync", "How updated weights travel from the trainers to the engines."},
      {"checkpoint", "Loading, saving and resuming."},
      {"metrics", "Where metrics go and which extra ones are computed."},
      {"fault_tolerance", "Engine health checks and restarts."},
      {"debug", "Partial runs, replay dumps, determinism, logging and CI assertions."},
  };
  return kSections;
}

const std::vector<FieldSpec<Config>>& ConfigFields() {
  static const std::vector<FieldSpec<Config>> kFields = [] {
    std::vector<FieldSpec<Config>> table;
    internal::AddClusterFields(&table);
    internal::AddModelFields(&table);
    internal::AddRolloutFields(&table);
    internal::AddDataFields(&table);
    internal::AddEvalFields(&table);
    internal::AddRewardFields(&table);
    internal::AddAlgorithmFields(&table);
    internal::AddTrainFields(&table);
    internal::AddWeightSyncFields(&table);
    internal::AddCheckpointFields(&table);
    internal::AddMetricsFields(&table);
    internal::AddFaultToleranceFields(&table);
    internal::AddDebugFields(&table);
    return table;
  }();
  return kFields;
}

const std::vector<FieldSpec<EvalDatasetConfig>>& EvalDatasetFields() {
  static const std::vector<FieldSpec<EvalDatasetConfig>> kFields = [] {
    std::vector<FieldSpec<EvalDatasetConfig>> table;
    internal::AddEvalDatasetFields(&table);
    return table;
  }();
  return kFields;
}

const FieldSpec<Config>* FindConfigField(std::string_view section, std::string_view key) {
  static const auto* kIndex = [] {
    auto* index = new std::unordered_map<std::string, const FieldSpec<Config>*>();
    for (const auto& field : ConfigFields()) (*index)[field.Path()] = &field;
    return index;
  }();
  std::string path = std::string(section) + "." + std::string(key);
  auto it = kIndex->find(path);
  return it == kIndex->end() ? nullptr : it->second;
}

namespace {

std::string FormatNumber(double v) { return internal::FormatDouble(v); }

std::string FormatString(const std::string& s) {
  static const std::vector<std::string> kAmbiguous = {"true", "false", "yes", "no", "on",
                                                      "off",  "null",  "~",   "y",  "n"};
  bool quote = s.empty() || s.front() == ' ' || s.back() == ' ' ||
               s.find_first_of("[]{},:#&*!|>'\"%@`") != std::string::npos;
  std::string lower = s;
  std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
  if (std::find(kAmbiguous.begin(), kAmbiguous.end(), lower) != kAmbiguous.end()) quote = true;
  if (!quote && !s.empty()) {
    char* end = nullptr;
    std::strtod(s.c_str(), &end);
    if (end != nullptr && *end == '\0') quote = true;  // looks like a number
  }
  if (!quote) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

bool InRange(const FieldInfo& field, double v) {
  if (field.min && (field.min->inclusive ? v < field.min->value : v <= field.min->value)) {
    return false;
  }
  if (field.max && (field.max->inclusive ? v > field.max->value : v >= field.max->value)) {
    return false;
  }
  return true;
}

Status RangeError(const FieldInfo& field, const std::string& where, const std::string& shown) {
  return absl::InvalidArgumentError(
      fmt::format("{} = {} is out of range; allowed: {}", where, shown, FormatRange(field)));
}

Status CheckInt(const FieldInfo& field, int64_t v, const std::string& where) {
  if (std::find(field.allowed_ints.begin(), field.allowed_ints.end(), v) !=
      field.allowed_ints.end()) {
    return absl::OkStatus();
  }
  if (v < field.int_min || v > field.int_max) {
    return absl::InvalidArgumentError(fmt::format(
        "{} = {} does not fit a 32-bit integer; allowed: {}", where, v,
        FormatRange(field).empty() ? fmt::format("[{}, {}]", field.int_min, field.int_max)
                                   : FormatRange(field)));
  }
  if (!InRange(field, static_cast<double>(v))) return RangeError(field, where, std::to_string(v));
  return absl::OkStatus();
}

Status CheckEnum(const FieldInfo& field, const std::string& v, const std::string& where) {
  if (field.allowed.empty()) return absl::OkStatus();
  std::string base = v;
  if (!field.allowed_prefix.empty() && base.rfind(field.allowed_prefix, 0) == 0) {
    base = base.substr(field.allowed_prefix.size());
  }
  if (std::find(field.allowed.begin(), field.allowed.end(), base) != field.allowed.end()) {
    return absl::OkStatus();
  }
  std::string message =
      fmt::format("{}: '{}' is not one of {}", where, v, JoinQuoted(field.allowed));
  if (!field.allowed_prefix.empty()) {
    message += fmt::format(" (optionally prefixed with '{}')", field.allowed_prefix);
  }
  if (auto guess = ClosestMatch(base, field.allowed)) {
    message += fmt::format("; did you mean '{}'?", *guess);
  }
  return absl::InvalidArgumentError(message);
}

}  // namespace

Status CheckFieldValue(const FieldInfo& field, const FieldValue& value, const std::string& where) {
  if (!field.refused.empty() && value != field.refused_default) {
    const bool unset = std::holds_alternative<std::monostate>(field.refused_default);
    return absl::InvalidArgumentError(fmt::format(
        "{} = {}: not supported ({}); remove the key or leave it {}", where,
        FormatFieldValue(value), field.refused,
        unset ? "unset" : "at its default " + FormatFieldValue(field.refused_default)));
  }
  if (std::holds_alternative<std::monostate>(value)) {
    if (field.optional) return absl::OkStatus();
    return absl::InvalidArgumentError(fmt::format("{} must be set (it cannot be null); expected {}",
                                                  where, FieldTypeName(field)));
  }
  if (field.required) {
    bool empty = false;
    if (const auto* s = std::get_if<std::string>(&value)) empty = s->empty();
    if (const auto* i = std::get_if<int64_t>(&value)) empty = *i == 0;
    if (empty) {
      std::string range = FormatRange(field);
      return absl::InvalidArgumentError(
          fmt::format("{} is required{}{}", where,
                      field.slime_flag.empty() || field.section.empty()
                          ? ""
                          : fmt::format(" (slime {})", field.slime_flag),
                      range.empty() ? "" : fmt::format("; allowed: {}", range)));
    }
  }
  switch (field.type) {
    case FieldType::kInt:
      return CheckInt(field, std::get<int64_t>(value), where);
    case FieldType::kIntList: {
      const auto& list = std::get<std::vector<int64_t>>(value);
      for (size_t i = 0; i < list.size(); ++i) {
        SLIME_RETURN_IF_ERROR(CheckInt(field, list[i], fmt::format("{}[{}]", where, i)));
      }
      return absl::OkStatus();
    }
    case FieldType::kDouble: {
      double v = std::get<double>(value);
      if (std::isnan(v)) {
        return absl::InvalidArgumentError(fmt::format("{} is NaN; expected a number", where));
      }
      if (!InRange(field, v)) return RangeError(field, where, FormatNumber(v));
      return absl::OkStatus();
    }
    case FieldType::kString:
      return CheckEnum(field, std::get<std::string>(value), where);
    case FieldType::kEvalDatasets: {
      const auto& datasets = std::get<std::vector<EvalDatasetConfig>>(value);
      for (size_t i = 0; i < datasets.size(); ++i) {
        for (const auto& sub : EvalDatasetFields()) {
          SLIME_RETURN_IF_ERROR(CheckFieldValue(sub, sub.get(datasets[i]),
                                                fmt::format("{}[{}].{}", where, i, sub.key)));
        }
      }
      return absl::OkStatus();
    }
    default:
      return absl::OkStatus();
  }
}

std::string FieldTypeName(const FieldInfo& field) {
  std::string name;
  switch (field.type) {
    case FieldType::kBool:
      name = "bool";
      break;
    case FieldType::kInt:
      name = "int";
      break;
    case FieldType::kDouble:
      name = "float";
      break;
    case FieldType::kString:
      name = field.allowed.empty() ? "string" : "enum";
      break;
    case FieldType::kStringList:
      name = "list<string>";
      break;
    case FieldType::kIntList:
      name = "list<int>";
      break;
    case FieldType::kStringMap:
      name = "map<string,string>";
      break;
    case FieldType::kEvalDatasets:
      name = "list<dataset>";
      break;
  }
  return field.optional ? name + "?" : name;
}

std::string FormatRange(const FieldInfo& field) {
  bool integral = field.type == FieldType::kInt || field.type == FieldType::kIntList;
  auto text = [integral](const Bound& b) {
    return integral ? std::to_string(static_cast<int64_t>(b.value)) : FormatNumber(b.value);
  };
  std::string range;
  if (field.min && field.max) {
    range = fmt::format("{}{}, {}{}", field.min->inclusive ? "[" : "(", text(*field.min),
                        text(*field.max), field.max->inclusive ? "]" : ")");
  } else if (field.min) {
    range = fmt::format("{} {}", field.min->inclusive ? ">=" : ">", text(*field.min));
  } else if (field.max) {
    range = fmt::format("{} {}", field.max->inclusive ? "<=" : "<", text(*field.max));
  }
  if (range.empty()) return range;
  for (int64_t sentinel : field.allowed_ints) range = fmt::format("{} or {}", sentinel, range);
  return range;
}

std::string FormatFieldValue(const FieldValue& value) {
  struct Visitor {
    std::string operator()(std::monostate) const { return "~"; }
    std::string operator()(bool v) const { return v ? "true" : "false"; }
    std::string operator()(int64_t v) const { return std::to_string(v); }
    std::string operator()(double v) const { return FormatNumber(v); }
    std::string operator()(const std::string& v) const { return FormatString(v); }
    std::string operator()(const std::vector<std::string>& v) const {
      std::string out = "[";
      for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + FormatString(v[i]);
      return out + "]";
    }
    std::string operator()(const std::vector<int64_t>& v) const {
      std::string out = "[";
      for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
      return out + "]";
    }
    std::string operator()(const std::map<std::string, std::string>& v) const {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, x] : v) {
        out += (first ? "" : ", ") + FormatString(k) + ": " + FormatString(x);
        first = false;
      }
      return out + "}";
    }
    std::string operator()(const std::vector<EvalDatasetConfig>& v) const {
      std::string out = "[";
      for (size_t i = 0; i < v.size(); ++i) {
        out += i ? ", {" : "{";
        bool first = true;
        for (const auto& field : EvalDatasetFields()) {
          FieldValue x = field.get(v[i]);
          if (std::holds_alternative<std::monostate>(x)) continue;
          out += (first ? "" : ", ") + field.key + ": " + FormatFieldValue(x);
          first = false;
        }
        out += "}";
      }
      return out + "]";
    }
  };
  return std::visit(Visitor{}, value);
}

}  // namespace slime::config
