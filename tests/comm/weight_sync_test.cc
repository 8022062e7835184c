// The weight plane on CPU with Gloo and real HTTP: c10d groups between threads (broadcast,
// rendezvous and broadcast timeouts), and a WeightSender (rank 0, this process) updating two
// real engine servers on a tiny random Qwen3 (world 3). After a sync each engine's greedy output
// and log-probs equal, bit for bit in float32, those of a fresh engine loaded from a checkpoint
// of the same perturbed weights; bad requests are rejected naming the tensor; groups can be
// destroyed and initialised again. The lazy Send (tensors fetched as their buckets are packed)
// fetches each tensor once, in order, and checks it against its listed shape.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <thread>

#include "remove_tree.h"
#include "nlohmann/json.hpp"
#include "slime/comm/process_group.h"
#include "slime/comm/cuda_ipc.h"
#include "slime/comm/weight_sender.h"
#include "slime/engine/engine.h"
#include "slime/engine/server.h"
#include "slime/http/client.h"
#include "slime/model/checkpoint.h"
#include "slime/model/config.h"
#include "slime/model/init_random_model.h"
#include "slime/model/weights.h"
#include "test_paths.h"

namespace slime::comm {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

using slime::testing::SourceDir;

std::string TempPath(const std::string& name) {
  return (fs::temp_directory_path() /
          ("slime-wsync-" + std::to_string(::getpid()) + "-" + name))
      .string();
}

// ---- process groups between two threads of this process

// Rank 0's options of a two-rank Gloo group.
ProcessGroupOptions TwoRankGloo(const std::string& name, double timeout_s) {
  ProcessGroupOptions o;
  o.world_size = 2;
  o.backend = "gloo";
  o.group_name = name;
  o.timeout_s = timeout_s;
  return o;
}

TEST(ProcessGroupTest, GlooBroadcastOfMixedDtypesBetweenTwoRanks) {
  ProcessGroupOptions o = TwoRankGloo("pg-test", 30);
  auto root = ProcessGroup::Open(o);
  ASSERT_TRUE(root.ok()) << root.status();
  ASSERT_GT((*root)->port(), 0);
  std::vector<torch::Tensor> sent = {torch::randn({3, 5}), torch::arange(7, torch::kInt),
                                     torch::randn({4}).to(torch::kBFloat16)};
  auto peer = std::async(std::launch::async, [&, port = (*root)->port()] {
    ProcessGroupOptions p = o;
    p.rank = 1;
    p.master_port = port;
    auto pg = ProcessGroup::Create(p);
    if (!pg.ok()) return std::vector<torch::Tensor>{};
    std::vector<torch::Tensor> got = {torch::zeros({3, 5}), torch::zeros({7}, torch::kInt),
                                      torch::zeros({4}, torch::kBFloat16)};
    Status s = (*pg)->Broadcast(got, 0);
    EXPECT_TRUE(s.ok()) << s;
    return got;
  });
  ASSERT_TRUE((*root)->Join().ok());
  ASSERT_TRUE((*root)->Broadcast(sent, 0).ok());
  std::vector<torch::Tensor> got = peer.get();
  ASSERT_EQ(got.size(), sent.size());
  for (size_t i = 0; i < sent.size(); ++i) EXPECT_TRUE(torch::equal(got[i], sent[i])) << i;
}

TEST(ProcessGroupTest, PeerThatNeverJoinsTimesOutWithAClearError) {
  ProcessGroupOptions o = TwoRankGloo("lonely", 2);
  const auto t0 = Clock::now();
  auto pg = ProcessGroup::Create(o);
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  ASSERT_FALSE(pg.ok());
  EXPECT_EQ(pg.status().code(), absl::StatusCode::kDeadlineExceeded) << pg.status();
  EXPECT_NE(std::string(pg.status().message()).find("group 'lonely'"), std::string::npos)
      << pg.status();
  EXPECT_LT(took, 20.0);
}

TEST(ProcessGroupTest, BroadcastThatNoPeerReceivesTimesOutAndBreaksTheGroup) {
  ProcessGroupOptions o = TwoRankGloo("deaf", 3);
  auto root = ProcessGroup::Open(o);
  ASSERT_TRUE(root.ok()) << root.status();
  std::unique_ptr<ProcessGroup> peer;
  std::thread t([&, port = (*root)->port()] {
    ProcessGroupOptions p = o;
    p.rank = 1;
    p.master_port = port;
    auto pg = ProcessGroup::Create(p);
    if (pg.ok()) peer = std::move(*pg);  // joins, then never receives
  });
  ASSERT_TRUE((*root)->Join().ok());
  t.join();
  ASSERT_NE(peer, nullptr);
  std::vector<torch::Tensor> x = {torch::randn({1 << 20})};
  Status s = (*root)->Broadcast(x, 0, {"model.embed_tokens.weight"}, 1.0);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(std::string(s.message()).find("model.embed_tokens.weight"), std::string::npos) << s;
  EXPECT_TRUE((*root)->broken());
  Status again = (*root)->Broadcast(x, 0);
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
}

// All-reduce (the trainers' data-parallel sums): float32, bfloat16 (summed in float32 on Gloo)
// and a non-contiguous view, then a rank that skips one: the error names the collective's
// sequence number and this rank's last collectives (the flight recorder).
TEST(ProcessGroupTest, GlooAllReduceSumsAndAMissedOneNamesTheRecentCollectives) {
  ProcessGroupOptions o = TwoRankGloo("sum", 30);
  auto root = ProcessGroup::Open(o);
  ASSERT_TRUE(root.ok()) << root.status();
  auto values = [](int rank) {
    return std::vector<torch::Tensor>{torch::full({4, 3}, 1.5f + rank),
                                      torch::full({5}, 0.25f * (rank + 1)).to(torch::kBFloat16),
                                      torch::arange(12, torch::kFloat).view({3, 4}).t() * (rank + 1)};
  };
  std::promise<void> peer_done;
  auto peer = std::async(std::launch::async, [&, port = (*root)->port()] {
    ProcessGroupOptions p = o;
    p.rank = 1;
    p.master_port = port;
    auto pg = ProcessGroup::Create(p);
    if (!pg.ok()) return pg.status();
    std::vector<torch::Tensor> v = values(1);
    for (size_t i = 0; i < v.size(); ++i) SLIME_RETURN_IF_ERROR((*pg)->AllReduceSum(v[i]));
    peer_done.set_value();
    // Joined, then skips the next collective; stays alive until rank 0 gives up.
    std::this_thread::sleep_for(std::chrono::seconds(3));
    return absl::OkStatus();
  });
  ASSERT_TRUE((*root)->Join().ok());
  std::vector<torch::Tensor> v = values(0);
  const std::vector<std::string> names = {"grads", "bf16", "view"};
  for (size_t i = 0; i < v.size(); ++i) ASSERT_TRUE((*root)->AllReduceSum(v[i], names[i]).ok()) << i;
  EXPECT_TRUE(torch::allclose(v[0], torch::full({4, 3}, 4.0f)));
  EXPECT_EQ(v[1].scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::allclose(v[1].to(torch::kFloat), torch::full({5}, 0.75f)));
  EXPECT_TRUE(torch::allclose(v[2], torch::arange(12, torch::kFloat).view({3, 4}).t() * 3));
  peer_done.get_future().wait();
  torch::Tensor lone = torch::ones({8});
  Status s = (*root)->AllReduceSum(lone, "metrics", 1.0);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  const std::string m(s.message());
  EXPECT_NE(m.find("all-reduce #4 of 'metrics'"), std::string::npos) << m;
  EXPECT_NE(m.find("last collectives: #1 all-reduce 'grads' [4,3] Float"), std::string::npos) << m;
  EXPECT_NE(m.find("#3 all-reduce 'view'"), std::string::npos) << m;
  EXPECT_TRUE((*root)->broken());
  EXPECT_TRUE(peer.get().ok());
}

TEST(ProcessGroupTest, BadOptionsAndBackends) {
  ProcessGroupOptions o;
  o.world_size = 2;
  o.rank = 1;  // a non-root rank needs rank 0's port
  EXPECT_EQ(ProcessGroup::Open(o).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveBackend("mpi").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*ResolveBackend("cpu:gloo,cuda:nccl"), torch::cuda::is_available() ? "nccl" : "gloo");
  EXPECT_EQ(*ParseDtypeName("torch.bfloat16"), torch::kBFloat16);
  EXPECT_EQ(DtypeName(torch::kFloat32), "float32");
  EXPECT_FALSE(ParseDtypeName("float4").ok());
}

TEST(PlanBucketsTest, KeepsOrderAndGivesLargeTensorsTheirOwnBucket) {
  std::vector<model::NamedTensor> t = {{"a", torch::zeros({10})},   // 40 B
                                       {"b", torch::zeros({10})},   // 40 B
                                       {"c", torch::zeros({100})},  // 400 B > bucket
                                       {"d", torch::zeros({5})}};
  auto b = PlanBuckets(t, 100);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0], std::make_pair(size_t{0}, size_t{2}));
  EXPECT_EQ(b[1], std::make_pair(size_t{2}, size_t{3}));
  EXPECT_EQ(b[2], std::make_pair(size_t{3}, size_t{4}));
}

