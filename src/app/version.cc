#include "slime/app/version.h"

#include "fmt/format.h"
#include "slime/comm/accelerator.h"
#include "slime/common/build_info.h"

namespace slime::app {

std::string VersionReport() {
  comm::AcceleratorInfo acc = comm::QueryAccelerators();
  std::string cuda = "not compiled (CPU LibTorch)";
  if (acc.cuda_compiled) {
    cuda = fmt::format("compiled (CUDA {}), {}", acc.cuda_version,
                       acc.cuda_available ? fmt::format("{} device(s)", acc.cuda_device_count)
                                          : std::string("no device visible"));
  }
  std::string nccl = acc.nccl_compiled ? fmt::format("compiled (NCCL {})", acc.nccl_version)
                                       : std::string("not compiled");
  return fmt::format(
      "slime_train {} (git {}, {}, {})\ntorch: {}\ncuda: {}\nnccl: {}\ngloo: {}\n",
      SLIME_VERSION, SLIME_GIT_HASH, SLIME_BUILD_TYPE, SLIME_COMPILER, acc.torch_version, cuda,
      nccl, acc.gloo_available ? "available" : "not compiled");
}

}  // namespace slime::app
