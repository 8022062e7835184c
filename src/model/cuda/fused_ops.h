// Fused inference kernels for the decoder's elementwise stages (CUDA builds only; raw pointers,
// no LibTorch headers). Each reproduces the rounding of the eager LibTorch ops it replaces:
//   RmsNorm:  y = w * T(x_f * rsqrt(mean(x_f^2) + eps))      (HF: normalise in float32, cast, scale)
//   Rope:     y = T(T(x * cos) + T(rotate_half(x) * sin))    (same three roundings as eager)
//   SiluMul:  y = T(T(silu(g)) * u)
// where T() rounds to the storage dtype. RmsNorm's float reduction order differs from
// torch's mean, so it can differ from eager by one rounding step; Rope and SiluMul are exact.
// Used only under inference mode (no autograd); the trainer keeps the eager ops.
#ifndef SLIME_SRC_MODEL_CUDA_FUSED_OPS_H_
#define SLIME_SRC_MODEL_CUDA_FUSED_OPS_H_

#include <cstdint>

namespace slime::model::cuda {

enum class DType { kFloat32, kFloat16, kBFloat16 };

// x, y [rows, n]; w [n]. Returns a cudaError_t as int (0 = ok).
int LaunchRmsNorm(const void* x, const void* w, void* y, int64_t rows, int n, float eps,
                  DType dtype, void* stream);
// x, y [tokens, heads, d]; cos, sin [tokens, d] (d even).
int LaunchRope(const void* x, const void* cos, const void* sin, void* y, int64_t tokens,
               int heads, int d, DType dtype, void* stream);
// g, u, y [n].
int LaunchSiluMul(const void* g, const void* u, void* y, int64_t n, DType dtype, void* stream);

}  // namespace slime::model::cuda

#endif  // SLIME_SRC_MODEL_CUDA_FUSED_OPS_H_
