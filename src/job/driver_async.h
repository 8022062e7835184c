// The asynchronous loops (internal to the job module). First, the one-step-off-policy loop of
// `slime_train --async`: slime's
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
//
// Second, the fully asynchronous loop of `slime_train --fully-async` (RunFullyAsyncLoop): a
// producer thread generates rollout after rollout while the loop's thread trains, and the
// weight updates land on the engines in the middle of a generation:
//
//   producer, for j in [start, num_rollout):
//     serve any eval asked for (between generations, at the engines' current weights)
//     wait until j − version ≤ max_staleness   (version: the weights on the engines, = the
//                                                rollout they were trained through + 1)
//     generate rollout j; capture the rollout-side state (checkpoint j keeps it); queue both
//   trainer, for k in [start, num_rollout):
//     take rollout k from the queue (perf/rollout_wait_time: the trainer idled)
//     drop from the loss every sample whose oldest token is over the bound (a sample continued
//       from an earlier rollout by rollout.partial_rollout can be); process, train, save k
//     if weight_sync.interval is due: wait for an eval in flight (an eval sees one version),
//       sync with EngineRequests::kKeep (running requests keep their tokens, continue on the new
//       weights; their later tokens carry the new version), version = k+1, wake the producer
//     if eval is due: ask the producer for it; report k
//
// Staleness bound: a sample of rollout j is trained at policy version j; its oldest token was
// generated at a version ≥ the engines' version when j started ≥ j − max_staleness. With
// max_staleness 0 the loop is synchronous (rollout k+1 starts after the sync of k); with 1 it
// overlaps like --async but without waiting for the generation to finish before a sync.
//
// Metrics added to each rollout's record beside --async's:
//   rollout/weight_staleness/min     the least lag of a sample's oldest token (max, mean above)
//   async/stale_samples_dropped      samples over the bound, kept out of the loss
//   async/queue_depth                finished rollouts waiting when the trainer took this one
//   async/admitted_version           the engines' weight version when this rollout started
//   async/producer_wait_time         seconds the producer waited on the bound before it
//   perf/eval_wait_time              seconds the sync waited for an eval in flight
//
// Stop: a failed step or a stop cancels the generation in flight and joins the producer; the
// queued rollouts are discarded (a resume regenerates them from checkpoint k's state).
#ifndef SLIME_JOB_DRIVER_ASYNC_H_
#define SLIME_JOB_DRIVER_ASYNC_H_

#include <cstdint>
#include <map>
#include <optional>

#include "driver_report.h"
#include "nlohmann/json.hpp"
#include "slime/common/status.h"
#include "slime/data/prompt_dataset.h"
#include "slime/rollout/coordinator.h"

namespace slime::job {

// What a weight update does with the requests the engines are running: the trainers'
// sync_weights "keep_requests" (comm::InFlight on their side). kAbort: as between rollouts;
// kKeep: they keep their tokens and continue on the new weights (the fully async loop).
enum class EngineRequests { kAbort, kKeep };

// The rollout side of a checkpoint, captured between two generations.
struct RolloutSideState {
  std::optional<data::DataSourceState> data_source;  // none when training on saved rollouts
  nlohmann::json coordinator;                        // RolloutCoordinator::State()
  std::optional<nlohmann::json> trajectory_buffer;   // TrajectoryBuffer::State(), when used
};

// The driver's steps. Threads (RunAsyncLoop): GenerateRollout runs on the loop's prefetch
// thread, at most one at a time, and never while CaptureState, UpdateWeights or Evaluate run;
// CancelGeneration may be called from any thread; the rest run on the thread that called the
// loop. RunFullyAsyncLoop: GenerateRollout, CaptureState and Evaluate run on the producer
// thread, one at a time; UpdateWeights (EngineRequests::kKeep) may run during a generation, never
// during an eval; the rest run on the loop's thread.
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
  // Weight version rollout_id + 1; `requests`: what the engines' running requests do meanwhile.
  virtual Status UpdateWeights(int64_t rollout_id, EngineRequests requests,
                               MetricValues* values) = 0;
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

// rollout.max_staleness when the config leaves it unset.
constexpr int64_t kDefaultMaxStaleness = 1;

// Runs rollouts [start_rollout_id, num_rollout) on the fully asynchronous schedule above, no
// sample trained more than `max_staleness` weight versions behind. Errors: as RunAsyncLoop's;
// a failed eval is reported at the next sync or at the end.
Status RunFullyAsyncLoop(int64_t start_rollout_id, int64_t num_rollout, int64_t max_staleness,
                         RolloutSteps* steps);

// How far behind the policy that trains them a rollout's samples were generated:
// rollout_id − the weight version of each sample's oldest generated span, over the samples
// whose versions are integers and that train (not remove_sample).
// tokens_by_lag: the generated tokens of those samples by rollout_id − the version of the span
// that made them (tokens by version), over the samples that know their span sizes
// (Sample::weight_version_tokens).
struct Staleness {
  double min = 0;
  double max = 0;
  double mean = 0;
  std::map<int64_t, int64_t> tokens_by_lag;
};
// nullopt when no sample has an integer version.
std::optional<Staleness> WeightStaleness(const rollout::RolloutResult& result);
// rollout/weight_staleness/{min,max,mean} and rollout/tokens_by_staleness/<lag> into `values`.
void AddStalenessMetrics(const Staleness& staleness, MetricValues* values);

// Marks remove_sample on every sample whose oldest integer version lags result->rollout_id by
// more than `max_staleness` (its loss mask becomes zero); returns how many it marked.
int64_t DropStaleSamples(int64_t max_staleness, rollout::RolloutResult* result);

}  // namespace slime::job

#endif  // SLIME_JOB_DRIVER_ASYNC_H_
