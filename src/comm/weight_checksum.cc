// Per-tensor checksums of model weights (include/slime/comm/weight_checksum.h).
#include "slime/comm/weight_checksum.h"

#include <torch/torch.h>

#include "fmt/format.h"

namespace slime::comm {

uint64_t Fnv1a64(const void* data, size_t size, uint64_t state) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < size; ++i) {
    state ^= p[i];
    state *= 1099511628211ull;
  }
  return state;
}

StatusOr<std::string> TensorChecksum(const torch::Tensor& t, torch::ScalarType dtype) {
  try {
    torch::NoGradGuard no_grad;
    const torch::Tensor host = t.detach().to(torch::kCPU, dtype).contiguous();
    const uint64_t h =
        Fnv1a64(host.data_ptr(), static_cast<size_t>(host.numel()) * host.element_size());
    return fmt::format("fnv1a64:{:016x}", h);
  } catch (const c10::Error& e) {
    return absl::InternalError(
        fmt::format("weight checksum: {}", e.what_without_backtrace()));
  }
}

}  // namespace slime::comm
