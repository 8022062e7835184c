// Batch-invariant CUDA kernels (invariant_ops.h).
#include "invariant_ops.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>

#include "slime/model/cuda/dtype.cuh"

namespace slime::model::cuda {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;

// ---- GEMM: cuBLASLt with one pinned algorithm per shape --------------------------------------

cudaDataType_t CudaType(DType d) {
  switch (d) {
    case DType::kFloat32:
      return CUDA_R_32F;
    case DType::kFloat16:
      return CUDA_R_16F;
    case DType::kBFloat16:
      return CUDA_R_16BF;
  }
  return CUDA_R_32F;
}

// The m the algorithm is chosen for: the engine's prefill and the trainer's micro-batches are
// hundreds to thousands of rows, decode steps 1-256; the algorithm then serves every m.
constexpr int64_t kReferenceRows = 512;
// Output columns per cuBLASLt call (header): cuBLASLt pins no split-K-free, workspace-free
// algorithm for the LM head's 151,936 columns at once, and the CUDA-core fallback is ~100x
// slower there; blocks of this many are shapes like the other projections'.
constexpr int64_t kMaxPinnedColumns = 16384;

int64_t ElementBytes(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }
__host__ __device__ inline int64_t RowStride(const InvariantGemmArgs& a) {
  return a.ldy > 0 ? a.ldy : a.n;
}

struct Pinned {
  bool cublas = false;  // else the tiled fallback
  cublasLtMatmulAlgo_t algo;
};

// The descriptors of one y = x wᵀ call in cuBLASLt's column-major terms: D [n, m] = op(A) B
// with A = w as a column-major [k, n] (op T), B = x as a column-major [k, m].
class GemmDescs {
 public:
  GemmDescs(cudaDataType_t type, int64_t m, int64_t n, int64_t k, int64_t ldx, int64_t ldy) {
    ok_ = cublasLtMatmulDescCreate(&op_, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS;
    const cublasOperation_t t = CUBLAS_OP_T, nn = CUBLAS_OP_N;
    ok_ = ok_ &&
          cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)) ==
              CUBLAS_STATUS_SUCCESS &&
          cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSB, &nn, sizeof(nn)) ==
              CUBLAS_STATUS_SUCCESS &&
          cublasLtMatrixLayoutCreate(&a_, type, k, n, k) == CUBLAS_STATUS_SUCCESS &&
          cublasLtMatrixLayoutCreate(&b_, type, k, m, ldx) == CUBLAS_STATUS_SUCCESS &&
          cublasLtMatrixLayoutCreate(&d_, type, n, m, ldy) == CUBLAS_STATUS_SUCCESS;
  }
  ~GemmDescs() {
    if (d_ != nullptr) cublasLtMatrixLayoutDestroy(d_);
    if (b_ != nullptr) cublasLtMatrixLayoutDestroy(b_);
    if (a_ != nullptr) cublasLtMatrixLayoutDestroy(a_);
    if (op_ != nullptr) cublasLtMatmulDescDestroy(op_);
  }
  GemmDescs(const GemmDescs&) = delete;
  GemmDescs& operator=(const GemmDescs&) = delete;

  bool ok() const { return ok_; }
  cublasLtMatmulDesc_t op() const { return op_; }
  cublasLtMatrixLayout_t a() const { return a_; }
  cublasLtMatrixLayout_t b() const { return b_; }
  cublasLtMatrixLayout_t d() const { return d_; }

 private:
  bool ok_ = false;
  cublasLtMatmulDesc_t op_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, d_ = nullptr;
};

// One handle per device and the pinned algorithms, behind one mutex (the lookups are per GEMM
// call, cheap next to the GEMM).
struct GemmRegistry {
  std::mutex mu;
  std::map<int, cublasLtHandle_t> handles;
  std::map<std::tuple<int, int64_t, int64_t, int64_t, int>, Pinned> pinned;  // device, n, k, ldy, dtype
  std::string report;
};

GemmRegistry& Registry() {
  static GemmRegistry* r = new GemmRegistry();  // never destroyed: used until exit
  return *r;
}

