// One sample's /generate request and answer (request.h).
#include "request.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

namespace slime::rollout::internal {

std::optional<nlohmann::json> BuildGenerateRequest(data::Sample* sample,
                                                   const SamplingOptions& sampling,
                                                   const std::string& rid,
                                                   std::optional<int64_t> sampling_seed) {
  // Token budget: what is left of max_response_len (a resumed partial response counts) and of
  // the context (slime: max_new_tokens −= already generated; 0 left → truncated).
  std::optional<int64_t> max_new;
  if (sampling.max_response_len) {
    max_new = static_cast<int64_t>(*sampling.max_response_len) - sample->response_length;
  }
  if (sampling.max_context_len) {
    const int64_t room = static_cast<int64_t>(*sampling.max_context_len) -
                         static_cast<int64_t>(sample->tokens.size());
    max_new = max_new ? std::min(*max_new, room) : room;
  }
  if (max_new && *max_new <= 0) {
    sample->status = data::SampleStatus::kTruncated;
    return std::nullopt;
  }
  nlohmann::json sp = {
      {"temperature", sampling.temperature},
      {"top_p", sampling.top_p},
      {"top_k", sampling.top_k},
      {"skip_special_tokens", sampling.skip_special_tokens},
      {"no_stop_trim", true},
      {"spaces_between_special_tokens", false},
  };
  if (max_new) sp["max_new_tokens"] = *max_new;
  if (!sampling.stop.empty()) sp["stop"] = sampling.stop;
  if (!sampling.stop_token_ids.empty()) sp["stop_token_ids"] = sampling.stop_token_ids;
  if (sampling.min_new_tokens) {
    sp["min_new_tokens"] =
        max_new ? std::min<int64_t>(*sampling.min_new_tokens, *max_new) : *sampling.min_new_tokens;
  }
  if (sampling_seed) sp["sampling_seed"] = *sampling_seed;
  return nlohmann::json{{"input_ids", sample->tokens},
                        {"sampling_params", std::move(sp)},
                        {"return_logprob", true},
                        {"rid", rid}};
}

Status ApplyGenerateResponse(const nlohmann::json& response, data::Sample* sample) {
  auto bad = [&](const std::string& what) {
    return absl::InternalError(
        fmt::format("sample {}: the engine's /generate answer {}", sample->index, what));
  };
  const auto meta_it = response.find("meta_info");
  if (meta_it == response.end() || !meta_it->is_object()) return bad("has no meta_info object");
  const nlohmann::json& meta = *meta_it;
  const auto ids_it = response.find("output_ids");
  if (ids_it == response.end() || !ids_it->is_array()) return bad("has no output_ids list");
  std::vector<int32_t> ids;
  for (const auto& v : *ids_it) {
    if (!v.is_number_integer()) return bad("has a non-integer entry in output_ids");
    ids.push_back(v.get<int32_t>());
  }
  // [[logprob, id, text], ...]: token-in/token-out, the ids must agree with output_ids.
  std::vector<float> log_probs;
  const auto lp_it = meta.find("output_token_logprobs");
  if (lp_it == meta.end() || !lp_it->is_array()) {
    return bad("has no meta_info.output_token_logprobs (was return_logprob ignored?)");
  }
  if (lp_it->size() != ids.size()) {
    return bad(
        fmt::format("has {} output_token_logprobs for {} output_ids", lp_it->size(), ids.size()));
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    const nlohmann::json& e = (*lp_it)[i];
    if (!e.is_array() || e.size() < 2 || !e[0].is_number() || !e[1].is_number_integer()) {
      return bad(fmt::format("has a malformed output_token_logprobs[{}]", i));
    }
    if (e[1].get<int32_t>() != ids[i]) {
      return bad(fmt::format("output_token_logprobs[{}] is for token {} but output_ids[{}] = {}", i,
                             e[1].get<int32_t>(), i, ids[i]));
    }
    log_probs.push_back(e[0].get<float>());
  }
  std::string weight_version;
  if (auto it = meta.find("weight_version"); it != meta.end() && it->is_string()) {
    weight_version = it->get<std::string>();
  }
  std::string text;
  if (auto it = response.find("text"); it != response.end() && it->is_string()) {
    text = it->get<std::string>();
  }
  const auto fr = meta.find("finish_reason");
  if (fr == meta.end() || !fr->is_object() || !fr->contains("type") || !(*fr)["type"].is_string()) {
    return bad("has no meta_info.finish_reason.type");
  }
  if (!ids.empty() || !text.empty()) {
    SLIME_RETURN_IF_ERROR(
        sample->AppendResponse(ids, log_probs, /*trainable=*/true, text, weight_version));
  } else if (!weight_version.empty()) {
    sample->weight_versions.push_back(weight_version);
  }
  return sample->SetStatusFromFinishReason((*fr)["type"].get<std::string>());
}

}  // namespace slime::rollout::internal
