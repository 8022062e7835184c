// Reward post-processing (reward_postprocess.h) against numbers computed by hand (each literal's
// formula is in the comment beside it; the values were evaluated with plain python3, not with
// any implementation of slime).
#include "slime/reward/reward_postprocess.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace slime::reward {
namespace {

void ExpectVector(const std::vector<double>& v, const std::vector<double>& expected,
                  double tol = 1e-9) {
  ASSERT_EQ(v.size(), expected.size());
  for (size_t i = 0; i < v.size(); ++i) EXPECT_NEAR(v[i], expected[i], tol) << "element " << i;
}

std::string Msg(const Status& s) { return std::string(s.message()); }

GroupRewardOptions Opts(std::string estimator, int n, int batch) {
  GroupRewardOptions o;
  o.advantage_estimator = std::move(estimator);
  o.n_samples_per_prompt = n;
  o.rollout_batch_size = batch;
  return o;
}

TEST(RewardPostprocessTest, GrpoUsesTheUnbiasedGroupStdPlusEpsilon) {
  // Group 1: {1,0,0,0}: mean 1/4, sample variance (9/16 + 3/16) / 3 = 1/4, std 1/2.
  // Group 2: {1,1,0,0}: mean 1/2, sample variance (4 · 1/4) / 3 = 1/3, std 1/sqrt(3).
  auto r = NormalizeGroupRewards({1, 0, 0, 0, 1, 1, 0, 0}, Opts("grpo", 4, 2));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->group_size, 4);
  EXPECT_FALSE(r->whole_batch_one_group);
  const double s1 = 0.5 + 1e-6;
  const double s2 = 1.0 / std::sqrt(3.0) + 1e-6;
  const std::vector<double> want = {0.75 / s1, -0.25 / s1, -0.25 / s1, -0.25 / s1,
                                    0.5 / s2,  0.5 / s2,   -0.5 / s2,  -0.5 / s2};
  ASSERT_EQ(r->rewards.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(r->rewards[i], want[i], 1e-12) << i;
  EXPECT_NEAR(r->rewards[0], 1.4999970000059999, 1e-12);  // 0.75 / 0.500001
}

TEST(RewardPostprocessTest, DrGrpoBaselineAndPassThrough) {
  GroupRewardOptions dr = Opts("grpo", 2, 2);
  dr.grpo_std_normalization = false;  // Dr.GRPO: mean only
  auto r = NormalizeGroupRewards({3, 1, 2, 2}, dr);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->rewards, (std::vector<double>{1, -1, 0, 0}));

  r = NormalizeGroupRewards({3, 1, 2, 2}, Opts("reinforce_plus_plus_baseline", 2, 2));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->rewards, (std::vector<double>{1, -1, 0, 0}));

  for (const char* e : {"ppo", "reinforce_plus_plus"}) {
    r = NormalizeGroupRewards({3, 1, 2, 2}, Opts(e, 2, 2));
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->rewards, (std::vector<double>{3, 1, 2, 2})) << e;
    EXPECT_EQ(r->group_size, 0);
  }
  GroupRewardOptions off = Opts("grpo", 2, 2);
  off.rewards_normalization = false;
  r = NormalizeGroupRewards({3, 1, 2, 2}, off);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->rewards, (std::vector<double>{3, 1, 2, 2}));
}

TEST(RewardPostprocessTest, OddCountsAreOneGroupAndSingletonsAreZero) {
  // 3 rewards where 2 × 2 were expected: one group, mean 2, std 1.
  auto r = NormalizeGroupRewards({1, 2, 3}, Opts("gspo", 2, 2));
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->whole_batch_one_group);
  EXPECT_EQ(r->group_size, 3);
  EXPECT_NEAR(r->rewards[0], -1 / (1 + 1e-6), 1e-12);
  EXPECT_NEAR(r->rewards[1], 0, 1e-12);
  EXPECT_NEAR(r->rewards[2], 1 / (1 + 1e-6), 1e-12);
  r = NormalizeGroupRewards({5, 7}, Opts("grpo", 1, 2));  // n = 1: std 0, r - mean = 0
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->rewards, (std::vector<double>{0, 0}));
  EXPECT_DOUBLE_EQ(SampleStd({1, 1, 1}), 0);
  EXPECT_DOUBLE_EQ(SampleStd({1, 3}), std::sqrt(2.0));
}

