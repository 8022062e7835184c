// The rollout coordinator against two real engines behind their real HTTP servers (tiny
// random-weight Qwen3 on CPU, real Qwen3 tokenizer), prompts from a real PromptDataSource and
// rewards from the reward module (a remote reward model served over HTTP by this test, and
// exact_match). Covers routing (a group stays on one engine, both engines are used), the
// per-engine concurrency limit seen from the engines, the dynamic filter, abort at the end of a
// rollout, partial-rollout resumption with off-policy masking, eval with pass@k, an engine
// lost mid-rollout (recovered through EngineRecovery, its groups retried whole), samples over
// the fully async staleness bound started over (stale_samples: regenerate), and the routed
// experts of a mixture-of-experts engine carried into the samples (routing replay).
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include "nlohmann/json.hpp"
#include "remove_tree.h"
#include "slime/data/prompt_dataset.h"
#include "slime/engine/engine.h"
#include "slime/engine/server.h"
#include "slime/http/server.h"
#include "slime/metrics/registry.h"
#include "slime/model/decoder.h"
#include "slime/model/init_random_model.h"
#include "slime/reward/reward.h"
#include "slime/rollout/coordinator.h"
#include "test_engine.h"
#include "test_paths.h"

namespace slime::rollout {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

using slime::testing::SourceDir;
using slime::testing::StartTestEngine;
using EngineUnderTest = slime::testing::TestEngine;

class RolloutEngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string tok = SourceDir() + "/.cache/testdata/qwen3";
    if (!fs::exists(tok + "/tokenizer.json")) {
      skip_ = "Qwen3 tokenizer missing at " + tok + ": run scripts/fetch_test_data.sh";
      return;
    }
    model_dir_ =
        (fs::temp_directory_path() / ("slime-rollout-test-" + std::to_string(::getpid()))).string();
    testing::RemoveTree(model_dir_);
    Status s =
        model::InitRandomModel(SourceDir() + "/tests/data/model/configs/qwen3-engine-test.json",
                               tok, model_dir_, 0, "fp32");
    ASSERT_TRUE(s.ok()) << s;
    for (int i = 0; i < 2; ++i) {
      auto e = StartTestEngine(
          {.model_dir = model_dir_, .weight_version = i == 0 ? "engine-a" : "engine-b"});
      ASSERT_TRUE(e.ok()) << e.status();
      engines_.push_back(e->release());
    }
    // The remote reward model: label "zero" → 0, "one" → 1, otherwise a number derived from
    // the response text (different responses get different rewards).
    http::Router router;
    router.Add(
        "POST", "/rm", [](const http::Request& req, std::shared_ptr<http::ResponseWriter> w) {
          json body = json::parse(req.body);
          const std::string label = body.value("label", "");
          double r = 0;
          if (label == "one") {
            r = 1;
          } else if (label != "zero") {
            r = static_cast<double>(std::hash<std::string>()(body.value("response", "")) % 1000) /
                1000.0;
          }
          w->SendJson(200, r);
        });
    auto rm = http::Server::Start({}, std::move(router));
    ASSERT_TRUE(rm.ok()) << rm.status();
    rm_server_ = rm->release();
  }
  static void TearDownTestSuite() {
    if (rm_server_ != nullptr) rm_server_->Stop();
    delete rm_server_;
    for (auto* e : engines_) {
      e->server->Stop();
      delete e;
    }
    engines_.clear();
    if (!model_dir_.empty()) testing::RemoveTree(model_dir_);
  }

  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    ASSERT_EQ(engines_.size(), 2u) << "the engines did not start (see the suite set-up)";
    ASSERT_NE(rm_server_, nullptr) << "the reward server did not start";
    reward::RewardOptions ro;
    ro.rm_type = "remote_rm";
    ro.remote.url = "http://127.0.0.1:" + std::to_string(rm_server_->port()) + "/rm";
    ro.remote.timeout = std::chrono::seconds(10);
    ro.remote.max_attempts = 2;
    auto rm = reward::RewardModel::Create(ro);
    ASSERT_TRUE(rm.ok()) << rm.status();
    reward_ = std::move(*rm);
    for (auto* e : engines_) {
      e->engine->Continue();  // a failed test may have left an engine paused
      WaitIdle(e);
    }
  }

  static double RequestsReceived(EngineUnderTest* e) {
    return e->registry->GetCounter("slime_engine_requests_total", "Generation requests received.")
        .Value();
  }

  static void WaitIdle(EngineUnderTest* e) {
    for (int i = 0; i < 1000; ++i) {
      const auto load = e->engine->load();
      if (load.num_running == 0 && load.num_waiting == 0) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    FAIL() << "engine still busy after 10 s";
  }

  // A PromptDataSource over JSONL rows {"input", "label"}.
  std::unique_ptr<data::PromptDataSource> Source(
      const std::vector<std::pair<std::string, std::string>>& rows, int n) {
    std::string text;
    for (const auto& [input, label] : rows) {
      text += json{{"input", input}, {"label", label}}.dump() + "\n";
    }
    data::PromptDatasetOptions po;
    po.label_key = "label";
    auto ds = data::PromptDataset::Parse(text, "test.jsonl", engines_[0]->engine->tokenizer(), po);
    EXPECT_TRUE(ds.ok()) << ds.status();
    dataset_ = std::make_shared<const data::PromptDataset>(std::move(*ds));
    data::PromptDataSourceOptions so;
    so.n_samples_per_prompt = n;
    auto src = data::PromptDataSource::Create(dataset_, so);
    EXPECT_TRUE(src.ok()) << src.status();
    return std::make_unique<data::PromptDataSource>(std::move(*src));
  }

  RolloutOptions Options(int batch, int n, int concurrency) {
    RolloutOptions o;
    o.engines.addresses = {engines_[0]->url(), engines_[1]->url()};
    o.engines.concurrency_per_engine = concurrency;
    o.engines.max_attempts = 2;
    o.engines.retry_interval = std::chrono::milliseconds(50);
    o.rollout_batch_size = batch;
    o.n_samples_per_prompt = n;
    o.sampling.max_response_len = 8;
    o.deterministic = true;
    return o;
  }

  static std::string skip_;
  static std::string model_dir_;
  static std::vector<EngineUnderTest*> engines_;
  static http::Server* rm_server_;
  std::shared_ptr<const data::PromptDataset> dataset_;
  std::unique_ptr<reward::RewardModel> reward_;
};

