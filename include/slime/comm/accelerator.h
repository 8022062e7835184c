// What the LibTorch this binary was built against can do: version, CUDA, NCCL, devices.
//
// The header is torch-free so the CLI (`slime_train --version`) and placement can ask without
// including LibTorch. Thread-safety: QueryAccelerators() may be called from any thread.
#ifndef SLIME_COMM_ACCELERATOR_H_
#define SLIME_COMM_ACCELERATOR_H_

#include <string>

namespace slime::comm {

struct AcceleratorInfo {
  std::string torch_version;     // e.g. "1.13.1" or "2.11.0"
  bool cuda_compiled = false;    // LibTorch was built with CUDA
  bool cuda_available = false;   // ... and a driver and at least one device are present
  int cuda_device_count = 0;
  std::string cuda_version;      // CUDA runtime LibTorch was built with, or ""
  bool nccl_compiled = false;    // our c10d NCCL path was compiled in
  std::string nccl_version;      // version of the NCCL library linked, or ""
  bool gloo_available = false;   // c10d Gloo backend (CPU collectives)
};

AcceleratorInfo QueryAccelerators();

}  // namespace slime::comm

#endif  // SLIME_COMM_ACCELERATOR_H_
