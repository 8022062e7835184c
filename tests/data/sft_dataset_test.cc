// Tests of the SFT dataset (token ids and loss masks from chat JSONL) and of EpochSampler.
//
// Two tokenizers: a tiny one built in memory (tests/support/byte_tokenizer.h; always available;
// every byte is one token, plus the merge "\n\n" and the ChatML / Llama-3 special tokens, so
// expected ids can be written out by hand), and the real Qwen3 tokenizer from
// scripts/fetch_test_data.sh (those tests skip with a message when it is missing).
#include "slime/data/sft_dataset.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "byte_tokenizer.h"
#include "slime/tokenizer/tokenizer.h"
#include "test_paths.h"

namespace slime::data {
namespace {

using OJson = nlohmann::ordered_json;
using tokenizer::Tokenizer;

// ---- Tokenizers ------------------------------------------------------------------------------

// Ids of the tiny tokenizer: 0..255 are the bytes, then these.
constexpr int32_t kNN = 256;           // "\n\n" (the only merge)
constexpr int32_t kImStart = 257;      // <|im_start|>   special
constexpr int32_t kImEnd = 258;        // <|im_end|>     special
constexpr int32_t kThink = 259;        // <think>        added, not special (as in Qwen3)
constexpr int32_t kThinkEnd = 260;     // </think>       added, not special
constexpr int32_t kHeaderStart = 261;  // <|start_header_id|>
constexpr int32_t kHeaderEnd = 262;    // <|end_header_id|>
constexpr int32_t kEot = 263;          // <|eot_id|>
constexpr int32_t kBot = 264;          // <|begin_of_text|>

// Chat templates: Qwen3's own (tests/data/tokenizer/qwen3_chat_template.jinja, as shipped with
// the model), a ChatML template without a default system prompt, and Llama-3-Instruct's.
std::string Qwen3Template() {
  std::ifstream in(slime::testing::SourceDir() + "/tests/data/tokenizer/qwen3_chat_template.jinja");
  std::stringstream s;
  s << in.rdbuf();
  EXPECT_FALSE(s.str().empty()) << "tests/data/tokenizer/qwen3_chat_template.jinja missing";
  return s.str();
}
constexpr char kChatMlTemplate[] =
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}";
constexpr char kLlama3Template[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";

// The tiny tokenizer (tests/support/byte_tokenizer.h, with the Qwen2-style split pre-tokenizer)
// with `chat_template` ("" for none).
std::unique_ptr<Tokenizer> TinyTokenizer(const std::string& chat_template) {
  slime::testing::ByteTokenizerOptions options;
  options.pre_tokenizer = slime::testing::ByteTokenizerOptions::PreTokenizer::kSplitThenBytes;
  options.merges = {"\n\n"};  // kNN
  options.added_tokens = {{kImStart, "<|im_start|>"},
                          {kImEnd, "<|im_end|>"},
                          {kThink, "<think>", false},
                          {kThinkEnd, "</think>", false},
                          {kHeaderStart, "<|start_header_id|>"},
                          {kHeaderEnd, "<|end_header_id|>"},
                          {kEot, "<|eot_id|>"},
                          {kBot, "<|begin_of_text|>"}};
  nlohmann::json config{{"bos_token", "<|begin_of_text|>"}, {"eos_token", "<|im_end|>"}};
  if (!chat_template.empty()) config["chat_template"] = chat_template;
  auto tok = Tokenizer::FromJsonText(slime::testing::ByteTokenizerJson(options), config.dump(),
                                     "tiny-tokenizer");
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? std::move(tok).value() : nullptr;
}

using slime::testing::SourceDir;

// The real Qwen3 tokenizer (loaded once), or nullptr and `*why`.
const Tokenizer* Qwen3(std::string* why) {
  static std::string reason;
  static std::unique_ptr<Tokenizer> tok = [] {
    const char* env = std::getenv("SLIME_TEST_DATA");
    const std::string data =
        (env != nullptr && *env != '\0') ? env : SourceDir() + "/.cache/testdata";
    const std::string dir = data + "/qwen3";
    if (!std::filesystem::exists(dir + "/tokenizer.json")) {
      reason = "missing " + dir +
               "/tokenizer.json: run scripts/fetch_test_data.sh (or point "
               "SLIME_TEST_DATA at a directory that holds qwen3/)";
      return std::unique_ptr<Tokenizer>();
    }
    auto t = Tokenizer::FromDirectory(dir);
    if (!t.ok()) {
      reason = std::string(t.status().message());
      return std::unique_ptr<Tokenizer>();
    }
    return std::move(t).value();
  }();
  *why = reason;
  return tok.get();
}

#define REQUIRE_QWEN3(var)                   \
  std::string qwen3_why_;                    \
  const Tokenizer* var = Qwen3(&qwen3_why_); \
  if (var == nullptr) GTEST_SKIP() << qwen3_why_

// ---- Helpers ---------------------------------------------------------------------------------

// Byte ids of ASCII text (the tiny tokenizer without the "\n\n" merge).
std::vector<int32_t> B(std::string_view text) {
  std::vector<int32_t> ids;
  for (char c : text) ids.push_back(static_cast<uint8_t>(c));
  return ids;
}

// Builds expected (tokens, mask) from runs of ids that share one mask value.
struct Expected {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
  Expected& Add(const std::vector<int32_t>& ids, uint8_t m) {
    for (int32_t id : ids) {
      tokens.push_back(id);
      mask.push_back(m);
    }
    return *this;
  }
};

OJson Msg(const char* role, const char* content) {
  return OJson{{"role", role}, {"content", content}};
}

OJson TwoTurn() {
  return OJson::array(
      {Msg("user", "Hi"), Msg("assistant", "Yo"), Msg("user", "Ok?"), Msg("assistant", "Sure")});
}

std::string Line(const OJson& messages) { return OJson{{"messages", messages}}.dump(); }

// Rendering of `messages` without generation prompt.
std::string Render(const Tokenizer& tok, const OJson& messages, const OJson& kwargs = {}) {
  tokenizer::ChatTemplateOptions o;
  if (!kwargs.is_null()) o.kwargs = kwargs;
  auto text = tok.ApplyChatTemplate(messages, o);
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? *text : "";
}

// The decoded text of the tokens whose mask is `m`, runs joined by "|".
std::string MaskedText(const Tokenizer& tok, const SftSample& s, uint8_t m) {
  std::string out;
  std::vector<int32_t> run;
  auto flush = [&] {
    if (run.empty()) return;
    if (!out.empty()) out += "|";
    out += tok.Decode(run);
    run.clear();
  };
  for (size_t t = 0; t < s.tokens.size(); ++t) {
    if (s.loss_mask[t] == m) {
      run.push_back(s.tokens[t]);
    } else {
      flush();
    }
  }
  flush();
  return out;
}

// ---- Exact masks, tiny tokenizer --------------------------------------------------------------

TEST(SftTiny, TwoTurnChatMlExactMask) {
  auto tok = TinyTokenizer(kChatMlTemplate);
  ASSERT_NE(tok, nullptr);
  // Rendered (qwen2 ChatML, no default system prompt):
  //   <|im_start|>user\nHi<|im_end|>\n
  //   <|im_start|>assistant\nYo<|im_end|>\n
  //   <|im_start|>user\nOk?<|im_end|>\n
  //   <|im_start|>assistant\nSure<|im_end|>\n
  // Each rendering of messages[0..i] extends the previous one: one sample. Trained: each
  // assistant's content and <|im_end|>; not its header, not the "\n" after <|im_end|>.
  Expected e;
  e.Add({kImStart}, 0).Add(B("user\nHi"), 0).Add({kImEnd}, 0).Add(B("\n"), 0);
  e.Add({kImStart}, 0).Add(B("assistant\n"), 0);
  e.Add(B("Yo"), 1).Add({kImEnd}, 1);
  e.Add(B("\n"), 0);
  e.Add({kImStart}, 0).Add(B("user\nOk?"), 0).Add({kImEnd}, 0).Add(B("\n"), 0);
  e.Add({kImStart}, 0).Add(B("assistant\n"), 0);
  e.Add(B("Sure"), 1).Add({kImEnd}, 1);
  e.Add(B("\n"), 0);

  SftDatasetOptions options;
  auto conv = TokenizeConversation(TwoTurn(), nullptr, *tok, options);
  ASSERT_TRUE(conv.ok()) << conv.status();
  EXPECT_FALSE(conv->split);
  EXPECT_FALSE(conv->drifted);
  ASSERT_EQ(conv->samples.size(), 1u);
  const SftSample& s = conv->samples[0];
  EXPECT_EQ(s.tokens, e.tokens);
  EXPECT_EQ(s.loss_mask, e.mask);
  EXPECT_EQ(s.turn, -1);
  // Incremental == full: the sample is the tokenization of the whole rendering.
  EXPECT_EQ(s.tokens, tok->Encode(Render(*tok, TwoTurn())));
  // Prompt/response view: the response starts at "Yo".
  EXPECT_EQ(s.PromptLength(), 10 + 11);
  EXPECT_EQ(s.ResponseLength(), static_cast<int64_t>(s.tokens.size()) - 21);
  EXPECT_EQ(s.NumTrainedTokens(), 3 + 5);
}

TEST(SftTiny, Qwen3SingleTurnTrainsTheThinkBlock) {
  auto tok = TinyTokenizer(Qwen3Template());
  ASSERT_NE(tok, nullptr);
  // <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nYo<|im_end|>\n
  // The generation prompt is "<|im_start|>assistant\n"; the empty think block the template puts
  // into the (final) turn is part of what the model generates, so it is trained.
  Expected e;
  e.Add({kImStart}, 0).Add(B("user\nHi"), 0).Add({kImEnd}, 0).Add(B("\n"), 0);
  e.Add({kImStart}, 0).Add(B("assistant\n"), 0);
  e.Add({kThink, kNN, kThinkEnd, kNN}, 1).Add(B("Yo"), 1).Add({kImEnd}, 1);
  e.Add(B("\n"), 0);
  const OJson messages = OJson::array({Msg("user", "Hi"), Msg("assistant", "Yo")});
  auto conv = TokenizeConversation(messages, nullptr, *tok, SftDatasetOptions());
  ASSERT_TRUE(conv.ok()) << conv.status();
  ASSERT_EQ(conv->samples.size(), 1u);
  EXPECT_FALSE(conv->split);
  EXPECT_EQ(conv->samples[0].tokens, e.tokens);
  EXPECT_EQ(conv->samples[0].loss_mask, e.mask);
}

TEST(SftTiny, Qwen3EnableThinkingFalsePutsTheEmptyThinkBlockInThePrompt) {
  auto tok = TinyTokenizer(Qwen3Template());
  ASSERT_NE(tok, nullptr);
  // Same text as above, but the generation prompt now ends with "<think>\n\n</think>\n\n"
  // (the engine sends it as part of the prompt), so those tokens are 0.
  Expected e;
  e.Add({kImStart}, 0).Add(B("user\nHi"), 0).Add({kImEnd}, 0).Add(B("\n"), 0);
  e.Add({kImStart}, 0).Add(B("assistant\n"), 0).Add({kThink, kNN, kThinkEnd, kNN}, 0);
  e.Add(B("Yo"), 1).Add({kImEnd}, 1);
  e.Add(B("\n"), 0);
  SftDatasetOptions options;
  options.template_options.kwargs = OJson{{"enable_thinking", false}};
  const OJson messages = OJson::array({Msg("user", "Hi"), Msg("assistant", "Yo")});
  auto conv = TokenizeConversation(messages, nullptr, *tok, options);
  ASSERT_TRUE(conv.ok()) << conv.status();
  ASSERT_EQ(conv->samples.size(), 1u);
  EXPECT_EQ(conv->samples[0].tokens, e.tokens);
  EXPECT_EQ(conv->samples[0].loss_mask, e.mask);

  // Reasoning in a turn while thinking is disabled contradicts the generation prompt.
  OJson reasoning = messages;
  reasoning[1]["reasoning_content"] = "because";
  auto bad = TokenizeConversation(reasoning, nullptr, *tok, options);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("messages[1]: the rendered turn does not start with the "
                                        "template's generation prompt"),
            std::string::npos)
      << bad.status();
}

TEST(SftTiny, Qwen3TwoTurnSplitsIntoOneSamplePerTurn) {
  auto tok = TinyTokenizer(Qwen3Template());
  ASSERT_NE(tok, nullptr);
  // messages[0..1] renders the first answer with the empty think block (it is the final turn);
  // messages[0..2] renders it without (a later user query exists). Not a prefix: split.
  // Sample for turn 1 = messages[0..1]:
  //   <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nYo<|im_end|>\n
  // Sample for turn 3 = messages[0..3]:
  //   <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nYo<|im_end|>\n
  //   <|im_start|>user\nOk?<|im_end|>\n
  //   <|im_start|>assistant\n<think>\n\n</think>\n\nSure<|im_end|>\n
  Expected first;
  first.Add({kImStart}, 0).Add(B("user\nHi"), 0).Add({kImEnd}, 0).Add(B("\n"), 0);
  first.Add({kImStart}, 0).Add(B("assistant\n"), 0);
  first.Add({kThink, kNN, kThinkEnd, kNN}, 1).Add(B("Yo"), 1).Add({kImEnd}, 1);
  first.Add(B("\n"), 0);
  Expected second;
  second.Add({kImStart}, 0).Add(B("user\nHi"), 0).Add({kImEnd}, 0).Add(B("\n"), 0);
  second.Add({kImStart}, 0).Add(B("assistant\nYo"), 0).Add({kImEnd}, 0).Add(B("\n"), 0);
  second.Add({kImStart}, 0).Add(B("user\nOk?"), 0).Add({kImEnd}, 0).Add(B("\n"), 0);
  second.Add({kImStart}, 0).Add(B("assistant\n"), 0);
  second.Add({kThink, kNN, kThinkEnd, kNN}, 1).Add(B("Sure"), 1).Add({kImEnd}, 1);
  second.Add(B("\n"), 0);

  auto conv = TokenizeConversation(TwoTurn(), nullptr, *tok, SftDatasetOptions());
  ASSERT_TRUE(conv.ok()) << conv.status();
  EXPECT_TRUE(conv->split);
  ASSERT_EQ(conv->samples.size(), 2u);
  EXPECT_EQ(conv->samples[0].turn, 1);
  EXPECT_EQ(conv->samples[0].tokens, first.tokens);
  EXPECT_EQ(conv->samples[0].loss_mask, first.mask);
  EXPECT_EQ(conv->samples[1].turn, 3);
  EXPECT_EQ(conv->samples[1].tokens, second.tokens);
  EXPECT_EQ(conv->samples[1].loss_mask, second.mask);
  EXPECT_EQ(conv->samples[1].tokens, tok->Encode(Render(*tok, TwoTurn())));

  // With the unstable policy "fail" the conversation is an error naming the message.
  SftDatasetOptions strict;
  strict.unstable = SftUnstablePolicy::kFail;
  auto bad = TokenizeConversation(TwoTurn(), nullptr, *tok, strict);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("messages[2]: appending this message re-renders"),
            std::string::npos)
      << bad.status();
}

