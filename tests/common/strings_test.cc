#include "slime/common/strings.h"

#include <gtest/gtest.h>

namespace slime {
namespace {

TEST(EditDistanceTest, ClassicCases) {
  EXPECT_EQ(EditDistance("", ""), 0);
  EXPECT_EQ(EditDistance("abc", ""), 3);
  EXPECT_EQ(EditDistance("kitten", "sitting"), 3);
  EXPECT_EQ(EditDistance("eps_clip", "eps_clp"), 1);
}

TEST(ClosestMatchTest, SuggestsPlausibleTypoOnly) {
  std::vector<std::string> keys = {"eps_clip", "eps_clip_high", "kl_loss_coef"};
  EXPECT_EQ(ClosestMatch("eps_clp", keys), "eps_clip");
  EXPECT_EQ(ClosestMatch("kl_los_coef", keys), "kl_loss_coef");
  EXPECT_FALSE(ClosestMatch("temperature", keys).has_value());
}

TEST(JoinQuotedTest, Quotes) {
  EXPECT_EQ(JoinQuoted({"a", "b"}), "'a', 'b'");
  EXPECT_EQ(JoinQuoted({}), "");
}

}  // namespace
}  // namespace slime
