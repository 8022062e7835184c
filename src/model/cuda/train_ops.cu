// Fused training kernels (see train_ops.h). Compiled without fast math so the float arithmetic
// matches LibTorch's kernels up to reduction order.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "slime/model/cuda/dtype.cuh"
#include "train_ops.h"

namespace slime::model::cuda {
namespace {

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

// ---- training forward kernels with 16-byte loads.
// RMSNorm: one warp per row, two passes over the row (the second from cache).
template <typename T>
__global__ void __launch_bounds__(256)
    RmsNormForwardKernel(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
                         int64_t rows, int n, float eps) {
  constexpr int V = 16 / sizeof(T);
  const int64_t row = static_cast<int64_t>(blockIdx.x) * 8 + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const Vec16<T>* xr = reinterpret_cast<const Vec16<T>*>(x + row * n);
  const Vec16<T>* wr = reinterpret_cast<const Vec16<T>*>(w);
  Vec16<T>* yr = reinterpret_cast<Vec16<T>*>(y + row * n);
  const int vecs = n / V;
  float ss = 0.f;
  for (int i = lane; i < vecs; i += 32) {
    const Vec16<T> xv = xr[i];
#pragma unroll
    for (int j = 0; j < V; ++j) ss += F(xv.v[j]) * F(xv.v[j]);
  }
  ss = WarpSum(ss);
  const float r = rsqrtf(ss / static_cast<float>(n) + eps);
  for (int i = lane; i < vecs; i += 32) {
    const Vec16<T> xv = xr[i];
    const Vec16<T> wv = wr[i];
    Vec16<T> out;
#pragma unroll
    for (int j = 0; j < V; ++j) out.v[j] = To<T>(F(wv.v[j]) * R<T>(F(xv.v[j]) * r));
    yr[i] = out;
  }
}

// RoPE: each thread rotates V pairs (element i of the first half with i + d/2).
template <typename T>
__global__ void RopeForwardKernel(const T* __restrict__ x, const T* __restrict__ cos_t,
                                  const T* __restrict__ sin_t, T* __restrict__ y, int64_t total,
                                  int heads, int d) {
  constexpr int V = 16 / sizeof(T);
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int half = d / 2;
  const int per_head = half / V;
  const int64_t head_row = idx / per_head;  // token * heads + head
  const int j = static_cast<int>(idx % per_head) * V;
  const int64_t t = head_row / heads;
  const T* xh = x + head_row * d;
  T* yh = y + head_row * d;
  const Vec16<T> x1 = *reinterpret_cast<const Vec16<T>*>(xh + j);
  const Vec16<T> x2 = *reinterpret_cast<const Vec16<T>*>(xh + half + j);
  const Vec16<T> c1 = *reinterpret_cast<const Vec16<T>*>(cos_t + t * d + j);
  const Vec16<T> c2 = *reinterpret_cast<const Vec16<T>*>(cos_t + t * d + half + j);
  const Vec16<T> s1 = *reinterpret_cast<const Vec16<T>*>(sin_t + t * d + j);
  const Vec16<T> s2 = *reinterpret_cast<const Vec16<T>*>(sin_t + t * d + half + j);
  Vec16<T> y1, y2;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const float a = F(x1.v[k]), b = F(x2.v[k]);
    y1.v[k] = To<T>(R<T>(a * F(c1.v[k])) + R<T>(-b * F(s1.v[k])));
    y2.v[k] = To<T>(R<T>(b * F(c2.v[k])) + R<T>(a * F(s2.v[k])));
  }
  *reinterpret_cast<Vec16<T>*>(yh + j) = y1;
  *reinterpret_cast<Vec16<T>*>(yh + half + j) = y2;
}

template <typename T>
__global__ void SiluMulForwardKernel(const T* __restrict__ g, const T* __restrict__ u,
                                     T* __restrict__ y, int64_t vecs) {
  constexpr int V = 16 / sizeof(T);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < vecs;
       i += stride) {
    const Vec16<T> gv = reinterpret_cast<const Vec16<T>*>(g)[i];
    const Vec16<T> uv = reinterpret_cast<const Vec16<T>*>(u)[i];
    Vec16<T> out;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float a = F(gv.v[j]);
      out.v[j] = To<T>(R<T>(a / (1.0f + expf(-a))) * F(uv.v[j]));
    }
    reinterpret_cast<Vec16<T>*>(y)[i] = out;
  }
}

// ---- optimizer
template <typename T>
__global__ void SquaredNormKernel(const T* __restrict__ g, int64_t n, float* __restrict__ accum) {
  float s = 0.f;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const float v = F(g[i]);
    s += v * v;
  }
  s = WarpSum(s);
  __shared__ float parts[8];
  if (threadIdx.x % 32 == 0) parts[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.f;
    for (int k = 0; k < static_cast<int>(blockDim.x / 32); ++k) total += parts[k];
    atomicAdd(accum, total);
  }
}

template <typename T>
__global__ void AdamWKernel(T* __restrict__ param, const T* __restrict__ grad,
                            float* __restrict__ master, float* __restrict__ m,
                            float* __restrict__ v, int64_t n, float grad_scale, float decay,
                            float b1, float b2, float c1, float c2, float step_size,
                            float bc2_sqrt, float eps) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    float target = master != nullptr ? master[i] : F(param[i]);
    target *= decay;
    float mi = m[i] * b1, vi = v[i] * b2;
    if (grad != nullptr) {
      const float g = F(grad[i]) * grad_scale;
      mi += c1 * g;
      vi += c2 * g * g;
    }
    m[i] = mi;
    v[i] = vi;
    target += -step_size * (mi / (sqrtf(vi) / bc2_sqrt + eps));
    if (master != nullptr) {
      master[i] = target;
      param[i] = To<T>(target);
    } else {
      param[i] = To<T>(target);
    }
  }
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

