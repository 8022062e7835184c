// The byte-level BPE tokenizer.json fixture of byte_tokenizer.h.
#include "byte_tokenizer.h"

#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "slime/tokenizer/unicode.h"

namespace slime::testing {
namespace {

using Json = nlohmann::json;

// A byte as tokenizer.json spells it (GPT-2's byte-to-unicode table, UTF-8).
std::string Spell(uint8_t b) {
  std::string s;
  tokenizer::AppendUtf8(tokenizer::ByteToUnicode(b), &s);
  return s;
}

Json ByteLevel(bool use_regex) {
  return Json{{"type", "ByteLevel"},
              {"add_prefix_space", false},
              {"trim_offsets", false},
              {"use_regex", use_regex}};
}

Json PreTokenizerJson(ByteTokenizerOptions::PreTokenizer pre_tokenizer) {
  switch (pre_tokenizer) {
    case ByteTokenizerOptions::PreTokenizer::kByteLevel:
      return ByteLevel(/*use_regex=*/true);
    case ByteTokenizerOptions::PreTokenizer::kSplitThenBytes:
      return Json{
          {"type", "Sequence"},
          {"pretokenizers",
           Json::array(
               {Json{{"type", "Split"},
                     {"pattern",
                      {{"Regex", R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N})"
                                 R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}}},
                     {"behavior", "Isolated"},
                     {"invert", false}},
                ByteLevel(/*use_regex=*/false)})}};
  }
  std::abort();  // unreachable: every enumerator returns above
}

}  // namespace

std::string ByteTokenizerJson(const ByteTokenizerOptions& options) {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[Spell(static_cast<uint8_t>(b))] = b;
  Json merges = Json::array();
  for (size_t i = 0; i < options.merges.size(); ++i) {
    const std::string& m = options.merges[i];
    if (m.size() != 2) {
      std::fprintf(stderr, "ByteTokenizerJson: merge %zu is %zu bytes; each merge is two bytes\n",
                   i, m.size());
      std::abort();
    }
    const std::string left = Spell(static_cast<uint8_t>(m[0]));
    const std::string right = Spell(static_cast<uint8_t>(m[1]));
    vocab[left + right] = 256 + static_cast<int>(i);
    merges.push_back(left + " " + right);
  }
  Json added_tokens = Json::array();
  for (const ByteTokenizerOptions::AddedToken& t : options.added_tokens) {
    added_tokens.push_back(Json{{"id", t.id},
                                {"content", t.content},
                                {"single_word", false},
                                {"lstrip", false},
                                {"rstrip", false},
                                {"normalized", false},
                                {"special", t.special}});
  }
  const bool decoder_regex =
      options.pre_tokenizer == ByteTokenizerOptions::PreTokenizer::kByteLevel;
  Json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = std::move(added_tokens);
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = PreTokenizerJson(options.pre_tokenizer);
  j["post_processor"] = nullptr;
  j["decoder"] = ByteLevel(decoder_regex);
  j["model"] = Json{{"type", "BPE"},
                    {"dropout", nullptr},
                    {"unk_token", nullptr},
                    {"continuing_subword_prefix", ""},
                    {"end_of_word_suffix", ""},
                    {"fuse_unk", false},
                    {"byte_fallback", false},
                    {"ignore_merges", false},
                    {"vocab", std::move(vocab)},
                    {"merges", std::move(merges)}};
  return j.dump();
}

}  // namespace slime::testing
