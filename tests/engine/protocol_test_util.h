// Helpers for the engine_protocol tests: a byte tokenizer built in memory (every byte is one
// token, so token boundaries are explicit) and the fetched real Qwen3 tokenizer, which tests skip
// with a message when scripts/fetch_test_data.sh has not been run. Test-only; one thread.
#ifndef SLIME_TESTS_ENGINE_PROTOCOL_TEST_UTIL_H_
#define SLIME_TESTS_ENGINE_PROTOCOL_TEST_UTIL_H_

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "byte_tokenizer.h"
#include "slime/tokenizer/tokenizer.h"
#include "test_paths.h"

namespace slime::engine::testing {

// Byte-level tokenizer (tests/support/byte_tokenizer.h): ids 0..255 are the bytes (no merges),
// 256 = "<|end|>" (special, EOS), 257 = "<|im_end|>" (special), 258 = "<tool>" (added, not
// special).
inline std::unique_ptr<tokenizer::Tokenizer> ByteTokenizer() {
  slime::testing::ByteTokenizerOptions options;
  options.added_tokens = {{256, "<|end|>"}, {257, "<|im_end|>"}, {258, "<tool>", false}};
  const nlohmann::json config{{"eos_token", "<|end|>"}};
  auto tok = tokenizer::Tokenizer::FromJsonText(slime::testing::ByteTokenizerJson(options),
                                                config.dump(), "byte-tokenizer");
  if (!tok.ok()) return nullptr;
  return std::move(tok).value();
}

// <test data>/qwen3 ($SLIME_TEST_DATA, else $SLIME_SOURCE_DIR/.cache/testdata, else the
// compile-time source dir) when it holds tokenizer.json; otherwise "" and `*why` says how to
// fetch it.
inline std::string Qwen3Dir(std::string* why) {
  const std::string dir = (slime::testing::TestDataDir() / "qwen3").string();
  if (std::filesystem::exists(dir + "/tokenizer.json")) return dir;
  *why = "missing " + dir +
         "/tokenizer.json: run scripts/fetch_test_data.sh (or point "
         "SLIME_TEST_DATA at a directory that holds qwen3/)";
  return "";
}

// Loads the real Qwen3 tokenizer once per process (nullptr + `*why` when absent).
inline const tokenizer::Tokenizer* Qwen3(std::string* why) {
  static std::string reason;
  static std::unique_ptr<tokenizer::Tokenizer> tok = [] {
    const std::string dir = Qwen3Dir(&reason);
    if (dir.empty()) return std::unique_ptr<tokenizer::Tokenizer>();
    auto t = tokenizer::Tokenizer::FromDirectory(dir);
    if (!t.ok()) {
      reason = std::string(t.status().message());
      return std::unique_ptr<tokenizer::Tokenizer>();
    }
    return std::move(t).value();
  }();
  *why = reason;
  return tok.get();
}

}  // namespace slime::engine::testing

// Skips the current test when the real Qwen3 tokenizer is not available.
#define SLIME_REQUIRE_QWEN3(var)                                                           \
  std::string qwen3_why_;                                                                  \
  const ::slime::tokenizer::Tokenizer* var = ::slime::engine::testing::Qwen3(&qwen3_why_); \
  if (var == nullptr) GTEST_SKIP() << qwen3_why_

#endif  // SLIME_TESTS_ENGINE_PROTOCOL_TEST_UTIL_H_
