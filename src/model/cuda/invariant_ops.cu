// Batch-invariant CUDA kernels (invariant_ops.h).
#include "invariant_ops.h"

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <mma.h>

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
// A warp takes up to kTcRows query rows of one head that read the same keys and walks the keys
// in blocks of kTcKeys at absolute positions 0, kTcKeys, 2 kTcKeys, ... For a row and a block
// the arithmetic is fixed (TcAttendBlock):
//   s_j = (Q Kᵀ)_j · scale, Q Kᵀ on tensor cores (16x16x16 steps over head_dim, ascending);
//   over the row's keys j <= last in the block: m' = max(m, max_j s_j), c = exp(m - m'),
//   p_j = exp(s_j - m') rounded to T (0 for keys past last), l = l c + (Σ_{j<16} p_j + Σ_{j>=16} p_j),
//   o = o c + P V (tensor cores, keys in two steps of 16);
// a block without a key of the row leaves the row untouched; out = o / l. Which other rows
// share the warp changes nothing in a row's numbers (a tensor-core product element reads its
// own row of Q only), so decode, chunked prefill and the trainer's packed forward agree bit
// for bit, as the CUDA-core kernel above does, at tensor-core speed.
//
// Two kernels run that arithmetic: InvariantAttentionTcKernel, one warp per block of threads
// (decode rows, one per warp, and short or unaligned inputs), and InvariantAttentionTcCtaKernel
// for prefills and the trainer: kTcWarps warps over kTcWarps · kTcRows consecutive rows share
// each key block through shared memory, the next block's loads in flight while the warps
// compute. The two give every row the same bits.
constexpr int kTcRows = 16;
constexpr int kTcKeys = 32;
constexpr int kTcPad = 8;
constexpr int kTcWarps = 4;

template <typename T>
using TcQFragment =
    nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, T, nvcuda::wmma::row_major>;

// One warp's scratch for a key block: the scores, the rounded probabilities, one 16-dim slice
// of P V.
template <typename T>
struct __align__(32) TcScratch {
  float ss[kTcRows][kTcKeys + 4];
  T ps[kTcRows][kTcKeys + kTcPad];
  float ts[kTcRows][16 + 4];
};

// K (kv[0]) and V (kv[1]) of one key block, rows kTcKeys, zeros past the group's last key.
template <typename T, int D>
using TcKeyBlock = T[2][kTcKeys][D + kTcPad];

template <bool kPaged>
__device__ __forceinline__ int64_t KeyRow(const InvariantAttentionArgs& a, int64_t r,
                                          int64_t first, int64_t j) {
  if (kPaged) {
    return static_cast<int64_t>(a.page_table[r * a.max_pages + j / a.page_size]) * a.page_size +
           j % a.page_size;
  }
  return a.key_rows != nullptr ? a.key_rows[first + j] : first + j;
}

// The block update of the header above for the warp's rows: lane pair (2i, 2i + 1) owns row i
// (`mine`: the row is in the group being walked; `my_last`: its last key), `half` its half of
// the block's keys and of each 16-dim slice of o.
template <typename T, int D>
__device__ __forceinline__ void TcAttendBlock(const TcQFragment<T> (&qf)[D / 16],
                                              const TcKeyBlock<T, D>& kv, TcScratch<T>& sc,
                                              int64_t kb, bool mine, int64_t my_last, float scale,
                                              float& m, float& l, float (&o)[D / 16][8]) {
  namespace wmma = nvcuda::wmma;
  const int lane = threadIdx.x & 31, i = lane >> 1, half = lane & 1;
  // S = Q Kᵀ [kTcRows, kTcKeys]
#pragma unroll
  for (int nf = 0; nf < kTcKeys / 16; ++nf) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.f);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb;
      wmma::load_matrix_sync(fb, &kv[0][nf * 16][kk * 16], D + kTcPad);
      wmma::mma_sync(acc, qf[kk], fb, acc);
    }
    wmma::store_matrix_sync(&sc.ss[0][nf * 16], acc, kTcKeys + 4, wmma::mem_row_major);
  }
  __syncwarp();
  // The online softmax of row i: this lane takes keys half * 16 .. half * 16 + 15.
  float bmax = -INFINITY;
#pragma unroll
  for (int jj = 0; jj < 16; ++jj) {
    const int j = half * 16 + jj;
    if (mine && kb + j <= my_last) bmax = fmaxf(bmax, sc.ss[i][j] * scale);
  }
  bmax = fmaxf(bmax, __shfl_xor_sync(kFullMask, bmax, 1));
  const bool update = mine && bmax != -INFINITY;
  const float m_new = update ? fmaxf(m, bmax) : m;
  const float c = update ? expf(m - m_new) : 1.f;
  float psum = 0.f;
