// Test helper: a Python interpreter that imports torch, for the tests that meet real PyTorch
// peers (tests/comm/torch_peer.py). Tried in order: $SLIME_TORCH_PYTHON, `python3` on PATH, and
// /usr/bin/python3 (Debian's python3-torch lives there; a pyenv or venv python3 earlier on PATH
// may lack torch). Header-only, no LibTorch.
#ifndef SLIME_TESTS_SUPPORT_TORCH_PYTHON_H_
#define SLIME_TESTS_SUPPORT_TORCH_PYTHON_H_

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace slime::testing {

struct TorchPython {
  std::string path;     // absolute path of the interpreter; empty when none imports torch
  std::string version;  // torch.__version__
  std::string tried;    // what was tried, for the skip message
};

namespace internal {
// stdout of `cmd` (stderr discarded); nullopt-like: ok=false when it did not exit 0.
inline bool RunForOutput(const std::string& cmd, std::string* out) {
  out->clear();
  FILE* p = ::popen((cmd + " 2>/dev/null").c_str(), "r");
  if (p == nullptr) return false;
  std::array<char, 512> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out->append(buf.data(), n);
  const int status = ::pclose(p);
  while (!out->empty() && (out->back() == '\n' || out->back() == '\r')) out->pop_back();
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}
}  // namespace internal

// The first candidate that runs `import torch` (cached per process).
inline const TorchPython& FindTorchPython() {
  static const TorchPython found = [] {
    TorchPython r;
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("SLIME_TORCH_PYTHON"); env != nullptr && *env != '\0') {
      candidates.push_back(env);
    }
    candidates.push_back("python3");
    candidates.push_back("/usr/bin/python3");
    for (const std::string& c : candidates) {
      std::string path, version;
      if (!internal::RunForOutput("command -v '" + c + "'", &path) || path.empty()) {
        r.tried += (r.tried.empty() ? "" : ", ") + c + " (not found)";
        continue;
      }
      if (!internal::RunForOutput(
              "'" + path + "' -c 'import torch, torch.distributed as d; assert d.is_available(); "
                           "print(torch.__version__)'",
              &version)) {
        r.tried += (r.tried.empty() ? "" : ", ") + path + " (no torch.distributed)";
        continue;
      }
      r.path = path;
      r.version = version;
      break;
    }
    return r;
  }();
  return found;
}

}  // namespace slime::testing

#endif  // SLIME_TESTS_SUPPORT_TORCH_PYTHON_H_
