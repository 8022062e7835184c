#include "slime/comm/accelerator.h"

#include <torch/torch.h>
#include <torch/version.h>

#ifdef SLIME_WITH_CUDA
#include <cuda_runtime_api.h>
#endif
#ifdef SLIME_WITH_NCCL
#include <nccl.h>
#endif
#ifdef USE_C10D_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif

namespace slime::comm {

AcceleratorInfo QueryAccelerators() {
  AcceleratorInfo info;
  info.torch_version = TORCH_VERSION;
#ifdef SLIME_WITH_CUDA
  info.cuda_compiled = true;
#endif
  info.cuda_available = torch::cuda::is_available();
  info.cuda_device_count = info.cuda_available ? static_cast<int>(torch::cuda::device_count()) : 0;
#if defined(SLIME_WITH_CUDA) && defined(CUDART_VERSION)
  info.cuda_version =
      std::to_string(CUDART_VERSION / 1000) + "." + std::to_string(CUDART_VERSION % 1000 / 10);
#endif
#ifdef SLIME_WITH_NCCL
  info.nccl_compiled = true;
  int v = 0;
  if (ncclGetVersion(&v) == ncclSuccess) {
    // NCCL >= 2.9 encodes MAJOR*10000 + MINOR*100 + PATCH.
    info.nccl_version = std::to_string(v / 10000) + "." + std::to_string(v % 10000 / 100) +
                        "." + std::to_string(v % 100);
  }
#endif
#ifdef USE_C10D_GLOO
  info.gloo_available = true;
#endif
  return info;
}

}  // namespace slime::comm
