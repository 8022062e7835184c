// The CUDA cases of the train module (label gpu; each skips without a CUDA device): AdamW's
// bf16 step on CUDA equal to the CPU's, the Trainer's first-step gates in bfloat16 on a GPU, a
// PPO rollout with the critic on the GPU, and a background checkpoint save from the GPU.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "slime/model/fused_train.h"
#include "slime/model/tensor_parallel.h"
#include "slime/train/critic.h"
#include "slime/train/logprobs.h"
#include "slime/train/optimizer.h"
#include "slime/train/trainer.h"
#include "trainer_test_util.h"

namespace slime::train {
namespace {

using model::testing::TempDir;
using test_util::BaseConfig;
using test_util::ExpectBitwiseEqual;
using test_util::LogProbs;
using test_util::MakeBatch;
using test_util::MakeModelDir;
using test_util::Train;
using test_util::Value;

// On the GPU machine: the same bf16 update on CUDA and on the CPU, states on the device.
TEST(AdamWTest, CudaBf16StepMatchesCpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(3);
  torch::Tensor cpu = torch::randn({8, 16}).to(torch::kBFloat16).set_requires_grad(true);
  torch::Tensor gpu = cpu.detach().to(torch::kCUDA).set_requires_grad(true);
  auto cpu_opt = AdamW::Create({{"w", cpu}}, AdamWOptions{});
  auto gpu_opt = AdamW::Create({{"w", gpu}}, AdamWOptions{});
  ASSERT_TRUE(cpu_opt.ok() && gpu_opt.ok());
  for (int i = 0; i < 3; ++i) {
    const torch::Tensor g = torch::randn({8, 16}).to(torch::kBFloat16);
    cpu.mutable_grad() = g.clone();
    gpu.mutable_grad() = g.to(torch::kCUDA);
    auto rc = (*cpu_opt)->Step(1e-2);
    auto rg = (*gpu_opt)->Step(1e-2);
    ASSERT_TRUE(rc.ok() && rg.ok());
    EXPECT_NEAR(rc->grad_norm, rg->grad_norm, 1e-5 * rc->grad_norm);
  }
  const OptimizerState sc = (*cpu_opt)->ExportState();
  const OptimizerState sg = (*gpu_opt)->ExportState();
  ASSERT_EQ(sc.tensors.size(), sg.tensors.size());
  for (size_t i = 0; i < sc.tensors.size(); ++i) {
    EXPECT_TRUE(sg.tensors[i].tensor.is_cuda()) << sg.tensors[i].name;
    EXPECT_TRUE(torch::allclose(sg.tensors[i].tensor.cpu(), sc.tensors[i].tensor, 1e-5, 1e-7))
        << sg.tensors[i].name;
  }
  EXPECT_EQ(gpu.scalar_type(), torch::kBFloat16);
}

// The same gates on a GPU in bfloat16 (the default dtype there): the forward-only passes and the
// training forward run the same kernels on the same micro-batches.
TEST(TrainerTest, CudaBf16FirstStepGates) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  TempDir dir;
  config::Config c = BaseConfig();
  c.algorithm.use_kl_loss = true;
  c.algorithm.kl_loss_coef = 0.1;
  c.train.global_batch_size = 2;
  TrainerOptions o;
  o.model_dir = MakeModelDir(dir, "m", 1);
  o.config = c;
  o.device = torch::Device(torch::kCUDA, 0);
  auto trainer = Trainer::Create(o);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  EXPECT_EQ((*trainer)->model().dtype(), torch::kBFloat16);
  const data::RolloutBatch batch = MakeBatch(4, 11);
  const SampleLogProbs actor = LogProbs(**trainer, batch);
  EXPECT_TRUE(actor.log_probs[0].is_cuda());
  ExpectBitwiseEqual(LogProbs(**trainer, batch, PolicyWeights::kRef), actor);
  TrainRolloutResult r = Train(**trainer, 0, batch);
  ASSERT_EQ(r.steps.size(), 2u);
  EXPECT_EQ(Value(r.steps[0], "ppo_kl"), 0.0);
  EXPECT_EQ(Value(r.steps[0], "pg_clipfrac"), 0.0);
  EXPECT_EQ(Value(r.steps[0], "kl_loss"), 0.0);
  EXPECT_NE(Value(r.steps[1], "ppo_kl"), 0.0);
  EXPECT_TRUE(std::isfinite(Value(r.steps[1], "grad_norm")));
}

// PPO on a GPU in bfloat16: the critic lives on the device, the first step's gates hold and the
// value loss is finite.
TEST(TrainerTest, CudaBf16PpoRollout) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  TempDir dir;
  config::Config c = BaseConfig();
  c.algorithm.advantage_estimator = "ppo";
  c.algorithm.gamma = 1.0;
  c.algorithm.lambd = 0.95;
  TrainerOptions o;
  o.model_dir = MakeModelDir(dir, "m", 1);
  o.config = c;
  o.device = torch::Device(torch::kCUDA, 0);
  auto trainer = Trainer::Create(o);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  ASSERT_NE((*trainer)->critic(), nullptr);
  EXPECT_TRUE((*trainer)->critic()->value_head().is_cuda());
  EXPECT_EQ((*trainer)->critic()->value_head().scalar_type(), torch::kBFloat16);
  TrainRolloutResult r = Train(**trainer, 0, MakeBatch(4, 11));
  ASSERT_EQ(r.steps.size(), 1u);
  EXPECT_EQ(Value(r.steps[0], "ppo_kl"), 0.0);
  EXPECT_EQ(Value(r.steps[0], "pg_clipfrac"), 0.0);
  EXPECT_TRUE(std::isfinite(Value(r.steps[0], "value_loss")));
  EXPECT_TRUE(std::isfinite(Value(r.steps[0], "critic_grad_norm")));
}

