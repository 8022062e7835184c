// Fused inference kernels of the decoder (see fused_ops.h). Compiled without fast math so the
// float arithmetic matches LibTorch's kernels.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <utility>

#include "fused_ops.h"
#include "slime/model/cuda/dtype.cuh"
#include "slime/model/cuda/pdl.cuh"

namespace slime::model::cuda {
namespace {

constexpr int kNormThreads = 128;

template <typename T>
__global__ void RmsNormKernel(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
                              int n, float eps) {
  GridDependencyWait();
  GridDependencyLaunch();
  const int64_t row = blockIdx.x;
  const T* xr = x + row * n;
  T* yr = y + row * n;
  float ss = 0.f;
  for (int i = threadIdx.x; i < n; i += kNormThreads) {
    const float v = F(xr[i]);
    ss += v * v;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  __shared__ float warp_sums[kNormThreads / 32];
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = ss;
  __syncthreads();
  float total = 0.f;
#pragma unroll
  for (int k = 0; k < kNormThreads / 32; ++k) total += warp_sums[k];
  const float r = rsqrtf(total / static_cast<float>(n) + eps);
  for (int i = threadIdx.x; i < n; i += kNormThreads) {
    yr[i] = To<T>(F(w[i]) * R<T>(F(xr[i]) * r));
  }
}

template <typename T>
__global__ void RopeKernel(const T* __restrict__ x, const T* __restrict__ cos_t,
                           const T* __restrict__ sin_t, T* __restrict__ y, int64_t total, int heads,
                           int d) {
  GridDependencyWait();
  GridDependencyLaunch();
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int i = static_cast<int>(idx % d);
  const int64_t t = idx / (static_cast<int64_t>(heads) * d);
  const int half = d / 2;
  const float xi = F(x[idx]);
  const float rot = i < half ? -F(x[idx + half]) : F(x[idx - half]);
  const float c = F(cos_t[t * d + i]);
  const float s = F(sin_t[t * d + i]);
  y[idx] = To<T>(R<T>(xi * c) + R<T>(rot * s));
}

template <typename T>
__global__ void SiluMulKernel(const T* __restrict__ g, const T* __restrict__ u, T* __restrict__ y,
                              int64_t n) {
  GridDependencyWait();
  GridDependencyLaunch();
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n) return;
  const float gv = F(g[idx]);
  const float s = gv / (1.0f + expf(-gv));
  y[idx] = To<T>(R<T>(s) * F(u[idx]));
}

// residual += delta (rounded as the eager add), then the RmsNorm of RmsNormKernel. Each thread
// re-reads only the elements it wrote itself.
template <typename T>
__global__ void AddRmsNormKernel(T* __restrict__ res, const T* __restrict__ delta,
                                 const T* __restrict__ w, T* __restrict__ y, int n, float eps) {
  GridDependencyWait();
  GridDependencyLaunch();
  const int64_t row = blockIdx.x;
  T* rr = res + row * n;
  const T* dr = delta != nullptr ? delta + row * n : nullptr;
  T* yr = y + row * n;
  float ss = 0.f;
  for (int i = threadIdx.x; i < n; i += kNormThreads) {
    const T s = dr != nullptr ? To<T>(F(rr[i]) + F(dr[i])) : rr[i];
    if (dr != nullptr) rr[i] = s;
    const float v = F(s);
    ss += v * v;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  __shared__ float warp_sums[kNormThreads / 32];
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = ss;
  __syncthreads();
  float total = 0.f;
#pragma unroll
  for (int k = 0; k < kNormThreads / 32; ++k) total += warp_sums[k];
  const float r = rsqrtf(total / static_cast<float>(n) + eps);
  for (int i = threadIdx.x; i < n; i += kNormThreads) {
    yr[i] = To<T>(F(w[i]) * R<T>(F(rr[i]) * r));
  }
}

// One block per token, a warp per head up to MAXW warps (more heads loop). Lane l holds
// elements [l*VEC, (l+1)*VEC) of the head; the rotate-half partner of element i (i +- d/2) sits
// in lane l ^ 16 at the same offset. At a few tokens the kernel is pure latency: with a warp per
// head (MAXW 32) every head is done in one pass instead of four. At many tokens (prefill, large
// decode batches) 8-warp blocks are faster: the 1,024-thread bound caps registers and
// occupancy (measured on the H200: 90 us against 33 us a launch at 256 x 128 prompt tokens).
constexpr int kQkvWideWarps = 32;
constexpr int kQkvWarps = 8;
constexpr int64_t kQkvWideMaxTokens = 8;
template <typename T, int VEC, int MAXW>
__global__ void __launch_bounds__(MAXW * 32)
    QkNormRopeKernel(T* __restrict__ qkv, int64_t row_stride, int heads, int kv_heads,
                     const T* __restrict__ q_norm, const T* __restrict__ k_norm, float eps,
                     const T* __restrict__ cos_t, const T* __restrict__ sin_t,
                     T* __restrict__ k_cache, T* __restrict__ v_cache,
                     const int64_t* __restrict__ slots) {
  GridDependencyWait();
  GridDependencyLaunch();
  constexpr int D = VEC * 32;
  const int64_t t = blockIdx.x;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  T* row = qkv + t * row_stride;
  const int64_t slot = k_cache != nullptr ? slots[t] : 0;
  float c[VEC], s[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    c[j] = F(cos_t[t * D + lane * VEC + j]);
    s[j] = F(sin_t[t * D + lane * VEC + j]);
  }
  const int total = heads + 2 * kv_heads;
  const int warps = blockDim.x / 32;
  for (int h = warp; h < total; h += warps) {
    T* hp = row + static_cast<int64_t>(h) * D + lane * VEC;
    if (h >= heads + kv_heads) {  // v: copied, not transformed
      if (k_cache != nullptr) {
        T* dst = v_cache + (slot * kv_heads + (h - heads - kv_heads)) * D + lane * VEC;
#pragma unroll
        for (int j = 0; j < VEC; ++j) dst[j] = hp[j];
      }
      continue;
    }
    const bool is_q = h < heads;
    const T* nw = is_q ? q_norm : k_norm;
    float x[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) x[j] = F(hp[j]);
    if (nw != nullptr) {
      float ss = 0.f;
#pragma unroll
      for (int j = 0; j < VEC; ++j) ss += x[j] * x[j];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      const float r = rsqrtf(ss / static_cast<float>(D) + eps);
#pragma unroll
      for (int j = 0; j < VEC; ++j) x[j] = R<T>(F(nw[lane * VEC + j]) * R<T>(x[j] * r));
    }
    T out[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float partner = __shfl_xor_sync(0xffffffffu, x[j], 16);
      const float rot = lane < 16 ? -partner : partner;
      out[j] = To<T>(R<T>(x[j] * c[j]) + R<T>(rot * s[j]));
    }
#pragma unroll
    for (int j = 0; j < VEC; ++j) hp[j] = out[j];
    if (!is_q && k_cache != nullptr) {
      T* dst = k_cache + (slot * kv_heads + (h - heads)) * D + lane * VEC;
#pragma unroll
      for (int j = 0; j < VEC; ++j) dst[j] = out[j];
    }
  }
}

template <typename T>
__global__ void SiluMulPackedKernel(const T* __restrict__ gu, T* __restrict__ y, int64_t rows,
                                    int64_t n) {
  GridDependencyWait();
  GridDependencyLaunch();
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= rows * n) return;
  const int64_t t = idx / n;
  const int64_t i = idx % n;
  const float gv = F(gu[t * 2 * n + i]);
  const float sv = gv / (1.0f + expf(-gv));
  y[idx] = To<T>(R<T>(sv) * F(gu[t * 2 * n + n + i]));
}

// ---- small-m GEMM (decode)

constexpr int kGemmWarps = 8;

// The first kPrefetch 16-byte weight vectors of each lane are loaded before the grid dependency
// wait (weights are never written by an earlier kernel), so streaming them overlaps the tail of
// the previous kernel; the accumulation order is the same as without the prefetch.
constexpr int kPrefetch = 8;

// Where a small-m GEMM's input rows come from. Lane `lane` of warp `warp` multiplies the 16-byte
// vectors at columns base = (i * 32 + lane) * V of every row; Load(m, base) returns the vector of
// row m there. BeforeWait runs before the grid dependency wait (it may only read memory no
// earlier kernel of the stream writes), AfterWait once after it in every warp of the block, idle
// ones included (it may synchronise the block).

// x [M, k] as stored in memory (written by the kernel before).
template <typename T>
struct StoredRows {
  const T* x;
  int k;
  __device__ __forceinline__ void BeforeWait(int, int) {}
  __device__ __forceinline__ void AfterWait(int, int) {}
  __device__ __forceinline__ Vec16<T> Load(int m, int base) const {
    return *reinterpret_cast<const Vec16<T>*>(x + static_cast<int64_t>(m) * k + base);
  }
};

// The norm's 16-byte vectors one thread handles: k / (32 V) "virtual warps" over kGemmWarps warps.
constexpr int kNormVecsPerThread = 4;

// RmsNorm(x) with weight `norm`, computed by the block into shared memory (dynamic, M * k * T):
// the roundings and the float summation order of AddRmsNormVecKernel — its warp v summed the
// vectors v * 32 + lane; here warp v % kGemmWarps does, into partial[m][v], and every thread adds
// the partials in order — so the GEMM result is bit-identical to that kernel's output followed by
// the GEMM. x is read once per block, not once per warp; the norm weight is loaded before the wait.
template <typename T, int M>
struct NormRows {
  const T* x;
  const T* norm;
  int k;
  float eps;
  T* xs;  // shared memory: the normalised rows (set by AfterWait)
  Vec16<T> nw[kNormVecsPerThread];

