// Fused training kernels (see train_ops.h). Compiled without fast math so the float arithmetic
// matches LibTorch's kernels up to reduction order.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "train_ops.h"

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
template <typename T>
__device__ __forceinline__ float R(float v) { return F(To<T>(v)); }

template <typename T>
struct alignas(16) Vec16 {
  T v[16 / sizeof(T)];
};

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

int MultiprocessorCount() {
  static const int count = [] {
    int device = 0, n = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      return 132;
    }
    return n;
  }();
  return count;
}

// ---- RMSNorm backward: one warp per row; dw accumulated in shared memory per block, then once
// per block into the float32 accumulator.
constexpr int kNormBwdWarps = 8;

template <typename T>
__global__ void __launch_bounds__(kNormBwdWarps * 32)
    RmsNormBackwardKernel(const T* __restrict__ x, const T* __restrict__ w,
                          const T* __restrict__ dy, T* __restrict__ dx, float* __restrict__ dw,
                          int64_t rows, int n, float eps) {
  extern __shared__ float sdw[];
  for (int i = threadIdx.x; i < n; i += blockDim.x) sdw[i] = 0.f;
  __syncthreads();
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kNormBwdWarps;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kNormBwdWarps + warp; row < rows;
       row += stride) {
    const T* xr = x + row * n;
    const T* dr = dy + row * n;
    T* out = dx + row * n;
    float ss = 0.f, dot = 0.f;
    for (int i = lane; i < n; i += 32) {
      const float xv = F(xr[i]);
      ss += xv * xv;
      dot += F(dr[i]) * F(w[i]) * xv;
    }
    ss = WarpSum(ss);
    dot = WarpSum(dot);
    const float r = rsqrtf(ss / static_cast<float>(n) + eps);
    const float c = r * dot / static_cast<float>(n);  // mean(g · xhat)
    for (int i = lane; i < n; i += 32) {
      const float dyv = F(dr[i]);
      const float xh = F(xr[i]) * r;
      out[i] = To<T>(r * (dyv * F(w[i]) - xh * c));
      atomicAdd(&sdw[i], dyv * R<T>(xh));
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) atomicAdd(&dw[i], sdw[i]);
}

template <typename T>
__global__ void SiluMulBackwardKernel(const T* __restrict__ g, const T* __restrict__ u,
                                      const T* __restrict__ dy, T* __restrict__ dg,
                                      T* __restrict__ du, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const float gv = F(g[i]);
    const float dyv = F(dy[i]);
    const float s = 1.0f / (1.0f + expf(-gv));
    du[i] = To<T>(dyv * R<T>(gv * s));
    dg[i] = To<T>(dyv * F(u[i]) * s * (1.0f + gv * (1.0f - s)));
  }
}

// ---- one-pass log-softmax statistics. Online state over z: m = running max,
// a = Σ exp(z - m), b = Σ exp(z - m)(z - m) (relative to the running max, so no cancellation).
struct Online {
  float m, a, b;
};

__device__ __forceinline__ void Push(Online& o, float z) {
  if (o.a == 0.f) {
    o = {z, 1.f, 0.f};
  } else if (z > o.m) {
    const float d = o.m - z;  // < 0
    const float sc = expf(d);
    o.b = (o.b + o.a * d) * sc;
    o.a = o.a * sc + 1.f;
    o.m = z;
  } else {
    const float d = z - o.m;
    const float e = expf(d);
    o.a += e;
    o.b += e * d;
  }
}

__device__ __forceinline__ Online Merge(const Online& x, const Online& y) {
  if (x.a == 0.f) return y;
  if (y.a == 0.f) return x;
  const float m = fmaxf(x.m, y.m);
  const float dx = x.m - m, dy = y.m - m;
  const float sx = expf(dx), sy = expf(dy);
  return {m, x.a * sx + y.a * sy, (x.b + x.a * dx) * sx + (y.b + y.a * dy) * sy};
}

constexpr int kStatsThreads = 512;