// The first heuristic candidate for kReferenceRows that runs with split-K = 1 and no reduction
// scheme (read from the algorithm, set where needed) and without workspace. `why` collects each
// rejected candidate's reason.
bool PinAlgorithm(cublasLtHandle_t handle, const InvariantGemmArgs& a, Pinned* out,
                  std::string* why) {
  const cudaDataType_t type = CudaType(a.dtype);
  GemmDescs ref(type, kReferenceRows, a.n, a.k, a.k, RowStride(a));
  if (!ref.ok()) {
    *why = "creating the cuBLASLt descriptors failed";
    return false;
  }
  cublasLtMatmulPreference_t pref = nullptr;
  cublasLtMatmulPreferenceCreate(&pref);
  const uint64_t workspace = 0;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                       sizeof(workspace));
  constexpr int kCandidates = 16;
  cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(handle, ref.op(), ref.a(), ref.b(), ref.d(), ref.d(), pref,
                                     kCandidates, results, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    *why = "no heuristic result (status " + std::to_string(static_cast<int>(st)) + ")";
    return false;
  }
  auto reject = [&](int i, const std::string& reason) {
    *why += (why->empty() ? "" : "; ") + std::string("candidate ") + std::to_string(i) + ": " +
            reason;
  };
  for (int i = 0; i < found; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS) {
      reject(i, "state " + std::to_string(static_cast<int>(results[i].state)));
      continue;
    }
    cublasLtMatmulAlgo_t algo = results[i].algo;
    int32_t splits = 0;
    uint32_t scheme = 0;
    size_t written = 0;
    const cublasStatus_t gs = cublasLtMatmulAlgoConfigGetAttribute(
        &algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof(splits), &written);
    const cublasStatus_t gr = cublasLtMatmulAlgoConfigGetAttribute(
        &algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof(scheme), &written);
    if (gs != CUBLAS_STATUS_SUCCESS || gr != CUBLAS_STATUS_SUCCESS) {
      reject(i, "split-K/reduction attributes unreadable");
      continue;
    }
    if (splits > 1) {
      const int32_t one = 1;
      if (cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &one,
                                               sizeof(one)) != CUBLAS_STATUS_SUCCESS) {
        reject(i, "split-K " + std::to_string(splits) + " cannot be set to 1");
        continue;
      }
    }
    if (scheme != CUBLASLT_REDUCTION_SCHEME_NONE) {
      const uint32_t none = CUBLASLT_REDUCTION_SCHEME_NONE;
      if (cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
                                               &none, sizeof(none)) != CUBLAS_STATUS_SUCCESS) {
        reject(i, "reduction scheme " + std::to_string(scheme) + " cannot be turned off");
        continue;
      }
    }
    cublasLtMatmulHeuristicResult_t check = {};
    const cublasStatus_t cs = cublasLtMatmulAlgoCheck(handle, ref.op(), ref.a(), ref.b(),
                                                      ref.d(), ref.d(), &algo, &check);
    if (cs != CUBLAS_STATUS_SUCCESS || check.workspaceSize > 0) {
      reject(i, "check status " + std::to_string(static_cast<int>(cs)) + ", workspace " +
                    std::to_string(check.workspaceSize));
      continue;
    }
    GemmDescs one(type, 1, a.n, a.k, a.k, RowStride(a));
    const cublasStatus_t c1 = one.ok() ? cublasLtMatmulAlgoCheck(handle, one.op(), one.a(),
                                                                 one.b(), one.d(), one.d(),
                                                                 &algo, &check)
                                       : CUBLAS_STATUS_INTERNAL_ERROR;
    if (c1 != CUBLAS_STATUS_SUCCESS || check.workspaceSize > 0) {
      reject(i, "one-row check status " + std::to_string(static_cast<int>(c1)) +
                    ", workspace " + std::to_string(check.workspaceSize));
      continue;
    }
    out->algo = algo;
    return true;
  }
  return false;
}

// The fallback where no cuBLASLt algorithm can be pinned: a shared-memory tiled GEMM on the CUDA
// cores, one thread per output element summing k in ascending order in float32.
constexpr int kTile = 16;

template <typename T>
__global__ void __launch_bounds__(kTile* kTile) TiledGemmKernel(InvariantGemmArgs a) {
  __shared__ float xs[kTile][kTile + 1];
  __shared__ float ws[kTile][kTile + 1];
  const int tx = threadIdx.x % kTile, ty = threadIdx.x / kTile;
  const int64_t row = static_cast<int64_t>(blockIdx.y) * kTile + ty;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kTile + tx;
  const int64_t wrow = static_cast<int64_t>(blockIdx.x) * kTile + ty;  // w's row loaded by ty
  const T* x = static_cast<const T*>(a.x);
  const T* w = static_cast<const T*>(a.w);
  float acc = 0.f;
  for (int64_t k0 = 0; k0 < a.k; k0 += kTile) {
    const int64_t kk = k0 + tx;
    xs[ty][tx] = row < a.m && kk < a.k ? F(x[row * a.ldx + kk]) : 0.f;
    ws[ty][tx] = wrow < a.n && kk < a.k ? F(w[wrow * a.k + kk]) : 0.f;
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kTile; ++j) acc += xs[ty][j] * ws[tx][j];
    __syncthreads();
  }
  if (row < a.m && col < a.n) static_cast<T*>(a.y)[row * RowStride(a) + col] = To<T>(acc);
}

template <typename T>
struct TiledGemmLauncher {
  static int Run(InvariantGemmArgs a, cudaStream_t s) {
    const dim3 grid(static_cast<unsigned>((a.n + kTile - 1) / kTile),
                    static_cast<unsigned>((a.m + kTile - 1) / kTile));
    TiledGemmKernel<T><<<grid, kTile * kTile, 0, s>>>(a);
    return static_cast<int>(cudaGetLastError());
  }
};

// ---- attention -------------------------------------------------------------------------------

constexpr int kAttnWarps = 4;

