// In-process tests of the runtime's gRPC plumbing: a real Head and real Agents on loopback in
// this process (no worker processes; those are in runtime_multiproc_test.cc).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <thread>

#include "grpcpp/generic/generic_stub.h"

#include "slime/metrics/registry.h"
#include "slime/runtime/agent.h"
#include "slime/runtime/head.h"
#include "slime/runtime/rpc.h"

namespace slime::runtime {
namespace {

using ::testing::HasSubstr;

std::string TempDir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() /
             ("slime_rt_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

HeadOptions FastHead(const std::string& run_dir) {
  HeadOptions o;
  o.run_dir = run_dir;
  o.heartbeat_interval_s = 0.1;
  o.heartbeat_timeout_s = 1.0;
  o.head_lost_timeout_s = 1.0;
  o.head_node_name = "n0";
  return o;
}

std::unique_ptr<Agent> StartAgent(const Head& head, const std::string& name, int gpus) {
  AgentOptions o;
  o.head_address = head.address();
  o.token = head.token();
  o.node_name = name;
  o.num_gpus = gpus;
  auto agent = Agent::Start(o);
  EXPECT_TRUE(agent.ok()) << agent.status();
  return agent.ok() ? *std::move(agent) : nullptr;
}

TEST(RpcTest, SplitHostPortAndTokenFiles) {
  auto hp = SplitHostPort("10.0.0.1:5000");
  ASSERT_TRUE(hp.ok());
  EXPECT_EQ(hp->first, "10.0.0.1");
  EXPECT_EQ(hp->second, 5000);
  EXPECT_EQ(SplitHostPort("[::1]:80")->first, "::1");
  EXPECT_THAT(std::string(SplitHostPort("nohost").status().message()), HasSubstr("HOST:PORT"));
  EXPECT_FALSE(SplitHostPort("h:99999").ok());
  EXPECT_FALSE(SplitHostPort("h:1x").ok());

  const std::string dir = TempDir("files");
  ASSERT_TRUE(WriteHeadFile(dir + "/head.json", "127.0.0.1:1234", "abc").ok());
  EXPECT_EQ(std::filesystem::status(dir + "/head.json").permissions() &
                std::filesystem::perms::others_read,
            std::filesystem::perms::none);
  auto head = ReadHeadFile(dir + "/head.json");
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(head->address, "127.0.0.1:1234");
  EXPECT_EQ(*ReadTokenFile(dir + "/head.json"), "abc");
  std::ofstream(dir + "/token") << "xyz\n";
  EXPECT_EQ(*ReadTokenFile(dir + "/token"), "xyz");
  std::ofstream(dir + "/bad.json") << "{\"address\": 3}";
  EXPECT_THAT(std::string(ReadHeadFile(dir + "/bad.json").status().message()),
              HasSubstr("not a head file"));
  EXPECT_EQ(ReadTokenFile(dir + "/missing").status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(GenerateToken(), GenerateToken());
  EXPECT_EQ(GenerateToken().size(), 64u);
  std::filesystem::remove_all(dir);
}

TEST(HeadTest, RejectsCallsWithoutTheJobToken) {
  const std::string dir = TempDir("token");
  auto head = Head::Start(FastHead(dir));
  ASSERT_TRUE(head.ok()) << head.status();
  auto stub = slime::v1::Head::NewStub(MakeChannel((*head)->address(), (*head)->rpc_options()));
  slime::v1::StatusReply reply;
  {
    grpc::ClientContext ctx;  // no token at all
    grpc::Status s = stub->Status(&ctx, slime::v1::StatusRequest(), &reply);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_THAT(s.error_message(), HasSubstr("missing job token"));
  }
  {
    auto ctx = MakeContext("not-the-token", std::chrono::seconds(5));
    grpc::Status s = stub->Status(ctx.get(), slime::v1::StatusRequest(), &reply);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    // A token that is a prefix of the real one is rejected too.
    auto ctx = MakeContext((*head)->token().substr(0, 10), std::chrono::seconds(5));
    EXPECT_EQ(stub->Status(ctx.get(), slime::v1::StatusRequest(), &reply).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    auto ctx = MakeContext((*head)->token(), std::chrono::seconds(5));
    grpc::Status s = stub->Status(ctx.get(), slime::v1::StatusRequest(), &reply);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(reply.job_state(), "running");
  }
  // head.json holds the address and the token for scripts.
  auto file = ReadHeadFile(dir + "/head.json");
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(file->address, (*head)->address());
  EXPECT_EQ(file->token, (*head)->token());
  head->reset();
  std::filesystem::remove_all(dir);
}

TEST(HeadTest, RejectsOversizedAndMalformedMessagesAndKeepsServing) {
  const std::string dir = TempDir("size");
  HeadOptions options = FastHead(dir);
  options.max_message_bytes = 1 << 20;
  auto head = Head::Start(options);
  ASSERT_TRUE(head.ok()) << head.status();
  // A client that would send anything: the server's limit must reject it.
  RpcOptions big{(*head)->token(), 64 << 20};
  auto stub = slime::v1::Head::NewStub(MakeChannel((*head)->address(), big));
  slime::v1::RegisterNodeRequest req;
  req.mutable_node()->set_name(std::string(2 << 20, 'x'));
  req.mutable_node()->set_agent_address("127.0.0.1:1");
  slime::v1::RegisterNodeReply reply;
  {
    auto ctx = MakeContext((*head)->token(), std::chrono::seconds(10));
    grpc::Status s = stub->RegisterNode(ctx.get(), req, &reply);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  }
  {
    // Well-sized but missing fields.
    slime::v1::RegisterNodeRequest empty;
    auto ctx = MakeContext((*head)->token(), std::chrono::seconds(5));
    grpc::Status s = stub->RegisterNode(ctx.get(), empty, &reply);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  {
    // Bytes that are not a RegisterWorkerRequest at all, through the generic API.
    grpc::GenericStub generic(MakeChannel((*head)->address(), big));
    grpc::ClientContext ctx;
    ctx.AddMetadata(kTokenMetadataKey, (*head)->token());
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::ByteBuffer request, response;
    grpc::Slice garbage(std::string("\xff\xff\xff\xff garbage", 12));
    request = grpc::ByteBuffer(&garbage, 1);
    std::promise<grpc::Status> done;
    generic.UnaryCall(&ctx, "/slime.v1.Head/RegisterWorker", grpc::StubOptions(), &request,
                      &response, [&](grpc::Status s) { done.set_value(s); });
    grpc::Status s = done.get_future().get();
    EXPECT_FALSE(s.ok());
  }
  // Still serving.
  auto ctx = MakeContext((*head)->token(), std::chrono::seconds(5));
  slime::v1::StatusReply status;
  EXPECT_TRUE(stub->Status(ctx.get(), slime::v1::StatusRequest(), &status).ok());
  head->reset();
  std::filesystem::remove_all(dir);
}

TEST(HeadTest, AgentsRegisterAndPlacementUsesTheirFakeGpus) {
  const std::string dir = TempDir("nodes");
  metrics::Registry registry;
  HeadOptions options = FastHead(dir);
  options.metrics = &registry;
  auto head = Head::Start(options);
  ASSERT_TRUE(head.ok()) << head.status();
  // The remote node registers first; the head node is still placed first.
  auto n1 = StartAgent(**head, "n1", 4);
  auto n0 = StartAgent(**head, "n0", 4);
  ASSERT_TRUE(n0 && n1);
  auto nodes = (*head)->WaitForNodes(2, std::chrono::seconds(10));
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  ASSERT_EQ(nodes->size(), 2u);
  EXPECT_EQ((*nodes)[0].name, "n0");
  EXPECT_EQ((*nodes)[1].name, "n1");
  EXPECT_EQ((*nodes)[1].num_gpus, 4);

  PlacementRequest disagg;
  disagg.actor_num_gpus_per_node = 4;
  disagg.rollout_num_gpus = 4;
  disagg.rollout_num_gpus_per_engine = 2;
  auto plan = PlanPlacement(disagg, *nodes);
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto actors = ActorsFromPlan(*plan, [](const std::string& role) { return "test-" + role; });
  std::map<std::string, std::string> where;
  for (const ActorOptions& a : actors) {
    std::string devices;
    for (int d : a.devices) devices += std::to_string(d);
    where[a.actor_id] = a.node_name + ":" + devices;
    EXPECT_EQ(a.actor_type, "test-" + a.role);
    EXPECT_EQ(a.restartable, a.role == "engine");
  }
  EXPECT_EQ(where["trainer-0"], "n0:0");
  EXPECT_EQ(where["trainer-3"], "n0:3");
  EXPECT_EQ(where["engine-0"], "n1:01");
  EXPECT_EQ(where["engine-1"], "n1:23");
  EXPECT_EQ(where["rollout-0"], "n0:");

  // Losing a node's heartbeats marks it lost (the agent is stopped: no more heartbeats).
  EXPECT_THAT(registry.Exposition(), HasSubstr("slime_runtime_nodes_alive 2"));
  n1.reset();
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  bool lost = false;
  while (!lost && std::chrono::steady_clock::now() < deadline) {
    const slime::v1::StatusReply status = (*head)->Snapshot();
    for (const auto& n : status.nodes()) lost |= n.name() == "n1" && !n.alive();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(lost);
  EXPECT_THAT(registry.Exposition(), HasSubstr("slime_runtime_nodes_alive 1"));
  head->reset();
  std::filesystem::remove_all(dir);
}

TEST(AgentTest, StopsWhenTheHeadIsGone) {
  const std::string dir = TempDir("lost");
  auto head = Head::Start(FastHead(dir));
  ASSERT_TRUE(head.ok());
  auto agent = StartAgent(**head, "n0", 0);
  ASSERT_TRUE(agent);
  head->reset();  // the head goes away
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(agent->Run(), 1);  // head_lost_timeout is 1 s
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  std::filesystem::remove_all(dir);
}

TEST(HeadTest, StartActorsValidatesIdsAndNodes) {
  const std::string dir = TempDir("validate");
  auto head = Head::Start(FastHead(dir));
  ASSERT_TRUE(head.ok());
  ActorOptions a;
  a.actor_id = "x";
  a.actor_type = "test";
  a.node_name = "nowhere";
  Status s = (*head)->StartActors({a});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("'nowhere', which is not registered"));
  auto agent = StartAgent(**head, "n0", 1);
  a.node_name = "n0";
  s = (*head)->StartActors({a, a});
  EXPECT_THAT(std::string(s.message()), HasSubstr("not unique"));
  auto handle = (*head)->Handle("unknown");
  auto r = handle.Call("echo", "x", {std::chrono::milliseconds(500)});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  head->reset();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace slime::runtime
