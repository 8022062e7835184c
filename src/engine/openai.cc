// OpenAI-compatible completions / chat completions / models JSON (see openai.h).
#include "slime/engine/openai.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string_view>

namespace slime::engine {
namespace {

using Json = nlohmann::json;

// OpenAI request key → SGLang sampling_params key (validated by ParseSamplingParams).
constexpr std::pair<std::string_view, std::string_view> kSamplingKeys[] = {
    {"temperature", "temperature"},
    {"top_p", "top_p"},
    {"top_k", "top_k"},
    {"min_p", "min_p"},
    {"min_tokens", "min_new_tokens"},
    {"n", "n"},
    {"stop", "stop"},
    {"stop_token_ids", "stop_token_ids"},
    {"seed", "sampling_seed"},
    {"frequency_penalty", "frequency_penalty"},
    {"presence_penalty", "presence_penalty"},
    {"repetition_penalty", "repetition_penalty"},
    {"logit_bias", "logit_bias"},
    {"ignore_eos", "ignore_eos"},
    {"skip_special_tokens", "skip_special_tokens"},
    {"spaces_between_special_tokens", "spaces_between_special_tokens"},
    {"no_stop_trim", "no_stop_trim"},
    // SGLang extensions this engine refuses when set (ParseSamplingParams names them).
    {"regex", "regex"},
    {"json_schema", "json_schema"},
    {"ebnf", "ebnf"},
    {"structural_tag", "structural_tag"},
    {"stop_regex", "stop_regex"},
};

// Other keys read here, or accepted without effect.
// clang-format off
constexpr std::string_view kOtherKeys[] = {
    "model", "prompt", "messages", "max_tokens", "max_completion_tokens", "logprobs",
    "top_logprobs", "stream", "stream_options", "echo", "suffix", "best_of", "user", "rid",
    "tools", "tool_choice", "functions", "function_call", "parallel_tool_calls",
    "response_format", "chat_template_kwargs", "continue_final_message",
    "add_generation_prompt"};
// clang-format on

constexpr int64_t kMaxTopLogprobs = 20;

bool IsOtherKey(std::string_view key) {
  return std::find(std::begin(kOtherKeys), std::end(kOtherKeys), key) != std::end(kOtherKeys);
}

bool IsSamplingKey(std::string_view key) {
  for (const auto& [from, to] : kSamplingKeys) {
    if (from == key) return true;
  }
  return false;
}

bool IsSet(const Json& v) {
  if (v.is_null()) return false;
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_array() || v.is_object()) return !v.empty();
  return true;
}

const char* ChunkObject(OpenAiEndpoint e) {
  return e == OpenAiEndpoint::kCompletions ? "text_completion" : "chat.completion.chunk";
}

std::string TokenText(const tokenizer::Tokenizer* tok, int32_t id) {
  return tok->Decode(std::span<const int32_t>(&id, 1), /*skip_special_tokens=*/false);
}

double SafeLogprob(float lp) { return std::isfinite(lp) ? static_cast<double>(lp) : -9999.0; }

Json TokenBytesJson(const tokenizer::Tokenizer* tok, int32_t id) {
  Json bytes = Json::array();
  for (unsigned char c : tok->TokenBytes(id)) bytes.push_back(static_cast<int>(c));
  return bytes;
}

int64_t CountChars(std::string_view s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

Json MatchedStop(const FinishReason& f) {
  if (f.type != FinishType::kStop) return nullptr;
  if (f.matched_string) return *f.matched_string;
  if (f.matched_token) return *f.matched_token;
  return nullptr;
}

// Length of the longest proper prefix of a stop string that `text` ends with.
size_t StopPrefixSuffix(std::string_view text, const std::vector<std::string>& stops) {
  size_t best = 0;
  for (const std::string& s : stops) {
    for (size_t k = std::min(s.size() - 1, text.size()); k > best; --k) {
      if (text.substr(text.size() - k) == std::string_view(s).substr(0, k)) {
        best = k;
        break;
      }
    }
  }
  return best;
}

// The fields shared by both endpoints; `prompts`/`prompt_fields` come from the caller.
StatusOr<ParsedOpenAi> Finish(OpenAiEndpoint endpoint, const Json& body, const OpenAiContext& ctx,
                              std::vector<std::vector<int32_t>> prompts,
                              std::vector<std::string> prompt_fields) {
  ParsedOpenAi req;
  req.endpoint = endpoint;
  const bool chat = endpoint == OpenAiEndpoint::kChatCompletions;

  for (const auto& [key, value] : body.items()) {
    if (!IsSamplingKey(key) && !IsOtherKey(key) && ctx.log != nullptr) ctx.log->Report(key);
  }
  SLIME_ASSIGN_OR_RETURN(std::optional<std::string> model,
                         ReadString(Member(body, "model"), "model"));
  req.model = model && !model->empty() ? *model : ctx.served_model_name;

  // Refused features.
  if (!chat) {
    SLIME_ASSIGN_OR_RETURN(std::optional<bool> echo, ReadBool(Member(body, "echo"), "echo"));
    if (echo.value_or(false)) {
      return FieldError("echo",
                        "echo is not supported by this engine; use /generate with "
                        "logprob_start_len 0 to score a prompt");
    }
    SLIME_ASSIGN_OR_RETURN(std::optional<std::string> suffix,
                           ReadString(Member(body, "suffix"), "suffix"));
    if (suffix && !suffix->empty()) {
      return FieldError("suffix", "suffix (fill-in-the-middle) is not supported by this engine");
    }
  } else {
    for (const char* key : {"tools", "functions"}) {
      if (IsSet(Member(body, key))) {
        return FieldError(key, fmt::format("{} is not supported by this engine yet (no tool-call "
                                           "parser); render tools into the messages yourself",
                                           key));
      }
    }
    const Json& rf = Member(body, "response_format");
    if (!rf.is_null() && !(rf.is_object() && Member(rf, "type") == "text")) {
      return FieldError("response_format",
                        "response_format is not supported by this engine "
                        "(only {\"type\": \"text\"}): no constrained decoding");
    }
    SLIME_ASSIGN_OR_RETURN(
        std::optional<bool> cont,
        ReadBool(Member(body, "continue_final_message"), "continue_final_message"));
    if (cont.value_or(false)) {
      return FieldError("continue_final_message",
                        "continue_final_message is not supported by this engine");
    }
  }

  // Sampling: copy the OpenAI keys into an SGLang sampling_params object and validate it.
  Json sp = Json::object();
  for (const auto& [from, to] : kSamplingKeys) {
    auto it = body.find(from);
    if (it != body.end()) sp[std::string(to)] = *it;
  }
  SamplingFieldNames names;
  names.prefix = "";
  names.aliases = {{"min_new_tokens", "min_tokens"}, {"sampling_seed", "seed"}};
  std::string max_field = "max_tokens";
  if (chat) {
    // max_completion_tokens wins; neither → up to the context length.
    const Json& mct = Member(body, "max_completion_tokens");
    if (!mct.is_null()) max_field = "max_completion_tokens";
    sp["max_new_tokens"] = mct.is_null() ? Member(body, "max_tokens") : mct;
  } else {
    const Json& mt = Member(body, "max_tokens");
    sp["max_new_tokens"] = mt.is_null() ? Json(16) : mt;  // OpenAI's completions default
  }
  names.aliases.emplace_back("max_new_tokens", max_field);
  int64_t n = 1;
  SLIME_ASSIGN_OR_RETURN(SamplingParams sampling,
                         ParseSamplingParams(sp, names, ctx.limits, ctx.tok, ctx.log, &n));
  req.n = n;
  {
    SLIME_ASSIGN_OR_RETURN(std::optional<int64_t> best_of,
                           ReadInt(Member(body, "best_of"), "best_of"));
    if (best_of && *best_of != n) {
      return FieldError("best_of", fmt::format("best_of ({}) is not supported by this engine "
                                               "unless it equals n ({})",
                                               *best_of, n));
    }
  }

  // Logprobs.
  if (chat) {
    SLIME_ASSIGN_OR_RETURN(std::optional<bool> lp, ReadBool(Member(body, "logprobs"), "logprobs"));
    SLIME_ASSIGN_OR_RETURN(std::optional<int64_t> top,
                           ReadInt(Member(body, "top_logprobs"), "top_logprobs"));
    req.logprobs = lp.value_or(false);
    req.top_logprobs = top.value_or(0);
    if (req.top_logprobs < 0 || req.top_logprobs > kMaxTopLogprobs) {
      return FieldError("top_logprobs", fmt::format("top_logprobs must be in [0, {}], got {}",
                                                    kMaxTopLogprobs, req.top_logprobs));
    }
    if (req.top_logprobs > 0 && !req.logprobs) {
      return FieldError("top_logprobs", "top_logprobs needs \"logprobs\": true");
    }
  } else {
    SLIME_ASSIGN_OR_RETURN(std::optional<int64_t> lp,
                           ReadInt(Member(body, "logprobs"), "logprobs"));
    if (lp) {
      if (*lp < 0 || *lp > kMaxTopLogprobs) {
        return FieldError("logprobs", fmt::format("logprobs must be in [0, {}] (alternatives per "
                                                  "token), got {}",
                                                  kMaxTopLogprobs, *lp));
      }
      req.logprobs = true;
      req.top_logprobs = *lp;
    }
  }

  // Streaming.
  SLIME_ASSIGN_OR_RETURN(std::optional<bool> stream, ReadBool(Member(body, "stream"), "stream"));
  req.stream = stream.value_or(false);
  {
    const Json& so = Member(body, "stream_options");
    if (!so.is_null() && !so.is_object()) {
      return FieldError("stream_options",
                        fmt::format("stream_options must be an object, got {}", so.type_name()));
    }
    SLIME_ASSIGN_OR_RETURN(std::optional<bool> usage,
                           ReadBool(Member(so, "include_usage"), "stream_options.include_usage"));
    req.include_usage = req.stream && usage.value_or(false);
  }

  // Prompts, rids, inputs.
  for (size_t i = 0; i < prompts.size(); ++i) {
    SLIME_RETURN_IF_ERROR(
        ValidatePrompt(prompt_fields[i], prompts[i], sampling, ctx.limits, max_field));
  }
  SLIME_ASSIGN_OR_RETURN(std::optional<std::string> rid, ReadString(Member(body, "rid"), "rid"));
  req.num_prompts = static_cast<int64_t>(prompts.size());
  const int64_t total = req.num_prompts * n;
  if (total > kMaxExpandedInputs) {
    return FieldError("n", fmt::format("{} prompts × n = {} exceeds the limit of {} choices per "
                                       "request",
                                       req.num_prompts, total, kMaxExpandedInputs));
  }
  for (int64_t i = 0; i < req.num_prompts; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      GenerateInput in;
      in.index = static_cast<int64_t>(req.inputs.size());
      if (rid && !rid->empty()) {
        in.rid = total == 1 ? *rid : fmt::format("{}_{}", *rid, in.index);
      } else {
        in.rid = RandomHexId();
      }
      in.input_ids = prompts[i];
      in.sampling = sampling;
      in.return_logprob = req.logprobs;
      in.top_logprobs_num = req.top_logprobs;
      in.stream = req.stream;
      req.inputs.push_back(std::move(in));
    }
  }
  return req;
}

}  // namespace

