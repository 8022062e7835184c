#include "slime/agent/trajectory.h"

#include <algorithm>
#include <optional>

#include "fmt/format.h"

namespace slime::agent {
namespace {

using ojson = nlohmann::ordered_json;

// Stands in for an assistant reply's content to find where the template puts content and what
// it writes after it (the end-of-turn suffix).
constexpr std::string_view kSentinel = "<<slime-agent-span-7f3a91>>";

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

template <typename T>
bool StartsWith(std::span<const T> s, std::span<const T> prefix) {
  return s.size() >= prefix.size() && std::equal(prefix.begin(), prefix.end(), s.begin());
}

std::string ContentOf(const ojson& message) {
  auto it = message.find("content");
  if (it == message.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  return it->dump();
}

// Tool-call arguments as JSON: parsed when they are a string holding JSON, else as given.
ojson Arguments(const ojson& call) {
  const ojson* fn = &call;
  auto f = call.find("function");
  if (f != call.end() && f->is_object()) fn = &*f;
  auto a = fn->find("arguments");
  if (a == fn->end()) return nullptr;
  if (a->is_string()) {
    ojson parsed = ojson::parse(a->get<std::string>(), nullptr, /*allow_exceptions=*/false);
    return parsed.is_discarded() ? *a : parsed;
  }
  return *a;
}

std::string ToolName(const ojson& call) {
  auto f = call.find("function");
  const ojson& fn = f != call.end() && f->is_object() ? *f : call;
  auto n = fn.find("name");
  return n != fn.end() && n->is_string() ? n->get<std::string>() : "";
}

ojson ToolCalls(const ojson& message) {
  auto it = message.find("tool_calls");
  if (it == message.end() || !it->is_array()) return ojson::array();
  return *it;
}

ojson Slice(const ojson& messages, size_t end) {
  ojson out = ojson::array();
  for (size_t i = 0; i < end; ++i) out.push_back(messages[i]);
  return out;
}

// Where an assistant message's generated span lies in the rendered conversation `text`:
// [begin, end) is what the model's output stands for; `suffix` is the template text after it.
struct Span {
  size_t begin = 0;
  size_t end = 0;
  std::string prefix;  // text[0:begin]: the conversation before it, generation prompt included
  std::string suffix;
};

// The span is found with two renderings: the conversation up to the message with the generation
// prompt (where the span begins: what the model was prompted with), and the whole conversation
// with the message's content replaced by kSentinel and its tool calls dropped (what follows the
// sentinel is the text after the span, so the span ends where that suffix begins in `text`).
// Rendering the prefix ending in the assistant message instead would not do: templates render a
// final assistant turn differently (Qwen3 adds an empty <think> block).
std::optional<Span> LocateReply(const ChatCodec& codec, const ojson& messages, size_t index,
                                const std::string& text) {
  if (index == 0) return std::nullopt;
  auto before = codec.Render(Slice(messages, index), /*add_generation_prompt=*/true);
  if (!before.ok() || !StartsWith(text, *before)) return std::nullopt;
  ojson probe = messages;
  probe[index] = ojson{{"role", "assistant"}, {"content", std::string(kSentinel)}};
  auto probed = codec.Render(probe, /*add_generation_prompt=*/true);
  if (!probed.ok() || !StartsWith(*probed, *before)) return std::nullopt;
  size_t at = probed->find(kSentinel, before->size());
  if (at == std::string::npos) return std::nullopt;
  std::string suffix = probed->substr(at + kSentinel.size());
  if (text.size() < before->size() + suffix.size() ||
      text.compare(text.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return std::nullopt;
  }
  Span span;
  span.begin = before->size();
  span.end = text.size() - suffix.size();
  span.prefix = std::move(*before);
  span.suffix = std::move(suffix);
  return span;
}

void Append(std::vector<int32_t>* ids, const std::vector<int32_t>& more) {
  ids->insert(ids->end(), more.begin(), more.end());
}

}  // namespace

bool SameReply(const ojson& a, const ojson& b) {
  if (ContentOf(a) != ContentOf(b)) return false;
  ojson ca = ToolCalls(a), cb = ToolCalls(b);
  if (ca.size() != cb.size()) return false;
  for (size_t i = 0; i < ca.size(); ++i) {
    if (ToolName(ca[i]) != ToolName(cb[i]) || Arguments(ca[i]) != Arguments(cb[i])) return false;
  }
  return true;
}

StatusOr<BuiltPrompt> BuildPrompt(const ChatCodec& codec, const ojson& messages,
                                  std::span<const AgentTurn> turns) {
  BuiltPrompt out;
  SLIME_ASSIGN_OR_RETURN(out.text, codec.Render(messages, /*add_generation_prompt=*/true));
  const std::string& text = out.text;
  size_t cursor = 0;  // text[0:cursor] is already in out.ids
  for (size_t i = 0; i < messages.size(); ++i) {
    const ojson& message = messages[i];
    if (!message.is_object() || message.value("role", "") != "assistant") continue;
    std::vector<int> candidates;
    for (size_t t = 0; t < turns.size(); ++t) {
      if (!turns[t].reply.is_null() && SameReply(turns[t].reply, message)) {
        candidates.push_back(static_cast<int>(t));
      }
    }
    if (candidates.empty()) continue;  // not one of ours (e.g. a few-shot example): text
    std::optional<Span> span = LocateReply(codec, messages, i, text);
    if (!span || span->begin < cursor) continue;
    // Prefer the turn generated from exactly this prefix; else the latest with this reply.
    int chosen = candidates.back();
    for (int t : candidates) {
      if (turns[t].prompt_text == span->prefix) chosen = t;
    }
    const AgentTurn& turn = turns[chosen];
    if (turn.prompt_text == span->prefix) {
      out.ids = turn.prompt_ids;  // what the model saw, covering text[0:begin]
    } else {
      Append(&out.ids, codec.Encode(std::string_view(text).substr(cursor, span->begin - cursor)));
    }
    Append(&out.ids, turn.output_ids);
    cursor = span->end;
    // The generated end-of-turn token (e.g. <|im_end|>) stands for the start of the suffix.
    if (!turn.output_ids.empty()) {
      std::string end_text = codec.SpecialTokenText(turn.output_ids.back());
      if (!end_text.empty() && StartsWith(span->suffix, end_text)) cursor += end_text.size();
    }
    out.spliced_turns.push_back(chosen);
  }
  Append(&out.ids, codec.Encode(std::string_view(text).substr(cursor)));
  return out;
}

StatusOr<std::vector<data::Sample>> BuildSegments(const data::Sample& input,
                                                  std::span<const AgentTurn> turns,
                                                  const DecodeFn& decode) {
  std::vector<data::Sample> segments;
  int turns_in_segment = 0;
  auto close_segment = [&]() {
    if (!segments.empty()) segments.back().metadata["agent_turns"] = turns_in_segment;
  };
  for (size_t i = 0; i < turns.size(); ++i) {
    const AgentTurn& turn = turns[i];
    if (!turn.log_probs.empty() && turn.log_probs.size() != turn.output_ids.size()) {
      return absl::InvalidArgumentError(
          fmt::format("agent turn {}: {} log-probs for {} output ids", i, turn.log_probs.size(),
                      turn.output_ids.size()));
    }
    bool extends = !segments.empty() &&
                   StartsWith(std::span<const int32_t>(turn.prompt_ids),
                              std::span<const int32_t>(segments.back().tokens));
    if (extends) {
      data::Sample& s = segments.back();
      std::vector<int32_t> between(turn.prompt_ids.begin() + s.tokens.size(),
                                   turn.prompt_ids.end());
      if (!between.empty()) {
        std::string between_text = decode ? decode(between) : std::string();
        SLIME_RETURN_IF_ERROR(s.AppendResponse(between, {}, /*trainable=*/false, between_text));
      }
    } else {
      close_segment();
      data::Sample s = input;
      s.tokens = turn.prompt_ids;
      s.prompt_text = turn.prompt_text;
      s.response_length = 0;
      s.response.clear();
      s.loss_mask.clear();
      s.rollout_log_probs.clear();
      s.weight_versions.clear();
      s.weight_version_tokens.clear();
      s.reward = 0;
      s.raw_reward = nullptr;
      s.status = data::SampleStatus::kPending;
      segments.push_back(std::move(s));
      turns_in_segment = 0;
    }
    data::Sample& s = segments.back();
    SLIME_RETURN_IF_ERROR(s.AppendResponse(turn.output_ids, turn.log_probs, /*trainable=*/true,
                                           turn.output_text, turn.weight_version));
    if (!s.SetStatusFromFinishReason(turn.finish_reason).ok()) {
      s.status = data::SampleStatus::kFailed;
    }
    ++turns_in_segment;
  }
  close_segment();
  return segments;
}

}  // namespace slime::agent
