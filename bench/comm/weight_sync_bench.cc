// weight_sync_bench: seconds per full weight sync and GB/s through SGLang's distributed update
// protocol (WeightSender → real engine HTTP servers in this process), per bucket size, plus the
// raw c10d broadcast of the same tensors between two ranks (no HTTP, no engine) for reference.
// Prints one markdown table.
//
//   weight_sync_bench [--device cpu|cuda] [--engines 1] [--buckets-mib 16,64,512]
//                     [--rounds 3] [--hidden 160] [--layers 4]
//
// The model is a random Qwen3 written to a temp dir: vocab 151936 (tied), hidden --hidden,
// 2 heads of 64, 1 KV head, intermediate 4x hidden; the defaults give ~26M parameters, ~103 MB
// in float32 (CPU) or ~52 MB in bfloat16 (CUDA). CPU: Gloo over loopback. CUDA: NCCL with
// the sender on cuda:0 and engine e on cuda:(1 + e) (needs 1 + engines GPUs).
// s/sync is the median over --rounds syncs after one warm-up sync.
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <vector>

#include "remove_tree.h"
#include "CLI/CLI.hpp"
#include "slime/comm/process_group.h"
#include "slime/comm/weight_sender.h"
#include "slime/engine/engine.h"
#include "slime/engine/server.h"
#include "slime/model/checkpoint.h"
#include "slime/model/config.h"
#include "slime/model/init_random_model.h"
#include "slime/model/weights.h"

namespace fs = std::filesystem;
using namespace slime;

namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int Fail(const std::string& what, const Status& s) {
  std::fprintf(stderr, "weight_sync_bench: %s: %s\n", what.c_str(), s.ToString().c_str());
  return 1;
}

