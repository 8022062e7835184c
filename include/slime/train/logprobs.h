// Log-probabilities and entropy of the response tokens of one packed micro-batch, from the
// final hidden states and the (vocab-parallel) LM head, differentiable for the policy loss.
//
// Definition (the engine's, engine::TokenLogprobs; docs/algorithms.md, "Numerics contract"): with
//   z = float32(hidden · Wᵀ) / temperature           (float64 when the inputs are float64)
// the log-prob of token y at a position is log_softmax(z)[y] and the entropy is
// -Σ_v softmax(z)_v · log_softmax(z)_v, over the whole vocabulary. The logits are computed in the
// inputs' dtype (the model's), then cast, exactly as the engine's LM head does.
//
// Shift. Sequence b of the packed batch occupies rows [cu_seqlens[b], cu_seqlens[b+1]) of
// `hidden` and `input_ids`: prompt_lengths[b] prompt tokens then response_lengths[b] response
// tokens. Response token j (0-based) sits at row p = cu_seqlens[b] + prompt_lengths[b] + j; its
// log-prob comes from the hidden state of row p - 1 (the position before it) with target
// input_ids[p]. So each sequence uses rows [start + P - 1, start + P + R - 1) of its own span;
// a prompt of at least one token is required when R > 0. Rows past cu_seqlens.back() (padding)
// are ignored.
//
// Vocab parallelism (docs/algorithms.md). `lm_head_weight` is this rank's shard W_r [V/P, hidden]
// of the vocabulary rows [r·V/P, (r+1)·V/P) (tensor_parallel.h layout); `hidden` is the same on
// every rank. Per row, the max is the maximum of the ranks' maxima (an AllGather of one value
// per rank and row), and the sum of exp, the target logit (owned by one rank, 0 elsewhere) and
// Σ exp·z go through one AllReduceSum. The results are identical on every rank. In the
// backward, each rank's gradient for its logits is local (softmax - onehot terms); the gradient
// for `hidden` is all-reduced over the group (hidden feeds every shard), the gradient for
// `lm_head_weight` stays local.
//
// Memory. The rows are processed in chunks of `chunk_size` (TrainConfig::log_probs_chunk_size;
// -1 = all rows at once). Per chunk only a few [chunk, V/P] float32 buffers exist at a time, in
// the forward and again in the backward, which recomputes the chunk's logits from the saved
// hidden rows instead of keeping them: nothing of size [rows, V] outlives a chunk. The autograd
// graph keeps, per chunk, the hidden rows (a view), the targets and three floats per row. With
// recompute_logits false (train.recompute_loss_function false, slime's default) each chunk's
// logits are kept from the forward to the backward instead: one [chunk, V/P] buffer per chunk
// (float32; the model dtype on the fused CUDA path) lives until the backward, which saves the
// LM-head GEMM it would repeat. Same results either way (bitwise on CPU).
//
// Thread-safety: call from the thread that owns the model replica. The backward runs the
// group's AllReduceSum from the autograd engine's thread (the caller's thread on CPU), so the
// group must outlive the backward and accept calls from there; every rank must run the same
// chunks' backward in the same order (it does: the graphs are identical).
#ifndef SLIME_TRAIN_LOGPROBS_H_
#define SLIME_TRAIN_LOGPROBS_H_

#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "slime/common/status.h"
#include "slime/model/tensor_parallel.h"

namespace slime::train {

// The layout of one packed micro-batch (sizes in tokens).
struct PackedSequences {
  std::vector<int64_t> cu_seqlens;        // [B + 1], cu_seqlens[0] == 0, non-decreasing
  std::vector<int64_t> prompt_lengths;    // [B]
  std::vector<int64_t> response_lengths;  // [B]; prompt + response == sequence length
};

struct LogProbOptions {
  // The rollout temperature; logits are divided by it. Must be finite and > 0.
  double temperature = 1.0;
  // Rows per chunk, or -1 for all rows at once.
  int64_t chunk_size = -1;
  // Also compute the entropy (costs one more [chunk, V/P] pass).
  bool compute_entropy = true;
  // Compute each chunk's logits again in the backward (true) or keep them from the forward
  // (false: faster backward, a [chunk, V/P] buffer per chunk until the backward runs).
  bool recompute_logits = true;
};

struct ResponseLogProbs {
  // Every sample's response tokens, concatenated in sample order: sample b's are the rows
  // [offsets[b], offsets[b+1]). float32 (float64 for float64 inputs), differentiable.
  torch::Tensor log_probs;       // [R]
  torch::Tensor entropy;         // [R]; undefined unless compute_entropy
  std::vector<int64_t> offsets;  // [B + 1]
};

// Rows of `hidden` that predict the response tokens, in output order (the shift above); the
// target of row p is input_ids[p + 1]. InvalidArgument for an inconsistent layout.
StatusOr<std::vector<int64_t>> ResponsePredictorRows(const PackedSequences& packed);

// Log-probs (and entropy) of the response tokens of a packed micro-batch.
//   hidden          [T, hidden] final hidden states (after the final norm), T >= cu_seqlens.back()
//   lm_head_weight  [V/P, hidden] this rank's LM-head shard, same dtype and device as hidden
//   input_ids       [T] token ids (integer), global vocabulary ids in [0, V/P · P)
// InvalidArgument for a bad temperature (naming it), chunk size, shape, layout or token id;
// Internal for a LibTorch or collective failure in the forward (a failure in the backward
// throws from backward(), like any autograd op). Gradients flow to `hidden` and
// `lm_head_weight` when they require grad. With no response tokens the results are empty and
// belong to no graph.
StatusOr<ResponseLogProbs> ComputeResponseLogProbs(const torch::Tensor& hidden,
                                                   const torch::Tensor& lm_head_weight,
                                                   const torch::Tensor& input_ids,
                                                   const PackedSequences& packed,
                                                   model::TensorParallelGroup& group,
                                                   const LogProbOptions& options);

}  // namespace slime::train

#endif  // SLIME_TRAIN_LOGPROBS_H_