template <typename T, int kPer>
__global__ void __launch_bounds__(kAttnWarps * 32)
    InvariantAttentionKernel(InvariantAttentionArgs a) {
  const int lane = threadIdx.x & 31;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kAttnWarps + (threadIdx.x >> 5);
  if (item >= a.rows * a.heads) return;
  const int64_t r = item / a.heads;
  const int h = static_cast<int>(item % a.heads);
  const int g = h / (a.heads / a.kv_heads);
  const int d = a.head_dim;
  const T* q = static_cast<const T*>(a.q) + r * a.q_row_stride + static_cast<int64_t>(h) * d;
  const T* k = static_cast<const T*>(a.k) + static_cast<int64_t>(g) * d;
  const T* v = static_cast<const T*>(a.v) + static_cast<int64_t>(g) * d;
  const int32_t* pages = a.page_table != nullptr ? a.page_table + r * a.max_pages : nullptr;
  const int64_t first = pages != nullptr ? 0 : a.row_meta[2 * r];
  const int64_t last = pages != nullptr ? static_cast<int64_t>(a.seq_lens[r]) - 1
                                        : a.row_meta[2 * r + 1];
  float qv[kPer], acc[kPer];
#pragma unroll
  for (int t = 0; t < kPer; ++t) {
    const int c = lane + 32 * t;
    qv[t] = c < d ? F(q[c]) : 0.f;
    acc[t] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  for (int64_t j = 0; j <= last; ++j) {
    const int64_t row =
        pages != nullptr ? static_cast<int64_t>(pages[j / a.page_size]) * a.page_size +
                               j % a.page_size
        : a.key_rows != nullptr ? a.key_rows[first + j]
                                : first + j;
    const T* kr = k + row * a.kv_row_stride;
    float part = 0.f;
#pragma unroll
    for (int t = 0; t < kPer; ++t) {
      const int c = lane + 32 * t;
      if (c < d) part += qv[t] * F(kr[c]);
    }
    // A butterfly: every lane ends with the same bits (each step adds a commuting pair).
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) part += __shfl_xor_sync(kFullMask, part, off);
    const float s = part * a.scale;
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new);
    const float p = expf(s - m_new);
    l = l * corr + p;
    const T* vr = v + row * a.kv_row_stride;
#pragma unroll
    for (int t = 0; t < kPer; ++t) {
      const int c = lane + 32 * t;
      if (c < d) acc[t] = acc[t] * corr + p * F(vr[c]);
    }
    m = m_new;
  }
  T* out = static_cast<T*>(a.out) + (r * a.heads + h) * static_cast<int64_t>(d);
#pragma unroll
  for (int t = 0; t < kPer; ++t) {
    const int c = lane + 32 * t;
    if (c < d) out[c] = To<T>(acc[t] / l);
  }
}

// ---- attention on tensor cores (bfloat16 / float16, head_dim 64 or 128) ----------------------
//
// A warp takes up to kTcRows query rows that read the same keys (consecutive tokens of one head
// in a prefill or the trainer's forward; the query heads of one key/value head for a decode
// token) and walks the keys in blocks of kTcKeys at absolute positions 0, kTcKeys, 2 kTcKeys,
// ... For a row and a block the arithmetic is fixed (TcAttendBlock), all of it in registers:
//   s_j = (Q Kᵀ)_j · scale, Q Kᵀ by mma.sync m16n8k16 over head_dim in ascending 16-wide steps;
//   over the row's keys j <= last in the block: m' = max(m, max_j s_j), c = exp(m - m'),
//   p_j = exp(s_j - m') rounded to T (0 for keys past last), the block's Σ p_j in one order
//   (each lane its 8 keys ascending, then a butterfly over the row's 4 lanes),
//   l = fma(l, c, Σ p_j), t = P V (mma over the block's two 16-key halves in order),
//   o = fma(o, c, t);
// a block without a key of the row leaves the row untouched; out = o / l. A tensor-core product
// element reads its own row of Q (or P) only, so which other rows share the warp changes nothing
// in a row's numbers: decode, chunked prefill and the trainer's packed forward agree bit for bit.
// Each rounding step is an explicit intrinsic, so no kernel's compilation contracts it otherwise.
//
// Two kernels run that arithmetic: InvariantAttentionTcKernel, one warp per block of threads
// (decode: the query heads of a token's key/value head as its rows; short or unaligned inputs),
// and InvariantAttentionTcCtaKernel for prefills and the trainer: kTcWarps warps over
// kTcWarps · kTcRows consecutive rows share each key block through shared memory. Both load the
// next key block while they compute on this one (cp.async where the rows are 16-byte aligned).
constexpr int kTcRows = 16;
constexpr int kTcKeys = 32;
constexpr int kTcPad = 8;
constexpr int kTcWarps = 4;

// K (kv[0]) and V (kv[1]) of one key block, rows kTcKeys, zeros past the group's last key.
template <typename T, int D>
using TcKeyBlock = T[2][kTcKeys][D + kTcPad];

// The warp's queries as mma A fragments: [16-dim step][register].
template <int D>
using TcQuery = uint32_t[D / 16][4];

__device__ __forceinline__ uint32_t Bits(__nv_bfloat16 x) { return __bfloat16_as_ushort(x); }
__device__ __forceinline__ uint32_t Bits(__half x) { return __half_as_ushort(x); }
template <typename T>
__device__ __forceinline__ uint32_t PackPair(T lo, T hi) {
  return Bits(lo) | (Bits(hi) << 16);
}

// d += A B for one m16n8k16 step, float32 accumulators.
template <typename T>
__device__ __forceinline__ void MmaTc(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                      uint32_t a3, uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

// Four 8x8 b16 matrices from shared memory, transposed: lanes 8i..8i+7 name matrix i's rows.
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const void* row) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

__device__ __forceinline__ void CpAsync16(void* dst, const void* src) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(addr), "l"(src) : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ void CpAsyncWaitAll() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

// The per-row state of a thread: lane (g, t) = (lane / 4, lane % 4) holds rows g and g + 8 of
// its warp's 16, key columns 2t, 2t + 1 of each 8-key tile, head dims 2t, 2t + 1 of each 8-dim
// tile of o.
template <int D>
struct TcRows {
  bool mine[2] = {false, false};  // the row is in the group being walked
  int64_t last[2] = {-1, -1};     // its last key
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.f, 0.f};
  float o[D / 8][4] = {};
};

// The block update of the header above for the warp's rows.
template <typename T, int D>
__device__ __forceinline__ void TcAttendBlock(const TcQuery<D>& qf, const TcKeyBlock<T, D>& kv,
                                              int64_t kb, float scale, TcRows<D>& st) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  // S = Q Kᵀ [16, kTcKeys]: s[nt] is the 16 x 8 tile of keys nt * 8 .. nt * 8 + 7.
  float s[kTcKeys / 8][4];
