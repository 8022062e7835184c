#include "slime/common/signal_watcher.h"

#include <pthread.h>

namespace slime {

SignalWatcher::SignalWatcher() {
  sigemptyset(&set_);
  for (int sig : {SIGINT, SIGTERM, SIGUSR1, SIGUSR2}) sigaddset(&set_, sig);
  pthread_sigmask(SIG_BLOCK, &set_, nullptr);
  thread_ = std::thread([this] {
    while (true) {
      int sig = 0;
      if (sigwait(&set_, &sig) != 0) continue;
      if (sig == SIGUSR2) return;  // our own stop request
      std::function<void(int)> handler;
      {
        std::lock_guard<std::mutex> lock(mu_);
        handler = handler_;
        if (sig != SIGUSR1) last_ = sig;
      }
      if (handler) handler(sig);
    }
  });
}

SignalWatcher::~SignalWatcher() {
  pthread_kill(thread_.native_handle(), SIGUSR2);
  thread_.join();
}

void SignalWatcher::SetHandler(std::function<void(int)> handler) {
  std::lock_guard<std::mutex> lock(mu_);
  handler_ = std::move(handler);
}

int SignalWatcher::last_signal() {
  std::lock_guard<std::mutex> lock(mu_);
  return last_;
}

}  // namespace slime
