// The rollout side of the driver's checkpoints and its saved rollouts (driver_internal.h):
//   save    <save>/rollout/data_source_state_N.json (the prompt order) and
//           <save>/rollout/coordinator_state_N.json (the partial-rollout buffer), then the
//           trainers' checkpoint, whose tracker is written last — a tracker never names an
//           iteration whose rollout state is missing;
//   resume  the trainers load checkpoint.load; the driver restores the same two files of the
//           loaded rollout (a missing data-source state restarts the prompt order, with a
//           warning) and continues at the loaded rollout + 1;
//   debug   debug.save_debug_rollout_data writes each generated rollout to a JSON file;
//           debug.load_debug_rollout_data reads them back instead of generating (train only),
//           keeping debug.load_debug_rollout_data_subsample of the groups (debug_data.h).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "debug_data.h"
#include "driver_internal.h"
#include "fmt/format.h"
#include "slime/common/atomic_file.h"
#include "spdlog/spdlog.h"

namespace slime::job {

// ---- Saved rollouts (debug): where a rollout comes from and what is kept of it.

StatusOr<rollout::RolloutResult> Driver::GenerateRollout(int64_t rollout_id) {
  if (train_only_) {
    const std::string path = DebugRolloutPath(*config_.debug.load_debug_rollout_data, rollout_id);
    SLIME_ASSIGN_OR_RETURN(rollout::RolloutResult loaded, LoadDebugRollout(path, rollout_id));
    const std::optional<double>& fraction = config_.debug.load_debug_rollout_data_subsample;
    if (!fraction) return loaded;
    const size_t before = loaded.groups.size();
    SLIME_ASSIGN_OR_RETURN(rollout::RolloutResult kept, SubsampleRollout(std::move(loaded), *fraction));
    spdlog::info("rollout {}: {} of the {} prompt groups of {} kept "
                 "(debug.load_debug_rollout_data_subsample {})",
                 rollout_id, kept.groups.size(), before, path, *fraction);
    return kept;
  }
  if (trajectories_) {
    spdlog::info("rollout {}: waiting for {} complete groups on POST /trajectories ({})", rollout_id,
                 config_.data.rollout_batch_size, trajectories_->Stats().dump());
    return trajectories_->Take(rollout_id);
  }
  EngineHealthMonitor::ActiveScope checks(health_.get());
  return coordinator_.Generate(rollout_id);
}

Status Driver::ProcessRollout(int64_t rollout_id, const rollout::RolloutResult& result,
                              MetricValues* values) {
  values->insert(result.metrics.begin(), result.metrics.end());
  if (health_ != nullptr) {  // the engines' health checks so far (engine_health.h)
    (*values)["engine_health/rounds"] = static_cast<double>(health_->rounds());
    (*values)["engine_health/failures"] = static_cast<double>(health_->failures());
  }
  if (config_.debug.save_debug_rollout_data) {
    SLIME_RETURN_IF_ERROR(SaveDebugRollout(
        DebugRolloutPath(*config_.debug.save_debug_rollout_data, rollout_id), result));
  }
  return absl::OkStatus();
}

// ---- Checkpoints.

namespace {

// A rollout-side state file of a checkpoint: nullopt when there is none (older checkpoints lack
// some); DataLoss when it is not JSON.
StatusOr<std::optional<Json>> ReadStateFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::optional<Json>();
  std::stringstream text;
  text << in.rdbuf();
  Json state = Json::parse(text.str(), nullptr, false);
  if (state.is_discarded()) return absl::DataLossError(fmt::format("{}: not JSON", path));
  return std::optional<Json>(std::move(state));
}

}  // namespace

Status Driver::Resume(const Json& init, const std::string& dir) {
  start_rollout_id_ = 0;
  if (!init.value("loaded", false)) return absl::OkStatus();
  const int64_t loaded = init.at("rollout_id").get<int64_t>();
  start_rollout_id_ = loaded + 1;
  if (source_) {
    const std::string path = data::DataSourceStatePath(dir, loaded);
    if (Status s = source_->Load(path); !s.ok()) {
      if (s.code() != absl::StatusCode::kNotFound) return s;
      spdlog::warn("resume: {}; the prompt order starts from the beginning", std::string(s.message()));
    }
  }
  SLIME_ASSIGN_OR_RETURN(
      std::optional<Json> coordinator,
      ReadStateFile(fmt::format("{}/rollout/coordinator_state_{}.json", dir, loaded)));
  if (coordinator) SLIME_RETURN_IF_ERROR(coordinator_.RestoreState(*coordinator));
  if (trajectories_) {
    // The trajectories buffered at checkpoint `loaded` (taken ones are in its rollouts).
    const std::string path = fmt::format("{}/rollout/trajectory_buffer_{}.json", dir, loaded);
    SLIME_ASSIGN_OR_RETURN(std::optional<Json> buffer, ReadStateFile(path));
    if (buffer) {
      if (Status s = trajectories_->RestoreState(*buffer); !s.ok()) {
        return absl::DataLossError(fmt::format("{}: {}", path, std::string(s.message())));
      }
    }
  }
  std::cout << fmt::format("resumed from {} at rollout {}\n", init.value("dir", std::string()),
                           start_rollout_id_);
  return absl::OkStatus();
}