StatusOr<ParsedOpenAi> ParseCompletionRequest(const Json& body, const OpenAiContext& ctx) {
  if (!body.is_object()) {
    return FieldError(
        "", fmt::format("the request body must be a JSON object, got {}", body.type_name()));
  }
  const Json& prompt = Member(body, "prompt");
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> fields;
  auto tokenize = [&](const std::string& text, std::string field) {
    prompts.push_back(ctx.tok->Encode(text, /*add_special_tokens=*/false));
    fields.push_back(std::move(field));
  };
  auto token_list = [&](const Json& list, std::string field) -> Status {
    std::vector<int32_t> ids;
    for (size_t k = 0; k < list.size(); ++k) {
      const std::string f = fmt::format("{}[{}]", field, k);
      SLIME_ASSIGN_OR_RETURN(std::optional<int64_t> id, ReadInt(list[k], f));
      if (!id || *id < 0 || *id > std::numeric_limits<int32_t>::max()) {
        return FieldError(f, fmt::format("{} must be a token id >= 0, got {}", f, list[k].dump()));
      }
      ids.push_back(static_cast<int32_t>(*id));
    }
    prompts.push_back(std::move(ids));
    fields.push_back(std::move(field));
    return absl::OkStatus();
  };
  if (prompt.is_string()) {
    tokenize(prompt.get<std::string>(), "prompt");
  } else if (prompt.is_array()) {
    if (prompt.empty()) return FieldError("prompt", "prompt must not be an empty list");
    if (prompt[0].is_number()) {
      SLIME_RETURN_IF_ERROR(token_list(prompt, "prompt"));
    } else {
      for (size_t i = 0; i < prompt.size(); ++i) {
        const std::string f = fmt::format("prompt[{}]", i);
        if (prompt[i].is_string()) {
          tokenize(prompt[i].get<std::string>(), f);
        } else if (prompt[i].is_array()) {
          SLIME_RETURN_IF_ERROR(token_list(prompt[i], f));
        } else {
          return FieldError(f, fmt::format("{} must be a string or a list of token ids, got {}", f,
                                           prompt[i].type_name()));
        }
      }
    }
  } else if (prompt.is_null()) {
    return FieldError("prompt",
                      "prompt is required: a string, a list of strings, a list of "
                      "token ids or a list of such lists");
  } else {
    return FieldError("prompt", fmt::format("prompt must be a string, a list of strings, a list "
                                            "of token ids or a list of such lists, got {}",
                                            prompt.type_name()));
  }
  return Finish(OpenAiEndpoint::kCompletions, body, ctx, std::move(prompts), std::move(fields));
}

