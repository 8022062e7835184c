// The real `slime_train --config` on a tiny random Qwen3 model on CPU: the driver starts a
// trainer and two engines as worker processes, runs slime's loop (eval → generate → train →
// save → Gloo weight sync → eval), writes metrics, resumes from its checkpoint, serves
// Prometheus /metrics (checked with promtool) and stops cleanly on SIGTERM; with --async the
// generation of rollout N+1 overlaps training on N, samples are one weight version stale, and a
// run stopped mid-generation resumes with the prompts of an uninterrupted run.
// An engine worker killed mid-rollout is restarted, resynced and its groups retried, unless
// restarts are off (then the job fails naming it). Two data-parallel trainer processes (Gloo
// all-reduce) train saved rollouts exactly as one trainer does; so do tensor-parallel ones (TP=2,
// TP=2 × DP=2), whose weight sync (Gloo group, disk) gives the engines the trainer's weights;
// so do pipeline-parallel ones (PP=2, PP=2 × DP=2; stage 1 sends its layers to rank 0 for the
// sync, also for a restarted engine's resync), and bad pipeline layouts fail naming the
// settings. A multi-turn GRPO job runs its
// episodes against the example calculator environment (real HTTP) and trains on them.
// On-policy distillation from a teacher served by `slime_train serve` pulls the student to it;
// an unreachable teacher fails the job naming it.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "child_process.h"
#include "job_runs.h"
#include "fmt/format.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "promtool.h"
#include "slime/http/client.h"
#include "slime/http/server.h"
#include "test_paths.h"

namespace slime {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;

using slime::testing::SourceDir;
using slime::testing::Child;
using slime::testing::ReadFile;
using slime::testing::ReadJsonl;
using slime::testing::WorkerPid;
using slime::testing::ExpectEnginesMatchTrainer;
using slime::testing::ExpectSameTrainMetrics;
using slime::testing::ExpectTrainsOnTheEnginesLogProbsToTheBit;
using slime::testing::ReadLogs;
using slime::testing::RunToCompletion;
using slime::testing::StepValues;
class DriverE2eTest : public testing::TinyModelJobTest {
 protected:
  static void SetUpTestSuite() { InitModel("qwen3-tiny.json", 3, "slime_driver_e2e_"); }
};

TEST_F(DriverE2eTest, TrainsSavesAndAnInterruptedRunResumesAtTheNextRollout) {
  const fs::path config = WriteConfig(3);
  {
    // Interrupted (SIGTERM) once rollout 1 is trained, saved, synced and evaluated.
    Child run({"--config", config.string()}, dir_);
    const auto deadline = Clock::now() + std::chrono::seconds(400);
    while (run.out().find("rollout 1/3 |") == std::string::npos && Clock::now() < deadline &&
           !run.Wait(std::chrono::seconds(0))) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    run.Signal(SIGTERM);
    std::optional<int> code = run.Wait(std::chrono::seconds(60));
    ASSERT_EQ(code, 128 + SIGTERM) << "stdout:\n" << run.out() << "\nstderr:\n" << run.err();
    const std::string out = run.out();
    EXPECT_NE(out.find("eval @ rollout 0 | add2"), std::string::npos) << out;
    EXPECT_NE(out.find("rollout 0/3 | reward"), std::string::npos) << out;
    EXPECT_NE(run.err().find("stopped by signal"), std::string::npos) << run.err();
  }
  // The checkpoint of rollout 1, with the data source's position beside it.
  EXPECT_EQ(ReadFile(dir_ / "ckpt" / "latest_checkpointed_iteration.txt").substr(0, 1), "1");
  EXPECT_TRUE(fs::exists(dir_ / "ckpt" / "rollout" / "data_source_state_1.json"));
  EXPECT_TRUE(fs::exists(dir_ / "ckpt" / "rollout" / "coordinator_state_1.json"));

  std::vector<Json> records = ReadJsonl(dir_ / "run" / "metrics.jsonl");
  int rollouts = 0, steps = 0, evals = 0;
  for (const Json& r : records) {
    if (r.contains("rollout/raw_reward")) {
      ++rollouts;
      for (const char* key : {"perf/rollout_time", "perf/train_time", "perf/save_time",
                              "perf/update_weights_time", "perf/step_time", "train/loss",
                              "rollout/response_len/mean"}) {
        EXPECT_TRUE(r.contains(key)) << key << " missing in " << r.dump();
      }
    }
    if (r.contains("step") && r.contains("train/pg_loss")) ++steps;
    if (r.contains("eval/add2")) ++evals;
  }
  EXPECT_EQ(rollouts, 2);
  EXPECT_EQ(steps, 2);  // global_batch_size 8 = one optimizer step per rollout
  EXPECT_EQ(evals, 3);  // before training and after rollouts 0 and 1

  // The same command again continues at rollout 2 and finishes the run.
  Child again({"--config", config.string()}, dir_);
  std::optional<int> code = again.Wait(std::chrono::seconds(400));
  ASSERT_EQ(code, 0) << "stdout:\n" << again.out() << "\nstderr:\n" << again.err();
  const std::string out = again.out();
  EXPECT_NE(out.find("at rollout 2"), std::string::npos) << out;
  EXPECT_EQ(out.find("rollout 1/3"), std::string::npos) << out;
  EXPECT_EQ(out.find("eval @ rollout 0 "), std::string::npos) << "no eval before training on resume";
  EXPECT_NE(out.find("rollout 2/3 | reward"), std::string::npos) << out;
  EXPECT_NE(out.find("done: rollouts 2..2"), std::string::npos) << out;
  EXPECT_EQ(ReadFile(dir_ / "ckpt" / "latest_checkpointed_iteration.txt").substr(0, 1), "2");
  // The data source continued: rollout 2 took the 4 prompts after rollout 1's.
  Json state = Json::parse(ReadFile(dir_ / "ckpt" / "rollout" / "data_source_state_2.json"));
  EXPECT_EQ(state.at("sample_offset").get<int64_t>(), 12);  // 3 rollouts × 4 prompts
}

TEST_F(DriverE2eTest, ServesMetricsAndStopsEveryProcessOnSigterm) {
  // metrics.prometheus_host: /metrics listens on that interface only (127.0.0.2, another
  // loopback address), which driver.json's metrics_url names.
  const fs::path config =
      WriteConfig(1000, "metrics:\n  prometheus_port: 0\n  prometheus_host: 127.0.0.2\n");
  Child run({"--config", config.string()}, dir_);
  // driver.json names the metrics endpoint; wait for the first rollout's gauges.
  const fs::path driver_file = dir_ / "run" / "driver.json";
  std::string exposition;
  const auto deadline = Clock::now() + std::chrono::seconds(300);
  while (Clock::now() < deadline) {
    if (fs::exists(driver_file)) {
      Json d = Json::parse(ReadFile(driver_file), nullptr, false);
      if (!d.is_discarded()) {
        const int port = d.at("metrics_port").get<int>();
        EXPECT_EQ(d.value("metrics_url", ""), fmt::format("http://127.0.0.2:{}/metrics", port));
        http::Client client("127.0.0.2", port);
        auto resp = client.Get("/metrics");
        http::Client other("127.0.0.1", port);
        auto elsewhere = other.Get("/metrics");
        EXPECT_FALSE(elsewhere.ok() && elsewhere->status == 200)
            << "/metrics answers on 127.0.0.1 too: it should listen on 127.0.0.2 only";
        if (resp.ok() && resp->status == 200 &&
            resp->body.find("slime_rollout_raw_reward") != std::string::npos) {
          exposition = resp->body;
          break;
        }
      }
    }
    if (run.Wait(std::chrono::seconds(0))) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  ASSERT_FALSE(exposition.empty()) << "no rollout metrics on the driver's /metrics\nstdout:\n"
                                   << run.out() << "\nstderr:\n" << run.err();
  for (const char* name : {"slime_train_loss", "slime_perf_step_time", "slime_perf_update_weights_bytes_per_seconds", "slime_driver_rollout_id",
                           "slime_runtime_nodes_alive"}) {
    EXPECT_NE(exposition.find(name), std::string::npos) << name << "\n" << exposition;
  }
  testing::PromtoolResult check = testing::PromtoolCheckMetrics(exposition);
  ASSERT_TRUE(check.ran) << check.output;
  EXPECT_EQ(check.exit_code, 0) << check.output << "\n" << exposition;

  run.Signal(SIGTERM);
  std::optional<int> code = run.Wait(std::chrono::seconds(60));
  ASSERT_TRUE(code.has_value()) << "the driver did not stop within 60 s of SIGTERM";
  EXPECT_EQ(*code, 128 + SIGTERM) << run.err();
  // Every worker process is gone: head.json's run dir has no live workers left (their logs
  // say they stopped) — check that no process still has the run dir's head address.
  Json head = Json::parse(ReadFile(dir_ / "run" / "head.json"));
  const std::string address = head.at("address").get<std::string>();
  const std::string ps = [] {
    std::string out;
    FILE* p = ::popen("ps -eo args", "r");
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    ::pclose(p);
    return out;
  }();
  EXPECT_EQ(ps.find("--head " + address), std::string::npos) << ps;
}

// ---- --async: slime's train_async.py (one-step off-policy) ----------------------------------

// The samples of one rollout saved by debug.save_debug_rollout_data, group by group.
std::vector<Json> SavedSamples(const fs::path& file) {
  Json doc = Json::parse(ReadFile(file));
  std::vector<Json> out;
  for (const Json& group : doc.at("samples")) {
    for (const Json& s : group) out.push_back(s);
  }
  return out;
}

// What identifies a rollout's prompts: each sample's (group_index, index, prompt, label).
std::vector<std::string> PromptOrder(const fs::path& file) {
  std::vector<std::string> out;
  for (const Json& s : SavedSamples(file)) {
    out.push_back(
        Json::array({s.at("group_index"), s.at("index"), s.at("prompt_text"), s.at("label")})
            .dump());
  }
  return out;
}

std::map<int64_t, Json> RolloutRecords(const fs::path& jsonl) {
  std::map<int64_t, Json> out;
  for (const Json& r : ReadJsonl(jsonl)) {
    if (r.contains("rollout/raw_reward")) out[r.at("rollout_id").get<int64_t>()] = r;
  }
  return out;
}

TEST_F(DriverE2eTest, AsyncOverlapsGenerationWithTrainingAndResumesWithTheSamePrompts) {
  const fs::path base = dir_;
  // 4 rollouts, each rollout's samples saved to <dir>/rollouts/<id>.json.
  auto config_in = [&](const fs::path& dir) {
    dir_ = dir;
    fs::create_directories(dir_);
    return WriteConfig(4, "debug:\n  save_debug_rollout_data: \"" + dir.string() +
                              "/rollouts/{rollout_id}.json\"\n");
  };
  // A: an uninterrupted async run of 4 rollouts.
  const fs::path a = base / "a";
  {
    Child run({"--config", config_in(a).string(), "--async"}, a);
    std::optional<int> code = run.Wait(std::chrono::seconds(400));
    ASSERT_EQ(code, 0) << "stdout:\n" << run.out() << "\nstderr:\n" << run.err();
    EXPECT_NE(run.out().find("done: rollouts 0..3"), std::string::npos) << run.out();
  }
  std::map<int64_t, Json> records = RolloutRecords(a / "run" / "metrics.jsonl");
  ASSERT_EQ(records.size(), 4u);
  int evals = 0;
  for (const Json& r : ReadJsonl(a / "run" / "metrics.jsonl")) evals += r.contains("eval/add2");
  EXPECT_EQ(evals, 5);  // before training and after every rollout
  for (const auto& [id, r] : records) {
    for (const char* key : {"perf/rollout_time", "perf/rollout_wait_time", "perf/train_time",
                            "perf/save_time", "perf/update_weights_time", "perf/eval_time",
                            "perf/step_time", "train/loss", "rollout/response_len/mean",
                            "timeline/generate_start_s", "timeline/generate_end_s",
                            "timeline/train_start_s", "timeline/train_end_s",
                            "rollout/weight_staleness/max"}) {
      EXPECT_TRUE(r.contains(key)) << key << " missing in " << r.dump();
    }
    if (id > 0) {
      EXPECT_TRUE(r.contains("perf/rollout_train_overlap_time")) << r.dump();
    }
    // One policy version stale after the first rollout: the engines generated rollout N with
    // the weights trained through rollout N-2 (version N-1).
    EXPECT_EQ(r.value("rollout/weight_staleness/max", -1.0), id == 0 ? 0.0 : 1.0) << id;
    const std::string expected = std::to_string(id == 0 ? 0 : id - 1);
    for (const Json& s : SavedSamples(a / "rollouts" / (std::to_string(id) + ".json"))) {
      for (const Json& v : s.at("weight_versions")) EXPECT_EQ(v.get<std::string>(), expected) << id;
    }
  }
  // The generation of rollout N+1 started before rollout N's training and ran during it.
  for (int64_t id = 0; id + 1 < 4; ++id) {
    const Json& cur = records.at(id);
    const Json& next = records.at(id + 1);
    const double train_start = cur.at("timeline/train_start_s").get<double>();
    const double train_end = cur.at("timeline/train_end_s").get<double>();
    const double gen_start = next.at("timeline/generate_start_s").get<double>();
    const double gen_end = next.at("timeline/generate_end_s").get<double>();
    EXPECT_LE(gen_start, train_start) << "rollout " << id + 1;
    EXPECT_GT(std::min(gen_end, train_end) - std::max(gen_start, train_start), 0.0)
        << "generation of rollout " << id + 1 << " did not overlap training of rollout " << id;
    EXPECT_GT(next.at("perf/rollout_train_overlap_time").get<double>(), 0.0);
  }

  // B: the same run, stopped by SIGTERM after rollout 1 while rollout 2 is trained and rollout
  // 3 generates, then resumed.
  const fs::path b = base / "b";
  const fs::path config_b = config_in(b);
  {
    Child run({"--config", config_b.string(), "--async"}, b);
    const auto deadline = Clock::now() + std::chrono::seconds(400);
    while (run.out().find("rollout 1/4 |") == std::string::npos && Clock::now() < deadline &&
           !run.Wait(std::chrono::seconds(0))) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    run.Signal(SIGTERM);
    std::optional<int> code = run.Wait(std::chrono::seconds(60));
    ASSERT_TRUE(code.has_value()) << "no exit within 60 s of SIGTERM";
    ASSERT_EQ(code, 128 + SIGTERM) << "stdout:\n" << run.out() << "\nstderr:\n" << run.err();
  }
  const int64_t saved = std::stoll(ReadFile(b / "ckpt" / "latest_checkpointed_iteration.txt"));
  ASSERT_GE(saved, 1);
  ASSERT_LE(saved, 2);
  // The data source saved with checkpoint N is the one after rollout N was drawn, although the
  // prefetched rollout N+1 had drawn its prompts by then.
  Json state = Json::parse(ReadFile(b / "ckpt" / "rollout" /
                                    ("data_source_state_" + std::to_string(saved) + ".json")));
  EXPECT_EQ(state.at("sample_offset").get<int64_t>(), (saved + 1) * 4);

  Child again({"--config", config_b.string(), "--async", "--set",
               "debug.save_debug_rollout_data=" + (b / "resumed").string() + "/{rollout_id}.json"},
              b);
  std::optional<int> code = again.Wait(std::chrono::seconds(400));
  ASSERT_EQ(code, 0) << "stdout:\n" << again.out() << "\nstderr:\n" << again.err();
  EXPECT_NE(again.out().find("at rollout " + std::to_string(saved + 1)), std::string::npos)
      << again.out();
  EXPECT_NE(again.out().find("done: rollouts " + std::to_string(saved + 1) + "..3"),
            std::string::npos)
      << again.out();
  for (int64_t id = saved + 1; id < 4; ++id) {
    const std::string name = std::to_string(id) + ".json";
    EXPECT_EQ(PromptOrder(b / "resumed" / name), PromptOrder(a / "rollouts" / name))
        << "rollout " << id << " prompts differ from the uninterrupted run";
  }
  // The first resumed rollout is generated with the checkpoint's weights (on policy), the next
  // one is one version stale again.
  for (const Json& s : SavedSamples(b / "resumed" / (std::to_string(saved + 1) + ".json"))) {
    for (const Json& v : s.at("weight_versions")) {
      EXPECT_EQ(v.get<std::string>(), std::to_string(saved + 1));
    }
  }
}

TEST_F(DriverE2eTest, AsyncRefusesColocatedJobsAndTrainerFailover) {
  const fs::path config = WriteConfig(1);
  Child run({"--config", config.string(), "--async", "--set", "cluster.colocate=true"}, dir_);
  std::optional<int> code = run.Wait(std::chrono::seconds(60));
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 2) << run.err();
  EXPECT_NE(run.err().find("--async: cluster.colocate is true"), std::string::npos) << run.err();
  EXPECT_FALSE(fs::exists(dir_ / "run" / "head.json")) << "no runtime should have started";
  // Trainer failover rewinds the synchronous loop only.
  Child failover({"--config", config.string(), "--async", "--set",
                  "fault_tolerance.max_trainer_restarts=1"},
                 dir_);
  code = failover.Wait(std::chrono::seconds(60));
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 2) << failover.err();
  EXPECT_NE(failover.err().find("--async: fault_tolerance.max_trainer_restarts"), std::string::npos)
      << failover.err();
}

