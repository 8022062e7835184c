#include "slime/model/decoder.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <barrier>
#include <string>
#include <thread>

#include "reference_decoder.h"
#include "slime/model/attention.h"
#include "slime/model/ffn/dense_mlp.h"
#include "slime/model/tensor_parallel.h"
#include "test_util.h"
#include "tiny_model.h"

namespace slime::model {
namespace {

using testing::MakeTinyModel;
using testing::TinyConfig;

using testing::MaxAbsDiff;
using testing::ReferenceLogits;

constexpr double kTol = 1e-4;  // fp32 CPU

std::string Msg(const Status& s) { return std::string(s.message()); }

// Deterministic token ids for sequence `s` of length `len`.
std::vector<int64_t> Tokens(int64_t vocab, int s, int64_t len) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < len; ++i) ids.push_back((s * 31 + i * 17 + 3) % vocab);
  return ids;
}

struct Packed {
  torch::Tensor ids;
  std::vector<int64_t> cu{0};
  std::vector<std::vector<int64_t>> seqs;
};

Packed Pack(int64_t vocab, const std::vector<int64_t>& lens) {
  Packed p;
  std::vector<int64_t> all;
  for (size_t s = 0; s < lens.size(); ++s) {
    p.seqs.push_back(Tokens(vocab, static_cast<int>(s), lens[s]));
    all.insert(all.end(), p.seqs.back().begin(), p.seqs.back().end());
    p.cu.push_back(p.cu.back() + lens[s]);
  }
  p.ids = torch::tensor(all, torch::kLong);
  return p;
}

torch::Tensor PackedLogits(DecoderModel& m, const Packed& p) {
  auto h = m.ForwardPacked(p.ids, p.cu);
  EXPECT_TRUE(h.ok()) << h.status();
  auto logits = m.Logits(*h);
  EXPECT_TRUE(logits.ok()) << logits.status();
  return *logits;
}

torch::Tensor Seq(const std::vector<int64_t>& ids) { return torch::tensor(ids, torch::kLong); }

class DecoderArchTest : public ::testing::TestWithParam<std::string> {};

TEST_P(DecoderArchTest, PackedForwardMatchesIndependentReference) {
  ModelConfig c = TinyConfig(GetParam());
  auto m = MakeTinyModel(c, torch::kFloat32);
  Packed p = Pack(c.vocab_size, {7, 1, 12});
  torch::Tensor logits = PackedLogits(*m, p);  // [20, vocab]
  ASSERT_EQ(logits.sizes(), (std::vector<int64_t>{20, c.vocab_size}));
  for (size_t s = 0; s < p.seqs.size(); ++s) {
    torch::Tensor ref = ReferenceLogits(c, m->weights(), p.seqs[s]);
    torch::Tensor got = logits.narrow(0, p.cu[s], p.cu[s + 1] - p.cu[s]);
    EXPECT_LE(MaxAbsDiff(got, ref), kTol) << "sequence " << s;
    EXPECT_GT(ref.abs().max().item<double>(), 1e-2);  // not trivially zero
  }
}

TEST_P(DecoderArchTest, PackedVarlenEqualsPerSequenceForward) {
  ModelConfig c = TinyConfig(GetParam());
  auto m = MakeTinyModel(c, torch::kFloat32);
  for (const auto& lens : {std::vector<int64_t>{5, 9, 2, 1}, std::vector<int64_t>{6, 6, 6}}) {
    Packed p = Pack(c.vocab_size, lens);
    torch::Tensor packed = PackedLogits(*m, p);
    for (size_t s = 0; s < p.seqs.size(); ++s) {
      const int64_t n = static_cast<int64_t>(p.seqs[s].size());
      auto h = m->ForwardPacked(Seq(p.seqs[s]), {0, n});
      ASSERT_TRUE(h.ok()) << h.status();
      EXPECT_LE(MaxAbsDiff(*m->Logits(*h), packed.narrow(0, p.cu[s], n)), kTol) << s;
    }
  }
}

