// Head: the gRPC service, registration and the public API. Health, restarts and failure
// handling live in head_health.cc; the status view and metrics in head_status.cc.
#include "slime/runtime/head.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_join.h"
#include "fmt/format.h"
#include "head_internal.h"
#include "slime/metrics/registry.h"
#include "spdlog/spdlog.h"

namespace slime::runtime {

std::string ActorStateName(ActorState state) {
  switch (state) {
    case ActorState::kPending:
      return "pending";
    case ActorState::kStarting:
      return "starting";
    case ActorState::kAlive:
      return "alive";
    case ActorState::kRestarting:
      return "restarting";
    case ActorState::kDead:
      return "dead";
  }
  return "?";
}

// The Head gRPC service: authorizes, then forwards to the Head's handlers.
class Head::Service final : public slime::v1::Head::CallbackService {
 public:
  explicit Service(Head* head) : head_(head) {}

#define SLIME_HEAD_HANDLER(Method, Req, Reply, body)                                        \
  grpc::ServerUnaryReactor* Method(grpc::CallbackServerContext* context, const Req* request, \
                                   Reply* reply) override {                                 \
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();                          \
    grpc::Status s = Authorize(context, head_->options_.token);                             \
    if (s.ok()) s = (body);                                                                 \
    reactor->Finish(s);                                                                     \
    return reactor;                                                                         \
  }

  SLIME_HEAD_HANDLER(RegisterNode, slime::v1::RegisterNodeRequest, slime::v1::RegisterNodeReply,
                     head_->OnRegisterNode(*request, reply))
  SLIME_HEAD_HANDLER(RegisterWorker, slime::v1::RegisterWorkerRequest,
                     slime::v1::RegisterWorkerReply, head_->OnRegisterWorker(*request, reply))
  SLIME_HEAD_HANDLER(Heartbeat, slime::v1::HeartbeatRequest, slime::v1::HeartbeatReply,
                     head_->OnHeartbeat(*request, reply))
  SLIME_HEAD_HANDLER(ReportExit, slime::v1::ReportExitRequest, slime::v1::ReportExitReply,
                     head_->OnReportExit(*request))
  SLIME_HEAD_HANDLER(Status, slime::v1::StatusRequest, slime::v1::StatusReply,
                     (*reply = head_->Snapshot(), grpc::Status::OK))
#undef SLIME_HEAD_HANDLER

 private:
  Head* head_;
};

Head::Head(HeadOptions options) : options_(std::move(options)) {}

StatusOr<std::unique_ptr<Head>> Head::Start(HeadOptions options) {
  if (options.run_dir.empty()) return absl::InvalidArgumentError("head: run_dir is required");
  if (options.heartbeat_interval_s <= 0 || options.heartbeat_timeout_s <= options.heartbeat_interval_s) {
    return absl::InvalidArgumentError(fmt::format(
        "head: heartbeat_timeout_s ({}) must exceed heartbeat_interval_s ({}) > 0",
        options.heartbeat_timeout_s, options.heartbeat_interval_s));
  }
  if (options.token.empty()) options.token = GenerateToken();
  std::error_code ec;
  std::filesystem::path run_dir = std::filesystem::absolute(options.run_dir, ec);
  std::filesystem::create_directories(run_dir / "logs", ec);
  if (ec) {
    return absl::InternalError(
        fmt::format("head: cannot create {}: {}", (run_dir / "logs").string(), ec.message()));
  }
  options.run_dir = run_dir.string();
  std::unique_ptr<Head> head(new Head(std::move(options)));
  head->rpc_.token = head->options_.token;
  head->rpc_.max_message_bytes = head->options_.max_message_bytes;
  head->service_ = std::make_unique<Service>(head.get());
  SLIME_ASSIGN_OR_RETURN(head->server_,
                         StartServer(head->options_.bind_host, head->options_.port,
                                     {head->service_.get()}, head->rpc_, &head->address_));
  SLIME_RETURN_IF_ERROR(WriteHeadFile((run_dir / "head.json").string(), head->address_,
                                      head->options_.token));
  if (head->options_.metrics != nullptr) {
    head->options_.metrics->AddCallbackGauge(
        "slime_runtime_nodes_alive", "Node agents registered and heartbeating", {},
        [n = head->nodes_alive_metric_] { return static_cast<double>(n->load()); });
  }
  head->health_thread_ = std::thread([h = head.get()] { h->HealthLoop(); });
  spdlog::info("runtime head listening on {} (run dir {})", head->address_, head->options_.run_dir);
  return head;
}

Head::~Head() { Shutdown(); }

// ---- Handlers --------------------------------------------------------------------------------

grpc::Status Head::OnRegisterNode(const slime::v1::RegisterNodeRequest& req,
                                  slime::v1::RegisterNodeReply* reply) {
  const slime::v1::NodeInfo& info = req.node();
  if (info.name().empty() || info.agent_address().empty() || info.num_gpus() < 0 ||
      info.num_cpu_slots() < 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "RegisterNode: want a name, an agent address and non-negative counts");
  }
  auto channel = MakeChannel(info.agent_address(), rpc_);
  std::lock_guard<std::mutex> lock(mu_);
  NodeRecord* node = nullptr;
  for (auto& n : nodes_) {
    if (n->info.name() == info.name()) node = n.get();
  }
  if (node != nullptr && node->alive && node->info.agent_address() != info.agent_address()) {
    return grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                        fmt::format("node name '{}' is already registered by the agent at {}; "
                                    "give each agent a unique --node-name",
                                    info.name(), node->info.agent_address()));
  }
  if (node == nullptr) {
    nodes_.push_back(std::make_unique<NodeRecord>());
    node = nodes_.back().get();
    node->index = static_cast<int>(nodes_.size()) - 1;
  }
  if (!node->alive || node->info.name().empty()) nodes_alive_metric_->fetch_add(1);
  node->info = info;
  node->alive = true;
  node->last_heartbeat = Clock::now();
  node->agent = slime::v1::Agent::NewStub(channel);
  reply->set_node_index(node->index);
  reply->set_heartbeat_interval_s(options_.heartbeat_interval_s);
  reply->set_head_lost_timeout_s(options_.head_lost_timeout_s);
  spdlog::info("node {} registered: agent {}, {} GPUs, {} CPU slots", info.name(),
               info.agent_address(), info.num_gpus(), info.num_cpu_slots());
  cv_.notify_all();
  return grpc::Status::OK;
}

