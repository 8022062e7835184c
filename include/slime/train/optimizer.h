// AdamW over the decoder's parameters, with Megatron's (and PyTorch's AdamW) semantics.
//
// One step, for lr given by the caller (the LR schedule lives elsewhere):
//   1. g = param.grad() converted to float32. With bf16 parameters the gradients are
//      accumulated in bf16 on the model by autograd (over the micro-batches of the step) and
//      converted here, once per step. A trainable parameter without a gradient counts as a
//      zero gradient (Megatron's grad buffers are always defined).
//   2. norm = sqrt(sum over trainable params of sum(g^2)), accumulated in float32. The sum of
//      squares goes through options.reduce_squared_grad_norm first (the model-parallel seam).
//   3. norm not finite -> the step is skipped: no parameter, master or moment changes, the step
//      counter stays, the gradients are dropped, and the result says skipped (the caller should
//      not advance its LR schedule either, as Megatron does on an unsuccessful update).
//   4. clip_grad > 0 and c = clip_grad / (norm + 1e-6) < 1 -> g *= c (torch/Megatron rule).
//   5. step += 1; for each trainable parameter (master = the fp32 copy, or the parameter itself
//      when it is float32), in torch::optim::AdamW's order:
//        master *= 1 - lr * weight_decay             (decoupled; only where decay applies)
//        m = beta1 * m + (1 - beta1) * g
//        v = beta2 * v + (1 - beta2) * g * g
//        master -= lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
//      then param = master converted to the parameter's dtype (round to nearest for bf16).
//   6. All gradients (trainable and frozen) are dropped (set undefined, as zero_grad(set_to_none)
//      does), so the next step accumulates from scratch.
// Weight decay follows Megatron's default: not applied to biases (names ending in ".bias") and
// 1-D parameters (norms). use_stateless_adam zeroes the moments and the step before every step
// (update = -lr * g / (|g| + eps) plus decay).
//
// Trainable parameters: all, or those selected by only_train_params_name_list (any regex
// matches, std::regex_search, ECMAScript) or not matched by freeze_params_name_list. The regexes
// see HF names ("model.layers.0.self_attn.q_proj.weight"), not Megatron's. Frozen parameters get
// requires_grad = false at Create and have no optimizer state.
//
// State, all float32 on the parameters' device: per trainable parameter exp_avg and exp_avg_sq
// (allocated at Create), plus a master copy when the parameter is not float32; one step counter.
// ExportState/ImportState give it as named tensors for checkpoints:
//   "<hf name>.master" (only for parameters that have a separate master), "<hf name>.exp_avg",
//   "<hf name>.exp_avg_sq", and the step.
//
// Distributed optimizer (ZeRO-1, Megatron's use_distributed_optimizer; options.distributed).
// The trainable parameters, in parameter order, are flattened into one index space of N
// elements, padded to P = dp_size * S (S = ceil(N / dp_size)); DP rank r owns the contiguous
// range [r*S, (r+1)*S) and keeps the float32 master, exp_avg and exp_avg_sq of that range only
// (three [S] float32 tensors; nothing per parameter), so the optimizer state per rank is 1/dp_size
// of the plain optimizer's. Frozen parameters are outside the index space. A step:
//   1. reduce-scatter of the gradients (sum): rank r receives the DP sum of the gradient
//      elements of its range. The gradients go in buckets: bucket k holds the k-th slice of
//      b = max(1, bucket_size / dp_size) elements of every rank's range (rank-major, so one
//      reduce-scatter gives each rank its own slice). A missing gradient is zeros; padding too.
//   2. norm: each rank sums the squares of its range (replicated parameters only on tp_rank 0),
//      dp_all_reduce sums that over the DP group, then reduce_squared_grad_norm (TP, PP) as
//      above. At TP > 1 the flattened index space is this TP rank's local tensors (its shards
//      and its copies of the replicated ones), so the DP group of each TP rank shards those.
//      Every rank sees the same norm, so every rank skips (3) or clips (4) alike.
//   5. the AdamW update of (5) above, on the own range, piece by piece (a piece = the part of one
//      parameter inside the range; weight decay is per parameter); the updated values in the
//      buffers' dtype (the parameters' dtype, or float32 when the trainable parameters mix
//      dtypes; round to nearest).
//   6. all-gather of the updated values in the same buckets, copied into every rank's model
//      parameters; then the gradients are dropped.
// The update of each element is the plain optimizer's, so with the same summed gradients the
// weights equal a plain optimizer's run on one rank with the whole batch (up to the order of the
// floating-point sums over ranks). Checkpoints stay layout-independent: GatherState() all-gathers
// the three ranges into the per-parameter tensors ExportState() gives without sharding, and
// ImportState() of that form keeps each rank's range, so a state saved at any dp_size, sharded
// or not, loads at any other. With dp_size 1 the sharded path runs without collectives (one
// shard holds everything). Requirements: trainable parameters contiguous and on one device.
// Transient memory per step: the own range's gradient [S] and one bucket's input or output
// [dp_size * b], in the buffers' dtype (bf16 on GPU: the reduction runs in bf16, as the plain
// path's all-reduce). On CUDA the fused kernels (model/fused_train.h) run per piece.
// Overlap with backward is not done: the collectives run after the last micro-batch (see
// trainer.h, "Data parallelism").
//
// Ownership: the optimizer holds the model's tensor handles (shared storage). The model must keep
// those tensor objects: update them in place (copy_) when loading or swapping weights, never
// reassign them; after an in-place change call ReloadMastersFromParams(). Thread-safety: one
// thread at a time; Step must not run concurrently with a forward/backward of the same model.
#ifndef SLIME_TRAIN_OPTIMIZER_H_
#define SLIME_TRAIN_OPTIMIZER_H_

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "slime/common/status.h"
#include "slime/model/checkpoint.h"

