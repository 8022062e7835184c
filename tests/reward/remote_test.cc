// remote_rm against a real in-process HTTP server: answers, mappings, slow answers past the
// timeout, 500s with retries, 400 without, refused connections, and the error policy.
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "gtest/gtest.h"
#include "slime/http/server.h"
#include "slime/reward/reward.h"

namespace slime::reward {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A reward server: /score answers {"score": 1|0, "echo": <request>} (1 when the response
// contains the label), /number answers 0.75, /slow never answers by itself, /flaky answers 500
// twice then 1.0, /error always 500, /bad 400, /text a non-JSON body.
class RewardServer {
 public:
  RewardServer() {
    http::Router router;
    router.Add("POST", "/score", [this](const http::Request& r, auto w) {
      ++score_calls;
      auto body = nlohmann::json::parse(r.body);
      bool hit = body["response"].get<std::string>().find(body["label"].get<std::string>()) !=
                 std::string::npos;
      w->SendJson(200, {{"score", hit ? 1 : 0}, {"echo", body}});
    });
    router.Add("POST", "/number", [](const http::Request&, auto w) { w->Send(200, "0.75"); });
    router.Add("POST", "/slow", [this](const http::Request&, auto w) {
      ++slow_calls;
      std::lock_guard<std::mutex> lock(mu_);
      parked_.push_back(w);  // answered never; dropped at Stop
    });
    router.Add("POST", "/flaky", [this](const http::Request&, auto w) {
      if (flaky_calls++ < 2) {
        w->SendJson(500, {{"error", {{"message", "warming up"}}}});
      } else {
        w->Send(200, "1.0");
      }
    });
    router.Add("POST", "/error", [this](const http::Request&, auto w) {
      ++error_calls;
      w->SendJson(500, {{"error", {{"message", "model crashed"}}}});
    });
    router.Add("POST", "/bad", [this](const http::Request&, auto w) {
      ++bad_calls;
      w->SendJson(400, {{"error", {{"message", "missing field"}}}});
    });
    router.Add("POST", "/text", [](const http::Request&, auto w) {
      w->Send(200, "<html>oops</html>", "text/html");
    });
    auto server = http::Server::Start({}, std::move(router));
    EXPECT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }
  ~RewardServer() { server_->Stop(); }

  std::string Url(const std::string& path) const {
    return "http://127.0.0.1:" + std::to_string(server_->port()) + path;
  }
  http::Server& server() { return *server_; }

  std::atomic<int> score_calls{0}, slow_calls{0}, flaky_calls{0}, error_calls{0}, bad_calls{0};

 private:
  std::unique_ptr<http::Server> server_;
  std::mutex mu_;
  std::vector<std::shared_ptr<http::ResponseWriter>> parked_;
};

RemoteOptions Fast(const std::string& url) {
  return {.url = url,
          .timeout = 300ms,
          .max_attempts = 3,
          .backoff_initial = 10ms,
          .backoff_max = 40ms};
}

TEST(RemoteRewardTest, NumberAndMappingAnswers) {
  RewardServer server;
  auto number = MakeRemoteRewardFn(Fast(server.Url("/number")));
  ASSERT_TRUE(number.ok()) << number.status();
  RewardSample sample{.prompt = "What is 6 * 7?", .response = "6 * 7 = 42", .label = "42"};
  auto v = (*number)->Score(sample);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->reward, 0.75);

  // Through the model: the mapping is read with reward_key, the payload is slime's.
  auto model = RewardModel::Create(
      {.rm_type = "remote_rm", .reward_key = "score", .remote = Fast(server.Url("/score"))});
  ASSERT_TRUE(model.ok()) << model.status();
  auto result = (*model)->Score(sample);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->reward, 1.0);
  EXPECT_EQ(
      result->fields["echo"],
      (nlohmann::json{{"prompt", "What is 6 * 7?"}, {"response", "6 * 7 = 42"}, {"label", "42"}}));
  // A mapping without reward_key is an error that lists the fields.
  auto no_key = RewardModel::Create({.rm_type = "remote_rm", .remote = Fast(server.Url("/score"))});
  auto error = (*no_key)->Score(sample);
  ASSERT_FALSE(error.ok());
  EXPECT_NE(std::string(error.status().message()).find("reward_key"), std::string::npos);
}

