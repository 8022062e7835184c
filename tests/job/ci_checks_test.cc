// debug.ci_test's assertions and the grad-norm records (src/job/ci_checks.h): each check passes
// on good values, fails naming the metric and the key on a bad one, and stays quiet where slime's
// does (later steps, later rollouts, ci_disable_kl_checker, ci_test off).
#include "ci_checks.h"  // src/job (internal to the job module)

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "remove_tree.h"

namespace slime::job {
namespace {

config::DebugConfig CiOn() {
  config::DebugConfig d;
  d.ci_test = true;
  return d;
}

TrainStepReport Step(int64_t step, int64_t in_rollout, std::map<std::string, double> values) {
  return TrainStepReport{step, in_rollout, std::move(values)};
}

::testing::AssertionResult FailsNaming(const Status& s, const std::vector<std::string>& parts) {
  if (s.ok()) return ::testing::AssertionFailure() << "expected an error";
  for (const std::string& p : parts) {
    if (s.message().find(p) == std::string_view::npos) {
      return ::testing::AssertionFailure() << "\"" << p << "\" not in: " << s.message();
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(CiChecks, PassOnAMatchedFirstStep) {
  const std::map<std::string, double> rollout = {{"log_probs", -2.5}, {"ref_log_probs", -2.5}};
  EXPECT_TRUE(RunCiChecks(CiOn(), 0,
                          {Step(0, 0, {{"ppo_kl", 0.0}, {"pg_clipfrac", 0.0}, {"kl_loss", 0.0},
                                       {"train_rollout_logprob_abs_diff", 0.02}})},
                          rollout)
                  .ok());
}

TEST(CiChecks, FirstStepKlMustBeBelowTheBound) {
  Status s = RunCiChecks(CiOn(), 3, {Step(7, 0, {{"ppo_kl", 1e-3}, {"pg_clipfrac", 0.0}})}, {});
  EXPECT_TRUE(FailsNaming(s, {"debug.ci_test: rollout 3, step 7", "|train/ppo_kl| = 0.001",
                              "debug.ci_kl_threshold = 1e-08"}));
  // Only the rollout's first step, and only with pg_clipfrac logged (slime's condition).
  EXPECT_TRUE(RunCiChecks(CiOn(), 3, {Step(8, 1, {{"ppo_kl", 1e-3}, {"pg_clipfrac", 0.0}})}, {}).ok());
  EXPECT_TRUE(RunCiChecks(CiOn(), 3, {Step(7, 0, {{"ppo_kl", 1e-3}})}, {}).ok());
  // kl_loss on the run's first step only.
  s = RunCiChecks(CiOn(), 0, {Step(0, 0, {{"kl_loss", -2e-8}})}, {});
  EXPECT_TRUE(FailsNaming(s, {"|train/kl_loss| = 2e-08", "run's first step"}));
  EXPECT_TRUE(RunCiChecks(CiOn(), 1, {Step(1, 0, {{"kl_loss", 0.5}})}, {}).ok());
  // A bound of 0 fails even an exact 0 (how a test forces the failure path).
  config::DebugConfig zero = CiOn();
  zero.ci_kl_threshold = 0.0;
  EXPECT_FALSE(RunCiChecks(zero, 0, {Step(0, 0, {{"kl_loss", 0.0}})}, {}).ok());
  // ci_disable_kl_checker and ci_test off turn the KL checks off.
  config::DebugConfig off = zero;
  off.ci_disable_kl_checker = true;
  EXPECT_TRUE(RunCiChecks(off, 0, {Step(0, 0, {{"kl_loss", 1.0}, {"ppo_kl", 1.0},
                                               {"pg_clipfrac", 0.0}})},
                          {{"log_probs", -1.0}, {"ref_log_probs", -3.0}})
                  .ok());
  EXPECT_TRUE(RunCiChecks(config::DebugConfig{}, 0, {Step(0, 0, {{"kl_loss", 1.0}})}, {}).ok());
}

TEST(CiChecks, TrainRolloutLogProbGapIsBoundedOnEveryStep) {
  Status s = RunCiChecks(CiOn(), 2,
                         {Step(4, 0, {{"train_rollout_logprob_abs_diff", 0.05}}),
                          Step(5, 1, {{"train_rollout_logprob_abs_diff", 0.25}})},
                         {});
  EXPECT_TRUE(FailsNaming(s, {"rollout 2, step 5 (step 1 of the rollout)",
                              "train/train_rollout_logprob_abs_diff = 0.25",
                              "debug.ci_train_rollout_logprob_abs_diff_threshold = 0.1"}));
  config::DebugConfig loose = CiOn();
  loose.ci_train_rollout_logprob_abs_diff_threshold = 0.5;
  EXPECT_TRUE(RunCiChecks(loose, 2, {Step(5, 1, {{"train_rollout_logprob_abs_diff", 0.25}})}, {}).ok());
}

TEST(CiChecks, RolloutZeroLogProbsMatchTheReference) {
  Status s = RunCiChecks(CiOn(), 0, {}, {{"log_probs", -2.5}, {"ref_log_probs", -2.4}});
  EXPECT_TRUE(FailsNaming(s, {"rollout/log_probs = -2.5", "rollout/ref_log_probs = -2.4"}));
  EXPECT_TRUE(RunCiChecks(CiOn(), 1, {}, {{"log_probs", -2.5}, {"ref_log_probs", -2.4}}).ok());
}

TEST(CiChecks, GradNormsAreSavedThenComparedWithinOnePercent) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("slime_ci_checks_" + std::to_string(::getpid()));
  testing::RemoveTree(dir);
  const std::string pattern = (dir / "{role}/{rollout_id}_{step_id}.txt").string();
  EXPECT_EQ(GradNormPath(pattern, "actor", 3, 1), (dir / "actor/3_1.txt").string());
  config::DebugConfig save;  // independent of ci_test
  save.ci_save_grad_norm = pattern;
  ASSERT_TRUE(RunCiChecks(save, 3,
                          {Step(6, 0, {{"grad_norm", 2.0}, {"critic_grad_norm", 5.0}}),
                           Step(7, 1, {{"grad_norm", 4.0}})},
                          {})
                  .ok());
  std::ifstream in(dir / "critic/3_0.txt");
  double v = 0;
  in >> v;
  EXPECT_EQ(v, 5.0);

  config::DebugConfig load;
  load.ci_load_grad_norm = pattern;
  EXPECT_TRUE(RunCiChecks(load, 3, {Step(7, 1, {{"grad_norm", 4.03}})}, {}).ok());
  Status s = RunCiChecks(load, 3, {Step(7, 1, {{"grad_norm", 4.1}})}, {});
  EXPECT_TRUE(FailsNaming(s, {"debug.ci_load_grad_norm: rollout 3 step 1 (actor)",
                              "train/grad_norm = 4.1", "saved 4", "1%"}));
  s = RunCiChecks(load, 9, {Step(7, 0, {{"grad_norm", 1.0}})}, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  testing::RemoveTree(dir);
}

}  // namespace
}  // namespace slime::job
