// Fused training ops for CUDA builds: autograd functions for the decoder's elementwise stages
// (RMSNorm, RoPE, SiLU·up) with hand-written backward kernels, and the one-pass log-softmax the
// trainer's log-prob pass uses (src/train/logprobs.cc). They replace chains of 5-15 eager
// kernels each (and their float32 intermediates) in the training forward and backward; the math
// is that of the eager ops (src/model/cuda/train_ops.h gives it), with float32 reductions in a
// different order, so results agree with eager to rounding (tests/model/gpu_test.cc checks it).
//
// On: CUDA builds, CUDA tensors of float32 / bfloat16 / float16, outside InferenceMode (the
// engine has its own fused inference path) — except the decoder's elementwise ops in
// deterministic mode, which serve the engine too (FusedDecoderOpsApply). Off: CPU builds, CPU
// tensors, or SLIME_FUSED_TRAIN=0 in the environment / SetFusedTraining(false) (A/B measurements
// and tests); then callers use the eager ops. Thread-safety: the switch is a process-wide atomic;
// the ops are as LibTorch's.
#ifndef SLIME_MODEL_FUSED_TRAIN_H_
#define SLIME_MODEL_FUSED_TRAIN_H_

#include <torch/types.h>

namespace slime::model {

bool FusedTrainingEnabled();
void SetFusedTraining(bool enabled);
// True when the fused training ops serve `x`: a CUDA build with the switch on, `x` on CUDA in a
// supported dtype.
bool FusedTrainingApplies(const torch::Tensor& x);

// True when the decoder's fused elementwise ops below serve `x`: as FusedTrainingApplies, and in
// deterministic mode (batch_invariant.h) also inside InferenceMode — the engine's forward — since
// their kernels compute every row on its own in one fixed order: the engine and the trainer call
// the same kernels and get the same bits.
bool FusedDecoderOpsApply(const torch::Tensor& x);

// Autograd functions (the caller checked FusedDecoderOpsApply); without autograd (InferenceMode,
// or no input needing a gradient under NoGrad) the same forward kernel runs on its own.
// y = weight · T(x · rsqrt(mean(x², -1) + eps)), over the last dim; gradients for x and weight.
torch::Tensor FusedRmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps);
// x [T, heads, D] rotated by cos/sin [T, 1, D] (rotate-half convention); gradient for x only.
torch::Tensor FusedRope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);
// silu(gate) · up; gradients for both.
torch::Tensor FusedSiluMul(const torch::Tensor& gate, const torch::Tensor& up);

// Per-row log-softmax statistics of logits / temperature ([C, V] contiguous, targets [C]
// int64): all [C] float32. `entropy` is undefined when not asked for.
struct LogSoftmaxRows {
  torch::Tensor log_probs;     // z[target] - m - log S
  torch::Tensor entropy;       // log S - mean_shifted
  torch::Tensor row_max;       // m = max z
  torch::Tensor log_sum;       // log S, S = Σ exp(z - m)
  torch::Tensor mean_shifted;  // E_p[z] - m
};
LogSoftmaxRows FusedLogSoftmaxRows(const torch::Tensor& logits, const torch::Tensor& targets,
                                   double temperature, bool with_entropy);
// Overwrites `logits` (the same logits again, [C, V] contiguous) with ∂loss/∂logits for the
// upstream gradients g_lp / g_ent ([C] float32, either may be undefined).
void FusedLogSoftmaxBackwardInPlace(torch::Tensor& logits, const torch::Tensor& targets,
                                    const LogSoftmaxRows& rows, const torch::Tensor& g_lp,
                                    const torch::Tensor& g_ent, double temperature);

// Optimizer kernels (CUDA tensors, contiguous). accum: a float32 scalar on grad's device.
void FusedAddSquaredNorm(const torch::Tensor& grad, torch::Tensor& accum);
// One AdamW update of one parameter in one kernel (the eager update of train/optimizer.cc:
// decoupled decay, moments, bias-corrected step; param rewritten from the float32 master when
// there is one). `grad` may be undefined (no gradient: the moments only decay).
struct FusedAdamWStep {
  double grad_scale = 1.0;    // clip coefficient
  double decay_factor = 1.0;  // 1 - lr · weight_decay, or 1
  double beta1 = 0.9, beta2 = 0.999;
  double step_size = 0.0;  // lr / bias_correction1
  double bias_correction2_sqrt = 1.0;
  double eps = 1e-8;
};
void FusedAdamW(torch::Tensor& param, const torch::Tensor& grad, torch::Tensor& master,
                torch::Tensor& exp_avg, torch::Tensor& exp_avg_sq, const FusedAdamWStep& step);

}  // namespace slime::model

#endif  // SLIME_MODEL_FUSED_TRAIN_H_