StatusOr<ParsedOpenAi> ParseChatCompletionRequest(const Json& body, const OpenAiContext& ctx) {
  if (!body.is_object()) {
    return FieldError(
        "", fmt::format("the request body must be a JSON object, got {}", body.type_name()));
  }
  const Json& messages = Member(body, "messages");
  if (!messages.is_array() || messages.empty()) {
    return FieldError("messages",
                      fmt::format("messages must be a non-empty list of "
                                  "{{\"role\", \"content\"}} objects, got {}",
                                  messages.is_array() ? "an empty list" : messages.type_name()));
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    if (!messages[i].is_object()) {
      const std::string f = fmt::format("messages[{}]", i);
      return FieldError(f, fmt::format("{} must be an object with \"role\" and \"content\", got {}",
                                       f, messages[i].type_name()));
    }
  }
  tokenizer::ChatTemplateOptions options;
  SLIME_ASSIGN_OR_RETURN(std::optional<bool> add_gen,
                         ReadBool(Member(body, "add_generation_prompt"), "add_generation_prompt"));
  options.add_generation_prompt = add_gen.value_or(true);
  const Json& kwargs = Member(body, "chat_template_kwargs");
  if (kwargs.is_object()) {
    options.kwargs = nlohmann::ordered_json::parse(kwargs.dump());
  } else if (!kwargs.is_null()) {
    return FieldError("chat_template_kwargs", fmt::format("chat_template_kwargs must be an "
                                                          "object, got {}",
                                                          kwargs.type_name()));
  }
  // Key order inside messages (tool-call arguments) is that of nlohmann::json: sorted. A null
  // content becomes "", as OpenAI servers pass it to chat templates (many fail on None).
  nlohmann::ordered_json ordered = nlohmann::ordered_json::parse(messages.dump());
  for (auto& m : ordered) {
    if (auto it = m.find("content"); it != m.end() && it->is_null()) *it = "";
  }
  StatusOr<std::string> rendered = ctx.tok->ApplyChatTemplate(ordered, options);
  if (!rendered.ok()) {
    return FieldError("messages",
                      fmt::format("messages: {}", std::string(rendered.status().message())));
  }
  std::vector<std::vector<int32_t>> prompts;
  prompts.push_back(ctx.tok->Encode(*rendered, /*add_special_tokens=*/false));
  return Finish(OpenAiEndpoint::kChatCompletions, body, ctx, std::move(prompts), {"messages"});
}

