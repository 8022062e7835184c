// Private to the config module: how the field tables are written.
//
// FieldTraits<T> maps a C++ member type to its FieldType and converts between the member and a
// FieldValue. FieldBuilder registers one field from a pointer-to-member and offers chained
// setters for its metadata:
//
//   b.Add("temperature", &RolloutConfig::temperature)
//       .ReadBy("rollout")
//       .Slime("--rollout-temperature").Above(0).Doc("Sampling temperature ...");
//
// Every field says who uses it: ReadBy(modules) names the modules (directories of src/) whose
// code reads the member, "config" when only ResolveConfig does (it derives other keys from it);
// scripts/check_config_fields.py (ctest config_fields_test) checks each name. A feature that is
// not there yet is Refused("why"): any value but the default fails the config check with
//   train.context_parallel_size = 2: not supported (context parallelism is later work); remove
//   the key or leave it at its default 1
// config_test fails on a field with neither mark.
//
// Thread-safety: used only while building the (function-local static) tables.
#ifndef SLIME_CONFIG_FIELD_BUILDER_H_
#define SLIME_CONFIG_FIELD_BUILDER_H_

#include <limits>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "slime/config/fields.h"

namespace slime::config::internal {

template <typename T>
struct FieldTraits;

template <>
struct FieldTraits<bool> {
  static constexpr FieldType kType = FieldType::kBool;
  static FieldValue To(bool v) { return v; }
  static bool From(const FieldValue& v) { return std::get<bool>(v); }
};

template <>
struct FieldTraits<int> {
  static constexpr FieldType kType = FieldType::kInt;
  static FieldValue To(int v) { return static_cast<int64_t>(v); }
  static int From(const FieldValue& v) { return static_cast<int>(std::get<int64_t>(v)); }
};

template <>
struct FieldTraits<int64_t> {
  static constexpr FieldType kType = FieldType::kInt;
  static FieldValue To(int64_t v) { return v; }
  static int64_t From(const FieldValue& v) { return std::get<int64_t>(v); }
};

template <>
struct FieldTraits<double> {
  static constexpr FieldType kType = FieldType::kDouble;
  static FieldValue To(double v) { return v; }
  static double From(const FieldValue& v) { return std::get<double>(v); }
};

template <>
struct FieldTraits<std::string> {
  static constexpr FieldType kType = FieldType::kString;
  static FieldValue To(const std::string& v) { return v; }
  static std::string From(const FieldValue& v) { return std::get<std::string>(v); }
};

template <>
struct FieldTraits<std::vector<std::string>> {
  static constexpr FieldType kType = FieldType::kStringList;
  static FieldValue To(const std::vector<std::string>& v) { return v; }
  static std::vector<std::string> From(const FieldValue& v) {
    return std::get<std::vector<std::string>>(v);
  }
};

template <>
struct FieldTraits<std::vector<int>> {
  static constexpr FieldType kType = FieldType::kIntList;
  static FieldValue To(const std::vector<int>& v) {
    return std::vector<int64_t>(v.begin(), v.end());
  }
  static std::vector<int> From(const FieldValue& v) {
    const auto& wide = std::get<std::vector<int64_t>>(v);
    std::vector<int> out;
    for (int64_t x : wide) out.push_back(static_cast<int>(x));
    return out;
  }
};

template <>
struct FieldTraits<std::map<std::string, std::string>> {
  static constexpr FieldType kType = FieldType::kStringMap;
  static FieldValue To(const std::map<std::string, std::string>& v) { return v; }
  static std::map<std::string, std::string> From(const FieldValue& v) {
    return std::get<std::map<std::string, std::string>>(v);
  }
};

template <>
struct FieldTraits<std::vector<EvalDatasetConfig>> {
  static constexpr FieldType kType = FieldType::kEvalDatasets;
  static FieldValue To(const std::vector<EvalDatasetConfig>& v) { return v; }
  static std::vector<EvalDatasetConfig> From(const FieldValue& v) {
    return std::get<std::vector<EvalDatasetConfig>>(v);
  }
};

template <typename T>
constexpr bool kIsOptional = false;
template <typename T>
constexpr bool kIsOptional<std::optional<T>> = true;

template <typename T>
struct Unwrapped {
  using type = T;
};
template <typename T>
struct Unwrapped<std::optional<T>> {
  using type = T;
};

// Member ↔ FieldValue for plain and optional members.
template <typename T>
FieldValue ToValue(const T& member) {
  if constexpr (kIsOptional<T>) {
    if (!member.has_value()) return std::monostate{};
    return FieldTraits<typename T::value_type>::To(*member);
  } else {
    return FieldTraits<T>::To(member);
  }
}

template <typename T>
void FromValue(const FieldValue& value, T& member) {
  if constexpr (kIsOptional<T>) {
    if (std::holds_alternative<std::monostate>(value)) {
      member.reset();
    } else {
      member = FieldTraits<typename T::value_type>::From(value);
    }
  } else {
    member = FieldTraits<T>::From(value);
  }
}

// Chained setters for the field most recently added.
template <typename Owner>
class FieldRef {
 public:
  explicit FieldRef(FieldSpec<Owner>* spec) : spec_(spec) {}

