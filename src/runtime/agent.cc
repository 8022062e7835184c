#include "slime/runtime/agent.h"

#include <cstdlib>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_join.h"
#include "fmt/format.h"
#include "process.h"
#include "slime/runtime/rpc.h"
#include "slime/v1/runtime.grpc.pb.h"
#include "spdlog/spdlog.h"

namespace slime::runtime {

using Clock = std::chrono::steady_clock;

class Agent::Impl final : public slime::v1::Agent::CallbackService {
 public:
  explicit Impl(const AgentOptions& options) : options_(options) {
    rpc_.token = options.token;
    rpc_.max_message_bytes = options.max_message_bytes;
    if (options_.node_name.empty()) {
      char host[256] = {0};
      ::gethostname(host, sizeof(host) - 1);
      options_.node_name = host;
    }
    if (options_.worker_binary.empty()) options_.worker_binary = SelfExecutable();
  }

  ~Impl() override {
    RequestStop(0, "");
    if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
    if (supervisor_thread_.joinable()) supervisor_thread_.join();  // kills every worker
    if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
  }

  Status Start() {
    SLIME_ASSIGN_OR_RETURN(server_, StartServer(options_.bind_host, 0, {this}, rpc_, &address_));
    head_ = slime::v1::Head::NewStub(MakeChannel(options_.head_address, rpc_));
    supervisor_thread_ = std::thread([this] { SupervisorLoop(); });
    slime::v1::RegisterNodeRequest req;
    req.mutable_node()->set_name(options_.node_name);
    req.mutable_node()->set_agent_address(address_);
    req.mutable_node()->set_num_gpus(options_.num_gpus);
    req.mutable_node()->set_num_cpu_slots(options_.num_cpu_slots);
    req.mutable_node()->set_pid(::getpid());
    slime::v1::RegisterNodeReply reply;
    const auto give_up =
        Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(options_.register_timeout_s * 1000));
    grpc::Status s = CallWhileUnavailable(
        [&] {
          auto ctx = MakeContext(rpc_.token, std::chrono::seconds(5));
          return head_->RegisterNode(ctx.get(), req, &reply);
        },
        give_up, std::chrono::milliseconds(200));
    if (!s.ok()) {
      return FromGrpc(s, fmt::format("agent {}: RegisterNode at head {}", options_.node_name,
                                     options_.head_address));
    }
    const HeartbeatTimings timings =
        HeartbeatTimingsFrom(reply.heartbeat_interval_s(), reply.head_lost_timeout_s());
    heartbeat_interval_ = timings.interval;
    head_lost_timeout_ = timings.head_lost_timeout;
    spdlog::info("agent {} registered with head {} as node {} ({} GPUs, {} CPU slots), serving "
                 "on {}",
                 options_.node_name, options_.head_address, reply.node_index(), options_.num_gpus,
                 options_.num_cpu_slots, address_);
    heartbeat_thread_ = std::thread([this] { HeartbeatLoop(); });
    return absl::OkStatus();
  }