#pragma unroll
  for (int jj = 0; jj < 16; ++jj) {
    const int j = half * 16 + jj;
    const float p = update && kb + j <= my_last ? expf(sc.ss[i][j] * scale - m_new) : 0.f;
    const T pt = To<T>(p);
    sc.ps[i][j] = pt;
    psum += F(pt);
  }
  const float other = __shfl_xor_sync(kFullMask, psum, 1);
  const float bsum = half == 0 ? psum + other : other + psum;  // one order on both lanes
  if (update) {
    l = l * c + bsum;
    m = m_new;
  }
  __syncwarp();
  // o = o c + P V, 16 dims at a time.
#pragma unroll
  for (int f = 0; f < D / 16; ++f) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.f);
#pragma unroll
    for (int kk = 0; kk < kTcKeys / 16; ++kk) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> fb;
      wmma::load_matrix_sync(fa, &sc.ps[0][kk * 16], kTcKeys + kTcPad);
      wmma::load_matrix_sync(fb, &kv[1][kk * 16][f * 16], D + kTcPad);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(&sc.ts[0][0], acc, 16 + 4, wmma::mem_row_major);
    __syncwarp();
    if (update) {
#pragma unroll
      for (int e = 0; e < 8; ++e) o[f][e] = o[f][e] * c + sc.ts[i][half * 8 + e];
    }
    __syncwarp();
  }
}

// Row r's first key index and last key (last < 0: no keys, nothing to do).
template <bool kPaged>
__device__ __forceinline__ void RowKeys(const InvariantAttentionArgs& a, int64_t r,
                                        int64_t* first, int64_t* last) {
  *first = kPaged ? 0 : a.row_meta[2 * r];
  *last = kPaged ? static_cast<int64_t>(a.seq_lens[r]) - 1 : a.row_meta[2 * r + 1];
}

// Stages `rows` query rows of head h (zeros past rows_here) through `qs` and loads the warp's
// kTcRows of them, starting at row `first_row`, as tensor-core fragments. Leaves qs free.
template <typename T, int D>
__device__ __forceinline__ void LoadQueries(const InvariantAttentionArgs& a, int64_t row0, int h,
                                            int rows, int rows_here, T (*qs)[D + kTcPad],
                                            int first_row, TcQFragment<T> (&qf)[D / 16],
                                            bool whole_block) {
  for (int idx = threadIdx.x; idx < rows * D; idx += blockDim.x) {
    const int i = idx / D, c = idx % D;
    qs[i][c] = i < rows_here ? static_cast<const T*>(a.q)[(row0 + i) * a.q_row_stride +
                                                          static_cast<int64_t>(h) * D + c]
                             : To<T>(0.f);
  }
  if (whole_block) __syncthreads();
  else __syncwarp();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    nvcuda::wmma::load_matrix_sync(qf[kk], &qs[first_row][kk * 16], D + kTcPad);
  }
  if (whole_block) __syncthreads();
  else __syncwarp();
}

// Chooses the next group among `n` rows: the first unfinished row and every unfinished row
// reading its keys (paged: the row alone). One thread calls it.
template <bool kPaged>
__device__ __forceinline__ void NextGroup(int n, const int64_t* first_s, const int64_t* last_s,
                                          int* done_s, int* group_s, int* leader_s,
                                          int64_t* glast_s) {
  int leader = -1;
  for (int r = 0; r < n && leader < 0; ++r) {
    if (!done_s[r]) leader = r;
  }
  int64_t glast = -1;
  for (int r = 0; r < n; ++r) {
    const bool in = leader >= 0 && !done_s[r] &&
                    (kPaged ? r == leader : first_s[r] == first_s[leader]);
    group_s[r] = in;
    if (in) {
      done_s[r] = 1;
      glast = max(glast, last_s[r]);
    }
  }
  *leader_s = leader;
  *glast_s = glast;
}

template <typename T, int D>
__device__ __forceinline__ void StoreRows(const InvariantAttentionArgs& a, int64_t row, int h,
                                          bool valid, float l, const float (&o)[D / 16][8]) {
  if (!valid) return;
  const int half = threadIdx.x & 1;
  T* out = static_cast<T*>(a.out) + (row * a.heads + h) * static_cast<int64_t>(D);
#pragma unroll
  for (int f = 0; f < D / 16; ++f) {
#pragma unroll
    for (int e = 0; e < 8; ++e) out[f * 16 + half * 8 + e] = To<T>(o[f][e] / l);
  }
}

