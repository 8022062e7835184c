// The loss and advantage-estimator tables (loss_registry.h): they list the names of the config's
// tables (config/algorithms.h) in the same order, so the config check and the trainer cannot
// drift; lookups refuse other names with the valid ones; and what a configuration needs.
#include "slime/train/loss_registry.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "slime/config/algorithms.h"

namespace slime::train {
namespace {

template <typename Row>
std::vector<std::string> Names(std::span<const Row> rows) {
  std::vector<std::string> names;
  for (const Row& row : rows) names.emplace_back(row.name);
  return names;
}

std::string Msg(const Status& s) { return std::string(s.message()); }

TEST(LossRegistryTest, TablesListTheConfigNamesInOrder) {
  EXPECT_EQ(Names(LossTypes()), config::LossTypeNames());
  EXPECT_EQ(Names(AdvantageEstimators()), config::AdvantageEstimatorNames());
  for (const LossTypeSpec& row : LossTypes()) EXPECT_NE(row.loss, nullptr) << row.name;
  for (const AdvantageEstimatorSpec& row : AdvantageEstimators()) {
    EXPECT_NE(row.advantages, nullptr) << row.name;
    EXPECT_EQ(row.info().name, row.name);
  }
}

TEST(LossRegistryTest, UnknownNamesListTheValidOnes) {
  auto loss = FindLossType("custom_loss");
  EXPECT_EQ(loss.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(Msg(loss.status()).find("custom_loss"), std::string::npos);
  EXPECT_NE(Msg(loss.status()).find("policy_loss, sft_loss"), std::string::npos);
  auto estimator = FindAdvantageEstimator("rloo");
  EXPECT_EQ(estimator.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(Msg(estimator.status()).find("rloo"), std::string::npos);
  EXPECT_NE(Msg(estimator.status())
                .find("grpo, gspo, cispo, reinforce_plus_plus, "
                      "reinforce_plus_plus_baseline, ppo"),
            std::string::npos);
}

TEST(LossRegistryTest, NeedsFollowTheRowsAndTheOptions) {
  config::AlgorithmConfig a;
  auto grpo = SelectAlgorithm(a);
  ASSERT_TRUE(grpo.ok()) << grpo.status();
  EXPECT_EQ(grpo->loss->name, "policy_loss");
  EXPECT_EQ(grpo->estimator->objective, PolicyObjective::kPpoClip);
  EXPECT_TRUE(grpo->needs.advantages);
  EXPECT_FALSE(grpo->needs.critic || grpo->needs.reference || grpo->needs.teacher_pass ||
               grpo->needs.teacher_in_batch || grpo->needs.old_actor_copy ||
               grpo->needs.rollout_log_probs);

  a.advantage_estimator = "ppo";
  a.use_kl_loss = true;
  a.use_opd = true;
  a.opd_type = "megatron";
  a.keep_old_actor = true;
  a.use_tis = true;
  auto ppo = SelectAlgorithm(a);
  ASSERT_TRUE(ppo.ok()) << ppo.status();
  EXPECT_TRUE(ppo->needs.critic && ppo->needs.reference && ppo->needs.teacher_pass &&
              ppo->needs.old_actor_copy && ppo->needs.rollout_log_probs);
  EXPECT_FALSE(ppo->needs.teacher_in_batch);
  EXPECT_TRUE(ppo->estimator->always_old_log_probs);

  // The SFT loss reads only the current log-probs: every option of the RL pipeline is ignored.
  a.loss_type = "sft_loss";
  auto sft = SelectAlgorithm(a);
  ASSERT_TRUE(sft.ok()) << sft.status();
  EXPECT_FALSE(sft->loss->needs.entropy);
  EXPECT_FALSE(sft->needs.advantages || sft->needs.critic || sft->needs.reference ||
               sft->needs.teacher_pass || sft->needs.old_actor_copy ||
               sft->needs.rollout_log_probs);

  a.loss_type = "policy_loss";
  a.opd_type = "sglang";
  a.advantage_estimator = "gspo";
  auto gspo = SelectAlgorithm(a);
  ASSERT_TRUE(gspo.ok()) << gspo.status();
  EXPECT_TRUE(gspo->needs.teacher_in_batch);
  EXPECT_FALSE(gspo->needs.teacher_pass || gspo->needs.critic);
  EXPECT_EQ(gspo->estimator->objective, PolicyObjective::kGspo);
}

}  // namespace
}  // namespace slime::train