TEST(SftTiny, Llama3MasksThroughEotId) {
  auto tok = TinyTokenizer(kLlama3Template);
  ASSERT_NE(tok, nullptr);
  // <|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>
  // <|start_header_id|>assistant<|end_header_id|>\n\nYo<|eot_id|>
  Expected e;
  e.Add({kBot, kHeaderStart}, 0).Add(B("user"), 0).Add({kHeaderEnd, kNN}, 0).Add(B("Hi"), 0);
  e.Add({kEot, kHeaderStart}, 0).Add(B("assistant"), 0).Add({kHeaderEnd, kNN}, 0);
  e.Add(B("Yo"), 1).Add({kEot}, 1);
  const OJson messages = OJson::array({Msg("user", "Hi"), Msg("assistant", "Yo")});
  auto conv = TokenizeConversation(messages, nullptr, *tok, SftDatasetOptions());
  ASSERT_TRUE(conv.ok()) << conv.status();
  ASSERT_EQ(conv->samples.size(), 1u);
  EXPECT_EQ(conv->samples[0].tokens, e.tokens);
  EXPECT_EQ(conv->samples[0].loss_mask, e.mask);
}

TEST(SftTiny, LossOverridesPerMessage) {
  auto tok = TinyTokenizer(kChatMlTemplate);
  ASSERT_NE(tok, nullptr);
  // loss: true on the user message trains its content and <|im_end|> (its header
  // "<|im_start|>user\n" stays 0); loss: 0 and step_loss_mask: 0 turn assistants off.
  OJson messages = TwoTurn();
  messages[0]["loss"] = true;
  messages[1]["loss"] = 0;
  messages[3]["step_loss_mask"] = 0;
  Expected e;
  e.Add({kImStart}, 0).Add(B("user\n"), 0).Add(B("Hi"), 1).Add({kImEnd}, 1).Add(B("\n"), 0);
  e.Add({kImStart}, 0).Add(B("assistant\nYo"), 0).Add({kImEnd}, 0).Add(B("\n"), 0);
  e.Add({kImStart}, 0).Add(B("user\nOk?"), 0).Add({kImEnd}, 0).Add(B("\n"), 0);
  e.Add({kImStart}, 0).Add(B("assistant\nSure"), 0).Add({kImEnd}, 0).Add(B("\n"), 0);
  auto conv = TokenizeConversation(messages, nullptr, *tok, SftDatasetOptions());
  ASSERT_TRUE(conv.ok()) << conv.status();
  ASSERT_EQ(conv->samples.size(), 1u);
  EXPECT_EQ(conv->samples[0].tokens, e.tokens);
  EXPECT_EQ(conv->samples[0].loss_mask, e.mask);

  // Nothing trained: the loader skips the line and counts it.
  OJson none = TwoTurn();
  none[1]["loss"] = false;
  none[3]["loss"] = false;
  auto data = ParseSftJsonl(Line(none) + "\n" + Line(TwoTurn()) + "\n", "t.jsonl", *tok,
                            SftDatasetOptions());
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->samples.size(), 1u);
  EXPECT_EQ(data->samples[0].line, 2);
  EXPECT_EQ(data->stats.no_trained_token, 1);
}

