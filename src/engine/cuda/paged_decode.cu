// Paged decode attention kernel (see paged_decode.h).
#include "paged_decode.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <cstdlib>

#include "slime/model/cuda/dtype.cuh"
#include "slime/model/cuda/launch.h"  // DecodeFusionEnabled
#include "slime/model/cuda/pdl.cuh"

namespace slime::engine::cuda {
namespace {

constexpr int kWarps = 8;

__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(__half x) { return __half2float(x); }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ void FromFloat(float v, float* p) { *p = v; }
__device__ __forceinline__ void FromFloat(float v, __half* p) { *p = __float2half(v); }
__device__ __forceinline__ void FromFloat(float v, __nv_bfloat16* p) { *p = __float2bfloat16(v); }

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// VEC = head_dim / 32 elements per lane; G query heads share the KV head. Each warp takes
// kUnroll positions at a time and issues all their K/V loads before using them, so enough
// memory requests are in flight to stream the cache at bandwidth rather than latency.
constexpr int kUnroll = 4;

// VEC elements of T loaded or stored as one access (8 bytes for bf16 at head_dim 128).
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Pack {
  T v[VEC];
};

// RAW: q points at raw q|k|v projection rows (PagedDecodeArgs::raw_qkv).
struct RawQkvParams {
  const void* q_norm;
  const void* k_norm;
  float eps;
  const void* cos;
  const void* sin;
  const int64_t* write_slots;
};

// One head of a raw projection row, per lane VEC elements: RMSNorm by `norm` (null: none) and
// RoPE with this lane's cos/sin, rounded exactly as QkNormRopeKernel (model/cuda/fused_ops.cu)
// rounds them. The division is __fdiv_rn so --use_fast_math does not change it.
template <typename T, int VEC>
__device__ __forceinline__ void NormRopeHead(const T* __restrict__ head, const float* nw, bool norm,
                                             float eps, const float* c, const float* s, int lane,
                                             T* out) {
  using slime::model::cuda::F;
  using slime::model::cuda::R;
  using slime::model::cuda::To;
  constexpr int D = VEC * 32;
  const Pack<T, VEC> hp = *reinterpret_cast<const Pack<T, VEC>*>(head + lane * VEC);
  float x[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) x[j] = F(hp.v[j]);
  if (norm) {
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < VEC; ++j) ss += x[j] * x[j];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float r = rsqrtf(__fdiv_rn(ss, static_cast<float>(D)) + eps);
#pragma unroll
    for (int j = 0; j < VEC; ++j) x[j] = R<T>(nw[j] * R<T>(x[j] * r));
  }
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    const float partner = __shfl_xor_sync(0xffffffffu, x[j], 16);
    const float rot = lane < 16 ? -partner : partner;
    out[j] = To<T>(R<T>(x[j] * c[j]) + R<T>(rot * s[j]));
  }
}

// Split-K merge of one output element: every split's (max, sum, accumulator) partial of head
// `hp` (splits <= kMaxSplits) combined into one value. The loads of all splits are issued before
// any is used (one memory round trip instead of one per split: the loop bound is a compile-time
// constant and the split count a predicate); the arithmetic runs in split order, so the result
// is the same as a plain loop over the splits. CG: read through L2 (written by other blocks).
constexpr int kMaxSplits = 16;

template <bool CG>
__device__ __forceinline__ float MergeSplitPartials(const float* hp, int splits, int d, int D) {
  float ms[kMaxSplits], ls[kMaxSplits], as[kMaxSplits];
#pragma unroll
  for (int s = 0; s < kMaxSplits; ++s) {
    if (s < splits) {
      const float* ps = hp + s * (D + 2);
      ms[s] = CG ? __ldcg(ps + D) : ps[D];
      ls[s] = CG ? __ldcg(ps + D + 1) : ps[D + 1];
      as[s] = CG ? __ldcg(ps + d) : ps[d];
    }
  }
  float mx = -FLT_MAX;
#pragma unroll
  for (int s = 0; s < kMaxSplits; ++s) {
    if (s < splits) mx = fmaxf(mx, ms[s]);
  }
  float num = 0.f, den = 0.f;
#pragma unroll
  for (int s = 0; s < kMaxSplits; ++s) {
    if (s < splits) {
      const float f = ls[s] > 0.f ? __expf(ms[s] - mx) : 0.f;
      num += f * as[s];
      den += f * ls[s];
    }
  }
  return den > 0.f ? num / den : 0.f;
}

