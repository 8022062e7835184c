// Status and StatusOr: the error currency across module and process boundaries.
//
// We use absl::Status / absl::StatusOr directly (docs/architecture.md, "Errors and logging").
// This header adds the two propagation macros every module uses. Thread-safety: stateless.
#ifndef SLIME_COMMON_STATUS_H_
#define SLIME_COMMON_STATUS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace slime {

using absl::Status;
using absl::StatusOr;

}  // namespace slime

#define SLIME_STATUS_CONCAT_INNER_(a, b) a##b
#define SLIME_STATUS_CONCAT_(a, b) SLIME_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (a Status) is not OK.
#define SLIME_RETURN_IF_ERROR(expr)                  \
  do {                                               \
    ::absl::Status _slime_status = (expr);           \
    if (!_slime_status.ok()) return _slime_status;   \
  } while (0)

// `lhs = value of expr` (a StatusOr<T>), or returns its error from the enclosing function.
#define SLIME_ASSIGN_OR_RETURN(lhs, expr)                                              \
  SLIME_ASSIGN_OR_RETURN_IMPL_(SLIME_STATUS_CONCAT_(_slime_statusor_, __LINE__), lhs, \
                               expr)
#define SLIME_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return std::move(tmp).status();     \
  lhs = std::move(tmp).value()

#endif  // SLIME_COMMON_STATUS_H_