TEST(SftTiny, RetokenizationDriftIsDetected) {
  auto tok = TinyTokenizer(kChatMlTemplate);
  ASSERT_NE(tok, nullptr);
  // "<|im_start|>assistant\n" + "\nYo": the whole text merges the two newlines into one token,
  // the pieces (header | content) do not.
  const OJson messages = OJson::array({Msg("user", "Hi"), Msg("assistant", "\nYo")});
  auto kept = TokenizeConversation(messages, nullptr, *tok, SftDatasetOptions());
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_TRUE(kept->drifted);
  Expected e;
  e.Add({kImStart}, 0).Add(B("user\nHi"), 0).Add({kImEnd}, 0).Add(B("\n"), 0);
  e.Add({kImStart}, 0).Add(B("assistant\n"), 0);
  e.Add(B("\nYo"), 1).Add({kImEnd}, 1);
  e.Add(B("\n"), 0);
  EXPECT_EQ(kept->samples[0].tokens, e.tokens);
  EXPECT_EQ(kept->samples[0].loss_mask, e.mask);
  EXPECT_NE(kept->samples[0].tokens, tok->Encode(Render(*tok, messages)));

  SftDatasetOptions strict;
  strict.drift = SftDriftPolicy::kFail;
  auto bad = TokenizeConversation(messages, nullptr, *tok, strict);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("messages[1]: re-tokenization drift: tokenized piece by "
                                        "piece, token 20 is 10 where the whole conversation "
                                        "gives 256"),
            std::string::npos)
      << bad.status();

  auto data = ParseSftJsonl(Line(messages), "d.jsonl", *tok, SftDatasetOptions());
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->stats.drifted, 1);
}

