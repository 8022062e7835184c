// Fused training kernels (CUDA builds only; raw pointers, no LibTorch headers): the backward
// passes of the decoder's elementwise stages and a one-pass log-softmax over LM-head logits.
// The forward passes reuse fused_ops.h (RmsNorm, Rope, SiluMul); the autograd functions that tie
// them together are in ../fused_autograd.cc, the log-prob function in src/train/logprobs.cc.
//
// Math (T() rounds to the storage dtype, everything else is float32):
//   RmsNormBackward: r = rsqrt(mean(x^2) + eps), xhat = x r, g = dy w;
//                    dx = r (g - xhat · mean(g · xhat)),  dw += Σ_rows dy · T(xhat)
//   SiluMulBackward: s = sigmoid(g); du = T(dy · T(g s)); dg = T(dy · u · s (1 + g (1 - s)))
//   LogSoftmaxStats: per row of logits l [C, V], z = l / temperature:
//                    m = max z, S = Σ exp(z - m), log_probs = z[target] - m - log S,
//                    mean_shifted = E_p[z] - m, entropy = log S - mean_shifted
//                    (one pass, online max; no [C, V] float32 buffer)
//   LogSoftmaxGrad:  in place over l: ((g_ent (mean_shifted - (z - m)) - g_lp) p
//                    + g_lp · onehot(target)) / temperature, p = exp(z - m - log S)
#ifndef SLIME_SRC_MODEL_CUDA_TRAIN_OPS_H_
#define SLIME_SRC_MODEL_CUDA_TRAIN_OPS_H_

#include <cstdint>

#include "slime/model/cuda/launch.h"  // DType

namespace slime::model::cuda {

// x, dy, dx [rows, n]; w [n]; dw_accum [n] float32, added to (the caller zeroes it).
int LaunchRmsNormBackward(const void* x, const void* w, const void* dy, void* dx, float* dw_accum,
                          int64_t rows, int n, float eps, DType dtype, void* stream);

// g, u, dy, dg, du [n].
int LaunchSiluMulBackward(const void* g, const void* u, const void* dy, void* dg, void* du,
                          int64_t n, DType dtype, void* stream);

// logits [rows, v] (row stride v); targets [rows] int64 in [0, v); outputs [rows] float32 each
// (entropy may be null).
struct LogSoftmaxStatsArgs {
  const void* logits = nullptr;
  const int64_t* targets = nullptr;
  int64_t rows = 0;
  int64_t v = 0;
  float inv_temperature = 1.f;
  float* log_probs = nullptr;
  float* entropy = nullptr;
  float* row_max = nullptr;
  float* log_sum = nullptr;
  float* mean_shifted = nullptr;
  DType dtype = DType::kBFloat16;
};
int LaunchLogSoftmaxStats(const LogSoftmaxStatsArgs& args, void* stream);

// logits [rows, v] overwritten by ∂loss/∂logits in the same dtype. g_lp / g_ent [rows] float32,
// either may be null (no gradient through that output).
struct LogSoftmaxGradArgs {
  void* logits = nullptr;
  const int64_t* targets = nullptr;
  int64_t rows = 0;
  int64_t v = 0;
  float inv_temperature = 1.f;
  const float* row_max = nullptr;
  const float* log_sum = nullptr;
  const float* mean_shifted = nullptr;
  const float* g_lp = nullptr;
  const float* g_ent = nullptr;
  DType dtype = DType::kBFloat16;
};
int LaunchLogSoftmaxGrad(const LogSoftmaxGradArgs& args, void* stream);

// Training forward kernels with 16-byte loads (the inference ones of fused_ops.h are tuned for
// decode steps); same math and roundings as RmsNorm / Rope / SiluMul there.
// x, y [rows, n]; w [n]; n % (16 / sizeof(T)) == 0 (else cudaErrorInvalidValue).
int LaunchRmsNormForward(const void* x, const void* w, void* y, int64_t rows, int n, float eps,
                         DType dtype, void* stream);
// x, y [tokens, heads, d]; cos, sin [tokens, d]; (d / 2) % (16 / sizeof(T)) == 0.
int LaunchRopeForward(const void* x, const void* cos, const void* sin, void* y, int64_t tokens,
                      int heads, int d, DType dtype, void* stream);
// g, u, y [n], n % (16 / sizeof(T)) == 0.
int LaunchSiluMulForward(const void* g, const void* u, void* y, int64_t n, DType dtype,
                         void* stream);

// Σ grad² (float32) added to *accum (a device scalar). grad [n] of `dtype`.
int LaunchAddSquaredNorm(const void* grad, int64_t n, float* accum, DType dtype, void* stream);

// One AdamW step over one parameter (torch's decoupled weight decay, as the eager update):
//   g = grad · grad_scale (0 when grad is null); target = master, or param when master is null
//   (then param is float32); target *= decay_factor; m = β1 m + (1-β1) g;
//   v = β2 v + (1-β2) g²; target -= step_size · m / (sqrt(v) / bc2_sqrt + eps);
//   param = T(target) when master is set.
struct AdamWArgs {
  void* param = nullptr;        // [n], `dtype`
  const void* grad = nullptr;   // [n], `dtype`, or null
  float* master = nullptr;      // [n] or null
  float* exp_avg = nullptr;     // [n]
  float* exp_avg_sq = nullptr;  // [n]
  int64_t n = 0;
  float grad_scale = 1.f;
  float decay_factor = 1.f;
  float beta1 = 0.9f, beta2 = 0.999f;
  // 1 - β1 and 1 - β2 rounded once from double (as the eager update's alpha arguments):
  // 1.0f - 0.999f is 1.3e-5 away from 0.001f.
  float one_minus_beta1 = 0.1f, one_minus_beta2 = 0.001f;
  float step_size = 0.f;
  float bc2_sqrt = 1.f;
  float eps = 1e-8f;
  DType dtype = DType::kBFloat16;
};
int LaunchAdamW(const AdamWArgs& args, void* stream);

}  // namespace slime::model::cuda

#endif  // SLIME_SRC_MODEL_CUDA_TRAIN_OPS_H_