std::string NewOpenAiId(OpenAiEndpoint endpoint) {
  return (endpoint == OpenAiEndpoint::kCompletions ? "cmpl-" : "chatcmpl-") + RandomHexId();
}

Json OpenAiFinishReason(const FinishReason& f) {
  switch (f.type) {
    case FinishType::kNone:
      return nullptr;
    case FinishType::kStop:
      return "stop";
    case FinishType::kLength:
      return "length";
    case FinishType::kAbort:
      return "abort";
  }
  return nullptr;
}

Json OpenAiLogprobsJson(OpenAiEndpoint endpoint, const RequestOutput& out, size_t begin, size_t end,
                        int64_t top_logprobs, const tokenizer::Tokenizer* tok,
                        int64_t* text_offset) {
  end = std::min({end, out.output_ids.size(), out.output_logprobs.size()});
  begin = std::min(begin, end);
  auto top_at = [&](size_t i) -> const TopLogprobs* {
    return top_logprobs > 0 && i < out.output_top_logprobs.size() ? &out.output_top_logprobs[i]
                                                                  : nullptr;
  };
  if (endpoint == OpenAiEndpoint::kChatCompletions) {
    Json content = Json::array();
    for (size_t i = begin; i < end; ++i) {
      const int32_t id = out.output_ids[i];
      Json tops = Json::array();
      if (const TopLogprobs* top = top_at(i)) {
        for (size_t k = 0; k < top->size() && k < static_cast<size_t>(top_logprobs); ++k) {
          const auto& [lp, tid] = (*top)[k];
          tops.push_back({{"token", TokenText(tok, tid)},
                          {"logprob", SafeLogprob(lp)},
                          {"bytes", TokenBytesJson(tok, tid)}});
        }
      }
      content.push_back({{"token", TokenText(tok, id)},
                         {"logprob", SafeLogprob(out.output_logprobs[i])},
                         {"bytes", TokenBytesJson(tok, id)},
                         {"top_logprobs", std::move(tops)}});
    }
    return Json{{"content", std::move(content)}};
  }
  Json tokens = Json::array(), token_logprobs = Json::array(), tops = Json::array(),
       offsets = Json::array();
  int64_t offset = text_offset != nullptr ? *text_offset : 0;
  for (size_t i = begin; i < end; ++i) {
    const std::string text = TokenText(tok, out.output_ids[i]);
    tokens.push_back(text);
    token_logprobs.push_back(SafeLogprob(out.output_logprobs[i]));
    if (const TopLogprobs* top = top_at(i)) {
      Json alternatives = Json::object();
      for (size_t k = 0; k < top->size() && k < static_cast<size_t>(top_logprobs); ++k) {
        const auto& [lp, tid] = (*top)[k];
        const std::string t = TokenText(tok, tid);
        if (!alternatives.contains(t)) alternatives[t] = SafeLogprob(lp);
      }
      tops.push_back(std::move(alternatives));
    } else {
      tops.push_back(nullptr);
    }
    offsets.push_back(offset);
    offset += CountChars(text);
  }
  if (text_offset != nullptr) *text_offset = offset;
  return Json{{"tokens", std::move(tokens)},
              {"token_logprobs", std::move(token_logprobs)},
              {"top_logprobs", std::move(tops)},
              {"text_offset", std::move(offsets)}};
}

