// The engines' health checks (internal to the job module): slime's RolloutHealthMonitor with
// fault_tolerance.health_check_{first_wait,interval,timeout}.
//
// One thread per monitor. Start() starts the clock: the first check is due health_check_first_wait
// seconds later, and after every round of checks the next one is due health_check_interval
// seconds after that round ended. A due round runs only while the monitor is active — between
// Resume() and Pause(), which the driver calls around each generation and evaluation (slime
// resumes its monitor at generate/eval and pauses it for offload and weight sync, when engines
// are legitimately unresponsive); a round due while paused runs at the next Resume. A round
// sends GET /health_generate to every engine of targets() in turn (a one-token forward on the
// engine, docs/http-api.md), each waited for at most health_check_timeout seconds; an engine
// that does not answer 200 in time is handed to on_unhealthy (the driver kills its worker so the
// runtime restarts it, as slime kills the engine actor) and the round goes on.
//
// Threads: Resume, Pause and Stop may be called from any thread; the callbacks run on the
// monitor's thread. Resume/Pause nest (checks run while resumes outnumber pauses).
#ifndef SLIME_SRC_JOB_ENGINE_HEALTH_H_
#define SLIME_SRC_JOB_ENGINE_HEALTH_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"

namespace slime::job {

struct EngineHealthTarget {
  std::string name;         // for messages: the actor id, or the address of an external engine
  std::string address;      // host:port
  int64_t incarnation = 0;  // the engine process the check is about (opaque to the monitor)
};

struct EngineHealthOptions {
  double first_wait_s = 0.0;  // fault_tolerance.health_check_first_wait
  double interval_s = 30.0;   // fault_tolerance.health_check_interval
  double timeout_s = 30.0;    // fault_tolerance.health_check_timeout
  std::string bearer_token;   // the engines' access key (config::EngineAccessToken), or ""
  // The engines to check, asked at every round (addresses change when engines restart).
  std::function<std::vector<EngineHealthTarget>()> targets;
  // An engine failed a check: `why` says how (the HTTP status and body, or the client error).
  std::function<void(const EngineHealthTarget& engine, const std::string& why)> on_unhealthy;
};

class EngineHealthMonitor {
 public:
  explicit EngineHealthMonitor(EngineHealthOptions options);
  ~EngineHealthMonitor();  // Stop(), then joins the thread
  EngineHealthMonitor(const EngineHealthMonitor&) = delete;
  EngineHealthMonitor& operator=(const EngineHealthMonitor&) = delete;

  // Starts the thread (once); the first round is due first_wait_s from now.
  void Start();
  void Resume();
  void Pause();
  // Tells the thread to end, interrupting any wait, and returns at once (safe from a signal
  // handler's thread); a check in flight finishes within timeout_s and runs no callback.
  void Stop();

  // Resume() for its lifetime; a null monitor does nothing.
  class ActiveScope {
   public:
    explicit ActiveScope(EngineHealthMonitor* monitor) : monitor_(monitor) {
      if (monitor_ != nullptr) monitor_->Resume();
    }
    ~ActiveScope() {
      if (monitor_ != nullptr) monitor_->Pause();
    }
    ActiveScope(const ActiveScope&) = delete;
    ActiveScope& operator=(const ActiveScope&) = delete;

   private:
    EngineHealthMonitor* monitor_;
  };

  // Rounds run and checks failed so far (for logs and tests).
  int64_t rounds() const;
  int64_t failures() const;

 private:
  using Clock = std::chrono::steady_clock;
  void Loop();
  // One check of `engine`: empty when healthy, else why not.
  std::string Check(const EngineHealthTarget& engine) const;

  const EngineHealthOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int active_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  Clock::time_point next_due_ ABSL_GUARDED_BY(mu_);
  int64_t rounds_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t failures_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace slime::job

#endif  // SLIME_SRC_JOB_ENGINE_HEALTH_H_
