// Reward post-processing without LibTorch (reward_postprocess.h).
#include "slime/reward/reward_postprocess.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cmath>

#include "slime/config/algorithms.h"

namespace slime::reward {

StatusOr<GroupRewardNormalization> GroupRewardNormalizationFor(const GroupRewardOptions& options) {
  const config::AdvantageEstimatorInfo* estimator =
      config::FindAdvantageEstimator(options.advantage_estimator);
  if (estimator == nullptr) {
    return absl::InvalidArgumentError(fmt::format(
        "advantage_estimator '{}' is not known: use one of {}", options.advantage_estimator,
        config::JoinNames(config::AdvantageEstimatorNames())));
  }
  if (!options.rewards_normalization || !estimator->group_mean_baseline) {
    return GroupRewardNormalization::kNone;
  }
  return estimator->group_std_scaling && options.grpo_std_normalization
             ? GroupRewardNormalization::kMeanStd
             : GroupRewardNormalization::kMean;
}

double SampleStd(const std::vector<double>& values) {
  if (values.size() < 2) return 0.0;
  double sum = 0;
  for (double v : values) sum += v;
  const double mean = sum / static_cast<double>(values.size());
  double squares = 0;
  for (double v : values) squares += (v - mean) * (v - mean);
  return std::sqrt(squares / static_cast<double>(values.size() - 1));
}

StatusOr<NormalizedRewards> NormalizeGroupRewards(const std::vector<double>& raw_rewards,
                                                  const GroupRewardOptions& options) {
  if (options.n_samples_per_prompt < 1) {
    return absl::InvalidArgumentError(fmt::format(
        "n_samples_per_prompt = {} is out of range: must be >= 1", options.n_samples_per_prompt));
  }
  if (options.rollout_batch_size < 0) {
    return absl::InvalidArgumentError(fmt::format(
        "rollout_batch_size = {} is out of range: must be >= 0", options.rollout_batch_size));
  }
  SLIME_ASSIGN_OR_RETURN(GroupRewardNormalization mode, GroupRewardNormalizationFor(options));
  for (size_t i = 0; i < raw_rewards.size(); ++i) {
    if (!std::isfinite(raw_rewards[i])) {
      return absl::InvalidArgumentError(
          fmt::format("reward of sample {} is {}: rewards must be finite", i, raw_rewards[i]));
    }
  }
  NormalizedRewards out;
  out.rewards = raw_rewards;
  if (mode == GroupRewardNormalization::kNone || raw_rewards.empty()) return out;

  const size_t n = static_cast<size_t>(options.n_samples_per_prompt);
  const size_t expected = n * static_cast<size_t>(options.rollout_batch_size);
  size_t group = n;
  if (raw_rewards.size() != expected) {
    group = raw_rewards.size();
    out.whole_batch_one_group = true;
    spdlog::warn(
        "rewards: {} rewards is not rollout_batch_size ({}) x n_samples_per_prompt ({}) = {}; "
        "normalizing the whole batch as one group (as slime does)",
        raw_rewards.size(), options.rollout_batch_size, n, expected);
  }
  out.group_size = static_cast<int>(group);
  for (size_t start = 0; start < raw_rewards.size(); start += group) {
    std::vector<double> g(raw_rewards.begin() + start, raw_rewards.begin() + start + group);
    double sum = 0;
    for (double v : g) sum += v;
    const double mean = sum / static_cast<double>(group);
    const double scale = mode == GroupRewardNormalization::kMeanStd
                             ? 1.0 / (SampleStd(g) + options.std_epsilon)
                             : 1.0;
    for (size_t k = 0; k < group; ++k) out.rewards[start + k] = (g[k] - mean) * scale;
  }
  return out;
}

}  // namespace slime::reward