namespace slime::config {
struct TrainConfig;
}  // namespace slime::config

namespace slime::model {
struct ModelWeights;
struct ModelConfig;
}  // namespace slime::model

namespace slime::train {

// Data-parallel collectives of the distributed optimizer. Every DP rank calls them in the same
// order with 1-D contiguous tensors of one dtype on the parameters' device; `output` may be a
// view into a larger buffer and must be written in place.
//   reduce_scatter(input [dp_size * n], output [n]):
//       output = the sum over ranks of input[dp_rank * n, (dp_rank + 1) * n)
//   all_gather(input [n], output [dp_size * n]): output[r * n, (r + 1) * n) = rank r's input
using DpReduceScatterSumFn =
    std::function<Status(const torch::Tensor& input, torch::Tensor& output)>;
using DpAllGatherFn = std::function<Status(const torch::Tensor& input, torch::Tensor& output)>;
// Sums a tensor over the DP group in place (the same type as advantages.h's AllReduceSumFn).
using DpAllReduceSumFn = std::function<Status(torch::Tensor&)>;

// The two collectives above made of an all-reduce (each rank contributes its part in a zero
// buffer of the full size and keeps its slice of the sum): about twice the traffic of the real
// collectives, for groups that offer only an all-reduce. `all_reduce` must outlive them.
DpReduceScatterSumFn ReduceScatterThroughAllReduce(DpAllReduceSumFn all_reduce, int dp_size,
                                                   int dp_rank);
DpAllGatherFn AllGatherThroughAllReduce(DpAllReduceSumFn all_reduce, int dp_size, int dp_rank);

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  // Decoupled weight decay; biases and 1-D parameters are exempt.
  double weight_decay = 0.01;
  // Maximum global L2 norm of the gradients; 0 turns clipping off.
  double clip_grad = 1.0;
  // slime's use_stateless_adam: moments and step reset before every step.
  bool stateless = false;
  // Regexes over HF parameter names; at most one of the two lists may be non-empty.
  std::vector<std::string> only_train_params_name_list;
  std::vector<std::string> freeze_params_name_list;

