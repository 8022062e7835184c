// Sample helpers (see sample.h).
#include "slime/data/sample.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <utility>

namespace slime::data {
namespace {

constexpr std::array<std::pair<SampleStatus, std::string_view>, 5> kStatusNames = {{
    {SampleStatus::kPending, "pending"},
    {SampleStatus::kCompleted, "completed"},
    {SampleStatus::kTruncated, "truncated"},
    {SampleStatus::kAborted, "aborted"},
    {SampleStatus::kFailed, "failed"},
}};

}  // namespace

std::string_view SampleStatusName(SampleStatus status) {
  for (const auto& [s, name] : kStatusNames) {
    if (s == status) return name;
  }
  return "unknown";
}

StatusOr<SampleStatus> ParseSampleStatus(std::string_view name) {
  for (const auto& [s, n] : kStatusNames) {
    if (n == name) return s;
  }
  return absl::InvalidArgumentError(
      fmt::format("unknown sample status \"{}\" (expected pending, completed, truncated, "
                  "aborted or failed)",
                  std::string(name)));
}

Status Sample::AppendResponse(std::span<const int32_t> ids, std::span<const float> log_probs,
                              bool trainable, std::string_view text,
                              std::string_view weight_version) {
  if (!log_probs.empty() && log_probs.size() != ids.size()) {
    return absl::InvalidArgumentError(
        fmt::format("sample {}: {} log-probs for {} appended tokens", index, log_probs.size(),
                    ids.size()));
  }
  const bool had_log_probs = !rollout_log_probs.empty();
  if (!log_probs.empty() && !had_log_probs && response_length > 0) {
    return absl::FailedPreconditionError(
        fmt::format("sample {}: log-probs appended after {} response tokens recorded without "
                    "them",
                    index, response_length));
  }
  tokens.insert(tokens.end(), ids.begin(), ids.end());
  response_length += static_cast<int64_t>(ids.size());
  loss_mask.insert(loss_mask.end(), ids.size(), trainable ? 1 : 0);
  if (!log_probs.empty()) {
    rollout_log_probs.insert(rollout_log_probs.end(), log_probs.begin(), log_probs.end());
  } else if (had_log_probs) {
    rollout_log_probs.insert(rollout_log_probs.end(), ids.size(), 0.0f);
  }
  teacher_log_probs.clear();
  response.append(text);
  if (!weight_version.empty()) {
    const bool counted = weight_version_tokens.size() == weight_versions.size();
    weight_versions.emplace_back(weight_version);
    if (counted) weight_version_tokens.push_back(static_cast<int64_t>(ids.size()));
  }
  return absl::OkStatus();
}

std::optional<int64_t> Sample::OldestWeightVersion() const {
  std::optional<int64_t> oldest;
  for (const std::string& v : weight_versions) {
    int64_t version = 0;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), version);
    if (ec != std::errc() || end != v.data() + v.size()) continue;
    oldest = oldest ? std::min(*oldest, version) : version;
  }
  return oldest;
}

void Sample::ClearResponse() {
  const int64_t prompt_length = PromptLength();
  tokens.resize(static_cast<size_t>(prompt_length));
  response_length = 0;
  response.clear();
  loss_mask.clear();
  rollout_log_probs.clear();
  teacher_log_probs.clear();
  weight_versions.clear();
  weight_version_tokens.clear();
  const int64_t prompt_rows = std::max<int64_t>(prompt_length - 1, 0);
  if (routed_experts_per_token > 0 && RoutedRows() > prompt_rows) {
    rollout_routed_experts.resize(static_cast<size_t>(prompt_rows * routed_experts_per_token));
  }
  if (rollout_routed_experts.empty()) routed_experts_per_token = 0;
  reward = 0.0;
  raw_reward = nullptr;
  status = SampleStatus::kPending;
  remove_sample = false;
}

