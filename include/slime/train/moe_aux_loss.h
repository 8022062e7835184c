// The mixture-of-experts router losses of the trainer (Megatron's --moe-aux-loss-coeff and
// --moe-z-loss-coeff; HF's router_aux_loss_coef with output_router_logits) and their metrics.
//
// Per sparse layer l, over the micro-batch's T real tokens (the packing's padding rows are
// excluded) with router logits [T, E] and k = num_experts_per_tok, in float32:
//   p      = softmax(logits)                      [T, E]
//   sel    = topk(p, k)                           [T, k] (the model's routing, ffn/moe.h)
//   f_e    = |{slots routed to e}| / (T·k)        fraction of the T·k slots (Σ_e f_e = 1)
//   P_e    = mean_t p[t, e]
//   aux_l  = E · Σ_e f_e · P_e                    1 when perfectly balanced, up to E
//   z_l    = mean_t logsumexp(logits[t])²
// f is a constant (top-k has no gradient); the gradient reaches the router through P and
// logsumexp. This is Megatron's switch_load_balancing_loss_func / z_loss_func per layer (HF's
// load_balancing_loss_func pools all layers' tokens instead and has Σ_e f_e = k).
//
// The loss added to the policy (or SFT) objective of one optimizer step, as Megatron does
// (each layer's MoEAuxLossAutoScaler adds its own term; micro-batches averaged):
//   L_moe = Σ_mb w_mb · Σ_l (aux_coeff · aux_l(mb) + z_coeff · z_l(mb))
//   w_mb  = T_mb / T_step: the micro-batch's real tokens over the step's tokens on all DP ranks
// — a token-weighted mean over the step's micro-batches (Megatron's plain mean over
// micro-batches and DP ranks when they hold equal token counts), summed over the sparse layers
// (not averaged: the coefficient means what it means in Megatron). With the DP all-reduce SUM
// of the gradients this is the step's objective on every DP rank, like the other loss terms
// (losses.h).
//
// Gradient path: the term is not added to the micro-batch's loss tensor but attached to each
// sparse layer's output (AttachLoss, Megatron's MoEAuxLossAutoScaler): the layer's backward
// adds d(term)/d(logits). So it works on every pipeline stage (each stage's layers carry their
// own term) and under activation recomputation (the recomputed layer attaches it in the
// backward's rerun; the no-graph forward attaches nothing): counted once either way. Under
// tensor parallelism every rank computes the same term from the same (replicated) logits and
// attaches 1/tp of it: the router's and the layer input's gradients are summed over the ranks.
//
// Metrics (per optimizer step, token-weighted over the micro-batches like L_moe, before the
// coefficients):
//   moe_aux_loss                   mean over the model's sparse layers of aux_l
//   moe_z_loss                     mean over the sparse layers of z_l (only with z_coeff != 0)
//   moe_load_imbalance/layer_{l}   E · max_e f_e of sparse layer l (1 = balanced, E = one
//                                  expert takes every slot); one per sparse layer
// all reported by every pipeline stage (summed over the stages' layers).
//
// Thread-safety: RouterLoadBalance and AttachLoss are pure. A MoeRouterLoss belongs to the
// trainer's thread; its hook (DecoderModel::set_router_loss_hook) also runs on the autograd
// engine's thread during a backward the trainer thread waits on.
#ifndef SLIME_TRAIN_MOE_AUX_LOSS_H_
#define SLIME_TRAIN_MOE_AUX_LOSS_H_

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "slime/common/status.h"
#include "slime/config/config.h"
#include "slime/model/config.h"
#include "slime/model/pipeline_parallel.h"

namespace slime::model {
class DecoderModel;
}  // namespace slime::model

namespace slime::train {

// One layer's terms (see the header comment) of router logits [T, E] (any floating dtype).
struct RouterBalance {
  torch::Tensor aux;       // 0-dim float32 aux_l (differentiable in the logits)
  torch::Tensor z;         // 0-dim float32 z_l (differentiable)
  torch::Tensor fraction;  // [E] float32 f_e (no gradient)
};
// T = 0 gives aux = z = 0 and f = 0 (still connected to the logits' graph).
RouterBalance RouterLoadBalance(const torch::Tensor& logits, int64_t top_k);

// Returns x unchanged (a view) whose backward also gives `loss` (0-dim) the gradient 1:
// backpropagating from anything that depends on the result adds d(loss)/d(its inputs) once.
torch::Tensor AttachLoss(const torch::Tensor& x, const torch::Tensor& loss);

// train.moe_aux_loss_coeff / moe_z_loss_coeff against the model: a nonzero one on a model with
// no sparse layer is InvalidArgument naming the key (it would do nothing).
Status CheckMoeLossConfig(const config::TrainConfig& train, const model::ModelConfig& model);

// The trainer's state for L_moe over one optimizer step. Usage per step:
//   BeginStep(T_step, micro-batch token counts); Install(model) (capture + hook on);
//   per micro-batch k and stage pass: Select(k) before its forward and before its backward;
//   AccumulateMetrics(model, sums) after its forward; Uninstall(model) after the backward passes;
//   TakeStageMetrics(sums) after the DP reduction; then (pipeline) SumOverStages.
class MoeRouterLoss {
 public:
  // Null when both coefficients are 0 (nothing to do) or the model has no sparse layer.
  static std::unique_ptr<MoeRouterLoss> Create(const config::TrainConfig& train,
                                               const model::ModelConfig& model,
                                               const model::PipelineStage& stage, int tp_size);

  // The step's real tokens on all DP ranks and this rank's micro-batches' real token counts.
  void BeginStep(int64_t step_tokens, std::vector<int64_t> micro_batch_tokens);
  void Select(size_t micro_batch) { current_ = micro_batch; }
  // Capture and hook on / off (the hook reads this object: it must outlive the install).
  void Install(model::DecoderModel& model);
  void Uninstall(model::DecoderModel& model);

  // After the forward of the selected micro-batch: its metric terms (no graph) into `sums`.
  // The stage's metric names are always present (zeros first) so DP ranks agree on them.
  void AccumulateMetrics(const model::DecoderModel& model,
                         std::map<std::string, torch::Tensor>& sums) const;
  // Moves this stage's metrics out of `sums` into a vector in MetricNames() order (zeros for
  // other stages' layers): summing it over the pipeline stages gives the model's metrics.
  std::vector<double> TakeStageMetrics(std::map<std::string, torch::Tensor>& sums) const;
  // The model-wide metric names, the same on every stage.
  const std::vector<std::string>& MetricNames() const { return names_; }

 private:
  MoeRouterLoss() = default;
  // DecoderModel::RouterLossHook.
  torch::Tensor Attach(int layer, const torch::Tensor& logits, const torch::Tensor& out) const;
  // The selected micro-batch's real rows of `logits`.
  torch::Tensor RealRows(const torch::Tensor& logits) const;

  double aux_coeff_ = 0.0;
  double z_coeff_ = 0.0;
  int64_t top_k_ = 1;
  int64_t num_experts_ = 1;
  int tp_size_ = 1;
  std::vector<int64_t> sparse_layers_;  // the model's, ascending
  std::vector<int64_t> stage_layers_;   // the sparse layers of this pipeline stage
  std::vector<std::string> names_;      // moe_aux_loss, [moe_z_loss], imbalance per layer
  int64_t step_tokens_ = 1;
  std::vector<int64_t> micro_batch_tokens_;
  size_t current_ = 0;
};

}  // namespace slime::train

#endif  // SLIME_TRAIN_MOE_AUX_LOSS_H_