  __device__ __forceinline__ void BeforeWait(int warp, int lane) {
    constexpr int V = 16 / sizeof(T);
    const int vw = k / (32 * V);
#pragma unroll
    for (int i = 0; i < kNormVecsPerThread; ++i) {
      const int v = warp + i * kGemmWarps;
      if (v < vw) nw[i] = *reinterpret_cast<const Vec16<T>*>(norm + (v * 32 + lane) * V);
    }
  }
  __device__ __forceinline__ void AfterWait(int warp, int lane) {
    constexpr int V = 16 / sizeof(T);
    extern __shared__ __align__(16) unsigned char norm_rows_smem[];
    __shared__ float partial[M][32];
    xs = reinterpret_cast<T*>(norm_rows_smem);
    const int vw = k / (32 * V);
#pragma unroll
    for (int m = 0; m < M; ++m) {
#pragma unroll
      for (int i = 0; i < kNormVecsPerThread; ++i) {
        const int v = warp + i * kGemmWarps;
        if (v < vw) {
          const int64_t off = static_cast<int64_t>(m) * k + (v * 32 + lane) * V;
          const Vec16<T> h = *reinterpret_cast<const Vec16<T>*>(x + off);
          *reinterpret_cast<Vec16<T>*>(xs + off) = h;
          float ss = 0.f;
#pragma unroll
          for (int j = 0; j < V; ++j) {
            const float f = F(h.v[j]);
            ss += f * f;
          }
#pragma unroll
          for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
          if (lane == 0) partial[m][v] = ss;
        }
      }
    }
    __syncthreads();
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float total = 0.f;
      for (int v = 0; v < vw; ++v) total += partial[m][v];
      const float r = rsqrtf(total / static_cast<float>(k) + eps);
#pragma unroll
      for (int i = 0; i < kNormVecsPerThread; ++i) {
        const int v = warp + i * kGemmWarps;
        if (v < vw) {
          Vec16<T>* p = reinterpret_cast<Vec16<T>*>(xs + static_cast<int64_t>(m) * k +
                                                     (v * 32 + lane) * V);
          Vec16<T> h = *p;
#pragma unroll
          for (int j = 0; j < V; ++j) h.v[j] = To<T>(F(nw[i].v[j]) * R<T>(F(h.v[j]) * r));
          *p = h;
        }
      }
    }
    __syncthreads();
  }
  __device__ __forceinline__ Vec16<T> Load(int m, int base) const {
    return *reinterpret_cast<const Vec16<T>*>(xs + static_cast<int64_t>(m) * k + base);
  }
};

// Shared by the streaming and the slab kernels below, so that both do the same arithmetic.

// acc[m] += wr · x_m over the lane's 16-byte vectors (i * 32 + lane) * V for i >= first, i
// ascending.
template <typename T, int M, typename Rows>
__device__ __forceinline__ void RowDot(const T* wr, const Rows& in, int k, int lane, int first,
                                       float (&acc)[M]) {
  constexpr int V = 16 / sizeof(T);
#pragma unroll 4
  for (int base = (first * 32 + lane) * V; base < k; base += 32 * V) {
    const Vec16<T> wv = *reinterpret_cast<const Vec16<T>*>(wr + base);
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const Vec16<T> xv = in.Load(m, base);
#pragma unroll
      for (int j = 0; j < V; ++j) acc[m] += F(wv.v[j]) * F(xv.v[j]);
    }
  }
}

