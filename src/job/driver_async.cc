// The asynchronous loops (driver_async.h).
#include "driver_async.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <future>
#include <mutex>
#include <thread>
#include <utility>

#include "slime/common/check.h"

namespace slime::job {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// One finished generation and when it ran.
struct Generated {
  int64_t rollout_id = -1;
  StatusOr<rollout::RolloutResult> result = absl::UnknownError("not generated");
  double start_s = 0;  // Unix times
  double end_s = 0;
};

// Rollout `rollout_id` generated on this thread, timed from `start_s` (Unix seconds).
Generated GenerateTimed(RolloutSteps* steps, int64_t rollout_id, double start_s) {
  Generated g;
  g.rollout_id = rollout_id;
  g.start_s = start_s;
  g.result = steps->GenerateRollout(rollout_id);
  g.end_s = UnixNow();
  return g;
}

// At most one generation in flight on a thread of its own. The destructor cancels and joins a
// generation still running, so no thread outlives the loop (and the coordinator it uses).
class Prefetch {
 public:
  explicit Prefetch(RolloutSteps* steps) : steps_(steps) {}
  ~Prefetch() {
    if (future_.valid()) {
      steps_->CancelGeneration();
      future_.wait();
    }
  }
  Prefetch(const Prefetch&) = delete;
  Prefetch& operator=(const Prefetch&) = delete;

  void Start(int64_t rollout_id) {
    SLIME_CHECK(!future_.valid(), "a generation is already in flight");
    const double start_s = UnixNow();  // here, so it orders before what the caller does next
    future_ = std::async(std::launch::async, [steps = steps_, rollout_id, start_s] {
      return GenerateTimed(steps, rollout_id, start_s);
    });
  }
  bool running() const { return future_.valid(); }
  // Blocks until the generation in flight is done; `*waited_s` += the seconds it blocked.
  Generated Wait(double* waited_s) {
    SLIME_CHECK(future_.valid(), "no generation in flight");
    const auto start = Clock::now();
    Generated g = future_.get();
    *waited_s += Since(start);
    return g;
  }

 private:
  RolloutSteps* steps_;
  std::future<Generated> future_;
};

}  // namespace

std::optional<Staleness> WeightStaleness(const rollout::RolloutResult& result) {
  Staleness st;
  double sum = 0;
  int64_t n = 0;
  for (const data::SampleGroup& group : result.groups) {
    for (const data::Sample& s : group) {
      const std::optional<int64_t> oldest = s.OldestWeightVersion();
      if (!oldest || s.remove_sample) continue;
      const double lag = static_cast<double>(result.rollout_id - *oldest);
      st.max = n == 0 ? lag : std::max(st.max, lag);
      st.min = n == 0 ? lag : std::min(st.min, lag);
      sum += lag;
      ++n;
      if (s.weight_version_tokens.size() != s.weight_versions.size()) continue;
      for (size_t i = 0; i < s.weight_versions.size(); ++i) {
        const std::string& v = s.weight_versions[i];
        int64_t version = 0;
        const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), version);
        if (ec != std::errc() || end != v.data() + v.size()) continue;
        st.tokens_by_lag[result.rollout_id - version] += s.weight_version_tokens[i];
      }
    }
  }
  if (n == 0) return std::nullopt;
  st.mean = sum / static_cast<double>(n);
  return st;
}

void AddStalenessMetrics(const Staleness& staleness, MetricValues* values) {
  (*values)["rollout/weight_staleness/min"] = staleness.min;
  (*values)["rollout/weight_staleness/max"] = staleness.max;
  (*values)["rollout/weight_staleness/mean"] = staleness.mean;
  for (const auto& [lag, tokens] : staleness.tokens_by_lag) {
    (*values)[fmt::format("rollout/tokens_by_staleness/{}", lag)] = static_cast<double>(tokens);
  }
}