TEST_P(DecoderArchTest, KvCacheIncrementalDecodeEqualsFullForward) {
  ModelConfig c = TinyConfig(GetParam());
  auto m = MakeTinyModel(c, torch::kFloat32);
  std::vector<int64_t> ids = Tokens(c.vocab_size, 4, 13);
  auto full_h = m->ForwardPacked(Seq(ids), {0, 13});
  ASSERT_TRUE(full_h.ok());
  torch::Tensor full = *m->Logits(*full_h);

  KvCache cache = m->NewKvCache(16);
  std::vector<torch::Tensor> parts;
  // Prefill 5, decode 4 one by one, then a 4-token chunk on top of the prefix.
  std::vector<std::pair<int64_t, int64_t>> steps = {{0, 5}, {5, 1}, {6, 1}, {7, 1}, {8, 1}, {9, 4}};
  for (auto [start, n] : steps) {
    std::vector<int64_t> chunk(ids.begin() + start, ids.begin() + start + n);
    auto h = m->ForwardWithCache(Seq(chunk), cache);
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_EQ(cache.length(), start + n);
    parts.push_back(*m->Logits(*h));
  }
  EXPECT_LE(MaxAbsDiff(torch::cat(parts, 0), full), kTol);

  // Rolling back and re-decoding gives the same logits.
  ASSERT_TRUE(cache.Truncate(8).ok());
  auto again = m->ForwardWithCache(Seq({ids[8]}), cache);
  ASSERT_TRUE(again.ok());
  EXPECT_LE(MaxAbsDiff(*m->Logits(*again), full.narrow(0, 8, 1)), kTol);
}

TEST_P(DecoderArchTest, BatchedKvCacheForwardMatchesFullForwards) {
  ModelConfig c = TinyConfig(GetParam());
  auto m = MakeTinyModel(c, torch::kFloat32);
  std::vector<int64_t> a = Tokens(c.vocab_size, 1, 9);
  std::vector<int64_t> b = Tokens(c.vocab_size, 2, 6);
  KvCache ca = m->NewKvCache(9);
  KvCache cb = m->NewKvCache(6);
  // Prefill a[0:6] and b[0:3] together, then two decode steps, then a: 1 token, b: 1 token.
  std::vector<torch::Tensor> la, lb;
  int64_t pa = 0, pb = 0;
  for (auto [na, nb] : std::vector<std::pair<int64_t, int64_t>>{{6, 3}, {1, 1}, {1, 1}, {1, 1}}) {
    std::vector<int64_t> ids(a.begin() + pa, a.begin() + pa + na);
    ids.insert(ids.end(), b.begin() + pb, b.begin() + pb + nb);
    auto h = m->ForwardWithCache(Seq(ids), {0, na, na + nb}, {&ca, &cb});
    ASSERT_TRUE(h.ok()) << h.status();
    torch::Tensor logits = *m->Logits(*h);
    la.push_back(logits.narrow(0, 0, na));
    lb.push_back(logits.narrow(0, na, nb));
    pa += na;
    pb += nb;
  }
  auto fa = m->ForwardPacked(Seq(std::vector<int64_t>(a.begin(), a.begin() + pa)), {0, pa});
  auto fb = m->ForwardPacked(Seq(std::vector<int64_t>(b.begin(), b.begin() + pb)), {0, pb});
  EXPECT_LE(MaxAbsDiff(torch::cat(la, 0), *m->Logits(*fa)), kTol);
  EXPECT_LE(MaxAbsDiff(torch::cat(lb, 0), *m->Logits(*fb)), kTol);
}

