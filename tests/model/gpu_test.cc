// CUDA checks of the decoder (label gpu): bf16 and fp32 on the GPU against the CPU reference and
// transformers' logits, SDPA against the math path, packed == per-sequence, cache == full.
// Every test skips with a message where CUDA is not available.
#include <ATen/Context.h>
#ifdef SLIME_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "hf_fixture.h"
#include "reference_decoder.h"
#include "slime/model/batch_invariant.h"
#include "slime/model/decoder.h"
#include "slime/model/fused_train.h"
#include "slime/model/offload.h"
#include "test_util.h"
#include "tiny_model.h"
#ifdef SLIME_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>

#include "fused_ops.h"  // internal src/model/cuda/fused_ops.h: the decode GEMMs, called below
#include "invariant_ops.h"  // internal: which GEMM deterministic mode took per shape
#endif

namespace slime::model {
namespace {

using testing::MaxAbsDiff;

#define SKIP_WITHOUT_CUDA()                                                        \
  if (!torch::cuda::is_available()) {                                              \
    GTEST_SKIP() << "CUDA is not available: GPU model tests need the GPU machine"; \
  }

void DisableTf32() {
  at::globalContext().setAllowTF32CuBLAS(false);
  at::globalContext().setAllowTF32CuDNN(false);
}

ModelConfig ConfigFor(const std::string& arch) {
  std::string json = arch == "qwen2"   ? testing::TinyQwen2ConfigJson()
                     : arch == "qwen3" ? testing::TinyQwen3ConfigJson()
                                       : testing::TinyLlama3ConfigJson();
  auto c = ParseModelConfigJson(json, arch + ".json");
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

ModelWeights Convert(const ModelWeights& w, const ModelConfig& c, torch::ScalarType dtype,
                     torch::Device device) {
  ModelWeights out = w;
  for (const ParamSpec& spec : ParameterSpecs(c)) {
    ParamSlot(out, spec) = ParamSlot(w, spec).to(device, dtype);
  }
  out.lm_head = c.tie_word_embeddings ? out.embed_tokens : out.lm_head;
  return out;
}

// fp32 CPU weights with random biases/norms.
ModelWeights CpuWeights(const ModelConfig& c, uint64_t seed) {
  auto w = RandomWeights(c, seed, {});
  EXPECT_TRUE(w.ok()) << w.status();
  testing::PerturbBiasesAndNorms(*w, c, seed + 1);
  return *w;
}

std::unique_ptr<DecoderModel> Make(const ModelConfig& c, const ModelWeights& cpu,
                                   torch::ScalarType dtype) {
  auto m = DecoderModel::Create(c, Convert(cpu, c, dtype, torch::kCUDA));
  EXPECT_TRUE(m.ok()) << m.status();
  return *std::move(m);
}

std::vector<int64_t> Tokens(int64_t vocab, int s, int64_t len) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < len; ++i) ids.push_back((s * 31 + i * 17 + 3) % vocab);
  return ids;
}

torch::Tensor Ids(const std::vector<int64_t>& ids) { return torch::tensor(ids, torch::kLong); }

torch::Tensor Forward(DecoderModel& m, const std::vector<std::vector<int64_t>>& seqs) {
  std::vector<int64_t> all, cu = {0};
  for (const auto& s : seqs) {
    all.insert(all.end(), s.begin(), s.end());
    cu.push_back(cu.back() + static_cast<int64_t>(s.size()));
  }
  auto h = m.ForwardPacked(Ids(all), cu);
  EXPECT_TRUE(h.ok()) << h.status();
  auto l = m.Logits(*h);
  EXPECT_TRUE(l.ok()) << l.status();
  return *l;
}

double Bf16Tol(const torch::Tensor& ref) {
  return 0.05 * std::max(1.0, ref.abs().max().item<double>());
}

class GpuArchTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuArchTest, Fp32OnCudaMatchesCpuReference) {
  SKIP_WITHOUT_CUDA();
  DisableTf32();
  ModelConfig c = ConfigFor(GetParam());
  ModelWeights cpu = CpuWeights(c, 3);
  auto m = Make(c, cpu, torch::kFloat32);
  std::vector<std::vector<int64_t>> seqs = {Tokens(c.vocab_size, 0, 9), Tokens(c.vocab_size, 1, 4)};
  torch::Tensor logits = Forward(*m, seqs);
  EXPECT_TRUE(logits.is_cuda());
  EXPECT_LE(MaxAbsDiff(logits.narrow(0, 0, 9), testing::ReferenceLogits(c, cpu, seqs[0])), 1e-4);
  EXPECT_LE(MaxAbsDiff(logits.narrow(0, 9, 4), testing::ReferenceLogits(c, cpu, seqs[1])), 1e-4);
}

TEST_P(GpuArchTest, Bf16PackedEqualsPerSequenceAndCacheEqualsFull) {
  SKIP_WITHOUT_CUDA();
  ModelConfig c = ConfigFor(GetParam());
  ModelWeights cpu = CpuWeights(c, 4);
  auto m = Make(c, cpu, torch::kBFloat16);
  std::vector<std::vector<int64_t>> seqs = {Tokens(c.vocab_size, 0, 11), Tokens(c.vocab_size, 1, 3),
                                            Tokens(c.vocab_size, 2, 7)};
  torch::Tensor packed = Forward(*m, seqs);
  EXPECT_EQ(packed.scalar_type(), torch::kBFloat16);
  const double tol = Bf16Tol(packed);
  int64_t off = 0;
  for (const auto& s : seqs) {
    const int64_t n = static_cast<int64_t>(s.size());
    EXPECT_LE(MaxAbsDiff(Forward(*m, {s}), packed.narrow(0, off, n)), tol);
    off += n;
  }
  // Equal lengths take the batched attention call.
  std::vector<std::vector<int64_t>> equal = {Tokens(c.vocab_size, 5, 8),
                                             Tokens(c.vocab_size, 6, 8)};
  torch::Tensor eq = Forward(*m, equal);
  EXPECT_LE(MaxAbsDiff(Forward(*m, {equal[1]}), eq.narrow(0, 8, 8)), tol);

  // Cache: prefill 6, decode 3, chunk of 2.
  const auto& s = seqs[0];
  torch::Tensor full = Forward(*m, {s});
  KvCache cache = m->NewKvCache(16);
  std::vector<torch::Tensor> parts;
  for (auto [start, n] : std::vector<std::pair<int, int>>{{0, 6}, {6, 1}, {7, 1}, {8, 1}, {9, 2}}) {
    auto h = m->ForwardWithCache(
        Ids(std::vector<int64_t>(s.begin() + start, s.begin() + start + n)), cache);
    ASSERT_TRUE(h.ok()) << h.status();
    parts.push_back(*m->Logits(*h));
  }
  EXPECT_LE(MaxAbsDiff(torch::cat(parts, 0), full), tol);
  // And bf16 stays close to fp32.
  auto m32 = Make(c, cpu, torch::kFloat32);
  EXPECT_LE(MaxAbsDiff(Forward(*m32, seqs), packed), tol);
}