template <typename T>
__global__ void __launch_bounds__(kStatsThreads)
    LogSoftmaxStatsKernel(const T* __restrict__ logits, const int64_t* __restrict__ targets,
                          int64_t v, float inv_t, float* __restrict__ log_probs,
                          float* __restrict__ entropy, float* __restrict__ row_max,
                          float* __restrict__ log_sum, float* __restrict__ mean_shifted) {
  constexpr int V = 16 / sizeof(T);
  const int64_t row = blockIdx.x;
  const T* lr = logits + row * v;
  Online o = {0.f, 0.f, 0.f};
  if (v % V == 0 && reinterpret_cast<uintptr_t>(lr) % 16 == 0) {
    const int64_t vecs = v / V;
    for (int64_t i = threadIdx.x; i < vecs; i += kStatsThreads) {
      const Vec16<T> x = reinterpret_cast<const Vec16<T>*>(lr)[i];
#pragma unroll
      for (int j = 0; j < V; ++j) Push(o, F(x.v[j]) * inv_t);
    }
  } else {
    for (int64_t i = threadIdx.x; i < v; i += kStatsThreads) Push(o, F(lr[i]) * inv_t);
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    Online other = {__shfl_xor_sync(0xffffffffu, o.m, off), __shfl_xor_sync(0xffffffffu, o.a, off),
                    __shfl_xor_sync(0xffffffffu, o.b, off)};
    o = Merge(o, other);
  }
  __shared__ Online parts[kStatsThreads / 32];
  if (threadIdx.x % 32 == 0) parts[threadIdx.x / 32] = o;
  __syncthreads();
  if (threadIdx.x != 0) return;
  Online total = parts[0];
  for (int k = 1; k < kStatsThreads / 32; ++k) total = Merge(total, parts[k]);
  const float ls = logf(total.a);
  const float ms = total.b / total.a;  // E_p[z - m]
  const float zt = F(lr[targets[row]]) * inv_t;
  log_probs[row] = zt - total.m - ls;
  if (entropy != nullptr) entropy[row] = ls - ms;
  row_max[row] = total.m;
  log_sum[row] = ls;
  mean_shifted[row] = ms;
}

constexpr int kGradThreads = 256;

__device__ __forceinline__ float GradAt(float l, int64_t col, int64_t target, float inv_t, float m,
                                        float ls, float ms, float glp, float gent) {
  const float zs = l * inv_t - m;
  const float p = expf(zs - ls);
  float g = p * (gent * (ms - zs) - glp);
  if (col == target) g += glp;
  return g * inv_t;
}

// grid (ceil(v / (threads · V)), rows): each thread rewrites V consecutive logits of one row.
template <typename T>
__global__ void __launch_bounds__(kGradThreads)
    LogSoftmaxGradKernel(T* __restrict__ logits, const int64_t* __restrict__ targets, int64_t v,
                         float inv_t, const float* __restrict__ row_max,
                         const float* __restrict__ log_sum, const float* __restrict__ mean_shifted,
                         const float* __restrict__ g_lp, const float* __restrict__ g_ent,
                         bool vectorized) {
  constexpr int V = 16 / sizeof(T);
  const int64_t row = blockIdx.y;
  T* lr = logits + row * v;
  const float m = row_max[row], ls = log_sum[row], ms = mean_shifted[row];
  const float glp = g_lp != nullptr ? g_lp[row] : 0.f;
  const float gent = g_ent != nullptr ? g_ent[row] : 0.f;
  const int64_t target = targets[row];
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * kGradThreads + threadIdx.x) * V;
  if (first >= v) return;
  if (vectorized) {
    Vec16<T> x = *reinterpret_cast<Vec16<T>*>(lr + first);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      x.v[j] = To<T>(GradAt(F(x.v[j]), first + j, target, inv_t, m, ls, ms, glp, gent));
    }
    *reinterpret_cast<Vec16<T>*>(lr + first) = x;
  } else {
    for (int64_t c = first; c < first + V && c < v; ++c) {
      lr[c] = To<T>(GradAt(F(lr[c]), c, target, inv_t, m, ls, ms, glp, gent));
    }
  }
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
struct RmsNormBackwardLauncher {
  static int Run(const void* x, const void* w, const void* dy, void* dx, float* dw, int64_t rows,
                 int n, float eps, cudaStream_t s) {
    if (rows == 0) return 0;
    const size_t smem = static_cast<size_t>(n) * sizeof(float);
    if (smem > 48 * 1024) return static_cast<int>(cudaErrorInvalidValue);
    const int64_t want = (rows + kNormBwdWarps - 1) / kNormBwdWarps;
    const int blocks = static_cast<int>(std::min<int64_t>(want, MultiprocessorCount() * 4));
    RmsNormBackwardKernel<T><<<blocks, kNormBwdWarps * 32, smem, s>>>(
        static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(dy),
        static_cast<T*>(dx), dw, rows, n, eps);
    return static_cast<int>(cudaGetLastError());
  }
};

