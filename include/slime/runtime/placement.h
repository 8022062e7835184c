// Placement planner: which actor of an RL job runs on which node and owns which devices.
//
// The head calls PlanPlacement() once per job with the registered nodes (head node first); the
// resulting PlacementPlan is what `slime_train --dry-run` prints (FormatPlan) and what the head
// ships to node agents (ToProto / FromProto) so each starts the actors that fall on its node.
// This module does not read the config: the app maps `cluster.*` and the trainer's parallel sizes
// onto a PlacementRequest.
//
// Thread-safety: every function here is pure (no shared state) and may be called from any thread.
//
// Placement rules (docs/architecture.md, "Placement"):
//   Devices. Each node offers devices of one kind, the request's `device_kind`: its GPUs, or its
//     CPU slots when the job runs without GPUs. A device is named (node index, local index);
//     nodes are taken in the order given, node 0 being the head node.
//   Bundles. The planner hands out bundles, each on one node: a trainer or critic bundle is one
//     device; an engine bundle is the engine's `rollout_num_gpus_per_engine` devices. An engine
//     larger than the node size (`num_gpus_per_node`, or node 0's device count when 0) spans
//     nodes: it must be a multiple of the node size and gets one bundle of node-size devices on
//     each of size/node-size distinct nodes, one engine process per node ("part"). Within a node
//     a bundle always takes the lowest free local indices, so an engine's devices are consecutive.
//   Strategy. PACK: each bundle goes to the lowest-index node with room for it (fill node 0
//     first). SPREAD: bundles go round-robin: a bundle goes to the first node with room for it,
//     scanning cyclically from the node after the one that received the previous bundle of the
//     plan (the cursor carries over from trainer to critic to engines), starting at node 0.
//   Order of allocation. Trainer (world = actor_num_nodes × actor_num_gpus_per_node devices),
//     then the critic (PPO; same shape), then the engines (rollout_num_gpus devices).
//     Disaggregated: all three device sets are disjoint. Colocated: the critic shares the
//     trainer's devices rank for rank, and the engines take the trainer's devices in rank order
//     (the first rollout_num_gpus of them); rollout_num_gpus above the trainer world adds
//     rollout-only engine bundles after the trainer's (the trainer world must then be a
//     multiple of rollout_num_gpus_per_engine). A colocated engine must not straddle a node
//     boundary of the trainer's devices.
//   Ranks. Within each role, ranks follow (node, local index): trainer rank r owns the r-th
//     trainer device in that order; engine ranks follow each engine's first device. Trainer
//     coordinates use Megatron's order, tp fastest, then cp, then dp, then pp:
//       rank = ((pp·DP + dp)·CP + cp)·TP + tp,   DP = world / (TP·PP·CP).
//   The rollout coordinator is one CPU actor on node 0 and owns no device.
//   `actor_num_nodes` only sizes the trainer world (as in slime); where the trainer lands follows
//   the strategy. Every failure returns InvalidArgument (bad request or node list) or
//   ResourceExhausted (not enough devices, or none free on one node for a bundle), naming what is
//   missing and what to change. Messages use the config keys the app maps onto the request
//   (`cluster.*`, `train.*_parallel_size`, `cluster.device`) so a user can act on them directly.
#ifndef SLIME_RUNTIME_PLACEMENT_H_
#define SLIME_RUNTIME_PLACEMENT_H_

#include <optional>
#include <string>
#include <vector>

#include "slime/common/status.h"

namespace slime::v1 {
class PlacementPlan;
}  // namespace slime::v1

namespace slime::runtime {

enum class DeviceKind { kGpu, kCpuSlot };
enum class PlacementStrategy { kPack, kSpread };
enum class ActorRole { kRolloutCoordinator, kTrainer, kCritic, kEngine };

// "gpu" / "cpu slot"; "pack" / "spread"; "rollout" / "trainer" / "critic" / "engine".
std::string DeviceKindName(DeviceKind kind);
std::string StrategyName(PlacementStrategy strategy);
std::string RoleName(ActorRole role);

// A node as registered with the head. `num_cpu_slots` are the devices when device_kind is
// kCpuSlot (e.g. one per trainer/engine process the node can host).
struct NodeResources {
  std::string name;
  int num_gpus = 0;
  int num_cpu_slots = 0;
};

// Everything placement needs from the job config. The "gpus" fields count devices of
// `device_kind` (GPUs or CPU slots); names mirror slime's cluster flags.
struct PlacementRequest {
  bool colocate = false;
  PlacementStrategy strategy = PlacementStrategy::kPack;
  DeviceKind device_kind = DeviceKind::kGpu;

