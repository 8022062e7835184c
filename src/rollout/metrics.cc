// Rollout and eval metrics (metrics.h).
#include "slime/rollout/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace slime::rollout {

std::string PyFloatString(double v) {
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 1e16) {
    return fmt::format("{:.1f}", v);
  }
  return fmt::format("{}", v);
}

double PassAtK(int64_t n, int64_t c, int64_t k) {
  if (n - c < k) return 1.0;
  // 1 − Π_{i=n−c+1}^{n} (1 − k / i)
  double prod = 1.0;
  for (int64_t i = n - c + 1; i <= n; ++i) prod *= 1.0 - static_cast<double>(k) / i;
  return 1.0 - prod;
}

MetricMap PassRates(const std::vector<data::SampleGroup>& groups) {
  MetricMap out;
  if (groups.empty()) return out;
  size_t n_min = groups.front().size();
  for (const auto& g : groups) n_min = std::min(n_min, g.size());
  for (int64_t k = 1; k <= static_cast<int64_t>(n_min); k *= 2) {
    double sum = 0;
    for (const auto& g : groups) {
      int64_t c = 0;
      for (const auto& s : g) c += s.reward == 1.0 ? 1 : 0;
      sum += PassAtK(static_cast<int64_t>(g.size()), c, k);
    }
    out[fmt::format("pass@{}", k)] = sum / static_cast<double>(groups.size());
  }
  return out;
}

namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : (v[m - 1] + v[m]) / 2;
}

double Mean(const std::vector<double>& v) {
  if (v.empty()) return 0;
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

}  // namespace

MetricMap RolloutSampleMetrics(const std::vector<data::SampleGroup>& groups,
                               const std::vector<double>& rewards, bool zero_std,
                               bool log_passrate) {
  MetricMap out;
  std::vector<double> raw, effective, lengths;
  int64_t truncated = 0;
  for (const auto& g : groups) {
    for (const auto& s : g) {
      raw.push_back(s.reward);
      double eff = 0;
      for (uint8_t m : s.loss_mask) eff += m;
      effective.push_back(eff);
      lengths.push_back(static_cast<double>(s.response_length));
      truncated += s.status == data::SampleStatus::kTruncated ? 1 : 0;
    }
    if (zero_std && !g.empty()) {
      bool all_equal = true;
      for (const auto& s : g) all_equal = all_equal && s.reward == g.front().reward;
      if (all_equal) out["rollout/zero_std/count_" + PyFloatString(g.front().reward)] += 1;
    }
  }
  if (raw.empty()) return out;
  out["rollout/raw_reward"] = Mean(raw);
  if (!rewards.empty()) out["rollout/rewards"] = Mean(rewards);
  out["rollout/response_len/mean"] = Mean(effective);
  out["rollout/response_len/median"] = Median(effective);
  out["rollout/response_len/max"] = *std::max_element(effective.begin(), effective.end());
  out["rollout/response_len/min"] = *std::min_element(effective.begin(), effective.end());
  out["rollout/response_lengths"] = Mean(lengths);
  out["rollout/truncated_ratio"] = static_cast<double>(truncated) / static_cast<double>(raw.size());
  if (log_passrate) {
    for (const auto& [k, v] : PassRates(groups)) out["passrate/" + k] = v;
  }
  return out;
}

MetricMap EvalMetrics(const std::string& name, const std::vector<data::SampleGroup>& groups) {
  MetricMap out;
  std::vector<double> rewards, lengths;
  int64_t truncated = 0;
  for (const auto& g : groups) {
    for (const auto& s : g) {
      rewards.push_back(s.reward);
      lengths.push_back(static_cast<double>(s.response_length));
      truncated += s.status == data::SampleStatus::kTruncated ? 1 : 0;
    }
  }
  if (rewards.empty()) return out;
  out["eval/" + name] = Mean(rewards);
  out["eval/" + name + "-truncated_ratio"] =
      static_cast<double>(truncated) / static_cast<double>(rewards.size());
  out["eval/" + name + "/response_len/mean"] = Mean(lengths);
  for (const auto& [k, v] : PassRates(groups)) out["eval/" + name + "-" + k] = v;
  return out;
}

}  // namespace slime::rollout