  // Model parallelism seam. The gradient norm is a sum over the whole model: a replicated
  // parameter (same on every tensor-parallel rank) counts only on tp_rank 0, and the local sum of
  // squares (a 0-dim float32 tensor on the parameters' device) is handed to
  // reduce_squared_grad_norm, which must replace it with the group's sum (an all-reduce).
  // Unset: one rank, nothing to reduce.
  int tp_rank = 0;
  // Expert parallelism: a parameter that is not an expert's (OptimizerParam::expert; identical on
  // every expert-parallel rank) counts only on ep_rank 0, and reduce_squared_grad_norm must then
  // also sum over the EP group, so each expert counts once.
  int ep_rank = 0;
  std::function<Status(torch::Tensor& squared_norm)> reduce_squared_grad_norm;

  // Distributed optimizer (header comment). The three collectives run over the DP group of
  // dp_size ranks; they are required when distributed and dp_size > 1. bucket_size: elements
  // per reduce-scatter / all-gather summed over the ranks (train.ddp_bucket_size).
  bool distributed = false;
  int dp_size = 1;
  int dp_rank = 0;
  int64_t bucket_size = 40'000'000;
  DpAllReduceSumFn dp_all_reduce;
  DpReduceScatterSumFn dp_reduce_scatter;
  DpAllGatherFn dp_all_gather;

  // lr is per step and not part of the options. distributed and bucket_size come from
  // train.use_distributed_optimizer and train.ddp_bucket_size; tp_rank, the DP rank and size and
  // the collectives are left at their defaults (the caller knows its rank and groups).
  static AdamWOptions FromTrainConfig(const config::TrainConfig& train);
  // Ranges (0 <= beta < 1, eps > 0, weight_decay >= 0, clip_grad >= 0, 0 <= dp_rank < dp_size,
  // bucket_size >= 1), the regex lists, and the collectives a distributed optimizer needs.
  Status Validate() const;
};

// A parameter as the optimizer sees it.
struct OptimizerParam {
  std::string name;         // HF name, unique
  torch::Tensor tensor;     // the model's tensor (shared storage); its grad() is read
  bool replicated = false;  // identical on every tensor-parallel rank (see AdamWOptions::tp_rank)
  // A pipeline stage's copy of a parameter another stage owns (the last stage's tied LM head,
  // model/pipeline_parallel.h): trained like any parameter but never counted in the gradient
  // norm (the owner counts it; reduce_squared_grad_norm sums the stages).
  bool pipeline_copy = false;
  // A mixture-of-experts expert's parameter (model::ParamSpec::expert >= 0): held by one
  // expert-parallel rank, so counted in the norm on every EP rank (see AdamWOptions::ep_rank).
  bool expert = false;
};

// The model's parameters (of weights.stage and weights.experts) in ParameterSpecs order
// (lm_head once when tied), with the replication flag from the tensor-parallel layout, the
// pipeline_copy flag and the expert flag.
std::vector<OptimizerParam> ModelParameters(const model::ModelWeights& weights,
                                            const model::ModelConfig& config);

struct OptimizerStepResult {
  double grad_norm = 0.0;  // global L2 norm before clipping (inf / nan when skipped)
  bool skipped = false;    // the norm was not finite; nothing was updated
  double lr = 0.0;         // the learning rate used
  int64_t step = 0;        // the optimizer's step counter after this call
};

// Checkpoint form of the optimizer state; tensors are float32. Exported tensors share storage
// with the optimizer: write (or clone) them before the next Step.
struct OptimizerState {
  int64_t step = 0;
  std::vector<model::NamedTensor> tensors;
};

