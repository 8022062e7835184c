// Micro-batch scheduling for the trainer: which samples go into which optimizer step, which
// micro-batch and which data-parallel (DP) rank. Pure bookkeeping on token counts, no LibTorch.
//
// slime's order ("pack first, distribute second", docs/algorithms.md), one stage per function:
//   SplitIntoSteps          rollout samples -> optimizer steps. Samples sharing a rollout id stay
//                           in one step; a step holds global_batch_size rollouts; trailing
//                           rollouts that do not fill a step are dropped (and logged).
//   PackMicroBatches        one step's samples -> micro-batches, for all DP ranks together:
//                           fixed micro_batch_size chunks, first-fit up to the token cap
//                           max_tokens_per_gpu × context_parallel_size (a sample longer than the
//                           cap goes alone, with a warning), or, with balance_by_flops, a
//                           Karmarkar–Karp partition by estimated FLOPs that respects the cap.
//   MakeCountMultipleOf     the micro-batch count becomes a multiple of the DP size: dynamic
//                           batches split their largest micro-batches; static ones must already be.
//   DistributeMicroBatches  micro-batches -> DP ranks, the same count on every rank: strided
//                           round-robin, or (balance_data) Karmarkar–Karp on estimated FLOPs.
//   ScheduleStep / ScheduleRollout run the stages in that order.
//
// Sample indices are positions in the rollout's sample list (the index space of
// `token_counts`) in every structure here, so a schedule can be applied to any per-sample
// array of the rollout.
//
// Cost model (EstimateForwardFlops), the forward FLOPs of one sequence of L tokens, counting a
// multiply-add as 2 FLOPs, with H = hidden_size, q = num_attention_heads × head_dim,
// kv = num_key_value_heads × head_dim, F = intermediate_size, V = vocab_size:
//   per layer:  QKV 2·L·H·(q + 2·kv) + attention output 2·L·q·H + SwiGLU MLP 6·L·H·F   (linear)
//               causal attention QKᵀ and AV: 2 · (2·L²·q / 2) = 2·q·L²               (quadratic)
//   LM head:    2·L·H·V            (the embedding is a lookup: 0)
//   flops(L) = a·L + b·L²,  a = layers·(2H(q + 2kv) + 2qH + 6HF) + 2HV,  b = 2·layers·q.
// A sparse (mixture-of-experts) layer counts its active FLOPs instead of the SwiGLU MLP's: the
// router 2·L·H·E and k experts of width I, 6·L·H·k·I (E = num_experts, k = experts per token,
// I = moe_intermediate_size; FlopsModel::sparse_layers of the layers are sparse).
// The cost of a micro-batch is the sum over its samples (packed sequences attend only within
// themselves). Without a FlopsModel the cost of a sample is its token count.
//
// Thread-safety: all functions are pure (no shared state) and may run on any thread.
// Invariants of a StepSchedule (CheckStepSchedule verifies them; the tests use it):
//   1. every sample of the step is in exactly one micro-batch of exactly one rank;
//   2. every rank has the same number (>= 1) of micro-batches;
//   3. with dynamic batching, a micro-batch of two or more samples has at most the token cap;
//      with static batching, a micro-batch has at most micro_batch_size samples;
//   4. MicroBatch::tokens and ::cost are the sums over its samples; samples ascend.
#ifndef SLIME_TRAIN_BATCHING_H_
#define SLIME_TRAIN_BATCHING_H_

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "slime/common/status.h"

