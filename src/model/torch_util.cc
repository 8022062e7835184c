#include "torch_util.h"

#include <fmt/ranges.h>

namespace slime::model::internal {

StatusOr<torch::ScalarType> ToTorchDType(SafetensorsDType dtype) {
  switch (dtype) {
    case SafetensorsDType::kBool:
      return torch::kBool;
    case SafetensorsDType::kU8:
      return torch::kByte;
    case SafetensorsDType::kI8:
      return torch::kChar;
    case SafetensorsDType::kI16:
      return torch::kShort;
    case SafetensorsDType::kI32:
      return torch::kInt;
    case SafetensorsDType::kI64:
      return torch::kLong;
    case SafetensorsDType::kF16:
      return torch::kHalf;
    case SafetensorsDType::kBF16:
      return torch::kBFloat16;
    case SafetensorsDType::kF32:
      return torch::kFloat;
    case SafetensorsDType::kF64:
      return torch::kDouble;
    default:
      break;
  }
  return absl::UnimplementedError(
      fmt::format("safetensors dtype {} cannot be loaded", SafetensorsDTypeName(dtype)));
}

StatusOr<SafetensorsDType> ToSafetensorsDType(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kBool:
      return SafetensorsDType::kBool;
    case torch::kByte:
      return SafetensorsDType::kU8;
    case torch::kChar:
      return SafetensorsDType::kI8;
    case torch::kShort:
      return SafetensorsDType::kI16;
    case torch::kInt:
      return SafetensorsDType::kI32;
    case torch::kLong:
      return SafetensorsDType::kI64;
    case torch::kHalf:
      return SafetensorsDType::kF16;
    case torch::kBFloat16:
      return SafetensorsDType::kBF16;
    case torch::kFloat:
      return SafetensorsDType::kF32;
    case torch::kDouble:
      return SafetensorsDType::kF64;
    default:
      break;
  }
  return absl::UnimplementedError(fmt::format("torch dtype {} cannot be written to safetensors",
                                              std::string(c10::toString(dtype))));
}

bool IsFloatingSafetensorsDType(SafetensorsDType dtype) {
  return dtype == SafetensorsDType::kF16 || dtype == SafetensorsDType::kBF16 ||
         dtype == SafetensorsDType::kF32 || dtype == SafetensorsDType::kF64;
}

std::string ShapeString(c10::IntArrayRef shape) {
  return fmt::format("[{}]", fmt::join(shape.begin(), shape.end(), ", "));
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

std::string TorchErrorMessage(const std::exception& e) {
  if (const auto* c10e = dynamic_cast<const c10::Error*>(&e)) {
    return c10e->what_without_backtrace();
  }
  std::string s = e.what();
  auto nl = s.find('\n');
  return nl == std::string::npos ? s : s.substr(0, nl);
}

}  // namespace slime::model::internal
