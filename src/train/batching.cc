// Micro-batch scheduling (see include/slime/train/batching.h).
#include "slime/train/batching.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_map>
#include <utility>

#include "slime/common/check.h"

namespace slime::train {
namespace {

// The token cap of a dynamic micro-batch.
int64_t TokenCap(const BatchingOptions& o) {
  return *o.max_tokens_per_gpu * o.context_parallel_size;
}

bool BalanceAcrossRanks(const BatchingOptions& o) { return o.balance_data || o.balance_by_flops; }

Status CheckSamples(std::span<const int64_t> samples, std::span<const int64_t> token_counts) {
  if (samples.empty()) return absl::InvalidArgumentError("a step needs at least one sample");
  for (int64_t s : samples) {
    if (s < 0 || s >= static_cast<int64_t>(token_counts.size())) {
      return absl::InvalidArgumentError(fmt::format(
          "sample index {} is outside the rollout's {} samples", s, token_counts.size()));
    }
    if (token_counts[s] < 1) {
      return absl::InvalidArgumentError(fmt::format(
          "sample {} has {} tokens; every sample needs at least one", s, token_counts[s]));
    }
  }
  return absl::OkStatus();
}

MicroBatch MakeMicroBatch(std::vector<int64_t> samples, std::span<const int64_t> token_counts,
                          const BatchingOptions& o) {
  std::sort(samples.begin(), samples.end());
  MicroBatch mb;
  for (int64_t s : samples) {
    mb.tokens += token_counts[s];
    mb.cost += SampleCost(o, token_counts[s]);
  }
  mb.samples = std::move(samples);
  return mb;
}

void WarnOversized(int64_t sample, int64_t tokens, int64_t cap) {
  spdlog::warn(
      "train: sample {} has {} tokens, more than the micro-batch cap max_tokens_per_gpu × "
      "context_parallel_size = {}; it gets a micro-batch of its own",
      sample, tokens, cap);
}

// First-fit in sample order: each sample goes to the first micro-batch it fits in.
std::vector<MicroBatch> FirstFit(std::span<const int64_t> samples,
                                 std::span<const int64_t> token_counts, const BatchingOptions& o) {
  const int64_t cap = TokenCap(o);
  std::vector<std::vector<int64_t>> bins;
  std::vector<int64_t> bin_tokens;
  for (int64_t s : samples) {
    const int64_t t = token_counts[s];
    if (t > cap) {
      // Alone: any addition would exceed the cap, so first-fit never adds to this bin.
      WarnOversized(s, t, cap);
      bins.push_back({s});
      bin_tokens.push_back(t);
      continue;
    }
    size_t b = 0;
    while (b < bins.size() && bin_tokens[b] + t > cap) ++b;
    if (b == bins.size()) {
      bins.emplace_back();
      bin_tokens.push_back(0);
    }
    bins[b].push_back(s);
    bin_tokens[b] += t;
  }
  std::vector<MicroBatch> out;
  out.reserve(bins.size());
  for (auto& bin : bins) out.push_back(MakeMicroBatch(std::move(bin), token_counts, o));
  return out;
}

// Karmarkar–Karp by cost into as few micro-batches as keep every multi-sample micro-batch
// within the token cap: start from the first-fit count and add one micro-batch until it holds.
// Oversized samples get their own micro-batches and take no part in the partition.
std::vector<MicroBatch> PackByFlops(std::span<const int64_t> samples,
                                    std::span<const int64_t> token_counts,
                                    const BatchingOptions& o) {
  const int64_t cap = TokenCap(o);
  std::vector<MicroBatch> out;
  std::vector<int64_t> rest;
  for (int64_t s : samples) {
    if (token_counts[s] > cap) {
      WarnOversized(s, token_counts[s], cap);
      out.push_back(MakeMicroBatch({s}, token_counts, o));
    } else {
      rest.push_back(s);
    }
  }
  if (rest.empty()) return out;
  std::vector<double> costs;
  costs.reserve(rest.size());
  for (int64_t s : rest) costs.push_back(SampleCost(o, token_counts[s]));
  const auto first_fit = FirstFit(rest, token_counts, o);
  for (auto k = static_cast<int64_t>(first_fit.size());; ++k) {
    // k <= rest.size() always succeeds (one sample per micro-batch), so the loop ends.
    auto parts = KarmarkarKarpPartition(costs, k, /*equal_size=*/false);
    SLIME_CHECK(parts.ok(), "{}", parts.status().ToString());
    std::vector<MicroBatch> packed;
    bool fits = true;
    for (const auto& part : *parts) {
      if (part.empty()) continue;
      std::vector<int64_t> members;
      for (int64_t i : part) members.push_back(rest[i]);
      packed.push_back(MakeMicroBatch(std::move(members), token_counts, o));
      if (packed.back().samples.size() > 1 && packed.back().tokens > cap) fits = false;
    }
    if (!fits) continue;
    // Deterministic order: by first sample.
    std::sort(packed.begin(), packed.end(), [](const MicroBatch& a, const MicroBatch& b) {
      return a.samples.front() < b.samples.front();
    });
    for (auto& mb : packed) out.push_back(std::move(mb));
    return out;
  }
}

// One partial partition of the KK algorithm: k subsets with their cost sums.
struct PartialPartition {
  std::vector<std::vector<int64_t>> sets;
  std::vector<double> sums;
  int64_t order = 0;  // creation order; breaks ties between equal spreads
  double spread() const {
    auto [lo, hi] = std::minmax_element(sums.begin(), sums.end());
    return *hi - *lo;
  }
};

}  // namespace

double EstimateForwardFlops(const FlopsModel& m, int64_t tokens) {
  const double L = static_cast<double>(tokens);
  const double h = static_cast<double>(m.hidden_size);
  const double q = static_cast<double>(m.num_attention_heads * m.head_dim);
  const double kv = static_cast<double>(m.num_key_value_heads * m.head_dim);
  const double f = static_cast<double>(m.intermediate_size);
  const double layers = static_cast<double>(m.num_layers);
  const double sparse = static_cast<double>(m.sparse_layers);
  const double active = static_cast<double>(m.experts_per_token * m.moe_intermediate_size);
  const double linear = layers * (2 * h * (q + 2 * kv) + 2 * q * h) +
                        (layers - sparse) * 6 * h * f +
                        sparse * (2 * h * static_cast<double>(m.num_experts) + 6 * h * active) +
                        2 * h * m.vocab_size;
  const double quadratic = 2 * layers * q;
  return linear * L + quadratic * L * L;
}

Status ValidateBatchingOptions(const BatchingOptions& o) {
  auto bad = [](const std::string& msg) { return absl::InvalidArgumentError(msg); };
  if (o.global_batch_size < 1) {
    return bad(fmt::format("global_batch_size must be >= 1, got {}", o.global_batch_size));
  }
  if (o.micro_batch_size < 1) {
    return bad(fmt::format("micro_batch_size must be >= 1, got {}", o.micro_batch_size));
  }
  if (o.context_parallel_size < 1) {
    return bad(fmt::format("context_parallel_size must be >= 1, got {}", o.context_parallel_size));
  }
  if (o.data_parallel_size < 1) {
    return bad(fmt::format("data_parallel_size must be >= 1, got {}", o.data_parallel_size));
  }
  if (o.use_dynamic_batch_size && (!o.max_tokens_per_gpu || *o.max_tokens_per_gpu < 1)) {
    return bad("use_dynamic_batch_size requires max_tokens_per_gpu >= 1");
  }
  if (o.balance_by_flops && !o.use_dynamic_batch_size) {
    return bad("balance_by_flops requires use_dynamic_batch_size");
  }
  if (o.flops_model) {
    const FlopsModel& m = *o.flops_model;
    if (m.num_layers < 1 || m.hidden_size < 1 || m.num_attention_heads < 1 ||
        m.num_key_value_heads < 1 || m.head_dim < 1 || m.intermediate_size < 1 ||
        m.vocab_size < 1) {
      return bad("every flops_model dimension must be >= 1");
    }
  }
  return absl::OkStatus();
}

double SampleCost(const BatchingOptions& o, int64_t tokens) {
  return o.flops_model ? EstimateForwardFlops(*o.flops_model, tokens) : static_cast<double>(tokens);
}

int64_t PaddedTokens(int64_t tokens, int64_t tp_size, int64_t pad_multiplier) {
  const int64_t m = std::max<int64_t>(1, tp_size * pad_multiplier);
  return (tokens + m - 1) / m * m;
}

StatusOr<StepSplit> SplitIntoSteps(std::span<const int64_t> rollout_ids,
                                   int64_t global_batch_size) {
  if (global_batch_size < 1) {
    return absl::InvalidArgumentError(
        fmt::format("global_batch_size must be >= 1, got {}", global_batch_size));
  }
  // Rollouts in order of their first sample, each with its samples.
  std::unordered_map<int64_t, size_t> slot;
  std::vector<std::vector<int64_t>> rollouts;
  for (size_t i = 0; i < rollout_ids.size(); ++i) {
    auto [it, inserted] = slot.emplace(rollout_ids[i], rollouts.size());
    if (inserted) rollouts.emplace_back();
    rollouts[it->second].push_back(static_cast<int64_t>(i));
  }
  const auto num_rollouts = static_cast<int64_t>(rollouts.size());
  const int64_t num_steps = num_rollouts / global_batch_size;
  if (num_steps == 0) {
    return absl::InvalidArgumentError(fmt::format(
        "the rollout has {} rollouts (sample groups), fewer than global_batch_size = {}: no "
        "optimizer step can run",
        num_rollouts, global_batch_size));
  }
  StepSplit split;
  split.steps.resize(num_steps);
  for (int64_t r = 0; r < num_rollouts; ++r) {
    std::vector<int64_t>& dst =
        r < num_steps * global_batch_size ? split.steps[r / global_batch_size] : split.dropped;
    dst.insert(dst.end(), rollouts[r].begin(), rollouts[r].end());
  }
  for (auto& step : split.steps) std::sort(step.begin(), step.end());
  std::sort(split.dropped.begin(), split.dropped.end());
  if (!split.dropped.empty()) {
    spdlog::warn(
        "train: {} rollouts are not a multiple of global_batch_size = {}; the last {} "
        "rollouts ({} samples) are not trained on",
        num_rollouts, global_batch_size, num_rollouts - num_steps * global_batch_size,
        split.dropped.size());
  }
  return split;
}

StatusOr<StepSplit> SplitIntoSteps(int64_t num_samples, int64_t global_batch_size) {
  std::vector<int64_t> ids(std::max<int64_t>(0, num_samples));
  std::iota(ids.begin(), ids.end(), 0);
  return SplitIntoSteps(ids, global_batch_size);
}

StatusOr<std::vector<MicroBatch>> PackMicroBatches(std::span<const int64_t> samples,
                                                   std::span<const int64_t> token_counts,
                                                   const BatchingOptions& options) {
  SLIME_RETURN_IF_ERROR(ValidateBatchingOptions(options));
  SLIME_RETURN_IF_ERROR(CheckSamples(samples, token_counts));
  if (!options.use_dynamic_batch_size) {
    std::vector<MicroBatch> out;
    for (size_t i = 0; i < samples.size(); i += options.micro_batch_size) {
      const size_t end = std::min(samples.size(), i + options.micro_batch_size);
      out.push_back(
          MakeMicroBatch({samples.begin() + i, samples.begin() + end}, token_counts, options));
    }
    return out;
  }
  if (options.balance_by_flops) return PackByFlops(samples, token_counts, options);
  return FirstFit(samples, token_counts, options);
}

StatusOr<std::vector<MicroBatch>> MakeCountMultipleOf(std::vector<MicroBatch> micro_batches,
                                                      int64_t multiple,
                                                      std::span<const int64_t> token_counts,
                                                      const BatchingOptions& options) {
  if (multiple < 1) {
    return absl::InvalidArgumentError(fmt::format("multiple must be >= 1, got {}", multiple));
  }
  auto count = [&] { return static_cast<int64_t>(micro_batches.size()); };
  if (!options.use_dynamic_batch_size) {
    if (count() == 0 || count() % multiple != 0) {
      return absl::FailedPreconditionError(fmt::format(
          "{} micro-batches of micro_batch_size = {} cannot be spread evenly over {} "
          "data-parallel ranks; make global_batch_size a multiple of micro_batch_size × "
          "data-parallel size, or use dynamic batching",
          count(), options.micro_batch_size, multiple));
    }
    return micro_batches;
  }
  while (count() == 0 || count() % multiple != 0) {
    // The micro-batch with the most tokens among the splittable ones (first on ties).
    int64_t best = -1;
    for (int64_t i = 0; i < count(); ++i) {
      if (micro_batches[i].samples.size() < 2) continue;
      if (best < 0 || micro_batches[i].tokens > micro_batches[best].tokens) best = i;
    }
    if (best < 0) {
      int64_t samples = 0;
      for (const auto& mb : micro_batches) samples += static_cast<int64_t>(mb.samples.size());
      return absl::FailedPreconditionError(fmt::format(
          "cannot make {} micro-batches of {} samples a multiple of {} data-parallel ranks: "
          "every rank needs the same number of non-empty micro-batches (global_batch_size "
          "too small for the data-parallel size?)",
          count(), samples, multiple));
    }
    const std::vector<int64_t>& s = micro_batches[best].samples;
    // Cut after position c-1 where max(prefix, suffix) tokens is smallest.
    size_t cut = 1;
    int64_t prefix = 0, best_max = -1;
    const int64_t total = micro_batches[best].tokens;
    for (size_t c = 1; c < s.size(); ++c) {
      prefix += token_counts[s[c - 1]];
      const int64_t worst = std::max(prefix, total - prefix);
      if (best_max < 0 || worst < best_max) {
        best_max = worst;
        cut = c;
      }
    }
    MicroBatch first = MakeMicroBatch({s.begin(), s.begin() + cut}, token_counts, options);
    MicroBatch second = MakeMicroBatch({s.begin() + cut, s.end()}, token_counts, options);
    micro_batches[best] = std::move(first);
    micro_batches.insert(micro_batches.begin() + best + 1, std::move(second));
  }
  return micro_batches;
}

StatusOr<std::vector<std::vector<MicroBatch>>> DistributeMicroBatches(
    std::vector<MicroBatch> micro_batches, const BatchingOptions& options) {
  const int64_t dp = options.data_parallel_size;
  const auto n = static_cast<int64_t>(micro_batches.size());
  if (dp < 1 || n == 0 || n % dp != 0) {
    return absl::InvalidArgumentError(
        fmt::format("{} micro-batches cannot be split evenly over {} data-parallel ranks", n, dp));
  }
  std::vector<std::vector<MicroBatch>> ranks(dp);
  if (!BalanceAcrossRanks(options) || dp == 1) {
    for (int64_t i = 0; i < n; ++i) ranks[i % dp].push_back(std::move(micro_batches[i]));
    return ranks;
  }
  std::vector<double> costs;
  costs.reserve(n);
  for (const auto& mb : micro_batches) costs.push_back(mb.cost);
  SLIME_ASSIGN_OR_RETURN(auto parts, KarmarkarKarpPartition(costs, dp, /*equal_size=*/true));
  // Deterministic rank order: by the first micro-batch index of each part.
  std::sort(parts.begin(), parts.end(),
            [](const auto& a, const auto& b) { return a.front() < b.front(); });
  for (int64_t r = 0; r < dp; ++r) {
    for (int64_t i : parts[r]) ranks[r].push_back(std::move(micro_batches[i]));
  }
  return ranks;
}

StatusOr<std::vector<std::vector<int64_t>>> KarmarkarKarpPartition(std::span<const double> costs,
                                                                   int64_t k, bool equal_size) {
  const auto n = static_cast<int64_t>(costs.size());
  if (k < 1) return absl::InvalidArgumentError(fmt::format("k must be >= 1, got {}", k));
  if (equal_size && n % k != 0) {
    return absl::InvalidArgumentError(fmt::format(
        "an equal-size partition of {} items into {} subsets needs a multiple of {} items", n, k,
        k));
  }
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(costs[i]) || costs[i] < 0) {
      return absl::InvalidArgumentError(
          fmt::format("item {} has cost {}; costs must be finite and >= 0", i, costs[i]));
    }
  }
  if (n == 0) return std::vector<std::vector<int64_t>>(k);

  // Items by cost, largest first, index breaking ties.
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return costs[a] > costs[b]; });

  // Max-heap by spread; among equal spreads the earlier-created partition first.
  auto less = [](const PartialPartition& a, const PartialPartition& b) {
    const double sa = a.spread(), sb = b.spread();
    if (sa != sb) return sa < sb;
    return a.order > b.order;
  };
  std::vector<PartialPartition> heap;  // a binary heap under `less`
  auto pop = [&] {
    std::pop_heap(heap.begin(), heap.end(), less);
    PartialPartition top = std::move(heap.back());
    heap.pop_back();
    return top;
  };
  auto push = [&](PartialPartition p) {
    heap.push_back(std::move(p));
    std::push_heap(heap.begin(), heap.end(), less);
  };
  int64_t created = 0;
  const int64_t group = equal_size ? k : 1;
  for (int64_t g = 0; g < n; g += group) {
    PartialPartition p;
    p.sets.resize(k);
    p.sums.assign(k, 0.0);
    for (int64_t j = 0; j < group; ++j) {
      p.sets[j].push_back(order[g + j]);
      p.sums[j] = costs[order[g + j]];
    }
    p.order = created++;
    push(std::move(p));
  }
  while (heap.size() > 1) {
    PartialPartition a = pop();
    PartialPartition b = pop();
    // a's subsets by sum descending, b's ascending; pair them up.
    std::vector<int64_t> ia(k), ib(k);
    std::iota(ia.begin(), ia.end(), 0);
    std::iota(ib.begin(), ib.end(), 0);
    std::stable_sort(ia.begin(), ia.end(),
                     [&](int64_t x, int64_t y) { return a.sums[x] > a.sums[y]; });
    std::stable_sort(ib.begin(), ib.end(),
                     [&](int64_t x, int64_t y) { return b.sums[x] < b.sums[y]; });
    PartialPartition merged;
    merged.sets.resize(k);
    merged.sums.resize(k);
    for (int64_t j = 0; j < k; ++j) {
      merged.sets[j] = std::move(a.sets[ia[j]]);
      auto& from_b = b.sets[ib[j]];
      merged.sets[j].insert(merged.sets[j].end(), from_b.begin(), from_b.end());
      merged.sums[j] = a.sums[ia[j]] + b.sums[ib[j]];
    }
    merged.order = created++;
    push(std::move(merged));
  }
  std::vector<std::vector<int64_t>> sets = std::move(heap.front().sets);
  for (auto& s : sets) std::sort(s.begin(), s.end());
  return sets;
}