class AdamW {
 public:
  // Errors: invalid options, duplicate or undefined parameters, a non-floating parameter, a
  // regex that does not compile, a selection that leaves no parameter trainable.
  static StatusOr<std::unique_ptr<AdamW>> Create(std::vector<OptimizerParam> params,
                                                 AdamWOptions options);
  // Create(ModelParameters(weights, config), options).
  static StatusOr<std::unique_ptr<AdamW>> ForModel(const model::ModelWeights& weights,
                                                   const model::ModelConfig& config,
                                                   AdamWOptions options);
  ~AdamW();
  AdamW(const AdamW&) = delete;
  AdamW& operator=(const AdamW&) = delete;

  // One update with learning rate `lr` (finite, >= 0); see the header comment. Errors: a bad lr,
  // a parameter or gradient whose shape changed, a reducer failure, a LibTorch error (then the
  // state may be partly updated; treat it as fatal).
  StatusOr<OptimizerStepResult> Step(double lr);

  // Drops the gradients of every parameter (set undefined).
  void ZeroGrad();
  // Zeroes exp_avg, exp_avg_sq and the step (slime's reset_optimizer_states); masters are kept.
  void ResetStates();
  // master = float32(param) for parameters with a separate master (after the model's weights
  // were changed in place from outside).
  void ReloadMastersFromParams();

  int64_t step() const { return step_; }
  const AdamWOptions& options() const { return options_; }
  // True when at least one trainable parameter keeps a separate float32 master.
  bool has_master_weights() const;
  // Names of the trainable parameters, in parameter order.
  std::vector<std::string> TrainableNames() const;
  bool IsTrainable(const std::string& name) const;

  // True when the state is sharded over the DP ranks (options.distributed).
  bool distributed() const { return options_.distributed; }

  // Named float32 tensors and the step (see the header comment); they share storage with the
  // optimizer. Not for a distributed optimizer (SLIME_CHECK): use GatherState().
  OptimizerState ExportState() const;
  // The same per-parameter form for any optimizer. Distributed: collective — every DP rank calls
  // it, in the same order; the tensors are new CPU tensors, gathered in buckets (with keep =
  // false this rank takes part and gets only the step). Otherwise ExportState(). Errors: a
  // collective's failure.
  StatusOr<OptimizerState> GatherState(bool keep = true) const;
  // Every state tensor this rank holds (masters and moments; the three shard tensors when
  // distributed), e.g. to offload them.
  std::vector<torch::Tensor> StateTensors() const;
  // Checks that `state` fits these parameters: every trainable parameter's exp_avg and
  // exp_avg_sq present, float32, of the parameter's shape; ".master" tensors (optional) too; no
  // tensor for an unknown or frozen parameter; step >= 0. Errors name the tensor.
  Status ValidateState(const OptimizerState& state) const;
  // ValidateState, then copies the state in. A master in `state` also overwrites the model
  // parameter (converted), and for a float32 parameter it is the parameter. A parameter with a
  // separate master but none in `state` gets master = float32(param). Distributed: `state` is
  // the full per-parameter form (as GatherState gives, or a plain optimizer's); every rank
  // writes the full parameters and keeps its range of the rest. Not collective.
  Status ImportState(const OptimizerState& state);

 private:
  struct Slot;
  struct Shard;
  AdamW(std::vector<Slot> slots, AdamWOptions options);
  StatusOr<OptimizerStepResult> StepImpl(double lr);
  StatusOr<OptimizerStepResult> StepSharded(double lr);
  // Distributed: the shard layout and state (called once by Create).
  Status BuildShard();
  const Slot* FindSlot(const std::string& name) const;

  std::vector<Slot> slots_;  // one per parameter, in parameter order
  AdamWOptions options_;
  int64_t step_ = 0;
  std::unique_ptr<Shard> shard_;  // distributed only
};

}  // namespace slime::train

#endif  // SLIME_TRAIN_OPTIMIZER_H_