// PREFETCH is a template parameter, not a flag: with a run-time flag the main loop's loads became
// conditional and lost their batching (256 x 256 decode fell from 47k to 30k output tok/s).
template <typename T, int VEC, int G, bool RAW, bool PREFETCH>
__global__ void __launch_bounds__(kWarps * 32)
    PagedDecodeKernel(const T* __restrict__ q, T* __restrict__ k_cache,
                      T* __restrict__ v_cache, T* __restrict__ out,
                      const int32_t* __restrict__ page_table, const int32_t* __restrict__ seq_lens,
                      int64_t q_row_stride, int num_heads, int num_kv_heads, int page_size,
                      int max_pages, float scale, float* __restrict__ part,
                      int32_t* __restrict__ counters, RawQkvParams raw) {
  using P = Pack<T, VEC>;
  constexpr int D = VEC * 32;
  const int kvh = blockIdx.x;
  const int b = blockIdx.y;
  const int split = blockIdx.z;
  const int splits = gridDim.z;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int seq_len = seq_lens[b];
  // Split-K (small batches): block `split` takes positions [start, len) of its share.
  const int share = (seq_len + splits - 1) / splits;
  const int start = min(seq_len, split * share);
  const int len = min(seq_len, start + share);
  const int32_t* pages = page_table + static_cast<int64_t>(b) * max_pages;
  auto slot_base = [&](int p) {
    const int64_t slot = static_cast<int64_t>(pages[p / page_size]) * page_size + p % page_size;
    return (slot * num_kv_heads + kvh) * D + lane * VEC;
  };

  // The K/V of this warp's first kUnroll positions are loaded before the grid dependency wait:
  // every position but the newest (seq_len - 1, which the kernel before this one writes) comes
  // from an earlier forward, and the lengths and page table from copies that precede the
  // forward's first kernel (pdl.cuh's contract). At decode lengths of a few hundred positions a
  // split has at most that many, so the cache reads overlap the previous kernel's tail.
  const int first = start + warp * kUnroll;
  P kpre[PREFETCH ? kUnroll : 1], vpre[PREFETCH ? kUnroll : 1];
  if constexpr (PREFETCH) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int p = min(first + u, len - 1);
      if (first < len && p < seq_len - 1) {
        const int64_t base = slot_base(p);
        kpre[u] = *reinterpret_cast<const P*>(k_cache + base);
        vpre[u] = *reinterpret_cast<const P*>(v_cache + base);
      }
    }
  }
  // Raw rows: the norm weights and this row's cos/sin come from before the forward.
  float qn[VEC], kn[VEC], cs[VEC], sn[VEC];
  if constexpr (RAW) {
    const T* qnw = static_cast<const T*>(raw.q_norm);
    const T* knw = static_cast<const T*>(raw.k_norm);
    const T* ct = static_cast<const T*>(raw.cos) + static_cast<int64_t>(b) * D + lane * VEC;
    const T* st = static_cast<const T*>(raw.sin) + static_cast<int64_t>(b) * D + lane * VEC;
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      qn[i] = qnw != nullptr ? ToFloat(qnw[lane * VEC + i]) : 1.f;
      kn[i] = knw != nullptr ? ToFloat(knw[lane * VEC + i]) : 1.f;
      cs[i] = ToFloat(ct[i]);
      sn[i] = ToFloat(st[i]);
    }
  }
  slime::model::cuda::GridDependencyWait();
  slime::model::cuda::GridDependencyLaunch();

  float qv[G][VEC];
  const T* row = q + static_cast<int64_t>(b) * q_row_stride;
  if constexpr (RAW) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
      T o[VEC];
      NormRopeHead<T, VEC>(row + static_cast<int64_t>(kvh * G + g) * D, qn, raw.q_norm != nullptr,
                           raw.eps, cs, sn, lane, o);
