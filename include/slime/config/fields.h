// The field table: every configuration key registered once, with its section, name, type,
// default, documentation, the slime flag it mirrors, its allowed values or numeric range, and
// accessors into the typed struct. YAML parsing, `--set` overrides, unknown-key detection,
// ToYaml and the Markdown reference are all driven by this table, so they cannot drift apart.
//
// Every field is either read (`read_by` names the modules whose code uses it; the ctest
// config_fields_test checks each claim with scripts/check_config_fields.py) or refused (any
// value but its default is an error naming the key and why: the feature is later work). A
// setting that is accepted but changes nothing cannot be added: config_test fails on a field
// that is neither.
//
// Two tables exist: ConfigFields() for `Config` (keys "section.key") and EvalDatasetFields()
// for the entries of `eval.datasets`. Both are built once, on first use, and are immutable
// afterwards; reading them from several threads is safe.
#ifndef SLIME_CONFIG_FIELDS_H_
#define SLIME_CONFIG_FIELDS_H_

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "slime/common/status.h"
#include "slime/config/config.h"

namespace slime::config {

enum class FieldType {
  kBool,
  kInt,
  kDouble,
  kString,
  kStringList,
  kIntList,
  kStringMap,
  kEvalDatasets,
};

// A field's value, independent of the struct it lives in. std::monostate = unset optional
// (YAML null, `~`).
using FieldValue = std::variant<std::monostate, bool, int64_t, double, std::string,
                                std::vector<std::string>, std::vector<int64_t>,
                                std::map<std::string, std::string>, std::vector<EvalDatasetConfig>>;

// One bound of a numeric range.
struct Bound {
  double value = 0;
  bool inclusive = true;
};

// Everything about a field except how to reach it.
struct FieldInfo {
  std::string section;  // "" for eval dataset entries
  std::string key;
  FieldType type = FieldType::kString;
  bool optional = false;  // may be null (unset)
  bool required = false;  // the default (0 / "") is not a valid value: the user must set it
  std::string doc;
  std::string slime_flag;             // e.g. "--rollout-temperature"; "" when the key is ours
  std::vector<std::string> allowed;   // enum values (strings); empty = any
  std::string allowed_prefix;         // optional prefix an enum value may carry ("boxed_")
  std::vector<int64_t> allowed_ints;  // extra integers allowed outside [min, max] (e.g. -1)
  std::optional<Bound> min;
  std::optional<Bound> max;
  int64_t int_min = std::numeric_limits<int64_t>::min();  // range of the C++ member
  int64_t int_max = std::numeric_limits<int64_t>::max();
  std::vector<std::string> read_by;  // modules whose code reads the field ("train", "config", ...)
  bool secret = false;               // a credential: redacted where the config is shown
  std::string refused;               // non-empty: only the default is accepted; says why
  FieldValue refused_default;        // the one accepted value of a refused field

  // "section.key", or just "key" for eval dataset entries.
  std::string Path() const { return section.empty() ? key : section + "." + key; }
};

template <typename Owner>
struct FieldSpec : FieldInfo {
  std::function<FieldValue(const Owner&)> get;
  std::function<void(Owner&, const FieldValue&)> set;  // value already checked
};

struct SectionInfo {
  std::string name;
  std::string doc;
};

// The thirteen sections, in document order.
const std::vector<SectionInfo>& ConfigSections();

// Every Config field, grouped by section in document order.
const std::vector<FieldSpec<Config>>& ConfigFields();

// Fields of one `eval.datasets` entry.
const std::vector<FieldSpec<EvalDatasetConfig>>& EvalDatasetFields();

// The field at "section.key", or null.
const FieldSpec<Config>* FindConfigField(std::string_view section, std::string_view key);

// Checks a value against the field's refusal, enum / range / required constraints. `where`
// names the key in messages (e.g. "eval.datasets[1].top_p").
Status CheckFieldValue(const FieldInfo& field, const FieldValue& value, const std::string& where);

// "bool", "int", "float", "string", "list<string>", ... with a trailing "?" when optional.
std::string FieldTypeName(const FieldInfo& field);

// A value in YAML flow notation, as used in messages and the docs ("1e-06", "[a, b]", "~").
std::string FormatFieldValue(const FieldValue& value);

// "(0, 1]", "[1, inf)", ... ; "" when the field has no range.
std::string FormatRange(const FieldInfo& field);

}  // namespace slime::config

#endif  // SLIME_CONFIG_FIELDS_H_
