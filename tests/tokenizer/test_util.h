// Shared helpers for the tokenizer tests: locating the repository's committed test data and the
// fetched real tokenizers, reading JSONL, temporary directories, and a tiny byte-level BPE
// tokenizer.json built in memory. Thread-safety: test-only, call from the test thread.
#ifndef SLIME_TESTS_TOKENIZER_TEST_UTIL_H_
#define SLIME_TESTS_TOKENIZER_TEST_UTIL_H_

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace slime::tokenizer::testing {

// Repository root: $SLIME_SOURCE_DIR (set by ctest), else the compile-time source directory.
std::string SourceDir();
// Directory of fetched tokenizers: $SLIME_TEST_DATA, else <source>/.cache/testdata.
std::string TestDataDir();
// <TestDataDir>/<name> when it holds tokenizer.json; otherwise "" and `*why` explains how to
// fetch it (the caller must fail, not skip).
std::string RealTokenizerDir(const std::string& name, std::string* why);

// Parses each non-empty line of a JSONL file (ordered, so key order is kept). Fails the
// current test (ADD_FAILURE) and returns {} when the file is missing or malformed.
std::vector<nlohmann::ordered_json> ReadJsonl(const std::string& path);

std::string ReadText(const std::string& path);
void WriteText(const std::string& path, const std::string& text);

// A fresh directory under the system temp dir, removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A small byte-level BPE tokenizer.json: the 256 byte tokens (id = byte value) plus merges
// h+e, l+l, he+ll, hell+o, Ġ+w, o+r, Ġw+or, Ġwor+l, Ġworl+d, a+a, b+c, a+b, a+bc (ids 256..268
// in that order); Qwen's Split regex + ByteLevel; added tokens <|end|> (300, special),
// <x> (301, lstrip+rstrip), word (302, single_word); TemplateProcessing "<s>" (303) + A.
nlohmann::json TinyByteLevelTokenizerJson();

}  // namespace slime::tokenizer::testing

#endif  // SLIME_TESTS_TOKENIZER_TEST_UTIL_H_