#pragma unroll
      for (int i = 0; i < VEC; ++i) qv[g][i] = ToFloat(o[i]) * scale;
    }
    // The block holding the newest position stores its K/V (warp 0: k, warp 1: v) before any
    // warp of the block reads it (block-uniform condition; __syncthreads makes the global
    // writes visible to the block).
    if (start <= seq_len - 1 && seq_len - 1 < len) {
      const int64_t base = (raw.write_slots[b] * num_kv_heads + kvh) * D + lane * VEC;
      if (warp == 0) {
        T o[VEC];
        NormRopeHead<T, VEC>(row + static_cast<int64_t>(num_heads + kvh) * D, kn,
                             raw.k_norm != nullptr, raw.eps, cs, sn, lane, o);
        P kp;
#pragma unroll
        for (int i = 0; i < VEC; ++i) kp.v[i] = o[i];
        *reinterpret_cast<P*>(k_cache + base) = kp;
      } else if (warp == 1) {
        *reinterpret_cast<P*>(v_cache + base) = *reinterpret_cast<const P*>(
            row + static_cast<int64_t>(num_heads + num_kv_heads + kvh) * D + lane * VEC);
      }
      __syncthreads();
    }
  } else {
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const P qp = *reinterpret_cast<const P*>(row + static_cast<int64_t>(kvh * G + g) * D +
                                               lane * VEC);
#pragma unroll
      for (int i = 0; i < VEC; ++i) qv[g][i] = ToFloat(qp.v[i]) * scale;
    }
  }
  float m[G], l[G], acc[G][VEC];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = -FLT_MAX;
    l[g] = 0.f;
#pragma unroll
    for (int i = 0; i < VEC; ++i) acc[g][i] = 0.f;
  }

  for (int p0 = first; p0 < len; p0 += kWarps * kUnroll) {
    float kv[kUnroll][VEC], vv[kUnroll][VEC];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int p = min(p0 + u, len - 1);  // clamped; masked below
      P kp, vp;
      if constexpr (PREFETCH) {
        if (p0 == first && p < seq_len - 1) {
          kp = kpre[u];
          vp = vpre[u];
        } else {
          const int64_t base = slot_base(p);
          kp = *reinterpret_cast<const P*>(k_cache + base);
          vp = *reinterpret_cast<const P*>(v_cache + base);
        }
      } else {
        const int64_t base = slot_base(p);
        kp = *reinterpret_cast<const P*>(k_cache + base);
        vp = *reinterpret_cast<const P*>(v_cache + base);
      }
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        kv[u][i] = ToFloat(kp.v[i]);
        vv[u][i] = ToFloat(vp.v[i]);
      }
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float sc[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < VEC; ++i) s += qv[g][i] * kv[u][i];
        sc[u] = s;
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) sc[u] = WarpSum(sc[u]);
      float m_new = m[g];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (p0 + u >= len) sc[u] = -FLT_MAX;
        m_new = fmaxf(m_new, sc[u]);
      }
      const float corr = __expf(m[g] - m_new);
      l[g] *= corr;
#pragma unroll
      for (int i = 0; i < VEC; ++i) acc[g][i] *= corr;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const float e = p0 + u < len ? __expf(sc[u] - m_new) : 0.f;
        l[g] += e;
#pragma unroll
        for (int i = 0; i < VEC; ++i) acc[g][i] += e * vv[u][i];
      }
      m[g] = m_new;
    }
  }

  // Merge the warps' partials.
  __shared__ float sm_m[kWarps][G];
  __shared__ float sm_l[kWarps][G];
  __shared__ float sm_acc[kWarps][G][D];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    if (lane == 0) {
      sm_m[warp][g] = m[g];
      sm_l[warp][g] = l[g];
    }
