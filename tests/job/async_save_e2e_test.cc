// checkpoint.async_save end to end: the real `slime_train --config` with a trainer worker process
// on CPU, training rollouts the test wrote itself (debug.load_debug_rollout_data; no engines) on
// a tiny random Qwen3, saving after every rollout. The test hook
// $SLIME_TEST_ASYNC_SAVE_DELAY_MS (train/checkpoint.h) holds each background write before each
// file, so the test acts while a write is certainly in progress:
//   - kill -9 of slime_train during the background write of iteration 1 leaves iteration 0 as
//     the tracker's checkpoint, loadable; the restarted job resumes from it at rollout 1 and
//     trains rollouts 1 and 2 exactly as an uninterrupted run with synchronous saves did;
//   - the write of the last checkpoint, still in flight when the loop ends, is completed before
//     the job exits (the stop's 3 s kill grace is shorter than the held write);
//   - SIGTERM during a background write: the job stops only after the write completed;
//   - a background write that fails (its temporary directory removed while held) fails the job
//     at the end, naming the checkpoint directory.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
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

constexpr char kDelayEnv[] = "SLIME_TEST_ASYNC_SAVE_DELAY_MS";
constexpr char kTracker[] = "latest_checkpointed_iteration.txt";

std::string IterDir(int64_t iteration) {
  char name[32];
  std::snprintf(name, sizeof name, "iter_%07lld", static_cast<long long>(iteration));
  return name;
}

// The command lines of every process (ps).
std::string ProcessList() {
  std::string out;
  FILE* p = ::popen("ps -eo args", "r");
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ::pclose(p);
  return out;
}

// rollout id -> the rollout's summary record.
std::map<int64_t, Json> RolloutRecords(const fs::path& jsonl) {
  std::map<int64_t, Json> out;
  for (const Json& r : ReadJsonl(jsonl)) {
    if (r.contains("perf/step_time")) out[r.at("rollout_id").get<int64_t>()] = r;
  }
  return out;
}

class AsyncSaveE2eTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const fs::path tokenizer = TestDataDir() / "qwen3";
    if (!fs::exists(tokenizer / "tokenizer.json")) {
      skip_ = new std::string(tokenizer.string() + " missing: run scripts/fetch_test_data.sh");
      return;
    }
    root_ = new fs::path(fs::temp_directory_path() /
                         ("slime_async_save_e2e_" + std::to_string(::getpid())));
    testing::RemoveTree(*root_);
    fs::create_directories(*root_);
    Child init({"init-model", "--config", SourceDir() + "/tests/data/model/configs/qwen3-tiny.json",
                "--tokenizer", tokenizer.string(), "--out", (*root_ / "model").string(), "--dtype",
                "fp32", "--seed", "3"},
               *root_);
    if (init.Wait(std::chrono::seconds(300)) != 0) {
      init_error_ = new std::string("init-model failed: " + init.err());
      return;
    }
    WriteRollouts(*root_ / "rollouts", 3);
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

  // Rollouts 0..n-1 as debug.save_debug_rollout_data writes them: 4 groups × 2 samples of a
  // 5-token prompt and a 6-token response with random ids, rewards +1 / -1 within each group.
  static void WriteRollouts(const fs::path& dir, int n) {
    fs::create_directories(dir);
    std::mt19937 rng(11);
    std::uniform_int_distribution<int> token(0, 151000);
    for (int id = 0; id < n; ++id) {
      Json groups = Json::array(), rewards = Json::array();
      for (int g = 0; g < 4; ++g) {
        Json group = Json::array();
        for (int i = 0; i < 2; ++i) {
          Json tokens = Json::array();
          for (int t = 0; t < 11; ++t) tokens.push_back(token(rng));
          const double reward = i == 0 ? 1.0 : -1.0;
          group.push_back({{"group_index", g},
                           {"index", 2 * g + i},
                           {"rollout_id", id},
                           {"prompt", "p"},
                           {"prompt_text", "p"},
                           {"tokens", tokens},
                           {"response_length", 6},
                           {"response", "r"},
                           {"label", "l"},
                           {"reward", reward},
                           {"raw_reward", reward},
                           {"loss_mask", Json::array({1, 1, 1, 1, 1, 1})},
                           {"rollout_log_probs", Json::array()},
                           {"status", "completed"},
                           {"metadata", Json::object()},
                           {"weight_versions", Json::array()},
                           {"remove_sample", false}});
          rewards.push_back(reward);
        }
        groups.push_back(group);
      }
      Json doc = {{"format", "slime-cpp rollout data"},
                  {"version", 1},
                  {"rollout_id", id},
                  {"samples", groups},
                  {"raw_rewards", rewards},
                  {"rewards", rewards},
                  {"metrics", Json::object()}};
      std::ofstream(dir / (std::to_string(id) + ".json")) << doc.dump();
    }
  }

  // A train-only job of `num_rollout` rollouts in `dir` (run dir dir/run, checkpoints dir/ckpt,
  // loaded from there when present), saving after every rollout.
  fs::path WriteConfig(const fs::path& dir, int num_rollout, bool async_save) {
    fs::create_directories(dir);
    const std::string yaml =
        "cluster:\n"
        "  device: cpu\n"
        "  cpu_slots_per_node: 2\n"
        "  actor_num_nodes: 1\n"
        "  actor_num_gpus_per_node: 1\n"
        "  rollout_num_gpus: 0\n"
        "  run_dir: " +
        (dir / "run").string() +
        "\n"
        "model:\n"
        "  hf_checkpoint: " +
        (*root_ / "model").string() +
        "\n"
        "data:\n"
        "  prompt_data: " +
        SourceDir() +
        "/data/demo/train.jsonl@[0:40]\n"
        "  label_key: label\n"
        "  apply_chat_template: true\n"
        "  rollout_batch_size: 4\n"
        "  n_samples_per_prompt: 2\n"
        "  num_rollout: " +
        std::to_string(num_rollout) +
        "\n"
        "debug:\n"
        "  load_debug_rollout_data: \"" +
        (*root_ / "rollouts").string() +
        "/{rollout_id}.json\"\n"
        "train:\n"
        "  bf16: false\n"
        "  lr: 1.0e-4\n"
        "  global_batch_size: 8\n"
        "  micro_batch_size: 4\n"
        "algorithm:\n"
        "  entropy_coef: 0.01\n"
        "checkpoint:\n"
        "  save: " +
        (dir / "ckpt").string() +
        "\n"
        "  load: " +
        (dir / "ckpt").string() +
        "\n"
        "  save_interval: 1\n"
        "  async_save: " +
        (async_save ? "true" : "false") + "\n";
    const fs::path path = dir / "job.yaml";
    std::ofstream(path) << yaml;
    return path;
  }

  // Waits until `path` exists (or `child` exited, or 300 s passed); whether it exists.
  static bool WaitForPath(const fs::path& path, Child& child) {
    const auto deadline = Clock::now() + std::chrono::seconds(300);
    while (!fs::exists(path) && Clock::now() < deadline && !child.Wait(std::chrono::seconds(0))) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return fs::exists(path);
  }

  static std::string Logs(const fs::path& dir, const Child& child) {
    std::string all = "stdout:\n" + child.out() + "\nstderr:\n" + child.err();
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir / "run" / "logs", ec)) {
      all += "\n--- " + e.path().filename().string() + "\n" + ReadFile(e.path());
    }
    return all;
  }

  static std::string* skip_;
  static std::string* init_error_;
  static fs::path* root_;
  fs::path dir_;
};
std::string* AsyncSaveE2eTest::skip_ = nullptr;
std::string* AsyncSaveE2eTest::init_error_ = nullptr;
fs::path* AsyncSaveE2eTest::root_ = nullptr;

