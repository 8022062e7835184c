// ChatTemplate (chat_template.h): a parsed Jinja chat template and the variables transformers
// passes to it.
#include "slime/tokenizer/chat_template.h"

#include <fmt/format.h>

namespace slime::tokenizer {
namespace {

using OJson = nlohmann::ordered_json;

bool Contains(std::string_view s, std::string_view part) {
  return s.find(part) != std::string_view::npos;
}

// The tool-call syntax a template teaches its model: Hermes-style tags where the template
// writes <tool_call>; Llama 3.x JSON where it writes Llama headers and tool calls.
ToolCallFormat DetectToolCallFormat(std::string_view jinja) {
  if (Contains(jinja, "<tool_call>")) return ToolCallFormat::kHermes;
  if (Contains(jinja, "<|python_tag|>") ||
      (Contains(jinja, "<|start_header_id|>") && Contains(jinja, "tool_calls"))) {
    return ToolCallFormat::kLlamaJson;
  }
  return ToolCallFormat::kNone;
}

// A template with a tool role compares the role with the string 'tool' (or Llama's 'ipython').
bool DetectToolRole(std::string_view jinja) {
  return Contains(jinja, "\"tool\"") || Contains(jinja, "'tool'") || Contains(jinja, "ipython");
}

// The variables apply_chat_template sets itself; kwargs may not replace them.
constexpr std::string_view kReserved[] = {"messages", "tools", "documents",
                                          "add_generation_prompt"};

}  // namespace

std::string_view ToolCallFormatName(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kNone: return "none";
    case ToolCallFormat::kHermes: return "hermes";
    case ToolCallFormat::kLlamaJson: return "llama-json";
  }
  return "?";
}

StatusOr<ChatTemplate> ChatTemplate::FromJinja(std::string_view jinja, std::string bos_token,
                                               std::string eos_token) {
  SLIME_ASSIGN_OR_RETURN(jinja::Template parsed, jinja::Template::Parse(jinja, "chat template"));
  ChatTemplate t;
  t.template_ = std::move(parsed);
  t.source_ = std::string(jinja);
  t.bos_token_ = std::move(bos_token);
  t.eos_token_ = std::move(eos_token);
  t.tool_call_format_ = DetectToolCallFormat(jinja);
  t.has_tool_role_ = DetectToolRole(jinja);
  return t;
}

StatusOr<std::string> ChatTemplate::Apply(const OJson& messages,
                                          const ChatTemplateOptions& options) const {
  if (!messages.is_array()) {
    return absl::InvalidArgumentError(
        fmt::format("messages must be an array of message objects, got {}", messages.type_name()));
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    if (!messages[i].is_object()) {
      return absl::InvalidArgumentError(fmt::format(
          "messages[{}] must be an object like {{\"role\": ..., \"content\": ...}}, got {}", i,
          messages[i].type_name()));
    }
  }
  if (!options.tools.is_null() && !options.tools.is_array()) {
    return absl::InvalidArgumentError(
        fmt::format("tools must be an array of tool definitions, got {}", options.tools.type_name()));
  }
  if (!options.kwargs.is_null() && !options.kwargs.is_object()) {
    return absl::InvalidArgumentError(fmt::format(
        "chat template kwargs must be an object, got {}", options.kwargs.type_name()));
  }
  OJson context = OJson::object();
  if (!bos_token_.empty()) context["bos_token"] = bos_token_;
  if (!eos_token_.empty()) context["eos_token"] = eos_token_;
  if (options.kwargs.is_object()) {
    for (auto it = options.kwargs.begin(); it != options.kwargs.end(); ++it) {
      for (std::string_view reserved : kReserved) {
        if (it.key() == reserved) {
          return absl::InvalidArgumentError(fmt::format(
              "chat template kwargs may not set '{}' (apply_chat_template sets it)", reserved));
        }
      }
      context[it.key()] = it.value();
    }
  }
  context["messages"] = messages;
  context["tools"] = options.tools;
  context["documents"] = nullptr;
  context["add_generation_prompt"] = options.add_generation_prompt;
  return template_.Render(context);
}

}  // namespace slime::tokenizer