Json OpenAiResponseJson(const ParsedOpenAi& req, std::span<const RequestOutput> outs,
                        const OpenAiContext& ctx, const std::string& id, int64_t created) {
  const bool chat = req.endpoint == OpenAiEndpoint::kChatCompletions;
  Json choices = Json::array();
  int64_t prompt_tokens = 0, completion_tokens = 0;
  for (size_t k = 0; k < outs.size(); ++k) {
    const RequestOutput& out = outs[k];
    Json choice;
    choice["index"] = static_cast<int64_t>(k);
    if (chat) {
      choice["message"] = {{"role", "assistant"}, {"content", out.text}};
    } else {
      choice["text"] = out.text;
    }
    choice["logprobs"] = req.logprobs
                             ? OpenAiLogprobsJson(req.endpoint, out, 0, out.output_ids.size(),
                                                  req.top_logprobs, ctx.tok)
                             : Json(nullptr);
    choice["finish_reason"] = OpenAiFinishReason(out.finish);
    choice["matched_stop"] = MatchedStop(out.finish);
    choices.push_back(std::move(choice));
    // Each prompt is counted once, from its first sample.
    if (req.n <= 1 || k % static_cast<size_t>(req.n) == 0) {
      prompt_tokens += out.prompt_tokens > 0 || k >= req.inputs.size()
                           ? out.prompt_tokens
                           : static_cast<int64_t>(req.inputs[k].input_ids.size());
    }
    completion_tokens += static_cast<int64_t>(out.output_ids.size());
  }
  return Json{{"id", id},
              {"object", chat ? "chat.completion" : "text_completion"},
              {"created", created},
              {"model", req.model},
              {"choices", std::move(choices)},
              {"usage",
               {{"prompt_tokens", prompt_tokens},
                {"completion_tokens", completion_tokens},
                {"total_tokens", prompt_tokens + completion_tokens}}}};
}

