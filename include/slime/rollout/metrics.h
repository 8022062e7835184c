// Rollout and eval metrics under slime's names (docs/algorithms.md, "Metrics"),
// computed from finished samples. Pure functions; torch-free.
//
//   rollout/raw_reward                  mean scalar reward (Sample::reward) of the kept samples
//   rollout/rewards                     mean post-processed reward
//   rollout/response_len/{mean,median,max,min}
//                                       effective response length = Σ loss_mask (slime)
//   rollout/response_lengths            mean response_length (all response tokens)
//   rollout/truncated_ratio             share of samples whose status is truncated
//   rollout/zero_std/count_<r>          groups whose rewards are all equal to r (non-ppo)
//   passrate/pass@k                     k = 1, 2, 4, … ≤ n (with metrics.log_passrate)
//   eval/<name>, eval/<name>-truncated_ratio, eval/<name>-pass@k,
//   eval/<name>/response_len/mean
// The opt-in families (LoggedSampleMetrics):
//   metrics.log_multi_turn (slime's keys):
//     multi_turn/raw_response_length/response_length_{mean,max,min}   response_length (tool
//                                          and environment tokens included)
//     multi_turn/raw_response_length/response_length_clip_ratio      share with
//                                          response_length >= rollout.max_response_len
//     multi_turn/wo_obs_response_length/response_length_{mean,max,min}   Σ loss_mask (model
//                                          tokens only)
//     multi_turn/multi_turn_metric/round_number_{mean,max,min}       metadata.round_number when
//                                          a number, else the runs of model tokens (loss-mask 1)
//   metrics.log_correct_samples: rollout/correct_length/p25, p50, p75, p100 — of the correct
//     samples (reward == 1, slime), the share whose response_length falls in each quarter of
//     rollout.max_response_len (p100: above 3/4; unset limit: the longest correct response);
//     0 without correct samples.
//     (correct_entropy comes from the trainer: rollout/trainer/correct_entropy.)
//   metrics.log_reward_category KEY: rollout/error_cat/<category> — the share of samples per
//     category (slime), and rollout/reward_cat/<category>/raw_reward, their mean reward. A
//     sample's category is raw_reward[KEY] when the reward function returned a mapping with
//     KEY, else metadata[KEY], else "unknown"; strings as they are, other JSON values dumped.
// (the coordinator adds rollout/dynamic_filter/drop_<reason>, perf/rollout_time and
// perf/*tokens_per_sec itself).
#ifndef SLIME_ROLLOUT_METRICS_H_
#define SLIME_ROLLOUT_METRICS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "slime/data/sample.h"

namespace slime::rollout {

using MetricMap = std::map<std::string, double>;

// Python's str() of a float for metric keys and reasons: 1.0 → "1.0", -1.0 → "-1.0",
// 0.25 → "0.25".
std::string PyFloatString(double v);

// Unbiased pass@k of one prompt with n samples of which c are correct:
// 1 − C(n−c, k) / C(n, k) (1 when n − c < k). Requires 1 <= k <= n.
double PassAtK(int64_t n, int64_t c, int64_t k);

// Mean pass@k over groups for k = 1, 2, 4, … up to the smallest group size; a sample is
// correct when its reward == 1 (slime). Keys "pass@<k>".
MetricMap PassRates(const std::vector<data::SampleGroup>& groups);

// The rollout/* sample metrics above for the kept groups. `rewards` are the post-processed
// rewards in flattened group order (may be empty). `zero_std` adds rollout/zero_std/*.
MetricMap RolloutSampleMetrics(const std::vector<data::SampleGroup>& groups,
                               const std::vector<double>& rewards, bool zero_std,
                               bool log_passrate);

struct LoggedMetricOptions {
  bool multi_turn = false;         // metrics.log_multi_turn
  bool correct_samples = false;    // metrics.log_correct_samples
  std::string reward_category;     // metrics.log_reward_category; "" = off
  int64_t max_response_len = 0;    // rollout.max_response_len, 0 = unset (clip ratio, bins)
};

// The opt-in families above for the kept groups (empty when none is on or there are no samples).
MetricMap LoggedSampleMetrics(const std::vector<data::SampleGroup>& groups,
                              const LoggedMetricOptions& options);

// eval/<name>… metrics of one eval dataset (rewards read from Sample::reward).
MetricMap EvalMetrics(const std::string& name, const std::vector<data::SampleGroup>& groups);

}  // namespace slime::rollout

#endif  // SLIME_ROLLOUT_METRICS_H_
