// OpenAI-compatible request parsing, responses and streaming deltas (openai.h). Completions use
// the byte tokenizer; chat needs a chat template and uses the real Qwen3 tokenizer (skipped when
// not fetched).
#include "slime/engine/openai.h"

#include <gtest/gtest.h>

#include <limits>

#include "protocol_test_util.h"

namespace slime::engine {
namespace {

using Json = nlohmann::json;

std::vector<int32_t> Bytes(std::string_view s) {
  std::vector<int32_t> ids;
  for (unsigned char c : s) ids.push_back(c);
  return ids;
}

class OpenAiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tok_ = testing::ByteTokenizer();
    ASSERT_NE(tok_, nullptr);
    ctx_.tok = tok_.get();
    ctx_.limits.context_length = 1024;
    ctx_.limits.vocab_size = 300;
    ctx_.served_model_name = "qwen3-test";
    ctx_.log = &log_;
  }
  StatusOr<ParsedOpenAi> Completion(std::string_view body) {
    return ParseCompletionRequest(Json::parse(body), ctx_);
  }
  ParsedOpenAi CompletionOk(std::string_view body) {
    auto p = Completion(body);
    EXPECT_TRUE(p.ok()) << body << "\n  -> " << p.status();
    return p.ok() ? std::move(p).value() : ParsedOpenAi();
  }

  std::unique_ptr<tokenizer::Tokenizer> tok_;
  UnknownFieldLog log_;
  OpenAiContext ctx_;
};

TEST_F(OpenAiTest, CompletionDefaults) {
  const ParsedOpenAi p = CompletionOk(R"({"model": "m", "prompt": "hi"})");
  EXPECT_EQ(p.endpoint, OpenAiEndpoint::kCompletions);
  EXPECT_EQ(p.model, "m");
  ASSERT_EQ(p.inputs.size(), 1u);
  const GenerateInput& in = p.inputs[0];
  EXPECT_EQ(in.input_ids, (std::vector<int32_t>{'h', 'i'}));
  EXPECT_EQ(in.sampling.max_new_tokens, std::optional<int64_t>(16)) << "OpenAI's default";
  EXPECT_EQ(in.sampling.temperature, 1.0);
  EXPECT_EQ(in.sampling.top_p, 1.0);
  EXPECT_FALSE(in.return_logprob);
  EXPECT_FALSE(p.stream);
  EXPECT_EQ(CompletionOk(R"({"prompt": "hi"})").model, "qwen3-test");
  EXPECT_EQ(
      CompletionOk(R"({"prompt": "hi", "max_tokens": null})").inputs[0].sampling.max_new_tokens,
      std::optional<int64_t>(16));
}

TEST_F(OpenAiTest, CompletionPromptShapesAndChoiceOrder) {
  EXPECT_EQ(CompletionOk(R"({"prompt": [5, 6, 7]})").inputs[0].input_ids,
            (std::vector<int32_t>{5, 6, 7}));
  const ParsedOpenAi p = CompletionOk(R"({"prompt": [[5], [6, 7]], "n": 2, "rid": "q"})");
  ASSERT_EQ(p.inputs.size(), 4u);
  EXPECT_EQ(p.num_prompts, 2);
  EXPECT_EQ(p.n, 2);
  const std::vector<std::vector<int32_t>> want = {{5}, {5}, {6, 7}, {6, 7}};
  for (int k = 0; k < 4; ++k) {
    EXPECT_EQ(p.inputs[k].input_ids, want[k]);
    EXPECT_EQ(p.inputs[k].index, k);
    EXPECT_EQ(p.inputs[k].rid, "q_" + std::to_string(k));
  }
  const ParsedOpenAi s = CompletionOk(R"({"prompt": ["a", "bc"]})");
  ASSERT_EQ(s.inputs.size(), 2u);
  EXPECT_EQ(s.inputs[1].input_ids, (std::vector<int32_t>{'b', 'c'}));
}