TEST_P(GpuArchTest, SdpaAgreesWithMathPath) {
  SKIP_WITHOUT_CUDA();
  DisableTf32();
  ASSERT_TRUE(SdpaAvailable()) << "the CUDA build should have LibTorch >= 2";
  ModelConfig c = ConfigFor(GetParam());
  ModelWeights cpu = CpuWeights(c, 5);
  for (torch::ScalarType dt : {torch::kFloat32, torch::kBFloat16}) {
    auto m = Make(c, cpu, dt);
    std::vector<std::vector<int64_t>> seqs = {Tokens(c.vocab_size, 0, 10),
                                              Tokens(c.vocab_size, 1, 10)};
    m->set_attention_impl(AttentionImpl::kMath);
    torch::Tensor math = Forward(*m, seqs);
    m->set_attention_impl(AttentionImpl::kSdpa);
    torch::Tensor sdpa = Forward(*m, seqs);
    EXPECT_LE(MaxAbsDiff(math, sdpa), dt == torch::kFloat32 ? 1e-4 : Bf16Tol(math));
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, GpuArchTest, ::testing::Values("qwen2", "qwen3", "llama3"));

TEST(GpuHfFixtureTest, CudaMatchesTransformersFp32AndBf16) {
  SKIP_WITHOUT_CUDA();
  DisableTf32();
  for (const char* name : testing::kHfFixtureNames) {
    auto fx = testing::LoadHfFixture(name);
    ASSERT_TRUE(fx.ok()) << fx.status();
    for (torch::ScalarType dt : {torch::kFloat32, torch::kBFloat16}) {
      auto m = DecoderModel::Load(fx->dir, dt, torch::kCUDA);
      ASSERT_TRUE(m.ok()) << m.status();
      torch::Tensor logits = Forward(**m, fx->inputs);
      int64_t off = 0;
      for (size_t s = 0; s < fx->inputs.size(); ++s) {
        const int64_t n = static_cast<int64_t>(fx->inputs[s].size());
        const double tol = dt == torch::kFloat32 ? 1e-4 : Bf16Tol(fx->logits[s]);
        EXPECT_LE(MaxAbsDiff(logits.narrow(0, off, n), fx->logits[s]), tol)
            << name << " " << c10::toString(dt) << " sequence " << s;
        off += n;
      }
    }
  }
}

TEST(GpuQwen3ShapeTest, RandomQwen3_0_6bBf16PackedAndIncrementalAgree) {
  SKIP_WITHOUT_CUDA();
  auto c = LoadModelConfig(testing::ModelTestDataDir() + "/configs/qwen3-0.6b.json");
  ASSERT_TRUE(c.ok()) << c.status();
  WeightOptions o;
  o.dtype = torch::kBFloat16;
  o.device = torch::kCUDA;
  auto w = RandomWeights(*c, 1, o);
  ASSERT_TRUE(w.ok()) << w.status();
  auto m = DecoderModel::Create(*c, *std::move(w));
  ASSERT_TRUE(m.ok()) << m.status();
  torch::NoGradGuard no_grad;
  std::vector<int64_t> a = Tokens(c->vocab_size, 0, 200), b = Tokens(c->vocab_size, 1, 77);
  torch::Tensor packed = Forward(**m, {a, b});
  ASSERT_TRUE(torch::isfinite(packed).all().item<bool>());
  const double tol = Bf16Tol(packed);
  KvCache cache = (*m)->NewKvCache(256);
  auto h = (*m)->ForwardWithCache(Ids(std::vector<int64_t>(a.begin(), a.begin() + 192)), cache);
  ASSERT_TRUE(h.ok()) << h.status();
  std::vector<torch::Tensor> parts = {*(*m)->Logits(*h)};
  for (int i = 192; i < 200; ++i) {
    auto hi = (*m)->ForwardWithCache(Ids({a[i]}), cache);
    ASSERT_TRUE(hi.ok()) << hi.status();
    parts.push_back(*(*m)->Logits(*hi));
  }
  EXPECT_LE(MaxAbsDiff(torch::cat(parts, 0), packed.narrow(0, 0, 200)), tol);
}

// Bytes the CUDA caching allocator has handed out on device 0.
int64_t AllocatedBytes() {
#ifdef SLIME_WITH_CUDA
  return static_cast<int64_t>(
      c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[0].current);
#else
  return 0;
#endif
}

// StorageOffloader: device memory really goes back to the allocator; every tensor (and a view
// sharing its storage) keeps its identity and its bytes after Onload, at a new address.
TEST(ModelGpuTest, StorageOffloaderFreesDeviceMemoryAndRestoresContents) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(3);
  torch::Tensor a = torch::randn({1024, 1024}, torch::dtype(torch::kBFloat16).device(torch::kCUDA));
  torch::Tensor fused = torch::randn({3, 4096, 1024}, torch::device(torch::kCUDA));  // 48 MiB
  torch::Tensor view = fused.narrow(0, 1, 1);
  const torch::Tensor a_cpu = a.cpu(), fused_cpu = fused.cpu();
  const void* old_ptr = fused.data_ptr();
  torch::cuda::synchronize();
  const int64_t before = AllocatedBytes();
  StorageOffloader off;
  ASSERT_TRUE(off.Offload({a, fused, view, torch::Tensor(), torch::ones({2})}).ok());
  EXPECT_TRUE(off.offloaded());
  EXPECT_EQ(off.bytes(), a.numel() * 2 + fused.numel() * 4);  // the view's storage counted once
  const int64_t during = AllocatedBytes();
  EXPECT_LE(during, before - off.bytes());
  EXPECT_FALSE(off.Offload({a}).ok());  // twice is refused
  ASSERT_TRUE(off.Onload().ok());
  EXPECT_FALSE(off.offloaded());
  EXPECT_TRUE(torch::equal(a.cpu(), a_cpu));
  EXPECT_TRUE(torch::equal(fused.cpu(), fused_cpu));
  EXPECT_TRUE(torch::equal(view.cpu(), fused_cpu.narrow(0, 1, 1)));
  view.fill_(2.0f);  // the view still shares the (new) storage
  EXPECT_EQ(fused[1][0][0].item<float>(), 2.0f);
  std::printf("offload: %lld bytes, fused storage %p -> %p\n", static_cast<long long>(off.bytes()),
              old_ptr, fused.data_ptr());
  EXPECT_TRUE(off.Onload().ok());  // a no-op now
}