// --- OpenAiStream -----------------------------------------------------------------------------

OpenAiStream::OpenAiStream(const ParsedOpenAi& req, const OpenAiContext& ctx, std::string id,
                           int64_t created)
    : endpoint_(req.endpoint),
      model_(req.model),
      n_(req.n),
      include_usage_(req.include_usage),
      logprobs_(req.logprobs),
      top_logprobs_(req.top_logprobs),
      tok_(ctx.tok),
      id_(std::move(id)),
      created_(created),
      choices_(req.inputs.size()) {
  for (size_t k = 0; k < req.inputs.size(); ++k) {
    choices_[k].stops = req.inputs[k].sampling.stop;
    choices_[k].prompt_tokens = static_cast<int64_t>(req.inputs[k].input_ids.size());
  }
}

Json OpenAiStream::Chunk(int64_t index, Json text_delta, Json logprobs,
                         const FinishReason* finish) const {
  Json choice;
  choice["index"] = index;
  if (endpoint_ == OpenAiEndpoint::kChatCompletions) {
    choice["delta"] = std::move(text_delta);
  } else {
    choice["text"] = std::move(text_delta);
  }
  choice["logprobs"] = std::move(logprobs);
  choice["finish_reason"] = finish != nullptr ? OpenAiFinishReason(*finish) : Json(nullptr);
  if (finish != nullptr) choice["matched_stop"] = MatchedStop(*finish);
  return Json{{"id", id_},
              {"object", ChunkObject(endpoint_)},
              {"created", created_},
              {"model", model_},
              {"choices", Json::array({std::move(choice)})}};
}

