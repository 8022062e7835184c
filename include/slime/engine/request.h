// The engine's request vocabulary: what one generation request asks for (GenerateInput with its
// SamplingParams) and what it has produced so far (RequestOutput). Pure data, no LibTorch.
//
// These types sit between the HTTP layer (protocol.h parses SGLang / OpenAI JSON into
// GenerateInput and serializes RequestOutput) and the engine loop (engine.h), which owns the
// model, the KV cache and the scheduler. One GenerateInput is one sequence: a batch body or
// `n > 1` is expanded into several inputs before it reaches the engine.
//
// Field semantics follow SGLang (docs/http-api.md §1).
// Thread-safety: plain values; copy freely between threads.
#ifndef SLIME_ENGINE_REQUEST_H_
#define SLIME_ENGINE_REQUEST_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace slime::engine {

// SGLang's sampling_params, validated (protocol.h enforces the ranges below).
struct SamplingParams {
  // Tokens to generate; nullopt = until the context limit. 0 = prefill only (scoring).
  std::optional<int64_t> max_new_tokens = 128;
  int64_t min_new_tokens = 0;        // EOS / stop tokens are masked until this many were produced
  double temperature = 1.0;          // >= 0; < 1e-6 means greedy
  double top_p = 1.0;                // (0, 1]
  int64_t top_k = -1;                // -1 (whole vocabulary) or >= 1
  double min_p = 0.0;                // [0, 1]
  double frequency_penalty = 0.0;    // [-2, 2]
  double presence_penalty = 0.0;     // [-2, 2]
  double repetition_penalty = 1.0;   // (0, 2]
  std::vector<std::string> stop;     // stop strings, matched on the detokenized output
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  bool skip_special_tokens = true;
  bool spaces_between_special_tokens = true;
  bool no_stop_trim = false;
  std::optional<uint64_t> sampling_seed;  // same seed + same prompt => same output
  std::map<int32_t, double> logit_bias;   // added to the logits before everything else

  bool greedy() const { return temperature < 1e-6 || top_k == 1; }
  bool has_penalties() const {
    return frequency_penalty != 0.0 || presence_penalty != 0.0 || repetition_penalty != 1.0;
  }
};

// One sequence to generate.
struct GenerateInput {
  std::string rid;                    // unique among live requests; abort matches by prefix
  std::vector<int32_t> input_ids;     // the prompt (text is tokenized before the engine sees it)
  SamplingParams sampling;
  bool return_logprob = false;
  int64_t logprob_start_len = -1;     // first prompt position with an input logprob; -1: none
  int64_t top_logprobs_num = 0;       // top alternatives per returned position
  // SGLang's return_routed_experts: the experts of every position fed through the model from
  // routed_experts_start_len on (RequestOutput::routed_experts).
  bool return_routed_experts = false;
  int64_t routed_experts_start_len = 0;
  bool stream = false;
  int64_t index = 0;                  // position in the expanded batch (SSE "index")
};

enum class FinishType { kNone, kStop, kLength, kAbort };

// SGLang's finish_reason object.
struct FinishReason {
  FinishType type = FinishType::kNone;
  std::optional<int32_t> matched_token;       // kStop by EOS / stop_token_ids
  std::optional<std::string> matched_string;  // kStop by a stop string
  int64_t length = 0;                         // kLength: the max_new_tokens that was reached
  std::string message;                        // kAbort: why
  std::optional<int> status_code;             // kAbort: null = user abort (HTTP 200)

  bool finished() const { return type != FinishType::kNone; }
  static FinishReason Stop(int32_t token) {
    FinishReason r;
    r.type = FinishType::kStop;
    r.matched_token = token;
    return r;
  }
  static FinishReason StopString(std::string s) {
    FinishReason r;
    r.type = FinishType::kStop;
    r.matched_string = std::move(s);
    return r;
  }
  static FinishReason Length(int64_t n) {
    FinishReason r;
    r.type = FinishType::kLength;
    r.length = n;
    return r;
  }
  static FinishReason Abort(std::string message, std::optional<int> status_code = std::nullopt) {
    FinishReason r;
    r.type = FinishType::kAbort;
    r.message = std::move(message);
    r.status_code = status_code;
    return r;
  }
};

// Top alternatives at one position: (logprob, token id), best first.
using TopLogprobs = std::vector<std::pair<float, int32_t>>;

// Output tokens [start, end) sampled with the weights of `version` (a request that lives
// through a weight update — a pause in place or by retraction — has one span per version).
struct WeightVersionSpan {
  std::string version;
  int64_t start = 0;
  int64_t end = 0;
  bool operator==(const WeightVersionSpan&) const = default;
};

// Everything a request has produced so far (cumulative; the engine sends a copy per update).
struct RequestOutput {
  std::string rid;
  int64_t index = 0;
  std::vector<int32_t> output_ids;           // every sampled token, the final EOS/stop included
  std::string text;                          // detokenized output, trimmed per no_stop_trim
  // return_logprob: one per output id; log_softmax(logits / T) before top-k/top-p/min-p.
  std::vector<float> output_logprobs;
  std::vector<TopLogprobs> output_top_logprobs;  // when top_logprobs_num > 0
  // return_logprob with logprob_start_len >= 0: prompt positions [start, prompt_len); the
  // logprob of position 0 is nullopt (nothing precedes it).
  std::vector<int32_t> input_logprob_ids;
  std::vector<std::optional<float>> input_logprobs;
  std::vector<TopLogprobs> input_top_logprobs;
  // return_routed_experts: positions [routed_experts_start_len, prompt + output − 1) (the last
  // sampled token is never fed), [rows, layers, top_k] flattened; each row ascending; a dense
  // layer of a partly sparse model gives zeros.
  std::vector<int32_t> routed_experts;
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;                 // prompt tokens served from the prefix cache
  int64_t num_retractions = 0;               // times the request was preempted and recomputed
  FinishReason finish;
  // The weights of the last output token (of the engine at arrival until one is sampled), and
  // every output token's by span, in order.
  std::string weight_version;
  std::vector<WeightVersionSpan> weight_versions;
  double e2e_latency = 0.0;                  // seconds from arrival to finish (0 until then)
};

}  // namespace slime::engine

#endif  // SLIME_ENGINE_REQUEST_H_