std::string RolloutEngineTest::skip_;
std::string RolloutEngineTest::model_dir_;
std::vector<EngineUnderTest*> RolloutEngineTest::engines_;
http::Server* RolloutEngineTest::rm_server_ = nullptr;

TEST_F(RolloutEngineTest, GroupsStayOnOneEngineWithinTheConcurrencyLimit) {
  std::vector<std::pair<std::string, std::string>> rows;
  for (int i = 0; i < 8; ++i) rows.push_back({"Question number " + std::to_string(i), "x"});
  auto source = Source(rows, 4);
  PromptGroupSource groups(source.get());
  RolloutCoordinator c;
  RolloutOptions o = Options(8, 4, 3);
  o.log_passrate = true;
  ASSERT_TRUE(c.Configure(o, &groups, reward_.get()).ok());
  std::vector<RolloutProgress> progress;
  c.SetProgressCallback([&](const RolloutProgress& p) { progress.push_back(p); });

  // The engines start paused, so every request the coordinator sends stays queued there: each
  // engine must hold exactly its limit (3) and no more, however long we wait. Then they run,
  // watched (the engine's load snapshot, taken between engine steps, never shows a request after
  // its answer was sent together with the one sent in its place).
  double received_before[2];
  for (int i = 0; i < 2; ++i) {
    received_before[i] = RequestsReceived(engines_[i]);
    engines_[i]->engine->Pause();  // ordered before any request the rollout submits
  }
  std::atomic<bool> stop{false};
  std::atomic<int64_t> max_load[2] = {0, 0};
  std::thread watcher([&] {
    while (!stop) {
      for (int i = 0; i < 2; ++i) {
        const auto l = engines_[i]->engine->load();
        max_load[i] = std::max<int64_t>(max_load[i], l.num_running + l.num_waiting);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  auto generate = std::async(std::launch::async, [&] { return c.Generate(0); });
  auto held = [&](int i) {
    const auto l = engines_[i]->engine->load();
    return l.num_running + l.num_waiting;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while ((held(0) < 3 || held(1) < 3) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // room to overshoot
  for (int i = 0; i < 2; ++i) {
    const auto l = engines_[i]->engine->load();
    EXPECT_EQ(l.num_running, 0) << "engine " << i << " is paused";
    EXPECT_EQ(l.num_waiting, 3) << "engine " << i << " should hold exactly the limit";
    EXPECT_EQ(c.engine_pool()->stats(i).in_flight, 3) << "engine " << i;
  }
  for (auto* e : engines_) e->engine->Continue();
  auto r = generate.get();
  stop = true;
  watcher.join();
  ASSERT_TRUE(r.ok()) << r.status();

  ASSERT_EQ(r->groups.size(), 8u);
  std::map<std::string, int> per_engine;
  int64_t last_index = -1;
  for (const auto& g : r->groups) {
    ASSERT_EQ(g.size(), 4u);
    const std::string version = g.front().weight_versions.at(0);
    ++per_engine[version];
    for (const auto& s : g) {
      EXPECT_EQ(s.weight_versions, std::vector<std::string>{version}) << "group split";
      EXPECT_EQ(s.metadata["engine"], g.front().metadata["engine"]);
      EXPECT_GT(s.index, last_index);  // sorted by sample index
      last_index = s.index;
      EXPECT_EQ(s.rollout_id, 0);
      EXPECT_GE(s.response_length, 1);
      EXPECT_LE(s.response_length, 8);
      EXPECT_EQ(s.rollout_log_probs.size(), static_cast<size_t>(s.response_length));
      for (float lp : s.rollout_log_probs) EXPECT_LE(lp, 0.0f);
      EXPECT_TRUE(s.status == data::SampleStatus::kTruncated ||
                  s.status == data::SampleStatus::kCompleted);
      EXPECT_TRUE(s.Validate().ok()) << s.Validate();
    }
  }
  EXPECT_EQ(per_engine.size(), 2u) << "both engines should serve groups";
  EXPECT_GE(per_engine["engine-a"], 2);
  EXPECT_GE(per_engine["engine-b"], 2);
  for (int i = 0; i < 2; ++i) {
    EXPECT_LE(max_load[i].load(), 3) << "engine " << i;
    EXPECT_EQ(c.engine_pool()->stats(i).max_in_flight, 3) << "engine " << i;
    // One /generate per sample of the groups it served: no retry, no duplicate.
    const std::string version = i == 0 ? "engine-a" : "engine-b";
    EXPECT_EQ(RequestsReceived(engines_[i]) - received_before[i], per_engine[version] * 4.0)
        << "engine " << i;
  }
  // Post-processed rewards: each group of 4 has mean 0 (grpo).
  ASSERT_EQ(r->rewards.size(), 32u);
  for (size_t g = 0; g < 8; ++g) {
    double sum = 0;
    for (size_t k = 0; k < 4; ++k) sum += r->rewards[g * 4 + k];
    EXPECT_NEAR(sum, 0, 1e-9);
  }
  for (const char* key : {"rollout/raw_reward", "rollout/response_len/mean",
                          "rollout/truncated_ratio", "perf/rollout_time", "passrate/pass@4"}) {
    EXPECT_EQ(r->metrics.count(key), 1u) << key;
  }
  ASSERT_FALSE(progress.empty());
  EXPECT_EQ(progress.back().samples_done, 32);
  EXPECT_EQ(progress.back().samples_target, 32);
  EXPECT_GT(progress.back().response_tokens, 0);
}

TEST_F(RolloutEngineTest, DynamicFilterDropsZeroStdGroups) {
  // First wave: 4 groups whose reward is always 0 (dropped); then groups with varied rewards.
  std::vector<std::pair<std::string, std::string>> rows;
  for (int i = 0; i < 4; ++i) rows.push_back({"Zero prompt " + std::to_string(i), "zero"});
  for (int i = 0; i < 4; ++i) rows.push_back({"Vary prompt " + std::to_string(i), "vary"});
  auto source = Source(rows, 3);
  PromptGroupSource groups(source.get());
  RolloutCoordinator c;
  RolloutOptions o = Options(2, 3, 8);
  o.over_sampling_batch_size = 4;
  o.dynamic_filter = DynamicFilter::kNonzeroStd;
  ASSERT_TRUE(c.Configure(o, &groups, reward_.get()).ok());
  auto r = c.Generate(0);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->groups.size(), 2u);
  for (const auto& g : r->groups) {
    EXPECT_EQ(g.front().label, "vary");
    std::vector<double> rewards;
    for (const auto& s : g) rewards.push_back(s.reward);
    EXPECT_GT(reward::SampleStd(rewards), 1e-6);
  }
  EXPECT_GE(r->metrics["rollout/dynamic_filter/drop_zero_std_0.0"], 3);
  EXPECT_LE(r->metrics["rollout/dynamic_filter/drop_zero_std_0.0"], 4);

  // With the fallback, a source of nothing but zero-std groups still completes the rollout.
  auto zeros = Source({{"Only zeros A", "zero"}, {"Only zeros B", "zero"}}, 2);
  PromptGroupSource zero_groups(zeros.get());
  o = Options(2, 2, 8);
  o.dynamic_filter = DynamicFilter::kNonzeroStdWithFallback;
  ASSERT_TRUE(c.Configure(o, &zero_groups, reward_.get()).ok());
  r = c.Generate(1);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->groups.size(), 2u);
  EXPECT_EQ(r->metrics["rollout/dynamic_filter/kept_by_fallback"], 2);
  EXPECT_EQ(r->metrics["rollout/zero_std/count_0.0"], 2);
}

TEST_F(RolloutEngineTest, AbortAtTheEndAndPartialRolloutResumes) {
  // The first prompt nearly fills max_context_len (a few new tokens), the others have room for
  // many: the short group is kept, the long ones are cut by the end-of-rollout abort.
  std::string long_prompt;
  for (int i = 0; i < 24; ++i) long_prompt += "alpha beta ";
  auto source = Source({{long_prompt, "x"}, {"Hi", "x"}, {"Yo", "x"}}, 2);
  const int64_t long_len = dataset_->prompt(0).tokens.size();
  ASSERT_GE(long_len, 40);
  PromptGroupSource groups(source.get());
  RolloutCoordinator c;
  RolloutOptions o = Options(1, 2, 4);
  o.over_sampling_batch_size = 3;
  o.partial_rollout = true;
  o.mask_offpolicy_in_partial_rollout = true;
  o.sampling.max_response_len = 400;
  o.sampling.max_context_len = static_cast<int>(long_len + 3);
  ASSERT_TRUE(c.Configure(o, &groups, reward_.get()).ok());
  auto r = c.Generate(1);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->groups.size(), 1u);
  EXPECT_EQ(r->groups[0][0].group_index, 0);
  for (const auto& s : r->groups[0]) EXPECT_EQ(s.response_length, 3);  // context cap
  // Nothing of ours is left running on the engines.
  for (auto* e : engines_) WaitIdle(e);
  ASSERT_EQ(c.partial_rollout_buffer().size(), 2u);
  int partial = 0;
  std::map<int64_t, std::vector<int32_t>> before;
  for (const auto& g : c.partial_rollout_buffer()) {
    for (const auto& s : g) {
      EXPECT_EQ(s.status, data::SampleStatus::kAborted);
      EXPECT_EQ(s.metadata["start_rollout_id"], 1);
      EXPECT_LT(s.response_length, long_len + 3 - s.PromptLength());
      partial += s.response_length > 0 ? 1 : 0;
      before[s.index] = s.tokens;
    }
  }
  EXPECT_GE(partial, 1) << "the abort should cut at least one response mid-way";
  EXPECT_GE(r->metrics["rollout/aborted_samples"], 4);
  EXPECT_EQ(r->metrics["rollout/partial_rollout/recycled_groups"], 2);

  // The buffer survives a checkpoint.
  RolloutCoordinator restored;
  ASSERT_TRUE(restored.RestoreState(c.State()).ok());
  ASSERT_EQ(restored.State(), c.State());

  // Next rollout: both recycled groups are continued to their full budget.
  o.rollout_batch_size = 2;
  o.over_sampling_batch_size = 2;
  ASSERT_TRUE(restored.Configure(o, &groups, reward_.get()).ok());
  r = restored.Generate(2);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->groups.size(), 2u);
  for (const auto& g : r->groups) {
    for (const auto& s : g) {
      const std::vector<int32_t>& old = before.at(s.index);
      const int64_t old_response = static_cast<int64_t>(old.size()) - s.PromptLength();
      ASSERT_GE(s.tokens.size(), old.size());
      EXPECT_TRUE(std::equal(old.begin(), old.end(), s.tokens.begin())) << "not a continuation";
      EXPECT_EQ(s.response_length, long_len + 3 - s.PromptLength());
      EXPECT_EQ(s.status, data::SampleStatus::kTruncated);
      EXPECT_EQ(s.rollout_log_probs.size(), static_cast<size_t>(s.response_length));
      for (int64_t t = 0; t < s.response_length; ++t) {
        EXPECT_EQ(s.loss_mask[t], t < old_response ? 0 : 1) << "token " << t;
      }
      EXPECT_EQ(s.metadata["start_rollout_id"], 1);
      EXPECT_EQ(s.rollout_id, 2);
    }
  }
  EXPECT_TRUE(restored.partial_rollout_buffer().empty());
}

TEST_F(RolloutEngineTest, SamplesOverTheStalenessBoundStartOverFromTheirPrompt) {
  // --fully-async with rollout.stale_samples: regenerate. Two continued samples come out of
  // the partial-rollout buffer into rollout 4 under a bound of 1: the one begun at version 0
  // (lag 4) starts over from its prompt, the one begun at version 3 (lag 1) is continued.
  auto source = Source({{"Hi there", "x"}, {"Yo", "x"}}, 2);
  PromptGroupSource groups(source.get());
  auto first = groups.GetSamples(1);
  ASSERT_TRUE(first.ok()) << first.status();
  data::SampleGroup g = std::move(first->front());
  const std::vector<int32_t> old_part = {100, 101, 102};
  std::map<int64_t, std::vector<int32_t>> before;
  for (size_t i = 0; i < g.size(); ++i) {
    ASSERT_TRUE(
        g[i].AppendResponse(old_part, std::vector<float>(3, -1.0f), true, "abc", i == 0 ? "0" : "3")
            .ok());
    g[i].status = data::SampleStatus::kAborted;
    g[i].metadata["start_rollout_id"] = 1;
    before[g[i].index] = g[i].tokens;
  }
  const int64_t stale = g[0].index;
  RolloutCoordinator c;
  ASSERT_TRUE(
      c.RestoreState({{"version", 1},
                      {"partial_rollout_buffer",
                       json::array({json::array({SampleToJson(g[0]), SampleToJson(g[1])})})}})
          .ok());
  RolloutOptions o = Options(1, 2, 4);
  o.partial_rollout = true;
  o.regenerate_older_than = 1;
  ASSERT_TRUE(c.Configure(o, &groups, reward_.get()).ok());
  auto r = c.Generate(4);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->groups.size(), 1u);
  EXPECT_EQ(r->metrics["rollout/partial_rollout/regenerated_samples"], 1);
  for (const data::Sample& s : r->groups[0]) {
    const std::vector<int32_t>& old = before.at(s.index);
    const bool continued = std::equal(old.begin(), old.end(), s.tokens.begin());
    ASSERT_EQ(s.weight_versions.size(), s.index == stale ? 1u : 2u) << s.index;
    if (s.index == stale) {
      EXPECT_FALSE(continued) << "the stale sample kept its old tokens";
      EXPECT_NE(s.weight_versions[0], "0");
      EXPECT_FALSE(s.metadata.contains("start_rollout_id"));
      EXPECT_EQ(s.OldestWeightVersion(), std::nullopt);  // only the engine's (named) version
    } else {
      EXPECT_TRUE(continued) << "the sample within the bound was not continued";
      EXPECT_EQ(s.weight_versions[0], "3");
      EXPECT_EQ(s.metadata["start_rollout_id"], 1);
    }
    EXPECT_GT(s.response_length, s.index == stale ? 0 : 3) << s.index;  // generated further
    EXPECT_LE(s.response_length, 8) << s.index;  // max_response_len counts the kept tokens
    EXPECT_TRUE(s.Validate().ok()) << s.Validate();
  }
}

TEST_F(RolloutEngineTest, EvalReportsRewardsAndPassAtK) {
  auto source = Source({{"Eval one", "one"}, {"Eval two", "one"}}, 1);
  RolloutCoordinator c;
  EvalDataset right{"right", {}, 4, {}, "", ""};
  for (const auto& p : dataset_->prompts()) right.prompts.push_back(data::MakeGroup(p, 1, 0, 0)[0]);
  right.sampling.max_response_len = 4;
  EvalDataset wrong = right;
  wrong.name = "wrong";
  wrong.n_samples = 2;
  wrong.rm_type = "exact_match";  // label "one" never equals a random response
  ASSERT_TRUE(c.Configure(Options(1, 1, 4), nullptr, reward_.get(), {right, wrong}).ok());
  auto r = c.Eval(3);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->datasets["right"].size(), 2u);
  EXPECT_EQ(r->datasets["right"][0].size(), 4u);
  EXPECT_EQ(r->datasets["wrong"][1].size(), 2u);
  EXPECT_DOUBLE_EQ(r->metrics["eval/right"], 1.0);
  EXPECT_DOUBLE_EQ(r->metrics["eval/right-pass@1"], 1.0);
  EXPECT_DOUBLE_EQ(r->metrics["eval/right-pass@4"], 1.0);
  EXPECT_DOUBLE_EQ(r->metrics["eval/wrong"], 0.0);
  EXPECT_DOUBLE_EQ(r->metrics["eval/wrong-pass@2"], 0.0);
  EXPECT_EQ(r->metrics.count("eval/wrong-pass@4"), 0u);
  EXPECT_DOUBLE_EQ(r->metrics["eval/right-truncated_ratio"], 1.0);
}

