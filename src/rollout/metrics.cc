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

namespace {

// metadata.round_number when a number, else the runs of model tokens (loss-mask 1).
double RoundNumber(const data::Sample& s) {
  auto it = s.metadata.find("round_number");
  if (it != s.metadata.end() && it->is_number()) return it->get<double>();
  double runs = 0;
  uint8_t previous = 0;
  for (uint8_t m : s.loss_mask) {
    if (m != 0 && previous == 0) ++runs;
    previous = m;
  }
  return runs;
}

void MeanMaxMin(const std::string& prefix, const std::vector<double>& v, MetricMap& out) {
  out[prefix + "_mean"] = Mean(v);
  out[prefix + "_max"] = *std::max_element(v.begin(), v.end());
  out[prefix + "_min"] = *std::min_element(v.begin(), v.end());
}

std::string Category(const data::Sample& s, const std::string& key) {
  const nlohmann::json* value = nullptr;
  if (s.raw_reward.is_object() && s.raw_reward.contains(key)) {
    value = &s.raw_reward.at(key);
  }
  nlohmann::json from_metadata;
  if (value == nullptr && s.metadata.contains(key)) {
    from_metadata = nlohmann::json::parse(s.metadata.at(key).dump());
    value = &from_metadata;
  }
  if (value == nullptr) return "unknown";
  return value->is_string() ? value->get<std::string>() : value->dump();
}

}  // namespace

MetricMap LoggedSampleMetrics(const std::vector<data::SampleGroup>& groups,
                              const LoggedMetricOptions& options) {
  MetricMap out;
  std::vector<const data::Sample*> samples;
  for (const auto& g : groups) {
    for (const auto& s : g) samples.push_back(&s);
  }
  if (samples.empty()) return out;
  const double n = static_cast<double>(samples.size());
  if (options.multi_turn) {
    std::vector<double> raw, wo_obs, rounds;
    double clipped = 0;
    for (const data::Sample* s : samples) {
      raw.push_back(static_cast<double>(s->response_length));
      double model_tokens = 0;
      for (uint8_t m : s->loss_mask) model_tokens += m;
      wo_obs.push_back(model_tokens);
      rounds.push_back(RoundNumber(*s));
      clipped += options.max_response_len > 0 && s->response_length >= options.max_response_len;
    }
    MeanMaxMin("multi_turn/raw_response_length/response_length", raw, out);
    out["multi_turn/raw_response_length/response_length_clip_ratio"] = clipped / n;
    MeanMaxMin("multi_turn/wo_obs_response_length/response_length", wo_obs, out);
    MeanMaxMin("multi_turn/multi_turn_metric/round_number", rounds, out);
  }
  if (options.correct_samples) {
    // Quarters of max_response_len L (unset: the longest correct response): bin k holds the
    // lengths in (k/4·L, (k+1)/4·L], bin 0 from 0 and bin 3 everything above 3/4·L.
    int64_t longest = 1;
    for (const data::Sample* s : samples) {
      if (s->reward == 1.0) longest = std::max(longest, s->response_length);
    }
    const double limit =
        static_cast<double>(options.max_response_len > 0 ? options.max_response_len : longest);
    double bins[4] = {0, 0, 0, 0};
    double correct = 0;
    for (const data::Sample* s : samples) {
      if (s->reward != 1.0) continue;
      ++correct;
      const double length = static_cast<double>(s->response_length);
      int bin = 3;
      for (int k = 0; k < 3; ++k) {
        if (length <= limit * (k + 1) / 4.0) {
          bin = k;
          break;
        }
      }
      bins[bin] += 1;
    }
    const char* names[4] = {"p25", "p50", "p75", "p100"};
    for (int k = 0; k < 4; ++k) {
      out[std::string("rollout/correct_length/") + names[k]] = correct > 0 ? bins[k] / correct : 0;
    }
  }
  if (!options.reward_category.empty()) {
    std::map<std::string, std::pair<double, double>> by_category;  // count, reward sum
    for (const data::Sample* s : samples) {
      auto& c = by_category[Category(*s, options.reward_category)];
      c.first += 1;
      c.second += s->reward;
    }
    for (const auto& [category, c] : by_category) {
      out["rollout/error_cat/" + category] = c.first / n;
      out["rollout/reward_cat/" + category + "/raw_reward"] = c.second / c.first;
    }
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