// RowDot for a gate row and an up row at once.
template <typename T, int M, typename Rows>
__device__ __forceinline__ void RowDot2(const T* wg, const T* wu, const Rows& in, int k, int lane,
                                        int first, float (&ag)[M], float (&au)[M]) {
  constexpr int V = 16 / sizeof(T);
#pragma unroll 2
  for (int base = (first * 32 + lane) * V; base < k; base += 32 * V) {
    const Vec16<T> gv = *reinterpret_cast<const Vec16<T>*>(wg + base);
    const Vec16<T> uv = *reinterpret_cast<const Vec16<T>*>(wu + base);
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const Vec16<T> xv = in.Load(m, base);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        ag[m] += F(gv.v[j]) * F(xv.v[j]);
        au[m] += F(uv.v[j]) * F(xv.v[j]);
      }
    }
  }
}

template <int M>
__device__ __forceinline__ void WarpSums(float (&acc)[M]) {
#pragma unroll
  for (int m = 0; m < M; ++m) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], o);
  }
}

// Output feature `row` of the M rows (lane 0): T(acc + bias), or with ADD T(old + T(acc + bias))
// into the residual — the eager linear's rounding, then the eager add's.
template <typename T, int M, bool ADD>
__device__ __forceinline__ void StoreRow(T* __restrict__ y, int n, int row,
                                         const T* __restrict__ bias, const float (&acc)[M],
                                         const float* old) {
  const float b = bias != nullptr ? F(bias[row]) : 0.f;
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const T v = To<T>(acc[m] + b);
    y[static_cast<int64_t>(m) * n + row] = ADD ? To<T>(old[m] + F(v)) : v;
  }
}

// SiluMul(T(x·gate_j), T(x·up_j)) with the roundings of the small-m GEMM followed by
// SiluMulPacked.
template <typename T, int M>
__device__ __forceinline__ void StoreSiluRow(T* __restrict__ y, int n, int row,
                                             const float (&ag)[M], const float (&au)[M]) {
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const float gv = F(To<T>(ag[m]));
    const float sv = gv / (1.0f + expf(-gv));
    y[static_cast<int64_t>(m) * n + row] = To<T>(R<T>(sv) * F(To<T>(au[m])));
  }
}

// y [M, n] = x W^T (+ bias): warp `row` streams weight row `row`. With ADD, y is the residual
// stream [M, n] and gets y += T(x W^T + bias) (the rounding of the eager linear, then of the eager
// add); its old values are read before the grid dependency wait, so the kernel right before must
// not write it (in the decoder it was last written two or more kernels back).
template <typename T, int M, typename Rows, bool ADD>
__global__ void __launch_bounds__(kGemmWarps * 32)
    SmallGemmKernel(Rows in, const T* __restrict__ w, const T* __restrict__ bias,
                    T* __restrict__ y, int n, int k) {
  constexpr int V = 16 / sizeof(T);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * kGemmWarps + warp;
  const bool active = row < n;
  const T* wr = w + static_cast<int64_t>(active ? row : 0) * k;
  Vec16<T> pre[kPrefetch];
#pragma unroll
  for (int i = 0; i < kPrefetch; ++i) {
    const int base = (i * 32 + lane) * V;
    if (active && base < k) pre[i] = *reinterpret_cast<const Vec16<T>*>(wr + base);
  }
  float old[M];
  if (ADD && active && lane == 0) {
#pragma unroll
    for (int m = 0; m < M; ++m) old[m] = F(y[static_cast<int64_t>(m) * n + row]);
  }
  in.BeforeWait(warp, lane);
  GridDependencyWait();
  GridDependencyLaunch();
  in.AfterWait(warp, lane);
  if (!active) return;
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.f;
#pragma unroll
  for (int i = 0; i < kPrefetch; ++i) {
    const int base = (i * 32 + lane) * V;
    if (base < k) {
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const Vec16<T> xv = in.Load(m, base);
#pragma unroll
        for (int j = 0; j < V; ++j) acc[m] += F(pre[i].v[j]) * F(xv.v[j]);
      }
    }
  }
  RowDot<T, M>(wr, in, k, lane, kPrefetch, acc);
  WarpSums<M>(acc);
  if (lane == 0) StoreRow<T, M, ADD>(y, n, row, bias, acc, old);
}