RolloutSideState Driver::CaptureState() {
  RolloutSideState state;
  if (source_) state.data_source = source_->state();
  state.coordinator = coordinator_.State();
  if (trajectories_) state.trajectory_buffer = trajectories_->State();
  return state;
}

Status Driver::Save(int64_t rollout_id, const RolloutSideState& state, MetricValues* values) {
  if (config_.debug.rollout_only || !config_.checkpoint.save ||
      !Periodic(rollout_id, config_.checkpoint.save_interval, num_rollout_)) {
    return absl::OkStatus();
  }
  const auto t = Clock::now();
  SLIME_RETURN_IF_ERROR(SaveCheckpoint(rollout_id, &state, values));
  (*values)["perf/save_time"] = Since(t);
  return absl::OkStatus();
}

Status Driver::WaitForSaves(std::chrono::milliseconds timeout) {
  if (!save_in_flight_.exchange(false)) return absl::OkStatus();
  const auto t = Clock::now();
  runtime::CallOptions co;
  co.timeout = timeout;
  Status s = head_->Group(trainer_ids_).CallAll("wait_save", "{}", co).status();
  if (s.ok()) spdlog::info("checkpoint: the background write finished ({:.1f} s wait)", Since(t));
  return s;
}

Status Driver::SaveCheckpoint(int64_t rollout_id, const RolloutSideState* state,
                              MetricValues* values) {
  const std::string& save = *config_.checkpoint.save;
  // The data source and coordinator state first: the trainer writes the tracker last, so a
  // tracker never names an iteration whose rollout state is missing.
  if (source_) {
    data::PromptDataSource at_rollout = *source_;
    if (state != nullptr && state->data_source) {
      SLIME_RETURN_IF_ERROR(at_rollout.Restore(*state->data_source));
    }
    SLIME_RETURN_IF_ERROR(at_rollout.Save(data::DataSourceStatePath(save, rollout_id)));
  }
  const Json coordinator = state != nullptr ? state->coordinator : coordinator_.State();
  // <save>/rollout/ may not exist yet (train-only runs have no data source to create it).
  std::error_code ec;
  std::filesystem::create_directories(save + "/rollout", ec);
  if (ec) {
    return absl::InternalError(
        fmt::format("checkpoint.save: cannot create {}/rollout: {}", save, ec.message()));
  }
  SLIME_RETURN_IF_ERROR(WriteFileAtomically(
      fmt::format("{}/rollout/coordinator_state_{}.json", save, rollout_id),
      coordinator.dump() + "\n"));
  if (trajectories_) {
    const Json buffer = state != nullptr && state->trajectory_buffer ? *state->trajectory_buffer
                                                                     : trajectories_->State();
    SLIME_RETURN_IF_ERROR(WriteFileAtomically(
        fmt::format("{}/rollout/trajectory_buffer_{}.json", save, rollout_id), buffer.dump() + "\n"));
  }
  Json request = {{"rollout_id", rollout_id},
                  {"extra_state", {{"num_rollout", num_rollout_}}}};
  // checkpoint.async_save: the trainers return once their host copies are taken; each save
  // first waits for the previous background write (its time is perf/save_wait_time, its
  // duration perf/save_background_time), and the end of the job waits for the last one.
  if (config_.checkpoint.async_save) save_in_flight_ = true;
  SLIME_ASSIGN_OR_RETURN(std::vector<std::string> replies, CallTrainers("save", request.dump()));
  checkpoint_saved_ = true;
  if (values != nullptr && config_.checkpoint.async_save) {
    double wait = 0, write = 0;
    for (const std::string& r : replies) {
      Json reply = Json::parse(r, nullptr, false);
      if (!reply.is_object()) continue;
      wait = std::max(wait, reply.value("wait_seconds", 0.0));
      write = std::max(write, reply.value("write_seconds", 0.0));
    }
    (*values)["perf/save_wait_time"] = wait;
    if (write > 0) (*values)["perf/save_background_time"] = write;
  }
  return absl::OkStatus();
}

}  // namespace slime::job
