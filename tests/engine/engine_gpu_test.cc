// Engine on CUDA (label gpu): the paged decode kernel against the gather path, the engine's
// bf16 log-probs against the model module's forward, and memory release/resume. Skips with a
// message where CUDA is absent.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <random>

#include "engine_test_util.h"
#include "slime/engine/engine.h"
#include "slime/engine/model_runner.h"
#include "slime/engine/paged_kv.h"
#include "slime/engine/sampler.h"
#include "slime/model/decoder.h"
#include "slime/model/init_random_model.h"

#ifdef SLIME_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace slime::engine {
namespace {

int cudaMemGetInfoWrapper(size_t* free_bytes, size_t* total_bytes) {
#ifdef SLIME_WITH_CUDA
  return static_cast<int>(cudaMemGetInfo(free_bytes, total_bytes));
#else
  return -1;
#endif
}

#define SKIP_WITHOUT_CUDA()                                                         \
  if (!torch::cuda::is_available()) {                                               \
    GTEST_SKIP() << "CUDA is not available in this build/machine: GPU test skipped"; \
  }

// qwen3-tiny (head_dim 32, 4 heads over 2 KV heads, real Qwen3 vocabulary) with random weights.
const std::string& TinyModel() {
  return test_util::RandomModelDir("engine-gpu", test_util::TestModelConfig("qwen3-tiny.json"), 3,
                                   "bf16");
}

// A Qwen3-MoE with head_dim 128 (the fused kernels' shapes): 16 experts, 4 active, I = 128.
const std::string& TinyMoeModel() {
  return test_util::RandomModelDir(
      "engine-gpu-moe", test_util::TestModelConfig("qwen3-moe-hd128-test.json"), 7, "bf16");
}

std::unique_ptr<ModelRunner> Runner(const std::string& dtype, bool fuse = true,
                                    const std::string& model = TinyModel()) {
  ModelRunnerOptions o;
  o.fuse_projections = fuse;
  o.model_path = model;
  o.device = "cuda";
  o.dtype = dtype;
  o.page_size = 16;
  o.max_total_tokens = 8192;
  auto r = ModelRunner::Create(o);
  EXPECT_TRUE(r.ok()) << r.status();
  return std::move(r).value();
}

TEST(EngineGpuTest, PagedDecodeKernelMatchesTheGatherPath) {
  SKIP_WITHOUT_CUDA();
  for (const char* dtype : {"float32", "bfloat16"}) {
    auto runner = Runner(dtype);
    ASSERT_TRUE(PagedDecodeKernelAvailable(runner->config().head_dim, 4, 2, runner->device()))
        << "the kernel should cover qwen3-tiny on CUDA";
    std::mt19937 rng(5);
    // Three sequences of different lengths on scattered pages; prefill, then decode steps.
    std::vector<std::vector<int32_t>> toks(3);
    std::vector<std::vector<int32_t>> pages = {{7, 3, 40, 12, 9}, {22, 5, 31}, {2, 60, 18, 44}};
    const int lens[] = {50, 17, 33};
    for (int s = 0; s < 3; ++s) {
      for (int i = 0; i < lens[s] + 8; ++i) toks[s].push_back(static_cast<int32_t>(rng() % 150000));
    }
    std::vector<int32_t> ids;
    std::vector<PagedItem> items;
    for (int s = 0; s < 3; ++s) {
      ids.insert(ids.end(), toks[s].begin(), toks[s].begin() + lens[s]);
      items.push_back({lens[s], lens[s], &pages[s]});
    }
    ASSERT_TRUE(runner->Forward(ids, items).ok());
    for (int step = 0; step < 8; ++step) {
      ids.clear();
      items.clear();
      for (int s = 0; s < 3; ++s) {
        ids.push_back(toks[s][lens[s] + step]);
        items.push_back({1, lens[s] + step + 1, &pages[s]});
      }
      // The same decode twice over the same cache state: kernel, then the gather path (kMath
      // turns the kernel off). Writing the same K/V twice is idempotent.
      auto kernel = runner->Forward(ids, items);
      ASSERT_TRUE(kernel.ok()) << kernel.status();
      runner->model().set_attention_impl(model::AttentionImpl::kMath);
      auto gather = runner->Forward(ids, items);
      runner->model().set_attention_impl(model::AttentionImpl::kAuto);
      ASSERT_TRUE(gather.ok()) << gather.status();
      // fp32: absolute; bf16: relative to the hidden states' scale (a few bf16 ulps).
      const double scale = gather->rank0().to(torch::kFloat32).abs().max().item<double>();
      const double tol = std::string(dtype) == "float32" ? 2e-4 : 2e-2 * scale;  // ~4 bf16 ulps
      const double diff =
          (kernel->rank0().to(torch::kFloat32) - gather->rank0().to(torch::kFloat32)).abs().max().item<double>();
      EXPECT_LT(diff, tol) << dtype << " step " << step << " (scale " << scale << ")";
    }
  }
}

// The fused runner's logits against the unfused one's over a prefill of two sequences and six
// decode steps: within 2e-4 in float32, 2% of the logits' scale in bf16.
void ExpectFusedMatchesUnfused(ModelRunner& fused, ModelRunner& plain, const std::string& dtype) {
  std::mt19937 rng(9);
  std::vector<std::vector<int32_t>> pages = {{4, 9, 1, 30}, {11, 2, 25}};
  const int lens[] = {41, 20};
  std::vector<std::vector<int32_t>> toks(2);
  for (int s = 0; s < 2; ++s) {
    for (int i = 0; i < lens[s] + 6; ++i) toks[s].push_back(static_cast<int32_t>(rng() % 150000));
  }
  auto compare = [&](const std::vector<int32_t>& ids, const std::vector<PagedItem>& items,
                     const std::string& what) {
    auto a = fused.Forward(ids, items);
    auto b = plain.Forward(ids, items);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    const double scale = b->rank0().to(torch::kFloat32).abs().max().item<double>();
    const double tol = dtype == "float32" ? 2e-4 : 2e-2 * scale;
    const double diff =
        (a->rank0().to(torch::kFloat32) - b->rank0().to(torch::kFloat32)).abs().max().item<double>();
    EXPECT_LT(diff, tol) << dtype << " " << what << " (scale " << scale << ")";
  };
  std::vector<int32_t> ids;
  std::vector<PagedItem> items;
  for (int s = 0; s < 2; ++s) {
    ids.insert(ids.end(), toks[s].begin(), toks[s].begin() + lens[s]);
    items.push_back({lens[s], lens[s], &pages[s]});
  }
  compare(ids, items, "prefill");
  for (int step = 0; step < 6; ++step) {
    ids.clear();
    items.clear();
    for (int s = 0; s < 2; ++s) {
      ids.push_back(toks[s][lens[s] + step]);
      items.push_back({1, lens[s] + step + 1, &pages[s]});
    }
    compare(ids, items, "decode step " + std::to_string(step));
  }
}

TEST(EngineGpuTest, FusedProjectionsMatchTheUnfusedForward) {
  SKIP_WITHOUT_CUDA();
  for (const char* dtype : {"float32", "bfloat16"}) {
    auto fused = Runner(dtype, true);
    auto plain = Runner(dtype, false);
    ASSERT_TRUE(fused->model().projections_fused()) << "FuseProjections should apply on CUDA";
    ASSERT_FALSE(plain->model().projections_fused());
    ExpectFusedMatchesUnfused(*fused, *plain, dtype);
  }
}

// MoE in bf16 on Hopper: the fused runner takes the grouped-GEMM path (no host sync), the
// unfused one the per-expert loop; same logits within bf16 rounding.
TEST(EngineGpuTest, MoeGroupedGemmMatchesThePerExpertLoop) {
  SKIP_WITHOUT_CUDA();
  auto fused = Runner("bfloat16", true, TinyMoeModel());
  auto plain = Runner("bfloat16", false, TinyMoeModel());
  ASSERT_TRUE(fused->model().projections_fused());
  EXPECT_FALSE(fused->model().ForwardWaitsOnHost()) << "the grouped-GEMM path should apply";
  EXPECT_TRUE(plain->model().ForwardWaitsOnHost()) << "the per-expert loop reads group sizes";
  ExpectFusedMatchesUnfused(*fused, *plain, "bfloat16");
}

TEST(EngineGpuTest, FusedSamplerMatchesTheTorchSampler) {
  SKIP_WITHOUT_CUDA();
  const int64_t batch = 64, vocab = 151936;
  torch::manual_seed(4);
  torch::Tensor logits =
      (torch::randn({batch, vocab}, torch::TensorOptions().device(torch::kCUDA)) * 3.0);
  std::vector<SamplingParams> params(batch);
  std::vector<SamplerRow> rows(batch);
  for (int64_t b = 0; b < batch; ++b) {
    params[b].temperature = b % 4 == 0 ? 0.0 : (b % 4 == 1 ? 0.7 : 1.0);
    rows[b].params = &params[b];
    rows[b].seed = 1000 + b;
    rows[b].num_output = b;
    rows[b].need_logprob = true;
  }
  SamplerOutput fused = Sample(logits, rows, SamplerPath::kAuto);
  SamplerOutput ref = Sample(logits, rows, SamplerPath::kTorch);
  int same = 0;
  for (int64_t b = 0; b < batch; ++b) {
    if (params[b].temperature == 0.0) {
      EXPECT_EQ(fused.tokens[b], ref.tokens[b]) << "greedy row " << b;
    }
    if (fused.tokens[b] == ref.tokens[b]) {
      ++same;
      EXPECT_NEAR(fused.logprobs[b], ref.logprobs[b], 1e-3) << "row " << b;
    }
  }
  // Sampled rows may differ only where u lands within float rounding of a CDF step.
  EXPECT_GE(same, batch - 2);
  // The chosen token's log-prob is the full-distribution log-prob whatever the path.
  torch::Tensor t = torch::tensor(std::vector<int64_t>(fused.tokens.begin(), fused.tokens.end()))
                        .to(torch::kCUDA);
  for (int64_t b = 0; b < batch; ++b) {
    const double temp = params[b].temperature == 0.0 ? 1.0 : params[b].temperature;
    const double want =
        torch::log_softmax(logits[b] / temp, 0)[fused.tokens[b]].item<double>();
    EXPECT_NEAR(fused.logprobs[b], want, 1e-3) << "row " << b;
  }
  // Batch invariance: a row alone samples what it sampled in the batch.
  for (int64_t b : {1, 2, 37}) {
    SamplerOutput one = Sample(logits.narrow(0, b, 1), {rows[b]}, SamplerPath::kAuto);
    EXPECT_EQ(one.tokens[0], fused.tokens[b]) << "row " << b;
    EXPECT_EQ(one.logprobs[0], fused.logprobs[b]) << "row " << b;
  }
  // Temperature 1 with many draws: the empirical mean of a peaked distribution's top token
  // matches its probability (checks the inverse CDF, not just agreement with the reference).
  torch::Tensor peaked = torch::full({1, vocab}, -30.0, torch::TensorOptions().device(torch::kCUDA));
  peaked[0][17] = 0.0;
  peaked[0][99] = std::log(3.0);  // p(99) = 3/4, p(17) = 1/4 (the rest ~1e-13)
  SamplingParams p1;
  p1.temperature = 1.0;
  int hits = 0;
  const int draws = 2000;
  for (int i = 0; i < draws; ++i) {
    SamplerRow r;
    r.params = &p1;
    r.seed = 77;
    r.num_output = i;
    hits += Sample(peaked, {r}, SamplerPath::kAuto).tokens[0] == 99;
  }
  EXPECT_NEAR(static_cast<double>(hits) / draws, 0.75, 0.04);
}

TEST(EngineGpuTest, Bf16EngineLogprobsMatchTheModelForward) {
  SKIP_WITHOUT_CUDA();
  EngineOptions o;
  o.model_path = TinyModel();
  o.device = "cuda";
  o.dtype = "bfloat16";
  o.max_total_tokens = 8192;
  o.context_length = 1024;
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<int32_t> prompt = {9707, 11, 1879, 0, 576, 374, 264, 1273, 315, 279, 1849, 13};
  GenerateInput in;
  in.rid = "gpu";
  in.input_ids = prompt;
  in.sampling.temperature = 1.0;
  in.sampling.max_new_tokens = 48;
  in.sampling.ignore_eos = true;
  in.sampling.sampling_seed = 3;
  in.return_logprob = true;
  std::promise<RequestOutput> done;
  (*engine)->Submit(in, [&](const RequestOutput& out) {
    if (out.finish.finished()) done.set_value(out);
  });
  RequestOutput out = done.get_future().get();
  ASSERT_EQ(out.output_ids.size(), 48u);
  auto model = model::DecoderModel::Load(TinyModel(), torch::kBFloat16, torch::Device("cuda"));
  ASSERT_TRUE(model.ok());
  std::vector<int64_t> all(prompt.begin(), prompt.end());
  for (int32_t t : out.output_ids) all.push_back(t);
  torch::NoGradGuard ng;
  auto hidden = (*model)->ForwardPacked(torch::tensor(all), {0, static_cast<int64_t>(all.size())});
  ASSERT_TRUE(hidden.ok());
  torch::Tensor lp = torch::log_softmax((*model)->Logits(*hidden)->to(torch::kFloat32), -1).cpu();
  double sum = 0, worst = 0;
  for (size_t i = 0; i < out.output_ids.size(); ++i) {
    const int64_t pos = static_cast<int64_t>(prompt.size() + i) - 1;
    const double d = std::abs(lp[pos][out.output_ids[i]].item<double>() - out.output_logprobs[i]);
    sum += d;
    worst = std::max(worst, d);
  }
  const double mean = sum / out.output_ids.size();
  std::cout << "bf16 engine vs trainer forward: mean |logprob diff| " << mean << ", max " << worst
            << " over " << out.output_ids.size() << " tokens\n";
  EXPECT_LT(mean, 2e-2);
}

TEST(EngineGpuTest, ReleaseMemoryReturnsDeviceMemory) {
  SKIP_WITHOUT_CUDA();
  EngineOptions o;
  o.model_path = TinyModel();
  o.device = "cuda";
  o.max_total_tokens = 1 << 20;  // a KV cache big enough to see (~1 GiB for qwen3-tiny)
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  size_t free_before = 0, free_after = 0, total = 0;
  torch::cuda::synchronize();
  ASSERT_EQ(cudaMemGetInfoWrapper(&free_before, &total), 0);
  ASSERT_TRUE((*engine)->ReleaseMemory({"kv_cache", "weights"}).get().ok());
  ASSERT_EQ(cudaMemGetInfoWrapper(&free_after, &total), 0);
  EXPECT_GT(free_after, free_before + (512u << 20)) << "release freed too little";
  ASSERT_TRUE((*engine)->ResumeMemory({"weights"}).get().ok());
  ASSERT_TRUE((*engine)->ResumeMemory({"kv_cache"}).get().ok());
}

// The greedy continuation of a fixed prompt (ignore_eos), `n` tokens.
std::vector<int32_t> GreedyIds(Engine& engine, int n) {
  GenerateInput in;
  in.input_ids = {9707, 11, 1879, 0, 576, 374};
  in.sampling.temperature = 0.0;
  in.sampling.max_new_tokens = n;
  in.sampling.ignore_eos = true;
  std::promise<std::vector<int32_t>> done;
  engine.Submit(in, [&](const RequestOutput& out) {
    if (out.finish.finished()) done.set_value(out.output_ids);
  });
  return done.get_future().get();
}

// Weights offloaded to pinned host memory and back (the fused projections keep their storage,
// at a new address): greedy output is unchanged.
TEST(EngineGpuTest, GreedyOutputSurvivesWeightOffload) {
  SKIP_WITHOUT_CUDA();
  EngineOptions o;
  o.model_path = TinyModel();
  o.device = "cuda";
  o.max_total_tokens = 8192;
  o.context_length = 1024;
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const std::vector<int32_t> before = GreedyIds(**engine, 24);
  ASSERT_TRUE((*engine)->ReleaseMemory({"kv_cache", "weights"}).get().ok());
  ASSERT_TRUE((*engine)->ResumeMemory({"weights", "kv_cache"}).get().ok());
  EXPECT_EQ(GreedyIds(**engine, 24), before);
}

// The fused CUDA path (head_dim 128: fused QK-norm/RoPE, paged decode kernel, small-m GEMM) with
// decode CUDA graphs, through slime's colocated cycle twice: release everything, resume the
// weights, then the K/V cache and graphs. The graphs are captured again at the weights' new
// addresses and the greedy output (with log-probs) is unchanged.
TEST(EngineGpuTest, FusedGraphsSurviveAWeightReleaseCycle) {
  SKIP_WITHOUT_CUDA();
  const std::string& dir = test_util::RandomModelDir(
      "engine-gpu-hd128", test_util::TestModelConfig("qwen3-hd128-test.json"), 5, "bf16");
  EngineOptions o;
  o.model_path = dir;
  o.device = "cuda";
  o.dtype = "bfloat16";
  o.max_total_tokens = 8192;
  o.context_length = 1024;
  o.cuda_graph_max_bs = 8;
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const std::vector<int32_t> before = GreedyIds(**engine, 32);
  for (int cycle = 0; cycle < 2; ++cycle) {
    ASSERT_TRUE((*engine)->ReleaseMemory({}).get().ok()) << cycle;
    ASSERT_TRUE((*engine)->ResumeMemory({"weights"}).get().ok()) << cycle;
    ASSERT_TRUE((*engine)->ResumeMemory({"kv_cache", "cuda_graph"}).get().ok()) << cycle;
    EXPECT_EQ(GreedyIds(**engine, 32), before) << "cycle " << cycle;
  }
}

// MoE decode steps captured in CUDA graphs (the grouped-GEMM path never syncs with the host)
// give the greedy continuation and log-probs of eager steps.
TEST(EngineGpuTest, MoeDecodeGraphsGiveTheEagerOutput) {
  SKIP_WITHOUT_CUDA();
  auto run = [](int64_t graph_bs) {
    EngineOptions o;
    o.model_path = TinyMoeModel();
    o.device = "cuda";
    o.dtype = "bfloat16";
    o.max_total_tokens = 8192;
    o.context_length = 1024;
    o.cuda_graph_max_bs = graph_bs;
    auto engine = Engine::Create(o);
    EXPECT_TRUE(engine.ok()) << engine.status();
    if (!engine.ok()) return std::vector<int32_t>{};
    return GreedyIds(**engine, 32);
  };
  const std::vector<int32_t> eager = run(0);
  ASSERT_EQ(eager.size(), 32u);
  EXPECT_EQ(run(8), eager);
}

}  // namespace
}  // namespace slime::engine
