// Math rule rewards on real-looking model outputs: boxed extraction, normalisation, grading,
// math and deepscaler.
#include "gtest/gtest.h"
#include "slime/reward/rules.h"

namespace slime::reward {
namespace {

TEST(BoxedTest, LastBoxedWithNestedBraces) {
  const std::string response =
      "First I tried \\boxed{1} but that was wrong.\n"
      "Using the identity $\\sin 60^\\circ = \\frac{\\sqrt{3}}{2}$, the final answer is "
      "$\\boxed{\\frac{\\sqrt{3}}{2}}$.";
  EXPECT_EQ(LastBoxedOnly(response).value(), "\\boxed{\\frac{\\sqrt{3}}{2}}");
  EXPECT_EQ(ExtractBoxedAnswer(response).value(), "\\frac{\\sqrt{3}}{2}");
}

TEST(BoxedTest, FboxUnbalancedAndAbsent) {
  EXPECT_EQ(ExtractBoxedAnswer("So the total is \\fbox{12}.").value(), "12");
  EXPECT_FALSE(ExtractBoxedAnswer("The answer is \\boxed{12").has_value());
  EXPECT_FALSE(ExtractBoxedAnswer("The answer is 12.").has_value());
  // \boxed wins over an earlier \fbox.
  EXPECT_EQ(ExtractBoxedAnswer("\\fbox{1} then \\boxed{2}").value(), "2");
}

TEST(MathdNormalizeTest, HendrycksRules) {
  EXPECT_EQ(MathdNormalize("\\left( 3, \\frac12 \\right)"), "(3,\\frac{1}{2})");
  EXPECT_EQ(MathdNormalize("x = 5"), "5");
  EXPECT_EQ(MathdNormalize("10\\text{ cm}"), "10");
  EXPECT_EQ(MathdNormalize("\\dfrac{3}{4}"), "\\frac{3}{4}");
  EXPECT_EQ(MathdNormalize("0.5"), "\\frac{1}{2}");
  EXPECT_EQ(MathdNormalize(".5"), "\\frac{1}{2}");
  EXPECT_EQ(MathdNormalize("3/4"), "\\frac{3}{4}");
  EXPECT_EQ(MathdNormalize("90^\\circ"), "90");
  EXPECT_EQ(MathdNormalize("\\$5"), "5");
  EXPECT_EQ(MathdNormalize("50\\%"), "50");
  EXPECT_EQ(MathdNormalize("\\text{(B)}"), "(B)");
  EXPECT_EQ(MathdNormalize("2\\sqrt3"), "2\\sqrt{3}");
  // "\text{ " twice: Python's assert fails and the answer is kept (trimmed).
  EXPECT_EQ(MathdNormalize(" 1\\text{ m}\\text{ s} "), "1\\text{ m}\\text{ s}");
}

TEST(GradeTest, SymbolicEqualityRules) {
  EXPECT_TRUE(GradeSympy("\\frac{3}{2}", "1.5"));
  EXPECT_FALSE(GradeSympy("\\frac{2}{4}", "\\frac{1}{2}"));  // unreduced fraction
  EXPECT_TRUE(GradeSympy("10.0", "10"));
  EXPECT_FALSE(GradeSympy("10.5", "10"));
  EXPECT_TRUE(GradeSympy("\\sqrt{12}", "2\\sqrt{3}"));
  EXPECT_TRUE(GradeSympy("(x+1)^2", "x^2+2x+1"));
  EXPECT_FALSE(GradeSympy("(x+1)^2", "x^2+1"));
  EXPECT_TRUE(GradeSympy("(1, 2)", "(1,2)"));
  EXPECT_FALSE(GradeSympy("[1, 2]", "(1, 2)"));  // closed vs open interval
  EXPECT_FALSE(GradeSympy("(1, 2, 3)", "(1, 2)"));
  EXPECT_TRUE(GradeSympy("1,000", "1000"));
  EXPECT_TRUE(GradeSympy("\\frac{\\pi}{2}", "\\pi/2"));
  EXPECT_TRUE(GradeSympy("1.5 \\text{ million}", "1500000.5 - 0.5"));
  // An integer ground truth needs an integer answer (slime too): "3*10^6" is not one.
  EXPECT_FALSE(GradeSympy("3 \\text{ million}", "3000000"));
  EXPECT_TRUE(GradeSympy("\\text{Monday}", "monday"));
  EXPECT_FALSE(GradeSympy("", "5"));
  // An integer answer must be given as an integer, not as an expression worth it.
  EXPECT_FALSE(GradeSympy("\\frac{8}{2}", "4"));
  EXPECT_TRUE(GradeMathd("\\dfrac{1}{2}", "\\frac12"));
}

TEST(MathRewardTest, ChainOfThoughtWithBoxedAnswer) {
  const std::string response =
      "Let me work through this step by step.\n\n"
      "The radius is 3, so the area is $\\pi r^2 = \\pi \\cdot 3^2 = 9\\pi$.\n\n"
      "Therefore, the area of the circle is $\\boxed{9\\pi}$.";
  EXPECT_EQ(MathReward(response, "9\\pi"), 1);
  EXPECT_EQ(MathReward(response, "\\boxed{9\\pi}"), 1);  // a boxed label is unboxed
  EXPECT_EQ(MathReward(response, "9"), 0);
  EXPECT_EQ(MathReward(response, ""), 0);
  EXPECT_EQ(MathReward("The area is 9 pi.", "9\\pi"), 0);  // no boxed answer
}

TEST(MathRewardTest, UnitsPrefixesAndEquivalentForms) {
  EXPECT_EQ(
      MathReward("The train covers 2 * 60 = 120 miles, so \\boxed{120 \\text{ miles}}.", "120"), 1);
  EXPECT_EQ(MathReward("Solving gives \\boxed{x = 4}.", "4"), 1);
  EXPECT_EQ(MathReward("The probability is \\boxed{0.5}.", "\\frac{1}{2}"), 1);
  EXPECT_EQ(MathReward("The probability is \\boxed{\\dfrac{1}{2}}.", "\\frac12"), 1);
  EXPECT_EQ(MathReward("So we get \\boxed{\\left( 2, -\\frac{1}{3} \\right)}.",
                       "\\left(2,-\\frac{1}{3}\\right)"),
            1);
  EXPECT_EQ(MathReward("The angle measures \\boxed{45^\\circ}.", "45"), 1);
  EXPECT_EQ(MathReward("Hence \\boxed{2\\sqrt{3}}", "\\sqrt{12}"), 1);
  EXPECT_EQ(MathReward("Hence \\boxed{\\frac{4}{6}}", "\\frac{2}{3}"), 0);
}

TEST(DeepscalerTest, ThinkSplitRules) {
  const std::string label = "7";
  EXPECT_EQ(DeepscalerReward("<think>Maybe \\boxed{3}? No: 3 + 4 = 7.</think>\n"
                             "The answer is \\boxed{7}.",
                             label),
            1);
  // No </think> and no ###Response: 0 even with a correct boxed answer.
  EXPECT_EQ(DeepscalerReward("3 + 4 = 7, so \\boxed{7}.", label), 0);
  EXPECT_EQ(DeepscalerReward("###Response\nWe add: \\boxed{7}", label), 1);
  // The boxed answer only inside the thinking does not count.
  EXPECT_EQ(DeepscalerReward("<think>\\boxed{7}</think> I am done.", label), 0);
  EXPECT_EQ(DeepscalerReward("<think>ok</think>\\boxed{7}", ""), 0);
  EXPECT_EQ(DeepscalerReward("<think>ok</think>\\boxed{7}", "\\boxed{7}"), 1);
  EXPECT_EQ(DeepscalerReward("<think>ok</think>\\boxed{8}", label), 0);
}

}  // namespace
}  // namespace slime::reward