#pragma unroll
  for (int nt = 0; nt < kTcKeys / 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) s[nt][e] = 0.f;
    const T* krow = &kv[0][nt * 8 + g][2 * t];
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t b0 = *reinterpret_cast<const uint32_t*>(krow + kk * 16);
      const uint32_t b1 = *reinterpret_cast<const uint32_t*>(krow + kk * 16 + 8);
      MmaTc<T>(s[nt], qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3], b0, b1);
    }
  }
  // Row r of this lane is element pair (2r, 2r + 1) of each tile.
  float bmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int nt = 0; nt < kTcKeys / 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e >> 1;
      s[nt][e] = __fmul_rn(s[nt][e], scale);
      const int64_t key = kb + nt * 8 + 2 * t + (e & 1);
      if (st.mine[r] && key <= st.last[r]) bmax[r] = fmaxf(bmax[r], s[nt][e]);
    }
  }
  bool upd[2];
  float c[2], m_new[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    bmax[r] = fmaxf(bmax[r], __shfl_xor_sync(kFullMask, bmax[r], 1));
    bmax[r] = fmaxf(bmax[r], __shfl_xor_sync(kFullMask, bmax[r], 2));
    upd[r] = st.mine[r] && bmax[r] != -INFINITY;
    m_new[r] = upd[r] ? fmaxf(st.m[r], bmax[r]) : st.m[r];
    c[r] = upd[r] ? expf(__fsub_rn(st.m[r], m_new[r])) : 1.f;
  }
  // P rounded to T, packed as the A fragments of P V: pf[nt][r] holds row r's two keys of tile nt.
  uint32_t pf[kTcKeys / 8][2];
  float psum[2] = {0.f, 0.f};
#pragma unroll
  for (int nt = 0; nt < kTcKeys / 8; ++nt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t key = kb + nt * 8 + 2 * t;
      const float p0 = upd[r] && key <= st.last[r] ? expf(__fsub_rn(s[nt][2 * r], m_new[r])) : 0.f;
      const float p1 =
          upd[r] && key + 1 <= st.last[r] ? expf(__fsub_rn(s[nt][2 * r + 1], m_new[r])) : 0.f;
      const T t0 = To<T>(p0), t1 = To<T>(p1);
      psum[r] = __fadd_rn(__fadd_rn(psum[r], F(t0)), F(t1));
      pf[nt][r] = PackPair(t0, t1);
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    // A butterfly: the four lanes end with the same bits (each step adds a commuting pair).
    psum[r] = __fadd_rn(psum[r], __shfl_xor_sync(kFullMask, psum[r], 1));
    psum[r] = __fadd_rn(psum[r], __shfl_xor_sync(kFullMask, psum[r], 2));
    if (upd[r]) {
      st.l[r] = __fmaf_rn(st.l[r], c[r], psum[r]);
      st.m[r] = m_new[r];
    }
  }
  // o = o c + P V, two 8-dim tiles per transposed load of V.
  const int mat = lane >> 3, mrow = lane & 7;
#pragma unroll
  for (int nd = 0; nd < D / 8; nd += 2) {
    float acc[2][4] = {};
#pragma unroll
    for (int kc = 0; kc < kTcKeys / 16; ++kc) {
      uint32_t b[4];
      LdMatrixX4Trans(b, &kv[1][kc * 16 + (mat & 1) * 8 + mrow][(nd + (mat >> 1)) * 8]);
      MmaTc<T>(acc[0], pf[2 * kc][0], pf[2 * kc][1], pf[2 * kc + 1][0], pf[2 * kc + 1][1], b[0],
               b[1]);
      MmaTc<T>(acc[1], pf[2 * kc][0], pf[2 * kc][1], pf[2 * kc + 1][0], pf[2 * kc + 1][1], b[2],
               b[3]);
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        if (upd[r]) st.o[nd + j][e] = __fmaf_rn(st.o[nd + j][e], c[r], acc[j][e]);
      }
    }
  }
}

// Reads the warp's 16 query rows from `qs` (rows `first_row`.., D + kTcPad apart) as A fragments.
template <typename T, int D>
__device__ __forceinline__ void TcLoadQuery(const T (*qs)[D + kTcPad], int first_row,
                                            TcQuery<D>& qf) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const int c = kk * 16 + 2 * t;
    qf[kk][0] = *reinterpret_cast<const uint32_t*>(&qs[first_row + g][c]);
    qf[kk][1] = *reinterpret_cast<const uint32_t*>(&qs[first_row + g + 8][c]);
    qf[kk][2] = *reinterpret_cast<const uint32_t*>(&qs[first_row + g][c + 8]);
    qf[kk][3] = *reinterpret_cast<const uint32_t*>(&qs[first_row + g + 8][c + 8]);
  }
}

// Row r's first key index and last key (last < 0: no keys, nothing to do).
template <bool kPaged>
__device__ __forceinline__ void RowKeys(const InvariantAttentionArgs& a, int64_t r,
                                        int64_t* first, int64_t* last) {
  *first = kPaged ? 0 : a.row_meta[2 * r];
  *last = kPaged ? static_cast<int64_t>(a.seq_lens[r]) - 1 : a.row_meta[2 * r + 1];
}

