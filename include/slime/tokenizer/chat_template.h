// ChatTemplate: native renderers for the chat templates of the model families slime-cpp
// supports. There is no Jinja engine: the `chat_template` string of tokenizer_config.json is
// inspected once, recognised as one of the families below, and rendered by C++ code written to
// produce exactly what Hugging Face `apply_chat_template(..., tokenize=False)` produces with that
// template. Unrecognised templates are refused (an error naming the supported families) rather
// than approximated.
//
// Supported families (ChatTemplateFamily):
//   qwen2     ChatML without tools (Qwen1.5/Qwen2-Instruct); the default system prompt, when the
//             template inserts one, is read from the template.
//   qwen2.5   ChatML with Hermes-style <tools>/<tool_call>/<tool_response> (Qwen2.5-Instruct,
//             Qwen2.5-Coder/Math); default system prompt read from the template.
//   qwen3     Qwen3 hybrid thinking: <think> blocks from `reasoning_content` or from the
//             content, dropped for turns before the last user query; `enable_thinking=false`
//             adds the empty think block to the generation prompt; tools as in qwen2.5.
//   llama3    Llama-3(.0)-Instruct: header tokens, trimmed contents, BOS before the first turn.
//             (Early versions always add the assistant header; this is read from the template.)
//   llama3.1  Llama-3.1/3.3-Instruct: system header with "Cutting Knowledge Date" and
//             "Today Date" (kwarg `date_string`, default "26 Jul 2024"), tools as JSON in the
//             first user turn (or the system turn with `tools_in_user_message=false`),
//             `builtin_tools` with <|python_tag|> calls and <|eom_id|>.
//   llama3.2  Llama-3.2-Instruct: as llama3.1 without builtin tools; the default date is today
//             (strftime "%d %b %Y", local time), like transformers' strftime_now.
//
// Inputs are OpenAI-style messages: [{"role", "content", "tool_calls"?, "reasoning_content"?}].
// They are nlohmann::ordered_json because key order is visible in the output (`tojson` of tools
// and tool-call arguments keeps insertion order, as Python dicts do). `content` must be a string
// or null; multimodal content lists are rejected (llama3.1/3.2 tool results may be JSON).
//
// Deliberate differences from Hugging Face, all where HF would fail or silently lose input:
//   * null content renders as "" (HF's templates raise or print "None");
//   * qwen2 and llama3 templates cannot express tools, so tools / tool_calls are an error
//     instead of being dropped;
//   * llama3.1/3.2: "tool_calls": null or [] counts as no tool call (HF raises);
//   * tool calls may be {"function": {"name", "arguments"}} or flat {"name", "arguments"}.
// Verified against Hugging Face renderings (tests/tokenizer/real_tokenizer_test.cc) for qwen3
// and llama3; the others against their templates' logic (chat_template_test.cc).
//
// Ownership: value type. Thread-safety: immutable; Apply may run concurrently.
#ifndef SLIME_TOKENIZER_CHAT_TEMPLATE_H_
#define SLIME_TOKENIZER_CHAT_TEMPLATE_H_

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "slime/common/status.h"

namespace slime::tokenizer {

enum class ChatTemplateFamily { kQwen2, kQwen25, kQwen3, kLlama3, kLlama31, kLlama32 };

// "qwen2", "qwen2.5", "qwen3", "llama3", "llama3.1", "llama3.2".
std::string_view ChatTemplateFamilyName(ChatTemplateFamily family);
// "qwen2, qwen2.5, ..." for error messages.
std::string SupportedChatTemplateFamilies();
StatusOr<ChatTemplateFamily> ParseChatTemplateFamily(std::string_view name);

struct ChatTemplateOptions {
  // Append the header that starts the assistant's turn.
  bool add_generation_prompt = false;
  // Tool (function) definitions, an array of objects as in the OpenAI API; null for none.
  nlohmann::ordered_json tools = nullptr;
  // Extra template variables, an object. Used keys: enable_thinking (qwen3, bool),
  // date_string (llama3.1/3.2), tools_in_user_message (llama3.1/3.2, default true),
  // builtin_tools (llama3.1, array of names), custom_tools (llama3.x, alias of tools).
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();
};

class ChatTemplate {
 public:
  // Recognises the family of a Jinja chat template. Error: the template matches no supported
  // family (the message lists them).
  static StatusOr<ChatTemplate> FromJinja(std::string_view jinja, std::string bos_token,
                                          std::string eos_token);
  // A template of a known family with its default settings (for tests and explicit overrides).
  static ChatTemplate ForFamily(ChatTemplateFamily family, std::string bos_token,
                                std::string eos_token);

  // Renders `messages` (an array). Errors: malformed messages (naming the index and field), or
  // conversations the template itself rejects (e.g. llama3.1 with two tool calls in one turn).
  StatusOr<std::string> Apply(const nlohmann::ordered_json& messages,
                              const ChatTemplateOptions& options) const;

  ChatTemplateFamily family() const { return family_; }
  // The system prompt inserted when the conversation has none ("" when the template adds none).
  const std::string& default_system() const { return default_system_; }

 private:
  ChatTemplate() = default;
  StatusOr<std::string> ApplyQwen(const nlohmann::ordered_json& messages,
                                  const ChatTemplateOptions& options) const;
  StatusOr<std::string> ApplyQwen3(const nlohmann::ordered_json& messages,
                                   const ChatTemplateOptions& options) const;
  StatusOr<std::string> ApplyLlama3(const nlohmann::ordered_json& messages,
                                    const ChatTemplateOptions& options) const;
  StatusOr<std::string> ApplyLlama31(const nlohmann::ordered_json& messages,
                                     const ChatTemplateOptions& options) const;

  ChatTemplateFamily family_ = ChatTemplateFamily::kQwen2;
  std::string bos_token_;
  std::string eos_token_;
  std::string default_system_;
  bool has_default_system_ = false;
  bool generation_prompt_always_ = false;  // llama3: early template without the condition
};

// Python's json.dumps(value, ensure_ascii=False, indent=indent) — the `tojson` filter of
// transformers' chat templates: ", " / ": " separators without indent, "," / ": " with it;
// keys in insertion order. indent < 0 means no indent.
std::string PyJsonDumps(const nlohmann::ordered_json& value, int indent = -1);

}  // namespace slime::tokenizer

#endif  // SLIME_TOKENIZER_CHAT_TEMPLATE_H_