TEST(SftTiny, ToolConversationWithQwen3Splits) {
  auto tok = TinyTokenizer(Qwen3Template());
  ASSERT_NE(tok, nullptr);
  const OJson tools =
      OJson::parse(R"([{"type": "function", "function": {"name": "add", "parameters": {}}}])");
  OJson messages = OJson::array(
      {Msg("user", "Add 1 and 2."),
       OJson{{"role", "assistant"},
             {"content", ""},
             {"tool_calls", OJson::parse(R"([{"function": {"name": "add", "arguments": {"a": 1,
               "b": 2}}}])")}},
       Msg("tool", "3"), Msg("assistant", "It is 3.")});
  auto conv = TokenizeConversation(messages, tools, *tok, SftDatasetOptions());
  ASSERT_TRUE(conv.ok()) << conv.status();
  EXPECT_TRUE(conv->split);
  ASSERT_EQ(conv->samples.size(), 2u);
  tokenizer::ChatTemplateOptions o;
  o.tools = tools;
  for (const SftSample& s : conv->samples) {
    OJson prefix = OJson::array();
    for (int k = 0; k <= s.turn; ++k) prefix.push_back(messages[k]);
    auto text = tok->ApplyChatTemplate(prefix, o);
    ASSERT_TRUE(text.ok()) << text.status();
    EXPECT_EQ(s.tokens, tok->Encode(*text)) << "turn " << s.turn;
  }
  EXPECT_EQ(MaskedText(*tok, conv->samples[0], 1),
            "<think>\n\n</think>\n\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, "
            "\"b\": 2}}\n</tool_call><|im_end|>");
  EXPECT_EQ(MaskedText(*tok, conv->samples[1], 1), "<think>\n\n</think>\n\nIt is 3.<|im_end|>");
}

