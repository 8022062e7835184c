// The OpenAI chat-completions wire format as the agent session server speaks it: request
// parsing and validation, the sampling overrides a request may set, tool calls read back out of
// the model's text, and the response / SSE chunk bodies.
//
// Requests: {"model"?, "messages": [...], "tools"?, "tool_choice"?, "max_tokens"? |
// "max_completion_tokens"?, "temperature"?, "top_p"?, "stop"?, "seed"?, "n"? (1 only),
// "stream"?, "stream_options"?: {"include_usage"}, "frequency_penalty"?, "presence_penalty"?}.
// Other fields are ignored, as OpenAI-compatible servers do. Messages: objects with a "role" of
// system, developer (treated as system), user, assistant or tool; "content" a string, null, or a
// list of {"type": "text", "text"} parts (joined); assistant "tool_calls" as OpenAI sends them.
//
// Sampling: max_tokens (max_completion_tokens) and stop always apply; temperature, top_p, seed
// and the penalties apply only with `honor_sampling_params` — by default the rollout's sampling
// parameters stay in force, so the recorded log-probs are those training expects.
//
// Thread-safety: stateless functions.
#ifndef SLIME_AGENT_OPENAI_CHAT_H_
#define SLIME_AGENT_OPENAI_CHAT_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "nlohmann/json.hpp"
#include "slime/common/status.h"

namespace slime::agent {

struct ChatRequest {
  nlohmann::ordered_json messages;  // array, normalized (developer → system, text parts joined)
  nlohmann::ordered_json tools = nullptr;  // null or a non-empty array of tool definitions
  std::string model;                       // as sent ("" when absent)
  bool stream = false;
  bool include_usage = false;      // stream_options.include_usage
  nlohmann::json overrides = nlohmann::json::object();  // sampling params for the engine
};

// A 400 answer: `param` names the offending field ("messages[2].role").
struct ChatRequestError {
  std::string message;
  std::string param;
};

// Parses a request body. On error fills `error` and returns false.
bool ParseChatRequest(std::string_view body, bool honor_sampling_params, ChatRequest* request,
                      ChatRequestError* error);

// How tool calls appear in the model's text.
enum class ToolCallSyntax {
  kNone,     // the template cannot express tools: never parsed
  kHermes,   // Qwen2.5/Qwen3: <tool_call>\n{"name", "arguments"}\n</tool_call> blocks
  kLlamaJson,  // Llama-3.1/3.2: the whole reply is {"name", "parameters"}
};

// The assistant message for the model's `text` (special tokens skipped): {"role": "assistant",
// "content", "tool_calls"?}. With tools in the request, tool calls written in `syntax` become
// OpenAI tool calls (ids "<id_prefix>_<k>", arguments as a JSON string) and are removed from the
// content (null when nothing else remains). Malformed calls stay in the content.
nlohmann::ordered_json ReplyMessage(std::string_view text, ToolCallSyntax syntax, bool has_tools,
                                    std::string_view id_prefix);

// The OpenAI finish reason: "tool_calls" when the reply calls tools and the engine stopped,
// "length" for "length", otherwise "stop".
std::string OpenAiFinishReason(std::string_view engine_finish_reason,
                               const nlohmann::ordered_json& reply);

struct CompletionInfo {
  std::string id;     // "chatcmpl-..."
  std::string model;  // echoed model name
  int64_t created = 0;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
};

// The non-streaming response body.
nlohmann::ordered_json CompletionBody(const CompletionInfo& info,
                                      const nlohmann::ordered_json& reply,
                                      const std::string& finish_reason);
// The streaming answer: "data: {chunk}\n\n" events (role, content, tool calls, finish reason,
// usage when asked) and the final "data: [DONE]\n\n".
std::vector<std::string> CompletionEvents(const CompletionInfo& info,
                                          const nlohmann::ordered_json& reply,
                                          const std::string& finish_reason, bool include_usage);

// {"error": {"message", "type", "param", "code"}} — OpenAI's error shape.
nlohmann::json OpenAiError(std::string_view message, std::string_view type,
                           std::string_view param = {}, std::string_view code = {});

}  // namespace slime::agent

#endif  // SLIME_AGENT_OPENAI_CHAT_H_
