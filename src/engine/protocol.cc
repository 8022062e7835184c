// SGLang /generate JSON: parsing, validation and responses (see protocol.h).
#include "slime/engine/protocol.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <random>
#include <unordered_set>

#include "absl/strings/cord.h"
#include "absl/strings/escaping.h"

namespace slime::engine {
namespace {

using Json = nlohmann::json;

const Json& NullJson() {
  static const Json kNull = nullptr;
  return kNull;
}

std::string Num(double v) { return fmt::format("{}", v); }

// A JSON value as it would appear in a message (strings quoted, long values cut).
std::string Show(const Json& v) {
  std::string s = v.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (s.size() > 60) {
    size_t cut = 57;
    while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;  // whole chars
    s = s.substr(0, cut) + "...";
  }
  return s;
}

std::string Indexed(std::string_view field, size_t i) { return fmt::format("{}[{}]", field, i); }

// clang-format off
// Top-level /generate keys this engine reads.
constexpr std::string_view kGenerateKeys[] = {
    "text", "input_ids", "sampling_params", "rid", "return_logprob",
    "logprob_start_len", "top_logprobs_num", "stream", "return_text_in_logprobs",
    "return_routed_experts", "routed_experts_start_len"};
// Known SGLang keys that do not change the result here: accepted silently.
constexpr std::string_view kGenerateHarmlessKeys[] = {
    "log_metrics", "no_logs", "custom_labels", "priority", "routed_dp_rank",
    "data_parallel_rank", "routing_key", "conversation_id", "extra_key", "cache_salt",
    "session_id", "received_time", "external_trace_header",
    "return_prompt_token_ids", "modalities"};
// sampling_params keys this engine reads (custom_params and stream_interval: validated, unused).
constexpr std::string_view kSamplingKeys[] = {
    "max_new_tokens", "min_new_tokens", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "stop", "stop_token_ids",
    "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim", "n",
    "logit_bias", "sampling_seed", "custom_params", "stream_interval"};
// clang-format on
// Grammar-constrained decoding and regex stops: refused when set.
constexpr std::string_view kSamplingUnsupported[] = {"json_schema", "regex", "ebnf",
                                                     "structural_tag", "stop_regex"};

template <size_t N>
bool In(const std::string_view (&set)[N], std::string_view key) {
  return std::find(std::begin(set), std::end(set), key) != std::end(set);
}

// An active value of an unsupported field: not null, not false, not an empty list/object/string.
bool IsSet(const Json& v) {
  if (v.is_null()) return false;
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_array() || v.is_object() || v.is_string()) return !v.empty() && v != "";
  return true;
}

int64_t IdLimit(const ProtocolLimits& limits) {
  return limits.vocab_size > 0 ? limits.vocab_size
                               : static_cast<int64_t>(std::numeric_limits<int32_t>::max()) + 1;
}

// One token id out of a JSON value; `field` is e.g. "input_ids[1][5]".
StatusOr<int32_t> ReadTokenId(const Json& v, const std::string& field,
                              const ProtocolLimits& limits) {
  if (!v.is_number_integer()) {
    return FieldError(field, fmt::format("{} must be an integer token id, got {}", field,
                                         v.is_number() ? Show(v) : v.type_name()));
  }
  const int64_t limit = IdLimit(limits);
  const bool neg = v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() < 0;
  if (neg || v.get<uint64_t>() >= static_cast<uint64_t>(limit)) {
    return FieldError(field, fmt::format("{} = {} is not a valid token id: must be in [0, {})",
                                         field, Show(v), limit));
  }
  return static_cast<int32_t>(v.get<int64_t>());
}

// Token ids out of a JSON list (must be a list of integers).
StatusOr<std::vector<int32_t>> ReadTokenList(const Json& v, const std::string& field,
                                             const ProtocolLimits& limits) {
  if (!v.is_array()) {
    return FieldError(field,
                      fmt::format("{} must be a list of token ids, got {}", field, v.type_name()));
  }
  std::vector<int32_t> ids;
  ids.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    SLIME_ASSIGN_OR_RETURN(int32_t id, ReadTokenId(v[i], Indexed(field, i), limits));
    ids.push_back(id);
  }
  return ids;
}

// A per-item field: a scalar broadcast to `batch` prompts, or a list of exactly `batch` values.
template <typename T, typename Reader>
StatusOr<std::vector<T>> PerItem(const Json& body, std::string_view key, size_t batch,
                                 T default_value, Reader read) {
  const Json& v = Member(body, key);
  std::vector<T> out(batch, default_value);
  if (v.is_array()) {
    if (v.size() != batch) {
      return FieldError(key, fmt::format("{} has {} entries but the request has {} prompt{}; "
                                         "give one value or one per prompt",
                                         key, v.size(), batch, batch == 1 ? "" : "s"));
    }
    for (size_t i = 0; i < batch; ++i) {
      SLIME_ASSIGN_OR_RETURN(std::optional<T> x, read(v[i], Indexed(key, i)));
      if (x) out[i] = *x;
    }
    return out;
  }
  SLIME_ASSIGN_OR_RETURN(std::optional<T> x, read(v, std::string(key)));
  if (x) std::fill(out.begin(), out.end(), *x);
  return out;
}

std::string FieldNameOf(const SamplingFieldNames& names, std::string_view key) {
  for (const auto& [from, to] : names.aliases) {
    if (from == key) return names.prefix + to;
  }
  return names.prefix + std::string(key);
}

