// Custom generation in the rollout coordinator (coordinator.h, custom_generate.h): the engine
// session over the EnginePool, one task per sample on a bounded pool, segments replacing the
// sample, rewards from the generator or the reward model, and the reward post-processing of
// groups whose size changed.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <future>
#include <set>

#include "coordinator_internal.h"
#include "request.h"
#include "slime/common/check.h"
#include "slime/reward/reward.h"

namespace slime::rollout {

// ---------------------------------------------------------------------------------------------
// TaskPool

RolloutCoordinator::TaskPool::~TaskPool() {
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    threads.swap(threads_);
  }
  cv_.notify_all();
  for (auto& t : threads) t.join();
}

void RolloutCoordinator::TaskPool::Post(std::function<void()> task) {
  std::lock_guard<std::mutex> lock(mu_);
  queue_.push_back(std::move(task));
  if (idle_ == 0 && static_cast<int>(threads_.size()) < max_threads_) {
    threads_.emplace_back([this] { Main(); });
  } else {
    cv_.notify_one();
  }
}

void RolloutCoordinator::TaskPool::Main() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    if (queue_.empty()) {
      if (stopping_) return;
      ++idle_;
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      --idle_;
      continue;
    }
    std::function<void()> task = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    task();
    lock.lock();
  }
}

namespace {

// EngineSession over one engine of the pool, for one sample of a run (custom_generate.h).
class PoolSession : public EngineSession {
 public:
  PoolSession(EnginePool* pool, int engine, const SamplingOptions* sampling, absl::Mutex* run_mu,
              const bool* run_aborting, std::string rid_prefix, bool retry_lost,
              std::atomic<int64_t>* response_tokens, std::atomic<int64_t>* attempt_tokens)
      : pool_(pool),
        engine_(engine),
        sampling_(sampling),
        run_mu_(run_mu),
        run_aborting_(run_aborting),
        rid_prefix_(std::move(rid_prefix)),
        retry_lost_(retry_lost),
        response_tokens_(response_tokens),
        attempt_tokens_(attempt_tokens) {}

  StatusOr<GenerateTurn> Generate(std::span<const int32_t> input_ids,
                                  const nlohmann::json& overrides) override {
    if (aborting()) return AbortTurn();
    if (!overrides.is_null() && !overrides.is_object()) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: sampling overrides must be a JSON object, got {}", rid_prefix_, overrides.dump()));
    }
    // The rollout's request for these ids (max_new_tokens from max_response_len and what the
    // context leaves), then the generator's overrides on top.
    data::Sample probe;
    probe.tokens.assign(input_ids.begin(), input_ids.end());
    const std::string rid = fmt::format("{}-{}", rid_prefix_, calls_++);
    std::optional<nlohmann::json> body =
        internal::BuildGenerateRequest(&probe, *sampling_, rid, std::nullopt);
    if (!body) {  // no room left in the context: nothing to ask
      GenerateTurn t;
      t.finish_reason = "length";
      return t;
    }
    if (overrides.is_object()) {
      for (const auto& [k, v] : overrides.items()) (*body)["sampling_params"][k] = v;
    }
    // A custom generate function's turns carry no routing (docs/algorithms.md, "Routing
    // replay"): its samples are assembled by the function, not from these rows.
    body->erase("return_routed_experts");
    body->erase("routed_experts_start_len");
    auto promise = std::make_shared<std::promise<StatusOr<nlohmann::json>>>();
    std::future<StatusOr<nlohmann::json>> answer = promise->get_future();
    pool_->Reserve(engine_, 1);
    pool_->Submit(engine_, std::move(*body),
                  [promise](StatusOr<nlohmann::json> r) { promise->set_value(std::move(r)); });
    StatusOr<nlohmann::json> r = answer.get();
    if (!r.ok()) {
      if (absl::IsCancelled(r.status()) && aborting()) return AbortTurn();
      if (retry_lost_ && absl::IsUnavailable(r.status())) lost_ = true;
      return r.status();
    }
    data::Sample out;
    out.index = probe.index;
    Status applied = internal::ApplyGenerateResponse(*r, &out);
    if (!applied.ok()) {
      return absl::InternalError(fmt::format("{} on engine {}: {}", rid, engine_address(),
                                             std::string(applied.message())));
    }
    GenerateTurn t;
    t.output_ids = std::move(out.tokens);
    t.log_probs = std::move(out.rollout_log_probs);
    if (t.log_probs.size() != t.output_ids.size()) t.log_probs.assign(t.output_ids.size(), 0.0f);
    t.text = std::move(out.response);
    t.weight_version = out.weight_versions.empty() ? "" : out.weight_versions.front();
    t.finish_reason = out.status == data::SampleStatus::kCompleted   ? "stop"
                      : out.status == data::SampleStatus::kTruncated ? "length"
                                                                     : "abort";
    *response_tokens_ += static_cast<int64_t>(t.output_ids.size());
    *attempt_tokens_ += static_cast<int64_t>(t.output_ids.size());
    return t;
  }