TEST_P(DecoderArchTest, Bfloat16ForwardTracksFloat32) {
  ModelConfig c = TinyConfig(GetParam());
  auto m32 = MakeTinyModel(c, torch::kFloat32);
  auto m16 = MakeTinyModel(c, torch::kBFloat16);
  EXPECT_EQ(m16->dtype(), torch::kBFloat16);
  Packed p = Pack(c.vocab_size, {6, 3});
  torch::Tensor l32 = PackedLogits(*m32, p);
  torch::Tensor l16 = PackedLogits(*m16, p);
  EXPECT_EQ(l16.scalar_type(), torch::kBFloat16);
  const double scale = l32.abs().max().item<double>();
  EXPECT_LE(MaxAbsDiff(l16, l32), 0.05 * std::max(1.0, scale));

  // Incremental bf16 decode agrees with the bf16 full forward.
  KvCache cache = m16->NewKvCache(8);
  std::vector<int64_t> head(p.seqs[0].begin(), p.seqs[0].begin() + 4);
  auto h1 = m16->ForwardWithCache(Seq(head), cache);
  auto h2 = m16->ForwardWithCache(Seq({p.seqs[0][4], p.seqs[0][5]}), cache);
  ASSERT_TRUE(h1.ok() && h2.ok());
  torch::Tensor inc = torch::cat({*m16->Logits(*h1), *m16->Logits(*h2)}, 0);
  EXPECT_LE(MaxAbsDiff(inc, l16.narrow(0, 0, 6)), 0.05 * std::max(1.0, scale));
}

