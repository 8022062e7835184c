// The real `slime_train --config` on the tiny random Qwen3 model on CPU (one trainer, two
// engines, worker processes), with the debug and observability keys on:
//   cluster.train_env_vars           the trainer process's environment has the variable (read
//                                    from /proc while the job runs); the engines' does not;
//   fault_tolerance.health_check_*   checks run while generating and kill no healthy engine;
//   debug.ci_test (+ use_kl_loss)    a matched first step passes; ci_kl_threshold 0 fails the
//                                    job naming the check;
//   debug.ci_save_grad_norm          one file per step holding train/grad_norm;
//   debug.dump_details               the rollouts and the trainer's train data, read back: the
//                                    trained samples are the rollout's, with advantages and
//                                    log-probs per response token;
//   debug.load_debug_rollout_data_subsample  a train-only run on half of the saved groups trains
//                                    exactly the first and the last group;
//   metrics.log_multi_turn / log_correct_samples / log_reward_category   in metrics.jsonl;
//   weight_sync.check_weight_update_equal   every sync's engine checksums equal the trainer's.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "child_process.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "remove_tree.h"
#include "test_paths.h"

namespace slime {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;
using slime::testing::Child;
using slime::testing::ReadFile;
using slime::testing::ReadJsonl;
using slime::testing::SourceDir;
using slime::testing::TestDataDir;
using slime::testing::WorkerPid;

// The NUL-separated environment a process was started with.
std::vector<std::string> Environ(pid_t pid) {
  const std::string text = ReadFile("/proc/" + std::to_string(pid) + "/environ");
  std::vector<std::string> out;
  std::string item;
  for (char c : text) {
    if (c == '\0') {
      out.push_back(item);
      item.clear();
    } else {
      item.push_back(c);
    }
  }
  return out;
}

bool Contains(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

std::string Logs(const fs::path& run_dir, const Child& child) {
  std::string all = child.err();
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(run_dir / "logs", ec)) all += ReadFile(e.path());
  return all;
}

size_t Count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

class DriverDebugE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const fs::path tokenizer = TestDataDir() / "qwen3";
    if (!fs::exists(tokenizer / "tokenizer.json")) {
      GTEST_SKIP() << tokenizer << " missing: run scripts/fetch_test_data.sh";
    }
    dir_ = fs::temp_directory_path() /
           ("slime_driver_debug_e2e_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    testing::RemoveTree(dir_.string());
    fs::create_directories(dir_);
    Child init({"init-model", "--config", SourceDir() + "/tests/data/model/configs/qwen3-tiny.json",
                "--tokenizer", tokenizer.string(), "--out", (dir_ / "model").string(), "--dtype",
                "fp32", "--seed", "3"},
               dir_);
    ASSERT_EQ(init.Wait(std::chrono::seconds(120)), 0) << init.err();
  }
  void TearDown() override {
    if (!dir_.empty()) testing::RemoveTree(dir_.string());
  }

  // Two engines + one trainer on CPU slots, 4 prompts × 2 samples of at most 6 tokens per
  // rollout, one optimizer step per rollout, a KL loss to the initial model, no eval.
  fs::path WriteConfig(int num_rollout, const std::string& extra) {
    const std::string src = SourceDir();
    const std::string yaml =
        "cluster:\n"
        "  device: cpu\n"
        "  cpu_slots_per_node: 4\n"
        "  actor_num_nodes: 1\n"
        "  actor_num_gpus_per_node: 1\n"
        "  rollout_num_gpus: 2\n"
        "  rollout_num_gpus_per_engine: 1\n"
        "  run_dir: " +
        (dir_ / "run").string() +
        "\n"
        "model:\n"
        "  hf_checkpoint: " +
        (dir_ / "model").string() +
        "\n"
        "data:\n"
        "  prompt_data: " +
        src +
        "/data/demo/train.jsonl@[0:40]\n"
        "  label_key: label\n"
        "  apply_chat_template: true\n"
        "  rollout_batch_size: 4\n"
        "  n_samples_per_prompt: 2\n"
        "  num_rollout: " +
        std::to_string(num_rollout) +
        "\n"
        "rollout:\n"
        "  max_response_len: 6\n"
        "reward:\n"
        "  rm_type: exact_match\n"
        "algorithm:\n"
        "  use_kl_loss: true\n"
        "  kl_loss_coef: 0.01\n"
        "train:\n"
        "  bf16: false\n"
        "  lr: 1.0e-4\n"
        "  global_batch_size: 8\n"
        "  micro_batch_size: 4\n"
        "checkpoint:\n"
        "  ref_load: " +
        (dir_ / "model").string() + "\n" + extra;
    const fs::path path = dir_ / "job.yaml";
    std::ofstream(path) << yaml;
    return path;
  }

