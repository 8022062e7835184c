// The Driver (internal to the job module): the root object of `slime_train --config`
// (include/slime/job/driver.h has the job it runs). It wires the components together — the
// runtime head and agent, the worker actors, the rollout coordinator, the engine tracker, the
// report — and its member functions are the job's named steps, one file per responsibility:
//
//   driver.cc             the lifecycle (setup → loop → finish, the exit code, Stop), the
//                         synchronous rollout loop, and one rollout's steps (RolloutSteps,
//                         shared with the --async loop): train, sync, eval, report; the GPUs'
//                         hand-over between colocated engines and trainers
//   driver_setup.cc       setup: data, runtime head and agent, placement and start of the worker
//                         actors, trainer groups and init, the engines' wiring and first push
//   driver_checkpoint.cc  where a rollout comes from (generated, or loaded with
//                         debug.load_debug_rollout_data) and what is saved of it
//                         (debug.save_debug_rollout_data); the rollout side of a checkpoint:
//                         save, capture (--async), resume
//   driver_failover.cc    trainer failover: a lost trainer restarts the trainer group from
//                         the newest checkpoint and the loop replays the rollouts after it
//
// Threads: RunDriver's thread runs every step (the --async loop adds its prefetch thread, see
// driver_async.h); Stop may also run on the signal thread.
#ifndef SLIME_SRC_JOB_DRIVER_INTERNAL_H_
#define SLIME_SRC_JOB_DRIVER_INTERNAL_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "driver_async.h"
#include "driver_report.h"
#include "engine_health.h"
#include "engine_recovery.h"
#include "nlohmann/json.hpp"
#include "slime/common/signal_watcher.h"
#include "slime/common/status.h"
#include "slime/data/prompt_dataset.h"
#include "slime/http/client.h"
#include "slime/http/server.h"
#include "slime/job/driver.h"
#include "slime/metrics/registry.h"
#include "slime/reward/reward.h"
#include "slime/rollout/coordinator.h"
#include "slime/rollout/trajectory_buffer.h"
#include "slime/runtime/agent.h"
#include "slime/runtime/head.h"
#include "slime/tokenizer/tokenizer.h"

namespace slime::job {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

inline double Since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// slime's should_run_periodic_action: every `interval` rollouts (and at the last one when
// `num_rollout` is given).
inline bool Periodic(int64_t rollout_id, std::optional<int> interval,
                     std::optional<int64_t> num_rollout) {
  if (!interval) return false;
  if (num_rollout && rollout_id + 1 == *num_rollout) return true;
  return (rollout_id + 1) % *interval == 0;
}

// `method` on `actor` with a JSON request; its reply parsed (not JSON: Internal).
StatusOr<Json> CallJson(const runtime::ActorHandle& actor, const std::string& method,
                        const Json& request, std::chrono::milliseconds timeout);

class Driver : public RolloutSteps {
 public:
  Driver(DriverOptions options, SignalWatcher* signals)
      : options_(std::move(options)), config_(options_.config), signals_(signals) {}
  ~Driver() override { Stop(); }

  // Setup, then the loop; the process exit code (driver.h).
  int RunToEnd();
  // Stops every actor and the servers. Idempotent; safe from the signal thread.
  void Stop();

 private:
  // The lifecycle (driver.cc).
  Status Loop();
  // One rollout of the synchronous loop: generate → train → save → sync → eval → report.
  Status RunRollout(int64_t rollout_id);
  Status FinishRun(Clock::time_point loop_start);

