// The runtime head: the control plane of one job, living inside the `slime_train` driver.
//
// The head owns the node registry (one node agent per node, the head node's agent in-process),
// the actor table and every actor's lifecycle, health checking, restarts and shutdown. It
// serves the Head gRPC service (proto/slime/v1/runtime.proto) and writes `<run_dir>/head.json`
// (address + job token, mode 0600) so scripts can start agents on other nodes.
//
// Actor lifecycle (one ActorRecord per actor id; `incarnation` counts starts):
//
//        StartActors()
//             |
//             v
//        +---------+  node agent reachable: StartWorker(spec, incarnation)
//        | pending |------------------------------------+
//        +---------+                                    v
//                                                 +----------+   RegisterWorker(id, inc)
//              +--------------------------------->| starting |--------------------------+
//              |  backoff elapsed: incarnation+1  +----------+                          v
//              |  StartWorker on the same bundle        | exit / no registration   +-------+
//        +------------+                                 | within start_timeout     | alive |
//        | restarting |<--------------------------------+--------------------------+-------+
//        +------------+  restartable and restarts < max    exit reported by the agent,
//              ^                                           heartbeats missing (hung: the head
//              |                                           kills it), or its node is lost
//              |                                                     |
//              +--------------------------(restartable)--------------+
//                                                                    | not restartable, or
//                                                                    v restarts exhausted
//                                                                 +------+
//                                                                 | dead | -> the job fails
//                                                                 +------+
//   Shutdown() moves every actor to dead without failing the job.
//
// Failure: when an actor becomes dead other than through Shutdown(), the job fails with one
// message naming the actor, its node and the exit reason (e.g. "actor trainer-1 on node n0
// (pid 4242) died: killed by signal 9 (SIGKILL); trainer actors are not restartable"). The
// driver sees it through job_failed()/failure()/WaitForJobFailure() and the
// `on_failure` callback, so nothing hangs silently.
//
// Threads: the public methods are thread-safe. gRPC handlers run on gRPC's callback threads
// and only update the table under `mu_`; RPCs to agents and workers are never made while `mu_`
// is held. One health thread checks deadlines (heartbeats, starts, restart backoffs).
#ifndef SLIME_RUNTIME_HEAD_H_
#define SLIME_RUNTIME_HEAD_H_

#include <chrono>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "slime/common/status.h"
#include "slime/runtime/actor_handle.h"
#include "slime/runtime/placement.h"
#include "slime/runtime/rpc.h"
#include "slime/v1/runtime.grpc.pb.h"

namespace slime::metrics {
class Registry;
}  // namespace slime::metrics

namespace slime::runtime {

enum class ActorState { kPending, kStarting, kAlive, kRestarting, kDead };
std::string ActorStateName(ActorState state);  // "pending", ...

struct HeadOptions {
  std::string bind_host = "127.0.0.1";  // the one interface the head listens on
  int port = 0;                         // 0 = any free port
  std::string token;                    // empty: a random token is generated
  std::string run_dir;                  // required: head.json, logs/<actor>.log
  std::string resolved_config;          // shipped to every worker at registration
  std::string head_node_name;           // the in-process agent's node name (placed first)
  double heartbeat_interval_s = 1.0;    // agents and workers heartbeat this often
  double heartbeat_timeout_s = 10.0;    // no heartbeat this long: actor hung / node lost
  double start_timeout_s = 60.0;        // StartWorker -> RegisterWorker at most this long
  double head_lost_timeout_s = 10.0;    // agents and workers give up on the head after this
  double restart_backoff_s = 1.0;       // first restart delay; doubles per restart of an actor
  int max_restarts = 3;                 // per restartable actor
  // How errors name that limit (the user's setting, e.g. fault_tolerance.max_engine_restarts).
  std::string max_restarts_name = "max_restarts";
  int max_message_bytes = 64 << 20;
  // When set: slime_runtime_nodes_alive, and per actor slime_runtime_actor_state and
  // slime_runtime_actor_restarts_total (labels actor, role, node). One head per registry.
  metrics::Registry* metrics = nullptr;
  std::function<void(const std::string& failure)> on_failure;  // called once, any thread
};

// One actor to run: where, with which devices, and how failures are handled.
struct ActorOptions {
  std::string actor_id;     // unique, e.g. "engine-0"
  std::string actor_type;   // the worker's actor registry key
  std::string role;         // trainer | critic | engine | rollout | test
  int rank = 0;
  std::string node_name;    // a registered node
  std::vector<int> devices; // local device indices on that node
  bool devices_are_gpus = true;
  bool restartable = false; // engines: true; trainers: with fault_tolerance.max_trainer_restarts
  int max_restarts = -1;    // restarts allowed (< 0: HeadOptions::max_restarts)
  std::string max_restarts_name;  // how errors name that limit (empty: the head's name)
  std::map<std::string, std::string> env;
  std::string init_payload;
};

// Actors for a placement plan: ids "<role>-<rank>" ("engine-<rank>-part<k>" for multi-node
// engine parts), `type_for_role(role)` gives the actor type, engines are restartable.
std::vector<ActorOptions> ActorsFromPlan(
    const PlacementPlan& plan, const std::function<std::string(const std::string& role)>& type_for_role);

class Head : public ActorDirectory {
 public:
  // Starts the gRPC server and the health thread, writes head.json.
  static StatusOr<std::unique_ptr<Head>> Start(HeadOptions options);
  ~Head() override;  // Shutdown()
  Head(const Head&) = delete;
  Head& operator=(const Head&) = delete;

