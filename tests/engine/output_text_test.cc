// OutputText: incremental detokenization, stop strings across token boundaries and SGLang's stop
// trimming. The byte tokenizer (one token per byte) makes boundaries explicit; the real Qwen3
// tokenizer (skipped when not fetched) covers real merges and multibyte characters.
#include "slime/engine/output_text.h"

#include <gtest/gtest.h>

#include <fstream>

#include "protocol_test_util.h"
#include "slime/tokenizer/unicode.h"

namespace slime::engine {
namespace {

using Ids = std::vector<int32_t>;
const std::string kReplacement = "\xef\xbf\xbd";  // U+FFFD

SamplingParams Params(std::vector<std::string> stop, bool skip_special = false) {
  SamplingParams sp;
  sp.stop = std::move(stop);
  sp.skip_special_tokens = skip_special;
  return sp;
}

Ids Bytes(std::string_view s) {
  Ids ids;
  for (unsigned char c : s) ids.push_back(c);
  return ids;
}

// Feeds `ids`; returns the index of the token whose Feed reported a stop (or -1) and checks that
// exactly one Feed reports.
int FeedAll(OutputText* out, const Ids& ids, std::string* matched = nullptr) {
  int at = -1;
  for (size_t i = 0; i < ids.size(); ++i) {
    std::optional<std::string> m = out->Feed(ids[i]);
    if (m) {
      EXPECT_EQ(at, -1) << "a stop reported twice";
      at = static_cast<int>(i);
      if (matched != nullptr) *matched = *m;
    }
  }
  return at;
}

class OutputTextBytesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tok_ = testing::ByteTokenizer();
    ASSERT_NE(tok_, nullptr);
  }
  std::unique_ptr<tokenizer::Tokenizer> tok_;
};

TEST_F(OutputTextBytesTest, StopStringSplitOverTokensIsFoundOnTheTokenThatCompletesIt) {
  OutputText out(tok_.get(), Params({"END"}));
  std::string matched;
  EXPECT_EQ(FeedAll(&out, Bytes("hello END world"), &matched), 8);  // the 'D'
  EXPECT_EQ(matched, "END");
  EXPECT_EQ(out.matched_stop_pos(), 6u);
  const FinishReason f = FinishReason::StopString("END");
  EXPECT_EQ(out.Text(f, /*no_stop_trim=*/false), "hello ");
  EXPECT_EQ(out.Text(f, /*no_stop_trim=*/true), "hello END");
  EXPECT_EQ(out.PartialText(), "hello END world") << "partial text is never trimmed";
}

TEST_F(OutputTextBytesTest, EarliestStartingStopWins) {
  OutputText out(tok_.get(), Params({"b", "ab"}));
  std::string matched;
  EXPECT_EQ(FeedAll(&out, Bytes("xab"), &matched), 2);
  EXPECT_EQ(matched, "ab");
  EXPECT_EQ(out.Text(FinishReason::StopString("ab"), false), "x");
}

TEST_F(OutputTextBytesTest, NoStopTrimCutsWhatTheSameTokenAddedAfterTheString) {
  // Token 258 is "<tool>": the stop "<to" ends inside it.
  OutputText out(tok_.get(), Params({"<to"}));
  EXPECT_EQ(FeedAll(&out, Ids{'a', 258, 'b'}), 1);
  const FinishReason f = FinishReason::StopString("<to");
  EXPECT_EQ(out.Text(f, true), "a<to");
  EXPECT_EQ(out.Text(f, false), "a");
}

TEST_F(OutputTextBytesTest, MultibyteCharactersAreHeldBackUntilComplete) {
  const std::string text = "caf\xc3\xa9 \xf0\x9f\x98\x80!";  // "café 😀!"
  OutputText out(tok_.get(), Params({"\xc3\xa9", "\xf0\x9f\x98\x80"}));
  std::vector<std::string> partials;
  std::vector<int> stops;
  const Ids ids = Bytes(text);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (out.Feed(ids[i])) stops.push_back(static_cast<int>(i));
    partials.push_back(out.PartialText());
    EXPECT_TRUE(tokenizer::IsValidUtf8(out.PartialText())) << i;
    EXPECT_EQ(out.PartialText().find(kReplacement), std::string::npos) << i;
    EXPECT_EQ(text.compare(0, out.PartialText().size(), out.PartialText()), 0) << i;
  }
  EXPECT_EQ(partials[3], "caf") << "first byte of é held back";
  EXPECT_EQ(partials[4], "caf\xc3\xa9");
  EXPECT_EQ(stops, std::vector<int>{4}) << "é completes on byte 4; the emoji stop comes after";
  EXPECT_EQ(out.Text(FinishReason::StopString("\xc3\xa9"), false), "caf");
}

