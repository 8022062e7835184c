// External trajectories into rollouts (trajectory_buffer.h).
#include "slime/rollout/trajectory_buffer.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <utility>
#include <vector>

#include "coordinator_internal.h"
#include "slime/rollout/metrics.h"

namespace slime::rollout {
namespace {

using Json = nlohmann::json;

// One trajectory of a POST body as a sample (group_index and index are set when it is added).
// `where` is "trajectories[i]".
StatusOr<std::pair<std::string, data::Sample>> ParseTrajectory(const Json& t,
                                                               const std::string& where) {
  auto bad = [&](std::string_view field, std::string_view what) {
    return absl::InvalidArgumentError(fmt::format("{}.{} {}", where, field, what));
  };
  if (!t.is_object()) return absl::InvalidArgumentError(where + " is not an object");
  data::Sample s;
  const auto group = t.find("group");
  if (group == t.end() || !group->is_string() || group->get<std::string>().empty()) {
    return bad("group", "is required: a non-empty string naming the prompt group");
  }
  const auto tokens = t.find("tokens");
  if (tokens == t.end() || !tokens->is_array() || tokens->empty()) {
    return bad("tokens", "is required: a non-empty list of token ids (prompt + response)");
  }
  for (const Json& id : *tokens) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
      return bad("tokens", "must hold non-negative integer token ids");
    }
    s.tokens.push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  const auto length = t.find("response_length");
  if (length == t.end() || !length->is_number_integer() || length->get<int64_t>() < 1 ||
      length->get<int64_t>() > static_cast<int64_t>(s.tokens.size())) {
    return bad("response_length",
               fmt::format("is required: an integer from 1 to the {} tokens", s.tokens.size()));
  }
  s.response_length = length->get<int64_t>();
  const auto reward = t.find("reward");
  if (reward == t.end() || !reward->is_number()) return bad("reward", "is required: a number");
  s.reward = reward->get<double>();
  s.raw_reward = *reward;
  const size_t n = static_cast<size_t>(s.response_length);
  if (const auto mask = t.find("loss_mask"); mask != t.end()) {
    if (!mask->is_array() || mask->size() != n) {
      return bad("loss_mask", fmt::format("must be a list of {} entries (response_length)", n));
    }
    for (const Json& m : *mask) {
      if (!m.is_number_integer() || (m.get<int64_t>() != 0 && m.get<int64_t>() != 1)) {
        return bad("loss_mask", "entries must be 0 or 1");
      }
      s.loss_mask.push_back(static_cast<uint8_t>(m.get<int64_t>()));
    }
  } else {
    s.loss_mask.assign(n, 1);
  }
  if (const auto lp = t.find("rollout_log_probs"); lp != t.end()) {
    if (!lp->is_array() || lp->size() != n) {
      return bad("rollout_log_probs",
                 fmt::format("must be a list of {} numbers (response_length)", n));
    }
    for (const Json& v : *lp) {
      if (!v.is_number() || v.get<double>() > 0) {
        return bad("rollout_log_probs", "entries must be log-probabilities (numbers <= 0)");
      }
      s.rollout_log_probs.push_back(v.get<float>());
    }
  }
  if (const auto vs = t.find("weight_versions"); vs != t.end()) {
    if (!vs->is_array()) return bad("weight_versions", "must be a list of strings, oldest first");
    for (const Json& v : *vs) {
      if (!v.is_string()) return bad("weight_versions", "must be a list of strings, oldest first");
      s.weight_versions.push_back(v.get<std::string>());
    }
  } else if (const auto v = t.find("weight_version"); v != t.end()) {
    if (!v->is_string()) return bad("weight_version", "must be a string");
    s.weight_versions.push_back(v->get<std::string>());
    // One version: every model token (loss mask 1) is its.
    s.weight_version_tokens.push_back(std::count(s.loss_mask.begin(), s.loss_mask.end(), 1));
  }
  if (const auto vt = t.find("weight_version_tokens"); vt != t.end()) {
    const std::string shape = fmt::format(
        "must be a list of {} token counts >= 0 (one per weight_versions entry) summing to at "
        "most {} (response_length)",
        s.weight_versions.size(), n);
    if (!t.contains("weight_versions") || !vt->is_array() ||
        vt->size() != s.weight_versions.size()) {
      return bad("weight_version_tokens", shape);
    }
    s.weight_version_tokens.clear();
    int64_t sum = 0;
    for (const Json& c : *vt) {
      if (!c.is_number_integer() || c.get<int64_t>() < 0)
        return bad("weight_version_tokens", shape);
      s.weight_version_tokens.push_back(c.get<int64_t>());
      sum += c.get<int64_t>();
    }
    if (sum > static_cast<int64_t>(n)) return bad("weight_version_tokens", shape);
  }
  s.status = data::SampleStatus::kCompleted;
  if (const auto st = t.find("status"); st != t.end()) {
    if (!st->is_string() || (*st != "completed" && *st != "truncated")) {
      return bad("status", "must be \"completed\" or \"truncated\"");
    }
    if (*st == "truncated") s.status = data::SampleStatus::kTruncated;
  }
  for (const char* field : {"label", "response"}) {
    if (const auto f = t.find(field); f != t.end()) {
      if (!f->is_string()) return bad(field, "must be a string");
      (std::string_view(field) == "label" ? s.label : s.response) = f->get<std::string>();
    }
  }
  if (const auto m = t.find("metadata"); m != t.end()) {
    if (!m->is_object()) return bad("metadata", "must be an object");
    s.metadata = nlohmann::ordered_json::parse(m->dump());
  }
  static const std::set<std::string> kKnown = {
      "group",           "tokens",         "response_length",
      "reward",          "loss_mask",      "rollout_log_probs",
      "weight_versions", "weight_version", "weight_version_tokens",
      "status",          "label",          "response",
      "metadata"};
  for (const auto& [key, value] : t.items()) {
    if (!kKnown.count(key)) return bad(key, "is not a trajectory field");
  }
  return std::make_pair(group->get<std::string>(), std::move(s));
}

}  // namespace