namespace slime::train {

// The model dimensions the FLOPs estimate needs (a dense decoder with SwiGLU MLP).
struct FlopsModel {
  int64_t num_layers = 0;
  int64_t hidden_size = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t intermediate_size = 0;
  int64_t vocab_size = 0;
  // Mixture-of-experts layers among num_layers (0: a dense model) and their routing.
  int64_t sparse_layers = 0;
  int64_t num_experts = 0;
  int64_t experts_per_token = 0;
  int64_t moe_intermediate_size = 0;
};

// Forward FLOPs of one sequence of `tokens` tokens (formula in the file comment).
double EstimateForwardFlops(const FlopsModel& model, int64_t tokens);

struct BatchingOptions {
  // Rollouts (groups of samples sharing a rollout id; usually one sample each) per step.
  int64_t global_batch_size = 1;
  // Samples per micro-batch when !use_dynamic_batch_size.
  int64_t micro_batch_size = 1;
  // Pack samples into micro-batches by tokens instead of a fixed sample count.
  bool use_dynamic_batch_size = false;
  // Token budget of one packed micro-batch per GPU; required (>= 1) with dynamic batching.
  // The cap is max_tokens_per_gpu × context_parallel_size (a CP group shares a micro-batch).
  std::optional<int64_t> max_tokens_per_gpu;
  int64_t context_parallel_size = 1;
  int64_t data_parallel_size = 1;
  // Assign micro-batches to DP ranks by Karmarkar–Karp on cost (else round-robin).
  bool balance_data = false;
  // Pack micro-batches by Karmarkar–Karp on cost (else first-fit on tokens). Needs dynamic
  // batching; implies balance_data.
  bool balance_by_flops = false;
  // Dimensions for the cost; unset: cost = tokens.
  std::optional<FlopsModel> flops_model;
};

// OK, or InvalidArgument naming the field and what would be valid.
Status ValidateBatchingOptions(const BatchingOptions& options);

// The balancing cost of one sample of `tokens` tokens under `options`.
double SampleCost(const BatchingOptions& options, int64_t tokens);

// Tokens of a packed micro-batch after padding to a multiple of tp_size × pad_multiplier
// (slime pads packed micro-batches with token id 0; data_pad_size_multiplier, default 128).
int64_t PaddedTokens(int64_t tokens, int64_t tp_size, int64_t pad_multiplier);

struct MicroBatch {
  std::vector<int64_t> samples;  // rollout sample indices, ascending
  int64_t tokens = 0;            // sum of the samples' token counts (unpadded)
  double cost = 0;               // sum of the samples' SampleCost
};

struct StepSplit {
  std::vector<std::vector<int64_t>> steps;  // [num_steps][samples of the step], ascending
  std::vector<int64_t> dropped;             // samples of the trailing rollouts, ascending
};

// Splits a rollout's samples into optimizer steps of `global_batch_size` rollouts each.
// rollout_ids[i] is the rollout (group) sample i belongs to; rollouts are taken in order of
// their first sample. steps = #rollouts / global_batch_size (integer division).
// InvalidArgument when global_batch_size < 1 or there are fewer rollouts than one step.
StatusOr<StepSplit> SplitIntoSteps(std::span<const int64_t> rollout_ids, int64_t global_batch_size);
// The usual case: every sample is its own rollout.
StatusOr<StepSplit> SplitIntoSteps(int64_t num_samples, int64_t global_batch_size);

// Packs the samples of one step (indices into token_counts) into micro-batches, in sample
// order for fixed-size and first-fit packing. token_counts[i] >= 1 is prompt + response tokens
// of sample i.
StatusOr<std::vector<MicroBatch>> PackMicroBatches(std::span<const int64_t> samples,
                                                   std::span<const int64_t> token_counts,
                                                   const BatchingOptions& options);

// Splits micro-batches until their count is a multiple of `multiple` (dynamic batching): the
// micro-batch with the most tokens among those of two or more samples is cut in two where the
// halves' larger token sum is smallest (sample order kept); the halves take its place.
// Static batching never splits: FailedPrecondition if the count is not a multiple. Also
// FailedPrecondition when no micro-batch can be split any more (too few samples).
StatusOr<std::vector<MicroBatch>> MakeCountMultipleOf(std::vector<MicroBatch> micro_batches,
                                                      int64_t multiple,
                                                      std::span<const int64_t> token_counts,
                                                      const BatchingOptions& options);

// Assigns micro-batches (count a multiple of data_parallel_size) to DP ranks, the same count
// per rank: micro-batch i to rank i % dp, or with balance_data / balance_by_flops an equal-count
// Karmarkar–Karp partition by cost. A rank runs its micro-batches in their original order.
// -> [dp][micro-batches of the rank]
StatusOr<std::vector<std::vector<MicroBatch>>> DistributeMicroBatches(
    std::vector<MicroBatch> micro_batches, const BatchingOptions& options);

// k-way Karmarkar–Karp (largest differencing method): partitions items 0..n-1 with the given
// costs into k subsets with close cost sums. Every item starts as a partial partition (its
// own subset plus k-1 empty ones); the two partial partitions with the largest spread
// (max sum - min sum) are merged, largest subset of one with smallest of the other, until one
// is left. With equal_size (n must be a multiple of k), the items sorted by cost are first
// grouped k at a time into partitions of one item per subset, so every subset ends with n/k
// items. Ties are broken by item index, so the result is deterministic. Each subset's items
// ascend; subsets come in no particular order. k >= 1; a subset may be empty if n < k.
StatusOr<std::vector<std::vector<int64_t>>> KarmarkarKarpPartition(std::span<const double> costs,
                                                                   int64_t k, bool equal_size);

struct StepSchedule {
  std::vector<int64_t> samples;                // every sample of the step, ascending
  std::vector<std::vector<MicroBatch>> ranks;  // [data_parallel_size][micro-batches]

  int64_t num_micro_batches_per_rank() const {
    return ranks.empty() ? 0 : static_cast<int64_t>(ranks[0].size());
  }
};

// Pack, make the count a multiple of the DP size, distribute.
StatusOr<StepSchedule> ScheduleStep(std::span<const int64_t> samples,
                                    std::span<const int64_t> token_counts,
                                    const BatchingOptions& options);

struct RolloutSchedule {
  std::vector<StepSchedule> steps;
  std::vector<int64_t> dropped;  // samples in no step (trailing rollouts)
};

// SplitIntoSteps then ScheduleStep for each step. rollout_ids empty: every sample its own
// rollout; else rollout_ids.size() == token_counts.size().
StatusOr<RolloutSchedule> ScheduleRollout(std::span<const int64_t> token_counts,
                                          std::span<const int64_t> rollout_ids,
                                          const BatchingOptions& options);

// Verifies the StepSchedule invariants (file comment) against the step's samples; Internal
// error describing the first violation.
Status CheckStepSchedule(const StepSchedule& schedule, std::span<const int64_t> token_counts,
                         const BatchingOptions& options);

}  // namespace slime::train

#endif  // SLIME_TRAIN_BATCHING_H_
