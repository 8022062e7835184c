// The rollout's side of routing replay (src/rollout/request.h): the /generate body asks for
// routed experts from the rows the sample holds; the answer's base64 little-endian int32 rows
// are decoded and appended (a multi-turn sample continues them); sizes that do not fit are
// errors naming them; the rows survive the sample's JSON round trip (rollout state, debug data).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "request.h"
#include "slime/rollout/coordinator.h"

namespace slime::rollout {
namespace {

// base64 of `values` as little-endian int32.
std::string Encode(const std::vector<int32_t>& values) {
  std::string bytes;
  for (int32_t v : values) {
    const auto u = static_cast<uint32_t>(v);
    for (int b = 0; b < 4; ++b) bytes.push_back(static_cast<char>((u >> (8 * b)) & 0xFF));
  }
  return absl::Base64Escape(bytes);
}

// An answer of `ids` with their log-probs and `routed` (base64) in meta_info.
nlohmann::json Answer(const std::vector<int32_t>& ids, const std::string& routed,
                      const std::string& finish = "stop") {
  nlohmann::json lps = nlohmann::json::array();
  for (int32_t id : ids) lps.push_back({-0.5, id, nullptr});
  return {{"text", "x"},
          {"output_ids", ids},
          {"meta_info",
           {{"output_token_logprobs", lps},
            {"finish_reason", {{"type", finish}}},
            {"weight_version", "1"},
            {"routed_experts", routed}}}};
}

TEST(RoutedExpertsTest, DecodesLittleEndianInt32AndRefusesBadSizes) {
  auto d = internal::DecodeRoutedExperts(Encode({1, -2, 70000, 3, 4, 5}), 3);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->values, (std::vector<int32_t>{1, -2, 70000, 3, 4, 5}));
  EXPECT_EQ(d->per_token, 2);
  auto not_rows = internal::DecodeRoutedExperts(Encode({1, 2, 3, 4, 5}), 2);
  ASSERT_FALSE(not_rows.ok());
  EXPECT_NE(not_rows.status().message().find("5 int32 values"), std::string::npos)
      << not_rows.status();
  EXPECT_NE(not_rows.status().message().find("2 rows"), std::string::npos) << not_rows.status();
  auto ragged = internal::DecodeRoutedExperts(absl::Base64Escape("abcdef"), 1);
  ASSERT_FALSE(ragged.ok());
  EXPECT_NE(ragged.status().message().find("6 bytes"), std::string::npos) << ragged.status();
  EXPECT_FALSE(internal::DecodeRoutedExperts("%%%", 1).ok());
}

TEST(RoutedExpertsTest, RequestAndAnswerAppendTurnByTurn) {
  SamplingOptions sampling;
  sampling.return_routed_experts = true;
  data::Sample s;
  s.index = 4;
  s.tokens = {10, 11, 12};  // the prompt
  auto body = internal::BuildGenerateRequest(&s, sampling, "r", std::nullopt);
  ASSERT_TRUE(body.has_value());
  EXPECT_EQ((*body)["return_routed_experts"], true);
  EXPECT_EQ((*body)["routed_experts_start_len"], 0);

  // Turn 1: 3 prompt + 2 output tokens → 4 rows of (2 layers × top-k 2).
  std::vector<int32_t> rows1;
  for (int i = 0; i < 16; ++i) rows1.push_back(i % 8);
  ASSERT_TRUE(internal::ApplyGenerateResponse(Answer({20, 21}, Encode(rows1)), &s, true).ok());
  EXPECT_EQ(s.rollout_routed_experts, rows1);
  EXPECT_EQ(s.routed_experts_per_token, 4);
  EXPECT_EQ(s.RoutedRows(), 4);  // tokens − 1

  // Turn 2 continues from the rows held: 5 tokens in, 1 out → rows [4, 5).
  body = internal::BuildGenerateRequest(&s, sampling, "r", std::nullopt);
  EXPECT_EQ((*body)["routed_experts_start_len"], 4);
  ASSERT_TRUE(internal::ApplyGenerateResponse(Answer({22}, Encode({7, 6, 5, 4})), &s, true).ok());
  EXPECT_EQ(s.RoutedRows(), 5);
  EXPECT_EQ(s.rollout_routed_experts.size(), 20u);
  EXPECT_TRUE(s.Validate().ok());

  // The rows survive the sample's JSON (rollout state and debug rollout data).
  auto back = SampleFromJson(SampleToJson(s));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->rollout_routed_experts, s.rollout_routed_experts);
  EXPECT_EQ(back->routed_experts_per_token, 4);
}

TEST(RoutedExpertsTest, SizeMismatchesAreErrorsNamingTheSizes) {
  data::Sample s;
  s.index = 9;
  s.tokens = {1, 2, 3};
  // 2 outputs → 4 rows expected; 6 values are no whole rows.
  Status st = internal::ApplyGenerateResponse(Answer({4, 5}, Encode({1, 2, 3, 4, 5, 6})), &s, true);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("sample 9"), std::string::npos) << st;
  EXPECT_NE(st.message().find("6 int32 values"), std::string::npos) << st;
  EXPECT_NE(st.message().find("4 rows"), std::string::npos) << st;

  // Asked for but missing: names the field and the engine flag.
  nlohmann::json no_routing = Answer({4}, "");
  no_routing["meta_info"].erase("routed_experts");
  st = internal::ApplyGenerateResponse(no_routing, &s, true);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("routed_experts"), std::string::npos) << st;

  // A later turn of another width.
  data::Sample t;
  t.tokens = {1, 2};
  ASSERT_TRUE(internal::ApplyGenerateResponse(Answer({3}, Encode({0, 1, 0, 1, 2, 3, 2, 3})), &t,
                                              true)
                  .ok());  // 2 rows × 4
  st = internal::ApplyGenerateResponse(Answer({4}, Encode({1, 2})), &t, true);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("2 entries per token after rows of 4"), std::string::npos) << st;

  // An aborted answer's rows are dropped (it may stop mid-prompt): a continuation asks again.
  data::Sample u;
  u.tokens = {1, 2, 3, 4};
  ASSERT_TRUE(internal::ApplyGenerateResponse(Answer({}, Encode({1, 2}), "abort"), &u, true).ok());
  EXPECT_TRUE(u.rollout_routed_experts.empty());

  // Invariant 5: more rows than tokens − 1.
  data::Sample v;
  v.tokens = {1, 2};
  v.rollout_routed_experts = {0, 1, 0, 1};
  v.routed_experts_per_token = 2;
  st = v.Validate();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("2 rows for 2 tokens"), std::string::npos) << st;
}

}  // namespace
}  // namespace slime::rollout
