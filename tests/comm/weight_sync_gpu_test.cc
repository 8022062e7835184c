// The weight plane over NCCL on CUDA: a WeightSender (rank 0 on cuda:0, this process) updates a
// real engine server on cuda:1 (bfloat16, fused projections, CUDA graphs) through SGLang's
// protocol; afterwards its greedy output equals a fresh engine on cuda:1 loaded from a checkpoint
// of the same weights. NCCL cannot put two ranks of one group on one device, so this needs two
// GPUs and skips otherwise. Also reports the sync time and GB/s of a ~80 MB model.
//
// The colocated hand-over on one GPU: the real `slime_train serve` process on cuda:0 goes through
// slime's colocated cycle (release all memory, resume the weights, CUDA IPC weight sync from this
// process on the same GPU, resume K/V and graphs) and then generates what a fresh engine with the
// sent weights generates.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <regex>
#include <sstream>
#include <thread>

#include "remove_tree.h"
#include "nlohmann/json.hpp"
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

using slime::testing::SourceDir;

struct ServedEngine {
  std::unique_ptr<engine::Engine> engine;
  std::unique_ptr<engine::EngineServer> server;
};

ServedEngine Serve(const std::string& dir, const std::string& device = "cuda:1") {
  engine::EngineOptions o;
  o.model_path = dir;
  o.device = device;
  o.dtype = "bfloat16";
  o.max_total_tokens = 4096;
  o.context_length = 256;
  o.cuda_graph_max_bs = 4;
  auto e = engine::Engine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status();
  if (!e.ok()) return {};
  engine::EngineServerOptions so;
  so.port = 0;
  so.weights_group_timeout_s = 120;
  auto s = engine::EngineServer::Start(e->get(), nullptr, so);
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return {};
  return {std::move(*e), std::move(*s)};
}

json Greedy(int port) {
  http::Client c("127.0.0.1", port);
  auto r = c.Post("/generate", json{{"input_ids", {9707, 11, 1879, 0, 576, 374, 264, 1273}},
                                    {"sampling_params", {{"temperature", 0},
                                                         {"max_new_tokens", 16},
                                                         {"ignore_eos", true}}},
                                    {"return_logprob", true}}
                                   .dump());
  EXPECT_TRUE(r.ok() && r->status == 200);
  return r.ok() ? json::parse(r->body) : json();
}

// A random-weight model at `base` and the same model with perturbed weights at `moved`
// (returned as tensors too).
std::vector<model::NamedTensor> MakeBaseAndMoved(const std::string& config, const std::string& base,
                                                 const std::string& moved) {
  const std::string tok = SourceDir() + "/.cache/testdata/qwen3";
  slime::testing::RemoveTree(base);
  slime::testing::RemoveTree(moved);
  EXPECT_TRUE(model::InitRandomModel(config, tok, base, 0, "bf16").ok());
  auto cfg = model::LoadModelConfig(base);
  auto reader = model::CheckpointReader::Open(base);
  EXPECT_TRUE(cfg.ok() && reader.ok());
  if (!cfg.ok() || !reader.ok()) return {};
  model::WeightOptions wo;
  wo.dtype = torch::kBFloat16;
  auto w = model::LoadWeights(*reader, *cfg, wo);
  EXPECT_TRUE(w.ok()) << w.status();
  if (!w.ok()) return {};
  torch::manual_seed(7);
  std::vector<model::NamedTensor> tensors;
  for (model::NamedTensor& nt : model::NamedParameters(*w, *cfg)) {
    tensors.push_back({nt.name, (nt.tensor.to(torch::kFloat32) +
                                 0.05 * torch::randn(nt.tensor.sizes()))
                                    .to(torch::kBFloat16)});
  }
  fs::create_directories(moved);
  for (const auto& f : fs::directory_iterator(base)) {
    if (f.path().extension() != ".safetensors" &&
        f.path().filename() != "model.safetensors.index.json") {
      fs::copy(f.path(), moved + "/" + f.path().filename().string());
    }
  }
  EXPECT_TRUE(model::WriteCheckpoint(moved, tensors).ok());
  return tensors;
}

// The two /generate answers' output log-probs agree to 1e-5.
void ExpectSameLogprobs(const json& got, const json& want) {
  const auto& a = got["meta_info"]["output_token_logprobs"];
  const auto& b = want["meta_info"]["output_token_logprobs"];
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(a[i][0].get<double>(), b[i][0].get<double>(), 1e-5) << i;
  }
}