TEST(RewardPostprocessTest, BadInputIsNamed) {
  auto r = NormalizeGroupRewards({1, 2}, Opts("grpo_typo", 2, 1));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("grpo_typo"), std::string::npos);
  r = NormalizeGroupRewards({1, NAN}, Opts("grpo", 2, 1));
  EXPECT_NE(r.status().message().find("sample 1"), std::string::npos);
  r = NormalizeGroupRewards({1}, Opts("grpo", 0, 1));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PostProcessRewardsTest, GrpoNormalizesEachGroupWithUnbiasedStd) {
  // Groups {1,0,0,1}: mean .5, std sqrt(4·.25/3) = .57735 → ±.5/(.57735+1e-6).
  //        {1,1,1,0}: mean .75, std sqrt((3·.0625+.5625)/3) = .5 → .25/.500001, −.75/.500001.
  auto out = NormalizeGroupRewards({1, 0, 0, 1, 1, 1, 1, 0}, Opts("grpo", 4, 2));
  ASSERT_TRUE(out.ok()) << out.status();
  ExpectVector(out->rewards,
               {0.866023903787, -0.866023903787, -0.866023903787, 0.866023903787, 0.499999000002,
                0.499999000002, 0.499999000002, -1.49999700001},
               1e-10);
  EXPECT_EQ(out->group_size, 4);
  EXPECT_FALSE(out->whole_batch_one_group);
}

TEST(PostProcessRewardsTest, GspoAndCispoNormalizeLikeGrpo) {
  for (const char* e : {"gspo", "cispo"}) {
    auto out = NormalizeGroupRewards({1, 0, 0, 1}, Opts(e, 4, 1));
    ASSERT_TRUE(out.ok());
    ExpectVector(out->rewards, {0.866023903787, -0.866023903787, -0.866023903787, 0.866023903787},
                 1e-10);
  }
}

TEST(PostProcessRewardsTest, DrGrpoAndReinforceBaselineOnlySubtractTheMean) {
  // r − mean_g: {1,0,0,1} − .5, {1,1,1,0} − .75.
  const std::vector<double> centered = {0.5, -0.5, -0.5, 0.5, 0.25, 0.25, 0.25, -0.75};
  auto dr = Opts("grpo", 4, 2);
  dr.grpo_std_normalization = false;
  auto out = NormalizeGroupRewards({1, 0, 0, 1, 1, 1, 1, 0}, dr);
  ASSERT_TRUE(out.ok());
  ExpectVector(out->rewards, centered);
  // reinforce_plus_plus_baseline never divides by the std, even with the flag on.
  out = NormalizeGroupRewards({1, 0, 0, 1, 1, 1, 1, 0}, Opts("reinforce_plus_plus_baseline", 4, 2));
  ASSERT_TRUE(out.ok());
  ExpectVector(out->rewards, centered);
}

TEST(PostProcessRewardsTest, PpoReinforceAndDisabledNormalizationKeepRawRewards) {
  const std::vector<double> raw = {1, 0, 0.5, 2};
  for (const char* e : {"ppo", "reinforce_plus_plus"}) {
    auto out = NormalizeGroupRewards(raw, Opts(e, 2, 2));
    ASSERT_TRUE(out.ok());
    EXPECT_EQ(out->rewards, raw);
    EXPECT_EQ(out->group_size, 0);
  }
  auto off = Opts("grpo", 2, 2);
  off.rewards_normalization = false;
  auto out = NormalizeGroupRewards(raw, off);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->rewards, raw);
}

TEST(PostProcessRewardsTest, UnexpectedCountNormalizesTheWholeBatchAsOneGroup) {
  // 3 rewards instead of 2 × 2: one group {1, 0, .5}, mean .5, std sqrt(.5/2) = .5 →
  // ±.5/.500001 and 0.
  auto out = NormalizeGroupRewards({1.0, 0.0, 0.5}, Opts("grpo", 2, 2));
  ASSERT_TRUE(out.ok());
  EXPECT_TRUE(out->whole_batch_one_group);
  EXPECT_EQ(out->group_size, 3);
  ExpectVector(out->rewards, {0.999998000004, -0.999998000004, 0.0}, 1e-10);
  // A single reward: std of one value is taken as 0 (slime: NaN), the centered reward is 0.
  out = NormalizeGroupRewards({0.7}, Opts("grpo", 2, 2));
  ASSERT_TRUE(out.ok());
  ExpectVector(out->rewards, {0.0});
}

TEST(PostProcessRewardsTest, BadInputIsAnError) {
  auto out = NormalizeGroupRewards({1, 0}, Opts("grpo", 0, 2));
  ASSERT_FALSE(out.ok());
  EXPECT_NE(Msg(out.status()).find("n_samples_per_prompt"), std::string::npos);
  out = NormalizeGroupRewards({1, NAN}, Opts("grpo", 2, 1));
  ASSERT_FALSE(out.ok());
  EXPECT_NE(Msg(out.status()).find("sample 1"), std::string::npos);

  auto normalization = GroupRewardNormalizationFor(Opts("rloo", 2, 1));
  ASSERT_FALSE(normalization.ok());
  EXPECT_NE(Msg(normalization.status()).find("rloo"), std::string::npos);
  EXPECT_NE(Msg(normalization.status()).find("reinforce_plus_plus_baseline"), std::string::npos);
}

}  // namespace
}  // namespace slime::reward
