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

#include "slime/tokenizer/tokenizer.h"
#include "slime/tokenizer/unicode.h"
#include "test_paths.h"

namespace slime::engine::testing {

// Byte-level tokenizer: ids 0..255 are the bytes (no merges), 256 = "<|end|>" (special, EOS),
// 257 = "<|im_end|>" (special), 258 = "<tool>" (added, not special).
inline std::unique_ptr<tokenizer::Tokenizer> ByteTokenizer() {
  using Json = nlohmann::json;
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) {
    std::string s;
    tokenizer::AppendUtf8(tokenizer::ByteToUnicode(static_cast<uint8_t>(b)), &s);
    vocab[s] = b;
  }
  auto added = [](int id, const char* content, bool special) {
    return Json{{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
                {"rstrip", false}, {"normalized", false}, {"special", special}};
  };
  Json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = Json::array(
      {added(256, "<|end|>", true), added(257, "<|im_end|>", true), added(258, "<tool>", false)});
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = Json{{"type", "ByteLevel"},
                            {"add_prefix_space", false},
                            {"trim_offsets", false},
                            {"use_regex", true}};
  j["post_processor"] = nullptr;
  j["decoder"] = Json{{"type", "ByteLevel"},
                      {"add_prefix_space", false},
                      {"trim_offsets", false},
                      {"use_regex", true}};
  j["model"] = Json{{"type", "BPE"},
                    {"dropout", nullptr},
                    {"unk_token", nullptr},
                    {"continuing_subword_prefix", ""},
                    {"end_of_word_suffix", ""},
                    {"fuse_unk", false},
                    {"byte_fallback", false},
                    {"ignore_merges", false},
                    {"vocab", vocab},
                    {"merges", Json::array()}};
  const Json config{{"eos_token", "<|end|>"}};
  auto tok = tokenizer::Tokenizer::FromJsonText(j.dump(), config.dump(), "byte-tokenizer");
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