template <typename T>
struct SiluMulBackwardLauncher {
  static int Run(const void* g, const void* u, const void* dy, void* dg, void* du, int64_t n,
                 cudaStream_t s) {
    if (n == 0) return 0;
    const int64_t want = (n + 255) / 256;
    const int blocks = static_cast<int>(std::min<int64_t>(want, MultiprocessorCount() * 16));
    SiluMulBackwardKernel<T><<<blocks, 256, 0, s>>>(
        static_cast<const T*>(g), static_cast<const T*>(u), static_cast<const T*>(dy),
        static_cast<T*>(dg), static_cast<T*>(du), n);
    return static_cast<int>(cudaGetLastError());
  }
};

template <typename T>
struct LogSoftmaxStatsLauncher {
  static int Run(const LogSoftmaxStatsArgs& a, cudaStream_t s) {
    if (a.rows == 0) return 0;
    if (a.rows > 0x7fffffff || a.v < 1) return static_cast<int>(cudaErrorInvalidValue);
    LogSoftmaxStatsKernel<T><<<static_cast<unsigned>(a.rows), kStatsThreads, 0, s>>>(
        static_cast<const T*>(a.logits), a.targets, a.v, a.inv_temperature, a.log_probs,
        a.entropy, a.row_max, a.log_sum, a.mean_shifted);
    return static_cast<int>(cudaGetLastError());
  }
};

template <typename T>
struct LogSoftmaxGradLauncher {
  static int Run(const LogSoftmaxGradArgs& a, cudaStream_t s) {
    if (a.rows == 0) return 0;
    if (a.v < 1) return static_cast<int>(cudaErrorInvalidValue);
    constexpr int V = 16 / sizeof(T);
    const bool vectorized = a.v % V == 0 && reinterpret_cast<uintptr_t>(a.logits) % 16 == 0;
    const int64_t per_block = static_cast<int64_t>(kGradThreads) * V;
    constexpr int64_t kMaxRows = 65535;  // gridDim.y
    for (int64_t r0 = 0; r0 < a.rows; r0 += kMaxRows) {
      const int64_t n = std::min(kMaxRows, a.rows - r0);
      const dim3 grid(static_cast<unsigned>((a.v + per_block - 1) / per_block),
                      static_cast<unsigned>(n));
      LogSoftmaxGradKernel<T><<<grid, kGradThreads, 0, s>>>(
          static_cast<T*>(a.logits) + r0 * a.v, a.targets + r0, a.v, a.inv_temperature,
          a.row_max + r0, a.log_sum + r0, a.mean_shifted + r0,
          a.g_lp != nullptr ? a.g_lp + r0 : nullptr, a.g_ent != nullptr ? a.g_ent + r0 : nullptr,
          vectorized);
      const cudaError_t err = cudaGetLastError();
      if (err != cudaSuccess) return static_cast<int>(err);
    }
    return 0;
  }
};

}  // namespace

int LaunchRmsNormBackward(const void* x, const void* w, const void* dy, void* dx, float* dw_accum,
                          int64_t rows, int n, float eps, DType dtype, void* stream) {
  return Dispatch<RmsNormBackwardLauncher>(dtype, x, w, dy, dx, dw_accum, rows, n, eps,
                                           static_cast<cudaStream_t>(stream));
}

int LaunchSiluMulBackward(const void* g, const void* u, const void* dy, void* dg, void* du,
                          int64_t n, DType dtype, void* stream) {
  return Dispatch<SiluMulBackwardLauncher>(dtype, g, u, dy, dg, du, n,
                                           static_cast<cudaStream_t>(stream));
}

int LaunchLogSoftmaxStats(const LogSoftmaxStatsArgs& args, void* stream) {
  return Dispatch<LogSoftmaxStatsLauncher>(args.dtype, args, static_cast<cudaStream_t>(stream));
}

int LaunchLogSoftmaxGrad(const LogSoftmaxGradArgs& args, void* stream) {
  return Dispatch<LogSoftmaxGradLauncher>(args.dtype, args, static_cast<cudaStream_t>(stream));
}

}  // namespace slime::model::cuda