int64_t DropStaleSamples(int64_t max_staleness, rollout::RolloutResult* result) {
  int64_t dropped = 0;
  for (data::SampleGroup& group : result->groups) {
    for (data::Sample& s : group) {
      const std::optional<int64_t> oldest = s.OldestWeightVersion();
      if (!oldest || result->rollout_id - *oldest <= max_staleness || s.remove_sample) continue;
      s.remove_sample = true;
      ++dropped;
    }
  }
  return dropped;
}

Status RunAsyncLoop(int64_t start_rollout_id, int64_t num_rollout, RolloutSteps* steps) {
  if (start_rollout_id >= num_rollout) return absl::OkStatus();
  Prefetch prefetch(steps);
  prefetch.Start(start_rollout_id);
  std::optional<Generated> ready;  // rollout k+1, when a sync or eval already waited for it
  double prev_train_start_s = 0, prev_train_end_s = 0;
  bool have_prev_train = false;
  for (int64_t rollout_id = start_rollout_id; rollout_id < num_rollout; ++rollout_id) {
    if (steps->Stopped()) return absl::CancelledError("stopped by a signal");
    const auto step_start = Clock::now();
    MetricValues values;
    // 1. Rollout k: generated in the background since the previous iteration.
    double waited_s = 0;
    Generated current = ready ? *std::move(ready) : prefetch.Wait(&waited_s);
    ready.reset();
    SLIME_CHECK(current.rollout_id == rollout_id, "got rollout {} for {}", current.rollout_id,
                rollout_id);
    SLIME_RETURN_IF_ERROR(current.result.status());
    const rollout::RolloutResult& result = *current.result;
    // 2. The state a checkpoint of k keeps, before k+1 draws its prompts; then start k+1.
    const RolloutSideState state = steps->CaptureState();
    if (rollout_id + 1 < num_rollout) prefetch.Start(rollout_id + 1);

    SLIME_RETURN_IF_ERROR(steps->ProcessRollout(rollout_id, result, &values));
    values["perf/rollout_time"] = current.end_s - current.start_s;
    values["perf/rollout_wait_time"] = waited_s;
    values["timeline/generate_start_s"] = current.start_s;
    values["timeline/generate_end_s"] = current.end_s;
    if (have_prev_train) {
      values["perf/rollout_train_overlap_time"] =
          std::max(0.0, std::min(current.end_s, prev_train_end_s) -
                            std::max(current.start_s, prev_train_start_s));
    }
    if (auto staleness = WeightStaleness(result)) AddStalenessMetrics(*staleness, &values);
    // 3. Train and save k while k+1 generates.
    const double train_start_s = UnixNow();
    SLIME_RETURN_IF_ERROR(steps->Train(rollout_id, result, &values));
    const double train_end_s = UnixNow();
    values["timeline/train_start_s"] = train_start_s;
    values["timeline/train_end_s"] = train_end_s;
    prev_train_start_s = train_start_s;
    prev_train_end_s = train_end_s;
    have_prev_train = true;
    SLIME_RETURN_IF_ERROR(steps->Save(rollout_id, state, &values));
    // 4. Weight sync: never while the engines generate.
    if (steps->SyncDue(rollout_id)) {
      if (prefetch.running()) {
        double w = 0;
        ready = prefetch.Wait(&w);
        values["perf/update_weights_wait_time"] = w;
        SLIME_RETURN_IF_ERROR(ready->result.status());
      }
      SLIME_RETURN_IF_ERROR(steps->UpdateWeights(rollout_id, EngineRequests::kAbort, &values));
    }
    // 5. Eval: the coordinator runs one generate or eval at a time.
    if (steps->EvalDue(rollout_id)) {
      if (prefetch.running()) {
        double w = 0;
        ready = prefetch.Wait(&w);
        values["perf/eval_wait_time"] = w;
        SLIME_RETURN_IF_ERROR(ready->result.status());
      }
      SLIME_RETURN_IF_ERROR(steps->Evaluate(rollout_id, &values));
    }
    values["perf/step_time"] = Since(step_start);
    SLIME_RETURN_IF_ERROR(steps->Report(rollout_id, values));
  }
  return absl::OkStatus();
}