// The gate|up projection and SiLU·up in one kernel: w [2n, k] is the stacked gate (rows [0, n))
// and up (rows [n, 2n)) weight; the warp of output feature j streams gate row j and up row j and
// writes y[m][j] = SiluMul(T(x·gate_j), T(x·up_j)) with the roundings of the two-kernel path
// (small-m GEMM, then SiluMulPacked), so the result is bit-identical to it.
template <typename T, int M, typename Rows>
__global__ void __launch_bounds__(kGemmWarps * 32)
    SmallGemmSiluKernel(Rows in, const T* __restrict__ w, T* __restrict__ y, int n, int k) {
  constexpr int V = 16 / sizeof(T);
  constexpr int kHalf = kPrefetch / 2;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * kGemmWarps + warp;
  const bool active = row < n;
  const T* wg = w + static_cast<int64_t>(active ? row : 0) * k;
  const T* wu = wg + static_cast<int64_t>(n) * k;
  Vec16<T> pg[kHalf], pu[kHalf];
#pragma unroll
  for (int i = 0; i < kHalf; ++i) {
    const int base = (i * 32 + lane) * V;
    if (active && base < k) {
      pg[i] = *reinterpret_cast<const Vec16<T>*>(wg + base);
      pu[i] = *reinterpret_cast<const Vec16<T>*>(wu + base);
    }
  }
  in.BeforeWait(warp, lane);
  GridDependencyWait();
  GridDependencyLaunch();
  in.AfterWait(warp, lane);
  if (!active) return;
  float ag[M], au[M];
#pragma unroll
  for (int m = 0; m < M; ++m) ag[m] = au[m] = 0.f;
#pragma unroll
  for (int i = 0; i < kHalf; ++i) {
    const int base = (i * 32 + lane) * V;
    if (base < k) {
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const Vec16<T> xv = in.Load(m, base);
#pragma unroll
        for (int j = 0; j < V; ++j) {
          ag[m] += F(pg[i].v[j]) * F(xv.v[j]);
          au[m] += F(pu[i].v[j]) * F(xv.v[j]);
        }
      }
    }
  }
  RowDot2<T, M>(wg, wu, in, k, lane, kHalf, ag, au);
  WarpSums<M>(ag);
  WarpSums<M>(au);
  if (lane == 0) StoreSiluRow<T, M>(y, n, row, ag, au);
}

// ---- slab small-m GEMMs (decode): the block's weight rows copied into shared memory first
//
// A block owns `rows` consecutive output features (a contiguous slab of W; for gate|up the gate
// slab and the up slab) and copies all of it into shared memory with cp.async before the grid
// dependency wait. The grid is one block per SM, so every block of a kernel is resident at once
// and, under PDL, next to the blocks of the kernel before it: each GEMM's weights stream in while
// the previous kernel still runs, and after the wait the products read shared memory only. The
// streaming kernels above reach the same overlap only for their first wave of blocks and the
// first kPrefetch vectors of each row. The arithmetic is theirs (RowDot, WarpSums, StoreRow), so
// results are bit-identical to them.

// One block's share of the GEMM (host: PlanSlab).
struct Slab {
  int rows;    // output features per block (of each half for gate|up)
  int offset;  // byte offset of the weight copy in dynamic shared memory (after the input rows)
};

__device__ __forceinline__ void CopyAsync16(void* dst, const void* src) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(src) : "memory");
}

__device__ __forceinline__ void CopyAsyncWaitAll() {
  asm volatile("cp.async.wait_all;" ::: "memory");
}

// `rows` rows of k elements from src (contiguous) to dst, spread over the block's threads.
template <typename T>
__device__ __forceinline__ void CopySlab(T* dst, const T* __restrict__ src, int rows, int k) {
  constexpr int V = 16 / sizeof(T);
  const int vecs = rows * (k / V);
  for (int i = threadIdx.x; i < vecs; i += blockDim.x) CopyAsync16(dst + i * V, src + i * V);
}

// The slab kernels' grid dependency wait (after they issued the slab copy): the input rows'
// before/after-wait steps around it, then the copy landed and visible to the whole block.
template <typename Rows>
__device__ __forceinline__ void SlabWait(Rows& in, int warp, int lane) {
  in.BeforeWait(warp, lane);
  GridDependencyWait();
  GridDependencyLaunch();
  in.AfterWait(warp, lane);
  CopyAsyncWaitAll();
  __syncthreads();
}

// SmallGemmKernel with the slab in shared memory. With ADD the block's old residual values are
// read into shared memory (after the slab) before the wait, as SmallGemmKernel reads them.
template <typename T, int M, typename Rows, bool ADD>
__global__ void __launch_bounds__(kGemmWarps * 32)
    SlabGemmKernel(Rows in, Slab slab, const T* __restrict__ w, const T* __restrict__ bias,
                   T* __restrict__ y, int n, int k) {
  extern __shared__ __align__(16) unsigned char slab_smem[];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int r0 = blockIdx.x * slab.rows;
  const int rows = min(slab.rows, n - r0);
  T* ws = reinterpret_cast<T*>(slab_smem + slab.offset);
  float* old = reinterpret_cast<float*>(ws + static_cast<int64_t>(slab.rows) * k);
  CopySlab(ws, w + static_cast<int64_t>(r0) * k, rows, k);
  if constexpr (ADD) {
    for (int i = threadIdx.x; i < rows * M; i += blockDim.x) {
      old[i] = F(y[static_cast<int64_t>(i % M) * n + r0 + i / M]);
    }
  }
  SlabWait(in, warp, lane);
  for (int r = warp; r < rows; r += kGemmWarps) {
    float acc[M];
#pragma unroll
    for (int m = 0; m < M; ++m) acc[m] = 0.f;
    RowDot<T, M>(ws + static_cast<int64_t>(r) * k, in, k, lane, 0, acc);
    WarpSums<M>(acc);
    if (lane == 0) StoreRow<T, M, ADD>(y, n, r0 + r, bias, acc, old + r * M);
  }
}