// ---- --fully-async: generation and training overlap under rollout.max_staleness ------------

TEST_F(DriverE2eTest, FullyAsyncKeepsEveryTrainedSampleWithinTheBoundAndUpdatesMidGeneration) {
  // 64-token answers, one request at a time per engine: rollouts of seconds. No evals (each
  // would run between two generations and hold the next sync until it is done:
  // RunFullyAsyncLoop's eval schedule is tested in driver_async_test).
  const fs::path config = WriteConfig(
      5, "debug:\n  save_debug_rollout_data: \"" + dir_.string() +
             "/rollouts/{rollout_id}.json\"\n");
  Child run({"--config", config.string(), "--fully-async", "--set", "rollout.max_staleness=2",
             "--set", "rollout.max_response_len=64", "--set", "rollout.engine_concurrency=1",
             "--set", "eval.interval=null"},
            dir_);
  std::optional<int> code = run.Wait(std::chrono::seconds(600));
  ASSERT_EQ(code, 0) << "stdout:\n" << run.out() << "\nstderr:\n" << run.err();
  EXPECT_NE(run.out().find("done: rollouts 0..4"), std::string::npos) << run.out();
  std::map<int64_t, Json> records = RolloutRecords(dir_ / "run" / "metrics.jsonl");
  ASSERT_EQ(records.size(), 5u);
  int interrupted = 0;  // answers generated across a weight update
  for (const auto& [id, r] : records) {
    for (const char* key : {"async/admitted_version", "async/queue_depth",
                            "async/stale_samples_dropped", "async/producer_wait_time",
                            "rollout/weight_staleness/min", "rollout/weight_staleness/max",
                            "perf/rollout_wait_time", "perf/update_weights_time", "train/loss"}) {
      EXPECT_TRUE(r.contains(key)) << key << " missing in " << r.dump();
    }
    EXPECT_LE(r.value("rollout/weight_staleness/max", 99.0), 2.0) << id;
    EXPECT_GE(r.at("async/admitted_version").get<double>(), static_cast<double>(id - 2)) << id;
    std::map<std::string, double> tokens_by_lag;  // from the saved samples' spans
    for (const Json& s : SavedSamples(dir_ / "rollouts" / (std::to_string(id) + ".json"))) {
      // Consecutive versions, oldest first, none older than the bound.
      std::vector<int64_t> versions;
      for (const Json& v : s.at("weight_versions")) versions.push_back(std::stoll(v.get<std::string>()));
      // Each span's token count, from the engine's spans, covering the answer.
      const std::vector<int64_t> counts = s.at("weight_version_tokens").get<std::vector<int64_t>>();
      ASSERT_EQ(counts.size(), versions.size()) << id << " " << s.dump();
      int64_t counted = 0;
      for (size_t i = 0; i < counts.size(); ++i) {
        counted += counts[i];
        if (!s.at("remove_sample").get<bool>()) {
          tokens_by_lag["rollout/tokens_by_staleness/" + std::to_string(id - versions[i])] +=
              static_cast<double>(counts[i]);
        }
      }
      EXPECT_EQ(counted, s.at("response_length").get<int64_t>()) << id;
      ASSERT_FALSE(versions.empty()) << id;
      EXPECT_GE(versions.front(), id - 2) << id << " " << s.dump();
      EXPECT_LE(versions.back(), id) << id;
      for (size_t i = 1; i < versions.size(); ++i) EXPECT_EQ(versions[i], versions[i - 1] + 1);
      interrupted += versions.size() > 1;
      // A retracted answer keeps its tokens and their log-probs.
      EXPECT_EQ(s.at("rollout_log_probs").size(), s.at("response_length").get<size_t>()) << id;
    }
    // Tokens by version: the record's keys are the saved spans' sums.
    std::map<std::string, double> reported;
    for (const auto& [key, value] : r.items()) {
      if (key.rfind("rollout/tokens_by_staleness/", 0) == 0) reported[key] = value.get<double>();
    }
    EXPECT_EQ(reported, tokens_by_lag) << id;
  }
  // Whether an update lands mid-generation depends on this machine's speeds (the trainer is
  // often slower here, and the producer then waits on the bound); weight_sync_test and
  // engine_server_test pin the interrupted answer deterministically.
  std::cout << "answers generated across a weight update: " << interrupted << "\n";
  // Checkpoint k keeps the data source after rollout k, though the producer had run ahead.
  for (int64_t k = 0; k < 5; ++k) {
    Json state = Json::parse(ReadFile(dir_ / "ckpt" / "rollout" /
                                      ("data_source_state_" + std::to_string(k) + ".json")));
    EXPECT_EQ(state.at("sample_offset").get<int64_t>(), (k + 1) * 4) << k;
  }
}

