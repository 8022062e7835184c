// Head: the status view (Status RPC, FormatStatus) and the Prometheus metrics hookup.
#include "absl/strings/str_join.h"
#include "fmt/format.h"
#include "head_internal.h"

namespace slime::runtime {

slime::v1::StatusReply Head::Snapshot() const {
  slime::v1::StatusReply out;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& n : nodes_) {
    slime::v1::NodeStatus* ns = out.add_nodes();
    ns->set_name(n->info.name());
    ns->set_agent_address(n->info.agent_address());
    ns->set_num_gpus(n->info.num_gpus());
    ns->set_num_cpu_slots(n->info.num_cpu_slots());
    ns->set_alive(n->alive);
  }
  for (const auto& [id, a] : actors_) {
    slime::v1::ActorStatus* as = out.add_actors();
    as->set_actor_id(id);
    as->set_actor_type(a->options.actor_type);
    as->set_role(a->options.role);
    as->set_rank(a->options.rank);
    as->set_node_name(a->options.node_name);
    for (int d : a->options.devices) as->add_devices(d);
    as->set_state(ActorStateName(a->state));
    as->set_pid(a->pid);
    as->set_restarts(a->restarts);
    as->set_address(a->address);
    as->set_last_exit(a->last_exit);
    as->set_incarnation(a->incarnation);
  }
  out.set_job_state(failed_ ? "failed" : (stopping_ ? "stopping" : "running"));
  out.set_failure(failure_);
  return out;
}

std::string FormatStatus(const slime::v1::StatusReply& status) {
  std::string out = fmt::format("job: {}{}\n", status.job_state(),
                                status.failure().empty() ? "" : " — " + status.failure());
  out += fmt::format("{:<16} {:<22} {:>5} {:>9} {}\n", "node", "agent", "gpus", "cpu_slots",
                     "alive");
  for (const auto& n : status.nodes()) {
    out += fmt::format("{:<16} {:<22} {:>5} {:>9} {}\n", n.name(), n.agent_address(),
                       n.num_gpus(), n.num_cpu_slots(), n.alive() ? "yes" : "no");
  }
  out += fmt::format("{:<20} {:<8} {:>4} {:<16} {:<8} {:<10} {:>7} {:>8}  {}\n", "actor", "role",
                     "rank", "node", "devices", "state", "pid", "restarts", "last exit");
  for (const auto& a : status.actors()) {
    std::vector<std::string> devices;
    for (int d : a.devices()) devices.push_back(std::to_string(d));
    out += fmt::format("{:<20} {:<8} {:>4} {:<16} {:<8} {:<10} {:>7} {:>8}  {}\n", a.actor_id(),
                       a.role(), a.rank(), a.node_name(), absl::StrJoin(devices, ","), a.state(),
                       a.pid(), a.restarts(), a.last_exit());
  }
  return out;
}

void Head::RegisterMetrics(const std::vector<std::string>& actor_ids) {
  metrics::Registry* registry = options_.metrics;
  if (registry == nullptr) return;
  static constexpr char kStateHelp[] =
      "Actor lifecycle state: 0 pending, 1 starting, 2 alive, 3 restarting, 4 dead";
  // Read what the gauges need under the lock, register outside it: a scrape holds the
  // registry's lock while it evaluates callbacks, which only read atomics.
  struct Item {
    std::string id, role, node;
    std::shared_ptr<std::atomic<int>> state;
  };
  std::vector<Item> items;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const std::string& id : actor_ids) {
      auto it = actors_.find(id);
      if (it == actors_.end()) continue;
      items.push_back({id, it->second->options.role, it->second->options.node_name,
                       it->second->state_metric});
    }
  }
  std::vector<metrics::Counter*> counters;
  for (const Item& item : items) {
    const metrics::Labels labels = {{"actor", item.id}, {"role", item.role}, {"node", item.node}};
    registry->AddCallbackGauge("slime_runtime_actor_state", kStateHelp, labels,
                               [state = item.state] { return static_cast<double>(state->load()); });
    counters.push_back(&registry->GetCounter("slime_runtime_actor_restarts_total",
                                             "Restarts of an actor since the job started",
                                             labels));
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < items.size(); ++i) {
    auto it = actors_.find(items[i].id);
    if (it != actors_.end()) it->second->restarts_metric = counters[i];
  }
}

}  // namespace slime::runtime
