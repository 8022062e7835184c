#include "slime/runtime/placement.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <ostream>
#include <set>
#include <string>
#include <tuple>
#include <vector>

namespace slime::runtime {

// Readable gtest failures ("node-1:3") instead of byte dumps.
void PrintTo(const Device& d, std::ostream* os) { *os << d.node_name << ":" << d.local_index; }

namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<NodeResources> GpuNodes(int count, int gpus) {
  std::vector<NodeResources> nodes;
  for (int i = 0; i < count; ++i) nodes.push_back({"node-" + std::to_string(i), gpus, 64});
  return nodes;
}

// "node-1:0,1" per actor of `role` (engine parts are listed separately).
std::vector<std::string> Layout(const PlacementPlan& plan, ActorRole role) {
  std::vector<std::string> out;
  for (const ActorPlacement& a : ActorsWithRole(plan, role)) {
    std::string s = a.node_name + ":";
    for (size_t i = 0; i < a.devices.size(); ++i) {
      s += (i == 0 ? "" : ",") + std::to_string(a.devices[i].local_index);
    }
    out.push_back(s);
  }
  return out;
}

PlacementRequest Trainer(int nodes, int per_node) {
  PlacementRequest r;
  r.actor_num_nodes = nodes;
  r.actor_num_gpus_per_node = per_node;
  return r;
}

PlacementPlan PlanOk(const PlacementRequest& r, const std::vector<NodeResources>& nodes) {
  StatusOr<PlacementPlan> plan = PlanPlacement(r, nodes);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? *plan : PlacementPlan{};
}

std::string PlanError(const PlacementRequest& r, const std::vector<NodeResources>& nodes) {
  StatusOr<PlacementPlan> plan = PlanPlacement(r, nodes);
  EXPECT_FALSE(plan.ok());
  return plan.ok() ? "" : std::string(plan.status().message());
}

// ---- Layouts ----------------------------------------------------------------------------------

TEST(PlacementTest, Colocated1x8SharesTrainerGpusWithEngines) {
  PlacementRequest r = Trainer(1, 8);
  r.colocate = true;
  r.rollout_num_gpus_per_engine = 2;  // rollout_num_gpus defaults to the trainer's 8
  PlacementPlan plan = PlanOk(r, GpuNodes(1, 8));
  EXPECT_TRUE(plan.colocated);
  EXPECT_EQ(plan.data_parallel, 8);
  EXPECT_EQ(plan.devices_per_engine, 2);
  EXPECT_THAT(Layout(plan, ActorRole::kTrainer),
              ElementsAre("node-0:0", "node-0:1", "node-0:2", "node-0:3", "node-0:4", "node-0:5",
                          "node-0:6", "node-0:7"));
  EXPECT_THAT(Layout(plan, ActorRole::kEngine),
              ElementsAre("node-0:0,1", "node-0:2,3", "node-0:4,5", "node-0:6,7"));
  EXPECT_EQ(plan.devices.size(), 8u);
  const ActorPlacement& coordinator = plan.actors.front();
  EXPECT_EQ(coordinator.role, ActorRole::kRolloutCoordinator);
  EXPECT_EQ(coordinator.node_index, 0);
  EXPECT_TRUE(coordinator.devices.empty());
}

TEST(PlacementTest, Disaggregated1x8GivesTrainerThenEnginesDisjointGpus) {
  PlacementRequest r = Trainer(1, 4);
  r.rollout_num_gpus = 4;
  PlacementPlan plan = PlanOk(r, GpuNodes(1, 8));
  EXPECT_FALSE(plan.colocated);
  EXPECT_THAT(Layout(plan, ActorRole::kTrainer),
              ElementsAre("node-0:0", "node-0:1", "node-0:2", "node-0:3"));
  EXPECT_THAT(Layout(plan, ActorRole::kEngine),
              ElementsAre("node-0:4", "node-0:5", "node-0:6", "node-0:7"));
  EXPECT_EQ(plan.actors.size(), 1u + 4u + 4u);
}

TEST(PlacementTest, Colocated2x4KeepsEachEngineOnOneNode) {
  PlacementRequest r = Trainer(2, 4);
  r.colocate = true;
  r.tensor_parallel = 2;
  r.rollout_num_gpus_per_engine = 4;
  PlacementPlan plan = PlanOk(r, GpuNodes(2, 4));
  EXPECT_THAT(Layout(plan, ActorRole::kTrainer),
              ElementsAre("node-0:0", "node-0:1", "node-0:2", "node-0:3", "node-1:0", "node-1:1",
                          "node-1:2", "node-1:3"));
  EXPECT_THAT(Layout(plan, ActorRole::kEngine), ElementsAre("node-0:0,1,2,3", "node-1:0,1,2,3"));
  EXPECT_EQ(NumNodesUsed(plan), 2);
}

TEST(PlacementTest, Disaggregated2x4PackFillsNodeZeroFirst) {
  PlacementRequest r = Trainer(1, 4);
  r.rollout_num_gpus = 4;
  r.rollout_num_gpus_per_engine = 2;
  PlacementPlan plan = PlanOk(r, GpuNodes(2, 4));
  EXPECT_THAT(Layout(plan, ActorRole::kTrainer),
              ElementsAre("node-0:0", "node-0:1", "node-0:2", "node-0:3"));
  EXPECT_THAT(Layout(plan, ActorRole::kEngine), ElementsAre("node-1:0,1", "node-1:2,3"));
}

TEST(PlacementTest, Disaggregated2x4SpreadRoundRobinsBundles) {
  PlacementRequest r = Trainer(1, 4);
  r.strategy = PlacementStrategy::kSpread;
  r.rollout_num_gpus = 4;
  r.rollout_num_gpus_per_engine = 2;
  PlacementPlan plan = PlanOk(r, GpuNodes(2, 4));
  // Trainer bundles go node-0, node-1, node-0, node-1; ranks then follow (node, index).
  EXPECT_THAT(Layout(plan, ActorRole::kTrainer),
              ElementsAre("node-0:0", "node-0:1", "node-1:0", "node-1:1"));
  EXPECT_THAT(Layout(plan, ActorRole::kEngine), ElementsAre("node-0:2,3", "node-1:2,3"));
}

TEST(PlacementTest, SpreadCursorCarriesAcrossRolesAndSkipsFullNodes) {
  PlacementRequest r = Trainer(1, 2);
  r.strategy = PlacementStrategy::kSpread;
  r.rollout_num_gpus = 2;
  PlacementPlan plan = PlanOk(r, GpuNodes(3, 2));
  EXPECT_THAT(Layout(plan, ActorRole::kTrainer), ElementsAre("node-0:0", "node-1:0"));
  // The cursor stands at node-2 after the trainer: engines go to node-2, then node-0.
  EXPECT_THAT(Layout(plan, ActorRole::kEngine), ElementsAre("node-0:1", "node-2:0"));

  PlacementRequest uneven = Trainer(1, 4);
  uneven.strategy = PlacementStrategy::kSpread;
  uneven.rollout_num_gpus = 0;
  PlacementPlan skewed = PlanOk(uneven, {{"small", 1, 0}, {"big", 3, 0}});
  EXPECT_THAT(Layout(skewed, ActorRole::kTrainer),
              ElementsAre("small:0", "big:0", "big:1", "big:2"));
}

TEST(PlacementTest, SpreadOnOneNodeMatchesPack) {
  PlacementRequest r = Trainer(1, 4);
  r.rollout_num_gpus = 4;
  r.rollout_num_gpus_per_engine = 2;
  PlacementPlan pack = PlanOk(r, GpuNodes(1, 8));
  r.strategy = PlacementStrategy::kSpread;
  PlacementPlan spread = PlanOk(r, GpuNodes(1, 8));
  EXPECT_EQ(spread.strategy, PlacementStrategy::kSpread);
  spread.strategy = PlacementStrategy::kPack;
  EXPECT_EQ(pack, spread);
}

TEST(PlacementTest, TrainerRanksUseMegatronOrderTp2Pp2) {
  PlacementRequest r = Trainer(1, 8);
  r.colocate = true;
  r.tensor_parallel = 2;
  r.pipeline_parallel = 2;
  PlacementPlan plan = PlanOk(r, GpuNodes(1, 8));
  EXPECT_EQ(plan.data_parallel, 2);
  std::vector<std::tuple<int, int, int>> coords;  // (pp, dp, tp)
  for (const ActorPlacement& a : ActorsWithRole(plan, ActorRole::kTrainer)) {
    coords.emplace_back(a.parallel.pp, a.parallel.dp, a.parallel.tp);
    EXPECT_EQ(a.parallel.cp, 0);
    EXPECT_EQ(a.devices.front().local_index, a.rank);
  }
  EXPECT_THAT(coords, ElementsAre(std::tuple(0, 0, 0), std::tuple(0, 0, 1), std::tuple(0, 1, 0),
                                  std::tuple(0, 1, 1), std::tuple(1, 0, 0), std::tuple(1, 0, 1),
                                  std::tuple(1, 1, 0), std::tuple(1, 1, 1)));
}

TEST(PlacementTest, TrainerRanksWithContextParallelFollowTheFormula) {
  PlacementRequest r = Trainer(2, 8);
  r.colocate = true;
  r.tensor_parallel = 2;
  r.context_parallel = 2;
  r.pipeline_parallel = 2;
  PlacementPlan plan = PlanOk(r, GpuNodes(2, 8));
  const int tp = 2, cp = 2, dp = plan.data_parallel;
  EXPECT_EQ(dp, 2);
  std::set<std::tuple<int, int, int, int>> seen;
  for (const ActorPlacement& a : ActorsWithRole(plan, ActorRole::kTrainer)) {
    const ParallelRank& c = a.parallel;
    EXPECT_EQ(((c.pp * dp + c.dp) * cp + c.cp) * tp + c.tp, a.rank);
    seen.emplace(c.pp, c.dp, c.cp, c.tp);
  }
  EXPECT_EQ(seen.size(), 16u);
  EXPECT_EQ(ActorsWithRole(plan, ActorRole::kTrainer)[2].parallel, (ParallelRank{0, 0, 0, 1}));
  EXPECT_EQ(ActorsWithRole(plan, ActorRole::kTrainer)[4].parallel, (ParallelRank{1, 0, 0, 0}));
}

TEST(PlacementTest, MultiNodeEngineSpansWholeNodes) {
  PlacementRequest r = Trainer(1, 4);
  r.rollout_num_gpus = 8;
  r.rollout_num_gpus_per_engine = 8;
  PlacementPlan plan = PlanOk(r, GpuNodes(3, 4));
  EXPECT_THAT(Layout(plan, ActorRole::kEngine), ElementsAre("node-1:0,1,2,3", "node-2:0,1,2,3"));
  std::vector<ActorPlacement> parts = ActorsWithRole(plan, ActorRole::kEngine);
  for (int p = 0; p < 2; ++p) {
    EXPECT_EQ(parts[p].rank, 0);
    EXPECT_EQ(parts[p].engine_node_rank, p);
    EXPECT_EQ(parts[p].engine_num_nodes, 2);
  }

  PlacementRequest colocated = Trainer(2, 4);
  colocated.colocate = true;
  colocated.rollout_num_gpus_per_engine = 8;
  PlacementPlan shared = PlanOk(colocated, GpuNodes(2, 4));
  EXPECT_THAT(Layout(shared, ActorRole::kEngine), ElementsAre("node-0:0,1,2,3", "node-1:0,1,2,3"));
  EXPECT_EQ(ActorsWithRole(shared, ActorRole::kEngine)[1].engine_node_rank, 1);
}

TEST(PlacementTest, ExplicitNodeSizeSplitsEngineIntoParts) {
  // num_gpus_per_node 2 on 4-GPU nodes: a 4-device engine is two parts of 2 on distinct nodes.
  PlacementRequest r = Trainer(1, 2);
  r.rollout_num_gpus = 4;
  r.rollout_num_gpus_per_engine = 4;
  r.num_gpus_per_node = 2;
  PlacementPlan plan = PlanOk(r, GpuNodes(2, 4));
  EXPECT_THAT(Layout(plan, ActorRole::kEngine), ElementsAre("node-0:2,3", "node-1:0,1"));

  // The second part must not land on the node of the first even though it has room there.
  r.actor_num_gpus_per_node = 4;
  PlacementPlan distinct = PlanOk(r, GpuNodes(3, 4));
  EXPECT_THAT(Layout(distinct, ActorRole::kEngine), ElementsAre("node-1:0,1", "node-2:0,1"));
}

TEST(PlacementTest, ColocatedRolloutSmallerOrLargerThanTrainer) {
  PlacementRequest fewer = Trainer(1, 8);
  fewer.colocate = true;
  fewer.rollout_num_gpus = 4;
  fewer.rollout_num_gpus_per_engine = 2;
  EXPECT_THAT(Layout(PlanOk(fewer, GpuNodes(1, 8)), ActorRole::kEngine),
              ElementsAre("node-0:0,1", "node-0:2,3"));

  PlacementRequest more = Trainer(1, 4);
  more.colocate = true;
  more.rollout_num_gpus = 8;
  more.rollout_num_gpus_per_engine = 2;
  PlacementPlan plan = PlanOk(more, GpuNodes(1, 8));
  EXPECT_THAT(Layout(plan, ActorRole::kTrainer),
              ElementsAre("node-0:0", "node-0:1", "node-0:2", "node-0:3"));
  EXPECT_THAT(Layout(plan, ActorRole::kEngine),
              ElementsAre("node-0:0,1", "node-0:2,3", "node-0:4,5", "node-0:6,7"));
}

TEST(PlacementTest, ZeroRolloutGpusMeansExternalEnginesOnly) {
  PlacementRequest r = Trainer(1, 8);
  r.rollout_num_gpus = 0;
  PlacementPlan plan = PlanOk(r, GpuNodes(1, 8));
  EXPECT_TRUE(ActorsWithRole(plan, ActorRole::kEngine).empty());
  EXPECT_EQ(plan.devices_per_engine, 0);
  EXPECT_THAT(FormatPlan(plan), HasSubstr("no local engines"));
}

TEST(PlacementTest, CpuSlotOnlyNodes) {
  PlacementRequest r = Trainer(1, 2);
  r.device_kind = DeviceKind::kCpuSlot;
  r.rollout_num_gpus = 2;
  PlacementPlan plan = PlanOk(r, {{"cpu-a", 0, 2}, {"cpu-b", 0, 2}});
  EXPECT_EQ(plan.device_kind, DeviceKind::kCpuSlot);
  EXPECT_THAT(Layout(plan, ActorRole::kTrainer), ElementsAre("cpu-a:0", "cpu-a:1"));
  EXPECT_THAT(Layout(plan, ActorRole::kEngine), ElementsAre("cpu-b:0", "cpu-b:1"));
  for (const Device& d : plan.devices) EXPECT_EQ(d.kind, DeviceKind::kCpuSlot);
  EXPECT_THAT(FormatPlan(plan), HasSubstr("cpu 0"));
  EXPECT_THAT(FormatPlan(plan), HasSubstr("CPU slots used per node: cpu-a 2/2, cpu-b 2/2"));
}

TEST(PlacementTest, PpoCriticOwnDevicesWhenDisaggregatedSharedWhenColocated) {
  PlacementRequest r = Trainer(1, 2);
  r.with_critic = true;
  r.rollout_num_gpus = 4;
  PlacementPlan plan = PlanOk(r, GpuNodes(1, 8));
  EXPECT_THAT(Layout(plan, ActorRole::kTrainer), ElementsAre("node-0:0", "node-0:1"));
  EXPECT_THAT(Layout(plan, ActorRole::kCritic), ElementsAre("node-0:2", "node-0:3"));
  EXPECT_THAT(Layout(plan, ActorRole::kEngine),
              ElementsAre("node-0:4", "node-0:5", "node-0:6", "node-0:7"));

  r.colocate = true;
  r.tensor_parallel = 2;
  PlacementPlan shared = PlanOk(r, GpuNodes(1, 8));
  std::vector<ActorPlacement> trainer = ActorsWithRole(shared, ActorRole::kTrainer);
  std::vector<ActorPlacement> critic = ActorsWithRole(shared, ActorRole::kCritic);
  ASSERT_EQ(critic.size(), 2u);
  for (size_t i = 0; i < critic.size(); ++i) {
    EXPECT_EQ(critic[i].devices, trainer[i].devices);
    EXPECT_EQ(critic[i].parallel, trainer[i].parallel);
  }
  EXPECT_EQ(shared.devices.size(), 4u);  // trainer 2 + 2 rollout-only
}

// ---- Errors -----------------------------------------------------------------------------------

TEST(PlacementErrorTest, NotEnoughGpusDisaggregated) {
  PlacementRequest r = Trainer(1, 8);
  r.rollout_num_gpus = 4;
  EXPECT_EQ(PlanError(r, GpuNodes(1, 8)),
            "need 12 GPUs (trainer 8 + engines 4) but the 1 node offers 8; add nodes or set "
            "cluster.colocate: true");
  // The critic counts when disaggregated but shares the trainer's GPUs when colocated, so
  // colocating would fit here...
  r.with_critic = true;
  r.rollout_num_gpus = 16;
  EXPECT_EQ(PlanError(r, GpuNodes(2, 8)),
            "need 32 GPUs (trainer 8 + critic 8 + engines 16) but the 2 nodes offer 16; add nodes "
            "or set cluster.colocate: true");
  // ... but not here.
  r.rollout_num_gpus = 24;
  EXPECT_EQ(
      PlanError(r, GpuNodes(2, 8)),
      "need 40 GPUs (trainer 8 + critic 8 + engines 24) but the 2 nodes offer 16; add "
      "nodes, or lower cluster.actor_num_nodes × cluster.actor_num_gpus_per_node (trainer) or "
      "cluster.rollout_num_gpus (engines)");
  EXPECT_EQ(PlanPlacement(r, GpuNodes(2, 8)).status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(PlacementErrorTest, NotEnoughGpusColocated) {
  PlacementRequest r = Trainer(2, 8);
  r.colocate = true;
  EXPECT_EQ(PlanError(r, GpuNodes(1, 8)),
            "need 16 GPUs (trainer 16; engines share the trainer's) but the 1 node offers 8; add "
            "nodes or lower cluster.actor_num_nodes × cluster.actor_num_gpus_per_node");
  PlacementRequest extra = Trainer(1, 8);
  extra.colocate = true;
  extra.rollout_num_gpus = 12;
  EXPECT_EQ(
      PlanError(extra, GpuNodes(1, 8)),
      "need 12 GPUs (trainer 8 + 4 rollout-only for cluster.rollout_num_gpus 12) but the 1 node "
      "offers 8; add nodes or lower cluster.rollout_num_gpus to at most 8");
}

TEST(PlacementErrorTest, WrongDeviceKind) {
  PlacementRequest r = Trainer(1, 2);
  r.rollout_num_gpus = 0;
  EXPECT_EQ(PlanError(r, {{"cpu-a", 0, 8}}),
            "the 1 node offers no GPUs (it has 8 CPU slots); set cluster.device: cpu to place the "
            "job on CPU slots, "
            "or add nodes with GPUs");
  r.device_kind = DeviceKind::kCpuSlot;
  EXPECT_EQ(PlanError(r, {{"gpu-a", 8, 0}, {"gpu-b", 8, 0}}),
            "the 2 nodes offer no CPU slots (they have 16 GPUs); set cluster.device: cuda to place "
            "the job on GPUs, "
            "or add nodes with CPU slots");
  EXPECT_EQ(PlanError(r, {{"empty", 0, 0}}),
            "the 1 node offers no CPU slots and no GPUs; add nodes with devices");
}

TEST(PlacementErrorTest, TrainerWorldNotDivisible) {
  PlacementRequest r = Trainer(1, 6);
  r.colocate = true;
  r.tensor_parallel = 4;
  EXPECT_EQ(PlanError(r, GpuNodes(1, 8)),
            "trainer world 6 (cluster.actor_num_nodes 1 × cluster.actor_num_gpus_per_node 6) is "
            "not divisible by "
            "train.tensor_model_parallel_size 4 × train.pipeline_model_parallel_size 1 × "
            "train.context_parallel_size 1 = 4; data parallel "
            "must be a whole number");
}

TEST(PlacementErrorTest, BadRequestFields) {
  PlacementRequest r = Trainer(1, 8);
  r.colocate = true;
  r.pipeline_parallel = 0;
  EXPECT_EQ(PlanError(r, GpuNodes(1, 8)),
            "train.pipeline_model_parallel_size is 0; it must be >= 1");
  r = Trainer(0, 8);
  r.colocate = true;
  EXPECT_EQ(PlanError(r, GpuNodes(1, 8)), "cluster.actor_num_nodes is 0; it must be >= 1");
  r = Trainer(1, 8);
  r.rollout_num_gpus = -1;
  EXPECT_EQ(PlanError(r, GpuNodes(1, 8)),
            "cluster.rollout_num_gpus is -1; it must be >= 0 (0 = no local engines)");
  r = Trainer(1, 8);
  r.colocate = true;
  r.num_gpus_per_node = -2;
  EXPECT_EQ(PlanError(r, GpuNodes(1, 8)),
            "cluster.num_gpus_per_node is -2; it must be >= 0 (0 = node 0's device count)");
  r = Trainer(1, 4);
  EXPECT_EQ(
      PlanError(r, GpuNodes(1, 8)),
      "cluster.rollout_num_gpus is required when cluster.colocate is false: set the devices for "
      "engines, or 0 to use external engines only");
  r = Trainer(1, 4);
  r.rollout_num_gpus = 4;
  r.rollout_num_gpus_per_engine = 3;
  EXPECT_EQ(
      PlanError(r, GpuNodes(1, 8)),
      "cluster.rollout_num_gpus 4 is not a multiple of cluster.rollout_num_gpus_per_engine 3");
  EXPECT_EQ(PlanPlacement(r, GpuNodes(1, 8)).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PlacementErrorTest, BadNodes) {
  PlacementRequest r = Trainer(1, 1);
  r.rollout_num_gpus = 0;
  EXPECT_EQ(PlanError(r, {}),
            "no nodes to place the job on; the head node must register itself before planning");
  EXPECT_EQ(PlanError(r, {{"a", 1, 1}, {"", 1, 1}}), "node 1 has an empty name");
  EXPECT_EQ(PlanError(r, {{"a", 1, 1}, {"a", 1, 1}}),
            "node name 'a' appears twice; node names must be unique");
  EXPECT_EQ(PlanError(r, {{"a", -1, 1}}),
            "node 'a' reports -1 GPUs and 1 CPU slot; counts must be >= 0");
}

TEST(PlacementErrorTest, EngineSizeNotAMultipleOfNodeSize) {
  PlacementRequest r = Trainer(1, 4);
  r.rollout_num_gpus = 6;
  r.rollout_num_gpus_per_engine = 6;
  EXPECT_EQ(
      PlanError(r, GpuNodes(3, 4)),
      "cluster.rollout_num_gpus_per_engine 6 exceeds the node size 4 but is not a multiple of it; "
      "an engine either fits in one node or spans whole nodes: use at most 4 or a multiple "
      "of 4");
}

TEST(PlacementErrorTest, EngineLargerThanRealNodes) {
  PlacementRequest r = Trainer(1, 4);
  r.rollout_num_gpus = 8;
  r.rollout_num_gpus_per_engine = 8;
  r.num_gpus_per_node = 8;  // but the nodes have 4
  EXPECT_EQ(
      PlanError(r, GpuNodes(3, 4)),
      "cannot place engine 0: it needs 8 GPUs on one node (cluster.rollout_num_gpus_per_engine 8 "
      "<= node size 8), but free GPUs per node are: node-0 0, node-1 4, node-2 4; no node "
      "has 8: set cluster.num_gpus_per_node to the real node size (4) so that the engine spans "
      "nodes, or lower cluster.rollout_num_gpus_per_engine");
}

TEST(PlacementErrorTest, EnginesFragmentedAcrossNodes) {
  PlacementRequest r = Trainer(1, 2);
  r.rollout_num_gpus = 6;
  r.rollout_num_gpus_per_engine = 3;
  EXPECT_EQ(
      PlanError(r, GpuNodes(2, 4)),
      "cannot place engine 1: it needs 3 GPUs on one node (cluster.rollout_num_gpus_per_engine 3 "
      "<= node size 4), but free GPUs per node are: node-0 2, node-1 1; use a "
      "cluster.rollout_num_gpus_per_engine that divides the devices each node has left, or add "
      "nodes");
}

TEST(PlacementErrorTest, MultiNodeEngineWithoutEnoughFreeNodes) {
  PlacementRequest r = Trainer(1, 6);
  r.strategy = PlacementStrategy::kSpread;  // leaves 2, 2, 3, 3 free: no whole node for a part
  r.rollout_num_gpus = 8;
  r.rollout_num_gpus_per_engine = 8;
  EXPECT_EQ(
      PlanError(r, GpuNodes(4, 4)),
      "cannot place engine 0: it spans 2 nodes with 4 GPUs free each "
      "(cluster.rollout_num_gpus_per_engine 8 / node size 4), but free GPUs per node are: node-0 "
      "2, node-1 2, node-2 3, node-3 3; add nodes or lower cluster.rollout_num_gpus_per_engine");
}

TEST(PlacementErrorTest, ColocatedEngineStraddlesNodes) {
  PlacementRequest r = Trainer(2, 3);
  r.colocate = true;
  r.rollout_num_gpus_per_engine = 2;
  EXPECT_EQ(PlanError(r, GpuNodes(2, 3)),
            "with cluster.colocate: true, engine 1 takes the trainer's GPUs node-0:2, node-1:0 in "
            "rank order, which straddle a node boundary; make the trainer's GPUs on each node a "
            "multiple of cluster.rollout_num_gpus_per_engine 2");
  r.rollout_num_gpus_per_engine = 6;
  r.num_gpus_per_node = 2;
  EXPECT_EQ(PlanError(r, GpuNodes(2, 3)),
            "with cluster.colocate: true, engine 0 takes the trainer's GPUs node-0:0, node-0:1, "
            "node-0:2, node-1:0, node-1:1, node-1:2 in rank order, which are not 2 GPUs on each "
            "of 3 distinct nodes; make the trainer's GPUs on each node a multiple of the "
            "node size 2");
}

TEST(PlacementErrorTest, ColocatedExtraEnginesNeedAlignedTrainer) {
  PlacementRequest r = Trainer(1, 2);
  r.colocate = true;
  r.rollout_num_gpus = 8;
  r.rollout_num_gpus_per_engine = 4;
  EXPECT_EQ(PlanError(r, GpuNodes(1, 8)),
            "with cluster.colocate: true and cluster.rollout_num_gpus 8 above the trainer's 2, the "
            "trainer's GPUs must be a multiple of cluster.rollout_num_gpus_per_engine 4 so that no "
            "engine mixes trainer and rollout-only devices");
}

TEST(PlacementErrorTest, UnknownNodeSize) {
  PlacementRequest r = Trainer(1, 2);
  r.rollout_num_gpus = 2;
  EXPECT_EQ(PlanError(r, {{"head", 0, 4}, {"gpu", 8, 0}}),
            "node 0 ('head') has no GPUs, so the node size for engines is unknown; set "
            "cluster.num_gpus_per_node");
  r.num_gpus_per_node = 8;
  PlacementPlan plan = PlanOk(r, {{"head", 0, 4}, {"gpu", 8, 0}});
  EXPECT_EQ(plan.actors.front().node_name, "head");  // the coordinator stays on node 0
  EXPECT_THAT(Layout(plan, ActorRole::kEngine), ElementsAre("gpu:2", "gpu:3"));
}

// ---- Determinism, formatting ------------------------------------------------------------------

TEST(PlacementTest, Deterministic) {
  PlacementRequest r = Trainer(2, 4);
  r.strategy = PlacementStrategy::kSpread;
  r.tensor_parallel = 2;
  r.with_critic = true;
  r.rollout_num_gpus = 8;
  r.rollout_num_gpus_per_engine = 2;
  const std::vector<NodeResources> nodes = GpuNodes(4, 8);
  PlacementPlan first = PlanOk(r, nodes);
  for (int i = 0; i < 5; ++i) {
    PlacementPlan again = PlanOk(r, nodes);
    EXPECT_EQ(again, first);
    EXPECT_EQ(FormatPlan(again), FormatPlan(first));
  }
  // Every device appears once in a disaggregated plan.
  std::set<std::pair<int, int>> owned;
  size_t count = 0;
  for (const ActorPlacement& a : first.actors) {
    for (const Device& d : a.devices) {
      owned.emplace(d.node_index, d.local_index);
      ++count;
    }
  }
  EXPECT_EQ(owned.size(), count);
  EXPECT_EQ(count, 8u + 8u + 8u);
}

TEST(PlacementTest, FormatPlanTable) {
  PlacementRequest r = Trainer(1, 4);
  r.tensor_parallel = 2;
  r.rollout_num_gpus = 8;
  r.rollout_num_gpus_per_engine = 8;
  PlacementPlan plan = PlanOk(r, GpuNodes(3, 4));
  EXPECT_EQ(FormatPlan(plan),
            "placement: 3 nodes, GPUs; trainer 4 = DP 2 × TP 2 × PP 1 × CP 1; engines 1 × 8 GPUs\n"
            "  role    rank node   devices dp tp pp cp\n"
            "  rollout 0    node-0 -       -  -  -  -\n"
            "  trainer 0    node-0 gpu 0   0  0  0  0\n"
            "  trainer 1    node-0 gpu 1   0  1  0  0\n"
            "  trainer 2    node-0 gpu 2   1  0  0  0\n"
            "  trainer 3    node-0 gpu 3   1  1  0  0\n"
            "  engine  0    node-1 gpu 0-3 -  -  -  -  part 0 of 2\n"
            "  engine  0    node-2 gpu 0-3 -  -  -  -  part 1 of 2\n"
            "summary: disaggregated, pack; GPUs used per node: node-0 4/4, node-1 4/4, node-2 "
            "4/4\n");
}

}  // namespace
}  // namespace slime::runtime
