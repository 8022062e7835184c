// Sample: one prompt and (once generated) one response, the record the rollout coordinator,
// the reward functions and the trainer pass between them (slime's `Sample`, docs/data.md).
//
// Life of a sample:
//   PromptDataSource::GetSamples   tokens = prompt ids, response_length = 0, status kPending
//   rollout (engine generation)    AppendResponse(...) once per generated or tool span;
//                                  SetStatusFromFinishReason("stop"|"length"|"abort")
//   reward function                reward (the scalar the estimator uses), raw_reward (the full
//                                  result, e.g. {"score": 1, "acc": true})
//   OPD teacher (opd_type sglang)  teacher_log_probs (rollout/teacher.h)
//   trainer                        tokens / response_length / loss_mask / rollout_log_probs
//
//   kPending ──stop──▶ kCompleted      kPending ──length──▶ kTruncated
//   kPending ──abort─▶ kAborted        any      ──error───▶ kFailed
//
// Invariants (checked by Validate):
//   1. 0 <= response_length <= tokens.size(); the prompt is tokens[0 : PromptLength()].
//   2. loss_mask.size() == response_length (1 = a model token trained on, 0 = a tool or
//      environment token in a multi-turn response).
//   3. rollout_log_probs and teacher_log_probs are each empty (not recorded) or have
//      response_length entries.
//   4. metadata is a JSON object.
//   5. rollout_routed_experts is empty, or holds rows × routed_experts_per_token entries with
//      routed_experts_per_token > 0 and rows <= tokens.size() − 1 (rows < tokens − 1 only
//      between a tool span and the next engine call).
//   6. weight_version_tokens is empty (not known) or has one entry ≥ 0 per weight_versions
//      entry, summing to at most response_length.
// A group is the n_samples_per_prompt samples of one prompt; they share group_index and have
// consecutive `index` values.
//
// Torch-free, plain value type: copy freely, no internal synchronisation.
#ifndef SLIME_DATA_SAMPLE_H_
#define SLIME_DATA_SAMPLE_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "slime/common/status.h"

namespace slime::data {

enum class SampleStatus {
  kPending,    // not generated yet (or being generated)
  kCompleted,  // the engine stopped on a stop token or string ("stop")
  kTruncated,  // the engine hit max_new_tokens or the context limit ("length")
  kAborted,    // generation was aborted (rollout cut short, engine shut down: "abort")
  kFailed,     // generation or reward failed; the sample carries no usable response
};

// "pending", "completed", "truncated", "aborted", "failed".
std::string_view SampleStatusName(SampleStatus status);
// Inverse of SampleStatusName. Error: an unknown name (the message lists the valid ones).
StatusOr<SampleStatus> ParseSampleStatus(std::string_view name);

struct Sample {
  int64_t group_index = -1;  // which prompt group (increasing across the run)
  int64_t index = -1;        // sample id (increasing across the run, unique)
  int64_t rollout_id = -1;   // the rollout that produced it (-1 until assigned)

  // The prompt as the dataset gave it: a string, or a list of chat messages.
  nlohmann::ordered_json prompt;
  std::string prompt_text;  // the text sent to the engine (chat template applied when enabled)

  std::vector<int32_t> tokens;  // [prompt + response] token ids
  int64_t response_length = 0;  // response tokens at the end of `tokens`
  std::string response;         // decoded response text

  std::string label;                               // the reference answer ("" when none)
  double reward = 0.0;                             // scalar reward used for training
  nlohmann::json raw_reward;                       // the reward function's full result (null)
  std::vector<uint8_t> loss_mask;                  // [response_length]
  std::vector<float> rollout_log_probs;            // [response_length] or empty
  std::vector<float> teacher_log_probs;            // [response_length] or empty (OPD teacher)
  SampleStatus status = SampleStatus::kPending;
  nlohmann::ordered_json metadata = nlohmann::ordered_json::object();  // rm_type, tools, ...
  std::vector<std::string> weight_versions;  // engine weight version of each generated span
  // The generated tokens of each weight_versions entry, or empty where not known (an external
  // trajectory that did not say, a checkpoint written before this field).
  std::vector<int64_t> weight_version_tokens;
  // Routing replay (docs/algorithms.md, "Routing replay"): the engine's experts of positions
  // 0..rows−1 of `tokens`, [rows, layers, top_k] int32 flattened (slime's
  // rollout_routed_experts; row i is the routing of token i, the last token is never fed), or
  // empty. routed_experts_per_token = layers × top_k (0 while empty).
  std::vector<int32_t> rollout_routed_experts;
  int64_t routed_experts_per_token = 0;
  bool remove_sample = false;                // excluded from training (loss mask forced to 0)

  int64_t PromptLength() const { return static_cast<int64_t>(tokens.size()) - response_length; }

  // The oldest weight version among weight_versions, where they are integers (the versions
  // slime_train's weight syncs name); nullopt when there is none.
  std::optional<int64_t> OldestWeightVersion() const;

  // Back to the prompt, as the data source gave it: the response, its masks, log-probs,
  // versions, routing rows past the prompt, reward and status are cleared (kPending); index,
  // group_index, prompt, label and metadata stay.
  void ClearResponse();

  // Appends a response span: `ids` to tokens, response_length += ids.size(), loss-mask entries
  // of 1 (`trainable`, model output) or 0 (tool / environment output). `log_probs` must have
  // ids.size() entries for a trainable span that records log-probs; spans without log-probs
  // (tool output, or a rollout that does not record them) append 0s when the sample already
  // has log-probs. Appending log-probs to a sample whose earlier spans had none is an error
  // (invariant 3 would break). `text` is appended to `response`; `weight_version`, when not
  // empty, to weight_versions (with ids.size() in weight_version_tokens while those are
  // known). teacher_log_probs are cleared (they scored the old response).
  Status AppendResponse(std::span<const int32_t> ids, std::span<const float> log_probs,
                        bool trainable, std::string_view text = {},
                        std::string_view weight_version = {});

  // The engine's finish reason → status: "stop" → kCompleted, "length" → kTruncated,
  // "abort" → kAborted. Error: any other reason (status unchanged).
  Status SetStatusFromFinishReason(std::string_view finish_reason);

  // Appends an engine's routing of positions [RoutedRows(), RoutedRows() + rows) (its answer to
  // routed_experts_start_len = RoutedRows()): `experts` is [rows, per_token] flattened.
  // InvalidArgument naming the sizes when per_token differs from the rows already held or the
  // rows would pass tokens.size() − 1.
  Status AppendRoutedExperts(std::span<const int32_t> experts, int64_t rows, int64_t per_token);
  int64_t RoutedRows() const {
    return routed_experts_per_token > 0
               ? static_cast<int64_t>(rollout_routed_experts.size()) / routed_experts_per_token
               : 0;
  }

  // Checks invariants 1–5; the message names the sample index and the broken field.
  Status Validate() const;
};

// A prompt's group of samples.
using SampleGroup = std::vector<Sample>;

}  // namespace slime::data

#endif  // SLIME_DATA_SAMPLE_H_