// ---- rollout.trajectory_buffer: trajectories POSTed by a program outside the job -----------

TEST_F(DriverE2eTest, TrainsOnTrajectoriesPostedByAnExternalProgram) {
  // 2 rollouts of 4 groups × 2 trajectories from tests/job/post_trajectories.py.
  const fs::path config = WriteConfig(
      2, "debug:\n  save_debug_rollout_data: \"" + dir_.string() +
             "/rollouts/{rollout_id}.json\"\n");
  Child run({"--config", config.string(), "--set", "rollout.trajectory_buffer=true", "--set",
             "data.prompt_data=''"},
            dir_);
  const std::string writer = fmt::format(
      "python3 {}/tests/job/post_trajectories.py {} 8 2 > {} 2>&1", SourceDir(),
      (dir_ / "run").string(), (dir_ / "writer.log").string());
  const int writer_code = std::system(writer.c_str());
  std::optional<int> code = run.Wait(std::chrono::seconds(400));
  EXPECT_EQ(writer_code, 0) << ReadFile(dir_ / "writer.log");
  ASSERT_EQ(code, 0) << "stdout:\n" << run.out() << "\nstderr:\n" << run.err();
  std::map<int64_t, Json> records = RolloutRecords(dir_ / "run" / "metrics.jsonl");
  ASSERT_EQ(records.size(), 2u);
  for (const auto& [id, r] : records) {
    EXPECT_TRUE(r.contains("train/loss")) << r.dump();
    EXPECT_EQ(r.at("rollout/raw_reward").get<double>(), 0.5) << r.dump();  // rewards 0, 1
    // Rollout k holds groups 4k..4k+3 as posted, with the tokens and versions given.
    const std::vector<Json> samples =
        SavedSamples(dir_ / "rollouts" / (std::to_string(id) + ".json"));
    ASSERT_EQ(samples.size(), 8u);
    for (size_t i = 0; i < samples.size(); ++i) {
      const int64_t group = 4 * id + static_cast<int64_t>(i) / 2;
      EXPECT_EQ(samples[i].at("tokens"),
                Json::array({100 + group, 200, 300, 400 + static_cast<int64_t>(i % 2), 500 + group}))
          << id << " " << i;
      EXPECT_EQ(samples[i].at("response_length"), 2);
      EXPECT_EQ(samples[i].at("weight_versions").size(), 1u);
    }
  }
  // Checkpoint 1 keeps the (empty) buffer after rollout 1.
  Json state = Json::parse(ReadFile(dir_ / "ckpt" / "rollout" / "trajectory_buffer_1.json"));
  EXPECT_EQ(state.at("complete").size(), 0u);
}