// The recovery side as the job driver plays it, with a real engine: Recover starts a fresh
// engine (weight_version "engine-c2") on a new port, as the runtime head restarts a dead one.
class RestartingRecovery : public EngineRecovery {
 public:
  explicit RestartingRecovery(std::string model_dir, Status fail = absl::OkStatus())
      : model_dir_(std::move(model_dir)), fail_(std::move(fail)) {}
  std::vector<int> ReplacedEngines() override { return {}; }
  StatusOr<RecoveredEngine> Recover(int engine, const Status& cause) override {
    std::lock_guard<std::mutex> lock(mu_);
    recovered_.push_back(engine);
    causes_.push_back(std::string(cause.message()));
    if (!fail_.ok()) return fail_;
    SLIME_ASSIGN_OR_RETURN(
        restarted_, StartTestEngine({.model_dir = model_dir_, .weight_version = "engine-c2"}));
    return RecoveredEngine{restarted_->url(), true, "engine-c2"};
  }
  std::vector<int> recovered() {
    std::lock_guard<std::mutex> lock(mu_);
    return recovered_;
  }
  std::vector<std::string> causes() {
    std::lock_guard<std::mutex> lock(mu_);
    return causes_;
  }
  ~RestartingRecovery() override {
    if (restarted_ != nullptr) restarted_->server->Stop();
  }