#pragma unroll
    for (int i = 0; i < VEC; ++i) sm_acc[warp][g][lane * VEC + i] = acc[g][i];
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < G * D; idx += blockDim.x) {
    const int g = idx / D;
    const int d = idx % D;
    float mx = -FLT_MAX;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, sm_m[w][g]);
    float num = 0.f, den = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float f = sm_l[w][g] > 0.f ? __expf(sm_m[w][g] - mx) : 0.f;
      num += f * sm_acc[w][g][d];
      den += f * sm_l[w][g];
    }
    const int64_t head = static_cast<int64_t>(b) * num_heads + kvh * G + g;
    if (splits == 1) {
      FromFloat(den > 0.f ? num / den : 0.f, out + head * D + d);
    } else {  // partial [head][split]: D accumulators, then max and sum
      float* pp = part + (head * splits + split) * (D + 2);
      pp[d] = num;
      if (d == 0) {
        pp[D] = den > 0.f ? mx : -FLT_MAX;
        pp[D + 1] = den;
      }
    }
  }
  // The in-kernel merge exists only in the split (PREFETCH) instantiations, so the kernels that
  // large batches run carry none of its registers.
  if constexpr (PREFETCH) {
    if (splits == 1 || counters == nullptr) return;
    // The last block of this (sequence, KV head) to arrive merges every split's partials (the
    // classic threadfence-reduction pattern: publish, fence, count; the last reader fences again
    // and reads through L2).
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    int32_t* counter = counters + static_cast<int64_t>(b) * num_kv_heads + kvh;
    if (threadIdx.x == 0) last = atomicAdd(counter, 1) == splits - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int idx = threadIdx.x; idx < G * D; idx += blockDim.x) {
      const int g = idx / D;
      const int d = idx % D;
      const int64_t head = static_cast<int64_t>(b) * num_heads + kvh * G + g;
      FromFloat(MergeSplitPartials<true>(part + head * splits * (D + 2), splits, d, D),
                out + head * D + d);
    }
    if (threadIdx.x == 0) *counter = 0;
  }
}

// Merges the splits' partials of one (sequence, head): one thread per element of the head.
template <typename T>
__global__ void CombineSplitsKernel(const float* __restrict__ part, T* __restrict__ out, int d,
                                    int splits) {
  slime::model::cuda::GridDependencyWait();
  slime::model::cuda::GridDependencyLaunch();
  const int64_t head = blockIdx.x;
  FromFloat(MergeSplitPartials<false>(part + head * splits * (d + 2), splits,
                                      static_cast<int>(threadIdx.x), d),
            out + head * d + threadIdx.x);
}

