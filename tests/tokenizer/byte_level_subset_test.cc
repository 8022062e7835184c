// WriteByteLevelSubset on the real Qwen3 and Llama 3 tokenizers (scripts/fetch_test_data.sh) and
// on malformed input; the quickstart's tiny model config must fit the Qwen3 subset.
#include "slime/tokenizer/byte_level_subset.h"

#include <gtest/gtest.h>

#include <fstream>

#include "slime/tokenizer/tokenizer.h"
#include "test_util.h"

namespace slime::tokenizer {
namespace {

using testing::ReadText;
using testing::TempDir;
using testing::WriteText;

class ByteLevelSubsetReal : public ::testing::TestWithParam<std::string> {};

TEST_P(ByteLevelSubsetReal, EncodesBytesKeepsSpecialsAndTemplate) {
  std::string why;
  const std::string dir = testing::RealTokenizerDir(GetParam(), &why);
  ASSERT_FALSE(dir.empty()) << why;
  TempDir out;
  StatusOr<ByteLevelSubsetInfo> info = WriteByteLevelSubset(dir, out.path());
  ASSERT_TRUE(info.ok()) << info.status();
  auto small = Tokenizer::FromDirectory(out.path());
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ((*small)->vocab_size(), static_cast<size_t>(info->vocab_size));
  EXPECT_EQ(info->vocab_size, 256 + static_cast<int64_t>(info->special.size()));

  // Every byte is one token; text round-trips, multi-byte characters included.
  const std::string text = "47+85=132 Größe 数学 \n\n";
  std::vector<int32_t> ids = (*small)->Encode(text);
  EXPECT_EQ(ids.size(), text.size());
  for (int32_t id : ids) EXPECT_LT(id, 256);
  EXPECT_EQ((*small)->Decode(ids), text);

  // Special tokens keep their strings, get ids from 256 on, and are still matched in text.
  for (const auto& [content, id] : info->special) {
    EXPECT_GE(id, 256);
    EXPECT_LT(id, info->vocab_size);
    EXPECT_EQ((*small)->TokenToId(content), std::optional<int32_t>(id)) << content;
  }
  const std::string eos = (*small)->eos_token();
  EXPECT_EQ(eos, nlohmann::json::parse(ReadText(dir + "/tokenizer_config.json")).at("eos_token").get<std::string>());
  ASSERT_TRUE(info->special.count(eos)) << eos;
  std::vector<int32_t> with_eos = (*small)->Encode("7" + eos);
  EXPECT_EQ(with_eos, (std::vector<int32_t>{*(*small)->TokenToId("7"), static_cast<int32_t>(info->special.at(eos))}));

  // The chat template is kept: a rendered prompt encodes its special tokens as single ids and
  // decodes back to the same text. (Loading the full tokenizer to compare costs ~10 s here.)
  const nlohmann::ordered_json messages = {{{"role", "user"}, {"content", "3+4="}}};
  ChatTemplateOptions options;
  options.add_generation_prompt = true;
  auto b = (*small)->ApplyChatTemplate(messages, options);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE(b->find("3+4="), std::string::npos) << *b;
  std::vector<int32_t> prompt = (*small)->Encode(*b);
  EXPECT_LT(prompt.size(), b->size()) << "special tokens are single ids";
  EXPECT_EQ((*small)->Decode(prompt), *b);
}

INSTANTIATE_TEST_SUITE_P(RealTokenizers, ByteLevelSubsetReal, ::testing::Values("qwen3", "llama3"));

// configs/tiny-model/config.json is the quickstart's model over the Qwen3 subset
// (scripts/warm_start.sh): its vocabulary must hold every id and name the same BOS/EOS.
TEST(ByteLevelSubset, TinyModelConfigFitsTheQwen3Subset) {
  std::string why;
  const std::string dir = testing::RealTokenizerDir("qwen3", &why);
  ASSERT_FALSE(dir.empty()) << why;
  TempDir out;
  StatusOr<ByteLevelSubsetInfo> info = WriteByteLevelSubset(dir, out.path());
  ASSERT_TRUE(info.ok()) << info.status();
  const auto config =
      nlohmann::json::parse(ReadText(testing::SourceDir() + "/configs/tiny-model/config.json"));
  EXPECT_GE(config.at("vocab_size").get<int64_t>(), info->vocab_size);
  EXPECT_EQ(config.at("bos_token_id").get<int64_t>(), info->special.at("<|endoftext|>"));
  EXPECT_EQ(config.at("eos_token_id").get<int64_t>(), info->special.at("<|im_end|>"));
}

TEST(ByteLevelSubset, RejectsWhatIsNotAByteLevelBpe) {
  TempDir in, out;
  nlohmann::json tok = testing::TinyByteLevelTokenizerJson();
  WriteText(in.File("tokenizer_config.json"), "{}");

  nlohmann::json no_byte_level = tok;
  no_byte_level["pre_tokenizer"] = {{"type", "Whitespace"}};
  WriteText(in.File("tokenizer.json"), no_byte_level.dump());
  auto r = WriteByteLevelSubset(in.path(), out.path());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("ByteLevel"), std::string::npos) << r.status();

