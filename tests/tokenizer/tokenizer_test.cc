// Self-contained tokenizer tests on small hand-made tokenizer.json files (always run): merges,
// byte-level mapping, added tokens, post-processing, decode, streaming, and malformed inputs.
#include "slime/tokenizer/tokenizer.h"

#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "slime/tokenizer/incremental_decoder.h"
#include "test_util.h"

namespace slime::tokenizer {
namespace {

using Json = nlohmann::json;
using ::slime::tokenizer::testing::TempDir;
using ::slime::tokenizer::testing::TinyByteLevelTokenizerJson;
using ::slime::tokenizer::testing::WriteText;
using Ids = std::vector<int32_t>;

std::unique_ptr<Tokenizer> Load(const Json& j, const Json& config = nullptr) {
  auto tok = Tokenizer::FromJsonText(j.dump(), config.is_null() ? "" : config.dump(), "tiny");
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? std::move(tok).value() : nullptr;
}

class TinyTokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tok_ = Load(TinyByteLevelTokenizerJson());
    ASSERT_NE(tok_, nullptr);
  }
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(TinyTokenizerTest, MergesByRank) {
  EXPECT_EQ(tok_->Encode("hello world"), (Ids{259, 264}));
  // b+c (rank 10) beats a+b (rank 11); then a+bc.
  EXPECT_EQ(tok_->Encode("abc"), (Ids{268}));
  EXPECT_EQ(tok_->Encode("abx"), (Ids{267, 'x'}));
  // Equal ranks merge leftmost first.
  EXPECT_EQ(tok_->Encode("aaa"), (Ids{265, 'a'}));
  EXPECT_EQ(tok_->Encode("aaaa"), (Ids{265, 265}));
  EXPECT_EQ(tok_->Encode(""), Ids{});
}

TEST_F(TinyTokenizerTest, ByteLevelMapsEveryByte) {
  // Space becomes Ġ and starts the " world" word; newline is its own byte token.
  EXPECT_EQ(tok_->Encode(" x\n"), (Ids{' ', 'x', '\n'}));
  // Non-ASCII text falls back to one token per UTF-8 byte.
  EXPECT_EQ(tok_->Encode("\u00e9"), (Ids{0xC3, 0xA9}));
  EXPECT_EQ(tok_->Encode("\U0001F600"), (Ids{0xF0, 0x9F, 0x98, 0x80}));
  // Invalid UTF-8 input is repaired to U+FFFD (EF BF BD) rather than rejected.
  EXPECT_EQ(tok_->Encode("a\xFF"), (Ids{'a', 0xEF, 0xBF, 0xBD}));
}

TEST_F(TinyTokenizerTest, NfcNormalizerRunsBeforeByteMapping) {
  EXPECT_EQ(tok_->Encode("e\u0301"), (Ids{0xC3, 0xA9}));
}

TEST_F(TinyTokenizerTest, AddedTokensSplitTheText) {
  EXPECT_EQ(tok_->Encode("hello<|end|>world"), (Ids{259, 300, 'w', 261, 'l', 'd'}));
  EXPECT_EQ(tok_->Encode("<|end|><|end|>"), (Ids{300, 300}));
  // A prefix of an added token is plain text.
  EXPECT_EQ(tok_->Encode("<|end").size(), 5u);
  // lstrip/rstrip absorb the surrounding whitespace.
  EXPECT_EQ(tok_->Encode("a  <x>  b"), (Ids{'a', 301, 'b'}));
  // single_word: only as a whole word.
  EXPECT_EQ(tok_->Encode("a word here"), (Ids{'a', ' ', 302, ' ', 256, 'r', 'e'}));
  EXPECT_EQ(tok_->Encode("swordfish"), (Ids{'s', 'w', 261, 'd', 'f', 'i', 's', 'h'}));
}

TEST_F(TinyTokenizerTest, PostProcessorOnlyWithAddSpecialTokens) {
  EXPECT_EQ(tok_->Encode("hello", true), (Ids{303, 259}));
  EXPECT_EQ(tok_->Encode("hello", false), (Ids{259}));
  EXPECT_EQ(tok_->Encode("", true), (Ids{303}));
}

TEST_F(TinyTokenizerTest, DecodeInvertsEncode) {
  for (const std::string text : {"hello world", "a word here <x> b", "e\u0301 \U0001F600 \u4e2d",
                                 "  tabs\t\tand\nnewlines\r\n"}) {
    // NFC changes "e\u0301"; compare with the normalized text.
    std::string expected = text == "e\u0301 \U0001F600 \u4e2d" ? "\u00e9 \U0001F600 \u4e2d" : text;
    if (text == "a word here <x> b") expected = "a word here<x>b";  // lstrip/rstrip ate spaces
    EXPECT_EQ(tok_->Decode(tok_->Encode(text)), expected);
  }
  EXPECT_EQ(tok_->Decode(Ids{259, 300}), "hello<|end|>");
  EXPECT_EQ(tok_->Decode(Ids{259, 300}, /*skip_special_tokens=*/true), "hello");
  EXPECT_EQ(tok_->Decode(Ids{259, 99999, -5}), "hello");  // unknown ids are skipped
  EXPECT_EQ(tok_->Decode(Ids{0xF0, 0x9F}), "\uFFFD");     // incomplete character
}

TEST_F(TinyTokenizerTest, Lookups) {
  EXPECT_EQ(tok_->TokenToId("hello"), 259);
  EXPECT_EQ(tok_->TokenToId("<|end|>"), 300);
  EXPECT_EQ(tok_->TokenToId("nope"), std::nullopt);
  EXPECT_EQ(tok_->IdToToken(264), "\u0120world");
  EXPECT_EQ(tok_->IdToToken(301), "<x>");
  EXPECT_EQ(tok_->IdToToken(5000), std::nullopt);
  EXPECT_TRUE(tok_->IsSpecial(300));
  EXPECT_FALSE(tok_->IsSpecial(301));
  EXPECT_FALSE(tok_->IsSpecial(259));
  EXPECT_EQ(tok_->vocab_size(), 256u + 13u + 4u);
  EXPECT_EQ(tok_->id_limit(), 304);
  EXPECT_EQ(tok_->bos_id(), std::nullopt);
  EXPECT_FALSE(tok_->chat_template().ok());
}

TEST_F(TinyTokenizerTest, IncrementalDecoderNeverSplitsACharacter) {
  IncrementalDecoder dec(tok_.get());
  const Ids emoji = tok_->Encode("\U0001F600");
  ASSERT_EQ(emoji.size(), 4u);
  EXPECT_EQ(dec.Feed(emoji[0]), "");
  EXPECT_EQ(dec.Feed(emoji[1]), "");
  EXPECT_EQ(dec.Feed(emoji[2]), "");
  EXPECT_TRUE(dec.has_pending());
  EXPECT_EQ(dec.Feed(emoji[3]), "\U0001F600");
  EXPECT_FALSE(dec.has_pending());
  EXPECT_EQ(dec.Feed(Ids{259, 300}), "hello<|end|>");
  // A character that never completes comes out as U+FFFD at the end, as Decode does.
  EXPECT_EQ(dec.Feed(Ids{0xE4, 0xB8}), "");
  EXPECT_EQ(dec.Flush(), "\uFFFD");
  EXPECT_EQ(dec.Feed(Ids{0xE4, 'a'}), "\uFFFD" "a");

  IncrementalDecoder skipping(tok_.get(), /*skip_special_tokens=*/true);
  EXPECT_EQ(skipping.Feed(Ids{259, 300, 264}), "hello world");
}

TEST_F(TinyTokenizerTest, ConcurrentEncodeMatchesSerial) {
  std::vector<std::string> texts;
  std::mt19937 rng(7);
  const std::vector<std::string> parts = {"hello", " world", "abc", "aaa", "<|end|>", " ",
                                          "\u00e9", "\U0001F600", "word", "\n", "xyz"};
  for (int i = 0; i < 200; ++i) {
    std::string t;
    for (int k = 0; k < 12; ++k) t += parts[rng() % parts.size()];
    texts.push_back(t);
  }
  std::vector<Ids> serial;
  for (const std::string& t : texts) serial.push_back(tok_->Encode(t));
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      for (int rep = 0; rep < 5; ++rep) {
        for (size_t i = 0; i < texts.size(); ++i) {
          if (tok_->Encode(texts[(i + w * 37) % texts.size()]) !=
              serial[(i + w * 37) % texts.size()]) {
            ++mismatches[w];
          }
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int w = 0; w < 4; ++w) EXPECT_EQ(mismatches[w], 0) << "thread " << w;
}

TEST(TokenizerConfigTest, SpecialTokensAndCleanup) {
  Json config = {{"bos_token", "<s>"},
                 {"eos_token", {{"content", "<|end|>"}, {"__type", "AddedToken"}}},
                 {"pad_token", nullptr},
                 {"clean_up_tokenization_spaces", true}};
  auto tok = Load(TinyByteLevelTokenizerJson(), config);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->bos_id(), 303);
  EXPECT_EQ(tok->eos_id(), 300);
  EXPECT_EQ(tok->pad_id(), std::nullopt);
  EXPECT_EQ(tok->bos_token(), "<s>");
  const Ids ids = tok->Encode("a , b .");
  EXPECT_TRUE(tok->clean_up_tokenization_spaces());
  EXPECT_EQ(tok->Decode(ids), "a , b .");  // BPE: ignored, as transformers >= 5 does
  EXPECT_EQ(tok->Decode(ids, false, /*clean_up_tokenization_spaces=*/true), "a, b.");
}

// A character-level (not byte-level) BPE: byte fallback, unk and fuse_unk.
Json CharLevelTokenizer(bool byte_fallback, bool fuse_unk) {
  Json j;
  j["added_tokens"] = Json::array();
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = nullptr;
  j["post_processor"] = nullptr;
  j["decoder"] = nullptr;
  j["model"] = {{"type", "BPE"},
                {"unk_token", "<unk>"},
                {"byte_fallback", byte_fallback},
                {"fuse_unk", fuse_unk},
                {"vocab", {{"<unk>", 0}, {"a", 1}, {"b", 2}, {"ab", 3}, {"<0xC3>", 4},
                           {"<0xA9>", 5}}},
                {"merges", Json::array({Json::array({"a", "b"})})}};
  return j;
}

TEST(CharLevelBpeTest, ByteFallbackUnkAndFuse) {
  auto fallback = Load(CharLevelTokenizer(true, false));
  ASSERT_NE(fallback, nullptr);
  EXPECT_EQ(fallback->Encode("ab\u00e9"), (Ids{3, 4, 5}));
  EXPECT_EQ(fallback->Encode("a\u4e2d"), (Ids{1, 0}));  // <0xE4> missing: unk
  auto plain = Load(CharLevelTokenizer(false, false));
  ASSERT_NE(plain, nullptr);
  EXPECT_EQ(plain->Encode("\u4e2d\u6587a"), (Ids{0, 0, 1}));
  auto fused = Load(CharLevelTokenizer(false, true));
  ASSERT_NE(fused, nullptr);
  EXPECT_EQ(fused->Encode("\u4e2d\u6587a"), (Ids{0, 1}));
  // Without a decoder, tokens are joined with spaces.
  EXPECT_EQ(plain->Decode(Ids{3, 1}), "ab a");
}

TEST(CharLevelBpeTest, IgnoreMergesTakesWholeWords) {
  Json j = CharLevelTokenizer(false, false);
  j["model"]["vocab"]["ba"] = 6;
  j["model"]["merges"] = Json::array({"a b"});  // no merge produces "ba"
  auto with_merges = Load(j);
  ASSERT_NE(with_merges, nullptr);
  EXPECT_EQ(with_merges->Encode("ba"), (Ids{2, 1}));
  j["model"]["ignore_merges"] = true;
  auto ignoring = Load(j);
  ASSERT_NE(ignoring, nullptr);
  EXPECT_EQ(ignoring->Encode("ba"), (Ids{6}));
}

TEST(SplitBehaviorTest, AllBehaviors) {
  auto run = [](const std::string& behavior, bool invert) {
    Json j = CharLevelTokenizer(false, false);
    j["model"]["vocab"] = {{"<unk>", 0}, {"a", 1}, {"b", 2}, {"-", 3}};
    j["model"]["merges"] = Json::array();
    j["decoder"] = nullptr;
    j["pre_tokenizer"] = {{"type", "Split"},
                          {"pattern", {{"String", "-"}}},
                          {"behavior", behavior},
                          {"invert", invert}};
    auto pre = PreTokenizer::FromJson(j["pre_tokenizer"]);
    EXPECT_TRUE(pre.ok()) << pre.status();
    std::deque<std::string> arena;
    std::vector<std::string_view> words;
    EXPECT_TRUE((*pre)->Split("a-b--a", &arena, &words).ok());
    return std::vector<std::string>(words.begin(), words.end());
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(run("Removed", false), (V{"a", "b", "a"}));
  EXPECT_EQ(run("Isolated", false), (V{"a", "-", "b", "-", "-", "a"}));
  EXPECT_EQ(run("MergedWithPrevious", false), (V{"a-", "b-", "-", "a"}));
  EXPECT_EQ(run("MergedWithNext", false), (V{"a", "-b", "-", "-a"}));
  EXPECT_EQ(run("Contiguous", false), (V{"a", "-", "b", "--", "a"}));
  EXPECT_EQ(run("Removed", true), (V{"-", "-", "-"}));
}

// ---- Malformed input: a clear error that names the file, never a crash ---------------------

class MalformedTest : public ::testing::Test {
 protected:
  // Writes `text` as tokenizer.json and loads it; returns the error message (or "" if it loaded).
  std::string LoadError(const std::string& text, const std::string& config = "") {
    WriteText(dir_.File("tokenizer.json"), text);
    std::string config_path;
    if (!config.empty()) {
      config_path = dir_.File("tokenizer_config.json");
      WriteText(config_path, config);
    }
    auto tok = Tokenizer::FromFiles(dir_.File("tokenizer.json"), config_path);
    return tok.ok() ? "" : std::string(tok.status().message());
  }
  TempDir dir_;
};

TEST_F(MalformedTest, MissingFiles) {
  auto tok = Tokenizer::FromFiles(dir_.File("absent.json"), "");
  ASSERT_FALSE(tok.ok());
  EXPECT_TRUE(absl::IsNotFound(tok.status()));
  EXPECT_NE(std::string(tok.status().message()).find(dir_.File("absent.json")), std::string::npos);
  auto from_dir = Tokenizer::FromDirectory(dir_.File("no_such_dir"));
  ASSERT_FALSE(from_dir.ok());
  EXPECT_NE(std::string(from_dir.status().message()).find("no_such_dir"), std::string::npos);
  auto empty_dir = Tokenizer::FromDirectory(dir_.path());
  ASSERT_FALSE(empty_dir.ok());
  EXPECT_NE(std::string(empty_dir.status().message()).find("tokenizer.json"), std::string::npos);
}

TEST_F(MalformedTest, EachErrorNamesTheFileAndTheProblem) {
  const std::string file = dir_.File("tokenizer.json");
  Json good = TinyByteLevelTokenizerJson();
  struct Case {
    std::string name;
    std::string text;
    std::string expect;  // substring of the message besides the file name
  };
  std::vector<Case> cases;
  cases.push_back({"not json", "{not json", "not valid JSON"});
  cases.push_back({"empty", "", "not valid JSON"});
  const std::string dumped = good.dump();
  cases.push_back({"truncated", dumped.substr(0, dumped.size() / 2), "not valid JSON"});
  cases.push_back({"array", "[1, 2]", "object"});
  Json no_model = good;
  no_model.erase("model");
  cases.push_back({"missing model", no_model.dump(), "model"});
  Json bad_merge = good;
  bad_merge["model"]["merges"].push_back("zz qq");
  cases.push_back({"merge out of vocab", bad_merge.dump(), "model.merges[13]"});
  Json malformed_merge = good;
  malformed_merge["model"]["merges"][2] = "nospace";
  cases.push_back({"merge without space", malformed_merge.dump(), "model.merges[2]"});
  Json merge_number = good;
  merge_number["model"]["merges"][0] = 5;
  cases.push_back({"merge number", merge_number.dump(), "model.merges[0]"});
  Json vocab_array = good;
  vocab_array["model"]["vocab"] = Json::array({"a"});
  cases.push_back({"vocab array", vocab_array.dump(), "model.vocab"});
  Json vocab_bad_id = good;
  vocab_bad_id["model"]["vocab"]["x"] = "seven";
  cases.push_back({"vocab id string", vocab_bad_id.dump(), "invalid id"});
  Json dup_id = good;
  dup_id["model"]["vocab"]["zzz"] = 5;
  cases.push_back({"duplicate id", dup_id.dump(), "used by two tokens"});
  Json wordpiece = good;
  wordpiece["model"]["type"] = "WordPiece";
  cases.push_back({"model type", wordpiece.dump(), "supported: BPE"});
  Json pre = good;
  pre["pre_tokenizer"] = {{"type", "Whitespace"}};
  cases.push_back({"pre_tokenizer type", pre.dump(), "Whitespace"});
  Json regex = good;
  regex["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  cases.push_back({"bad regex", regex.dump(), "pre_tokenizer.pretokenizers[0].pattern"});
  Json behavior = good;
  behavior["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Sideways";
  cases.push_back({"bad behavior", behavior.dump(), "Sideways"});
  Json norm = good;
  norm["normalizer"] = {{"type", "NFKD"}};
  cases.push_back({"normalizer", norm.dump(), "NFKD"});
  Json added = good;
  added["added_tokens"][1]["id"] = 300;
  cases.push_back({"duplicate added id", added.dump(), "added_tokens[1]"});
  Json added_huge = good;
  added_huge["added_tokens"][0]["id"] = 1 << 30;
  cases.push_back({"huge added id", added_huge.dump(), "outside"});
  Json vocab_huge = good;
  vocab_huge["model"]["vocab"]["zzz"] = 1LL << 40;
  cases.push_back({"huge vocab id", vocab_huge.dump(), "invalid id"});
  Json added_bad = good;
  added_bad["added_tokens"][0] = "text";
  cases.push_back({"added token string", added_bad.dump(), "added_tokens[0]"});
  Json post = good;
  post["post_processor"]["special_tokens"] = Json::object();
  cases.push_back({"template special", post.dump(), "post_processor.single[0]"});
  Json decoder = good;
  decoder["decoder"] = {{"type", "WordPiece"}};
  cases.push_back({"decoder", decoder.dump(), "decoder"});
  Json dropout = good;
  dropout["model"]["dropout"] = 0.1;
  cases.push_back({"dropout", dropout.dump(), "dropout"});
  for (const Case& c : cases) {
    const std::string message = LoadError(c.text);
    ASSERT_FALSE(message.empty()) << c.name << ": loaded but should not";
    EXPECT_NE(message.find(file), std::string::npos) << c.name << ": " << message;
    EXPECT_NE(message.find(c.expect), std::string::npos) << c.name << ": " << message;
  }
}

TEST_F(MalformedTest, BadConfigNamesTheConfigFile) {
  const std::string good = TinyByteLevelTokenizerJson().dump();
  const std::string config = dir_.File("tokenizer_config.json");
  for (const auto& [text, expect] : std::vector<std::pair<std::string, std::string>>{
           {"{oops", "not valid JSON"},
           {R"({"eos_token": "<nope>"})", "<nope>"},
           {R"({"bos_token": 12})", "bos_token"},
           {R"({"chat_template": 3})", "chat_template"},
           {R"({"clean_up_tokenization_spaces": "yes"})", "clean_up_tokenization_spaces"}}) {
    const std::string message = LoadError(good, text);
    ASSERT_FALSE(message.empty()) << text;
    EXPECT_NE(message.find(config), std::string::npos) << message;
    EXPECT_NE(message.find(expect), std::string::npos) << message;
  }
  // A chat template with a syntax error does not fail loading; using it does, naming the
  // config file and the template line.
  EXPECT_EQ(LoadError(good, R"({"chat_template": "hi\n{% for m in messages %}"})"), "");
  auto tok = Tokenizer::FromFiles(dir_.File("tokenizer.json"), config);
  ASSERT_TRUE(tok.ok());
  auto rendered = (*tok)->ApplyChatTemplate(
      nlohmann::ordered_json::array({{{"role", "user"}, {"content", "hi"}}}), {});
  ASSERT_FALSE(rendered.ok());
  const std::string message(rendered.status().message());
  EXPECT_NE(message.find(config), std::string::npos) << message;
  EXPECT_NE(message.find("chat template line 2: 'for' is never closed"), std::string::npos)
      << message;
}

TEST_F(MalformedTest, RandomCorruptionNeverCrashes) {
  const std::string good = TinyByteLevelTokenizerJson().dump();
  std::mt19937 rng(1234);
  int failures = 0;
  for (int i = 0; i < 300; ++i) {
    std::string text = good;
    for (int k = 0; k < 3; ++k) text[rng() % text.size()] = static_cast<char>(rng() % 256);
    auto tok = Tokenizer::FromJsonText(text, "", "corrupt.json");
    if (!tok.ok()) {
      ++failures;
      EXPECT_NE(std::string(tok.status().message()).find("corrupt.json"), std::string::npos);
      continue;
    }
    (void)(*tok)->Encode("hello world <|end|> \u00e9");  // loaded: must still encode safely
  }
  EXPECT_GT(failures, 0);
}

}  // namespace
}  // namespace slime::tokenizer
