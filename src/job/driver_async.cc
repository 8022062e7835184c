// The one-step-off-policy loop (driver_async.h).
#include "driver_async.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <future>
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
      Generated g;
      g.rollout_id = rollout_id;
      g.start_s = start_s;
      g.result = steps->GenerateRollout(rollout_id);
      g.end_s = UnixNow();
      return g;
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

std::optional<std::pair<double, double>> WeightStaleness(const rollout::RolloutResult& result) {
  double max = 0, sum = 0;
  int64_t n = 0;
  for (const data::SampleGroup& group : result.groups) {
    for (const data::Sample& s : group) {
      std::optional<int64_t> oldest;
      for (const std::string& v : s.weight_versions) {
        int64_t version = 0;
        const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), version);
        if (ec != std::errc() || end != v.data() + v.size()) continue;
        oldest = oldest ? std::min(*oldest, version) : version;
      }
      if (!oldest) continue;
      const double lag = static_cast<double>(result.rollout_id - *oldest);
      max = n == 0 ? lag : std::max(max, lag);
      sum += lag;
      ++n;
    }
  }
  if (n == 0) return std::nullopt;
  return std::make_pair(max, sum / static_cast<double>(n));
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
    if (auto staleness = WeightStaleness(result)) {
      values["rollout/weight_staleness/max"] = staleness->first;
      values["rollout/weight_staleness/mean"] = staleness->second;
    }
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
      SLIME_RETURN_IF_ERROR(steps->UpdateWeights(rollout_id, &values));
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

}  // namespace slime::job
