// Micro-batch scheduling: hand-checked packings and partitions, and the schedule invariants on
// random rollouts.
#include "slime/train/batching.h"

#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace slime::train {
namespace {

using Ids = std::vector<int64_t>;

std::vector<Ids> SamplesOf(const std::vector<MicroBatch>& mbs) {
  std::vector<Ids> out;
  for (const auto& mb : mbs) out.push_back(mb.samples);
  return out;
}

BatchingOptions Dynamic(int64_t cap, int64_t dp = 1) {
  BatchingOptions o;
  o.use_dynamic_batch_size = true;
  o.max_tokens_per_gpu = cap;
  o.data_parallel_size = dp;
  return o;
}

double CostSum(const std::vector<double>& costs, const Ids& set) {
  double s = 0;
  for (int64_t i : set) s += costs[i];
  return s;
}

double Spread(const std::vector<double>& costs, const std::vector<Ids>& sets) {
  std::vector<double> sums;
  for (const auto& s : sets) sums.push_back(CostSum(costs, s));
  return *std::max_element(sums.begin(), sums.end()) - *std::min_element(sums.begin(), sums.end());
}

// Greedy LPT for comparison: largest item first into the currently lightest subset.
std::vector<Ids> Greedy(const std::vector<double>& costs, int k) {
  Ids order(costs.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return costs[a] > costs[b]; });
  std::vector<Ids> sets(k);
  std::vector<double> sums(k, 0);
  for (int64_t i : order) {
    const auto j = std::min_element(sums.begin(), sums.end()) - sums.begin();
    sets[j].push_back(i);
    sums[j] += costs[i];
  }
  return sets;
}

TEST(FlopsTest, HandComputedFormula) {
  // layers 1, H 2, q = kv = 1 × 2, F 3, V 5:
  //   linear 2·2·(2 + 4) + 2·2·2 + 6·2·3 + 2·2·5 = 24 + 8 + 36 + 20 = 88; quadratic 2·2 = 4.
  FlopsModel m{.num_layers = 1,
               .hidden_size = 2,
               .num_attention_heads = 1,
               .num_key_value_heads = 1,
               .head_dim = 2,
               .intermediate_size = 3,
               .vocab_size = 5};
  EXPECT_DOUBLE_EQ(EstimateForwardFlops(m, 1), 92.0);
  EXPECT_DOUBLE_EQ(EstimateForwardFlops(m, 3), 88.0 * 3 + 4.0 * 9);
  BatchingOptions o;
  EXPECT_DOUBLE_EQ(SampleCost(o, 7), 7.0);  // no model: tokens
  o.flops_model = m;
  EXPECT_DOUBLE_EQ(SampleCost(o, 3), 300.0);
  EXPECT_EQ(PaddedTokens(1, 1, 128), 128);
  EXPECT_EQ(PaddedTokens(256, 2, 128), 256);
  EXPECT_EQ(PaddedTokens(257, 2, 128), 512);
}

TEST(FlopsTest, SparseLayersCountTheRouterAndTheActiveExperts) {
  // Two layers, one sparse (E 4 experts, k 2 of width I 3), H 2, q = kv = 1 × 2, F 5, V 5:
  //   attention per layer 2·2·(2 + 4) + 2·2·2 = 32; dense MLP 6·2·5 = 60;
  //   sparse: router 2·2·4 = 16, experts 6·2·(2·3) = 72; LM head 2·2·5 = 20;
  //   linear 2·32 + 60 + 16 + 72 + 20 = 232; quadratic 2·2·2 = 8.
  FlopsModel m{.num_layers = 2,
               .hidden_size = 2,
               .num_attention_heads = 1,
               .num_key_value_heads = 1,
               .head_dim = 2,
               .intermediate_size = 5,
               .vocab_size = 5,
               .sparse_layers = 1,
               .num_experts = 4,
               .experts_per_token = 2,
               .moe_intermediate_size = 3};
  EXPECT_DOUBLE_EQ(EstimateForwardFlops(m, 1), 240.0);
  EXPECT_DOUBLE_EQ(EstimateForwardFlops(m, 3), 232.0 * 3 + 8.0 * 9);
}

