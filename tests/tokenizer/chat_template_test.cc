// ChatTemplate (slime/tokenizer/chat_template.h): the variables apply_chat_template passes to
// the template, input validation, tool-call format detection, and — with the fetched Qwen3 and
// Llama-3 tokenizers (scripts/fetch_test_data.sh; skipped without them) — the renderings that
// the hand-written renderers used to be checked against (Hugging Face outputs).
#include "slime/tokenizer/chat_template.h"

#include <gtest/gtest.h>

#include "slime/tokenizer/tokenizer.h"
#include "test_util.h"

namespace slime::tokenizer {
namespace {

using OJson = nlohmann::ordered_json;
using ::slime::tokenizer::testing::TestDataDir;

OJson Msg(const std::string& role, const std::string& content) {
  return OJson{{"role", role}, {"content", content}};
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

// A ChatML template with tools, written for these tests.
constexpr std::string_view kChatMl =
    "{%- if tools %}{{ '<|im_start|>system\\nTools:' }}{% for t in tools %} {{ t.function.name }}"
    "{% endfor %}{{ '<|im_end|>\\n' }}{% endif %}\n"
    "{%- for m in messages %}\n"
    "  {%- if m.role == 'tool' %}{{ '<|im_start|>user\\n<tool_response>' + m.content + "
    "'</tool_response><|im_end|>\\n' }}\n"
    "  {%- else %}{{ '<|im_start|>' + m.role + '\\n' + (m.content or '') }}\n"
    "    {%- for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>"
    "{% endfor %}{{ '<|im_end|>\\n' }}\n"
    "  {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

TEST(ChatTemplateTest, RendersWithTheVariablesOfApplyChatTemplate) {
  auto t = ChatTemplate::FromJinja(kChatMl, "", "<|im_end|>");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(Render(*t, OJson::array({Msg("user", "Hi")}), true),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  OJson call = OJson::parse(R"({"role": "assistant", "content": null, "tool_calls": [
      {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]})");
  OJson tools = OJson::parse(R"([{"type": "function", "function": {"name": "get_weather"}}])");
  EXPECT_EQ(Render(*t, OJson::array({Msg("user", "W?"), call, Msg("tool", "sunny")}), false, tools),
            "<|im_start|>system\nTools: get_weather<|im_end|>\n<|im_start|>user\nW?<|im_end|>\n"
            "<|im_start|>assistant\n<tool_call>{\"name\": \"get_weather\", \"arguments\": "
            "{\"city\": \"Paris\"}}</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>sunny"
            "</tool_response><|im_end|>\n");
  EXPECT_EQ(t->tool_call_format(), ToolCallFormat::kHermes);
  EXPECT_TRUE(t->has_tool_role());

  // tools / documents are defined and none without tools; special tokens only when set;
  // kwargs become variables.
  auto vars = ChatTemplate::FromJinja(
      "{{ tools is none }} {{ documents is none }} {{ bos_token is defined }} {{ eos_token }} "
      "{{ enable_thinking }} {{ add_generation_prompt }} {{ messages | length }}",
      "", "</s>");
  ASSERT_TRUE(vars.ok());
  EXPECT_EQ(Render(*vars, OJson::array(), true, nullptr, {{"enable_thinking", false}}),
            "True True False </s> False True 0");
}

TEST(ChatTemplateTest, DetectsToolCallFormatAndToolRole) {
  struct Case {
    std::string_view jinja;
    ToolCallFormat format;
    bool tool_role;
  };
  for (const Case& c : std::vector<Case>{
           {"{{ '<|im_start|>' + m.role }}", ToolCallFormat::kNone, false},
           {"{% if m.role == 'tool' %}<tool_call>{% endif %}", ToolCallFormat::kHermes, true},
           {"<|start_header_id|>{% if m.role == \"ipython\" %}{{ m.tool_calls }}{% endif %}",
            ToolCallFormat::kLlamaJson, true},
           {"{{ '<|python_tag|>' }}", ToolCallFormat::kLlamaJson, false},
           {"<|start_header_id|>{{ m.role }}<|eot_id|>", ToolCallFormat::kNone, false}}) {
    auto t = ChatTemplate::FromJinja(c.jinja, "", "");
    ASSERT_TRUE(t.ok()) << c.jinja;
    EXPECT_EQ(t->tool_call_format(), c.format) << c.jinja;
    EXPECT_EQ(t->has_tool_role(), c.tool_role) << c.jinja;
  }
}

TEST(ChatTemplateTest, BadInputAndTemplateErrorsAreNamed) {
  auto parse_error = ChatTemplate::FromJinja("{% for m in messages %}", "", "");
  ASSERT_FALSE(parse_error.ok());
  EXPECT_EQ(parse_error.status().message(),
            "chat template line 1: 'for' is never closed (expected 'endfor')");

  auto t = ChatTemplate::FromJinja(
      "{% for m in messages %}{% if m.role not in ['user', 'assistant'] %}"
      "{{ raise_exception('unsupported role ' + m.role) }}{% endif %}{{ m.content }}{% endfor %}",
      "", "");
  ASSERT_TRUE(t.ok());
  struct Case {
    OJson messages;
    ChatTemplateOptions options;
    std::string expect;
  };
  ChatTemplateOptions bad_tools;
  bad_tools.tools = "x";
  ChatTemplateOptions reserved;
  reserved.kwargs = {{"messages", 1}};
  for (const Case& c : std::vector<Case>{
           {OJson::object(), {}, "messages must be an array"},
           {OJson::array({"text"}), {}, "messages[0] must be an object"},
           {OJson::array({Msg("user", "x")}), bad_tools, "tools must be an array"},
           {OJson::array({Msg("user", "x")}), reserved, "may not set 'messages'"},
           {OJson::array({Msg("system", "x")}), {}, "chat template line 1: unsupported role system"}}) {
    auto out = t->Apply(c.messages, c.options);
    ASSERT_FALSE(out.ok()) << c.messages.dump();
    EXPECT_NE(std::string(out.status().message()).find(c.expect), std::string::npos)
        << out.status();
  }
}

// The real templates, when fetched. These expectations were checked against Hugging Face.
std::unique_ptr<Tokenizer> LoadFetched(const std::string& name) {
  auto tok = Tokenizer::FromDirectory(TestDataDir() + "/" + name);
  return tok.ok() ? std::move(tok).value() : nullptr;
}

TEST(ChatTemplateRealTest, Qwen3ThinkingSwitchAndHistory) {
  auto tok = LoadFetched("qwen3");
  if (tok == nullptr) GTEST_SKIP() << "qwen3 tokenizer missing: run scripts/fetch_test_data.sh";
  const ChatTemplate& t = *tok->chat_template();
  EXPECT_EQ(t.tool_call_format(), ToolCallFormat::kHermes);
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
  // What the template does with a null content: `'</think>' in None` fails, as in Python.
  auto null_content = t.Apply(
      OJson::array({Msg("user", "a"), {{"role", "assistant"}, {"content", nullptr}}}), {});
  ASSERT_FALSE(null_content.ok());
  EXPECT_NE(std::string(null_content.status().message()).find("chat template line "),
            std::string::npos);
}

TEST(ChatTemplateRealTest, Llama3HeadersTrimmedContentAndNoToolSyntax) {
  auto tok = LoadFetched("llama3");
  if (tok == nullptr) GTEST_SKIP() << "llama3 tokenizer missing: run scripts/fetch_test_data.sh";
  const ChatTemplate& t = *tok->chat_template();
  EXPECT_EQ(t.tool_call_format(), ToolCallFormat::kNone);
  EXPECT_FALSE(t.has_tool_role());
  // The early Llama-3 template always appends the assistant header and prints None for a null
  // content (Python's str(None) through `trim`).
  EXPECT_EQ(Render(t, OJson::array({Msg("user", " Hi "), {{"role", "assistant"}, {"content", nullptr}}}),
                   false),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nNone<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

}  // namespace
}  // namespace slime::tokenizer
