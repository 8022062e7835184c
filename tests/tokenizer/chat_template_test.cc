// Chat template tests that need no downloaded data: family recognition, Python-style JSON, and
// renderings of the families whose real templates are not among the fetched tokenizers
// (qwen2, qwen2.5, llama3.1, llama3.2), written out by hand from those templates' logic. The
// qwen3 and llama3 renderers are compared with Hugging Face in real_tokenizer_test.cc.
#include "slime/tokenizer/chat_template.h"

#include <regex>

#include <gtest/gtest.h>

namespace slime::tokenizer {
namespace {

using OJson = nlohmann::ordered_json;

OJson Msg(const std::string& role, const std::string& content) {
  return OJson{{"role", role}, {"content", content}};
}

OJson WeatherTool() {
  return OJson::parse(R"({"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object"}}})");
}

OJson ToolCallMessage(const std::string& name, const OJson& args) {
  OJson call = {{"type", "function"}, {"function", {{"name", name}, {"arguments", args}}}};
  return OJson{{"role", "assistant"}, {"content", ""}, {"tool_calls", OJson::array({call})}};
}

std::string Render(const ChatTemplate& t, const OJson& messages, bool gen,
                   const OJson& tools = nullptr, const OJson& kwargs = OJson::object()) {
  ChatTemplateOptions options;
  options.add_generation_prompt = gen;
  options.tools = tools;
  options.kwargs = kwargs;
  auto out = t.Apply(messages, options);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : "";
}

TEST(PyJsonDumpsTest, MatchesPythonJsonDumps) {
  OJson v = OJson::parse(
      R"({"a": 1, "b": [true, null, 1.5, 1e-06, 1e16, 100.0, 0.0001, 123456789.123, -0.0,
          1e22, 5e-324], "c": "\u00e9\n\"\u0001\u007f"})");
  EXPECT_EQ(PyJsonDumps(v), "{\"a\": 1, \"b\": [true, null, 1.5, 1e-06, 1e+16, 100.0, 0.0001, "
                            "123456789.123, -0.0, 1e+22, 5e-324], \"c\": \"\u00e9\\n\\\"\\u0001"
                            "\x7f\"}");
  OJson nested = OJson::parse(R"({"a": [], "b": {}, "c": [1, {"d": 2}]})");
  EXPECT_EQ(PyJsonDumps(nested, 4),
            "{\n    \"a\": [],\n    \"b\": {},\n    \"c\": [\n        1,\n        {\n"
            "            \"d\": 2\n        }\n    ]\n}");
  // Key order is insertion order, as for Python dicts.
  EXPECT_EQ(PyJsonDumps(OJson::parse(R"({"z": 1, "a": 2})")), "{\"z\": 1, \"a\": 2}");
}

TEST(ChatTemplateDetectTest, RecognisesFamiliesByTheirMarkers) {
  auto family = [](std::string_view jinja) -> std::string {
    auto t = ChatTemplate::FromJinja(jinja, "<s>", "</s>");
    return t.ok() ? std::string(ChatTemplateFamilyName(t->family())) : "error";
  };
  EXPECT_EQ(family("{{'<|im_start|>' + m + '<|im_end|>'}}"), "qwen2");
  EXPECT_EQ(family("{% if tools %}<tools>{% endif %}{{- '<|im_start|>system\\nSys.<|im_end|>\\n' "
                   "}}<|im_end|>"),
            "qwen2.5");
  EXPECT_EQ(family("<|im_start|><|im_end|> reasoning_content <think> enable_thinking "
                   "<tool_response>"),
            "qwen3");
  EXPECT_EQ(family("<|start_header_id|><|eot_id|> add_generation_prompt"), "llama3");
  EXPECT_EQ(family("<|start_header_id|><|eot_id|> Cutting Knowledge Date builtin_tools"),
            "llama3.1");
  EXPECT_EQ(family("<|start_header_id|><|eot_id|> Cutting Knowledge Date strftime_now"),
            "llama3.2");
  // Unknown templates and unknown variants are refused, naming what is supported.
  for (std::string_view jinja : {"{{ bos_token }}{{ messages }}", "<|im_start|><|im_end|><think>",
                                 "<|im_start|><|im_end|> tool_calls", "[INST] {{ m }} [/INST]"}) {
    auto t = ChatTemplate::FromJinja(jinja, "", "");
    ASSERT_FALSE(t.ok()) << jinja;
    EXPECT_NE(std::string(t.status().message()).find(SupportedChatTemplateFamilies()),
              std::string::npos);
  }
}