Json LogprobTriple(std::optional<float> lp, int32_t id, const tokenizer::Tokenizer* tok,
                   bool with_text) {
  Json t = Json::array();
  if (lp) {
    t.push_back(*lp);
  } else {
    t.push_back(nullptr);
  }
  t.push_back(id);
  if (with_text && tok != nullptr) {
    t.push_back(tok->Decode(std::span<const int32_t>(&id, 1), /*skip_special_tokens=*/false));
  } else {
    t.push_back(nullptr);
  }
  return t;
}

Json TopList(const TopLogprobs& top, const tokenizer::Tokenizer* tok, bool with_text) {
  Json list = Json::array();
  for (const auto& [lp, id] : top) list.push_back(LogprobTriple(lp, id, tok, with_text));
  return list;
}

}  // namespace

// --- UnknownFieldLog --------------------------------------------------------------------------

bool UnknownFieldLog::Report(std::string_view name) {
  {
    absl::MutexLock lock(&mu_);
    if (seen_.size() >= kMaxNames) {
      if (seen_.contains(std::string(name)) || full_warned_) return false;
      full_warned_ = true;
      spdlog::warn("more than {} distinct unknown request fields: no longer warning about them",
                   kMaxNames);
      return false;
    }
    if (!seen_.emplace(std::string(name)).second) return false;
  }
  spdlog::warn(
      "ignoring unknown request field \"{}\" (accepted for SGLang compatibility; "
      "warned once per field name)",
      name);
  return true;
}

bool UnknownFieldLog::Seen(std::string_view name) const {
  absl::MutexLock lock(&mu_);
  return seen_.contains(std::string(name));
}

size_t UnknownFieldLog::size() const {
  absl::MutexLock lock(&mu_);
  return seen_.size();
}

// --- Field readers ----------------------------------------------------------------------------

const Json& Member(const Json& obj, std::string_view key) {
  if (!obj.is_object()) return NullJson();
  auto it = obj.find(key);
  return it == obj.end() ? NullJson() : *it;
}

StatusOr<std::optional<double>> ReadNumber(const Json& v, std::string_view field) {
  if (v.is_null()) return std::optional<double>();
  if (!v.is_number()) {
    return FieldError(field, fmt::format("{} must be a number, got {}", field, v.type_name()));
  }
  return std::optional<double>(v.get<double>());
}

StatusOr<std::optional<int64_t>> ReadInt(const Json& v, std::string_view field) {
  if (v.is_null()) return std::optional<int64_t>();
  if (v.is_number_unsigned()) {
    if (v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return FieldError(field, fmt::format("{} = {} is too large", field, Show(v)));
    }
    return std::optional<int64_t>(static_cast<int64_t>(v.get<uint64_t>()));
  }
  if (v.is_number_integer()) return std::optional<int64_t>(v.get<int64_t>());
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && std::floor(d) == d && std::fabs(d) < 9.2e18) {
      return std::optional<int64_t>(static_cast<int64_t>(d));
    }
    return FieldError(field, fmt::format("{} must be an integer, got {}", field, Show(v)));
  }
  return FieldError(field, fmt::format("{} must be an integer, got {}", field, v.type_name()));
}

StatusOr<std::optional<bool>> ReadBool(const Json& v, std::string_view field) {
  if (v.is_null()) return std::optional<bool>();
  if (!v.is_boolean()) {
    return FieldError(field, fmt::format("{} must be true or false, got {}", field, v.type_name()));
  }
  return std::optional<bool>(v.get<bool>());
}

StatusOr<Json> ParseJsonBody(std::string_view body) {
  if (body.find_first_not_of(" \t\r\n") == std::string_view::npos) return Json::object();
  try {
    return Json::parse(body);
  } catch (const Json::exception& e) {  // parse_error, and out_of_range for 1e999
    return absl::InvalidArgumentError(
        fmt::format("request body is not valid JSON: {}", std::string(e.what())));
  }
}

StatusOr<std::optional<std::string>> ReadString(const Json& v, std::string_view field) {
  if (v.is_null()) return std::optional<std::string>();
  if (!v.is_string()) {
    return FieldError(field, fmt::format("{} must be a string, got {}", field, v.type_name()));
  }
  return std::optional<std::string>(v.get<std::string>());
}

// --- Errors -----------------------------------------------------------------------------------

Status FieldError(std::string_view field, std::string_view message) {
  Status s = absl::InvalidArgumentError(std::string(message));
  s.SetPayload(kFieldPayloadUrl, absl::Cord(std::string(field)));
  return s;
}

std::optional<std::string> ErrorField(const Status& status) {
  auto p = status.GetPayload(kFieldPayloadUrl);  // absl::optional on Debian
  if (!p) return std::nullopt;
  return std::string(*p);
}

