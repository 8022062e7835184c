// One sample's /generate request and answer (request.h).
#include "request.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"

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
  nlohmann::json body{{"input_ids", sample->tokens},
                      {"sampling_params", std::move(sp)},
                      {"return_logprob", true},
                      {"rid", rid}};
  if (sampling.return_routed_experts) {
    body["return_routed_experts"] = true;
    body["routed_experts_start_len"] = sample->RoutedRows();  // rows held: the rest is asked for
  }
  return body;
}

StatusOr<RoutedExperts> DecodeRoutedExperts(const std::string& base64, int64_t rows) {
  std::string bytes;
  if (!absl::Base64Unescape(base64, &bytes)) {
    return absl::InvalidArgumentError("meta_info.routed_experts is not base64");
  }
  if (bytes.size() % sizeof(int32_t) != 0) {
    return absl::InvalidArgumentError(fmt::format(
        "meta_info.routed_experts has {} bytes, not whole int32 values", bytes.size()));
  }
  RoutedExperts out;
  out.values.resize(bytes.size() / sizeof(int32_t));
  for (size_t i = 0; i < out.values.size(); ++i) {  // little-endian, whatever the host
    const auto* b = reinterpret_cast<const unsigned char*>(bytes.data() + 4 * i);
    out.values[i] = static_cast<int32_t>(static_cast<uint32_t>(b[0]) |
                                         (static_cast<uint32_t>(b[1]) << 8) |
                                         (static_cast<uint32_t>(b[2]) << 16) |
                                         (static_cast<uint32_t>(b[3]) << 24));
  }
  const int64_t n = static_cast<int64_t>(out.values.size());
  if (rows == 0) {
    if (n != 0) {
      return absl::InvalidArgumentError(
          fmt::format("meta_info.routed_experts has {} values for 0 rows", n));
    }
    return out;
  }
  if (rows < 0 || n == 0 || n % rows != 0) {
    return absl::InvalidArgumentError(fmt::format(
        "meta_info.routed_experts has {} int32 values, not a positive multiple of the {} rows "
        "expected (prompt + output − 1 − routed_experts_start_len)",
        n, rows));
  }
  out.per_token = n / rows;
  return out;
}

namespace {

// The answer's routing of the positions the request asked for (from sample->RoutedRows() to
// the last token but one once the `num_output` ids are appended), checked against the rows the
// sample holds. Nothing is changed: the caller appends it after the output ids.
StatusOr<RoutedExperts> ReadRoutedExperts(const nlohmann::json& meta, size_t num_output,
                                          const data::Sample& sample) {
  const auto it = meta.find("routed_experts");
  if (it == meta.end() || !it->is_string()) {
    return absl::InternalError(fmt::format(
        "sample {}: the engine's /generate answer has no meta_info.routed_experts (was "
        "return_routed_experts ignored? the engine needs --enable-return-routed-experts)",
        sample.index));
  }
  const int64_t rows = static_cast<int64_t>(sample.tokens.size() + num_output) - 1 -
                       sample.RoutedRows();
  StatusOr<RoutedExperts> decoded = DecodeRoutedExperts(it->get<std::string>(), rows);
  if (!decoded.ok()) {
    return absl::InternalError(
        fmt::format("sample {}: {}", sample.index, std::string(decoded.status().message())));
  }
  if (rows > 0 && sample.routed_experts_per_token > 0 &&
      decoded->per_token != sample.routed_experts_per_token) {
    return absl::InternalError(fmt::format(
        "sample {}: routed experts with {} entries per token after rows of {}", sample.index,
        decoded->per_token, sample.routed_experts_per_token));
  }
  decoded->rows = rows;
  return decoded;
}

}  // namespace

Status ApplyGenerateResponse(const nlohmann::json& response, data::Sample* sample,
                             bool routed_experts) {
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
  // The weights of the answer's tokens: each span's version, oldest first, where the engine
  // reports spans (an answer that lived through a weight update has several), else its one.
  std::vector<std::string> versions;
  std::vector<int64_t> span_tokens;  // each span's end − start, where every span gives them
  bool spans_counted = true;
  if (auto it = meta.find("weight_versions"); it != meta.end() && !it->is_null()) {
    if (!it->is_array()) return bad("has a meta_info.weight_versions that is not a list");
    for (size_t i = 0; i < it->size(); ++i) {
      const nlohmann::json& span = (*it)[i];
      if (!span.is_object() || !span.contains("version") || !span["version"].is_string()) {
        return bad(fmt::format(
            "has a malformed meta_info.weight_versions[{}] (each entry is {{\"version\": "
            "string, \"start\": int, \"end\": int}})",
            i));
      }
      versions.push_back(span["version"].get<std::string>());
      const auto start = span.find("start");
      const auto end = span.find("end");
      if (start == span.end() || end == span.end() || !start->is_number_integer() ||
          !end->is_number_integer() || end->get<int64_t>() < start->get<int64_t>()) {
        spans_counted = false;
      } else {
        span_tokens.push_back(end->get<int64_t>() - start->get<int64_t>());
      }
    }
  }
  if (auto it = meta.find("weight_version"); versions.empty() && it != meta.end() &&
                                             it->is_string()) {
    versions.push_back(it->get<std::string>());
  }
  const std::string weight_version = versions.empty() ? std::string() : versions.front();
  std::string text;
  if (auto it = response.find("text"); it != response.end() && it->is_string()) {
    text = it->get<std::string>();
  }
  const auto fr = meta.find("finish_reason");
  if (fr == meta.end() || !fr->is_object() || !fr->contains("type") || !(*fr)["type"].is_string()) {
    return bad("has no meta_info.finish_reason.type");
  }
  // An aborted answer may stop anywhere (mid-prompt): its rows are not kept, and the
  // continuation of the sample asks for them again from the rows it holds.
  std::optional<RoutedExperts> routed;
  if (routed_experts && (*fr)["type"].get<std::string>() != "abort") {
    SLIME_ASSIGN_OR_RETURN(routed, ReadRoutedExperts(meta, ids.size(), *sample));
  }
  if (!ids.empty() || !text.empty()) {
    SLIME_RETURN_IF_ERROR(
        sample->AppendResponse(ids, log_probs, /*trainable=*/true, text, weight_version));
  } else if (!weight_version.empty()) {
    sample->weight_versions.push_back(weight_version);
    if (sample->weight_version_tokens.size() + 1 == sample->weight_versions.size()) {
      sample->weight_version_tokens.push_back(0);
    }
  }
  // AppendResponse counted every id to the first span's version; the spans say how many each
  // version made (not known: the sample's counts are dropped).
  if (versions.size() > 1) {
    // Where the first span's version went in: the last entry, when it was appended at all.
    const size_t before = sample->weight_versions.size();
    for (size_t i = 1; i < versions.size(); ++i) sample->weight_versions.push_back(versions[i]);
    std::vector<int64_t>& counts = sample->weight_version_tokens;
    int64_t spanned = 0;
    for (const int64_t t : span_tokens) spanned += t;
    if (!spans_counted || weight_version.empty() || counts.size() != before ||
        spanned != static_cast<int64_t>(ids.size())) {
      counts.clear();
    } else {
      counts.pop_back();
      counts.insert(counts.end(), span_tokens.begin(), span_tokens.end());
    }
  }
  if (routed && routed->rows > 0) {
    SLIME_RETURN_IF_ERROR(
        sample->AppendRoutedExperts(routed->values, routed->rows, routed->per_token));
  }
  return sample->SetStatusFromFinishReason((*fr)["type"].get<std::string>());
}

}  // namespace slime::rollout::internal
