// LoadConfig / LoadConfigFromString: YAML text → `base:` includes → `--set` overrides →
// `${ENV}` expansion → typed Config → ResolveConfig.
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <yaml-cpp/yaml.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "slime/config/config.h"
#include "slime/config/fields.h"
#include "yaml_values.h"

namespace slime::config {
namespace {

namespace fs = std::filesystem;
using internal::DescribeNode;

// Files currently being loaded, outermost first (for cycle detection and messages).
using IncludeChain = std::vector<std::string>;

StatusOr<YAML::Node> ParseYaml(const std::string& text, const std::string& origin) {
  try {
    return YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    return absl::InvalidArgumentError(fmt::format("{}: YAML syntax error at line {}, column {}: {}",
                                                  origin, e.mark.line + 1, e.mark.column + 1,
                                                  e.msg));
  }
}

StatusOr<std::string> ReadFile(const fs::path& path, const std::string& what) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    return absl::NotFoundError(
        fmt::format("{} '{}' does not exist or is not a file", what, path.string()));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(fmt::format("{} '{}' cannot be opened", what, path.string()));
  }
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Expands ${VAR} and ${VAR:-default}; "$${" is a literal "${". `where` names the key.
StatusOr<std::string> Expand(const std::string& text, const std::string& where) {
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    if (text.compare(i, 3, "$${") == 0) {
      out += "${";
      i += 3;
      continue;
    }
    if (text.compare(i, 2, "${") != 0) {
      out += text[i++];
      continue;
    }
    size_t close = text.find('}', i + 2);
    if (close == std::string::npos) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: unterminated '${{' in '{}' (write $${{ for a literal '${{')", where, text));
    }
    std::string inner = text.substr(i + 2, close - i - 2);
    std::optional<std::string> fallback;
    size_t sep = inner.find(":-");
    std::string name = inner.substr(0, sep);
    if (sep != std::string::npos) fallback = inner.substr(sep + 2);
    bool valid = !name.empty() && !std::isdigit(static_cast<unsigned char>(name[0]));
    for (char c : name) valid = valid && (std::isalnum(static_cast<unsigned char>(c)) || c == '_');
    if (!valid) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: '${{{}}}' is not a valid reference; use ${{NAME}} or ${{NAME:-default}} with "
          "NAME made of letters, digits and '_'",
          where, inner));
    }
    const char* env = std::getenv(name.c_str());
    if (fallback.has_value()) {
      out += (env != nullptr && *env != '\0') ? std::string(env) : *fallback;
    } else if (env != nullptr) {
      out += env;
    } else {
      return absl::InvalidArgumentError(fmt::format(
          "{}: environment variable '{}' is not set (use ${{{}:-default}} to give a default)",
          where, name, name));
    }
    i = close + 1;
  }
  return out;
}

// Expands every scalar below `node`, except keys overridden with --set.
Status ExpandTree(YAML::Node node, const std::string& path, const std::set<std::string>& skip) {
  if (skip.count(path) > 0) return absl::OkStatus();
  if (node.IsScalar()) {
    const std::string text = node.Scalar();
    if (text.find('$') == std::string::npos) return absl::OkStatus();
    SLIME_ASSIGN_OR_RETURN(std::string expanded, Expand(text, path));
    if (expanded != text) node = expanded;
    return absl::OkStatus();
  }
  if (node.IsSequence()) {
    for (size_t i = 0; i < node.size(); ++i) {
      SLIME_RETURN_IF_ERROR(ExpandTree(node[i], fmt::format("{}[{}]", path, i), skip));
    }
  } else if (node.IsMap()) {
    for (auto it = node.begin(); it != node.end(); ++it) {
      std::string key = it->first.IsScalar() ? it->first.Scalar() : "?";
      SLIME_RETURN_IF_ERROR(ExpandTree(it->second, path.empty() ? key : path + "." + key, skip));
    }
  }
  return absl::OkStatus();
}

// `over` deep-merged onto `base`: mappings merge key by key, anything else is replaced.
YAML::Node Merge(const YAML::Node& base, const YAML::Node& over) {
  if (!base.IsMap() || !over.IsMap()) return YAML::Clone(over);
  YAML::Node out = YAML::Clone(base);
  for (const auto& kv : over) {
    std::string key = kv.first.Scalar();
    YAML::Node existing = out[key];
    if (existing.IsDefined() && existing.IsMap() && kv.second.IsMap()) {
      out[key] = Merge(existing, kv.second);
    } else {
      out[key] = YAML::Clone(kv.second);
    }
  }
  return out;
}

