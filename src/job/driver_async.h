// The one-step-off-policy loop of `slime_train --async` (internal to the job module): slime's
// train_async.py (docs/algorithms.md, "One step off policy") as a schedule over the driver's
// per-rollout steps. The Driver (driver.cc) implements RolloutSteps; RunAsyncLoop only decides
// what runs when, so the schedule reads in one place:
//
//   prefetch generate(start)
//   for k in [start, num_rollout):
//     wait for rollout k (unless the weight sync of k-1 already waited for it)
//     capture the rollout-side state (data source, partial-rollout buffer) — the state after
//       rollout k was drawn, saved with checkpoint k, so a resume regenerates k+1 itself
//     prefetch generate(k+1) on the engines, with the weights of before training k
//     process rollout k (metrics, debug data), train k, save k
//     if weight_sync.interval is due: wait for generation k+1 (no weight update while the
//       engines generate, as slime), then sync the weights (version k+1)
//     if eval is due: wait for any generation in flight (one coordinator call at a time, as
//       slime's RolloutManager actor), then eval
//     record rollout k
//
// Staleness: rollout k (k > start) is generated with weights version k-1 when
// weight_sync.interval is 1 (version = the rollout the weights were about to train), i.e. one
// policy step behind; with interval n at most n steps behind. Each sample's weight_versions
// shows it; `rollout/weight_staleness/{max,mean}` summarises it per rollout.
//
// Metrics added to each rollout's record (see docs/operations.md):
//   perf/rollout_time                 seconds the generation of this rollout took (background)
//   perf/rollout_wait_time            seconds the loop blocked waiting for this rollout
//   perf/update_weights_wait_time     seconds the sync waited for the next rollout's generation
//   perf/eval_wait_time               seconds the eval waited for a generation in flight
//   perf/rollout_train_overlap_time   seconds this rollout's generation ran while the previous
//                                     rollout trained (the time async saves)
//   timeline/{generate,train}_{start,end}_s   Unix times of this rollout's generation and
//                                     training (compare with the next record's generation)
//
// Stop: when a step fails or the job is stopped, the generation in flight is cancelled
// (RolloutSteps::CancelGeneration) and joined before RunAsyncLoop returns; its rollout is
// discarded (a resume regenerates it from the saved state).
#ifndef SLIME_JOB_DRIVER_ASYNC_H_
#define SLIME_JOB_DRIVER_ASYNC_H_

#include <cstdint>
#include <optional>

#include "driver_report.h"
#include "nlohmann/json.hpp"
#include "slime/common/status.h"
#include "slime/data/prompt_dataset.h"
#include "slime/rollout/coordinator.h"

namespace slime::job {

// The rollout side of a checkpoint, captured between two generations.
struct RolloutSideState {
  std::optional<data::DataSourceState> data_source;  // none when training on saved rollouts
  nlohmann::json coordinator;                        // RolloutCoordinator::State()
};

// The driver's steps. Threads: GenerateRollout runs on the loop's prefetch thread, at most one
// at a time, and never while CaptureState, UpdateWeights or Evaluate run; CancelGeneration may be
// called from any thread; the rest run on the thread that called RunAsyncLoop.
class RolloutSteps {
 public:
  virtual ~RolloutSteps() = default;
  // Generates rollout `rollout_id` (or loads it in debug.load_debug_rollout_data runs).
  virtual StatusOr<rollout::RolloutResult> GenerateRollout(int64_t rollout_id) = 0;
  virtual RolloutSideState CaptureState() = 0;
  // The rollout's own metrics into `values`, debug.save_debug_rollout_data.
  virtual Status ProcessRollout(int64_t rollout_id, const rollout::RolloutResult& result,
                                MetricValues* values) = 0;
  // Each of these does nothing when the config says so (debug.rollout_only, save_interval).
  virtual Status Train(int64_t rollout_id, const rollout::RolloutResult& result,
                       MetricValues* values) = 0;
  virtual Status Save(int64_t rollout_id, const RolloutSideState& state, MetricValues* values) = 0;
  virtual bool SyncDue(int64_t rollout_id) = 0;
  virtual Status UpdateWeights(int64_t rollout_id, MetricValues* values) = 0;  // version id + 1
  virtual bool EvalDue(int64_t rollout_id) = 0;
  virtual Status Evaluate(int64_t rollout_id, MetricValues* values) = 0;
  // The console summary and the metrics record of the rollout.
  virtual Status Report(int64_t rollout_id, const MetricValues& values) = 0;
  virtual void CancelGeneration() = 0;
  virtual bool Stopped() = 0;
};

// Runs rollouts [start_rollout_id, num_rollout) on the schedule above. Errors: the first step
// that fails (a failed generation is reported when the loop waits for it), Cancelled when
// `steps->Stopped()` turns true between rollouts.
Status RunAsyncLoop(int64_t start_rollout_id, int64_t num_rollout, RolloutSteps* steps);

// rollout_id − the weight version of each sample's oldest generated span, for samples whose
// versions are integers: {max, mean}; nullopt when no sample has one.
std::optional<std::pair<double, double>> WeightStaleness(const rollout::RolloutResult& result);

}  // namespace slime::job

#endif  // SLIME_JOB_DRIVER_ASYNC_H_
