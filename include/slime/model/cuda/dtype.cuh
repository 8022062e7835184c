// Device helpers of the CUDA kernels: float conversion of the three storage dtypes, rounding to a
// storage dtype, a 16-byte vector, and the host-side dispatch from DType to a kernel launcher
// template. Published by slime_model_cuda (launch.h) for its own kernels (fused_ops.cu,
// train_ops.cu) and the engine's (paged_decode.cu rounds as the decoder's q/k norm + RoPE does).
#ifndef SLIME_MODEL_CUDA_DTYPE_CUH_
#define SLIME_MODEL_CUDA_DTYPE_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "slime/model/cuda/launch.h"  // DType

namespace slime::model::cuda {

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

// 16 bytes of T, for vector loads and stores.
template <typename T>
struct alignas(16) Vec16 {
  T v[16 / sizeof(T)];
};

// Launcher<T>::Run(args...) for the storage type of `dtype`; returns a cudaError_t as int.
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

}  // namespace slime::model::cuda

#endif  // SLIME_MODEL_CUDA_DTYPE_CUH_