// ---- fused training ops (model/fused_train.h) against the eager ops, forward and backward.

torch::Tensor EagerRmsNorm(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  torch::Tensor xf = x.to(torch::kFloat32);
  xf = xf * torch::rsqrt(xf.pow(2).mean(-1, true) + eps);
  return w * xf.to(x.scalar_type());
}
torch::Tensor EagerRope(const torch::Tensor& x, const torch::Tensor& c, const torch::Tensor& s) {
  const int64_t half = x.size(-1) / 2;
  torch::Tensor rot = torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * c + rot * s;
}
// max |a - b| / max |b|: one scale per tensor, so bf16 rounding of large entries does not
// dominate.
double RelErr(const torch::Tensor& a, const torch::Tensor& b) {
  const double scale = b.to(torch::kFloat64).abs().max().item<double>();
  return MaxAbsDiff(a, b) / (scale > 0 ? scale : 1.0);
}

struct FusedCase {
  torch::ScalarType dtype;
  double tol;
};

class FusedTrainingOpsTest : public ::testing::TestWithParam<FusedCase> {};

TEST_P(FusedTrainingOpsTest, RmsNormRopeSiluMulMatchEagerWithGradients) {
  SKIP_WITHOUT_CUDA();
  DisableTf32();
  const auto [dtype, tol] = GetParam();
  const auto opts = torch::TensorOptions().dtype(dtype).device(torch::kCUDA);
  torch::manual_seed(11);
  ASSERT_TRUE(FusedTrainingEnabled());
  // RMSNorm over a hidden row (1024) and over q/k heads (128), ragged row counts.
  for (auto shape : {std::vector<int64_t>{333, 1024}, std::vector<int64_t>{77, 16, 128}}) {
    const int64_t n = shape.back();
    torch::Tensor x = torch::randn(shape, opts);
    torch::Tensor w = (1 + 0.1 * torch::randn({n}, opts)).detach();
    torch::Tensor dy = torch::randn(shape, opts);
    torch::Tensor xa = x.clone().requires_grad_(true), wa = w.clone().requires_grad_(true);
    ASSERT_TRUE(FusedTrainingApplies(xa));
    torch::Tensor ya = FusedRmsNorm(xa, wa, 1e-6);
    ya.backward(dy);
    torch::Tensor xb = x.clone().requires_grad_(true), wb = w.clone().requires_grad_(true);
    torch::Tensor yb = EagerRmsNorm(xb, wb, 1e-6);
    yb.backward(dy);
    EXPECT_LE(RelErr(ya, yb), tol) << "RMSNorm y, n " << n;
    EXPECT_LE(RelErr(xa.grad(), xb.grad()), tol) << "RMSNorm dx, n " << n;
    EXPECT_LE(RelErr(wa.grad(), wb.grad()), tol) << "RMSNorm dw, n " << n;
  }
  {
    const int64_t t = 129, heads = 6, d = 128;
    torch::Tensor x = torch::randn({t, heads, d}, opts);
    torch::Tensor ang = torch::rand({t, 1, d / 2}, torch::kCUDA) * 6.28;
    ang = torch::cat({ang, ang}, -1);
    torch::Tensor c = ang.cos().to(dtype), s = ang.sin().to(dtype);
    torch::Tensor dy = torch::randn({t, heads, d}, opts);
    torch::Tensor xa = x.clone().requires_grad_(true);
    torch::Tensor ya = FusedRope(xa, c, s);
    ya.backward(dy);
    torch::Tensor xb = x.clone().requires_grad_(true);
    torch::Tensor yb = EagerRope(xb, c, s);
    yb.backward(dy);
    EXPECT_LE(RelErr(ya, yb), tol) << "RoPE y";
    EXPECT_LE(RelErr(xa.grad(), xb.grad()), tol) << "RoPE dx";
  }
  {
    torch::Tensor g = torch::randn({97, 3072}, opts) * 3, u = torch::randn({97, 3072}, opts);
    torch::Tensor dy = torch::randn({97, 3072}, opts);
    torch::Tensor ga = g.clone().requires_grad_(true), ua = u.clone().requires_grad_(true);
    torch::Tensor ya = FusedSiluMul(ga, ua);
    ya.backward(dy);
    torch::Tensor gb = g.clone().requires_grad_(true), ub = u.clone().requires_grad_(true);
    torch::Tensor yb = torch::silu(gb) * ub;
    yb.backward(dy);
    EXPECT_LE(RelErr(ya, yb), tol) << "SiLU*up y";
    EXPECT_LE(RelErr(ga.grad(), gb.grad()), tol) << "SiLU*up dgate";
    EXPECT_LE(RelErr(ua.grad(), ub.grad()), tol) << "SiLU*up dup";
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, FusedTrainingOpsTest,
                         ::testing::Values(FusedCase{torch::kFloat32, 2e-5},
                                           FusedCase{torch::kBFloat16, 2e-2}),
                         [](const auto& info) {
                           return std::string(info.param.dtype == torch::kFloat32 ? "Fp32"
                                                                                  : "Bf16");
                         });

// The whole decoder: a training forward + backward with the fused ops equals the eager one
// (float32: to 1e-4 of each gradient's scale).
TEST(FusedTrainingDecoderTest, Qwen3GradientsMatchEagerFp32) {
  SKIP_WITHOUT_CUDA();
  DisableTf32();
  const ModelConfig c = ConfigFor("qwen3");
  std::unique_ptr<DecoderModel> model = Make(c, CpuWeights(c, 5), torch::kFloat32);
  std::vector<NamedTensor> params = NamedParameters(model->weights(), c);
  for (NamedTensor& p : params) p.tensor.requires_grad_(true);
  std::vector<int64_t> all = Tokens(c.vocab_size, 1, 17), second = Tokens(c.vocab_size, 2, 23);
  all.insert(all.end(), second.begin(), second.end());
  auto grads_with = [&](bool fused) {
    SetFusedTraining(fused);
    for (NamedTensor& p : params) p.tensor.mutable_grad() = torch::Tensor();
    auto hidden = model->ForwardPacked(Ids(all), {0, 17, 40});
    EXPECT_TRUE(hidden.ok()) << hidden.status();
    torch::Tensor probe =
        torch::linspace(-1, 1, hidden->numel(), hidden->options()).view_as(*hidden);
    (*hidden * probe).sum().backward();
    std::vector<torch::Tensor> g;
    for (NamedTensor& p : params) {
      g.push_back(p.tensor.grad().defined() ? p.tensor.grad().clone() : torch::Tensor());
    }
    return g;
  };
  const std::vector<torch::Tensor> fused = grads_with(true);
  const std::vector<torch::Tensor> eager = grads_with(false);
  SetFusedTraining(true);
  ASSERT_EQ(fused.size(), eager.size());
  for (size_t i = 0; i < fused.size(); ++i) {
    ASSERT_EQ(fused[i].defined(), eager[i].defined()) << params[i].name;
    if (fused[i].defined()) EXPECT_LE(RelErr(fused[i], eager[i]), 1e-4) << params[i].name;
  }
}

// Activation recomputation on the GPU (fused training ops, SDPA): every setting keeps the
// gradients (to rounding: the fused RMSNorm weight gradient sums with atomics, so two runs are
// not bitwise equal on CUDA — the CPU tests check bitwise), and full recomputation keeps far
// less memory between the forward and the backward (the layer inputs only).
TEST(FusedTrainingDecoderTest, RecomputationKeepsTheGradientsAndHoldsLessMemory) {
  SKIP_WITHOUT_CUDA();
  DisableTf32();
  ModelConfig c = ConfigFor("qwen3");
  c.num_hidden_layers = 4;
  std::unique_ptr<DecoderModel> model = Make(c, CpuWeights(c, 7), torch::kFloat32);
  std::vector<NamedTensor> params = NamedParameters(model->weights(), c);
  for (NamedTensor& p : params) p.tensor.requires_grad_(true);
  std::vector<int64_t> all = Tokens(c.vocab_size, 1, 700), second = Tokens(c.vocab_size, 2, 1348);
  all.insert(all.end(), second.begin(), second.end());
  struct Run {
    std::vector<torch::Tensor> grads;
    int64_t held = 0;  // bytes allocated by the forward and still held when it returns
  };
  auto run = [&](const RecomputeOptions& o) {
    EXPECT_TRUE(model->SetRecompute(o).ok());
    for (NamedTensor& p : params) p.tensor.mutable_grad() = torch::Tensor();
    Run r;
    torch::cuda::synchronize();
    const int64_t before = AllocatedBytes();
    auto hidden = model->ForwardPacked(Ids(all), {0, 700, 2048});
    EXPECT_TRUE(hidden.ok()) << hidden.status();
    torch::cuda::synchronize();
    r.held = AllocatedBytes() - before;
    torch::Tensor probe =
        torch::linspace(-1, 1, hidden->numel(), hidden->options()).view_as(*hidden);
    (*hidden * probe).sum().backward();
    // Parameters outside ForwardPacked (the output layer) get no gradient in any run.
    for (NamedTensor& p : params) {
      r.grads.push_back(p.tensor.grad().defined() ? p.tensor.grad().clone() : torch::Tensor());
    }
    return r;
  };
  const Run plain = run(RecomputeOptions{});
  RecomputeOptions full;
  full.granularity = RecomputeGranularity::kFull;
  full.method = RecomputeMethod::kUniform;
  full.num_layers = 1;
  RecomputeOptions block = full;
  block.method = RecomputeMethod::kBlock;
  block.num_layers = 2;
  RecomputeOptions selective;
  selective.granularity = RecomputeGranularity::kSelective;
  for (const RecomputeOptions& o : {full, block, selective}) {
    const Run got = run(o);
    for (size_t i = 0; i < params.size(); ++i) {
      ASSERT_EQ(got.grads[i].defined(), plain.grads[i].defined())
          << RecomputeDescription(o) << ": " << params[i].name;
      if (!plain.grads[i].defined()) continue;
      EXPECT_LE(RelErr(got.grads[i], plain.grads[i]), 1e-4)
          << RecomputeDescription(o) << ": " << params[i].name;
    }
    EXPECT_LE(got.held, plain.held) << RecomputeDescription(o);
    if (o.full() && o.method == RecomputeMethod::kUniform) {
      EXPECT_LT(got.held * 3, plain.held) << "held " << got.held << " vs " << plain.held;
    }
  }
  model->SetRecompute(RecomputeOptions{}).IgnoreError();
}

// ---- the decode GEMMs with the layer's elementwise steps folded in (cuda/fused_ops.h,
// "norm_gemm"): bit for bit what the separate kernels give.

struct NormGemmCase {
  torch::ScalarType dtype;
  int64_t k;
};

class NormGemmTest : public ::testing::TestWithParam<NormGemmCase> {};

TEST_P(NormGemmTest, FoldedNormAndResidualAddEqualTheSeparateKernels) {
  SKIP_WITHOUT_CUDA();
#ifdef SLIME_WITH_CUDA
  const auto [dtype, k] = GetParam();
  const cuda::DType dt = dtype == torch::kFloat32 ? cuda::DType::kFloat32 : cuda::DType::kBFloat16;
  const auto opts = torch::TensorOptions().dtype(dtype).device(torch::kCUDA);
  torch::manual_seed(5);
  const int64_t n = 203;  // not a multiple of the 8 warps of a block: idle warps in the last one
  const int64_t k2 = 384;  // the in-features of the GEMM that adds into the residual
  const float eps = 1e-6f;
  void* stream = at::cuda::getCurrentCUDAStream().stream();  // the one torch's ops below use
  for (const int64_t m : {1, 3, 8}) {
    if (!cuda::NormGemmSupported(m, k, dt)) {
      ASSERT_GT(m, 1);  // the fold is compiled for single-row steps only
      continue;
    }
    SCOPED_TRACE(::testing::Message() << "m=" << m);
    const torch::Tensor residual = torch::randn({m, k}, opts);
    const torch::Tensor x2 = torch::randn({m, k2}, opts);
    const torch::Tensor w2 = torch::randn({k, k2}, opts) / 16;
    const torch::Tensor b2 = torch::randn({k}, opts);
    const torch::Tensor norm = 1 + 0.1 * torch::randn({k}, opts);
    const torch::Tensor w = torch::randn({n, k}, opts) / 16;
    const torch::Tensor gate_up = torch::randn({2 * n, k}, opts) / 16;
    const torch::Tensor bias = torch::randn({n}, opts);

    // Separate kernels: delta = x2 W2^T + b2; residual += delta and normed = RmsNorm(residual);
    // then the GEMMs on `normed`.
    torch::Tensor delta = torch::empty({m, k}, opts);
    ASSERT_EQ(cuda::LaunchSmallGemm(x2.data_ptr(), w2.data_ptr(), b2.data_ptr(), delta.data_ptr(),
                                    m, k, k2, dt, stream),
              0);
    torch::Tensor ref_res = residual.clone(), normed = torch::empty_like(residual);
    ASSERT_EQ(cuda::LaunchAddRmsNorm(ref_res.data_ptr(), delta.data_ptr(), norm.data_ptr(),
                                     normed.data_ptr(), m, static_cast<int>(k), eps, dt, stream),
              0);
    torch::Tensor ref_y = torch::empty({m, n}, opts), ref_act = torch::empty({m, n}, opts);
    ASSERT_EQ(cuda::LaunchSmallGemm(normed.data_ptr(), w.data_ptr(), bias.data_ptr(),
                                    ref_y.data_ptr(), m, n, k, dt, stream),
              0);
    ASSERT_EQ(cuda::LaunchSmallGemmSiluMul(normed.data_ptr(), gate_up.data_ptr(),
                                           ref_act.data_ptr(), m, n, k, dt, stream),
              0);
    // The null-delta AddRmsNorm of the final norm: the residual as it is, not written.
    torch::Tensor again = ref_res.clone(), normed_again = torch::empty_like(residual);
    ASSERT_EQ(cuda::LaunchAddRmsNorm(again.data_ptr(), nullptr, norm.data_ptr(),
                                     normed_again.data_ptr(), m, static_cast<int>(k), eps, dt,
                                     stream),
              0);

    // Folded: the add inside the GEMM, the norm inside the next ones.
    torch::Tensor res = residual.clone();
    ASSERT_EQ(cuda::LaunchSmallGemmAddResidual(x2.data_ptr(), w2.data_ptr(), b2.data_ptr(),
                                               res.data_ptr(), m, k, k2, dt, stream),
              0);
    torch::Tensor y = torch::full({m, n}, 7, opts), act = torch::full({m, n}, 7, opts);
    ASSERT_EQ(cuda::LaunchNormSmallGemm(res.data_ptr(), norm.data_ptr(), eps, w.data_ptr(),
                                        bias.data_ptr(), y.data_ptr(), m, n, k, dt, stream),
              0);
    ASSERT_EQ(cuda::LaunchNormSmallGemmSiluMul(res.data_ptr(), norm.data_ptr(), eps,
                                               gate_up.data_ptr(), act.data_ptr(), m, n, k, dt,
                                               stream),
              0);
    torch::cuda::synchronize();
    EXPECT_TRUE(torch::equal(res, ref_res)) << "max diff " << MaxAbsDiff(res, ref_res);
    EXPECT_TRUE(torch::equal(y, ref_y)) << "max diff " << MaxAbsDiff(y, ref_y);
    EXPECT_TRUE(torch::equal(act, ref_act)) << "max diff " << MaxAbsDiff(act, ref_act);
    EXPECT_TRUE(torch::equal(again, ref_res));
    EXPECT_TRUE(torch::equal(normed_again, normed));
    EXPECT_FALSE(torch::equal(res, residual));  // the add happened
    EXPECT_GT(y.abs().max().item<double>(), 0.0);
  }
  EXPECT_FALSE(cuda::NormGemmSupported(1, k + 8, dt));
  EXPECT_FALSE(cuda::NormGemmSupported(2, k, dt));
  EXPECT_FALSE(cuda::NormGemmSupported(9, k, dt));
  const torch::Tensor x = torch::randn({1, k + 8}, opts), w8 = torch::randn({8, k + 8}, opts);
  torch::Tensor y8 = torch::empty({1, 8}, opts);
  EXPECT_NE(cuda::LaunchNormSmallGemm(x.data_ptr(), x.data_ptr(), eps, w8.data_ptr(), nullptr,
                                      y8.data_ptr(), 1, 8, k + 8, dt, stream),
            0);
#else
  GTEST_SKIP() << "built without CUDA kernels";
#endif
}

// The slab small-m GEMMs (weights copied to shared memory before the grid dependency wait) give
// the streaming kernels' results bit for bit, for every kind of decode GEMM and the Qwen3-0.6B
// shapes (q|k|v, o, gate|up, down) plus ragged ones.
TEST(SlabGemmTest, SlabKernelsEqualTheStreamingKernels) {
  SKIP_WITHOUT_CUDA();
#ifdef SLIME_WITH_CUDA
  void* stream = at::cuda::getCurrentCUDAStream().stream();
  struct Shape {
    int64_t n, k;
  };
  const std::vector<Shape> shapes = {{4096, 1024}, {1024, 2048}, {3072, 1024},
                                     {1024, 3072}, {203, 1024},  {203, 2560}};
  int slab_cases = 0;
  for (const torch::ScalarType dtype : {torch::kBFloat16, torch::kFloat32}) {
    const cuda::DType dt =
        dtype == torch::kFloat32 ? cuda::DType::kFloat32 : cuda::DType::kBFloat16;
    const auto opts = torch::TensorOptions().dtype(dtype).device(torch::kCUDA);
    for (const Shape& shape : shapes) {
      for (const int64_t m : {1, 2, 8}) {  // slab kernels at 1 and 2 rows; 8 streams
        const int64_t n = shape.n, k = shape.k;
        SCOPED_TRACE(::testing::Message() << torch::toString(dtype) << " m=" << m << " n=" << n
                                          << " k=" << k);
        torch::manual_seed(11);
        const torch::Tensor x = torch::randn({m, k}, opts);
        const torch::Tensor w = torch::randn({n, k}, opts) / 16;
        const torch::Tensor gate_up = torch::randn({2 * n, k}, opts) / 16;
        const torch::Tensor bias = torch::randn({n}, opts);
        const torch::Tensor residual = torch::randn({m, n}, opts);
        const torch::Tensor norm = 1 + 0.1 * torch::randn({k}, opts);
        const bool norm_ok = cuda::NormGemmSupported(m, k, dt);
        slab_cases += cuda::SmallGemmUsesSlab(m, n, k, dt, false, false) +
                      cuda::SmallGemmUsesSlab(m, n, k, dt, true, false) +
                      cuda::SmallGemmUsesSlab(m, n, k, dt, false, true);
        auto run = [&](bool slab) {
          cuda::SetSlabGemm(slab);
          std::vector<torch::Tensor> out = {torch::full({m, n}, 7, opts),
                                            torch::full({m, n}, 7, opts), residual.clone(),
                                            torch::full({m, n}, 7, opts),
                                            torch::full({m, n}, 7, opts)};
          EXPECT_EQ(cuda::LaunchSmallGemm(x.data_ptr(), w.data_ptr(), bias.data_ptr(),
                                          out[0].data_ptr(), m, n, k, dt, stream),
                    0);
          EXPECT_EQ(cuda::LaunchSmallGemmSiluMul(x.data_ptr(), gate_up.data_ptr(),
                                                 out[1].data_ptr(), m, n, k, dt, stream),
                    0);
          EXPECT_EQ(cuda::LaunchSmallGemmAddResidual(x.data_ptr(), w.data_ptr(), bias.data_ptr(),
                                                     out[2].data_ptr(), m, n, k, dt, stream),
                    0);
          if (norm_ok) {
            EXPECT_EQ(cuda::LaunchNormSmallGemm(x.data_ptr(), norm.data_ptr(), 1e-6f,
                                                w.data_ptr(), bias.data_ptr(), out[3].data_ptr(),
                                                m, n, k, dt, stream),
                      0);
            EXPECT_EQ(cuda::LaunchNormSmallGemmSiluMul(x.data_ptr(), norm.data_ptr(), 1e-6f,
                                                       gate_up.data_ptr(), out[4].data_ptr(), m,
                                                       n, k, dt, stream),
                      0);
          }
          torch::cuda::synchronize();
          cuda::SetSlabGemm(true);
          return out;
        };
        const std::vector<torch::Tensor> slab = run(true);
        const std::vector<torch::Tensor> streaming = run(false);
        for (size_t i = 0; i < slab.size(); ++i) {
          EXPECT_TRUE(torch::equal(slab[i], streaming[i]))
              << "output " << i << " max diff " << MaxAbsDiff(slab[i], streaming[i]);
        }
        // Both are the GEMM, not the same wrong answer.
        const torch::Tensor ref = torch::addmm(bias.to(torch::kFloat32), x.to(torch::kFloat32),
                                               w.to(torch::kFloat32).t());
        EXPECT_LE(RelErr(slab[0].to(torch::kFloat32), ref), 1e-2);
        EXPECT_LE(RelErr((slab[2] - residual).to(torch::kFloat32), ref), 5e-2);
      }
    }
  }
  // On a GPU with at least 64 SMs the bf16 Qwen3-0.6B shapes take the slab path.
  EXPECT_GT(slab_cases, 0);
  EXPECT_FALSE(cuda::SmallGemmUsesSlab(8, 4096, 1024, cuda::DType::kBFloat16, false, false));
  if (at::cuda::getCurrentDeviceProperties()->multiProcessorCount >= 64) {
    EXPECT_TRUE(cuda::SmallGemmUsesSlab(1, 4096, 1024, cuda::DType::kBFloat16, false, false));
    EXPECT_TRUE(cuda::SmallGemmUsesSlab(1, 3072, 1024, cuda::DType::kBFloat16, true, false));
    EXPECT_TRUE(cuda::SmallGemmUsesSlab(1, 1024, 3072, cuda::DType::kBFloat16, false, true));
  }
#else
  GTEST_SKIP() << "built without CUDA kernels";
#endif
}

INSTANTIATE_TEST_SUITE_P(DtypesAndWidths, NormGemmTest,
                         ::testing::Values(NormGemmCase{torch::kBFloat16, 1024},
                                           NormGemmCase{torch::kBFloat16, 2560},
                                           NormGemmCase{torch::kFloat32, 1024},
                                           NormGemmCase{torch::kFloat32, 4096}));

// ---- Deterministic mode on CUDA (model/batch_invariant.h, src/model/cuda/invariant_ops.h)

class ModeOn {
 public:
  ModeOn() : was_(BatchInvariant()) { SetBatchInvariant(true); }
  ~ModeOn() { SetBatchInvariant(was_); }

 private:
  bool was_;
};

TEST(BatchInvariantCudaTest, LinearRowsAreTheSameBitsForEveryRowCount) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(3);
  // Qwen3-0.6B's and -4B's projection shapes, the 0.6B LM head, and an odd small one.
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {1024, 2048}, {1024, 1024}, {2048, 1024}, {1024, 3072}, {3072, 1024},
      {2560, 9728}, {9728, 2560}, {1024, 151936}, {96, 40}};
  for (auto [k, n] : shapes) {
    for (torch::ScalarType dtype : {torch::kBFloat16, torch::kFloat32}) {
      const int64_t rows = n > 100000 ? 512 : 2048;
      const auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(dtype);
      const torch::Tensor x = torch::randn({rows, k}, opts);
      const torch::Tensor w = torch::randn({n, k}, opts) * 0.03;
      const torch::Tensor first = InvariantLinear(x.narrow(0, 0, 1), w);
      const torch::Tensor last = InvariantLinear(x.narrow(0, rows - 1, 1), w);
      for (int64_t m : {int64_t{1}, int64_t{2}, int64_t{7}, int64_t{64}, int64_t{255},
                        int64_t{256}, int64_t{1000}, rows}) {
        if (m > rows) continue;
        const torch::Tensor y = InvariantLinear(x.narrow(0, 0, m), w);
        EXPECT_TRUE(torch::equal(y.narrow(0, 0, 1), first))
            << "k " << k << " n " << n << " " << c10::toString(dtype) << ": row 0 of " << m;
        if (m == rows) {
          EXPECT_TRUE(torch::equal(y.narrow(0, rows - 1, 1), last))
              << "k " << k << " n " << n << ": the last row";
          const torch::Tensor ref = torch::linear(x.to(torch::kFloat64), w.to(torch::kFloat64));
          EXPECT_LE((y.to(torch::kFloat64) - ref).abs().max().item<double>(),
                    (dtype == torch::kBFloat16 ? 2e-2 : 1e-3) *
                        std::max(1.0, ref.abs().max().item<double>()))
              << "k " << k << " n " << n << " " << c10::toString(dtype);
        }
      }
    }
  }