// SmallGemmSiluKernel with the gate slab and the up slab in shared memory.
template <typename T, int M, typename Rows>
__global__ void __launch_bounds__(kGemmWarps * 32)
    SlabGemmSiluKernel(Rows in, Slab slab, const T* __restrict__ w, T* __restrict__ y, int n,
                       int k) {
  extern __shared__ __align__(16) unsigned char slab_smem[];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int r0 = blockIdx.x * slab.rows;
  const int rows = min(slab.rows, n - r0);
  T* wg = reinterpret_cast<T*>(slab_smem + slab.offset);
  T* wu = wg + static_cast<int64_t>(slab.rows) * k;
  CopySlab(wg, w + static_cast<int64_t>(r0) * k, rows, k);
  CopySlab(wu, w + (static_cast<int64_t>(n) + r0) * k, rows, k);
  SlabWait(in, warp, lane);
  for (int r = warp; r < rows; r += kGemmWarps) {
    float ag[M], au[M];
#pragma unroll
    for (int m = 0; m < M; ++m) ag[m] = au[m] = 0.f;
    RowDot2<T, M>(wg + static_cast<int64_t>(r) * k, wu + static_cast<int64_t>(r) * k, in, k, lane,
                  0, ag, au);
    WarpSums<M>(ag);
    WarpSums<M>(au);
    if (lane == 0) StoreSiluRow<T, M>(y, n, r0 + r, ag, au);
  }
}

// AddRmsNorm with one 16-byte vector per thread held in registers (n / V threads, a multiple of
// 32, at most 1024): one read of residual, delta and w, one write of residual and y.
// With `prefetch`, the residual and the weight are read before the grid dependency wait: in the
// decoder the residual was last written by the previous AddRmsNorm, three or more kernels back
// (complete once the kernel before this one has passed its own wait; pdl.cuh), and only `delta`
// comes from the kernel right before.
template <typename T>
__global__ void AddRmsNormVecKernel(T* __restrict__ res, const T* __restrict__ delta,
                                    const T* __restrict__ w, T* __restrict__ y, int n, float eps,
                                    bool prefetch) {
  constexpr int V = 16 / sizeof(T);
  const int64_t off = static_cast<int64_t>(blockIdx.x) * n + threadIdx.x * V;
  const Vec16<T> wv = *reinterpret_cast<const Vec16<T>*>(w + threadIdx.x * V);
  Vec16<T> rv;
  if (prefetch) rv = *reinterpret_cast<const Vec16<T>*>(res + off);
  GridDependencyWait();
  GridDependencyLaunch();
  if (!prefetch) rv = *reinterpret_cast<const Vec16<T>*>(res + off);
  if (delta != nullptr) {
    const Vec16<T> dv = *reinterpret_cast<const Vec16<T>*>(delta + off);
#pragma unroll
    for (int j = 0; j < V; ++j) rv.v[j] = To<T>(F(rv.v[j]) + F(dv.v[j]));
    *reinterpret_cast<Vec16<T>*>(res + off) = rv;
  }
  float v[V];
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    v[j] = F(rv.v[j]);
    ss += v[j] * v[j];
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  __shared__ float warp_sums[32];
  const int warps = blockDim.x / 32;
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = ss;
  __syncthreads();
  float total = 0.f;
  for (int i = 0; i < warps; ++i) total += warp_sums[i];
  const float r = rsqrtf(total / static_cast<float>(n) + eps);
  Vec16<T> out;
#pragma unroll
  for (int j = 0; j < V; ++j) out.v[j] = To<T>(F(wv.v[j]) * R<T>(v[j] * r));
  *reinterpret_cast<Vec16<T>*>(y + off) = out;
}

template <typename T>
struct RmsNormLauncher {
  static int Run(const void* x, const void* w, void* y, int64_t rows, int n, float eps,
                 cudaStream_t s) {
    if (rows == 0) return 0;
    LaunchKernel(RmsNormKernel<T>, static_cast<unsigned>(rows), kNormThreads, 0, s,
                 static_cast<const T*>(x), static_cast<const T*>(w), static_cast<T*>(y), n, eps);
    return static_cast<int>(cudaGetLastError());
  }
};

template <typename T>
struct RopeLauncher {
  static int Run(const void* x, const void* c, const void* sn, void* y, int64_t tokens, int heads,
                 int d, cudaStream_t s) {
    const int64_t total = tokens * heads * d;
    if (total == 0) return 0;
    const int threads = 256;
    LaunchKernel(RopeKernel<T>, static_cast<unsigned>((total + threads - 1) / threads), threads, 0,
                 s, static_cast<const T*>(x), static_cast<const T*>(c), static_cast<const T*>(sn),
                 static_cast<T*>(y), total, heads, d);
    return static_cast<int>(cudaGetLastError());
  }
};

template <typename T>
struct SiluMulLauncher {
  static int Run(const void* g, const void* u, void* y, int64_t n, cudaStream_t s) {
    if (n == 0) return 0;
    const int threads = 256;
    LaunchKernel(SiluMulKernel<T>, static_cast<unsigned>((n + threads - 1) / threads), threads, 0,
                 s, static_cast<const T*>(g), static_cast<const T*>(u), static_cast<T*>(y), n);
    return static_cast<int>(cudaGetLastError());
  }
};

template <typename T>
struct AddRmsNormLauncher {
  static int Run(void* res, const void* delta, const void* w, void* y, int64_t rows, int n,
                 float eps, cudaStream_t s) {
    if (rows == 0) return 0;
    constexpr int V = 16 / static_cast<int>(sizeof(T));
    const int threads = n / V;
    const bool aligned = (reinterpret_cast<uintptr_t>(res) | reinterpret_cast<uintptr_t>(delta) |
                          reinterpret_cast<uintptr_t>(w) | reinterpret_cast<uintptr_t>(y)) % 16 == 0;
    if (aligned && n % V == 0 && threads % 32 == 0 && threads <= 1024) {
      // Without delta the residual may come from the kernel right before: read after the wait.
      static const bool prefetch = DecodeFusionEnabled("norm_prefetch");
      LaunchKernel(AddRmsNormVecKernel<T>, static_cast<unsigned>(rows), threads, 0, s,
                   static_cast<T*>(res), static_cast<const T*>(delta), static_cast<const T*>(w),
                   static_cast<T*>(y), n, eps, prefetch && delta != nullptr);
      return static_cast<int>(cudaGetLastError());
    }
    LaunchKernel(AddRmsNormKernel<T>, static_cast<unsigned>(rows), kNormThreads, 0, s,
                 static_cast<T*>(res), static_cast<const T*>(delta), static_cast<const T*>(w),
                 static_cast<T*>(y), n, eps);
    return static_cast<int>(cudaGetLastError());
  }
};

