// The real Qwen3 and Llama-3 tokenizers (fetched by scripts/fetch_test_data.sh) against the
// committed reference ids and chat renderings in tests/data/tokenizer/<model>_reference.jsonl,
// produced by scripts/device/make_tokenizer_reference.py with Hugging Face tokenizers and
// transformers. Every mismatch is reported, not only the first. Missing data is a failure that
// says how to fetch it.
#include <map>

#include <gtest/gtest.h>

#include "slime/tokenizer/incremental_decoder.h"
#include "slime/tokenizer/tokenizer.h"
#include "slime/tokenizer/unicode.h"
#include "test_util.h"

namespace slime::tokenizer {
namespace {

using OJson = nlohmann::ordered_json;
using Ids = std::vector<int32_t>;
using ::slime::tokenizer::testing::ReadJsonl;
using ::slime::tokenizer::testing::RealTokenizerDir;
using ::slime::tokenizer::testing::SourceDir;

std::string Show(std::string_view s) { return OJson(std::string(s)).dump(); }

std::string ShowIds(const Ids& ids) { return OJson(ids).dump(); }

class RealTokenizerTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string why;
    const std::string dir = RealTokenizerDir(GetParam(), &why);
    ASSERT_FALSE(dir.empty()) << why;
    auto tok = Tokenizer::FromDirectory(dir);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = std::move(tok).value();
    const std::string data = SourceDir() + "/tests/data/tokenizer/";
    for (const OJson& c : ReadJsonl(data + "corpus.jsonl")) corpus_[c["id"]] = c["text"];
    for (const OJson& c : ReadJsonl(data + "chat_cases.jsonl")) chats_[c["name"]] = c;
    reference_ = ReadJsonl(data + GetParam() + "_reference.jsonl");
    ASSERT_FALSE(reference_.empty());
    ASSERT_TRUE(reference_[0].contains("meta"));
    generator_ = reference_[0]["meta"].value("generator", "?");
  }

  std::unique_ptr<Tokenizer> tok_;
  std::map<std::string, std::string> corpus_;
  std::map<std::string, OJson> chats_;
  std::vector<OJson> reference_;
  std::string generator_;
};

TEST_P(RealTokenizerTest, EncodeMatchesReferenceOnEveryCorpusLine) {
  int cases = 0, identical = 0;
  for (const OJson& ref : reference_) {
    if (!ref.contains("id")) continue;
    ++cases;
    auto it = corpus_.find(ref["id"]);
    ASSERT_NE(it, corpus_.end()) << "reference case " << ref["id"] << " not in corpus.jsonl";
    const Ids want = ref["ids"].get<Ids>();
    const Ids got = tok_->Encode(it->second, /*add_special_tokens=*/false);
    const Ids want_special = ref["ids_special"].get<Ids>();
    const Ids got_special = tok_->Encode(it->second, /*add_special_tokens=*/true);
    EXPECT_EQ(got, want) << GetParam() << " case " << ref["id"] << " text " << Show(it->second)
                         << "\n  got  " << ShowIds(got) << "\n  want " << ShowIds(want);
    EXPECT_EQ(got_special, want_special)
        << GetParam() << " case " << ref["id"] << " (add_special_tokens)";
    if (got == want && got_special == want_special) ++identical;
  }
  EXPECT_EQ(cases, static_cast<int>(corpus_.size())) << "reference does not cover the corpus";
  std::printf("[ %s ] encode: %d/%d corpus cases identical (reference: %s)\n", GetParam().c_str(),
              identical, cases, generator_.c_str());
}

TEST_P(RealTokenizerTest, DecodeMatchesReference) {
  for (const OJson& ref : reference_) {
    if (!ref.contains("id")) continue;
    const Ids ids = ref["ids"].get<Ids>();
    EXPECT_EQ(tok_->Decode(ids, false, false), ref["decoded"].get<std::string>())
        << GetParam() << " case " << ref["id"];
    EXPECT_EQ(tok_->Decode(ids, true, false), ref["decoded_skip"].get<std::string>())
        << GetParam() << " case " << ref["id"] << " (skip_special_tokens)";
    EXPECT_EQ(tok_->Decode(ids), ref["decoded_hf"].get<std::string>())
        << GetParam() << " case " << ref["id"] << " (transformers decode, clean-up "
        << tok_->clean_up_tokenization_spaces() << ")";
  }
}