namespace {

// One rollout the producer finished, with the rollout-side state after it was drawn.
struct Produced {
  Generated generated;
  RolloutSideState state;
  int64_t admitted_version = 0;  // the engines' weights when it started
  double producer_wait_s = 0;    // the producer's wait on the bound before it
};

// The fully asynchronous loop's producer thread (driver_async.h): generations one after another
// under the staleness bound, evals between them. The destructor stops it: the generation in
// flight is cancelled and the thread joined.
class Producer {
 public:
  Producer(RolloutSteps* steps, int64_t start, int64_t num_rollout, int64_t max_staleness)
      : steps_(steps), num_rollout_(num_rollout), max_staleness_(max_staleness), version_(start),
        next_(start) {
    thread_ = std::thread([this] { Run(); });
  }
  ~Producer() {
    bool generating = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      generating = generating_;
    }
    cv_.notify_all();
    if (generating) steps_->CancelGeneration();
    thread_.join();
  }
  Producer(const Producer&) = delete;
  Producer& operator=(const Producer&) = delete;

  // Blocks until rollout `rollout_id` is done (the producer makes them in order); `*waited_s`:
  // the seconds it blocked; `*depth`: the finished rollouts queued when it was taken.
  Produced Take(int64_t rollout_id, double* waited_s, size_t* depth) {
    const auto start = Clock::now();
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !done_.empty(); });
    *waited_s = Since(start);
    *depth = done_.size();
    Produced p = std::move(done_.front());
    done_.pop_front();
    SLIME_CHECK(p.generated.rollout_id == rollout_id, "got rollout {} for {}",
                p.generated.rollout_id, rollout_id);
    return p;
  }
  // The engines hold weight version `version` now: rollouts up to version + max_staleness may
  // start.
  void SetVersion(int64_t version) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      version_ = version;
    }
    cv_.notify_all();
  }
  // The producer runs Evaluate(rollout_id) before its next generation.
  void RequestEval(int64_t rollout_id) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      evals_.push_back(rollout_id);
    }
    cv_.notify_all();
  }
  // Blocks until no eval is asked for or running; `*waited_s` += the seconds it blocked. The
  // first failed eval's error.
  Status WaitForEvals(double* waited_s) {
    const auto start = Clock::now();
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return (evals_.empty() && !eval_running_) || stop_; });
    *waited_s += Since(start);
    return eval_status_;
  }

 private:
  void Run() {
    for (int64_t j = next_; j < num_rollout_; ++j) {
      Produced p;
      if (!Admit(j, &p.producer_wait_s, &p.admitted_version)) return;
      p.generated = GenerateTimed(steps_, j, UnixNow());
      {
        std::lock_guard<std::mutex> lock(mu_);
        generating_ = false;
      }
      const bool ok = p.generated.result.ok();
      if (ok) p.state = steps_->CaptureState();  // before rollout j+1 draws its prompts
      {
        std::lock_guard<std::mutex> lock(mu_);
        done_.push_back(std::move(p));
      }
      cv_.notify_all();
      if (!ok) break;  // the trainer reports it when it takes this rollout
    }
    // Every rollout is generated: evals go on until the loop ends.
    std::unique_lock<std::mutex> lock(mu_);
    double unused_s = 0;
    ServeEvals(lock, [] { return false; }, &unused_s);
  }

  // Serves evals until rollout j may start (j − version ≤ max_staleness), then marks it
  // generating under the same lock, so a stop from then on cancels it. False when stopped.
  // `*waited_s`: the seconds spent waiting on the bound; `*admitted`: the version it starts at.
  bool Admit(int64_t j, double* waited_s, int64_t* admitted) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!ServeEvals(lock, [&] { return j - version_ <= max_staleness_; }, waited_s)) return false;
    *admitted = version_;
    generating_ = true;
    return true;
  }

  // With `lock` (on mu_) held: runs asked-for evals until `ready()` holds, and returns true
  // with the lock held; false when stopped. `*waited_s` += the seconds spent waiting (evals not
  // counted).
  template <typename Ready>
  bool ServeEvals(std::unique_lock<std::mutex>& lock, Ready ready, double* waited_s) {
    while (true) {
      if (stop_) return false;
      if (!evals_.empty()) {
        const int64_t id = evals_.front();
        evals_.pop_front();
        eval_running_ = true;
        lock.unlock();
        MetricValues unused;
        Status s = steps_->Evaluate(id, &unused);
        lock.lock();
        eval_running_ = false;
        if (!s.ok() && eval_status_.ok()) eval_status_ = s;
        cv_.notify_all();
        continue;
      }
      if (ready()) return true;
      const auto start = Clock::now();
      cv_.wait(lock);
      *waited_s += Since(start);
    }
  }

  RolloutSteps* steps_;
  const int64_t num_rollout_;
  const int64_t max_staleness_;
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t version_;                 // guarded by mu_
  const int64_t next_;
  std::deque<Produced> done_;       // guarded by mu_
  std::deque<int64_t> evals_;       // guarded by mu_
  bool eval_running_ = false;       // guarded by mu_
  bool generating_ = false;         // guarded by mu_
  Status eval_status_;              // guarded by mu_
  bool stop_ = false;               // guarded by mu_
  std::thread thread_;              // last: started once the rest is set
};

}  // namespace