TEST_F(OpenAiTest, CompletionSamplingFields) {
  const ParsedOpenAi p = CompletionOk(R"({"prompt": "x", "max_tokens": 5, "temperature": 0.3,
      "top_p": 0.9, "top_k": 40, "min_p": 0.05, "min_tokens": 2, "stop": ["\n\n"], "seed": 7,
      "frequency_penalty": 0.5, "presence_penalty": -0.5, "repetition_penalty": 1.1,
      "stop_token_ids": [256], "ignore_eos": true, "skip_special_tokens": false,
      "logit_bias": {"65": -100}, "logprobs": 3, "stream": true,
      "stream_options": {"include_usage": true}, "user": "u1"})");
  ASSERT_EQ(p.inputs.size(), 1u);
  const SamplingParams& sp = p.inputs[0].sampling;
  EXPECT_EQ(sp.max_new_tokens, std::optional<int64_t>(5));
  EXPECT_EQ(sp.temperature, 0.3);
  EXPECT_EQ(sp.top_p, 0.9);
  EXPECT_EQ(sp.top_k, 40);
  EXPECT_EQ(sp.min_p, 0.05);
  EXPECT_EQ(sp.min_new_tokens, 2);
  EXPECT_EQ(sp.stop, std::vector<std::string>{"\n\n"});
  EXPECT_EQ(sp.sampling_seed, std::optional<uint64_t>(7));
  EXPECT_EQ(sp.frequency_penalty, 0.5);
  EXPECT_EQ(sp.presence_penalty, -0.5);
  EXPECT_EQ(sp.repetition_penalty, 1.1);
  EXPECT_EQ(sp.stop_token_ids, std::vector<int32_t>{256});
  EXPECT_TRUE(sp.ignore_eos);
  EXPECT_FALSE(sp.skip_special_tokens);
  EXPECT_EQ(sp.logit_bias.at(65), -100.0);
  EXPECT_TRUE(p.logprobs);
  EXPECT_EQ(p.top_logprobs, 3);
  EXPECT_TRUE(p.inputs[0].return_logprob);
  EXPECT_EQ(p.inputs[0].top_logprobs_num, 3);
  EXPECT_TRUE(p.stream);
  EXPECT_TRUE(p.include_usage);
  EXPECT_EQ(log_.size(), 0u);
}

TEST_F(OpenAiTest, UnknownKeysAreLogged) {
  CompletionOk(R"({"prompt": "x", "frobnicate": 1})");
  EXPECT_TRUE(log_.Seen("frobnicate"));
}

struct BadCase {
  const char* body;
  const char* field;
  const char* substring;
};

TEST_F(OpenAiTest, CompletionErrorsNameTheOpenAiField) {
  const BadCase cases[] = {
      {R"({"prompt": "x", "max_tokens": -1})", "max_tokens", "at least 0"},
      {R"({"prompt": "x", "max_tokens": 2000})", "max_tokens",
       "maximum context length of 1024 tokens"},
      {R"({"prompt": "x", "min_tokens": 20})", "min_tokens", "max_tokens = 16"},
      {R"({"prompt": "x", "seed": "s"})", "seed", "must be an integer, got string"},
      {R"({"prompt": "x", "temperature": -1})", "temperature", "finite number >= 0"},
      {R"({"prompt": "x", "top_p": 2})", "top_p", "(0, 1]"},
      {R"({"prompt": "x", "n": 0})", "n", "in [1, 1024]"},
      {R"({"prompt": "x", "n": 1844674308})", "n", "in [1, 1024]"},  // tests/fuzz: a DoS
      {R"({"prompt": ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o",
                      "p", "q", "r", "s", "t", "u", "v", "w", "x", "y", "z", "0", "1", "2", "3",
                      "4", "5", "6", "7", "8", "9", "A", "B", "C", "D", "E", "F", "G", "H", "I",
                      "J", "K", "L", "M", "N", "O", "P", "Q", "R", "S", "T", "U", "V", "W", "X",
                      "Y", "Z", "!", "?", "."], "n": 1024})",
       "n", "exceeds the limit of 65536"},
      {R"({"prompt": "x", "logprobs": 21})", "logprobs", "[0, 20]"},
      {R"({"prompt": "x", "logprobs": true})", "logprobs", "must be an integer, got boolean"},
      {R"({"prompt": "x", "echo": true})", "echo", "not supported"},
      {R"({"prompt": "x", "suffix": "y"})", "suffix", "not supported"},
      {R"({"prompt": "x", "best_of": 3})", "best_of", "unless it equals n"},
      {R"({"prompt": "x", "regex": "a+"})", "regex", "not supported"},
      {R"({"prompt": "x", "stream_options": 3})", "stream_options", "must be an object"},
      {R"({"prompt": "x", "model": 3})", "model", "must be a string"},
      {R"({"prompt": []})", "prompt", "must not be an empty list"},
      {R"({"prompt": ""})", "prompt", "is empty"},
      {R"({"prompt": 5})", "prompt", "got number"},
      {R"({"max_tokens": 3})", "prompt", "prompt is required"},
      {R"({"prompt": ["a", 5]})", "prompt[1]", "a string or a list of token ids"},
      {R"({"prompt": [1, "a"]})", "prompt[1]", "must be an integer"},
      {R"({"prompt": [1, 999]})", "prompt[1]", "[0, 300)"},
      {R"({"prompt": [[1], [2, -3]]})", "prompt[1][1]", "token id >= 0"},
  };
  for (const BadCase& c : cases) {
    auto p = Completion(c.body);
    ASSERT_FALSE(p.ok()) << "accepted: " << c.body;
    const std::string msg(p.status().message());
    EXPECT_EQ(HttpStatusFor(p.status()), 400);
    EXPECT_NE(msg.find(c.field), std::string::npos) << c.body << "\n  message: " << msg;
    EXPECT_NE(msg.find(c.substring), std::string::npos) << c.body << "\n  message: " << msg;
    EXPECT_EQ(ErrorField(p.status()), std::optional<std::string>(c.field)) << msg;
    const Json e = OpenAiErrorJson(p.status());
    EXPECT_EQ(e["error"]["message"], msg);
    EXPECT_EQ(e["error"]["type"], "invalid_request_error");
    EXPECT_EQ(e["error"]["param"], c.field);
    EXPECT_EQ(e["error"]["code"], 400);
  }
}

