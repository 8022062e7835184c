// RunAsyncLoop's schedule (src/job/driver_async.h) against scripted driver steps: the order of
// generate/train/save/sync/eval, that no weight update or eval runs while a generation is in
// flight, that checkpoint N keeps the data-source state of after rollout N, staleness, and that
// a failure or a stop cancels and joins the generation in flight. The real driver runs this
// loop in tests/job/driver_e2e_test.cc (Async*).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "driver_async.h"  // src/job (internal to the job module)
#include "gtest/gtest.h"

namespace slime::job {
namespace {

class ScriptedSteps : public RolloutSteps {
 public:
  int sync_interval = 1;
  int eval_interval = 0;  // 0: never
  int64_t fail_generate_at = -1;
  int64_t fail_train_at = -1;
  int64_t stop_after_report = -1;
  std::chrono::milliseconds generate_time{40};
  std::chrono::milliseconds train_time{20};
  std::chrono::milliseconds sync_time{0};
  std::chrono::milliseconds eval_time{0};
  bool fully_async = false;  // RunFullyAsyncLoop: generation runs on across syncs
  int64_t slow_from = -1;  // rollouts from this one take 30 s unless cancelled
  int64_t num_rollout = 4;
  std::optional<int64_t> carried_sample_version;  // adds one sample this old to every rollout