std::string ChainText(const IncludeChain& chain, const std::string& last) {
  std::string text;
  for (const auto& file : chain) text += file + " -> ";
  return text + last;
}

// Parses `text` (from `origin`, whose relative `base:` paths start at `dir`) and everything it
// includes, into one merged mapping without `base` keys.
StatusOr<YAML::Node> LoadTree(const std::string& text, const fs::path& dir,
                              const std::string& origin, IncludeChain* chain) {
  SLIME_ASSIGN_OR_RETURN(YAML::Node root, ParseYaml(text, origin));
  if (!root.IsDefined() || root.IsNull()) return YAML::Node(YAML::NodeType::Map);
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: the top level must be a mapping of sections (cluster:, train:, ...), got {}", origin,
        DescribeNode(root)));
  }
  YAML::Node merged(YAML::NodeType::Map);
  const YAML::Node& const_root = root;  // const lookup: no placeholder entry for a missing key
  if (const_root["base"]) {
    YAML::Node base = const_root["base"];
    std::vector<std::string> bases;
    if (base.IsScalar()) {
      bases.push_back(base.Scalar());
    } else if (base.IsSequence()) {
      for (size_t i = 0; i < base.size(); ++i) {
        if (!base[i].IsScalar()) {
          return absl::InvalidArgumentError(fmt::format("{}: base[{}] must be a file path, got {}",
                                                        origin, i, DescribeNode(base[i])));
        }
        bases.push_back(base[i].Scalar());
      }
    } else {
      return absl::InvalidArgumentError(
          fmt::format("{}: base must be a file path or a list of file paths, got {}", origin,
                      DescribeNode(base)));
    }
    root.remove("base");
    for (const std::string& raw : bases) {
      SLIME_ASSIGN_OR_RETURN(std::string expanded, Expand(raw, "base"));
      fs::path path = fs::path(expanded);
      if (path.is_relative()) path = dir / path;
      std::error_code ec;
      fs::path canonical = fs::weakly_canonical(path, ec);
      if (ec) canonical = path.lexically_normal();
      std::string key = canonical.string();
      for (const auto& open : *chain) {
        if (open == key) {
          return absl::InvalidArgumentError(
              fmt::format("config 'base' cycle: {}", ChainText(*chain, key)));
        }
      }
      SLIME_ASSIGN_OR_RETURN(
          std::string base_text,
          ReadFile(canonical, fmt::format("base config (included from {})", origin)));
      chain->push_back(key);
      auto tree = LoadTree(base_text, canonical.parent_path(), key, chain);
      chain->pop_back();
      if (!tree.ok()) return tree.status();
      merged = Merge(merged, *tree);
    }
  }
  return Merge(merged, root);
}

Status ApplyOverride(YAML::Node root, const std::string& arg, std::set<std::string>* overridden) {
  size_t eq = arg.find('=');
  std::string path = arg.substr(0, eq);
  size_t dot = path.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot == 0 || dot + 1 == path.size() ||
      path.find('.', dot + 1) != std::string::npos) {
    return absl::InvalidArgumentError(
        fmt::format("--set '{}': expected section.key=value (e.g. --set train.lr=1e-6)", arg));
  }
  std::string section = path.substr(0, dot);
  std::string key = path.substr(dot + 1);
  std::string text = arg.substr(eq + 1);
  bool known_section = false;
  for (const auto& info : ConfigSections()) known_section |= info.name == section;
  if (!known_section) {
    Status status = internal::UnknownSectionError(section);
    return absl::InvalidArgumentError(
        fmt::format("--set '{}': {}", arg, std::string(status.message())));
  }
  const FieldSpec<Config>* field = FindConfigField(section, key);
  if (field == nullptr) {
    Status status = internal::UnknownKeyError(section, key);
    return absl::InvalidArgumentError(
        fmt::format("--set '{}': {}", arg, std::string(status.message())));
  }
  YAML::Node value;
  bool parsed = true;
  try {
    value = YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    parsed = false;
    if (field->type != FieldType::kString) {
      return absl::InvalidArgumentError(
          fmt::format("--set '{}': the value is not valid YAML: {}", arg, e.msg));
    }
  }
  // A string key takes the text verbatim unless YAML reads it as a scalar; an empty value
  // unsets an optional key and empties a plain string key.
  if (field->type == FieldType::kString) {
    bool null = parsed && (!value.IsDefined() || value.IsNull());
    if (!parsed || (!null && !value.IsScalar()) || (null && !field->optional && text.empty())) {
      value = YAML::Node(text);
    }
  }
  const YAML::Node& const_root = root;
  if (!const_root[section] || !const_root[section].IsMap()) {
    root[section] = YAML::Node(YAML::NodeType::Map);
  }
  root[section][key] = value;
  overridden->insert(path);
  return absl::OkStatus();
}

