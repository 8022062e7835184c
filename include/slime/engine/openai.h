// The JSON side of the OpenAI-compatible endpoints (docs/http-api.md §2): `POST /v1/completions`,
// `POST /v1/chat/completions` and `GET /v1/models`. Requests become GenerateInputs with the same
// validation as /generate (protocol.h), responses are built from the engine's RequestOutputs.
// No I/O: the HTTP layer frames SSE events (SseEvent, kSseDone in protocol.h).
//
// Request fields (both endpoints unless noted):
//   model (string, echoed; not checked against the served name — SGLang does not either),
//   prompt (completions: str | [str] | [int] | [[int]]), messages (chat: rendered with the
//   tokenizer's chat template, add_generation_prompt true; `chat_template_kwargs` such as
//   {"enable_thinking": false} are passed to it), max_tokens (completions default 16 as in
//   OpenAI; chat default: up to the context length) / max_completion_tokens (chat, wins over
//   max_tokens), temperature (1), top_p (1), top_k, min_p, min_tokens, n (1), stop,
//   stop_token_ids, seed, frequency_penalty, presence_penalty, repetition_penalty, logit_bias,
//   ignore_eos, skip_special_tokens, spaces_between_special_tokens, no_stop_trim, logprobs
//   (completions: int 0..20 = alternatives per position; chat: bool) + top_logprobs (chat,
//   0..20, needs logprobs), stream, stream_options.include_usage, rid (string prefix),
//   user (ignored). Refused when set: echo, suffix, best_of > n, tools / functions,
//   response_format other than "text", continue_final_message, and the unsupported
//   sampling features of /generate. Unknown keys are ignored and reported to UnknownFieldLog.
// Errors are FieldErrors (InvalidArgument) named with the OpenAI field name; OpenAiErrorJson
// gives {"error": {"message", "type", "param", "code"}}.
//
// Choices: prompt i, sample j → choice index i * n + j (the order of ParsedOpenAi::inputs).
// finish_reason: "stop" | "length" | "abort" (null while running), plus "matched_stop" (the stop
// token id or string, else null) as SGLang adds. usage counts each prompt once and every choice's
// completion tokens.
//
// Thread-safety: parse and build functions are pure; an OpenAiStream belongs to one request
// and is used by one thread at a time.
#ifndef SLIME_ENGINE_OPENAI_H_
#define SLIME_ENGINE_OPENAI_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "slime/common/status.h"
#include "slime/engine/protocol.h"
#include "slime/engine/request.h"
#include "slime/tokenizer/tokenizer.h"

namespace slime::engine {

enum class OpenAiEndpoint { kCompletions, kChatCompletions };

// What parsing and responses need to know about the server.
struct OpenAiContext {
  const tokenizer::Tokenizer* tok = nullptr;  // required (chat template, token text)
  ProtocolLimits limits;
  std::string served_model_name = "default";  // "model" when the request has none
  UnknownFieldLog* log = nullptr;             // may be null
};

struct ParsedOpenAi {
  OpenAiEndpoint endpoint = OpenAiEndpoint::kCompletions;
  std::string model;                  // as requested, else the served name
  std::vector<GenerateInput> inputs;  // prompts × n; inputs[k].index == k == choice index
  int64_t num_prompts = 1;
  int64_t n = 1;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool logprobs = false;       // return per-token logprobs in choices
  int64_t top_logprobs = 0;    // alternatives per position
};

StatusOr<ParsedOpenAi> ParseCompletionRequest(const nlohmann::json& body, const OpenAiContext& ctx);
StatusOr<ParsedOpenAi> ParseChatCompletionRequest(const nlohmann::json& body,
                                                  const OpenAiContext& ctx);

// "cmpl-<32 hex>" / "chatcmpl-<32 hex>".
std::string NewOpenAiId(OpenAiEndpoint endpoint);

// "stop" | "length" | "abort", or null while running.
nlohmann::json OpenAiFinishReason(const FinishReason& f);

// The non-streaming response; `outs[k]` is the final output of choice k (outs.size() ==
// req.inputs.size()). `created` is Unix seconds.
nlohmann::json OpenAiResponseJson(const ParsedOpenAi& req, std::span<const RequestOutput> outs,
                                  const OpenAiContext& ctx, const std::string& id, int64_t created);

// Streaming: turns cumulative RequestOutputs (any order across choices) into OpenAI chunks
// carrying only what each choice has not sent yet.
//   * text delta = new text since the last chunk of that choice. While the choice runs, a tail
//     that could be the start of one of its stop strings is held back (OpenAI clients cannot take
//     text back; it is sent once it is known not to be a stop string, or dropped when it is);
//   * chat: the first chunk of each choice carries {"role": "assistant", "content": ""};
//   * logprobs of the new tokens only; finish_reason on the choice's last chunk;
//   * after every choice finished, UsageChunk() when stream_options.include_usage, then the
//     caller sends kSseDone.
class OpenAiStream {
 public:
  OpenAiStream(const ParsedOpenAi& req, const OpenAiContext& ctx, std::string id, int64_t created);