TEST(SplitIntoStepsTest, OneSamplePerRollout) {
  auto split = SplitIntoSteps(10, 4);
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_EQ(split->steps, (std::vector<Ids>{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(split->dropped, (Ids{8, 9}));
}

TEST(SplitIntoStepsTest, RolloutsStayTogether) {
  // Rollouts in order of first appearance: 7 {0,1}, 3 {2,3}, 9 {4}, 1 {5}.
  Ids ids = {7, 7, 3, 3, 9, 1};
  auto split = SplitIntoSteps(ids, 2);
  ASSERT_TRUE(split.ok());
  EXPECT_EQ(split->steps, (std::vector<Ids>{{0, 1, 2, 3}, {4, 5}}));
  EXPECT_TRUE(split->dropped.empty());
  split = SplitIntoSteps(ids, 3);
  ASSERT_TRUE(split.ok());
  EXPECT_EQ(split->steps, (std::vector<Ids>{{0, 1, 2, 3, 4}}));
  EXPECT_EQ(split->dropped, (Ids{5}));
  // Interleaved groups.
  Ids interleaved = {1, 2, 1, 2};
  split = SplitIntoSteps(interleaved, 1);
  ASSERT_TRUE(split.ok());
  EXPECT_EQ(split->steps, (std::vector<Ids>{{0, 2}, {1, 3}}));
}

TEST(SplitIntoStepsTest, Errors) {
  EXPECT_EQ(SplitIntoSteps(3, 0).status().code(), absl::StatusCode::kInvalidArgument);
  auto s = SplitIntoSteps(3, 4);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("global_batch_size = 4"), std::string::npos);
}

TEST(PackTest, FixedMicroBatchSize) {
  BatchingOptions o;
  o.micro_batch_size = 2;
  Ids tokens = {5, 5, 5, 5, 5, 5, 5};
  Ids samples = {0, 1, 2, 3, 4};
  auto mbs = PackMicroBatches(samples, tokens, o);
  ASSERT_TRUE(mbs.ok());
  EXPECT_EQ(SamplesOf(*mbs), (std::vector<Ids>{{0, 1}, {2, 3}, {4}}));
  EXPECT_EQ((*mbs)[0].tokens, 10);
}

TEST(PackTest, FirstFitByTokens) {
  // cap 8: 5 -> b0; 3 -> b0 (8); 4 -> b1; 2 -> b1 (6); 6 -> b2.
  Ids tokens = {5, 3, 4, 2, 6};
  Ids samples = {0, 1, 2, 3, 4};
  auto mbs = PackMicroBatches(samples, tokens, Dynamic(8));
  ASSERT_TRUE(mbs.ok());
  EXPECT_EQ(SamplesOf(*mbs), (std::vector<Ids>{{0, 1}, {2, 3}, {4}}));
  EXPECT_EQ((*mbs)[0].tokens, 8);
  EXPECT_EQ((*mbs)[1].tokens, 6);
  // First-fit, not next-fit: the 2 goes back into the first micro-batch with room.
  Ids t2 = {6, 5, 2};
  auto m2 = PackMicroBatches(Ids{0, 1, 2}, t2, Dynamic(8));
  ASSERT_TRUE(m2.ok());
  EXPECT_EQ(SamplesOf(*m2), (std::vector<Ids>{{0, 2}, {1}}));
}

TEST(PackTest, ContextParallelScalesTheCap) {
  BatchingOptions o = Dynamic(4);
  o.context_parallel_size = 2;  // cap 8
  Ids tokens = {5, 3};
  auto mbs = PackMicroBatches(Ids{0, 1}, tokens, o);
  ASSERT_TRUE(mbs.ok());
  EXPECT_EQ(SamplesOf(*mbs), (std::vector<Ids>{{0, 1}}));
}

TEST(PackTest, OversizedSampleGoesAlone) {
  Ids tokens = {3, 12, 4};
  auto mbs = PackMicroBatches(Ids{0, 1, 2}, tokens, Dynamic(8));
  ASSERT_TRUE(mbs.ok());
  EXPECT_EQ(SamplesOf(*mbs), (std::vector<Ids>{{0, 2}, {1}}));
  EXPECT_EQ((*mbs)[1].tokens, 12);
}

TEST(PackTest, RejectsBadInput) {
  Ids tokens = {3, 0};
  EXPECT_EQ(PackMicroBatches(Ids{0, 1}, tokens, Dynamic(8)).status().code(),
            absl::StatusCode::kInvalidArgument);
  Ids ok_tokens = {3, 3};
  EXPECT_EQ(PackMicroBatches(Ids{0, 2}, ok_tokens, Dynamic(8)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PackMicroBatches(Ids{}, ok_tokens, Dynamic(8)).status().code(),
            absl::StatusCode::kInvalidArgument);
  BatchingOptions no_cap;
  no_cap.use_dynamic_batch_size = true;
  auto s = PackMicroBatches(Ids{0}, ok_tokens, no_cap);
  EXPECT_NE(s.status().message().find("max_tokens_per_gpu"), std::string::npos);
  BatchingOptions flops_static;
  flops_static.balance_by_flops = true;
  EXPECT_FALSE(ValidateBatchingOptions(flops_static).ok());
}

TEST(PackTest, BalanceByFlopsEvensCostWithinTheCap) {
  // Tokens 5, 5 and ten 1s, cap 10. First-fit puts the two 5s together (cost dominated by the
  // quadratic term) and the ten 1s in the other micro-batch; packing by FLOPs gives each
  // micro-batch one 5 and five 1s: equal cost, 10 tokens each.
  Ids tokens = {5, 5, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  Ids samples(tokens.size());
  std::iota(samples.begin(), samples.end(), 0);
  BatchingOptions o = Dynamic(10);
  o.flops_model = FlopsModel{.num_layers = 2,
                             .hidden_size = 8,
                             .num_attention_heads = 2,
                             .num_key_value_heads = 1,
                             .head_dim = 4,
                             .intermediate_size = 16,
                             .vocab_size = 32};
  auto first_fit = PackMicroBatches(samples, tokens, o);
  ASSERT_TRUE(first_fit.ok());
  EXPECT_EQ((*first_fit)[0].samples, (Ids{0, 1}));
  o.balance_by_flops = true;
  auto mbs = PackMicroBatches(samples, tokens, o);
  ASSERT_TRUE(mbs.ok()) << mbs.status();
  ASSERT_EQ(mbs->size(), 2u);
  for (const MicroBatch& mb : *mbs) {
    EXPECT_EQ(mb.tokens, 10);
    EXPECT_EQ(mb.samples.size(), 6u);
  }
  EXPECT_EQ((*mbs)[0].samples.front(), 0);
  EXPECT_EQ((*mbs)[1].samples.front(), 1);
  EXPECT_DOUBLE_EQ((*mbs)[0].cost, (*mbs)[1].cost);
}

TEST(PackTest, BalanceByFlopsAddsMicroBatchesUntilTheCapHolds) {
  // Cap 1000, tokens 600 and fourteen 100s: first-fit needs 2 micro-batches (600 + 4×100,
  // 10×100). With cost 16·L + 2·L² (all model dims 1) the 600 costs 729,600 and each 100 costs
  // 21,600, so a 2-way partition by cost puts all 100s (1,400 tokens) together, over the cap;
  // 3 micro-batches hold: {600}, 7×100, 7×100.
  Ids tokens = {600};
  for (int i = 0; i < 14; ++i) tokens.push_back(100);
  Ids samples(tokens.size());
  std::iota(samples.begin(), samples.end(), 0);
  BatchingOptions o = Dynamic(1000);
  o.flops_model = FlopsModel{.num_layers = 1,
                             .hidden_size = 1,
                             .num_attention_heads = 1,
                             .num_key_value_heads = 1,
                             .head_dim = 1,
                             .intermediate_size = 1,
                             .vocab_size = 1};
  ASSERT_DOUBLE_EQ(SampleCost(o, 600), 729600.0);
  auto first_fit = PackMicroBatches(samples, tokens, o);
  ASSERT_TRUE(first_fit.ok());
  EXPECT_EQ(first_fit->size(), 2u);
  o.balance_by_flops = true;
  auto mbs = PackMicroBatches(samples, tokens, o);
  ASSERT_TRUE(mbs.ok());
  ASSERT_EQ(mbs->size(), 3u);
  EXPECT_EQ((*mbs)[0].samples, (Ids{0}));
  EXPECT_EQ((*mbs)[1].tokens, 700);
  EXPECT_EQ((*mbs)[2].tokens, 700);
  // An oversized sample stays alone and out of the partition.
  Ids big = {30, 4, 6};
  BatchingOptions small = Dynamic(10);
  small.balance_by_flops = true;
  mbs = PackMicroBatches(Ids{0, 1, 2}, big, small);
  ASSERT_TRUE(mbs.ok());
  EXPECT_EQ(SamplesOf(*mbs), (std::vector<Ids>{{0}, {1, 2}}));
}

TEST(MakeCountMultipleOfTest, SplitsTheLargestMicroBatch) {
  // {0,1} 8 tokens, {2,3} 6, {4} 6; dp 2 -> split {0,1}.
  Ids tokens = {5, 3, 4, 2, 6};
  BatchingOptions o = Dynamic(8, 2);
  auto mbs = PackMicroBatches(Ids{0, 1, 2, 3, 4}, tokens, o);
  ASSERT_TRUE(mbs.ok());
  auto even = MakeCountMultipleOf(*mbs, 2, tokens, o);
  ASSERT_TRUE(even.ok());
  EXPECT_EQ(SamplesOf(*even), (std::vector<Ids>{{0}, {1}, {2, 3}, {4}}));
  auto step = ScheduleStep(Ids{0, 1, 2, 3, 4}, tokens, o);
  ASSERT_TRUE(step.ok());
  EXPECT_EQ(SamplesOf(step->ranks[0]), (std::vector<Ids>{{0}, {2, 3}}));
  EXPECT_EQ(SamplesOf(step->ranks[1]), (std::vector<Ids>{{1}, {4}}));
}

TEST(MakeCountMultipleOfTest, CutsWhereTheHalvesAreMostEven) {
  // cap 8: {0,1,2,3} (1+1+1+5 = 8), {4} (6). dp 4: split {0,1,2,3} at 3|5 -> {0,1,2},{3};
  // then the only splittable one, {0,1,2}: cuts 1|2 and 2|1 tie, the first wins -> {0},{1,2}.
  Ids tokens = {1, 1, 1, 5, 6};
  BatchingOptions o = Dynamic(8, 4);
  auto mbs = PackMicroBatches(Ids{0, 1, 2, 3, 4}, tokens, o);
  ASSERT_TRUE(mbs.ok());
  ASSERT_EQ(SamplesOf(*mbs), (std::vector<Ids>{{0, 1, 2, 3}, {4}}));
  auto even = MakeCountMultipleOf(*mbs, 4, tokens, o);
  ASSERT_TRUE(even.ok());
  EXPECT_EQ(SamplesOf(*even), (std::vector<Ids>{{0}, {1, 2}, {3}, {4}}));
}

TEST(MakeCountMultipleOfTest, Errors) {
  Ids tokens = {4, 4};
  BatchingOptions o = Dynamic(8, 3);
  auto step = ScheduleStep(Ids{0, 1}, tokens, o);  // 2 samples for 3 ranks
  EXPECT_EQ(step.status().code(), absl::StatusCode::kFailedPrecondition);
  BatchingOptions fixed;
  fixed.micro_batch_size = 1;
  fixed.data_parallel_size = 2;
  Ids three = {1, 1, 1};
  step = ScheduleStep(Ids{0, 1, 2}, three, fixed);  // 3 fixed micro-batches for 2 ranks
  EXPECT_EQ(step.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(step.status().message().find("micro_batch_size"), std::string::npos);
}

TEST(DistributeTest, RoundRobinAndBalanced) {
  // Fixed size 1 over 2 ranks: costs 10, 9, 2, 1.
  Ids tokens = {10, 9, 2, 1};
  BatchingOptions o;
  o.data_parallel_size = 2;
  auto rr = ScheduleStep(Ids{0, 1, 2, 3}, tokens, o);
  ASSERT_TRUE(rr.ok());
  EXPECT_EQ(SamplesOf(rr->ranks[0]), (std::vector<Ids>{{0}, {2}}));  // 12 tokens
  EXPECT_EQ(SamplesOf(rr->ranks[1]), (std::vector<Ids>{{1}, {3}}));  // 10 tokens
  o.balance_data = true;
  auto kk = ScheduleStep(Ids{0, 1, 2, 3}, tokens, o);
  ASSERT_TRUE(kk.ok());
  EXPECT_EQ(SamplesOf(kk->ranks[0]), (std::vector<Ids>{{0}, {3}}));  // 11
  EXPECT_EQ(SamplesOf(kk->ranks[1]), (std::vector<Ids>{{1}, {2}}));  // 11
  EXPECT_TRUE(CheckStepSchedule(*kk, tokens, o).ok());
}

TEST(KarmarkarKarpTest, ClassicTwoWayExample) {
  // {8,7,6,5,4}: differencing 8-7=1, 6-5=1, 4-1=3, 3-1=2 -> sums 16 / 14. Greedy (LPT) gives
  // 17 / 13.
  std::vector<double> costs = {8, 7, 6, 5, 4};
  auto kk = KarmarkarKarpPartition(costs, 2, false);
  ASSERT_TRUE(kk.ok());
  std::vector<Ids> sets = *kk;
  std::sort(sets.begin(), sets.end());
  EXPECT_EQ(sets, (std::vector<Ids>{{0, 2}, {1, 3, 4}}));
  EXPECT_DOUBLE_EQ(Spread(costs, *kk), 2.0);
  EXPECT_DOUBLE_EQ(Spread(costs, Greedy(costs, 2)), 4.0);
}

TEST(KarmarkarKarpTest, BetterThanGreedyOnAverage) {
  // On random instances the differencing method leaves a smaller spread than greedy LPT on
  // average (it is not better on every instance).
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> cost(1.0, 100.0);
  for (int k : {2, 3, 4}) {
    double kk_total = 0, greedy_total = 0;
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<double> costs(12);
      for (double& c : costs) c = cost(rng);
      auto kk = KarmarkarKarpPartition(costs, k, false);
      ASSERT_TRUE(kk.ok());
      kk_total += Spread(costs, *kk);
      greedy_total += Spread(costs, Greedy(costs, k));
    }
    EXPECT_LT(kk_total, greedy_total) << "k = " << k;
  }
}

TEST(KarmarkarKarpTest, EqualSizeAndEdgeCases) {
  std::vector<double> costs = {1, 2, 3, 4, 5, 6};
  auto eq = KarmarkarKarpPartition(costs, 3, true);
  ASSERT_TRUE(eq.ok());
  Ids all;
  for (const auto& s : *eq) {
    EXPECT_EQ(s.size(), 2u);
    all.insert(all.end(), s.begin(), s.end());
  }
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, (Ids{0, 1, 2, 3, 4, 5}));
  EXPECT_DOUBLE_EQ(Spread(costs, *eq), 0.0);  // {6,1} {5,2} {4,3}

  EXPECT_EQ(KarmarkarKarpPartition(costs, 4, true).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KarmarkarKarpPartition(costs, 0, false).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<double> negative = {1, -1};
  EXPECT_FALSE(KarmarkarKarpPartition(negative, 2, false).ok());
  auto few = KarmarkarKarpPartition(std::vector<double>{3}, 3, false);
  ASSERT_TRUE(few.ok());
  EXPECT_EQ(few->size(), 3u);
  auto none = KarmarkarKarpPartition(std::vector<double>{}, 2, false);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, (std::vector<Ids>{{}, {}}));
}

TEST(ScheduleRolloutTest, InvariantsOnRandomRollouts) {
  std::mt19937_64 rng(12345);
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  // The random cases warn about oversized samples and dropped rollouts by the hundred.
  const auto level = spdlog::get_level();
  spdlog::set_level(spdlog::level::err);
  int scheduled = 0;
  for (int trial = 0; trial < 300; ++trial) {
    BatchingOptions o;
    o.data_parallel_size = uniform(1, 4);
    o.use_dynamic_batch_size = uniform(0, 1) == 1;
    o.balance_data = uniform(0, 1) == 1;
    if (uniform(0, 1) == 1) {
      o.flops_model = FlopsModel{.num_layers = 4,
                                 .hidden_size = 64,
                                 .num_attention_heads = 4,
                                 .num_key_value_heads = 2,
                                 .head_dim = 16,
                                 .intermediate_size = 128,
                                 .vocab_size = 1000};
    }
    int64_t num_rollouts = 0;
    Ids rollout_ids;  // empty: one sample per rollout
    if (o.use_dynamic_batch_size) {
      o.max_tokens_per_gpu = uniform(200, 3000);
      o.context_parallel_size = uniform(1, 2);
      o.balance_by_flops = uniform(0, 1) == 1;
      o.global_batch_size = uniform(o.data_parallel_size, 40);
      num_rollouts = o.global_batch_size * uniform(1, 3) + uniform(0, o.global_batch_size - 1);
      if (uniform(0, 1) == 1) {  // rollouts of 1-3 samples, interleaved
        for (int64_t r = 0; r < num_rollouts; ++r) {
          for (int64_t n = uniform(1, 3); n > 0; --n) rollout_ids.push_back(r);
        }
        std::shuffle(rollout_ids.begin(), rollout_ids.end(), rng);
      }
    } else {
      o.micro_batch_size = uniform(1, 4);
      o.global_batch_size = o.micro_batch_size * o.data_parallel_size * uniform(1, 4);
      num_rollouts = o.global_batch_size * uniform(1, 3) + uniform(0, 3);
    }
    const int64_t num_samples =
        rollout_ids.empty() ? num_rollouts : static_cast<int64_t>(rollout_ids.size());
    Ids tokens(num_samples);
    for (auto& t : tokens) t = uniform(1, 2500);
    const std::string where = "trial " + std::to_string(trial);

    auto schedule = ScheduleRollout(tokens, rollout_ids, o);
    if (!schedule.ok()) {
      // The one legitimate failure: a step whose sample count is not a multiple of the DP size
      // cannot give every rank the same number of micro-batches once every sample is alone.
      ASSERT_EQ(schedule.status().code(), absl::StatusCode::kFailedPrecondition)
          << where << ": " << schedule.status();
      auto split = rollout_ids.empty() ? SplitIntoSteps(num_samples, o.global_batch_size)
                                       : SplitIntoSteps(rollout_ids, o.global_batch_size);
      ASSERT_TRUE(split.ok());
      bool uneven = false;
      for (const Ids& step : split->steps) {
        uneven = uneven || static_cast<int64_t>(step.size()) % o.data_parallel_size != 0;
      }
      ASSERT_TRUE(uneven) << where << ": " << schedule.status();
      continue;
    }
    ++scheduled;
    Ids seen = schedule->dropped;
    for (const StepSchedule& step : schedule->steps) {
      Status check = CheckStepSchedule(step, tokens, o);
      ASSERT_TRUE(check.ok()) << where << ": " << check;
      seen.insert(seen.end(), step.samples.begin(), step.samples.end());
      // Samples of one rollout sit in one step.
      if (!rollout_ids.empty()) {
        for (int64_t s : step.samples) {
          for (int64_t other = 0; other < num_samples; ++other) {
            if (rollout_ids[other] == rollout_ids[s]) {
              ASSERT_TRUE(std::binary_search(step.samples.begin(), step.samples.end(), other))
                  << where;
            }
          }
        }
      }
    }
    std::sort(seen.begin(), seen.end());
    Ids all(num_samples);
    std::iota(all.begin(), all.end(), 0);
    ASSERT_EQ(seen, all) << where;
    EXPECT_EQ(static_cast<int64_t>(schedule->steps.size()), num_rollouts / o.global_batch_size)
        << where;
  }
  spdlog::set_level(level);
  EXPECT_GT(scheduled, 250);
}

}  // namespace
}  // namespace slime::train
