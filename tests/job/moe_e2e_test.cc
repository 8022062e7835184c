// The real `slime_train --config` on a tiny random Qwen3-MoE model on CPU (issue: MoE end to
// end): two engines serve the sparse model, a trainer trains it with the router's load-balancing
// and z losses, the weight sync carries every expert (the engines' log-probs of the next rollout
// equal the trainer's), a run resumes from its checkpoint, expert-parallel trainers (EP 2) match
// one trainer and their checkpoint resumes at EP 1, rollout routing replay trains on the engines'
// experts on every layout, and in deterministic mode the trainer recomputes the engines'
// log-probs to the bit.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "child_process.h"
#include "gtest/gtest.h"
#include "job_runs.h"
#include "nlohmann/json.hpp"

namespace slime {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using testing::Child;
using testing::ExpectEnginesMatchTrainer;
using testing::ExpectSameTrainMetrics;
using testing::ExpectTrainsOnTheEnginesLogProbsToTheBit;
using testing::ReadFile;
using testing::RunToCompletion;
using testing::StepValues;

class MoeE2eTest : public testing::TinyModelJobTest {
 protected:
  static void SetUpTestSuite() { InitModel("qwen3-moe-tiny.json", 5, "slime_moe_e2e_"); }
};

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

  steps["ep1"] = TrainSavedRollouts(config, rollouts, "ep1", 1, 1, 1, common, &logs);
  steps["dp2"] = TrainSavedRollouts(config, rollouts, "dp2", 2, 1, 1, common, &logs);
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

// A copy of a rollout saved as debug rollout data, with every routed expert id e moved to
// (e + 4) mod 8 (each row kept ascending): routes the model would not choose, so replaying them
// must show.
void ShiftSavedRouting(const fs::path& from, const fs::path& to) {
  Json doc = Json::parse(ReadFile(from));
  int64_t shifted = 0;
  constexpr size_t kTopK = 2;  // the tiny model's num_experts_per_tok
  for (Json& group : doc.at("samples")) {
    for (Json& sample : group) {
      std::vector<int32_t> ids = sample.at("rollout_routed_experts").get<std::vector<int32_t>>();
      for (size_t row = 0; row + kTopK <= ids.size(); row += kTopK) {
        for (size_t j = 0; j < kTopK; ++j) ids[row + j] = (ids[row + j] + 4) % 8;
        std::sort(ids.begin() + static_cast<std::ptrdiff_t>(row),
                  ids.begin() + static_cast<std::ptrdiff_t>(row + kTopK));
      }
      shifted += static_cast<int64_t>(ids.size());
      sample["rollout_routed_experts"] = ids;
    }
  }
  ASSERT_GT(shifted, 0) << from << " holds no routing";
  fs::create_directories(to.parent_path());
  std::ofstream(to) << doc.dump() << "\n";
}

// Rollout routing replay (R3) through the real job: the engines return every token's experts
// (--enable-return-routed-experts), the samples carry them over gRPC, and two expert-parallel
// trainers replay them before the all-to-all dispatch; the saved rollouts carry the routing too.
//   * the replayed rollouts train the same on one trainer, at TP 2 (the routes of the gathered
//     sequence) and at PP 2 (each stage its layers' routes) as at EP 2;
//   * the replay is honoured: the same rollouts with their routes moved to other experts train
//     with a far larger train/rollout log-prob gap;
//   * with replay off and the routing returned, train/routing_agreement measures it: close to 1
//     for the engines' own routes (same weights, float32), far lower for the moved routes.
TEST_F(MoeE2eTest, RolloutRoutingReplayTrainsOnTheEnginesExpertsOnEveryLayout) {
  const fs::path rollouts = dir_ / "rollouts";
  const fs::path config = WriteConfig(
      2, "debug:\n  save_debug_rollout_data: \"" + (rollouts / "{rollout_id}.json").string() +
             "\"\nalgorithm:\n  get_mismatch_metrics: true\n  entropy_coef: 0.01\n"
             "  use_rollout_routing_replay: true\n");
  const std::vector<std::string> common = {"--set", "train.lr=1.0e-3", "--set",
                                           "eval.interval=null", "--set",
                                           "train.lr_decay_iters=32"};
  std::map<std::string, std::map<int64_t, Json>> steps;
  std::vector<std::string> ep2 = {"--config", config.string(),
                                  "--set",    "cluster.actor_num_gpus_per_node=2",
                                  "--set",    "train.expert_model_parallel_size=2"};
  ep2.insert(ep2.end(), common.begin(), common.end());
  std::string logs;
  ASSERT_TRUE(RunToCompletion(ep2, dir_, std::chrono::seconds(500), "r3-ep2", &logs));
  steps["ep2"] = StepValues(dir_ / "run" / "metrics.jsonl");
  ASSERT_EQ(steps["ep2"].size(), 2u) << "one optimizer step per rollout";
  ExpectEnginesMatchTrainer(steps["ep2"], "r3-ep2");
  for (const auto& [step, values] : steps["ep2"]) {
    EXPECT_FALSE(values.contains("train/routing_agreement")) << "replayed: nothing to measure";
  }
  // Every saved sample has its tokens' routes: 2 layers × top-2 per token.
  const Json saved = Json::parse(ReadFile(rollouts / "0.json"));
  for (const Json& group : saved.at("samples")) {
    for (const Json& sample : group) {
      EXPECT_EQ(sample.at("routed_experts_per_token").get<int64_t>(), 4) << sample.dump();
      EXPECT_FALSE(sample.at("rollout_routed_experts").empty()) << sample.dump();
    }
  }

  const std::string replayed = (rollouts / "{rollout_id}.json").string();
  steps["ep1"] = TrainSavedRollouts(config, replayed, "ep1", 1, 1, 1, common, &logs);
  steps["tp2"] = TrainSavedRollouts(config, replayed, "tp2", 2, 2, 1, common, &logs);
  steps["pp2"] = TrainSavedRollouts(config, replayed, "pp2", 2, 1, 2, common, &logs);
  ExpectSameTrainMetrics(steps, "ep1", {"ep2", "tp2", "pp2"});

  for (int rollout = 0; rollout < 2; ++rollout) {
    const std::string name = std::to_string(rollout) + ".json";
    ShiftSavedRouting(rollouts / name, dir_ / "shifted" / name);
  }
  const std::string shifted = (dir_ / "shifted" / "{rollout_id}.json").string();
  steps["moved"] = TrainSavedRollouts(config, shifted, "moved", 1, 1, 1, common, &logs);
  ASSERT_EQ(steps["moved"].size(), 2u) << logs;
  const std::string diff = "train/train_rollout_logprob_abs_diff";
  for (const auto& [step, values] : steps["moved"]) {
    ASSERT_TRUE(values.contains(diff)) << values.dump();
    const double own = steps["ep1"].at(step)[diff].get<double>();
    std::cout << "step " << step << ": log-prob gap " << values[diff] << " with moved routes, "
              << own << " with the engines'\n";
    EXPECT_GT(values[diff].get<double>(), 20 * own + 1e-4)
        << "step " << step << ": the moved routes were not replayed";
  }

  // Replay off, routing returned: the agreement metric.
  std::vector<std::string> measure = common;
  measure.insert(measure.end(), {"--set", "algorithm.use_rollout_routing_replay=false", "--set",
                                 "rollout.return_routed_experts=true"});
  for (const auto& [name, files] :
       std::vector<std::pair<std::string, std::string>>{{"own", replayed}, {"moved-own", shifted}}) {
    steps[name] = TrainSavedRollouts(config, files, name, 1, 1, 1, measure, &logs);
    ASSERT_EQ(steps[name].size(), 2u) << name << ": " << logs;
  }
  const std::string key = "train/routing_agreement";
  for (const auto& [step, values] : steps["own"]) {
    const Json& moved = steps["moved-own"].at(step);
    ASSERT_TRUE(values.contains(key)) << values.dump();
    ASSERT_TRUE(moved.contains(key)) << moved.dump();
    std::cout << "step " << step << ": routing_agreement " << values[key] << " (moved routes "
              << moved[key] << ")\n";
    EXPECT_GT(values[key].get<double>(), 0.95) << "step " << step;
    EXPECT_LT(moved[key].get<double>(), 0.6) << "step " << step;
  }
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
  ExpectTrainsOnTheEnginesLogProbsToTheBit(StepValues(dir_ / "run" / "metrics.jsonl"), 2, logs);
}

}  // namespace
}  // namespace slime