#ifdef SLIME_WITH_CUDA
  std::cout << "deterministic-mode GEMMs:\n" << cuda::InvariantGemmReport();
#endif
}

TEST(BatchInvariantCudaTest, AttentionQueriesAreTheSameBitsAloneInAChunkOrInTheWholeSequence) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(4);
  for (torch::ScalarType dtype : {torch::kBFloat16, torch::kFloat32}) {
    for (int64_t d : {64, 128}) {
      const auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(dtype);
      const int64_t l = 300, heads = 16, kv_heads = 8;
      const torch::Tensor q = torch::randn({l, heads, d}, opts);
      const torch::Tensor k = torch::randn({l, kv_heads, d}, opts);
      const torch::Tensor v = torch::randn({l, kv_heads, d}, opts);
      const torch::Tensor whole = InvariantCausalAttention(q, k, v);
      // The last 37 queries as a chunk over the cached prefix, and single decode steps.
      // (37 rows run one warp per row, 300 and 101 the multi-warp kernel on other row tilings.)
      for (int64_t n : {int64_t{37}, int64_t{101}}) {
        const torch::Tensor chunk = InvariantCausalAttention(q.narrow(0, l - n, n), k, v);
        EXPECT_TRUE(torch::equal(chunk, whole.narrow(0, l - n, n))) << "chunk " << n << ", D " << d;
      }
      for (int64_t i : {int64_t{0}, int64_t{1}, int64_t{150}, l - 1}) {
        const torch::Tensor step = InvariantCausalAttention(
            q.narrow(0, i, 1), k.narrow(0, 0, i + 1), v.narrow(0, 0, i + 1));
        EXPECT_TRUE(torch::equal(step, whole.narrow(0, i, 1))) << "step " << i << ", D " << d;
      }
      // The values are attention's: the math path in float64.
      const torch::Tensor kr = k.to(torch::kFloat64).repeat_interleave(heads / kv_heads, 1);
      const torch::Tensor vr = v.to(torch::kFloat64).repeat_interleave(heads / kv_heads, 1);
      torch::Tensor s = torch::einsum("ihd,jhd->hij", {q.to(torch::kFloat64), kr}) /
                        std::sqrt(static_cast<double>(d));
      const torch::Tensor mask = torch::ones({l, l}, torch::kBool).triu(1).to(torch::kCUDA);
      s = s.masked_fill(mask, -std::numeric_limits<double>::infinity());
      const torch::Tensor ref = torch::einsum("hij,jhd->ihd", {torch::softmax(s, -1), vr});
      EXPECT_LE((whole.to(torch::kFloat64) - ref).abs().max().item<double>(),
                dtype == torch::kBFloat16 ? 2e-2 : 1e-4);
      // Differentiable (the backward recomputes through LibTorch's attention).
      const torch::Tensor qg = q.to(torch::kFloat32).detach().requires_grad_(true);
      InvariantCausalAttention(qg, k.to(torch::kFloat32), v.to(torch::kFloat32)).sum().backward();
      ASSERT_TRUE(qg.grad().defined());
      EXPECT_TRUE(torch::isfinite(qg.grad()).all().item<bool>());
    }
  }
}

