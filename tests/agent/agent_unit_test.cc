// Unit tests of the agent adapter's pure parts with hand-written ids: prompt building with
// recorded outputs spliced in (re-tokenization drift), trajectory → training segments, and the
// OpenAI wire format (request validation, tool calls read back, SSE events).
#include <gtest/gtest.h>

#include "slime/agent/agent_generator.h"
#include "slime/agent/openai_chat.h"
#include "slime/agent/trajectory.h"

namespace slime::agent {
namespace {

using ojson = nlohmann::ordered_json;
using Ids = std::vector<int32_t>;

// A ChatML-like template and a byte tokenizer written out by hand: <|im_start|> = 1,
// <|im_end|> = 2, any other byte b = 100 + b. Tool calls are rendered as
// <tool_call>{"name": N, "arguments": A}</tool_call> with A re-serialized (spaces after ':' and
// ','), which is not what the model wrote: the drift splicing must undo.
class ToyCodec : public ChatCodec {
 public:
  StatusOr<std::string> Render(const ojson& messages, bool add_generation_prompt) const override {
    std::string out;
    for (const auto& m : messages) {
      if (m.value("role", "") == "bad") return absl::InvalidArgumentError("messages: bad role");
      out += "<|im_start|>" + m.value("role", "") + "\n";
      if (m.contains("content") && m["content"].is_string()) out += m["content"].get<std::string>();
      if (m.contains("tool_calls")) {
        for (const auto& c : m["tool_calls"]) {
          ojson args = ojson::parse(c["function"]["arguments"].get<std::string>());
          out += "<tool_call>{\"name\": \"" + c["function"]["name"].get<std::string>() +
                 "\", \"arguments\": " + args.dump(-1).insert(1, " ") + "}</tool_call>";
        }
      }
      out += "<|im_end|>\n";
    }
    if (add_generation_prompt) out += "<|im_start|>assistant\n";
    return out;
  }
  std::vector<int32_t> Encode(std::string_view text) const override {
    Ids ids;
    for (size_t i = 0; i < text.size();) {
      if (text.substr(i).starts_with("<|im_start|>")) {
        ids.push_back(1);
        i += 12;
      } else if (text.substr(i).starts_with("<|im_end|>")) {
        ids.push_back(2);
        i += 10;
      } else {
        ids.push_back(100 + static_cast<unsigned char>(text[i++]));
      }
    }
    return ids;
  }
  std::string SpecialTokenText(int32_t id) const override {
    return id == 1 ? "<|im_start|>" : id == 2 ? "<|im_end|>" : "";
  }
};

Ids Cat(std::initializer_list<Ids> parts) {
  Ids out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

ojson Msg(std::string role, std::string content) {
  return ojson{{"role", role}, {"content", content}};
}

// The first turn of a conversation [system, user], generated as hand-written ids.
AgentTurn FirstTurn(const ToyCodec& codec, const ojson& messages, Ids output, std::string reply) {
  AgentTurn t;
  t.prompt_text = *codec.Render(messages, true);
  t.prompt_ids = codec.Encode(t.prompt_text);
  t.output_ids = std::move(output);
  for (size_t i = 0; i < t.output_ids.size(); ++i) t.log_probs.push_back(-0.5f - i);
  t.finish_reason = "stop";
  t.reply = Msg("assistant", std::move(reply));
  return t;
}

TEST(BuildPromptTest, NoHistoryIsTheRenderedTextTokenized) {
  ToyCodec codec;
  ojson messages = ojson::array({Msg("user", "hi")});
  auto built = BuildPrompt(codec, messages, {});
  ASSERT_TRUE(built.ok()) << built.status();
  EXPECT_EQ(built->text, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(built->ids, codec.Encode(built->text));
  EXPECT_TRUE(built->spliced_turns.empty());
}

TEST(BuildPromptTest, AnEarlierReplyBecomesExactlyItsGeneratedIds) {
  ToyCodec codec;
  ojson first = ojson::array({Msg("system", "s"), Msg("user", "2+3?")});
  // The model wrote "5" as the (made-up) ids 900, 901 and ended with <|im_end|>.
  AgentTurn t0 = FirstTurn(codec, first, {900, 901, 2}, "5");
  ojson second = first;
  second.push_back(Msg("assistant", "5"));
  second.push_back(Msg("user", "sure?"));
  auto built = BuildPrompt(codec, second, std::vector<AgentTurn>{t0});
  ASSERT_TRUE(built.ok()) << built.status();
  // Previous prompt + generated ids (its <|im_end|> stands for the template's) + the rest.
  Ids expected = Cat({t0.prompt_ids, {900, 901, 2},
                      codec.Encode("\n<|im_start|>user\nsure?<|im_end|>\n<|im_start|>assistant\n")});
  EXPECT_EQ(built->ids, expected);
  EXPECT_EQ(built->spliced_turns, std::vector<int>{0});
  // The re-tokenized text would have been different ids.
  EXPECT_NE(built->ids, codec.Encode(built->text));
}

TEST(BuildPromptTest, AReplyCutByLengthKeepsTheTemplatesEndOfTurn) {
  ToyCodec codec;
  ojson first = ojson::array({Msg("user", "count")});
  AgentTurn t0 = FirstTurn(codec, first, {900, 901}, "12");  // no <|im_end|>: hit max tokens
  t0.finish_reason = "length";
  ojson second = first;
  second.push_back(Msg("assistant", "12"));
  second.push_back(Msg("user", "go on"));
  auto built = BuildPrompt(codec, second, std::vector<AgentTurn>{t0});
  ASSERT_TRUE(built.ok()) << built.status();
  Ids expected =
      Cat({t0.prompt_ids, {900, 901},
           codec.Encode("<|im_end|>\n<|im_start|>user\ngo on<|im_end|>\n<|im_start|>assistant\n")});
  EXPECT_EQ(built->ids, expected);
}

TEST(BuildPromptTest, ToolCallsSentBackReSerializedStillSpliceTheGeneratedIds) {
  ToyCodec codec;
  ojson first = ojson::array({Msg("user", "add 2 and 3")});
  AgentTurn t0 = FirstTurn(codec, first, {700, 701, 702, 2}, "");
  t0.reply = ojson{{"role", "assistant"},
                   {"content", nullptr},
                   {"tool_calls", ojson::array({ojson{{"id", "call_0"},
                                                      {"type", "function"},
                                                      {"function",
                                                       {{"name", "add"},
                                                        {"arguments", "{\"a\":2,\"b\":3}"}}}}})}};
  ojson second = first;
  // The agent echoes the call with other spacing in the arguments and another id.
  ojson echoed = t0.reply;
  echoed["tool_calls"][0]["id"] = "whatever";
  echoed["tool_calls"][0]["function"]["arguments"] = "{\"a\": 2, \"b\": 3}";
  second.push_back(echoed);
  second.push_back(ojson{{"role", "tool"}, {"tool_call_id", "whatever"}, {"content", "5"}});
  auto built = BuildPrompt(codec, second, std::vector<AgentTurn>{t0});
  ASSERT_TRUE(built.ok()) << built.status();
  Ids expected = Cat({t0.prompt_ids, {700, 701, 702, 2},
                      codec.Encode("\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n")});
  EXPECT_EQ(built->ids, expected);
}

TEST(BuildPromptTest, TwoRepliesSpliceInOrderAndForeignAssistantMessagesStayText) {
  ToyCodec codec;
  ojson c1 = ojson::array({Msg("user", "a")});
  AgentTurn t0 = FirstTurn(codec, c1, {900, 2}, "x");
  ojson c2 = c1;
  c2.push_back(Msg("assistant", "x"));
  c2.push_back(Msg("user", "b"));
  auto p1 = BuildPrompt(codec, c2, std::vector<AgentTurn>{t0});
  ASSERT_TRUE(p1.ok());
  AgentTurn t1;
  t1.prompt_text = p1->text;
  t1.prompt_ids = p1->ids;
  t1.output_ids = {901, 902, 2};
  t1.log_probs = {-1, -2, -3};
  t1.finish_reason = "stop";
  t1.reply = Msg("assistant", "yz");
  ojson c3 = c2;
  c3.push_back(Msg("assistant", "yz"));
  c3.push_back(Msg("user", "c"));
  auto p2 = BuildPrompt(codec, c3, std::vector<AgentTurn>{t0, t1});
  ASSERT_TRUE(p2.ok());
  EXPECT_EQ(p2->spliced_turns, (std::vector<int>{0, 1}));
  Ids expected = Cat({t1.prompt_ids, {901, 902, 2},
                      codec.Encode("\n<|im_start|>user\nc<|im_end|>\n<|im_start|>assistant\n")});
  EXPECT_EQ(p2->ids, expected);

  // An assistant message the model never wrote (a few-shot example) is ordinary text.
  ojson fewshot = ojson::array({Msg("user", "q"), Msg("assistant", "example"), Msg("user", "a")});
  auto p3 = BuildPrompt(codec, fewshot, std::vector<AgentTurn>{t0});
  ASSERT_TRUE(p3.ok());
  EXPECT_EQ(p3->ids, codec.Encode(p3->text));
  EXPECT_TRUE(p3->spliced_turns.empty());
}

TEST(BuildPromptTest, AnEditedEarlierContextIsRetokenizedButTheReplyIsSpliced) {
  ToyCodec codec;
  ojson c1 = ojson::array({Msg("system", "old"), Msg("user", "a")});
  AgentTurn t0 = FirstTurn(codec, c1, {900, 2}, "x");
  ojson c2 = ojson::array({Msg("system", "new"), Msg("user", "a"), Msg("assistant", "x")});
  auto built = BuildPrompt(codec, c2, std::vector<AgentTurn>{t0});
  ASSERT_TRUE(built.ok());
  Ids expected = Cat({codec.Encode("<|im_start|>system\nnew<|im_end|>\n<|im_start|>user\na"
                                   "<|im_end|>\n<|im_start|>assistant\n"),
                      {900, 2},
                      codec.Encode("\n<|im_start|>assistant\n")});
  EXPECT_EQ(built->ids, expected);
}

TEST(BuildPromptTest, TemplateErrorsPassThrough) {
  ToyCodec codec;
  auto built = BuildPrompt(codec, ojson::array({Msg("bad", "x")}), {});
  EXPECT_FALSE(built.ok());
  EXPECT_NE(built.status().message().find("bad role"), std::string::npos);
}

TEST(SameReplyTest, ContentAndToolCallsDecide) {
  ojson a = Msg("assistant", "hi");
  EXPECT_TRUE(SameReply(a, ojson{{"role", "assistant"}, {"content", "hi"}, {"name", "x"}}));
  EXPECT_FALSE(SameReply(a, Msg("assistant", "hi ")));
  EXPECT_TRUE(SameReply(ojson{{"content", nullptr}}, ojson{{"content", ""}}));
  ojson call = {{"function", {{"name", "f"}, {"arguments", "{\"x\":1}"}}}};
  ojson b = {{"content", nullptr}, {"tool_calls", ojson::array({call})}};
  ojson c = b;
  c["tool_calls"][0]["function"]["arguments"] = "{ \"x\" : 1 }";
  EXPECT_TRUE(SameReply(b, c));
  c["tool_calls"][0]["function"]["arguments"] = "{\"x\":2}";
  EXPECT_FALSE(SameReply(b, c));
  c["tool_calls"][0]["function"]["arguments"] = ojson{{"x", 1}};  // an object, not a string
  EXPECT_TRUE(SameReply(b, c));
  EXPECT_FALSE(SameReply(b, ojson{{"content", nullptr}}));
}

AgentTurn Turn(Ids prompt, Ids output, std::vector<float> lps, std::string finish = "stop") {
  AgentTurn t;
  t.prompt_ids = std::move(prompt);
  t.output_ids = std::move(output);
  t.log_probs = std::move(lps);
  t.finish_reason = std::move(finish);
  t.output_text = "o";
  t.prompt_text = "p";
  return t;
}

data::Sample Input() {
  data::Sample s;
  s.group_index = 3;
  s.index = 7;
  s.prompt = "task";
  s.label = "5";
  s.tokens = {42};  // the dataset's prompt ids: replaced by what the agent sent
  s.metadata = {{"k", "v"}};
  return s;
}

TEST(BuildSegmentsTest, ExtendingTurnsMakeOneSampleWithMaskedInBetweenTokens) {
  std::vector<AgentTurn> turns = {
      Turn({1, 2, 3}, {10, 11}, {-0.1f, -0.2f}),
      Turn({1, 2, 3, 10, 11, 20, 21, 22}, {12}, {-0.3f}),
      Turn({1, 2, 3, 10, 11, 20, 21, 22, 12, 30}, {13, 14}, {-0.4f, -0.5f}, "length")};
  turns[0].weight_version = "w1";
  turns[2].weight_version = "w2";
  auto segments = BuildSegments(Input(), turns, [](std::span<const int32_t> ids) {
    return "<" + std::to_string(ids.size()) + ">";
  });
  ASSERT_TRUE(segments.ok()) << segments.status();
  ASSERT_EQ(segments->size(), 1u);
  const data::Sample& s = (*segments)[0];
  EXPECT_EQ(s.tokens, (Ids{1, 2, 3, 10, 11, 20, 21, 22, 12, 30, 13, 14}));
  EXPECT_EQ(s.response_length, 9);
  EXPECT_EQ(s.loss_mask, (std::vector<uint8_t>{1, 1, 0, 0, 0, 1, 0, 1, 1}));
  EXPECT_EQ(s.rollout_log_probs,
            (std::vector<float>{-0.1f, -0.2f, 0, 0, 0, -0.3f, 0, -0.4f, -0.5f}));
  EXPECT_EQ(s.response, "o<3>o<1>o");
  EXPECT_EQ(s.status, data::SampleStatus::kTruncated);
  EXPECT_EQ(s.weight_versions, (std::vector<std::string>{"w1", "w2"}));
  EXPECT_EQ(s.group_index, 3);
  EXPECT_EQ(s.index, 7);
  EXPECT_EQ(s.label, "5");
  EXPECT_EQ(s.metadata["k"], "v");
  EXPECT_EQ(s.metadata["agent_turns"], 3);
  EXPECT_TRUE(s.Validate().ok()) << s.Validate();
}

TEST(BuildSegmentsTest, ATurnThatDoesNotExtendStartsANewSegment) {
  std::vector<AgentTurn> turns = {Turn({1, 2}, {10}, {-0.1f}),
                                  Turn({1, 2, 10, 5}, {11}, {-0.2f}),
                                  Turn({1, 9}, {12, 13}, {-0.3f, -0.4f}),  // context rewritten
                                  Turn({1, 9, 12, 13}, {14}, {-0.5f}, "abort")};
  auto segments = BuildSegments(Input(), turns, nullptr);
  ASSERT_TRUE(segments.ok()) << segments.status();
  ASSERT_EQ(segments->size(), 2u);
  const data::Sample& a = (*segments)[0];
  EXPECT_EQ(a.tokens, (Ids{1, 2, 10, 5, 11}));
  EXPECT_EQ(a.PromptLength(), 2);
  EXPECT_EQ(a.loss_mask, (std::vector<uint8_t>{1, 0, 1}));
  EXPECT_EQ(a.rollout_log_probs, (std::vector<float>{-0.1f, 0, -0.2f}));
  EXPECT_EQ(a.status, data::SampleStatus::kCompleted);
  EXPECT_EQ(a.metadata["agent_turns"], 2);
  const data::Sample& b = (*segments)[1];
  EXPECT_EQ(b.tokens, (Ids{1, 9, 12, 13, 14}));  // nothing in between: prompt = turn 3's
  EXPECT_EQ(b.PromptLength(), 2);
  EXPECT_EQ(b.loss_mask, (std::vector<uint8_t>{1, 1, 1}));
  EXPECT_EQ(b.rollout_log_probs, (std::vector<float>{-0.3f, -0.4f, -0.5f}));
  EXPECT_EQ(b.status, data::SampleStatus::kAborted);
  EXPECT_EQ(b.group_index, 3);
  for (const auto& s : *segments) EXPECT_TRUE(s.Validate().ok()) << s.Validate();
}

TEST(BuildSegmentsTest, NoTurnsNoSegmentsAndBadLogProbsAreAnError) {
  auto none = BuildSegments(Input(), {}, nullptr);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  auto bad = BuildSegments(Input(), std::vector<AgentTurn>{Turn({1}, {2, 3}, {-1})}, nullptr);
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("1 log-probs for 2 output ids"), std::string::npos);
}

// ---- OpenAI wire format ---------------------------------------------------------------------

ChatRequestError ParseError(std::string body) {
  ChatRequest request;
  ChatRequestError error;
  EXPECT_FALSE(ParseChatRequest(body, false, &request, &error)) << body;
  return error;
}

TEST(OpenAiChatTest, BadRequestsNameTheField) {
  EXPECT_EQ(ParseError("{nope").message, "the request body is not valid JSON");
  EXPECT_EQ(ParseError("[]").message, "the request body must be a JSON object");
  EXPECT_EQ(ParseError("{}").param, "messages");
  EXPECT_EQ(ParseError(R"({"messages": []})").param, "messages");
  EXPECT_EQ(ParseError(R"({"messages": [{"content": "x"}]})").param, "messages[0].role");
  auto role = ParseError(R"({"messages": [{"role": "robot", "content": "x"}]})");
  EXPECT_EQ(role.param, "messages[0].role");
  EXPECT_NE(role.message.find("\"robot\" is not one of"), std::string::npos);
  EXPECT_EQ(ParseError(R"({"messages": [{"role": "user", "content": 5}]})").param,
            "messages[0].content");
  EXPECT_EQ(ParseError(R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})")
                .param,
            "messages[0].content[0]");
  EXPECT_EQ(ParseError(R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {}}]}]})")
                .param,
            "messages[0].tool_calls[0].function.name");
  const std::string ok_messages = R"("messages": [{"role": "user", "content": "x"}])";
  EXPECT_EQ(ParseError("{" + ok_messages + R"(, "max_tokens": 0})").param, "max_tokens");
  EXPECT_EQ(ParseError("{" + ok_messages + R"(, "temperature": "hot"})").param, "temperature");
  EXPECT_EQ(ParseError("{" + ok_messages + R"(, "n": 2})").param, "n");
  EXPECT_EQ(ParseError("{" + ok_messages + R"(, "stop": [1]})").param, "stop");
  EXPECT_EQ(ParseError("{" + ok_messages + R"(, "stream": "yes"})").param, "stream");
  EXPECT_EQ(ParseError("{" + ok_messages + R"(, "tools": [{"type": "function"}]})").param,
            "tools[0].function.name");
}

