// EpisodeRenderer and ParseToolCalls (episode_render.h).
#include "slime/workflow/episode_render.h"

#include <fmt/format.h>

#include "slime/tokenizer/tokenizer.h"

namespace slime::workflow {

using ojson = nlohmann::ordered_json;
using tokenizer::ToolCallFormat;

namespace {

// Stands for an assistant turn's content; no whitespace, so no template trims it.
constexpr std::string_view kMarker = "SLIMETURNMARKER9f27c1";

std::string_view Trim(std::string_view s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return {};
  const size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

bool StripSuffix(std::string_view* s, std::string_view suffix) {
  if (s->size() < suffix.size() || s->substr(s->size() - suffix.size()) != suffix) return false;
  s->remove_suffix(suffix.size());
  return true;
}

// {"name", "arguments" | "parameters"} → {"id", "name", "arguments" (object)}; null if not one.
ojson ToolCallFromJson(std::string_view text, int turn, size_t k) {
  ojson j = ojson::parse(std::string(Trim(text)), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return nullptr;
  const auto name = j.find("name");
  if (name == j.end() || !name->is_string()) return nullptr;
  ojson args = ojson::object();
  for (const char* key : {"arguments", "parameters"}) {
    const auto a = j.find(key);
    if (a == j.end()) continue;
    if (a->is_string()) {  // OpenAI style: the arguments as JSON text
      ojson parsed = ojson::parse(a->get<std::string>(), nullptr, false);
      args = parsed.is_discarded() ? *a : parsed;
    } else {
      args = *a;
    }
    break;
  }
  return ojson{{"id", fmt::format("call_{}_{}", turn, k)}, {"name", *name}, {"arguments", args}};
}

}  // namespace

ojson ParseToolCalls(std::string_view text, ToolCallFormat format, int turn) {
  ojson calls = ojson::array();
  constexpr std::string_view kOpen = "<tool_call>";
  constexpr std::string_view kClose = "</tool_call>";
  for (size_t pos = text.find(kOpen); pos != std::string_view::npos;
       pos = text.find(kOpen, pos)) {
    const size_t start = pos + kOpen.size();
    const size_t end = text.find(kClose, start);
    if (end == std::string_view::npos) break;  // unterminated: not a call
    ojson call = ToolCallFromJson(text.substr(start, end - start), turn, calls.size());
    if (!call.is_null()) calls.push_back(std::move(call));
    pos = end + kClose.size();
  }
  if (calls.empty() && format == ToolCallFormat::kLlamaJson) {
    std::string_view body = Trim(text);
    while (StripSuffix(&body, "<|eot_id|>") || StripSuffix(&body, "<|eom_id|>")) body = Trim(body);
    constexpr std::string_view kPythonTag = "<|python_tag|>";
    if (body.substr(0, kPythonTag.size()) == kPythonTag) body.remove_prefix(kPythonTag.size());
    ojson call = ToolCallFromJson(body, turn, 0);
    if (!call.is_null()) calls.push_back(std::move(call));
  }
  return calls;
}

StatusOr<EpisodeRenderer> EpisodeRenderer::Create(const tokenizer::Tokenizer* tokenizer,
                                                  ojson chat_template_kwargs) {
  if (!tokenizer->chat_template().ok()) {
    return Status(tokenizer->chat_template().status().code(),
                  fmt::format("multi-turn episodes need the model's chat template: {}",
                              std::string(tokenizer->chat_template().status().message())));
  }
  EpisodeRenderer r;
  r.tokenizer_ = tokenizer;
  r.tool_call_format_ = tokenizer->chat_template()->tool_call_format();
  r.has_tool_role_ = tokenizer->chat_template()->has_tool_role();
  r.kwargs_ = chat_template_kwargs.is_object() ? std::move(chat_template_kwargs) : ojson::object();
  return r;
}

ojson EpisodeRenderer::InitialMessages(const ojson& observation) {
  if (observation.is_array()) return observation;
  return ojson::array({ojson{{"role", "user"},
                             {"content", observation.is_string() ? observation : ojson("")}}});
}

StatusOr<std::vector<int32_t>> EpisodeRenderer::Prompt(const ojson& messages, const ojson& tools,
                                                       std::string* text_out) const {
  tokenizer::ChatTemplateOptions o;
  o.add_generation_prompt = true;
  o.tools = tools;
  o.kwargs = kwargs_;
  SLIME_ASSIGN_OR_RETURN(std::string text, tokenizer_->ApplyChatTemplate(messages, o));
  std::vector<int32_t> ids = tokenizer_->Encode(text, /*add_special_tokens=*/false);
  if (text_out != nullptr) *text_out = std::move(text);
  return ids;
}

ojson EpisodeRenderer::ObservationMessages(const ojson& observation, bool had_tool_calls) const {
  const std::string tool_role = has_tool_role() ? "tool" : "user";
  if (observation.is_array()) {
    ojson out = observation;
    for (auto& m : out) {
      if (m.value("role", "") == "tool") m["role"] = tool_role;
    }
    return out;
  }
  const std::string role = had_tool_calls ? tool_role : "user";
  return ojson::array(
      {ojson{{"role", role}, {"content", observation.is_string() ? observation : ojson("")}}});
}

StatusOr<std::string> EpisodeRenderer::ObservationText(const ojson& messages) const {
  ojson conversation = ojson::array({ojson{{"role", "user"}, {"content", "."}},
                                     ojson{{"role", "assistant"}, {"content", kMarker}}});
  for (const auto& m : messages) conversation.push_back(m);
  tokenizer::ChatTemplateOptions o;
  o.add_generation_prompt = true;
  o.kwargs = kwargs_;
  StatusOr<std::string> full = tokenizer_->ApplyChatTemplate(conversation, o);
  if (!full.ok()) {
    return Status(full.status().code(),
                  fmt::format("rendering the observation {}: {}", messages.dump().substr(0, 200),
                              std::string(full.status().message())));
  }
  const size_t at = full->rfind(kMarker);
  if (at == std::string::npos) {
    return absl::InternalError(
        "the chat template dropped the assistant turn's content");
  }
  return full->substr(at + kMarker.size());
}

StatusOr<std::vector<int32_t>> EpisodeRenderer::Observation(
    const ojson& messages, std::span<const int32_t> turn_ids) const {
  SLIME_ASSIGN_OR_RETURN(std::string text, ObservationText(messages));
  std::vector<int32_t> ids = tokenizer_->Encode(text, /*add_special_tokens=*/false);
  // The turn's end-of-turn token, when the model emitted it, is not repeated: the template's
  // text after the content starts with that (added, so separately tokenized) token.
  if (!turn_ids.empty() && !ids.empty() && ids.front() == turn_ids.back()) {
    ids.erase(ids.begin());
  }
  return ids;
}

}  // namespace slime::workflow