  nlohmann::json missing_byte = tok;
  missing_byte["model"]["vocab"].erase("A");
  WriteText(in.File("tokenizer.json"), missing_byte.dump());
  r = WriteByteLevelSubset(in.path(), out.path());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("0x41"), std::string::npos) << r.status();

  nlohmann::json word_level = tok;
  word_level["model"]["type"] = "WordLevel";
  WriteText(in.File("tokenizer.json"), word_level.dump());
  r = WriteByteLevelSubset(in.path(), out.path());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("BPE"), std::string::npos) << r.status();

  WriteText(in.File("tokenizer.json"), tok.dump());
  WriteText(in.File("tokenizer_config.json"), R"({"added_tokens_decoder": {"999": {}}})");
  r = WriteByteLevelSubset(in.path(), out.path());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'999'"), std::string::npos) << r.status();

  WriteText(in.File("tokenizer.json"), "{not json");
  r = WriteByteLevelSubset(in.path(), out.path());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("tokenizer.json"), std::string::npos) << r.status();
  EXPECT_FALSE(std::ifstream(out.File("tokenizer.json")).good()) << "nothing written on error";
}

TEST(ByteLevelSubset, RemapsTheTinyTokenizersAddedTokensAndTemplateIds) {
  TempDir in, out;
  WriteText(in.File("tokenizer.json"), testing::TinyByteLevelTokenizerJson().dump());
  WriteText(in.File("tokenizer_config.json"),
            R"({"added_tokens_decoder": {"300": {"content": "<|end|>", "special": true}}})");
  auto info = WriteByteLevelSubset(in.path(), out.path());
  ASSERT_TRUE(info.ok()) << info.status();
  // Added tokens 300..303 become 256..259; the merges are gone.
  EXPECT_EQ(info->vocab_size, 260);
  EXPECT_EQ(info->special.at("<|end|>"), 256);
  EXPECT_EQ(info->special.at("<s>"), 259);
  const auto tok = nlohmann::json::parse(ReadText(out.File("tokenizer.json")));
  EXPECT_TRUE(tok["model"]["merges"].empty());
  EXPECT_EQ(tok["model"]["vocab"].size(), 256u);
  const auto cfg = nlohmann::json::parse(ReadText(out.File("tokenizer_config.json")));
  EXPECT_TRUE(cfg["added_tokens_decoder"].contains("256"));
  auto small = Tokenizer::FromDirectory(out.path());
  ASSERT_TRUE(small.ok()) << small.status();
  // The post-processor's "<s>" now carries the new id.
  std::vector<int32_t> ids = (*small)->Encode("hello", /*add_special_tokens=*/true);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), 259);
  EXPECT_EQ(ids.size(), 6u);
}

}  // namespace
}  // namespace slime::tokenizer
