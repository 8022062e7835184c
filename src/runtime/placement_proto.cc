// PlacementPlan <-> slime.v1.PlacementPlan (the head ships plans to node agents).
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>

#include "fmt/format.h"
#include "slime/runtime/placement.h"
#include "slime/v1/placement.pb.h"

namespace slime::runtime {
namespace {

v1::DeviceKind KindToProto(DeviceKind kind) {
  return kind == DeviceKind::kGpu ? v1::DEVICE_KIND_GPU : v1::DEVICE_KIND_CPU_SLOT;
}

StatusOr<DeviceKind> KindFromProto(v1::DeviceKind kind, const std::string& where) {
  switch (kind) {
    case v1::DEVICE_KIND_GPU:
      return DeviceKind::kGpu;
    case v1::DEVICE_KIND_CPU_SLOT:
      return DeviceKind::kCpuSlot;
    default:
      return absl::InvalidArgumentError(
          fmt::format("placement plan: {} has device kind {}; expected GPU or CPU_SLOT", where,
                      static_cast<int>(kind)));
  }
}

void DeviceToProto(const Device& d, v1::Device* out) {
  out->set_node_index(d.node_index);
  out->set_node_name(d.node_name);
  out->set_kind(KindToProto(d.kind));
  out->set_local_index(d.local_index);
}

// Reads a device and checks it names a real device of the plan's kind.
StatusOr<Device> DeviceFromProto(const v1::Device& in, const PlacementPlan& plan,
                                 const std::string& where) {
  Device d;
  d.node_index = in.node_index();
  d.node_name = in.node_name();
  d.local_index = in.local_index();
  SLIME_ASSIGN_OR_RETURN(d.kind, KindFromProto(in.kind(), where));
  const int num_nodes = static_cast<int>(plan.nodes.size());
  if (d.node_index < 0 || d.node_index >= num_nodes) {
    return absl::InvalidArgumentError(
        fmt::format("placement plan: {} names node {} but the plan has {} nodes", where,
                    d.node_index, num_nodes));
  }
  const PlanNode& node = plan.nodes[d.node_index];
  if (d.node_name != node.name) {
    return absl::InvalidArgumentError(
        fmt::format("placement plan: {} names node {} '{}' but that node is '{}'", where,
                    d.node_index, d.node_name, node.name));
  }
  if (d.kind != plan.device_kind) {
    return absl::InvalidArgumentError(
        fmt::format("placement plan: {} is a {} but the plan places on {}", where,
                    DeviceKindName(d.kind), DeviceKindName(plan.device_kind)));
  }
  if (d.local_index < 0 || d.local_index >= node.num_devices) {
    return absl::InvalidArgumentError(
        fmt::format("placement plan: {} has local index {} but node '{}' offers {}", where,
                    d.local_index, node.name, node.num_devices));
  }
  return d;
}

StatusOr<ActorRole> RoleFromName(const std::string& name) {
  for (ActorRole role : {ActorRole::kRolloutCoordinator, ActorRole::kTrainer, ActorRole::kCritic,
                         ActorRole::kEngine}) {
    if (RoleName(role) == name) return role;
  }
  return absl::InvalidArgumentError(fmt::format(
      "placement plan: unknown actor role '{}'; expected 'rollout', 'trainer', 'critic' or "
      "'engine'",
      name));
}

bool DeviceLess(const Device& a, const Device& b) {
  return std::pair(a.node_index, a.local_index) < std::pair(b.node_index, b.local_index);
}

// The invariants of PlacementPlan (header) that a well-formed proto may still break. A device
// belongs to at most one actor of each role, and in disaggregated plans to at most one actor.
Status CheckDevices(const PlacementPlan& plan) {
  std::map<std::tuple<int, int, int>, std::string> owner;  // (role or -1, node, local) -> who
  std::vector<Device> all;
  for (const ActorPlacement& a : plan.actors) {
    const std::string who = fmt::format("{} {}", RoleName(a.role), a.rank);
    for (const Device& d : a.devices) {
      if (d.node_index != a.node_index) {
        return absl::InvalidArgumentError(
            fmt::format("placement plan: {} runs on node {} but owns device {}:{} on node {}", who,
                        a.node_index, d.node_name, d.local_index, d.node_index));
      }
      const int scope = plan.colocated ? static_cast<int>(a.role) : -1;
      auto [it, inserted] = owner.emplace(std::tuple(scope, d.node_index, d.local_index), who);
      if (!inserted) {
        return absl::InvalidArgumentError(
            fmt::format("placement plan: device {}:{} is owned by both {} and {}", d.node_name,
                        d.local_index, it->second, who));
      }
      all.push_back(d);
    }
  }
  std::sort(all.begin(), all.end(), DeviceLess);
  all.erase(std::unique(all.begin(), all.end()), all.end());
  if (all != plan.devices) {
    return absl::InvalidArgumentError(
        "placement plan: the device list is not the sorted union of the actors' devices");
  }
  return absl::OkStatus();
}

}  // namespace

v1::PlacementPlan ToProto(const PlacementPlan& plan) {
  v1::PlacementPlan out;
  out.set_colocated(plan.colocated);
  out.set_strategy(StrategyName(plan.strategy));
  out.set_num_nodes_used(NumNodesUsed(plan));
  out.set_device_kind(KindToProto(plan.device_kind));
  out.set_tensor_parallel(plan.tensor_parallel);
  out.set_pipeline_parallel(plan.pipeline_parallel);
  out.set_context_parallel(plan.context_parallel);
  out.set_data_parallel(plan.data_parallel);
  out.set_devices_per_engine(plan.devices_per_engine);
  for (const PlanNode& n : plan.nodes) {
    v1::PlanNode* node = out.add_nodes();
    node->set_name(n.name);
    node->set_num_devices(n.num_devices);
  }
  for (const Device& d : plan.devices) DeviceToProto(d, out.add_devices());
  for (const ActorPlacement& a : plan.actors) {
    v1::ActorPlacement* actor = out.add_actors();
    actor->set_role(RoleName(a.role));
    actor->set_rank(a.rank);
    for (const Device& d : a.devices) DeviceToProto(d, actor->add_devices());
    actor->set_dp_rank(a.parallel.dp);
    actor->set_tp_rank(a.parallel.tp);
    actor->set_pp_rank(a.parallel.pp);
    actor->set_cp_rank(a.parallel.cp);
    actor->set_node_index(a.node_index);
    actor->set_node_name(a.node_name);
    actor->set_engine_node_rank(a.engine_node_rank);
    actor->set_engine_num_nodes(a.engine_num_nodes);
  }
  return out;
}

StatusOr<PlacementPlan> FromProto(const v1::PlacementPlan& in) {
  PlacementPlan plan;
  plan.colocated = in.colocated();
  if (in.strategy() == "pack") {
    plan.strategy = PlacementStrategy::kPack;
  } else if (in.strategy() == "spread") {
    plan.strategy = PlacementStrategy::kSpread;
  } else {
    return absl::InvalidArgumentError(fmt::format(
        "placement plan: unknown strategy '{}'; expected 'pack' or 'spread'", in.strategy()));
  }
  SLIME_ASSIGN_OR_RETURN(plan.device_kind, KindFromProto(in.device_kind(), "the plan"));
  plan.tensor_parallel = in.tensor_parallel();
  plan.pipeline_parallel = in.pipeline_parallel();
  plan.context_parallel = in.context_parallel();
  plan.data_parallel = in.data_parallel();
  plan.devices_per_engine = in.devices_per_engine();
  if (plan.tensor_parallel < 1 || plan.pipeline_parallel < 1 || plan.context_parallel < 1 ||
      plan.data_parallel < 1 || plan.devices_per_engine < 0) {
    return absl::InvalidArgumentError(
        fmt::format("placement plan: parallel sizes TP {} PP {} CP {} DP {} must be >= 1 and "
                    "devices_per_engine {} >= 0",
                    plan.tensor_parallel, plan.pipeline_parallel, plan.context_parallel,
                    plan.data_parallel, plan.devices_per_engine));
  }
  if (in.nodes().empty()) {
    return absl::InvalidArgumentError("placement plan: no nodes");
  }
  std::set<std::string> names;
  for (const v1::PlanNode& n : in.nodes()) {
    if (n.name().empty() || n.num_devices() < 0 || !names.insert(n.name()).second) {
      return absl::InvalidArgumentError(fmt::format(
          "placement plan: bad node '{}' with {} devices (names must be unique and non-empty)",
          n.name(), n.num_devices()));
    }
    plan.nodes.push_back(PlanNode{n.name(), n.num_devices()});
  }
  for (int i = 0; i < in.devices_size(); ++i) {
    SLIME_ASSIGN_OR_RETURN(Device d,
                           DeviceFromProto(in.devices(i), plan, fmt::format("device entry {}", i)));
    plan.devices.push_back(std::move(d));
  }
  for (int i = 0; i < in.actors_size(); ++i) {
    const v1::ActorPlacement& in_actor = in.actors(i);
    ActorPlacement a;
    SLIME_ASSIGN_OR_RETURN(a.role, RoleFromName(in_actor.role()));
    a.rank = in_actor.rank();
    a.node_index = in_actor.node_index();
    a.node_name = in_actor.node_name();
    a.parallel = ParallelRank{in_actor.dp_rank(), in_actor.tp_rank(), in_actor.pp_rank(),
                              in_actor.cp_rank()};
    a.engine_node_rank = in_actor.engine_node_rank();
    a.engine_num_nodes = in_actor.engine_num_nodes();
    const std::string who = fmt::format("{} {}", in_actor.role(), a.rank);
    if (a.rank < 0 || a.engine_num_nodes < 1 || a.engine_node_rank < 0 ||
        a.engine_node_rank >= a.engine_num_nodes) {
      return absl::InvalidArgumentError(
          fmt::format("placement plan: {} has rank {}, engine part {} of {}", who, a.rank,
                      a.engine_node_rank, a.engine_num_nodes));
    }
    if (a.node_index < 0 || a.node_index >= static_cast<int>(plan.nodes.size()) ||
        plan.nodes[a.node_index].name != a.node_name) {
      return absl::InvalidArgumentError(fmt::format(
          "placement plan: {} runs on node {} '{}', which is not in the plan's node list", who,
          a.node_index, a.node_name));
    }
    for (int j = 0; j < in_actor.devices_size(); ++j) {
      SLIME_ASSIGN_OR_RETURN(Device d, DeviceFromProto(in_actor.devices(j), plan,
                                                       fmt::format("{} device {}", who, j)));
      a.devices.push_back(std::move(d));
    }
    plan.actors.push_back(std::move(a));
  }
  SLIME_RETURN_IF_ERROR(CheckDevices(plan));
  if (in.num_nodes_used() != NumNodesUsed(plan)) {
    return absl::InvalidArgumentError(
        fmt::format("placement plan: num_nodes_used is {} but the actors run on {} nodes",
                    in.num_nodes_used(), NumNodesUsed(plan)));
  }
  return plan;
}

}  // namespace slime::runtime
