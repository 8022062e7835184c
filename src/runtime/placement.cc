// Placement planner (rules in include/slime/runtime/placement.h).
#include "slime/runtime/placement.h"

#include <algorithm>
#include <set>
#include <utility>

#include "fmt/format.h"

namespace slime::runtime {
namespace {

bool DeviceLess(const Device& a, const Device& b) {
  return std::pair(a.node_index, a.local_index) < std::pair(b.node_index, b.local_index);
}

// "1 GPU", "8 GPUs", "4 CPU slots".
std::string Count(int n, DeviceKind kind) {
  const char* unit = kind == DeviceKind::kGpu ? "GPU" : "CPU slot";
  return fmt::format("{} {}{}", n, unit, n == 1 ? "" : "s");
}

std::string Units(DeviceKind kind) { return kind == DeviceKind::kGpu ? "GPUs" : "CPU slots"; }

// The config key the app maps onto PlacementRequest::num_gpus_per_node for this device kind.
std::string NodeSizeKey(DeviceKind kind) {
  return kind == DeviceKind::kGpu ? "cluster.num_gpus_per_node" : "cluster.cpu_slots_per_node";
}

std::string DeviceName(const Device& d) { return fmt::format("{}:{}", d.node_name, d.local_index); }

// Hands out bundles of devices, each on one node, following the strategy (see header). On each
// node the free devices are always the suffix [used, num_devices) because nothing is returned.
class Allocator {
 public:
  Allocator(const std::vector<PlanNode>& nodes, DeviceKind kind, PlacementStrategy strategy)
      : nodes_(nodes), used_(nodes.size(), 0), kind_(kind), strategy_(strategy) {}

  // `size` devices on one node that is not in `exclude`, or nullopt when no node has room.
  std::optional<std::vector<Device>> Take(int size, const std::vector<int>& exclude = {}) {
    const int n = static_cast<int>(nodes_.size());
    for (int step = 0; step < n; ++step) {
      const int node = strategy_ == PlacementStrategy::kPack ? step : (cursor_ + step) % n;
      if (std::find(exclude.begin(), exclude.end(), node) != exclude.end()) continue;
      if (Free(node) < size) continue;
      std::vector<Device> devices;
      for (int i = 0; i < size; ++i) {
        devices.push_back(Device{node, nodes_[node].name, kind_, used_[node] + i});
      }
      used_[node] += size;
      cursor_ = (node + 1) % n;
      return devices;
    }
    return std::nullopt;
  }

  int Free(int node) const { return nodes_[node].num_devices - used_[node]; }

  // "node-a 2, node-b 0".
  std::string FreeSummary() const {
    std::string out;
    for (size_t i = 0; i < nodes_.size(); ++i) {
      out += fmt::format("{}{} {}", i == 0 ? "" : ", ", nodes_[i].name, Free(i));
    }
    return out;
  }