TEST(OpenAiChatTest, ParsesMessagesToolsAndOverrides) {
  ChatRequest r;
  ChatRequestError e;
  ASSERT_TRUE(ParseChatRequest(
      R"({"model": "m", "messages": [{"role": "developer", "content": "sys"},
          {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
          "tools": [{"type": "function", "function": {"name": "add"}}], "max_tokens": 16,
          "stop": "END", "temperature": 0.2, "seed": 3, "stream": true,
          "stream_options": {"include_usage": true}})",
      false, &r, &e))
      << e.message;
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.messages[0]["role"], "system");
  EXPECT_EQ(r.messages[1]["content"], "ab");
  EXPECT_EQ(r.tools.size(), 1u);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  // temperature and seed are not honored by default: the rollout's sampling stays in force.
  EXPECT_EQ(r.overrides, (nlohmann::json{{"max_new_tokens", 16}, {"stop", {"END"}}}));
  ChatRequest honored;
  ASSERT_TRUE(ParseChatRequest(
      R"({"messages": [{"role": "user", "content": "x"}], "temperature": 0.5, "seed": 3,
          "max_completion_tokens": 4, "tool_choice": "none",
          "tools": [{"type": "function", "function": {"name": "add"}}]})",
      true, &honored, &e));
  EXPECT_EQ(honored.overrides,
            (nlohmann::json{{"max_new_tokens", 4}, {"temperature", 0.5}, {"sampling_seed", 3}}));
  EXPECT_TRUE(honored.tools.is_null());  // tool_choice "none": no tools offered
}