// --- Responses --------------------------------------------------------------------------------

RequestOutput Out(int64_t index, std::string text, std::vector<int32_t> ids, FinishReason f,
                  int64_t prompt_tokens = 2) {
  RequestOutput o;
  o.index = index;
  o.text = std::move(text);
  o.output_ids = std::move(ids);
  o.finish = std::move(f);
  o.prompt_tokens = prompt_tokens;
  return o;
}

TEST_F(OpenAiTest, CompletionResponseGolden) {
  const ParsedOpenAi p = CompletionOk(R"({"model": "m", "prompt": ["ab", "c"], "n": 2})");
  std::vector<RequestOutput> outs = {Out(0, "x", {'x', 256}, FinishReason::Stop(256), 2),
                                     Out(1, "yy", {'y', 'y'}, FinishReason::Length(2), 2),
                                     Out(2, "z", {'z', ';'}, FinishReason::StopString(";"), 1),
                                     Out(3, "", {}, FinishReason::Abort("aborted"), 1)};
  const Json j = OpenAiResponseJson(p, outs, ctx_, "cmpl-1", 1700000000);
  const Json want = Json::parse(R"({"id": "cmpl-1", "object": "text_completion",
      "created": 1700000000, "model": "m",
      "choices": [
        {"index": 0, "text": "x", "logprobs": null, "finish_reason": "stop", "matched_stop": 256},
        {"index": 1, "text": "yy", "logprobs": null, "finish_reason": "length",
         "matched_stop": null},
        {"index": 2, "text": "z", "logprobs": null, "finish_reason": "stop", "matched_stop": ";"},
        {"index": 3, "text": "", "logprobs": null, "finish_reason": "abort",
         "matched_stop": null}],
      "usage": {"prompt_tokens": 3, "completion_tokens": 6, "total_tokens": 9}})");
  EXPECT_EQ(j, want) << j.dump(1);
}

TEST_F(OpenAiTest, CompletionLogprobs) {
  const ParsedOpenAi p = CompletionOk(R"({"prompt": "q", "logprobs": 2})");
  RequestOutput o = Out(0, "ab", {'a', 'b'}, FinishReason::Length(2));
  o.output_logprobs = {-0.5f, -1.0f};
  o.output_top_logprobs = {{{-0.5f, 'a'}, {-2.0f, 'c'}}, {{-1.0f, 'b'}, {-1.5f, 'd'}}};
  const Json j = OpenAiResponseJson(p, std::span<const RequestOutput>(&o, 1), ctx_, "c", 0);
  EXPECT_EQ(j["choices"][0]["logprobs"], Json::parse(R"({"tokens": ["a", "b"],
      "token_logprobs": [-0.5, -1.0],
      "top_logprobs": [{"a": -0.5, "c": -2.0}, {"b": -1.0, "d": -1.5}],
      "text_offset": [0, 1]})"));
}