  const SamplingOptions& sampling() const override { return *sampling_; }
  bool aborting() const override {
    absl::MutexLock lock(run_mu_);
    return *run_aborting_;
  }
  std::string engine_address() const override { return pool_->address(engine_).ToString(); }
  std::string request_id() const override { return rid_prefix_; }

  bool lost() const { return lost_; }

 private:
  static GenerateTurn AbortTurn() {
    GenerateTurn t;
    t.finish_reason = "abort";
    return t;
  }

  EnginePool* pool_;
  int engine_;
  const SamplingOptions* sampling_;
  absl::Mutex* run_mu_;
  const bool* run_aborting_;  // guarded by *run_mu_
  std::string rid_prefix_;
  bool retry_lost_;
  std::atomic<int64_t>* response_tokens_;
  std::atomic<int64_t>* attempt_tokens_;
  int64_t calls_ = 0;
  bool lost_ = false;
};

// Checks one sample's result and puts its segments in order: group_index and rollout id of the
// input, fresh indices after the first, metadata["segment"] when there are several.
Status CheckSegments(const data::Sample& input, const std::string& kind,
                     std::atomic<int64_t>* next_index, CustomGenerateResult* result) {
  if (result->segments.empty()) {
    return absl::InternalError(fmt::format(
        "sample {}: the {} custom generator returned no segment (at least one is required)",
        input.index, kind));
  }
  const bool several = result->segments.size() > 1;
  for (size_t k = 0; k < result->segments.size(); ++k) {
    data::Sample& s = result->segments[k];
    s.group_index = input.group_index;
    s.rollout_id = input.rollout_id;
    s.index = k == 0 ? input.index : next_index->fetch_add(1);
    if (several) s.metadata["segment"] = static_cast<int64_t>(k);
    if (Status v = s.Validate(); !v.ok()) {
      return absl::InternalError(fmt::format("sample {}: segment {} of the {} custom generator: {}",
                                             input.index, k, kind, std::string(v.message())));
    }
  }
  return absl::OkStatus();
}

// The group's segments in place of its samples, then the reward model for the segments the
// generator did not reward. Runs on the task of the group's last sample.
Status FinishCustomGroup(reward::RewardModel* reward, const std::string& rm_type,
                         const std::string& reward_key, std::vector<CustomGenerateResult>* results,
                         data::SampleGroup* group) {
  data::SampleGroup expanded;
  std::vector<bool> rewarded;
  for (size_t j = 0; j < group->size(); ++j) {
    CustomGenerateResult& r = (*results)[j];
    if (r.segments.empty()) {  // not generated here (already finished)
      expanded.push_back(std::move((*group)[j]));
      rewarded.push_back(false);
      continue;
    }
    for (auto& seg : r.segments) {
      expanded.push_back(std::move(seg));
      rewarded.push_back(r.rewarded);
    }
  }
  results->clear();
  bool aborted = false;
  for (const auto& s : expanded) aborted = aborted || s.status == data::SampleStatus::kAborted;
  *group = std::move(expanded);
  if (aborted) return absl::OkStatus();  // cut short: dropped, never scored
  data::SampleGroup unscored;
  std::vector<size_t> where;
  for (size_t i = 0; i < group->size(); ++i) {
    if (rewarded[i]) continue;
    unscored.push_back((*group)[i]);
    where.push_back(i);
  }
  if (unscored.empty()) return absl::OkStatus();
  SLIME_RETURN_IF_ERROR(internal::ScoreGroup(reward, rm_type, reward_key, &unscored));
  for (size_t i = 0; i < where.size(); ++i) {
    (*group)[where[i]].reward = unscored[i].reward;
    (*group)[where[i]].raw_reward = std::move(unscored[i].raw_reward);
  }
  return absl::OkStatus();
}

}  // namespace

