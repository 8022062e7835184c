// The shipped configs/, the freshness of docs/config.md, and sanity of the field table.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cctype>
#include <fstream>
#include <set>
#include <sstream>

#include "slime/config/config.h"
#include "slime/config/fields.h"
#include "test_util.h"

namespace slime::config {
namespace {

using testing::SourceDir;

class ConfigShipped : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : {"SLIME_TINY_MODEL", "SLIME_TINY_DATA", "QWEN3_0_6B", "QWEN3_4B",
                             "SLIME_DATA_DIR", "SLIME_CKPT_DIR"}) {
      ::unsetenv(name);
    }
  }

  StatusOr<Config> Load(const std::string& name) {
    warnings_.clear();
    return LoadConfig((SourceDir() / "configs" / name).string(), {}, &warnings_);
  }

  std::vector<std::string> warnings_;
};

TEST_F(ConfigShipped, GrpoTinyCpu) {
  auto c = Load("grpo-tiny-cpu.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(warnings_.empty()) << ::testing::PrintToString(warnings_);
  EXPECT_EQ(c->cluster.device, "cpu");
  EXPECT_FALSE(c->cluster.colocate);
  EXPECT_EQ(ActorNumGpus(*c), 1);
  EXPECT_EQ(NumRolloutEngines(*c), 2);
  EXPECT_EQ(DataParallelSize(*c), 1);
  EXPECT_EQ(c->model.hf_checkpoint, "runs/tiny-model");
  EXPECT_EQ(c->data.rollout_batch_size, 8);
  EXPECT_EQ(c->data.n_samples_per_prompt, 8);
  EXPECT_EQ(c->train.global_batch_size, 64);
  EXPECT_EQ(c->rollout.max_response_len, 12);
  EXPECT_EQ(c->algorithm.advantage_estimator, "grpo");
  EXPECT_FALSE(c->algorithm.use_kl_loss);
  EXPECT_FALSE(c->train.bf16);
  EXPECT_EQ(c->cluster.offload_train, false);
  EXPECT_EQ(c->cluster.offload_rollout, false);
  EXPECT_EQ(c->algorithm.eps_clip_high, 0.28);  // from the base file

  ::setenv("SLIME_TINY_MODEL", "/tmp/tiny", 1);
  auto with_env = Load("grpo-tiny-cpu.yaml");
  ASSERT_TRUE(with_env.ok()) << with_env.status();
  EXPECT_EQ(with_env->model.hf_checkpoint, "/tmp/tiny");
}

TEST_F(ConfigShipped, Qwen3_0_6bOneGpuColocated) {
  auto c = Load("qwen3-0.6b-grpo.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(warnings_.empty()) << ::testing::PrintToString(warnings_);
  EXPECT_EQ(c->cluster.device, "cuda");
  EXPECT_TRUE(c->cluster.colocate);
  EXPECT_EQ(ActorNumGpus(*c), 1);
  EXPECT_EQ(c->cluster.rollout_num_gpus, 1);
  EXPECT_EQ(c->cluster.offload_train, true);
  EXPECT_EQ(c->cluster.offload_rollout, true);
  EXPECT_EQ(c->model.hf_checkpoint, "/root/Qwen3-0.6B");
  EXPECT_EQ(c->checkpoint.ref_load, "/root/Qwen3-0.6B");
  EXPECT_EQ(c->data.prompt_data, "/root/dapo-math-17k/dapo-math-17k.jsonl");
  EXPECT_EQ(c->train.global_batch_size, 64);
  ASSERT_EQ(c->eval.datasets.size(), 1u);
  EXPECT_EQ(c->eval.datasets[0].n_samples, 4);
  EXPECT_EQ(c->eval.datasets[0].max_response_len, 8192);
}

TEST_F(ConfigShipped, Qwen3_4bRecipeMatchesSlime) {
  auto c = Load("qwen3-4b-grpo-8gpu.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(warnings_.empty()) << ::testing::PrintToString(warnings_);
  // Placement: 8 GPUs colocated, TP2 + SP trainers, engines of 2 GPUs.
  EXPECT_TRUE(c->cluster.colocate);
  EXPECT_EQ(ActorNumGpus(*c), 8);
  EXPECT_EQ(c->cluster.rollout_num_gpus, 8);
  EXPECT_EQ(c->cluster.rollout_num_gpus_per_engine, 2);
  EXPECT_EQ(NumRolloutEngines(*c), 4);
  EXPECT_EQ(c->train.tensor_model_parallel_size, 2);
  EXPECT_TRUE(c->train.sequence_parallel);
  EXPECT_EQ(DataParallelSize(*c), 4);
  EXPECT_EQ(c->rollout.mem_fraction_static, 0.7);
  // Rollout and data.
  EXPECT_EQ(c->data.rollout_batch_size, 32);
  EXPECT_EQ(c->data.n_samples_per_prompt, 8);
  EXPECT_EQ(c->data.num_rollout, 3000);
  EXPECT_EQ(c->data.input_key, "prompt");
  EXPECT_EQ(c->data.label_key, "label");
  EXPECT_TRUE(c->data.apply_chat_template);
  EXPECT_TRUE(c->rollout.shuffle);
  EXPECT_EQ(c->rollout.max_response_len, 8192);
  EXPECT_EQ(c->rollout.temperature, 1.0);
  EXPECT_EQ(c->reward.rm_type, "deepscaler");
  // Training.
  EXPECT_EQ(c->train.global_batch_size, 256);
  EXPECT_TRUE(c->train.use_dynamic_batch_size);
  EXPECT_EQ(c->train.max_tokens_per_gpu, 9216);
  EXPECT_TRUE(c->train.balance_data);
  EXPECT_EQ(c->train.recompute_granularity, "full");
  EXPECT_EQ(c->train.lr, 1e-6);
  EXPECT_EQ(c->train.lr_decay_style, "constant");
  EXPECT_EQ(c->train.weight_decay, 0.1);
  EXPECT_EQ(c->train.adam_beta1, 0.9);
  EXPECT_EQ(c->train.adam_beta2, 0.98);
  // Algorithm.
  EXPECT_EQ(c->algorithm.advantage_estimator, "grpo");
  EXPECT_EQ(c->algorithm.eps_clip, 0.2);
  EXPECT_EQ(c->algorithm.eps_clip_high, 0.28);
  EXPECT_TRUE(c->algorithm.use_kl_loss);
  EXPECT_EQ(c->algorithm.kl_loss_coef, 0.0);
  EXPECT_EQ(c->algorithm.kl_loss_type, "low_var_kl");
  EXPECT_EQ(c->algorithm.entropy_coef, 0.0);
  EXPECT_TRUE(c->algorithm.grpo_std_normalization);
  // Eval and checkpoints.
  EXPECT_EQ(c->eval.interval, 20);
  ASSERT_EQ(c->eval.datasets.size(), 1u);
  EXPECT_EQ(c->eval.datasets[0].name, "aime");
  EXPECT_EQ(c->eval.datasets[0].n_samples, 16);
  EXPECT_EQ(c->eval.datasets[0].max_response_len, 16384);
  EXPECT_EQ(c->checkpoint.save_interval, 20);
  EXPECT_EQ(c->checkpoint.ref_load, "/root/Qwen3-4B");
  EXPECT_EQ(c->checkpoint.load, c->checkpoint.save);
}

TEST_F(ConfigShipped, Qwen3_30bA3bRecipeIsExpertParallel) {
  auto c = Load("qwen3-30b-a3b-grpo-8gpu.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(warnings_.empty()) << ::testing::PrintToString(warnings_);
  EXPECT_TRUE(c->cluster.colocate);
  EXPECT_EQ(ActorNumGpus(*c), 8);
  EXPECT_EQ(c->cluster.rollout_num_gpus, 8);
  EXPECT_EQ(NumRolloutEngines(*c), 8);
  EXPECT_EQ(c->train.tensor_model_parallel_size, 1);
  EXPECT_EQ(DataParallelSize(*c), 8);
  EXPECT_EQ(c->train.expert_model_parallel_size, 8);
  EXPECT_EQ(c->train.max_tokens_per_gpu, 20480);
  EXPECT_EQ(c->train.global_batch_size, 256);
  EXPECT_EQ(c->data.rollout_batch_size, 32);
  EXPECT_EQ(c->data.n_samples_per_prompt, 8);
  EXPECT_EQ(c->algorithm.advantage_estimator, "grpo");
  EXPECT_EQ(c->checkpoint.ref_load, "/root/Qwen3-30B-A3B");
}

TEST_F(ConfigShipped, RoundTripThroughToYaml) {
  for (const char* name : {"grpo-tiny-cpu.yaml", "qwen3-0.6b-grpo.yaml",
                           "qwen3-4b-grpo-8gpu.yaml", "qwen3-30b-a3b-grpo-8gpu.yaml"}) {
    auto c = Load(name);
    ASSERT_TRUE(c.ok()) << name << ": " << c.status();
    std::vector<std::string> warnings;
    auto again = LoadConfigFromString(ToYaml(*c), ".", {}, &warnings);
    ASSERT_TRUE(again.ok()) << name << ": " << again.status();
    EXPECT_TRUE(*again == *c) << name;
  }
}

TEST(ConfigDocs, CommittedReferenceIsFresh) {
  std::filesystem::path path = SourceDir() / "docs" / "config.md";
  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << path << " is missing: run slime_config_docs > docs/config.md";
  std::stringstream committed;
  committed << in.rdbuf();
  EXPECT_TRUE(committed.str() == ConfigReferenceMarkdown())
      << "docs/config.md is stale: run slime_config_docs > docs/config.md";
}

TEST(ConfigDocs, EveryKeyIsDocumented) {
  std::string markdown = ConfigReferenceMarkdown();
  for (const auto& field : ConfigFields()) {
    EXPECT_NE(markdown.find("| `" + field.Path() + "` |"), std::string::npos) << field.Path();
  }
  for (const auto& field : EvalDatasetFields()) {
    EXPECT_NE(markdown.find("| `" + field.key + "` |"), std::string::npos) << field.key;
  }
}

bool IsSnakeCase(const std::string& name) {
  if (name.empty() || !std::islower(static_cast<unsigned char>(name[0]))) return false;
  for (char c : name) {
    if (!(std::islower(static_cast<unsigned char>(c)) ||
          std::isdigit(static_cast<unsigned char>(c)) || c == '_')) {
      return false;
    }
  }
  return true;
}

TEST(ConfigFieldTable, KeysAreUniqueSnakeCaseAndDocumented) {
  std::set<std::string> paths;
  std::set<std::string> sections;
  for (const auto& field : ConfigFields()) {
    EXPECT_TRUE(paths.insert(field.Path()).second) << "duplicate " << field.Path();
    EXPECT_TRUE(IsSnakeCase(field.key)) << field.Path();
    EXPECT_FALSE(field.doc.empty()) << field.Path();
    EXPECT_EQ(FindConfigField(field.section, field.key), &field);
    sections.insert(field.section);
  }
  EXPECT_EQ(sections.size(), ConfigSections().size());
  for (const auto& section : ConfigSections())
    EXPECT_TRUE(sections.count(section.name)) << section.name;
  EXPECT_EQ(FindConfigField("train", "nope"), nullptr);
  std::set<std::string> dataset_keys;
  for (const auto& field : EvalDatasetFields()) {
    EXPECT_TRUE(dataset_keys.insert(field.key).second) << field.key;
    EXPECT_FALSE(field.doc.empty()) << field.key;
  }
}

TEST(ConfigFieldTable, DefaultsSatisfyTheirOwnConstraints) {
  const Config defaults = DefaultConfig();
  for (const auto& field : ConfigFields()) {
    if (field.required) continue;  // the default means "not set yet"
    Status status = CheckFieldValue(field, field.get(defaults), field.Path());
    EXPECT_TRUE(status.ok()) << status;
  }
}

TEST(ConfigFieldTable, SettersAndGettersAgree) {
  Config c = DefaultConfig();
  const FieldSpec<Config>* lr = FindConfigField("train", "lr");
  ASSERT_NE(lr, nullptr);
  lr->set(c, FieldValue(0.5));
  EXPECT_EQ(c.train.lr, 0.5);
  EXPECT_EQ(std::get<double>(lr->get(c)), 0.5);
  const FieldSpec<Config>* gpus = FindConfigField("cluster", "rollout_num_gpus");
  gpus->set(c, FieldValue(int64_t{6}));
  EXPECT_EQ(c.cluster.rollout_num_gpus, 6);
  gpus->set(c, FieldValue(std::monostate{}));
  EXPECT_FALSE(c.cluster.rollout_num_gpus.has_value());
  EXPECT_EQ(FieldTypeName(*gpus), "int?");
  EXPECT_EQ(FormatRange(*FindConfigField("rollout", "top_k")), "-1 or >= 1");
  EXPECT_EQ(FormatFieldValue(FieldValue(std::vector<std::string>{"a", "b c", ""})),
            "[a, b c, \"\"]");
}

}  // namespace
}  // namespace slime::config
