// Head: health checking, restarts with backoff, job failure, and the RPCs to agents.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_join.h"
#include "fmt/format.h"
#include "head_internal.h"
#include "spdlog/spdlog.h"

namespace slime::runtime {
namespace {

std::chrono::milliseconds Ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(std::llround(seconds * 1000.0)));
}

}  // namespace

void Head::SetState(ActorRecord* actor, ActorState state) {
  actor->state = state;
  actor->state_metric->store(static_cast<int>(state), std::memory_order_relaxed);
  cv_.notify_all();
}

void Head::FailJobLocked(const std::string& message) {
  if (failed_) return;
  failed_ = true;
  failure_ = message;
  spdlog::error("job failed: {}", message);
  cv_.notify_all();
}

void Head::HandleActorLossLocked(ActorRecord* actor, const std::string& reason,
                                 std::vector<Action>* actions) {
  actor->last_exit = reason;
  actor->address.clear();
  actor->stub.reset();
  if (actor->stop_requested || stopping_) {
    SetState(actor, ActorState::kDead);
    return;
  }
  const ActorOptions& o = actor->options;
  const int max_restarts = o.max_restarts >= 0 ? o.max_restarts : options_.max_restarts;
  const std::string& limit_name =
      o.max_restarts_name.empty() ? options_.max_restarts_name : o.max_restarts_name;
  // Placement is fixed: an actor of a lost node has nowhere to restart, so it does not wait out
  // its restarts there (the job fails now, naming the node).
  bool node_alive = false;
  for (const auto& node : nodes_) node_alive |= node->info.name() == o.node_name && node->alive;
  if (o.restartable && actor->restarts < max_restarts && node_alive) {
    ++actor->restarts;
    if (actor->restarts_metric != nullptr) actor->restarts_metric->Increment();
    const double backoff = options_.restart_backoff_s * std::pow(2.0, actor->restarts - 1);
    actor->deadline = Clock::now() + Ms(backoff);
    SetState(actor, ActorState::kRestarting);
    spdlog::warn("actor {} on node {} died ({}); restart {}/{} on the same devices in {:.1f} s",
                 o.actor_id, o.node_name, reason, actor->restarts, max_restarts, backoff);
    return;
  }
  SetState(actor, ActorState::kDead);
  const std::string why =
      !o.restartable ? fmt::format("{} actors are not restartable", o.role)
      : !node_alive  ? fmt::format("its node {} is lost and no other node has its devices",
                                   o.node_name)
                     : fmt::format("it was restarted {} time(s) already, the limit ({} = {})",
                                   actor->restarts, limit_name, max_restarts);
  FailJobLocked(fmt::format("actor {} (role {}, rank {}) on node {} died: {}; {}, so the job fails",
                            o.actor_id, o.role, o.rank, o.node_name, reason, why));
  (void)actions;
}

void Head::MarkNodeLostLocked(NodeRecord* node, Clock::time_point now,
                              std::vector<Action>* actions) {
  node->alive = false;
  nodes_alive_metric_->fetch_sub(1);
  const double silent_s =
      std::chrono::duration<double>(now - node->last_heartbeat).count();
  spdlog::error("node {} lost: no agent heartbeat for {:.1f} s", node->info.name(), silent_s);
  for (auto& [id, a] : actors_) {
    if (a->options.node_name == node->info.name() &&
        (a->state == ActorState::kAlive || a->state == ActorState::kStarting)) {
      HandleActorLossLocked(a.get(),
                            fmt::format("its node {} was lost (no agent heartbeat for {:.1f} s)",
                                        node->info.name(), silent_s),
                            actions);
    }
  }
}

std::vector<Head::Action> Head::CheckDeadlinesLocked(Clock::time_point now) {
  std::vector<Action> actions;
  const auto timeout = Ms(options_.heartbeat_timeout_s);
  for (auto& node : nodes_) {
    if (node->alive && now - node->last_heartbeat > timeout) {
      MarkNodeLostLocked(node.get(), now, &actions);
    }
  }
  for (auto& [id, a] : actors_) {
    switch (a->state) {
      case ActorState::kAlive:
        if (now - a->last_heartbeat > timeout) {
          // A silent worker on a node whose agent is silent too (three intervals and more): the
          // node is gone, not the worker hung; its actors cannot restart there.
          NodeRecord* node = nullptr;
          for (auto& n : nodes_) {
            if (n->info.name() == a->options.node_name) node = n.get();
          }
          if (node != nullptr && node->alive &&
              now - node->last_heartbeat > Ms(3 * options_.heartbeat_interval_s)) {
            MarkNodeLostLocked(node, now, &actions);
            break;
          }
          actions.push_back(Action{Action::kKill, id, a->incarnation, true});
          HandleActorLossLocked(
              a.get(),
              fmt::format("pid {} sent no heartbeat for {:.1f} s (hung or unreachable; killed)",
                          a->pid, options_.heartbeat_timeout_s),
              &actions);
        }
        break;
      case ActorState::kStarting:
        if (now > a->deadline) {
          actions.push_back(Action{Action::kKill, id, a->incarnation, true});
          HandleActorLossLocked(
              a.get(),
              fmt::format("did not register within {:.1f} s of being started (see its log {})",
                          options_.start_timeout_s,
                          options_.run_dir + "/logs/" + id + ".log"),
              &actions);
        }
        break;
      case ActorState::kRestarting:
        if (now >= a->deadline) actions.push_back(Action{Action::kStart, id});
        break;
      case ActorState::kPending:
      case ActorState::kDead:
        break;
    }
  }
  return actions;
}

