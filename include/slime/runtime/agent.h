// The node agent: starts and stops the worker processes of one node for the head.
//
// On the head node the agent runs in-process (the driver creates it next to the Head); on
// other nodes it is `slime_train agent --head HOST:PORT [--token-file F] [--node-name N]`.
// Start() serves the Agent gRPC service on `bind_host` and registers the node (name, agent
// address, GPUs or CPU slots) with the head, retrying while the head is not up yet.
//
// Workers: StartWorker re-executes `worker_binary worker --head H:P --actor ID` with the job
// token, incarnation and bind host in the environment, CUDA_VISIBLE_DEVICES set from the spec's
// devices (empty for CPU slots), the spec's extra environment, and stdout/stderr appended to
// the spec's log file. Each worker has its own process group and PR_SET_PDEATHSIG(SIGKILL),
// forked from the agent's supervisor thread, so workers die with the agent. The supervisor
// reaps exits and reports them (ReportExit) with a readable reason.
//
// No orphans: workers are killed (SIGTERM, SIGKILL after `stop_grace`) when the agent is
// destroyed or stopped, when the head stops answering heartbeats for head_lost_timeout, or when
// the head says it does not know this node (it restarted). Run() returns 1 in the last two cases.
//
// Threads: gRPC callback threads (handlers enqueue to the supervisor), the supervisor thread
// (fork, waitpid, kill), the heartbeat thread. Public methods are thread-safe.
#ifndef SLIME_RUNTIME_AGENT_H_
#define SLIME_RUNTIME_AGENT_H_

#include <memory>
#include <string>
#include <vector>

#include "slime/common/status.h"

namespace slime::runtime {

struct AgentOptions {
  std::string head_address;
  std::string token;
  std::string node_name;               // unique per job; empty = the host name
  std::string bind_host = "127.0.0.1"; // interface for this agent's and its workers' servers
  int num_gpus = 0;                    // GPUs offered (tests pass a fake count)
  int num_cpu_slots = 4;               // CPU slots offered when the job runs without GPUs
  std::string worker_binary;           // empty = this executable (/proc/self/exe)
  std::vector<std::string> worker_args_prefix = {"worker"};  // before --head/--actor
  int max_message_bytes = 64 << 20;
  double stop_grace_s = 3.0;           // SIGTERM -> SIGKILL
  double register_timeout_s = 30.0;    // keep trying RegisterNode this long
};

class Agent {
 public:
  static StatusOr<std::unique_ptr<Agent>> Start(const AgentOptions& options);
  ~Agent();  // kills every worker it started

  // Blocks until RequestStop() (returns 0) or the head is lost (returns 1).
  int Run();
  void RequestStop();

  const std::string& address() const;
  const std::string& node_name() const;
  // Pids of the workers that are running now (diagnostics and tests).
  std::vector<int> WorkerPids() const;

  class Impl;

 private:
  explicit Agent(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace slime::runtime

#endif  // SLIME_RUNTIME_AGENT_H_
