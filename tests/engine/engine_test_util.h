// Shared helpers of the engine tests that need a model directory (engine_gpu_test.cc,
// engine_tp_test.cc): the fetched Qwen3 test tokenizer and a random-weight model directory
// written once per test process. Header-only; include from tests/engine/ only (targets that
// link slime::model). Compiles in the CPU build and the CUDA build alike.
#ifndef SLIME_TESTS_ENGINE_ENGINE_TEST_UTIL_H_
#define SLIME_TESTS_ENGINE_ENGINE_TEST_UTIL_H_

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>

#include "remove_tree.h"
#include "slime/common/status.h"
#include "slime/model/init_random_model.h"
#include "test_paths.h"

namespace slime::engine::test_util {

using slime::testing::SourceDir;

// The Qwen3 tokenizer fetched by scripts/fetch_test_data.sh (holds tokenizer.json once fetched).
inline std::string TokenizerDir() { return SourceDir() + "/.cache/testdata/qwen3"; }

// A config under tests/data/model/configs/ (e.g. "qwen3-tiny.json").
inline std::string TestModelConfig(const std::string& file) {
  return SourceDir() + "/tests/data/model/configs/" + file;
}

// A random-weight HF model directory <temp>/slime-<name>-<pid>: model::InitRandomModel of
// `config_path` with TokenizerDir()'s tokenizer, `seed` and `dtype` ("bf16" | "fp32" | ...).
// Written on the first call for `name` (a failure is a test failure), returned as is by later
// calls, removed when the process exits. `name` must identify config, seed and dtype.
// Thread-safe.
inline const std::string& RandomModelDir(const std::string& name, const std::string& config_path,
                                         uint64_t seed, const std::string& dtype) {
  static std::mutex mu;
  static std::map<std::string, std::string> dirs;  // name -> directory (nodes never move)
  std::lock_guard<std::mutex> lock(mu);
  auto it = dirs.find(name);
  if (it != dirs.end()) return it->second;
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("slime-" + name + "-" + std::to_string(::getpid())))
                              .string();
  slime::testing::RemoveTree(dir);
  slime::testing::RemoveTreeAtExit(dir);
  Status s = model::InitRandomModel(config_path, TokenizerDir(), dir, seed, dtype);
  EXPECT_TRUE(s.ok()) << name << ": " << s;
  return dirs.emplace(name, dir).first->second;
}

}  // namespace slime::engine::test_util

#endif  // SLIME_TESTS_ENGINE_ENGINE_TEST_UTIL_H_