template <typename T>
struct QkNormRopeLauncher {
  template <int VEC>
  static void Go(const QkNormRopeArgs& a, cudaStream_t s) {
    static const bool wide_enabled = DecodeFusionEnabled("qk_wide");
    if (wide_enabled && a.tokens <= kQkvWideMaxTokens) {
      Launch<VEC, kQkvWideWarps>(a, std::min(a.heads + 2 * a.kv_heads, kQkvWideWarps), s);
    } else {
      Launch<VEC, kQkvWarps>(a, std::min(a.heads + 2 * a.kv_heads, kQkvWarps), s);
    }
  }
  template <int VEC, int MAXW>
  static void Launch(const QkNormRopeArgs& a, int warps, cudaStream_t s) {
    LaunchKernel(QkNormRopeKernel<T, VEC, MAXW>, static_cast<unsigned>(a.tokens), warps * 32, 0,
                 s, static_cast<T*>(a.qkv), a.row_stride, a.heads, a.kv_heads,
                 static_cast<const T*>(a.q_norm), static_cast<const T*>(a.k_norm), a.eps,
                 static_cast<const T*>(a.cos), static_cast<const T*>(a.sin),
                 static_cast<T*>(a.k_cache), static_cast<T*>(a.v_cache), a.slots);
  }
  static int Run(const QkNormRopeArgs& a, cudaStream_t s) {
    if (a.tokens == 0) return 0;
    switch (a.d) {
      case 32: Go<1>(a, s); break;
      case 64: Go<2>(a, s); break;
      case 128: Go<4>(a, s); break;
      case 256: Go<8>(a, s); break;
      default: return static_cast<int>(cudaErrorInvalidValue);
    }
    return static_cast<int>(cudaGetLastError());
  }
};

template <typename T>
struct SiluMulPackedLauncher {
  static int Run(const void* gu, void* y, int64_t rows, int64_t n, cudaStream_t s) {
    const int64_t total = rows * n;
    if (total == 0) return 0;
    const int threads = 256;
    LaunchKernel(SiluMulPackedKernel<T>, static_cast<unsigned>((total + threads - 1) / threads),
                 threads, 0, s, static_cast<const T*>(gu), static_cast<T*>(y), rows, n);
    return static_cast<int>(cudaGetLastError());
  }
};

// Host side of the small-m GEMMs: where the input rows come from (StoredInput or NormInput),
// which kernel runs (plain, plain adding into the residual, or gate|up with SiLU), m = 1 up to
// the input's kMaxRows.
enum class GemmKind { kPlain, kAddResidual, kSilu };

template <typename T>
struct StoredInput {
  const T* x;
  int k;
  template <int M>
  StoredRows<T> Rows() const {
    return {x, k};
  }
  static constexpr int kMaxRows = 8;
  size_t SharedBytes(int) const { return 0; }
};

template <typename T>
struct NormInput {
  const T* x;
  const T* norm;
  int k;
  float eps;
  template <int M>
  NormRows<T, M> Rows() const {
    NormRows<T, M> rows;
    rows.x = x;
    rows.norm = norm;
    rows.k = k;
    rows.eps = eps;
    return rows;
  }
  // The decoder folds the norm at single-row steps only (more rows measured slower), so no
  // kernels are compiled for more.
  static constexpr int kMaxRows = 1;
  size_t SharedBytes(int m) const { return static_cast<size_t>(m) * k * sizeof(T); }
};

// The slab kernels (SlabGemmKernel): rows per block for one block per SM (a multiple of the
// warps), used at up to kSlabMaxRows input rows when a block's weight rows fit in kSlabMaxBytes
// of shared memory, so that the slabs of two consecutive GEMMs fit on one SM together
// (kSlabMaxShared adds the input rows and the old residual values). Only at one or two rows: at
// four and eight the streaming kernels were faster (more warps per SM to hide the input-row
// loads; decode graph replay 1.155 / 1.509 ms streaming against 1.261 / 1.730 ms with slabs, and
// 0.736 / 0.954 ms slab against 0.842 / 0.973 at one and two rows).
constexpr size_t kSlabMaxBytes = 96 * 1024;
constexpr int kSlabMaxShared = 160 * 1024;
constexpr int kSlabMaxRows = 2;

std::atomic<bool> g_slab{true};

bool SlabGemmEnabled() {
  static const bool env_enabled = DecodeFusionEnabled("slab");
  return env_enabled && g_slab.load(std::memory_order_relaxed);
}

constexpr int kMaxDevices = 64;

int SmCount() {
  static std::atomic<int> counts[kMaxDevices] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) return 0;
  int v = counts[device].load(std::memory_order_relaxed);
  if (v == 0) {
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) return 0;
    counts[device].store(v, std::memory_order_relaxed);
  }
  return v;
}

struct SlabPlan {
  Slab slab;
  unsigned blocks = 0;
  size_t smem = 0;
};