template <typename T, int VEC>
int LaunchVec(const PagedDecodeArgs& a, cudaStream_t stream) {
  // At most kMaxSplits (PagedDecodeSplits never asks for more; fewer shares fit the caller's
  // partials buffer too).
  const int splits =
      a.num_splits > 1 && a.partials != nullptr ? std::min(a.num_splits, kMaxSplits) : 1;
  static const bool merge_in_kernel = slime::model::cuda::DecodeFusionEnabled("attn_merge");
  // K/V prefetch before the grid dependency wait only for split (small) batches: a full grid
  // has no idle SMs for the early blocks to use.
  static const bool prefetch_enabled = slime::model::cuda::DecodeFusionEnabled("attn_prefetch");
  const bool prefetch = prefetch_enabled && splits > 1;
  // The in-kernel merge comes with the prefetch instantiations (see the kernel's tail).
  int32_t* counters = splits > 1 && merge_in_kernel && prefetch ? a.split_counters : nullptr;
  const dim3 grid(a.num_kv_heads, a.batch, splits);
  const dim3 block(kWarps * 32);
  const T* q = static_cast<const T*>(a.q);
  T* k = static_cast<T*>(const_cast<void*>(a.k_cache));
  T* v = static_cast<T*>(const_cast<void*>(a.v_cache));
  const RawQkvParams raw{a.q_norm, a.k_norm, a.norm_eps, a.cos, a.sin, a.write_slots};
  T* o = static_cast<T*>(a.out);
  const int64_t q_stride =
      a.q_row_stride > 0 ? a.q_row_stride : static_cast<int64_t>(a.num_heads) * a.head_dim;
#define SLIME_LAUNCH_RAW(G, RAW, PRE)                                                          \
  slime::model::cuda::LaunchKernel(PagedDecodeKernel<T, VEC, G, RAW, PRE>, grid, block, 0, stream, \
                                   q, k, v, o, a.page_table, a.seq_lens, q_stride, a.num_heads,    \
                                   a.num_kv_heads, a.page_size, a.max_pages, a.scale, a.partials,  \
                                   counters, raw)
#define SLIME_LAUNCH(G)                  \
  if (a.raw_qkv && prefetch) {           \
    SLIME_LAUNCH_RAW(G, true, true);     \
  } else if (a.raw_qkv) {                \
    SLIME_LAUNCH_RAW(G, true, false);    \
  } else if (prefetch) {                 \
    SLIME_LAUNCH_RAW(G, false, true);    \
  } else {                               \
    SLIME_LAUNCH_RAW(G, false, false);   \
  }
  switch (a.num_heads / a.num_kv_heads) {
    case 1:
      SLIME_LAUNCH(1);
      break;
    case 2:
      SLIME_LAUNCH(2);
      break;
    case 4:
      SLIME_LAUNCH(4);
      break;
    case 8:
      SLIME_LAUNCH(8);
      break;
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
#undef SLIME_LAUNCH
#undef SLIME_LAUNCH_RAW
  if (splits > 1 && counters == nullptr) {
    slime::model::cuda::LaunchKernel(CombineSplitsKernel<T>, dim3(a.batch * a.num_heads),
                                     dim3(a.head_dim), 0, stream, a.partials, o, a.head_dim,
                                     splits);
  }
  return static_cast<int>(cudaGetLastError());
}

template <typename T>
int Launch(const PagedDecodeArgs& a, cudaStream_t stream) {
  switch (a.head_dim) {
    case 32:
      return LaunchVec<T, 1>(a, stream);
    case 64:
      return LaunchVec<T, 2>(a, stream);
    case 128:
      return LaunchVec<T, 4>(a, stream);
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
}

}  // namespace

int PagedDecodeSplits(int batch, int num_kv_heads) {
  // Blocks aimed for (SLIME_DECODE_SPLIT_TARGET overrides, to measure other split counts).
  static const int target = [] {
    const char* env = std::getenv("SLIME_DECODE_SPLIT_TARGET");
    const int v = env != nullptr ? std::atoi(env) : 0;
    return v > 0 ? v : 256;
  }();
  const int blocks = batch * num_kv_heads;
  if (blocks >= 128) return 1;
  return std::max(1, std::min(kMaxSplits, (target + blocks - 1) / blocks));
}

bool PagedDecodeRawQkvEnabled(int64_t rows) {
  static const bool enabled = slime::model::cuda::DecodeFusionEnabled("attn_qkv");
  return enabled && rows <= kPagedDecodeRawQkvMaxRows;
}

bool PagedDecodeSupported(int head_dim, int num_heads, int num_kv_heads) {
  const bool dim_ok = head_dim == 32 || head_dim == 64 || head_dim == 128;
  const int group = num_kv_heads > 0 ? num_heads / num_kv_heads : 0;
  return dim_ok && num_kv_heads > 0 && num_heads % num_kv_heads == 0 &&
         (group == 1 || group == 2 || group == 4 || group == 8);
}

int LaunchPagedDecode(const PagedDecodeArgs& a, void* stream) {
  if (a.batch == 0) return 0;
  if (!PagedDecodeSupported(a.head_dim, a.num_heads, a.num_kv_heads)) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  if (a.raw_qkv && (a.cos == nullptr || a.sin == nullptr || a.write_slots == nullptr)) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (a.dtype) {
    case DType::kFloat32:
      return Launch<float>(a, s);
    case DType::kFloat16:
      return Launch<__half>(a, s);
    case DType::kBFloat16:
      return Launch<__nv_bfloat16>(a, s);
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

}  // namespace slime::engine::cuda