// ---- Truncation ------------------------------------------------------------------------------

TEST(SftTiny, TruncateOrDropOverlongSamples) {
  auto tok = TinyTokenizer(kChatMlTemplate);
  ASSERT_NE(tok, nullptr);
  const std::string text = Line(TwoTurn()) + "\n";  // 53 tokens, first trained token at 21
  SftDatasetOptions options;
  options.max_length = 23;  // keeps "Yo" of the first answer
  auto cut = ParseSftJsonl(text, "t.jsonl", *tok, options);
  ASSERT_TRUE(cut.ok()) << cut.status();
  ASSERT_EQ(cut->samples.size(), 1u);
  const SftSample& s = cut->samples[0];
  EXPECT_TRUE(s.truncated);
  EXPECT_EQ(s.tokens.size(), 23u);
  EXPECT_EQ(s.loss_mask.size(), 23u);
  EXPECT_EQ(s.NumTrainedTokens(), 2);
  EXPECT_EQ(cut->stats.truncated, 1);

  options.max_length = 21;  // nothing trained is left: skipped and counted, then no samples
  auto empty = ParseSftJsonl(text, "t.jsonl", *tok, options);
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("t.jsonl: no SFT samples (1 lines: 0 bad, 1 samples "
                                          "without a trained token"),
            std::string::npos)
      << empty.status();

  options.max_length = 23;
  options.overlong = SftOverlongPolicy::kDrop;
  auto dropped = ParseSftJsonl(text + Line(OJson::array({Msg("user", "a"), Msg("assistant", "b")})),
                               "t.jsonl", *tok, options);
  ASSERT_TRUE(dropped.ok()) << dropped.status();
  ASSERT_EQ(dropped->samples.size(), 1u);
  EXPECT_EQ(dropped->samples[0].line, 2);
  EXPECT_FALSE(dropped->samples[0].truncated);
  EXPECT_EQ(dropped->stats.overlong_dropped, 1);

  options.max_length = 0;  // no limit
  auto all = ParseSftJsonl(text, "t.jsonl", *tok, options);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->samples[0].tokens.size(), 53u);
}

// ---- Bad input -------------------------------------------------------------------------------

struct BadLine {
  std::string line;
  std::string error;  // expected after "bad.jsonl:2: "
};