template <bool kPaged>
__device__ __forceinline__ int64_t KeyRow(const InvariantAttentionArgs& a, int64_t r,
                                          int64_t first, int64_t j) {
  if (kPaged) {
    return static_cast<int64_t>(a.page_table[r * a.max_pages + j / a.page_size]) * a.page_size +
           j % a.page_size;
  }
  return a.key_rows != nullptr ? a.key_rows[first + j] : first + j;
}

// Starts moving key block kb (keys past glast as zeros) of kv/head base k, v into `dst`, spread
// over `threads` threads from `tid`: cp.async when kVec, else plain loads and stores.
template <typename T, int D, bool kPaged, bool kVec>
__device__ __forceinline__ void TcFetchBlock(const InvariantAttentionArgs& a, const T* k,
                                             const T* v, int64_t token, int64_t first,
                                             int64_t glast, int64_t kb, TcKeyBlock<T, D>& dst,
                                             int tid, int threads) {
  for (int idx = tid; idx < kTcKeys * (D / 8); idx += threads) {
    const int j = idx / (D / 8), c = (idx % (D / 8)) * 8;
    const int64_t key = kb + j;
    if (key <= glast) {
      const int64_t row = KeyRow<kPaged>(a, token, first, key);
      const T* kr = k + row * a.kv_row_stride + c;
      const T* vr = v + row * a.kv_row_stride + c;
      if (kVec) {
        CpAsync16(&dst[0][j][c], kr);
        CpAsync16(&dst[1][j][c], vr);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          dst[0][j][c + e] = kr[e];
          dst[1][j][c + e] = vr[e];
        }
      }
    } else {
      *reinterpret_cast<uint4*>(&dst[0][j][c]) = make_uint4(0, 0, 0, 0);
      *reinterpret_cast<uint4*>(&dst[1][j][c]) = make_uint4(0, 0, 0, 0);
    }
  }
  if (kVec) CpAsyncCommit();
}

// Chooses the next group among `n` rows: the first unfinished row and every unfinished row
// reading its keys. One thread calls it.
__device__ __forceinline__ void NextGroup(int n, const int64_t* first_s, const int64_t* last_s,
                                          int* done_s, int* group_s, int* leader_s,
                                          int64_t* glast_s) {
  int leader = -1;
  for (int r = 0; r < n && leader < 0; ++r) {
    if (!done_s[r]) leader = r;
  }
  int64_t glast = -1;
  for (int r = 0; r < n; ++r) {
    const bool in = leader >= 0 && !done_s[r] && first_s[r] == first_s[leader];
    group_s[r] = in;
    if (in) {
      done_s[r] = 1;
      glast = max(glast, last_s[r]);
    }
  }
  *leader_s = leader;
  *glast_s = glast;
}

// Writes the lane's rows: row r of the warp to out row out_row[r], head out_head[r], if valid.
template <typename T, int D>
__device__ __forceinline__ void TcStoreRows(const InvariantAttentionArgs& a,
                                            const int64_t (&out_row)[2], const int (&out_head)[2],
                                            const bool (&valid)[2], const TcRows<D>& st) {
  const int t = threadIdx.x & 3;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (!valid[r]) continue;
    T* out = static_cast<T*>(a.out) +
             (out_row[r] * a.heads + out_head[r]) * static_cast<int64_t>(D) + 2 * t;
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd) {
      *reinterpret_cast<uint32_t*>(out + nd * 8) =
          PackPair(To<T>(__fdiv_rn(st.o[nd][2 * r], st.l[r])),
                   To<T>(__fdiv_rn(st.o[nd][2 * r + 1], st.l[r])));
    }
  }
}