  // `req` and `ctx` are copied from (ctx.tok is borrowed and must outlive the stream).
  // Chunks for one update of choice `out.index` (empty when there is nothing new). Updates after
  // the choice finished are ignored.
  std::vector<nlohmann::json> OnOutput(const RequestOutput& out);

  bool AllFinished() const;
  // {"id", "object", "created", "model", "choices": [], "usage": {...}} once AllFinished() and
  // include_usage; nullopt otherwise.
  std::optional<nlohmann::json> UsageChunk() const;

 private:
  struct Choice {
    std::vector<std::string> stops;  // the choice's stop strings (hold-back)
    size_t sent_text = 0;            // bytes of the cumulative text already sent
    size_t sent_tokens = 0;          // output tokens whose logprobs were sent
    int64_t sent_chars = 0;          // completions text_offset of the next token
    bool started = false;            // chat: role chunk sent
    bool finished = false;
    int64_t prompt_tokens = 0;
    int64_t completion_tokens = 0;
  };
  nlohmann::json Chunk(int64_t index, nlohmann::json text_delta, nlohmann::json logprobs,
                       const FinishReason* finish) const;

  // Copied from the request so the stream does not depend on its lifetime.
  OpenAiEndpoint endpoint_;
  std::string model_;
  int64_t n_;
  bool include_usage_;
  bool logprobs_;
  int64_t top_logprobs_;
  const tokenizer::Tokenizer* tok_;  // borrowed from the context; outlives the stream
  std::string id_;
  int64_t created_;
  std::vector<Choice> choices_;
};

// Logprobs of output tokens [begin, end) of `out` in the endpoint's shape:
// completions {"tokens", "token_logprobs", "top_logprobs" (null entries when top_logprobs is 0),
// "text_offset"}, chat {"content": [{"token", "logprob", "bytes", "top_logprobs"}]}. A token's
// text is its own lossy decode; "bytes" its raw UTF-8 bytes; a non-finite logprob is sent as
// -9999.0 (as vLLM). text_offset counts characters of the token texts from *text_offset (0 when
// null), which is advanced past the last token.
nlohmann::json OpenAiLogprobsJson(OpenAiEndpoint endpoint, const RequestOutput& out, size_t begin,
                                  size_t end, int64_t top_logprobs, const tokenizer::Tokenizer* tok,
                                  int64_t* text_offset = nullptr);

// {"object": "list", "data": [{"id", "object": "model", "created", "owned_by": "slime-cpp",
// "root", "max_model_len"}]}.
nlohmann::json ModelsJson(const std::string& served_model_name, int64_t created,
                          int64_t max_model_len);

// {"error": {"message", "type", "param", "code"}}: type "invalid_request_error" for 4xx,
// "server_error" otherwise; param = the field named by FieldError, else null; code = the
// HTTP status (HttpStatusFor).
nlohmann::json OpenAiErrorJson(const Status& status);

}  // namespace slime::engine

#endif  // SLIME_ENGINE_OPENAI_H_