std::vector<BadLine> BadLines() {
  const std::string ok_user = R"({"role": "user", "content": "Hi"})";
  return {
      {R"({"messages": [)", "malformed JSON: "},
      {R"([1, 2])", "expected a JSON object with \"messages\", got array"},
      {R"({"msgs": []})", "missing \"messages\""},
      {R"({"messages": "hi"})", "\"messages\": expected an array of"},
      {R"({"messages": []})", "\"messages\": the conversation is empty"},
      {R"({"messages": ["hi"]})", "messages[0]: expected an object"},
      {R"({"messages": [{"content": "x"}]})", "messages[0].role: missing"},
      {R"({"messages": [{"role": 1, "content": "x"}]})",
       "messages[0].role: expected a string, got number"},
      {R"({"messages": [{"role": "bot", "content": "x"}]})",
       "messages[0].role: unknown role \"bot\" (expected system, user, assistant or tool)"},
      {R"({"messages": [{"role": "user", "content": ["x"]}]})",
       "messages[0].content: expected a string or null, got array"},
      {R"({"messages": [{"role": "user"}]})", "messages[0].content: missing"},
      {R"({"messages": [)" + ok_user +
           R"(, {"role": "assistant", "content": "x", "loss": "yes"}]})",
       "messages[1].loss: expected true, false, 0 or 1, got \"yes\""},
      {R"({"messages": [)" + ok_user + R"(, {"role": "assistant", "content": "x", "loss": 2}]})",
       "messages[1].loss: expected true, false, 0 or 1, got 2"},
      {R"({"messages": [)" + ok_user +
           R"(, {"role": "assistant", "content": "x", "loss": 1, "step_loss_mask": 0}]})",
       "messages[1]: \"loss\" and \"step_loss_mask\" disagree"},
      {R"({"tools": 5, "messages": [)" + ok_user + "]}",
       "\"tools\": expected an array of tool definitions, got number"},
      {R"({"tools": "[oops", "messages": [)" + ok_user + "]}",
       "\"tools\": a string that is not JSON"},
      {R"({"messages": [{"role": "assistant", "content": "x"}]})",
       "messages[0]: a trained assistant message needs a message before it"},
      // Errors of the chat template itself come through with the template line (Qwen3's
      // template pipes the missing arguments to tojson).
      {R"({"messages": [)" + ok_user +
           R"(, {"role": "assistant", "content": "", "tool_calls": [{"function": {}}]}]})",
       "chat template line 62: 'dict object' has no attribute 'arguments'"},
  };
}

TEST(SftTiny, EachBadLineFailsNamingFileLineAndField) {
  auto tok = TinyTokenizer(Qwen3Template());
  ASSERT_NE(tok, nullptr);
  const std::string good = Line(OJson::array({Msg("user", "Hi"), Msg("assistant", "Yo")}));
  for (const BadLine& b : BadLines()) {
    auto data = ParseSftJsonl(good + "\n" + b.line + "\n" + good + "\n", "bad.jsonl", *tok,
                              SftDatasetOptions());
    ASSERT_FALSE(data.ok()) << b.line;
    EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string want = "bad.jsonl:2: " + b.error;
    EXPECT_EQ(std::string(data.status().message()).rfind(want, 0), 0u)
        << "line: " << b.line << "\nwant prefix: " << want << "\ngot: " << data.status();
  }
}

TEST(SftTiny, BadLinesAreSkippedAndCounted) {
  auto tok = TinyTokenizer(Qwen3Template());
  ASSERT_NE(tok, nullptr);
  const std::string good = Line(OJson::array({Msg("user", "Hi"), Msg("assistant", "Yo")}));
  std::string text = good + "\n\n   \n";  // blank lines are not lines of data
  const std::vector<BadLine> bad = BadLines();
  for (const BadLine& b : bad) text += b.line + "\r\n";
  text += good;  // no final newline
  SftDatasetOptions options;
  options.bad_line = SftBadLinePolicy::kSkip;
  options.max_logged_bad_lines = 2;
  auto data = ParseSftJsonl(text, "bad.jsonl", *tok, options);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->stats.bad_lines, static_cast<int64_t>(bad.size()));
  EXPECT_EQ(data->stats.lines, static_cast<int64_t>(bad.size()) + 2);
  ASSERT_EQ(data->samples.size(), 2u);
  EXPECT_EQ(data->samples[0].line, 1);
  EXPECT_EQ(data->samples[1].line, static_cast<int64_t>(bad.size()) + 4);
  EXPECT_EQ(data->samples[0].tokens, data->samples[1].tokens);

  // Only bad lines: an error with the counts.
  auto none = ParseSftJsonl(bad[0].line, "bad.jsonl", *tok, options);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("no SFT samples (1 lines: 1 bad"), std::string::npos);
}

TEST(SftTiny, SetupErrors) {
  auto tok = TinyTokenizer(kChatMlTemplate);
  ASSERT_NE(tok, nullptr);
  auto missing = LoadSftDataset("/nonexistent/sft.jsonl", *tok, SftDatasetOptions());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/nonexistent/sft.jsonl"), std::string::npos);

  auto no_template = TinyTokenizer("");
  ASSERT_NE(no_template, nullptr);
  auto r = ParseSftJsonl("", "x.jsonl", *no_template, SftDatasetOptions());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("x.jsonl: the tokenizer tiny-tokenizer has no usable chat "
                                      "template"),
            std::string::npos)
      << r.status();

  SftDatasetOptions options;
  options.max_length = -1;
  EXPECT_FALSE(options.Validate().ok());
  EXPECT_FALSE(ParseSftJsonl("", "x.jsonl", *tok, options).ok());
  options = SftDatasetOptions();
  options.messages_key = "";
  EXPECT_FALSE(options.Validate().ok());
  options = SftDatasetOptions();
  options.template_options.tools = "x";
  EXPECT_FALSE(options.Validate().ok());
}

TEST(SftTiny, MessagesKeyIsConfigurable) {
  auto tok = TinyTokenizer(kChatMlTemplate);
  ASSERT_NE(tok, nullptr);
  SftDatasetOptions options;
  options.messages_key = "conversation";
  const OJson row{{"conversation", OJson::array({Msg("user", "Hi"), Msg("assistant", "Yo")})}};
  auto data = ParseSftJsonl(row.dump(), "k.jsonl", *tok, options);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->samples.size(), 1u);
  auto bad = ParseSftJsonl(Line(OJson::array({Msg("bot", "Hi")})), "k.jsonl", *tok, options);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("k.jsonl:1: missing \"conversation\""), std::string::npos);
  const OJson bad_role{{"conversation", OJson::array({Msg("bot", "Hi")})}};
  bad = ParseSftJsonl(bad_role.dump(), "k.jsonl", *tok, options);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("k.jsonl:1: conversation[0].role: unknown role"),
            std::string::npos);
}