TEST(OpenAiJsonTest, ChatLogprobsShape) {
  auto tok = testing::ByteTokenizer();
  RequestOutput o = Out(0, "é", {0xC3, 0xA9}, FinishReason::Length(2));
  o.output_logprobs = {-0.5f, -std::numeric_limits<float>::infinity()};
  o.output_top_logprobs = {{{-0.5f, 0xC3}}, {{-0.1f, 0xA9}}};
  const Json j = OpenAiLogprobsJson(OpenAiEndpoint::kChatCompletions, o, 0, 2, 1, tok.get());
  const Json want = Json::parse(R"({"content": [
      {"token": "\ufffd", "logprob": -0.5, "bytes": [195],
       "top_logprobs": [{"token": "\ufffd", "logprob": -0.5, "bytes": [195]}]},
      {"token": "\ufffd", "logprob": -9999.0, "bytes": [169],
       "top_logprobs": [{"token": "\ufffd", "logprob": -0.10000000149011612, "bytes": [169]}]}
      ]})");
  EXPECT_EQ(j, want) << j.dump();
}

TEST(OpenAiJsonTest, ModelsAndErrors) {
  EXPECT_EQ(ModelsJson("qwen3", 5, 4096), Json::parse(R"({"object": "list", "data": [
      {"id": "qwen3", "object": "model", "created": 5, "owned_by": "slime-cpp",
       "root": "qwen3", "max_model_len": 4096}]})"));
  const Json e = OpenAiErrorJson(absl::InternalError("boom"));
  EXPECT_EQ(e, Json::parse(R"({"error": {"message": "boom", "type": "server_error",
                                "param": null, "code": 500}})"));
  const std::string id = NewOpenAiId(OpenAiEndpoint::kChatCompletions);
  EXPECT_EQ(id.rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(id.size(), 9u + 32u);
  EXPECT_EQ(NewOpenAiId(OpenAiEndpoint::kCompletions).rfind("cmpl-", 0), 0u);
  EXPECT_EQ(OpenAiFinishReason(FinishReason()), Json(nullptr));
}

// --- Streaming --------------------------------------------------------------------------------

TEST_F(OpenAiTest, CompletionStreamSendsOnlyNewTextAndHoldsBackStopPrefixes) {
  const ParsedOpenAi p = CompletionOk(R"({"prompt": "q", "stop": "world", "stream": true,
      "stream_options": {"include_usage": true}})");
  OpenAiStream s(p, ctx_, "cmpl-9", 42);
  auto text_of = [](const std::vector<Json>& chunks) {
    std::string t;
    for (const Json& c : chunks) t += c["choices"][0]["text"].get<std::string>();
    return t;
  };
  EXPECT_EQ(text_of(s.OnOutput(Out(0, "Hel", {'H', 'e', 'l'}, FinishReason()))), "Hel");
  EXPECT_EQ(text_of(s.OnOutput(Out(0, "Hello w", Bytes("Hello w"), FinishReason()))), "lo ")
      << "\"w\" could start \"world\": held back";
  EXPECT_TRUE(s.OnOutput(Out(0, "Hello wor", Bytes("Hello wor"), FinishReason())).empty());
  EXPECT_FALSE(s.UsageChunk().has_value()) << "not finished yet";
  const std::vector<Json> last =
      s.OnOutput(Out(0, "Hello ", Bytes("Hello world"), FinishReason::StopString("world")));
  ASSERT_EQ(last.size(), 1u);
  const Json want = Json::parse(R"({"id": "cmpl-9", "object": "text_completion", "created": 42,
      "model": "qwen3-test", "choices": [{"index": 0, "text": "", "logprobs": null,
      "finish_reason": "stop", "matched_stop": "world"}]})");
  EXPECT_EQ(last[0], want) << last[0].dump();
  EXPECT_TRUE(s.AllFinished());
  EXPECT_TRUE(s.OnOutput(Out(0, "Hello ", Bytes("Hello world"), FinishReason())).empty())
      << "updates after the finish are ignored";
  const std::optional<Json> usage = s.UsageChunk();
  ASSERT_TRUE(usage.has_value());
  EXPECT_EQ((*usage)["choices"], Json::array());
  EXPECT_EQ((*usage)["usage"], Json::parse(R"({"prompt_tokens": 2, "completion_tokens": 11,
                                               "total_tokens": 13})"));
}