// One warp. kHeadRows: block (x, y) takes token x and its rows are the query heads of key/value
// head y / chunks (chunk y % chunks of 16 of them), all reading the token's keys — decode.
// Otherwise block (x, y) takes up to tile_rows consecutive tokens from x · tile_rows of head y,
// walked in groups of rows that read the same keys.
template <typename T, int D, bool kPaged, bool kVec, bool kHeadRows>
__global__ void __launch_bounds__(32) InvariantAttentionTcKernel(InvariantAttentionArgs a,
                                                                 int tile_rows) {
  __shared__ __align__(16) TcKeyBlock<T, D> kv[2];
  __shared__ int64_t first_s[kTcRows], last_s[kTcRows];
  __shared__ int done_s[kTcRows], group_s[kTcRows];
  __shared__ int leader_s;
  __shared__ int64_t glast_s;

  const int lane = threadIdx.x, g = lane >> 2;
  const int group_heads = a.heads / a.kv_heads;
  const int chunks = (group_heads + kTcRows - 1) / kTcRows;
  // Row i of the warp: token row_token(i), head row_head(i); rows_here of the 16 exist.
  const int64_t token0 = kHeadRows ? static_cast<int64_t>(blockIdx.x)
                                   : static_cast<int64_t>(blockIdx.x) * tile_rows;
  const int head0 = kHeadRows ? static_cast<int>(blockIdx.y / chunks) * group_heads +
                                    static_cast<int>(blockIdx.y % chunks) * kTcRows
                              : static_cast<int>(blockIdx.y);
  const int rows_here =
      kHeadRows ? min(kTcRows, group_heads - static_cast<int>(blockIdx.y % chunks) * kTcRows)
                : static_cast<int>(min(static_cast<int64_t>(tile_rows), a.rows - token0));
  auto row_token = [&](int i) { return kHeadRows ? token0 : token0 + i; };
  auto row_head = [&](int i) { return kHeadRows ? head0 + i : head0; };
  const int kvh = head0 / group_heads;
  const T* k = static_cast<const T*>(a.k) + static_cast<int64_t>(kvh) * D;
  const T* v = static_cast<const T*>(a.v) + static_cast<int64_t>(kvh) * D;

  // The queries, staged through the first key buffer.
  T (*qs)[D + kTcPad] = &kv[0][0][0];
  for (int idx = lane; idx < kTcRows * D; idx += 32) {
    const int i = idx / D, c = idx % D;
    qs[i][c] = i < rows_here ? static_cast<const T*>(a.q)[row_token(i) * a.q_row_stride +
                                                          static_cast<int64_t>(row_head(i)) * D + c]
                             : To<T>(0.f);
  }
  __syncwarp();
  TcQuery<D> qf;
  TcLoadQuery<T, D>(qs, 0, qf);
  if (lane < kTcRows) {
    int64_t first = 0, last = -1;
    if (lane < rows_here) RowKeys<kPaged>(a, row_token(lane), &first, &last);
    first_s[lane] = first;
    last_s[lane] = last;
    done_s[lane] = last < 0;
  }
  __syncwarp();

  TcRows<D> st;
  while (true) {
    if (lane == 0) NextGroup(kTcRows, first_s, last_s, done_s, group_s, &leader_s, &glast_s);
    __syncwarp();
    const int leader = leader_s;
    if (leader < 0) break;
    const int64_t glast = glast_s;
    const int64_t gfirst = first_s[leader];
    const int64_t gtoken = row_token(leader);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      st.mine[r] = group_s[g + 8 * r] != 0;
      st.last[r] = last_s[g + 8 * r];
    }
    int buf = 0;
    TcFetchBlock<T, D, kPaged, kVec>(a, k, v, gtoken, gfirst, glast, 0, kv[0], lane, 32);
    for (int64_t kb = 0; kb <= glast; kb += kTcKeys, buf ^= 1) {
      if (kVec) CpAsyncWaitAll();
      __syncwarp();
      if (kb + kTcKeys <= glast) {
        TcFetchBlock<T, D, kPaged, kVec>(a, k, v, gtoken, gfirst, glast, kb + kTcKeys,
                                         kv[buf ^ 1], lane, 32);
      }
      TcAttendBlock<T, D>(qf, kv[buf], kb, a.scale, st);
      __syncwarp();
    }
  }
  const int64_t out_row[2] = {row_token(g), row_token(g + 8)};
  const int out_head[2] = {row_head(g), row_head(g + 8)};
  const bool valid[2] = {g < rows_here, g + 8 < rows_here};
  TcStoreRows<T, D>(a, out_row, out_head, valid, st);
}

// kTcWarps warps over kTcWarps · kTcRows consecutive rows of head h (keys 16-byte aligned,
// key_rows/row_meta addressing): the warps share each key block, loaded by all the block's
// threads while the warps compute on the one before.
template <typename T, int D>
__global__ void __launch_bounds__(kTcWarps * 32)
    InvariantAttentionTcCtaKernel(InvariantAttentionArgs a) {
  constexpr int kRows = kTcWarps * kTcRows;
  constexpr int kThreads = kTcWarps * 32;
  static_assert(2 * kTcKeys >= kRows, "the queries are staged through a key block");
  __shared__ __align__(16) TcKeyBlock<T, D> kv[2];
  __shared__ int64_t first_s[kRows], last_s[kRows];
  __shared__ int done_s[kRows], group_s[kRows];
  __shared__ int leader_s;
  __shared__ int64_t glast_s;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2;
  const int h = blockIdx.y;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const int rows_here = static_cast<int>(min(static_cast<int64_t>(kRows), a.rows - row0));
  const int kvh = h / (a.heads / a.kv_heads);
  const T* k = static_cast<const T*>(a.k) + static_cast<int64_t>(kvh) * D;
  const T* v = static_cast<const T*>(a.v) + static_cast<int64_t>(kvh) * D;

  T (*qs)[D + kTcPad] = &kv[0][0][0];
  for (int idx = tid; idx < kRows * D; idx += kThreads) {
    const int i = idx / D, c = idx % D;
    qs[i][c] = i < rows_here ? static_cast<const T*>(a.q)[(row0 + i) * a.q_row_stride +
                                                          static_cast<int64_t>(h) * D + c]
                             : To<T>(0.f);
  }
  __syncthreads();
  TcQuery<D> qf;
  TcLoadQuery<T, D>(qs, warp * kTcRows, qf);
  if (tid < kRows) {
    int64_t first = 0, last = -1;
    if (tid < rows_here) RowKeys<false>(a, row0 + tid, &first, &last);
    first_s[tid] = first;
    last_s[tid] = last;
    done_s[tid] = last < 0;
  }
  __syncthreads();

  const int my_row0 = warp * kTcRows + g;  // the lane's rows: my_row0 and my_row0 + 8
  TcRows<D> st;
  while (true) {
    if (tid == 0) NextGroup(kRows, first_s, last_s, done_s, group_s, &leader_s, &glast_s);
    __syncthreads();
    const int leader = leader_s;
    if (leader < 0) break;
    const int64_t glast = glast_s;
    const int64_t gfirst = first_s[leader];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      st.mine[r] = group_s[my_row0 + 8 * r] != 0;
      st.last[r] = last_s[my_row0 + 8 * r];
    }
    // The warp's last key in this group: blocks past it change none of its rows.
    const long long last0 = st.mine[0] ? st.last[0] : -1, last1 = st.mine[1] ? st.last[1] : -1;
    long long wlast = last0 > last1 ? last0 : last1;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      wlast = max(wlast, __shfl_xor_sync(kFullMask, wlast, off));
    }
    int buf = 0;
    TcFetchBlock<T, D, false, true>(a, k, v, 0, gfirst, glast, 0, kv[0], tid, kThreads);
    for (int64_t kb = 0; kb <= glast; kb += kTcKeys, buf ^= 1) {
      CpAsyncWaitAll();
      __syncthreads();
      if (kb + kTcKeys <= glast) {
        TcFetchBlock<T, D, false, true>(a, k, v, 0, gfirst, glast, kb + kTcKeys, kv[buf ^ 1], tid,
                                        kThreads);
      }
      if (kb <= wlast) TcAttendBlock<T, D>(qf, kv[buf], kb, a.scale, st);
      __syncthreads();
    }
  }
  const int64_t out_row[2] = {row0 + my_row0, row0 + my_row0 + 8};
  const int out_head[2] = {h, h};
  const bool valid[2] = {my_row0 < rows_here, my_row0 + 8 < rows_here};
  TcStoreRows<T, D>(a, out_row, out_head, valid, st);
}