// ---- the full protocol against real engine servers

struct ServedEngine {
  std::unique_ptr<engine::Engine> engine;
  std::unique_ptr<engine::EngineServer> server;
};

ServedEngine Serve(const std::string& model_dir, double group_timeout_s) {
  engine::EngineOptions o;
  o.model_path = model_dir;
  o.device = "cpu";
  o.dtype = "float32";
  o.page_size = 4;
  o.max_total_tokens = 1024;
  o.context_length = 256;
  auto e = engine::Engine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status();
  if (!e.ok()) return {};
  engine::EngineServerOptions so;
  so.port = 0;
  so.weights_group_timeout_s = group_timeout_s;
  auto s = engine::EngineServer::Start(e->get(), nullptr, so);
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return {};
  return {std::move(*e), std::move(*s)};
}

class WeightSyncTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string tok = SourceDir() + "/.cache/testdata/qwen3";
    ASSERT_TRUE(fs::exists(tok + "/tokenizer.json"))
        << "Qwen3 tokenizer missing at " << tok << ": run scripts/fetch_test_data.sh";
    base_dir_ = TempPath("base");
    perturbed_dir_ = TempPath("perturbed");
    slime::testing::RemoveTree(base_dir_);
    slime::testing::RemoveTree(perturbed_dir_);
    Status s = model::InitRandomModel(
        SourceDir() + "/tests/data/model/configs/qwen3-engine-test.json", tok, base_dir_, 0, "fp32");
    ASSERT_TRUE(s.ok()) << s;
    // The "trainer": the base weights moved by a deterministic perturbation.
    auto config = model::LoadModelConfig(base_dir_);
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = new model::ModelConfig(*config);
    auto reader = model::CheckpointReader::Open(base_dir_);
    ASSERT_TRUE(reader.ok()) << reader.status();
    auto w = model::LoadWeights(*reader, *config_, {});
    ASSERT_TRUE(w.ok()) << w.status();
    torch::manual_seed(1234);
    perturbed_ = new std::vector<model::NamedTensor>();
    for (model::NamedTensor& nt : model::NamedParameters(*w, *config_)) {
      perturbed_->push_back({nt.name, nt.tensor + 0.05 * torch::randn_like(nt.tensor)});
    }
    // The reference: a fresh engine loaded from a checkpoint of the perturbed weights.
    fs::create_directories(perturbed_dir_);
    for (const auto& f : fs::directory_iterator(base_dir_)) {
      if (f.path().extension() != ".safetensors" && f.path().filename() != kIndex) {
        fs::copy(f.path(), perturbed_dir_ + "/" + f.path().filename().string());
      }
    }
    ASSERT_TRUE(model::WriteCheckpoint(perturbed_dir_, *perturbed_).ok());
    engines_ = new std::vector<ServedEngine>();
    engines_->push_back(Serve(base_dir_, 30));
    engines_->push_back(Serve(base_dir_, 30));
    engines_->push_back(Serve(perturbed_dir_, 30));
  }
  static void TearDownTestSuite() {
    delete engines_;
    delete perturbed_;
    delete config_;
    slime::testing::RemoveTree(base_dir_);
    slime::testing::RemoveTree(perturbed_dir_);
  }

  static int Port(int e) { return (*engines_)[e].server->port(); }

  static WeightSenderOptions SenderOptions(const std::string& group) {
    WeightSenderOptions o;
    o.engines = {{"127.0.0.1", Port(0), 1}, {"127.0.0.1", Port(1), 1}};
    o.group_name = group;
    o.backend = "gloo";
    o.bucket_bytes = 64 << 10;  // many buckets; the embedding table is one of its own
    o.timeout_s = 60;
    return o;
  }

  static std::pair<int, json> Post(int e, const std::string& path, const json& body) {
    http::Client c("127.0.0.1", Port(e));
    auto r = c.Post(path, body.dump());
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return {0, json()};
    return {r->status, json::parse(r->body, nullptr, false)};
  }

  // Greedy ids and log-probs of engine e for a fixed prompt.
  static std::pair<std::vector<int>, std::vector<double>> Greedy(int e) {
    auto [status, out] = Post(e, "/generate",
                              {{"input_ids", {9707, 11, 1879, 0, 576, 374, 264, 1273}},
                               {"sampling_params",
                                {{"temperature", 0}, {"max_new_tokens", 8}, {"ignore_eos", true}}},
                               {"return_logprob", true}});
    EXPECT_EQ(status, 200) << out.dump();
    std::vector<double> lps;
    for (const json& t : out["meta_info"]["output_token_logprobs"]) lps.push_back(t[0].get<double>());
    return {out["output_ids"].get<std::vector<int>>(), lps};
  }

  static std::string Version(int e) {
    http::Client c("127.0.0.1", Port(e));
    auto r = c.Get("/get_weight_version");
    return r.ok() ? json::parse(r->body)["weight_version"].get<std::string>() : "";
  }

  static constexpr char kIndex[] = "model.safetensors.index.json";
  static std::string base_dir_, perturbed_dir_;
  static model::ModelConfig* config_;
  static std::vector<model::NamedTensor>* perturbed_;
  static std::vector<ServedEngine>* engines_;
};

