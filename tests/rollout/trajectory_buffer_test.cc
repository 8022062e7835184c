// TrajectoryBuffer (include/slime/rollout/trajectory_buffer.h): trajectories POSTed from
// outside the job become rollouts of complete groups in completion order, with their rewards
// group-normalized; a bad body is refused naming the entry and field with nothing added; Take
// waits for enough groups and ends on Cancel; the state round-trips through a checkpoint.
#include "slime/rollout/trajectory_buffer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <string>

namespace slime::rollout {
namespace {

using Json = nlohmann::json;

Json Trajectory(const std::string& group, double reward, int response = 2) {
  Json t = {{"group", group},
            {"tokens", Json::array({1, 2, 3, 4, 5})},
            {"response_length", response},
            {"reward", reward},
            {"rollout_log_probs", Json(std::vector<double>(response, -0.5))},
            {"weight_versions", Json::array({"3", "4"})}};
  return t;
}

std::string Body(std::vector<Json> trajectories) {
  return Json{{"trajectories", trajectories}}.dump();
}

std::unique_ptr<TrajectoryBuffer> Buffer(int64_t n = 2, int64_t groups = 2) {
  TrajectoryBuffer::Options o;
  o.n_samples_per_prompt = n;
  o.rollout_batch_size = groups;
  o.reward_postprocess.n_samples_per_prompt = static_cast<int>(n);
  o.reward_postprocess.rollout_batch_size = static_cast<int>(groups);
  auto b = TrajectoryBuffer::Create(o);
  EXPECT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->Add(Body({Trajectory("early", 1)})).status().code(),
            absl::StatusCode::kUnavailable);  // not open yet
  (*b)->Open();
  return *std::move(b);
}

TEST(TrajectoryBufferTest, CompleteGroupsBecomeARolloutInCompletionOrder) {
  auto buffer = Buffer();
  ASSERT_EQ(*buffer->Add(Body({Trajectory("a", 1), Trajectory("b", 0)})), 2);
  ASSERT_EQ(*buffer->Add(Body({Trajectory("b", 1), Trajectory("c", 1)})), 2);  // b completes
  EXPECT_EQ(buffer->Stats()["complete_groups"], 1);
  ASSERT_TRUE(buffer->Add(Body({Trajectory("a", 0)})).ok());  // a completes second
  EXPECT_EQ(buffer->Stats()["complete_groups"], 2);
  EXPECT_EQ(buffer->Stats()["open_groups"], 1);
  StatusOr<RolloutResult> r = buffer->Take(7);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->groups.size(), 2u);
  EXPECT_EQ(r->groups[0][0].group_index, r->groups[0][1].group_index);
  // b = {0, 1}, a = {1, 0}: GRPO normalization gives ±1/std per group.
  EXPECT_EQ(r->raw_rewards, (std::vector<double>{0, 1, 1, 0}));
  ASSERT_EQ(r->rewards.size(), 4u);
  EXPECT_LT(r->rewards[0], 0);
  EXPECT_GT(r->rewards[1], 0);
  EXPECT_NEAR(r->rewards[0] + r->rewards[1], 0, 1e-9);
  for (const auto& g : r->groups) {
    for (const data::Sample& s : g) {
      EXPECT_EQ(s.rollout_id, 7);
      EXPECT_EQ(s.response_length, 2);
      EXPECT_EQ(s.PromptLength(), 3);
      EXPECT_EQ(s.loss_mask, (std::vector<uint8_t>{1, 1}));
      EXPECT_EQ(s.weight_versions, (std::vector<std::string>{"3", "4"}));
      EXPECT_TRUE(s.weight_version_tokens.empty());  // not given: not known
      EXPECT_TRUE(s.Validate().ok());
    }
  }
  EXPECT_TRUE(r->metrics.count("rollout/raw_reward"));
  EXPECT_EQ(buffer->Stats()["taken"], 4);
  EXPECT_EQ(buffer->Stats()["trajectories"], 1);  // c waits for its second sample
}

