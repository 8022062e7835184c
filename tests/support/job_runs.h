// Test helper for the end-to-end tests that run whole `slime_train` jobs (tests/job): run one to
// completion with its logs, read the per-step train/* values of its metrics.jsonl, and the checks
// that compare runs (engines' log-probs against the trainer's, two layouts' losses and gradient
// norms), and TinyModelJobTest, the fixture of a suite of such jobs on one tiny random model.
// Header-only, like child_process.h.
#ifndef SLIME_TESTS_SUPPORT_JOB_RUNS_H_
#define SLIME_TESTS_SUPPORT_JOB_RUNS_H_

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include <unistd.h>

#include "child_process.h"
#include "fmt/format.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "remove_tree.h"
#include "test_paths.h"

namespace slime::testing {

// dir/job.yaml: the end-to-end tests' job on the tiny model at `model_dir` on CPU: 2 engines + 1
// trainer on CPU slots, 4 prompts × 2 samples of at most 6 tokens per rollout (the demo task),
// eval on 6 held-out prompts every rollout, a checkpoint every rollout under dir/ckpt, the run
// dir dir/run; `extra` is appended (YAML). Returns the file's path.
inline std::filesystem::path WriteTinyJob(const std::filesystem::path& dir,
                                          const std::filesystem::path& model_dir, int num_rollout,
                                          const std::string& extra = "") {
  const std::string src = SourceDir();
  const std::string yaml =
      fmt::format(R"(cluster:
  device: cpu
  cpu_slots_per_node: 4
  actor_num_nodes: 1
  actor_num_gpus_per_node: 1
  rollout_num_gpus: 2
  rollout_num_gpus_per_engine: 1
  run_dir: {run}
model:
  hf_checkpoint: {model}
data:
  prompt_data: {src}/data/demo/train.jsonl@[0:40]
  label_key: label
  apply_chat_template: true
  rollout_batch_size: 4
  n_samples_per_prompt: 2
  num_rollout: {num_rollout}
eval:
  interval: 1
  temperature: 0.0
  datasets:
    - name: add2
      path: {src}/data/demo/eval.jsonl@[0:6]
rollout:
  max_response_len: 6
  shuffle: true
reward:
  rm_type: exact_match
train:
  bf16: false
  lr: 1.0e-4
  global_batch_size: 8
  micro_batch_size: 4
checkpoint:
  save: {ckpt}
  load: {ckpt}
  save_interval: 1
)",
                  fmt::arg("run", (dir / "run").string()), fmt::arg("model", model_dir.string()),
                  fmt::arg("src", src), fmt::arg("num_rollout", num_rollout),
                  fmt::arg("ckpt", (dir / "ckpt").string())) +
      extra;
  const std::filesystem::path path = dir / "job.yaml";
  std::ofstream(path) << yaml;
  return path;
}

// The run's stderr and every log file under run_dir/logs (the workers').
inline std::string ReadLogs(const std::filesystem::path& run_dir, const Child& run) {
  std::string all = run.err();
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(run_dir / "logs", ec))
    all += ReadFile(entry.path());
  return all;
}

// Runs slime_train with `args` in `dir` (its run dir dir/run) for at most `limit` and puts its
// logs (stderr and the run's log files) in *logs; false, with a test failure naming `label` and
// showing both outputs, when it did not exit with 0.
inline bool RunToCompletion(const std::vector<std::string>& args, const std::filesystem::path& dir,
                            std::chrono::seconds limit, const std::string& label,
                            std::string* logs) {
  Child child(args, dir);
  const std::optional<int> code = child.Wait(limit);
  *logs = ReadLogs(dir / "run", child);
  if (code == 0) return true;
  ADD_FAILURE() << label << " exited with "
                << (code.has_value() ? std::to_string(*code) : std::string("a timeout"))
                << "\nstdout:\n"
                << child.out() << "\nstderr:\n"
                << *logs;
  return false;
}

// The per-step train/* values of a run's metrics.jsonl (the rollout summary lines repeat the
// last step's values and carry no "step").
inline std::map<int64_t, nlohmann::json> StepValues(const std::filesystem::path& metrics) {
  std::map<int64_t, nlohmann::json> out;
  for (const nlohmann::json& r : ReadJsonl(metrics)) {
    if (!r.contains("train/grad_norm") || !r.contains("step") || !r["step"].is_number()) continue;
    nlohmann::json values = nlohmann::json::object();
    for (const auto& [k, v] : r.items()) {
      if (k.rfind("train/", 0) == 0 && v.is_number()) values[k] = v;
    }
    out[r.value("step", int64_t{-1})] = values;
  }
  return out;
}