 private:
  std::string model_dir_;
  Status fail_;
  std::mutex mu_;
  std::vector<int> recovered_;
  std::vector<std::string> causes_;
  std::unique_ptr<EngineUnderTest> restarted_;
};

// Engine "c" holds its requests (paused), then its server goes away mid-rollout: the groups it
// had (sent and queued) start over on engine a or on the recovered engine, whole.
TEST_F(RolloutEngineTest, AnEngineLostMidRolloutIsRecoveredAndItsGroupsRetried) {
  auto lost = StartTestEngine({.model_dir = model_dir_, .weight_version = "engine-c"});
  ASSERT_TRUE(lost.ok()) << lost.status();
  std::vector<std::pair<std::string, std::string>> rows;
  for (int i = 0; i < 12; ++i) rows.push_back({"Retry prompt " + std::to_string(i), "x"});
  auto source = Source(rows, 2);
  PromptGroupSource groups(source.get());
  RestartingRecovery recovery(model_dir_);
  RolloutCoordinator c;
  c.SetEngineRecovery(&recovery);
  RolloutOptions o = Options(6, 2, 2);
  o.engines.addresses = {engines_[0]->url(), (*lost)->url()};
  ASSERT_TRUE(c.Configure(o, &groups, reward_.get()).ok());
  (*lost)->engine->Pause();
  auto generate = std::async(std::launch::async, [&] { return c.Generate(0); });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while ((*lost)->engine->load().num_waiting < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ((*lost)->engine->load().num_waiting, 2) << "engine c should hold its limit";
  (*lost)->server->Stop();  // its connections close: the calls in flight fail, the rest wait
  auto r = generate.get();
  ASSERT_TRUE(r.ok()) << r.status();

  EXPECT_EQ(recovery.recovered(), std::vector<int>{1});
  ASSERT_EQ(recovery.causes().size(), 1u);
  EXPECT_NE(recovery.causes()[0].find((*lost)->url().substr(7)), std::string::npos)
      << recovery.causes()[0];
  ASSERT_EQ(r->groups.size(), 6u);
  for (const auto& g : r->groups) {
    ASSERT_EQ(g.size(), 2u);
    const std::vector<std::string> version = g.front().weight_versions;
    EXPECT_TRUE(version == std::vector<std::string>{"engine-a"} ||
                version == std::vector<std::string>{"engine-c2"})
        << "a sample of the lost engine was kept";
    for (const auto& s : g) {
      EXPECT_EQ(s.weight_versions, version) << "a retried group must not mix engines";
      EXPECT_EQ(s.metadata["engine"], g.front().metadata["engine"]);
      EXPECT_GE(s.response_length, 1);
      EXPECT_TRUE(s.Validate().ok()) << s.Validate();
    }
  }
  EXPECT_EQ(r->metrics["rollout/samples"], 12);
  EXPECT_EQ(r->metrics["rollout/engine_restarts"], 1);
  EXPECT_GE(r->metrics["rollout/retried_groups"], 1);
  EXPECT_GT(r->metrics["perf/engine_recovery_time"], 0);
  EXPECT_FALSE(c.engine_pool()->engine_down(1));
  EXPECT_NE(c.engine_pool()->address(1).ToString(), (*lost)->url().substr(7));
  // The next rollout uses the recovered engine like any other.
  auto next = c.Generate(1);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->metrics["rollout/engine_restarts"], 0);
  EXPECT_EQ(next->metrics["rollout/retried_groups"], 0);
}

