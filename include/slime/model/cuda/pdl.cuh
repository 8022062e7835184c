// Programmatic dependent launch (PDL, sm_90+) for the decode kernels: each kernel is launched so
// that it may start while the kernel before it on the stream is still finishing, does the work
// that needs no earlier result (streaming its weights) and then waits in GridDependencyWait()
// until every earlier kernel has completed and its writes are visible. At batch 1 a decode step
// is ~250 kernels of a few microseconds each, so hiding each launch and ramp-up is what counts.
//
// Contract for a kernel launched with LaunchKernel():
//   - before GridDependencyWait() it may only read memory no earlier kernel of the stream writes
//     (weights), and must not write global memory;
//   - it calls GridDependencyLaunch() once it no longer needs its SM slots to itself (we call it
//     right after the wait), letting the next kernel's blocks be scheduled.
// Without sm_90, or with SLIME_PDL=0 in the environment, launches are ordinary stream-ordered
// launches and both device calls are no-ops. Works under CUDA graph capture (CUDA >= 12.3).
//
// Published by slime_model_cuda (launch.h): the decoder's kernels (src/model/cuda) and the
// engine's (src/engine/cuda) both launch through it, so one switch covers every decode kernel.
#ifndef SLIME_MODEL_CUDA_PDL_CUH_
#define SLIME_MODEL_CUDA_PDL_CUH_

#include <cuda_runtime.h>

#include "slime/model/cuda/launch.h"  // ProgrammaticLaunchEnabled

namespace slime::model::cuda {

__device__ __forceinline__ void GridDependencyWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void GridDependencyLaunch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, stream>>>(args...), with the PDL attribute when enabled.
template <typename... Params, typename... Args>
cudaError_t LaunchKernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                         cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  if (ProgrammaticLaunchEnabled()) {
    config.attrs = attribute;
    config.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
}

}  // namespace slime::model::cuda

#endif  // SLIME_MODEL_CUDA_PDL_CUH_
