// The debug modes' saved rollouts (src/job/debug_data.h): the file round trip, the path
// template, and debug.load_debug_rollout_data_subsample's cut on whole prompt groups.
#include "debug_data.h"  // src/job (internal to the job module)

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "remove_tree.h"

namespace slime::job {
namespace {

// `groups` prompt groups of `n` samples each; sample k of group g has index g·n + k, reward
// (raw) g + 0.5 and post-processed reward −g.
rollout::RolloutResult MakeRollout(int groups, int n) {
  rollout::RolloutResult r;
  r.rollout_id = 7;
  for (int g = 0; g < groups; ++g) {
    data::SampleGroup group;
    for (int k = 0; k < n; ++k) {
      data::Sample s;
      s.group_index = g;
      s.index = g * n + k;
      s.tokens = {1, 2, 3};
      s.response_length = 1;
      s.loss_mask = {1};
      s.reward = g + 0.5;
      s.status = data::SampleStatus::kCompleted;
      group.push_back(s);
      r.raw_rewards.push_back(g + 0.5);
      r.rewards.push_back(-g);
    }
    r.groups.push_back(std::move(group));
  }
  return r;
}

std::vector<int64_t> GroupIndices(const rollout::RolloutResult& r) {
  std::vector<int64_t> out;
  for (const data::SampleGroup& g : r.groups) out.push_back(g.front().group_index);
  return out;
}

TEST(DebugData, SubsampleKeepsTheHeadAndTailGroupsWithTheirRewards) {
  // 10 groups × 2, fraction 0.5: 5 groups, the first 2 and the last 3.
  StatusOr<rollout::RolloutResult> r = SubsampleRollout(MakeRollout(10, 2), 0.5);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(GroupIndices(*r), (std::vector<int64_t>{0, 1, 7, 8, 9}));
  EXPECT_EQ(r->rollout_id, 7);
  ASSERT_EQ(r->rewards.size(), 10u);
  ASSERT_EQ(r->raw_rewards.size(), 10u);
  size_t i = 0;
  for (const data::SampleGroup& g : r->groups) {
    ASSERT_EQ(g.size(), 2u);  // whole groups
    for (const data::Sample& s : g) {
      EXPECT_EQ(r->raw_rewards[i], s.reward);
      EXPECT_EQ(r->rewards[i], -static_cast<double>(s.group_index));
      ++i;
    }
  }
}

TEST(DebugData, SubsampleRoundsDownButKeepsAGroupAndOneIsEverything) {
  StatusOr<rollout::RolloutResult> r = SubsampleRollout(MakeRollout(4, 3), 0.6);  // floor(2.4)
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(GroupIndices(*r), (std::vector<int64_t>{0, 3}));
  r = SubsampleRollout(MakeRollout(4, 3), 0.1);  // floor(0.4) = 0: still one group
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(GroupIndices(*r), (std::vector<int64_t>{3}));
  EXPECT_EQ(r->rewards.size(), 3u);
  r = SubsampleRollout(MakeRollout(4, 3), 1.0);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(GroupIndices(*r), (std::vector<int64_t>{0, 1, 2, 3}));
}

TEST(DebugData, SubsampleRefusesBadInput) {
  for (double bad : {0.0, -0.5, 1.5}) {
    StatusOr<rollout::RolloutResult> r = SubsampleRollout(MakeRollout(4, 1), bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("load_debug_rollout_data_subsample"), std::string::npos);
  }
  rollout::RolloutResult uneven = MakeRollout(4, 2);
  uneven.rewards.pop_back();
  StatusOr<rollout::RolloutResult> r = SubsampleRollout(uneven, 0.5);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("8 samples but 8 raw_rewards and 7 rewards"),
            std::string::npos)
      << r.status();
}

TEST(DebugData, SavedRolloutsRoundTripThroughTheTemplate) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("slime_debug_data_" + std::to_string(::getpid()));
  testing::RemoveTree(dir);
  const std::string path = DebugRolloutPath((dir / "r_{rollout_id}.json").string(), 7);
  EXPECT_EQ(path, (dir / "r_7.json").string());
  ASSERT_TRUE(SaveDebugRollout(path, MakeRollout(3, 2)).ok());
  StatusOr<rollout::RolloutResult> back = LoadDebugRollout(path, 7);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(GroupIndices(*back), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(back->rewards, MakeRollout(3, 2).rewards);
  EXPECT_TRUE(absl::IsNotFound(LoadDebugRollout((dir / "none.json").string(), 0).status()));
  testing::RemoveTree(dir);
}

}  // namespace
}  // namespace slime::job
