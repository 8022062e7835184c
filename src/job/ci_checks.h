// slime's CI assertions on a training call's metrics (internal to the job module):
// debug.ci_test and the debug.ci_* keys. The driver runs them on rank 0's train reply after
// every rollout; a violated one fails the job with an error naming the metric, its value, the
// bound and the key that sets it.
//
// With debug.ci_test:
//   every step      train_rollout_logprob_abs_diff <= ci_train_rollout_logprob_abs_diff_threshold
//                   (the trainer's log-probs against the engines', when the batch has them)
//   unless debug.ci_disable_kl_checker (the policies of train and rollout match at the start):
//   first step of each rollout   |ppo_kl| < ci_kl_threshold (slime: when pg_clipfrac is logged)
//   first step of the run        |kl_loss| < ci_kl_threshold (the reference is the actor)
//   rollout 0                    |log_probs − ref_log_probs| < ci_kl_threshold (rollout means)
// slime's further model-specific range checks (−1 < log_probs < 0, 0 < entropy < 1) are not
// made: they hold for trained models, not for the random ones of tests.
// Independently of ci_test, per step and role ("actor": grad_norm; "critic": critic_grad_norm):
//   debug.ci_save_grad_norm  writes the value to the template's file ({role}, {rollout_id},
//                            {step_id} = the step within the rollout), "%.17g\n", atomically;
//   debug.ci_load_grad_norm  reads it back and requires |value − saved| <= 1% of |saved|.
//
// Thread-safety: free functions; the files are written and read by one caller at a time.
#ifndef SLIME_SRC_JOB_CI_CHECKS_H_
#define SLIME_SRC_JOB_CI_CHECKS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "slime/common/status.h"
#include "slime/config/config.h"

namespace slime::job {

// One optimizer step as the trainer reported it (workers.h's Train reply).
struct TrainStepReport {
  int64_t step = 0;             // the run's optimizer step counter before this step
  int64_t step_in_rollout = 0;  // 0-based
  std::map<std::string, double> values;  // slime's names without "train/": ppo_kl, kl_loss, ...
};

// The checks above for one rollout's training call. `rollout_values` are the trainer's
// rollout-side means (log_probs, ref_log_probs, ...). FailedPrecondition for a violated check,
// NotFound / DataLoss for a missing or unreadable saved grad norm, an I/O error for a failed save.
Status RunCiChecks(const config::DebugConfig& debug, int64_t rollout_id,
                   const std::vector<TrainStepReport>& steps,
                   const std::map<std::string, double>& rollout_values);

// `pattern` with {role}, {rollout_id} and {step_id} replaced.
std::string GradNormPath(const std::string& pattern, const std::string& role, int64_t rollout_id,
                         int64_t step_id);

}  // namespace slime::job

#endif  // SLIME_SRC_JOB_CI_CHECKS_H_
