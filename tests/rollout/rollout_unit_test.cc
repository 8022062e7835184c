// Rollout pieces without an inference engine: pass@k and metrics, engine addresses, checkpoint
// state, and engines that are down, hang or refuse requests (real HTTP: a closed port, and a real
// http::Server that never answers).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <mutex>
#include <thread>

#include "slime/http/server.h"
#include "slime/reward/reward.h"
#include "slime/rollout/coordinator.h"
#include "slime/rollout/engine_pool.h"
#include "slime/rollout/metrics.h"

namespace slime::rollout {
namespace {

TEST(RolloutMetricsTest, PassAtKMatchesTheClosedForm) {
  EXPECT_DOUBLE_EQ(PassAtK(4, 1, 1), 0.25);
  EXPECT_DOUBLE_EQ(PassAtK(4, 1, 2), 0.5);  // 1 - C(3,2)/C(4,2) = 1 - 3/6
  EXPECT_DOUBLE_EQ(PassAtK(4, 0, 4), 0.0);
  EXPECT_DOUBLE_EQ(PassAtK(4, 2, 4), 1.0);
  EXPECT_NEAR(PassAtK(8, 2, 4), 1 - 15.0 / 70.0, 1e-12);  // 1 - C(6,4)/C(8,4)
}

data::Sample Done(int64_t index, double reward, int64_t len, data::SampleStatus status) {
  data::Sample s;
  s.index = index;
  s.group_index = index / 2;
  s.tokens = {1, 2};
  for (int64_t i = 0; i < len; ++i) s.tokens.push_back(7);
  s.response_length = len;
  s.loss_mask.assign(static_cast<size_t>(len), 1);
  s.reward = reward;
  s.status = status;
  return s;
}

TEST(RolloutMetricsTest, SlimeNamesAndValues) {
  using S = data::SampleStatus;
  std::vector<data::SampleGroup> groups = {
      {Done(0, 1, 4, S::kCompleted), Done(1, 0, 8, S::kTruncated)},
      {Done(2, 1, 2, S::kCompleted), Done(3, 1, 6, S::kCompleted)},
  };
  groups[1][1].loss_mask[0] = 0;  // effective length 5
  MetricMap m = RolloutSampleMetrics(groups, {0.5, -0.5, 0, 0}, true, true);
  EXPECT_DOUBLE_EQ(m["rollout/raw_reward"], 0.75);
  EXPECT_DOUBLE_EQ(m["rollout/rewards"], 0);
  EXPECT_DOUBLE_EQ(m["rollout/response_len/mean"], (4 + 8 + 2 + 5) / 4.0);
  EXPECT_DOUBLE_EQ(m["rollout/response_len/median"], 4.5);
  EXPECT_DOUBLE_EQ(m["rollout/response_len/max"], 8);
  EXPECT_DOUBLE_EQ(m["rollout/response_len/min"], 2);
  EXPECT_DOUBLE_EQ(m["rollout/truncated_ratio"], 0.25);
  EXPECT_DOUBLE_EQ(m["rollout/zero_std/count_1.0"], 1);
  EXPECT_EQ(m.count("rollout/zero_std/count_0.0"), 0u);
  EXPECT_DOUBLE_EQ(m["passrate/pass@1"], (0.5 + 1.0) / 2);
  EXPECT_DOUBLE_EQ(m["passrate/pass@2"], 1.0);
  MetricMap e = EvalMetrics("gsm", groups);
  EXPECT_DOUBLE_EQ(e["eval/gsm"], 0.75);
  EXPECT_DOUBLE_EQ(e["eval/gsm-truncated_ratio"], 0.25);
  EXPECT_DOUBLE_EQ(e["eval/gsm-pass@2"], 1.0);
  EXPECT_EQ(PyFloatString(-1), "-1.0");
  EXPECT_EQ(PyFloatString(0.25), "0.25");
}

TEST(RolloutMetricsTest, LoggedFamiliesAreOffByDefault) {
  using S = data::SampleStatus;
  std::vector<data::SampleGroup> groups = {{Done(0, 1, 4, S::kCompleted)}};
  EXPECT_TRUE(LoggedSampleMetrics(groups, {}).empty());
  LoggedMetricOptions all{true, true, "kind", 8};
  EXPECT_TRUE(LoggedSampleMetrics({}, all).empty());
}

TEST(RolloutMetricsTest, MultiTurnLengthsAndRounds) {
  using S = data::SampleStatus;
  // Sample 0: 8 tokens, model / tool / model turns (mask 1 1 0 0 0 1 1 1): 5 model tokens,
  // 2 rounds. Sample 1: 3 model tokens, metadata.round_number 4. Sample 2: 1 model token.
  std::vector<data::SampleGroup> groups = {
      {Done(0, 1, 8, S::kTruncated), Done(1, 0, 3, S::kCompleted)}, {Done(2, 0, 1, S::kCompleted)}};
  groups[0][0].loss_mask = {1, 1, 0, 0, 0, 1, 1, 1};
  groups[0][1].metadata["round_number"] = 4;
  LoggedMetricOptions o;
  o.multi_turn = true;
  o.max_response_len = 8;
  MetricMap m = LoggedSampleMetrics(groups, o);
  EXPECT_DOUBLE_EQ(m["multi_turn/raw_response_length/response_length_mean"], 4.0);
  EXPECT_DOUBLE_EQ(m["multi_turn/raw_response_length/response_length_max"], 8);
  EXPECT_DOUBLE_EQ(m["multi_turn/raw_response_length/response_length_min"], 1);
  EXPECT_DOUBLE_EQ(m["multi_turn/raw_response_length/response_length_clip_ratio"], 1.0 / 3);
  EXPECT_DOUBLE_EQ(m["multi_turn/wo_obs_response_length/response_length_mean"], 3.0);
  EXPECT_DOUBLE_EQ(m["multi_turn/wo_obs_response_length/response_length_max"], 5);
  EXPECT_DOUBLE_EQ(m["multi_turn/wo_obs_response_length/response_length_min"], 1);
  EXPECT_DOUBLE_EQ(m["multi_turn/multi_turn_metric/round_number_mean"], (2 + 4 + 1) / 3.0);
  EXPECT_DOUBLE_EQ(m["multi_turn/multi_turn_metric/round_number_max"], 4);
  EXPECT_DOUBLE_EQ(m["multi_turn/multi_turn_metric/round_number_min"], 1);
  EXPECT_EQ(m.count("rollout/correct_length/p25"), 0u);
}

TEST(RolloutMetricsTest, CorrectSampleLengthQuarters) {
  using S = data::SampleStatus;
  // max_response_len 8: quarters (0,2], (2,4], (4,6], (6,8]. Correct lengths 2, 3, 8, 8; the
  // wrong sample (length 1) does not count.
  std::vector<data::SampleGroup> groups = {
      {Done(0, 1, 2, S::kCompleted), Done(1, 1, 3, S::kCompleted)},
      {Done(2, 1, 8, S::kTruncated), Done(3, 1, 8, S::kTruncated), Done(4, 0, 1, S::kCompleted)}};
  LoggedMetricOptions o;
  o.correct_samples = true;
  o.max_response_len = 8;
  MetricMap m = LoggedSampleMetrics(groups, o);
  EXPECT_DOUBLE_EQ(m["rollout/correct_length/p25"], 0.25);
  EXPECT_DOUBLE_EQ(m["rollout/correct_length/p50"], 0.25);
  EXPECT_DOUBLE_EQ(m["rollout/correct_length/p75"], 0.0);
  EXPECT_DOUBLE_EQ(m["rollout/correct_length/p100"], 0.5);
  // No correct sample: zeros.
  MetricMap none = LoggedSampleMetrics({{Done(0, 0, 2, S::kCompleted)}}, o);
  EXPECT_DOUBLE_EQ(none["rollout/correct_length/p25"], 0.0);
  EXPECT_DOUBLE_EQ(none["rollout/correct_length/p100"], 0.0);
}

TEST(RolloutMetricsTest, RewardCategoriesFromTheRewardMappingOrMetadata) {
  using S = data::SampleStatus;
  std::vector<data::SampleGroup> groups = {
      {Done(0, 1, 2, S::kCompleted), Done(1, 0, 2, S::kCompleted)},
      {Done(2, 0, 2, S::kCompleted), Done(3, 0.5, 2, S::kCompleted)}};
  groups[0][0].raw_reward = {{"score", 1}, {"kind", "ok"}};
  groups[0][1].raw_reward = {{"score", 0}, {"kind", "format_error"}};
  groups[1][0].raw_reward = 0.0;  // a scalar reward: the sample's metadata decides
  groups[1][0].metadata["kind"] = "format_error";
  groups[1][1].raw_reward = {{"score", 0.5}};  // neither: "unknown"
  LoggedMetricOptions o;
  o.reward_category = "kind";
  MetricMap m = LoggedSampleMetrics(groups, o);
  EXPECT_DOUBLE_EQ(m["rollout/error_cat/ok"], 0.25);
  EXPECT_DOUBLE_EQ(m["rollout/error_cat/format_error"], 0.5);
  EXPECT_DOUBLE_EQ(m["rollout/error_cat/unknown"], 0.25);
  EXPECT_DOUBLE_EQ(m["rollout/reward_cat/ok/raw_reward"], 1.0);
  EXPECT_DOUBLE_EQ(m["rollout/reward_cat/format_error/raw_reward"], 0.0);
  EXPECT_DOUBLE_EQ(m["rollout/reward_cat/unknown/raw_reward"], 0.5);
  groups[0][0].raw_reward = {{"kind", 3}};  // a non-string category is dumped
  EXPECT_DOUBLE_EQ(LoggedSampleMetrics(groups, o)["rollout/error_cat/3"], 0.25);
}

TEST(EngineAddressTest, ParsesUrlsAndNamesBadOnes) {
  auto a = ParseEngineAddress("http://10.0.0.2:30000/");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "10.0.0.2");
  EXPECT_EQ(a->port, 30000);
  EXPECT_EQ(ParseEngineAddress("localhost:8")->ToString(), "localhost:8");
  for (const char* bad : {"localhost", "http://h:0", "h:99999", "https://h:1", "h:1/x", ":5"}) {
    auto r = ParseEngineAddress(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find(bad), std::string::npos) << r.status();
  }
}

TEST(RolloutStateTest, SampleJsonRoundTripAndBadState) {
  data::Sample s = Done(5, 0.5, 3, data::SampleStatus::kAborted);
  s.rollout_log_probs = {-0.5f, -1.0f, -2.0f};
  s.metadata["start_rollout_id"] = 3;
  s.weight_versions = {"7"};
  s.weight_version_tokens = {3};
  s.prompt = "hi";
  auto back = SampleFromJson(SampleToJson(s));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->tokens, s.tokens);
  EXPECT_EQ(back->weight_version_tokens, s.weight_version_tokens);
  nlohmann::json older = SampleToJson(s);  // a checkpoint written before the counts existed
  older.erase("weight_version_tokens");
  ASSERT_TRUE(SampleFromJson(older).ok());
  EXPECT_TRUE(SampleFromJson(older)->weight_version_tokens.empty());
  EXPECT_EQ(back->rollout_log_probs, s.rollout_log_probs);
  EXPECT_EQ(back->status, data::SampleStatus::kAborted);
  EXPECT_EQ(back->metadata["start_rollout_id"], 3);
  nlohmann::json j = SampleToJson(s);
  j.erase("tokens");
  EXPECT_NE(SampleFromJson(j).status().message().find("tokens"), std::string::npos);

