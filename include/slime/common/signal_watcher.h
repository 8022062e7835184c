// SignalWatcher: delivers SIGINT, SIGTERM and SIGUSR1 to a handler on a thread of its own, so a
// long-running command (the driver, an agent, a worker) reacts to Ctrl-C or a SLURM SIGTERM
// without async-signal-safety concerns.
//
// Construct it on the main thread BEFORE any other thread starts: it blocks those signals in the
// calling thread, and threads started later inherit the mask, so only the watcher's sigwait
// receives them. SIGUSR2 is reserved (the destructor uses it to stop the watcher).
// Threads: SetHandler and last_signal may be called from any thread; the handler runs on the
// watcher thread and must not destroy the watcher.
#ifndef SLIME_COMMON_SIGNAL_WATCHER_H_
#define SLIME_COMMON_SIGNAL_WATCHER_H_

#include <signal.h>

#include <functional>
#include <mutex>
#include <thread>

namespace slime {

class SignalWatcher {
 public:
  SignalWatcher();
  ~SignalWatcher();
  SignalWatcher(const SignalWatcher&) = delete;
  SignalWatcher& operator=(const SignalWatcher&) = delete;

  // Replaces the handler (nullptr: signals are only recorded).
  void SetHandler(std::function<void(int)> handler);
  // The last SIGINT or SIGTERM received (SIGUSR1 is not recorded); 0 when none.
  int last_signal();

 private:
  sigset_t set_;
  std::mutex mu_;
  std::function<void(int)> handler_;
  int last_ = 0;
  std::thread thread_;
};

}  // namespace slime

#endif  // SLIME_COMMON_SIGNAL_WATCHER_H_