 private:
  std::vector<PlanNode> nodes_;
  std::vector<int> used_;
  DeviceKind kind_;
  PlacementStrategy strategy_;
  int cursor_ = 0;  // SPREAD: the node after the one that got the previous bundle
};

// An engine: one device list per node it runs on (one entry unless it spans nodes).
using EngineParts = std::vector<std::vector<Device>>;

Status ValidateNodes(const std::vector<NodeResources>& nodes) {
  if (nodes.empty()) {
    return absl::InvalidArgumentError(
        "no nodes to place the job on; the head node must register itself before planning");
  }
  std::set<std::string> names;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const NodeResources& node = nodes[i];
    if (node.name.empty()) {
      return absl::InvalidArgumentError(fmt::format("node {} has an empty name", i));
    }
    if (!names.insert(node.name).second) {
      return absl::InvalidArgumentError(
          fmt::format("node name '{}' appears twice; node names must be unique", node.name));
    }
    if (node.num_gpus < 0 || node.num_cpu_slots < 0) {
      return absl::InvalidArgumentError(fmt::format(
          "node '{}' reports {} and {}; counts must be >= 0", node.name,
          Count(node.num_gpus, DeviceKind::kGpu), Count(node.num_cpu_slots, DeviceKind::kCpuSlot)));
    }
  }
  return absl::OkStatus();
}

Status ValidateRequest(const PlacementRequest& r) {
  const std::pair<const char*, int> positive[] = {
      {"cluster.actor_num_nodes", r.actor_num_nodes},
      {"cluster.actor_num_gpus_per_node", r.actor_num_gpus_per_node},
      {"train.tensor_model_parallel_size", r.tensor_parallel},
      {"train.pipeline_model_parallel_size", r.pipeline_parallel},
      {"train.context_parallel_size", r.context_parallel},
      {"cluster.rollout_num_gpus_per_engine", r.rollout_num_gpus_per_engine},
  };
  for (const auto& [name, value] : positive) {
    if (value < 1) {
      return absl::InvalidArgumentError(fmt::format("{} is {}; it must be >= 1", name, value));
    }
  }
  if (r.num_gpus_per_node < 0) {
    return absl::InvalidArgumentError(
        fmt::format("{} is {}; it must be >= 0 (0 = node 0's device count)",
                    NodeSizeKey(r.device_kind), r.num_gpus_per_node));
  }
  if (r.rollout_num_gpus.has_value() && *r.rollout_num_gpus < 0) {
    return absl::InvalidArgumentError(
        fmt::format("cluster.rollout_num_gpus is {}; it must be >= 0 (0 = no local engines)",
                    *r.rollout_num_gpus));
  }
  if (!r.colocate && !r.rollout_num_gpus.has_value()) {
    return absl::InvalidArgumentError(
        "cluster.rollout_num_gpus is required when cluster.colocate is false: set the devices for "
        "engines, or 0 to use external engines only");
  }
  return absl::OkStatus();
}

// The not-enough-devices error, with the breakdown and the cheapest fix.
Status NotEnoughDevices(const PlacementRequest& r, const std::vector<NodeResources>& nodes,
                        int offered, int world, int rollout) {
  const DeviceKind kind = r.device_kind;
  const std::string where = fmt::format("the {} node{} offer{}", nodes.size(),
                                        nodes.size() == 1 ? "" : "s", nodes.size() == 1 ? "s" : "");
  if (offered == 0) {
    int gpus = 0, slots = 0;
    for (const NodeResources& n : nodes) {
      gpus += n.num_gpus;
      slots += n.num_cpu_slots;
    }
    const DeviceKind other = kind == DeviceKind::kGpu ? DeviceKind::kCpuSlot : DeviceKind::kGpu;
    const int other_count = other == DeviceKind::kGpu ? gpus : slots;
    if (other_count == 0) {
      return absl::ResourceExhaustedError(fmt::format("{} no {} and no {}; add nodes with devices",
                                                      where, Units(kind), Units(other)));
    }
    return absl::ResourceExhaustedError(fmt::format(
        "{} no {} ({} {}); set cluster.device: {} to place the job on {}, or add "
        "nodes with {}",
        where, Units(kind), nodes.size() == 1 ? "it has" : "they have", Count(other_count, other),
        other == DeviceKind::kGpu ? "cuda" : "cpu", Units(other), Units(kind)));
  }
  std::string breakdown = fmt::format("trainer {}", world);
  std::string hint;
  int need = 0;
  if (r.colocate) {
    const int extra = std::max(0, rollout - world);
    need = world + extra;
    if (extra > 0) {
      breakdown +=
          fmt::format(" + {} rollout-only for cluster.rollout_num_gpus {}", extra, rollout);
    } else {
      breakdown += "; engines share the trainer's";
    }
    hint = extra > 0 && world <= offered
               ? fmt::format("add nodes or lower cluster.rollout_num_gpus to at most {}", offered)
               : "add nodes or lower cluster.actor_num_nodes × cluster.actor_num_gpus_per_node";
  } else {
    const int critic = r.with_critic ? world : 0;
    need = world + critic + rollout;
    if (critic > 0) breakdown += fmt::format(" + critic {}", critic);
    if (rollout > 0) breakdown += fmt::format(" + engines {}", rollout);
    hint = std::max(world, rollout) <= offered ? "add nodes or set cluster.colocate: true"
                                               : "add nodes, or lower cluster.actor_num_nodes × "
                                                 "cluster.actor_num_gpus_per_node (trainer) or "
                                                 "cluster.rollout_num_gpus (engines)";
  }
  return absl::ResourceExhaustedError(fmt::format("need {} ({}) but {} {}; {}", Count(need, kind),
                                                  breakdown, where, offered, hint));
}

// Places `count` engines of `k` devices (disaggregated engines, or the rollout-only engines
// beyond the trainer's devices when colocated). `first` numbers them in messages.
StatusOr<std::vector<EngineParts>> AllocateEngines(Allocator& alloc, int count, int k,
                                                   int node_size, int max_node_devices,
                                                   DeviceKind kind, int first) {
  std::vector<EngineParts> engines;
  for (int e = 0; e < count; ++e) {
    EngineParts parts;
    if (k <= node_size) {
      std::optional<std::vector<Device>> devices = alloc.Take(k);
      if (!devices.has_value()) {
        std::string hint =
            k > max_node_devices
                ? fmt::format(
                      "no node has {}: set {} to the real node size ({}) so that the "
                      "engine spans nodes, or lower cluster.rollout_num_gpus_per_engine",
                      k, NodeSizeKey(kind), max_node_devices)
                : "use a cluster.rollout_num_gpus_per_engine that divides the devices each node "
                  "has left, or add nodes";
        return absl::ResourceExhaustedError(fmt::format(
            "cannot place engine {}: it needs {} on one node (cluster.rollout_num_gpus_per_engine "
            "{} <= node size {}), but free {} per node are: {}; {}",
            first + e, Count(k, kind), k, node_size, Units(kind), alloc.FreeSummary(), hint));
      }
      parts.push_back(std::move(*devices));
    } else {
      const int num_parts = k / node_size;
      std::vector<int> taken_nodes;
      for (int p = 0; p < num_parts; ++p) {
        std::optional<std::vector<Device>> devices = alloc.Take(node_size, taken_nodes);
        if (!devices.has_value()) {
          return absl::ResourceExhaustedError(
              fmt::format("cannot place engine {}: it spans {} nodes with {} free each "
                          "(cluster.rollout_num_gpus_per_engine {} / node size {}), but free {} "
                          "per node are: {}; add nodes or lower "
                          "cluster.rollout_num_gpus_per_engine",
                          first + e, num_parts, Count(node_size, kind), k, node_size, Units(kind),
                          alloc.FreeSummary()));
        }
        taken_nodes.push_back(devices->front().node_index);
        parts.push_back(std::move(*devices));
      }
    }
    engines.push_back(std::move(parts));
  }
  return engines;
}

// Colocated engines on the trainer's devices: consecutive chunks of `k` in rank order, each on
// one node, or for a multi-node engine node_size devices on each of k / node_size nodes.
StatusOr<std::vector<EngineParts>> ChunkTrainerDevices(const std::vector<Device>& pool, int k,
                                                       int node_size, DeviceKind kind) {
  std::vector<EngineParts> engines;
  const int part_size = std::min(k, node_size);
  for (size_t start = 0; start < pool.size(); start += k) {
    const int e = static_cast<int>(engines.size());
    EngineParts parts;
    std::set<int> nodes_seen;
    for (int p = 0; p < k / part_size; ++p) {
      auto begin = pool.begin() + start + p * part_size;
      std::vector<Device> part(begin, begin + part_size);
      const bool one_node = std::all_of(part.begin(), part.end(), [&](const Device& d) {
        return d.node_index == part.front().node_index;
      });
      if (!one_node || !nodes_seen.insert(part.front().node_index).second) {
        std::string taken;
        for (size_t i = start; i < start + k; ++i) {
          taken += fmt::format("{}{}", i == start ? "" : ", ", DeviceName(pool[i]));
        }
        return absl::InvalidArgumentError(fmt::format(
            "with cluster.colocate: true, engine {} takes the trainer's {} {} in rank order, "
            "which {}; make the trainer's {} on each node a multiple of {}",
            e, Units(kind), taken,
            k <= node_size ? "straddle a node boundary"
                           : fmt::format("are not {} on each of {} distinct nodes",
                                         Count(node_size, kind), k / node_size),
            Units(kind),
            k <= node_size ? fmt::format("cluster.rollout_num_gpus_per_engine {}", k)
                           : fmt::format("the node size {}", node_size)));
      }
      parts.push_back(std::move(part));
    }
    engines.push_back(std::move(parts));
  }
  return engines;
}

ActorPlacement MakeActor(ActorRole role, int rank, std::vector<Device> devices) {
  ActorPlacement actor;
  actor.role = role;
  actor.rank = rank;
  actor.node_index = devices.front().node_index;
  actor.node_name = devices.front().node_name;
  actor.devices = std::move(devices);
  return actor;
}

// Megatron's rank order: rank = ((pp·DP + dp)·CP + cp)·TP + tp.
ParallelRank TrainerCoordinates(int rank, int tp, int cp, int dp) {
  ParallelRank c;
  c.tp = rank % tp;
  c.cp = (rank / tp) % cp;
  c.dp = (rank / (tp * cp)) % dp;
  c.pp = rank / (tp * cp * dp);
  return c;
}

std::string FormatDevices(const std::vector<Device>& devices) {
  if (devices.empty()) return "-";
  std::string out = devices.front().kind == DeviceKind::kGpu ? "gpu " : "cpu ";
  for (size_t i = 0; i < devices.size();) {
    size_t j = i;
    while (j + 1 < devices.size() && devices[j + 1].local_index == devices[j].local_index + 1) ++j;
    out += i == 0 ? "" : ",";
    out += j == i ? fmt::format("{}", devices[i].local_index)
                  : fmt::format("{}-{}", devices[i].local_index, devices[j].local_index);
    i = j + 1;
  }
  return out;
}

}  // namespace