bool PlanSlab(int m, int n, int k, size_t elem, size_t in_bytes, GemmKind kind, SlabPlan* plan) {
  if (m > kSlabMaxRows || !SlabGemmEnabled()) return false;
  const int sms = SmCount();
  if (sms <= 0) return false;
  const int per_sm = (n + sms - 1) / sms;
  const int rows = (per_sm + kGemmWarps - 1) / kGemmWarps * kGemmWarps;
  const size_t halves = kind == GemmKind::kSilu ? 2 : 1;
  const size_t slab_bytes = static_cast<size_t>(rows) * k * elem * halves;
  if (slab_bytes > kSlabMaxBytes) return false;
  const size_t offset = (in_bytes + 15) / 16 * 16;
  plan->slab = Slab{rows, static_cast<int>(offset)};
  plan->blocks = static_cast<unsigned>((n + rows - 1) / rows);
  plan->smem = offset + slab_bytes +
               (kind == GemmKind::kAddResidual ? static_cast<size_t>(rows) * m * sizeof(float) : 0);
  return plan->smem <= static_cast<size_t>(kSlabMaxShared);
}

// Lets `Kernel` use kSlabMaxShared bytes of dynamic shared memory with the carve-out at its
// maximum, once per device (function attributes are per device).
template <auto Kernel>
void AllowSlabShared() {
  static std::atomic<uint64_t> done{0};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return;
  const uint64_t bit = uint64_t{1} << (device % kMaxDevices);
  if ((done.load(std::memory_order_acquire) & bit) != 0) return;
  cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSlabMaxShared);
  cudaFuncSetAttribute(Kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                       cudaSharedmemCarveoutMaxShared);
  done.fetch_or(bit, std::memory_order_acq_rel);
}

template <auto Kernel, typename... Args>
void LaunchSlab(const SlabPlan& plan, cudaStream_t s, Args&&... args) {
  AllowSlabShared<Kernel>();
  LaunchKernel(Kernel, plan.blocks, kGemmWarps * 32, plan.smem, s, std::forward<Args>(args)...);
}

template <typename T, int M, typename Input>
void LaunchGemmM(const Input& in, const T* w, const T* b, T* y, int n, int k, GemmKind kind,
                 cudaStream_t s) {
  using Rows = decltype(in.template Rows<M>());
  const size_t smem = in.SharedBytes(M);
  if constexpr (M <= kSlabMaxRows) {  // no slab kernels compiled for more rows
    SlabPlan plan;
    if (PlanSlab(M, n, k, sizeof(T), smem, kind, &plan)) {
      switch (kind) {
        case GemmKind::kPlain:
          LaunchSlab<SlabGemmKernel<T, M, Rows, false>>(plan, s, in.template Rows<M>(),
                                                        plan.slab, w, b, y, n, k);
          break;
        case GemmKind::kAddResidual:
          LaunchSlab<SlabGemmKernel<T, M, Rows, true>>(plan, s, in.template Rows<M>(), plan.slab,
                                                       w, b, y, n, k);
          break;
        case GemmKind::kSilu:
          LaunchSlab<SlabGemmSiluKernel<T, M, Rows>>(plan, s, in.template Rows<M>(), plan.slab,
                                                     w, y, n, k);
          break;
      }
      return;
    }
  }
  const unsigned blocks = static_cast<unsigned>((n + kGemmWarps - 1) / kGemmWarps);
  switch (kind) {
    case GemmKind::kPlain:
      LaunchKernel(SmallGemmKernel<T, M, Rows, false>, blocks, kGemmWarps * 32, smem, s,
                   in.template Rows<M>(), w, b, y, n, k);
      break;
    case GemmKind::kAddResidual:
      LaunchKernel(SmallGemmKernel<T, M, Rows, true>, blocks, kGemmWarps * 32, smem, s,
                   in.template Rows<M>(), w, b, y, n, k);
      break;
    case GemmKind::kSilu:
      LaunchKernel(SmallGemmSiluKernel<T, M, Rows>, blocks, kGemmWarps * 32, smem, s,
                   in.template Rows<M>(), w, y, n, k);
      break;
  }
}

// LaunchGemmM<T, m> for the run-time m in [M, Input::kMaxRows].
template <typename T, int M, typename Input>
void LaunchGemmRows(int m, const Input& in, const T* w, const T* b, T* y, int n, int k,
                    GemmKind kind, cudaStream_t s) {
  if constexpr (M < Input::kMaxRows) {
    if (m > M) return LaunchGemmRows<T, M + 1>(m, in, w, b, y, n, k, kind, s);
  }
  LaunchGemmM<T, M>(in, w, b, y, n, k, kind, s);
}

// m (at most Input::kMaxRows), n, k and the weight's alignment checked by the caller.
template <typename T, typename Input>
int RunSmallGemm(const Input& in, const void* w, const void* b, void* y, int64_t m, int64_t n,
                 int64_t k, GemmKind kind, cudaStream_t s) {
  LaunchGemmRows<T, 1>(static_cast<int>(m), in, static_cast<const T*>(w),
                       static_cast<const T*>(b), static_cast<T*>(y), static_cast<int>(n),
                       static_cast<int>(k), kind, s);
  return static_cast<int>(cudaGetLastError());
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

size_t ElementSize(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }

// m = 1..8 input rows of k elements in whole 16-byte vectors.
bool SmallShapeOk(int64_t m, int64_t k, size_t elem) {
  return m >= 1 && m <= 8 && k % (16 / static_cast<int64_t>(elem)) == 0;
}

template <typename T>
bool GemmShapeOk(int64_t m, int64_t n, int64_t k, const void* w) {
  return SmallShapeOk(m, k, sizeof(T)) && n > 0 && Aligned16(w);
}

// The normalised rows in dynamic shared memory, below the 48 KiB a block gets without opting in
// (the partial sums take 1 KiB of static shared memory).
constexpr size_t kNormGemmMaxShared = 40 * 1024;

bool NormGemmShapeOk(int64_t m, int64_t k, size_t elem) {
  const int64_t v = 16 / static_cast<int64_t>(elem);
  return m >= 1 && m <= NormInput<float>::kMaxRows && k % (32 * v) == 0 &&
         k / (32 * v) <= kNormVecsPerThread * kGemmWarps &&
         static_cast<size_t>(m * k) * elem <= kNormGemmMaxShared;
}

template <typename T>
struct SmallGemmLauncher {
  static int Run(const void* x, const void* w, const void* b, void* y, int64_t m, int64_t n,
                 int64_t k, GemmKind kind, cudaStream_t s) {
    if (!GemmShapeOk<T>(m, n, k, w) || !Aligned16(x)) {
      return static_cast<int>(cudaErrorInvalidValue);
    }
    return RunSmallGemm<T>(StoredInput<T>{static_cast<const T*>(x), static_cast<int>(k)}, w, b, y,
                           m, n, k, kind, s);
  }
};

template <typename T>
struct NormGemmLauncher {
  static int Run(const void* x, const void* norm, float eps, const void* w, const void* b, void* y,
                 int64_t m, int64_t n, int64_t k, GemmKind kind, cudaStream_t s) {
    if (!GemmShapeOk<T>(m, n, k, w) || !NormGemmShapeOk(m, k, sizeof(T)) || !Aligned16(x) ||
        !Aligned16(norm)) {
      return static_cast<int>(cudaErrorInvalidValue);
    }
    const NormInput<T> in{static_cast<const T*>(x), static_cast<const T*>(norm),
                          static_cast<int>(k), eps};
    return RunSmallGemm<T>(in, w, b, y, m, n, k, kind, s);
  }
};

}  // namespace