grpc::Status Head::OnRegisterWorker(const slime::v1::RegisterWorkerRequest& req,
                                    slime::v1::RegisterWorkerReply* reply) {
  auto channel = MakeChannel(req.address(), rpc_);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = actors_.find(req.actor_id());
  if (it == actors_.end()) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        fmt::format("RegisterWorker: unknown actor '{}'", req.actor_id()));
  }
  ActorRecord& a = *it->second;
  const bool retry = a.state == ActorState::kAlive && a.incarnation == req.incarnation() &&
                     a.address == req.address();
  if (!retry && (a.state != ActorState::kStarting || a.incarnation != req.incarnation())) {
    return grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        fmt::format("RegisterWorker: actor {} incarnation {} is not expected (state {}, "
                    "incarnation {})",
                    req.actor_id(), req.incarnation(), ActorStateName(a.state), a.incarnation));
  }
  a.pid = req.pid();
  a.address = req.address();
  a.stub = slime::v1::Worker::NewStub(channel);
  a.last_heartbeat = Clock::now();
  if (!retry) {
    SetState(&a, ActorState::kAlive);
    spdlog::info("actor {} alive: pid {} on node {} at {} (incarnation {})", req.actor_id(),
                 req.pid(), a.options.node_name, req.address(), req.incarnation());
  }
  slime::v1::ActorSpec* spec = reply->mutable_spec();
  spec->set_actor_id(a.options.actor_id);
  spec->set_actor_type(a.options.actor_type);
  spec->set_role(a.options.role);
  spec->set_rank(a.options.rank);
  spec->set_node_name(a.options.node_name);
  for (int d : a.options.devices) spec->add_devices(d);
  spec->set_devices_are_gpus(a.options.devices_are_gpus);
  spec->set_incarnation(a.incarnation);
  spec->mutable_env()->insert(a.options.env.begin(), a.options.env.end());
  spec->set_init_payload(a.options.init_payload);
  reply->set_resolved_config(options_.resolved_config);
  reply->set_heartbeat_interval_s(options_.heartbeat_interval_s);
  reply->set_head_lost_timeout_s(options_.head_lost_timeout_s);
  cv_.notify_all();
  return grpc::Status::OK;
}

grpc::Status Head::OnHeartbeat(const slime::v1::HeartbeatRequest& req,
                               slime::v1::HeartbeatReply* reply) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = Clock::now();
  if (req.has_node_name()) {
    for (auto& n : nodes_) {
      if (n->info.name() == req.node_name() && n->alive) {
        n->last_heartbeat = now;
        reply->set_known(true);
      }
    }
    return grpc::Status::OK;
  }
  auto it = actors_.find(req.actor_id());
  if (it != actors_.end() && it->second->incarnation == req.incarnation() &&
      (it->second->state == ActorState::kAlive || it->second->state == ActorState::kStarting)) {
    it->second->last_heartbeat = now;
    reply->set_known(true);
  }
  return grpc::Status::OK;
}