template <typename T, int D>
int LaunchTcAttention(const InvariantAttentionArgs& a, cudaStream_t s) {
  const bool paged = a.page_table != nullptr;
  const bool vec = reinterpret_cast<uintptr_t>(a.k) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(a.v) % 16 == 0 && a.kv_row_stride % 8 == 0;
  if (!paged && !a.rows_are_sequences && vec && a.rows >= kTcWarps * kTcRows) {
    // A prefill or the trainer's forward: consecutive rows mostly read the same keys.
    const dim3 grid(static_cast<unsigned>((a.rows + kTcWarps * kTcRows - 1) / (kTcWarps * kTcRows)),
                    static_cast<unsigned>(a.heads));
    InvariantAttentionTcCtaKernel<T, D><<<grid, kTcWarps * 32, 0, s>>>(a);
    return static_cast<int>(cudaGetLastError());
  }
  if (paged || a.rows_are_sequences || a.rows < 4 * kTcRows) {
    // Decode steps and short chunks: a token per warp, its query heads of one key/value head as
    // the rows (they read the same keys).
    const int group_heads = a.heads / a.kv_heads;
    const int chunks = (group_heads + kTcRows - 1) / kTcRows;
    const dim3 grid(static_cast<unsigned>(a.rows), static_cast<unsigned>(a.kv_heads * chunks));
    if (paged) {
      if (vec) InvariantAttentionTcKernel<T, D, true, true, true><<<grid, 32, 0, s>>>(a, 1);
      else InvariantAttentionTcKernel<T, D, true, false, true><<<grid, 32, 0, s>>>(a, 1);
    } else {
      if (vec) InvariantAttentionTcKernel<T, D, false, true, true><<<grid, 32, 0, s>>>(a, 1);
      else InvariantAttentionTcKernel<T, D, false, false, true><<<grid, 32, 0, s>>>(a, 1);
    }
    return static_cast<int>(cudaGetLastError());
  }
  // Longer unaligned inputs: 16 consecutive rows of a head per warp.
  const dim3 grid(static_cast<unsigned>((a.rows + kTcRows - 1) / kTcRows),
                  static_cast<unsigned>(a.heads));
  InvariantAttentionTcKernel<T, D, false, false, false><<<grid, 32, 0, s>>>(a, kTcRows);
  return static_cast<int>(cudaGetLastError());
}
template <typename T>
struct AttentionLauncher {
  static int Run(InvariantAttentionArgs a, cudaStream_t s) {
    const int64_t items = a.rows * a.heads;
    if (items == 0) return 0;
    if constexpr (!std::is_same_v<T, float>) {
      if (a.head_dim == 128) return LaunchTcAttention<T, 128>(a, s);
      if (a.head_dim == 64) return LaunchTcAttention<T, 64>(a, s);
    }
    const dim3 grid(static_cast<unsigned>((items + kAttnWarps - 1) / kAttnWarps));
    const int per = (a.head_dim + 31) / 32;
    if (per <= 2) {
      InvariantAttentionKernel<T, 2><<<grid, kAttnWarps * 32, 0, s>>>(a);
    } else if (per <= 4) {
      InvariantAttentionKernel<T, 4><<<grid, kAttnWarps * 32, 0, s>>>(a);
    } else {
      InvariantAttentionKernel<T, 8><<<grid, kAttnWarps * 32, 0, s>>>(a);
    }
    return static_cast<int>(cudaGetLastError());
  }
};

// ---- row statistics --------------------------------------------------------------------------

constexpr int kStatThreads = 256;

// Sums `x` over the block in a fixed tree; every thread gets the total.
__device__ float BlockSum(float x, float* shared) {
  shared[threadIdx.x] = x;
  __syncthreads();
  for (int half = kStatThreads / 2; half > 0; half >>= 1) {
    if (static_cast<int>(threadIdx.x) < half) shared[threadIdx.x] += shared[threadIdx.x + half];
    __syncthreads();
  }
  const float total = shared[0];
  __syncthreads();
  return total;
}

__device__ float BlockMax(float x, float* shared) {
  shared[threadIdx.x] = x;
  __syncthreads();
  for (int half = kStatThreads / 2; half > 0; half >>= 1) {
    if (static_cast<int>(threadIdx.x) < half) {
      shared[threadIdx.x] = fmaxf(shared[threadIdx.x], shared[threadIdx.x + half]);
    }
    __syncthreads();
  }
  const float total = shared[0];
  __syncthreads();
  return total;
}

