// Fused inference kernels of the decoder (see fused_ops.h). Compiled without fast math so the
// float arithmetic matches LibTorch's kernels.
#include "fused_ops.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace slime::model::cuda {
namespace {

__device__ __forceinline__ float F(float x) { return x; }
__device__ __forceinline__ float F(__half x) { return __half2float(x); }
__device__ __forceinline__ float F(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T To(float v);
template <>
__device__ __forceinline__ float To<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half To<__half>(float v) { return __float2half(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 To<__nv_bfloat16>(float v) { return __float2bfloat16(v); }
// Round to T and back: the value an eager op would have stored.
template <typename T>
__device__ __forceinline__ float R(float v) { return F(To<T>(v)); }

constexpr int kNormThreads = 128;

template <typename T>
__global__ void RmsNormKernel(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
                              int n, float eps) {
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
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n) return;
  const float gv = F(g[idx]);
  const float s = gv / (1.0f + expf(-gv));
  y[idx] = To<T>(R<T>(s) * F(u[idx]));
}

template <template <typename> class Launcher, typename... Args>
int Dispatch(DType dtype, Args... args) {
  switch (dtype) {
    case DType::kFloat32:
      return Launcher<float>::Run(args...);
    case DType::kFloat16:
      return Launcher<__half>::Run(args...);
    case DType::kBFloat16:
      return Launcher<__nv_bfloat16>::Run(args...);
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

template <typename T>
struct RmsNormLauncher {
  static int Run(const void* x, const void* w, void* y, int64_t rows, int n, float eps,
                 cudaStream_t s) {
    if (rows == 0) return 0;
    RmsNormKernel<T><<<static_cast<unsigned>(rows), kNormThreads, 0, s>>>(
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
    RopeKernel<T><<<static_cast<unsigned>((total + threads - 1) / threads), threads, 0, s>>>(
        static_cast<const T*>(x), static_cast<const T*>(c), static_cast<const T*>(sn),
        static_cast<T*>(y), total, heads, d);
    return static_cast<int>(cudaGetLastError());
  }
};

template <typename T>
struct SiluMulLauncher {
  static int Run(const void* g, const void* u, void* y, int64_t n, cudaStream_t s) {
    if (n == 0) return 0;
    const int threads = 256;
    SiluMulKernel<T><<<static_cast<unsigned>((n + threads - 1) / threads), threads, 0, s>>>(
        static_cast<const T*>(g), static_cast<const T*>(u), static_cast<T*>(y), n);
    return static_cast<int>(cudaGetLastError());
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

}  // namespace slime::model::cuda