  RolloutCoordinator c;
  EXPECT_FALSE(c.RestoreState({{"version", 2}}).ok());
  nlohmann::json group = nlohmann::json::array({SampleToJson(s), j});
  nlohmann::json state = nlohmann::json::object();
  state["version"] = 1;
  state["partial_rollout_buffer"] = nlohmann::json::array({group});
  Status st = c.RestoreState(state);
  EXPECT_NE(st.message().find("partial_rollout_buffer[0][1]"), std::string::npos) << st;
  state["partial_rollout_buffer"][0][1] = SampleToJson(s);
  ASSERT_TRUE(c.RestoreState(state).ok());
  EXPECT_EQ(c.partial_rollout_buffer().size(), 1u);
  EXPECT_EQ(c.State(), state);
}

// A source with a fixed list of single-sample groups.
class ListSource : public GroupSource {
 public:
  StatusOr<std::vector<data::SampleGroup>> GetSamples(int64_t k) override {
    std::vector<data::SampleGroup> out;
    for (int64_t i = 0; i < k; ++i) {
      data::Sample s;
      s.index = next_;
      s.group_index = next_++;
      s.tokens = {1, 2, 3};
      s.prompt_text = "p";
      out.push_back({s});
    }
    return out;
  }

 private:
  int64_t next_ = 0;
};

class BrokenEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    reward::RewardOptions ro;
    ro.rm_type = "exact_match";
    auto rm = reward::RewardModel::Create(ro);
    ASSERT_TRUE(rm.ok()) << rm.status();
    reward_ = std::move(*rm);
  }
  RolloutOptions Options(std::string address) {
    RolloutOptions o;
    o.engines.addresses = {std::move(address)};
    o.engines.max_attempts = 3;
    o.engines.retry_interval = std::chrono::milliseconds(20);
    o.engines.request_timeout = std::chrono::milliseconds(500);
    o.engines.control_timeout = std::chrono::milliseconds(500);
    o.abort_timeout = std::chrono::seconds(5);
    o.sampling.max_response_len = 4;
    return o;
  }
  ListSource source_;
  std::unique_ptr<reward::RewardModel> reward_;
};

TEST_F(BrokenEngineTest, AnEngineThatIsDownFailsTheRolloutNamingIt) {
  // A port that was free a moment ago: nothing listens there.
  int port = 0;
  {
    http::Router router;
    auto s = http::Server::Start({}, std::move(router));
    ASSERT_TRUE(s.ok());
    port = (*s)->port();
  }
  RolloutCoordinator c;
  ASSERT_TRUE(
      c.Configure(Options("http://127.0.0.1:" + std::to_string(port)), &source_, reward_.get())
          .ok());
  const auto start = std::chrono::steady_clock::now();
  auto r = c.Generate(0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_NE(r.status().message().find("127.0.0.1:" + std::to_string(port)), std::string::npos)
      << r.status();
  EXPECT_NE(r.status().message().find("3 attempt"), std::string::npos) << r.status();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

TEST_F(BrokenEngineTest, CancelEndsAGenerateThatWouldRetryForAMinute) {
  int port = 0;
  {
    http::Router router;
    auto s = http::Server::Start({}, std::move(router));
    ASSERT_TRUE(s.ok());
    port = (*s)->port();
  }
  RolloutOptions o = Options("http://127.0.0.1:" + std::to_string(port));
  o.engines.max_attempts = 60;  // slime's: a minute of retries against a dead engine
  o.engines.retry_interval = std::chrono::seconds(1);
  RolloutCoordinator c;
  ASSERT_TRUE(c.Configure(o, &source_, reward_.get()).ok());
  std::thread canceller([&c] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    c.Cancel();  // what the driver does on SIGTERM
  });
  const auto start = std::chrono::steady_clock::now();
  auto r = c.Generate(0);
  canceller.join();
  ASSERT_FALSE(r.ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5)) << r.status();
}

