// The debug modes' saved rollouts (debug_data.h).
#include "debug_data.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "slime/common/atomic_file.h"

namespace slime::job {
namespace {

using Json = nlohmann::json;

}  // namespace

std::string DebugRolloutPath(const std::string& pattern, int64_t rollout_id) {
  std::string out = pattern;
  const std::string key = "{rollout_id}";
  for (size_t pos = out.find(key); pos != std::string::npos; pos = out.find(key)) {
    out.replace(pos, key.size(), std::to_string(rollout_id));
  }
  return out;
}

Status SaveDebugRollout(const std::string& path, const rollout::RolloutResult& result) {
  Json groups = Json::array();
  for (const data::SampleGroup& g : result.groups) {
    Json group = Json::array();
    for (const data::Sample& s : g) group.push_back(rollout::SampleToJson(s));
    groups.push_back(std::move(group));
  }
  Json doc = {{"format", "slime-cpp rollout data"},
              {"version", 1},
              {"rollout_id", result.rollout_id},
              {"samples", std::move(groups)},
              {"raw_rewards", result.raw_rewards},
              {"rewards", result.rewards},
              {"metrics", result.metrics}};
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  return WriteFileAtomically(path, doc.dump() + "\n");
}

StatusOr<rollout::RolloutResult> LoadDebugRollout(const std::string& path, int64_t rollout_id) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(fmt::format("{}: cannot open the saved rollout data", path));
  std::stringstream text;
  text << in.rdbuf();
  Json doc = Json::parse(text.str(), nullptr, false);
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("samples")) {
    return absl::InvalidArgumentError(
        fmt::format("{}: not rollout data written by debug.save_debug_rollout_data", path));
  }
  rollout::RolloutResult result;
  result.rollout_id = rollout_id;
  try {
    size_t gi = 0;
    for (const Json& group : doc.at("samples")) {
      data::SampleGroup g;
      for (const Json& s : group) {
        StatusOr<data::Sample> sample = rollout::SampleFromJson(s);
        if (!sample.ok()) {
          return absl::InvalidArgumentError(fmt::format("{}: group {}: {}", path, gi,
                                                        std::string(sample.status().message())));
        }
        g.push_back(*std::move(sample));
      }
      result.groups.push_back(std::move(g));
      ++gi;
    }
    result.raw_rewards = doc.at("raw_rewards").get<std::vector<double>>();
    result.rewards = doc.at("rewards").get<std::vector<double>>();
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(fmt::format("{}: {}", path, e.what()));
  }
  return result;
}

StatusOr<rollout::RolloutResult> SubsampleRollout(rollout::RolloutResult result, double fraction) {
  if (!(fraction > 0.0 && fraction <= 1.0)) {
    return absl::InvalidArgumentError(fmt::format(
        "debug.load_debug_rollout_data_subsample = {} must be in (0, 1]", fraction));
  }
  size_t num_samples = 0;
  for (const data::SampleGroup& g : result.groups) num_samples += g.size();
  const bool with_raw = !result.raw_rewards.empty(), with_rewards = !result.rewards.empty();
  if ((with_raw && result.raw_rewards.size() != num_samples) ||
      (with_rewards && result.rewards.size() != num_samples)) {
    return absl::InvalidArgumentError(fmt::format(
        "rollout {}: {} samples but {} raw_rewards and {} rewards", result.rollout_id,
        num_samples, result.raw_rewards.size(), result.rewards.size()));
  }
  const size_t num_groups = result.groups.size();
  const size_t keep = std::max<size_t>(
      1, static_cast<size_t>(std::floor(static_cast<double>(num_groups) * fraction)));
  if (num_groups == 0 || keep >= num_groups) return result;
  const size_t head = keep / 2, tail_start = num_groups - (keep - head);
  rollout::RolloutResult out;
  out.rollout_id = result.rollout_id;
  out.metrics = std::move(result.metrics);
  size_t offset = 0;  // the group's first sample in the flattened reward lists
  for (size_t g = 0; g < num_groups; ++g) {
    const size_t n = result.groups[g].size();
    if (g < head || g >= tail_start) {
      for (size_t k = 0; k < n; ++k) {
        if (with_raw) out.raw_rewards.push_back(result.raw_rewards[offset + k]);
        if (with_rewards) out.rewards.push_back(result.rewards[offset + k]);
      }
      out.groups.push_back(std::move(result.groups[g]));
    }
    offset += n;
  }
  return out;
}

}  // namespace slime::job