TEST_F(OpenAiTest, HeldBackTextIsSentWhenItTurnsOutNotToBeAStop) {
  const ParsedOpenAi p = CompletionOk(R"({"prompt": "q", "stop": ["END"], "stream": true})");
  OpenAiStream s(p, ctx_, "c", 0);
  std::string sent;
  for (const auto& [text, done] : std::vector<std::pair<std::string, bool>>{
           {"a E", false}, {"a EN", false}, {"a ENX", false}, {"a ENXE", true}}) {
    for (const Json& c :
         s.OnOutput(Out(0, text, Bytes(text), done ? FinishReason::Length(6) : FinishReason()))) {
      sent += c["choices"][0]["text"].get<std::string>();
    }
  }
  EXPECT_EQ(sent, "a ENXE") << "the held-back E is flushed at the finish";
  EXPECT_FALSE(s.UsageChunk().has_value()) << "include_usage not requested";
}

TEST_F(OpenAiTest, StreamLogprobsCoverOnlyNewTokensPerChoice) {
  const ParsedOpenAi p = CompletionOk(R"({"prompt": "q", "n": 2, "logprobs": 0,
      "stream": true})");
  OpenAiStream s(p, ctx_, "c", 0);
  RequestOutput a = Out(1, "ab", {'a', 'b'}, FinishReason());
  a.output_logprobs = {-1.0f, -2.0f};
  std::vector<Json> c = s.OnOutput(a);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0]["choices"][0]["index"], 1);
  EXPECT_EQ(c[0]["choices"][0]["logprobs"]["tokens"], Json::parse(R"(["a", "b"])"));
  EXPECT_EQ(c[0]["choices"][0]["logprobs"]["top_logprobs"], Json::parse("[null, null]"));
  a.output_ids.push_back('c');
  a.output_logprobs.push_back(-3.0f);
  a.text = "abc";
  a.finish = FinishReason::Length(3);
  c = s.OnOutput(a);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0]["choices"][0]["text"], "c");
  EXPECT_EQ(c[0]["choices"][0]["logprobs"]["tokens"], Json::parse(R"(["c"])"));
  EXPECT_EQ(c[0]["choices"][0]["logprobs"]["text_offset"], Json::parse("[2]"));
  EXPECT_EQ(c[0]["choices"][0]["finish_reason"], "length");
  EXPECT_FALSE(s.AllFinished()) << "choice 0 still running";
}

// --- Chat (real Qwen3 template) ---------------------------------------------------------------