std::string WeightSyncTest::base_dir_, WeightSyncTest::perturbed_dir_;
model::ModelConfig* WeightSyncTest::config_ = nullptr;
std::vector<model::NamedTensor>* WeightSyncTest::perturbed_ = nullptr;
std::vector<ServedEngine>* WeightSyncTest::engines_ = nullptr;

TEST_F(WeightSyncTest, SyncMakesEnginesEqualAFreshEngineOnThePerturbedWeights) {
  const auto reference = Greedy(2);
  ASSERT_NE(Greedy(0).second, reference.second) << "the perturbation must change the output";
  auto sender = WeightSender::Connect(SenderOptions("sync"));
  ASSERT_TRUE(sender.ok()) << sender.status();
  ASSERT_TRUE((*sender)->PauseEngines().ok());
  auto stats = (*sender)->Send(*perturbed_, "7");
  ASSERT_TRUE(stats.ok()) << stats.status();
  ASSERT_TRUE((*sender)->ContinueEngines().ok());
  EXPECT_GT(stats->buckets, 2);
  EXPECT_EQ(stats->tensors, static_cast<int64_t>(perturbed_->size()));
  for (int e : {0, 1}) {
    const auto got = Greedy(e);
    EXPECT_EQ(got.first, reference.first) << "engine " << e;
    EXPECT_EQ(got.second, reference.second) << "engine " << e;  // exact in float32
    EXPECT_EQ(Version(e), "7");
  }
  EXPECT_TRUE((*sender)->Disconnect().ok());
  // The group is gone on the engines: a bucket for it is refused by name.
  auto [s, j] = Post(0, "/update_weights_from_distributed",
                     {{"names", {"model.norm.weight"}}, {"dtypes", {"float32"}},
                      {"shapes", {{64}}}, {"group_name", "sync"}});
  EXPECT_EQ(s, 400);
  EXPECT_EQ(j["success"], false);
  EXPECT_NE(j["message"].get<std::string>().find("'sync' does not exist"), std::string::npos)
      << j.dump();
}

