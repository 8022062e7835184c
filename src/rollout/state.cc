// Sample <-> JSON and the coordinator's checkpoint state (coordinator.h).
#include <fmt/format.h>

#include "slime/rollout/coordinator.h"

namespace slime::rollout {

nlohmann::json SampleToJson(const data::Sample& s) {
  return nlohmann::json{
      {"group_index", s.group_index},
      {"index", s.index},
      {"rollout_id", s.rollout_id},
      {"prompt", nlohmann::json::parse(s.prompt.dump())},
      {"prompt_text", s.prompt_text},
      {"tokens", s.tokens},
      {"response_length", s.response_length},
      {"response", s.response},
      {"label", s.label},
      {"reward", s.reward},
      {"raw_reward", s.raw_reward},
      {"loss_mask", s.loss_mask},
      {"rollout_log_probs", s.rollout_log_probs},
      {"teacher_log_probs", s.teacher_log_probs},
      {"status", std::string(data::SampleStatusName(s.status))},
      {"metadata", nlohmann::json::parse(s.metadata.dump())},
      {"weight_versions", s.weight_versions},
      {"weight_version_tokens", s.weight_version_tokens},
      {"remove_sample", s.remove_sample},
      {"rollout_routed_experts", s.rollout_routed_experts},
      {"routed_experts_per_token", s.routed_experts_per_token},
  };
}

StatusOr<data::Sample> SampleFromJson(const nlohmann::json& j) {
  if (!j.is_object()) return absl::InvalidArgumentError("a sample must be a JSON object");
  data::Sample s;
  std::string field;
  try {
    field = "group_index";
    s.group_index = j.at(field).get<int64_t>();
    field = "index";
    s.index = j.at(field).get<int64_t>();
    field = "rollout_id";
    s.rollout_id = j.at(field).get<int64_t>();
    field = "prompt";
    s.prompt = nlohmann::ordered_json::parse(j.at(field).dump());
    field = "prompt_text";
    s.prompt_text = j.at(field).get<std::string>();
    field = "tokens";
    s.tokens = j.at(field).get<std::vector<int32_t>>();
    field = "response_length";
    s.response_length = j.at(field).get<int64_t>();
    field = "response";
    s.response = j.at(field).get<std::string>();
    field = "label";
    s.label = j.at(field).get<std::string>();
    field = "reward";
    s.reward = j.at(field).get<double>();
    field = "raw_reward";
    s.raw_reward = j.at(field);
    field = "loss_mask";
    s.loss_mask = j.at(field).get<std::vector<uint8_t>>();
    field = "rollout_log_probs";
    s.rollout_log_probs = j.at(field).get<std::vector<float>>();
    field = "teacher_log_probs";  // optional: files written before it existed lack it
    if (j.contains(field)) s.teacher_log_probs = j.at(field).get<std::vector<float>>();
    field = "status";
    SLIME_ASSIGN_OR_RETURN(s.status, data::ParseSampleStatus(j.at(field).get<std::string>()));
    field = "metadata";
    s.metadata = nlohmann::ordered_json::parse(j.at(field).dump());
    field = "weight_versions";
    s.weight_versions = j.at(field).get<std::vector<std::string>>();
    field = "weight_version_tokens";  // optional: files written before it existed lack it
    if (j.contains(field)) s.weight_version_tokens = j.at(field).get<std::vector<int64_t>>();
    field = "remove_sample";
    s.remove_sample = j.at(field).get<bool>();
    field = "rollout_routed_experts";  // optional: files written before it existed lack it
    if (j.contains(field)) {
      s.rollout_routed_experts = j.at(field).get<std::vector<int32_t>>();
      field = "routed_experts_per_token";
      s.routed_experts_per_token = j.at(field).get<int64_t>();
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(
        fmt::format("sample field '{}' is missing or has the wrong type: {}", field, e.what()));
  }
  SLIME_RETURN_IF_ERROR(s.Validate());
  return s;
}

nlohmann::json RolloutCoordinator::State() const {
  nlohmann::json groups = nlohmann::json::array();
  for (const auto& g : buffer_) {
    nlohmann::json group = nlohmann::json::array();
    for (const auto& s : g) group.push_back(SampleToJson(s));
    groups.push_back(std::move(group));
  }
  return {{"version", 1}, {"partial_rollout_buffer", std::move(groups)}};
}

Status RolloutCoordinator::RestoreState(const nlohmann::json& state) {
  if (!state.is_object() || state.value("version", 0) != 1 ||
      !state.contains("partial_rollout_buffer") || !state["partial_rollout_buffer"].is_array()) {
    return absl::InvalidArgumentError(
        "rollout state must be {\"version\": 1, \"partial_rollout_buffer\": [...]}");
  }
  std::vector<data::SampleGroup> buffer;
  const nlohmann::json& groups = state["partial_rollout_buffer"];
  for (size_t g = 0; g < groups.size(); ++g) {
    if (!groups[g].is_array() || groups[g].empty()) {
      return absl::InvalidArgumentError(fmt::format(
          "rollout state: partial_rollout_buffer[{}] must be a non-empty list of samples", g));
    }
    data::SampleGroup group;
    for (size_t i = 0; i < groups[g].size(); ++i) {
      StatusOr<data::Sample> s = SampleFromJson(groups[g][i]);
      if (!s.ok()) {
        return absl::InvalidArgumentError(
            fmt::format("rollout state: partial_rollout_buffer[{}][{}]: {}", g, i,
                        std::string(s.status().message())));
      }
      group.push_back(std::move(*s));
    }
    buffer.push_back(std::move(group));
  }
  buffer_ = std::move(buffer);
  return absl::OkStatus();
}

}  // namespace slime::rollout
