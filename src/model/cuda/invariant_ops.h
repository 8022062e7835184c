// Batch-invariant CUDA kernels of deterministic mode (../batch_invariant.cc calls them; CUDA
// builds only; raw pointers, no LibTorch headers). Every output element is computed by one fixed
// sequence of operations on its own row's inputs, whatever the launch shape:
//
//   InvariantGemm        y [m, n] = x [m, k] · w [n, k]ᵀ through cuBLASLt with one algorithm
//                        pinned per (n, k, dtype, device) — chosen once, split-K off — and used
//                        for every m, so m (the batch) never changes the kernel or its K order
//                        (a tiled CUDA-core kernel where no algorithm can be pinned); outputs
//                        wider than 16,384 columns (the LM head) in column blocks of that many,
//                        each its own pinned GEMM (blocking the columns leaves every element's
//                        K order alone);
//   InvariantAttention   bfloat16/float16 with head_dim 64 or 128 (every model we serve): a warp
//                        takes up to 16 query rows that read the same keys (consecutive tokens
//                        of a head; in decode, a token's query heads of one key/value head) and
//                        walks the keys in blocks of 32 at absolute positions 0, 32, 64, ...;
//                        per row and block, S = Q Kᵀ and P V by mma.sync m16n8k16 with
//                        everything in registers (16-wide steps in ascending order), the block's
//                        online-softmax update in a fixed order (p rounded to the storage dtype,
//                        explicit fma/add/mul intrinsics), a block without a key of the row
//                        skipped; a row's numbers never depend on the other rows of its warp
//                        (prefills and the trainer run 4 such warps over 64 rows sharing each
//                        key block in shared memory; decode one token per warp: same bits).
//                        Other dtypes / head sizes: per query row and head, one warp walks the
//                        row's keys j = 0..last in ascending order: s = (Σ_d q_d k_jd, a fixed
//                        butterfly over the lanes) · scale, then the online softmax
//                        m' = max(m, s), c = exp(m - m'), p = exp(s - m'), l = l c + p,
//                        o_d = o_d c + p v_jd; out = o / l;
//   InvariantRowStats    per row of float32 z [rows, v], 256 threads in a fixed stride and a
//                        fixed tree: sum of squares (RMSNorm), or the softmax statistics
//                        max, log Σ exp(z - max) and Σ exp(z - max)(z - max) / Σ exp(z - max).
//
// These are not the CPU kernels' orders (fp32 sums differ between them), only fixed ones: on one
// device the engine and the trainer call the same kernels and agree bit for bit.
#ifndef SLIME_SRC_MODEL_CUDA_INVARIANT_OPS_H_
#define SLIME_SRC_MODEL_CUDA_INVARIANT_OPS_H_

#include <cstdint>
#include <string>

#include "slime/model/cuda/launch.h"  // DType

namespace slime::model::cuda {

// y [m, n] (row stride ldy, 0 = n) = x [m, k] (row stride ldx) · w [n, k]ᵀ (row stride k),
// float32 accumulation, all of `dtype`. Returns 0, or a cuBLAS/CUDA status with `error` set.
struct InvariantGemmArgs {
  const void* x = nullptr;
  int64_t ldx = 0;
  const void* w = nullptr;
  void* y = nullptr;
  int64_t ldy = 0;
  int64_t m = 0, n = 0, k = 0;
  DType dtype = DType::kBFloat16;
  int device = 0;
};
// Shapes whose algorithm cannot be pinned (cuBLASLt offers none that runs without split-K and
// workspace) take a tiled CUDA-core kernel instead, one thread per element in ascending k.
int LaunchInvariantGemm(const InvariantGemmArgs& args, void* stream, std::string* error);
// One line per (n, k, dtype) served so far: pinned cuBLASLt or the fallback and why.
std::string InvariantGemmReport();

// Causal attention of `rows` query rows. Query row r (q + r * q_row_stride, its heads
// head_dim apart) attends over keys j = 0..row_meta[2r + 1] of its sequence, key j being row
// key_rows[row_meta[2r] + j] of k/v (or row row_meta[2r] + j when key_rows is null); a key row
// holds kv_heads heads head_dim apart, rows kv_row_stride apart. out [rows, heads, head_dim]
// contiguous. head_dim <= 256; heads a multiple of kv_heads.
struct InvariantAttentionArgs {
  const void* q = nullptr;
  int64_t q_row_stride = 0;
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t kv_row_stride = 0;
  const int64_t* key_rows = nullptr;  // device, may be null
  const int64_t* row_meta = nullptr;  // device, [rows, 2]: first key index, last key
  // Instead of key_rows/row_meta, a paged cache (the decode CUDA graphs' inputs): row r sees
  // keys j = 0..seq_lens[r] - 1, key j being row page_table[r][j / page_size] * page_size +
  // j % page_size of k/v. Same per-row arithmetic, so the same bits as over key_rows.
  const int32_t* page_table = nullptr;  // device, [rows, max_pages]
  const int32_t* seq_lens = nullptr;    // device, [rows]
  int64_t max_pages = 0;
  int page_size = 0;
  // Every row reads keys no other row reads (one decode token per sequence): rows go one per
  // warp with their query heads of a key/value head, not 64 consecutive rows per block. Only the
  // launch shape changes, not a row's bits.
  bool rows_are_sequences = false;
  void* out = nullptr;
  int64_t rows = 0;
  int heads = 0, kv_heads = 0, head_dim = 0;
  float scale = 1.f;
  DType dtype = DType::kBFloat16;
};
int LaunchInvariantAttention(const InvariantAttentionArgs& args, void* stream);

// Per row of z [rows, v] float32 (row stride v): sum_sq[r] = Σ z², or, when sum_sq is null,
// max[r], log_sum[r] and (if mean_shifted is non-null) mean_shifted[r].
struct InvariantRowStatsArgs {
  const float* z = nullptr;
  int64_t rows = 0, v = 0;
  float* sum_sq = nullptr;
  float* max = nullptr;
  float* log_sum = nullptr;
  float* mean_shifted = nullptr;
};
int LaunchInvariantRowStats(const InvariantRowStatsArgs& args, void* stream);

}  // namespace slime::model::cuda

#endif  // SLIME_SRC_MODEL_CUDA_INVARIANT_OPS_H_