TEST(SftTiny, SampleFileLoads) {
  auto tok = TinyTokenizer(Qwen3Template());
  ASSERT_NE(tok, nullptr);
  const std::string path = SourceDir() + "/tests/data/sft/chat.jsonl";
  auto data = LoadSftDataset(path, *tok, SftDatasetOptions());
  ASSERT_TRUE(data.ok()) << data.status();
  // Lines 1 and 4 are single-turn; 2 and 5 split into 2 samples; 3 trains only its last answer
  // (its first one is loss: false) and still splits (the first answer is re-rendered).
  EXPECT_EQ(data->stats.lines, 5);
  EXPECT_EQ(data->stats.bad_lines, 0);
  EXPECT_EQ(data->stats.split_lines, 3);
  ASSERT_EQ(data->samples.size(), 7u);
  std::vector<int64_t> lines;
  for (const SftSample& s : data->samples) {
    lines.push_back(s.line);
    EXPECT_EQ(s.loss_mask[0], 0);
    EXPECT_GT(s.NumTrainedTokens(), 0);
  }
  EXPECT_EQ(lines, (std::vector<int64_t>{1, 2, 2, 3, 4, 5, 5}));
  // Line 4 trains its reasoning.
  EXPECT_EQ(MaskedText(*tok, data->samples[4], 1),
            "<think>\n91 = 7 * 13.\n</think>\n\nNo.<|im_end|>");
}

// ---- Real Qwen3 tokenizer --------------------------------------------------------------------

TEST(SftQwen3, SingleTurnExactIds) {
  REQUIRE_QWEN3(tok);
  // <|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n
  // <|im_start|>assistant\n<think>\n\n</think>\n\nHello!<|im_end|>\n
  const OJson messages =
      OJson::array({Msg("system", "Be brief."), Msg("user", "Hi"), Msg("assistant", "Hello!")});
  auto conv = TokenizeConversation(messages, nullptr, *tok, SftDatasetOptions());
  ASSERT_TRUE(conv.ok()) << conv.status();
  ASSERT_EQ(conv->samples.size(), 1u);
  const SftSample& s = conv->samples[0];
  const int32_t im_start = 151644, im_end = 151645, think = 151667, think_end = 151668;
  const int32_t nl = 198, nlnl = 271, system = 8948, user = 872, assistant = 77091;
  Expected e;
  e.Add({im_start, system, nl}, 0).Add(tok->Encode("Be brief."), 0).Add({im_end, nl}, 0);
  e.Add({im_start, user, nl}, 0).Add(tok->Encode("Hi"), 0).Add({im_end, nl}, 0);
  e.Add({im_start, assistant, nl}, 0);
  e.Add({think, nlnl, think_end, nlnl}, 1).Add(tok->Encode("Hello!"), 1).Add({im_end}, 1);
  e.Add({nl}, 0);
  EXPECT_EQ(s.tokens, e.tokens);
  EXPECT_EQ(s.loss_mask, e.mask);
  EXPECT_EQ(s.tokens, tok->Encode(Render(*tok, messages)));
  EXPECT_FALSE(conv->drifted);
}

TEST(SftQwen3, TwoTurnSplitMasks) {
  REQUIRE_QWEN3(tok);
  auto conv = TokenizeConversation(TwoTurn(), nullptr, *tok, SftDatasetOptions());
  ASSERT_TRUE(conv.ok()) << conv.status();
  EXPECT_TRUE(conv->split);
  EXPECT_FALSE(conv->drifted);
  ASSERT_EQ(conv->samples.size(), 2u);
  const SftSample& a = conv->samples[0];
  const SftSample& b = conv->samples[1];
  EXPECT_EQ(MaskedText(*tok, a, 0), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n|\n");
  EXPECT_EQ(MaskedText(*tok, a, 1), "<think>\n\n</think>\n\nYo<|im_end|>");
  EXPECT_EQ(MaskedText(*tok, b, 0),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nYo<|im_end|>\n"
            "<|im_start|>user\nOk?<|im_end|>\n<|im_start|>assistant\n|\n");
  EXPECT_EQ(MaskedText(*tok, b, 1), "<think>\n\n</think>\n\nSure<|im_end|>");
  EXPECT_EQ(a.tokens, tok->Encode(Render(*tok, OJson::array({TwoTurn()[0], TwoTurn()[1]}))));
  EXPECT_EQ(b.tokens, tok->Encode(Render(*tok, TwoTurn())));
}

TEST(SftQwen3, StableConversationsEqualTheFullTokenization) {
  REQUIRE_QWEN3(tok);
  // Every stable conversation of the sample file and of a few variants: incremental == full.
  const std::vector<OJson> conversations = {
      OJson::array({Msg("user", "Hi"), Msg("assistant", "Yo")}),
      OJson::array({Msg("system", "S"), Msg("user", "Hi there, how are you?"),
                    Msg("assistant", "Fine, thanks. And you?")}),
      OJson::array({Msg("user", "数学"), Msg("assistant", "  leading spaces and ünïcödé")}),
      OJson::array({Msg("user", "Q"), Msg("assistant", "<think>\nR\n</think>\n\nA")}),
  };
  for (const OJson& m : conversations) {
    auto conv = TokenizeConversation(m, nullptr, *tok, SftDatasetOptions());
    ASSERT_TRUE(conv.ok()) << conv.status();
    ASSERT_EQ(conv->samples.size(), 1u) << m.dump();
    EXPECT_FALSE(conv->drifted) << m.dump();
    EXPECT_EQ(conv->samples[0].tokens, tok->Encode(Render(*tok, m))) << m.dump();
  }
}

TEST(SftQwen3, SampleFileLoads) {
  REQUIRE_QWEN3(tok);
  auto data = LoadSftDataset(SourceDir() + "/tests/data/sft/chat.jsonl", *tok, SftDatasetOptions());
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->samples.size(), 7u);
  EXPECT_EQ(data->stats.drifted, 0);
  // The tool-call turn trains the call; the tool response is prompt.
  const SftSample& call = data->samples[5];
  EXPECT_EQ(call.line, 5);
  EXPECT_EQ(call.turn, 1);
  EXPECT_EQ(MaskedText(*tok, call, 1),
            "<think>\n\n</think>\n\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 17, "
            "\"b\": 25}}\n</tool_call><|im_end|>");
  const SftSample& answer = data->samples[6];
  EXPECT_EQ(answer.turn, 3);
  EXPECT_NE(MaskedText(*tok, answer, 0).find("<tool_response>\n42\n</tool_response>"),
            std::string::npos);
  EXPECT_EQ(MaskedText(*tok, answer, 1), "<think>\n\n</think>\n\n17 + 25 = 42.<|im_end|>");
}