TEST_F(RolloutEngineTest, AFailedRecoveryFailsTheRolloutWithItsError) {
  auto lost = StartTestEngine({.model_dir = model_dir_, .weight_version = "engine-c"});
  ASSERT_TRUE(lost.ok()) << lost.status();
  std::vector<std::pair<std::string, std::string>> rows;
  for (int i = 0; i < 4; ++i) rows.push_back({"Doomed prompt " + std::to_string(i), "x"});
  auto source = Source(rows, 2);
  PromptGroupSource groups(source.get());
  RestartingRecovery recovery(
      model_dir_, absl::FailedPreconditionError("engine-c died and may not be restarted"));
  RolloutCoordinator c;
  c.SetEngineRecovery(&recovery);
  RolloutOptions o = Options(4, 2, 2);
  o.engines.addresses = {engines_[0]->url(), (*lost)->url()};
  ASSERT_TRUE(c.Configure(o, &groups, reward_.get()).ok());
  (*lost)->server->Stop();  // gone before the rollout starts: its calls are refused
  const auto start = std::chrono::steady_clock::now();
  auto r = c.Generate(0);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(r.status())) << r.status();
  EXPECT_NE(r.status().message().find("engine-c died"), std::string::npos) << r.status();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_EQ(recovery.recovered(), std::vector<int>{1});
}

