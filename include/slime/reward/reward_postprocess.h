// Reward post-processing (reward shaping) without LibTorch: slime's
// RolloutManager._post_process_rewards (docs/algorithms.md, "Reward post-processing"). The
// rollout coordinator runs it on the CPU before samples are shipped to the trainers; this is the
// one implementation (the trainer receives r̃ in data::TrainSample::reward).
//
// What an estimator asks for is a column of config/algorithms.h (group_mean_baseline,
// group_std_scaling); today:
//   grpo, gspo, cispo (rewards_normalization on):
//       r̃ = (r − mean_g) / (std_g + 1e-6)  with std_g the unbiased (n − 1) sample std;
//       grpo_std_normalization off (Dr.GRPO): r̃ = r − mean_g.
//   reinforce_plus_plus_baseline (rewards_normalization on): r̃ = r − mean_g.
//   ppo, reinforce_plus_plus, or rewards_normalization off: r̃ = r.
// Groups are consecutive runs of n_samples_per_prompt rewards when there are exactly
// rollout_batch_size × n_samples_per_prompt of them; otherwise (dynamic filtering kept fewer
// groups, a custom rollout returned more) the whole batch is one group, as slime does.
// A group of one reward has std 0 (slime's torch.std would give NaN), so its r̃ is 0.
// Computed in double.
//
// Thread-safety: pure functions.
#ifndef SLIME_REWARD_REWARD_POSTPROCESS_H_
#define SLIME_REWARD_REWARD_POSTPROCESS_H_

#include <string>
#include <string_view>
#include <vector>

#include "slime/common/status.h"

namespace slime::reward {

// What the estimator and options imply for one group.
enum class GroupRewardNormalization {
  kNone,     // r̃ = r
  kMean,     // r̃ = r − mean
  kMeanStd,  // r̃ = (r − mean) / (std + epsilon)
};

struct GroupRewardOptions {
  // AlgorithmConfig::advantage_estimator: a name of config::kAdvantageEstimators.
  std::string advantage_estimator = "grpo";
  bool rewards_normalization = true;   // false: slime's --disable-rewards-normalization
  bool grpo_std_normalization = true;  // false: Dr.GRPO (mean only)
  int n_samples_per_prompt = 1;        // >= 1
  int rollout_batch_size = 0;          // prompts per rollout, >= 0
  double std_epsilon = 1e-6;           // slime's constant
};

// The normalization for these options. Error: an unknown estimator (the message lists them).
StatusOr<GroupRewardNormalization> GroupRewardNormalizationFor(const GroupRewardOptions& options);

struct NormalizedRewards {
  std::vector<double> rewards;         // r̃_i, same order as the input
  int group_size = 0;                  // n, the whole batch, or 0 when the rewards are unchanged
  bool whole_batch_one_group = false;  // the count was not rollout_batch_size × n (warned)
};

// Errors: n_samples_per_prompt < 1, rollout_batch_size < 0, an unknown estimator, a non-finite
// reward (the message names its index).
StatusOr<NormalizedRewards> NormalizeGroupRewards(const std::vector<double>& raw_rewards,
                                                  const GroupRewardOptions& options);

// The unbiased (n − 1) sample std of `values` (torch.std's default); 0 for fewer than two
// values. Also used by the rollout's dynamic-sampling filter.
double SampleStd(const std::vector<double>& values);

}  // namespace slime::reward

#endif  // SLIME_REWARD_REWARD_POSTPROCESS_H_
