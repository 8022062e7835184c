// EpisodeRenderer: the chat-template side of a multi-turn episode, token-in/token-out. The
// episode's token sequence is always
//
//   prompt ids  +  turn 1 output ids  +  observation 1 ids  +  turn 2 output ids  + ...
//
// where the model's output ids are kept exactly as generated (never decoded and re-encoded)
// and only the parts the model did not write are rendered and tokenized here:
//   * Prompt: the initial conversation (+ tool schemas) with the generation prompt, as
//     Hugging Face apply_chat_template would render it, tokenized without extra special tokens.
//   * Observation: what follows a model turn — the end of the assistant turn that the model
//     did not emit (e.g. "\n" after Qwen's <|im_end|>, or the whole "<|im_end|>\n" when the turn
//     was cut by length), the observation messages (tool results as `tool` messages:
//     <tool_response> in a user turn for Qwen, an `ipython` turn for Llama 3.1/3.2), and the
//     next generation prompt. It is found by rendering a conversation whose assistant turn is
//     a marker and taking the text after the marker, so it is exactly what the template puts
//     between the end of an assistant's content and the next assistant's content.
//
// Tool calls in a model turn are parsed from its text: Hermes-style
// <tool_call>{"name", "arguments"}</tool_call> blocks (templates that write <tool_call>, e.g.
// Qwen2.5/Qwen3), or — for Llama 3.x templates with tool calls — a turn that is a single JSON
// object {"name", "parameters" | "arguments"} (ChatTemplate::tool_call_format). Templates
// without a tool role (e.g. Qwen2, Llama 3.0) get tool results as user messages.
//
// Ownership: borrows the tokenizer (it must outlive the renderer). Thread-safety: immutable;
// all methods may run concurrently.
#ifndef SLIME_WORKFLOW_EPISODE_RENDER_H_
#define SLIME_WORKFLOW_EPISODE_RENDER_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "nlohmann/json.hpp"
#include "slime/common/status.h"
#include "slime/tokenizer/chat_template.h"

namespace slime::tokenizer {
class Tokenizer;
}

namespace slime::workflow {

// [{"id": "call_<turn>_<k>", "name", "arguments": object}] parsed from a model turn's text;
// blocks that are not valid JSON with a string "name" are skipped (the text still carries them).
// `format` kLlamaJson also reads a bare JSON call (after <|python_tag|>) when no tags are found.
nlohmann::ordered_json ParseToolCalls(std::string_view text, tokenizer::ToolCallFormat format,
                                      int turn);

class EpisodeRenderer {
 public:
  // Errors: the tokenizer has no supported chat template.
  static StatusOr<EpisodeRenderer> Create(const tokenizer::Tokenizer* tokenizer,
                                          nlohmann::ordered_json chat_template_kwargs);

  // A string observation as messages: [{"role": "user", "content": text}]; messages as is.
  static nlohmann::ordered_json InitialMessages(const nlohmann::ordered_json& observation);
  // The ids of the initial conversation (`messages`, an array) with `tools` (array or null)
  // and the generation prompt; `text` (optional) gets the rendering.
  StatusOr<std::vector<int32_t>> Prompt(const nlohmann::ordered_json& messages,
                                        const nlohmann::ordered_json& tools,
                                        std::string* text = nullptr) const;
  // The observation as messages after a turn: a string becomes one `tool` message when the
  // turn made tool calls (a `user` one otherwise, or for families without a tool role);
  // messages are kept (role `tool` mapped to `user` for families without one).
  nlohmann::ordered_json ObservationMessages(const nlohmann::ordered_json& observation,
                                             bool had_tool_calls) const;
  // The ids that follow a model turn whose output was `turn_ids` (see the file comment).
  // Error: the template cannot render the messages (naming the problem).
  StatusOr<std::vector<int32_t>> Observation(const nlohmann::ordered_json& messages,
                                             std::span<const int32_t> turn_ids) const;
  // The text between the marker assistant content and the next assistant content (for tests).
  StatusOr<std::string> ObservationText(const nlohmann::ordered_json& messages) const;

  tokenizer::ToolCallFormat tool_call_format() const { return tool_call_format_; }
  bool has_tool_role() const { return has_tool_role_; }

 private:
  EpisodeRenderer() = default;
  const tokenizer::Tokenizer* tokenizer_ = nullptr;
  tokenizer::ToolCallFormat tool_call_format_ = tokenizer::ToolCallFormat::kNone;
  bool has_tool_role_ = false;
  nlohmann::ordered_json kwargs_ = nlohmann::ordered_json::object();
};

}  // namespace slime::workflow

#endif  // SLIME_WORKFLOW_EPISODE_RENDER_H_
