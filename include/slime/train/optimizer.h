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
  std::function<Status(torch::Tensor& squared_norm)> reduce_squared_grad_norm;

  // lr is per step and not part of the options. tp_rank and the reducer are left at their
  // defaults (the caller knows its rank and group).
  static AdamWOptions FromTrainConfig(const config::TrainConfig& train);
  // Ranges (0 <= beta < 1, eps > 0, weight_decay >= 0, clip_grad >= 0) and the regex lists.
  Status Validate() const;
};

// A parameter as the optimizer sees it.
struct OptimizerParam {
  std::string name;         // HF name, unique
  torch::Tensor tensor;     // the model's tensor (shared storage); its grad() is read
  bool replicated = false;  // identical on every tensor-parallel rank (see AdamWOptions::tp_rank)
};

// The model's parameters in ParameterSpecs order (lm_head once when tied), with the replication
// flag from the tensor-parallel layout.
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

  // Named float32 tensors and the step (see the header comment).
  OptimizerState ExportState() const;
  // Checks that `state` fits these parameters: every trainable parameter's exp_avg and
  // exp_avg_sq present, float32, of the parameter's shape; ".master" tensors (optional) too; no
  // tensor for an unknown or frozen parameter; step >= 0. Errors name the tensor.
  Status ValidateState(const OptimizerState& state) const;
  // ValidateState, then copies the state in. A master in `state` also overwrites the model
  // parameter (converted), and for a float32 parameter it is the parameter. A parameter with a
  // separate master but none in `state` gets master = float32(param).
  Status ImportState(const OptimizerState& state);

 private:
  struct Slot;
  AdamW(std::vector<Slot> slots, AdamWOptions options);
  StatusOr<OptimizerStepResult> StepImpl(double lr);
  const Slot* FindSlot(const std::string& name) const;

  std::vector<Slot> slots_;  // one per parameter, in parameter order
  AdamWOptions options_;
  int64_t step_ = 0;
};

}  // namespace slime::train

#endif  // SLIME_TRAIN_OPTIMIZER_H_