TEST_F(BrokenEngineTest, HangingAndRefusingEnginesGiveClearErrors) {
  std::mutex mu;
  std::vector<std::shared_ptr<http::ResponseWriter>> parked;  // never answered
  int aborts = 0;
  bool refuse = false;
  http::Router router;
  router.Add(
      "POST", "/generate", [&](const http::Request&, std::shared_ptr<http::ResponseWriter> w) {
        std::lock_guard<std::mutex> lock(mu);
        if (refuse) {
          w->SendJson(400,
                      {{"error", {{"message", "input_ids[0] = 999999 is not a valid token id"}}}});
        } else {
          parked.push_back(std::move(w));
        }
      });
  router.Add("POST", "/abort_request",
             [&](const http::Request&, std::shared_ptr<http::ResponseWriter> w) {
               std::lock_guard<std::mutex> lock(mu);
               ++aborts;
               w->Send(200, "");
             });
  auto server = http::Server::Start({}, std::move(router));
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string addr = "127.0.0.1:" + std::to_string((*server)->port());

  RolloutCoordinator c;
  ASSERT_TRUE(c.Configure(Options(addr), &source_, reward_.get()).ok());
  auto r = c.Generate(0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  EXPECT_NE(r.status().message().find(addr), std::string::npos) << r.status();
  {
    std::lock_guard<std::mutex> lock(mu);
    refuse = true;
  }
  r = c.Generate(1);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find("not a valid token id"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find(addr), std::string::npos) << r.status();
  (*server)->Stop();
}

TEST(RolloutConfigureTest, BadOptionsAreRefused) {
  auto rm = reward::RewardModel::Create(reward::RewardOptions{.rm_type = "exact_match"});
  ASSERT_TRUE(rm.ok());
  RolloutCoordinator c;
  RolloutOptions o;
  EXPECT_NE(c.Configure(o, nullptr, rm->get()).message().find("no engines"), std::string::npos);
  o.engines.addresses = {"127.0.0.1:1"};
  o.rollout_batch_size = 4;
  o.over_sampling_batch_size = 2;
  EXPECT_NE(c.Configure(o, nullptr, rm->get()).message().find("over_sampling_batch_size"),
            std::string::npos);
  o.over_sampling_batch_size = 0;
  o.reward_postprocess.advantage_estimator = "nope";
  EXPECT_NE(c.Configure(o, nullptr, rm->get()).message().find("nope"), std::string::npos);
  auto r = c.Generate(0);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace slime::rollout
