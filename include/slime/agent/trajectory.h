// Agent trajectories: the model calls one agent session made, how a later call's prompt is
// built so that it contains exactly the tokens generated earlier, and how the calls become
// training samples when the session ends.
//
// Re-tokenization drift. An agent sends the whole conversation on every call, its earlier
// assistant replies included, as text (and tool calls). Rendering and tokenizing that text again
// need not give the ids the model generated (different merges, tool-call JSON re-serialized,
// a <think> block dropped). BuildPrompt therefore renders the conversation, finds each earlier
// reply's span in the rendered text (between the prompt that produced it and the template's
// end-of-turn suffix) and puts the recorded output ids there instead of tokenizing that span.
// A reply is recognised by what the server answered (SameReply: content and tool calls). When the
// text before a reply equals the prompt text of the turn that generated it, that turn's prompt ids
// are reused verbatim, so a conversation that only grows yields prompts that extend the previous
// prompt + output token for token.
//
// Samples. BuildSegments walks the turns in order: a turn whose prompt ids start with the current
// sample's tokens (previous prompt + outputs + what came between) continues that sample — the ids
// in between (tool results, user messages, template tokens) are appended with loss mask 0, the
// model's output ids with loss mask 1 and their log-probs. A turn that does not extend it starts a
// new sample (a new segment of CustomGenerateResult).
//
// Thread-safety: plain functions over values; a ChatCodec implementation must be usable from the
// calling thread.
#ifndef SLIME_AGENT_TRAJECTORY_H_
#define SLIME_AGENT_TRAJECTORY_H_

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "nlohmann/json.hpp"
#include "slime/common/status.h"
#include "slime/data/sample.h"

namespace slime::agent {

// One model call of a session, as the session server recorded it.
struct AgentTurn {
  std::string prompt_text;          // the rendered conversation, generation prompt included
  std::vector<int32_t> prompt_ids;  // the engine's input ids (earlier outputs spliced in)
  std::vector<int32_t> output_ids;  // what the engine generated
  std::vector<float> log_probs;     // [output_ids.size()]
  std::string output_text;          // output_ids decoded, special tokens kept
  std::string finish_reason;        // "stop", "length" or "abort"
  std::string weight_version;       // the engine's weight version ("" when unknown)
  nlohmann::ordered_json reply;     // the assistant message answered to the agent
};

// What prompt building needs from a chat template and a tokenizer. TokenizerChatCodec
// (session_server.h) implements it with tokenizer::Tokenizer; tests write small ones.
class ChatCodec {
 public:
  virtual ~ChatCodec() = default;
  // The conversation rendered by the chat template (with the request's tools bound).
  virtual StatusOr<std::string> Render(const nlohmann::ordered_json& messages,
                                       bool add_generation_prompt) const = 0;
  virtual std::vector<int32_t> Encode(std::string_view text) const = 0;
  // The text of `id` if it is a special token (e.g. "<|im_end|>"), otherwise "".
  virtual std::string SpecialTokenText(int32_t id) const = 0;
};

struct BuiltPrompt {
  std::string text;               // the rendered conversation (generation prompt included)
  std::vector<int32_t> ids;       // token ids, recorded outputs spliced in
  std::vector<int> spliced_turns;  // for each spliced reply, the index of its turn
};

// Renders `messages` (an array of OpenAI chat messages) with the generation prompt and tokenizes
// it, splicing in the output ids of `turns` for the assistant messages that are their replies
// (see the file comment). A reply whose span cannot be located (the template rendered the
// conversation before it differently) is tokenized as text. Errors: the template's (Render).
StatusOr<BuiltPrompt> BuildPrompt(const ChatCodec& codec, const nlohmann::ordered_json& messages,
                                  std::span<const AgentTurn> turns);

// True when assistant messages `a` and `b` say the same thing: equal content (null and ""
// are equal) and the same tool calls in order (function name and arguments, compared as JSON
// when the arguments string parses). Ids, roles and other fields are ignored.
bool SameReply(const nlohmann::ordered_json& a, const nlohmann::ordered_json& b);

// Decodes ids for Sample::response (may be null: spans between outputs then add no text).
using DecodeFn = std::function<std::string(std::span<const int32_t>)>;

// The training samples of a finished session (see the file comment). Each segment copies
// `input` (group, index, prompt, label, metadata) with tokens = its first turn's prompt ids and
// the response built from the turns; prompt_text = that turn's prompt text; status from the
// segment's last turn's finish reason; metadata["agent_turns"] = its number of turns.
// No turns → no segments. Errors: a turn whose log_probs do not match its output ids.
StatusOr<std::vector<data::Sample>> BuildSegments(const data::Sample& input,
                                                  std::span<const AgentTurn> turns,
                                                  const DecodeFn& decode);

}  // namespace slime::agent

#endif  // SLIME_AGENT_TRAJECTORY_H_