Status RunFullyAsyncLoop(int64_t start_rollout_id, int64_t num_rollout, int64_t max_staleness,
                         RolloutSteps* steps) {
  if (start_rollout_id >= num_rollout) return absl::OkStatus();
  SLIME_CHECK(max_staleness >= 0, "max_staleness {} < 0", max_staleness);
  Producer producer(steps, start_rollout_id, num_rollout, max_staleness);
  for (int64_t rollout_id = start_rollout_id; rollout_id < num_rollout; ++rollout_id) {
    if (steps->Stopped()) return absl::CancelledError("stopped by a signal");
    const auto step_start = Clock::now();
    MetricValues values;
    double waited_s = 0;
    size_t depth = 0;
    Produced p = producer.Take(rollout_id, &waited_s, &depth);
    SLIME_RETURN_IF_ERROR(p.generated.result.status());
    rollout::RolloutResult& result = *p.generated.result;
    const int64_t dropped = DropStaleSamples(max_staleness, &result);
    SLIME_RETURN_IF_ERROR(steps->ProcessRollout(rollout_id, result, &values));
    values["perf/rollout_time"] = p.generated.end_s - p.generated.start_s;
    values["perf/rollout_wait_time"] = waited_s;
    values["timeline/generate_start_s"] = p.generated.start_s;
    values["timeline/generate_end_s"] = p.generated.end_s;
    values["async/stale_samples_dropped"] = static_cast<double>(dropped);
    values["async/queue_depth"] = static_cast<double>(depth);
    values["async/admitted_version"] = static_cast<double>(p.admitted_version);
    values["async/producer_wait_time"] = p.producer_wait_s;
    if (auto staleness = WeightStaleness(result)) AddStalenessMetrics(*staleness, &values);
    const double train_start_s = UnixNow();
    SLIME_RETURN_IF_ERROR(steps->Train(rollout_id, result, &values));
    values["timeline/train_start_s"] = train_start_s;
    values["timeline/train_end_s"] = UnixNow();
    SLIME_RETURN_IF_ERROR(steps->Save(rollout_id, p.state, &values));
    if (steps->SyncDue(rollout_id)) {
      double w = 0;
      SLIME_RETURN_IF_ERROR(producer.WaitForEvals(&w));  // an eval sees one weight version
      values["perf/eval_wait_time"] = w;
      SLIME_RETURN_IF_ERROR(steps->UpdateWeights(rollout_id, EngineRequests::kKeep, &values));
      producer.SetVersion(rollout_id + 1);
    }
    if (steps->EvalDue(rollout_id)) producer.RequestEval(rollout_id);
    values["perf/step_time"] = Since(step_start);
    SLIME_RETURN_IF_ERROR(steps->Report(rollout_id, values));
  }
  double w = 0;
  return producer.WaitForEvals(&w);
}

}  // namespace slime::job