TEST(OpenAiChatTest, ToolCallsAreReadBackOutOfTheText) {
  ojson plain = ReplyMessage("hello", ToolCallSyntax::kHermes, true, "c");
  EXPECT_EQ(plain, (ojson{{"role", "assistant"}, {"content", "hello"}}));
  ojson hermes = ReplyMessage(
      "Let me add.\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 2, \"b\": 3}}\n"
      "</tool_call>\n<tool_call>\n{\"name\": \"neg\", \"arguments\": {\"x\": 1}}\n</tool_call>",
      ToolCallSyntax::kHermes, true, "call_s_0");
  EXPECT_EQ(hermes["content"], "Let me add.");
  ASSERT_EQ(hermes["tool_calls"].size(), 2u);
  EXPECT_EQ(hermes["tool_calls"][0],
            (ojson{{"id", "call_s_0_0"},
                   {"type", "function"},
                   {"function", {{"name", "add"}, {"arguments", "{\"a\":2,\"b\":3}"}}}}));
  EXPECT_EQ(hermes["tool_calls"][1]["function"]["name"], "neg");
  EXPECT_EQ(OpenAiFinishReason("stop", hermes), "tool_calls");
  EXPECT_EQ(OpenAiFinishReason("length", hermes), "length");
  EXPECT_EQ(OpenAiFinishReason("stop", plain), "stop");
  // Without tools in the request, or malformed, the text stays content.
  EXPECT_FALSE(ReplyMessage("<tool_call>\n{\"name\": \"a\"}\n</tool_call>", ToolCallSyntax::kHermes,
                            false, "c")
                   .contains("tool_calls"));
  EXPECT_EQ(ReplyMessage("<tool_call>\nnot json\n</tool_call>", ToolCallSyntax::kHermes, true, "c")
                ["content"],
            "<tool_call>\nnot json\n</tool_call>");
  ojson llama = ReplyMessage("{\"name\": \"add\", \"parameters\": {\"a\": 1}}",
                             ToolCallSyntax::kLlamaJson, true, "c");
  EXPECT_TRUE(llama["content"].is_null());
  EXPECT_EQ(llama["tool_calls"][0]["function"]["arguments"], "{\"a\":1}");
}