TEST(BatchInvariantCudaTest, PagedAttentionIsTheSameBitsAsAttentionOverTheSequence) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(5);
  const int64_t heads = 16, kv_heads = 8, d = 128, page = 16, slots = 64 * page;
  const auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  const auto longs = torch::TensorOptions().dtype(torch::kLong);
  const torch::Tensor kc = torch::randn({slots, kv_heads, d}, opts);
  const torch::Tensor vc = torch::randn({slots, kv_heads, d}, opts);
  // Three sequences on shuffled pages; each one's new tokens: a decode step, a 70-token chunk,
  // and a whole 40-token prefill (111 rows: row tiles of the multi-warp kernel span sequences).
  const std::vector<int64_t> lens = {77, 130, 40}, news = {1, 70, 40};
  const torch::Tensor perm = torch::randperm(64, longs);
  std::vector<torch::Tensor> rows_of;
  std::vector<int64_t> key_rows, meta;
  int64_t next_page = 0, total_new = 0;
  for (size_t s = 0; s < lens.size(); ++s) {
    const int64_t pages = (lens[s] + page - 1) / page;
    std::vector<int64_t> rows;
    for (int64_t j = 0; j < lens[s]; ++j) {
      rows.push_back(perm[next_page + j / page].item<int64_t>() * page + j % page);
    }
    next_page += pages;
    for (int64_t i = lens[s] - news[s]; i < lens[s]; ++i) {
      meta.push_back(static_cast<int64_t>(key_rows.size()));
      meta.push_back(i);
    }
    key_rows.insert(key_rows.end(), rows.begin(), rows.end());
    rows_of.push_back(torch::tensor(rows, longs).to(torch::kCUDA));
    total_new += news[s];
  }
  const torch::Tensor q = torch::randn({total_new, heads, d}, opts);
  const torch::Tensor key_rows_d = torch::tensor(key_rows, longs).to(torch::kCUDA);
  const torch::Tensor meta_d = torch::tensor(meta, longs).view({total_new, 2}).to(torch::kCUDA);
  const torch::Tensor out = InvariantPagedAttention(q, kc, vc, key_rows_d, meta_d);
  // One warp per row with its query heads (the launch shape for a step of decodes), and the
  // rows in two launches (a step that mixes decodes and chunks): the same bits.
  EXPECT_TRUE(torch::equal(
      InvariantPagedAttention(q, kc, vc, key_rows_d, meta_d, /*rows_are_sequences=*/true), out));
  const torch::Tensor head = torch::arange(0, 71, longs).to(torch::kCUDA);
  EXPECT_TRUE(torch::equal(InvariantPagedAttention(q.index_select(0, head), kc, vc, key_rows_d,
                                                   meta_d.index_select(0, head), true),
                           out.narrow(0, 0, 71)));
  int64_t row = 0;
  for (size_t s = 0; s < lens.size(); ++s) {
    const torch::Tensor ref = InvariantCausalAttention(
        q.narrow(0, row, news[s]), kc.index_select(0, rows_of[s]), vc.index_select(0, rows_of[s]));
    EXPECT_TRUE(torch::equal(out.narrow(0, row, news[s]), ref)) << "sequence " << s;
    row += news[s];
  }
  // The decode form over a page table: one query per sequence (padded rows of length 0 are
  // allowed and touch nothing else).
  const int64_t max_pages = 9;
  std::vector<int32_t> table(4 * max_pages, 0), seq_lens = {77, 130, 40, 0};
  next_page = 0;
  for (size_t s = 0; s < lens.size(); ++s) {
    const int64_t pages = (lens[s] + page - 1) / page;
    for (int64_t p = 0; p < pages; ++p) {
      table[s * max_pages + p] = static_cast<int32_t>(perm[next_page + p].item<int64_t>());
    }
    next_page += pages;
  }
  const torch::Tensor qd = torch::randn({4, heads, d}, opts);
  const torch::Tensor od = InvariantPagedDecodeAttention(
      qd, kc, vc, torch::tensor(table, torch::kInt).view({4, max_pages}).to(torch::kCUDA),
      torch::tensor(seq_lens, torch::kInt).to(torch::kCUDA), page);
  for (size_t s = 0; s < lens.size(); ++s) {
    const torch::Tensor ref = InvariantCausalAttention(
        qd.narrow(0, s, 1), kc.index_select(0, rows_of[s]), vc.index_select(0, rows_of[s]));
    EXPECT_TRUE(torch::equal(od.narrow(0, s, 1), ref)) << "decode, sequence " << s;
  }
}