// Fully async training's sync (InFlight::kKeep): a request running on engine 0 is held by an
// in-place pause (so the update surely lands in the middle of its answer); the sender pauses in
// retract mode without waiting for the prefix cache (a kAbort pause would wait for it until the
// timeout), sends and continues. The answer finishes at full length, its spans name the old
// version up to the update and the new one after it, and the engine then equals a fresh engine
// on the new weights (no K/V of the old weights outlived the update).
TEST_F(WeightSyncTest, KeepingRequestsTheUpdateLandsMidAnswerAndItsSpansNameBothVersions) {
  engine::Engine* e0 = (*engines_)[0].engine.get();
  auto answer = std::async(std::launch::async, [] {
    return Post(0, "/generate",
                {{"input_ids", {9707, 11, 1879, 0, 576, 374, 264, 1273}},
                 {"sampling_params",
                  {{"temperature", 0}, {"max_new_tokens", 200}, {"ignore_eos", true}}},
                 {"return_logprob", true}});
  });
  for (int i = 0; i < 5000 && e0->load().num_running == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(e0->load().num_running, 1);
  ASSERT_EQ(Post(0, "/pause_generation", {{"mode", "in_place"}}).first, 200);
  const std::string before = Version(0);
  auto sender = WeightSender::Connect(SenderOptions("keep"));
  ASSERT_TRUE(sender.ok()) << sender.status();
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE((*sender)->PauseEngines(InFlight::kKeep).ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  auto stats = (*sender)->Send(*perturbed_, "9");
  ASSERT_TRUE(stats.ok()) << stats.status();
  ASSERT_TRUE((*sender)->ContinueEngines().ok());
  auto [status, out] = answer.get();
  ASSERT_EQ(status, 200) << out.dump();
  EXPECT_EQ(out["output_ids"].size(), 200u);
  EXPECT_EQ(out["meta_info"]["output_token_logprobs"].size(), 200u);
  const json& spans = out["meta_info"]["weight_versions"];
  ASSERT_EQ(spans.size(), 2u) << out["meta_info"].dump();
  EXPECT_EQ(spans[0]["version"], before);
  EXPECT_EQ(spans[1]["version"], "9");
  EXPECT_EQ(spans[0]["start"], 0);
  EXPECT_GT(spans[0]["end"].get<int>(), 0);
  EXPECT_EQ(spans[0]["end"], spans[1]["start"]);
  EXPECT_EQ(spans[1]["end"], 200);
  EXPECT_EQ(Version(1), "9");  // the idle engine too
  EXPECT_EQ(Greedy(0), Greedy(2));
  EXPECT_TRUE((*sender)->Disconnect().ok());
}

// The lazy form (a tensor-parallel trainer gathers each parameter as its bucket is packed): the
// shapes up front (meta tensors: no storage), every tensor fetched once, in order; a fetched
// tensor that does not match its listed shape fails the sync naming it, before anything is sent.
TEST_F(WeightSyncTest, LazySendFetchesEachTensorOnceInOrderAndChecksItsShape) {
  const auto reference = Greedy(2);
  std::vector<model::NamedTensor> shapes;
  for (const model::NamedTensor& nt : *perturbed_) {
    shapes.push_back(
        {nt.name,
         torch::empty(nt.tensor.sizes(),
                      torch::TensorOptions().dtype(nt.tensor.scalar_type()).device(c10::kMeta))});
  }
  auto sender = WeightSender::Connect(SenderOptions("lazy"));
  ASSERT_TRUE(sender.ok()) << sender.status();
  const std::string version = Version(0);
  auto wrong = (*sender)->Send(
      shapes,
      [&](size_t i) -> StatusOr<torch::Tensor> { return (*perturbed_)[i].tensor.narrow(0, 0, 1); },
      "bad");
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(std::string(wrong.status().message()).find("'" + shapes[0].name + "' was produced as"),
            std::string::npos)
      << wrong.status();
  EXPECT_EQ(Version(0), version);
  std::vector<size_t> fetched;
  auto stats = (*sender)->Send(
      shapes,
      [&](size_t i) -> StatusOr<torch::Tensor> {
        fetched.push_back(i);
        return (*perturbed_)[i].tensor;
      },
      "9");
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_GT(stats->buckets, 2);
  std::vector<size_t> in_order(shapes.size());
  for (size_t i = 0; i < in_order.size(); ++i) in_order[i] = i;
  EXPECT_EQ(fetched, in_order);
  for (int e : {0, 1}) {
    EXPECT_EQ(Greedy(e), reference) << "engine " << e;
    EXPECT_EQ(Version(e), "9");
  }
  EXPECT_TRUE((*sender)->Disconnect().ok());
}

TEST_F(WeightSyncTest, RejectedBucketsChangeNothingAndKeepTheGroupInStep) {
  auto sender = WeightSender::Connect(SenderOptions("reject"));
  ASSERT_TRUE(sender.ok()) << sender.status();
  const auto before = Greedy(0);
  const std::string version = Version(0);
  auto expect_rejected = [&](std::vector<model::NamedTensor> bucket, const std::string& needle) {
    auto stats = (*sender)->Send(bucket, "bad");
    ASSERT_FALSE(stats.ok());
    EXPECT_NE(std::string(stats.status().message()).find(needle), std::string::npos)
        << stats.status();
  };
  // A valid tensor next to an unknown one: neither is applied.
  expect_rejected({{"model.norm.weight", torch::full({64}, 3.0f)},
                   {"model.layers.0.mlp.bogus.weight", torch::zeros({4, 4})}},
                  "unknown parameter 'model.layers.0.mlp.bogus.weight'");
  expect_rejected({{"model.norm.weight", torch::zeros({63})}}, "model.norm.weight': shape [63]");
  expect_rejected({{"model.norm.weight", torch::zeros({64}, torch::kBFloat16)}},
                  "model.norm.weight': dtype BFloat16");
  EXPECT_EQ(Greedy(0), before);
  EXPECT_EQ(Version(0), version);
  // Every rejected bucket was still received, so the group keeps working.
  std::vector<model::NamedTensor> one = {(*perturbed_)[0]};
  ASSERT_TRUE((*sender)->Send(one, version).ok());
  // Raw requests: validation errors that need no broadcast.
  auto [s1, j1] = Post(0, "/update_weights_from_distributed",
                       {{"names", {"model.norm.weight"}}, {"dtypes", {"float4"}},
                        {"shapes", {{64}}}, {"group_name", "reject"}});
  EXPECT_EQ(s1, 400);
  EXPECT_NE(j1["message"].get<std::string>().find("model.norm.weight"), std::string::npos);
  auto [s2, j2] = Post(0, "/update_weights_from_distributed",
                       {{"names", {"a", "b"}}, {"dtypes", {"float32"}}, {"shapes", {{1}}}});
  EXPECT_EQ(s2, 400);
  EXPECT_NE(j2["message"].get<std::string>().find("same length"), std::string::npos);
  auto [s3, j3] = Post(0, "/init_weights_update_group",
                       {{"master_address", "127.0.0.1"}, {"master_port", 0}, {"rank_offset", 1},
                        {"world_size", 2}});
  EXPECT_EQ(s3, 400);
  EXPECT_NE(j3["message"].get<std::string>().find("master_port"), std::string::npos);
  auto [s4, j4] = Post(0, "/init_weights_update_group",
                       {{"master_address", "127.0.0.1"}, {"master_port", 1234},
                        {"rank_offset", 1}, {"world_size", 2}, {"group_name", "reject"},
                        {"backend", "gloo"}});
  EXPECT_EQ(s4, 400);
  EXPECT_NE(j4["message"].get<std::string>().find("already exists"), std::string::npos);
  auto [s5, j5] = Post(0, "/destroy_weights_update_group", {{"group_name", "nope"}});
  EXPECT_EQ(s5, 400);
  EXPECT_EQ(j5["message"], "The group to be destroyed does not exist.");
  // Destroy and initialise again under the same name: syncing works as before.
  ASSERT_TRUE((*sender)->Disconnect().ok());
  sender->reset();
  auto again = WeightSender::Connect(SenderOptions("reject"));
  ASSERT_TRUE(again.ok()) << again.status();
  auto stats = (*again)->Send(*perturbed_, "8");
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(Greedy(0), Greedy(2));
  EXPECT_EQ(Version(1), "8");
}

TEST_F(WeightSyncTest, EngineBroadcastWithoutASenderTimesOutClearly) {
  // A separate engine with a short group timeout; this process joins as rank 0 but never
  // broadcasts the bucket the engine was told about.
  ServedEngine e = Serve(base_dir_, 2);
  ProcessGroupOptions o = TwoRankGloo("silent", 30);
  auto root = ProcessGroup::Open(o);
  ASSERT_TRUE(root.ok()) << root.status();
  auto init = std::async(std::launch::async, [&] {
    http::Client c("127.0.0.1", e.server->port());
    return c.Post("/init_weights_update_group",
                  json{{"master_address", "127.0.0.1"}, {"master_port", (*root)->port()},
                       {"rank_offset", 1}, {"world_size", 2}, {"group_name", "silent"},
                       {"backend", "gloo"}}
                      .dump());
  });
  ASSERT_TRUE((*root)->Join().ok());
  auto r = init.get();
  ASSERT_TRUE(r.ok() && r->status == 200) << (r.ok() ? r->body : r.status().ToString());
  http::Client c("127.0.0.1", e.server->port());
  const auto t0 = Clock::now();
  auto u = c.Post("/update_weights_from_distributed",
                  json{{"names", {"model.norm.weight"}}, {"dtypes", {"float32"}},
                       {"shapes", {{64}}}, {"group_name", "silent"}}
                      .dump());
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->status, 400);
  const std::string message = json::parse(u->body)["message"].get<std::string>();
  EXPECT_NE(message.find("timed out"), std::string::npos) << message;
  EXPECT_NE(message.find("model.norm.weight"), std::string::npos) << message;
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 20.0);
  // The engine still serves and the broken group can be destroyed.
  auto d = c.Post("/destroy_weights_update_group", json{{"group_name", "silent"}}.dump());
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->status, 200) << d->body;
  auto g = c.Post("/generate", json{{"input_ids", {1, 2, 3}},
                                    {"sampling_params", {{"max_new_tokens", 2}}}}
                                   .dump());
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->status, 200);
}