template <typename T, int D, bool kPaged, bool kVec>
__global__ void __launch_bounds__(32) InvariantAttentionTcKernel(InvariantAttentionArgs a,
                                                                 int tile_rows) {
  __shared__ __align__(32) TcKeyBlock<T, D> kv;
  __shared__ TcScratch<T> sc;
  __shared__ int64_t first_s[kTcRows], last_s[kTcRows];
  __shared__ int done_s[kTcRows], group_s[kTcRows];
  __shared__ int leader_s;
  __shared__ int64_t glast_s;

  const int lane = threadIdx.x;
  const int h = blockIdx.y;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * tile_rows;
  const int rows_here = static_cast<int>(min(static_cast<int64_t>(tile_rows), a.rows - row0));
  const int g = h / (a.heads / a.kv_heads);
  const T* k = static_cast<const T*>(a.k) + static_cast<int64_t>(g) * D;
  const T* v = static_cast<const T*>(a.v) + static_cast<int64_t>(g) * D;

  TcQFragment<T> qf[D / 16];
  LoadQueries<T, D>(a, row0, h, kTcRows, rows_here, &kv[0][0], 0, qf, false);
  if (lane < kTcRows) {
    int64_t first = 0, last = -1;
    if (lane < rows_here) RowKeys<kPaged>(a, row0 + lane, &first, &last);
    first_s[lane] = first;
    last_s[lane] = last;
    done_s[lane] = last < 0;
  }
  __syncwarp();

  const int i = lane >> 1;
  float m = -INFINITY, l = 0.f;
  float o[D / 16][8];
#pragma unroll
  for (int f = 0; f < D / 16; ++f) {
#pragma unroll
    for (int e = 0; e < 8; ++e) o[f][e] = 0.f;
  }

  while (true) {
    if (lane == 0) NextGroup<kPaged>(kTcRows, first_s, last_s, done_s, group_s, &leader_s, &glast_s);
    __syncwarp();
    const int leader = leader_s;
    if (leader < 0) break;
    const int64_t glast = glast_s;
    const int64_t gfirst = first_s[leader];
    const int64_t grow = row0 + leader;
    const bool mine = group_s[i] != 0;
    const int64_t my_last = last_s[i];

    for (int64_t kb = 0; kb <= glast; kb += kTcKeys) {
      for (int idx = lane; idx < kTcKeys * (D / 8); idx += 32) {
        const int j = idx / (D / 8), c = (idx % (D / 8)) * 8;
        const int64_t key = kb + j;
        if (key <= glast) {
          const int64_t row = KeyRow<kPaged>(a, grow, gfirst, key);
          const T* kr = k + row * a.kv_row_stride + c;
          const T* vr = v + row * a.kv_row_stride + c;
          if (kVec) {
            *reinterpret_cast<Vec16<T>*>(&kv[0][j][c]) = *reinterpret_cast<const Vec16<T>*>(kr);
            *reinterpret_cast<Vec16<T>*>(&kv[1][j][c]) = *reinterpret_cast<const Vec16<T>*>(vr);
          } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) {
              kv[0][j][c + e] = kr[e];
              kv[1][j][c + e] = vr[e];
            }
          }
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            kv[0][j][c + e] = To<T>(0.f);
            kv[1][j][c + e] = To<T>(0.f);
          }
        }
      }
      __syncwarp();
      TcAttendBlock<T, D>(qf, kv, sc, kb, mine, my_last, a.scale, m, l, o);
    }
  }
  StoreRows<T, D>(a, row0 + i, h, i < rows_here, l, o);
}

