// Test helper: where a test finds the repository and the real binary. ctest sets
// SLIME_SOURCE_DIR and SLIME_TRAIN_BIN; a test run by hand falls back to the paths compiled in
// by slime_add_test (SLIME_SOURCE_DIR_DEFAULT, SLIME_TRAIN_BIN_DEFAULT; cmake/SlimeModule.cmake).
#ifndef SLIME_TESTS_SUPPORT_TEST_PATHS_H_
#define SLIME_TESTS_SUPPORT_TEST_PATHS_H_

#include <cstdlib>
#include <string>

namespace slime::testing {

// The source tree: $SLIME_SOURCE_DIR when set and not empty, else SLIME_SOURCE_DIR_DEFAULT.
inline std::string SourceDir() {
  const char* env = std::getenv("SLIME_SOURCE_DIR");
  return env != nullptr && *env != '\0' ? env : SLIME_SOURCE_DIR_DEFAULT;
}

// The slime_train binary: $SLIME_TRAIN_BIN when set and not empty, else SLIME_TRAIN_BIN_DEFAULT.
inline std::string TrainBin() {
  const char* env = std::getenv("SLIME_TRAIN_BIN");
  return env != nullptr && *env != '\0' ? env : SLIME_TRAIN_BIN_DEFAULT;
}

}  // namespace slime::testing

#endif  // SLIME_TESTS_SUPPORT_TEST_PATHS_H_
