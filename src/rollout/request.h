// Internal to the rollout module: one sample's /generate request and the answer's effect on the
// sample (the pure part of slime's sglang_rollout.generate). Thread-safety: pure functions.
#ifndef SLIME_SRC_ROLLOUT_REQUEST_H_
#define SLIME_SRC_ROLLOUT_REQUEST_H_

#include <optional>
#include <string>

#include "nlohmann/json.hpp"
#include "slime/common/status.h"
#include "slime/data/sample.h"
#include "slime/rollout/coordinator.h"

namespace slime::rollout::internal {

// The body of POST /generate for `sample` (input_ids = all its tokens, so a partial response
// is continued), or nullopt when no token budget is left: then the sample is marked truncated.
// `sampling_seed` is sent when set.
std::optional<nlohmann::json> BuildGenerateRequest(data::Sample* sample,
                                                   const SamplingOptions& sampling,
                                                   const std::string& rid,
                                                   std::optional<int64_t> sampling_seed);

// Appends an SGLang /generate answer (output_ids, meta_info.output_token_logprobs,
// finish_reason, weight_version, text) to the sample and sets its status. Errors name the
// sample and the missing or malformed field. With `routed_experts` (the request asked for them
// from routed_experts_start_len = sample->RoutedRows()), meta_info.routed_experts is required
// and appended (DecodeRoutedExperts), except from an aborted answer, whose rows are dropped
// (it may stop mid-prompt; a continuation asks for them again).
Status ApplyGenerateResponse(const nlohmann::json& response, data::Sample* sample,
                             bool routed_experts = false);

// meta_info.routed_experts: base64 of a little-endian int32 array of `rows` × per-token entries
// → the int32 values and the per-token count (layers × top_k). InvalidArgument naming the sizes
// when the bytes are not base64, not whole int32s, or not a multiple of `rows` (rows > 0).
struct RoutedExperts {
  std::vector<int32_t> values;  // [rows, per_token] flattened
  int64_t per_token = 0;
  int64_t rows = 0;
};
StatusOr<RoutedExperts> DecodeRoutedExperts(const std::string& base64, int64_t rows);

}  // namespace slime::rollout::internal

#endif  // SLIME_SRC_ROLLOUT_REQUEST_H_
