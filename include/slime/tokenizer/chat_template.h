// ChatTemplate: a model's Hugging Face chat template, rendered by slime-cpp's Jinja interpreter
// (jinja.h) exactly as transformers' `apply_chat_template(..., tokenize=False)` renders it.
//
// FromJinja parses the `chat_template` of tokenizer_config.json (or chat_template.jinja) once;
// Apply renders a conversation with the variables transformers passes to the template:
//   messages               the conversation as given (OpenAI-style dicts, any extra keys kept)
//   tools                  ChatTemplateOptions::tools, or none
//   documents              none
//   add_generation_prompt  ChatTemplateOptions::add_generation_prompt
//   bos_token, eos_token   the tokenizer's special tokens (absent when the tokenizer has none)
//   every key of ChatTemplateOptions::kwargs (e.g. enable_thinking, date_string)
// The template decides everything else — null contents, unknown roles, what it rejects with
// raise_exception — and its errors come back as InvalidArgument naming the template line.
//
// Besides rendering, the template text tells how a model writes tool calls (tool_call_format)
// and whether it has a `tool` role (has_tool_role); agents and multi-turn rollouts use these to
// parse replies and to phrase tool results.
//
// Ownership: value type (copies share the parsed template). Thread-safety: immutable; Apply may
// run concurrently from any number of threads.
#ifndef SLIME_TOKENIZER_CHAT_TEMPLATE_H_
#define SLIME_TOKENIZER_CHAT_TEMPLATE_H_

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "slime/common/status.h"
#include "slime/tokenizer/jinja.h"

namespace slime::tokenizer {

// How the model writes a tool call, read from its template's text.
enum class ToolCallFormat {
  kNone,       // the template shows no tool calls
  kHermes,     // <tool_call>{"name": ..., "arguments": ...}</tool_call> (Qwen2.5, Qwen3, Hermes)
  kLlamaJson,  // a bare JSON object {"name", "parameters"}, maybe after <|python_tag|> (Llama 3.x)
};
std::string_view ToolCallFormatName(ToolCallFormat format);

struct ChatTemplateOptions {
  // Append the header that starts the assistant's turn.
  bool add_generation_prompt = false;
  // Tool (function) definitions, an array of objects as in the OpenAI API; null for none.
  nlohmann::ordered_json tools = nullptr;
  // Extra template variables, an object (transformers' **kwargs of apply_chat_template), e.g.
  // enable_thinking (Qwen3), date_string / tools_in_user_message / builtin_tools (Llama 3.x).
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();
};

class ChatTemplate {
 public:
  // Parses a Jinja chat template. `bos_token` / `eos_token` are passed to the template (an
  // empty one is left undefined, as transformers leaves an unset special token). Error: a
  // syntax error or an unsupported construct, naming the template line.
  static StatusOr<ChatTemplate> FromJinja(std::string_view jinja, std::string bos_token,
                                          std::string eos_token);

  // Renders `messages` (an array of objects). Errors: malformed input (naming the index or the
  // option), or the template failing (naming its line; raise_exception messages verbatim).
  StatusOr<std::string> Apply(const nlohmann::ordered_json& messages,
                              const ChatTemplateOptions& options) const;

  ToolCallFormat tool_call_format() const { return tool_call_format_; }
  // Whether the template renders `tool` messages as tool results (else callers send tool
  // results as user turns).
  bool has_tool_role() const { return has_tool_role_; }
  const std::string& source() const { return source_; }

 private:
  ChatTemplate() = default;

  jinja::Template template_;
  std::string source_;
  std::string bos_token_;
  std::string eos_token_;
  ToolCallFormat tool_call_format_ = ToolCallFormat::kNone;
  bool has_tool_role_ = false;
};

}  // namespace slime::tokenizer

#endif  // SLIME_TOKENIZER_CHAT_TEMPLATE_H_