  fs::path dir_;
};

TEST_F(DriverDebugE2eTest, DebugAndObservabilityKeysOfARealJob) {
  const fs::path dump = dir_ / "dump";
  const fs::path config =
      WriteConfig(2,
                  "debug:\n"
                  "  ci_test: true\n"
                  "  dump_details: " +
                      dump.string() +
                      "\n"
                      "  ci_save_grad_norm: " +
                      (dir_ / "grad" / "{role}_{rollout_id}_{step_id}.txt").string() +
                      "\n"
                      "metrics:\n"
                      "  log_multi_turn: true\n"
                      "  log_correct_samples: true\n"
                      "  log_reward_category: engine\n"
                      "weight_sync:\n"
                      "  check_weight_update_equal: true\n"
                      "fault_tolerance:\n"
                      "  health_check_first_wait: 0\n"
                      "  health_check_interval: 0.2\n");
  const fs::path run_dir = dir_ / "run";
  Child run(
      {"--config", config.string(), "--set", "cluster.train_env_vars={SLIME_WIRING_PROBE: hello}"},
      dir_);
  // cluster.train_env_vars: read the trainer's environment while it runs.
  std::vector<std::string> trainer_env, engine_env;
  const auto deadline = Clock::now() + std::chrono::seconds(200);
  while ((trainer_env.empty() || engine_env.empty()) && Clock::now() < deadline &&
         !run.Wait(std::chrono::seconds(0))) {
    if (trainer_env.empty()) {
      if (pid_t pid = WorkerPid(run_dir, "trainer-0"); pid > 0) trainer_env = Environ(pid);
    }
    if (engine_env.empty()) {
      if (pid_t pid = WorkerPid(run_dir, "engine-0"); pid > 0) engine_env = Environ(pid);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::optional<int> code = run.Wait(std::chrono::seconds(400));
  const std::string logs = Logs(run_dir, run);
  ASSERT_EQ(code, 0) << "stdout:\n" << run.out() << "\nlogs:\n" << logs;
  ASSERT_FALSE(trainer_env.empty()) << "the trainer process was not seen";
  EXPECT_TRUE(Contains(trainer_env, "SLIME_WIRING_PROBE=hello"));
  ASSERT_FALSE(engine_env.empty()) << "the engine process was not seen";
  EXPECT_FALSE(Contains(engine_env, "SLIME_WIRING_PROBE=hello")) << "engines do not get them";

  // weight_sync.check_weight_update_equal: the first push and the two syncs were checked.
  EXPECT_EQ(Count(logs, "engine(s) hold the trainer's"), 3u) << logs;
  // Health checks ran while generating and killed nothing.
  EXPECT_NE(logs.find("engine health checks: GET /health_generate every 0.2 s"), std::string::npos);
  EXPECT_EQ(logs.find("failed its health check"), std::string::npos) << logs;

  // Metrics of both rollouts.
  std::map<int64_t, Json> rollouts;
  std::map<int64_t, double> grad_norms;  // step -> train/grad_norm
  for (const Json& r : ReadJsonl(run_dir / "metrics.jsonl")) {
    if (r.contains("rollout/raw_reward")) rollouts[r.at("rollout_id").get<int64_t>()] = r;
    if (r.contains("step") && r["step"].is_number() && r.contains("train/grad_norm")) {
      grad_norms[r["step"].get<int64_t>()] = r["train/grad_norm"].get<double>();
    }
  }
  ASSERT_EQ(rollouts.size(), 2u);
  for (const auto& [id, r] : rollouts) {
    for (const char* key :
         {"multi_turn/raw_response_length/response_length_mean",
          "multi_turn/raw_response_length/response_length_clip_ratio",
          "multi_turn/wo_obs_response_length/response_length_max",
          "multi_turn/multi_turn_metric/round_number_mean", "rollout/correct_length/p25",
          "rollout/correct_length/p100", "rollout/trainer/correct_entropy",
          "rollout/trainer/log_probs", "rollout/trainer/ref_log_probs", "engine_health/rounds",
          "train/kl_loss"}) {
      EXPECT_TRUE(r.contains(key)) << key << " missing in rollout " << id << ": " << r.dump();
    }
    // Plain generation: one model turn, no observation tokens.
    EXPECT_EQ(r.value("multi_turn/multi_turn_metric/round_number_mean", -1.0), 1.0);
    EXPECT_EQ(r.value("multi_turn/raw_response_length/response_length_mean", -1.0),
              r.value("multi_turn/wo_obs_response_length/response_length_mean", -2.0));
    // The samples by the engine that generated them: each engine's share, summing to 1.
    double shares = 0;
    int categories = 0;
    for (const auto& [k, v] : r.items()) {
      if (k.rfind("rollout/error_cat/", 0) == 0) {
        shares += v.get<double>();
        ++categories;
        EXPECT_TRUE(r.contains("rollout/reward_cat/" + k.substr(18) + "/raw_reward")) << k;
      }
    }
    EXPECT_GE(categories, 1) << r.dump();
    EXPECT_NEAR(shares, 1.0, 1e-9) << r.dump();
    EXPECT_GE(r.value("engine_health/rounds", 0.0), 1.0) << r.dump();
    EXPECT_EQ(r.value("engine_health/failures", -1.0), 0.0);
    EXPECT_EQ(r.value("rollout/engine_restarts", -1.0), 0.0);
  }
  // ci_test's rollout-0 check held: the old-actor pass (log_correct_samples) equals the reference.
  EXPECT_EQ(rollouts[0].value("rollout/trainer/log_probs", 1.0),
            rollouts[0].value("rollout/trainer/ref_log_probs", 2.0));

  // debug.ci_save_grad_norm: one file per step ({step_id} = 0, the rollout's only step; the
  // run's step s is rollout s's), holding the logged value.
  ASSERT_EQ(grad_norms.size(), 2u);
  for (const auto& [step, norm] : grad_norms) {
    const fs::path file = dir_ / "grad" / ("actor_" + std::to_string(step) + "_0.txt");
    ASSERT_TRUE(fs::exists(file)) << file;
    EXPECT_NEAR(std::stod(ReadFile(file)), norm, 1e-12 * (1 + norm)) << file;
  }

  // debug.dump_details: the rollouts and what the trainer trained on, read back.
  for (int64_t id : {0, 1}) {
    const Json rollout =
        Json::parse(ReadFile(dump / "rollout_data" / (std::to_string(id) + ".json")));
    std::vector<Json> samples;
    for (const Json& group : rollout.at("samples")) {
      for (const Json& s : group) samples.push_back(s);
    }
    ASSERT_EQ(samples.size(), 8u);
    const fs::path file = dump / "train_data" / (std::to_string(id) + "_0.json");
    ASSERT_TRUE(fs::exists(file)) << file;
    const Json train = Json::parse(ReadFile(file));
    EXPECT_EQ(train.at("format"), "slime-cpp train data");
    EXPECT_EQ(train.at("version"), 1);
    EXPECT_EQ(train.at("rollout_id"), id);
    EXPECT_EQ(train.at("rank"), 0);
    EXPECT_EQ(train.at("batch_samples"), 8);
    ASSERT_EQ(train.at("samples").size(), 8u);
    ASSERT_EQ(train.at("steps").size(), 1u);
    for (size_t i = 0; i < 8; ++i) {
      const Json& t = train.at("samples")[i];
      EXPECT_EQ(t.at("index"), i);
      EXPECT_EQ(t.at("tokens"), samples[i].at("tokens")) << "rollout " << id << " sample " << i;
      const size_t response = t.at("response_length").get<size_t>();
      EXPECT_EQ(response, samples[i].at("response_length").get<size_t>());
      for (const char* key :
           {"loss_mask", "advantages", "log_probs", "ref_log_probs", "rollout_log_probs"}) {
        ASSERT_TRUE(t.contains(key)) << key << ": " << t.dump();
        EXPECT_EQ(t.at(key).size(), response) << key;
      }
    }
  }

  // debug.load_debug_rollout_data_subsample: train-only on half of the saved groups (4 → 2:
  // the first and the last), its train data dumped.
  const fs::path sub = dir_ / "sub";
  fs::create_directories(sub);
  Child train(
      {"--config",
       config.string(),
       "--set",
       "debug.load_debug_rollout_data=" + (dump / "rollout_data" / "{rollout_id}.json").string(),
       "--set",
       "debug.load_debug_rollout_data_subsample=0.5",
       "--set",
       "debug.dump_details=null",
       "--set",
       "debug.save_debug_rollout_data=null",
       "--set",
       "debug.save_debug_train_data=" + (sub / "{rollout_id}_{rank}.json").string(),
       "--set",
       "debug.ci_save_grad_norm=null",
       "--set",
       "cluster.rollout_num_gpus=0",
       "--set",
       "train.global_batch_size=4",
       "--set",
       "cluster.run_dir=" + (sub / "run").string()},
      sub);
  code = train.Wait(std::chrono::seconds(300));
  ASSERT_EQ(code, 0) << "stdout:\n" << train.out() << "\nlogs:\n" << Logs(sub / "run", train);
  EXPECT_NE(train.err().find("2 of the 4 prompt groups"), std::string::npos) << train.err();
  for (int64_t id : {0, 1}) {
    const Json rollout =
        Json::parse(ReadFile(dump / "rollout_data" / (std::to_string(id) + ".json")));
    const Json& groups = rollout.at("samples");
    std::vector<Json> kept;  // groups 0 and 3
    for (size_t g : {size_t{0}, size_t{3}}) {
      for (const Json& s : groups[g]) kept.push_back(s.at("tokens"));
    }
    const Json train_data = Json::parse(ReadFile(sub / (std::to_string(id) + "_0.json")));
    ASSERT_EQ(train_data.at("samples").size(), kept.size()) << "rollout " << id;
    for (size_t i = 0; i < kept.size(); ++i) {
      EXPECT_EQ(train_data.at("samples")[i].at("tokens"), kept[i]) << "rollout " << id << " " << i;
    }
  }
}

// debug.ci_test's failure path: a bound of 0 on the first-step KL (which is exactly 0) fails the
// job after rollout 0's training, naming the check and the key.
TEST_F(DriverDebugE2eTest, AViolatedCiCheckFailsTheJobNamingIt) {
  const fs::path config = WriteConfig(1, "debug:\n  ci_test: true\n  ci_kl_threshold: 0\n");
  Child run({"--config", config.string()}, dir_);
  std::optional<int> code = run.Wait(std::chrono::seconds(300));
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 1) << run.err();
  const std::string err = run.err();
  EXPECT_NE(err.find("slime_train: error: debug.ci_test: rollout 0, step 0"), std::string::npos)
      << err;
  EXPECT_NE(err.find("debug.ci_kl_threshold = 0"), std::string::npos) << err;
  // The step was logged before the check failed the job.
  bool logged = false;
  for (const Json& r : ReadJsonl(dir_ / "run" / "metrics.jsonl"))
    logged |= r.contains("train/ppo_kl");
  EXPECT_TRUE(logged);
}

}  // namespace
}  // namespace slime