// ---- EpochSampler ----------------------------------------------------------------------------

TEST(EpochSampler, EngineIsTheStandardMt19937_64) {
  // The standard fixes the 10000th output of a default-seeded mt19937_64; our order depends only
  // on it, so this pins the orders below on every platform.
  std::mt19937_64 gen;
  gen.discard(9999);
  EXPECT_EQ(gen(), 9981545732273789042ull);
}

TEST(EpochSampler, OrdersArePermutationsAndDeterministic) {
  for (int64_t n : {1, 2, 7, 100}) {
    for (int64_t epoch : {0, 1, 5}) {
      auto order = EpochSampler::EpochOrder(n, 42, epoch);
      auto sorted = order;
      std::sort(sorted.begin(), sorted.end());
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(sorted[i], i);
      EXPECT_EQ(order, EpochSampler::EpochOrder(n, 42, epoch));
    }
  }
  EXPECT_NE(EpochSampler::EpochOrder(100, 42, 0), EpochSampler::EpochOrder(100, 42, 1));
  EXPECT_NE(EpochSampler::EpochOrder(100, 42, 0), EpochSampler::EpochOrder(100, 43, 0));
  // Seed + epoch, as slime reseeds: (seed 42, epoch 1) == (seed 43, epoch 0).
  EXPECT_EQ(EpochSampler::EpochOrder(100, 42, 1), EpochSampler::EpochOrder(100, 43, 0));
  std::vector<int64_t> identity(10);
  for (int i = 0; i < 10; ++i) identity[i] = i;
  EXPECT_EQ(EpochSampler::EpochOrder(10, 42, 3, /*shuffle=*/false), identity);
  // Golden order (also computed by an independent Python mt19937_64 + Fisher–Yates): a change
  // here changes every run's data order and breaks resume.
  EXPECT_EQ(EpochSampler::EpochOrder(10, 1234, 0),
            (std::vector<int64_t>{0, 3, 4, 7, 9, 8, 5, 6, 1, 2}));
}

TEST(EpochSampler, WalksEpochsAndResumes) {
  auto created = EpochSampler::Create(10, 7);
  ASSERT_TRUE(created.ok());
  EpochSampler a = *created;
  const std::vector<int64_t> first = a.Next(10);
  EXPECT_EQ(first, EpochSampler::EpochOrder(10, 7, 0));
  EXPECT_EQ(a.state().epoch, 1);
  EXPECT_EQ(a.state().offset, 0);
  a.Next(7);
  const EpochSamplerState saved = a.state();
  EXPECT_EQ(saved.epoch, 1);
  EXPECT_EQ(saved.offset, 7);
  const std::vector<int64_t> rest = a.Next(25);  // crosses into epochs 2, 3 and 4

  // A fresh sampler restored from the two integers continues identically.
  EpochSampler b = *EpochSampler::Create(10, 7);
  ASSERT_TRUE(b.Restore(saved).ok());
  EXPECT_EQ(b.Next(25), rest);
  EXPECT_EQ(b.state().epoch, a.state().epoch);
  EXPECT_EQ(b.state().offset, a.state().offset);
  // The expected continuation, spelled out from the epoch orders.
  std::vector<int64_t> want;
  for (int64_t e = 1; e <= 4; ++e) {
    for (int64_t idx : EpochSampler::EpochOrder(10, 7, e)) want.push_back(idx);
  }
  EXPECT_EQ(rest, std::vector<int64_t>(want.begin() + 7, want.begin() + 32));

  EXPECT_FALSE(b.Restore({-1, 0}).ok());
  EXPECT_FALSE(b.Restore({0, 10}).ok());
  auto bad = b.Restore({0, -1});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("offset in [0, 10)"), std::string::npos) << bad;
  EXPECT_FALSE(EpochSampler::Create(0, 7).ok());
}

}  // namespace
}  // namespace slime::data
