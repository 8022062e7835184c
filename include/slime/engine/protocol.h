// The JSON side of SGLang's native `POST /generate` (docs/http-api.md
// §1): request bodies → validated GenerateInputs, engine
// outputs → response objects, Status → HTTP status and error bodies. No LibTorch, no I/O.
//
// Parsing follows SGLang's GenerateReqInput normalization:
//   * exactly one of `text` / `input_ids` (`input_embeds` is refused: not supported); single vs
//     batch by shape (string vs list of strings, flat int list vs list of int lists);
//   * per-item fields (`sampling_params`, `return_logprob`, `logprob_start_len`,
//     `top_logprobs_num`) are a scalar broadcast to the batch or a list with one entry per prompt;
//   * `sampling_params.n > 1` (equal in every entry) expands each prompt into n inputs, in
//     SGLang's response order: all n samples of prompt 0, then the n of prompt 1, … (expanded index
//     = prompt * n + sample). A single prompt with n > 1 becomes a batch;
//   * rids: a string on a single request is used as is; a string on a batch becomes
//     "{rid}_{i}" over the expanded index; a list needs one rid per prompt (with n > 1, sample j of
//     prompt i gets "{rid[i]}_{j}" — SGLang instead regenerates random rids for n > 1, which breaks
//     abort-by-prefix); absent → a random 32-hex-digit id per input. Expanded rids must be unique;
//   * JSON null means "the default" for every field;
//   * `text` is tokenized with the tokenizer without special tokens (no BOS is added — right for
//     Qwen; SGLang would add Llama-3's BOS here, send input_ids to control it exactly);
//   * unknown top-level and sampling_params keys are ignored (a router may add or drop keys) and
//     reported once per key name through UnknownFieldLog; known SGLang features this engine does
//     not implement (multimodal data, LoRA, sessions, grammars, stop_regex, hidden states, routed
//     token_ids_logprob, custom logit processors) are refused when set, naming the field;
//   * `return_routed_experts` (bool) and `routed_experts_start_len` (int, 0 <= it < every
//     prompt's length) apply to every input; return_routed_experts needs
//     ProtocolLimits::enable_return_routed_experts and moe_model (else 400 naming the flag or
//     the model).
// Every validation error is an InvalidArgument (HTTP 400) whose message names the field — with
// its index in a batch — and the allowed values; FieldError() also records the field as the
// status payload so an OpenAI-shaped error can fill "param".
//
// Thread-safety: all functions are pure or touch only their arguments; UnknownFieldLog is
// internally synchronized and shared by all HTTP threads.
#ifndef SLIME_ENGINE_PROTOCOL_H_
#define SLIME_ENGINE_PROTOCOL_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "slime/common/status.h"
#include "slime/engine/request.h"
#include "slime/tokenizer/tokenizer.h"

namespace slime::engine {

// What the served model allows; a value <= 0 disables that check.
struct ProtocolLimits {
  int64_t context_length = 0;  // prompt + output tokens must fit; prompt must be shorter
  int64_t vocab_size = 0;      // token ids must be in [0, vocab_size)
  // return_routed_experts is honoured only with both: the engine was started with
  // --enable-return-routed-experts and its model has sparse (mixture-of-experts) layers.
  bool enable_return_routed_experts = false;
  bool moe_model = false;
};

// Bounds on what one request may expand into (a request is parsed into prompts × n inputs before
// anything else, so these keep one body from allocating without bound): `n` (samples per
// prompt) at most kMaxSamplesPerPrompt, prompts × n at most kMaxExpandedInputs. Both are
// InvalidArgument naming `n`.
inline constexpr int64_t kMaxSamplesPerPrompt = 1024;
inline constexpr int64_t kMaxExpandedInputs = 65536;

// Request fields that were ignored, each warned about once per process (or per log object).
// Thread-safe; one instance is shared by every request handler.
class UnknownFieldLog {
 public:
  // At most this many names are remembered (a client cannot grow the set or the log without
  // bound); past it, one last warning says so and further names are dropped.
  static constexpr size_t kMaxNames = 256;