TEST_P(DecoderArchTest, GradientsReachEveryParameter) {
  ModelConfig c = TinyConfig(GetParam());
  auto m = MakeTinyModel(c, torch::kFloat32);
  for (const ParamSpec& spec : ParameterSpecs(c)) {
    ParamSlot(m->mutable_weights(), spec).requires_grad_(true);
  }
  Packed p = Pack(c.vocab_size, {4, 5});
  torch::Tensor logits = PackedLogits(*m, p);
  torch::Tensor loss = torch::log_softmax(logits, -1).select(1, 3).sum();
  loss.backward();
  for (const ParamSpec& spec : ParameterSpecs(c)) {
    const torch::Tensor& g = ParamSlot(m->weights(), spec).grad();
    ASSERT_TRUE(g.defined()) << spec.hf_name;
    EXPECT_TRUE(torch::isfinite(g).all().item<bool>()) << spec.hf_name;
    EXPECT_GT(g.abs().sum().item<double>(), 0.0) << spec.hf_name;
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, DecoderArchTest, ::testing::Values("qwen2", "qwen3", "llama3"));

TEST(RopeTest, Llama3FrequenciesCoverKeptSmoothedAndScaledRegimes) {
  ModelConfig c = TinyConfig("llama3");
  torch::Tensor f = RopeInverseFrequencies(c);  // [8]
  ASSERT_EQ(f.size(0), 8);
  ModelConfig plain = c;
  plain.rope = RopeConfig{};
  plain.rope.theta = c.rope.theta;
  torch::Tensor base = RopeInverseFrequencies(plain);
  EXPECT_FLOAT_EQ(f[0].item<float>(), base[0].item<float>());  // short wavelength: kept
  EXPECT_LT(f[1].item<float>(), base[1].item<float>());        // medium: smoothed
  EXPECT_GT(f[1].item<float>(), base[1].item<float>() / 8);
  for (int i = 2; i < 8; ++i) {  // long wavelengths: divided by the factor
    EXPECT_FLOAT_EQ(f[i].item<float>(), base[i].item<float>() / 8) << i;
  }
  plain.rope.type = RopeType::kLinear;
  plain.rope.factor = 2.0;
  EXPECT_TRUE(torch::allclose(RopeInverseFrequencies(plain), base / 2));
}

TEST(AttentionTest, PrefixCausalAttentionEqualsSliceOfFullAttention) {
  torch::manual_seed(0);
  torch::Tensor q = torch::randn({10, 4, 8});
  torch::Tensor k = torch::randn({10, 2, 8});
  torch::Tensor v = torch::randn({10, 2, 8});
  torch::Tensor full = CausalAttention(q, k, v, AttentionImpl::kMath);
  for (int64_t n : {1, 3, 10}) {
    torch::Tensor tail = CausalAttention(q.narrow(0, 10 - n, n), k, v, AttentionImpl::kMath);
    EXPECT_LE(MaxAbsDiff(tail, full.narrow(0, 10 - n, n)), 1e-6) << n;
  }
  // First query sees only the first key: output is its value (head group 0 -> kv head 0).
  EXPECT_LE(MaxAbsDiff(full[0][1], v[0][0]), 1e-6);
}

TEST(AttentionTest, SdpaPathAgreesWithMathPathOrIsReportedUnavailable) {
  ModelConfig c = TinyConfig("qwen3");
  auto m = MakeTinyModel(c, torch::kFloat32);
  Packed p = Pack(c.vocab_size, {5, 8, 8});
  m->set_attention_impl(AttentionImpl::kMath);
  torch::Tensor math = PackedLogits(*m, p);
  m->set_attention_impl(AttentionImpl::kSdpa);
  auto h = m->ForwardPacked(p.ids, p.cu);
  if (SdpaAvailable()) {
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_LE(MaxAbsDiff(*m->Logits(*h), math), 1e-5);
    KvCache cache = m->NewKvCache(8);
    ASSERT_TRUE(m->ForwardWithCache(Seq({1, 2, 3}), cache).ok());
    auto chunk = m->ForwardWithCache(Seq({4, 5, 6}), cache);  // masked prefix path
    ASSERT_TRUE(chunk.ok());
  } else {
    ASSERT_FALSE(h.ok());
    EXPECT_NE(Msg(h.status()).find("LibTorch >= 2"), std::string::npos) << h.status();
  }
}

TEST(DecoderInputTest, BadInputsAreErrorsNotCrashes) {
  ModelConfig c = TinyConfig("qwen2");
  auto m = MakeTinyModel(c, torch::kFloat32);
  auto out_of_vocab = m->ForwardPacked(Seq({1, c.vocab_size}), {0, 2});
  ASSERT_FALSE(out_of_vocab.ok());
  EXPECT_NE(Msg(out_of_vocab.status()).find("outside the vocabulary"), std::string::npos);
  EXPECT_FALSE(m->ForwardPacked(Seq({-1, 2}), {0, 2}).ok());
  EXPECT_FALSE(m->ForwardPacked(torch::zeros({2, 2}, torch::kLong), {0, 4}).ok());
  EXPECT_FALSE(m->ForwardPacked(torch::zeros({3}, torch::kFloat), {0, 3}).ok());
  EXPECT_FALSE(m->ForwardPacked(torch::zeros({0}, torch::kLong), {0, 0}).ok());
  auto bad_cu = m->ForwardPacked(Seq({1, 2, 3}), {0, 2});
  ASSERT_FALSE(bad_cu.ok());
  EXPECT_NE(Msg(bad_cu.status()).find("cu_seqlens"), std::string::npos);
  EXPECT_FALSE(m->ForwardPacked(Seq({1, 2, 3}), {1, 3}).ok());
  EXPECT_FALSE(m->ForwardPacked(Seq({1, 2, 3}), {0, 2, 1, 3}).ok());
  EXPECT_FALSE(m->Logits(torch::zeros({2, 7})).ok());
  // int32 ids are accepted.
  EXPECT_TRUE(m->ForwardPacked(torch::tensor({1, 2, 3}, torch::kInt), {0, 3}).ok());

  // A full cache refuses without changing.
  KvCache cache = m->NewKvCache(4);
  ASSERT_TRUE(m->ForwardWithCache(Seq({1, 2, 3}), cache).ok());
  auto full = m->ForwardWithCache(Seq({4, 5}), cache);
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(cache.length(), 3);
  EXPECT_FALSE(cache.Truncate(5).ok());
  // Caches that do not fit the model, or are passed twice.
  KvCache wrong(1, 8, 1, 8, torch::kFloat32);
  auto mismatch = m->ForwardWithCache(Seq({1}), wrong);
  ASSERT_FALSE(mismatch.ok());
  EXPECT_NE(Msg(mismatch.status()).find("does not fit"), std::string::npos);
  KvCache other = m->NewKvCache(8);
  EXPECT_FALSE(m->ForwardWithCache(Seq({1, 2}), {0, 1, 2}, {&other, &other}).ok());
  EXPECT_FALSE(m->ForwardWithCache(Seq({1, 2}), {0, 2}, {&other, &cache}).ok());
}

TEST(DecoderCreateTest, RejectsWeightsThatDoNotMatchTheConfig) {
  ModelConfig c = TinyConfig("qwen3");
  auto w = RandomWeights(c, 1, {});
  ASSERT_TRUE(w.ok());
  ModelWeights bad = *w;
  bad.layers[1].k_norm = torch::ones({3});
  auto m = DecoderModel::Create(c, bad);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(Msg(m.status()).find("model.layers.1.self_attn.k_norm.weight"), std::string::npos);
  ModelWeights mixed = *w;
  mixed.layers[0].ffn.params[DenseMlp::kUpProj] =
      mixed.layers[0].ffn.params[DenseMlp::kUpProj].to(torch::kBFloat16);
  EXPECT_FALSE(DecoderModel::Create(c, mixed).ok());
  ModelWeights missing = *w;
  missing.layers[0].q_norm = torch::Tensor();
  EXPECT_FALSE(DecoderModel::Create(c, missing).ok());
}

// --- Random initialisation ----------------------------------------------------------------------

TEST(RandomWeightsTest, SameSeedSameBytesDifferentSeedDifferent) {
  ModelConfig c = TinyConfig("llama3");
  auto a = RandomWeights(c, 42, {});
  auto b = RandomWeights(c, 42, {});
  auto d = RandomWeights(c, 43, {});
  ASSERT_TRUE(a.ok() && b.ok() && d.ok());
  for (const ParamSpec& spec : ParameterSpecs(c)) {
    EXPECT_TRUE(torch::equal(ParamSlot(*a, spec), ParamSlot(*b, spec))) << spec.hf_name;
    if (spec.init == ParamInit::kNormal) {
      EXPECT_FALSE(torch::equal(ParamSlot(*a, spec), ParamSlot(*d, spec))) << spec.hf_name;
    }
  }
  // Distribution: N(0, initializer_range) for matrices, ones / zeros for norms / biases.
  torch::Tensor e = a->embed_tokens;
  EXPECT_NEAR(e.mean().item<double>(), 0.0, 0.002);
  EXPECT_NEAR(e.std().item<double>(), c.initializer_range, 0.002);
  EXPECT_TRUE(torch::equal(a->final_norm, torch::ones({c.hidden_size})));
  EXPECT_TRUE(torch::equal(a->layers[0].o_bias, torch::zeros({c.hidden_size})));
  // Different parameters get different streams.
  EXPECT_FALSE(torch::equal(a->layers[0].ffn.params[DenseMlp::kGateProj],
                            a->layers[0].ffn.params[DenseMlp::kUpProj]));
}

TEST(RandomWeightsTest, ShardsAreSlicesOfTheFullTensorAndTiedHeadAliasesEmbedding) {
  ModelConfig c = TinyConfig("qwen2");
  c.vocab_size = 96;
  auto full = RandomWeights(c, 9, {});
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(full->lm_head.data_ptr(), full->embed_tokens.data_ptr());
  WeightOptions o;
  o.tp_size = 2;
  o.tp_rank = 1;
  auto shard = RandomWeights(c, 9, o);
  ASSERT_TRUE(shard.ok());
  EXPECT_TRUE(torch::equal(shard->embed_tokens, full->embed_tokens.narrow(0, 48, 48)));
  EXPECT_TRUE(torch::equal(shard->layers[1].o_proj, full->layers[1].o_proj.narrow(1, 16, 16)));
  EXPECT_TRUE(torch::equal(shard->layers[1].ffn.params[DenseMlp::kDownProj],
                           full->layers[1].ffn.params[DenseMlp::kDownProj].narrow(1, 24, 24)));
  EXPECT_TRUE(torch::equal(shard->layers[0].k_proj, full->layers[0].k_proj.narrow(0, 8, 8)));
  o.tp_size = 3;  // 4 heads do not split 3 ways
  EXPECT_FALSE(RandomWeights(c, 9, o).ok());
}

// --- Tensor parallelism, simulated with two threads ---------------------------------------------

// Two ranks in one process: collectives exchange tensors through shared slots.
class ThreadGroupHub {
 public:
  explicit ThreadGroupHub(int size) : slots_(size), barrier_(size) {}
  std::vector<torch::Tensor> Exchange(int rank, torch::Tensor t) {
    slots_[rank] = std::move(t);
    barrier_.arrive_and_wait();
    std::vector<torch::Tensor> all = slots_;
    barrier_.arrive_and_wait();
    return all;
  }

 private:
  std::vector<torch::Tensor> slots_;
  std::barrier<> barrier_;
};

class ThreadGroup final : public TensorParallelGroup {
 public:
  ThreadGroup(ThreadGroupHub* hub, int rank, int size) : hub_(hub), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void AllReduceSum(at::Tensor& t) override {
    std::vector<torch::Tensor> all = hub_->Exchange(rank_, t.clone());
    torch::Tensor sum = all[0].clone();
    for (size_t r = 1; r < all.size(); ++r) sum += all[r];
    t.copy_(sum);
  }
  at::Tensor AllGather(const at::Tensor& t, int64_t dim) override {
    return torch::cat(hub_->Exchange(rank_, t), dim);
  }

 private:
  ThreadGroupHub* hub_;
  int rank_;
  int size_;
};

TEST(TensorParallelTest, TwoRankForwardMatchesSingleRank) {
  for (const std::string arch : {"qwen2", "qwen3", "llama3", "qwen3_moe"}) {
    ModelConfig c = TinyConfig(arch);
    c.vocab_size = 96;
    auto ref = MakeTinyModel(c, torch::kFloat32, 21);
    Packed p = Pack(c.vocab_size, {5, 3});
    torch::Tensor want = PackedLogits(*ref, p);

    ThreadGroupHub hub(2);
    std::vector<torch::Tensor> got(2);
    std::vector<std::string> errors(2);
    auto run = [&](int rank) {
      torch::NoGradGuard no_grad;
      auto group = std::make_shared<ThreadGroup>(&hub, rank, 2);
      WeightOptions o;
      o.tp_rank = rank;
      o.tp_size = 2;
      auto w = RandomWeights(c, 21, o);
      // Same perturbation as the reference: biases/norms of the full model, sliced.
      ModelWeights full = ref->weights();
      for (const ParamSpec& spec : ParameterSpecs(c)) {
        if (spec.init == ParamInit::kNormal) continue;
        torch::Tensor t = ParamSlot(full, spec);
        if (spec.shard == ShardDim::kRows) t = t.chunk(2, 0)[rank];
        ParamSlot(*w, spec) = t.clone();
      }
      auto m = DecoderModel::Create(c, *std::move(w), group);
      if (!m.ok()) {
        errors[rank] = std::string(m.status().message());
        return;
      }
      EXPECT_EQ((*m)->local_heads(), c.num_attention_heads / 2);
      auto h = (*m)->ForwardPacked(p.ids, p.cu);
      auto l = h.ok() ? (*m)->Logits(*h, /*gather=*/true) : h;
      if (!l.ok()) {
        errors[rank] = std::string(l.status().message());
        return;
      }
      got[rank] = *l;
    };
    std::thread t0(run, 0), t1(run, 1);
    t0.join();
    t1.join();
    ASSERT_EQ(errors[0], "") << arch;
    ASSERT_EQ(errors[1], "") << arch;
    EXPECT_LE(MaxAbsDiff(got[0], want), kTol) << arch;
    EXPECT_LE(MaxAbsDiff(got[1], want), kTol) << arch;
  }
}

}  // namespace
}  // namespace slime::model
