// Test helper: runs the real `slime_train` binary (TrainBin() of tests/support/test_paths.h:
// SLIME_TRAIN_BIN, set by ctest; the build's binary otherwise) and captures its exit code, stdout
// and stderr.
#ifndef SLIME_TESTS_APP_SLIME_BINARY_H_
#define SLIME_TESTS_APP_SLIME_BINARY_H_

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "test_paths.h"  // SourceDir(), TrainBin()

namespace slime::testing {

struct BinaryResult {
  int exit_code = -1;  // -1: did not run or did not exit normally
  std::string out, err;
};

// `slime_train <args>` (args are passed to the shell as they are).
inline BinaryResult RunSlimeTrain(const std::string& args) {
  static int counter = 0;
  const std::filesystem::path err =
      std::filesystem::temp_directory_path() /
      ("slime_bin_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + ".err");
  const std::string cmd = "'" + TrainBin() + "' " + args + " 2>'" + err.string() + "'";
  BinaryResult r;
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.out.append(buf.data(), n);
  const int status = ::pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream in(err);
  std::stringstream s;
  s << in.rdbuf();
  r.err = s.str();
  std::error_code ec;
  std::filesystem::remove(err, ec);
  return r;
}

}  // namespace slime::testing

#endif  // SLIME_TESTS_APP_SLIME_BINARY_H_
