// RolloutCoordinator: the generation core of slime's default rollout
// (slime/rollout/sglang_rollout.py; docs/algorithms.md, "The default rollout") as a
// library class. The runtime wraps it as the rollout actor; this class knows nothing of gRPC.
//
// One Generate(rollout_id):
//   1. pull prompt groups in waves of over_sampling_batch_size — first the groups recycled by
//      the previous rollout (partial rollout), then the GroupSource — until the groups kept plus
//      the groups in flight reach rollout_batch_size;
//   2. each group goes to one engine (EnginePool::PickEngine: least outstanding, whole group,
//      so the n samples share a prefix); each sample is one token-in/token-out POST /generate
//      (input_ids = prompt + any partial response, return_logprob, max_new_tokens = what is left
//      of max_response_len and of max_context_len; nothing left → truncated without a call);
//      output ids, log-probs, finish reason → status, and weight_version are recorded
//      (metadata.engine = the serving engine's host:port);
//   3. with an OPD teacher (RolloutOptions::teacher) each generated sample is scored by it as
//      soon as its /generate returns; when a group is generated, its rewards come from the
//      reward module in one ScoreGroup call (aborted samples get none), then the
//      dynamic-sampling filter keeps or drops it;
//   4. once rollout_batch_size groups are kept: queued calls are cancelled, every engine gets
//      /abort_request {"abort_all": true} (repeated until our calls have all returned);
//      with partial_rollout the unfinished and surplus groups are kept for the next rollout
//      (metadata.start_rollout_id marks where they began), otherwise they are dropped;
//   5. the kept groups (sorted by sample index) get rollout_id, rewards are post-processed
//      (reward/reward_postprocess.h), and metrics are computed (metrics.h).
// Eval(rollout_id) generates every prompt of every eval dataset n times with that dataset's
// sampling options and reward type, without filtering or aborting, and reports eval/* metrics.
//
// Errors: a /generate that fails (engine unreachable after its retries, a timeout, a 4xx/5xx
// answer) or a reward that fails (reward.on_error: fail) ends the call with that error, after
// the other requests were aborted; the message names the engine or the sample. A data source
// that runs dry before the rollout is full is FailedPrecondition.
//
// Custom generation (RolloutOptions::custom_generator, EvalDataset::custom_generator): each
// sample of a group runs through CustomGenerator::Generate on a thread of a bounded pool, with
// an EngineSession on the group's engine (custom_generate.h has the contract). The returned
// segments replace the sample in its group, so a group may hold more than n samples; reward
// post-processing then normalizes per group over the n parent samples (segment 0), and every
// segment gets its parent's group statistics. Custom groups left over when a rollout is cut
// short are dropped, never recycled by partial rollout (the episode's state lived in the
// generator). A lost engine restarts the group from scratch as for default generation.
//
// Engine loss (with SetEngineRecovery): a /generate that cannot reach its engine marks the
// engine down (EnginePool) and starts EngineRecovery::Recover for it on a helper thread; new
// groups go to the engines still up. A group with a call lost that way starts over from the
// state it was submitted in (its samples, finished ones included, are generated again) once
// all its calls have returned, on the least-loaded engine that is up (the restarted one when
// it is back first; every engine down: queued on one until it is back). Generate and Eval wait
// for every recovery they started before returning; a failed recovery fails them with its
// error. Rollout metrics rollout/engine_restarts, rollout/retried_groups and
// perf/engine_recovery_time count it.
//
// Ownership: borrows the GroupSource and the RewardModel (they must outlive the coordinator);
// owns its EnginePool. Threads: Configure, Generate, Eval, State and RestoreState are called
// from one thread at a time (the rollout actor's); the progress callback runs on that thread.
// Checkpoints: State() holds the partial-rollout buffer (slime does not persist it); the data
// source's own state is saved by its owner.
#ifndef SLIME_ROLLOUT_COORDINATOR_H_
#define SLIME_ROLLOUT_COORDINATOR_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "slime/common/status.h"
#include "slime/data/prompt_dataset.h"
#include "slime/data/sample.h"
#include "slime/reward/reward_postprocess.h"
#include "slime/rollout/custom_generate.h"
#include "slime/rollout/engine_pool.h"
#include "slime/rollout/metrics.h"
#include "slime/rollout/teacher.h"

namespace slime::config {
struct Config;
struct EvalDatasetConfig;
}  // namespace slime::config
namespace slime::reward {
class RewardModel;
}