int HttpStatusFor(const Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kAlreadyExists:
      return 409;
    case absl::StatusCode::kUnimplemented:
      return 501;
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

Json ErrorJson(std::string_view message) {
  return Json{{"error", {{"message", std::string(message)}}}};
}

Json ErrorJson(const Status& status) {
  return ErrorJson(std::string_view(status.message().data(), status.message().size()));
}

int HttpStatusForFinish(const FinishReason& f) {
  if (f.type == FinishType::kAbort && f.status_code && *f.status_code >= 400) {
    return *f.status_code;
  }
  return 200;
}

int HttpStatusForOutputs(std::span<const RequestOutput> outs) {
  for (const RequestOutput& o : outs) {
    const int s = HttpStatusForFinish(o.finish);
    if (s != 200) return s;
  }
  return 200;
}

// --- Helpers ----------------------------------------------------------------------------------

std::string RandomHexId() {
  thread_local std::mt19937_64 rng([] {
    std::random_device rd;
    std::seed_seq seq{rd(), rd(), rd(), rd()};
    return std::mt19937_64(seq);
  }());
  return fmt::format("{:016x}{:016x}", rng(), rng());
}

std::string SseEvent(const Json& chunk) {
  return "data: " + chunk.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n\n";
}

// --- sampling_params --------------------------------------------------------------------------

StatusOr<SamplingParams> ParseSamplingParams(const Json& params, const SamplingFieldNames& names,
                                             const ProtocolLimits& limits,
                                             const tokenizer::Tokenizer* tok, UnknownFieldLog* log,
                                             int64_t* n) {
  SamplingParams sp;
  *n = 1;
  if (params.is_null()) return sp;
  if (!params.is_object()) {
    std::string obj = names.prefix;
    if (!obj.empty() && obj.back() == '.') obj.pop_back();
    if (obj.empty()) obj = "sampling_params";
    return FieldError(obj, fmt::format("{} must be an object, got {}", obj, params.type_name()));
  }
  auto name = [&](std::string_view key) { return FieldNameOf(names, key); };
  for (const auto& [key, value] : params.items()) {
    if (In(kSamplingUnsupported, key)) {
      if (!IsSet(value)) continue;
      const std::string f = name(key);
      if (key == "stop_regex") {
        return FieldError(f, fmt::format("{} is not supported by this engine (stop strings are; "
                                         "regular expressions are not)",
                                         f));
      }
      return FieldError(f, fmt::format("{} is not supported by this engine (no grammar-"
                                       "constrained decoding)",
                                       f));
    }
    if (!In(kSamplingKeys, key) && log != nullptr) log->Report(names.log_prefix + key);
  }

  // Numbers. Absent and null keep the SGLang default (max_new_tokens: see below).
  auto number = [&](std::string_view key, double* out) -> Status {
    SLIME_ASSIGN_OR_RETURN(std::optional<double> v, ReadNumber(Member(params, key), name(key)));
    if (v) *out = *v;
    return absl::OkStatus();
  };
  auto integer = [&](std::string_view key, int64_t* out) -> Status {
    SLIME_ASSIGN_OR_RETURN(std::optional<int64_t> v, ReadInt(Member(params, key), name(key)));
    if (v) *out = *v;
    return absl::OkStatus();
  };
  auto boolean = [&](std::string_view key, bool* out) -> Status {
    SLIME_ASSIGN_OR_RETURN(std::optional<bool> v, ReadBool(Member(params, key), name(key)));
    if (v) *out = *v;
    return absl::OkStatus();
  };

  // max_new_tokens: absent → 128 (SGLang's default); null → no limit but the context.
  if (params.contains("max_new_tokens")) {
    SLIME_ASSIGN_OR_RETURN(sp.max_new_tokens,
                           ReadInt(params["max_new_tokens"], name("max_new_tokens")));
  }
  SLIME_RETURN_IF_ERROR(integer("min_new_tokens", &sp.min_new_tokens));
  SLIME_RETURN_IF_ERROR(number("temperature", &sp.temperature));
  SLIME_RETURN_IF_ERROR(number("top_p", &sp.top_p));
  SLIME_RETURN_IF_ERROR(integer("top_k", &sp.top_k));
  SLIME_RETURN_IF_ERROR(number("min_p", &sp.min_p));
  SLIME_RETURN_IF_ERROR(number("frequency_penalty", &sp.frequency_penalty));
  SLIME_RETURN_IF_ERROR(number("presence_penalty", &sp.presence_penalty));
  SLIME_RETURN_IF_ERROR(number("repetition_penalty", &sp.repetition_penalty));
  SLIME_RETURN_IF_ERROR(boolean("ignore_eos", &sp.ignore_eos));
  SLIME_RETURN_IF_ERROR(boolean("skip_special_tokens", &sp.skip_special_tokens));
  SLIME_RETURN_IF_ERROR(
      boolean("spaces_between_special_tokens", &sp.spaces_between_special_tokens));
  SLIME_RETURN_IF_ERROR(boolean("no_stop_trim", &sp.no_stop_trim));
  SLIME_RETURN_IF_ERROR(integer("n", n));
  int64_t stream_interval = 1;
  SLIME_RETURN_IF_ERROR(integer("stream_interval", &stream_interval));
  {
    SLIME_ASSIGN_OR_RETURN(std::optional<int64_t> seed,
                           ReadInt(Member(params, "sampling_seed"), name("sampling_seed")));
    if (seed) sp.sampling_seed = static_cast<uint64_t>(*seed);
  }

  // Ranges (SGLang SamplingParams.verify), each message naming the field and the valid values.
  const auto range_error = [&](std::string_view key, std::string_view valid, double v) {
    const std::string f = name(key);
    return FieldError(f, fmt::format("{} must be {}, got {}", f, valid, Num(v)));
  };
  if (!std::isfinite(sp.temperature) || sp.temperature < 0.0) {
    return range_error("temperature", "a finite number >= 0 (0 = greedy)", sp.temperature);
  }
  if (!(sp.top_p > 0.0 && sp.top_p <= 1.0)) return range_error("top_p", "in (0, 1]", sp.top_p);
  if (sp.top_k != -1 && sp.top_k < 1) {
    return range_error("top_k", "-1 (whole vocabulary) or at least 1",
                       static_cast<double>(sp.top_k));
  }
  if (!(sp.min_p >= 0.0 && sp.min_p <= 1.0)) return range_error("min_p", "in [0, 1]", sp.min_p);
  if (!(sp.frequency_penalty >= -2.0 && sp.frequency_penalty <= 2.0)) {
    return range_error("frequency_penalty", "in [-2, 2]", sp.frequency_penalty);
  }
  if (!(sp.presence_penalty >= -2.0 && sp.presence_penalty <= 2.0)) {
    return range_error("presence_penalty", "in [-2, 2]", sp.presence_penalty);
  }
  if (!(sp.repetition_penalty > 0.0 && sp.repetition_penalty <= 2.0)) {
    return range_error("repetition_penalty", "in (0, 2] (1 = no penalty)", sp.repetition_penalty);
  }
  if (sp.max_new_tokens && *sp.max_new_tokens < 0) {
    return range_error("max_new_tokens", "at least 0 (or null: up to the context length)",
                       static_cast<double>(*sp.max_new_tokens));
  }
  if (sp.min_new_tokens < 0) {
    return range_error("min_new_tokens", "at least 0", static_cast<double>(sp.min_new_tokens));
  }
  if (sp.max_new_tokens && sp.min_new_tokens > *sp.max_new_tokens) {
    const std::string f = name("min_new_tokens");
    return FieldError(f,
                      fmt::format("{} must be in [0, {}] ({} = {}), got {}", f, *sp.max_new_tokens,
                                  name("max_new_tokens"), *sp.max_new_tokens, sp.min_new_tokens));
  }
  if (*n < 1 || *n > kMaxSamplesPerPrompt) {
    return range_error("n", fmt::format("in [1, {}]", kMaxSamplesPerPrompt),
                       static_cast<double>(*n));
  }
  if (stream_interval < 1) {
    return range_error("stream_interval", "at least 1", static_cast<double>(stream_interval));
  }

  // stop: a string or a list of strings; empty strings are ignored (they would match at once).
  {
    const Json& stop = Member(params, "stop");
    const std::string f = name("stop");
    if (stop.is_string()) {
      if (!stop.get<std::string>().empty()) sp.stop.push_back(stop.get<std::string>());
    } else if (stop.is_array()) {
      for (size_t i = 0; i < stop.size(); ++i) {
        SLIME_ASSIGN_OR_RETURN(std::optional<std::string> s, ReadString(stop[i], Indexed(f, i)));
        if (!s) {
          return FieldError(Indexed(f, i),
                            fmt::format("{} must be a string, got null", Indexed(f, i)));
        }
        if (!s->empty() && std::find(sp.stop.begin(), sp.stop.end(), *s) == sp.stop.end()) {
          sp.stop.push_back(*s);
        }
      }
    } else if (!stop.is_null()) {
      return FieldError(
          f, fmt::format("{} must be a string or a list of strings, got {}", f, stop.type_name()));
    }
    if (!sp.stop.empty() && tok == nullptr) {
      return FieldError(f, fmt::format("{} needs a tokenizer to match text, and this engine "
                                       "runs without one; use stop_token_ids",
                                       f));
    }
  }
  // stop_token_ids: a list of ids (nulls ignored, duplicates dropped).
  {
    const Json& ids = Member(params, "stop_token_ids");
    const std::string f = name("stop_token_ids");
    if (ids.is_array()) {
      for (size_t i = 0; i < ids.size(); ++i) {
        if (ids[i].is_null()) continue;
        SLIME_ASSIGN_OR_RETURN(int32_t id, ReadTokenId(ids[i], Indexed(f, i), limits));
        if (std::find(sp.stop_token_ids.begin(), sp.stop_token_ids.end(), id) ==
            sp.stop_token_ids.end()) {
          sp.stop_token_ids.push_back(id);
        }
      }
    } else if (!ids.is_null()) {
      return FieldError(f,
                        fmt::format("{} must be a list of token ids, got {}", f, ids.type_name()));
    }
  }
  // logit_bias: {"<token id>": bias}.
  {
    const Json& bias = Member(params, "logit_bias");
    const std::string f = name("logit_bias");
    if (bias.is_object()) {
      const int64_t limit = IdLimit(limits);
      for (const auto& [key, value] : bias.items()) {
        int64_t id = -1;
        const char* end = key.data() + key.size();
        auto [ptr, ec] = std::from_chars(key.data(), end, id);
        if (key.empty() || ec != std::errc() || ptr != end || id < 0 || id >= limit) {
          return FieldError(
              f, fmt::format("{} keys must be token ids in [0, {}), got \"{}\"", f, limit, key));
        }
        const std::string vf = fmt::format("{}[\"{}\"]", f, key);
        SLIME_ASSIGN_OR_RETURN(std::optional<double> b, ReadNumber(value, vf));
        if (!b || !std::isfinite(*b)) {
          return FieldError(vf, fmt::format("{} must be a finite number, got {}", vf, Show(value)));
        }
        sp.logit_bias[static_cast<int32_t>(id)] = *b;
      }
    } else if (!bias.is_null()) {
      return FieldError(f, fmt::format("{} must be an object {{\"token_id\": bias}}, got {}", f,
                                       bias.type_name()));
    }
  }
  // custom_params: accepted for custom logit processors and slime's patches; ignored here.
  {
    const Json& custom = Member(params, "custom_params");
    if (!custom.is_null() && !custom.is_object()) {
      const std::string f = name("custom_params");
      return FieldError(f, fmt::format("{} must be an object, got {}", f, custom.type_name()));
    }
  }
  return sp;
}

// --- Prompt checks ----------------------------------------------------------------------------

Status ValidatePrompt(std::string_view field, std::span<const int32_t> ids,
                      const SamplingParams& sampling, const ProtocolLimits& limits,
                      std::string_view max_tokens_field) {
  if (ids.empty()) {
    return FieldError(field,
                      fmt::format("{} is empty: the prompt needs at least one token", field));
  }
  const int64_t limit = IdLimit(limits);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= limit) {
      const std::string f = Indexed(field, i);
      return FieldError(
          f, fmt::format("{} = {} is not a valid token id: must be in [0, {})", f, ids[i], limit));
    }
  }
  const int64_t len = static_cast<int64_t>(ids.size());
  if (limits.context_length > 0) {
    if (len >= limits.context_length) {
      return FieldError(field, fmt::format("The input ({} tokens in {}) is longer than the "
                                           "model's context length ({} tokens); the prompt must "
                                           "be shorter than the context",
                                           len, field, limits.context_length));
    }
    if (sampling.max_new_tokens && len + *sampling.max_new_tokens > limits.context_length) {
      return FieldError(
          max_tokens_field,
          fmt::format("Requested token count exceeds the model's maximum context length of {} "
                      "tokens. You requested a total of {} tokens: {} tokens from the input ({}) "
                      "and {} tokens for the completion ({}). Reduce the prompt or {}.",
                      limits.context_length, len + *sampling.max_new_tokens, len, field,
                      *sampling.max_new_tokens, max_tokens_field, max_tokens_field));
    }
  }
  return absl::OkStatus();
}