template <typename T>
struct RmsNormForwardLauncher {
  static int Run(const void* x, const void* w, void* y, int64_t rows, int n, float eps,
                 cudaStream_t s) {
    constexpr int V = 16 / sizeof(T);
    if (n % V != 0) return static_cast<int>(cudaErrorInvalidValue);
    if (rows == 0) return 0;
    const int64_t blocks = (rows + 7) / 8;
    RmsNormForwardKernel<T><<<static_cast<unsigned>(blocks), 256, 0, s>>>(
        static_cast<const T*>(x), static_cast<const T*>(w), static_cast<T*>(y), rows, n, eps);
    return static_cast<int>(cudaGetLastError());
  }
};

template <typename T>
struct RopeForwardLauncher {
  static int Run(const void* x, const void* c, const void* sn, void* y, int64_t tokens, int heads,
                 int d, cudaStream_t s) {
    constexpr int V = 16 / sizeof(T);
    if (d % 2 != 0 || (d / 2) % V != 0) return static_cast<int>(cudaErrorInvalidValue);
    const int64_t total = tokens * heads * (d / 2 / V);
    if (total == 0) return 0;
    RopeForwardKernel<T><<<static_cast<unsigned>((total + 255) / 256), 256, 0, s>>>(
        static_cast<const T*>(x), static_cast<const T*>(c), static_cast<const T*>(sn),
        static_cast<T*>(y), total, heads, d);
    return static_cast<int>(cudaGetLastError());
  }
};

template <typename T>
struct SiluMulForwardLauncher {
  static int Run(const void* g, const void* u, void* y, int64_t n, cudaStream_t s) {
    constexpr int V = 16 / sizeof(T);
    if (n % V != 0) return static_cast<int>(cudaErrorInvalidValue);
    const int64_t vecs = n / V;
    if (vecs == 0) return 0;
    const int blocks =
        static_cast<int>(std::min<int64_t>((vecs + 255) / 256, MultiprocessorCount() * 16));
    SiluMulForwardKernel<T><<<blocks, 256, 0, s>>>(static_cast<const T*>(g),
                                                   static_cast<const T*>(u), static_cast<T*>(y),
                                                   vecs);
    return static_cast<int>(cudaGetLastError());
  }
};

template <typename T>
struct SquaredNormLauncher {
  static int Run(const void* g, int64_t n, float* accum, cudaStream_t s) {
    if (n == 0) return 0;
    const int blocks =
        static_cast<int>(std::min<int64_t>((n + 255) / 256, MultiprocessorCount() * 8));
    SquaredNormKernel<T><<<blocks, 256, 0, s>>>(static_cast<const T*>(g), n, accum);
    return static_cast<int>(cudaGetLastError());
  }
};

template <typename T>
struct AdamWLauncher {
  static int Run(const AdamWArgs& a, cudaStream_t s) {
    if (a.n == 0) return 0;
    if (a.master == nullptr && !std::is_same<T, float>::value) {
      return static_cast<int>(cudaErrorInvalidValue);  // a non-float32 parameter needs a master
    }
    const int blocks =
        static_cast<int>(std::min<int64_t>((a.n + 255) / 256, MultiprocessorCount() * 8));
    AdamWKernel<T><<<blocks, 256, 0, s>>>(static_cast<T*>(a.param), static_cast<const T*>(a.grad),
                                          a.master, a.exp_avg, a.exp_avg_sq, a.n, a.grad_scale,
                                          a.decay_factor, a.beta1, a.beta2, a.one_minus_beta1,
                                          a.one_minus_beta2, a.step_size,
                                          a.bc2_sqrt, a.eps);
    return static_cast<int>(cudaGetLastError());
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

namespace slime::model::cuda {

int LaunchRmsNormForward(const void* x, const void* w, void* y, int64_t rows, int n, float eps,
                         DType dtype, void* stream) {
  return Dispatch<RmsNormForwardLauncher>(dtype, x, w, y, rows, n, eps,
                                          static_cast<cudaStream_t>(stream));
}

int LaunchRopeForward(const void* x, const void* c, const void* s, void* y, int64_t tokens,
                      int heads, int d, DType dtype, void* stream) {
  return Dispatch<RopeForwardLauncher>(dtype, x, c, s, y, tokens, heads, d,
                                       static_cast<cudaStream_t>(stream));
}

int LaunchSiluMulForward(const void* g, const void* u, void* y, int64_t n, DType dtype,
                         void* stream) {
  return Dispatch<SiluMulForwardLauncher>(dtype, g, u, y, n, static_cast<cudaStream_t>(stream));
}

int LaunchAddSquaredNorm(const void* grad, int64_t n, float* accum, DType dtype, void* stream) {
  return Dispatch<SquaredNormLauncher>(dtype, grad, n, accum, static_cast<cudaStream_t>(stream));
}

int LaunchAdamW(const AdamWArgs& args, void* stream) {
  return Dispatch<AdamWLauncher>(args.dtype, args, static_cast<cudaStream_t>(stream));
}

}  // namespace slime::model::cuda
