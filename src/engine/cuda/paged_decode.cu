// Paged decode attention kernel (see paged_decode.h).
#include "paged_decode.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cfloat>

namespace slime::engine::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kMaxGroup = 8;

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

// VEC = head_dim / 32 elements per lane.
template <typename T, int VEC>
__global__ void __launch_bounds__(kWarps * 32)
    PagedDecodeKernel(const T* __restrict__ q, const T* __restrict__ k_cache,
                      const T* __restrict__ v_cache, T* __restrict__ out,
                      const int32_t* __restrict__ page_table, const int32_t* __restrict__ seq_lens,
                      int num_heads, int num_kv_heads, int page_size, int max_pages, float scale) {
  constexpr int D = VEC * 32;
  const int kvh = blockIdx.x;
  const int b = blockIdx.y;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int group = num_heads / num_kv_heads;
  const int len = seq_lens[b];
  const int32_t* pages = page_table + static_cast<int64_t>(b) * max_pages;

  // This lane's slice of each query head of the group, pre-scaled.
  float qv[kMaxGroup][VEC];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g < group) {
      const T* qp = q + (static_cast<int64_t>(b) * num_heads + kvh * group + g) * D + lane * VEC;
#pragma unroll
      for (int i = 0; i < VEC; ++i) qv[g][i] = ToFloat(qp[i]) * scale;
    }
  }
  float m[kMaxGroup], l[kMaxGroup], acc[kMaxGroup][VEC];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    m[g] = -FLT_MAX;
    l[g] = 0.f;
#pragma unroll
    for (int i = 0; i < VEC; ++i) acc[g][i] = 0.f;
  }

  for (int p = warp; p < len; p += kWarps) {
    const int64_t slot = static_cast<int64_t>(pages[p / page_size]) * page_size + p % page_size;
    const int64_t base = (slot * num_kv_heads + kvh) * D + lane * VEC;
    float kv[VEC], vv[VEC];
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      kv[i] = ToFloat(k_cache[base + i]);
      vv[i] = ToFloat(v_cache[base + i]);
    }
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      if (g < group) {
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < VEC; ++i) s += qv[g][i] * kv[i];
        s = WarpSum(s);
        const float m_new = fmaxf(m[g], s);
        const float corr = __expf(m[g] - m_new);
        const float e = __expf(s - m_new);
        l[g] = l[g] * corr + e;
#pragma unroll
        for (int i = 0; i < VEC; ++i) acc[g][i] = acc[g][i] * corr + e * vv[i];
        m[g] = m_new;
      }
    }
  }

  // Merge the warps' partials: shared [warp][group] (m, l) and [warp][group][D] acc.
  __shared__ float sm_m[kWarps][kMaxGroup];
  __shared__ float sm_l[kWarps][kMaxGroup];
  extern __shared__ float sm_acc[];  // [kWarps][group][D]
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g < group) {
      if (lane == 0) {
        sm_m[warp][g] = m[g];
        sm_l[warp][g] = l[g];
      }
#pragma unroll
      for (int i = 0; i < VEC; ++i) sm_acc[(warp * group + g) * D + lane * VEC + i] = acc[g][i];
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < group * D; idx += blockDim.x) {
    const int g = idx / D;
    const int d = idx % D;
    float mx = -FLT_MAX;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, sm_m[w][g]);
    float num = 0.f, den = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float f = sm_m[w][g] == -FLT_MAX ? 0.f : __expf(sm_m[w][g] - mx);
      num += f * sm_acc[(w * group + g) * D + d];
      den += f * sm_l[w][g];
    }
    T* op = out + (static_cast<int64_t>(b) * num_heads + kvh * group + g) * D + d;
    FromFloat(den > 0.f ? num / den : 0.f, op);
  }
}

template <typename T>
int Launch(const PagedDecodeArgs& a, cudaStream_t stream) {
  const dim3 grid(a.num_kv_heads, a.batch);
  const dim3 block(kWarps * 32);
  const int group = a.num_heads / a.num_kv_heads;
  const size_t shared = sizeof(float) * kWarps * group * a.head_dim;
  const T* q = static_cast<const T*>(a.q);
  const T* k = static_cast<const T*>(a.k_cache);
  const T* v = static_cast<const T*>(a.v_cache);
  T* o = static_cast<T*>(a.out);
#define SLIME_LAUNCH(VEC)                                                                  \
  PagedDecodeKernel<T, VEC><<<grid, block, shared, stream>>>(                              \
      q, k, v, o, a.page_table, a.seq_lens, a.num_heads, a.num_kv_heads, a.page_size,      \
      a.max_pages, a.scale)
  switch (a.head_dim) {
    case 32:
      SLIME_LAUNCH(1);
      break;
    case 64:
      SLIME_LAUNCH(2);
      break;
    case 128:
      SLIME_LAUNCH(4);
      break;
    case 256:
      if (shared > 48 * 1024) {
        cudaFuncSetAttribute(PagedDecodeKernel<T, 8>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(shared));
      }
      SLIME_LAUNCH(8);
      break;
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
#undef SLIME_LAUNCH
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

bool PagedDecodeSupported(int head_dim, int num_heads, int num_kv_heads) {
  const bool dim_ok = head_dim == 32 || head_dim == 64 || head_dim == 128 || head_dim == 256;
  return dim_ok && num_kv_heads > 0 && num_heads % num_kv_heads == 0 &&
         num_heads / num_kv_heads <= kMaxGroup;
}

int LaunchPagedDecode(const PagedDecodeArgs& a, void* stream) {
  if (a.batch == 0) return 0;
  if (!PagedDecodeSupported(a.head_dim, a.num_heads, a.num_kv_heads)) {
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