// --- /generate --------------------------------------------------------------------------------

namespace {

// Ignores (and reports) unknown keys; refuses the SGLang features this engine lacks when set.
Status CheckTopLevelKeys(const Json& body, UnknownFieldLog* log) {
  for (const auto& [key, value] : body.items()) {
    if (In(kGenerateKeys, key) || In(kGenerateHarmlessKeys, key)) continue;
    std::string why;
    if (key == "image_data" || key == "video_data" || key == "audio_data") {
      why = "multimodal input is not supported by this engine (text-only models)";
    } else if (key == "lora_path" || key == "lora_id") {
      why = "LoRA adapters are not supported by this engine";
    } else if (key == "session_params") {
      why = "sessions are not supported by this engine";
    } else if (key == "custom_logit_processor") {
      why = "custom logit processors are not supported by this engine";
    } else if (key == "token_ids_logprob") {
      why = "per-id logprobs are not supported by this engine (use top_logprobs_num)";
    } else if (key == "return_hidden_states") {
      why = "returning hidden states is not supported by this engine";
    } else if (key == "input_embeds") {
      why = "input_embeds is not supported by this engine; send input_ids or text";
    } else {
      if (log != nullptr) log->Report(key);
      continue;
    }
    if (IsSet(value)) {
      return FieldError(key, key == "input_embeds" ? why : fmt::format("{}: {}", key, why));
    }
  }
  return absl::OkStatus();
}

// The prompts of `text` or `input_ids`, the field naming each, and whether the body is a batch.
struct Prompts {
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::string> fields;  // "input_ids", "text[2]", ...
  bool batch = false;
};

StatusOr<Prompts> ParsePrompts(const Json& body, const tokenizer::Tokenizer* tok,
                               const ProtocolLimits& limits) {
  const Json& text = Member(body, "text");
  const Json& input_ids = Member(body, "input_ids");
  if (text.is_null() && input_ids.is_null()) {
    return FieldError("input_ids",
                      "the request has no prompt: set exactly one of text or input_ids");
  }
  if (!text.is_null() && !input_ids.is_null()) {
    return FieldError("input_ids", "set exactly one of text or input_ids, not both");
  }
  Prompts out;
  if (!text.is_null()) {
    auto tokenize = [&](const Json& t, const std::string& field) -> Status {
      if (!t.is_string()) {
        return FieldError(field, fmt::format("{} must be a string, got {}", field, t.type_name()));
      }
      if (tok == nullptr) {
        return FieldError(field, fmt::format("{} needs a tokenizer and this engine runs without "
                                             "one; send input_ids",
                                             field));
      }
      out.ids.push_back(tok->Encode(t.get<std::string>(), /*add_special_tokens=*/false));
      out.fields.push_back(field);
      return absl::OkStatus();
    };
    if (!text.is_array()) {
      SLIME_RETURN_IF_ERROR(tokenize(text, "text"));
      return out;
    }
    out.batch = true;
    if (text.empty()) return FieldError("text", "text must not be an empty list");
    for (size_t i = 0; i < text.size(); ++i) {
      SLIME_RETURN_IF_ERROR(tokenize(text[i], Indexed("text", i)));
    }
    return out;
  }
  if (!input_ids.is_array()) {
    return FieldError("input_ids", fmt::format("input_ids must be a list of token ids or a list "
                                               "of such lists, got {}",
                                               input_ids.type_name()));
  }
  if (input_ids.empty()) {
    return FieldError("input_ids",
                      "input_ids must not be empty: the prompt needs at least one token");
  }
  if (!input_ids[0].is_array()) {
    SLIME_ASSIGN_OR_RETURN(std::vector<int32_t> ids, ReadTokenList(input_ids, "input_ids", limits));
    out.ids.push_back(std::move(ids));
    out.fields.push_back("input_ids");
    return out;
  }
  out.batch = true;
  for (size_t i = 0; i < input_ids.size(); ++i) {
    const std::string field = Indexed("input_ids", i);
    SLIME_ASSIGN_OR_RETURN(std::vector<int32_t> ids, ReadTokenList(input_ids[i], field, limits));
    out.ids.push_back(std::move(ids));
    out.fields.push_back(field);
  }
  return out;
}

// sampling_params: one object for every prompt, or one per prompt; `*n` gets their common n.
StatusOr<std::vector<SamplingParams>> ParseAllSamplingParams(const Json& sp, size_t num_prompts,
                                                             const ProtocolLimits& limits,
                                                             const tokenizer::Tokenizer* tok,
                                                             UnknownFieldLog* log, int64_t* n) {
  std::vector<SamplingParams> sampling(num_prompts);
  if (!sp.is_array()) {
    SamplingFieldNames names;
    names.prefix = "sampling_params.";
    SLIME_ASSIGN_OR_RETURN(SamplingParams one, ParseSamplingParams(sp, names, limits, tok, log, n));
    std::fill(sampling.begin(), sampling.end(), one);
    return sampling;
  }
  if (sp.size() != num_prompts) {
    return FieldError("sampling_params",
                      fmt::format("sampling_params has {} entries but the request has {} "
                                  "prompt{}; give one object or one per prompt",
                                  sp.size(), num_prompts, num_prompts == 1 ? "" : "s"));
  }
  for (size_t i = 0; i < num_prompts; ++i) {
    SamplingFieldNames names;
    names.prefix = Indexed("sampling_params", i) + ".";
    int64_t ni = 1;
    SLIME_ASSIGN_OR_RETURN(sampling[i], ParseSamplingParams(sp[i], names, limits, tok, log, &ni));
    if (i == 0) {
      *n = ni;
    } else if (ni != *n) {
      return FieldError(Indexed("sampling_params", i) + ".n",
                        fmt::format("sampling_params[{}].n ({}) must equal sampling_params[0].n "
                                    "({}): every prompt of a batch takes the same number of "
                                    "samples",
                                    i, ni, *n));
    }
  }
  return sampling;
}

// One rid per expanded input (prompt-major, see protocol.h), all distinct.
StatusOr<std::vector<std::string>> ExpandRids(const Json& rid, size_t num_prompts, int64_t n,
                                              bool is_batch) {
  const size_t total = num_prompts * static_cast<size_t>(n);
  std::vector<std::string> rids(total);
  if (rid.is_null()) {
    for (std::string& r : rids) r = RandomHexId();
    return rids;  // random: distinct
  }
  if (rid.is_string()) {
    const std::string r = rid.get<std::string>();
    if (r.empty()) return FieldError("rid", "rid must not be empty");
    if (!is_batch) {
      rids[0] = r;
    } else {
      for (size_t i = 0; i < total; ++i) rids[i] = fmt::format("{}_{}", r, i);
    }
    return rids;  // distinct by construction
  }
  if (!rid.is_array()) {
    return FieldError(
        "rid", fmt::format("rid must be a string or a list of strings, got {}", rid.type_name()));
  }
  if (rid.size() != num_prompts) {
    return FieldError("rid", fmt::format("rid has {} entries but the request has {} prompt{}; "
                                         "give one string or one per prompt",
                                         rid.size(), num_prompts, num_prompts == 1 ? "" : "s"));
  }
  for (size_t i = 0; i < num_prompts; ++i) {
    const std::string f = Indexed("rid", i);
    SLIME_ASSIGN_OR_RETURN(std::optional<std::string> r, ReadString(rid[i], f));
    if (!r || r->empty()) return FieldError(f, fmt::format("{} must be a non-empty string", f));
    for (int64_t j = 0; j < n; ++j) rids[i * n + j] = n == 1 ? *r : fmt::format("{}_{}", *r, j);
  }
  std::unordered_set<std::string_view> seen;
  for (const std::string& r : rids) {
    if (!seen.insert(r).second) {
      return FieldError("rid", fmt::format("rid \"{}\" appears more than once in the request; "
                                           "request ids must be unique",
                                           r));
    }
  }
  return rids;
}

// return_routed_experts / routed_experts_start_len: one value for every input.
struct RoutedExpertsRequest {
  bool on = false;
  int64_t start_len = 0;
};
StatusOr<RoutedExpertsRequest> ParseRoutedExperts(const Json& body, const Prompts& prompts,
                                                  const ProtocolLimits& limits) {
  RoutedExpertsRequest r;
  SLIME_ASSIGN_OR_RETURN(std::optional<bool> on,
                         ReadBool(Member(body, "return_routed_experts"), "return_routed_experts"));
  SLIME_ASSIGN_OR_RETURN(
      std::optional<int64_t> start,
      ReadInt(Member(body, "routed_experts_start_len"), "routed_experts_start_len"));
  r.on = on.value_or(false);
  r.start_len = start.value_or(0);
  if (!r.on) return r;
  if (!limits.moe_model) {
    return FieldError("return_routed_experts",
                      "return_routed_experts needs a mixture-of-experts model; this engine's "
                      "model has no sparse layer (leave return_routed_experts false)");
  }
  if (!limits.enable_return_routed_experts) {
    return FieldError("return_routed_experts",
                      "return_routed_experts needs the engine started with "
                      "--enable-return-routed-experts");
  }
  for (size_t i = 0; i < prompts.ids.size(); ++i) {
    if (r.start_len < 0 || r.start_len >= static_cast<int64_t>(prompts.ids[i].size())) {
      return FieldError("routed_experts_start_len",
                        fmt::format("routed_experts_start_len must be in [0, prompt length) = "
                                    "[0, {}) for {}, got {}",
                                    prompts.ids[i].size(), prompts.fields[i], r.start_len));
    }
  }
  return r;
}

}  // namespace