Status Sample::AppendRoutedExperts(std::span<const int32_t> experts, int64_t rows,
                                   int64_t per_token) {
  if (rows < 0 || per_token <= 0 || static_cast<int64_t>(experts.size()) != rows * per_token) {
    return absl::InvalidArgumentError(fmt::format(
        "sample {}: routed experts of {} entries are not {} rows × {} per token", index,
        experts.size(), rows, per_token));
  }
  if (!rollout_routed_experts.empty() && per_token != routed_experts_per_token) {
    return absl::InvalidArgumentError(fmt::format(
        "sample {}: routed experts with {} entries per token after rows of {}", index, per_token,
        routed_experts_per_token));
  }
  const int64_t limit = static_cast<int64_t>(tokens.size()) - 1;
  if (RoutedRows() + rows > limit) {
    return absl::InvalidArgumentError(fmt::format(
        "sample {}: {} routed rows after {} would pass tokens − 1 = {}", index, rows,
        RoutedRows(), limit));
  }
  rollout_routed_experts.insert(rollout_routed_experts.end(), experts.begin(), experts.end());
  routed_experts_per_token = per_token;
  return absl::OkStatus();
}

Status Sample::SetStatusFromFinishReason(std::string_view finish_reason) {
  if (finish_reason == "stop") {
    status = SampleStatus::kCompleted;
  } else if (finish_reason == "length") {
    status = SampleStatus::kTruncated;
  } else if (finish_reason == "abort") {
    status = SampleStatus::kAborted;
  } else {
    return absl::InvalidArgumentError(
        fmt::format("sample {}: unknown finish reason \"{}\" (expected stop, length or abort)",
                    index, std::string(finish_reason)));
  }
  return absl::OkStatus();
}

Status Sample::Validate() const {
  const int64_t n = static_cast<int64_t>(tokens.size());
  auto bad = [&](const std::string& what) {
    return absl::FailedPreconditionError(fmt::format("sample {}: {}", index, what));
  };
  if (response_length < 0 || response_length > n) {
    return bad(fmt::format("response_length {} outside [0, {}] (tokens)", response_length, n));
  }
  if (static_cast<int64_t>(loss_mask.size()) != response_length) {
    return bad(fmt::format("loss_mask has {} entries, response_length is {}", loss_mask.size(),
                           response_length));
  }
  if (!rollout_log_probs.empty() &&
      static_cast<int64_t>(rollout_log_probs.size()) != response_length) {
    return bad(fmt::format("rollout_log_probs has {} entries, response_length is {}",
                           rollout_log_probs.size(), response_length));
  }
  if (!teacher_log_probs.empty() &&
      static_cast<int64_t>(teacher_log_probs.size()) != response_length) {
    return bad(fmt::format("teacher_log_probs has {} entries, response_length is {}",
                           teacher_log_probs.size(), response_length));
  }
  if (!rollout_routed_experts.empty()) {
    const int64_t size = static_cast<int64_t>(rollout_routed_experts.size());
    if (routed_experts_per_token <= 0 || size % routed_experts_per_token != 0) {
      return bad(fmt::format("rollout_routed_experts has {} entries, not rows × "
                             "routed_experts_per_token ({})",
                             size, routed_experts_per_token));
    }
    if (RoutedRows() > n - 1) {
      return bad(fmt::format("rollout_routed_experts has {} rows for {} tokens (at most {})",
                             RoutedRows(), n, n - 1));
    }
  }
  if (!metadata.is_object()) {
    return bad(fmt::format("metadata is {}, expected an object", metadata.type_name()));
  }
  if (!weight_version_tokens.empty()) {
    if (weight_version_tokens.size() != weight_versions.size()) {
      return bad(fmt::format("weight_version_tokens has {} entries, weight_versions {}",
                             weight_version_tokens.size(), weight_versions.size()));
    }
    int64_t sum = 0;
    for (const int64_t t : weight_version_tokens) {
      if (t < 0) return bad(fmt::format("weight_version_tokens has a negative entry {}", t));
      sum += t;
    }
    if (sum > response_length) {
      return bad(fmt::format("weight_version_tokens sum to {}, past response_length {}", sum,
                             response_length));
    }
  }
  return absl::OkStatus();
}

}  // namespace slime::data
