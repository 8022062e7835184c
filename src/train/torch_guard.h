// Private to src/train: the guard that turns LibTorch (or any standard) exceptions into Status
// at the module's edge (docs/architecture.md, "Errors and logging"), shared by every source. Not
// installed; include only from src/train/. Thread-safety: pure functions.
#ifndef SLIME_SRC_TRAIN_TORCH_GUARD_H_
#define SLIME_SRC_TRAIN_TORCH_GUARD_H_

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <exception>
#include <string>
#include <string_view>

#include "slime/common/status.h"

namespace slime::train::internal {

// The first line of `text` (a LibTorch message continues with a C++ backtrace).
inline std::string FirstLine(std::string_view text) {
  return std::string(text.substr(0, text.find('\n')));
}

// Runs `fn` (returning Status or StatusOr<T>) and returns any exception it throws as an
// InternalError "<context>: <first line of the message>".
template <typename Fn>
auto GuardTorch(std::string_view context, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const c10::Error& e) {
    return absl::InternalError(
        fmt::format("{}: {}", context, FirstLine(e.what_without_backtrace())));
  } catch (const std::exception& e) {
    return absl::InternalError(fmt::format("{}: {}", context, FirstLine(e.what())));
  }
}

}  // namespace slime::train::internal

#endif  // SLIME_SRC_TRAIN_TORCH_GUARD_H_
