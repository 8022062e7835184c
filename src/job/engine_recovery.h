// The job's engines as the driver tracks them (internal to the job module): their actor ids and
// current HTTP addresses, trainer rank 0's weight-update group over them, and the recovery of
// an engine that was lost mid-rollout (rollout::EngineRecovery, called by the coordinator).
//
// Recover(engine) — the engine's /generate calls could not reach it (or, before a rollout, the
// head reports a new process for it):
//   1. wait for the runtime head to restart the engine's worker process (the head restarts
//      engine actors with fault_tolerance.restart_backoff, doubling, at most
//      max_engine_restarts times). The head giving up (actor dead: the job failed) ends the
//      wait at once with the head's message, which names the engine; the old process answering
//      /health again (a transient error) ends it with the old address and nothing restarted;
//      the same process staying unreachable for fault_tolerance.health_check_timeout seconds,
//      or no new process within the head's whole restart schedule, is an error naming it.
//   2. ask the new process for its HTTP address (the engine actor's `address`);
//   3. have trainer rank 0 push its weights to that engine alone (`resync_engine`, called on
//      every rank of DP rank 0 — every TP rank of every pipeline stage — which take part in
//      gathering the shards and sending the stages' parameters to rank 0: the disk
//      transport — an HF directory the engine loads with /update_weights_from_disk — whatever
//      weight_sync.transport is; see docs/operations.md, "Engine failures", for why), stamped
//      with the version the trainer's weights are (the engines' current version unless the
//      trainer has trained since the last sync);
//   4. remember the new address; the trainer's weight-update group still holds the dead
//      engine, so the next ReconnectIfChanged (the driver calls it before every weight sync)
//      re-forms it with the current addresses.
// Logged as warnings naming the engine, the restart n/max and the seconds lost; counted in
// slime_engine_restarts_total{engine} (Prometheus) beside the rollout metrics.
//
// External engines (cluster.rollout_external_engine_addrs) have no actor: a lost one is waited
// for (health_check_timeout), not restarted; see RecoverExternal.
//
// Threads: Recover may run for several engines at once, on the coordinator's helper threads,
// while the driver thread reads Addresses(); every method is thread-safe.
#ifndef SLIME_SRC_JOB_ENGINE_RECOVERY_H_
#define SLIME_SRC_JOB_ENGINE_RECOVERY_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <functional>
#include <vector>

#include "engine_health.h"
#include "slime/common/status.h"
#include "slime/metrics/registry.h"
#include "slime/rollout/coordinator.h"
#include "slime/runtime/head.h"

namespace slime::job {

// The name of trainer rank 0's weight-update group with the engines (SGLang's group_name). A
// trainer-group restart destroys it on every engine before the new rank 0 forms it again.
inline constexpr char kWeightUpdateGroup[] = "weight_update_group";

struct EngineRecoveryOptions {
  runtime::Head* head = nullptr;               // borrowed
  std::vector<std::string> engine_ids;         // engine-0 ..., in the coordinator's order; ""
                                               // for an external engine (no actor of ours)
  std::vector<std::string> addresses;          // host:port of each, as resolved at start
  // The trainers of DP rank 0 (the TP ranks of every pipeline stage, workers.h); [0] is rank 0,
  // the weight source (it holds the weight-update group). Concurrent resyncs are safe at TP > 1
  // or PP > 1: every resync runs the same collectives (every parameter's gather and send to
  // stage 0), so two in different orders on two ranks still match.
  std::vector<std::string> trainer_ids;
  int num_gpus_per_engine = 1;
  int max_restarts = 3;                        // fault_tolerance.max_engine_restarts
  double restart_backoff_s = 5.0;              // fault_tolerance.restart_backoff
  double start_timeout_s = 60.0;               // the head's start timeout per attempt
  double health_check_timeout_s = 30.0;        // fault_tolerance.health_check_timeout
  metrics::Registry* metrics = nullptr;        // borrowed; may be null
  // Called (no lock held) after a restarted engine got its new address; may be empty.
  std::function<void()> on_address_change;
};

class EngineRecoveryImpl : public rollout::EngineRecovery {
 public:
  // Records each engine's current incarnation (the head must know every engine).
  static StatusOr<std::unique_ptr<EngineRecoveryImpl>> Create(EngineRecoveryOptions options);

  // trainer rank 0 `connect_engines` with the current addresses (its weight-update group).
  Status ConnectTrainer();
  // ConnectTrainer when an engine was recovered since the last one.
  Status ReconnectIfChanged();
  std::vector<std::string> Addresses() const;
  // The engines for the health checks (engine_health.h): each engine of ours whose alive process
  // is the one tracked here (one the head is restarting, or restarted but not yet recovered, is
  // left out: its address is stale), named by its actor id with that incarnation; external
  // engines by their address.
  std::vector<EngineHealthTarget> HealthTargets() const;

  std::vector<int> ReplacedEngines() override;
  StatusOr<rollout::RecoveredEngine> Recover(int engine, const Status& cause) override;

 private:
  explicit EngineRecoveryImpl(EngineRecoveryOptions options);
  // An external engine (cluster.rollout_external_engine_addrs): nothing to restart; wait up to
  // health_check_timeout for it to answer /health again, then try to give it the trainer's
  // weights (disk transport) and re-form the weight-update group at the next sync.
  StatusOr<rollout::RecoveredEngine> RecoverExternal(int engine, const Status& cause);
  // The restart count the head reports for `actor_id` (-1 when unknown).
  int HeadRestarts(const std::string& actor_id) const;

  const EngineRecoveryOptions options_;
  mutable std::mutex mu_;
  std::vector<std::string> addresses_;   // guarded by mu_
  std::vector<int64_t> incarnations_;    // guarded by mu_: of the process at addresses_[i]
  bool changed_ = false;                 // guarded by mu_: the trainer's group is stale
  std::vector<metrics::Counter*> restart_counters_;
};

}  // namespace slime::job

#endif  // SLIME_SRC_JOB_ENGINE_RECOVERY_H_
