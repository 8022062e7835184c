// Test helpers (see test_util.h).
#include "test_util.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "slime/tokenizer/unicode.h"

namespace slime::tokenizer::testing {

std::string SourceDir() {
  const char* env = std::getenv("SLIME_SOURCE_DIR");
  return (env != nullptr && *env != '\0') ? env : SLIME_TEST_SOURCE_DIR;
}

std::string TestDataDir() {
  const char* env = std::getenv("SLIME_TEST_DATA");
  return (env != nullptr && *env != '\0') ? env : SourceDir() + "/.cache/testdata";
}

std::string RealTokenizerDir(const std::string& name, std::string* why) {
  const std::string dir = TestDataDir() + "/" + name;
  if (std::filesystem::exists(dir + "/tokenizer.json")) return dir;
  *why = "missing " + dir + "/tokenizer.json: run scripts/fetch_test_data.sh (or point "
         "SLIME_TEST_DATA at a directory that holds qwen3/, llama3/ and llama3_1/)";
  return "";
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

std::vector<nlohmann::ordered_json> ReadJsonl(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    ADD_FAILURE() << "cannot open " << path;
    return {};
  }
  std::vector<nlohmann::ordered_json> out;
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      out.push_back(nlohmann::ordered_json::parse(line));
    } catch (const nlohmann::json::exception& e) {
      ADD_FAILURE() << path << ":" << line_no << ": " << e.what();
      return {};
    }
  }
  return out;
}

TempDir::TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "slime_tok_XXXXXX").string();
  path_ = mkdtemp(tmpl.data()) != nullptr ? tmpl : std::string();
}

TempDir::~TempDir() {
  std::error_code ec;
  if (!path_.empty()) std::filesystem::remove_all(path_, ec);
}

nlohmann::json TinyByteLevelTokenizerJson() {
  using Json = nlohmann::json;
  Json vocab = Json::object();
  auto ch = [](int b) {
    std::string s;
    AppendUtf8(ByteToUnicode(static_cast<uint8_t>(b)), &s);
    return s;
  };
  for (int b = 0; b < 256; ++b) vocab[ch(b)] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"},   {"l", "l"},  {"he", "ll"},   {"hell", "o"},   {"Ġ", "w"},
      {"o", "r"},   {"Ġw", "or"}, {"Ġwor", "l"}, {"Ġworl", "d"},  {"a", "a"},
      {"b", "c"},   {"a", "b"},  {"a", "bc"}};
  Json merge_list = Json::array();
  int next = 256;
  for (const auto& [a, b] : merges) {
    vocab[a + b] = next++;
    merge_list.push_back(a + " " + b);
  }
  auto added = [](int id, const std::string& content, bool special, bool lstrip, bool rstrip,
                  bool single_word) {
    return Json{{"id", id},           {"content", content}, {"single_word", single_word},
                {"lstrip", lstrip},   {"rstrip", rstrip},   {"normalized", false},
                {"special", special}};
  };
  Json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = Json::array({added(300, "<|end|>", true, false, false, false),
                                   added(301, "<x>", false, true, true, false),
                                   added(302, "word", false, false, false, true),
                                   added(303, "<s>", true, false, false, false)});
  j["normalizer"] = Json{{"type", "NFC"}};
  j["pre_tokenizer"] = Json{
      {"type", "Sequence"},
      {"pretokenizers",
       Json::array(
           {Json{{"type", "Split"},
                 {"pattern",
                  {{"Regex", R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N})"
                             R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}}},
                 {"behavior", "Isolated"},
                 {"invert", false}},
            Json{{"type", "ByteLevel"},
                 {"add_prefix_space", false},
                 {"trim_offsets", false},
                 {"use_regex", false}}})}};
  j["post_processor"] = Json{
      {"type", "TemplateProcessing"},
      {"single", Json::array({Json{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                              Json{{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
      {"pair", Json::array()},
      {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {303}}, {"tokens", {"<s>"}}}}}}};
  j["decoder"] = Json{{"type", "ByteLevel"}, {"add_prefix_space", false},
                      {"trim_offsets", false}, {"use_regex", false}};
  j["model"] = Json{{"type", "BPE"},         {"dropout", nullptr},
                    {"unk_token", nullptr},  {"continuing_subword_prefix", ""},
                    {"end_of_word_suffix", ""}, {"fuse_unk", false},
                    {"byte_fallback", false}, {"ignore_merges", false},
                    {"vocab", vocab},        {"merges", merge_list}};
  return j;
}

}  // namespace slime::tokenizer::testing
