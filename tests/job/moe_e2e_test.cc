// The real `slime_train --config` on a tiny random Qwen3-MoE model on CPU (issue: MoE end to
// end): two engines serve the sparse model, a trainer trains it with the router's load-balancing
// and z losses, the weight sync carries every expert (the engines' log-probs of the next rollout
// equal the trainer's), a run resumes from its checkpoint, expert-parallel trainers (EP 2) match
// one trainer and their checkpoint resumes at EP 1, and in deterministic mode the trainer
// recomputes the engines' log-probs to the bit.
#include <chrono>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "child_process.h"
#include "gtest/gtest.h"
#include "job_runs.h"
#include "nlohmann/json.hpp"
#include "remove_tree.h"
#include "test_paths.h"

namespace slime {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using testing::Child;
using testing::ExpectEnginesMatchTrainer;
using testing::ExpectSameTrainMetrics;
using testing::ReadFile;
using testing::RunToCompletion;
using testing::SourceDir;
using testing::StepValues;
using testing::TestDataDir;
using testing::TrainSavedRollouts;
using testing::WriteTinyJob;

class MoeE2eTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const fs::path tokenizer = TestDataDir() / "qwen3";
    if (!fs::exists(tokenizer / "tokenizer.json")) {
      skip_ = new std::string(tokenizer.string() + " missing: run scripts/fetch_test_data.sh");
      return;
    }
    root_ =
        new fs::path(fs::temp_directory_path() / ("slime_moe_e2e_" + std::to_string(::getpid())));
    testing::RemoveTree(*root_);
    fs::create_directories(*root_);
    Child init(
        {"init-model", "--config", SourceDir() + "/tests/data/model/configs/qwen3-moe-tiny.json",
         "--tokenizer", tokenizer.string(), "--out", (*root_ / "model").string(), "--dtype", "fp32",
         "--seed", "5"},
        *root_);
    const std::optional<int> code = init.Wait(std::chrono::seconds(120));
    if (code != 0) init_error_ = new std::string("init-model failed: " + init.err());
  }
  static void TearDownTestSuite() {
    if (root_ != nullptr) testing::RemoveTree(*root_);
    delete root_;
    root_ = nullptr;
  }
  void SetUp() override {
    if (skip_ != nullptr) GTEST_SKIP() << *skip_;
    if (init_error_ != nullptr) FAIL() << *init_error_;
    dir_ = *root_ / ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::create_directories(dir_);
  }
  fs::path WriteConfig(int num_rollout, const std::string& extra = "") {
    return WriteTinyJob(dir_, *root_ / "model", num_rollout, extra);
  }

  static std::string* skip_;
  static std::string* init_error_;
  static fs::path* root_;
  fs::path dir_;
};
std::string* MoeE2eTest::skip_ = nullptr;
std::string* MoeE2eTest::init_error_ = nullptr;
fs::path* MoeE2eTest::root_ = nullptr;

// GRPO on the sparse model: 2 rollouts, one optimizer step each with the router losses on; the
// engines generate rollout 1 with the weights the trainer synced after step 0 (a learning rate
// large enough that stale experts would show in the log-prob diff); the same command with one
// more rollout resumes at rollout 2.
TEST_F(MoeE2eTest, GrpoTrainsTheRouterSyncsEveryExpertAndResumes) {
  const fs::path config = WriteConfig(2, "algorithm:\n  get_mismatch_metrics: true\n");
  const std::vector<std::string> common = {"--config", config.string(),
                                           "--set",    "train.lr=1.0e-3",
                                           "--set",    "train.moe_aux_loss_coeff=0.01",
                                           "--set",    "train.moe_z_loss_coeff=0.001",
                                           // One schedule for the run and its extension.
                                           "--set",    "train.lr_decay_iters=32"};
  std::string logs;
  ASSERT_TRUE(RunToCompletion(common, dir_, std::chrono::seconds(500), "the run", &logs));
  const std::map<int64_t, Json> steps = StepValues(dir_ / "run" / "metrics.jsonl");
  ASSERT_EQ(steps.size(), 2u) << "one optimizer step per rollout";
  for (const auto& [step, values] : steps) {
    for (const char* key :
         {"train/moe_aux_loss", "train/moe_z_loss", "train/moe_load_imbalance/layer_0",
          "train/moe_load_imbalance/layer_1"}) {
      ASSERT_TRUE(values.contains(key)) << key << " at step " << step << ": " << values.dump();
    }
    // Top-2 of 8 experts: the auxiliary loss is at least 1 (perfect balance) times its weight.
    EXPECT_GE(values["train/moe_aux_loss"].get<double>(), 0.99) << values.dump();
    EXPECT_GT(values["train/grad_norm"].get<double>(), 0.0);
  }
  ExpectEnginesMatchTrainer(steps, "moe");
  EXPECT_EQ(ReadFile(dir_ / "ckpt" / "latest_checkpointed_iteration.txt").substr(0, 1), "1");

  std::vector<std::string> again = common;
  again.insert(again.end(), {"--set", "data.num_rollout=3"});
  Child resumed(again, dir_);
  const std::optional<int> code = resumed.Wait(std::chrono::seconds(400));
  ASSERT_EQ(code, 0) << "stdout:\n" << resumed.out() << "\nstderr:\n" << resumed.err();
  EXPECT_NE(resumed.out().find("at rollout 2"), std::string::npos) << resumed.out();
  EXPECT_NE(resumed.out().find("rollout 2/3 | reward"), std::string::npos) << resumed.out();
  EXPECT_EQ(ReadFile(dir_ / "ckpt" / "latest_checkpointed_iteration.txt").substr(0, 1), "2");
}