std::string DeviceKindName(DeviceKind kind) {
  return kind == DeviceKind::kGpu ? "gpu" : "cpu slot";
}

std::string StrategyName(PlacementStrategy strategy) {
  return strategy == PlacementStrategy::kPack ? "pack" : "spread";
}

std::string RoleName(ActorRole role) {
  switch (role) {
    case ActorRole::kRolloutCoordinator:
      return "rollout";
    case ActorRole::kTrainer:
      return "trainer";
    case ActorRole::kCritic:
      return "critic";
    case ActorRole::kEngine:
      return "engine";
  }
  return "unknown";
}

StatusOr<PlacementPlan> PlanPlacement(const PlacementRequest& r,
                                      const std::vector<NodeResources>& nodes) {
  SLIME_RETURN_IF_ERROR(ValidateNodes(nodes));
  SLIME_RETURN_IF_ERROR(ValidateRequest(r));
  const DeviceKind kind = r.device_kind;

  const int world = r.actor_num_nodes * r.actor_num_gpus_per_node;
  const int model_parallel = r.tensor_parallel * r.pipeline_parallel * r.context_parallel;
  if (world % model_parallel != 0) {
    return absl::InvalidArgumentError(
        fmt::format("trainer world {} (cluster.actor_num_nodes {} × "
                    "cluster.actor_num_gpus_per_node {}) is not divisible by "
                    "train.tensor_model_parallel_size {} × train.pipeline_model_parallel_size {} × "
                    "train.context_parallel_size {} = {}; data parallel "
                    "must be a whole number",
                    world, r.actor_num_nodes, r.actor_num_gpus_per_node, r.tensor_parallel,
                    r.pipeline_parallel, r.context_parallel, model_parallel));
  }

  PlacementPlan plan;
  plan.colocated = r.colocate;
  plan.strategy = r.strategy;
  plan.device_kind = kind;
  plan.tensor_parallel = r.tensor_parallel;
  plan.pipeline_parallel = r.pipeline_parallel;
  plan.context_parallel = r.context_parallel;
  plan.data_parallel = world / model_parallel;
  if (r.expert_parallel < 1 || plan.data_parallel % r.expert_parallel != 0) {
    return absl::InvalidArgumentError(fmt::format(
        "train.expert_model_parallel_size {} must divide the data-parallel size {}",
        r.expert_parallel, plan.data_parallel));
  }
  plan.expert_parallel = r.expert_parallel;
  int offered = 0, max_node_devices = 0;
  for (const NodeResources& n : nodes) {
    const int count = kind == DeviceKind::kGpu ? n.num_gpus : n.num_cpu_slots;
    plan.nodes.push_back(PlanNode{n.name, count});
    offered += count;
    max_node_devices = std::max(max_node_devices, count);
  }

  const int rollout = r.rollout_num_gpus.value_or(world);
  const int k = r.rollout_num_gpus_per_engine;
  const int node_size = r.num_gpus_per_node > 0 ? r.num_gpus_per_node : plan.nodes[0].num_devices;
  if (rollout % k != 0) {
    return absl::InvalidArgumentError(fmt::format(
        "cluster.rollout_num_gpus {} is not a multiple of cluster.rollout_num_gpus_per_engine {}",
        rollout, k));
  }
  if (rollout > 0 && node_size == 0) {
    return absl::InvalidArgumentError(
        fmt::format("node 0 ('{}') has no {}, so the node size for engines is unknown; set {}",
                    nodes[0].name, Units(kind), NodeSizeKey(kind)));
  }
  if (rollout > 0 && k > node_size && k % node_size != 0) {
    return absl::InvalidArgumentError(fmt::format(
        "cluster.rollout_num_gpus_per_engine {} exceeds the node size {} but is not a multiple of "
        "it; an engine either fits in one node or spans whole nodes: use at most {} or a "
        "multiple of {}",
        k, node_size, node_size, node_size));
  }
  const int need =
      r.colocate ? std::max(world, rollout) : world + (r.with_critic ? world : 0) + rollout;
  if (need > offered) return NotEnoughDevices(r, nodes, offered, world, rollout);

  Allocator alloc(plan.nodes, kind, r.strategy);
  auto take_singles = [&](int count) {
    std::vector<Device> devices;
    for (int i = 0; i < count; ++i) {
      std::optional<std::vector<Device>> d = alloc.Take(1);
      if (!d.has_value()) break;  // cannot happen: the total was checked above
      devices.push_back(d->front());
    }
    std::sort(devices.begin(), devices.end(), DeviceLess);
    return devices;
  };
  const std::vector<Device> trainer = take_singles(world);
  const std::vector<Device> critic = !r.with_critic ? std::vector<Device>{}
                                     : r.colocate   ? trainer
                                                    : take_singles(world);
  if (static_cast<int>(trainer.size()) != world ||
      static_cast<int>(critic.size()) != (r.with_critic ? world : 0)) {
    return absl::InternalError("placement: device count check and allocation disagree");
  }

  std::vector<EngineParts> engines;
  if (rollout > 0) {
    if (!r.colocate) {
      SLIME_ASSIGN_OR_RETURN(
          engines, AllocateEngines(alloc, rollout / k, k, node_size, max_node_devices, kind, 0));
    } else {
      if (rollout > world && world % k != 0) {
        return absl::InvalidArgumentError(
            fmt::format("with cluster.colocate: true and cluster.rollout_num_gpus {} above the "
                        "trainer's {}, the "
                        "trainer's {} must be a multiple of cluster.rollout_num_gpus_per_engine {} "
                        "so that no engine "
                        "mixes trainer and rollout-only devices",
                        rollout, world, Units(kind), k));
      }
      const std::vector<Device> pool(trainer.begin(), trainer.begin() + std::min(world, rollout));
      SLIME_ASSIGN_OR_RETURN(engines, ChunkTrainerDevices(pool, k, node_size, kind));
      if (rollout > world) {
        SLIME_ASSIGN_OR_RETURN(
            std::vector<EngineParts> extra,
            AllocateEngines(alloc, (rollout - world) / k, k, node_size, max_node_devices, kind,
                            static_cast<int>(engines.size())));
        for (EngineParts& e : extra) engines.push_back(std::move(e));
      }
    }
    std::stable_sort(engines.begin(), engines.end(),
                     [](const EngineParts& a, const EngineParts& b) {
                       return DeviceLess(a.front().front(), b.front().front());
                     });
    plan.devices_per_engine = k;
  }

  // Actors: rollout coordinator, trainer, critic, engines.
  ActorPlacement coordinator;
  coordinator.role = ActorRole::kRolloutCoordinator;
  coordinator.node_index = 0;
  coordinator.node_name = nodes[0].name;
  plan.actors.push_back(coordinator);
  for (int rank = 0; rank < world; ++rank) {
    ActorPlacement a = MakeActor(ActorRole::kTrainer, rank, {trainer[rank]});
    a.parallel =
        TrainerCoordinates(rank, r.tensor_parallel, r.context_parallel, plan.data_parallel);
    plan.actors.push_back(std::move(a));
  }
  for (int rank = 0; rank < static_cast<int>(critic.size()); ++rank) {
    ActorPlacement a = MakeActor(ActorRole::kCritic, rank, {critic[rank]});
    a.parallel =
        TrainerCoordinates(rank, r.tensor_parallel, r.context_parallel, plan.data_parallel);
    plan.actors.push_back(std::move(a));
  }
  for (int e = 0; e < static_cast<int>(engines.size()); ++e) {
    const int num_parts = static_cast<int>(engines[e].size());
    for (int p = 0; p < num_parts; ++p) {
      ActorPlacement a = MakeActor(ActorRole::kEngine, e, engines[e][p]);
      a.engine_node_rank = p;
      a.engine_num_nodes = num_parts;
      plan.actors.push_back(std::move(a));
    }
  }

  for (const ActorPlacement& a : plan.actors) {
    plan.devices.insert(plan.devices.end(), a.devices.begin(), a.devices.end());
  }
  std::sort(plan.devices.begin(), plan.devices.end(), DeviceLess);
  plan.devices.erase(std::unique(plan.devices.begin(), plan.devices.end()), plan.devices.end());
  return plan;
}