TEST(CudaIpcWireTest, BucketRoundTripsAndBadFieldsAreNamed) {
  IpcBucket b;
  b.handle = std::string(126, 'a') + "0F";
  b.device_uuid = "GPU-12345678-9abc-def0-1234-56789abcdef0";
  b.bytes = 4096;
  b.tensors = {{"model.norm.weight", torch::kBFloat16, {64}, 0},
               {"model.embed_tokens.weight", torch::kFloat32, {8, 64}, 256}};
  auto back = IpcBucketFromJson(IpcBucketToJson(b));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->handle, b.handle);
  EXPECT_EQ(back->device_uuid, b.device_uuid);
  EXPECT_EQ(back->bytes, 4096);
  ASSERT_EQ(back->tensors.size(), 2u);
  EXPECT_EQ(back->tensors[1].name, "model.embed_tokens.weight");
  EXPECT_EQ(back->tensors[1].dtype, torch::kFloat32);
  EXPECT_EQ(back->tensors[1].shape, (std::vector<int64_t>{8, 64}));
  EXPECT_EQ(back->tensors[1].offset, 256);
  auto error = [&](const std::function<void(json&)>& edit) {
    json j = IpcBucketToJson(b);
    edit(j);
    auto r = IpcBucketFromJson(j);
    EXPECT_FALSE(r.ok()) << j.dump();
    return r.ok() ? std::string() : std::string(r.status().message());
  };
  EXPECT_NE(error([](json& j) { j["handle"] = "xyz"; }).find("128 hex digits"), std::string::npos);
  EXPECT_NE(error([](json& j) { j["handle"] = std::string(127, 'g') + "0"; }).find("hex"),
            std::string::npos);
  EXPECT_NE(error([](json& j) { j.erase("device_uuid"); }).find("device_uuid"), std::string::npos);
  EXPECT_NE(error([](json& j) { j["bytes"] = -1; }).find("bytes"), std::string::npos);
  EXPECT_NE(error([](json& j) { j["tensors"][1]["dtype"] = "complex32"; }).find("model.embed_tokens"),
            std::string::npos);
  EXPECT_NE(error([](json& j) { j["tensors"][0]["shape"] = {-1}; }).find("shape"), std::string::npos);
  // 8 x 64 float32 = 2048 bytes from offset 2304 end at 4352 > 4096.
  EXPECT_NE(error([](json& j) { j["tensors"][1]["offset"] = 2304; }).find("outside the 4096-byte"),
            std::string::npos);
  EXPECT_EQ(IpcExportBuffer::PackedBytes({{"a", torch::zeros({3}, torch::kBFloat16)},
                                          {"b", torch::zeros({2, 2})}},
                                         std::nullopt),
            256 + 16);
  EXPECT_EQ(IpcExportBuffer::PackedBytes({{"a", torch::zeros({3})}}, torch::kBFloat16), 6);
}