// Routing replay's data path (docs/algorithms.md, "Routing replay"): a tiny random Qwen3-MoE
// engine started with --enable-return-routed-experts, behind its HTTP server; the rollout asks
// for return_routed_experts and every sample ends with one row per token but its last
// (slime's [len(tokens) − 1, layers, top_k]), equal to the routing a full forward of the
// sample's tokens makes.
TEST_F(RolloutEngineTest, SamplesCarryTheMoeEnginesRoutedExperts) {
  const std::string tok = SourceDir() + "/.cache/testdata/qwen3";
  const std::string dir = model_dir_ + "-moe";
  testing::RemoveTree(dir);
  Status init = model::InitRandomModel(
      SourceDir() + "/tests/data/model/configs/qwen3-moe-tiny.json", tok, dir, 3, "fp32");
  ASSERT_TRUE(init.ok()) << init;
  auto moe = StartTestEngine({.model_dir = dir, .enable_return_routed_experts = true});
  ASSERT_TRUE(moe.ok()) << moe.status();
  auto source = Source({{"Route me", "x"}, {"And route me too, a longer prompt here", "x"}}, 2);
  PromptGroupSource groups(source.get());
  RolloutCoordinator c;
  RolloutOptions o = Options(2, 2, 4);
  o.engines.addresses = {(*moe)->url()};
  o.sampling.return_routed_experts = true;
  ASSERT_TRUE(c.Configure(o, &groups, reward_.get()).ok());
  auto r = c.Generate(0);
  (*moe)->server->Stop();
  ASSERT_TRUE(r.ok()) << r.status();

  auto loaded = model::DecoderModel::Load(dir, torch::kFloat32, torch::kCPU);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  model::DecoderModel& ref = **loaded;
  const int64_t layers = ref.config().num_hidden_layers;
  const int64_t k = ref.config().moe.num_experts_per_tok;
  ref.set_capture_routed_experts(true);
  int checked = 0;
  for (const auto& g : r->groups) {
    for (const data::Sample& s : g) {
      const int64_t rows = static_cast<int64_t>(s.tokens.size()) - 1;
      ASSERT_EQ(s.routed_experts_per_token, layers * k) << "sample " << s.index;
      ASSERT_EQ(s.RoutedRows(), rows) << "sample " << s.index;
      EXPECT_TRUE(s.Validate().ok());
      std::vector<int64_t> ids(s.tokens.begin(), s.tokens.end());
      auto hidden = ref.ForwardPacked(torch::tensor(ids, torch::kLong), {0, rows + 1});
      ASSERT_TRUE(hidden.ok()) << hidden.status();
      std::vector<torch::Tensor> per_layer;
      for (const torch::Tensor& t : ref.routed_experts()) per_layer.push_back(t.narrow(0, 0, rows));
      const torch::Tensor want = torch::stack(per_layer, 1).to(torch::kInt);  // [rows, layers, k]
      const torch::Tensor got =
          torch::tensor(s.rollout_routed_experts, torch::kInt).reshape({rows, layers, k});
      EXPECT_TRUE(torch::equal(got, want)) << "sample " << s.index;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 4);
  testing::RemoveTree(dir);
}

}  // namespace
}  // namespace slime::rollout