// Every step's train_rollout_logprob_abs_diff (the engines' log-probs of the step's samples
// against the trainer's recomputed ones) is at float32 noise: the engines generated with the
// trainer's weights of that step.
inline void ExpectEnginesMatchTrainer(const std::map<int64_t, nlohmann::json>& steps,
                                      const std::string& label) {
  const std::string key = "train/train_rollout_logprob_abs_diff";
  for (const auto& [step, values] : steps) {
    ASSERT_TRUE(values.contains(key)) << label << ": " << values.dump();
    std::cout << label << " step " << step << ": train_rollout_logprob_abs_diff " << values[key]
              << "\n";
    EXPECT_LT(values[key].get<double>(), 2e-5)
        << label << " step " << step << ": the engines' log-probs differ from the trainer's";
  }
}

// A deterministic-mode run (debug.deterministic_mode) of `rollouts` rollouts, two optimizer steps
// each: every step's train_rollout_logprob_abs_diff is exactly 0 (the trainer's log-probs are
// the engines' bits), and so are slime's first-step gates, ppo_kl and pg_clipfrac, on each
// rollout's first step.
inline void ExpectTrainsOnTheEnginesLogProbsToTheBit(const std::map<int64_t, nlohmann::json>& steps,
                                                     size_t rollouts, const std::string& logs) {
  ASSERT_EQ(steps.size(), 2 * rollouts) << logs;
  int index = 0;
  for (const auto& [step, values] : steps) {
    const bool first_of_rollout = index++ % 2 == 0;
    const std::string diff = "train/train_rollout_logprob_abs_diff";
    ASSERT_TRUE(values.contains(diff)) << values.dump();
    EXPECT_EQ(values[diff].get<double>(), 0.0) << "step " << step << ": " << values.dump();
    if (!first_of_rollout) continue;
    for (const char* gate : {"train/ppo_kl", "train/pg_clipfrac"}) {
      ASSERT_TRUE(values.contains(gate)) << gate << ": " << values.dump();
      EXPECT_EQ(values[gate].get<double>(), 0.0) << gate << " at step " << step;
    }
  }
}

// Each of `runs` has the reference run's steps with the same loss, pg_loss, entropy loss and
// gradient norm within float32 tolerance (and the reference's gradient norm is not zero).
inline void ExpectSameTrainMetrics(
    const std::map<std::string, std::map<int64_t, nlohmann::json>>& steps,
    const std::string& reference, const std::vector<std::string>& runs) {
  const std::map<int64_t, nlohmann::json>& one = steps.at(reference);
  ASSERT_EQ(one.size(), 2u) << reference;
  for (const std::string& run : runs) {
    const std::map<int64_t, nlohmann::json>& other = steps.at(run);
    ASSERT_EQ(other.size(), one.size()) << run;
    for (const auto& [step, ref] : one) {
      ASSERT_TRUE(other.count(step)) << run << " step " << step;
      const nlohmann::json& got = other.at(step);
      for (const std::string key :
           {"train/grad_norm", "train/loss", "train/pg_loss", "train/entropy_loss"}) {
        ASSERT_TRUE(ref.contains(key)) << key << ": " << ref.dump();
        ASSERT_TRUE(got.contains(key)) << key << " at step " << step << ": " << got.dump();
        const double a = ref[key].get<double>(), b = got[key].get<double>();
        std::cout << run << " step " << step << " " << key << ": " << b << " (" << reference << " "
                  << a << ")\n";
        EXPECT_NEAR(a, b, 1e-5 + 1e-4 * std::abs(a)) << key << " at step " << step << ", " << run;
      }
      EXPECT_GT(ref["train/grad_norm"].get<double>(), 0.0) << "step " << step;
    }
  }
}