StatusOr<std::unique_ptr<TrajectoryBuffer>> TrajectoryBuffer::Create(Options options) {
  if (options.n_samples_per_prompt < 1 || options.rollout_batch_size < 1) {
    return absl::InvalidArgumentError(fmt::format(
        "trajectory buffer: n_samples_per_prompt {} and rollout_batch_size {} must be >= 1",
        options.n_samples_per_prompt, options.rollout_batch_size));
  }
  return std::unique_ptr<TrajectoryBuffer>(new TrajectoryBuffer(std::move(options)));
}

StatusOr<int64_t> TrajectoryBuffer::Add(std::string_view body) {
  const Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("the body is not JSON");
  if (!j.is_object() || !j.contains("trajectories") || !j["trajectories"].is_array()) {
    return absl::InvalidArgumentError("the body must be {\"trajectories\": [...]}");
  }
  const Json& list = j["trajectories"];
  std::vector<std::pair<std::string, data::Sample>> parsed;
  for (size_t i = 0; i < list.size(); ++i) {
    SLIME_ASSIGN_OR_RETURN(auto t, ParseTrajectory(list[i], fmt::format("trajectories[{}]", i)));
    parsed.push_back(std::move(t));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (cancelled_) return absl::CancelledError("the job is stopping");
  if (!open_for_adds_) {
    return absl::UnavailableError("the job is starting (restoring its buffer); retry shortly");
  }
  // Group sizes after this body, checked before anything changes.
  std::map<std::string, int64_t> sizes;
  for (size_t i = 0; i < parsed.size(); ++i) {
    const std::string& id = parsed[i].first;
    if (!sizes.count(id)) {
      const auto open = open_.find(id);
      sizes[id] = open == open_.end() ? 0 : static_cast<int64_t>(open->second.samples.size());
    }
    if (++sizes[id] > options_.n_samples_per_prompt) {
      return absl::InvalidArgumentError(fmt::format(
          "trajectories[{}].group '{}' would have more than n_samples_per_prompt = {} "
          "trajectories (a group completes at that many and then takes no more)",
          i, id, options_.n_samples_per_prompt));
    }
  }
  for (auto& [id, sample] : parsed) {
    auto [it, inserted] = open_.try_emplace(id);
    if (inserted) it->second.group_index = next_group_index_++;
    sample.group_index = it->second.group_index;
    sample.index = next_sample_index_++;
    it->second.samples.push_back(std::move(sample));
    if (static_cast<int64_t>(it->second.samples.size()) == options_.n_samples_per_prompt) {
      complete_.emplace_back(id, std::move(it->second));
      open_.erase(it);
    }
  }
  added_ += static_cast<int64_t>(parsed.size());
  cv_.notify_all();
  return static_cast<int64_t>(parsed.size());
}

StatusOr<RolloutResult> TrajectoryBuffer::Take(int64_t rollout_id) {
  std::vector<data::SampleGroup> groups;
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] {
      return cancelled_ ||
             static_cast<int64_t>(complete_.size()) >= options_.rollout_batch_size;
    });
    if (cancelled_) return absl::CancelledError("the job is stopping");
    for (int64_t g = 0; g < options_.rollout_batch_size; ++g) {
      groups.push_back(std::move(complete_.front().second.samples));
      complete_.pop_front();
      taken_ += static_cast<int64_t>(groups.back().size());
    }
  }
  SLIME_ASSIGN_OR_RETURN(RolloutResult result,
                         internal::ResultOfGroups(rollout_id, std::move(groups),
                                                  options_.reward_postprocess));
  result.metrics = RolloutSampleMetrics(result.groups, result.rewards, /*zero_std=*/true,
                                        /*log_passrate=*/false);
  const Json stats = Stats();
  result.metrics["rollout/trajectory_buffer/complete_groups"] =
      stats["complete_groups"].get<double>();
  result.metrics["rollout/trajectory_buffer/open_groups"] = stats["open_groups"].get<double>();
  return result;
}