// Converts the merged tree into `config`; collects every key error.
Status BuildConfig(const YAML::Node& root, const std::set<std::string>& overridden,
                   Config* config) {
  std::vector<std::string> errors;
  auto note = [&errors](const Status& status, const std::string& path,
                        const std::set<std::string>& from_set) {
    std::string message(status.message());
    if (from_set.count(path) > 0) message += " (from --set)";
    errors.push_back(std::move(message));
  };
  for (const auto& section_kv : root) {
    std::string name = section_kv.first.IsScalar() ? section_kv.first.Scalar() : "?";
    bool known = false;
    for (const auto& info : ConfigSections()) known |= info.name == name;
    if (!known) {
      errors.push_back(std::string(internal::UnknownSectionError(name).message()));
      continue;
    }
    const YAML::Node& section = section_kv.second;
    if (!section.IsDefined() || section.IsNull()) continue;
    if (!section.IsMap()) {
      errors.push_back(fmt::format("section '{}' must be a mapping of key: value, got {}", name,
                                   DescribeNode(section)));
      continue;
    }
    for (const auto& kv : section) {
      std::string key = kv.first.IsScalar() ? kv.first.Scalar() : "?";
      const FieldSpec<Config>* field = FindConfigField(name, key);
      if (field == nullptr) {
        errors.push_back(std::string(internal::UnknownKeyError(name, key).message()));
        continue;
      }
      std::string path = field->Path();
      auto value = internal::ParseFieldValue(*field, kv.second, path);
      if (!value.ok()) {
        note(value.status(), path, overridden);
        continue;
      }
      Status checked = CheckFieldValue(*field, *value, path);
      if (!checked.ok()) {
        note(checked, path, overridden);
        continue;
      }
      field->set(*config, *value);
    }
  }
  if (errors.empty()) return absl::OkStatus();
  if (errors.size() == 1) return absl::InvalidArgumentError(errors[0]);
  std::string message = fmt::format("{} configuration errors:", errors.size());
  for (const auto& error : errors) message += "\n  - " + error;
  return absl::InvalidArgumentError(message);
}

StatusOr<Config> LoadFromText(const std::string& text, const fs::path& dir,
                              const std::string& origin, IncludeChain chain,
                              const std::vector<std::string>& set_overrides,
                              std::vector<std::string>* warnings) {
  SLIME_ASSIGN_OR_RETURN(YAML::Node root, LoadTree(text, dir, origin, &chain));
  std::set<std::string> overridden;
  for (const std::string& arg : set_overrides) {
    SLIME_RETURN_IF_ERROR(ApplyOverride(root, arg, &overridden));
  }
  SLIME_RETURN_IF_ERROR(ExpandTree(root, "", overridden));
  Config config = DefaultConfig();
  SLIME_RETURN_IF_ERROR(BuildConfig(root, overridden, &config));
  std::vector<std::string> found;
  SLIME_RETURN_IF_ERROR(ResolveConfig(&config, &found));
  if (warnings != nullptr) {
    warnings->insert(warnings->end(), found.begin(), found.end());
  } else {
    for (const auto& warning : found) spdlog::warn("config: {}", warning);
  }
  return config;
}

}  // namespace

Config DefaultConfig() { return Config{}; }

StatusOr<Config> LoadConfig(const std::string& path, const std::vector<std::string>& set_overrides,
                            std::vector<std::string>* warnings) {
  SLIME_ASSIGN_OR_RETURN(std::string text, ReadFile(path, "config file"));
  std::error_code ec;
  fs::path canonical = fs::weakly_canonical(fs::path(path), ec);
  if (ec) canonical = fs::path(path).lexically_normal();
  return LoadFromText(text, canonical.parent_path(), path, IncludeChain{canonical.string()},
                      set_overrides, warnings);
}

StatusOr<Config> LoadConfigFromString(const std::string& yaml_text, const std::string& base_dir,
                                      const std::vector<std::string>& set_overrides,
                                      std::vector<std::string>* warnings) {
  return LoadFromText(yaml_text, fs::path(base_dir.empty() ? "." : base_dir), "<config text>",
                      IncludeChain{}, set_overrides, warnings);
}

}  // namespace slime::config