// Expert parallelism end to end: two trainers at DP 2 × EP 2 (each holds 4 of the 8 experts of
// every layer, tokens dispatched by all-to-all over Gloo) generate and train 2 rollouts; the
// weight sync gathers every expert for the engines (rollout 1's engine log-probs equal the
// trainer's). The same saved rollouts trained by one trainer (EP 1) and by two trainers without
// EP give the same losses and gradient norms; the EP 2 checkpoint (full HF experts) resumes on
// one trainer.
TEST_F(MoeE2eTest, ExpertParallelTrainersMatchOneTrainerAndResumeAtEp1) {
  const std::string rollouts = (dir_ / "rollouts" / "{rollout_id}.json").string();
  const fs::path config = WriteConfig(2, "debug:\n  save_debug_rollout_data: \"" + rollouts +
                                             "\"\nalgorithm:\n  get_mismatch_metrics: true\n"
                                             "  entropy_coef: 0.01\n");
  // The entropy term gives every step a gradient (the tiny model's rewards are often all equal).
  const std::vector<std::string> common = {"--set", "train.lr=1.0e-3", "--set",
                                           "eval.interval=null", "--set",
                                           "train.lr_decay_iters=32"};
  std::map<std::string, std::map<int64_t, Json>> steps;  // run -> step -> train/* values
  std::vector<std::string> ep2 = {"--config", config.string(),
                                  "--set",    "cluster.actor_num_gpus_per_node=2",
                                  "--set",    "train.expert_model_parallel_size=2"};
  ep2.insert(ep2.end(), common.begin(), common.end());
  std::string logs;
  ASSERT_TRUE(RunToCompletion(ep2, dir_, std::chrono::seconds(500), "ep2", &logs));
  steps["ep2"] = StepValues(dir_ / "run" / "metrics.jsonl");
  ASSERT_EQ(steps["ep2"].size(), 2u) << "one optimizer step per rollout";
  ExpectEnginesMatchTrainer(steps["ep2"], "ep2");

  steps["ep1"] = TrainSavedRollouts(dir_, config, rollouts, "ep1", 1, 1, 1, common, &logs);
  steps["dp2"] = TrainSavedRollouts(dir_, config, rollouts, "dp2", 2, 1, 1, common, &logs);
  ExpectSameTrainMetrics(steps, "ep1", {"ep2", "dp2"});

  // The EP 2 run's checkpoint, one rollout further on one trainer.
  std::vector<std::string> again = {"--config", config.string(), "--set",
                                    "data.num_rollout=3", "--set",
                                    "debug.save_debug_rollout_data=null"};
  again.insert(again.end(), common.begin(), common.end());
  Child resumed(again, dir_);
  const std::optional<int> code = resumed.Wait(std::chrono::seconds(400));
  ASSERT_EQ(code, 0) << "stdout:\n" << resumed.out() << "\nstderr:\n" << resumed.err();
  EXPECT_NE(resumed.out().find("at rollout 2"), std::string::npos) << resumed.out();
  EXPECT_NE(resumed.out().find("rollout 2/3 | reward"), std::string::npos) << resumed.out();
}

// debug.deterministic_mode on the sparse model: the engines' routing, expert GEMMs and combine
// are batch-invariant like the dense layers, so the trainer's recomputed log-probs equal the
// engines' to the bit on every step, and the first step of each rollout has ppo_kl = 0 and
// pg_clipfrac = 0 exactly.
TEST_F(MoeE2eTest, DeterministicModeTrainsOnTheEnginesLogProbsToTheBit) {
  const fs::path config = WriteConfig(2);
  std::string logs;
  ASSERT_TRUE(
      RunToCompletion({"--config", config.string(), "--set", "debug.deterministic_mode=true",
                       "--set", "train.global_batch_size=4", "--set", "eval.interval=null"},
                      dir_, std::chrono::seconds(600), "deterministic", &logs));
  const std::map<int64_t, Json> steps = StepValues(dir_ / "run" / "metrics.jsonl");
  ASSERT_EQ(steps.size(), 4u) << logs;
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

}  // namespace
}  // namespace slime
