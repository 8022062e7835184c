// Loading: defaults, types, --set overrides, base includes, ${ENV}, unknown keys, round trip.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <yaml-cpp/yaml.h>

#include "slime/config/config.h"
#include "slime/config/fields.h"
#include "test_util.h"

namespace slime::config {
namespace {

using testing::Contains;
using testing::FailsWith;
using testing::LoadMinimal;
using testing::LoadText;
using testing::TempDir;

TEST(ConfigDefaults, MatchSlimeDefaults) {
  Config c = DefaultConfig();
  EXPECT_EQ(c.cluster.run_dir, "runs/slime");
  EXPECT_EQ(c.cluster.device, "auto");
  EXPECT_EQ(c.cluster.num_nodes, 1);
  EXPECT_EQ(c.cluster.num_gpus_per_node, 8);
  EXPECT_EQ(c.cluster.cpu_slots_per_node, 4);
  EXPECT_EQ(c.cluster.placement_strategy, "pack");
  EXPECT_EQ(c.cluster.actor_num_nodes, 1);
  EXPECT_EQ(c.cluster.actor_num_gpus_per_node, 8);
  EXPECT_FALSE(c.cluster.rollout_num_gpus.has_value());
  EXPECT_EQ(c.cluster.rollout_num_gpus_per_engine, 1);
  EXPECT_FALSE(c.cluster.colocate);
  EXPECT_FALSE(c.cluster.offload_train.has_value());
  EXPECT_EQ(c.cluster.distributed_timeout_minutes, 10);
  EXPECT_EQ(c.rollout.temperature, 1.0);
  EXPECT_EQ(c.rollout.top_p, 1.0);
  EXPECT_EQ(c.rollout.top_k, -1);
  EXPECT_EQ(c.rollout.seed, 42);
  EXPECT_EQ(c.rollout.engine_concurrency, 512);
  EXPECT_EQ(c.data.input_key, "input");
  EXPECT_EQ(c.data.metadata_key, "metadata");
  EXPECT_EQ(c.data.tool_key, "tools");
  EXPECT_EQ(c.data.n_samples_per_prompt, 1);
  EXPECT_TRUE(c.data.rollout_global_dataset);
  EXPECT_EQ(c.eval.n_samples_per_eval_prompt, 1);
  EXPECT_EQ(c.algorithm.advantage_estimator, "grpo");
  EXPECT_EQ(c.algorithm.loss_type, "policy_loss");
  EXPECT_EQ(c.algorithm.eps_clip, 0.2);
  EXPECT_FALSE(c.algorithm.eps_clip_high.has_value());
  EXPECT_EQ(c.algorithm.value_clip, 0.2);
  EXPECT_EQ(c.algorithm.kl_loss_type, "k1");
  EXPECT_EQ(c.algorithm.gamma, 1.0);
  EXPECT_EQ(c.algorithm.lambd, 1.0);
  EXPECT_EQ(c.algorithm.tis_clip, 2.0);
  EXPECT_EQ(c.algorithm.tis_clip_low, 0.0);
  EXPECT_EQ(c.algorithm.opsm_delta, 1e-4);
  EXPECT_EQ(c.algorithm.opd_kl_coef, 1.0);
  EXPECT_TRUE(c.algorithm.grpo_std_normalization);
  EXPECT_TRUE(c.algorithm.rewards_normalization);
  EXPECT_EQ(c.train.lr, 1e-6);
  EXPECT_EQ(c.train.seed, 1234);
  EXPECT_EQ(c.train.clip_grad, 1.0);
  EXPECT_EQ(c.train.micro_batch_size, 1);
  EXPECT_EQ(c.train.log_probs_chunk_size, -1);
  EXPECT_EQ(c.train.data_pad_size_multiplier, 128);
  EXPECT_FALSE(c.train.use_distributed_optimizer);
  EXPECT_EQ(c.train.ddp_bucket_size, 40'000'000);
  EXPECT_EQ(c.train.mtp_loss_scaling_factor, 0.2);
  EXPECT_EQ(c.train.lr_decay_style, "linear");
  EXPECT_EQ(c.train.adam_beta2, 0.999);
  EXPECT_TRUE(c.train.bf16);
  EXPECT_EQ(c.weight_sync.mode, "full");
  EXPECT_EQ(c.weight_sync.transport, "nccl");
  EXPECT_EQ(c.weight_sync.buffer_size, 512LL * 1024 * 1024);
  EXPECT_EQ(c.weight_sync.delta_encoding, "xor");
  EXPECT_EQ(c.weight_sync.delta_checksum, "xxh3-128");
  EXPECT_EQ(c.fault_tolerance.health_check_interval, 30.0);
  EXPECT_EQ(c.fault_tolerance.health_check_timeout, 30.0);
  EXPECT_EQ(c.fault_tolerance.health_check_first_wait, 0.0);
  EXPECT_EQ(c.debug.log_level, "info");
  EXPECT_EQ(c.debug.ci_train_rollout_logprob_abs_diff_threshold, 0.1);
}

TEST(ConfigDefaults, DefaultConfigIsNotValidWithoutRequiredKeys) {
  Config c = DefaultConfig();
  std::vector<std::string> warnings;
  Status status = ResolveConfig(&c, &warnings);
  EXPECT_TRUE(FailsWith(status, {"model.hf_checkpoint is required", "--hf-checkpoint",
                                 "data.rollout_batch_size is required", "allowed: >= 1"}));
}

TEST(ConfigLoad, MinimalConfigResolvesDerivedValues) {
  auto c = LoadMinimal();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model.hf_checkpoint, "/models/tiny");
  EXPECT_EQ(c->data.rollout_batch_size, 4);
  EXPECT_EQ(c->rollout.over_sampling_batch_size, 4);
  EXPECT_EQ(c->train.global_batch_size, 4);
  EXPECT_EQ(c->algorithm.eps_clip_high, 0.2);
  EXPECT_EQ(c->cluster.offload_train, false);
  EXPECT_EQ(c->cluster.offload_rollout, false);
  EXPECT_FALSE(c->algorithm.grpo_std_normalization);  // n_samples_per_prompt == 1
  EXPECT_EQ(c->metrics.jsonl_path, "runs/slime/metrics.jsonl");
  EXPECT_EQ(c->eval.temperature, 1.0);
  EXPECT_EQ(c->eval.input_key, "input");
}

TEST(ConfigLoad, ParsesEveryValueType) {
  auto c = LoadText(R"(
model: {hf_checkpoint: /m, model_name: qwen3}
data:
  prompt_data: /d.jsonl@[0:100]
  rollout_batch_size: 8
  n_samples_per_prompt: 4
  num_rollout: 3
  label_key: ~
  apply_chat_template: yes
  apply_chat_template_kwargs: {enable_thinking: false}
cluster: {actor_num_gpus_per_node: 2, rollout_num_gpus: 2, train_env_vars: {A: "1"}}
rollout:
  stop: ["</s>", "###"]
  stop_token_ids: [151643, 151645]
  temperature: 0.7
  max_response_len: 1024
train: {lr: 2.5e-6, weight_decay: 0}
weight_sync: {buffer_size: 1073741824}
)");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model.model_name, "qwen3");
  EXPECT_EQ(c->data.prompt_data, "/d.jsonl@[0:100]");
  EXPECT_FALSE(c->data.label_key.has_value());
  EXPECT_TRUE(c->data.apply_chat_template);
  EXPECT_EQ(c->data.apply_chat_template_kwargs.at("enable_thinking"), "false");
  EXPECT_EQ(c->cluster.train_env_vars.at("A"), "1");
  EXPECT_EQ(c->rollout.stop, (std::vector<std::string>{"</s>", "###"}));
  EXPECT_EQ(c->rollout.stop_token_ids, (std::vector<int>{151643, 151645}));
  EXPECT_EQ(c->rollout.temperature, 0.7);
  EXPECT_EQ(c->rollout.max_response_len, 1024);
  EXPECT_EQ(c->train.lr, 2.5e-6);
  EXPECT_EQ(c->train.weight_decay, 0.0);
  EXPECT_EQ(c->weight_sync.buffer_size, 1073741824LL);
  EXPECT_TRUE(c->algorithm.grpo_std_normalization);  // n = 4
}

TEST(ConfigLoad, SingleScalarIsAOneElementList) {
  auto c = LoadMinimal({"rollout.stop=</s>"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rollout.stop, std::vector<std::string>{"</s>"});
}

TEST(ConfigLoad, EmptyFileAndEmptySectionUseDefaults) {
  auto c = LoadText(std::string(testing::kMinimalYaml) + "eval:\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->eval.datasets.empty());
  EXPECT_TRUE(FailsWith(LoadText(""), {"model.hf_checkpoint is required"}));
}

TEST(ConfigOverrides, SetParsesValuesAsYaml) {
  auto c =
      LoadMinimal({"train.lr=3e-6", "rollout.stop=[\"a\",\"b\"]", "rollout.partial_rollout=true",
                   "data.label_key=label", "cluster.train_env_vars={X: y}",
                   "rollout.max_response_len=512", "rollout.max_response_len=256"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->train.lr, 3e-6);
  EXPECT_EQ(c->rollout.stop, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(c->rollout.partial_rollout);
  EXPECT_EQ(c->data.label_key, "label");
  EXPECT_EQ(c->cluster.train_env_vars.at("X"), "y");
  EXPECT_EQ(c->rollout.max_response_len, 256);  // the later --set wins
}

TEST(ConfigOverrides, SetNullUnsetsAnOptionalKey) {
  auto c = LoadText(std::string(testing::kMinimalYaml) + "rollout: {max_response_len: 100}\n",
                    {"rollout.max_response_len=~"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->rollout.max_response_len.has_value());
  auto empty = LoadMinimal({"data.label_key="});
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_FALSE(empty->data.label_key.has_value());
}

TEST(ConfigOverrides, StringKeysTakeTextThatIsNotYaml) {
  auto c = LoadMinimal(
      {"model.model_name=*not-an-alias", "model.hf_checkpoint=/p/a: b", "cluster.run_dir=runs/x"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model.model_name, "*not-an-alias");
  EXPECT_EQ(c->model.hf_checkpoint, "/p/a: b");
  EXPECT_EQ(c->cluster.run_dir, "runs/x");
  EXPECT_EQ(c->metrics.jsonl_path, "runs/x/metrics.jsonl");
}

TEST(ConfigOverrides, MalformedSetIsAnError) {
  EXPECT_TRUE(
      FailsWith(LoadMinimal({"train.lr"}), {"--set 'train.lr'", "expected section.key=value"}));
  EXPECT_TRUE(FailsWith(LoadMinimal({"lr=1"}), {"--set 'lr=1'", "expected section.key=value"}));
  EXPECT_TRUE(FailsWith(LoadMinimal({"train.lr.x=1"}), {"expected section.key=value"}));
  EXPECT_TRUE(FailsWith(LoadMinimal({"=1"}), {"expected section.key=value"}));
  EXPECT_TRUE(FailsWith(LoadMinimal({"train.lr=[1"}), {"--set 'train.lr=[1'", "not valid YAML"}));
}

TEST(ConfigOverrides, UnknownSetKeySuggestsTheClosest) {
  EXPECT_TRUE(
      FailsWith(LoadMinimal({"train.lrr=1"}),
                {"--set 'train.lrr=1'", "unknown key 'train.lrr'", "did you mean 'train.lr'?"}));
  EXPECT_TRUE(
      FailsWith(LoadMinimal({"trian.lr=1"}), {"unknown section 'trian'", "did you mean 'train'?"}));
  EXPECT_TRUE(FailsWith(LoadMinimal({"rollout.lr=1"}), {"did you mean 'train.lr'?"}));
}

TEST(ConfigOverrides, TypeErrorFromSetSaysSo) {
  EXPECT_TRUE(FailsWith(LoadMinimal({"train.lr=fast"}),
                        {"train.lr: expected a number, got 'fast'", "(from --set)"}));
}

TEST(ConfigErrors, UnknownKeyInFileSuggestsTheClosest) {
  EXPECT_TRUE(
      FailsWith(LoadText(std::string(testing::kMinimalYaml) + "rollout: {temprature: 0.5}\n"),
                {"unknown key 'rollout.temprature'", "did you mean 'rollout.temperature'?"}));
  EXPECT_TRUE(FailsWith(LoadText(std::string(testing::kMinimalYaml) + "rollout: {lr: 1}\n"),
                        {"unknown key 'rollout.lr'", "did you mean 'train.lr'?"}));
  EXPECT_TRUE(FailsWith(LoadText(std::string(testing::kMinimalYaml) + "rollout: {zzzzqqq: 1}\n"),
                        {"unknown key 'rollout.zzzzqqq'", "section 'rollout'"}));
}

TEST(ConfigErrors, UnknownSectionSuggestsTheClosest) {
  EXPECT_TRUE(FailsWith(LoadText(std::string(testing::kMinimalYaml) + "trainn: {lr: 1}\n"),
                        {"unknown section 'trainn'", "did you mean 'train'?", "'weight_sync'"}));
  EXPECT_TRUE(FailsWith(LoadText(std::string(testing::kMinimalYaml) + "lr: 1\n"),
                        {"unknown section 'lr'", "did you mean 'train.lr'"}));
}

TEST(ConfigErrors, ReportsAllKeyErrorsAtOnce) {
  auto c = LoadText(std::string(testing::kMinimalYaml) + "train: {lrr: 1, seed: x}\n");
  EXPECT_TRUE(
      FailsWith(c, {"2 configuration errors", "train.lrr", "train.seed: expected an integer"}));
}

TEST(ConfigErrors, TypeErrorsNameKeyValueAndType) {
  auto with = [](const std::string& yaml) {
    return LoadText(std::string(testing::kMinimalYaml) + yaml);
  };
  EXPECT_TRUE(FailsWith(with("train: {lr: abc}\n"), {"train.lr: expected a number, got 'abc'"}));
  EXPECT_TRUE(FailsWith(with("train: {lr: nan}\n"), {"train.lr: expected a number, got 'nan'"}));
  EXPECT_TRUE(
      FailsWith(with("train: {seed: 1.5}\n"), {"train.seed: expected an integer, got '1.5'"}));
  EXPECT_TRUE(FailsWith(with("rollout: {partial_rollout: maybe}\n"),
                        {"rollout.partial_rollout: expected a bool (true or false), got 'maybe'"}));
  EXPECT_TRUE(FailsWith(with("rollout: {stop: {a: b}}\n"),
                        {"rollout.stop: expected a list of strings, got a mapping"}));
  EXPECT_TRUE(FailsWith(with("rollout: {stop_token_ids: [1, x]}\n"),
                        {"rollout.stop_token_ids[1]: expected an integer, got 'x'"}));
  EXPECT_TRUE(FailsWith(with("cluster: {run_dir: [a]}\n"),
                        {"cluster.run_dir: expected a string, got a list"}));
  EXPECT_TRUE(FailsWith(with("train: {lr: ~}\n"), {"train.lr: expected float", "cannot be null"}));
  EXPECT_TRUE(FailsWith(with("train: {seed: 99999999999}\n"),
                        {"train.seed = 99999999999 does not fit a 32-bit integer"}));
  EXPECT_TRUE(FailsWith(
      with("data: {apply_chat_template_kwargs: [a]}\n"),
      {"data.apply_chat_template_kwargs: expected a mapping of name: value, got a list"}));
  EXPECT_TRUE(FailsWith(with("train: 5\n"), {"section 'train' must be a mapping", "'5'"}));
}

TEST(ConfigErrors, RangeErrorsNameTheAllowedRange) {
  auto with = [](const std::string& set) { return LoadMinimal({set}); };
  EXPECT_TRUE(FailsWith(with("rollout.top_p=1.5"),
                        {"rollout.top_p = 1.5 is out of range; allowed: (0.0, 1.0]"}));
  EXPECT_TRUE(FailsWith(with("rollout.top_p=0"), {"allowed: (0.0, 1.0]"}));
  EXPECT_TRUE(FailsWith(with("rollout.top_k=0"),
                        {"rollout.top_k = 0 is out of range; allowed: -1 or >= 1"}));
  EXPECT_TRUE(
      FailsWith(with("train.lr=-1e-6"), {"train.lr = -1e-06 is out of range; allowed: >= 0.0"}));
  EXPECT_TRUE(FailsWith(with("metrics.prometheus_port=70000"), {"allowed: [0, 65535]"}));
  EXPECT_TRUE(FailsWith(with("train.adam_beta2=1"), {"train.adam_beta2", "allowed: [0.0, 1.0)"}));
  EXPECT_TRUE(
      FailsWith(with("data.n_samples_per_prompt=0"), {"data.n_samples_per_prompt = 0", ">= 1"}));
  EXPECT_TRUE(
      FailsWith(with("rollout.stop_token_ids=[5, -2]"), {"rollout.stop_token_ids[1] = -2"}));
  EXPECT_TRUE(FailsWith(with("train.ddp_bucket_size=0"),
                        {"train.ddp_bucket_size = 0 is out of range; allowed: >= 1"}));
}

TEST(ConfigErrors, EnumErrorsListAllowedValues) {
  EXPECT_TRUE(FailsWith(LoadMinimal({"cluster.device=gpu"}),
                        {"cluster.device: 'gpu' is not one of 'auto', 'cuda', 'cpu'"}));
  EXPECT_TRUE(FailsWith(LoadMinimal({"algorithm.advantage_estimator=grop"}),
                        {"'grop' is not one of 'grpo', 'gspo', 'cispo'", "did you mean 'grpo'?"}));
  EXPECT_TRUE(FailsWith(
      LoadMinimal({"debug.log_level=verbose"}),
      {"debug.log_level", "'trace', 'debug', 'info', 'warn', 'error', 'critical', 'off'"}));
  EXPECT_TRUE(FailsWith(LoadMinimal({"reward.rm_type=boxed_mth"}),
                        {"reward.rm_type: 'boxed_mth' is not one of", "'deepscaler'",
                         "optionally prefixed with 'boxed_'", "did you mean 'math'?"}));
  auto boxed = LoadMinimal({"reward.rm_type=boxed_deepscaler"});
  ASSERT_TRUE(boxed.ok()) << boxed.status();
  EXPECT_EQ(boxed->reward.rm_type, "boxed_deepscaler");
}

TEST(ConfigErrors, YamlSyntaxAndShapeErrors) {
  EXPECT_TRUE(FailsWith(LoadText("train: {lr: 1\n"), {"YAML syntax error at line"}));
  EXPECT_TRUE(FailsWith(LoadText("- a\n- b\n"), {"top level must be a mapping of sections"}));
}

TEST(ConfigFiles, LoadConfigReadsAFileAndReportsMissingOnes) {
  TempDir dir;
  std::string path = dir.Write("job.yaml", testing::kMinimalYaml);
  std::vector<std::string> warnings;
  auto c = LoadConfig(path, {"train.lr=5e-7"}, &warnings);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->train.lr, 5e-7);
  auto missing = LoadConfig((dir.path() / "nope.yaml").string(), {}, &warnings);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(FailsWith(missing, {"config file", "nope.yaml", "does not exist"}));
}

TEST(ConfigBase, IncludingFileWinsAndMergesDeep) {
  TempDir dir;
  dir.Write("common/base.yaml", R"(
model: {hf_checkpoint: /models/base}
data: {prompt_data: /data/a.jsonl, rollout_batch_size: 4, num_rollout: 2}
cluster: {actor_num_gpus_per_node: 1, rollout_num_gpus: 1}
rollout: {temperature: 0.8, stop: [x, y], max_response_len: 64}
)");
  std::string job = dir.Write("jobs/job.yaml", R"(
base: ../common/base.yaml
rollout: {stop: [z]}
train: {lr: 2e-6}
)");
  auto c = LoadConfig(job, {}, nullptr);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model.hf_checkpoint, "/models/base");
  EXPECT_EQ(c->rollout.temperature, 0.8);  // kept from the base
  EXPECT_EQ(c->rollout.max_response_len, 64);
  EXPECT_EQ(c->rollout.stop, std::vector<std::string>{"z"});  // lists are replaced whole
  EXPECT_EQ(c->train.lr, 2e-6);
}

TEST(ConfigBase, ChainsAndListsOfBases) {
  TempDir dir;
  dir.Write("a.yaml", "model: {hf_checkpoint: /a}\nrollout: {top_k: 5}\n");
  dir.Write("b.yaml", "base: a.yaml\nrollout: {top_k: 7, seed: 1}\n");
  dir.Write("c.yaml",
            "data: {prompt_data: /d, rollout_batch_size: 2, num_rollout: 1}\n"
            "cluster: {actor_num_gpus_per_node: 1, rollout_num_gpus: 1}\n"
            "rollout: {seed: 3}\n");
  std::string job = dir.Write("job.yaml", "base: [b.yaml, c.yaml]\nrollout: {top_p: 0.9}\n");
  auto c = LoadConfig(job, {}, nullptr);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model.hf_checkpoint, "/a");
  EXPECT_EQ(c->rollout.top_k, 7);    // b over a
  EXPECT_EQ(c->rollout.seed, 3);     // c (later in the list) over b
  EXPECT_EQ(c->rollout.top_p, 0.9);  // the including file over all
}

TEST(ConfigBase, BaseOfAStringIsRelativeToBaseDir) {
  TempDir dir;
  dir.Write("base.yaml", testing::kMinimalYaml);
  auto c = LoadConfigFromString("base: base.yaml\ntrain: {seed: 7}\n", dir.path().string(), {});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->train.seed, 7);
  EXPECT_EQ(c->model.hf_checkpoint, "/models/tiny");
}

TEST(ConfigBase, CycleIsAnErrorListingTheChain) {
  TempDir dir;
  dir.Write("a.yaml", "base: b.yaml\n");
  dir.Write("b.yaml", "base: c.yaml\n");
  std::string c_path = dir.Write("c.yaml", "base: a.yaml\n");
  auto c = LoadConfig((dir.path() / "a.yaml").string(), {}, nullptr);
  EXPECT_TRUE(FailsWith(c, {"config 'base' cycle", "a.yaml -> ", "b.yaml -> ", "c.yaml -> "}));
  auto self = LoadConfig(dir.Write("self.yaml", "base: self.yaml\n"), {}, nullptr);
  EXPECT_TRUE(FailsWith(self, {"cycle", "self.yaml -> ", "self.yaml"}));
}

TEST(ConfigBase, MissingOrMalformedBase) {
  TempDir dir;
  std::string job = dir.Write("job.yaml", "base: missing.yaml\n");
  EXPECT_TRUE(FailsWith(LoadConfig(job, {}, nullptr), {"base config (included from", "job.yaml",
                                                       "missing.yaml", "does not exist"}));
  EXPECT_TRUE(FailsWith(LoadText("base: {a: 1}\n"), {"base must be a file path or a list"}));
}

TEST(ConfigEnv, InterpolatesVariablesAndDefaults) {
  ::setenv("SLIME_CFG_TEST_MODEL", "/env/model", 1);
  ::setenv("SLIME_CFG_TEST_EMPTY", "", 1);
  ::unsetenv("SLIME_CFG_TEST_UNSET");
  auto c = LoadText(R"(
model: {hf_checkpoint: "${SLIME_CFG_TEST_MODEL}", model_name: "x-${SLIME_CFG_TEST_UNSET:-dflt}-y"}
data: {prompt_data: "${SLIME_CFG_TEST_EMPTY:-/fallback.jsonl}", rollout_batch_size: 4, num_rollout: 2}
cluster: {actor_num_gpus_per_node: 1, rollout_num_gpus: 1, run_dir: "$${NOT_EXPANDED}"}
train: {lr: "${SLIME_CFG_TEST_UNSET:-3e-6}"}
rollout: {stop: ["${SLIME_CFG_TEST_UNSET:-a}", "b"]}
)");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model.hf_checkpoint, "/env/model");
  EXPECT_EQ(c->model.model_name, "x-dflt-y");
  EXPECT_EQ(c->data.prompt_data, "/fallback.jsonl");  // empty counts as unset for :-
  EXPECT_EQ(c->cluster.run_dir, "${NOT_EXPANDED}");
  EXPECT_EQ(c->train.lr, 3e-6);
  EXPECT_EQ(c->rollout.stop, (std::vector<std::string>{"a", "b"}));
}

TEST(ConfigEnv, UnsetVariableWithoutDefaultNamesKeyAndVariable) {
  ::unsetenv("SLIME_CFG_TEST_UNSET");
  EXPECT_TRUE(
      FailsWith(LoadText(std::string(testing::kMinimalYaml) +
                         "checkpoint: {save: \"${SLIME_CFG_TEST_UNSET}/ckpt\"}\n"),
                {"checkpoint.save", "environment variable 'SLIME_CFG_TEST_UNSET' is not set"}));
  EXPECT_TRUE(FailsWith(LoadText(std::string(testing::kMinimalYaml) +
                                 "rollout: {stop: [a, \"${SLIME_CFG_TEST_UNSET}\"]}\n"),
                        {"rollout.stop[1]", "SLIME_CFG_TEST_UNSET"}));
  EXPECT_TRUE(
      FailsWith(LoadText(std::string(testing::kMinimalYaml) + "cluster: {run_dir: \"${OOPS\"}\n"),
                {"cluster.run_dir", "unterminated '${'"}));
  EXPECT_TRUE(
      FailsWith(LoadText(std::string(testing::kMinimalYaml) + "cluster: {run_dir: \"${1BAD}\"}\n"),
                {"cluster.run_dir", "not a valid reference"}));
}

TEST(ConfigEnv, BasePathsAreInterpolatedAndSetValuesAreNot) {
  TempDir dir;
  dir.Write("base.yaml", testing::kMinimalYaml);
  ::setenv("SLIME_CFG_TEST_DIR", dir.path().c_str(), 1);
  ::unsetenv("SLIME_CFG_TEST_UNSET");
  auto c = LoadText(
      "base: ${SLIME_CFG_TEST_DIR}/base.yaml\nmodel: {model_name: \"${SLIME_CFG_TEST_UNSET}\"}\n",
      {"model.model_name=qwen", "cluster.run_dir=${LITERAL}"});
  ASSERT_TRUE(c.ok()) << c.status();  // the --set replaced the key that would not expand
  EXPECT_EQ(c->model.model_name, "qwen");
  EXPECT_EQ(c->cluster.run_dir, "${LITERAL}");
}

TEST(ConfigEvalDatasets, ParsesEntriesAndChecksThem) {
  const std::string base = std::string(testing::kMinimalYaml);
  auto c = LoadText(base + R"(
eval:
  interval: 5
  datasets:
    - {name: aime, path: /e/aime.jsonl, n_samples: 16, temperature: 0.6, stop: ["</s>"]}
    - {name: gsm8k, path: /e/gsm8k.jsonl, rm_type: boxed_math}
)");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->eval.datasets.size(), 2u);
  EXPECT_EQ(c->eval.datasets[0].n_samples, 16);
  EXPECT_EQ(c->eval.datasets[0].temperature, 0.6);
  EXPECT_EQ(c->eval.datasets[1].rm_type, "boxed_math");
  EXPECT_TRUE(FailsWith(LoadText(base + "eval: {datasets: [{name: a, path: p, n_sample: 2}]}\n"),
                        {"unknown key 'eval.datasets[0].n_sample'", "did you mean 'n_samples'?"}));
  EXPECT_TRUE(FailsWith(LoadText(base + "eval: {datasets: [{name: a}]}\n"),
                        {"eval.datasets[0].path is required"}));
  EXPECT_TRUE(FailsWith(LoadText(base + "eval: {datasets: [{name: a, path: p, top_p: 2}]}\n"),
                        {"eval.datasets[0].top_p = 2.0 is out of range; allowed: (0.0, 1.0]"}));
  EXPECT_TRUE(FailsWith(LoadText(base + "eval: {datasets: {name: a}}\n"),
                        {"eval.datasets: expected a list of datasets"}));
  EXPECT_TRUE(FailsWith(LoadText(base + "eval: {datasets: [a]}\n"),
                        {"eval.datasets[0]: expected a mapping with at least name and path"}));
}

TEST(ConfigRoundTrip, ToYamlReloadsToAnEqualConfig) {
  auto c = LoadText(std::string(testing::kMinimalYaml) + R"(
rollout:
  stop: ["$${x}", "a: b", "true", "", "null", "ünïcode", "quote\"d", "back\\slash"]
  stop_token_ids: [1, 2]
  max_context_len: 4096
  mem_fraction_static: 0.7
  dynamic_sampling_filter: check_reward_nonzero_std
data: {label_key: "", apply_chat_template_kwargs: {enable_thinking: "false", "k:x": "v"}}
train: {lr: 1.23456789e-7, min_lr: 0, weight_decay: 0.1}
eval:
  interval: 3
  datasets: [{name: aime, path: "/e/aime.jsonl", n_samples: 4, stop: []}]
cluster: {train_env_vars: {NCCL_DEBUG: INFO}, rollout_external_engine_addrs: []}
reward: {rm_type: deepscaler, reward_key: score}
)",
                    {"data.prompt_data=$${HOME}/x"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->data.prompt_data, "$${HOME}/x");  // --set values are literal
  EXPECT_EQ(c->data.label_key, "");
  EXPECT_EQ(c->rollout.stop[0], "${x}");
  std::string yaml = ToYaml(*c);
  std::vector<std::string> warnings;
  auto again = LoadConfigFromString(yaml, ".", {}, &warnings);
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << yaml;
  EXPECT_TRUE(*again == *c) << yaml;
  EXPECT_EQ(ToYaml(*again), yaml);
}

TEST(ConfigRoundTrip, ToYamlListsEverySectionAndKey) {
  auto c = LoadMinimal();
  ASSERT_TRUE(c.ok()) << c.status();
  YAML::Node root = YAML::Load(ToYaml(*c));
  for (const auto& field : ConfigFields()) {
    EXPECT_TRUE(root[field.section][field.key].IsDefined()) << field.Path();
  }
}

TEST(ConfigWarnings, AreReturnedNotFatal) {
  std::vector<std::string> warnings;
  auto c = LoadMinimal({"algorithm.advantage_estimator=cispo"}, &warnings);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(Contains(warnings, "CISPO")) << ::testing::PrintToString(warnings);
  // Without a vector the warnings are logged instead; loading still succeeds.
  EXPECT_TRUE(
      LoadConfigFromString(testing::kMinimalYaml, ".", {"algorithm.advantage_estimator=cispo"})
          .ok());
}

}  // namespace
}  // namespace slime::config