int LaunchRmsNorm(const void* x, const void* w, void* y, int64_t rows, int n, float eps,
                  DType dtype, void* stream) {
  return Dispatch<RmsNormLauncher>(dtype, x, w, y, rows, n, eps,
                                   static_cast<cudaStream_t>(stream));
}

int LaunchRope(const void* x, const void* c, const void* s, void* y, int64_t tokens, int heads,
               int d, DType dtype, void* stream) {
  return Dispatch<RopeLauncher>(dtype, x, c, s, y, tokens, heads, d,
                                static_cast<cudaStream_t>(stream));
}

int LaunchSiluMul(const void* g, const void* u, void* y, int64_t n, DType dtype, void* stream) {
  return Dispatch<SiluMulLauncher>(dtype, g, u, y, n, static_cast<cudaStream_t>(stream));
}

int LaunchAddRmsNorm(void* residual, const void* delta, const void* w, void* y, int64_t rows,
                     int n, float eps, DType dtype, void* stream) {
  return Dispatch<AddRmsNormLauncher>(dtype, residual, delta, w, y, rows, n, eps,
                                      static_cast<cudaStream_t>(stream));
}

bool SmallGemmSupported(int64_t m, int64_t k, DType dtype) {
  return SmallShapeOk(m, k, ElementSize(dtype));
}

int LaunchSmallGemm(const void* x, const void* w, const void* bias, void* y, int64_t m, int64_t n,
                    int64_t k, DType dtype, void* stream) {
  return Dispatch<SmallGemmLauncher>(dtype, x, w, bias, y, m, n, k, GemmKind::kPlain,
                                     static_cast<cudaStream_t>(stream));
}

int LaunchSmallGemmSiluMul(const void* x, const void* gate_up, void* y, int64_t m, int64_t n,
                           int64_t k, DType dtype, void* stream) {
  return Dispatch<SmallGemmLauncher>(dtype, x, gate_up, static_cast<const void*>(nullptr), y, m,
                                     n, k, GemmKind::kSilu, static_cast<cudaStream_t>(stream));
}

int LaunchSmallGemmAddResidual(const void* x, const void* w, const void* bias, void* residual,
                               int64_t m, int64_t n, int64_t k, DType dtype, void* stream) {
  return Dispatch<SmallGemmLauncher>(dtype, x, w, bias, residual, m, n, k,
                                     GemmKind::kAddResidual, static_cast<cudaStream_t>(stream));
}

void SetSlabGemm(bool enabled) { g_slab.store(enabled, std::memory_order_relaxed); }

bool SmallGemmUsesSlab(int64_t m, int64_t n, int64_t k, DType dtype, bool gate_up,
                       bool add_residual) {
  const GemmKind kind = gate_up        ? GemmKind::kSilu
                        : add_residual ? GemmKind::kAddResidual
                                       : GemmKind::kPlain;
  SlabPlan plan;
  return SmallShapeOk(m, k, ElementSize(dtype)) && n > 0 &&
         PlanSlab(static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
                  ElementSize(dtype), 0, kind, &plan);
}

bool NormGemmSupported(int64_t m, int64_t k, DType dtype) {
  return NormGemmShapeOk(m, k, ElementSize(dtype));
}

int LaunchNormSmallGemm(const void* x, const void* norm, float eps, const void* w,
                        const void* bias, void* y, int64_t m, int64_t n, int64_t k, DType dtype,
                        void* stream) {
  return Dispatch<NormGemmLauncher>(dtype, x, norm, eps, w, bias, y, m, n, k, GemmKind::kPlain,
                                    static_cast<cudaStream_t>(stream));
}

int LaunchNormSmallGemmSiluMul(const void* x, const void* norm, float eps, const void* gate_up,
                               void* y, int64_t m, int64_t n, int64_t k, DType dtype,
                               void* stream) {
  return Dispatch<NormGemmLauncher>(dtype, x, norm, eps, gate_up,
                                    static_cast<const void*>(nullptr), y, m, n, k, GemmKind::kSilu,
                                    static_cast<cudaStream_t>(stream));
}

bool QkNormRopeSupported(int d) { return d == 32 || d == 64 || d == 128 || d == 256; }

int LaunchQkNormRope(const QkNormRopeArgs& args, void* stream) {
  return Dispatch<QkNormRopeLauncher>(args.dtype, args, static_cast<cudaStream_t>(stream));
}

int LaunchSiluMulPacked(const void* gu, void* y, int64_t rows, int64_t n, DType dtype,
                        void* stream) {
  return Dispatch<SiluMulPackedLauncher>(dtype, gu, y, rows, n, static_cast<cudaStream_t>(stream));
}

}  // namespace slime::model::cuda