StatusOr<StepSchedule> ScheduleStep(std::span<const int64_t> samples,
                                    std::span<const int64_t> token_counts,
                                    const BatchingOptions& options) {
  SLIME_ASSIGN_OR_RETURN(auto packed, PackMicroBatches(samples, token_counts, options));
  SLIME_ASSIGN_OR_RETURN(packed, MakeCountMultipleOf(std::move(packed), options.data_parallel_size,
                                                     token_counts, options));
  StepSchedule schedule;
  schedule.samples.assign(samples.begin(), samples.end());
  std::sort(schedule.samples.begin(), schedule.samples.end());
  SLIME_ASSIGN_OR_RETURN(schedule.ranks, DistributeMicroBatches(std::move(packed), options));
  return schedule;
}

StatusOr<RolloutSchedule> ScheduleRollout(std::span<const int64_t> token_counts,
                                          std::span<const int64_t> rollout_ids,
                                          const BatchingOptions& options) {
  SLIME_RETURN_IF_ERROR(ValidateBatchingOptions(options));
  StepSplit split;
  if (rollout_ids.empty()) {
    SLIME_ASSIGN_OR_RETURN(split, SplitIntoSteps(static_cast<int64_t>(token_counts.size()),
                                                 options.global_batch_size));
  } else {
    if (rollout_ids.size() != token_counts.size()) {
      return absl::InvalidArgumentError(
          fmt::format("{} rollout ids for {} samples; give one per sample (or none)",
                      rollout_ids.size(), token_counts.size()));
    }
    SLIME_ASSIGN_OR_RETURN(split, SplitIntoSteps(rollout_ids, options.global_batch_size));
  }
  RolloutSchedule out;
  out.dropped = std::move(split.dropped);
  for (size_t i = 0; i < split.steps.size(); ++i) {
    auto step = ScheduleStep(split.steps[i], token_counts, options);
    if (!step.ok()) {
      return Status(step.status().code(), fmt::format("step {} of the rollout: {}", i,
                                                      std::string(step.status().message())));
    }
    out.steps.push_back(*std::move(step));
  }
  return out;
}

