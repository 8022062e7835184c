// The weight plane over NCCL on CUDA: a WeightSender (rank 0 on cuda:0, this process) updates a
// real engine server on cuda:1 (bfloat16, fused projections, CUDA graphs) through SGLang's
// protocol; afterwards its greedy output equals a fresh engine on cuda:1 loaded from a checkpoint
// of the same weights. NCCL cannot put two ranks of one group on one device, so this needs two
// GPUs and skips otherwise. Also reports the sync time and GB/s of a ~80 MB model.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>

#include "remove_tree.h"
#include "nlohmann/json.hpp"
#include "slime/comm/weight_sender.h"
#include "slime/engine/engine.h"
#include "slime/engine/server.h"
#include "slime/http/client.h"
#include "slime/model/checkpoint.h"
#include "slime/model/config.h"
#include "slime/model/init_random_model.h"
#include "slime/model/weights.h"

namespace slime::comm {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

std::string SourceDir() {
  const char* env = std::getenv("SLIME_SOURCE_DIR");
  return env != nullptr && *env != '\0' ? env : SLIME_SOURCE_DIR_DEFAULT;
}

struct ServedEngine {
  std::unique_ptr<engine::Engine> engine;
  std::unique_ptr<engine::EngineServer> server;
};

ServedEngine Serve(const std::string& dir) {
  engine::EngineOptions o;
  o.model_path = dir;
  o.device = "cuda:1";
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

TEST(WeightSyncGpuTest, NcclSyncMatchesAFreshEngine) {
  if (!torch::cuda::is_available() || torch::cuda::device_count() < 2) {
    GTEST_SKIP() << "needs 2 CUDA devices (NCCL cannot put two ranks of a group on one GPU)";
  }
  auto backend = ResolveBackend("nccl");
  if (!backend.ok()) GTEST_SKIP() << backend.status();
  const std::string tok = SourceDir() + "/.cache/testdata/qwen3";
  const std::string base = (fs::temp_directory_path() / "slime-wsync-gpu-base").string();
  const std::string moved = (fs::temp_directory_path() / "slime-wsync-gpu-moved").string();
  slime::testing::RemoveTree(base);
  slime::testing::RemoveTree(moved);
  ASSERT_TRUE(model::InitRandomModel(SourceDir() + "/tests/data/model/configs/qwen3-engine-test.json",
                                     tok, base, 0, "bf16")
                  .ok());
  auto config = model::LoadModelConfig(base);
  ASSERT_TRUE(config.ok());
  auto reader = model::CheckpointReader::Open(base);
  ASSERT_TRUE(reader.ok());
  model::WeightOptions wo;
  wo.dtype = torch::kBFloat16;
  auto w = model::LoadWeights(*reader, *config, wo);
  ASSERT_TRUE(w.ok()) << w.status();
  torch::manual_seed(7);
  std::vector<model::NamedTensor> tensors;
  for (model::NamedTensor& nt : model::NamedParameters(*w, *config)) {
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
  ASSERT_TRUE(model::WriteCheckpoint(moved, tensors).ok());
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
  const auto& a = got["meta_info"]["output_token_logprobs"];
  const auto& b = want["meta_info"]["output_token_logprobs"];
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(a[i][0].get<double>(), b[i][0].get<double>(), 1e-5) << i;
  }
  EXPECT_TRUE((*sender)->Disconnect().ok());
  slime::testing::RemoveTree(base);
  slime::testing::RemoveTree(moved);
}

}  // namespace
}  // namespace slime::comm