TEST(WeightSyncGpuTest, NcclSyncMatchesAFreshEngine) {
  if (!torch::cuda::is_available() || torch::cuda::device_count() < 2) {
    GTEST_SKIP() << "needs 2 CUDA devices (NCCL cannot put two ranks of a group on one GPU)";
  }
  auto backend = ResolveBackend("nccl");
  if (!backend.ok()) GTEST_SKIP() << backend.status();
  const std::string base = (fs::temp_directory_path() / "slime-wsync-gpu-base").string();
  const std::string moved = (fs::temp_directory_path() / "slime-wsync-gpu-moved").string();
  std::vector<model::NamedTensor> tensors = MakeBaseAndMoved(
      SourceDir() + "/tests/data/model/configs/qwen3-engine-test.json", base, moved);
  ASSERT_FALSE(tensors.empty());
  ServedEngine target = Serve(base);
  ServedEngine reference = Serve(moved);
  ASSERT_TRUE(target.server && reference.server);
  const json want = Greedy(reference.server->port());
  ASSERT_NE(Greedy(target.server->port())["output_ids"], want["output_ids"]);

  WeightSenderOptions so;
  so.engines = {{"127.0.0.1", target.server->port(), 1}};
  so.group_name = "gpu-sync";
  so.backend = "nccl";
  so.bucket_bytes = 16 << 20;
  so.timeout_s = 120;
  auto sender = WeightSender::Connect(so);
  ASSERT_TRUE(sender.ok()) << sender.status();
  ASSERT_TRUE((*sender)->PauseEngines().ok());
  for (int round = 0; round < 3; ++round) {  // the first includes NCCL warm-up
    auto stats = (*sender)->Send(tensors, std::to_string(round + 1));
    ASSERT_TRUE(stats.ok()) << stats.status();
    std::printf("nccl sync %d: %.1f MB in %lld buckets, %.3f s, %.2f GB/s\n", round,
                stats->bytes / 1e6, static_cast<long long>(stats->buckets), stats->seconds,
                stats->gb_per_s());
  }
  ASSERT_TRUE((*sender)->ContinueEngines().ok());
  const json got = Greedy(target.server->port());
  EXPECT_EQ(got["output_ids"], want["output_ids"]);
  EXPECT_EQ(got["meta_info"]["weight_version"], "3");
  ExpectSameLogprobs(got, want);
  EXPECT_TRUE((*sender)->Disconnect().ok());
  slime::testing::RemoveTree(base);
  slime::testing::RemoveTree(moved);
}