// kTcWarps warps over kTcWarps · kTcRows consecutive rows of head h (keys 16-byte aligned,
// key_rows/row_meta addressing): the warps share each key block, loaded by all the block's
// threads, the next block's 16-byte chunks held in registers while the warps compute.
template <typename T, int D>
__global__ void __launch_bounds__(kTcWarps * 32)
    InvariantAttentionTcCtaKernel(InvariantAttentionArgs a) {
  constexpr int kRows = kTcWarps * kTcRows;
  constexpr int kThreads = kTcWarps * 32;
  constexpr int kChunks = kTcKeys * (D / 8) / kThreads;  // 16-byte chunks of K (and V) a thread moves
  static_assert(kTcKeys * (D / 8) % kThreads == 0, "key block must split evenly over the threads");
  static_assert(2 * kTcKeys >= kRows, "the queries are staged through the key block");
  __shared__ __align__(32) TcKeyBlock<T, D> kv;
  __shared__ TcScratch<T> scratch[kTcWarps];
  __shared__ int64_t first_s[kRows], last_s[kRows];
  __shared__ int done_s[kRows], group_s[kRows];
  __shared__ int leader_s;
  __shared__ int64_t glast_s;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int h = blockIdx.y;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const int rows_here = static_cast<int>(min(static_cast<int64_t>(kRows), a.rows - row0));
  const int g = h / (a.heads / a.kv_heads);
  const T* k = static_cast<const T*>(a.k) + static_cast<int64_t>(g) * D;
  const T* v = static_cast<const T*>(a.v) + static_cast<int64_t>(g) * D;

  TcQFragment<T> qf[D / 16];
  LoadQueries<T, D>(a, row0, h, kRows, rows_here, &kv[0][0], warp * kTcRows, qf, true);
  if (tid < kRows) {
    int64_t first = 0, last = -1;
    if (tid < rows_here) RowKeys<false>(a, row0 + tid, &first, &last);
    first_s[tid] = first;
    last_s[tid] = last;
    done_s[tid] = last < 0;
  }
  __syncthreads();

  const int my_row = warp * kTcRows + (lane >> 1);
  float m = -INFINITY, l = 0.f;
  float o[D / 16][8];
#pragma unroll
  for (int f = 0; f < D / 16; ++f) {
#pragma unroll
    for (int e = 0; e < 8; ++e) o[f][e] = 0.f;
  }

  while (true) {
    if (tid == 0) NextGroup<false>(kRows, first_s, last_s, done_s, group_s, &leader_s, &glast_s);
    __syncthreads();
    const int leader = leader_s;
    if (leader < 0) break;
    const int64_t glast = glast_s;
    const int64_t gfirst = first_s[leader];
    const bool mine = group_s[my_row] != 0;
    const int64_t my_last = last_s[my_row];
    // The warp's last key in this group: blocks past it change none of its rows.
    long long wlast = mine ? my_last : -1;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      wlast = max(wlast, __shfl_xor_sync(kFullMask, wlast, off));
    }

    uint4 kreg[kChunks], vreg[kChunks];
    auto fetch = [&](int64_t kb) {
#pragma unroll
      for (int t = 0; t < kChunks; ++t) {
        const int idx = tid + t * kThreads;
        const int64_t key = kb + idx / (D / 8);
        if (key <= glast) {
          const int64_t row = KeyRow<false>(a, 0, gfirst, key);
          const int64_t off = row * a.kv_row_stride + (idx % (D / 8)) * 8;
          kreg[t] = *reinterpret_cast<const uint4*>(k + off);
          vreg[t] = *reinterpret_cast<const uint4*>(v + off);
        } else {
          kreg[t] = make_uint4(0, 0, 0, 0);
          vreg[t] = make_uint4(0, 0, 0, 0);
        }
      }
    };
    fetch(0);
    for (int64_t kb = 0; kb <= glast; kb += kTcKeys) {
#pragma unroll
      for (int t = 0; t < kChunks; ++t) {
        const int idx = tid + t * kThreads;
        const int j = idx / (D / 8), c = (idx % (D / 8)) * 8;
        *reinterpret_cast<uint4*>(&kv[0][j][c]) = kreg[t];
        *reinterpret_cast<uint4*>(&kv[1][j][c]) = vreg[t];
      }
      __syncthreads();
      if (kb + kTcKeys <= glast) fetch(kb + kTcKeys);
      if (kb <= wlast) {
        TcAttendBlock<T, D>(qf, kv, scratch[warp], kb, mine, my_last, a.scale, m, l, o);
      }
      __syncthreads();
    }
  }
  StoreRows<T, D>(a, row0 + my_row, h, my_row < rows_here, l, o);
}

template <typename T, int D>
int LaunchTcAttention(const InvariantAttentionArgs& a, cudaStream_t s) {
  const bool paged = a.page_table != nullptr;
  const bool vec = reinterpret_cast<uintptr_t>(a.k) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(a.v) % 16 == 0 && a.kv_row_stride % 8 == 0;
  if (!paged && vec && a.rows >= kTcWarps * kTcRows) {
    // A prefill or the trainer's forward: consecutive rows mostly read the same keys.
    const dim3 grid(static_cast<unsigned>((a.rows + kTcWarps * kTcRows - 1) / (kTcWarps * kTcRows)),
                    static_cast<unsigned>(a.heads));
    InvariantAttentionTcCtaKernel<T, D><<<grid, kTcWarps * 32, 0, s>>>(a);
    return static_cast<int>(cudaGetLastError());
  }
  // One row per warp where rows are separate sequences (decode); otherwise 16 consecutive rows,
  // which in a prefill mostly read the same keys. Either way a row gets the same bits.
  const int tile_rows = paged || a.rows < 4 * kTcRows ? 1 : kTcRows;
  const dim3 grid(static_cast<unsigned>((a.rows + tile_rows - 1) / tile_rows),
                  static_cast<unsigned>(a.heads));
  if (paged) {
    if (vec) InvariantAttentionTcKernel<T, D, true, true><<<grid, 32, 0, s>>>(a, tile_rows);
    else InvariantAttentionTcKernel<T, D, true, false><<<grid, 32, 0, s>>>(a, tile_rows);
  } else {
    if (vec) InvariantAttentionTcKernel<T, D, false, true><<<grid, 32, 0, s>>>(a, tile_rows);
    else InvariantAttentionTcKernel<T, D, false, false><<<grid, 32, 0, s>>>(a, tile_rows);
  }
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