  FieldRef& Doc(std::string doc) {
    spec_->doc = std::move(doc);
    return *this;
  }
  FieldRef& Slime(std::string flag) {
    spec_->slime_flag = std::move(flag);
    return *this;
  }
  FieldRef& Enum(std::vector<std::string> allowed) {
    spec_->allowed = std::move(allowed);
    return *this;
  }
  FieldRef& EnumPrefix(std::string prefix) {
    spec_->allowed_prefix = std::move(prefix);
    return *this;
  }
  FieldRef& Min(double v) {  // value ≥ v
    spec_->min = Bound{v, true};
    return *this;
  }
  FieldRef& Above(double v) {  // value > v
    spec_->min = Bound{v, false};
    return *this;
  }
  FieldRef& Max(double v) {  // value ≤ v
    spec_->max = Bound{v, true};
    return *this;
  }
  FieldRef& Below(double v) {  // value < v
    spec_->max = Bound{v, false};
    return *this;
  }
  FieldRef& AlsoAllow(int64_t v) {  // an integer sentinel outside [min, max], e.g. -1
    spec_->allowed_ints.push_back(v);
    return *this;
  }
  FieldRef& Required() {
    spec_->required = true;
    return *this;
  }
  FieldRef& Secret() {  // ToYaml(config, /*redact_secrets=*/true) hides its value
    spec_->secret = true;
    return *this;
  }
  template <typename... More>
  FieldRef& ReadBy(const char* module, More... more) {  // module names, e.g. ("rollout", "job")
    spec_->read_by = {module, more...};
    return *this;
  }
  FieldRef& Refused(std::string why) {  // `why` completes "not supported (...)"
    spec_->refused = std::move(why);
    spec_->refused_default = spec_->get(Owner{});
    return *this;
  }

 private:
  FieldSpec<Owner>* spec_;
};

// Describes the type of a member of type T.
template <typename T>
void DescribeType(FieldInfo* spec) {
  using Inner = typename Unwrapped<T>::type;
  spec->type = FieldTraits<Inner>::kType;
  spec->optional = kIsOptional<T>;
  if constexpr (std::is_same_v<Inner, int> || std::is_same_v<Inner, std::vector<int>>) {
    spec->int_min = std::numeric_limits<int>::min();
    spec->int_max = std::numeric_limits<int>::max();
  }
}

// Registers the fields of one section (a member of `Config` of type Section).
template <typename Section>
class SectionBuilder {
 public:
  SectionBuilder(std::vector<FieldSpec<Config>>* table, std::string name, Section Config::*section)
      : table_(table), name_(std::move(name)), section_(section) {}

  template <typename T>
  FieldRef<Config> Add(const char* key, T Section::*member) {
    FieldSpec<Config> spec;
    spec.section = name_;
    spec.key = key;
    DescribeType<T>(&spec);
    Section Config::*section = section_;
    spec.get = [section, member](const Config& c) { return ToValue((c.*section).*member); };
    spec.set = [section, member](Config& c, const FieldValue& v) {
      FromValue(v, (c.*section).*member);
    };
    table_->push_back(std::move(spec));
    return FieldRef<Config>(&table_->back());
  }

 private:
  std::vector<FieldSpec<Config>>* table_;
  std::string name_;
  Section Config::*section_;
};

// Registers the fields of an `eval.datasets` entry.
class EvalDatasetBuilder {
 public:
  explicit EvalDatasetBuilder(std::vector<FieldSpec<EvalDatasetConfig>>* table) : table_(table) {}

  template <typename T>
  FieldRef<EvalDatasetConfig> Add(const char* key, T EvalDatasetConfig::*member) {
    FieldSpec<EvalDatasetConfig> spec;
    spec.key = key;
    DescribeType<T>(&spec);
    spec.get = [member](const EvalDatasetConfig& d) { return ToValue(d.*member); };
    spec.set = [member](EvalDatasetConfig& d, const FieldValue& v) { FromValue(v, d.*member); };
    table_->push_back(std::move(spec));
    return FieldRef<EvalDatasetConfig>(&table_->back());
  }

 private:
  std::vector<FieldSpec<EvalDatasetConfig>>* table_;
};

// The per-section registration functions (fields_*.cc).
void AddClusterFields(std::vector<FieldSpec<Config>>* table);
void AddModelFields(std::vector<FieldSpec<Config>>* table);
void AddRolloutFields(std::vector<FieldSpec<Config>>* table);
void AddDataFields(std::vector<FieldSpec<Config>>* table);
void AddEvalFields(std::vector<FieldSpec<Config>>* table);
void AddRewardFields(std::vector<FieldSpec<Config>>* table);
void AddAlgorithmFields(std::vector<FieldSpec<Config>>* table);
void AddTrainFields(std::vector<FieldSpec<Config>>* table);
void AddWeightSyncFields(std::vector<FieldSpec<Config>>* table);
void AddCheckpointFields(std::vector<FieldSpec<Config>>* table);
void AddMetricsFields(std::vector<FieldSpec<Config>>* table);
void AddFaultToleranceFields(std::vector<FieldSpec<Config>>* table);
void AddDebugFields(std::vector<FieldSpec<Config>>* table);
void AddEvalDatasetFields(std::vector<FieldSpec<EvalDatasetConfig>>* table);

// Reward model types slime's rm_hub knows (`boxed_` may prefix any of them).
const std::vector<std::string>& RewardModelTypes();

}  // namespace slime::config::internal

#endif  // SLIME_CONFIG_FIELD_BUILDER_H_
