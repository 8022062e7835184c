// The worker: one actor process (`slime_train worker --head H:P --actor ID`), started by a node
// agent.
//
// Start(): bring up the Worker gRPC service on a free port of `bind_host`, register with the
// head (RegisterWorker, retried until head_lost_timeout), receive the ActorSpec and the job's
// resolved config, and start the actor thread, which first creates the actor from the registry
// and then runs calls one at a time in arrival order. Calls that arrive while the actor is
// still being created wait in the queue.
//
// Request ids: the worker remembers the last `dedup_capacity` request ids. A call whose id is
// being executed waits for that execution's result; a call whose id has finished gets the
// stored reply. So a retried call never runs twice while this process lives.
//
// Ending: Run() returns when the head calls Shutdown (exit code 0), RequestStop() is called
// (0, e.g. on SIGTERM), the actor factory fails (1), the head says it no longer knows this
// incarnation (1), or no heartbeat got through for head_lost_timeout (1). The process was also
// started with PR_SET_PDEATHSIG by its agent, so it dies with the agent.
//
// Threads: gRPC callback threads (handlers only enqueue), the actor thread, the heartbeat
// thread. Public methods are thread-safe.
#ifndef SLIME_RUNTIME_WORKER_H_
#define SLIME_RUNTIME_WORKER_H_

#include <memory>
#include <string>

#include "slime/common/status.h"
#include "slime/runtime/actor.h"

namespace slime::runtime {

struct WorkerOptions {
  std::string head_address;
  std::string actor_id;
  int64_t incarnation = 1;
  std::string token;
  std::string bind_host = "127.0.0.1";
  int max_message_bytes = 64 << 20;
  size_t dedup_capacity = 1024;
  const ActorRegistry* registry = nullptr;  // must outlive the worker
};

class Worker {
 public:
  static StatusOr<std::unique_ptr<Worker>> Start(const WorkerOptions& options);
  ~Worker();

  // Blocks until the worker should end; returns the process exit code (see above).
  int Run();
  void RequestStop();

  const std::string& address() const;
  const slime::v1::ActorSpec& spec() const;
  const std::string& resolved_config() const;

  class Impl;

 private:
  explicit Worker(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace slime::runtime

#endif  // SLIME_RUNTIME_WORKER_H_