StatusOr<ParsedGenerate> ParseGenerateRequest(const Json& body, const tokenizer::Tokenizer* tok,
                                              const ProtocolLimits& limits, UnknownFieldLog* log) {
  if (!body.is_object()) {
    return FieldError(
        "", fmt::format("the /generate body must be a JSON object, got {}", body.type_name()));
  }
  SLIME_RETURN_IF_ERROR(CheckTopLevelKeys(body, log));
  ParsedGenerate parsed;
  SLIME_ASSIGN_OR_RETURN(std::optional<bool> stream, ReadBool(Member(body, "stream"), "stream"));
  parsed.stream = stream.value_or(false);
  SLIME_ASSIGN_OR_RETURN(
      std::optional<bool> text_lp,
      ReadBool(Member(body, "return_text_in_logprobs"), "return_text_in_logprobs"));
  parsed.return_text_in_logprobs = text_lp.value_or(false);

  SLIME_ASSIGN_OR_RETURN(Prompts prompts, ParsePrompts(body, tok, limits));
  const size_t num_prompts = prompts.ids.size();
  const Json& sp = Member(body, "sampling_params");
  SLIME_ASSIGN_OR_RETURN(std::vector<SamplingParams> sampling,
                         ParseAllSamplingParams(sp, num_prompts, limits, tok, log, &parsed.n));
  const int64_t n = parsed.n;
  parsed.is_batch = prompts.batch || n > 1;

  // Per-item logprob fields, then the per-prompt checks.
  SLIME_ASSIGN_OR_RETURN(
      std::vector<bool> return_logprob,
      PerItem<bool>(body, "return_logprob", num_prompts, false,
                    [](const Json& v, const std::string& f) { return ReadBool(v, f); }));
  SLIME_ASSIGN_OR_RETURN(
      std::vector<int64_t> logprob_start_len,
      PerItem<int64_t>(body, "logprob_start_len", num_prompts, -1,
                       [](const Json& v, const std::string& f) { return ReadInt(v, f); }));
  SLIME_ASSIGN_OR_RETURN(
      std::vector<int64_t> top_logprobs_num,
      PerItem<int64_t>(body, "top_logprobs_num", num_prompts, 0,
                       [](const Json& v, const std::string& f) { return ReadInt(v, f); }));
  const bool lp_list = Member(body, "logprob_start_len").is_array();
  const bool top_list = Member(body, "top_logprobs_num").is_array();
  for (size_t i = 0; i < num_prompts; ++i) {
    const std::string lp_field = lp_list ? Indexed("logprob_start_len", i) : "logprob_start_len";
    const std::string top_field = top_list ? Indexed("top_logprobs_num", i) : "top_logprobs_num";
    const std::string max_field =
        (sp.is_array() ? Indexed("sampling_params", i) : std::string("sampling_params")) +
        ".max_new_tokens";
    SLIME_RETURN_IF_ERROR(
        ValidatePrompt(prompts.fields[i], prompts.ids[i], sampling[i], limits, max_field));
    if (logprob_start_len[i] < -1) {
      return FieldError(lp_field, fmt::format("{} must be -1 (output tokens only) or a prompt "
                                              "position >= 0, got {}",
                                              lp_field, logprob_start_len[i]));
    }
    if (return_logprob[i] && logprob_start_len[i] >= static_cast<int64_t>(prompts.ids[i].size())) {
      return FieldError(lp_field, fmt::format("{} ({}) must be less than the prompt length ({} "
                                              "tokens in {})",
                                              lp_field, logprob_start_len[i], prompts.ids[i].size(),
                                              prompts.fields[i]));
    }
    if (top_logprobs_num[i] < 0) {
      return FieldError(
          top_field, fmt::format("{} must be at least 0, got {}", top_field, top_logprobs_num[i]));
    }
  }
  if (static_cast<int64_t>(num_prompts) * n > kMaxExpandedInputs) {
    return FieldError("n", fmt::format("{} prompts × n = {} exceeds the limit of {} inputs per "
                                       "request",
                                       num_prompts, static_cast<int64_t>(num_prompts) * n,
                                       kMaxExpandedInputs));
  }
  SLIME_ASSIGN_OR_RETURN(RoutedExpertsRequest routed, ParseRoutedExperts(body, prompts, limits));
  SLIME_ASSIGN_OR_RETURN(std::vector<std::string> rids,
                         ExpandRids(Member(body, "rid"), num_prompts, n, parsed.is_batch));

  // Expand: sample j of prompt i is input i * n + j.
  parsed.inputs.reserve(rids.size());
  for (size_t i = 0; i < num_prompts; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      GenerateInput in;
      in.index = static_cast<int64_t>(parsed.inputs.size());
      in.rid = std::move(rids[in.index]);
      in.input_ids = prompts.ids[i];
      in.sampling = sampling[i];
      in.return_logprob = return_logprob[i];
      in.logprob_start_len = logprob_start_len[i];
      in.top_logprobs_num = top_logprobs_num[i];
      in.return_routed_experts = routed.on;
      in.routed_experts_start_len = routed.start_len;
      in.stream = parsed.stream;
      parsed.inputs.push_back(std::move(in));
    }
  }
  return parsed;
}

