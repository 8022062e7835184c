// Tensor parallelism for the decoder: the group handle the layers talk to, and the
// Megatron-style parallel layers built on it.
//
// TensorParallelGroup is a tiny torch-free interface (rank, size, all-reduce, all-gather); the
// model only ever sees it. SingleRankGroup (size 1, identity) is the default;
// comm::ProcessGroupTensorParallel (comm/tensor_parallel_group.h) runs the collectives on a
// c10d Gloo / NCCL group.
//
// Autograd (Megatron's mappings, torch::autograd::Function). When a graph is recorded (grad
// mode on and the input requires grad) the collectives are differentiable:
//   copy-to-region     identity forward, all-reduce of the gradient backward — the replicated
//                      input of column-parallel layers (each rank's W_r only sees its part of
//                      ∂L/∂x; the sum over ranks is the full gradient, identical on every rank)
//   reduce-from-region all-reduce forward, identity backward — the row-parallel output and the
//                      vocab-parallel embedding (every rank already holds the full ∂L/∂y)
//   gather-from-region all-gather along the last dim forward, this rank's slice backward —
//                      gather_output
// and, for sequence parallelism (Megatron's SP: the token dim T of the residual stream, the
// norms and the embedding output is split over the P ranks, rank r holding rows
// SequenceShard(T, P, r), so those activations take 1/P of the memory):
//   gather-from-sequence  all-gather along T forward (before the column-parallel layers),
//                         reduce-scatter backward (or this rank's rows, where the gradient is
//                         already identical on every rank: before the LM head, whose input
//                         goes through copy-to-region)
//   reduce-scatter-to-sequence  reduce-scatter along T forward (the row-parallel output and the
//                         vocab-parallel embedding), all-gather backward
//   scatter-to-sequence   this rank's rows forward, all-gather backward (a later pipeline
//                         stage's full input)
// With SP the norm weights (and row-parallel biases) see only this rank's rows, so they enter
// through copy-to-region like q_norm / k_norm (their gradient is summed over the ranks).
// T need not divide by P: the first T % P ranks hold one row more (the collectives pad).
// so a TP=P model computes the TP=1 function and its gradients: sharded parameters get their
// slice of the full gradient, replicated parameters (norms, row-parallel biases) the full
// gradient on every rank. Without a graph (inference) the plain collectives run, in place
// where the tensor is fresh. Every rank must run the same ops in the same order (forward and
// backward), as with any collective.
//
// Layouts (Megatron / HF tp_plan "colwise"/"rowwise"), for a TP group of size P, rank r:
//   column-parallel: W_r [out/P, in]  = rows    [r*out/P, (r+1)*out/P) of W; b_r likewise.
//   row-parallel:    W_r [out, in/P]  = columns [r*in/P, (r+1)*in/P)  of W; b full, added once.
//   vocab-parallel:  E_r [V/P, hidden] = rows  [r*V/P, (r+1)*V/P) of the embedding / LM head.
//
// Thread-safety: a group is used by the one thread that owns the model replica (and the
// autograd backward it runs). Collective failures throw (c10::Error or std::runtime_error); the
// model's public entry points catch them and return a Status (a failure inside backward()
// throws from backward(), which the trainer catches).
#ifndef SLIME_MODEL_TENSOR_PARALLEL_H_
#define SLIME_MODEL_TENSOR_PARALLEL_H_

#include <cstdint>
#include <memory>

namespace at {
class Tensor;
}  // namespace at