  // Setup (driver_setup.cc), in this order.
  Status Setup();
  // Workers may run in other directories: every path they read is made absolute.
  Status MakePathsAbsolute();
  Status LoadData();
  // `start`: when LoadData began (the log line's seconds include the tokenizer's).
  Status LoadPrompts(Clock::time_point start);
  // data.num_rollout, by default the dataset's rollouts × data.num_epoch.
  Status ResolveNumRollout();
  Status LoadEvalDatasets();
  Status StartRuntime();
  Status WriteDriverFile();
  // Rewrites <run_dir>/prometheus_targets.json: the driver's /metrics and each engine actor's
  // (current addresses, after a restart too). Thread-safe.
  Status UpdatePrometheusTargets();
  Status StartActors();
  // The placement's worker actors with their init payloads; fills trainer_ids_ (in rank
  // order) and engine_ids_. `gpus`: whether the plan placed them on GPUs.
  StatusOr<std::vector<runtime::ActorOptions>> PlanActors(
      const std::vector<runtime::NodeResources>& nodes, bool* gpus);
  // has_engines_ and the colocated offload flags; an error when there is nothing to run.
  Status DecideEngines(bool gpus);
  // Every engine's HTTP address (asked of its actor; external ones are waited for).
  Status ResolveEngineAddresses(std::chrono::milliseconds timeout);
  // Every address answers GET /health 200 before `timeout`, else an error naming it.
  Status WaitForExternalEngines(const std::vector<std::string>& addresses,
                                std::chrono::milliseconds timeout);
  // The trainers' tensor- and data-parallel groups (open_groups, then join_groups).
  Status FormTrainerGroups();
  // The first setup: InitTrainerRanks with checkpoint.load, then the driver side resumed from
  // what the ranks loaded.
  Status InitTrainers();
  // The trainers' groups formed, then `init` on every rank (through CallTrainers), loading
  // checkpoint `load` when it is not empty (else what the config names); rank 0's reply.
  // Serves the first setup and a trainer group restart alike.
  StatusOr<Json> InitTrainerRanks(const std::string& load);
  // The engines as tracked from now on (engines_), the coordinator configured over them, and
  // trainer rank 0's weight-update group with the first weight push.
  Status ConnectEngines();
  EngineRecoveryOptions EngineTrackingOptions();
  Status ConfigureCoordinator();
  // fault_tolerance.health_check_*: the engines' health checks (engine_health.h), active while
  // the engines generate (GenerateRollout, Evaluate); an engine of ours that fails one is killed
  // and restarted by the runtime, then recovered by the coordinator.
  void StartHealthChecks();

  // Saved rollouts and the rollout side of a checkpoint (driver_checkpoint.cc).
  // trainer init's reply {"loaded", "rollout_id", "dir"}: start_rollout_id_, and the data source
  // and coordinator as saved with that checkpoint.
  // `dir`: the checkpoint directory the trainers loaded from.
  Status Resume(const Json& init, const std::string& dir);
  // `state`: the rollout side to save (the async loop's capture); null: the current one.
  // `values` (may be null): checkpoint.async_save's perf/save_wait_time and
  // perf/save_background_time.
  Status SaveCheckpoint(int64_t rollout_id, const RolloutSideState* state = nullptr,
                        MetricValues* values = nullptr);
  // checkpoint.async_save: waits up to `timeout` for the trainers' background checkpoint write
  // (none in flight: returns at once); its failure as the error, naming the checkpoint.
  Status WaitForSaves(std::chrono::milliseconds timeout);
  // RolloutSteps (driver_async.h), for both loops.
  StatusOr<rollout::RolloutResult> GenerateRollout(int64_t rollout_id) override;
  Status ProcessRollout(int64_t rollout_id, const rollout::RolloutResult& result,
                        MetricValues* values) override;
  RolloutSideState CaptureState() override;
  Status Save(int64_t rollout_id, const RolloutSideState& state, MetricValues* values) override;

  // Trainer failover (driver_failover.cc), on when fault_tolerance.max_trainer_restarts > 0.
  bool TrainerFailover() const;
  // Every trainer's incarnation as initialized (after setup and after each group restart).
  void RecordTrainerIncarnations();
  // The first trainer whose initialized process is gone (restarting, dead or replaced),
  // described for the log; nullopt when each is still the process that was initialized.
  std::optional<std::string> LostTrainer();
  // `method` on every trainer, the replies in rank order. With failover: Aborted as soon as a
  // trainer is lost (its peers may wait on it in a collective forever), and no call is retried
  // on a trainer's next process.
  StatusOr<std::vector<std::string>> CallTrainers(const std::string& method,
                                                  const std::string& payload);
  // After `cause` failed rollout `failed_rollout`: when a trainer was lost (the head may take
  // up to 10 s to see it) and restarts are left, restarts the trainer group
  // (RestartTrainerGroup, again if a restart itself loses a trainer) and returns OK with
  // start_rollout_id_ the rollout to run next; otherwise an error (`cause`, or the limit's).
  Status RecoverTrainers(const Status& cause, int64_t failed_rollout);
  Status RestartTrainerGroup(const std::string& lost, int64_t failed_rollout);
  Status RestoreRolloutSide(const RolloutSideState& state);
  // POST /destroy_weights_update_group (kWeightUpdateGroup) to every engine; a missing group
  // is logged, not an error.
  void DropEngineWeightGroups();