namespace slime::rollout {

// Where training prompts come from (the prompt data source implements it).
class GroupSource {
 public:
  virtual ~GroupSource() = default;
  // The next `num_groups` groups of n_samples_per_prompt pending samples (tokens = prompt ids,
  // response_length 0, unique increasing `index`). Fewer (or none) when the data ran out.
  virtual StatusOr<std::vector<data::SampleGroup>> GetSamples(int64_t num_groups) = 0;
};

// A GroupSource over a PromptDataSource (borrowed; it must outlive this adapter).
class PromptGroupSource : public GroupSource {
 public:
  explicit PromptGroupSource(data::PromptDataSource* source) : source_(source) {}
  StatusOr<std::vector<data::SampleGroup>> GetSamples(int64_t num_groups) override {
    return source_->GetSamples(num_groups);
  }

 private:
  data::PromptDataSource* source_;
};

// The sampling_params of one request family (rollout.*, or an eval dataset's overrides).
struct SamplingOptions {
  double temperature = 1.0;
  double top_p = 1.0;
  int top_k = -1;
  std::optional<int> max_response_len;  // max_new_tokens; unset: the engine's default
  std::optional<int> max_context_len;   // prompt + response cap
  std::optional<int> min_new_tokens;
  std::vector<std::string> stop;
  std::vector<int> stop_token_ids;
  bool skip_special_tokens = false;
  // Ask the engines for each token's routed experts (SGLang's return_routed_experts, from
  // routed_experts_start_len = the rows the sample already holds) and keep them in
  // Sample::rollout_routed_experts: rollout.return_routed_experts or
  // algorithm.use_rollout_routing_replay.
  bool return_routed_experts = false;
};

enum class DynamicFilter {
  kNone,                    // keep every group
  kNonzeroStd,              // keep a group whose rewards are not all equal (std > 1e-6)
  kNonzeroStdWithFallback,  // ... but keep a rejected group when the groups kept plus those
                            // still in flight cannot reach the target without it
};

struct RolloutOptions {
  EnginePoolOptions engines;
  int rollout_batch_size = 1;        // prompt groups per rollout
  int n_samples_per_prompt = 1;      // samples per group
  int over_sampling_batch_size = 0;  // groups per wave; 0 = rollout_batch_size
  SamplingOptions sampling;
  DynamicFilter dynamic_filter = DynamicFilter::kNone;
  bool partial_rollout = false;
  bool mask_offpolicy_in_partial_rollout = false;
  // Set (--fully-async with rollout.stale_samples: regenerate): a sample the partial-rollout
  // buffer hands to rollout j whose oldest token's weight version is below j − this starts
  // over from its prompt (Sample::ClearResponse), so no token it trains on at step j is older
  // than the bound; counted in rollout/partial_rollout/regenerated_samples.
  std::optional<int64_t> regenerate_older_than;
  // Deterministic mode: sample j of every group sends sampling_seed = seed + j.
  bool deterministic = false;
  int seed = 42;
  // Reward post-processing (estimator, group normalization); n and batch size are filled from
  // the fields above.
  reward::GroupRewardOptions reward_postprocess;
  bool log_passrate = false;  // passrate/pass@k in rollout metrics
  // metrics.log_multi_turn / log_correct_samples / log_reward_category (metrics.h).
  LoggedMetricOptions logged_metrics;
  // On-policy distillation with an SGLang-API teacher (algorithm.use_opd, opd_type sglang):
  // set, every generated training sample gets the teacher's log-probs of its response in
  // Sample::teacher_log_probs (teacher.h), asked as soon as the sample is generated; eval
  // samples are not sent. A teacher failure fails the Generate naming the sample and the URL.
  std::optional<TeacherOptions> teacher;
  // false: training samples are not scored and keep reward 0 (pure distillation: use_opd with
  // opd_type sglang and neither reward.rm_type nor reward.custom_rm_path). Eval is scored.
  bool score_rewards = true;
  // Custom generation (custom_generate.h; rollout.custom_generate): set, every training sample
  // is generated by it instead of one /generate call. Shared with whoever built it.
  std::shared_ptr<CustomGenerator> custom_generator;
  // Samples inside CustomGenerator::Generate at once (threads of the coordinator's pool,
  // shared by Generate and Eval; rollout.custom_generate_concurrency).
  int custom_generate_concurrency = 64;
  // End of rollout: re-send abort_all this often while our calls are still out, and give up
  // (DeadlineExceeded) after abort_timeout.
  std::chrono::milliseconds abort_poll_interval{std::chrono::milliseconds(200)};
  std::chrono::milliseconds abort_timeout{std::chrono::seconds(120)};
  std::chrono::milliseconds progress_interval{std::chrono::seconds(1)};
};

// Options from a resolved config (rollout.*, data.*, algorithm.*, debug.deterministic_mode,
// metrics.log_passrate) and the engine addresses the runtime started or was given.
StatusOr<RolloutOptions> RolloutOptionsFromConfig(const config::Config& config,
                                                  std::vector<std::string> engine_addresses);

// Who brings a lost engine back (the job driver: the runtime head restarts engine processes).
struct RecoveredEngine {
  std::string address;         // host:port it serves on now
  bool restarted = false;      // a new process (false: the old one answered again)
  std::string weight_version;  // the weights it was given ("" when not restarted)
};
class EngineRecovery {
 public:
  virtual ~EngineRecovery() = default;
  // Engines whose process was replaced since they were last started or recovered (e.g. one
  // that died and was restarted between rollouts); Generate and Eval recover them before
  // sending them anything.
  virtual std::vector<int> ReplacedEngines() = 0;
  // Blocks until `engine` (lost because of `cause`) serves again with the job's current
  // weights, or fails with an error that names the engine (the rollout then fails with it).
  // Runs on a helper thread, possibly for several engines at once.
  virtual StatusOr<RecoveredEngine> Recover(int engine, const Status& cause) = 0;
};

// One eval dataset, already loaded: pending prompt samples (tokens = prompt ids).
struct EvalDataset {
  std::string name;
  std::vector<data::Sample> prompts;
  int n_samples = 1;
  SamplingOptions sampling;
  std::string rm_type;     // per-dataset reward type; "" = the reward module's default
  std::string reward_key;  // a field of the reward mapping to use; "" = the scalar reward
  // This dataset's custom generation (null: one /generate call per sample).
  std::shared_ptr<CustomGenerator> custom_generator;
};

// An eval dataset's settings from the config, each resolved as slime does: the dataset entry,
// else eval.*, else rollout.* (sampling) / reward.* (rm_type, reward_key); n_samples from
// eval.n_samples_per_eval_prompt. `prompts` is filled from `dataset` (one pending sample each).
EvalDataset EvalDatasetFromConfig(const config::Config& config,
                                  const config::EvalDatasetConfig& entry,
                                  const data::PromptDataset& dataset);

struct RolloutResult {
  int64_t rollout_id = 0;
  std::vector<data::SampleGroup> groups;  // kept groups, sorted by sample index
  std::vector<double> raw_rewards;        // Sample::reward, flattened in group order
  std::vector<double> rewards;            // post-processed (r̃), same order
  MetricMap metrics;
};

struct EvalResult {
  int64_t rollout_id = 0;
  std::map<std::string, std::vector<data::SampleGroup>> datasets;  // name → groups
  MetricMap metrics;
};

// For a console line: how far the current Generate or Eval is.
struct RolloutProgress {
  int64_t rollout_id = 0;
  bool eval = false;
  int64_t samples_done = 0;    // samples generated (every finished /generate call counts)
  int64_t samples_target = 0;  // rollout_batch_size × n (eval: all prompts × n)
  int64_t response_tokens = 0;
  double elapsed_s = 0;
  double tokens_per_s = 0;
};
using ProgressCallback = std::function<void(const RolloutProgress&)>;

class RolloutCoordinator {
 public:
  RolloutCoordinator();
  ~RolloutCoordinator();
  RolloutCoordinator(const RolloutCoordinator&) = delete;
  RolloutCoordinator& operator=(const RolloutCoordinator&) = delete;

