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

// eval/<name>… metrics of one eval dataset (rewards read from Sample::reward).
MetricMap EvalMetrics(const std::string& name, const std::vector<data::SampleGroup>& groups);

}  // namespace slime::rollout

#endif  // SLIME_ROLLOUT_METRICS_H_