TEST(ChatTemplateDetectTest, ReadsTheDefaultSystemPrompt) {
  auto t = ChatTemplate::FromJinja(
      "{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nPlease reason step by "
      "step, and put your final answer within \\\\boxed{}.<|im_end|>\\n' }}{% endif %}"
      "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' }}",
      "", "");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->family(), ChatTemplateFamily::kQwen2);
  EXPECT_EQ(t->default_system(),
            "Please reason step by step, and put your final answer within \\boxed{}.");
  // A ChatML template without a default system prompt adds none.
  auto plain = ChatTemplate::FromJinja("{{ '<|im_start|>' + role + '<|im_end|>' }}", "", "");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(Render(*plain, OJson::array({Msg("user", "Hi")}), true),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_TRUE(ParseChatTemplateFamily("llama3.2").ok());
  EXPECT_FALSE(ParseChatTemplateFamily("mistral").ok());
}

TEST(Qwen2TemplateTest, DefaultSystemAndNoTools) {
  ChatTemplate t = ChatTemplate::ForFamily(ChatTemplateFamily::kQwen2, "", "<|im_end|>");
  EXPECT_EQ(Render(t, OJson::array({Msg("user", "Hi")}), false),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n");
  EXPECT_EQ(Render(t, OJson::array({Msg("system", "S"), Msg("user", "Hi")}), true),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n");
  ChatTemplateOptions with_tools;
  with_tools.tools = OJson::array({WeatherTool()});
  EXPECT_FALSE(t.Apply(OJson::array({Msg("user", "Hi")}), with_tools).ok());
}

TEST(Qwen25TemplateTest, ToolsToolCallsAndResponses) {
  ChatTemplate t = ChatTemplate::ForFamily(ChatTemplateFamily::kQwen25, "", "<|im_end|>");
  EXPECT_EQ(Render(t, OJson::array({Msg("user", "Hi")}), true),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
            "assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  OJson messages = OJson::array({Msg("user", "Weather?"),
                                 ToolCallMessage("get_weather", {{"city", "Paris"}}),
                                 Msg("tool", "sunny"), Msg("tool", "windy")});
  EXPECT_EQ(Render(t, messages, false, OJson::array({WeatherTool()})),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
            "assistant.\n\n# Tools\n\nYou may call one or more functions to assist with the user "
            "query.\n\nYou are provided with function signatures within <tools></tools> XML "
            "tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
            "\"parameters\": {\"type\": \"object\"}}}\n</tools>\n\nFor each function call, return "
            "a json object with function name and arguments within <tool_call></tool_call> XML "
            "tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
            "<args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nWeather?<|im_end|>\n"
            "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
            "{\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n"
            "sunny\n</tool_response>\n<tool_response>\nwindy\n</tool_response><|im_end|>\n");
}

TEST(Qwen3TemplateTest, ThinkingSwitchAndHistory) {
  ChatTemplate t = ChatTemplate::ForFamily(ChatTemplateFamily::kQwen3, "", "<|im_end|>");
  OJson one = OJson::array({Msg("user", "Hi")});
  EXPECT_EQ(Render(t, one, true), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(Render(t, one, true, nullptr, {{"enable_thinking", false}}),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  // Thinking of turns before the last user query is dropped; the last turn keeps it.
  OJson history = OJson::array({Msg("user", "a"), Msg("assistant", "<think>\nr1\n</think>\n\nx"),
                                Msg("user", "b"), Msg("assistant", "<think>r2</think>y")});
  EXPECT_EQ(Render(t, history, false),
            "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\nx<|im_end|>\n"
            "<|im_start|>user\nb<|im_end|>\n<|im_start|>assistant\n<think>\nr2\n</think>\n\n"
            "y<|im_end|>\n");
}

TEST(Llama31TemplateTest, DateHeaderAndToolsInFirstUserMessage) {
  ChatTemplate t =
      ChatTemplate::ForFamily(ChatTemplateFamily::kLlama31, "<|begin_of_text|>", "<|eot_id|>");
  EXPECT_EQ(Render(t, OJson::array({Msg("user", " Hi ")}), false, nullptr,
                   {{"date_string", "01 Jan 2025"}}),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge "
            "Date: December 2023\nToday Date: 01 Jan 2025\n\n<|eot_id|><|start_header_id|>user"
            "<|end_header_id|>\n\nHi<|eot_id|>");
  OJson messages = OJson::array({Msg("system", "You are helpful. "), Msg("user", "Weather?")});
  EXPECT_EQ(Render(t, messages, true, OJson::array({WeatherTool()})),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython"
            "\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nYou are helpful."
            "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, "
            "please respond with a JSON for a function call with its proper arguments that best "
            "answers the given prompt.\n\nRespond in the format {\"name\": function name, "
            "\"parameters\": dictionary of argument name and its value}.Do not use variables.\n\n"
            "{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": "
            "\"get_weather\",\n        \"parameters\": {\n            \"type\": \"object\"\n"
            "        }\n    }\n}\n\nWeather?<|eot_id|><|start_header_id|>assistant"
            "<|end_header_id|>\n\n");
  // Tools in the system message instead.
  const std::string in_system = Render(t, messages, false, OJson::array({WeatherTool()}),
                                       {{"tools_in_user_message", false}});
  EXPECT_NE(in_system.find("26 Jul 2024\n\nYou have access to the following functions. To call "
                           "a function, please respond with JSON for a function call.Respond"),
            std::string::npos)
      << in_system;
  EXPECT_NE(in_system.find("}\n\nYou are helpful.<|eot_id|><|start_header_id|>user"),
            std::string::npos)
      << in_system;
}

TEST(Llama31TemplateTest, ToolCallsResultsAndBuiltinTools) {
  ChatTemplate t =
      ChatTemplate::ForFamily(ChatTemplateFamily::kLlama31, "<|begin_of_text|>", "<|eot_id|>");
  OJson messages = OJson::array({Msg("user", "Weather?"),
                                 ToolCallMessage("get_weather", {{"city", "Paris"}}),
                                 Msg("tool", "sunny, 21\u00b0C")});
  const std::string out = Render(t, messages, false);
  EXPECT_NE(out.find("<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": "
                     "\"get_weather\", \"parameters\": {\"city\": \"Paris\"}}<|eot_id|>"
                     "<|start_header_id|>ipython<|end_header_id|>\n\n\"sunny, 21\u00b0C\""
                     "<|eot_id|>"),
            std::string::npos)
      << out;
  OJson builtin_messages = OJson::array(
      {Msg("user", "Search x"), ToolCallMessage("brave_search", {{"query", "x"}})});
  const std::string builtin =
      Render(t, builtin_messages, false, nullptr,
             {{"builtin_tools", OJson::array({"brave_search", "code_interpreter"})}});
  EXPECT_NE(builtin.find("Environment: ipython\nTools: brave_search\n\nCutting Knowledge"),
            std::string::npos)
      << builtin;
  EXPECT_NE(builtin.find("<|python_tag|>brave_search.call(query=\"x\")<|eom_id|>"),
            std::string::npos)
      << builtin;
}

TEST(Llama31TemplateTest, RefusesWhatTheTemplateRefuses) {
  ChatTemplate t = ChatTemplate::ForFamily(ChatTemplateFamily::kLlama31, "", "");
  OJson two_calls = ToolCallMessage("a", OJson::object());
  two_calls["tool_calls"].push_back(two_calls["tool_calls"][0]);
  auto multi = t.Apply(OJson::array({Msg("user", "q"), two_calls}), {});
  ASSERT_FALSE(multi.ok());
  EXPECT_NE(std::string(multi.status().message()).find("single tool-calls"), std::string::npos);
  ChatTemplateOptions tools;
  tools.tools = OJson::array({WeatherTool()});
  EXPECT_FALSE(t.Apply(OJson::array({Msg("system", "only system")}), tools).ok());
}

TEST(Llama32TemplateTest, DefaultDateIsToday) {
  ChatTemplate t = ChatTemplate::ForFamily(ChatTemplateFamily::kLlama32, "<|begin_of_text|>", "");
  const std::string out = Render(t, OJson::array({Msg("user", "Hi")}), true);
  EXPECT_TRUE(std::regex_search(out, std::regex("Today Date: \\d\\d [A-Z][a-z]{2} \\d{4}\n\n")))
      << out;
  // builtin_tools belong to 3.1 only: 3.2 ignores them, like its template.
  const std::string with_builtin =
      Render(t, OJson::array({Msg("user", "Hi")}), false, nullptr,
             {{"builtin_tools", OJson::array({"brave_search"})}, {"date_string", "x"}});
  EXPECT_EQ(with_builtin.find("Environment"), std::string::npos);
}

TEST(ChatTemplateInputTest, MalformedMessagesAreErrorsNamingTheField) {
  ChatTemplate t = ChatTemplate::ForFamily(ChatTemplateFamily::kQwen3, "", "");
  struct Case {
    OJson messages;
    std::string expect;
  };
  for (const Case& c : std::vector<Case>{
           {OJson::array(), "non-empty"},
           {OJson::object(), "non-empty"},
           {OJson::array({"text"}), "messages[0]"},
           {OJson::array({{{"content", "x"}}}), "messages[0]: missing string \"role\""},
           {OJson::array({Msg("user", "x"), {{"role", "user"}, {"content", 5}}}),
            "messages[1].content"},
           {OJson::array({{{"role", "assistant"}, {"content", "x"}, {"reasoning_content", 1}}}),
            "reasoning_content"},
           {OJson::array({{{"role", "assistant"},
                           {"content", "x"},
                           {"tool_calls", OJson::array({{{"function", {{"arguments", "{}"}}}}})}}}),
            "tool_calls[0]: missing function name"}}) {
    auto out = t.Apply(c.messages, {});
    ASSERT_FALSE(out.ok()) << c.messages.dump();
    EXPECT_NE(std::string(out.status().message()).find(c.expect), std::string::npos)
        << out.status();
  }
  // null content renders as empty.
  EXPECT_EQ(Render(t, OJson::array({{{"role", "user"}, {"content", nullptr}}}), false),
            "<|im_start|>user\n<|im_end|>\n");
}

}  // namespace
}  // namespace slime::tokenizer