  // Checks the options, builds the engine pool (no engine is contacted). May be called again
  // between rollouts (the partial-rollout buffer is kept). `source` may be null when only Eval
  // is used; `reward` is required.
  Status Configure(RolloutOptions options, GroupSource* source, reward::RewardModel* reward,
                   std::vector<EvalDataset> eval_datasets = {});
  void SetProgressCallback(ProgressCallback callback);
  // Borrowed (must outlive the coordinator); takes effect at the next Configure. Null: an
  // unreachable engine is retried (EnginePoolOptions::max_attempts) and then fails the call.
  void SetEngineRecovery(EngineRecovery* recovery) { recovery_ = recovery; }

  StatusOr<RolloutResult> Generate(int64_t rollout_id);
  StatusOr<EvalResult> Eval(int64_t rollout_id);

  // From any thread, when the job stops: the running Generate or Eval ends soon with an error
  // (queued calls are cancelled, unreachable engines are no longer retried). Irreversible: a
  // later Configure builds a pool that is shut down too.
  void Cancel();

  // {"version": 1, "partial_rollout_buffer": [[sample, ...], ...]}.
  nlohmann::json State() const;
  // Replaces the buffer; errors name the bad group/sample and field.
  Status RestoreState(const nlohmann::json& state);

  // Groups waiting in the partial-rollout buffer.
  const std::vector<data::SampleGroup>& partial_rollout_buffer() const { return buffer_; }
  const EnginePool* engine_pool() const { return pool_.get(); }