TEST_F(AsyncSaveE2eTest, KillDuringABackgroundWriteLeavesThePreviousCheckpointToResumeFrom) {
  // The reference: three rollouts with synchronous saves, uninterrupted.
  const fs::path sync = dir_ / "sync";
  {
    Child run({"--config", WriteConfig(sync, 3, false).string()}, sync);
    ASSERT_EQ(run.Wait(std::chrono::seconds(400)), 0) << Logs(sync, run);
  }
  const std::map<int64_t, Json> reference = RolloutRecords(sync / "run" / "metrics.jsonl");
  ASSERT_EQ(reference.size(), 3u);

  // Async saves, each write held 1.5 s before each file: SIGKILL as soon as the write of
  // iteration 1 has created its temporary directory (iteration 0 is published by then: the save
  // of rollout 1 waited for it).
  const fs::path a = dir_ / "async";
  const fs::path ckpt = a / "ckpt";
  const fs::path config = WriteConfig(a, 3, true);
  {
    Child run({"--config", config.string()}, a, {.env = {{kDelayEnv, "1500"}}});
    ASSERT_TRUE(WaitForPath(ckpt / (".tmp-" + IterDir(1)), run)) << Logs(a, run);
    run.Signal(SIGKILL);
    ASSERT_EQ(run.Wait(std::chrono::seconds(30)), 128 + SIGKILL);
    // The trainer worker dies with its parent (PR_SET_PDEATHSIG); none may write on.
    const std::string head =
        Json::parse(ReadFile(a / "run" / "head.json")).at("address").get<std::string>();
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    while (ProcessList().find("--head " + head) != std::string::npos && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ASSERT_EQ(ProcessList().find("--head " + head), std::string::npos) << ProcessList();
  }
  // The kill landed during the write: its temporary directory is still there, unpublished.
  EXPECT_TRUE(fs::exists(ckpt / (".tmp-" + IterDir(1))));
  EXPECT_FALSE(fs::exists(ckpt / IterDir(1)));
  EXPECT_EQ(ReadFile(ckpt / kTracker), "0");
  EXPECT_TRUE(fs::exists(ckpt / IterDir(0) / "trainer_state.json"));

  // The same command resumes from iteration 0 at rollout 1 and finishes.
  Child again({"--config", config.string()}, a);
  ASSERT_EQ(again.Wait(std::chrono::seconds(400)), 0) << Logs(a, again);
  const std::string out = again.out();
  EXPECT_NE(out.find("resumed from " + (ckpt / IterDir(0)).string() + " at rollout 1"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("done: rollouts 1..2"), std::string::npos) << out;
  EXPECT_EQ(ReadFile(ckpt / kTracker), "2");
  EXPECT_FALSE(fs::exists(ckpt / (".tmp-" + IterDir(1)))) << "the next save removes leftovers";
  // Rollouts 1 and 2 train as in the uninterrupted run.
  const std::map<int64_t, Json> resumed = RolloutRecords(a / "run" / "metrics.jsonl");
  for (int64_t id : {1, 2}) {
    ASSERT_TRUE(resumed.count(id)) << id;
    for (const char* key : {"train/loss", "train/pg_loss", "train/grad_norm"}) {
      ASSERT_TRUE(reference.at(id).contains(key)) << key;
      ASSERT_TRUE(resumed.at(id).contains(key)) << key;
      const double want = reference.at(id).at(key).get<double>();
      const double got = resumed.at(id).at(key).get<double>();
      EXPECT_NEAR(got, want, 1e-6 + 1e-5 * std::abs(want)) << key << " of rollout " << id;
    }
    EXPECT_TRUE(resumed.at(id).contains("perf/save_wait_time")) << resumed.at(id).dump();
  }
}

TEST_F(AsyncSaveE2eTest, TheLastBackgroundWriteCompletesBeforeTheJobExits) {
  // Each write is held 1 s before each of its 6 steps: longer than the 3 s a stopping worker
  // gets before it is killed, so only an explicit wait completes it.
  const fs::path config = WriteConfig(dir_, 2, true);
  Child run({"--config", config.string()}, dir_, {.env = {{kDelayEnv, "1000"}}});
  ASSERT_EQ(run.Wait(std::chrono::seconds(400)), 0) << Logs(dir_, run);
  const fs::path ckpt = dir_ / "ckpt";
  EXPECT_EQ(ReadFile(ckpt / kTracker), "1");
  EXPECT_TRUE(fs::exists(ckpt / IterDir(1) / "trainer_state.json"));
  EXPECT_TRUE(fs::exists(ckpt / IterDir(0) / "trainer_state.json"));
  for (const auto& e : fs::directory_iterator(ckpt)) {
    EXPECT_NE(e.path().filename().string().rfind(".tmp-", 0), 0u) << e.path();
  }
  // The save calls returned before their writes finished; the second waited for the first.
  const std::map<int64_t, Json> records = RolloutRecords(dir_ / "run" / "metrics.jsonl");
  ASSERT_EQ(records.size(), 2u);
  EXPECT_LT(records.at(0).at("perf/save_time").get<double>(), 5.0) << records.at(0).dump();
  EXPECT_GT(records.at(1).value("perf/save_background_time", 0.0), 5.0) << records.at(1).dump();
}

TEST_F(AsyncSaveE2eTest, SigtermDuringABackgroundWriteStopsAfterItCompleted) {
  const fs::path config = WriteConfig(dir_, 3, true);
  const fs::path ckpt = dir_ / "ckpt";
  Child run({"--config", config.string()}, dir_, {.env = {{kDelayEnv, "1000"}}});
  ASSERT_TRUE(WaitForPath(ckpt / (".tmp-" + IterDir(0)), run)) << Logs(dir_, run);
  run.Signal(SIGTERM);
  ASSERT_EQ(run.Wait(std::chrono::seconds(120)), 128 + SIGTERM) << Logs(dir_, run);
  EXPECT_EQ(ReadFile(ckpt / kTracker), "0") << Logs(dir_, run);
  EXPECT_TRUE(fs::exists(ckpt / IterDir(0) / "trainer_state.json"));
}

TEST_F(AsyncSaveE2eTest, AFailedBackgroundWriteFailsTheJobNamingTheCheckpoint) {
  const fs::path config = WriteConfig(dir_, 1, true);
  const fs::path ckpt = dir_ / "ckpt";
  Child run({"--config", config.string()}, dir_, {.env = {{kDelayEnv, "1000"}}});
  ASSERT_TRUE(WaitForPath(ckpt / (".tmp-" + IterDir(0)), run)) << Logs(dir_, run);
  testing::RemoveTree(ckpt / (".tmp-" + IterDir(0)));  // the write is held before its first file
  ASSERT_EQ(run.Wait(std::chrono::seconds(120)), 1) << Logs(dir_, run);
  const std::string err = run.err();
  EXPECT_NE(err.find("background write of " + (ckpt / IterDir(0)).string() + " failed"),
            std::string::npos)
      << err;
  EXPECT_FALSE(fs::exists(ckpt / kTracker));
}

}  // namespace
}  // namespace slime