__global__ void __launch_bounds__(kStatThreads) InvariantRowStatsKernel(InvariantRowStatsArgs a) {
  __shared__ float shared[kStatThreads];
  const float* z = a.z + static_cast<int64_t>(blockIdx.x) * a.v;
  if (a.sum_sq != nullptr) {
    float sq = 0.f;
    for (int64_t c = threadIdx.x; c < a.v; c += kStatThreads) sq += z[c] * z[c];
    sq = BlockSum(sq, shared);
    if (threadIdx.x == 0) a.sum_sq[blockIdx.x] = sq;
    return;
  }
  float m = -INFINITY;
  for (int64_t c = threadIdx.x; c < a.v; c += kStatThreads) m = fmaxf(m, z[c]);
  m = BlockMax(m, shared);
  float sum = 0.f, sum_ez = 0.f;
  for (int64_t c = threadIdx.x; c < a.v; c += kStatThreads) {
    const float shifted = z[c] - m;
    const float e = expf(shifted);
    sum += e;
    sum_ez += e * shifted;
  }
  sum = BlockSum(sum, shared);
  if (a.mean_shifted != nullptr) sum_ez = BlockSum(sum_ez, shared);
  if (threadIdx.x == 0) {
    a.max[blockIdx.x] = m;
    a.log_sum[blockIdx.x] = logf(sum);
    if (a.mean_shifted != nullptr) a.mean_shifted[blockIdx.x] = sum_ez / sum;
  }
}

}  // namespace

int LaunchInvariantGemm(const InvariantGemmArgs& a, void* stream, std::string* error) {
  if (a.m == 0 || a.n == 0) return 0;
  if (a.n > kMaxPinnedColumns) {  // column blocks, each a GEMM of its own (kMaxPinnedColumns)
    for (int64_t c0 = 0; c0 < a.n; c0 += kMaxPinnedColumns) {
      InvariantGemmArgs block = a;
      block.n = std::min(kMaxPinnedColumns, a.n - c0);
      block.ldy = RowStride(a);
      block.w = static_cast<const char*>(a.w) + c0 * a.k * ElementBytes(a.dtype);
      block.y = static_cast<char*>(a.y) + c0 * ElementBytes(a.dtype);
      if (const int st = LaunchInvariantGemm(block, stream, error); st != 0) return st;
    }
    return 0;
  }
  GemmRegistry& reg = Registry();
  cublasLtHandle_t handle = nullptr;
  Pinned pinned;
  {
    std::lock_guard<std::mutex> lock(reg.mu);
    auto h = reg.handles.find(a.device);
    if (h == reg.handles.end()) {
      cublasLtHandle_t created = nullptr;
      const cublasStatus_t st = cublasLtCreate(&created);
      if (st != CUBLAS_STATUS_SUCCESS) {
        *error = "cublasLtCreate failed";
        return static_cast<int>(st);
      }
      h = reg.handles.emplace(a.device, created).first;
    }
    handle = h->second;
    const auto key = std::make_tuple(a.device, a.n, a.k, RowStride(a), static_cast<int>(a.dtype));
    auto p = reg.pinned.find(key);
    if (p == reg.pinned.end()) {
      Pinned chosen;
      std::string why;
      chosen.cublas = PinAlgorithm(handle, a, &chosen, &why);
      reg.report += "[n " + std::to_string(a.n) + ", k " + std::to_string(a.k) + ", ldy " +
                    std::to_string(RowStride(a)) + ", dtype " +
                    std::to_string(static_cast<int>(a.dtype)) + "] " +
                    (chosen.cublas ? "cuBLASLt, pinned" : "tiled fallback: " + why) + "\n";
      p = reg.pinned.emplace(key, chosen).first;
    }
    pinned = p->second;
  }
  if (!pinned.cublas) {
    return Dispatch<TiledGemmLauncher>(a.dtype, a, static_cast<cudaStream_t>(stream));
  }
  GemmDescs descs(CudaType(a.dtype), a.m, a.n, a.k, a.ldx, RowStride(a));
  if (!descs.ok()) {
    *error = "creating the cuBLASLt descriptors failed";
    return static_cast<int>(CUBLAS_STATUS_INTERNAL_ERROR);
  }
  const float alpha = 1.f, beta = 0.f;
  const cublasStatus_t st =
      cublasLtMatmul(handle, descs.op(), &alpha, a.w, descs.a(), a.x, descs.b(), &beta, a.y,
                     descs.d(), a.y, descs.d(), &pinned.algo, nullptr, 0,
                     static_cast<cudaStream_t>(stream));
  if (st != CUBLAS_STATUS_SUCCESS) {
    *error = "cublasLtMatmul with the pinned algorithm failed (status " +
             std::to_string(static_cast<int>(st)) + ") for m = " + std::to_string(a.m);
    return static_cast<int>(st);
  }
  return 0;
}

std::string InvariantGemmReport() {
  GemmRegistry& reg = Registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  return reg.report;
}

int LaunchInvariantAttention(const InvariantAttentionArgs& args, void* stream) {
  if (args.head_dim <= 0 || args.head_dim > 256 || args.kv_heads <= 0 ||
      args.heads % args.kv_heads != 0) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  return Dispatch<AttentionLauncher>(args.dtype, args, static_cast<cudaStream_t>(stream));
}

int LaunchInvariantRowStats(const InvariantRowStatsArgs& args, void* stream) {
  if (args.rows == 0) return 0;
  InvariantRowStatsKernel<<<static_cast<unsigned>(args.rows), kStatThreads, 0,
                            static_cast<cudaStream_t>(stream)>>>(args);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace slime::model::cuda
