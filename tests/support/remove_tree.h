// Test helper: removes a directory tree with nftw(3). Used instead of std::filesystem::remove_all,
// which crashes in executables of the CUDA build (they bind std::filesystem to the copy that
// PyTorch's libtorch exports; see docs/operations.md, "Build on a GPU machine").
#ifndef SLIME_TESTS_SUPPORT_REMOVE_TREE_H_
#define SLIME_TESTS_SUPPORT_REMOVE_TREE_H_

#include <ftw.h>
#include <stdio.h>
#include <sys/stat.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace slime::testing {

// Removes `path` and everything below it; a missing path is fine. Returns false on an error.
inline bool RemoveTree(const std::string& path) {
  auto remove_one = [](const char* p, const struct stat*, int, struct FTW*) -> int {
    return ::remove(p) == 0 ? 0 : -1;
  };
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return true;
  return ::nftw(path.c_str(), remove_one, 16, FTW_DEPTH | FTW_PHYS) == 0;
}

// Removes `path` (as RemoveTree does) when the process exits normally. For per-process fixtures
// that outlive every test (ctest runs each test case as its own process, so a fixture written once
// per process and never removed piles up in the temp dir). Thread-safe.
inline void RemoveTreeAtExit(const std::string& path) {
  static std::mutex* mu = new std::mutex();
  static std::vector<std::string>* paths = [] {
    std::atexit([] {
      std::lock_guard<std::mutex> lock(*mu);
      for (const std::string& p : *paths) RemoveTree(p);
    });
    return new std::vector<std::string>();
  }();
  std::lock_guard<std::mutex> lock(*mu);
  paths->push_back(path);
}

}  // namespace slime::testing

#endif  // SLIME_TESTS_SUPPORT_REMOVE_TREE_H_