TEST(OpenAiChatTest, MessagesAreRenderedWithTheChatTemplate) {
  SLIME_REQUIRE_QWEN3(tok);
  OpenAiContext ctx;
  ctx.tok = tok;
  ctx.limits = {40960, 151936};
  const Json body = Json::parse(R"({"model": "qwen3", "messages": [
      {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}],
      "logprobs": true, "top_logprobs": 2, "max_completion_tokens": 9, "max_tokens": 100})");
  auto p = ParseChatCompletionRequest(body, ctx);
  ASSERT_TRUE(p.ok()) << p.status();
  tokenizer::ChatTemplateOptions options;
  options.add_generation_prompt = true;
  const auto rendered =
      tok->ApplyChatTemplate(nlohmann::ordered_json::parse(body["messages"].dump()), options);
  ASSERT_TRUE(rendered.ok());
  EXPECT_EQ(*rendered,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
            "<|im_start|>assistant\n");
  ASSERT_EQ(p->inputs.size(), 1u);
  EXPECT_EQ(p->inputs[0].input_ids, tok->Encode(*rendered));
  EXPECT_EQ(p->inputs[0].sampling.max_new_tokens, std::optional<int64_t>(9))
      << "max_completion_tokens wins over max_tokens";
  EXPECT_TRUE(p->inputs[0].return_logprob);
  EXPECT_EQ(p->inputs[0].top_logprobs_num, 2);

  // No max tokens → up to the context; chat_template_kwargs reach the template.
  auto q =
      ParseChatCompletionRequest(Json::parse(R"({"messages": [{"role": "user", "content": "Hi!"}],
                      "chat_template_kwargs": {"enable_thinking": false}})"),
                                 ctx);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_FALSE(q->inputs[0].sampling.max_new_tokens.has_value());
  EXPECT_EQ(tok->Decode(q->inputs[0].input_ids),
            "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

TEST(OpenAiChatTest, ChatErrors) {
  SLIME_REQUIRE_QWEN3(tok);
  OpenAiContext ctx;
  ctx.tok = tok;
  ctx.limits = {40960, 151936};
  const BadCase cases[] = {
      {R"({"messages": []})", "messages", "non-empty list"},
      {R"({"messages": "hi"})", "messages", "got string"},
      {R"({"messages": ["hi"]})", "messages[0]", "must be an object"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", "messages",
       "messages: "},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", "top_logprobs",
       "needs \"logprobs\": true"},
      {R"({"messages": [{"role": "user", "content": "x"}], "logprobs": 1})", "logprobs",
       "must be true or false"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})",
       "tools", "not supported"},
      {R"({"messages": [{"role": "user", "content": "x"}],
           "response_format": {"type": "json_object"}})",
       "response_format", "not supported"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 50000})",
       "max_completion_tokens", "maximum context length of 40960"},
      {R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": 1})",
       "chat_template_kwargs", "must be an object"},
  };
  for (const BadCase& c : cases) {
    auto p = ParseChatCompletionRequest(Json::parse(c.body), ctx);
    ASSERT_FALSE(p.ok()) << "accepted: " << c.body;
    const std::string msg(p.status().message());
    EXPECT_EQ(HttpStatusFor(p.status()), 400);
    EXPECT_NE(msg.find(c.field), std::string::npos) << c.body << "\n  message: " << msg;
    EXPECT_NE(msg.find(c.substring), std::string::npos) << c.body << "\n  message: " << msg;
    EXPECT_EQ(ErrorField(p.status()), std::optional<std::string>(c.field)) << msg;
  }
}

TEST(OpenAiChatTest, ChatResponseAndStream) {
  SLIME_REQUIRE_QWEN3(tok);
  OpenAiContext ctx;
  ctx.tok = tok;
  ctx.limits = {40960, 151936};
  ctx.served_model_name = "qwen3";
  auto p = ParseChatCompletionRequest(
      Json::parse(R"({"messages": [{"role": "user", "content": "Hi"}], "stream": true})"), ctx);
  ASSERT_TRUE(p.ok()) << p.status();
  const int32_t im_end = *tok->TokenToId("<|im_end|>");
  RequestOutput done = Out(0, "Hello!", tok->Encode("Hello!"), FinishReason::Stop(im_end));
  done.output_ids.push_back(im_end);
  const Json r = OpenAiResponseJson(*p, std::span<const RequestOutput>(&done, 1), ctx, "x", 1);
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["model"], "qwen3");
  EXPECT_EQ(r["choices"][0]["message"], Json::parse(R"({"role": "assistant",
                                                        "content": "Hello!"})"));
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(r["choices"][0]["matched_stop"], im_end);
  EXPECT_EQ(r["usage"]["completion_tokens"], static_cast<int64_t>(done.output_ids.size()));

  OpenAiStream s(*p, ctx, "chatcmpl-1", 7);
  std::vector<Json> chunks = s.OnOutput(Out(0, "Hel", tok->Encode("Hel"), FinishReason()));
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_EQ(chunks[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(chunks[0]["choices"][0]["delta"],
            Json::parse(R"({"role": "assistant", "content": ""})"));
  EXPECT_EQ(chunks[1]["choices"][0]["delta"], Json::parse(R"({"content": "Hel"})"));
  EXPECT_EQ(chunks[1]["choices"][0]["finish_reason"], nullptr);
  chunks = s.OnOutput(done);
  ASSERT_EQ(chunks.size(), 1u);
  EXPECT_EQ(chunks[0]["choices"][0]["delta"], Json::parse(R"({"content": "lo!"})"));
  EXPECT_EQ(chunks[0]["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(s.AllFinished());
}

}  // namespace
}  // namespace slime::engine
