// Batch-invariant kernels: the deterministic mode of the log-prob path (debug.deterministic_mode,
// `serve --enable-deterministic-inference`).
//
// A kernel is batch-invariant when the value it computes for one row (a token, a query, a row
// of logits) depends only on that row's own inputs: not on how many other rows share the call,
// what they hold, where the row sits among them, how the work is split across threads, or how a
// sequence was cut into prefill chunks or decode steps. LibTorch's GEMMs and reductions are not:
// BLAS and oneDNN pick blocking and code paths by shape (on the development machine a float32
// [M, 64] × [64, 16] product gives row 0 different bits for M = 1 and M = 100). The kernels here
// fix every reduction order instead:
//
//   InvariantLinear         y[r, n] = Σ_k x[r, k] · W[n, k], summed in ascending k one product
//                           at a time in the accumulation type, then + bias[n];
//   InvariantCausalAttention for each query and head: s_j = (Σ_d q_d k_jd) · scale over its
//                           own keys j = 0..position (ascending d), m = max_j s_j,
//                           l = Σ_j exp(s_j - m) and o_d = (Σ_j exp(s_j - m) v_jd) / l in
//                           ascending j;
//   InvariantSoftmaxStats   per row of logits z: m = max_v z_v, S = Σ_v exp(z_v - m) and
//                           E = Σ_v exp(z_v - m)(z_v - m) in ascending v.
//
// The accumulation type is float32 for float32 and bfloat16 inputs and float64 for float64
// inputs. Results are cast back to the input dtype (the stats stay in the accumulation type).
// Every output element is computed by one thread, so the thread count changes nothing.
//
// The engine (prefill, chunked prefill, decode, prefix-cache hits) and the trainer (packed
// micro-batches) call these same functions when the mode is on, so a token's log-prob is the
// same bits in both (docs/architecture.md, "Deterministic mode").
//
// CPU tensors in every build, CUDA tensors in CUDA builds (src/model/cuda/invariant_ops.h: a
// cuBLASLt GEMM with one pinned algorithm per weight shape and no split-K, one warp per query
// and head walking its keys in order, one block per row in a fixed tree). CPU and CUDA sum in
// different orders; each is fixed, so on one device engine and trainer agree bit for bit.
// Differentiable in the inputs that require grad: the backward uses LibTorch's ordinary ops (the
// gradients need not be batch-invariant, only the forward values).
#ifndef SLIME_MODEL_BATCH_INVARIANT_H_
#define SLIME_MODEL_BATCH_INVARIANT_H_

#include <torch/types.h>

namespace slime::model {

// The process-wide switch the model's layers consult (default off). Set it once at start-up,
// before any forward; the engine and trainer workers set it from their options.
void SetBatchInvariant(bool on);
bool BatchInvariant();

// Whether this build has batch-invariant kernels for tensors on `device` (CPU: always; CUDA: in
// CUDA builds).
bool InvariantKernelsServe(const torch::Device& device);

// The model's linear layers: InvariantLinear when the mode is on (CPU tensors), else
// torch::linear.
torch::Tensor Linear(const torch::Tensor& x, const torch::Tensor& weight,
                     const torch::Tensor& bias = torch::Tensor());

// y = x Wᵀ (+ bias): x [..., K], weight [N, K], bias [N] or undefined -> [..., N].
torch::Tensor InvariantLinear(const torch::Tensor& x, const torch::Tensor& weight,
                              const torch::Tensor& bias = torch::Tensor());

// Σ_d x_d² / D per row of float32 x [..., D] -> [..., 1] (RMSNorm's variance); differentiable.
torch::Tensor InvariantMeanSquare(const torch::Tensor& x);

// Causal attention of one sequence's last n positions over its L >= n positions (query i sits
// at position L - n + i and sees keys 0..L - n + i), scale 1/sqrt(head_dim):
//   q [n, heads, D], k/v [L, kv_heads, D] (heads % kv_heads == 0; strided views allowed)
//   -> [n, heads, D] in q's dtype.
torch::Tensor InvariantCausalAttention(const torch::Tensor& q, const torch::Tensor& k,
                                       const torch::Tensor& v);

// The same attention for the engine's paged K/V cache, every sequence of a step in one launch
// (CUDA only): query row r of q [T, heads, D] (each row's heads packed; rows may be strided)
// sees keys j = 0..row_meta[r][1], key j being cache row key_rows[row_meta[r][0] + j] of
// k_cache/v_cache [slots, kv_heads, D]. Row r's result is the bits InvariantCausalAttention
// gives the same query over the same keys (one kernel, one order per row). Not differentiable.
// `rows_are_sequences` (every row reads keys no other row reads, as a step of decodes does)
// picks the launch shape for such rows; it changes no row's bits.
torch::Tensor InvariantPagedAttention(const torch::Tensor& q, const torch::Tensor& k_cache,
                                      const torch::Tensor& v_cache, const torch::Tensor& key_rows,
                                      const torch::Tensor& row_meta,
                                      bool rows_are_sequences = false);

// The decode form (one new token per sequence, the decode CUDA graphs' inputs): row b of
// q [B, heads, D] sees keys 0..seq_lens[b] - 1 of its pages, key j being cache row
// page_table[b][j / page_size] * page_size + j % page_size. The same bits as the key_rows
// form over the same keys. CUDA only; not differentiable.
torch::Tensor InvariantPagedDecodeAttention(const torch::Tensor& q, const torch::Tensor& k_cache,
                                            const torch::Tensor& v_cache,
                                            const torch::Tensor& page_table,
                                            const torch::Tensor& seq_lens, int64_t page_size);

// Per row of z [C, V] (float32, or float64 on CPU): the max, log S and, with `with_entropy`, E / S
// (the softmax mean of z - m). Not differentiable (the log-prob op has its own backward).
struct SoftmaxStats {
  torch::Tensor max;           // [C]
  torch::Tensor log_sum;       // [C]
  torch::Tensor mean_shifted;  // [C]; undefined unless with_entropy
};
SoftmaxStats InvariantSoftmaxStats(const torch::Tensor& z, bool with_entropy);

// log softmax(float(logits) / temperature)[target] per row, from InvariantSoftmaxStats — the
// engine's returned log-probs in deterministic mode, bitwise what the trainer's log-prob op
// computes for the same logits. logits [C, V] (any floating dtype), targets [C] integer.
torch::Tensor InvariantTokenLogProbs(const torch::Tensor& logits, const torch::Tensor& targets,
                                     double temperature);

}  // namespace slime::model

#endif  // SLIME_MODEL_BATCH_INVARIANT_H_
