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
// sample and the missing or malformed field.
Status ApplyGenerateResponse(const nlohmann::json& response, data::Sample* sample);

}  // namespace slime::rollout::internal

#endif  // SLIME_SRC_ROLLOUT_REQUEST_H_