namespace slime::model {

class TensorParallelGroup {
 public:
  virtual ~TensorParallelGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Sums `tensor` element-wise over all ranks, in place.
  virtual void AllReduceSum(at::Tensor& tensor) = 0;
  // Concatenation of every rank's `tensor` along `dim`, in rank order.
  virtual at::Tensor AllGather(const at::Tensor& tensor, int64_t dim) = 0;
  // This rank's chunk along dim 0 of the element-wise sum over ranks: rows
  // [rank·N/P, (rank+1)·N/P) of the [N, ...] sum (N divisible by size()). The default is an
  // all-reduce of a copy and a slice; a c10d group overrides it with one reduce-scatter.
  virtual at::Tensor ReduceScatterSum(const at::Tensor& tensor);
};

// Rows [start, start + rows) of a T-row tensor that rank `rank` of `size` holds under sequence
// parallelism: contiguous, the first T % size ranks one row more.
struct SequenceShard {
  int64_t start = 0;
  int64_t rows = 0;
};
SequenceShard SequenceShardOf(int64_t total, int size, int rank);

// The group of one rank: collectives are identities.
class SingleRankGroup final : public TensorParallelGroup {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void AllReduceSum(at::Tensor& tensor) override;
  at::Tensor AllGather(const at::Tensor& tensor, int64_t dim) override;
};

std::shared_ptr<TensorParallelGroup> MakeSingleRankGroup();

// The mappings above (identities for a group of size 1). Each returns a new autograd node
// only when a graph is recorded.
at::Tensor CopyToTensorParallelRegion(const at::Tensor& x, TensorParallelGroup& group);
at::Tensor ReduceFromTensorParallelRegion(const at::Tensor& x, TensorParallelGroup& group);
at::Tensor GatherFromTensorParallelRegion(const at::Tensor& x, TensorParallelGroup& group);

// Sequence-parallel mappings (file comment); identities for a group of size 1. x is this
// rank's SequenceShardOf(total_rows) rows [rows_r, ...] (Gather, with reduce_grad = false where
// the incoming gradient is identical on every rank) or a full [T, ...] tensor (the others).
at::Tensor GatherFromSequenceParallelRegion(const at::Tensor& x, TensorParallelGroup& group,
                                            int64_t total_rows, bool reduce_grad);
at::Tensor ReduceScatterToSequenceParallelRegion(const at::Tensor& x, TensorParallelGroup& group);
at::Tensor ScatterToSequenceParallelRegion(const at::Tensor& x, TensorParallelGroup& group);

// y = x W^T + b for a column-parallel weight: x [..., in], W_r [out/P, in], b_r [out/P] or
// undefined. Returns this rank's columns of y [..., out/P], or all of y [..., out] when
// `gather_output`. x goes through copy-to-region first, unless `input_in_region` says the
// caller already did that (several layers sharing one input, e.g. q/k/v: one all-reduce of
// the input gradient instead of one per layer; doing it twice would multiply it by P).
at::Tensor ColumnParallelLinear(const at::Tensor& x, const at::Tensor& weight,
                                const at::Tensor& bias, TensorParallelGroup& group,
                                bool gather_output, bool input_in_region = false);

// y = sum_r x_r W_r^T + b for a row-parallel weight: x_r [..., in/P] (this rank's part of the
// input, e.g. a column-parallel output), W_r [out, in/P], b [out] or undefined. Returns y
// [..., out], identical on every rank.
at::Tensor RowParallelLinear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                             TensorParallelGroup& group);
// The same, ending in this rank's sequence shard: x_r [T, in/P] -> rows SequenceShardOf(T) of
// y [rows_r, out] (the partial sums reduce-scattered instead of all-reduced; b added to the
// shard, its gradient summed over the ranks).
at::Tensor RowParallelLinearToSequenceShard(const at::Tensor& x, const at::Tensor& weight,
                                            const at::Tensor& bias, TensorParallelGroup& group);

// Embedding rows for `ids` [T] (int64, global vocabulary ids) from a vocab-parallel table
// E_r [V/P, hidden]. Returns [T, hidden], identical on every rank.
at::Tensor VocabParallelEmbedding(const at::Tensor& ids, const at::Tensor& weight,
                                  TensorParallelGroup& group);
// The same, ending in this rank's sequence shard [rows_r, hidden] (reduce-scatter).
at::Tensor VocabParallelEmbeddingToSequenceShard(const at::Tensor& ids, const at::Tensor& weight,
                                                 TensorParallelGroup& group);

// Logits of hidden [T, hidden] against a vocab-parallel LM head W_r [V/P, hidden]: this rank's
// [T, V/P], or the full [T, V] when `gather_output`.
at::Tensor VocabParallelLmHead(const at::Tensor& hidden, const at::Tensor& weight,
                               TensorParallelGroup& group, bool gather_output);

}  // namespace slime::model

#endif  // SLIME_MODEL_TENSOR_PARALLEL_H_