  int Run() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return stop_; });
    if (!stop_reason_.empty()) spdlog::error("agent {}: {}", options_.node_name, stop_reason_);
    return exit_code_;
  }

  void RequestStop(int code, const std::string& reason) {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    stop_ = true;
    exit_code_ = code;
    stop_reason_ = reason;
    cv_.notify_all();
  }

  std::vector<int> WorkerPids() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<int> pids;
    for (const auto& [id, child] : children_) pids.push_back(child.pid);
    return pids;
  }

  // ---- Agent service ----
  grpc::ServerUnaryReactor* StartWorker(grpc::CallbackServerContext* context,
                                        const slime::v1::StartWorkerRequest* request,
                                        slime::v1::StartWorkerReply* reply) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    if (grpc::Status s = Authorize(context, rpc_.token); !s.ok()) {
      reactor->Finish(s);
      return reactor;
    }
    if (request->spec().actor_id().empty()) {
      reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "empty actor_id"));
      return reactor;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) {
      reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "agent is stopping"));
      return reactor;
    }
    commands_.push_back(Command{Command::kStart, request->spec(), 0, false, reactor, reply});
    cv_.notify_all();
    return reactor;
  }

  grpc::ServerUnaryReactor* StopWorker(grpc::CallbackServerContext* context,
                                       const slime::v1::StopWorkerRequest* request,
                                       slime::v1::StopWorkerReply* reply) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    if (grpc::Status s = Authorize(context, rpc_.token); !s.ok()) {
      reactor->Finish(s);
      return reactor;
    }
    std::lock_guard<std::mutex> lock(mu_);
    auto it = children_.find(request->actor_id());
    const bool running = it != children_.end() &&
                         (request->incarnation() == 0 ||
                          it->second.incarnation == request->incarnation());
    reply->set_was_running(running);
    if (running) {
      Child& c = it->second;
      const auto now = Clock::now();
      const auto grace = request->force() ? std::chrono::milliseconds(0) : StopGrace();
      if (c.kill_at == Clock::time_point::max() || now + grace < c.kill_at) {
        if (!request->force()) ::kill(-c.pid, SIGTERM);
        c.kill_at = now + grace;
      }
      cv_.notify_all();
    }
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  AgentOptions options_;
  RpcOptions rpc_;
  std::string address_;

 private:
  struct Command {
    enum Kind { kStart } kind;
    slime::v1::ActorSpec spec;
    int64_t incarnation;
    bool force;
    grpc::ServerUnaryReactor* reactor;
    slime::v1::StartWorkerReply* reply;
  };
  struct Child {
    int pid = 0;
    int64_t incarnation = 0;
    Clock::time_point kill_at = Clock::time_point::max();  // SIGKILL the group at this time
  };

  std::chrono::milliseconds StopGrace() const {
    return std::chrono::milliseconds(static_cast<int64_t>(options_.stop_grace_s * 1000));
  }

  void HandleStart(const Command& cmd) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const slime::v1::ActorSpec& spec = cmd.spec;
    auto it = children_.find(spec.actor_id());
    if (it != children_.end()) {
      if (it->second.incarnation == spec.incarnation()) {  // a retried StartWorker
        cmd.reply->set_pid(it->second.pid);
        cmd.reactor->Finish(grpc::Status::OK);
        return;
      }
      // An older incarnation is still running: kill it first, the new one starts alone.
      ::kill(-it->second.pid, SIGKILL);
    }
    SpawnOptions spawn;
    spawn.binary = options_.worker_binary;
    spawn.args = options_.worker_args_prefix;
    spawn.args.insert(spawn.args.end(), {"--head", options_.head_address, "--actor", spec.actor_id()});
    spawn.env = {spec.env().begin(), spec.env().end()};
    spawn.env[kTokenEnv] = rpc_.token;
    spawn.env[kIncarnationEnv] = std::to_string(spec.incarnation());
    spawn.env[kBindHostEnv] = options_.bind_host;
    std::vector<std::string> devices;
    for (int d : spec.devices()) devices.push_back(std::to_string(d));
    spawn.env["CUDA_VISIBLE_DEVICES"] = spec.devices_are_gpus() ? absl::StrJoin(devices, ",") : "";
    // Workers share the node's cores (CPU slots, or the host threads beside the GPUs): OpenMP
    // threads that spin while waiting burn the cores the other workers need (measured on a
    // 2-core host: a CPU trainer step 5x slower). Sleep instead, unless the user chose.
    if (std::getenv("OMP_WAIT_POLICY") == nullptr && !spawn.env.count("OMP_WAIT_POLICY")) {
      spawn.env["OMP_WAIT_POLICY"] = "PASSIVE";
    }
    spawn.log_path = spec.log_path();
    StatusOr<pid_t> pid = SpawnProcess(spawn);
    if (!pid.ok()) {
      cmd.reactor->Finish(ToGrpc(pid.status()));
      return;
    }
    Child& child = children_[spec.actor_id()];
    if (it != children_.end()) zombies_.push_back(it->second.pid);  // reap the old one silently
    child = Child{*pid, spec.incarnation()};
    spdlog::info("agent {}: started {} (incarnation {}) as pid {}, devices [{}], log {}",
                 options_.node_name, spec.actor_id(), spec.incarnation(), *pid,
                 absl::StrJoin(devices, ","), spec.log_path());
    cmd.reply->set_pid(*pid);
    cmd.reactor->Finish(grpc::Status::OK);
  }

  void ReportExit(const std::string& actor_id, const Child& child, int wait_status) {
    auto req = std::make_shared<slime::v1::ReportExitRequest>();
    req->set_actor_id(actor_id);
    req->set_incarnation(child.incarnation);
    req->set_pid(child.pid);
    if (WIFEXITED(wait_status)) req->set_exit_code(WEXITSTATUS(wait_status));
    if (WIFSIGNALED(wait_status)) req->set_signal(WTERMSIG(wait_status));
    req->set_reason(DescribeWaitStatus(wait_status));
    spdlog::info("agent {}: {} (pid {}) {}", options_.node_name, actor_id, child.pid,
                 req->reason());
    auto ctx = std::shared_ptr<grpc::ClientContext>(MakeContext(rpc_.token, std::chrono::seconds(5)));
    auto reply = std::make_shared<slime::v1::ReportExitReply>();
    head_->async()->ReportExit(ctx.get(), req.get(), reply.get(),
                               [ctx, req, reply](grpc::Status) {});
  }

  void SupervisorLoop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait_for(lock, std::chrono::milliseconds(20));
      while (!commands_.empty()) {
        Command cmd = std::move(commands_.front());
        commands_.pop_front();
        HandleStart(cmd);
      }
      const auto now = Clock::now();
      if (stop_ && !stopping_children_) {
        stopping_children_ = true;
        for (auto& [id, c] : children_) {
          ::kill(-c.pid, SIGTERM);
          c.kill_at = std::min(c.kill_at, now + StopGrace());
        }
      }
      for (auto it = children_.begin(); it != children_.end();) {
        Child& c = it->second;
        if (now >= c.kill_at) {
          ::kill(-c.pid, SIGKILL);
          c.kill_at = Clock::time_point::max() - std::chrono::hours(1);  // sent
        }
        int status = 0;
        if (::waitpid(c.pid, &status, WNOHANG) == c.pid) {
          ::kill(-c.pid, SIGKILL);  // anything the worker started goes with it
          if (!stop_) ReportExit(it->first, c, status);
          it = children_.erase(it);
        } else {
          ++it;
        }
      }
      for (auto it = zombies_.begin(); it != zombies_.end();) {
        int status = 0;
        it = ::waitpid(*it, &status, WNOHANG) == *it ? zombies_.erase(it) : it + 1;
      }
      if (stop_ && children_.empty() && zombies_.empty()) break;
    }
    // Answer starts that raced with the stop.
    for (Command& cmd : commands_) {
      cmd.reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "agent stopped"));
    }
    commands_.clear();
  }

  void HeartbeatLoop() {
    auto last_ok = Clock::now();
    while (true) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (cv_.wait_for(lock, heartbeat_interval_, [this] { return stop_; })) return;
      }
      slime::v1::HeartbeatRequest req;
      req.set_node_name(options_.node_name);
      slime::v1::HeartbeatReply reply;
      auto ctx = MakeContext(rpc_.token, std::max(heartbeat_interval_ * 2,
                                                  std::chrono::milliseconds(500)));
      grpc::Status s = head_->Heartbeat(ctx.get(), req, &reply);
      if (s.ok()) {
        last_ok = Clock::now();
        if (!reply.known()) {
          RequestStop(1, "the head does not know this node any more; stopping its workers");
          return;
        }
      } else if (Clock::now() - last_ok > head_lost_timeout_) {
        RequestStop(1, fmt::format("lost the head at {} (no heartbeat answered for {} ms: {}); "
                                   "stopped all workers",
                                   options_.head_address, head_lost_timeout_.count(),
                                   s.error_message()));
        return;
      }
    }
  }

  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<slime::v1::Head::Stub> head_;
  std::chrono::milliseconds heartbeat_interval_{1000};
  std::chrono::milliseconds head_lost_timeout_{10000};
  std::thread supervisor_thread_;
  std::thread heartbeat_thread_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_children_ ABSL_GUARDED_BY(mu_) = false;
  int exit_code_ ABSL_GUARDED_BY(mu_) = 0;
  std::string stop_reason_ ABSL_GUARDED_BY(mu_);
  std::deque<Command> commands_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Child> children_ ABSL_GUARDED_BY(mu_);
  std::vector<int> zombies_ ABSL_GUARDED_BY(mu_);
};

Agent::Agent(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Agent::~Agent() = default;

StatusOr<std::unique_ptr<Agent>> Agent::Start(const AgentOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  SLIME_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<Agent>(new Agent(std::move(impl)));
}

int Agent::Run() { return impl_->Run(); }
void Agent::RequestStop() { impl_->RequestStop(0, ""); }
const std::string& Agent::address() const { return impl_->address_; }
const std::string& Agent::node_name() const { return impl_->options_.node_name; }
std::vector<int> Agent::WorkerPids() const { return impl_->WorkerPids(); }

}  // namespace slime::runtime

