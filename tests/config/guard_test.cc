// The config guard: every field is read by some module or refused (field_builder.h), and every
// refused field, set to anything but its default, fails LoadConfig and ResolveConfig with an
// error naming the key and why. The loops run over the field tables, so a field added later is
// covered without touching this file. (That each ReadBy claim holds is checked by
// scripts/check_config_fields.py, ctest config_fields_test.)
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "slime/config/fields.h"
#include "test_util.h"

namespace slime::config {
namespace {

using testing::FailsWith;
using testing::LoadMinimal;

// Whether `value` holds a T equal to `x`.
template <typename T>
bool Holds(const FieldValue& value, const T& x) {
  return std::holds_alternative<T>(value) && std::get<T>(value) == x;
}

// A value of `field`'s type that differs from `def` and passes its range and enum checks.
FieldValue NonDefault(const FieldInfo& field, const FieldValue& def) {
  switch (field.type) {
    case FieldType::kBool:
      return !Holds(def, true);
    case FieldType::kInt: {
      int64_t v = field.min ? static_cast<int64_t>(field.min->value) + !field.min->inclusive : 1;
      while (Holds(def, v)) ++v;
      return v;
    }
    case FieldType::kDouble: {
      double v = std::holds_alternative<double>(def) ? std::get<double>(def) : 0.0;
      v += 0.5;
      if (field.max && v > field.max->value) v = field.max->value / 2;
      return v;
    }
    case FieldType::kString:
      for (const std::string& allowed : field.allowed) {
        if (!Holds(def, allowed)) return allowed;
      }
      return std::string("not-the-default");
    case FieldType::kStringList:
      return std::vector<std::string>{"x"};
    case FieldType::kIntList:
      return std::vector<int64_t>{1};
    case FieldType::kStringMap:
      return std::map<std::string, std::string>{{"k", "v"}};
    case FieldType::kEvalDatasets:
      break;
  }
  ADD_FAILURE() << field.Path() << ": no non-default value for type " << FieldTypeName(field);
  return def;
}

// "<where> = <value>: not supported (<why>); remove the key or leave it at its default <d>"
// ("... leave it unset" when the default is unset).
std::string RefusalMessage(const FieldInfo& field, const std::string& where,
                           const FieldValue& value) {
  const bool unset = std::holds_alternative<std::monostate>(field.refused_default);
  return where + " = " + FormatFieldValue(value) + ": not supported (" + field.refused +
         "); remove the key or leave it " +
         (unset ? "unset" : "at its default " + FormatFieldValue(field.refused_default));
}

TEST(ConfigGuard, EveryFieldIsReadOrRefused) {
  auto check = [](const FieldInfo& field) {
    EXPECT_FALSE(field.read_by.empty() && field.refused.empty())
        << field.Path()
        << ": mark it .ReadBy(\"<module>\") (the modules whose code reads it) or "
           ".Refused(\"why\") in src/config/fields_*.cc";
    EXPECT_FALSE(!field.read_by.empty() && !field.refused.empty())
        << field.Path() << ": marked both ReadBy and Refused";
  };
  for (const auto& field : ConfigFields()) check(field);
  for (const auto& field : EvalDatasetFields()) check(field);
}

TEST(ConfigGuard, EveryRefusedKeyFailsNamingTheKey) {
  int refused = 0;
  for (const auto& field : ConfigFields()) {
    if (field.refused.empty()) continue;
    ++refused;
    const FieldValue value = NonDefault(field, field.refused_default);
    const std::string text = FormatFieldValue(value);
    // From the file or --set (the loader's check).
    EXPECT_TRUE(FailsWith(LoadMinimal({field.Path() + "=" + text}),
                          {RefusalMessage(field, field.Path(), value)}))
        << field.Path();
    // From a config built in code (ResolveConfig's check).
    StatusOr<Config> config = LoadMinimal();
    ASSERT_TRUE(config.ok()) << config.status();
    field.set(*config, value);
    EXPECT_TRUE(
        FailsWith(ResolveConfig(&*config, nullptr), {RefusalMessage(field, field.Path(), value)}))
        << field.Path();
  }
  for (const auto& field : EvalDatasetFields()) {
    if (field.refused.empty()) continue;
    ++refused;
    const FieldValue value = NonDefault(field, field.refused_default);
    const std::string entry = "eval.datasets=[{name: a, path: a.jsonl, " + field.key + ": " +
                              FormatFieldValue(value) + "}]";
    EXPECT_TRUE(FailsWith(LoadMinimal({entry}),
                          {RefusalMessage(field, "eval.datasets[0]." + field.key, value)}))
        << entry;
  }
  EXPECT_GT(refused, 0) << "no refused field: the loops above tested nothing";
}

TEST(ConfigGuard, RefusedKeysAtTheirDefaultsAreAccepted) {
  std::vector<std::string> sets;
  for (const auto& field : ConfigFields()) {
    if (!field.refused.empty()) {
      sets.push_back(field.Path() + "=" + FormatFieldValue(field.refused_default));
    }
  }
  StatusOr<Config> config = LoadMinimal(sets);
  EXPECT_TRUE(config.ok()) << config.status();
}

TEST(ConfigGuard, TheRefusalsOfIssue26) {
  // The message a user of slime's flags sees (exact), for one key of each refused feature.
  EXPECT_TRUE(FailsWith(LoadMinimal({"weight_sync.mode=delta"}),
                        {"weight_sync.mode = delta: not supported (delta weight sync is later "
                         "work); remove the key or leave it at its default full"}));
  EXPECT_TRUE(FailsWith(LoadMinimal({"train.mtp_num_layers=1"}),
                        {"train.mtp_num_layers = 1: not supported (multi-token prediction is "
                         "later work); remove the key or leave it unset"}));
  EXPECT_TRUE(
      FailsWith(LoadMinimal({"train.context_parallel_size=2", "cluster.actor_num_gpus_per_node=2"}),
                {"train.context_parallel_size = 2: not supported (context parallelism is "
                 "later work); remove the key or leave it at its default 1"}));
  for (const char* key :
       {"weight_sync.mode", "weight_sync.delta_encoding", "weight_sync.delta_checksum",
        "weight_sync.local_checkpoint_dir", "train.mtp_num_layers", "train.mtp_loss_scaling_factor",
        "train.enable_mtp_training", "train.context_parallel_size"}) {
    std::string path = key;
    const FieldSpec<Config>* field =
        FindConfigField(path.substr(0, path.find('.')), path.substr(path.find('.') + 1));
    ASSERT_NE(field, nullptr) << key;
    EXPECT_FALSE(field->refused.empty()) << key << " is no longer refused";
  }
}

}  // namespace
}  // namespace slime::config
