// Records of the Head's tables (head.cc, head_health.cc, head_status.cc). Guarded by Head::mu_.
#ifndef SLIME_SRC_RUNTIME_HEAD_INTERNAL_H_
#define SLIME_SRC_RUNTIME_HEAD_INTERNAL_H_

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "slime/metrics/registry.h"
#include "slime/runtime/head.h"

namespace slime::runtime {

using Clock = std::chrono::steady_clock;

struct Head::NodeRecord {
  slime::v1::NodeInfo info;
  int index = 0;  // registration order
  bool alive = true;
  Clock::time_point last_heartbeat;
  std::shared_ptr<slime::v1::Agent::Stub> agent;
};

struct Head::ActorRecord {
  ActorOptions options;
  ActorState state = ActorState::kPending;
  // Mirror of `state` for metrics callbacks, which must not take the head's lock.
  std::shared_ptr<std::atomic<int>> state_metric = std::make_shared<std::atomic<int>>(0);
  int64_t incarnation = 0;   // of the current (or last) process
  int restarts = 0;
  int pid = 0;
  std::string address;
  std::shared_ptr<slime::v1::Worker::Stub> stub;
  std::string last_exit;
  Clock::time_point deadline;   // starting: registration due; restarting: next start
  Clock::time_point last_heartbeat;
  metrics::Counter* restarts_metric = nullptr;  // set once metrics are registered
  bool stop_requested = false;  // Shutdown() asked it to stop: its exit is not a failure
};

}  // namespace slime::runtime

#endif  // SLIME_SRC_RUNTIME_HEAD_INTERNAL_H_
