// SLIME_CHECK's failure path (see include/slime/common/check.h).
#include "slime/common/check.h"

#include <cstdio>
#include <cstdlib>

namespace slime::internal {

void CheckFailed(const char* file, int line, const char* condition, const std::string& message) {
  std::fprintf(stderr, "%s:%d: CHECK failed: %s: %s\n", file, line, condition, message.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace slime::internal