  // One rollout's other steps (driver.cc); RolloutSteps too, except TrainRollout.
  Status TrainRollout(int64_t rollout_id, const rollout::RolloutResult& result,
                      MetricValues* values);
  Status Train(int64_t rollout_id, const rollout::RolloutResult& result,
               MetricValues* values) override {
    return TrainRollout(rollout_id, result, values);
  }
  bool SyncDue(int64_t rollout_id) override;
  Status UpdateWeights(int64_t rollout_id, EngineRequests requests,
                       MetricValues* values) override;
  bool EvalDue(int64_t rollout_id) override;
  Status Evaluate(int64_t rollout_id, MetricValues* perf) override;
  Status Report(int64_t rollout_id, const MetricValues& values) override;
  void CancelGeneration() override {
    coordinator_.Cancel();
    if (trajectories_) trajectories_->Cancel();
  }
  bool Stopped() override { return signals_->last_signal() != 0; }
  StatusOr<Json> SyncWeights(const std::string& version,
                             EngineRequests requests = EngineRequests::kAbort);
  // Colocated with offload: after a generation, the engines release their GPU memory and the
  // trainers take theirs back.
  Status HandGpuToTrainers(MetricValues* values);
  // The weight sync (when due) between the colocated swaps back: the engines take their
  // weights' memory back first; then the trainer leaves the GPU and the engines take their K/V
  // cache (and CUDA graphs) back (slime's order).
  Status SyncAndHandGpuToEngines(int64_t rollout_id, MetricValues* values);
  // Colocated with offload_rollout: the engines give their GPU memory (weights, K/V cache, CUDA
  // graphs) back while the trainer works, take the weights back for the weight sync and the K/V
  // cache after it. `tags`: SGLang's memory tags ([] = all).
  Status EngineMemory(bool release, const std::vector<std::string>& tags);
  // POST `body` to `path` of the engine at `address` (host:port) with the job's access key.
  StatusOr<http::Response> PostToEngine(const std::string& address, const std::string& path,
                                        const std::string& body,
                                        std::chrono::milliseconds timeout) const;
  // Colocated with offload_train: every trainer moves its weights and optimizer state to host
  // memory while the engines generate.
  Status TrainerMemory(bool release, const char* metric, MetricValues* values);
  std::chrono::milliseconds LongCall() const { return std::chrono::hours(24); }
  // How long a stop (signal, error) waits for a checkpoint being written in the background.
  static constexpr std::chrono::minutes kStopSaveWait{5};

  DriverOptions options_;
  config::Config& config_;
  SignalWatcher* signals_;
  std::mutex stop_mu_;
  bool setup_done_ = false;
  std::atomic<bool> save_in_flight_{false};  // an async_save checkpoint may be being written

  metrics::Registry registry_;
  // rollout.trajectory_buffer: rollouts from POST /trajectories instead of group_source_ (before
  // metrics_server_, whose routes use them, so the server stops first).
  std::unique_ptr<rollout::TrajectoryBuffer> trajectories_;
  std::atomic<int64_t> weight_version_{0};  // the engines' weights (the last sync's version)
  std::unique_ptr<http::Server> metrics_server_;
  std::string metrics_target_;  // host:port of metrics_server_ as Prometheus should scrape it
  std::string metrics_local_;   // host:port of metrics_server_ from this machine
  std::mutex targets_mu_;       // serializes UpdatePrometheusTargets
  std::unique_ptr<DriverReport> report_;
  std::unique_ptr<runtime::Head> head_;
  std::unique_ptr<runtime::Agent> agent_;

  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  std::shared_ptr<data::PromptDataset> dataset_;
  std::optional<data::PromptDataSource> source_;
  std::unique_ptr<rollout::PromptGroupSource> group_source_;
  void AddTrajectoryRoutes(http::Router* router);
  std::vector<rollout::EvalDataset> eval_datasets_;
  std::unique_ptr<reward::RewardModel> reward_;
  std::unique_ptr<EngineRecoveryImpl> engines_;  // outlives coordinator_ (it calls Recover)
  rollout::RolloutCoordinator coordinator_;

  std::vector<std::string> trainer_ids_;
  std::vector<std::string> engine_ids_;
  std::vector<std::string> engine_addresses_;
  int64_t start_rollout_id_ = 0;
  int64_t num_rollout_ = 0;
  bool has_engines_ = false;
  bool train_only_ = false;
  bool offload_engines_ = false;
  bool offload_trainers_ = false;
  std::map<std::string, double> first_eval_, last_eval_;  // eval/<name> of this run
  bool engines_released_ = false;  // colocated offload: the engines gave their memory back
  // Trainer failover.
  std::vector<int64_t> trainer_incarnations_;
  int trainer_group_restarts_ = 0;
  double trainer_lost_seconds_ = 0;
  bool checkpoint_saved_ = false;                // this job completed a save
  RolloutSideState initial_rollout_side_;        // after setup: a restart without a checkpoint
  int64_t initial_start_rollout_id_ = 0;
  Clock::time_point loop_start_;
  std::map<int64_t, Clock::time_point> rollout_ends_;  // when each rollout's steps ended
  // Destroyed first (declared last): its thread calls into engines_ and head_.
  std::unique_ptr<EngineHealthMonitor> health_;
};

}  // namespace slime::job

#endif  // SLIME_SRC_JOB_DRIVER_INTERNAL_H_
