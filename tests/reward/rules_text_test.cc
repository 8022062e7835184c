// Text rule rewards on real-looking model outputs: dapo, f1, gpqa, exact_match.
#include <string>

#include "gtest/gtest.h"
#include "slime/reward/rules.h"

namespace slime::reward {
namespace {

TEST(DapoTest, MinervaAnswerLine) {
  const std::string response =
      "We need the number of positive divisors of 360 = 2^3 * 3^2 * 5.\n"
      "That is (3+1)(2+1)(1+1) = 24.\n\nAnswer: 24";
  auto score = DapoScore(response, "24");
  ASSERT_TRUE(score.ok()) << score.status();
  EXPECT_EQ((*score)["score"].get<double>(), 1.0);
  EXPECT_EQ((*score)["acc"].get<bool>(), true);
  EXPECT_EQ((*score)["pred"].get<std::string>(), "24");

  auto wrong = DapoScore(response, "25");
  ASSERT_TRUE(wrong.ok());
  EXPECT_EQ((*wrong)["score"].get<double>(), -1.0);
  EXPECT_EQ((*wrong)["acc"].get<bool>(), false);
}

TEST(DapoTest, NormalisationAndLabelCast) {
  EXPECT_EQ((*DapoScore("so the total is\nanswer: $1,000$ dollars", "1000"))["score"], 1.0);
  EXPECT_EQ((*DapoScore("ANSWER : \\boxed{14}", "14.0"))["score"], 1.0);  // int(float("14.0"))
  EXPECT_EQ((*DapoScore("Answer: x = 12", "12"))["score"], 1.0);
  auto none = DapoScore("I could not solve it.", "3");
  EXPECT_EQ((*none)["score"], -1.0);
  EXPECT_EQ((*none)["pred"], "[INVALID]");
  // The last "Answer:" line wins.
  EXPECT_EQ((*DapoScore("Answer: 5\nWait, recheck.\nAnswer: 7", "7"))["score"], 1.0);
  // Only the last 300 characters are read.
  std::string long_tail = "Answer: 7\n" + std::string(400, '.');
  EXPECT_EQ((*DapoScore(long_tail, "7"))["pred"], "[INVALID]");
  auto bad = DapoScore("Answer: 7", "seven");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(bad.status().message()).find("seven"), std::string::npos);
}

TEST(DapoTest, NormalizeFinalAnswer) {
  EXPECT_EQ(DapoNormalizeFinalAnswer("x = \\frac{1}{2}"), "\\frac{1}{2}");
  EXPECT_EQ(DapoNormalizeFinalAnswer("\\text{5 dollars}"), "5");
  EXPECT_EQ(DapoNormalizeFinalAnswer("10^{\\circ}"), "10");
  EXPECT_EQ(DapoNormalizeFinalAnswer("\\frac12"), "\\frac{1}{2}");
  EXPECT_EQ(DapoNormalizeFinalAnswer("\\sqrt2"), "\\sqrt{2}");
  EXPECT_EQ(DapoNormalizeFinalAnswer("12,345"), "12345");
}

TEST(F1Test, SquadTokenF1) {
  // pred tokens: capital of france is paris (5), truth: paris (1) -> P = 1/5, R = 1.
  EXPECT_NEAR(F1Reward("The capital of France is Paris.", "Paris"), 2 * 0.2 / 1.2, 1e-12);
  EXPECT_DOUBLE_EQ(F1Reward("the Eiffel Tower!", "Eiffel   tower"), 1.0);
  EXPECT_DOUBLE_EQ(F1Reward("Yes.", "yes"), 1.0);
  EXPECT_DOUBLE_EQ(F1Reward("yes", "no"), 0.0);
  EXPECT_DOUBLE_EQ(F1Reward("no answer here", "noanswer"), 0.0);
  EXPECT_DOUBLE_EQ(F1Reward("blue whale", "the giant squid"), 0.0);
  // pred: barack obama (2); truth: obama barack hussein (3) -> P = 1, R = 2/3, F1 = 0.8.
  EXPECT_NEAR(F1Reward("Barack Obama", "Obama, Barack Hussein"), 0.8, 1e-12);
  EXPECT_EQ(SquadNormalize("  An apple, THE pear; a plum.  "), "apple pear plum");
}

TEST(GpqaTest, LetterExtraction) {
  const std::string abcd = "ABCD";
  EXPECT_EQ(GpqaExtractLetter("<think>Option A is wrong; B looks plausible.</think>\n"
                              "The answer is (C).",
                              abcd),
            'C');
  EXPECT_EQ(GpqaExtractLetter("After checking each option, I conclude that B is correct.", abcd),
            'B');
  EXPECT_EQ(GpqaExtractLetter("Final answer: D", abcd), 'D');
  EXPECT_EQ(GpqaExtractLetter("the answer is a", abcd), 'A');
  // "answer is correct" is not a letter; the fallback finds the standalone capital.
  EXPECT_EQ(GpqaExtractLetter("My answer is correct, I pick A", abcd), 'A');
  EXPECT_EQ(GpqaExtractLetter("So we go with D", abcd), 'D');
  EXPECT_FALSE(GpqaExtractLetter("The answer is (E)", abcd).has_value());
  EXPECT_FALSE(GpqaExtractLetter("", abcd).has_value());
}

TEST(GpqaTest, RewardFromMetadataAndLabel) {
  nlohmann::json meta = {{"choices", {"toluene", "benzaldehyde", "phenol", "aniline"}}};
  const std::string cot =
      "<think>The oxidation of toluene with CrO3 stops at the aldehyde under these conditions."
      "</think>\nThe answer is (B).";
  EXPECT_EQ(GpqaReward(cot, "B", &meta), 1);
  EXPECT_EQ(GpqaReward(cot, "C", &meta), 0);
  EXPECT_EQ(GpqaReward(cot, "benzaldehyde", &meta), 1);  // label text -> letter B
  nlohmann::json with_letter = meta;
  with_letter["correct_letter"] = "b";
  EXPECT_EQ(GpqaReward(cot, "", &with_letter), 1);
  // No letter in the response: the correct choice's text counts.
  EXPECT_EQ(GpqaReward("The product is benzaldehyde.", "benzaldehyde", &meta), 1);
  EXPECT_EQ(GpqaReward("The product is phenol.", "benzaldehyde", &meta), 0);
  // Without metadata: letters A-J, one-letter label.
  EXPECT_EQ(GpqaReward("I am confident: the answer is (H)", "H", nullptr), 1);
}

TEST(ExactMatchTest, TrimmedAfterThink) {
  EXPECT_EQ(ExactMatchReward("<think>Capital of France...</think>\n  Paris \n", "Paris"), 1);
  EXPECT_EQ(ExactMatchReward("<think>x</think>paris", "Paris"), 0);
  EXPECT_EQ(ExactMatchReward("42", " 42\n"), 1);
  EXPECT_EQ(StripThink("a</think>b</think>c"), "c");
}

}  // namespace
}  // namespace slime::reward