// Starts `config` and SIGKILLs engine-1's worker as soon as rollout 0 is reported, i.e. while
// rollout 1 generates (64-token responses, one request at a time per engine: several seconds).
// Returns the killed pid (-1 when the run ended first).
pid_t KillEngineOneDuringRolloutOne(Child& run, const fs::path& run_dir) {
  const auto deadline = Clock::now() + std::chrono::seconds(400);
  while (run.out().find("rollout 0/3 |") == std::string::npos && Clock::now() < deadline) {
    if (run.Wait(std::chrono::seconds(0))) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const pid_t pid = WorkerPid(run_dir, "engine-1");
  if (pid > 0) ::kill(pid, SIGKILL);
  return pid;
}

TEST_F(DriverE2eTest, AnEngineKilledMidRolloutIsRestartedResyncedAndItsGroupsRetried) {
  const fs::path config = WriteConfig(
      3, "fault_tolerance:\n  max_engine_restarts: 2\n  restart_backoff: 0.5\n"
         "debug:\n  save_debug_rollout_data: " + (dir_ / "rollouts" / "{rollout_id}.json").string() + "\n");
  Child run({"--config", config.string(), "--set", "rollout.max_response_len=64", "--set",
             "rollout.engine_concurrency=1", "--set", "eval.max_response_len=6"},
            dir_);
  const pid_t killed = KillEngineOneDuringRolloutOne(run, dir_ / "run");
  ASSERT_GT(killed, 0) << "engine-1's worker was not found\nstdout:\n" << run.out() << "\nstderr:\n"
                       << run.err();
  const auto killed_at = Clock::now();
  std::optional<int> code = run.Wait(std::chrono::seconds(500));
  ASSERT_EQ(code, 0) << "stdout:\n" << run.out() << "\nstderr:\n" << ReadLogs(dir_ / "run", run);
  const std::string out = run.out();
  EXPECT_NE(out.find("rollout 2/3 |"), std::string::npos) << out;
  // A new engine-1 process, announced by the driver with its restart count.
  const pid_t now_pid = WorkerPid(dir_ / "run", "engine-1");
  EXPECT_NE(now_pid, killed);
  const std::string logs = ReadLogs(dir_ / "run", run);
  EXPECT_NE(logs.find("engine engine-1 restarted (restart 1/2)"), std::string::npos) << logs;
  std::cout << "engine-1 killed; the run ended "
            << std::chrono::duration<double>(Clock::now() - killed_at).count() << " s later\n";

  // Rollout 1 kept its full batch (4 groups × 2 samples) and counted the restart.
  std::map<int64_t, Json> rollouts;
  for (const Json& r : ReadJsonl(dir_ / "run" / "metrics.jsonl")) {
    if (r.contains("rollout/raw_reward")) rollouts[r.at("rollout_id").get<int64_t>()] = r;
  }
  ASSERT_EQ(rollouts.size(), 3u);
  EXPECT_EQ(rollouts[1].value("rollout/samples", -1.0), 8.0) << rollouts[1].dump();
  EXPECT_EQ(rollouts[1].value("rollout/engine_restarts", -1.0), 1.0) << rollouts[1].dump();
  EXPECT_GE(rollouts[1].value("rollout/retried_groups", -1.0), 1.0) << rollouts[1].dump();
  EXPECT_GT(rollouts[1].value("perf/engine_recovery_time", 0.0), 0.0) << rollouts[1].dump();
  EXPECT_EQ(rollouts[0].value("rollout/engine_restarts", -1.0), 0.0);
  EXPECT_EQ(rollouts[2].value("rollout/engine_restarts", -1.0), 0.0);

  // Every sample of rollout r was generated with weight_version r (the restarted engine got
  // version 1 from the trainer, then version 2 through the re-formed weight-update group), and
  // rollout 2 used both engines, engine-1 at a new address.
  std::map<int64_t, std::set<std::string>> engines_used;
  for (int64_t r = 0; r < 3; ++r) {
    Json doc = Json::parse(ReadFile(dir_ / "rollouts" / (std::to_string(r) + ".json")));
    int64_t samples = 0;
    for (const Json& group : doc.at("samples")) {
      for (const Json& sample : group) {
        ++samples;
        EXPECT_GE(sample.at("response_length").get<int64_t>(), 1) << sample.dump();
        EXPECT_EQ(sample.at("weight_versions"), Json::array({std::to_string(r)}))
            << "rollout " << r << ": " << sample.dump();
        engines_used[r].insert(sample.at("metadata").at("engine").get<std::string>());
      }
    }
    EXPECT_EQ(samples, 8) << "rollout " << r;
  }
  EXPECT_EQ(engines_used[0].size(), 2u);
  EXPECT_EQ(engines_used[2].size(), 2u);
  EXPECT_NE(engines_used[0], engines_used[2]) << "engine-1 should serve rollout 2 from a new port";
  // The Prometheus targets file followed engine-1 to its new port.
  const Json targets = Json::parse(ReadFile(dir_ / "run" / "prometheus_targets.json"));
  std::string engine1;
  for (const Json& group : targets) {
    if (group.at("labels").value("slime_engine", "") == "engine-1") {
      engine1 = group.at("targets").at(0).get<std::string>();
    }
  }
  EXPECT_TRUE(engines_used[2].count(engine1) == 1 && engines_used[0].count(engine1) == 0)
      << "engine-1 listed at '" << engine1 << "' in " << targets.dump();
}

TEST_F(DriverE2eTest, AnEngineThatMayNotRestartFailsTheJobNamingIt) {
  const fs::path config = WriteConfig(3, "fault_tolerance:\n  max_engine_restarts: 0\n");
  Child run({"--config", config.string(), "--set", "rollout.max_response_len=64", "--set",
             "rollout.engine_concurrency=1", "--set", "eval.max_response_len=6"},
            dir_);
  const pid_t killed = KillEngineOneDuringRolloutOne(run, dir_ / "run");
  ASSERT_GT(killed, 0) << "stdout:\n" << run.out() << "\nstderr:\n" << run.err();
  const auto killed_at = Clock::now();
  std::optional<int> code = run.Wait(std::chrono::seconds(60));
  ASSERT_TRUE(code.has_value()) << "the job did not end within 60 s of losing engine-1\nstdout:\n"
                                << run.out() << "\nstderr:\n" << run.err();
  EXPECT_EQ(*code, 1) << run.err();
  const std::string err = run.err();
  EXPECT_NE(err.find("slime_train: error:"), std::string::npos) << err;
  EXPECT_NE(err.find("engine-1"), std::string::npos) << err;
  EXPECT_NE(err.find("max_engine_restarts"), std::string::npos) << err;
  EXPECT_EQ(run.out().find("rollout 1/3 |"), std::string::npos) << run.out();
  std::cout << "the job failed " << std::chrono::duration<double>(Clock::now() - killed_at).count()
            << " s after engine-1 was killed\n";
  // No worker of the job is left.
  EXPECT_EQ(WorkerPid(dir_ / "run", "engine-0"), -1);
  EXPECT_EQ(WorkerPid(dir_ / "run", "trainer-0"), -1);
}

TEST_F(DriverE2eTest, AKilledTrainerRestartsTheGroupFromTheLastCheckpointAndTheJobFinishes) {
  // Two data-parallel trainers and two engines; a checkpoint every rollout.
  const fs::path config = WriteConfig(
      4, "fault_tolerance:\n  max_trainer_restarts: 1\n  restart_backoff: 0.2\n"
         "debug:\n  save_debug_rollout_data: " + (dir_ / "rollouts" / "{rollout_id}.json").string() + "\n");
  Child run({"--config", config.string(), "--set", "cluster.actor_num_gpus_per_node=2", "--set",
             "eval.interval=null"},
            dir_);
  // trainer-1 is SIGKILLed once rollout 1 is reported (trained, saved, synced): during rollout 2.
  const auto deadline = Clock::now() + std::chrono::seconds(400);
  while (run.out().find("rollout 1/4 |") == std::string::npos && Clock::now() < deadline &&
         !run.Wait(std::chrono::seconds(0))) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const pid_t trainer0 = WorkerPid(dir_ / "run", "trainer-0");
  const pid_t killed = WorkerPid(dir_ / "run", "trainer-1");
  ASSERT_GT(killed, 0) << "trainer-1's worker was not found\nstdout:\n" << run.out();
  ::kill(killed, SIGKILL);
  std::optional<int> code = run.Wait(std::chrono::seconds(400));
  ASSERT_EQ(code, 0) << "stdout:\n" << run.out() << "\nstderr:\n" << ReadLogs(dir_ / "run", run);
  const std::string out = run.out();
  EXPECT_NE(out.find("trainer trainer-1 on node"), std::string::npos) << out;
  EXPECT_NE(out.find("lost during rollout 2: restarting the trainer group from the newest "
                     "checkpoint (restart 1/1)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("rollouts 2..2 run again"), std::string::npos) << out;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    if (line.find("trainer group") != std::string::npos) std::cout << line << "\n";
  }
  EXPECT_NE(out.find("rollout 3/4 |"), std::string::npos) << out;
  // Both trainers run in new processes (the survivor could be blocked in a collective).
  EXPECT_NE(WorkerPid(dir_ / "run", "trainer-0"), trainer0);
  EXPECT_NE(WorkerPid(dir_ / "run", "trainer-1"), killed);

  // The final weights hold each rollout once: one optimizer step per rollout, steps 0..3, the
  // replayed rollout's step numbered as the first time (not a fifth step).
  std::set<int64_t> steps;
  std::map<int64_t, Json> last_summary;
  Json restart;
  for (const Json& r : ReadJsonl(dir_ / "run" / "metrics.jsonl")) {
    if (r.contains("train/pg_loss") && r.contains("step") && r["step"].is_number()) {
      steps.insert(r["step"].get<int64_t>());
    }
    if (r.contains("rollout/raw_reward")) last_summary[r.at("rollout_id").get<int64_t>()] = r;
    if (r.contains("fault/rolled_back_to")) restart = r;
  }
  EXPECT_EQ(steps, (std::set<int64_t>{0, 1, 2, 3}));
  ASSERT_EQ(last_summary.size(), 4u);
  EXPECT_EQ(last_summary[1].value("fault/trainer_restarts", -1.0), 0.0) << last_summary[1].dump();
  EXPECT_EQ(last_summary[3].value("fault/trainer_restarts", -1.0), 1.0) << last_summary[3].dump();
  EXPECT_GT(last_summary[3].value("fault/trainer_lost_time", 0.0), 0.0) << last_summary[3].dump();
  ASSERT_FALSE(restart.is_null()) << "no fault/* record in metrics.jsonl";
  EXPECT_EQ(restart.value("rollout_id", int64_t{-1}), 2) << restart.dump();
  EXPECT_EQ(restart.value("fault/rolled_back_to", -1.0), 2.0) << restart.dump();
  EXPECT_EQ(ReadFile(dir_ / "ckpt" / "latest_checkpointed_iteration.txt").substr(0, 1), "3");
  // The engines got the checkpoint's weights from the new trainer rank 0: the replayed rollout
  // 2 was generated with weight version 2 and rollout 3 with version 3.
  for (int64_t r : {2, 3}) {
    Json doc = Json::parse(ReadFile(dir_ / "rollouts" / (std::to_string(r) + ".json")));
    for (const Json& group : doc.at("samples")) {
      for (const Json& sample : group) {
        EXPECT_EQ(sample.at("weight_versions"), Json::array({std::to_string(r)}))
            << "rollout " << r << ": " << sample.dump();
      }
    }
  }
  // The data source went back to rollout 1's checkpoint: 4 rollouts × 4 prompts in all.
  Json state = Json::parse(ReadFile(dir_ / "ckpt" / "rollout" / "data_source_state_3.json"));
  EXPECT_EQ(state.at("sample_offset").get<int64_t>(), 16);
}

TEST_F(DriverE2eTest, BadDatasetLineFailsBeforeAnyWorkerStarts) {
  const fs::path data = dir_ / "bad.jsonl";
  std::ofstream(data) << "{\"input\": \"1+1=\", \"label\": \"2\"}\n{not json\n";
  const fs::path config = WriteConfig(1, "");
  std::string yaml = ReadFile(config);
  const std::string from = SourceDir() + "/data/demo/train.jsonl@[0:40]";
  yaml.replace(yaml.find(from), from.size(), data.string());
  std::ofstream(config) << yaml;
  Child run({"--config", config.string(), "--set", "data.on_bad_line=fail"}, dir_);
  std::optional<int> code = run.Wait(std::chrono::seconds(60));
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 2) << run.err();
  EXPECT_NE(run.err().find("bad.jsonl:2"), std::string::npos) << run.err();
  EXPECT_FALSE(fs::exists(dir_ / "run" / "head.json")) << "no runtime should have started";
}

// The port `slime_train serve --port 0` printed ("listening on http://host:port"), or 0.
int ServePort(const Child& server, std::chrono::seconds timeout) {
  const auto deadline = Clock::now() + timeout;
  const std::string marker = "listening on http://127.0.0.1:";
  while (Clock::now() < deadline) {
    const std::string out = server.out();
    if (size_t at = out.find(marker); at != std::string::npos) {
      return std::atoi(out.c_str() + at + marker.size());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return 0;
}

// cluster.rollout_external_engine_addrs: no engine workers; the job generates on a server it did
// not start (here `slime_train serve`, as a real SGLang server would be), pushes the trainer's
// weights to it over the weight-update group after every step, and leaves it running. The
// server requires access keys (--api-key / --admin-api-key); the job sends the ones
// cluster.engine_api_key / engine_admin_api_key give (the admin key from the environment through
// ${...}), and a job with a wrong key fails naming the engine's 401 without changing it.
TEST_F(DriverE2eTest, DrivesAnExternalEngineGivenByAddress) {
  const std::string user_key = "e2e-user-8f1c", admin_key = "e2e-admin-42d7";
  fs::create_directories(dir_ / "server");
  Child server({"serve", "--model", model_dir().string(), "--host", "127.0.0.1", "--port",
                "0", "--device", "cpu", "--api-key", user_key, "--admin-api-key", admin_key},
               dir_ / "server");
  const int port = ServePort(server, std::chrono::seconds(120));
  ASSERT_GT(port, 0) << "the external server did not start\n" << server.err();

  fs::path config = WriteConfig(2);
  std::string yaml = ReadFile(config);
  const std::string local = "  rollout_num_gpus: 2\n";
  ASSERT_NE(yaml.find(local), std::string::npos);
  yaml.replace(yaml.find(local), local.size(),
               "  rollout_external_engine_addrs: [\"127.0.0.1:" + std::to_string(port) + "\"]\n" +
                   "  engine_api_key: " + user_key + "\n" +
                   "  engine_admin_api_key: ${SLIME_E2E_ENGINE_ADMIN_KEY}\n");
  std::ofstream(config) << yaml;

  {  // The wrong admin key: the first weight push is refused; the job ends naming the 401.
    fs::create_directories(dir_ / "wrong");
    Child wrong({"--config", config.string(), "--set",
                 "cluster.run_dir=" + (dir_ / "wrong" / "run").string()},
                dir_ / "wrong", {.env = {{"SLIME_E2E_ENGINE_ADMIN_KEY", "not-the-key"}}});
    std::optional<int> code = wrong.Wait(std::chrono::seconds(200));
    ASSERT_TRUE(code.has_value()) << wrong.err();
    EXPECT_NE(*code, 0);
    const std::string logs = ReadLogs(dir_ / "wrong" / "run", wrong);
    EXPECT_NE(logs.find("401"), std::string::npos) << logs;
    EXPECT_EQ(logs.find("not-the-key"), std::string::npos) << "a key in the logs";
  }

  Child run({"--config", config.string()}, dir_,
            {.env = {{"SLIME_E2E_ENGINE_ADMIN_KEY", admin_key}}});
  std::optional<int> code = run.Wait(std::chrono::seconds(300));
  ASSERT_EQ(code, std::optional<int>(0)) << "stdout:\n" << run.out() << "\nstderr:\n" << run.err();
  EXPECT_NE(run.err().find("external engines up: 127.0.0.1:" + std::to_string(port)), std::string::npos)
      << run.err();
  EXPECT_EQ(run.err().find("started engine-"), std::string::npos) << "no engine worker: " << run.err();
  const std::string logs = run.out() + ReadLogs(dir_ / "run", run) +
                           ReadFile(dir_ / "run" / "metrics.jsonl");
  EXPECT_EQ(logs.find(user_key), std::string::npos) << "the API key in the logs or metrics";
  EXPECT_EQ(logs.find(admin_key), std::string::npos) << "the admin key in the logs or metrics";

  std::map<int64_t, Json> records = RolloutRecords(dir_ / "run" / "metrics.jsonl");
  for (int64_t r : {0, 1}) {
    ASSERT_TRUE(records.count(r)) << "rollout " << r;
    EXPECT_GT(records[r].value("rollout/trainer/response_length", -1.0), 0) << records[r].dump();
  }
  // Initial push = version 0, then a sync after each of the 2 rollouts: the server holds version
  // 2, and it still serves (the job does not stop what it did not start). The wrong-key job
  // changed nothing.
  http::Client client("127.0.0.1", port, {.bearer_token = user_key});
  auto version = client.Get("/get_weight_version");
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_EQ(Json::parse(version->body).value("weight_version", ""), "2") << version->body;
  auto health = client.Get("/health");
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(health->status, 200);
  http::Client anonymous("127.0.0.1", port);
  auto refused = anonymous.Get("/get_weight_version");
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_EQ(refused->status, 401);
}

// cluster.engine_api_key / engine_admin_api_key with local engines: the driver starts its
// engines with them (a call without the key gets 401 while the job runs, the user key on an
// admin route 403) and every call of the job carries the admin key; --dry-run shows them as
// <redacted>; neither key reaches a log or the metrics.
TEST_F(DriverE2eTest, LocalEnginesRequireTheConfiguredKeys) {
  const std::string user_key = "local-user-77ab", admin_key = "local-admin-0c9e";
  const fs::path config = WriteConfig(3);
  const std::vector<std::string> keys = {"--set", "cluster.engine_api_key=" + user_key, "--set",
                                         "cluster.engine_admin_api_key=" + admin_key};
  {
    std::vector<std::string> args = {"--config", config.string(), "--dry-run"};
    args.insert(args.end(), keys.begin(), keys.end());
    Child dry(args, dir_, {.name = "dry"});
    ASSERT_EQ(dry.Wait(std::chrono::seconds(60)), std::optional<int>(0)) << dry.err();
    EXPECT_NE(dry.out().find("engine_api_key: \"<redacted>\""), std::string::npos) << dry.out();
    EXPECT_NE(dry.out().find("engine_admin_api_key: \"<redacted>\""), std::string::npos) << dry.out();
    EXPECT_EQ(dry.out().find(user_key), std::string::npos) << dry.out();
    EXPECT_EQ(dry.out().find(admin_key), std::string::npos) << dry.out();
  }
  std::vector<std::string> args = {"--config", config.string(), "--set",
                                   "rollout.max_response_len=64", "--set",
                                   "rollout.engine_concurrency=1"};
  args.insert(args.end(), keys.begin(), keys.end());
  Child run(args, dir_);
  // While rollout 1 generates, ask an engine directly (its address from the Prometheus targets).
  const auto deadline = Clock::now() + std::chrono::seconds(400);
  while (run.out().find("rollout 0/3 |") == std::string::npos && Clock::now() < deadline) {
    if (run.Wait(std::chrono::seconds(0))) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::string engine;
  for (const Json& group : Json::parse(ReadFile(dir_ / "run" / "prometheus_targets.json"))) {
    if (group.at("labels").contains("slime_engine")) engine = group.at("targets").at(0).get<std::string>();
  }
  ASSERT_FALSE(engine.empty()) << "no engine in the Prometheus targets\n" << run.err();
  const std::string host = engine.substr(0, engine.rfind(':'));
  const int port = std::stoi(engine.substr(engine.rfind(':') + 1));
  http::Client anonymous(host, port);
  auto refused = anonymous.Get("/get_weight_version");
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_EQ(refused->status, 401) << refused->body;
  http::Client user(host, port, {.bearer_token = user_key});
  auto read = user.Get("/get_weight_version");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->status, 200) << read->body;
  auto flush = user.Get("/flush_cache");
  ASSERT_TRUE(flush.ok()) << flush.status();
  EXPECT_EQ(flush->status, 403) << "the user key on an admin route: " << flush->body;
  // The driver's own /metrics takes the same key.
  const std::string metrics_url =
      Json::parse(ReadFile(dir_ / "run" / "driver.json")).value("metrics_url", "");
  const std::string hostport = metrics_url.substr(7, metrics_url.find("/metrics") - 7);
  const std::string driver_host = hostport.substr(0, hostport.rfind(':'));
  const int driver_port = std::stoi(hostport.substr(hostport.rfind(':') + 1));
  auto driver_anonymous = http::Client(driver_host, driver_port).Get("/metrics");
  ASSERT_TRUE(driver_anonymous.ok()) << driver_anonymous.status();
  EXPECT_EQ(driver_anonymous->status, 401) << "the driver's /metrics without the key";
  auto driver_user =
      http::Client(driver_host, driver_port, {.bearer_token = user_key}).Get("/metrics");
  ASSERT_TRUE(driver_user.ok()) << driver_user.status();
  EXPECT_EQ(driver_user->status, 200) << driver_user->body;
  EXPECT_EQ(driver_user->body.find(user_key), std::string::npos) << "the key in /metrics";

  std::optional<int> code = run.Wait(std::chrono::seconds(400));
  ASSERT_EQ(code, std::optional<int>(0)) << "stdout:\n" << run.out() << "\nstderr:\n"
                                         << ReadLogs(dir_ / "run", run);
  EXPECT_NE(run.out().find("rollout 2/3 |"), std::string::npos) << run.out();
  const std::string logs = run.out() + ReadLogs(dir_ / "run", run) +
                           ReadFile(dir_ / "run" / "metrics.jsonl");
  EXPECT_EQ(logs.find(user_key), std::string::npos) << "the API key in the logs or metrics";
  EXPECT_EQ(logs.find(admin_key), std::string::npos) << "the admin key in the logs or metrics";
}

// Data parallelism across trainer processes: two rollouts generated once, then trained from the
// saved samples (debug.load_debug_rollout_data) by one trainer and by two trainer processes
// whose gradients are all-reduced over Gloo, and by two with train.use_distributed_optimizer
// (ZeRO-1: gradients reduce-scattered, parameters all-gathered, the save collective). Same losses
// and gradient norms per step (so the same updated weights: step 2's loss is computed on them),
// and one checkpoint written, by rank 0.
// (Also a train-only run with a fresh checkpoint.save directory, which used to fail creating
// <save>/rollout/.)
TEST_F(DriverE2eTest, TwoDataParallelTrainersMatchOneTrainer) {
  const std::string rollouts = (dir_ / "rollouts" / "{rollout_id}.json").string();
  const fs::path config = WriteConfig(
      2, "debug:\n  save_debug_rollout_data: \"" + rollouts + "\"\n");
  {
    Child gen({"--config", config.string()}, dir_);
    ASSERT_EQ(gen.Wait(std::chrono::seconds(400)), 0) << gen.out() << gen.err();
  }
  // Runs: 1 = one trainer, 2 = two trainers, 3 = two trainers with the distributed optimizer
  // (ZeRO-1: the worker's reduce-scatter / all-gather seams and the collective save).
  std::map<int, std::map<int64_t, Json>> steps;  // run -> step -> train/* values
  for (int variant : {1, 2, 3}) {
    const int dp = variant == 1 ? 1 : 2;
    const fs::path run = dir_ / ("dp" + std::to_string(variant));
    fs::create_directories(run);
    Child train(
        {"--config", config.string(), "--set", "debug.save_debug_rollout_data=null", "--set",
         "debug.load_debug_rollout_data=" + rollouts, "--set",
         std::string("train.use_distributed_optimizer=") + (variant == 3 ? "true" : "false"),
         "--set", "cluster.actor_num_gpus_per_node=" + std::to_string(dp), "--set",
         "cluster.rollout_num_gpus=0", "--set", "eval.interval=null",
         // An entropy bonus: a gradient even where a group's rewards are all equal.
         "--set", "algorithm.entropy_coef=0.01", "--set",
         "cluster.run_dir=" + (run / "run").string(), "--set",
         "checkpoint.save=" + (run / "ckpt").string(), "--set",
         "checkpoint.load=" + (run / "ckpt").string()},
        run);
    std::optional<int> code = train.Wait(std::chrono::seconds(300));
    ASSERT_EQ(code, 0) << "dp " << dp << "\nstdout:\n" << train.out() << "\nstderr:\n"
                       << ReadLogs(run / "run", train);
    if (dp == 2) {
      const std::string logs = ReadLogs(run / "run", train);
      EXPECT_NE(logs.find("tensor-parallel size 1 × data-parallel size 2"), std::string::npos)
          << logs;
      EXPECT_EQ(logs.find("(distributed optimizer)") != std::string::npos, variant == 3) << logs;
    }
    EXPECT_TRUE(fs::exists(run / "ckpt" / "latest_checkpointed_iteration.txt"))
        << "run " << variant;
    for (const Json& r : ReadJsonl(run / "run" / "metrics.jsonl")) {
      // Per optimizer step (the rollout's summary line repeats the last step's values).
      if (!r.contains("train/grad_norm") || !r.contains("step") || !r["step"].is_number()) continue;
      Json values = Json::object();
      for (const auto& [k, v] : r.items()) {
        if (k.rfind("train/", 0) == 0 && v.is_number()) values[k] = v;
      }
      steps[variant][r.value("step", int64_t{-1})] = values;
    }
  }
  ASSERT_EQ(steps[1].size(), 2u) << "one optimizer step per rollout";
  for (int variant : {2, 3}) {
    ASSERT_EQ(steps[variant].size(), steps[1].size()) << "run " << variant;
    for (const auto& [step, one] : steps[1]) {
      ASSERT_TRUE(steps[variant].count(step)) << "run " << variant << " step " << step;
      const Json& two = steps[variant][step];
      for (const std::string key : {"train/grad_norm", "train/loss", "train/pg_loss"}) {
        if (!one.contains(key)) continue;
        ASSERT_TRUE(two.contains(key)) << key << " at step " << step << ": " << two.dump();
        const double a = one[key].get<double>(), b = two[key].get<double>();
        EXPECT_NEAR(a, b, 1e-5 + 1e-4 * std::abs(a))
            << key << " at step " << step << ", run " << variant;
      }
      EXPECT_GT(one["train/grad_norm"].get<double>(), 0.0) << "step " << step;
    }
  }
}

// debug.deterministic_mode: engines and trainer run the batch-invariant kernels, so every step's
// train_rollout_logprob_abs_diff is exactly 0 (the trainer recomputes the engines' log-probs to
// the bit), and slime's first-step gates hold exactly (the rollouts sample at temperature 1
// from seeds; 2 optimizer steps a rollout, so the second step's ppo_kl is not 0).
TEST_F(DriverE2eTest, DeterministicModeTrainsOnTheEnginesLogProbsToTheBit) {
  const fs::path config = WriteConfig(2);
  std::string logs;
  ASSERT_TRUE(RunToCompletion({"--config", config.string(), "--set", "debug.deterministic_mode=true",
                               "--set", "train.global_batch_size=4"},
                              dir_, std::chrono::seconds(600), "deterministic", &logs));
  ExpectTrainsOnTheEnginesLogProbsToTheBit(StepValues(dir_ / "run" / "metrics.jsonl"), 2, logs);
  EXPECT_NE(logs.find("deterministic"), std::string::npos) << logs;
}

// Tensor parallelism across trainer processes (Megatron's layout: rank = dp·TP + tp; workers.h):
//   A. train.tensor_model_parallel_size 2 on two trainer processes with two engines: the TP
//      group and the gathered weight sync over Gloo. After rollout 0 the trainer's updated
//      weights reach the engines as full HF tensors (each all-gathered over the TP group), so
//      the engines' log-probs of rollout 1's samples equal the trainer's recomputed ones
//      (train_rollout_logprob_abs_diff ~ 6e-7; the weights of before the step give ~0.2 here).
//   B. the same rollouts (saved by A) trained by one trainer (TP 1), and
//   C. by four trainers at TP 2 × DP 2 (two TP groups, two DP groups):
// the same per-step loss, pg_loss and grad_norm within float32 tolerance, and one checkpoint.
TEST_F(DriverE2eTest, TensorParallelTrainersMatchOneTrainerAndSyncFullWeights) {
  const std::string rollouts = (dir_ / "rollouts" / "{rollout_id}.json").string();
  // A larger learning rate than the other tests: one step moves the log-probs well past the
  // tolerance below, so weights that did not reach the engines show.
  const fs::path config =
      WriteConfig(2, "debug:\n  save_debug_rollout_data: \"" + rollouts +
                         "\"\n"
                         "algorithm:\n  get_mismatch_metrics: true\n  entropy_coef: 0.01\n");
  const std::vector<std::string> common = {"--set", "train.lr=1.0e-3", "--set",
                                           "eval.interval=null"};
  std::map<std::string, std::map<int64_t, Json>> steps;  // run -> step -> train/* values
  {
    std::vector<std::string> args = {"--config", config.string(),
                                     "--set",    "cluster.actor_num_gpus_per_node=2",
                                     "--set",    "train.tensor_model_parallel_size=2"};
    args.insert(args.end(), common.begin(), common.end());
    std::string logs;
    ASSERT_TRUE(RunToCompletion(args, dir_, std::chrono::seconds(500), "the run", &logs));
    EXPECT_NE(logs.find("tensor-parallel size 2 × data-parallel size 1"), std::string::npos)
        << logs;
    // Each worker's trainer is a TP shard (rank 1: tp rank 1 of DP rank 0), not a DP replica.
    EXPECT_NE(logs.find("dp rank 0/1, tp rank 1/2"), std::string::npos) << logs;
    EXPECT_EQ(logs.find("not wired into the trainer"), std::string::npos) << logs;
    steps["tp2"] = StepValues(dir_ / "run" / "metrics.jsonl");
    ASSERT_EQ(steps["tp2"].size(), 2u) << "one optimizer step per rollout";
    // Rollout 1 was generated with the weights synced after step 0.
    ExpectEnginesMatchTrainer(steps["tp2"], "tp2");
    EXPECT_TRUE(fs::exists(dir_ / "ckpt" / "latest_checkpointed_iteration.txt"));
  }
  std::string logs;
  steps["tp1"] = TrainSavedRollouts(config, rollouts, "tp1", 1, 1, 1, common, &logs);
  steps["tp2dp2"] = TrainSavedRollouts(config, rollouts, "tp2dp2", 4, 2, 1, common, &logs);
  EXPECT_NE(logs.find("tensor-parallel size 2 × data-parallel size 2"), std::string::npos)
      << logs;
  // Rank 3 = dp 1, tp 1 (Megatron's order).
  EXPECT_NE(logs.find("dp rank 1/2, tp rank 1/2"), std::string::npos) << logs;
  ExpectSameTrainMetrics(steps, "tp1", {"tp2", "tp2dp2"});
}
// The disk transport from a TP=2 trainer: rank 0 writes the full tensors (each all-gathered over
// the TP group as it is written) and the engines load them; rollout 1's engine log-probs equal
// the trainer's.
TEST_F(DriverE2eTest, TensorParallelTrainersSyncThroughTheDiskTransport) {
  const fs::path config =
      WriteConfig(2,
                  "algorithm:\n  get_mismatch_metrics: true\n  entropy_coef: 0.01\n"
                  "weight_sync:\n  transport: disk\n  disk_dir: " +
                      (dir_ / "weights").string() + "\n");
  std::string logs;
  ASSERT_TRUE(RunToCompletion(
      {"--config", config.string(), "--set", "cluster.actor_num_gpus_per_node=2", "--set",
       "train.tensor_model_parallel_size=2", "--set", "train.lr=1.0e-3", "--set",
       "eval.interval=null"},
      dir_, std::chrono::seconds(500), "the run", &logs));
  EXPECT_NE(logs.find("weight sync: disk transport"), std::string::npos) << logs;
  const std::map<int64_t, Json> steps = StepValues(dir_ / "run" / "metrics.jsonl");
  ASSERT_EQ(steps.size(), 2u);
  ExpectEnginesMatchTrainer(steps, "disk, tp2");
}

// Pipeline parallelism across trainer processes (Megatron's layout: rank = pp·DP + dp at TP 1;
// workers.h):
//   A. train.pipeline_model_parallel_size 2 on two trainer processes with two engines: the
//      pipeline group (1F1B over Gloo send / recv) and the weight sync from rank 0, to which
//      stage 1 sends its layers (and the final norm; the tied LM head copy is not sent, stage 0
//      sends the table). After rollout 0 the engines' log-probs of rollout 1's samples equal the
//      trainer's recomputed ones, so both stages' updated layers reached them.
//   B. the same rollouts (saved by A) trained by one trainer (PP 1), and
//   C. by four trainers at PP 2 × DP 2 (two pipelines, two DP groups of one stage each), and
//   D. by four trainers at PP 2 × TP 2 (two tensor-parallel stages):
// the same per-step loss, pg_loss, entropy_loss and grad_norm within float32 tolerance, and one
// checkpoint (a whole model: it loads at any layout).
TEST_F(DriverE2eTest, PipelineParallelTrainersMatchOneTrainerAndSyncFullWeights) {
  const std::string rollouts = (dir_ / "rollouts" / "{rollout_id}.json").string();
  // The larger learning rate of the TP test: one step moves the log-probs well past the
  // tolerance below (the disk test shows how far).
  const fs::path config =
      WriteConfig(2, "debug:\n  save_debug_rollout_data: \"" + rollouts +
                         "\"\n"
                         "algorithm:\n  get_mismatch_metrics: true\n  entropy_coef: 0.01\n");
  const std::vector<std::string> common = {"--set", "train.lr=1.0e-3", "--set",
                                           "eval.interval=null"};
  std::map<std::string, std::map<int64_t, Json>> steps;  // run -> step -> train/* values
  {
    std::vector<std::string> args = {"--config", config.string(),
                                     "--set",    "cluster.actor_num_gpus_per_node=2",
                                     "--set",    "train.pipeline_model_parallel_size=2"};
    args.insert(args.end(), common.begin(), common.end());
    std::string logs;
    ASSERT_TRUE(RunToCompletion(args, dir_, std::chrono::seconds(500), "the run", &logs));
    EXPECT_NE(
        logs.find("tensor-parallel size 1 × data-parallel size 1 × pipeline-parallel size 2"),
        std::string::npos)
        << logs;
    // Each worker's trainer is a pipeline stage, not a DP replica.
    EXPECT_NE(logs.find("dp rank 0/1, tp rank 0/1, pp stage 1/2"), std::string::npos) << logs;
    steps["pp2"] = StepValues(dir_ / "run" / "metrics.jsonl");
    ASSERT_EQ(steps["pp2"].size(), 2u) << "one optimizer step per rollout";
    // Rollout 1 was generated with the weights synced after step 0.
    ExpectEnginesMatchTrainer(steps["pp2"], "pp2");
    EXPECT_TRUE(fs::exists(dir_ / "ckpt" / "latest_checkpointed_iteration.txt"));
  }
  std::string logs;
  steps["pp1"] = TrainSavedRollouts(config, rollouts, "pp1", 1, 1, 1, common, &logs);
  steps["pp2dp2"] = TrainSavedRollouts(config, rollouts, "pp2dp2", 4, 1, 2, common, &logs);
  EXPECT_NE(logs.find("data-parallel size 2 × pipeline-parallel size 2"), std::string::npos)
      << logs;
  // Every (dp, stage) pair exists once; rank 1 = dp 1 of stage 0, rank 2 = dp 0 of stage 1
  // (Megatron's order: the DP index runs faster than the stage).
  for (const char* who :
       {"dp rank 0/2, tp rank 0/1, pp stage 0/2", "dp rank 1/2, tp rank 0/1, pp stage 0/2",
        "dp rank 0/2, tp rank 0/1, pp stage 1/2", "dp rank 1/2, tp rank 0/1, pp stage 1/2"}) {
    EXPECT_NE(logs.find(who), std::string::npos) << who << "\n" << logs;
  }
  steps["pp2tp2"] = TrainSavedRollouts(config, rollouts, "pp2tp2", 4, 2, 2, common, &logs);
  EXPECT_NE(logs.find("tensor-parallel size 2 × data-parallel size 1 × pipeline-parallel size 2"),
            std::string::npos)
      << logs;
  // Rank 2 = TP rank 0 of stage 1 (TP runs fastest, then DP, then the stage).
  EXPECT_NE(logs.find("dp rank 0/1, tp rank 0/2, pp stage 1/2"), std::string::npos) << logs;
  ExpectSameTrainMetrics(steps, "pp1", {"pp2", "pp2dp2", "pp2tp2"});
}

// PP=2 × TP=2 across four trainer processes with two engines: each stage's TP group gathers its
// tensors, its TP ranks send them to stage 0, and rank 0 sends the engines full tensors. After
// rollout 0 the engines' log-probs of rollout 1's samples equal the trainer's recomputed ones,
// so both stages' updated shards reached them.
TEST_F(DriverE2eTest, PipelineTimesTensorParallelTrainersSyncFullWeights) {
  const fs::path config =
      WriteConfig(2, "algorithm:\n  get_mismatch_metrics: true\n  entropy_coef: 0.01\n");
  std::string logs;
  ASSERT_TRUE(RunToCompletion(
      {"--config", config.string(), "--set", "cluster.cpu_slots_per_node=6", "--set",
       "cluster.actor_num_gpus_per_node=4", "--set", "train.pipeline_model_parallel_size=2",
       "--set", "train.tensor_model_parallel_size=2", "--set", "train.lr=1.0e-3", "--set",
       "eval.interval=null"},
      dir_, std::chrono::seconds(600), "the run", &logs));
  EXPECT_NE(logs.find("tensor-parallel size 2 × data-parallel size 1 × pipeline-parallel size 2"),
            std::string::npos)
      << logs;
  EXPECT_NE(logs.find("dp rank 0/1, tp rank 1/2, pp stage 1/2"), std::string::npos) << logs;
  const std::map<int64_t, Json> steps = StepValues(dir_ / "run" / "metrics.jsonl");
  ASSERT_EQ(steps.size(), 2u);
  ExpectEnginesMatchTrainer(steps, "pp2tp2");
}

// The disk transport from a PP=2 trainer: rank 0 writes one HF directory of full tensors (stage
// 1's arrive over the pipeline group as they are written) and the engines load it. Three
// rollouts with weight_sync.interval 2: the engines get the weights after rollout 1 only, so
// rollout 1 is generated with the initial weights while the trainer has stepped once (its log-
// probs differ clearly: the check can fail), and rollout 2 with the weights of after step 1
// (they agree).
TEST_F(DriverE2eTest, PipelineParallelTrainersSyncThroughTheDiskTransport) {
  const fs::path config =
      WriteConfig(3,
                  "algorithm:\n  get_mismatch_metrics: true\n  entropy_coef: 0.01\n"
                  "weight_sync:\n  transport: disk\n  interval: 2\n  disk_dir: " +
                      (dir_ / "weights").string() + "\n");
  std::string logs;
  ASSERT_TRUE(RunToCompletion(
      {"--config", config.string(), "--set", "cluster.actor_num_gpus_per_node=2", "--set",
       "train.pipeline_model_parallel_size=2", "--set", "train.lr=1.0e-3", "--set",
       "eval.interval=null"},
      dir_, std::chrono::seconds(500), "the run", &logs));
  EXPECT_NE(logs.find("weight sync: disk transport"), std::string::npos) << logs;
  EXPECT_NE(logs.find("pipeline-parallel size 2"), std::string::npos) << logs;
  const std::map<int64_t, Json> steps = StepValues(dir_ / "run" / "metrics.jsonl");
  ASSERT_EQ(steps.size(), 3u);
  std::map<int64_t, double> diff;
  for (const auto& [step, values] : steps) {
    ASSERT_TRUE(values.contains("train/train_rollout_logprob_abs_diff")) << values.dump();
    diff[step] = values["train/train_rollout_logprob_abs_diff"].get<double>();
    std::cout << "disk, pp2 step " << step << ": train_rollout_logprob_abs_diff " << diff[step]
              << "\n";
  }
  EXPECT_LT(diff[0], 2e-5) << "the initial weights";
  EXPECT_GT(diff[1], 1e-3) << "rollout 1 came from the initial weights (no sync after step 0)";
  EXPECT_LT(diff[2], 2e-5) << "the weights synced after step 1 did not all reach the engines";
}

// A restarted engine gets a PP=2 trainer's weights: resync_engine runs on both stages (the
// exporters; stage 1 sends its layers to rank 0, which writes the directory the new engine
// loads), so rollout 1 — partly generated by the restarted engine after step 0 — still has the
// trainer's log-probs, and the job finishes.
TEST_F(DriverE2eTest, APipelineParallelTrainerResyncsARestartedEngine) {
  const fs::path config = WriteConfig(
      3, "fault_tolerance:\n  max_engine_restarts: 2\n  restart_backoff: 0.5\n"
         "algorithm:\n  get_mismatch_metrics: true\n  entropy_coef: 0.01\n");
  Child run({"--config", config.string(), "--set", "rollout.max_response_len=64", "--set",
             "rollout.engine_concurrency=1", "--set", "eval.interval=null", "--set",
             "train.lr=1.0e-3", "--set", "cluster.actor_num_gpus_per_node=2", "--set",
             "train.pipeline_model_parallel_size=2"},
            dir_);
  const pid_t killed = KillEngineOneDuringRolloutOne(run, dir_ / "run");
  ASSERT_GT(killed, 0) << "engine-1's worker was not found\nstdout:\n" << run.out() << "\nstderr:\n"
                       << run.err();
  std::optional<int> code = run.Wait(std::chrono::seconds(500));
  ASSERT_EQ(code, 0) << "stdout:\n" << run.out() << "\nstderr:\n" << ReadLogs(dir_ / "run", run);
  const std::string logs = ReadLogs(dir_ / "run", run);
  EXPECT_NE(logs.find("engine engine-1 restarted (restart 1/2)"), std::string::npos) << logs;
  EXPECT_NE(logs.find("resynced to weight_version 1"), std::string::npos) << logs;
  std::map<int64_t, Json> rollouts;
  for (const Json& r : ReadJsonl(dir_ / "run" / "metrics.jsonl")) {
    if (r.contains("rollout/raw_reward")) rollouts[r.at("rollout_id").get<int64_t>()] = r;
  }
  ASSERT_EQ(rollouts.size(), 3u);
  EXPECT_EQ(rollouts[1].value("rollout/engine_restarts", -1.0), 1.0) << rollouts[1].dump();
  const std::map<int64_t, Json> steps = StepValues(dir_ / "run" / "metrics.jsonl");
  ASSERT_EQ(steps.size(), 3u);
  ExpectEnginesMatchTrainer(steps, "resync, pp2");
}

// Layouts the trainers cannot run fail with errors that name the settings: a trainer count that
// train.pipeline_model_parallel_size does not divide (before any worker starts), and pipeline
// parallelism with the PPO critic (not supported yet: the trainers refuse at init, and the job
// fails with their error).
TEST_F(DriverE2eTest, BadPipelineLayoutsFailNamingTheSettings) {
  // Train-only (no engines): the rollouts would come from files, but init fails first.
  const fs::path config = WriteConfig(
      1, "debug:\n  load_debug_rollout_data: \"" + (dir_ / "none" / "{rollout_id}.json").string() +
             "\"\n");
  {
    Child run({"--config", config.string(), "--set", "cluster.actor_num_gpus_per_node=3", "--set",
               "cluster.rollout_num_gpus=0", "--set", "train.pipeline_model_parallel_size=2"},
              dir_);
    std::optional<int> code = run.Wait(std::chrono::seconds(60));
    ASSERT_TRUE(code.has_value());
    EXPECT_NE(*code, 0);
    const std::string err = run.err();
    EXPECT_NE(err.find("train.pipeline_model_parallel_size"), std::string::npos) << err;
    EXPECT_NE(err.find("1 × 2 × 1 = 2"), std::string::npos) << err;
    EXPECT_EQ(err.find("started trainer-"), std::string::npos) << "no worker: " << err;
  }
  {
    const fs::path run_dir = dir_ / "ppppo";
    fs::create_directories(run_dir);
    Child run({"--config", config.string(), "--set", "cluster.actor_num_gpus_per_node=2", "--set",
               "cluster.rollout_num_gpus=0", "--set", "train.pipeline_model_parallel_size=2",
               "--set", "algorithm.advantage_estimator=ppo", "--set",
               "cluster.run_dir=" + (run_dir / "run").string()},
              run_dir);
    std::optional<int> code = run.Wait(std::chrono::seconds(300));
    ASSERT_TRUE(code.has_value());
    EXPECT_NE(*code, 0);
    const std::string logs = ReadLogs(run_dir / "run", run);
    EXPECT_NE(logs.find("pipeline parallelism (2 stages) is not supported yet with "
                        "advantage_estimator ppo"),
              std::string::npos)
        << logs;
  }
}

#ifdef SLIME_CALC_ENV_BIN_DEFAULT
// rollout.custom_generate: env — every sample is a multi-turn episode against the example
// calculator environment (its own process, real HTTP): the job completes its rollouts, the
// rewards are the environment's, and responses span several turns (model turns of at most 6
// tokens; the prompt with the tool schema is ~190 tokens, so 400 leave room for three turns and
// the environment's observations between them: a response is longer than one turn).
TEST_F(DriverE2eTest, MultiTurnGrpoAgainstTheCalculatorEnvironment) {
  Child env({"--port", "0", "--seed", "5"}, dir_, {.binary = SLIME_CALC_ENV_BIN_DEFAULT, .name = "env"});
  std::string url;
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (url.empty() && Clock::now() < deadline && !env.Wait(std::chrono::seconds(0))) {
    const std::string out = env.out();
    const std::string marker = "listening on ";
    const size_t at = out.find(marker);
    if (at != std::string::npos && out.find('\n', at) != std::string::npos) {
      url = out.substr(at + marker.size(), out.find('\n', at) - at - marker.size());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_FALSE(url.empty()) << "calculator env did not start: " << env.err();

  const fs::path base = WriteConfig(2);
  std::string yaml = ReadFile(base);
  const std::string rollout = "rollout:\n  max_response_len: 6\n";
  ASSERT_NE(yaml.find(rollout), std::string::npos);
  yaml.replace(yaml.find(rollout), rollout.size(),
               rollout + "  custom_generate: env\n  env_url: " + url +
                   "\n  max_turns: 3\n  max_total_tokens: 400\n  episode_timeout_s: 60\n"
                   "  on_env_error: fail\n");
  // Rewards come from the environment; the eval set keeps the rule-based reward of the config.
  const fs::path config = dir_ / "env.yaml";
  std::ofstream(config) << yaml;

  Child run({"--config", config.string()}, dir_);
  std::optional<int> code = run.Wait(std::chrono::seconds(400));
  ASSERT_EQ(code, 0) << "stdout:\n" << run.out() << "\nstderr:\n" << run.err();
  EXPECT_NE(run.out().find("rollout 1/2 | reward"), std::string::npos) << run.out();

  int rollouts = 0;
  for (const Json& r : ReadJsonl(dir_ / "run" / "metrics.jsonl")) {
    if (!r.contains("rollout/raw_reward")) continue;
    ++rollouts;
    const double reward = r.at("rollout/raw_reward").get<double>();
    EXPECT_GE(reward, 0.0);
    EXPECT_LE(reward, 1.0);
    EXPECT_TRUE(r.contains("train/loss")) << r.dump();
    // Three turns of at most 6 model tokens with observations between them: one turn alone
    // could not be longer than 6 tokens.
    EXPECT_GT(r.at("rollout/response_len/mean").get<double>(), 6.0) << r.dump();
  }
  EXPECT_EQ(rollouts, 2);
  EXPECT_EQ(ReadFile(dir_ / "ckpt" / "latest_checkpointed_iteration.txt").substr(0, 1), "1");
}
#endif

// Multiplies the float32 tensor `name` by `factor` in every *.safetensors file of `dir` that
// holds it (in place: header length, JSON header, data). False with *error when it is not there.
bool ScaleSafetensor(const fs::path& dir, const std::string& name, float factor,
                     std::string* error) {
  bool found = false;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".safetensors") continue;
    std::string bytes = ReadFile(entry.path());
    uint64_t header_len = 0;
    std::memcpy(&header_len, bytes.data(), sizeof header_len);  // little-endian hosts
    const Json header = Json::parse(bytes.substr(8, header_len));
    if (!header.contains(name)) continue;
    if (header[name].at("dtype") != "F32") {
      *error = name + " is not F32 in " + entry.path().string();
      return false;
    }
    const auto offsets = header[name].at("data_offsets").get<std::vector<uint64_t>>();
    for (uint64_t at = 8 + header_len + offsets[0]; at < 8 + header_len + offsets[1]; at += 4) {
      float v = 0;
      std::memcpy(&v, bytes.data() + at, 4);
      v *= factor;
      std::memcpy(bytes.data() + at, &v, 4);
    }
    const fs::path tmp = entry.path().string() + ".tmp";
    std::ofstream(tmp, std::ios::binary) << bytes;
    fs::rename(tmp, entry.path());
    found = true;
  }
  if (!found) *error = name + " not found in " + dir.string();
  return found;
}

// The OPD job of the tests below: `student` distilled from the teacher at 127.0.0.1:`port`
// with no task reward, the same 4 prompts × 8 samples every rollout, one step per rollout.
fs::path WriteOpdConfig(const fs::path& dir, const fs::path& student, int port,
                        int num_rollout) {
  const std::string yaml =
      "cluster:\n"
      "  device: cpu\n"
      "  cpu_slots_per_node: 2\n"
      "  actor_num_nodes: 1\n"
      "  actor_num_gpus_per_node: 1\n"
      "  rollout_num_gpus: 1\n"
      "  rollout_num_gpus_per_engine: 1\n"
      "  run_dir: " + (dir / "run").string() + "\n"
      "model:\n"
      "  hf_checkpoint: " + student.string() + "\n"
      "data:\n"
      "  prompt_data: " + SourceDir() + "/data/demo/train.jsonl@[0:4]\n"
      "  apply_chat_template: true\n"
      "  rollout_batch_size: 4\n"
      "  n_samples_per_prompt: 8\n"
      "  num_rollout: " + std::to_string(num_rollout) + "\n"
      "rollout:\n"
      "  max_response_len: 8\n"
      "  temperature: 0.05\n"
      "  seed: 7\n"
      "reward:\n"
      "  rm_url: http://127.0.0.1:" + std::to_string(port) + "\n"
      "  rm_max_attempts: 2\n"
      "algorithm:\n"
      "  use_opd: true\n"
      "  opd_type: sglang\n"
      "  opd_kl_coef: 1.0\n"
      "train:\n"
      "  bf16: false\n"
      "  lr: 3.0e-5\n"
      "  seed: 7\n"
      "  global_batch_size: 32\n"
      "  micro_batch_size: 32\n"
      "debug:\n"
      "  deterministic_mode: true\n";  // sample j of a group samples with seed 7 + j
  const fs::path config = dir / "job.yaml";
  std::ofstream(config) << yaml;
  return config;
}

// On-policy distillation from a teacher behind SGLang's API (algorithm.opd_type: sglang): the
// teacher is `slime_train serve` on another model — the student's initial weights with the
// final RMSNorm scaled ×2, i.e. the same ranking of tokens with logits ×2 (a sharper policy) —
// and no task reward is set (pure distillation: every reward 0, so the OPD term is the only
// signal). At rollout temperature 0.05 the random student's near-uniform logits make a peaked
// policy, as a trained model's is. The same prompts and sampling seeds every rollout: the
// reverse KL from student to teacher on the sampled tokens (train/opd_reverse_kl, the mean of
// logp_student − logp_teacher) falls to well under half its start, and the teacher finds the
// student's samples ever more likely (rollout/trainer/teacher_log_probs).
TEST_F(DriverE2eTest, OnPolicyDistillationFromAServedTeacherPullsTheStudentToIt) {
  const fs::path teacher = dir_ / "teacher";
  fs::copy(model_dir(), teacher, fs::copy_options::recursive);
  std::string error;
  ASSERT_TRUE(ScaleSafetensor(teacher, "model.norm.weight", 2.0f, &error)) << error;
  fs::create_directories(dir_ / "server");
  Child server({"serve", "--model", teacher.string(), "--host", "127.0.0.1", "--port", "0",
                "--device", "cpu"},
               dir_ / "server");
  const int port = ServePort(server, std::chrono::seconds(120));
  ASSERT_GT(port, 0) << "the teacher server did not start\n" << server.err();

  const int num_rollout = 8;
  const fs::path config = WriteOpdConfig(dir_, model_dir(), port, num_rollout);
  Child run({"--config", config.string()}, dir_);
  std::optional<int> code = run.Wait(std::chrono::seconds(400));
  ASSERT_EQ(code, std::optional<int>(0)) << "stdout:\n" << run.out() << "\nstderr:\n"
                                         << ReadLogs(dir_ / "run", run);

  std::map<int64_t, Json> rollouts = RolloutRecords(dir_ / "run" / "metrics.jsonl");
  std::map<int64_t, Json> steps = StepValues(dir_ / "run" / "metrics.jsonl");
  ASSERT_EQ(rollouts.size(), static_cast<size_t>(num_rollout));
  ASSERT_EQ(steps.size(), static_cast<size_t>(num_rollout));  // one optimizer step per rollout
  std::vector<double> kl, teacher_lp;
  for (const auto& [step, values] : steps) {
    ASSERT_TRUE(values.contains("train/opd_reverse_kl")) << values.dump();
    kl.push_back(values["train/opd_reverse_kl"].get<double>());
  }
  for (const auto& [id, r] : rollouts) {
    EXPECT_EQ(r.value("rollout/raw_reward", -1.0), 0.0) << "pure distillation: " << r.dump();
    ASSERT_TRUE(r.contains("rollout/trainer/teacher_log_probs")) << r.dump();
    teacher_lp.push_back(r["rollout/trainer/teacher_log_probs"].get<double>());
  }
  std::string trace = "reverse KL per step:";
  for (double v : kl) trace += " " + std::to_string(v);
  trace += "; teacher log-prob per rollout:";
  for (double v : teacher_lp) trace += " " + std::to_string(v);
  std::cerr << trace << "\n";
  // The untrained student is measurably far from the teacher; over the last three steps it is
  // much closer (the same prompts and seeds each rollout: only the student changed).
  const auto last3 = [](const std::vector<double>& v) { return (v[5] + v[6] + v[7]) / 3; };
  EXPECT_GT(kl[0], 0.15) << trace;
  EXPECT_LT(last3(kl), 0.5 * kl[0]) << trace;
  EXPECT_GT(last3(teacher_lp), teacher_lp[0] + 0.2) << trace;
}

// The teacher is down: the first rollout fails the job, naming the teacher's URL and the
// sample it could not score, and no worker is left.
TEST_F(DriverE2eTest, AnUnreachableTeacherFailsTheJobNamingItAndTheSample) {
  int port = 0;
  {
    auto probe = http::Server::Start({}, http::Router());
    ASSERT_TRUE(probe.ok()) << probe.status();
    port = (*probe)->port();  // free again once the server is gone
  }
  const fs::path config = WriteOpdConfig(dir_, model_dir(), port, 1);
  Child run({"--config", config.string(), "--set", "reward.rm_max_attempts=1"}, dir_);
  std::optional<int> code = run.Wait(std::chrono::seconds(300));
  ASSERT_EQ(code, std::optional<int>(1)) << "stdout:\n" << run.out() << "\nstderr:\n"
                                         << run.err();
  const std::string err = run.err();
  EXPECT_NE(err.find("slime_train: error: OPD teacher http://127.0.0.1:" + std::to_string(port) +
                     ": sample "),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("no log-probs after 1 attempt"), std::string::npos) << err;
  EXPECT_EQ(WorkerPid(dir_ / "run", "engine-0"), -1);
  EXPECT_EQ(WorkerPid(dir_ / "run", "trainer-0"), -1);
}

}  // namespace
}  // namespace slime