 private:
  struct Run;
  struct Job;
  struct RecoveryTask;
  class TaskPool;
  Status CheckConfigured() const;
  // Custom generation (custom_job.cc): every sample of `job` through its generator.
  void SubmitCustomJob(const std::shared_ptr<Run>& run, Job* job, int64_t rollout_id);
  void SubmitJob(const std::shared_ptr<Run>& run, Job* job, int64_t rollout_id);
  // A group with a call lost to an engine failure: back to its submitted state, sent again.
  void RestartJob(const std::shared_ptr<Run>& run, Job* job, int64_t rollout_id);
  // Null when a recovery failed (RecoveryFailure() says why).
  Job* WaitDone(Run* run);
  // Engine recovery (the file comment, "Engine loss").
  void RecoverReplacedEngines();
  void StartRecovery(int engine, const Status& cause);
  Status RecoveryFailure();
  // Joins every recovery started; restarts and seconds into `metrics`; the first failure.
  Status FinishRecoveries(MetricMap* metrics);
  Status AbortAndDrain(const std::shared_ptr<Run>& run);
  void ReportProgress(Run& run, bool force);
  // Ends a Generate or Eval: aborts what is still out, joins the recoveries (their metrics into
  // `recovery_metrics`), reports the final progress. The drain's error, else `failure`, else a
  // recovery's.
  Status EndRun(const std::shared_ptr<Run>& run, const Status& failure,
                MetricMap* recovery_metrics);
  // Generate's steps (coordinator.cc), over its GenerateTally.
  struct GenerateTally;
  // Submits waves until the groups kept and in flight cover the target; an error (source dry
  // with nothing in flight, a bad group) into tally->failure.
  void TopUpWaves(const std::shared_ptr<Run>& run, GenerateTally* tally);
  // The next over_sampling_batch_size groups for rollout `rollout_id`: the partial-rollout
  // buffer's first (samples over regenerate_older_than cleared, counted in tally), then the
  // source's; empty when both ran dry.
  StatusOr<std::vector<data::SampleGroup>> NextWave(int64_t rollout_id, GenerateTally* tally);
  // One job per group, submitted; a group of the wrong size is an error.
  Status SubmitWave(const std::shared_ptr<Run>& run, std::vector<data::SampleGroup> wave,
                    GenerateTally* tally);
  // Waits for the next group handed back: a lost one is submitted again, a failed one sets
  // tally->failure, a finished one is kept or dropped by the dynamic filter.
  void CollectGroup(const std::shared_ptr<Run>& run, GenerateTally* tally);
  bool PassesDynamicFilter(const Job& job, GenerateTally* tally);
  // The groups neither kept nor dropped: into the partial-rollout buffer (partial_rollout) or
  // gone; counted in the tally.
  void RecycleLeftovers(Run& run, GenerateTally* tally);
  // The kept groups sorted by sample index, stamped with rollout_id, their rewards
  // post-processed.
  StatusOr<RolloutResult> KeptResult(int64_t rollout_id, const std::vector<Job*>& kept);
  void AddRolloutMetrics(const Run& run, const GenerateTally& tally, RolloutResult* result);

  RolloutOptions options_;
  GroupSource* source_ = nullptr;
  reward::RewardModel* reward_ = nullptr;
  std::vector<EvalDataset> eval_datasets_;
  std::mutex cancel_mu_;  // guards the pool_ pointer against Cancel from another thread
  bool cancelled_ = false;
  std::unique_ptr<EnginePool> pool_;
  std::unique_ptr<TeacherClient> teacher_;  // options_.teacher's client
  std::vector<data::SampleGroup> buffer_;   // partial rollout: groups to continue
  ProgressCallback progress_;
  EngineRecovery* recovery_ = nullptr;
  bool recovery_enabled_ = false;  // recovery_ was set at Configure
  std::mutex recovery_mu_;
  std::vector<std::unique_ptr<RecoveryTask>> recoveries_;  // guarded by recovery_mu_
  // Custom generation: the threads that run CustomGenerator::Generate (declared after pool_:
  // destroyed, and joined, before it). Segment indices come from their own range.
  std::unique_ptr<TaskPool> custom_pool_;
  std::atomic<int64_t> next_segment_index_{int64_t{1} << 48};
};

// Sample ⇄ JSON (the State() format; every field of data::Sample).
nlohmann::json SampleToJson(const data::Sample& sample);
StatusOr<data::Sample> SampleFromJson(const nlohmann::json& j);

}  // namespace slime::rollout

#endif  // SLIME_ROLLOUT_COORDINATOR_H_
