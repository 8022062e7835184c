// Fused inference kernels for the decoder's elementwise stages (CUDA builds only; raw pointers,
// no LibTorch headers). Each reproduces the rounding of the eager LibTorch ops it replaces:
//   RmsNorm:  y = w * T(x_f * rsqrt(mean(x_f^2) + eps))      (HF: normalise in float32, cast, scale)
//   Rope:     y = T(T(x * cos) + T(rotate_half(x) * sin))    (same three roundings as eager)
//   SiluMul:  y = T(T(silu(g)) * u)
//   AddRmsNorm: residual = T(residual + delta), then RmsNorm of it (the eager add, then the norm)
//   QkNormRope: RmsNorm of each q/k head by q_norm/k_norm, then Rope, in place on the packed
//               q|k|v rows of the fused projection; optionally k and v copied into a paged cache
// where T() rounds to the storage dtype. RmsNorm's float reduction order differs from
// torch's mean, so it can differ from eager by one rounding step; Rope and SiluMul are exact.
// Used only under inference mode (no autograd); the trainer keeps the eager ops. Internal to the
// model module: its code launches these (docs/architecture.md, "CUDA code").
#ifndef SLIME_SRC_MODEL_CUDA_FUSED_OPS_H_
#define SLIME_SRC_MODEL_CUDA_FUSED_OPS_H_

#include <cstdint>

#include "slime/model/cuda/launch.h"  // DType, the launch switches