std::vector<ActorPlacement> ActorsWithRole(const PlacementPlan& plan, ActorRole role) {
  std::vector<ActorPlacement> out;
  for (const ActorPlacement& a : plan.actors) {
    if (a.role == role) out.push_back(a);
  }
  return out;
}

int NumNodesUsed(const PlacementPlan& plan) {
  std::set<int> used;
  for (const ActorPlacement& a : plan.actors) used.insert(a.node_index);
  return static_cast<int>(used.size());
}

std::string FormatPlan(const PlacementPlan& plan) {
  const int world = static_cast<int>(ActorsWithRole(plan, ActorRole::kTrainer).size());
  std::string out =
      fmt::format("placement: {} node{}, {}; trainer {} = DP {} × TP {} × PP {} × CP {}",
                  plan.nodes.size(), plan.nodes.size() == 1 ? "" : "s", Units(plan.device_kind), world, plan.data_parallel,
                  plan.tensor_parallel, plan.pipeline_parallel, plan.context_parallel);
  if (plan.expert_parallel > 1) {
    out += fmt::format(" (DP = EP {} × expert-DP {})", plan.expert_parallel,
                       plan.data_parallel / plan.expert_parallel);
  }
  if (plan.devices_per_engine > 0) {
    std::set<int> engines;
    for (const ActorPlacement& a : ActorsWithRole(plan, ActorRole::kEngine)) engines.insert(a.rank);
    out += fmt::format("; engines {} × {}", engines.size(),
                       Count(plan.devices_per_engine, plan.device_kind));
  } else {
    out += "; no local engines";
  }
  out += "\n";

  std::vector<std::vector<std::string>> rows = {
      {"role", "rank", "node", "devices", "dp", "tp", "pp", "cp", ""}};
  for (const ActorPlacement& a : plan.actors) {
    const bool trainer_like = a.role == ActorRole::kTrainer || a.role == ActorRole::kCritic;
    auto coord = [&](int v) { return trainer_like ? std::to_string(v) : std::string("-"); };
    rows.push_back({RoleName(a.role), std::to_string(a.rank), a.node_name, FormatDevices(a.devices),
                    coord(a.parallel.dp), coord(a.parallel.tp), coord(a.parallel.pp),
                    coord(a.parallel.cp),
                    a.engine_num_nodes > 1
                        ? fmt::format("part {} of {}", a.engine_node_rank, a.engine_num_nodes)
                        : ""});
  }
  std::vector<size_t> width(rows.front().size(), 0);
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  for (const auto& row : rows) {
    std::string line = " ";
    for (size_t c = 0; c < row.size(); ++c) line += fmt::format(" {:<{}}", row[c], width[c]);
    line.erase(line.find_last_not_of(' ') + 1);
    out += line + "\n";
  }

  std::vector<int> used(plan.nodes.size(), 0);
  for (const Device& d : plan.devices) {
    if (d.node_index >= 0 && d.node_index < static_cast<int>(used.size())) ++used[d.node_index];
  }
  out += fmt::format(
      "summary: {}, {}; {} used per node:", plan.colocated ? "colocated" : "disaggregated",
      StrategyName(plan.strategy), Units(plan.device_kind));
  for (size_t i = 0; i < plan.nodes.size(); ++i) {
    out += fmt::format("{} {} {}/{}", i == 0 ? "" : ",", plan.nodes[i].name, used[i],
                       plan.nodes[i].num_devices);
  }
  out += "\n";
  return out;
}

}  // namespace slime::runtime
