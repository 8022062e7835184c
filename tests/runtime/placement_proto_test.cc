// ToProto / FromProto: the plan the head ships to node agents.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "slime/runtime/placement.h"
#include "slime/v1/placement.pb.h"

namespace slime::runtime {
namespace {

using ::testing::HasSubstr;

std::vector<NodeResources> GpuNodes(int count, int gpus) {
  std::vector<NodeResources> nodes;
  for (int i = 0; i < count; ++i) nodes.push_back({"node-" + std::to_string(i), gpus, 16});
  return nodes;
}

PlacementPlan MustPlan(const PlacementRequest& r, const std::vector<NodeResources>& nodes) {
  StatusOr<PlacementPlan> plan = PlanPlacement(r, nodes);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? *plan : PlacementPlan{};
}

// Plans covering every field: colocated PPO with TP×PP×CP, a SPREAD disaggregated plan with a
// multi-node engine, CPU slots, and external engines only.
std::vector<PlacementPlan> SamplePlans() {
  std::vector<PlacementPlan> plans;
  PlacementRequest colocated;
  colocated.colocate = true;
  colocated.actor_num_nodes = 2;
  colocated.actor_num_gpus_per_node = 8;
  colocated.tensor_parallel = 2;
  colocated.pipeline_parallel = 2;
  colocated.context_parallel = 2;
  colocated.with_critic = true;
  colocated.rollout_num_gpus_per_engine = 4;
  plans.push_back(MustPlan(colocated, GpuNodes(2, 8)));

  PlacementRequest spread;
  spread.strategy = PlacementStrategy::kSpread;
  spread.actor_num_gpus_per_node = 4;
  spread.rollout_num_gpus = 8;
  spread.rollout_num_gpus_per_engine = 8;
  spread.num_gpus_per_node = 4;
  plans.push_back(MustPlan(spread, GpuNodes(6, 4)));  // engine parts on node-4, node-5

  PlacementRequest cpu;
  cpu.device_kind = DeviceKind::kCpuSlot;
  cpu.actor_num_gpus_per_node = 2;
  cpu.rollout_num_gpus = 2;
  plans.push_back(MustPlan(cpu, {{"a", 0, 3}, {"b", 0, 3}}));

  PlacementRequest external;
  external.actor_num_gpus_per_node = 8;
  external.rollout_num_gpus = 0;
  plans.push_back(MustPlan(external, GpuNodes(2, 8)));
  return plans;
}

TEST(PlacementProtoTest, RoundTripThroughTheWire) {
  for (const PlacementPlan& plan : SamplePlans()) {
    std::string wire;
    ASSERT_TRUE(ToProto(plan).SerializeToString(&wire));
    v1::PlacementPlan parsed;
    ASSERT_TRUE(parsed.ParseFromString(wire));
    StatusOr<PlacementPlan> back = FromProto(parsed);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, plan);
    EXPECT_EQ(FormatPlan(*back), FormatPlan(plan));
  }
}

TEST(PlacementProtoTest, ProtoFieldsMatchThePlan) {
  std::vector<PlacementPlan> plans = SamplePlans();
  v1::PlacementPlan colocated = ToProto(plans[0]);
  EXPECT_TRUE(colocated.colocated());
  EXPECT_EQ(colocated.strategy(), "pack");
  EXPECT_EQ(colocated.device_kind(), v1::DEVICE_KIND_GPU);
  EXPECT_EQ(colocated.num_nodes_used(), 2);
  EXPECT_EQ(colocated.data_parallel(), 2);
  EXPECT_EQ(colocated.actors(0).role(), "rollout");
  EXPECT_EQ(colocated.actors(1).role(), "trainer");
  EXPECT_EQ(colocated.actors(17).role(), "critic");
  EXPECT_EQ(colocated.actors(15).cp_rank(), 1);  // rank 14 = ((1·2 + 1)·2 + 1)·2 + 0
  EXPECT_EQ(colocated.devices_size(), 16);

  v1::PlacementPlan spread = ToProto(plans[1]);
  EXPECT_EQ(spread.strategy(), "spread");
  EXPECT_EQ(spread.num_nodes_used(), 6);
  const v1::ActorPlacement& part = spread.actors(spread.actors_size() - 1);
  EXPECT_EQ(part.role(), "engine");
  EXPECT_EQ(part.engine_node_rank(), 1);
  EXPECT_EQ(part.engine_num_nodes(), 2);

  EXPECT_EQ(ToProto(plans[2]).devices(0).kind(), v1::DEVICE_KIND_CPU_SLOT);
}

// A valid proto, broken by `mutate`, must be rejected with a message containing `expected`.
void ExpectRejected(void (*mutate)(v1::PlacementPlan*), const std::string& expected) {
  PlacementRequest r;
  r.actor_num_gpus_per_node = 2;
  r.rollout_num_gpus = 2;
  StatusOr<PlacementPlan> plan = PlanPlacement(r, GpuNodes(2, 2));
  ASSERT_TRUE(plan.ok()) << plan.status();
  v1::PlacementPlan proto = ToProto(*plan);
  mutate(&proto);
  StatusOr<PlacementPlan> back = FromProto(proto);
  ASSERT_FALSE(back.ok());
  EXPECT_EQ(back.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(back.status().message()), HasSubstr(expected));
}

TEST(PlacementProtoTest, RejectsMalformedPlans) {
  ExpectRejected([](v1::PlacementPlan* p) { p->set_strategy("random"); },
                 "unknown strategy 'random'");
  ExpectRejected([](v1::PlacementPlan* p) { p->set_device_kind(v1::DEVICE_KIND_UNSPECIFIED); },
                 "the plan has device kind 0; expected GPU or CPU_SLOT");
  ExpectRejected([](v1::PlacementPlan* p) { p->mutable_actors(1)->set_role("judge"); },
                 "unknown actor role 'judge'");
  ExpectRejected([](v1::PlacementPlan* p) { p->set_tensor_parallel(0); },
                 "parallel sizes TP 0 PP 1 CP 1 DP 2 must be >= 1");
  ExpectRejected([](v1::PlacementPlan* p) { p->clear_nodes(); }, "no nodes");
  ExpectRejected([](v1::PlacementPlan* p) { p->mutable_nodes(1)->set_name("node-0"); },
                 "bad node 'node-0'");
  // Engine 0 sits on node-1; point its device at node-0.
  ExpectRejected(
      [](v1::PlacementPlan* p) {
        v1::Device* d = p->mutable_actors(3)->mutable_devices(0);
        d->set_node_index(0);
        d->set_node_name("node-0");
      },
      "engine 0 runs on node 1 but owns device node-0:0 on node 0");
  ExpectRejected(
      [](v1::PlacementPlan* p) { p->mutable_actors(3)->mutable_devices(0)->set_node_name("x"); },
      "engine 0 device 0 names node 1 'x' but that node is 'node-1'");
  ExpectRejected(
      [](v1::PlacementPlan* p) { p->mutable_actors(3)->mutable_devices(0)->set_local_index(5); },
      "has local index 5 but node 'node-1' offers 2");
  ExpectRejected(
      [](v1::PlacementPlan* p) {
        p->mutable_actors(3)->mutable_devices(0)->set_kind(v1::DEVICE_KIND_CPU_SLOT);
      },
      "is a cpu slot but the plan places on gpu");
  // Disaggregated: engine 1 takes trainer 0's device.
  ExpectRejected(
      [](v1::PlacementPlan* p) {
        v1::ActorPlacement* engine = p->mutable_actors(4);
        engine->set_node_index(0);
        engine->set_node_name("node-0");
        engine->mutable_devices(0)->set_node_index(0);
        engine->mutable_devices(0)->set_node_name("node-0");
        engine->mutable_devices(0)->set_local_index(0);
      },
      "device node-0:0 is owned by both trainer 0 and engine 1");
  ExpectRejected([](v1::PlacementPlan* p) { p->mutable_devices()->RemoveLast(); },
                 "the device list is not the sorted union of the actors' devices");
  ExpectRejected([](v1::PlacementPlan* p) { p->set_num_nodes_used(7); },
                 "num_nodes_used is 7 but the actors run on 2 nodes");
  ExpectRejected([](v1::PlacementPlan* p) { p->mutable_actors(2)->set_node_index(9); },
                 "trainer 1 runs on node 9 'node-0', which is not in the plan's node list");
  ExpectRejected([](v1::PlacementPlan* p) { p->mutable_actors(3)->set_engine_node_rank(2); },
                 "engine 0 has rank 0, engine part 2 of 1");
}

TEST(PlacementProtoTest, ColocatedPlansShareDevicesAcrossRolesOnly) {
  PlacementRequest r;
  r.colocate = true;
  r.actor_num_gpus_per_node = 2;
  StatusOr<PlacementPlan> plan = PlanPlacement(r, GpuNodes(1, 2));
  ASSERT_TRUE(plan.ok()) << plan.status();
  v1::PlacementPlan proto = ToProto(*plan);
  EXPECT_TRUE(FromProto(proto).ok());  // trainer and engines share node-0:0 and node-0:1
  proto.mutable_actors(2)->mutable_devices(0)->set_local_index(0);  // trainer 1 takes 0 too
  StatusOr<PlacementPlan> back = FromProto(proto);
  ASSERT_FALSE(back.ok());
  EXPECT_THAT(std::string(back.status().message()),
              HasSubstr("device node-0:0 is owned by both trainer 0 and trainer 1"));
}

}  // namespace
}  // namespace slime::runtime
