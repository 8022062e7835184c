// Fused sampling kernels (see sample.h).
//
// Two kernels so that small batches use the whole GPU: the row is cut into kChunks fixed chunks
// (fixed, so a row's result never depends on the batch size).
//   1. ChunkStats, one block per (row, chunk): max and sum of exp of x / t over the chunk, and
//      the chunk's argmax of x.
//   2. Pick, one block per row: log Z from the chunk stats (warp 0, a chunk per lane); greedy
//      rows take the argmax; sampled rows find the chunk holding u * total from the chunk masses
//      s_c exp(m_c - log Z) (a warp scan), then the token inside it by a block scan of
//      exp(x / t - log Z).
#include "sample.h"

#include <cuda_runtime.h>

#include <cfloat>
#include <cub/block/block_scan.cuh>

#include "slime/model/cuda/pdl.cuh"

namespace slime::engine::cuda {
namespace {

constexpr int kChunks = 32;
constexpr int kStatThreads = 256;
constexpr int kPickThreads = 256;

struct ChunkStat {
  float m;   // max of x / t
  float s;   // sum of exp(x / t - m)
  float av;  // max of x
  int ai;    // its lowest index
};

__device__ __forceinline__ void Merge(ChunkStat& a, const ChunkStat& b) {
  if (b.m != -FLT_MAX) {
    if (a.m == -FLT_MAX) {
      a.m = b.m;
      a.s = b.s;
    } else {
      const float m = fmaxf(a.m, b.m);
      a.s = a.s * expf(a.m - m) + b.s * expf(b.m - m);
      a.m = m;
    }
  }
  if (b.av > a.av || (b.av == a.av && b.ai < a.ai)) {
    a.av = b.av;
    a.ai = b.ai;
  }
}

__device__ __forceinline__ ChunkStat ShuffleXor(const ChunkStat& v, int o) {
  return {__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o),
          __shfl_xor_sync(0xffffffffu, v.av, o), __shfl_xor_sync(0xffffffffu, v.ai, o)};
}

__device__ __forceinline__ float Temperature(const float* params, int row) {
  const float t = params[2 * row];
  return t <= 0.f ? 1.f : t;
}

__global__ void __launch_bounds__(kStatThreads)
    ChunkStatsKernel(const float* __restrict__ logits, int64_t row_stride, int vocab,
                     const float* __restrict__ params, ChunkStat* __restrict__ stats) {
  slime::model::cuda::GridDependencyWait();
  slime::model::cuda::GridDependencyLaunch();
  const int row = blockIdx.y;
  const int chunk = blockIdx.x;
  const int len = (vocab + kChunks - 1) / kChunks;
  const int lo = min(vocab, chunk * len);
  const int hi = min(vocab, lo + len);
  const float* x = logits + static_cast<int64_t>(row) * row_stride;
  const float t = Temperature(params, row);
  // Two passes over the thread's elements, each with independent loads (the second hits L1/L2):
  // the max and argmax of x (x / t is monotone in x for t > 0, so max(x / t) = max(x) / t),
  // then the sum of exp(x / t - m).
  ChunkStat st{-FLT_MAX, 0.f, -FLT_MAX, vocab};
#pragma unroll 8
  for (int i = lo + static_cast<int>(threadIdx.x); i < hi; i += kStatThreads) {
    const float raw = x[i];
    if (raw > st.av) {  // strided: a thread's first hit is its lowest index
      st.av = raw;
      st.ai = i;
    }
  }
  if (st.av != -FLT_MAX) {
    st.m = st.av / t;
#pragma unroll 8
    for (int i = lo + static_cast<int>(threadIdx.x); i < hi; i += kStatThreads) {
      st.s += expf(x[i] / t - st.m);
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) Merge(st, ShuffleXor(st, o));
  __shared__ ChunkStat warp_stats[kStatThreads / 32];
  if (threadIdx.x % 32 == 0) warp_stats[threadIdx.x / 32] = st;
  __syncthreads();
  if (threadIdx.x == 0) {
    ChunkStat all = warp_stats[0];
    for (int w = 1; w < kStatThreads / 32; ++w) Merge(all, warp_stats[w]);
    stats[row * kChunks + chunk] = all;
  }
}

__global__ void __launch_bounds__(kPickThreads)
    PickKernel(const float* __restrict__ logits, int64_t row_stride, int batch, int vocab,
               const float* __restrict__ params, const ChunkStat* __restrict__ stats,
               double* __restrict__ out) {
  slime::model::cuda::GridDependencyWait();
  slime::model::cuda::GridDependencyLaunch();
  using Scan = cub::BlockScan<float, kPickThreads>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ float sh_logz;
  __shared__ int sh_token, sh_chunk;
  __shared__ float sh_before, sh_target;

  const int row = blockIdx.x;
  const float* x = logits + static_cast<int64_t>(row) * row_stride;
  const bool greedy = params[2 * row] <= 0.f;
  const float t = Temperature(params, row);
  const float u = params[2 * row + 1];
  const ChunkStat* rs = stats + row * kChunks;
  const int len = (vocab + kChunks - 1) / kChunks;

  // Warp 0 combines the kChunks chunk stats, one per lane (a shuffle tree, lane 0's result
  // broadcast), and for sampled rows finds the chunk whose running mass passes u * total by a
  // warp scan of the chunk masses in chunk order and a ballot.
  static_assert(kChunks == 32, "one chunk per lane of warp 0");
  if (threadIdx.x < 32) {
    const int lane = static_cast<int>(threadIdx.x);
    const ChunkStat mine = rs[lane];
    ChunkStat all = mine;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) Merge(all, ShuffleXor(all, o));
    all.m = __shfl_sync(0xffffffffu, all.m, 0);
    all.s = __shfl_sync(0xffffffffu, all.s, 0);
    all.ai = __shfl_sync(0xffffffffu, all.ai, 0);
    const float logz = all.m + logf(all.s);
    if (!greedy) {
      const float mass = mine.m == -FLT_MAX ? 0.f : mine.s * expf(mine.m - logz);
      float incl = mass;  // inclusive prefix sum of the masses up to this chunk
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const float y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
      }
      const float total = __shfl_sync(0xffffffffu, incl, 31);
      const float target = u * total;
      const float up = __shfl_up_sync(0xffffffffu, incl, 1);
      const float before = lane == 0 ? 0.f : up;  // the masses of the chunks before this one
      const unsigned hit = __ballot_sync(0xffffffffu, before + mass > target && mass > 0.f);
      const int chosen = hit != 0 ? __ffs(static_cast<int>(hit)) - 1 : kChunks - 1;
      const float chosen_before = __shfl_sync(0xffffffffu, hit != 0 ? before : incl, chosen);
      if (lane == 0) {
        sh_chunk = chosen;
        sh_before = chosen_before;
        sh_target = target;
      }
    }
    if (lane == 0) {
      sh_logz = logz;
      sh_token = all.ai < vocab ? all.ai : 0;
    }
  }
  __syncthreads();
  const float logz = sh_logz;
  if (!greedy) {
    // Inside the chunk: contiguous sub-ranges per thread, a block scan of their masses, and the
    // thread whose sub-range crosses the target walks it.
    const int lo = min(vocab, sh_chunk * len);
    const int hi = min(vocab, lo + len);
    const int sub = (hi - lo + kPickThreads - 1) / kPickThreads;
    const int a = min(hi, lo + static_cast<int>(threadIdx.x) * sub);
    const int b = min(hi, a + sub);
    float mass = 0.f;
    for (int i = a; i < b; ++i) mass += expf(x[i] / t - logz);
    float prefix = 0.f;
    Scan(scan_tmp).ExclusiveSum(mass, prefix);
    const float before = sh_before + prefix;
    const float target = sh_target;
    if (threadIdx.x == 0) sh_token = vocab;
    __syncthreads();
    if (b > a && before + mass > target && (before <= target || threadIdx.x == 0)) {
      float c = before;
      int found = b - 1;
      for (int i = a; i < b; ++i) {
        c += expf(x[i] / t - logz);
        if (c > target) {
          found = i;
          break;
        }
      }
      atomicMin(&sh_token, found);  // scan rounding can let two neighbours claim: lower wins
    }
    __syncthreads();
    if (threadIdx.x == 0 && sh_token == vocab) sh_token = hi > lo ? hi - 1 : vocab - 1;
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const int token = sh_token;
    out[row] = static_cast<double>(token);
    out[batch + row] = static_cast<double>(x[token] / t - logz);
  }
}

}  // namespace

int FusedSampleScratchBytes(int batch) {
  return batch * kChunks * static_cast<int>(sizeof(ChunkStat));
}

int LaunchFusedSample(const FusedSampleArgs& a, void* stream) {
  if (a.batch == 0) return 0;
  if (a.vocab <= 0 || a.row_stride < a.vocab || a.scratch == nullptr) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  ChunkStat* stats = static_cast<ChunkStat*>(a.scratch);
  using slime::model::cuda::LaunchKernel;
  LaunchKernel(ChunkStatsKernel, dim3(kChunks, a.batch), dim3(kStatThreads), 0, s, a.logits,
               a.row_stride, a.vocab, a.params, stats);
  LaunchKernel(PickKernel, dim3(a.batch), dim3(kPickThreads), 0, s, a.logits, a.row_stride,
               a.batch, a.vocab, a.params, stats, a.out);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace slime::engine::cuda