// checkpoint.async_save on a GPU: a PPO trainer in bfloat16 saves synchronously, then in the
// background (pinned host copies of the device tensors, copied asynchronously and synchronized
// before Save returns); the weights change in place on the device right after and a rollout
// trains while the files are written: the files equal the synchronous save's, byte for byte.
TEST(TrainerTest, CudaBackgroundSaveWritesTheSynchronousFiles) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  TempDir dir;
  config::Config c = BaseConfig();
  c.algorithm.advantage_estimator = "ppo";
  TrainerOptions o;
  o.model_dir = MakeModelDir(dir, "m", 2);
  o.config = c;
  o.device = torch::Device(torch::kCUDA, 0);
  auto trainer = Trainer::Create(o);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  Trainer& t = **trainer;
  Train(t, 0, MakeBatch(4, 12));
  ASSERT_TRUE(t.Save(dir.Join("sync"), 0, "{}", Trainer::SaveMode::kSynchronous).ok());
  ASSERT_TRUE(t.Save(dir.Join("async"), 0, "{}", Trainer::SaveMode::kBackground).ok());
  {
    torch::NoGradGuard no_grad;
    for (const model::NamedTensor& nt :
         model::NamedParameters(t.model().weights(), t.model().config())) {
      nt.tensor.add_(1.0);
    }
  }
  Train(t, 1, MakeBatch(4, 13));
  Status waited = t.WaitForSave();
  ASSERT_TRUE(waited.ok()) << waited;
  namespace fs = std::filesystem;
  auto files = [](const fs::path& root) {
    std::map<std::string, std::string> out;
    for (const fs::directory_entry& e : fs::recursive_directory_iterator(root)) {
      if (!e.is_regular_file()) continue;
      std::ifstream in(e.path(), std::ios::binary);
      out[fs::relative(e.path(), root).string()] =
          std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    return out;
  };
  const auto want = files(dir.Join("sync")), got = files(dir.Join("async"));
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, bytes] : want) {
    ASSERT_EQ(got.count(name), 1u) << name;
    EXPECT_TRUE(got.at(name) == bytes) << name << " differs";
  }
  EXPECT_EQ(want.count("iter_0000000/rng_state.safetensors"), 1u);
  EXPECT_EQ(want.count("critic/iter_0000000/extra_weights.safetensors"), 1u);
}

// The fused one-pass log-softmax (model/fused_train.h) against the eager chunk on CUDA: log-probs,
// entropy and the gradients of hidden and the LM head for a loss through both outputs, at a
// temperature != 1, in float32 (tight) and bfloat16, with a Qwen-sized vocabulary row. Keeping
// the logits for the backward (train.recompute_loss_function false) gives the recomputing
// backward's results bit for bit, fused and eager.
TEST(LogProbsTest, CudaFusedLogSoftmaxMatchesEager) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  at::globalContext().setAllowTF32CuBLAS(false);
  for (const torch::ScalarType dtype : {torch::kFloat32, torch::kBFloat16}) {
    torch::manual_seed(7);
    const int64_t vocab = 151936, dim = 64;
    PackedSequences packed;
    packed.cu_seqlens = {0, 40, 70};
    packed.prompt_lengths = {9, 1};
    packed.response_lengths = {31, 29};
    const auto opts = torch::TensorOptions().dtype(dtype).device(torch::kCUDA);
    const torch::Tensor ids = torch::randint(0, vocab, {70}, torch::kLong).to(torch::kCUDA);
    const torch::Tensor hidden = torch::randn({70, dim}, opts);
    const torch::Tensor weight = torch::randn({vocab, dim}, opts) * 0.5;
    auto group = model::MakeSingleRankGroup();
    auto run = [&](bool fused, bool recompute = true) {
      model::SetFusedTraining(fused);
      torch::Tensor h = hidden.clone().requires_grad_(true);
      torch::Tensor w = weight.clone().requires_grad_(true);
      LogProbOptions o;
      o.temperature = 0.7;
      o.chunk_size = 16;
      o.recompute_logits = recompute;
      auto r = ComputeResponseLogProbs(h, w, ids, packed, *group, o);
      EXPECT_TRUE(r.ok()) << r.status();
      const torch::Tensor a = torch::linspace(-1, 1, r->log_probs.numel(), r->log_probs.options());
      ((r->log_probs * a).sum() + (r->entropy * a.flip(0)).sum() * 0.3).backward();
      return std::vector<torch::Tensor>{r->log_probs.detach(), r->entropy.detach(), h.grad(),
                                        w.grad()};
    };
    const std::vector<torch::Tensor> fused = run(true);
    const std::vector<torch::Tensor> eager = run(false);
    const std::vector<torch::Tensor> fused_kept = run(true, /*recompute=*/false);
    const std::vector<torch::Tensor> eager_kept = run(false, /*recompute=*/false);
    model::SetFusedTraining(true);
    const double tol = dtype == torch::kFloat32 ? 1e-4 : 2e-2;
    const char* names[] = {"log_probs", "entropy", "grad hidden", "grad lm_head"};
    for (int i = 0; i < 4; ++i) {
      const double scale = eager[i].abs().max().item<double>();
      const double err = (fused[i].to(torch::kFloat64) - eager[i].to(torch::kFloat64))
                             .abs().max().item<double>();
      EXPECT_LE(err, tol * std::max(scale, 1e-3)) << names[i] << " " << c10::toString(dtype);
      EXPECT_TRUE(torch::equal(fused_kept[i], fused[i])) << names[i] << " fused, kept logits";
      EXPECT_TRUE(torch::equal(eager_kept[i], eager[i])) << names[i] << " eager, kept logits";
    }
  }
}

}  // namespace
}  // namespace slime::train
