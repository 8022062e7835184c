// The weight versions of a /generate answer (src/rollout/request.h): a sample records the
// version of every span of tokens the engine reports (meta_info.weight_versions, several when
// the answer lived through a weight update during an in-place or retracting pause), oldest
// first, so its staleness counts its oldest token; without spans, meta_info.weight_version; a
// malformed list is an error naming the field. Each span's end − start is its token count
// (Sample::weight_version_tokens) when the spans cover the answer.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "request.h"

namespace slime::rollout {
namespace {

nlohmann::json Answer(const std::vector<int32_t>& ids, const nlohmann::json& meta_extra) {
  nlohmann::json lps = nlohmann::json::array();
  for (int32_t id : ids) lps.push_back({-0.5, id, nullptr});
  nlohmann::json meta = {{"output_token_logprobs", lps}, {"finish_reason", {{"type", "length"}}}};
  meta.update(meta_extra);
  return {{"text", "x"}, {"output_ids", ids}, {"meta_info", meta}};
}

data::Sample Prompt() {
  data::Sample s;
  s.index = 3;
  s.tokens = {10, 11, 12};
  return s;
}

TEST(AnswerVersionsTest, EverySpansVersionOldestFirst) {
  data::Sample s = Prompt();
  const nlohmann::json spans = nlohmann::json::parse(
      R"([{"version": "4", "start": 0, "end": 2}, {"version": "5", "start": 2, "end": 3}])");
  ASSERT_TRUE(internal::ApplyGenerateResponse(
                  Answer({20, 21, 22}, {{"weight_version", "5"}, {"weight_versions", spans}}), &s)
                  .ok());
  EXPECT_EQ(s.weight_versions, (std::vector<std::string>{"4", "5"}));
  EXPECT_EQ(s.response_length, 3);

  // A second turn from one version adds it once.
  const nlohmann::json one =
      nlohmann::json::parse(R"([{"version": "5", "start": 0, "end": 1}])");
  ASSERT_TRUE(internal::ApplyGenerateResponse(
                  Answer({23}, {{"weight_version", "5"}, {"weight_versions", one}}), &s)
                  .ok());
  EXPECT_EQ(s.weight_versions, (std::vector<std::string>{"4", "5", "5"}));
  // And how many tokens each span made (rollout/tokens_by_staleness/*).
  EXPECT_EQ(s.weight_version_tokens, (std::vector<int64_t>{2, 1, 1}));
  EXPECT_TRUE(s.Validate().ok());
}

TEST(AnswerVersionsTest, SpanSizesThatDoNotCoverTheAnswerLeaveTheCountsUnknown) {
  // Spans without start/end, spanning other than the answer's tokens, or a first span without
  // a version: the versions stay, the counts are dropped rather than guessed.
  for (const char* spans : {R"([{"version": "4"}, {"version": "5"}])",
                            R"([{"version": "", "start": 0, "end": 2},
                                {"version": "5", "start": 2, "end": 3}])",
                            R"([{"version": "4", "start": 0, "end": 1},
                                {"version": "5", "start": 1, "end": 5}])"}) {
    data::Sample s = Prompt();
    ASSERT_TRUE(internal::ApplyGenerateResponse(
                    Answer({20, 21, 22}, {{"weight_versions", nlohmann::json::parse(spans)}}), &s)
                    .ok())
        << spans;
    if (s.weight_versions.size() == 1) {  // an unnamed first span is not recorded
      EXPECT_EQ(s.weight_versions, (std::vector<std::string>{"5"})) << spans;
    } else {
      EXPECT_EQ(s.weight_versions, (std::vector<std::string>{"4", "5"})) << spans;
    }
    EXPECT_TRUE(s.weight_version_tokens.empty()) << spans;
    EXPECT_TRUE(s.Validate().ok()) << spans;
  }
}

TEST(AnswerVersionsTest, WithoutSpansTheAnswersVersion) {
  data::Sample s = Prompt();
  ASSERT_TRUE(internal::ApplyGenerateResponse(Answer({20}, {{"weight_version", "7"}}), &s).ok());
  EXPECT_EQ(s.weight_versions, (std::vector<std::string>{"7"}));
  EXPECT_EQ(s.weight_version_tokens, (std::vector<int64_t>{1}));
  // An empty list (no output token) falls back to the answer's version too.
  data::Sample t = Prompt();
  ASSERT_TRUE(internal::ApplyGenerateResponse(
                  Answer({}, {{"weight_version", "8"}, {"weight_versions", nlohmann::json::array()}}),
                  &t)
                  .ok());
  EXPECT_EQ(t.weight_versions, (std::vector<std::string>{"8"}));
}

TEST(AnswerVersionsTest, MalformedSpansAreErrorsNamingTheField) {
  for (const char* bad : {R"("4")", R"([{"start": 0, "end": 1}])", R"([{"version": 4}])"}) {
    data::Sample s = Prompt();
    const Status st = internal::ApplyGenerateResponse(
        Answer({20}, {{"weight_versions", nlohmann::json::parse(bad)}}), &s);
    ASSERT_FALSE(st.ok()) << bad;
    EXPECT_NE(st.message().find("meta_info.weight_versions"), std::string::npos) << st;
    EXPECT_TRUE(s.weight_versions.empty()) << "nothing appended from a refused answer";
  }
}

}  // namespace
}  // namespace slime::rollout