  const std::string& address() const { return address_; }
  const std::string& token() const { return options_.token; }
  const RpcOptions& rpc_options() const { return rpc_; }

  // Waits until `count` nodes have registered; returns them ordered for placement (the head
  // node first, then by name). DeadlineExceeded names the nodes that are there.
  StatusOr<std::vector<NodeResources>> WaitForNodes(int count, std::chrono::milliseconds timeout);

  // Adds the actors and asks their nodes' agents to start them. InvalidArgument for duplicate
  // ids or unknown nodes; the start itself proceeds asynchronously (see the diagram).
  Status StartActors(const std::vector<ActorOptions>& actors);

  // Waits until all `actor_ids` are alive. Fails at once (FailedPrecondition with the failure
  // message) when the job fails meanwhile; DeadlineExceeded names the actors not yet alive.
  Status WaitForActors(const std::vector<std::string>& actor_ids,
                       std::chrono::milliseconds timeout);

  ActorHandle Handle(const std::string& actor_id);
  ActorGroup Group(const std::vector<std::string>& actor_ids);

  bool job_failed() const;
  std::string failure() const;
  // True when the job failed within `timeout` (then failure() says why).
  bool WaitForJobFailure(std::chrono::milliseconds timeout);

  // Kills the alive process `incarnation` of `actor_id` (SIGKILL through its node's agent) and
  // handles it as a lost actor: restarted when restartable and under max_restarts, else the job
  // fails with `reason` in its message. For a caller that judged the process unusable while its
  // heartbeats go on (e.g. an engine that fails its health checks). NotFound for an unknown
  // actor; FailedPrecondition when that incarnation is no longer the alive one (already lost,
  // restarting or replaced: nothing is done).
  Status KillActor(const std::string& actor_id, int64_t incarnation, const std::string& reason);

  // The status view: nodes, actors (where, state, restarts), job state.
  slime::v1::StatusReply Snapshot() const;

  // Stops every actor (Worker.Shutdown, then the agent kills what is left after `grace`) and the
  // server. Idempotent.
  void Shutdown(std::chrono::milliseconds grace = std::chrono::milliseconds(3000));

  // ActorDirectory: the current endpoint of an alive actor; Unavailable while it is starting or
  // restarting, FailedPrecondition when it is dead.
  StatusOr<ActorEndpoint> Resolve(const std::string& actor_id) override;

 private:
  class Service;
  struct NodeRecord;
  struct ActorRecord;
  // What the health thread or a handler decided to do outside the lock.
  struct Action {
    enum Kind { kStart, kKill } kind;
    std::string actor_id;
    int64_t incarnation = 0;  // kKill: the process to kill
    bool force = false;       // kKill: SIGKILL at once
  };

  explicit Head(HeadOptions options);

  // Handlers (called by Service).
  grpc::Status OnRegisterNode(const slime::v1::RegisterNodeRequest& req,
                              slime::v1::RegisterNodeReply* reply);
  grpc::Status OnRegisterWorker(const slime::v1::RegisterWorkerRequest& req,
                                slime::v1::RegisterWorkerReply* reply);
  grpc::Status OnHeartbeat(const slime::v1::HeartbeatRequest& req,
                           slime::v1::HeartbeatReply* reply);
  grpc::Status OnReportExit(const slime::v1::ReportExitRequest& req);

  // head_health.cc
  void HealthLoop();
  std::vector<Action> CheckDeadlinesLocked(std::chrono::steady_clock::time_point now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The node's agent is gone: marks it lost and hands each of its actors to
  // HandleActorLossLocked (which fails the job: they cannot restart elsewhere).
  void MarkNodeLostLocked(NodeRecord* node, std::chrono::steady_clock::time_point now,
                          std::vector<Action>* actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An alive/starting actor stopped being (exit, hang, lost node): restart or fail the job.
  void HandleActorLossLocked(ActorRecord* actor, const std::string& reason,
                             std::vector<Action>* actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailJobLocked(const std::string& message) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RunActions(const std::vector<Action>& actions);
  void StartOnAgent(const std::string& actor_id);
  void KillOnAgent(const Action& action);
  void SetState(ActorRecord* actor, ActorState state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RegisterMetrics(const std::vector<std::string>& actor_ids);

  HeadOptions options_;
  RpcOptions rpc_;
  std::string address_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<NodeRecord>> nodes_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<ActorRecord>> actors_ ABSL_GUARDED_BY(mu_);
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  std::string failure_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  bool failure_notified_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<std::atomic<int>> nodes_alive_metric_ = std::make_shared<std::atomic<int>>(0);
  std::thread health_thread_;
};

// The status view as a table (one line per node and per actor).
std::string FormatStatus(const slime::v1::StatusReply& status);

}  // namespace slime::runtime

#endif  // SLIME_RUNTIME_HEAD_H_