namespace slime::model::cuda {

// x, y [rows, n]; w [n]. Returns a cudaError_t as int (0 = ok).
int LaunchRmsNorm(const void* x, const void* w, void* y, int64_t rows, int n, float eps,
                  DType dtype, void* stream);
// x, y [tokens, heads, d]; cos, sin [tokens, d] (d even).
int LaunchRope(const void* x, const void* cos, const void* sin, void* y, int64_t tokens,
               int heads, int d, DType dtype, void* stream);
// g, u, y [n].
int LaunchSiluMul(const void* g, const void* u, void* y, int64_t n, DType dtype, void* stream);

// residual [rows, n] in place (+= delta [rows, n]); y [rows, n] = RmsNorm(residual) with w [n].
// With programmatic launch, `residual` may be read before the kernel waits for the previous
// kernel of the stream: only `delta` may come from that kernel (the decoder's layout). A null
// `delta` normalises the residual as it is (then it is read after the wait, and not written).
int LaunchAddRmsNorm(void* residual, const void* delta, const void* w, void* y, int64_t rows,
                     int n, float eps, DType dtype, void* stream);

// The q/k/v rows of the fused projection, transformed in place.
struct QkNormRopeArgs {
  void* qkv = nullptr;           // [tokens, row_stride]: q heads | k heads | v heads, each d wide
  int64_t tokens = 0;
  int64_t row_stride = 0;        // elements between tokens (>= (heads + 2 kv_heads) d)
  int heads = 0;
  int kv_heads = 0;
  int d = 0;                     // 32, 64, 128 or 256
  const void* q_norm = nullptr;  // [d] or null (no q/k norm)
  const void* k_norm = nullptr;  // [d] or null
  float eps = 1e-6f;
  const void* cos = nullptr;     // [tokens, d]
  const void* sin = nullptr;     // [tokens, d]
  // Optional paged K/V destination: rotated k and v of token t go to slot slots[t] of
  // k_cache / v_cache [num_slots, kv_heads, d]. Null k_cache: nothing is copied.
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  const int64_t* slots = nullptr;
  DType dtype = DType::kBFloat16;
};
bool QkNormRopeSupported(int d);
int LaunchQkNormRope(const QkNormRopeArgs& args, void* stream);

// y [m, n] = x [m, k] W^T (+ bias [n]) for small m (1..8, decode steps): one warp per output
// feature streams its weight row with 16-byte loads (cuBLAS reaches ~1 TB/s on these shapes; this
// streams near HBM bandwidth). fp32 accumulation, one rounding to T. Returns
// cudaErrorInvalidValue (as int) for shapes it does not take: m > 8, k % (16 / sizeof(T)) != 0.
bool SmallGemmSupported(int64_t m, int64_t k, DType dtype);
int LaunchSmallGemm(const void* x, const void* w, const void* bias, void* y, int64_t m, int64_t n,
                    int64_t k, DType dtype, void* stream);

// y [m, n] = SiluMul(x W_gate^T, x W_up^T) for small m, where gate_up [2n, k] stacks W_gate
// (rows [0, n)) over W_up (rows [n, 2n)): the gate/up GEMM and LaunchSiluMulPacked in one kernel,
// bit-identical to the two (each warp streams gate row j and up row j).
int LaunchSmallGemmSiluMul(const void* x, const void* gate_up, void* y, int64_t m, int64_t n,
                           int64_t k, DType dtype, void* stream);

// The decode GEMMs with the layer's elementwise steps folded in, so a decoder layer's decode step
// runs five kernels (q|k|v, attention, o, gate|up, down) and every result stays bit-identical to
// the separate kernels:
//   LaunchNormSmallGemm / LaunchNormSmallGemmSiluMul: y = RmsNorm(x) W^T (+ bias), each block
//     normalising x itself: the same bits as LaunchAddRmsNorm's y (for x = its residual after the
//     add) followed by LaunchSmallGemm / LaunchSmallGemmSiluMul;
//   LaunchSmallGemmAddResidual: residual [m, n] += T(x W^T + bias), the eager linear then the
//     eager add (LaunchSmallGemm, then the add of LaunchAddRmsNorm). `residual` is read before
//     the grid dependency wait: the kernel right before must not write it.
// NormGemmSupported: m == 1 (the decoder folds the norm at single-row steps only: at 2-8 rows the
// separate kernels measured faster), k a multiple of 32 * (16 / sizeof(T)), at most 32 such
// groups, k * sizeof(T) <= 40 KiB (the normalised row sits in shared memory).
bool NormGemmSupported(int64_t m, int64_t k, DType dtype);
int LaunchNormSmallGemm(const void* x, const void* norm, float eps, const void* w,
                        const void* bias, void* y, int64_t m, int64_t n, int64_t k, DType dtype,
                        void* stream);
int LaunchNormSmallGemmSiluMul(const void* x, const void* norm, float eps, const void* gate_up,
                               void* y, int64_t m, int64_t n, int64_t k, DType dtype,
                               void* stream);
int LaunchSmallGemmAddResidual(const void* x, const void* w, const void* bias, void* residual,
                               int64_t m, int64_t n, int64_t k, DType dtype, void* stream);

// gu [rows, 2n] = gate | up (the fused gate/up projection) -> y [rows, n] = SiluMul(gate, up).
int LaunchSiluMulPacked(const void* gu, void* y, int64_t rows, int64_t n, DType dtype,
                        void* stream);

// The small-m GEMMs above run as "slab" kernels at one or two rows where a block's weight rows
// fit in shared memory (one block per SM; each block copies its rows of W into shared memory before its grid
// dependency wait, so under PDL the weights stream in while the kernel before still runs),
// bit-identical to the streaming kernels. SmallGemmUsesSlab says whether a GEMM of that shape
// (without folded norm input) takes that path on the current device; SetSlabGemm(false) turns it
// off for this process (tests, A/B), as does SLIME_DECODE_UNFUSE=slab; SetSlabGemm(true) restores.
bool SmallGemmUsesSlab(int64_t m, int64_t n, int64_t k, DType dtype, bool gate_up,
                       bool add_residual);
void SetSlabGemm(bool enabled);

}  // namespace slime::model::cuda

#endif  // SLIME_SRC_MODEL_CUDA_FUSED_OPS_H_