TEST(BatchInvariantCudaTest, RowStatisticsAreTheSameBitsForEveryRowCount) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(5);
  const torch::Tensor z = torch::randn({64, 151936}, torch::kCUDA) * 3;
  const SoftmaxStats all = InvariantSoftmaxStats(z, /*with_entropy=*/true);
  for (int64_t r : {0, 17, 63}) {
    const SoftmaxStats one = InvariantSoftmaxStats(z.narrow(0, r, 1), true);
    EXPECT_TRUE(torch::equal(one.max, all.max.narrow(0, r, 1)));
    EXPECT_TRUE(torch::equal(one.log_sum, all.log_sum.narrow(0, r, 1)));
    EXPECT_TRUE(torch::equal(one.mean_shifted, all.mean_shifted.narrow(0, r, 1)));
  }
  const torch::Tensor targets =
      torch::randint(0, 151936, {64}, torch::TensorOptions().dtype(torch::kLong).device(torch::kCUDA));
  const torch::Tensor want = torch::log_softmax(z.to(torch::kFloat64) / 0.7, -1)
                                 .gather(1, targets.unsqueeze(1))
                                 .squeeze(1);
  const torch::Tensor got = InvariantTokenLogProbs(z, targets, 0.7);
  EXPECT_LT((got.to(torch::kFloat64) - want).abs().max().item<double>(), 1e-4);
  const torch::Tensor x = torch::randn({300, 1024}, torch::kCUDA);
  const torch::Tensor ms = InvariantMeanSquare(x);
  EXPECT_TRUE(torch::equal(InvariantMeanSquare(x.narrow(0, 5, 1)), ms.narrow(0, 5, 1)));
  EXPECT_LT((ms - x.pow(2).mean(-1, true)).abs().max().item<double>(), 1e-5);
}