TEST_F(OutputTextBytesTest, StopTokenIsTrimmedUnlessNoStopTrim) {
  OutputText out(tok_.get(), Params({}));
  FeedAll(&out, Ids{'h', 'i', 256});
  EXPECT_EQ(out.Text(FinishReason::Stop(256), false), "hi");
  EXPECT_EQ(out.Text(FinishReason::Stop(256), true), "hi<|end|>");
  // A non-special stop token (stop_token_ids) is trimmed the same way.
  OutputText plain(tok_.get(), Params({}));
  FeedAll(&plain, Ids{'h', 'i', '.'});
  EXPECT_EQ(plain.Text(FinishReason::Stop('.'), false), "hi");
  EXPECT_EQ(plain.Text(FinishReason::Stop('.'), true), "hi.");
}

TEST_F(OutputTextBytesTest, SkipSpecialTokens) {
  OutputText out(tok_.get(), Params({}, /*skip_special=*/true));
  FeedAll(&out, Ids{257, 'h', 'i', 256});
  EXPECT_EQ(out.PartialText(), "hi");
  EXPECT_EQ(out.Text(FinishReason::Stop(256), false), "hi");
  EXPECT_EQ(out.Text(FinishReason::Stop(256), true), "hi");
  OutputText kept(tok_.get(), Params({}, /*skip_special=*/false));
  FeedAll(&kept, Ids{257, 'h', 'i', 256});
  EXPECT_EQ(kept.Text(FinishReason::Length(4), false), "<|im_end|>hi<|end|>");
}

TEST_F(OutputTextBytesTest, StopStringsSeeSpecialTokensOnlyWhenNotSkipped) {
  OutputText kept(tok_.get(), Params({"<|end|>"}, false));
  EXPECT_EQ(FeedAll(&kept, Ids{'a', 256}), 1);
  OutputText skipped(tok_.get(), Params({"<|end|>"}, true));
  EXPECT_EQ(FeedAll(&skipped, Ids{'a', 256}), -1);
}

TEST_F(OutputTextBytesTest, IncompleteTrailingCharacterInFinalText) {
  OutputText out(tok_.get(), Params({}));
  FeedAll(&out, Ids{'a', 0xE4, 0xBD});  // "a" + 2 of the 3 bytes of 你
  EXPECT_EQ(out.PartialText(), "a");
  EXPECT_EQ(out.Text(FinishReason::Length(3), false), "a" + kReplacement);
  EXPECT_EQ(out.Text(FinishReason::Abort("x"), false), "a" + kReplacement);
  // Stop token after an incomplete character: the text before it, as Decode(ids[:-1]).
  OutputText stop(tok_.get(), Params({}));
  FeedAll(&stop, Ids{'a', 0xE4, 256});
  EXPECT_EQ(stop.Text(FinishReason::Stop(256), false), "a" + kReplacement);
  EXPECT_EQ(stop.Text(FinishReason::Stop(256), true), tok_->Decode(Ids{'a', 0xE4, 256}));
}

TEST_F(OutputTextBytesTest, StopReportedByTheEngineButNotSeenHereUsesFirstOccurrence) {
  OutputText out(tok_.get(), Params({}));
  FeedAll(&out, Bytes("a;b;c"));
  EXPECT_EQ(out.Text(FinishReason::StopString(";"), false), "a");
  EXPECT_EQ(out.Text(FinishReason::StopString(";"), true), "a;");
  EXPECT_EQ(out.Text(FinishReason::StopString("zz"), false), "a;b;c");
}

TEST_F(OutputTextBytesTest, NothingAfterTheFirstMatchIsReported) {
  OutputText out(tok_.get(), Params({"x"}));
  EXPECT_EQ(FeedAll(&out, Bytes("axbx")), 1);
  EXPECT_EQ(out.matched_stop(), std::optional<std::string>("x"));
  EXPECT_EQ(out.num_tokens(), 4u);
}

// --- Real Qwen3 tokenizer ---------------------------------------------------------------------