// --- Responses --------------------------------------------------------------------------------

Json FinishReasonJson(const FinishReason& f) {
  switch (f.type) {
    case FinishType::kNone:
      return nullptr;
    case FinishType::kStop:
      if (f.matched_string) return Json{{"type", "stop"}, {"matched", *f.matched_string}};
      if (f.matched_token) return Json{{"type", "stop"}, {"matched", *f.matched_token}};
      return Json{{"type", "stop"}, {"matched", nullptr}};
    case FinishType::kLength:
      return Json{{"type", "length"}, {"length", f.length}};
    case FinishType::kAbort: {
      Json j{{"type", "abort"}, {"message", f.message}, {"err_type", nullptr}};
      j["status_code"] = f.status_code ? Json(*f.status_code) : Json(nullptr);
      return j;
    }
  }
  return nullptr;
}

Json GenerateOutputJson(const RequestOutput& out, const GenerateInput& in,
                        const tokenizer::Tokenizer* tok, bool return_text_in_logprobs,
                        bool include_index) {
  Json meta;
  meta["id"] = out.rid.empty() ? in.rid : out.rid;
  meta["finish_reason"] = FinishReasonJson(out.finish);
  meta["prompt_tokens"] =
      out.prompt_tokens > 0 ? out.prompt_tokens : static_cast<int64_t>(in.input_ids.size());
  meta["completion_tokens"] = static_cast<int64_t>(out.output_ids.size());
  meta["cached_tokens"] = out.cached_tokens;
  meta["weight_version"] = out.weight_version;
  // The output tokens by the weights that sampled them (several spans when the request lived
  // through a weight update during an in-place or retracting pause).
  Json spans = Json::array();
  for (const WeightVersionSpan& v : out.weight_versions) {
    spans.push_back({{"version", v.version}, {"start", v.start}, {"end", v.end}});
  }
  meta["weight_versions"] = std::move(spans);
  meta["num_retractions"] = out.num_retractions;
  if (out.finish.finished()) meta["e2e_latency"] = out.e2e_latency;

  if (in.return_logprob) {
    const bool with_text = return_text_in_logprobs;
    // One triple per output id; a shorter logprob vector (an engine bug) truncates the list.
    const size_t n_out = std::min(out.output_ids.size(), out.output_logprobs.size());
    Json output_lp = Json::array();
    for (size_t i = 0; i < n_out; ++i) {
      output_lp.push_back(LogprobTriple(out.output_logprobs[i], out.output_ids[i], tok, with_text));
    }
    const size_t n_in = std::min(out.input_logprob_ids.size(), out.input_logprobs.size());
    Json input_lp = Json::array();
    for (size_t i = 0; i < n_in; ++i) {
      input_lp.push_back(
          LogprobTriple(out.input_logprobs[i], out.input_logprob_ids[i], tok, with_text));
    }
    meta["output_token_logprobs"] = std::move(output_lp);
    meta["input_token_logprobs"] = std::move(input_lp);
    meta["output_token_logprobs_length"] = static_cast<int64_t>(n_out);
    if (in.top_logprobs_num > 0) {
      Json output_top = Json::array();
      for (size_t i = 0; i < std::min(n_out, out.output_top_logprobs.size()); ++i) {
        output_top.push_back(TopList(out.output_top_logprobs[i], tok, with_text));
      }
      Json input_top = Json::array();
      for (size_t i = 0; i < n_in; ++i) {
        if (!out.input_logprobs[i] || i >= out.input_top_logprobs.size()) {
          input_top.push_back(nullptr);
        } else {
          input_top.push_back(TopList(out.input_top_logprobs[i], tok, with_text));
        }
      }
      meta["output_top_logprobs"] = std::move(output_top);
      meta["input_top_logprobs"] = std::move(input_top);
    }
  }

  if (in.return_routed_experts) {
    std::string bytes(out.routed_experts.size() * 4, '\0');
    for (size_t i = 0; i < out.routed_experts.size(); ++i) {  // little-endian, whatever the host
      const auto v = static_cast<uint32_t>(out.routed_experts[i]);
      for (int b = 0; b < 4; ++b) bytes[4 * i + b] = static_cast<char>((v >> (8 * b)) & 0xFF);
    }
    meta["routed_experts"] = absl::Base64Escape(bytes);
  }

  Json j;
  j["text"] = out.text;
  j["output_ids"] = out.output_ids;
  j["meta_info"] = std::move(meta);
  if (include_index) j["index"] = in.index;
  return j;
}

}  // namespace slime::engine