grpc::Status Head::OnReportExit(const slime::v1::ReportExitRequest& req) {
  std::vector<Action> actions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = actors_.find(req.actor_id());
    if (it == actors_.end()) return grpc::Status::OK;  // idempotent: nothing to do
    ActorRecord& a = *it->second;
    if (a.incarnation != req.incarnation() ||
        (a.state != ActorState::kAlive && a.state != ActorState::kStarting)) {
      return grpc::Status::OK;  // an older process, or already handled (retry)
    }
    HandleActorLossLocked(&a, fmt::format("pid {} {}", req.pid(), req.reason()), &actions);
  }
  RunActions(actions);
  return grpc::Status::OK;
}

// ---- Public API ------------------------------------------------------------------------------

StatusOr<std::vector<NodeResources>> Head::WaitForNodes(int count,
                                                        std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  auto alive = [this] {
    return std::count_if(nodes_.begin(), nodes_.end(), [](const auto& n) { return n->alive; });
  };
  if (!cv_.wait_for(lock, timeout, [&] { return alive() >= count || failed_; })) {
    std::vector<std::string> names;
    for (const auto& n : nodes_) names.push_back(n->info.name());
    return absl::DeadlineExceededError(fmt::format(
        "waited {} ms for {} node(s); registered: {} [{}]. Start `slime_train agent --head {} "
        "--token-file {}/head.json` on the missing nodes",
        timeout.count(), count, names.size(), absl::StrJoin(names, ", "), address_,
        options_.run_dir));
  }
  std::vector<const NodeRecord*> order;
  for (const auto& n : nodes_) {
    if (n->alive) order.push_back(n.get());
  }
  std::sort(order.begin(), order.end(), [this](const NodeRecord* a, const NodeRecord* b) {
    const bool ha = a->info.name() == options_.head_node_name;
    const bool hb = b->info.name() == options_.head_node_name;
    if (ha != hb) return ha;
    return a->info.name() < b->info.name();
  });
  std::vector<NodeResources> out;
  for (const NodeRecord* n : order) {
    out.push_back(NodeResources{n->info.name(), n->info.num_gpus(), n->info.num_cpu_slots()});
  }
  return out;
}

Status Head::StartActors(const std::vector<ActorOptions>& actors) {
  std::vector<std::string> ids;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return absl::FailedPreconditionError("head is shutting down");
    for (const ActorOptions& o : actors) {
      if (o.actor_id.empty() || actors_.count(o.actor_id) > 0 ||
          std::count(ids.begin(), ids.end(), o.actor_id) > 0) {
        return absl::InvalidArgumentError(
            fmt::format("StartActors: actor id '{}' is empty or not unique", o.actor_id));
      }
      const bool known = std::any_of(nodes_.begin(), nodes_.end(), [&](const auto& n) {
        return n->info.name() == o.node_name;
      });
      if (!known) {
        return absl::InvalidArgumentError(
            fmt::format("StartActors: actor {} is placed on node '{}', which is not registered",
                        o.actor_id, o.node_name));
      }
      ids.push_back(o.actor_id);
    }
    for (const ActorOptions& o : actors) {
      auto record = std::make_unique<ActorRecord>();
      record->options = o;
      actors_[o.actor_id] = std::move(record);
    }
  }
  RegisterMetrics(ids);
  std::vector<Action> actions;
  for (const std::string& id : ids) actions.push_back(Action{Action::kStart, id});
  RunActions(actions);
  return absl::OkStatus();
}

Status Head::WaitForActors(const std::vector<std::string>& actor_ids,
                           std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  auto not_alive = [&] {
    std::vector<std::string> out;
    for (const std::string& id : actor_ids) {
      auto it = actors_.find(id);
      if (it == actors_.end() || it->second->state != ActorState::kAlive) out.push_back(id);
    }
    return out;
  };
  cv_.wait_for(lock, timeout, [&] { return failed_ || not_alive().empty(); });
  if (failed_) return absl::FailedPreconditionError(failure_);
  std::vector<std::string> missing = not_alive();
  if (!missing.empty()) {
    std::vector<std::string> described;
    for (const std::string& id : missing) {
      auto it = actors_.find(id);
      described.push_back(it == actors_.end()
                              ? id + " (unknown)"
                              : fmt::format("{} ({})", id, ActorStateName(it->second->state)));
    }
    return absl::DeadlineExceededError(fmt::format("actors not alive after {} ms: {}",
                                                   timeout.count(),
                                                   absl::StrJoin(described, ", ")));
  }
  return absl::OkStatus();
}