Status CheckStepSchedule(const StepSchedule& schedule, std::span<const int64_t> token_counts,
                         const BatchingOptions& options) {
  auto fail = [](const std::string& msg) { return absl::InternalError(msg); };
  if (static_cast<int64_t>(schedule.ranks.size()) != options.data_parallel_size) {
    return fail(
        fmt::format("{} ranks, expected {}", schedule.ranks.size(), options.data_parallel_size));
  }
  const int64_t per_rank = schedule.num_micro_batches_per_rank();
  if (per_rank < 1) return fail("a rank has no micro-batch");
  std::vector<int64_t> seen;
  for (size_t r = 0; r < schedule.ranks.size(); ++r) {
    if (static_cast<int64_t>(schedule.ranks[r].size()) != per_rank) {
      return fail(fmt::format("rank {} has {} micro-batches, rank 0 has {}", r,
                              schedule.ranks[r].size(), per_rank));
    }
    for (size_t m = 0; m < schedule.ranks[r].size(); ++m) {
      const MicroBatch& mb = schedule.ranks[r][m];
      const std::string where = fmt::format("rank {} micro-batch {}", r, m);
      if (mb.samples.empty()) return fail(where + " is empty");
      if (!std::is_sorted(mb.samples.begin(), mb.samples.end())) {
        return fail(where + ": samples not ascending");
      }
      int64_t tokens = 0;
      double cost = 0;
      for (int64_t s : mb.samples) {
        if (s < 0 || s >= static_cast<int64_t>(token_counts.size())) {
          return fail(fmt::format("{}: sample {} out of range", where, s));
        }
        tokens += token_counts[s];
        cost += SampleCost(options, token_counts[s]);
        seen.push_back(s);
      }
      if (tokens != mb.tokens) {
        return fail(fmt::format("{}: tokens {} != sum {}", where, mb.tokens, tokens));
      }
      if (std::abs(cost - mb.cost) > 1e-9 * std::max(1.0, std::abs(cost))) {
        return fail(fmt::format("{}: cost {} != sum {}", where, mb.cost, cost));
      }
      if (options.use_dynamic_batch_size) {
        if (mb.samples.size() > 1 && mb.tokens > TokenCap(options)) {
          return fail(
              fmt::format("{}: {} tokens over the cap {}", where, mb.tokens, TokenCap(options)));
        }
      } else if (static_cast<int64_t>(mb.samples.size()) > options.micro_batch_size) {
        return fail(fmt::format("{}: {} samples over micro_batch_size {}", where, mb.samples.size(),
                                options.micro_batch_size));
      }
    }
  }
  std::sort(seen.begin(), seen.end());
  if (seen != schedule.samples) {
    return fail("the micro-batches do not hold every sample of the step exactly once");
  }
  return absl::OkStatus();
}

}  // namespace slime::train