std::vector<Json> OpenAiStream::OnOutput(const RequestOutput& out) {
  std::vector<Json> chunks;
  if (out.index < 0 || out.index >= static_cast<int64_t>(choices_.size())) return chunks;
  Choice& c = choices_[out.index];
  if (c.finished) return chunks;
  const bool chat = endpoint_ == OpenAiEndpoint::kChatCompletions;
  if (chat && !c.started) {
    chunks.push_back(
        Chunk(out.index, Json{{"role", "assistant"}, {"content", ""}}, nullptr, nullptr));
  }
  c.started = true;

  const bool finished = out.finish.finished();
  // Send up to `limit`: all of it at the end, else all but a possible stop-string start.
  size_t limit = out.text.size();
  if (!finished) limit -= StopPrefixSuffix(out.text, c.stops);
  std::string delta;
  if (limit > c.sent_text) {
    delta = out.text.substr(c.sent_text, limit - c.sent_text);
    c.sent_text = limit;
  }
  const size_t new_tokens_end = std::min(out.output_ids.size(), out.output_logprobs.size());
  const bool new_logprobs = logprobs_ && new_tokens_end > c.sent_tokens;
  c.prompt_tokens = out.prompt_tokens > 0 ? out.prompt_tokens : c.prompt_tokens;
  c.completion_tokens = static_cast<int64_t>(out.output_ids.size());
  if (delta.empty() && !new_logprobs && !finished) return chunks;

  Json logprobs = nullptr;
  if (logprobs_) {
    logprobs = OpenAiLogprobsJson(endpoint_, out, c.sent_tokens, new_tokens_end, top_logprobs_,
                                  tok_, &c.sent_chars);
    c.sent_tokens = std::max(c.sent_tokens, new_tokens_end);
  }
  Json text_delta;
  if (chat) {
    text_delta = Json::object();
    if (!delta.empty() || !finished) text_delta["content"] = delta;
  } else {
    text_delta = delta;
  }
  chunks.push_back(Chunk(out.index, std::move(text_delta), std::move(logprobs),
                         finished ? &out.finish : nullptr));
  c.finished = finished;
  return chunks;
}

bool OpenAiStream::AllFinished() const {
  return std::all_of(choices_.begin(), choices_.end(), [](const Choice& c) { return c.finished; });
}

std::optional<Json> OpenAiStream::UsageChunk() const {
  if (!include_usage_ || !AllFinished()) return std::nullopt;
  int64_t prompt_tokens = 0, completion_tokens = 0;
  for (size_t k = 0; k < choices_.size(); ++k) {
    if (n_ <= 1 || k % static_cast<size_t>(n_) == 0) prompt_tokens += choices_[k].prompt_tokens;
    completion_tokens += choices_[k].completion_tokens;
  }
  return Json{{"id", id_},
              {"object", ChunkObject(endpoint_)},
              {"created", created_},
              {"model", model_},
              {"choices", Json::array()},
              {"usage",
               {{"prompt_tokens", prompt_tokens},
                {"completion_tokens", completion_tokens},
                {"total_tokens", prompt_tokens + completion_tokens}}}};
}

// --- /v1/models, errors -----------------------------------------------------------------------

Json ModelsJson(const std::string& served_model_name, int64_t created, int64_t max_model_len) {
  Json model{{"id", served_model_name},
             {"object", "model"},
             {"created", created},
             {"owned_by", "slime-cpp"},
             {"root", served_model_name}};
  if (max_model_len > 0) model["max_model_len"] = max_model_len;
  return Json{{"object", "list"}, {"data", Json::array({std::move(model)})}};
}

Json OpenAiErrorJson(const Status& status) {
  const int code = HttpStatusFor(status);
  std::optional<std::string> field = ErrorField(status);
  return Json{{"error",
               {{"message", std::string(status.message())},
                {"type", code >= 400 && code < 500 ? "invalid_request_error" : "server_error"},
                {"param", field && !field->empty() ? Json(*field) : Json(nullptr)},
                {"code", code}}}};
}

}  // namespace slime::engine