TEST(TrajectoryBufferTest, ABadBodyIsRefusedNamingTheFieldAndNothingIsAdded) {
  auto buffer = Buffer();
  struct Case {
    Json trajectory;
    std::string message;
  };
  Json no_group = Trajectory("a", 1);
  no_group.erase("group");
  Json long_mask = Trajectory("a", 1);
  long_mask["loss_mask"] = Json::array({1, 1, 1});
  Json bad_lp = Trajectory("a", 1);
  bad_lp["rollout_log_probs"] = Json::array({-0.1, 0.5});
  Json extra = Trajectory("a", 1);
  extra["advantage"] = 1.0;
  Json bad_status = Trajectory("a", 1);
  bad_status["status"] = "aborted";
  Json short_counts = Trajectory("a", 1);
  short_counts["weight_version_tokens"] = Json::array({2});
  Json over_counts = Trajectory("a", 1);
  over_counts["weight_version_tokens"] = Json::array({2, 1});
  for (const Case& c : std::vector<Case>{
           {no_group, "trajectories[1].group is required"},
           {Trajectory("a", 1, 9),
            "trajectories[1].response_length is required: an integer from 1 to the 5 tokens"},
           {long_mask, "trajectories[1].loss_mask must be a list of 2 entries"},
           {bad_lp, "trajectories[1].rollout_log_probs entries must be log-probabilities"},
           {extra, "trajectories[1].advantage is not a trajectory field"},
           {bad_status, "trajectories[1].status must be"},
           {short_counts, "trajectories[1].weight_version_tokens must be a list of 2 token counts"},
           {over_counts, "summing to at most 2 (response_length)"},
           {Json{{"group", "a"},
                 {"tokens", Json::array({1, -2})},
                 {"response_length", 1},
                 {"reward", 0}},
            "trajectories[1].tokens must hold non-negative integer token ids"},
       }) {
    StatusOr<int64_t> added = buffer->Add(Body({Trajectory("x", 1), c.trajectory}));
    ASSERT_FALSE(added.ok()) << c.message;
    EXPECT_EQ(added.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(added.status().message().find(c.message), std::string::npos) << added.status();
  }
  EXPECT_FALSE(buffer->Add("not json").ok());
  EXPECT_NE(buffer->Add("{\"trajectory\": []}").status().message().find("{\"trajectories\": [...]}"),
            std::string::npos);
  // A group over n_samples_per_prompt, within one body or across bodies.
  StatusOr<int64_t> over = buffer->Add(Body({Trajectory("g", 1), Trajectory("g", 1), Trajectory("g", 0)}));
  ASSERT_FALSE(over.ok());
  EXPECT_NE(over.status().message().find("trajectories[2].group 'g' would have more than n_samples_per_prompt = 2"),
            std::string::npos)
      << over.status();
  EXPECT_EQ(buffer->Stats()["trajectories"], 0) << "a refused body left something behind";
  EXPECT_EQ(buffer->Stats()["added"], 0);
}

TEST(TrajectoryBufferTest, TokensPerVersionAreKeptWhereKnown) {
  auto buffer = Buffer(1, 2);
  Json counted = Trajectory("a", 1);
  counted["weight_version_tokens"] = Json::array({1, 1});
  Json one = Trajectory("b", 0);
  one.erase("weight_versions");
  one["weight_version"] = "6";
  one["loss_mask"] = Json::array({0, 1});  // one version made every model token
  ASSERT_TRUE(buffer->Add(Body({counted, one})).ok());
  StatusOr<RolloutResult> r = buffer->Take(7);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->groups[0][0].weight_version_tokens, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(r->groups[1][0].weight_versions, (std::vector<std::string>{"6"}));
  EXPECT_EQ(r->groups[1][0].weight_version_tokens, (std::vector<int64_t>{1}));
}

TEST(TrajectoryBufferTest, TakeWaitsForEnoughGroupsAndEndsOnCancel) {
  auto buffer = Buffer(1, 2);
  auto taken = std::async(std::launch::async, [&] { return buffer->Take(0); });
  ASSERT_TRUE(buffer->Add(Body({Trajectory("a", 1)})).ok());
  EXPECT_EQ(taken.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout);
  ASSERT_TRUE(buffer->Add(Body({Trajectory("b", 0)})).ok());
  StatusOr<RolloutResult> r = taken.get();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->groups.size(), 2u);

  auto waiting = std::async(std::launch::async, [&] { return buffer->Take(1); });
  EXPECT_EQ(waiting.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout);
  buffer->Cancel();
  EXPECT_EQ(waiting.get().status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(buffer->Add(Body({Trajectory("c", 0)})).status().code(), absl::StatusCode::kCancelled);
}

TEST(TrajectoryBufferTest, StateRoundTripsCompleteAndOpenGroups) {
  auto buffer = Buffer();
  ASSERT_TRUE(buffer->Add(Body({Trajectory("a", 1), Trajectory("a", 0), Trajectory("b", 1)})).ok());
  const Json state = buffer->State();
  auto restored = Buffer();
  ASSERT_TRUE(restored->RestoreState(state).ok());
  EXPECT_EQ(restored->State(), state);
  EXPECT_EQ(restored->Stats()["complete_groups"], 1);
  EXPECT_EQ(restored->Stats()["open_groups"], 1);
  // b's second trajectory completes the restored open group.
  ASSERT_TRUE(restored->Add(Body({Trajectory("b", 0)})).ok());
  StatusOr<RolloutResult> r = restored->Take(0);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->groups[1][0].group_index, r->groups[1][1].group_index);
  EXPECT_NE(r->groups[0][0].group_index, r->groups[1][0].group_index);
  Json broken = state;
  broken["complete"][0]["samples"][0].erase("tokens");
  Status s = restored->RestoreState(broken);
  EXPECT_NE(s.message().find("complete[0][0]"), std::string::npos) << s;
  EXPECT_FALSE(restored->RestoreState(Json::object()).ok());
}

}  // namespace
}  // namespace slime::rollout