TEST(OutputTextQwen3Test, StopStringSplitAcrossRealTokens) {
  SLIME_REQUIRE_QWEN3(tok);
  const std::string text = "The answer is 42.\nDone";
  const Ids ids = tok->Encode(text);
  for (const std::string stop : {"answer is", "answer i"}) {
    // The stop string spans several tokens: no single token holds it.
    for (int32_t id : ids)
      ASSERT_EQ(std::string(tok->TokenBytes(id)).find(stop), std::string::npos);
    OutputText out(tok, Params({stop}));
    const int at = FeedAll(&out, ids);
    ASSERT_GE(at, 0) << stop;
    // Reported on the token that completes it: the text before that token lacks it.
    const std::string before = tok->Decode(std::span<const int32_t>(ids.data(), at));
    const std::string through = tok->Decode(std::span<const int32_t>(ids.data(), at + 1));
    EXPECT_EQ(before.find(stop), std::string::npos);
    EXPECT_NE(through.find(stop), std::string::npos);
    const FinishReason f = FinishReason::StopString(stop);
    EXPECT_EQ(out.Text(f, false), "The ");
    EXPECT_EQ(out.Text(f, true), "The " + stop) << "no_stop_trim keeps up to the string's end";
  }
}

TEST(OutputTextQwen3Test, MultibyteCharactersAndStops) {
  SLIME_REQUIRE_QWEN3(tok);
  const std::string text = "你好，世界！🙂👍🏽 café ñ";
  const Ids ids = tok->Encode(text);
  bool split_character = false;
  for (int32_t id : ids) split_character |= !tokenizer::IsValidUtf8(tok->TokenBytes(id));
  ASSERT_TRUE(split_character) << "the sample should contain a character split over tokens";
  OutputText out(tok, Params({"👍🏽"}));
  int at = -1;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (out.Feed(ids[i])) at = static_cast<int>(i);
    EXPECT_TRUE(tokenizer::IsValidUtf8(out.PartialText()));
    EXPECT_EQ(out.PartialText().find(kReplacement), std::string::npos);
    EXPECT_EQ(text.compare(0, out.PartialText().size(), out.PartialText()), 0);
  }
  ASSERT_GE(at, 0);
  EXPECT_EQ(out.Text(FinishReason::StopString("👍🏽"), false), "你好，世界！🙂");
  EXPECT_EQ(out.Text(FinishReason::StopString("👍🏽"), true), "你好，世界！🙂👍🏽");
  EXPECT_EQ(out.Text(FinishReason::Length(100), false), text);
}

TEST(OutputTextQwen3Test, StopTokenTrimAndSkipSpecialTokens) {
  SLIME_REQUIRE_QWEN3(tok);
  const std::optional<int32_t> im_end = tok->TokenToId("<|im_end|>");
  const std::optional<int32_t> im_start = tok->TokenToId("<|im_start|>");
  ASSERT_TRUE(im_end && im_start);
  Ids ids = tok->Encode("assistant\nHello there");
  ids.insert(ids.begin(), *im_start);
  ids.push_back(*im_end);
  const FinishReason f = FinishReason::Stop(*im_end);

  OutputText kept(tok, Params({}, /*skip_special=*/false));
  FeedAll(&kept, ids);
  EXPECT_EQ(kept.Text(f, false), "<|im_start|>assistant\nHello there");
  EXPECT_EQ(kept.Text(f, true), "<|im_start|>assistant\nHello there<|im_end|>")
      << "slime's setting (no_stop_trim, keep special tokens): the decode of every token";
  EXPECT_EQ(kept.Text(f, true), tok->Decode(ids, false));

  OutputText skipped(tok, Params({}, /*skip_special=*/true));
  FeedAll(&skipped, ids);
  EXPECT_EQ(skipped.Text(f, false), "assistant\nHello there");
  EXPECT_EQ(skipped.Text(f, true), "assistant\nHello there");
}

TEST(OutputTextQwen3Test, FinalTextEqualsDecodeOnTheCorpus) {
  SLIME_REQUIRE_QWEN3(tok);
  std::ifstream corpus(slime::testing::SourceDir() + "/tests/data/tokenizer/corpus.jsonl");
  ASSERT_TRUE(corpus.good()) << "tests/data/tokenizer/corpus.jsonl is committed";
  std::string line;
  int cases = 0;
  while (std::getline(corpus, line)) {
    if (line.empty()) continue;
    const std::string text = nlohmann::json::parse(line)["text"];
    const Ids ids = tok->Encode(text);
    for (bool skip : {false, true}) {
      OutputText out(tok, Params({}, skip));
      FeedAll(&out, ids);
      EXPECT_EQ(out.Text(FinishReason::Length(0), false), tok->Decode(ids, skip, false))
          << "skip_special_tokens=" << skip << " text " << nlohmann::json(text).dump();
    }
    ++cases;
  }
  EXPECT_GT(cases, 50);
}

}  // namespace
}  // namespace slime::engine