  // Records `name` ("priority_boost", "sampling_params.foo"). The first time a name is seen it
  // logs one spdlog warning and returns true; later calls return false.
  bool Report(std::string_view name);
  bool Seen(std::string_view name) const;
  size_t size() const;

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_set<std::string> seen_ ABSL_GUARDED_BY(mu_);
  bool full_warned_ ABSL_GUARDED_BY(mu_) = false;
};

// A parsed /generate body.
struct ParsedGenerate {
  std::vector<GenerateInput> inputs;  // expanded batch, inputs[i].index == i
  bool is_batch = false;              // respond with a JSON array (and SSE "index")
  bool stream = false;
  bool return_text_in_logprobs = false;  // fill the text slot of logprob triples
  int64_t n = 1;                         // samples per prompt (inputs.size() = prompts * n)
};

StatusOr<ParsedGenerate> ParseGenerateRequest(const nlohmann::json& body,
                                              const tokenizer::Tokenizer* tok,
                                              const ProtocolLimits& limits, UnknownFieldLog* log);

// One `sampling_params` object (null = all defaults). `prefix` is put before field names in
// errors ("sampling_params." or "sampling_params[2]." or ""); `aliases` renames fields in errors
// ({"max_new_tokens", "max_tokens"} for the OpenAI endpoints). Unknown keys go to `log` as
// "<log_prefix><key>". `*n` receives `n` (>= 1). `tok` may be null unless stop strings are set.
struct SamplingFieldNames {
  std::string prefix;
  std::vector<std::pair<std::string, std::string>> aliases;  // (sglang key, name to show)
  std::string log_prefix = "sampling_params.";
};
StatusOr<SamplingParams> ParseSamplingParams(const nlohmann::json& params,
                                             const SamplingFieldNames& names,
                                             const ProtocolLimits& limits,
                                             const tokenizer::Tokenizer* tok, UnknownFieldLog* log,
                                             int64_t* n);

// The length and id checks /generate applies to one tokenized prompt: not empty, every id in
// [0, vocab_size) (the error names `field`[index]), shorter than the context, and prompt +
// max_new_tokens within it (that error names `max_tokens_field`).
Status ValidatePrompt(std::string_view field, std::span<const int32_t> ids,
                      const SamplingParams& sampling, const ProtocolLimits& limits,
                      std::string_view max_tokens_field = "sampling_params.max_new_tokens");

// The response object of one input (a non-streaming answer, or one cumulative SSE chunk):
// {"text", "output_ids", "meta_info": {"id", "finish_reason", "prompt_tokens",
//  "completion_tokens", "cached_tokens", "weight_version", "weight_versions" ([{"version",
//  "start", "end"}] spans of output tokens, RequestOutput::weight_versions), "num_retractions",
//  "e2e_latency" (finished only), with in.return_routed_experts "routed_experts" (base64 of the
//  little-endian int32 [rows, layers, top_k] array), and with in.return_logprob:
//  "output_token_logprobs", "input_token_logprobs", "output_token_logprobs_length", and with
//  top_logprobs_num > 0:
//  "output_top_logprobs", "input_top_logprobs"}} plus top-level "index" when include_index
// (streamed batch). Logprob entries are [logprob, id, text] triples whose text is null unless
// return_text_in_logprobs (then the token's own decode, lossy, special tokens kept); an input
// position without a logprob (prompt position 0) has logprob null and top list null. `tok` may
// be null when return_text_in_logprobs is false.
nlohmann::json GenerateOutputJson(const RequestOutput& out, const GenerateInput& in,
                                  const tokenizer::Tokenizer* tok, bool return_text_in_logprobs,
                                  bool include_index = false);

// SGLang's finish_reason: null, {"type":"stop","matched":id|string},
// {"type":"length","length":n}, {"type":"abort","message","status_code","err_type":null}.
nlohmann::json FinishReasonJson(const FinishReason& f);

// --- Errors -----------------------------------------------------------------------------------

// InvalidArgument(message) that also records `field` (payload kFieldPayloadUrl).
inline constexpr char kFieldPayloadUrl[] = "type.slime/request-field";
Status FieldError(std::string_view field, std::string_view message);
// The field recorded by FieldError, if any.
std::optional<std::string> ErrorField(const Status& status);

// HTTP status of a failed request: InvalidArgument/OutOfRange/FailedPrecondition 400,
// NotFound 404, AlreadyExists 409, PermissionDenied 403, Unauthenticated 401,
// ResourceExhausted/Unavailable 503, DeadlineExceeded 504, Unimplemented 501, others 500.
int HttpStatusFor(const Status& status);
// {"error": {"message": status.message()}}.
nlohmann::json ErrorJson(const Status& status);
nlohmann::json ErrorJson(std::string_view message);

// The HTTP status of a finished output: 200 except an abort carrying status_code >= 400, which
// becomes that status (docs/http-api.md §1.5: a user abort is a 200 body with partial output).
int HttpStatusForFinish(const FinishReason& f);
// The first such error status among `outs` (a batch answers with it), else 200.
int HttpStatusForOutputs(std::span<const RequestOutput> outs);

// --- Helpers shared with the OpenAI endpoints ---------------------------------------------------

// A request body as JSON: whitespace-only (or empty) is {} (slime posts {} or nothing to control
// endpoints); anything that does not parse is an InvalidArgument "request body is not valid
// JSON: ..." — including numbers that overflow a double (1e999), which nlohmann reports as
// out_of_range rather than parse_error. Never throws.
StatusOr<nlohmann::json> ParseJsonBody(std::string_view body);

// A random 32-hex-digit id (SGLang's uuid4().hex shape).
std::string RandomHexId();
// "data: <json>\n\n" and the terminating "data: [DONE]\n\n".
std::string SseEvent(const nlohmann::json& chunk);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

// Typed readers for one JSON value; null → nullopt. Errors are FieldErrors such as
// "temperature must be a number, got string". Integers accept integral floats (5.0).
StatusOr<std::optional<double>> ReadNumber(const nlohmann::json& v, std::string_view field);
StatusOr<std::optional<int64_t>> ReadInt(const nlohmann::json& v, std::string_view field);
StatusOr<std::optional<bool>> ReadBool(const nlohmann::json& v, std::string_view field);
StatusOr<std::optional<std::string>> ReadString(const nlohmann::json& v, std::string_view field);
// The member `key` of object `obj`, or null when absent.
const nlohmann::json& Member(const nlohmann::json& obj, std::string_view key);

}  // namespace slime::engine

#endif  // SLIME_ENGINE_PROTOCOL_H_
