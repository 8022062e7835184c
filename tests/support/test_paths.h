// Test helper: where a test finds the repository, the real binary and the fetched test data.
// ctest sets SLIME_SOURCE_DIR and SLIME_TRAIN_BIN; a test run by hand falls back to the
// configure-time paths of the slime_test_paths library (test_paths.cc, linked into every test by
// slime_add_test), kept out of the tests' own compile flags so that ccache serves every checkout.
#ifndef SLIME_TESTS_SUPPORT_TEST_PATHS_H_
#define SLIME_TESTS_SUPPORT_TEST_PATHS_H_

#include <cstdlib>
#include <filesystem>
#include <string>

namespace slime::testing {

// The configure-time source tree and slime_train path (test_paths.cc).
const char* SourceDirDefault();
const char* TrainBinDefault();

// The source tree: $SLIME_SOURCE_DIR when set and not empty, else SourceDirDefault().
inline std::string SourceDir() {
  const char* env = std::getenv("SLIME_SOURCE_DIR");
  return env != nullptr && *env != '\0' ? env : SourceDirDefault();
}

// The slime_train binary: $SLIME_TRAIN_BIN when set and not empty, else TrainBinDefault().
inline std::string TrainBin() {
  const char* env = std::getenv("SLIME_TRAIN_BIN");
  return env != nullptr && *env != '\0' ? env : TrainBinDefault();
}

// The fetched test data (scripts/fetch_test_data.sh): $SLIME_TEST_DATA when set and not empty,
// else SourceDir()/.cache/testdata.
inline std::filesystem::path TestDataDir() {
  const char* env = std::getenv("SLIME_TEST_DATA");
  return env != nullptr && *env != '\0' ? std::filesystem::path(env)
                                          : std::filesystem::path(SourceDir()) / ".cache/testdata";
}

}  // namespace slime::testing

#endif  // SLIME_TESTS_SUPPORT_TEST_PATHS_H_
