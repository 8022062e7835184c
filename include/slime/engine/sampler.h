// Sampler: next tokens and their log-probs for a batch of sequences, exactly as SGLang defines
// them (docs/http-api.md §1.2, §1.5).
//
// Per row, in order:
//   1. logits += logit_bias;
//   2. penalties: repetition (SGLang: tokens of prompt and output; positive logits divided,
//      negative multiplied), frequency (minus penalty x count in the output), presence (minus
//      penalty once per token present in the output);
//   3. while fewer than min_new_tokens were produced, the stop ids (EOS, stop_token_ids) are -inf;
//   4. logprobs = log_softmax(logits / T) with T = temperature (T = 1 for greedy rows) — this
//      is the returned log-prob, before any truncation;
//   5. greedy rows (T < 1e-6 or top_k == 1) take argmax; others sample from softmax(logits / T)
//      truncated by top_k, top_p (keep the smallest prefix of the sorted distribution whose mass
//      before a token is <= top_p) and min_p (keep p >= min_p * p_max).
// Sampling inverts the row's cumulative distribution at one uniform u = hash(row seed, output
// index): the first token whose cumulative (truncated) mass exceeds u * total. A request's
// tokens depend only on its seed, its prompt and the logits — not on the batch it shares — so
// the same sampling_seed and prompt give the same output.
//
// One device-to-host copy per call (token ids and their log-probs; top log-probs when asked).
// Thread-safety: stateless apart from its options; the engine thread calls it.
#ifndef SLIME_ENGINE_SAMPLER_H_
#define SLIME_ENGINE_SAMPLER_H_

#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "slime/engine/request.h"

namespace slime::engine {

struct SamplerRow {
  const SamplingParams* params = nullptr;
  const std::vector<int32_t>* tokens = nullptr;  // prompt + output so far (for penalties)
  int64_t prompt_len = 0;
  int64_t num_output = 0;        // tokens produced so far (min_new_tokens, noise position)
  uint64_t seed = 0;             // the request's seed
  const std::vector<int32_t>* stop_ids = nullptr;  // masked while num_output < min_new_tokens
  int64_t top_logprobs_num = 0;
  bool need_logprob = true;      // false: the returned log-prob may be 0 (saves a softmax when
                                 // no row of the batch needs one)
};

struct SamplerOutput {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;          // log_softmax(logits / T)[token]
  std::vector<TopLogprobs> top;         // per row; empty where not asked
};

// How Sample computes. kAuto: on CUDA, batches without top-k/top-p/min-p truncation and without
// top log-probs go through one fused kernel (src/engine/cuda/sample.h); everything else through
// LibTorch ops. kTorch forces the LibTorch ops (the reference the kernel is tested against).
enum class SamplerPath { kAuto, kTorch };

// logits [B, V] in any floating dtype on any device; rows.size() == B.
SamplerOutput Sample(const torch::Tensor& logits, const std::vector<SamplerRow>& rows,
                     SamplerPath path = SamplerPath::kAuto);

// The uniform the sampler uses for the token at output index `position` of a request seeded
// with `seed`: u in (0, 1).
double SamplerUniform(uint64_t seed, int64_t position);

// log_softmax(logits / temperature) [T, V] -> the log-prob of target[i] at row i, [T] float32.
// (Prompt log-probs for input_token_logprobs and prefill-only scoring.)
torch::Tensor TokenLogprobs(const torch::Tensor& logits, const torch::Tensor& targets,
                            double temperature);

}  // namespace slime::engine

#endif  // SLIME_ENGINE_SAMPLER_H_