void RolloutCoordinator::SubmitCustomJob(const std::shared_ptr<Run>& run, Job* job,
                                         int64_t rollout_id) {
  static std::atomic<uint64_t> rid_counter{0};
  SLIME_CHECK(custom_pool_ != nullptr, "custom generation without a task pool");
  std::vector<size_t> todo;
  for (size_t j = 0; j < job->group.size(); ++j) {
    if (internal::NeedsGeneration(job->group[j])) todo.push_back(j);
  }
  job->custom_results.assign(job->group.size(), CustomGenerateResult{});
  if (todo.empty()) {  // nothing to generate (a finished group): score it now
    Status st = internal::FinishGroup(run->reward, run->teacher, job->rm_type, job->reward_key,
                                      &job->group);
    absl::MutexLock lock(&run->mu);
    job->error = st;
    run->done.push_back(job);
    return;
  }
  const int engine = pool_->PickEngine(0);
  const std::string engine_name = pool_->address(engine).ToString();
  {
    absl::MutexLock lock(&run->mu);
    job->calls_left = static_cast<int>(todo.size());
    run->calls_out += static_cast<int64_t>(todo.size());
  }
  EnginePool* pool = pool_.get();
  std::atomic<int64_t>* next_index = &next_segment_index_;
  const bool retry_lost = recovery_enabled_;
  for (size_t j : todo) {
    data::Sample& s = job->group[j];
    s.status = data::SampleStatus::kPending;
    s.metadata["engine"] = engine_name;
    const std::string rid = fmt::format("slime-{}{}-{}-{}", run->eval ? "eval" : "rollout",
                                        rollout_id, s.index, rid_counter.fetch_add(1));
    custom_pool_->Post([run, job, j, engine, rid, pool, next_index, retry_lost] {
      data::Sample& s = job->group[j];
      CustomGenerateResult& result = job->custom_results[j];
      Status st;
      bool lost = false;
      bool aborting = false;
      {
        absl::MutexLock lock(&run->mu);
        aborting = run->aborting;
      }
      if (aborting) {  // queued until the rollout was full: never started
        s.status = data::SampleStatus::kAborted;
        result.segments = {s};
      } else {
        PoolSession session(pool, engine, job->sampling, &run->mu, &run->aborting, rid,
                            retry_lost, &run->response_tokens, &job->attempt_tokens);
        StatusOr<CustomGenerateResult> r;
        try {
          r = job->custom->Generate(s, &session);
        } catch (const std::exception& e) {
          r = absl::InternalError(fmt::format("threw: {}", e.what()));
        }
        lost = session.lost();
        if (lost) {
          // The engine is being recovered: the group starts over (the generator's error,
          // if any, was this loss).
        } else if (!r.ok()) {
          st = Status(r.status().code(),
                      fmt::format("sample {} ({} custom generator, engine {}): {}", s.index,
                                  job->custom->kind(), session.engine_address(),
                                  std::string(r.status().message())));
        } else {
          result = *std::move(r);
          st = CheckSegments(s, job->custom->kind(), next_index, &result);
          if (st.ok()) {
            run->samples_done += 1;
            job->attempt_samples += 1;
          }
        }
      }
      const Run::CallEnd end = run->EndCall(job, st, lost);
      st = end.error;
      if (end.last) {
        if (st.ok() && !end.retry) {
          st = FinishCustomGroup(run->reward, job->rm_type, job->reward_key,
                                 &job->custom_results, &job->group);
          if (st.ok() && !end.aborting && run->teacher != nullptr) {
            st = run->teacher->ScoreGroup(&job->group);  // custom groups cut short are dropped
          }
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

namespace internal {

StatusOr<std::vector<double>> PostProcessRewards(const std::vector<data::SampleGroup>& groups,
                                                 const std::vector<double>& raw_rewards,
                                                 const reward::GroupRewardOptions& options) {
  bool fixed = true;
  for (const auto& g : groups) {
    fixed = fixed && static_cast<int>(g.size()) == options.n_samples_per_prompt;
  }
  if (fixed) {
    SLIME_ASSIGN_OR_RETURN(reward::NormalizedRewards n,
                           reward::NormalizeGroupRewards(raw_rewards, options));
    return std::move(n.rewards);
  }
  SLIME_ASSIGN_OR_RETURN(reward::GroupRewardNormalization norm,
                         reward::GroupRewardNormalizationFor(options));
  std::vector<double> out;
  out.reserve(raw_rewards.size());
  size_t i = 0;
  for (const auto& g : groups) {
    std::vector<double> parents;
    for (size_t k = 0; k < g.size(); ++k) {
      const auto seg = g[k].metadata.find("segment");
      const bool parent = seg == g[k].metadata.end() || !seg->is_number_integer() ||
                          seg->get<int64_t>() == 0;
      if (parent) parents.push_back(raw_rewards.at(i + k));
    }
    if (parents.empty()) {  // every sample is a later segment (cannot happen): all count
      parents.assign(raw_rewards.begin() + static_cast<std::ptrdiff_t>(i),
                     raw_rewards.begin() + static_cast<std::ptrdiff_t>(i + g.size()));
    }
    double mean = 0;
    for (double r : parents) mean += r;
    mean /= static_cast<double>(parents.size());
    const double std = reward::SampleStd(parents);
    for (size_t k = 0; k < g.size(); ++k, ++i) {
      const double r = raw_rewards.at(i);
      if (!std::isfinite(r)) {
        return absl::InvalidArgumentError(
            fmt::format("reward {} of sample {} is not finite", r, g[k].index));
      }
      switch (norm) {
        case reward::GroupRewardNormalization::kNone:
          out.push_back(r);
          break;
        case reward::GroupRewardNormalization::kMean:
          out.push_back(r - mean);
          break;
        case reward::GroupRewardNormalization::kMeanStd:
          out.push_back((r - mean) / (std + options.std_epsilon));
          break;
      }
    }
  }
  return out;
}

StatusOr<RolloutResult> ResultOfGroups(int64_t rollout_id, std::vector<data::SampleGroup> groups,
                                       const reward::GroupRewardOptions& options) {
  RolloutResult result;
  result.rollout_id = rollout_id;
  result.groups = std::move(groups);
  for (auto& g : result.groups) {
    for (auto& s : g) {
      s.rollout_id = rollout_id;
      result.raw_rewards.push_back(s.reward);
    }
  }
  SLIME_ASSIGN_OR_RETURN(result.rewards,
                         PostProcessRewards(result.groups, result.raw_rewards, options));
  return result;
}

}  // namespace internal
}  // namespace slime::rollout
