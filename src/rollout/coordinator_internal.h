// Internal to the rollout module: the state RolloutCoordinator shares between coordinator.cc
// (default generation, the rollout loop) and custom_job.cc (custom generation).
#ifndef SLIME_SRC_ROLLOUT_COORDINATOR_INTERNAL_H_
#define SLIME_SRC_ROLLOUT_COORDINATOR_INTERNAL_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "slime/rollout/coordinator.h"

namespace slime::reward {
class RewardModel;
}

namespace slime::rollout {

using Clock = std::chrono::steady_clock;

// One group in flight. The main thread creates it; each sample is touched only by its own
// /generate callback (or custom-generation task) until the last one scores the group and hands
// it back through Run::done.
struct RolloutCoordinator::Job {
  data::SampleGroup group;
  const SamplingOptions* sampling = nullptr;
  std::string rm_type;
  std::string reward_key;
  CustomGenerator* custom = nullptr;  // set: custom generation (custom_job.cc)
  int calls_left = 0;                 // guarded by Run::mu
  Status error;                       // guarded by Run::mu until the job is in Run::done
  enum class Fate { kOpen, kKept, kDropped } fate = Fate::kOpen;  // main thread only
  // Custom generation: each sample's result, by position in `group` (each task writes its own).
  std::vector<CustomGenerateResult> custom_results;
  // Engine recovery: the group as first submitted (a retried group starts over from it), a
  // call lost to an unreachable engine (guarded by Run::mu), and what this attempt counted
  // in Run's progress.
  data::SampleGroup original;
  bool retry = false;
  std::atomic<int64_t> attempt_samples{0};
  std::atomic<int64_t> attempt_tokens{0};
};

// The state of one Generate or Eval call, shared with the /generate callbacks (which may
// outlive an abandoned call: they hold a shared_ptr).
struct RolloutCoordinator::Run {
  int64_t rollout_id = 0;
  bool eval = false;
  int64_t samples_target = 0;
  reward::RewardModel* reward = nullptr;  // null: no rewards (pure distillation, training only)
  TeacherClient* teacher = nullptr;       // the OPD teacher (training runs only), or null
  Clock::time_point start = Clock::now();
  Clock::time_point last_progress = Clock::now();
  std::vector<std::unique_ptr<Job>> jobs;  // main thread only; Jobs never move
  std::atomic<int64_t> samples_done{0};
  std::atomic<int64_t> response_tokens{0};

  absl::Mutex mu;
  std::deque<Job*> done ABSL_GUARDED_BY(mu);  // generated (and scored) groups
  bool aborting ABSL_GUARDED_BY(mu) = false;
  int64_t calls_out ABSL_GUARDED_BY(mu) = 0;  // submitted, callback (or task) not finished

  // One of `job`'s calls (a /generate or a custom-generation task) has ended with `status`
  // (`lost`: to an unreachable engine). Records the first error and the loss, and returns
  // whether it was the job's last call, the job's error so far, and the run's abort and the
  // job's retry flags at that moment.
  struct CallEnd {
    bool last = false;
    bool aborting = false;
    bool retry = false;
    Status error;
  };
  bool Aborting() {
    absl::MutexLock lock(&mu);
    return aborting;
  }
  CallEnd EndCall(Job* job, const Status& status, bool lost) {
    absl::MutexLock lock(&mu);
    if (!status.ok() && job->error.ok()) job->error = status;
    if (lost) job->retry = true;
    return {--job->calls_left == 0, aborting, job->retry, job->error};
  }
};

// A fixed-size pool of threads running queued tasks in FIFO order (custom generation: one task
// per sample, so at most `num_threads` samples are inside CustomGenerator::Generate). Threads
// start on demand. The destructor runs what is queued and joins.
class RolloutCoordinator::TaskPool {
 public:
  explicit TaskPool(int num_threads) : max_threads_(num_threads) {}
  ~TaskPool();
  TaskPool(const TaskPool&) = delete;
  TaskPool& operator=(const TaskPool&) = delete;
  void Post(std::function<void()> task);
  int max_threads() const { return max_threads_; }

 private:
  void Main();
  const int max_threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;  // guarded by mu_
  int idle_ = 0;                              // guarded by mu_
  bool stopping_ = false;                     // guarded by mu_
  std::vector<std::thread> threads_;          // guarded by mu_ (joined in the destructor)
};

namespace internal {

bool NeedsGeneration(const data::Sample& s);

// Scores the generated (completed or truncated) samples of `group` in one reward call (slime:
// aborted samples get none); reward_key picks a field of a mapping reward. A null `model`
// scores nothing (rewards stay as they are).
Status ScoreGroup(reward::RewardModel* model, const std::string& rm_type,
                  const std::string& reward_key, data::SampleGroup* group);

// A generated group's last step, on the thread of its last call: the teacher's log-probs for
// the generated samples still without them (`teacher` set), then ScoreGroup.
Status FinishGroup(reward::RewardModel* model, TeacherClient* teacher, const std::string& rm_type,
                   const std::string& reward_key, data::SampleGroup* group);

// Slime's reward post-processing (reward::NormalizeGroupRewards) over the kept groups, whose
// rewards are `raw_rewards` flattened in group order. When every group has
// n_samples_per_prompt samples this is exactly NormalizeGroupRewards. When custom generation
// returned extra segments (a group is larger), each group is normalized on its own: mean and
// std over its parent samples (those without metadata["segment"] or with segment 0), applied
// to every sample of the group, so a sample split into k segments does not weigh k times.
StatusOr<std::vector<double>> PostProcessRewards(const std::vector<data::SampleGroup>& groups,
                                                 const std::vector<double>& raw_rewards,
                                                 const reward::GroupRewardOptions& options);

// Rollout `rollout_id` of `groups` in the order given: rollout_id set on every sample, the raw
// rewards (Sample::reward) flattened in group order and their PostProcessRewards. No metrics.
StatusOr<RolloutResult> ResultOfGroups(int64_t rollout_id, std::vector<data::SampleGroup> groups,
                                       const reward::GroupRewardOptions& options);

}  // namespace internal
}  // namespace slime::rollout

#endif  // SLIME_SRC_ROLLOUT_COORDINATOR_INTERNAL_H_