// Trains the rollouts saved under `rollouts` (debug.load_debug_rollout_data; no engines) on
// `trainers` trainer processes at tensor-parallel size `tp` and pipeline-parallel size `pp` with
// `extra` arguments, in dir/name (its own run dir and checkpoints). Returns the steps' train/*
// values (empty, with a test failure, when the run fails) and its logs in *logs.
inline std::map<int64_t, nlohmann::json> TrainSavedRollouts(
    const std::filesystem::path& dir, const std::filesystem::path& config,
    const std::string& rollouts, const std::string& name, int trainers, int tp, int pp,
    const std::vector<std::string>& extra, std::string* logs) {
  const std::filesystem::path run = dir / name;
  std::filesystem::create_directories(run);
  std::vector<std::string> args = {
      "--config", config.string(),
      "--set",    "debug.save_debug_rollout_data=null",
      "--set",    "debug.load_debug_rollout_data=" + rollouts,
      "--set",    "cluster.rollout_num_gpus=0",
      "--set",    "cluster.actor_num_gpus_per_node=" + std::to_string(trainers),
      "--set",    "train.tensor_model_parallel_size=" + std::to_string(tp),
      "--set",    "train.pipeline_model_parallel_size=" + std::to_string(pp),
      "--set",    "cluster.run_dir=" + (run / "run").string(),
      "--set",    "checkpoint.save=" + (run / "ckpt").string(),
      "--set",    "checkpoint.load=" + (run / "ckpt").string()};
  args.insert(args.end(), extra.begin(), extra.end());
  if (!RunToCompletion(args, run, std::chrono::seconds(400), name, logs)) return {};
  EXPECT_TRUE(std::filesystem::exists(run / "ckpt" / "latest_checkpointed_iteration.txt")) << name;
  return StepValues(run / "run" / "metrics.jsonl");
}

// The fixture of a suite of whole jobs on one tiny random model: `slime_train init-model` writes
// it once per suite (fp32, the Qwen3 tokenizer of scripts/fetch_test_data.sh) into a fresh
// directory under the temp dir, removed when the suite ends; each test gets its own directory
// below it (dir_). A suite names its model in SetUpTestSuite:
//   static void SetUpTestSuite() { InitModel("qwen3-tiny.json", 3, "slime_driver_e2e_"); }
// Without the tokenizer every test skips, saying what to run; a failed init-model fails them.
class TinyModelJobTest : public ::testing::Test {
 protected:
  // `config`: a file of tests/data/model/configs; `prefix`: the root directory's name before
  // the process id.
  static void InitModel(const std::string& config, int seed, const std::string& prefix) {
    const std::filesystem::path tokenizer = TestDataDir() / "qwen3";
    if (!std::filesystem::exists(tokenizer / "tokenizer.json")) {
      skip_ = new std::string(tokenizer.string() + " missing: run scripts/fetch_test_data.sh");
      return;
    }
    root_ = new std::filesystem::path(std::filesystem::temp_directory_path() /
                                      (prefix + std::to_string(::getpid())));
    RemoveTree(*root_);
    std::filesystem::create_directories(*root_);
    Child init({"init-model", "--config", SourceDir() + "/tests/data/model/configs/" + config,
                "--tokenizer", tokenizer.string(), "--out", model_dir().string(), "--dtype", "fp32",
                "--seed", std::to_string(seed)},
               *root_);
    const std::optional<int> code = init.Wait(std::chrono::seconds(120));
    if (code != 0) init_error_ = new std::string("init-model failed: " + init.err());
  }
  static void TearDownTestSuite() {
    if (root_ != nullptr) RemoveTree(*root_);
    delete root_;
    root_ = nullptr;
    delete skip_;
    skip_ = nullptr;
    delete init_error_;
    init_error_ = nullptr;
  }
  void SetUp() override {
    if (skip_ != nullptr) GTEST_SKIP() << *skip_;
    if (init_error_ != nullptr) FAIL() << *init_error_;
    dir_ = *root_ / ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::create_directories(dir_);
  }

  static std::filesystem::path model_dir() { return *root_ / "model"; }

  // WriteTinyJob in this test's directory on the suite's model.
  std::filesystem::path WriteConfig(int num_rollout, const std::string& extra = "") const {
    return WriteTinyJob(dir_, model_dir(), num_rollout, extra);
  }

  // TrainSavedRollouts in this test's directory.
  std::map<int64_t, nlohmann::json> TrainSavedRollouts(const std::filesystem::path& config,
                                                       const std::string& rollouts,
                                                       const std::string& name, int trainers,
                                                       int tp, int pp,
                                                       const std::vector<std::string>& extra,
                                                       std::string* logs) const {
    return testing::TrainSavedRollouts(dir_, config, rollouts, name, trainers, tp, pp, extra,
                                       logs);
  }

  static inline std::string* skip_ = nullptr;
  static inline std::string* init_error_ = nullptr;
  static inline std::filesystem::path* root_ = nullptr;
  std::filesystem::path dir_;
};

}  // namespace slime::testing

#endif  // SLIME_TESTS_SUPPORT_JOB_RUNS_H_
