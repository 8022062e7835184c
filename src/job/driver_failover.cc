// Trainer failover (fault_tolerance.max_trainer_restarts; driver_internal.h): a trainer process
// lost mid-job restarts the whole trainer group from the job's newest checkpoint, and the loop
// runs the rollouts after that checkpoint again.
//
// Why the whole group: the lost rank's peers are blocked in (or will enter) collectives with
// it, and the optimizer state of every rank has moved past the checkpoint. So every trainer
// process is replaced (the survivors killed through the head, which restarts each as it
// restarts the lost one), the groups are formed again, every rank loads the checkpoint, the
// engines' weight-update group is destroyed and formed with the new rank 0, which pushes the
// checkpoint's weights, and the data source and coordinator go back to their state at that
// checkpoint, so the replayed rollouts take the prompts they had. A rollout trained before the
// loss but after the checkpoint is trained again from the checkpoint's weights: the job ends
// with each rollout trained once into the final weights.
#include <cmath>
#include <filesystem>
#include <iostream>
#include <thread>

#include "driver_internal.h"
#include "fmt/format.h"
#include "slime/http/client.h"
#include "spdlog/spdlog.h"

namespace slime::job {
namespace {

// The trainer's checkpoint tracker (train/checkpoint.h): a save directory holding one has a
// complete checkpoint.
constexpr char kTrackerFile[] = "latest_checkpointed_iteration.txt";

// How long a failed trainer call waits for the head to see a lost trainer (its agent reports
// the exit; the peers' collectives may fail first).
constexpr auto kLossGrace = std::chrono::seconds(10);
constexpr auto kPoll = std::chrono::milliseconds(100);

}  // namespace

bool Driver::TrainerFailover() const {
  return config_.fault_tolerance.max_trainer_restarts > 0;
}

void Driver::RecordTrainerIncarnations() {
  trainer_incarnations_.assign(trainer_ids_.size(), -1);
  for (size_t i = 0; i < trainer_ids_.size(); ++i) {
    StatusOr<runtime::ActorEndpoint> e = head_->Resolve(trainer_ids_[i]);
    if (e.ok()) trainer_incarnations_[i] = e->incarnation;
  }
}

std::optional<std::string> Driver::LostTrainer() {
  for (size_t i = 0; i < trainer_ids_.size(); ++i) {
    StatusOr<runtime::ActorEndpoint> e = head_->Resolve(trainer_ids_[i]);
    if (e.ok() && e->incarnation == trainer_incarnations_[i]) continue;
    std::string what = trainer_ids_[i];
    const slime::v1::StatusReply status = head_->Snapshot();
    for (const auto& a : status.actors()) {
      if (a.actor_id() != trainer_ids_[i]) continue;
      what = fmt::format("{} on node {} ({}{})", a.actor_id(), a.node_name(), a.state(),
                         a.last_exit().empty() ? "" : "; " + a.last_exit());
    }
    return what;
  }
  return std::nullopt;
}

StatusOr<std::vector<std::string>> Driver::CallTrainers(const std::string& method,
                                                        const std::string& payload) {
  runtime::CallOptions co;
  co.timeout = LongCall();
  const bool failover = TrainerFailover();
  // With failover, a call never waits for a trainer's next process (it would not be
  // initialized), is not sent while a trainer is lost, and stops waiting once one is.
  co.retry_unavailable = !failover;
  auto lost_error = [&]() -> Status {
    std::optional<std::string> lost = failover ? LostTrainer() : std::nullopt;
    if (!lost) return absl::OkStatus();
    return absl::AbortedError(fmt::format("{} on the trainers: trainer {} was lost", method, *lost));
  };
  SLIME_RETURN_IF_ERROR(lost_error());
  std::vector<runtime::CallFuture> futures =
      head_->Group(trainer_ids_).CallAllAsync(method, payload, co);
  if (failover) {
    for (runtime::CallFuture& f : futures) {
      while (f.wait_for(kPoll) != std::future_status::ready) SLIME_RETURN_IF_ERROR(lost_error());
    }
  }
  return runtime::WaitAll(futures);
}

Status Driver::RecoverTrainers(const Status& cause, int64_t failed_rollout) {
  if (!TrainerFailover() || signals_->last_signal() != 0) return cause;
  Status last = cause;
  while (true) {
    std::optional<std::string> lost = LostTrainer();
    for (auto end = Clock::now() + kLossGrace; !lost && Clock::now() < end;) {
      std::this_thread::sleep_for(kPoll);
      lost = LostTrainer();
    }
    if (!lost) return last;  // not a trainer loss
    // The head failed the job (e.g. the trainer's node was lost): no restart can help.
    if (head_->job_failed()) return last;
    const int limit = config_.fault_tolerance.max_trainer_restarts;
    if (trainer_group_restarts_ >= limit) {
      return absl::AbortedError(fmt::format(
          "trainer {} was lost and the trainer group was restarted {} time(s) already, the "
          "limit (fault_tolerance.max_trainer_restarts = {}): {}",
          *lost, trainer_group_restarts_, limit, std::string(last.message())));
    }
    ++trainer_group_restarts_;
    last = RestartTrainerGroup(*lost, failed_rollout);
    if (last.ok() || head_->job_failed()) return last;
    spdlog::error("trainer group restart {} failed: {}", trainer_group_restarts_,
                  std::string(last.message()));
  }
}

Status Driver::RestartTrainerGroup(const std::string& lost, int64_t failed_rollout) {
  const auto start = Clock::now();
  const int limit = config_.fault_tolerance.max_trainer_restarts;
  if (report_) report_->EndProgress();
  std::cout << fmt::format(
                   "trainer {} lost during rollout {}: restarting the trainer group from the "
                   "newest checkpoint (restart {}/{})",
                   lost, failed_rollout, trainer_group_restarts_, limit)
            << std::endl;
  spdlog::warn("trainer {} lost during rollout {}; trainer group restart {}/{}", lost,
               failed_rollout, trainer_group_restarts_, limit);
  save_in_flight_ = false;  // a background write of the lost group is not waited for

  // 1. Every trainer gets a new process: the survivors are killed (they may be blocked in a
  //    collective with the lost rank); the head restarts each after fault_tolerance.restart_backoff.
  for (size_t i = 0; i < trainer_ids_.size(); ++i) {
    StatusOr<runtime::ActorEndpoint> e = head_->Resolve(trainer_ids_[i]);
    if (!e.ok() || e->incarnation != trainer_incarnations_[i]) continue;
    Status killed = head_->KillActor(trainer_ids_[i], e->incarnation,
                                     fmt::format("trainer group restart after {} was lost", lost));
    if (!killed.ok() && killed.code() != absl::StatusCode::kFailedPrecondition) return killed;
  }
  const double backoff = config_.fault_tolerance.restart_backoff *
                         std::pow(2.0, std::min(trainer_group_restarts_, 16));
  SLIME_RETURN_IF_ERROR(head_->WaitForActors(
      trainer_ids_, std::chrono::milliseconds(static_cast<int64_t>(
                        (options_.start_timeout_s + backoff) * 1000))));
  RecordTrainerIncarnations();  // from here on, a loss is one of these processes

  // 2. Groups, then every rank loads the newest checkpoint of this job (or what the job
  //    started from).
  std::string load;
  const std::optional<std::string>& save = config_.checkpoint.save;
  if (checkpoint_saved_ && save && std::filesystem::exists(*save + "/" + kTrackerFile)) {
    load = *save;
  } else if (config_.checkpoint.load) {
    load = *config_.checkpoint.load;
  }
  SLIME_ASSIGN_OR_RETURN(Json init, InitTrainerRanks(load));
  if (init.value("loaded", false)) {
    SLIME_RETURN_IF_ERROR(Resume(init, load));
  } else {
    SLIME_RETURN_IF_ERROR(RestoreRolloutSide(initial_rollout_side_));
    start_rollout_id_ = initial_start_rollout_id_;
  }

  // 3. The engines: the old weight-update group names a dead rank 0; the new one pushes the
  //    checkpoint's weights as version start_rollout_id_.
  if (has_engines_ && !config_.debug.rollout_only) {
    const bool released = engines_released_;
    if (released) SLIME_RETURN_IF_ERROR(EngineMemory(/*release=*/false, {"weights"}));
    DropEngineWeightGroups();
    SLIME_RETURN_IF_ERROR(engines_->ConnectTrainer());
    SLIME_RETURN_IF_ERROR(SyncWeights(std::to_string(start_rollout_id_)).status());
    if (released) SLIME_RETURN_IF_ERROR(EngineMemory(/*release=*/false, {"kv_cache", "cuda_graph"}));
  }
  if (offload_trainers_) SLIME_RETURN_IF_ERROR(TrainerMemory(/*release=*/true, "", nullptr));

  // 4. The time lost: from the end of the checkpoint's rollout (the work after it is redone)
  //    to now.
  const auto durable = rollout_ends_.find(start_rollout_id_ - 1);
  const Clock::time_point since =
      durable != rollout_ends_.end() ? std::min(durable->second, start) : loop_start_;
  const double lost_s = std::chrono::duration<double>(Clock::now() - since).count();
  trainer_lost_seconds_ += lost_s;
  std::cout << fmt::format(
                   "trainer group restarted in {:.1f} s from {}; rollouts {}..{} run again ({:.1f} s "
                   "lost in all)",
                   Since(start), load.empty() ? "the initial weights" : init.value("dir", load),
                   start_rollout_id_, failed_rollout, trainer_lost_seconds_)
            << std::endl;
  return report_->Record(failed_rollout, std::nullopt,
                         {{"fault/trainer_restarts", static_cast<double>(trainer_group_restarts_)},
                          {"fault/trainer_lost_time", trainer_lost_seconds_},
                          {"fault/trainer_restart_time", Since(start)},
                          {"fault/rolled_back_to", static_cast<double>(start_rollout_id_)}});
}

Status Driver::RestoreRolloutSide(const RolloutSideState& state) {
  if (source_ && state.data_source) SLIME_RETURN_IF_ERROR(source_->Restore(*state.data_source));
  return coordinator_.RestoreState(state.coordinator);
}

void Driver::DropEngineWeightGroups() {
  const std::string body = Json{{"group_name", kWeightUpdateGroup}}.dump();
  for (const std::string& address : engines_->Addresses()) {
    StatusOr<http::Response> r =
        PostToEngine(address, "/destroy_weights_update_group", body, std::chrono::seconds(60));
    // Not there (disk or CUDA IPC transport, or never formed): nothing to drop.
    spdlog::info("engine {}: the old weight-update group {}", address,
                 r.ok() && r->status == 200 ? "destroyed"
                                            : "was not there (" + (r.ok() ? r->body : std::string(r.status().message())) + ")");
  }
}

}  // namespace slime::job
