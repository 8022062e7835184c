// RolloutCoordinator (coordinator.h): the generation loop of slime's default rollout.
#include "slime/rollout/coordinator.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "coordinator_internal.h"
#include "request.h"
#include "slime/config/algorithms.h"
#include "slime/reward/reward.h"

namespace slime::rollout {

namespace {

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

// One Generate's bookkeeping, on the calling thread: the groups kept so far and what its steps
// counted.
struct RolloutCoordinator::GenerateTally {
  int64_t target = 0;         // groups to keep (rollout_batch_size)
  std::vector<Job*> kept;     // in the order they were kept
  int64_t pending = 0;        // submitted, not yet handed back
  int64_t fallback_kept = 0;  // zero-std groups kept by the dynamic filter's fallback
  int64_t retried_groups = 0;
  int64_t recycled = 0;         // leftover groups into the partial-rollout buffer
  int64_t regenerated = 0;      // buffered samples over the staleness bound, started over
  int64_t aborted_samples = 0;  // in the leftover groups
  MetricMap drops;              // rollout/dynamic_filter/drop_zero_std_<reward>
  MetricMap recovery_metrics;   // FinishRecoveries'
  Status failure;               // the first error: ends the loop
};

// One Recover() on its helper thread.
struct RolloutCoordinator::RecoveryTask {
  int engine = 0;
  std::thread thread;
  bool done = false;  // guarded by RolloutCoordinator::recovery_mu_, as the fields below
  Status status;
  RecoveredEngine result;
  double seconds = 0;
};

namespace internal {

bool NeedsGeneration(const data::Sample& s) {
  return s.status != data::SampleStatus::kCompleted && s.status != data::SampleStatus::kTruncated;
}

// Runs on the worker thread of the group's last call.
Status ScoreGroup(reward::RewardModel* model, const std::string& rm_type,
                  const std::string& reward_key, data::SampleGroup* group) {
  if (model == nullptr) return absl::OkStatus();
  std::vector<data::Sample*> scored;
  for (auto& s : *group) {
    if (s.status == data::SampleStatus::kCompleted || s.status == data::SampleStatus::kTruncated) {
      scored.push_back(&s);
    }
  }
  if (scored.empty()) return absl::OkStatus();
  std::vector<std::string> prompts;
  std::vector<nlohmann::json> metadata;
  prompts.reserve(scored.size());
  metadata.reserve(scored.size());
  std::vector<reward::RewardSample> views;
  for (data::Sample* s : scored) {
    prompts.push_back(!s->prompt_text.empty() ? s->prompt_text
                      : s->prompt.is_string() ? s->prompt.get<std::string>()
                                              : s->prompt.dump());
    metadata.push_back(nlohmann::json::parse(s->metadata.dump()));
  }
  for (size_t i = 0; i < scored.size(); ++i) {
    views.push_back(reward::RewardSample{prompts[i], scored[i]->response, scored[i]->label,
                                         &metadata[i], rm_type});
  }
  StatusOr<std::vector<reward::RewardResult>> results = model->ScoreGroup(views);
  if (!results.ok()) {
    return Status(results.status().code(),
                  fmt::format("reward of group {} (sample {}): {}", group->front().group_index,
                              scored.front()->index, std::string(results.status().message())));
  }
  for (size_t i = 0; i < scored.size(); ++i) {
    const reward::RewardResult& r = (*results)[i];
    scored[i]->reward = r.reward;
    scored[i]->raw_reward = r.fields.is_null() ? nlohmann::json(r.reward) : r.fields;
    if (!reward_key.empty()) {
      const auto it = r.fields.find(reward_key);
      if (!r.fields.is_object() || it == r.fields.end() || !it->is_number()) {
        return absl::InvalidArgumentError(
            fmt::format("sample {}: reward_key '{}' is not a numeric field of the reward {}",
                        scored[i]->index, reward_key, r.fields.dump()));
      }
      scored[i]->reward = it->get<double>();
    }
  }
  return absl::OkStatus();
}

Status FinishGroup(reward::RewardModel* model, TeacherClient* teacher, const std::string& rm_type,
                   const std::string& reward_key, data::SampleGroup* group) {
  if (teacher != nullptr) SLIME_RETURN_IF_ERROR(teacher->ScoreGroup(group));
  return ScoreGroup(model, rm_type, reward_key, group);
}

}  // namespace internal

using internal::FinishGroup;
using internal::NeedsGeneration;

RolloutCoordinator::RolloutCoordinator() = default;
RolloutCoordinator::~RolloutCoordinator() {
  MetricMap unused;
  (void)FinishRecoveries(&unused);
}

Status RolloutCoordinator::Configure(RolloutOptions options, GroupSource* source,
                                     reward::RewardModel* reward,
                                     std::vector<EvalDataset> eval_datasets) {
  if (reward == nullptr) {
    return absl::InvalidArgumentError("the rollout coordinator needs a reward model");
  }
  if (options.rollout_batch_size < 1 || options.n_samples_per_prompt < 1) {
    return absl::InvalidArgumentError(
        fmt::format("rollout_batch_size = {} and n_samples_per_prompt = {} must both be >= 1",
                    options.rollout_batch_size, options.n_samples_per_prompt));
  }
  if (options.over_sampling_batch_size == 0) {
    options.over_sampling_batch_size = options.rollout_batch_size;
  }
  if (options.over_sampling_batch_size < options.rollout_batch_size) {
    return absl::InvalidArgumentError(
        fmt::format("over_sampling_batch_size = {} must be at least rollout_batch_size = {}",
                    options.over_sampling_batch_size, options.rollout_batch_size));
  }
  if (options.mask_offpolicy_in_partial_rollout && !options.partial_rollout) {
    return absl::InvalidArgumentError(
        "mask_offpolicy_in_partial_rollout needs partial_rollout: true");
  }
  for (const EvalDataset& d : eval_datasets) {
    if (d.n_samples < 1) {
      return absl::InvalidArgumentError(
          fmt::format("eval dataset '{}': n_samples = {} must be >= 1", d.name, d.n_samples));
    }
  }
  if (options.custom_generate_concurrency < 1) {
    return absl::InvalidArgumentError(
        fmt::format("custom_generate_concurrency = {} must be >= 1",
                    options.custom_generate_concurrency));
  }
  bool custom = options.custom_generator != nullptr;
  for (const EvalDataset& d : eval_datasets) custom = custom || d.custom_generator != nullptr;
  if (options.custom_generator != nullptr && options.partial_rollout) {
    return absl::InvalidArgumentError(
        "rollout.partial_rollout cannot continue custom-generated samples (their multi-turn "
        "state lives in the generator): turn partial_rollout off with rollout.custom_generate");
  }
  options.reward_postprocess.n_samples_per_prompt = options.n_samples_per_prompt;
  options.reward_postprocess.rollout_batch_size = options.rollout_batch_size;
  SLIME_RETURN_IF_ERROR(reward::GroupRewardNormalizationFor(options.reward_postprocess).status());
  recovery_enabled_ = recovery_ != nullptr;
  if (recovery_enabled_) {
    options.engines.on_unreachable = [this](int engine, const Status& cause) {
      StartRecovery(engine, cause);
    };
  }
  std::unique_ptr<TeacherClient> teacher;
  if (options.teacher.has_value()) {
    SLIME_ASSIGN_OR_RETURN(teacher, TeacherClient::Create(*options.teacher));
  }
  SLIME_ASSIGN_OR_RETURN(std::unique_ptr<EnginePool> pool, EnginePool::Create(options.engines));
  {
    std::lock_guard<std::mutex> lock(cancel_mu_);
    if (cancelled_) pool->Shutdown();
    pool_ = std::move(pool);
  }
  if (custom && (custom_pool_ == nullptr ||
                 custom_pool_->max_threads() != options.custom_generate_concurrency)) {
    custom_pool_.reset();  // joins the old threads (no Generate or Eval is running)
    custom_pool_ = std::make_unique<TaskPool>(options.custom_generate_concurrency);
  }
  teacher_ = std::move(teacher);
  options_ = std::move(options);
  source_ = source;
  reward_ = reward;
  eval_datasets_ = std::move(eval_datasets);
  return absl::OkStatus();
}

void RolloutCoordinator::SetProgressCallback(ProgressCallback callback) {
  progress_ = std::move(callback);
}

Status RolloutCoordinator::CheckConfigured() const {
  if (pool_ == nullptr) {
    return absl::FailedPreconditionError("the rollout coordinator is not configured");
  }
  return absl::OkStatus();
}

void RolloutCoordinator::SubmitJob(const std::shared_ptr<Run>& run, Job* job, int64_t rollout_id) {
  static std::atomic<uint64_t> rid_counter{0};
  if (recovery_enabled_ && job->original.empty()) job->original = job->group;
  if (job->custom != nullptr) {
    SubmitCustomJob(run, job, rollout_id);
    return;
  }
  std::vector<std::pair<size_t, nlohmann::json>> calls;
  for (size_t j = 0; j < job->group.size(); ++j) {
    data::Sample& s = job->group[j];
    if (!NeedsGeneration(s)) continue;
    if (options_.mask_offpolicy_in_partial_rollout && !run->eval && s.response_length > 0) {
      std::fill(s.loss_mask.begin(), s.loss_mask.end(), 0);  // tokens of an older policy
    }
    s.status = data::SampleStatus::kPending;
    std::optional<int64_t> seed;
    if (options_.deterministic) seed = options_.seed + static_cast<int64_t>(j);
    const std::string rid = fmt::format("slime-{}{}-{}-{}", run->eval ? "eval" : "rollout",
                                        rollout_id, s.index, rid_counter.fetch_add(1));
    std::optional<nlohmann::json> body =
        internal::BuildGenerateRequest(&s, *job->sampling, rid, seed);
    if (body) calls.emplace_back(j, std::move(*body));
  }
  if (calls.empty()) {  // nothing left to generate (resumed finished group): score it now
    Status st = FinishGroup(run->reward, run->teacher, job->rm_type, job->reward_key, &job->group);
    absl::MutexLock lock(&run->mu);
    job->error = st;
    run->done.push_back(job);
    return;
  }
  const int engine = pool_->PickEngine(static_cast<int64_t>(calls.size()));
  {
    absl::MutexLock lock(&run->mu);
    job->calls_left = static_cast<int>(calls.size());
    run->calls_out += static_cast<int64_t>(calls.size());
  }
  const std::string engine_name = pool_->address(engine).ToString();
  const bool retry_lost = recovery_enabled_;
  for (auto& [j, body] : calls) {
    job->group[j].metadata["engine"] = engine_name;
    pool_->Submit(engine, std::move(body), [run, job, j = j, retry_lost](StatusOr<nlohmann::json> r) {
      data::Sample& s = job->group[j];
      Status st;
      bool lost = false;
      if (r.ok()) {
        const int64_t before = s.response_length;
        st = internal::ApplyGenerateResponse(*r, &s, job->sampling->return_routed_experts);
        if (st.ok() && run->teacher != nullptr && !NeedsGeneration(s) && !run->Aborting()) {
          // The teacher scores the sample now, in parallel with the group's other samples.
          StatusOr<std::vector<float>> lps = run->teacher->ResponseLogProbs(s);
          if (lps.ok()) {
            s.teacher_log_probs = *std::move(lps);
          } else {
            st = lps.status();
          }
        }
        run->response_tokens += s.response_length - before;
        run->samples_done += 1;
        job->attempt_tokens += s.response_length - before;
        job->attempt_samples += 1;
      } else if (absl::IsCancelled(r.status())) {
        s.status = data::SampleStatus::kAborted;  // never sent: continued next time
      } else if (retry_lost && absl::IsUnavailable(r.status())) {
        lost = true;  // the engine is being recovered: the group starts over
      } else {
        st = r.status();
      }
      const Run::CallEnd end = run->EndCall(job, st, lost);
      st = end.error;
      if (end.last) {
        if (st.ok() && !end.aborting && !end.retry) {
          st = FinishGroup(run->reward, run->teacher, job->rm_type, job->reward_key, &job->group);
        }
        absl::MutexLock lock(&run->mu);
        if (!st.ok()) job->error = st;
        run->done.push_back(job);
      }
      absl::MutexLock lock(&run->mu);
      --run->calls_out;
    });
  }
}

void RolloutCoordinator::RestartJob(const std::shared_ptr<Run>& run, Job* job,
                                    int64_t rollout_id) {
  {
    absl::MutexLock lock(&run->mu);
    job->retry = false;
  }
  run->samples_done -= job->attempt_samples.exchange(0);
  run->response_tokens -= job->attempt_tokens.exchange(0);
  job->group = job->original;
  SubmitJob(run, job, rollout_id);
}

void RolloutCoordinator::RecoverReplacedEngines() {
  if (!recovery_enabled_) return;
  for (int engine : recovery_->ReplacedEngines()) {
    if (engine < 0 || engine >= pool_->num_engines()) continue;
    const Status cause = absl::UnavailableError(fmt::format(
        "engine {}: its process was replaced", pool_->address(engine).ToString()));
    if (pool_->MarkEngineDown(engine, cause)) StartRecovery(engine, cause);
  }
}

void RolloutCoordinator::StartRecovery(int engine, const Status& cause) {
  std::lock_guard<std::mutex> lock(recovery_mu_);
  for (const auto& t : recoveries_) {
    if (t->engine == engine && !t->done) return;  // already on it
  }
  auto task = std::make_unique<RecoveryTask>();
  RecoveryTask* t = task.get();
  t->engine = engine;
  t->thread = std::thread([this, t, cause] {
    const auto start = Clock::now();
    StatusOr<RecoveredEngine> r = recovery_->Recover(t->engine, cause);
    Status s = r.status();
    if (r.ok()) s = pool_->SetEngineUp(t->engine, r->address);
    std::lock_guard<std::mutex> lock(recovery_mu_);
    t->done = true;
    t->status = s;
    if (r.ok()) t->result = *std::move(r);
    t->seconds = Seconds(Clock::now() - start);
  });
  recoveries_.push_back(std::move(task));
}

Status RolloutCoordinator::RecoveryFailure() {
  std::lock_guard<std::mutex> lock(recovery_mu_);
  for (const auto& t : recoveries_) {
    if (t->done && !t->status.ok()) return t->status;
  }
  return absl::OkStatus();
}

Status RolloutCoordinator::FinishRecoveries(MetricMap* metrics) {
  std::vector<std::unique_ptr<RecoveryTask>> tasks;
  {
    std::lock_guard<std::mutex> lock(recovery_mu_);
    tasks.swap(recoveries_);
  }
  for (auto& t : tasks) t->thread.join();
  Status first;
  int64_t restarts = 0;
  double seconds = 0;
  for (const auto& t : tasks) {  // done: no lock needed after the join
    if (!t->status.ok() && first.ok()) first = t->status;
    if (t->status.ok() && t->result.restarted) ++restarts;
    seconds += t->seconds;
  }
  if (recovery_enabled_) {
    (*metrics)["rollout/engine_restarts"] = static_cast<double>(restarts);
    if (!tasks.empty()) (*metrics)["perf/engine_recovery_time"] = seconds;
  }
  return first;
}

void RolloutCoordinator::ReportProgress(Run& run, bool force) {
  if (!progress_) return;
  const auto now = Clock::now();
  if (!force && now - run.last_progress < options_.progress_interval) return;
  run.last_progress = now;
  RolloutProgress p;
  p.rollout_id = run.rollout_id;
  p.eval = run.eval;
  p.samples_done = run.samples_done.load();
  p.samples_target = run.samples_target;
  p.response_tokens = run.response_tokens.load();
  p.elapsed_s = Seconds(now - run.start);
  p.tokens_per_s = p.elapsed_s > 0 ? static_cast<double>(p.response_tokens) / p.elapsed_s : 0;
  progress_(p);
}

void RolloutCoordinator::Cancel() {
  std::lock_guard<std::mutex> lock(cancel_mu_);
  cancelled_ = true;
  if (pool_ != nullptr) pool_->Shutdown();
}

Status RolloutCoordinator::AbortAndDrain(const std::shared_ptr<Run>& run) {
  {
    absl::MutexLock lock(&run->mu);
    run->aborting = true;
  }
  pool_->CancelQueued();
  const auto deadline = Clock::now() + options_.abort_timeout;
  while (true) {
    int64_t out = 0;
    {
      absl::MutexLock lock(&run->mu);
      out = run->calls_out;
    }
    if (out == 0) return absl::OkStatus();
    // Repeated: a call sent just after an abort is not aborted by it.
    Status s = pool_->AbortAll();
    if (!s.ok()) spdlog::warn("rollout {}: abort: {}", run->rollout_id, s.ToString());
    absl::MutexLock lock(&run->mu);
    run->mu.AwaitWithTimeout(
        absl::Condition(
            +[](Run* r) ABSL_NO_THREAD_SAFETY_ANALYSIS { return r->calls_out == 0; }, run.get()),
        absl::FromChrono(options_.abort_poll_interval));
    if (run->calls_out > 0 && Clock::now() > deadline) {
      return absl::DeadlineExceededError(fmt::format(
          "rollout {}: {} /generate calls still had not returned {:.0f} s after aborting them",
          run->rollout_id, run->calls_out, Seconds(options_.abort_timeout)));
    }
  }
}

RolloutCoordinator::Job* RolloutCoordinator::WaitDone(Run* run) {
  const auto tick = std::min(options_.progress_interval, std::chrono::milliseconds(1000));
  while (true) {
    if (recovery_enabled_ && !RecoveryFailure().ok()) return nullptr;
    {
      absl::MutexLock lock(&run->mu);
      run->mu.AwaitWithTimeout(
          absl::Condition(
              +[](Run* r) ABSL_NO_THREAD_SAFETY_ANALYSIS { return !r->done.empty(); }, run),
          absl::FromChrono(tick));
      if (!run->done.empty()) {
        Job* job = run->done.front();
        run->done.pop_front();
        return job;
      }
    }
    ReportProgress(*run, false);
  }
}

// Generate's steps (the file comment of coordinator.h): top up with waves, collect and filter
// groups until rollout_batch_size are kept, abort the rest, recycle the leftovers, finalize.
StatusOr<RolloutResult> RolloutCoordinator::Generate(int64_t rollout_id) {
  SLIME_RETURN_IF_ERROR(CheckConfigured());
  GenerateTally tally;
  tally.target = options_.rollout_batch_size;
  auto run = std::make_shared<Run>();
  run->rollout_id = rollout_id;
  run->samples_target = tally.target * options_.n_samples_per_prompt;
  run->reward = options_.score_rewards ? reward_ : nullptr;
  run->teacher = teacher_.get();
  pool_->ResetMaxInFlight();
  RecoverReplacedEngines();

  while (static_cast<int64_t>(tally.kept.size()) < tally.target && tally.failure.ok()) {
    TopUpWaves(run, &tally);
    if (!tally.failure.ok() || tally.pending == 0) break;
    CollectGroup(run, &tally);
  }
  SLIME_RETURN_IF_ERROR(EndRun(run, tally.failure, &tally.recovery_metrics));
  RecycleLeftovers(*run, &tally);
  SLIME_ASSIGN_OR_RETURN(RolloutResult result, KeptResult(rollout_id, tally.kept));
  AddRolloutMetrics(*run, tally, &result);
  return result;
}

void RolloutCoordinator::TopUpWaves(const std::shared_ptr<Run>& run, GenerateTally* t) {
  // Whole waves until kept + in flight covers the target (slime's loop).
  while (static_cast<int64_t>(t->kept.size()) + t->pending < t->target && t->failure.ok()) {
    StatusOr<std::vector<data::SampleGroup>> wave = NextWave(run->rollout_id, t);
    if (!wave.ok()) {
      t->failure = wave.status();
      return;
    }
    if (wave->empty()) {
      if (t->pending == 0) {
        t->failure = absl::FailedPreconditionError(
            fmt::format("rollout {}: the prompt source ran out after {} of {} groups were kept",
                        run->rollout_id, t->kept.size(), t->target));
      }
      return;
    }
    t->failure = SubmitWave(run, *std::move(wave), t);
  }
}

StatusOr<std::vector<data::SampleGroup>> RolloutCoordinator::NextWave(int64_t rollout_id,
                                                                      GenerateTally* t) {
  std::vector<data::SampleGroup> wave;
  const int64_t want = options_.over_sampling_batch_size;
  while (!buffer_.empty() && static_cast<int64_t>(wave.size()) < want) {
    wave.push_back(std::move(buffer_.front()));
    buffer_.erase(buffer_.begin());
    if (!options_.regenerate_older_than) continue;
    for (data::Sample& s : wave.back()) {
      const std::optional<int64_t> oldest = s.OldestWeightVersion();
      if (!oldest || rollout_id - *oldest <= *options_.regenerate_older_than) continue;
      s.ClearResponse();
      s.metadata.erase("start_rollout_id");
      ++t->regenerated;
    }
  }
  if (static_cast<int64_t>(wave.size()) < want) {
    if (source_ == nullptr) {
      return absl::FailedPreconditionError("the rollout coordinator has no prompt source");
    }
    SLIME_ASSIGN_OR_RETURN(std::vector<data::SampleGroup> more,
                           source_->GetSamples(want - static_cast<int64_t>(wave.size())));
    for (auto& g : more) wave.push_back(std::move(g));
  }
  return wave;
}

Status RolloutCoordinator::SubmitWave(const std::shared_ptr<Run>& run,
                                      std::vector<data::SampleGroup> wave, GenerateTally* t) {
  const int64_t n = options_.n_samples_per_prompt;
  for (auto& g : wave) {
    if (static_cast<int64_t>(g.size()) != n) {
      return absl::InvalidArgumentError(
          fmt::format("rollout {}: a prompt group (group_index {}) has {} samples, expected "
                      "n_samples_per_prompt = {}",
                      run->rollout_id, g.empty() ? -1 : g.front().group_index, g.size(), n));
    }
    auto job = std::make_unique<Job>();
    job->group = std::move(g);
    job->sampling = &options_.sampling;
    job->custom = options_.custom_generator.get();
    run->jobs.push_back(std::move(job));
    SubmitJob(run, run->jobs.back().get(), run->rollout_id);
    ++t->pending;
  }
  return absl::OkStatus();
}

void RolloutCoordinator::CollectGroup(const std::shared_ptr<Run>& run, GenerateTally* t) {
  Job* job = WaitDone(run.get());
  if (job == nullptr) {
    t->failure = RecoveryFailure();
    return;
  }
  if (std::lock_guard<std::mutex> lock(cancel_mu_); cancelled_) {
    // The engines stop with the job: a lost group would wait for a recovery that will not
    // come, a cancelled one would count as kept.
    t->failure = absl::CancelledError("the rollout was cancelled: the job is stopping");
    return;
  }
  if (job->error.ok() && job->retry) {  // lost to an engine failure: again, still pending
    RestartJob(run, job, run->rollout_id);
    ++t->retried_groups;
    return;
  }
  --t->pending;
  if (!job->error.ok()) {
    t->failure = job->error;
    return;
  }
  const bool keep = PassesDynamicFilter(*job, t);
  job->fate = keep ? Job::Fate::kKept : Job::Fate::kDropped;
  if (keep) t->kept.push_back(job);
}

bool RolloutCoordinator::PassesDynamicFilter(const Job& job, GenerateTally* t) {
  if (options_.dynamic_filter == DynamicFilter::kNone) return true;
  std::vector<double> rewards;
  for (const auto& s : job.group) rewards.push_back(s.reward);
  const bool zero_std = reward::SampleStd(rewards) <= 1e-6;
  if (!zero_std) return true;
  if (options_.dynamic_filter == DynamicFilter::kNonzeroStdWithFallback &&
      static_cast<int64_t>(t->kept.size()) + t->pending < t->target) {
    ++t->fallback_kept;
    return true;  // no candidate left to replace it: keep rather than start a new wave
  }
  t->drops["rollout/dynamic_filter/drop_zero_std_" + PyFloatString(rewards.front())] += 1;
  return false;
}

Status RolloutCoordinator::EndRun(const std::shared_ptr<Run>& run, const Status& failure,
                                  MetricMap* recovery_metrics) {
  Status drained = AbortAndDrain(run);
  Status recovered = FinishRecoveries(recovery_metrics);
  ReportProgress(*run, true);
  SLIME_RETURN_IF_ERROR(drained);
  SLIME_RETURN_IF_ERROR(failure);
  return recovered;
}

void RolloutCoordinator::RecycleLeftovers(Run& run, GenerateTally* t) {
  // Leftovers: surplus finished groups and aborted ones.
  for (auto& job : run.jobs) {
    if (job->fate != Job::Fate::kOpen) continue;
    if (job->retry) job->group = job->original;  // lost to an engine failure: from the start
    for (const auto& s : job->group) {
      t->aborted_samples += s.status == data::SampleStatus::kAborted ? 1 : 0;
    }
    if (!options_.partial_rollout || job->custom != nullptr) continue;
    for (auto& s : job->group) {
      if (!s.metadata.contains("start_rollout_id")) s.metadata["start_rollout_id"] = run.rollout_id;
    }
    buffer_.push_back(std::move(job->group));
    ++t->recycled;
  }
  std::sort(buffer_.begin(), buffer_.end(),
            [](const auto& a, const auto& b) { return a.front().index < b.front().index; });
}

StatusOr<RolloutResult> RolloutCoordinator::KeptResult(int64_t rollout_id,
                                                       const std::vector<Job*>& kept) {
  std::vector<data::SampleGroup> groups;
  for (Job* job : kept) groups.push_back(std::move(job->group));
  std::sort(groups.begin(), groups.end(),
            [](const auto& a, const auto& b) { return a.front().index < b.front().index; });
  return internal::ResultOfGroups(rollout_id, std::move(groups), options_.reward_postprocess);
}

void RolloutCoordinator::AddRolloutMetrics(const Run& run, const GenerateTally& t,
                                           RolloutResult* result) {
  const double elapsed = Seconds(Clock::now() - run.start);
  MetricMap& metrics = result->metrics;
  // rollout/zero_std/* counts groups whose rewards leave no group signal: estimators without a
  // critic (config/algorithms.h).
  const config::AdvantageEstimatorInfo* estimator =
      config::FindAdvantageEstimator(options_.reward_postprocess.advantage_estimator);
  metrics = RolloutSampleMetrics(result->groups, result->rewards,
                                 /*zero_std=*/estimator == nullptr || !estimator->critic,
                                 options_.log_passrate);
  for (const auto& [k, v] : LoggedSampleMetrics(result->groups, options_.logged_metrics)) {
    metrics[k] = v;
  }
  for (const auto& [k, v] : t.drops) metrics[k] = v;
  if (t.fallback_kept > 0) metrics["rollout/dynamic_filter/kept_by_fallback"] = t.fallback_kept;
  metrics["rollout/partial_rollout/recycled_groups"] = static_cast<double>(t.recycled);
  if (options_.regenerate_older_than) {
    metrics["rollout/partial_rollout/regenerated_samples"] = static_cast<double>(t.regenerated);
  }
  metrics["rollout/aborted_samples"] = static_cast<double>(t.aborted_samples);
  for (const auto& [k, v] : t.recovery_metrics) metrics[k] = v;
  int64_t num_samples = 0;
  for (const auto& g : result->groups) num_samples += static_cast<int64_t>(g.size());
  metrics["rollout/samples"] = static_cast<double>(num_samples);
  if (recovery_enabled_) metrics["rollout/retried_groups"] = static_cast<double>(t.retried_groups);
  metrics["perf/rollout_time"] = elapsed;
  metrics["perf/tokens_per_sec"] =
      elapsed > 0 ? static_cast<double>(run.response_tokens.load()) / elapsed : 0;
  int64_t longest = 0;
  for (const auto& g : result->groups) {
    for (const auto& s : g) longest = std::max(longest, s.response_length);
  }
  metrics["perf/longest_sample_tokens_per_sec"] =
      elapsed > 0 ? static_cast<double>(longest) / elapsed : 0;
}

StatusOr<EvalResult> RolloutCoordinator::Eval(int64_t rollout_id) {
  SLIME_RETURN_IF_ERROR(CheckConfigured());
  auto run = std::make_shared<Run>();
  run->rollout_id = rollout_id;
  run->eval = true;
  run->reward = reward_;
  std::vector<std::pair<const EvalDataset*, Job*>> jobs;
  for (const EvalDataset& d : eval_datasets_) {
    for (size_t p = 0; p < d.prompts.size(); ++p) {
      auto job = std::make_unique<Job>();
      for (int j = 0; j < d.n_samples; ++j) {
        data::Sample s = d.prompts[p];
        s.group_index = static_cast<int64_t>(p);
        s.index = static_cast<int64_t>(p) * d.n_samples + j;
        s.rollout_id = rollout_id;
        job->group.push_back(std::move(s));
      }
      job->sampling = &d.sampling;
      job->rm_type = d.rm_type;
      job->reward_key = d.reward_key;
      job->custom = d.custom_generator.get();
      run->samples_target += d.n_samples;
      run->jobs.push_back(std::move(job));
      jobs.emplace_back(&d, run->jobs.back().get());
    }
  }
  RecoverReplacedEngines();
  for (auto& [d, job] : jobs) SubmitJob(run, job, rollout_id);
  Status failure;
  for (size_t finished = 0; finished < jobs.size() && failure.ok();) {
    Job* job = WaitDone(run.get());
    if (job == nullptr) {
      failure = RecoveryFailure();
    } else if (!job->error.ok()) {
      failure = job->error;
    } else if (std::lock_guard<std::mutex> lock(cancel_mu_); cancelled_) {
      failure = absl::CancelledError("the eval was cancelled: the job is stopping");
    } else if (job->retry) {
      RestartJob(run, job, rollout_id);
    } else {
      ++finished;
    }
  }
  MetricMap recovery_metrics;  // not reported for an eval
  SLIME_RETURN_IF_ERROR(EndRun(run, failure, &recovery_metrics));

  EvalResult result;
  result.rollout_id = rollout_id;
  for (auto& [d, job] : jobs) result.datasets[d->name].push_back(std::move(job->group));
  for (const auto& [name, groups] : result.datasets) {
    for (const auto& [k, v] : EvalMetrics(name, groups)) result.metrics[k] = v;
  }
  return result;
}

}  // namespace slime::rollout