TEST(RemoteRewardTest, SlowServerTimesOutAfterTheAttempts) {
  RewardServer server;
  auto fn = MakeRemoteRewardFn(Fast(server.Url("/slow")));
  ASSERT_TRUE(fn.ok());
  auto start = Clock::now();
  auto v = (*fn)->Score({.response = "x", .label = "y"});
  auto took = Clock::now() - start;
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kDeadlineExceeded) << v.status();
  EXPECT_NE(std::string(v.status().message()).find(server.Url("/slow")), std::string::npos);
  EXPECT_EQ(server.slow_calls.load(), 3);
  // 3 x 300 ms plus two short backoffs; far from a hang.
  EXPECT_GE(took, 900ms);
  EXPECT_LT(took, 5s);
}

TEST(RemoteRewardTest, RetriesServerErrorsButNotBadRequests) {
  RewardServer server;
  auto flaky = MakeRemoteRewardFn(Fast(server.Url("/flaky")));
  auto v = (*flaky)->Score({.response = "x"});
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->reward, 1.0);
  EXPECT_EQ(server.flaky_calls.load(), 3);

  auto always = MakeRemoteRewardFn(Fast(server.Url("/error")));
  auto e = (*always)->Score({.response = "x"});
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(std::string(e.status().message()).find("HTTP 500"), std::string::npos);
  EXPECT_NE(std::string(e.status().message()).find("model crashed"), std::string::npos);
  EXPECT_EQ(server.error_calls.load(), 3);

  auto bad = MakeRemoteRewardFn(Fast(server.Url("/bad")));
  auto b = (*bad)->Score({.response = "x"});
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument) << b.status();
  EXPECT_EQ(server.bad_calls.load(), 1);

  auto text = MakeRemoteRewardFn(Fast(server.Url("/text")));
  auto t = (*text)->Score({.response = "x"});
  ASSERT_FALSE(t.ok());
  EXPECT_NE(std::string(t.status().message()).find("not JSON"), std::string::npos);
}

TEST(RemoteRewardTest, RefusedConnectionAndErrorPolicy) {
  int port;
  {
    RewardServer gone;
    port = gone.server().port();
  }
  std::string url = "http://127.0.0.1:" + std::to_string(port) + "/score";
  auto fn = MakeRemoteRewardFn(Fast(url));
  auto v = (*fn)->Score({.response = "x"});
  EXPECT_EQ(v.status().code(), absl::StatusCode::kUnavailable) << v.status();

  // on_error = value: a timeout gives the configured reward and the error text.
  RewardServer server;
  auto model = RewardModel::Create({.rm_type = "remote_rm",
                                    .remote = Fast(server.Url("/slow")),
                                    .on_error = OnError::kValue,
                                    .error_reward = -1});
  ASSERT_TRUE(model.ok());
  auto result = (*model)->Score({.response = "x"});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->reward, -1);
  EXPECT_NE(result->error.find("remote_rm"), std::string::npos) << result->error;
}

TEST(RemoteRewardTest, BatchRunsConcurrently) {
  RewardServer server;
  auto model = RewardModel::Create({.rm_type = "remote_rm",
                                    .reward_key = "score",
                                    .remote = Fast(server.Url("/score")),
                                    .num_workers = 8});
  ASSERT_TRUE(model.ok());
  std::vector<std::string> responses;
  for (int i = 0; i < 64; ++i) responses.push_back("the result is " + std::to_string(i));
  std::vector<RewardSample> samples;
  for (int i = 0; i < 64; ++i) {
    samples.push_back({.response = responses[i], .label = i % 2 == 0 ? "result" : "nothing"});
  }
  auto results = (*model)->ScoreBatch(samples);
  ASSERT_TRUE(results.ok()) << results.status();
  for (int i = 0; i < 64; ++i) EXPECT_EQ((*results)[i].reward, i % 2 == 0 ? 1.0 : 0.0);
  EXPECT_EQ(server.score_calls.load(), 64);
}

}  // namespace
}  // namespace slime::reward