TEST_F(WeightSyncTest, TensorRouteExplainsWhatItAcceptsAndNeedsACudaEngine) {
  // SGLang's pickled payload: a broken pickle names the entry; SGLang's per-tensor form
  // (load_format null) names what is accepted.
  auto [s1, j1] = Post(0, "/update_weights_from_tensor",
                       {{"serialized_named_tensors", {"gASV"}}, {"load_format", "flattened_bucket"}});
  EXPECT_EQ(s1, 400);
  EXPECT_NE(j1["message"].get<std::string>().find("serialized_named_tensors[0]: pickle"),
            std::string::npos)
      << j1.dump();
  auto [s0, j0] = Post(0, "/update_weights_from_tensor", {{"serialized_named_tensors", {"gASV"}}});
  EXPECT_EQ(s0, 400);
  EXPECT_NE(j0["message"].get<std::string>().find("flattened_bucket"), std::string::npos) << j0.dump();
  // A well-formed CUDA bucket (tests/data/comm) meets this CPU engine: refused, nothing changed.
  auto fixture = [](const std::string& name) {
    std::ifstream f(slime::testing::SourceDir() + "/tests/data/comm/" + name);
    std::string s;
    std::getline(f, s);
    return s;
  };
  auto [s4, j4] = Post(0, "/update_weights_from_tensor",
                       {{"serialized_named_tensors", {fixture("cuda_uuid.b64")}},
                        {"load_format", "flattened_bucket"}});
  EXPECT_EQ(s4, 400);
  EXPECT_NE(j4["message"].get<std::string>().find("CUDA"), std::string::npos) << j4.dump();
  // A CPU bucket whose shared-memory file is gone (its sender exited long ago).
  auto [s5, j5] = Post(0, "/update_weights_from_tensor",
                       {{"serialized_named_tensors", {fixture("cpu_shm.b64")}},
                        {"load_format", "flattened_bucket"}});
  EXPECT_EQ(s5, 400);
  EXPECT_NE(j5["message"].get<std::string>().find("shared-memory file"), std::string::npos)
      << j5.dump();
  // Two entries for an engine of one TP rank.
  auto [s6, j6] = Post(0, "/update_weights_from_tensor",
                       {{"serialized_named_tensors", {fixture("cuda_empty.b64"), fixture("cuda_empty.b64")}},
                        {"load_format", "flattened_bucket"}});
  EXPECT_EQ(s6, 400);
  EXPECT_NE(j6["message"].get<std::string>().find("one entry per TP rank"), std::string::npos)
      << j6.dump();
  auto [s2, j2] = Post(0, "/update_weights_from_tensor",
                       {{"load_format", "slime_cuda_ipc"}, {"ipc_buckets", json::array()}});
  EXPECT_EQ(s2, 400);
  EXPECT_NE(j2["message"].get<std::string>().find("one bucket per engine GPU"), std::string::npos)
      << j2.dump();
  IpcBucket b;
  b.handle = std::string(128, '0');
  b.device_uuid = "GPU-0";
  b.bytes = 256;
  b.tensors = {{"model.norm.weight", torch::kFloat32, {64}, 0}};
  auto [s3, j3] = Post(0, "/update_weights_from_tensor",
                       {{"load_format", "slime_cuda_ipc"}, {"ipc_buckets", {IpcBucketToJson(b)}}});
  EXPECT_EQ(s3, 400);
  EXPECT_NE(j3["message"].get<std::string>().find("CUDA"), std::string::npos) << j3.dump();
  // The sender refuses the transport without a CUDA trainer.
  WeightSenderOptions o;
  o.engines = {{"127.0.0.1", Port(0), 1}};
  o.backend = "cuda_ipc";
  auto sender = WeightSender::Connect(o);
  ASSERT_FALSE(sender.ok());
  EXPECT_NE(sender.status().message().find("cuda_ipc"), std::string::npos) << sender.status();
  // The engine still serves, on its own weights.
  EXPECT_EQ(Greedy(0).first.size(), 8u);
}

}  // namespace
}  // namespace slime::comm