// `slime_train serve ARGS` as a child process (stdout and stderr in `log`); killed on destruction.
class ServeChild {
 public:
  ServeChild(const std::vector<std::string>& args, const std::string& log) : log_(log) {
    std::vector<std::string> a = {slime::testing::TrainBin(), "serve"};
    a.insert(a.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& s : a) argv.push_back(s.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
    if (posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&fa);
  }
  ~ServeChild() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      int status = 0;
      for (int i = 0; i < 100 && ::waitpid(pid_, &status, WNOHANG) == 0; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
    }
  }
  // The port from "listening on http://host:port", or 0 after `timeout`.
  int WaitForPort(std::chrono::seconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    const std::regex re("listening on http://[^:]+:([0-9]+)");
    while (std::chrono::steady_clock::now() < deadline && pid_ > 0) {
      std::smatch m;
      const std::string text = Log();
      if (std::regex_search(text, m, re)) return std::stoi(m[1]);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return 0;
  }
  std::string Log() const {
    std::ifstream in(log_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  std::string log_;
  pid_t pid_ = -1;
};

json PostJson(int port, const std::string& path, const json& body) {
  http::Client c("127.0.0.1", port);
  auto r = c.Post(path, body.dump());
  EXPECT_TRUE(r.ok()) << path << ": " << r.status();
  if (!r.ok()) return json();
  EXPECT_EQ(r->status, 200) << path << ": " << r->body;
  return json::parse(r->body, nullptr, false);
}

TEST(WeightSyncGpuTest, CudaIpcHandOverToAColocatedServeProcess) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "CUDA is not available: GPU test skipped";
  const std::string base = (fs::temp_directory_path() / "slime-wsync-ipc-base").string();
  const std::string moved = (fs::temp_directory_path() / "slime-wsync-ipc-moved").string();
  const std::string log = (fs::temp_directory_path() / "slime-wsync-ipc-serve.log").string();
  // head_dim 128: the fused kernels and decode CUDA graphs are on in the served engine.
  std::vector<model::NamedTensor> tensors = MakeBaseAndMoved(
      SourceDir() + "/tests/data/model/configs/qwen3-hd128-test.json", base, moved);
  ASSERT_FALSE(tensors.empty());
  ServeChild child({"--model", base, "--port", "0", "--device", "cuda:0", "--dtype", "bfloat16",
                    "--max-total-tokens", "4096", "--context-length", "256",
                    "--cuda-graph-max-bs", "4", "--enable-memory-saver"},
                   log);
  const int port = child.WaitForPort(std::chrono::seconds(180));
  ASSERT_GT(port, 0) << "serve did not come up:\n" << child.Log();
  ServedEngine reference = Serve(moved, "cuda:0");
  ASSERT_TRUE(reference.server);
  const json want = Greedy(reference.server->port());
  ASSERT_NE(Greedy(port)["output_ids"], want["output_ids"]);

  WeightSenderOptions so;
  so.engines = {{"127.0.0.1", port, 1}};
  so.backend = "cuda_ipc";
  so.device = torch::Device("cuda:0");
  so.bucket_bytes = 32 << 20;  // several buckets through one reused buffer
  so.timeout_s = 120;
  auto sender = WeightSender::Connect(so);
  ASSERT_TRUE(sender.ok()) << sender.status();
  for (int round = 0; round < 3; ++round) {
    // slime's colocated order: release all -> (train) -> resume weights -> sync -> resume K/V.
    PostJson(port, "/release_memory_occupation", json::object());
    PostJson(port, "/resume_memory_occupation", {{"tags", {"weights"}}});
    ASSERT_TRUE((*sender)->PauseEngines().ok());
    auto stats = (*sender)->Send(tensors, std::to_string(round + 1));
    ASSERT_TRUE(stats.ok()) << stats.status() << "\n" << child.Log();
    ASSERT_TRUE((*sender)->ContinueEngines().ok());
    PostJson(port, "/resume_memory_occupation", {{"tags", {"kv_cache", "cuda_graph"}}});
    std::printf("cuda ipc sync %d: %.1f MB in %lld buckets, %.3f s, %.2f GB/s\n", round,
                stats->bytes / 1e6, static_cast<long long>(stats->buckets), stats->seconds,
                stats->gb_per_s());
  }
  const json got = Greedy(port);
  EXPECT_EQ(got["output_ids"], want["output_ids"]);
  EXPECT_EQ(got["meta_info"]["weight_version"], "3");
  ExpectSameLogprobs(got, want);
  // A bucket that claims another GPU is refused with a message naming both.
  IpcBucket foreign;
  foreign.handle = std::string(128, '0');
  foreign.device_uuid = "GPU-00000000-0000-0000-0000-000000000000";
  foreign.bytes = 0;
  http::Client c("127.0.0.1", port);
  auto r = c.Post("/update_weights_from_tensor",
                  json{{"load_format", "slime_cuda_ipc"}, {"ipc_buckets", {IpcBucketToJson(foreign)}}}
                      .dump());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("colocated"), std::string::npos) << r->body;
  slime::testing::RemoveTree(base);
  slime::testing::RemoveTree(moved);
}

// The trainers' data-parallel sum over NCCL: two ranks (threads of this process, cuda:0 and
// cuda:1) all-reduce a bfloat16 gradient bucket and float32 metrics in place.
TEST(WeightSyncGpuTest, NcclAllReduceSumBetweenTwoGpus) {
  if (!torch::cuda::is_available() || torch::cuda::device_count() < 2) {
    GTEST_SKIP() << "needs 2 CUDA devices";
  }
  auto backend = ResolveBackend("nccl");
  if (!backend.ok()) GTEST_SKIP() << backend.status();
  ProcessGroupOptions o;
  o.world_size = 2;
  o.backend = "nccl";
  o.group_name = "dp-sum";
  o.timeout_s = 120;
  auto root = ProcessGroup::Open(o);
  ASSERT_TRUE(root.ok()) << root.status();
  auto run = [](ProcessGroup& pg, int rank) -> Status {
    const torch::Device dev(torch::kCUDA, static_cast<c10::DeviceIndex>(rank));
    torch::Tensor grads = torch::full({1 << 20}, 0.5 * (rank + 1), torch::dtype(torch::kBFloat16).device(dev));
    torch::Tensor metrics = torch::tensor({1.0f + rank, 2.0f}, torch::kFloat32);  // on the host
    SLIME_RETURN_IF_ERROR(pg.AllReduceSum(grads, "grads"));
    SLIME_RETURN_IF_ERROR(pg.AllReduceSum(metrics, "metrics"));
    if (!torch::allclose(grads.to(torch::kFloat32).cpu(), torch::full({1 << 20}, 1.5f)) ||
        !torch::allclose(metrics, torch::tensor({3.0f, 4.0f}))) {
      return absl::InternalError(fmt::format("rank {}: wrong sums", rank));
    }
    return absl::OkStatus();
  };
  auto peer = std::async(std::launch::async, [&, port = (*root)->port()]() -> Status {
    ProcessGroupOptions p = o;
    p.rank = 1;
    p.master_port = port;
    p.cuda_device = 1;
    auto pg = ProcessGroup::Create(p);
    if (!pg.ok()) return pg.status();
    return run(**pg, 1);
  });
  ASSERT_TRUE((*root)->Join().ok());
  Status mine = run(**root, 0);
  Status theirs = peer.get();
  EXPECT_TRUE(mine.ok()) << mine;
  EXPECT_TRUE(theirs.ok()) << theirs;
}

}  // namespace
}  // namespace slime::comm