TEST(OpenAiChatTest, BodiesAndStreamEvents) {
  CompletionInfo info{"chatcmpl-x", "m", 100, 7, 2};
  ojson reply = {{"role", "assistant"}, {"content", "hi"}};
  ojson body = CompletionBody(info, reply, "stop");
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["choices"][0]["message"], reply);
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(body["usage"]["total_tokens"], 9);
  auto events = CompletionEvents(info, reply, "stop", /*include_usage=*/true);
  ASSERT_EQ(events.size(), 5u);  // role, content, finish, usage, [DONE]
  EXPECT_TRUE(events[0].starts_with("data: {\"id\":\"chatcmpl-x\",\"object\":\"chat.completion.chunk\""));
  EXPECT_NE(events[1].find("\"delta\":{\"content\":\"hi\"}"), std::string::npos);
  EXPECT_NE(events[2].find("\"finish_reason\":\"stop\""), std::string::npos);
  EXPECT_NE(events[3].find("\"usage\":{\"prompt_tokens\":7"), std::string::npos);
  EXPECT_EQ(events[4], "data: [DONE]\n\n");
  auto error = OpenAiError("bad", "invalid_request_error", "messages");
  EXPECT_EQ(error.dump(),
            R"({"error":{"code":null,"message":"bad","param":"messages","type":"invalid_request_error"}})");
}

TEST(ShellJoinTest, QuotesWhatTheShellWouldSplitOrExpand) {
  EXPECT_EQ(ShellJoin({"python3", "my_agent.py", "--k=v"}), "python3 my_agent.py --k=v");
  EXPECT_EQ(ShellJoin({"echo", "a b", "$HOME", "it's", ""}),
            "echo 'a b' '$HOME' 'it'\\''s' ''");
}

}  // namespace
}  // namespace slime::agent