ActorHandle Head::Handle(const std::string& actor_id) {
  return ActorHandle(this, options_.token, actor_id);
}

ActorGroup Head::Group(const std::vector<std::string>& actor_ids) {
  std::vector<ActorHandle> handles;
  for (const std::string& id : actor_ids) handles.push_back(Handle(id));
  return ActorGroup(std::move(handles));
}

StatusOr<ActorEndpoint> Head::Resolve(const std::string& actor_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = actors_.find(actor_id);
  if (it == actors_.end()) {
    return absl::NotFoundError(fmt::format("no actor '{}' in this job", actor_id));
  }
  const ActorRecord& a = *it->second;
  switch (a.state) {
    case ActorState::kAlive:
      return ActorEndpoint{a.address, a.incarnation, a.stub};
    case ActorState::kDead:
      return absl::FailedPreconditionError(
          fmt::format("actor {} is dead ({})", actor_id, a.last_exit));
    case ActorState::kPending:
    case ActorState::kStarting:
    case ActorState::kRestarting:
      return absl::UnavailableError(
          fmt::format("actor {} is {}", actor_id, ActorStateName(a.state)));
  }
  return absl::InternalError("unreachable");
}

bool Head::job_failed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failed_;
}

std::string Head::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

bool Head::WaitForJobFailure(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [this] { return failed_; });
}

void Head::Shutdown(std::chrono::milliseconds grace) {
  std::vector<std::pair<std::string, std::shared_ptr<slime::v1::Worker::Stub>>> alive;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) return;
    shut_down_ = true;
    stopping_ = true;
    for (auto& [id, a] : actors_) {
      a->stop_requested = true;
      if (a->state == ActorState::kAlive && a->stub != nullptr) alive.emplace_back(id, a->stub);
    }
    cv_.notify_all();
  }
  // Ask every alive worker to shut down, all at once.
  struct Pending {
    std::unique_ptr<grpc::ClientContext> ctx;
    slime::v1::ShutdownRequest req;
    slime::v1::ShutdownReply reply;
    std::promise<void> done;
  };
  std::vector<std::unique_ptr<Pending>> pending;
  for (auto& [id, stub] : alive) {
    auto p = std::make_unique<Pending>();
    p->ctx = MakeContext(options_.token, std::chrono::milliseconds(1000));
    Pending* raw = p.get();
    stub->async()->Shutdown(raw->ctx.get(), &raw->req, &raw->reply,
                            [raw](grpc::Status) { raw->done.set_value(); });
    pending.push_back(std::move(p));
  }
  for (auto& p : pending) p->done.get_future().wait();
  // Then the agents stop whatever is left: SIGTERM now, SIGKILL after the grace.
  std::vector<Action> kills;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, a] : actors_) {
      if (a->state != ActorState::kDead && a->state != ActorState::kPending) {
        kills.push_back(Action{Action::kKill, id, a->incarnation, false});
      }
    }
  }
  RunActions(kills);
  const auto wait_until = Clock::now() + grace;
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_until(lock, wait_until, [this] {
      return std::all_of(actors_.begin(), actors_.end(), [](const auto& kv) {
        return kv.second->state == ActorState::kDead || kv.second->state == ActorState::kPending;
      });
    });
    for (auto& [id, a] : actors_) SetState(a.get(), ActorState::kDead);
  }
  if (health_thread_.joinable()) health_thread_.join();
  if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  spdlog::info("runtime head stopped");
}

std::vector<ActorOptions> ActorsFromPlan(
    const PlacementPlan& plan,
    const std::function<std::string(const std::string& role)>& type_for_role) {
  std::vector<ActorOptions> out;
  for (const ActorPlacement& p : plan.actors) {
    ActorOptions o;
    o.role = RoleName(p.role);
    o.rank = p.rank;
    o.actor_id = p.engine_num_nodes > 1
                     ? fmt::format("{}-{}-part{}", o.role, p.rank, p.engine_node_rank)
                     : fmt::format("{}-{}", o.role, p.rank);
    o.actor_type = type_for_role(o.role);
    o.node_name = p.node_name;
    for (const Device& d : p.devices) o.devices.push_back(d.local_index);
    o.devices_are_gpus = plan.device_kind == DeviceKind::kGpu;
    o.restartable = p.role == ActorRole::kEngine;
    out.push_back(std::move(o));
  }
  return out;
}

}  // namespace slime::runtime