// Raw c10d: rank 0 broadcasts `tensors` (one broadcast each) to rank 1 in another thread.
StatusOr<double> RawBroadcastSeconds(const std::vector<model::NamedTensor>& tensors, bool cuda,
                                     int rounds) {
  comm::ProcessGroupOptions o;
  o.world_size = 2;
  o.backend = cuda ? "nccl" : "gloo";
  o.group_name = "raw-bench";
  o.timeout_s = 300;
  SLIME_ASSIGN_OR_RETURN(auto root, comm::ProcessGroup::Open(o));
  const torch::Device dev0 = cuda ? torch::Device("cuda:0") : torch::Device(torch::kCPU);
  const torch::Device dev1 = cuda ? torch::Device("cuda:1") : torch::Device(torch::kCPU);
  std::vector<torch::Tensor> send, recv;
  for (const auto& nt : tensors) {
    send.push_back(nt.tensor.to(dev0).contiguous());
    recv.push_back(torch::empty_like(nt.tensor, torch::TensorOptions().device(dev1)));
  }
  auto peer = std::async(std::launch::async, [&, port = root->port()]() -> Status {
    comm::ProcessGroupOptions p = o;
    p.rank = 1;
    p.master_port = port;
    p.cuda_device = 1;
    SLIME_ASSIGN_OR_RETURN(auto pg, comm::ProcessGroup::Create(p));
    for (int r = 0; r < rounds + 1; ++r) SLIME_RETURN_IF_ERROR(pg->Broadcast(recv, 0));
    return absl::OkStatus();
  });
  SLIME_RETURN_IF_ERROR(root->Join());
  std::vector<double> times;
  for (int r = 0; r < rounds + 1; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    SLIME_RETURN_IF_ERROR(root->Broadcast(send, 0));
    if (cuda) torch::cuda::synchronize();
    if (r > 0) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  SLIME_RETURN_IF_ERROR(peer.get());
  return Median(times);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"weight sync throughput (SGLang distributed update protocol)"};
  std::string device = "cpu";
  int num_engines = 1, rounds = 3, hidden = 160, layers = 4;
  std::vector<int64_t> buckets_mib = {16, 64, 512};
  app.add_option("--device", device, "cpu (Gloo) or cuda (NCCL)");
  app.add_option("--engines", num_engines, "engines to update");
  app.add_option("--buckets-mib", buckets_mib, "bucket sizes (MiB)")->delimiter(',');
  app.add_option("--rounds", rounds, "timed syncs per bucket size");
  app.add_option("--hidden", hidden, "model hidden size");
  app.add_option("--layers", layers, "model layers");
  CLI11_PARSE(app, argc, argv);
  const bool cuda = device == "cuda";
  if (cuda && (!torch::cuda::is_available() || static_cast<int>(torch::cuda::device_count()) < 1 + num_engines)) {
    std::fprintf(stderr, "weight_sync_bench: --device cuda needs %d GPUs\n", 1 + num_engines);
    return 2;
  }
  const char* src = std::getenv("SLIME_SOURCE_DIR");
  const std::string source = src != nullptr && *src != '\0' ? src : SLIME_SOURCE_DIR_DEFAULT;
  const std::string tmp = (fs::temp_directory_path() / ("slime-wsync-bench-" + std::to_string(::getpid()))).string();
  slime::testing::RemoveTree(tmp);
  fs::create_directories(tmp);
  {
    std::ofstream cfg(tmp + "/config.json");
    cfg << fmt::format(
        R"({{"model_type": "qwen3", "vocab_size": 151936, "hidden_size": {}, "intermediate_size": {},
  "num_hidden_layers": {}, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64,
  "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
  "tie_word_embeddings": true, "hidden_act": "silu", "eos_token_id": 151645}})",
        hidden, 4 * hidden, layers);
  }
  const std::string dtype = cuda ? "bf16" : "fp32";
  Status s = model::InitRandomModel(tmp + "/config.json", source + "/.cache/testdata/qwen3",
                                    tmp + "/model", 0, dtype);
  if (!s.ok()) return Fail("writing the model", s);
  auto config = model::LoadModelConfig(tmp + "/model");
  auto reader = model::CheckpointReader::Open(tmp + "/model");
  if (!config.ok() || !reader.ok()) return Fail("reading the model", config.ok() ? reader.status() : config.status());
  model::WeightOptions wo;
  wo.dtype = cuda ? torch::kBFloat16 : torch::kFloat32;
  auto weights = model::LoadWeights(*reader, *config, wo);
  if (!weights.ok()) return Fail("loading weights", weights.status());
  std::vector<model::NamedTensor> tensors = model::NamedParameters(*weights, *config);
  int64_t bytes = 0;
  for (const auto& t : tensors) bytes += t.tensor.numel() * t.tensor.element_size();

  std::vector<std::unique_ptr<engine::Engine>> engines;
  std::vector<std::unique_ptr<engine::EngineServer>> servers;
  comm::WeightSenderOptions so;
  for (int e = 0; e < num_engines; ++e) {
    engine::EngineOptions eo;
    eo.model_path = tmp + "/model";
    eo.device = cuda ? fmt::format("cuda:{}", 1 + e) : "cpu";
    eo.dtype = cuda ? "bfloat16" : "float32";
    eo.max_total_tokens = 1024;
    eo.context_length = 256;
    eo.cuda_graph_max_bs = 0;
    auto engine = engine::Engine::Create(eo);
    if (!engine.ok()) return Fail("starting an engine", engine.status());
    engine::EngineServerOptions sso;
    sso.port = 0;
    auto server = engine::EngineServer::Start(engine->get(), nullptr, sso);
    if (!server.ok()) return Fail("starting a server", server.status());
    so.engines.push_back({"127.0.0.1", (*server)->port(), 1});
    engines.push_back(std::move(*engine));
    servers.push_back(std::move(*server));
  }
  so.backend = cuda ? "nccl" : "gloo";
  so.timeout_s = 600;

  std::printf("\nweight sync: %.1f MB (%zu tensors, %s), %d engine(s), %s, torch threads %d\n\n",
              bytes / 1e6, tensors.size(), cuda ? "bfloat16" : "float32", num_engines,
              cuda ? "NCCL" : "Gloo over loopback", torch::get_num_threads());
  std::printf("| path | bucket MiB | buckets | s/sync | GB/s |\n|---|---|---|---|---|\n");
  auto raw = RawBroadcastSeconds(tensors, cuda, rounds);
  if (raw.ok()) {
    std::printf("| raw c10d broadcast (2 ranks) | - | - | %.3f | %.2f |\n", *raw, bytes / *raw / 1e9);
  } else {
    std::printf("| raw c10d broadcast (2 ranks) | - | - | failed: %s | |\n",
                std::string(raw.status().message()).c_str());
  }
  for (int64_t mib : buckets_mib) {
    so.bucket_bytes = mib << 20;
    so.group_name = fmt::format("bench-{}", mib);
    auto sender = comm::WeightSender::Connect(so);
    if (!sender.ok()) return Fail("connecting", sender.status());
    std::vector<double> times;
    int64_t nbuckets = 0;
    for (int r = 0; r < rounds + 1; ++r) {
      auto stats = (*sender)->Send(tensors, std::to_string(r + 1), true);
      if (!stats.ok()) return Fail("sync", stats.status());
      if (r > 0) times.push_back(stats->seconds);
      nbuckets = stats->buckets;
    }
    const double t = Median(times);
    std::printf("| WeightSender → engine HTTP + broadcast + swap | %lld | %lld | %.3f | %.2f |\n",
                static_cast<long long>(mib), static_cast<long long>(nbuckets), t, bytes / t / 1e9);
    std::fflush(stdout);
  }
  servers.clear();
  engines.clear();
  slime::testing::RemoveTree(tmp);
  return 0;
}