  // Trainer: world = actor_num_nodes × actor_num_gpus_per_node, which must be divisible by
  // tensor_parallel × pipeline_parallel × context_parallel (the quotient is data parallel).
  int actor_num_nodes = 1;
  int actor_num_gpus_per_node = 8;
  int tensor_parallel = 1;
  int pipeline_parallel = 1;
  int context_parallel = 1;
  // Expert parallelism carved out of the data-parallel ranks (MoE; must divide DP): shown in the
  // plan, it places nothing by itself.
  int expert_parallel = 1;
  bool with_critic = false;  // PPO: a critic with the trainer's shape

  // Engines: total devices (a multiple of rollout_num_gpus_per_engine). Unset: the trainer world
  // when colocated, an error when disaggregated. 0: no local engines (external servers).
  std::optional<int> rollout_num_gpus;
  int rollout_num_gpus_per_engine = 1;
  // Node size for engine spanning; 0 = node 0's device count.
  int num_gpus_per_node = 0;
};

struct Device {
  int node_index = 0;
  std::string node_name;
  DeviceKind kind = DeviceKind::kGpu;
  int local_index = 0;  // CUDA ordinal or CPU slot number on that node

  bool operator==(const Device&) const = default;
};

// Trainer (and critic) coordinates; all zero for other roles.
struct ParallelRank {
  int dp = 0;
  int tp = 0;
  int pp = 0;
  int cp = 0;

  bool operator==(const ParallelRank&) const = default;
};

// One actor process and the devices it owns.
struct ActorPlacement {
  ActorRole role = ActorRole::kTrainer;
  int rank = 0;  // within its role; for engine parts, the engine's rank
  int node_index = 0;
  std::string node_name;
  std::vector<Device> devices;  // sorted by local index; all on `node_index`; empty for rollout
  ParallelRank parallel;
  int engine_node_rank = 0;  // multi-node engines: part index (0 serves HTTP)
  int engine_num_nodes = 1;

  bool operator==(const ActorPlacement&) const = default;
};

struct PlanNode {
  std::string name;
  int num_devices = 0;  // devices of the plan's kind the node offered

  bool operator==(const PlanNode&) const = default;
};

// Invariants (established by PlanPlacement, checked by FromProto): every actor's devices lie on
// its node and are of `device_kind`; disaggregated plans give each device to at most one
// trainer, critic or engine part; `devices` is the sorted union of all actors' devices.
struct PlacementPlan {
  bool colocated = false;
  PlacementStrategy strategy = PlacementStrategy::kPack;
  DeviceKind device_kind = DeviceKind::kGpu;
  int tensor_parallel = 1;
  int pipeline_parallel = 1;
  int context_parallel = 1;
  int data_parallel = 1;
  int expert_parallel = 1;  // within data_parallel
  int devices_per_engine = 0;  // 0 when there are no local engines
  std::vector<PlanNode> nodes;
  std::vector<Device> devices;
  // Rollout coordinator, trainer ranks, critic ranks, then engines by (rank, part).
  std::vector<ActorPlacement> actors;

  bool operator==(const PlacementPlan&) const = default;
};

// Plans the job on `nodes`. Deterministic: the same request and node list give the same plan.
StatusOr<PlacementPlan> PlanPlacement(const PlacementRequest& request,
                                      const std::vector<NodeResources>& nodes);

// Actors of `role`, in plan order.
std::vector<ActorPlacement> ActorsWithRole(const PlacementPlan& plan, ActorRole role);
// Number of nodes hosting at least one actor.
int NumNodesUsed(const PlacementPlan& plan);

// A table for `--dry-run`: a header line, one line per actor (role, rank, node, devices,
// dp/tp/pp/cp) and a summary line with the devices used on each node.
std::string FormatPlan(const PlacementPlan& plan);

// Wire form for head → agent. FromProto(ToProto(p)) == p; FromProto rejects plans that break
// the invariants above (unknown role/kind/strategy, devices off their node, overlaps).
slime::v1::PlacementPlan ToProto(const PlacementPlan& plan);
StatusOr<PlacementPlan> FromProto(const slime::v1::PlacementPlan& proto);

}  // namespace slime::runtime

#endif  // SLIME_RUNTIME_PLACEMENT_H_
