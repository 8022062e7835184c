// Custom generation: the seam through which user logic generates a sample instead of the
// coordinator's single /generate call (slime's --custom-generate-function-path,
// docs/algorithms.md, "Custom generation"). Three kinds plug in here:
//   * a generate plugin: a shared library behind the versioned C ABI of
//     include/slime/plugin/generate_plugin.h (plugin/plugin_generator.h);
//   * a tool environment spoken to over HTTP, run as a multi-turn episode
//     (workflow/env_generator.h);
//   * an unmodified agent program pointed at a per-sample OpenAI-compatible endpoint
//     (agent/agent_generator.h).
//
// Contract between the coordinator and a CustomGenerator:
//   * The coordinator picks one engine per prompt group (as for default generation, so the n
//     samples share a prefix cache) and calls Generate(sample, session) once per sample that
//     needs generation, on a thread of its own (blocking is fine), several samples at once.
//   * The generator talks to the engine only through the EngineSession (token-in/token-out:
//     input ids in, output ids and their log-probs out), appends what it made to the sample's
//     response with data::Sample::AppendResponse (model tokens trainable = true with their
//     log-probs; tool / environment tokens trainable = false), and sets the sample's status.
//   * It returns one or more segments: samples that replace the input sample in its group
//     (usually exactly one, the sample itself). Every segment keeps the input's group_index and
//     prompt; the coordinator assigns fresh unique `index` values to segments after the first
//     and records metadata["segment"] = k. Segments must pass data::Sample::Validate.
//   * `rewarded` = true: the generator set reward (and raw_reward) on every segment, e.g. from
//     the environment; the reward model is then not called for them. Otherwise the group is
//     scored by the reward model as usual.
//   * Abort: when the rollout is full (or the job stops), EngineSession::aborting() turns true,
//     a /generate in flight comes back with finish_reason "abort" (partial output kept), and
//     every later Generate returns at once with an empty "abort" turn. The generator must then
//     return promptly (status kAborted); aborted custom samples are dropped, never continued by
//     partial rollout (their multi-turn state lives in the generator).
//   * Errors: a returned error fails the rollout, naming the sample, unless the generator's
//     own error policy (e.g. rollout.on_env_error) turned it into a sample outcome.
//
// Threads: Generate is called concurrently for different samples; implementations must be
// thread-safe. An EngineSession is used by one Generate call at a time.
#ifndef SLIME_ROLLOUT_CUSTOM_GENERATE_H_
#define SLIME_ROLLOUT_CUSTOM_GENERATE_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "slime/common/status.h"
#include "slime/data/sample.h"

namespace slime::rollout {

struct SamplingOptions;

// One token-in/token-out /generate answer.
struct GenerateTurn {
  std::vector<int32_t> output_ids;
  std::vector<float> log_probs;  // one per output id: log_softmax(logits / temperature)
  std::string text;              // the engine's decoded text of output_ids
  std::string finish_reason;     // "stop", "length" or "abort"
  std::string weight_version;    // meta_info.weight_version ("" when absent)
};

// Blocking access to the engine picked for one sample's group.
class EngineSession {
 public:
  virtual ~EngineSession() = default;
  // POST /generate {input_ids, sampling_params, return_logprob: true} on this session's engine.
  // `overrides` (a JSON object, may be empty) is merged over the rollout's sampling params
  // (temperature, top_p, top_k, stop, stop_token_ids, ...), e.g. {"max_new_tokens": 64}.
  // Errors: the engine's errors as the rollout reports them (naming the engine).
  virtual StatusOr<GenerateTurn> Generate(std::span<const int32_t> input_ids,
                                          const nlohmann::json& overrides) = 0;
  // The rollout's sampling options (this sample's: train or eval dataset).
  virtual const SamplingOptions& sampling() const = 0;
  // True once the rollout is being cut short (see the file comment).
  virtual bool aborting() const = 0;
  virtual std::string engine_address() const = 0;  // "host:port"
  // "slime-rollout<id>-<sample index>-<n>": a request id prefix unique to this sample.
  virtual std::string request_id() const = 0;
};

struct CustomGenerateResult {
  std::vector<data::Sample> segments;  // at least one
  bool rewarded = false;               // rewards set by the generator (reward model skipped)
};

class CustomGenerator {
 public:
  virtual ~CustomGenerator() = default;
  // "plugin", "env" or "agent" (metrics and logs).
  virtual std::string kind() const = 0;
  // Generates `sample` (tokens = its prompt ids, response_length 0, status kPending).
  virtual StatusOr<CustomGenerateResult> Generate(const data::Sample& sample,
                                                  EngineSession* session) = 0;
};

}  // namespace slime::rollout

#endif  // SLIME_ROLLOUT_CUSTOM_GENERATE_H_