Status Head::KillActor(const std::string& actor_id, int64_t incarnation,
                       const std::string& reason) {
  std::vector<Action> actions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = actors_.find(actor_id);
    if (it == actors_.end()) {
      return absl::NotFoundError(fmt::format("no actor '{}' in this job", actor_id));
    }
    ActorRecord* a = it->second.get();
    if (a->state != ActorState::kAlive || a->incarnation != incarnation) {
      return absl::FailedPreconditionError(fmt::format(
          "actor {}: incarnation {} is not the alive process (state {}, incarnation {})",
          actor_id, incarnation, ActorStateName(a->state), a->incarnation));
    }
    actions.push_back(Action{Action::kKill, actor_id, incarnation, true});
    HandleActorLossLocked(a, fmt::format("pid {} killed: {}", a->pid, reason), &actions);
  }
  RunActions(actions);
  return absl::OkStatus();
}

void Head::HealthLoop() {
  const auto tick = std::min(Ms(options_.heartbeat_interval_s / 2), std::chrono::milliseconds(100));
  while (true) {
    std::vector<Action> actions;
    std::function<void(const std::string&)> notify;
    std::string failure;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, tick, [this] { return stopping_; });
      if (stopping_) return;
      actions = CheckDeadlinesLocked(Clock::now());
      if (failed_ && !failure_notified_) {
        failure_notified_ = true;
        notify = options_.on_failure;
        failure = failure_;
      }
    }
    RunActions(actions);
    if (notify) notify(failure);
  }
}

void Head::RunActions(const std::vector<Action>& actions) {
  for (const Action& action : actions) {
    if (action.kind == Action::kStart) {
      StartOnAgent(action.actor_id);
    } else {
      KillOnAgent(action);
    }
  }
}

void Head::StartOnAgent(const std::string& actor_id) {
  slime::v1::StartWorkerRequest req;
  std::shared_ptr<slime::v1::Agent::Stub> agent;
  std::string node_name;
  int64_t incarnation = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = actors_.find(actor_id);
    if (it == actors_.end() || stopping_) return;
    ActorRecord& a = *it->second;
    if (a.state != ActorState::kPending && a.state != ActorState::kRestarting) return;
    const NodeRecord* node = nullptr;
    for (const auto& n : nodes_) {
      if (n->info.name() == a.options.node_name) node = n.get();
    }
    std::vector<Action> none;
    if (node == nullptr || !node->alive) {
      HandleActorLossLocked(&a, fmt::format("its node {} is not available", a.options.node_name),
                            &none);
      return;
    }
    agent = node->agent;
    node_name = node->info.name();
    incarnation = ++a.incarnation;
    a.deadline = Clock::now() + Ms(options_.start_timeout_s);
    a.last_heartbeat = Clock::now();
    a.pid = 0;
    SetState(&a, ActorState::kStarting);
    slime::v1::ActorSpec* spec = req.mutable_spec();
    spec->set_actor_id(actor_id);
    spec->set_actor_type(a.options.actor_type);
    spec->set_role(a.options.role);
    spec->set_rank(a.options.rank);
    spec->set_node_name(node_name);
    for (int d : a.options.devices) spec->add_devices(d);
    spec->set_devices_are_gpus(a.options.devices_are_gpus);
    spec->set_incarnation(incarnation);
    spec->mutable_env()->insert(a.options.env.begin(), a.options.env.end());
    spec->set_log_path(options_.run_dir + "/logs/" + actor_id + ".log");
  }
  slime::v1::StartWorkerReply reply;
  grpc::Status s;
  for (int attempt = 0; attempt < 3; ++attempt) {  // StartWorker is idempotent per incarnation
    auto ctx = MakeContext(options_.token, std::chrono::seconds(10));
    s = agent->StartWorker(ctx.get(), req, &reply);
    if (s.ok() || s.error_code() != grpc::StatusCode::UNAVAILABLE) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = actors_.find(actor_id);
  if (it == actors_.end()) return;
  ActorRecord& a = *it->second;
  if (a.incarnation != incarnation || a.state != ActorState::kStarting) return;
  if (s.ok()) {
    if (a.pid == 0) a.pid = reply.pid();
    return;
  }
  std::vector<Action> none;
  HandleActorLossLocked(&a,
                        fmt::format("the agent of node {} could not start it: {}", node_name,
                                    s.error_message()),
                        &none);
}

void Head::KillOnAgent(const Action& action) {
  std::shared_ptr<slime::v1::Agent::Stub> agent;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = actors_.find(action.actor_id);
    if (it == actors_.end()) return;
    for (const auto& n : nodes_) {
      if (n->info.name() == it->second->options.node_name && n->alive) agent = n->agent;
    }
  }
  if (agent == nullptr) return;
  slime::v1::StopWorkerRequest req;
  req.set_actor_id(action.actor_id);
  req.set_incarnation(action.incarnation);
  req.set_force(action.force);
  slime::v1::StopWorkerReply reply;
  auto ctx = MakeContext(options_.token, std::chrono::seconds(5));
  grpc::Status s = agent->StopWorker(ctx.get(), req, &reply);
  if (!s.ok()) {
    spdlog::warn("could not stop {} (incarnation {}) through its agent: {}", action.actor_id,
                 action.incarnation, s.error_message());
  }
}

}  // namespace slime::runtime
