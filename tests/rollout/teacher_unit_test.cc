// The OPD teacher client (rollout/teacher.h) against real HTTP servers that play a teacher: the
// request it sends (SGLang's prefill-only scoring), the answer shapes it accepts (SGLang's null
// at the first returned position, and a server that fills it), and its errors — an unreachable
// teacher, a wrong number of log-probs, log-probs of other tokens, null or positive values, HTTP
// errors with and without retries, bad URLs — each naming the sample and the URL. Also the
// Sample field that carries the result (validation, JSON round trip, cleared on append).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>

#include "nlohmann/json.hpp"
#include "slime/http/server.h"
#include "slime/rollout/coordinator.h"
#include "slime/rollout/teacher.h"

namespace slime::rollout {
namespace {

using json = nlohmann::json;

// Prompt {11, 12, 13}, response {21, 22} (sample index 7, completed).
data::Sample TwoTokenSample() {
  data::Sample s;
  s.index = 7;
  s.group_index = 3;
  s.tokens = {11, 12, 13, 21, 22};
  s.response_length = 2;
  s.loss_mask = {1, 1};
  s.status = data::SampleStatus::kCompleted;
  return s;
}

// A fake teacher: `answer` builds the reply to each /generate body; requests are recorded.
class FakeTeacher {
 public:
  using Answer = std::function<std::pair<int, json>(const json& request)>;
  explicit FakeTeacher(Answer answer, const std::string& path = "/generate")
      : answer_(std::move(answer)) {
    http::Router router;
    router.Add("POST", path,
               [this](const http::Request& req, std::shared_ptr<http::ResponseWriter> w) {
                 json body = json::parse(req.body);
                 std::pair<int, json> a;
                 {
                   std::lock_guard<std::mutex> lock(mu_);
                   requests_.push_back(body);
                   a = answer_(body);
                 }
                 w->SendJson(a.first, a.second);
               });
    auto s = http::Server::Start({}, std::move(router));
    EXPECT_TRUE(s.ok()) << s.status();
    if (s.ok()) server_ = std::move(*s);
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(server_->port()); }
  std::vector<json> requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }

 private:
  Answer answer_;
  std::mutex mu_;
  std::vector<json> requests_;
  std::unique_ptr<http::Server> server_;
};

// SGLang's answer for input_ids from logprob_start_len: [null, lp, lp, ...] with the token ids,
// where the log-prob of position q is -(q / 10) (first_null: SGLang's null at the first one).
json Scoring(const json& request, bool first_null) {
  const std::vector<int> ids = request.at("input_ids").get<std::vector<int>>();
  const int start = request.at("logprob_start_len").get<int>();
  json lps = json::array();
  for (int q = start; q < static_cast<int>(ids.size()); ++q) {
    json v = (q == start && first_null) || q == 0 ? json(nullptr) : json(-q / 10.0);
    lps.push_back({v, ids[q], nullptr});
  }
  return {{"text", ""},
          {"output_ids", json::array()},
          {"meta_info",
           {{"finish_reason", {{"type", "length"}, {"length", 0}}},
            {"prompt_tokens", ids.size()},
            {"input_token_logprobs", lps},
            {"output_token_logprobs", json::array()}}}};
}

TeacherOptions Fast(const std::string& url) {
  TeacherOptions o;
  o.url = url;
  o.temperature = 0.7;
  o.timeout = std::chrono::seconds(5);
  o.max_attempts = 3;
  o.backoff_initial = std::chrono::milliseconds(1);
  o.backoff_max = std::chrono::milliseconds(5);
  return o;
}

TEST(TeacherClientTest, SendsPrefillOnlyScoringAndReadsTheResponsePositions) {
  for (bool first_null : {true, false}) {  // SGLang's shape, and a server that fills it
    FakeTeacher teacher([&](const json& r) { return std::make_pair(200, Scoring(r, first_null)); });
    auto client = TeacherClient::Create(Fast(teacher.url()));
    ASSERT_TRUE(client.ok()) << client.status();
    auto lps = (*client)->ResponseLogProbs(TwoTokenSample());
    ASSERT_TRUE(lps.ok()) << lps.status();
    EXPECT_EQ(*lps, (std::vector<float>{-0.3f, -0.4f}));  // positions 3 and 4
    ASSERT_EQ(teacher.requests().size(), 1u);
    const json req = teacher.requests()[0];
    EXPECT_EQ(req.at("input_ids"), json({11, 12, 13, 21, 22}));
    EXPECT_EQ(req.at("return_logprob"), true);
    EXPECT_EQ(req.at("logprob_start_len"), 2);  // one before the response: SGLang nulls it
    EXPECT_EQ(req.at("sampling_params").at("max_new_tokens"), 0);
    EXPECT_DOUBLE_EQ(req.at("sampling_params").at("temperature").get<double>(), 0.7);
    EXPECT_EQ(req.at("sampling_params").at("skip_special_tokens"), false);
  }
}

TEST(TeacherClientTest, AnExplicitPathIsUsedAndARootPathMeansGenerate) {
  FakeTeacher at_path([](const json& r) { return std::make_pair(200, Scoring(r, true)); },
                      "/teacher/generate");
  auto client = TeacherClient::Create(Fast(at_path.url() + "/teacher/generate"));
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE((*client)->ResponseLogProbs(TwoTokenSample()).ok());
  FakeTeacher root([](const json& r) { return std::make_pair(200, Scoring(r, true)); });
  client = TeacherClient::Create(Fast(root.url() + "/"));
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE((*client)->ResponseLogProbs(TwoTokenSample()).ok());
  EXPECT_EQ(root.requests().size(), 1u);
}

TEST(TeacherClientTest, ScoreGroupFillsGeneratedSamplesOnly) {
  FakeTeacher teacher([](const json& r) { return std::make_pair(200, Scoring(r, true)); });
  auto client = TeacherClient::Create(Fast(teacher.url()));
  ASSERT_TRUE(client.ok()) << client.status();
  data::SampleGroup group(4, TwoTokenSample());
  group[1].status = data::SampleStatus::kTruncated;
  group[2].status = data::SampleStatus::kAborted;
  group[3].teacher_log_probs = {-1.0f, -2.0f};  // already scored: kept, no request
  ASSERT_TRUE((*client)->ScoreGroup(&group).ok());
  EXPECT_EQ(group[0].teacher_log_probs, (std::vector<float>{-0.3f, -0.4f}));
  EXPECT_EQ(group[1].teacher_log_probs, (std::vector<float>{-0.3f, -0.4f}));
  EXPECT_TRUE(group[2].teacher_log_probs.empty());
  EXPECT_EQ(group[3].teacher_log_probs, (std::vector<float>{-1.0f, -2.0f}));
  EXPECT_EQ(teacher.requests().size(), 2u);
  // An empty response needs no request.
  data::Sample empty = TwoTokenSample();
  empty.tokens.resize(3);
  empty.response_length = 0;
  empty.loss_mask.clear();
  auto none = (*client)->ResponseLogProbs(empty);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());
  EXPECT_EQ(teacher.requests().size(), 2u);
}

