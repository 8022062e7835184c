// Test helper: checks a Prometheus text exposition with the real `promtool check metrics`
// (Debian's prometheus package, extracted by scripts/fetch_tools.sh into .cache/tools/bin).
// Header-only; used by the metrics, engine and driver tests.
#ifndef SLIME_TESTS_SUPPORT_PROMTOOL_H_
#define SLIME_TESTS_SUPPORT_PROMTOOL_H_

#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "test_paths.h"

namespace slime::testing {

// The promtool binary: $SLIME_PROMTOOL, else SourceDir()/.cache/tools/bin/promtool.
inline std::string PromtoolPath() {
  if (const char* p = std::getenv("SLIME_PROMTOOL"); p != nullptr && *p != '\0') return p;
  return SourceDir() + "/.cache/tools/bin/promtool";
}

struct PromtoolResult {
  bool ran = false;    // promtool was found and executed
  int exit_code = -1;  // 0: the exposition passed every check
  std::string output;  // what promtool printed (problems, one per line)
};

// Runs `promtool check metrics` on `exposition`. Lint problems (e.g. a counter without the
// _total suffix) make promtool exit non-zero just like format errors do.
inline PromtoolResult PromtoolCheckMetrics(const std::string& exposition) {
  PromtoolResult r;
  const std::string tool = PromtoolPath();
  if (access(tool.c_str(), X_OK) != 0) {
    r.output = "promtool not found at " + tool + " (run scripts/fetch_tools.sh)";
    return r;
  }
  char path[] = "/tmp/slime_promtool_XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) {
    r.output = "mkstemp failed";
    return r;
  }
  close(fd);
  std::ofstream(path, std::ios::binary) << exposition;
  const std::string cmd = "'" + tool + "' check metrics < '" + path + "' 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) {
    unlink(path);
    r.output = "popen failed";
    return r;
  }
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
  const int status = pclose(pipe);
  unlink(path);
  r.ran = true;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace slime::testing

#endif  // SLIME_TESTS_SUPPORT_PROMTOOL_H_