class BatchInvariantCudaDecoderTest
    : public ::testing::TestWithParam<std::tuple<std::string, torch::ScalarType>> {};

TEST_P(BatchInvariantCudaDecoderTest, ASequenceIsTheSameBitsPackedAloneAndThroughTheCache) {
  SKIP_WITHOUT_CUDA();
  ModeOn mode;
  const auto [arch, dtype] = GetParam();
  const ModelConfig c = testing::TinyConfig(arch);
  auto m = testing::MakeTinyModel(c, dtype, 11, torch::kCUDA);
  ASSERT_NE(m, nullptr);
  testing::ExpectASequenceIsTheSameBitsPackedAloneAndThroughTheCache(*m, c.vocab_size);
}

INSTANTIATE_TEST_SUITE_P(
    Archs, BatchInvariantCudaDecoderTest,
    ::testing::Combine(::testing::Values("qwen2", "qwen3", "llama3"),
                       ::testing::Values(torch::kFloat32, torch::kBFloat16)),
    [](const auto& info) {
      return std::get<0>(info.param) +
             (std::get<1>(info.param) == torch::kFloat32 ? "_fp32" : "_bf16");
    });

TEST(BatchInvariantCudaDecoderTest, Qwen3_0_6bShapeBf16) {
  SKIP_WITHOUT_CUDA();
  ModeOn mode;
  auto c = LoadModelConfig(testing::ModelTestDataDir() + "/configs/qwen3-0.6b.json");
  ASSERT_TRUE(c.ok()) << c.status();
  WeightOptions o;
  o.dtype = torch::kBFloat16;
  o.device = torch::kCUDA;
  auto w = RandomWeights(*c, 1, o);
  ASSERT_TRUE(w.ok()) << w.status();
  auto m = DecoderModel::Create(*c, *std::move(w));
  ASSERT_TRUE(m.ok()) << m.status();
  testing::ExpectASequenceIsTheSameBitsPackedAloneAndThroughTheCache(**m, c->vocab_size,
                                                                     {100, 300, 57});
}

}  // namespace
}  // namespace slime::model