TEST_P(RealTokenizerTest, ChatTemplateMatchesReference) {
  ASSERT_TRUE(tok_->chat_template().ok()) << tok_->chat_template().status();
  int rendered = 0;
  for (const OJson& ref : reference_) {
    if (!ref.contains("chat")) continue;
    const std::string name = ref["chat"];
    ASSERT_TRUE(chats_.count(name)) << name;
    const OJson& c = chats_[name];
    ChatTemplateOptions options;
    options.add_generation_prompt = c["add_generation_prompt"].get<bool>();
    options.tools = c["tools"];
    options.kwargs = c["kwargs"];
    auto text = tok_->ApplyChatTemplate(c["messages"], options);
    if (ref.contains("error")) {
      EXPECT_FALSE(text.ok()) << name << ": Hugging Face refused (" << ref["error"]
                              << ") but we rendered " << Show(text.ok() ? *text : "");
      continue;
    }
    ++rendered;
    ASSERT_TRUE(text.ok()) << name << ": " << text.status();
    EXPECT_EQ(*text, ref["text"].get<std::string>())
        << GetParam() << " chat " << name << "\n  got  " << Show(*text) << "\n  want "
        << ref["text"];
    EXPECT_EQ(tok_->Encode(*text), ref["ids"].get<Ids>()) << GetParam() << " chat " << name;
  }
  EXPECT_GT(rendered, 0);
}

TEST_P(RealTokenizerTest, IncrementalDecodingEqualsDecodeAndNeverSplitsCharacters) {
  for (const auto& [id, text] : corpus_) {
    const Ids ids = tok_->Encode(text);
    IncrementalDecoder dec(tok_.get());
    std::string streamed;
    for (int32_t token : ids) {
      const std::string piece = dec.Feed(token);
      EXPECT_TRUE(IsValidUtf8(piece)) << id;
      EXPECT_EQ(piece.find("\uFFFD"), std::string::npos) << id << ": replacement char emitted";
      streamed += piece;
    }
    streamed += dec.Flush();
    EXPECT_EQ(streamed, tok_->Decode(ids, false, false)) << id;
  }
}

TEST_P(RealTokenizerTest, RoundTripAndSpecialTokens) {
  const bool nfc = GetParam() == "qwen3";
  for (const auto& [id, text] : corpus_) {
    const std::string expected = nfc ? NormalizeNfc(text) : text;
    EXPECT_EQ(tok_->Decode(tok_->Encode(text), false, false), expected) << id;
  }
  // A multi-byte character split across byte-level tokens (rare CJK) decodes only when whole.
  const Ids rare = tok_->Encode("\U0002A6A5");
  ASSERT_GT(rare.size(), 1u);
  IncrementalDecoder dec(tok_.get());
  for (size_t i = 0; i + 1 < rare.size(); ++i) EXPECT_EQ(dec.Feed(rare[i]), "");
  EXPECT_EQ(dec.Feed(rare.back()), "\U0002A6A5");

  if (GetParam() == "qwen3") {
    EXPECT_EQ(tok_->eos_id(), 151645);
    EXPECT_EQ(tok_->pad_id(), 151643);
    EXPECT_EQ(tok_->bos_id(), std::nullopt);
    EXPECT_EQ(tok_->TokenToId("<think>"), 151667);
    EXPECT_FALSE(tok_->IsSpecial(151667));
    EXPECT_EQ(tok_->vocab_size(), 151669u);
    EXPECT_EQ(tok_->chat_template()->tool_call_format(), ToolCallFormat::kHermes);
  } else {
    EXPECT_EQ(tok_->bos_id(), 128000);
    EXPECT_EQ(tok_->eos_id(), GetParam() == "llama3" ? 128001 : 128009);
    EXPECT_TRUE(tok_->IsSpecial(128009));
    EXPECT_EQ(tok_->vocab_size(), 128256u);
    EXPECT_EQ(tok_->chat_template()->tool_call_format(), ToolCallFormat::kNone);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, RealTokenizerTest,
                         ::testing::Values("qwen3", "llama3", "llama3_1"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace slime::tokenizer
