// Private LibTorch helpers of the model module: dtype mapping, shape strings, and the guard that
// turns LibTorch exceptions into Status at the module edge. Thread-safety: pure functions.
#ifndef SLIME_SRC_MODEL_TORCH_UTIL_H_
#define SLIME_SRC_MODEL_TORCH_UTIL_H_

#include <fmt/format.h>
#include <torch/torch.h>

#include <exception>
#include <string>
#include <type_traits>
#include <vector>

#include "slime/common/status.h"
#include "slime/model/safetensors.h"

namespace slime::model::internal {

// Torch dtype of a safetensors dtype; F8 and unsigned > 8 bit have no LibTorch 1.13 equivalent.
StatusOr<torch::ScalarType> ToTorchDType(SafetensorsDType dtype);
StatusOr<SafetensorsDType> ToSafetensorsDType(torch::ScalarType dtype);
bool IsFloatingSafetensorsDType(SafetensorsDType dtype);

std::string ShapeString(c10::IntArrayRef shape);
std::string ShapeString(const std::vector<int64_t>& shape);

// First line of a LibTorch error (its full text carries a C++ backtrace).
std::string TorchErrorMessage(const std::exception& e);

// Runs `fn` (returning StatusOr<T> or Status) and converts any exception into an InternalError
// prefixed with `context`.
template <typename Fn>
auto GuardTorch(const std::string& context, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const c10::Error& e) {
    return absl::InternalError(fmt::format("{}: {}", context, TorchErrorMessage(e)));
  } catch (const std::exception& e) {
    return absl::InternalError(fmt::format("{}: {}", context, std::string(e.what())));
  }
}

}  // namespace slime::model::internal

#endif  // SLIME_SRC_MODEL_TORCH_UTIL_H_