void TrajectoryBuffer::Open() {
  std::lock_guard<std::mutex> lock(mu_);
  open_for_adds_ = true;
}

void TrajectoryBuffer::Cancel() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
  }
  cv_.notify_all();
}

Json TrajectoryBuffer::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t buffered = 0;
  for (const auto& [id, g] : open_) buffered += static_cast<int64_t>(g.samples.size());
  for (const auto& [id, g] : complete_) buffered += static_cast<int64_t>(g.samples.size());
  return {{"trajectories", buffered},
          {"complete_groups", static_cast<int64_t>(complete_.size())},
          {"open_groups", static_cast<int64_t>(open_.size())},
          {"added", added_},
          {"taken", taken_},
          {"groups_per_rollout", options_.rollout_batch_size},
          {"samples_per_group", options_.n_samples_per_prompt}};
}

Json TrajectoryBuffer::State() const {
  std::lock_guard<std::mutex> lock(mu_);
  auto groups = [](const auto& list) {
    Json out = Json::array();
    for (const auto& [id, g] : list) {
      Json samples = Json::array();
      for (const data::Sample& s : g.samples) samples.push_back(SampleToJson(s));
      out.push_back({{"group", id}, {"group_index", g.group_index}, {"samples", samples}});
    }
    return out;
  };
  return {{"version", 1},
          {"complete", groups(complete_)},
          {"open", groups(open_)},
          {"next_group_index", next_group_index_},
          {"next_sample_index", next_sample_index_}};
}

Status TrajectoryBuffer::RestoreState(const Json& state) {
  if (!state.is_object() || state.value("version", 0) != 1 || !state.contains("complete") ||
      !state["complete"].is_array() || !state.contains("open") || !state["open"].is_array() ||
      !state.contains("next_group_index") || !state["next_group_index"].is_number_integer() ||
      !state.contains("next_sample_index") || !state["next_sample_index"].is_number_integer()) {
    return absl::InvalidArgumentError(
        "trajectory buffer state must be {\"version\": 1, \"complete\": [...], \"open\": [...], "
        "\"next_group_index\": int, \"next_sample_index\": int}");
  }
  auto read = [](const Json& list, const char* name,
                 auto&& put) -> Status {
    for (size_t g = 0; g < list.size(); ++g) {
      const Json& e = list[g];
      if (!e.is_object() || !e.contains("group") || !e["group"].is_string() ||
          !e.contains("group_index") || !e["group_index"].is_number_integer() ||
          !e.contains("samples") || !e["samples"].is_array()) {
        return absl::InvalidArgumentError(fmt::format(
            "trajectory buffer state: {}[{}] must be {{\"group\", \"group_index\", \"samples\"}}",
            name, g));
      }
      Group group;
      group.group_index = e["group_index"].get<int64_t>();
      for (size_t i = 0; i < e["samples"].size(); ++i) {
        StatusOr<data::Sample> s = SampleFromJson(e["samples"][i]);
        if (!s.ok()) {
          return absl::InvalidArgumentError(fmt::format("trajectory buffer state: {}[{}][{}]: {}",
                                                        name, g, i, std::string(s.status().message())));
        }
        group.samples.push_back(std::move(*s));
      }
      put(e["group"].get<std::string>(), std::move(group));
    }
    return absl::OkStatus();
  };
  std::deque<std::pair<std::string, Group>> complete;
  std::map<std::string, Group> open;
  SLIME_RETURN_IF_ERROR(read(state["complete"], "complete", [&](std::string id, Group g) {
    complete.emplace_back(std::move(id), std::move(g));
  }));
  SLIME_RETURN_IF_ERROR(read(state["open"], "open", [&](std::string id, Group g) {
    open.emplace(std::move(id), std::move(g));
  }));
  std::lock_guard<std::mutex> lock(mu_);
  complete_ = std::move(complete);
  open_ = std::move(open);
  next_group_index_ = state["next_group_index"].get<int64_t>();
  next_sample_index_ = state["next_sample_index"].get<int64_t>();
  cv_.notify_all();
  return absl::OkStatus();
}

}  // namespace slime::rollout