// The error names the URL and the sample, and contains `what`.
void ExpectNamed(const Status& s, const std::string& url, const std::string& what) {
  EXPECT_NE(s.message().find("OPD teacher " + url), std::string::npos) << s;
  EXPECT_NE(s.message().find("sample 7"), std::string::npos) << s;
  EXPECT_NE(s.message().find(what), std::string::npos) << s;
}

TEST(TeacherClientTest, AnUnreachableTeacherFailsAfterItsAttempts) {
  int port = 0;
  {
    auto s = http::Server::Start({}, http::Router());
    ASSERT_TRUE(s.ok());
    port = (*s)->port();  // free again once the server is gone
  }
  const std::string url = "http://127.0.0.1:" + std::to_string(port);
  auto client = TeacherClient::Create(Fast(url));
  ASSERT_TRUE(client.ok()) << client.status();
  auto r = (*client)->ResponseLogProbs(TwoTokenSample());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  ExpectNamed(r.status(), url, "after 3 attempts");
}

TEST(TeacherClientTest, WrongAnswersFailNamingTheSampleAndUrl) {
  struct Case {
    std::string name;
    std::function<json(const json&)> answer;
    std::string what;
  };
  const std::vector<Case> cases = {
      {"too few log-probs",
       [](const json& r) {
         json a = Scoring(r, true);
         a["meta_info"]["input_token_logprobs"] = json::array({json::array({-0.5, 22, nullptr})});
         return a;
       },
       "expected log-probs for its 2 response tokens, the teacher returned 1"},
      {"no input log-probs",
       [](const json& r) {
         json a = Scoring(r, true);
         a["meta_info"].erase("input_token_logprobs");
         return a;
       },
       "no meta_info.input_token_logprobs"},
      {"other tokens",
       [](const json& r) {
         json a = Scoring(r, true);
         a["meta_info"]["input_token_logprobs"].back()[1] = 99;
         return a;
       },
       "scored token id 99, the response has 22"},
      {"a null log-prob",
       [](const json& r) {
         json a = Scoring(r, true);
         a["meta_info"]["input_token_logprobs"].back()[0] = nullptr;
         return a;
       },
       "response token 1 (id 22)"},
      {"a positive log-prob",
       [](const json& r) {
         json a = Scoring(r, true);
         a["meta_info"]["input_token_logprobs"].back()[0] = 0.5;
         return a;
       },
       "is not a finite value <= 0"},
      {"not an object", [](const json&) { return json::array(); },
       "no meta_info.input_token_logprobs"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    FakeTeacher teacher([&](const json& r) { return std::make_pair(200, c.answer(r)); });
    auto client = TeacherClient::Create(Fast(teacher.url()));
    ASSERT_TRUE(client.ok()) << client.status();
    auto r = (*client)->ResponseLogProbs(TwoTokenSample());
    ASSERT_FALSE(r.ok());
    ExpectNamed(r.status(), teacher.url(), c.what);
    EXPECT_EQ(teacher.requests().size(), 1u) << "a malformed answer is not retried";
  }
}

TEST(TeacherClientTest, ServerErrorsAreRetriedAndRequestErrorsAreNot) {
  std::atomic<int> calls{0};
  FakeTeacher flaky([&](const json& r) {
    if (calls++ < 2) return std::make_pair(503, json{{"error", {{"message", "warming up"}}}});
    return std::make_pair(200, Scoring(r, true));
  });
  auto client = TeacherClient::Create(Fast(flaky.url()));
  ASSERT_TRUE(client.ok()) << client.status();
  auto r = (*client)->ResponseLogProbs(TwoTokenSample());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(flaky.requests().size(), 3u);

  FakeTeacher refusing([](const json&) {
    return std::make_pair(
        400, json{{"error", {{"message", "input_ids[3] = 151940 is not a valid token id"}}}});
  });
  client = TeacherClient::Create(Fast(refusing.url()));
  ASSERT_TRUE(client.ok()) << client.status();
  r = (*client)->ResponseLogProbs(TwoTokenSample());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  ExpectNamed(r.status(), refusing.url(), "after 1 attempt: HTTP 400");
  EXPECT_NE(r.status().message().find("not a valid token id"), std::string::npos) << r.status();
  EXPECT_EQ(refusing.requests().size(), 1u);

  FakeTeacher down([](const json&) {
    return std::make_pair(500, json{{"error", {{"message", "engine crashed"}}}});
  });
  client = TeacherClient::Create(Fast(down.url()));
  ASSERT_TRUE(client.ok()) << client.status();
  r = (*client)->ResponseLogProbs(TwoTokenSample());
  ASSERT_FALSE(r.ok());
  ExpectNamed(r.status(), down.url(), "after 3 attempts: HTTP 500");
  EXPECT_EQ(down.requests().size(), 3u);
}

TEST(TeacherClientTest, BadOptionsAreRefused) {
  for (const std::string url : {"https://teacher:30000", "teacher:30000", "http://teacher",
                                "http://:30000/generate", "http://teacher:99999"}) {
    auto c = TeacherClient::Create(Fast(url));
    ASSERT_FALSE(c.ok()) << url;
    EXPECT_NE(c.status().message().find(url), std::string::npos) << c.status();
    EXPECT_NE(c.status().message().find("reward.rm_url"), std::string::npos) << c.status();
  }
  TeacherOptions o = Fast("http://127.0.0.1:30000");
  o.max_attempts = 0;
  EXPECT_FALSE(TeacherClient::Create(o).ok());
  o = Fast("http://127.0.0.1:30000");
  o.timeout = std::chrono::milliseconds(0);
  EXPECT_FALSE(TeacherClient::Create(o).ok());
}

TEST(TeacherLogProbsInSampleTest, ValidatedRoundTrippedAndClearedByAppend) {
  data::Sample s = TwoTokenSample();
  s.teacher_log_probs = {-0.5f};
  Status v = s.Validate();
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.message().find("teacher_log_probs has 1 entries, response_length is 2"),
            std::string::npos)
      << v;
  s.teacher_log_probs = {-0.5f, -0.25f};
  ASSERT_TRUE(s.Validate().ok());
  auto back = SampleFromJson(SampleToJson(s));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->teacher_log_probs, s.teacher_log_probs);
  json old = SampleToJson(s);
  old.erase("teacher_log_probs");  // written before the field existed
  back = SampleFromJson(old);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->teacher_log_probs.empty());
  // A continued response invalidates the teacher's scores of the old one.
  const std::vector<int32_t> more = {23};
  ASSERT_TRUE(s.AppendResponse(more, {}, true).ok());
  EXPECT_TRUE(s.teacher_log_probs.empty());
  EXPECT_TRUE(s.Validate().ok());
}

}  // namespace
}  // namespace slime::rollout