  StatusOr<rollout::RolloutResult> GenerateRollout(int64_t rollout_id) override {
    EXPECT_FALSE(generating_.exchange(true)) << "two generations at once";
    const int64_t version = version_.load();
    {
      std::lock_guard<std::mutex> lock(mu_);
      events_.push_back("gen " + std::to_string(rollout_id));
      offset_ += 4;  // draws its prompts first, as the coordinator does
      started_ = std::max(started_, rollout_id);
    }
    started_cv_.notify_all();
    const auto end = std::chrono::steady_clock::now() +
                     (slow_from >= 0 && rollout_id >= slow_from ? std::chrono::seconds(30)
                                                                : generate_time);
    while (std::chrono::steady_clock::now() < end && !cancelled_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    generating_ = false;
    if (cancelled_) return absl::CancelledError("cancelled");
    if (rollout_id == fail_generate_at) return absl::UnavailableError("engine gone");
    rollout::RolloutResult result;
    result.rollout_id = rollout_id;
    data::Sample s;
    s.weight_versions = {std::to_string(version)};
    s.weight_version_tokens = {3};
    // A sync landed during the generation: the answer's later tokens carry the new version.
    if (const int64_t now = version_.load(); now != version) {
      s.weight_versions.push_back(std::to_string(now));
      s.weight_version_tokens.push_back(2);
    }
    result.groups.push_back({s, s});
    if (carried_sample_version) {  // a sample continued from an earlier rollout
      data::Sample old;
      old.weight_versions = {std::to_string(*carried_sample_version), std::to_string(version)};
      result.groups.push_back({old});
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      generated_versions[rollout_id] = result.groups.front().front().weight_versions;
    }
    return result;
  }
  RolloutSideState CaptureState() override {
    EXPECT_FALSE(generating_) << "state captured while a generation draws prompts";
    RolloutSideState state;
    state.data_source = data::DataSourceState{};
    std::lock_guard<std::mutex> lock(mu_);
    state.data_source->offset = offset_;
    return state;
  }
  Status ProcessRollout(int64_t rollout_id, const rollout::RolloutResult&,
                        MetricValues*) override {
    Event("process", rollout_id);
    return absl::OkStatus();
  }
  Status Train(int64_t rollout_id, const rollout::RolloutResult& result,
               MetricValues*) override {
    Event("train", rollout_id);
    for (const data::SampleGroup& g : result.groups) {
      for (const data::Sample& s : g) removed[rollout_id] += s.remove_sample;
    }
    trained.push_back(rollout_id);
    if (!fully_async && rollout_id + 1 < num_rollout) {
      // The next rollout generates while this one trains.
      std::unique_lock<std::mutex> lock(mu_);
      EXPECT_TRUE(started_cv_.wait_for(lock, std::chrono::seconds(5),
                                       [&] { return started_ >= rollout_id + 1; }))
          << "generation of rollout " << rollout_id + 1 << " did not start during training of "
          << rollout_id;
    }
    std::this_thread::sleep_for(train_time);
    if (rollout_id == fail_train_at) return absl::InternalError("trainer died");
    return absl::OkStatus();
  }
  Status Save(int64_t rollout_id, const RolloutSideState& state, MetricValues*) override {
    Event("save", rollout_id);
    saved_offsets.push_back(state.data_source->offset);
    return absl::OkStatus();
  }
  bool SyncDue(int64_t rollout_id) override { return (rollout_id + 1) % sync_interval == 0; }
  Status UpdateWeights(int64_t rollout_id, EngineRequests requests, MetricValues*) override {
    if (fully_async) {
      EXPECT_EQ(requests, EngineRequests::kKeep) << "a fully async sync drains the engines";
      EXPECT_FALSE(evaluating_) << "weight update during an eval (rollout " << rollout_id << ")";
    } else {
      EXPECT_EQ(requests, EngineRequests::kAbort);
      EXPECT_FALSE(generating_) << "weight update during a generation (rollout " << rollout_id
                                << ")";
    }
    if (generating_) Event("sync during gen", rollout_id);
    Event("sync", rollout_id);
    std::this_thread::sleep_for(sync_time);
    version_ = rollout_id + 1;
    return absl::OkStatus();
  }
  bool EvalDue(int64_t rollout_id) override {
    return eval_interval > 0 && (rollout_id + 1) % eval_interval == 0;
  }
  Status Evaluate(int64_t rollout_id, MetricValues*) override {
    EXPECT_FALSE(generating_) << "eval during a generation";
    evaluating_ = true;
    Event("eval", rollout_id);
    eval_versions.push_back(version_.load());
    std::this_thread::sleep_for(eval_time);
    evaluating_ = false;
    return absl::OkStatus();
  }
  Status Report(int64_t rollout_id, const MetricValues& values) override {
    Event("report", rollout_id);
    reports.push_back(values);
    if (rollout_id == stop_after_report) stopped_ = true;
    return absl::OkStatus();
  }
  void CancelGeneration() override { cancelled_ = true; }
  bool Stopped() override { return stopped_; }

  bool generating() const { return generating_; }
  bool cancelled() const { return cancelled_; }
  std::vector<std::string> events() {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }
  // Position of `event` in the log, -1 when absent.
  int IndexOf(const std::string& event) {
    std::vector<std::string> e = events();
    for (size_t i = 0; i < e.size(); ++i) {
      if (e[i] == event) return static_cast<int>(i);
    }
    return -1;
  }

  std::vector<int64_t> saved_offsets;
  std::vector<MetricValues> reports;
  std::vector<int64_t> trained;
  std::vector<int64_t> eval_versions;  // the weight version each eval saw
  std::map<int64_t, std::vector<std::string>> generated_versions;  // guarded by mu_
  // The rollouts whose Train received a sample marked remove_sample, by count.
  std::map<int64_t, int64_t> removed;

 private:
  void Event(const std::string& what, int64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(what + " " + std::to_string(id));
  }
  std::mutex mu_;
  std::condition_variable started_cv_;
  int64_t started_ = -1;  // the last rollout whose generation began
  std::vector<std::string> events_;
  int64_t offset_ = 0;
  std::atomic<bool> generating_{false};
  std::atomic<bool> evaluating_{false};
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> stopped_{false};
  std::atomic<int64_t> version_{0};
};

TEST(AsyncLoop, GeneratesTheNextRolloutWhileTrainingAndSyncsBetweenGenerations) {
  ScriptedSteps steps;
  steps.eval_interval = 2;
  ASSERT_TRUE(RunAsyncLoop(0, 4, &steps).ok());
  // (Train checks that generation k+1 began while rollout k trained.)
  EXPECT_EQ(steps.IndexOf("gen 4"), -1);
  EXPECT_GE(steps.IndexOf("eval 1"), 0);
  EXPECT_EQ(steps.IndexOf("eval 0"), -1);
  // Checkpoint k keeps the source after rollout k (k+1 had drawn its 4 prompts already).
  EXPECT_EQ(steps.saved_offsets, (std::vector<int64_t>{4, 8, 12, 16}));
  ASSERT_EQ(steps.reports.size(), 4u);
  for (int k = 0; k < 4; ++k) {
    const MetricValues& v = steps.reports[k];
    EXPECT_EQ(v.at("rollout/weight_staleness/max"), k == 0 ? 0.0 : 1.0) << k;
    EXPECT_GE(v.at("perf/rollout_time"), 0.035) << k;
    EXPECT_TRUE(v.count("perf/rollout_wait_time")) << k;
    // The sync after rollout k waits for generation k+1; nothing is in flight after the last.
    EXPECT_EQ(v.count("perf/update_weights_wait_time"), k < 3 ? 1u : 0u) << k;
    EXPECT_LE(v.at("timeline/generate_start_s"), v.at("timeline/generate_end_s"));
    if (k > 0) {
      EXPECT_GT(v.at("perf/rollout_train_overlap_time"), 0.0) << k;
    }
  }
}

TEST(AsyncLoop, WithSyncIntervalTwoGenerationRunsOnAcrossTheSkippedSync) {
  ScriptedSteps steps;
  steps.sync_interval = 2;
  steps.generate_time = std::chrono::milliseconds(60);
  ASSERT_TRUE(RunAsyncLoop(0, 4, &steps).ok());
  // Rollout 1 synced (version 2); rollout 2 began before that sync, rollout 3 after it.
  EXPECT_LT(steps.IndexOf("gen 2"), steps.IndexOf("sync 1"));
  EXPECT_GT(steps.IndexOf("gen 3"), steps.IndexOf("sync 1"));
  EXPECT_EQ(steps.IndexOf("sync 0"), -1);
  EXPECT_EQ(steps.reports[1].at("rollout/weight_staleness/max"), 1.0);
  EXPECT_EQ(steps.reports[2].at("rollout/weight_staleness/max"), 2.0);
  EXPECT_EQ(steps.reports[3].at("rollout/weight_staleness/max"), 1.0);
}

TEST(AsyncLoop, AFailedStepCancelsAndJoinsTheGenerationInFlight) {
  ScriptedSteps steps;
  steps.fail_train_at = 1;
  steps.slow_from = 2;  // in flight when training rollout 1 fails
  const auto start = std::chrono::steady_clock::now();
  Status s = RunAsyncLoop(0, 4, &steps);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_TRUE(steps.cancelled());
  EXPECT_FALSE(steps.generating()) << "the prefetch thread outlived the loop";
  EXPECT_GE(steps.IndexOf("gen 2"), 0);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

TEST(AsyncLoop, AFailedPrefetchIsReportedWhenTheLoopNeedsIt) {
  ScriptedSteps steps;
  steps.fail_generate_at = 2;
  Status s = RunAsyncLoop(0, 4, &steps);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_EQ(steps.IndexOf("train 2"), -1);
  EXPECT_EQ(steps.IndexOf("sync 1"), -1) << "the sync waits for generation 2, which failed";
}

TEST(AsyncLoop, AStopBetweenRolloutsCancelsThePrefetch) {
  ScriptedSteps steps;
  steps.sync_interval = 1000;  // nothing waits for rollout 1 inside rollout 0's iteration
  steps.slow_from = 1;
  steps.stop_after_report = 0;
  const auto start = std::chrono::steady_clock::now();
  Status s = RunAsyncLoop(0, 4, &steps);
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  EXPECT_TRUE(steps.cancelled());
  EXPECT_FALSE(steps.generating());
  EXPECT_EQ(steps.IndexOf("train 1"), -1);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

TEST(AsyncLoop, WeightStalenessIgnoresSamplesWithoutANumericVersion) {
  rollout::RolloutResult r;
  r.rollout_id = 5;
  data::Sample a, b, c;
  a.weight_versions = {"3", "4"};  // the oldest span counts: 2
  b.weight_versions = {"4"};
  c.weight_versions = {"v4"};
  r.groups.push_back({a, b, c});
  auto st = WeightStaleness(r);
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->max, 2.0);
  EXPECT_EQ(st->min, 1.0);
  EXPECT_EQ(st->mean, 1.5);
  r.groups = {{c}};
  EXPECT_FALSE(WeightStaleness(r).has_value());
}

TEST(AsyncLoop, TokensByStalenessCountTheTrainedSamplesSpans) {
  rollout::RolloutResult r;
  r.rollout_id = 5;
  data::Sample a, b, unknown, removed;
  a.weight_versions = {"3", "4", "5"};
  a.weight_version_tokens = {10, 4, 1};
  b.weight_versions = {"4"};
  b.weight_version_tokens = {7};
  unknown.weight_versions = {"2"};  // its span sizes are not known: staleness only
  removed.weight_versions = {"1"};
  removed.weight_version_tokens = {100};
  removed.remove_sample = true;  // not trained: neither
  r.groups.push_back({a, b, unknown, removed});
  auto st = WeightStaleness(r);
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->tokens_by_lag, (std::map<int64_t, int64_t>{{0, 1}, {1, 11}, {2, 10}}));
  EXPECT_EQ(st->max, 3.0);
  MetricValues values;
  AddStalenessMetrics(*st, &values);
  EXPECT_EQ(values.at("rollout/tokens_by_staleness/1"), 11.0);
  EXPECT_EQ(values.at("rollout/weight_staleness/min"), 1.0);
  EXPECT_EQ(values.count("rollout/tokens_by_staleness/3"), 0u);
}

// ---- RunFullyAsyncLoop ----------------------------------------------------------------------

std::vector<std::string> Versions(std::initializer_list<int64_t> v) {
  std::vector<std::string> out;
  for (int64_t x : v) out.push_back(std::to_string(x));
  return out;
}

TEST(FullyAsyncLoop, ASlowTrainerMakesTheProducerWaitOnTheBound) {
  ScriptedSteps steps;
  steps.fully_async = true;
  steps.num_rollout = 6;
  steps.train_time = std::chrono::milliseconds(150);  // generation takes 40 ms
  ASSERT_TRUE(RunFullyAsyncLoop(0, 6, /*max_staleness=*/1, &steps).ok());
  ASSERT_EQ(steps.reports.size(), 6u);
  EXPECT_EQ(steps.trained, (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  double producer_waited = 0;
  for (int64_t k = 0; k < 6; ++k) {
    const MetricValues& v = steps.reports[k];
    // Rollout k starts once the weights of k − 1 are on the engines (k − version ≤ 1), and
    // finishes before the next sync: every token carries version k − 1.
    EXPECT_EQ(v.at("async/admitted_version"), static_cast<double>(std::max<int64_t>(0, k - 1)));
    EXPECT_EQ(steps.generated_versions.at(k), Versions({std::max<int64_t>(0, k - 1)})) << k;
    EXPECT_EQ(v.at("rollout/weight_staleness/max"), k == 0 ? 0.0 : 1.0) << k;
    EXPECT_LE(v.at("rollout/weight_staleness/min"), v.at("rollout/weight_staleness/max"));
    EXPECT_EQ(v.at("async/stale_samples_dropped"), 0.0);
    producer_waited += v.at("async/producer_wait_time");
  }
  // The producer ran ahead and waited on the bound while the trainer trained (~110 ms a
  // rollout from rollout 2 on).
  EXPECT_GT(producer_waited, 0.3);
  EXPECT_EQ(steps.IndexOf("gen 6"), -1);
  // Checkpoint k keeps the data source after rollout k, however far the producer had run.
  EXPECT_EQ(steps.saved_offsets, (std::vector<int64_t>{4, 8, 12, 16, 20, 24}));
}

TEST(FullyAsyncLoop, WeightUpdatesLandDuringAGenerationAndItsTokensCarryBothVersions) {
  ScriptedSteps steps;
  steps.fully_async = true;
  steps.num_rollout = 5;
  steps.generate_time = std::chrono::milliseconds(250);
  steps.train_time = std::chrono::milliseconds(10);
  ASSERT_TRUE(RunFullyAsyncLoop(0, 5, /*max_staleness=*/2, &steps).ok());
  // Rollout j (j ≥ 1) starts as rollout j − 1 finishes, at version j − 1; the sync of j − 1
  // (version j) lands while it generates.
  EXPECT_EQ(steps.generated_versions.at(0), Versions({0}));
  for (int64_t j = 1; j < 5; ++j) {
    EXPECT_EQ(steps.generated_versions.at(j), Versions({j - 1, j})) << j;
    EXPECT_GE(steps.IndexOf("sync during gen " + std::to_string(j - 1)), 0) << j;
    EXPECT_EQ(steps.reports[j].at("rollout/weight_staleness/max"), 1.0) << j;
    // Tokens by version: each of the two samples made 3 tokens at j − 1, 2 at j.
    EXPECT_EQ(steps.reports[j].at("rollout/tokens_by_staleness/1"), 6.0) << j;
    EXPECT_EQ(steps.reports[j].at("rollout/tokens_by_staleness/0"), 4.0) << j;
  }
  EXPECT_EQ(steps.reports[0].at("rollout/tokens_by_staleness/0"), 6.0);
  EXPECT_EQ(steps.reports[0].count("rollout/tokens_by_staleness/1"), 0u);
  // The trainer idled on generation: it waited for every rollout.
  EXPECT_GT(steps.reports[2].at("perf/rollout_wait_time"), 0.15);
}

TEST(FullyAsyncLoop, MaxStalenessZeroIsTheSynchronousSchedule) {
  ScriptedSteps steps;
  steps.fully_async = true;
  ASSERT_TRUE(RunFullyAsyncLoop(0, 4, /*max_staleness=*/0, &steps).ok());
  for (int64_t k = 0; k + 1 < 4; ++k) {
    EXPECT_GT(steps.IndexOf("gen " + std::to_string(k + 1)), steps.IndexOf("sync " + std::to_string(k)));
    EXPECT_EQ(steps.generated_versions.at(k), Versions({k}));
    EXPECT_EQ(steps.reports[k].at("rollout/weight_staleness/max"), 0.0);
  }
  EXPECT_EQ(steps.IndexOf("sync during gen 0"), -1);
}

TEST(FullyAsyncLoop, SamplesOverTheBoundAreDroppedFromTheLoss) {
  ScriptedSteps steps;
  steps.fully_async = true;
  steps.num_rollout = 5;
  steps.carried_sample_version = 0;  // one sample of every rollout began at version 0
  ASSERT_TRUE(RunFullyAsyncLoop(0, 5, /*max_staleness=*/1, &steps).ok());
  for (int64_t k = 0; k < 5; ++k) {
    const int64_t over = k >= 2 ? 1 : 0;  // lag k > 1
    EXPECT_EQ(steps.removed[k], over) << k;
    EXPECT_EQ(steps.reports[k].at("async/stale_samples_dropped"), static_cast<double>(over)) << k;
    // What trains is within the bound.
    EXPECT_LE(steps.reports[k].at("rollout/weight_staleness/max"), 1.0) << k;
  }
}

TEST(FullyAsyncLoop, AnEvalRunsBetweenGenerationsAtOneWeightVersion) {
  ScriptedSteps steps;
  steps.fully_async = true;
  steps.num_rollout = 4;
  steps.eval_interval = 2;
  steps.eval_time = std::chrono::milliseconds(120);  // longer than a rollout's training
  ASSERT_TRUE(RunFullyAsyncLoop(0, 4, /*max_staleness=*/1, &steps).ok());
  // Asked after the syncs of rollouts 1 and 3: each saw the weights of that sync, no update
  // landed during it (UpdateWeights checks), and the loop waited for the last one.
  EXPECT_EQ(steps.eval_versions, (std::vector<int64_t>{2, 4}));
  EXPECT_GE(steps.IndexOf("eval 3"), 0);
  EXPECT_GT(steps.IndexOf("sync 2"), steps.IndexOf("eval 1"));
  EXPECT_GT(steps.reports[2].at("perf/eval_wait_time"), 0.0);
}

TEST(FullyAsyncLoop, AFailureOrAStopCancelsTheGenerationAndJoinsTheProducer) {
  {
    ScriptedSteps steps;
    steps.fully_async = true;
    steps.fail_train_at = 1;
    steps.slow_from = 2;
    const auto start = std::chrono::steady_clock::now();
    Status s = RunFullyAsyncLoop(0, 4, 1, &steps);
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
    EXPECT_TRUE(steps.cancelled());
    EXPECT_FALSE(steps.generating()) << "the producer outlived the loop";
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  }
  {
    ScriptedSteps steps;
    steps.fully_async = true;
    steps.fail_generate_at = 2;
    Status s = RunFullyAsyncLoop(0, 4, 1, &steps);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_EQ(steps.IndexOf("train 2"), -1);
    EXPECT_EQ(steps.IndexOf("gen 3"), -1) << "the producer stops at a failed generation";
  }
  {
    ScriptedSteps steps;
    steps.fully_async = true;
    steps.slow_from = 1;
    steps.stop_after_report = 0;
    const auto start = std::chrono::steady_clock::now();
    Status s = RunFullyAsyncLoop(0, 4, 1, &steps);
    EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
    EXPECT_TRUE(steps.cancelled());
    EXPECT_EQ(steps.IndexOf("train 1"), -1);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  }
}

}  // namespace
}  // namespace slime::job
