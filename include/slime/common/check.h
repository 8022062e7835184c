// SLIME_CHECK: abort on a broken invariant (a bug, never a user error — those are Status).
//
//   SLIME_CHECK(pages >= 2, "pool needs at least 2 pages, got {}", pages);
//
// Prints "file:line: CHECK failed: <condition>: <message>" to stderr and aborts; the message is
// formatted with fmt only when the check fails. Thread-safety: callable from any thread.
#ifndef SLIME_COMMON_CHECK_H_
#define SLIME_COMMON_CHECK_H_

#include <fmt/format.h>

#include <string>

namespace slime::internal {

[[noreturn]] void CheckFailed(const char* file, int line, const char* condition,
                              const std::string& message);

}  // namespace slime::internal

#define SLIME_CHECK(cond, ...)                                                          \
  do {                                                                                  \
    if (!(cond)) [[unlikely]]                                                           \
      ::slime::internal::CheckFailed(__FILE__, __LINE__, #cond, fmt::format(__VA_ARGS__)); \
  } while (0)

#endif  // SLIME_COMMON_CHECK_H_
