// Response log-probs and entropy: the shift on a hand-built case, equality with a plain
// torch::log_softmax reference (values and gradients), chunked == unchunked, a finite-difference
// gradient check in float64, and a two-rank vocab split (two threads) == one rank.
#include "slime/train/logprobs.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "slime/model/tensor_parallel.h"

namespace slime::train {
namespace {

double MaxAbsDiff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

// A random packed micro-batch: sequences of (prompt, response) lengths, plus `pad` rows.
struct Batch {
  PackedSequences packed;
  torch::Tensor ids;     // [T]
  torch::Tensor hidden;  // [T, H]
  torch::Tensor weight;  // [V, H]
};

Batch RandomBatch(const std::vector<std::pair<int64_t, int64_t>>& lengths, int64_t vocab,
                  int64_t dim, torch::ScalarType dtype, int64_t pad = 0, uint64_t seed = 1) {
  torch::manual_seed(seed);
  Batch b;
  b.packed.cu_seqlens = {0};
  for (auto [p, r] : lengths) {
    b.packed.prompt_lengths.push_back(p);
    b.packed.response_lengths.push_back(r);
    b.packed.cu_seqlens.push_back(b.packed.cu_seqlens.back() + p + r);
  }
  const int64_t t = b.packed.cu_seqlens.back() + pad;
  b.ids = torch::randint(0, vocab, {t}, torch::kLong);
  b.hidden = torch::randn({t, dim}, torch::kFloat64).to(dtype);
  b.weight = (torch::randn({vocab, dim}, torch::kFloat64) * 0.7).to(dtype);
  return b;
}

// The reference, written independently of the implementation: the engine's definition
// log_softmax(float(h Wᵀ) / T) over all positions, then per response token j of sample b the
// row of position start + P + j - 1 and the id at start + P + j.
struct Reference {
  torch::Tensor log_probs, entropy;
};

Reference ReferenceLogProbs(const torch::Tensor& hidden, const torch::Tensor& weight,
                            const Batch& b, double temperature) {
  const auto compute = hidden.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  torch::Tensor logits = torch::linear(hidden, weight).to(compute) / temperature;
  torch::Tensor logp_all = torch::log_softmax(logits, -1);  // [T, V]
  std::vector<torch::Tensor> lp, ent;
  for (size_t s = 0; s < b.packed.prompt_lengths.size(); ++s) {
    const int64_t start = b.packed.cu_seqlens[s];
    const int64_t p = b.packed.prompt_lengths[s];
    for (int64_t j = 0; j < b.packed.response_lengths[s]; ++j) {
      const int64_t pos = start + p + j;
      torch::Tensor row = logp_all[pos - 1];
      lp.push_back(row[b.ids[pos].item<int64_t>()]);
      ent.push_back(-(row.exp() * row).sum());
    }
  }
  return {torch::stack(lp), torch::stack(ent)};
}

// Weights of the test loss sum(a · log_probs) + sum(c · entropy).
// Fixed, varied per-row weights without a random generator: ranks run as threads in the
// vocab-split test, and seeding the global generator from two threads raced (the ranks then
// weighted their losses differently and their gradients disagreed).
torch::Tensor LossWeights(int64_t n, uint64_t seed, torch::ScalarType dtype) {
  torch::Tensor i = torch::arange(n, torch::kFloat64);
  return torch::sin(i * 1.37 + static_cast<double>(seed)).mul(1.5).to(dtype);
}

struct Grads {
  torch::Tensor hidden, weight;
};

// Runs ComputeResponseLogProbs on fresh leaves and backpropagates the test loss.
struct OurRun {
  ResponseLogProbs out;
  Grads grads;
};

OurRun RunOurs(const Batch& b, const torch::Tensor& hidden_in, const torch::Tensor& weight_in,
               model::TensorParallelGroup& group, const LogProbOptions& o,
               bool use_log_probs = true) {
  torch::Tensor hidden = hidden_in.detach().clone().requires_grad_(true);
  torch::Tensor weight = weight_in.detach().clone().requires_grad_(true);
  auto r = ComputeResponseLogProbs(hidden, weight, b.ids, b.packed, group, o);
  EXPECT_TRUE(r.ok()) << r.status();
  OurRun run{*r, {}};
  const int64_t n = r->log_probs.size(0);
  torch::Tensor loss = torch::zeros({}, r->log_probs.options());
  if (use_log_probs)
    loss = loss + (LossWeights(n, 11, r->log_probs.scalar_type()) * r->log_probs).sum();
  if (o.compute_entropy) {
    loss = loss + (LossWeights(n, 12, r->entropy.scalar_type()) * r->entropy).sum();
  }
  loss.backward();
  run.grads = {hidden.grad(), weight.grad()};
  return run;
}

Grads ReferenceGrads(const Batch& b, double temperature, bool with_log_probs, bool with_entropy) {
  torch::Tensor hidden = b.hidden.detach().clone().requires_grad_(true);
  torch::Tensor weight = b.weight.detach().clone().requires_grad_(true);
  Reference ref = ReferenceLogProbs(hidden, weight, b, temperature);
  const int64_t n = ref.log_probs.size(0);
  torch::Tensor loss = torch::zeros({}, ref.log_probs.options());
  if (with_log_probs)
    loss = loss + (LossWeights(n, 11, ref.log_probs.scalar_type()) * ref.log_probs).sum();
  if (with_entropy)
    loss = loss + (LossWeights(n, 12, ref.entropy.scalar_type()) * ref.entropy).sum();
  loss.backward();
  return {hidden.grad(), weight.grad()};
}

TEST(LogProbsTest, ShiftOnAHandBuiltBatch) {
  // V = H = 4, W = I, so the logits of a row are its hidden state. Row p boosts one token:
  // logits ln(3) at b_p, 0 elsewhere -> probabilities 1/2 (b_p) and 1/6 (others).
  // Sequences: [0,1 | 2,3] (prompt 2, response 2) and [1 | 2,3,0] (prompt 1, response 3),
  // then two padding rows. Response tokens sit at rows 2,3 and 5,6,7 and are predicted from
  // rows 1,2 and 4,5,6, which boost exactly the next token; the other rows boost the token at
  // their own row (what an off-by-one would read), or token 1 for padding rows.
  PackedSequences packed{{0, 4, 8}, {2, 1}, {2, 3}};
  torch::Tensor ids = torch::tensor({0, 1, 2, 3, 1, 2, 3, 0, 3, 3}, torch::kLong);
  const std::vector<int64_t> boost = {0, 2, 3, 3, 2, 3, 0, 0, 1, 1};
  torch::Tensor hidden = torch::zeros({10, 4}, torch::kFloat32);
  for (int64_t p = 0; p < 10; ++p) hidden[p][boost[p]] = std::log(3.0);
  torch::Tensor weight = torch::eye(4, torch::kFloat32);

  auto rows = ResponsePredictorRows(packed);
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ(*rows, (std::vector<int64_t>{1, 2, 4, 5, 6}));

  model::SingleRankGroup group;
  auto r = ComputeResponseLogProbs(hidden, weight, ids, packed, group, {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->offsets, (std::vector<int64_t>{0, 2, 5}));
  ASSERT_EQ(r->log_probs.sizes(), torch::IntArrayRef({5}));
  EXPECT_EQ(r->log_probs.scalar_type(), torch::kFloat32);
  const double entropy = 0.5 * std::log(2.0) + 0.5 * std::log(6.0);
  for (int64_t i = 0; i < 5; ++i) {
    EXPECT_NEAR(r->log_probs[i].item<double>(), std::log(0.5), 1e-6) << i;
    EXPECT_NEAR(r->entropy[i].item<double>(), entropy, 1e-6) << i;
  }

  // Temperature 2 halves the logits: boosted probability sqrt(3) / (sqrt(3) + 3).
  LogProbOptions o;
  o.temperature = 2.0;
  r = ComputeResponseLogProbs(hidden, weight, ids, packed, group, o);
  ASSERT_TRUE(r.ok());
  const double p = std::sqrt(3.0) / (std::sqrt(3.0) + 3.0);
  const double q = (1 - p) / 3;
  for (int64_t i = 0; i < 5; ++i) {
    EXPECT_NEAR(r->log_probs[i].item<double>(), std::log(p), 1e-6);
    EXPECT_NEAR(r->entropy[i].item<double>(), -(p * std::log(p) + 3 * q * std::log(q)), 1e-6);
  }
}

TEST(LogProbsTest, MatchesLogSoftmaxReference) {
  Batch b = RandomBatch({{3, 4}, {1, 1}, {5, 0}, {2, 6}}, 37, 16, torch::kFloat32, /*pad=*/3);
  model::SingleRankGroup group;
  for (double temperature : {1.0, 0.7, 1.9}) {
    LogProbOptions o;
    o.temperature = temperature;
    OurRun ours = RunOurs(b, b.hidden, b.weight, group, o);
    Reference ref = ReferenceLogProbs(b.hidden, b.weight, b, temperature);
    EXPECT_LT(MaxAbsDiff(ours.out.log_probs, ref.log_probs), 2e-6) << temperature;
    EXPECT_LT(MaxAbsDiff(ours.out.entropy, ref.entropy), 2e-6) << temperature;
    Grads g = ReferenceGrads(b, temperature, true, true);
    EXPECT_LT(MaxAbsDiff(ours.grads.hidden, g.hidden), 2e-5) << temperature;
    EXPECT_LT(MaxAbsDiff(ours.grads.weight, g.weight), 2e-5) << temperature;
    // Padding rows get no gradient.
    EXPECT_EQ(ours.grads.hidden.narrow(0, 22, 3).abs().max().item<float>(), 0.0f);
  }
  EXPECT_EQ(RunOurs(b, b.hidden, b.weight, group, {}).out.offsets,
            (std::vector<int64_t>{0, 4, 5, 5, 11}));
}

TEST(LogProbsTest, LogProbsOnlyOrEntropyOnly) {
  Batch b = RandomBatch({{2, 5}, {4, 3}}, 29, 8, torch::kFloat32);
  model::SingleRankGroup group;
  LogProbOptions no_entropy;
  no_entropy.compute_entropy = false;
  no_entropy.temperature = 0.8;
  OurRun lp_only = RunOurs(b, b.hidden, b.weight, group, no_entropy);
  EXPECT_FALSE(lp_only.out.entropy.defined());
  Grads g = ReferenceGrads(b, 0.8, true, false);
  EXPECT_LT(MaxAbsDiff(lp_only.grads.hidden, g.hidden), 2e-5);
  EXPECT_LT(MaxAbsDiff(lp_only.grads.weight, g.weight), 2e-5);
  // Entropy used, log-probs not (their gradient is undefined in the backward).
  LogProbOptions with_entropy;
  with_entropy.temperature = 0.8;
  OurRun ent_only = RunOurs(b, b.hidden, b.weight, group, with_entropy, /*use_log_probs=*/false);
  g = ReferenceGrads(b, 0.8, false, true);
  EXPECT_LT(MaxAbsDiff(ent_only.grads.hidden, g.hidden), 2e-5);
  EXPECT_LT(MaxAbsDiff(ent_only.grads.weight, g.weight), 2e-5);
}

TEST(LogProbsTest, ChunkedEqualsUnchunked) {
  Batch b = RandomBatch({{3, 4}, {1, 1}, {2, 6}}, 41, 12, torch::kFloat32);
  model::SingleRankGroup group;
  LogProbOptions whole;
  whole.temperature = 0.6;
  OurRun all = RunOurs(b, b.hidden, b.weight, group, whole);
  // A few float32 ulps of the largest value: the log-sum-exp's reduction order may differ
  // between a chunk and the whole (the SIMD path of the machine's CPU decides; 1.9e-6 = 2 ulps
  // of a log-prob near -10 was measured on an AVX-512 machine). A chunking error is O(1).
  auto ulps = [](const torch::Tensor& t) {
    return 4.0 * std::numeric_limits<float>::epsilon() *
           std::max(1.0, t.abs().max().item<double>());
  };
  for (int64_t chunk : {1, 2, 3, 5, 11, 100}) {
    LogProbOptions o = whole;
    o.chunk_size = chunk;
    OurRun c = RunOurs(b, b.hidden, b.weight, group, o);
    EXPECT_LT(MaxAbsDiff(c.out.log_probs, all.out.log_probs), ulps(all.out.log_probs)) << chunk;
    EXPECT_LT(MaxAbsDiff(c.out.entropy, all.out.entropy), ulps(all.out.entropy)) << chunk;
    EXPECT_LT(MaxAbsDiff(c.grads.hidden, all.grads.hidden), 1e-5) << chunk;  // fp32 sum order
    // The weight gradient sums over tokens in a different order per chunking: with an optimized
    // BLAS (OpenBLAS) that is a few float32 ulps of the O(1) values, not a chunking error.
    EXPECT_LT(MaxAbsDiff(c.grads.weight, all.grads.weight), 1e-5) << chunk;
  }
}

// train.recompute_loss_function false keeps each chunk's logits for the backward instead of
// computing them again: the same log-probs, entropy and gradients, bit for bit, whatever the
// chunking and whichever outputs the loss uses.
TEST(LogProbsTest, KeptLogitsEqualRecomputedBitwise) {
  Batch b = RandomBatch({{3, 4}, {1, 1}, {2, 6}}, 41, 12, torch::kFloat32);
  model::SingleRankGroup group;
  for (int64_t chunk : {-1, 1, 4}) {
    for (bool entropy : {true, false}) {
      for (bool use_log_probs : {true, false}) {
        if (!entropy && !use_log_probs) continue;
        LogProbOptions o;
        o.temperature = 0.6;
        o.chunk_size = chunk;
        o.compute_entropy = entropy;
        OurRun recomputed = RunOurs(b, b.hidden, b.weight, group, o, use_log_probs);
        o.recompute_logits = false;
        OurRun kept = RunOurs(b, b.hidden, b.weight, group, o, use_log_probs);
        const std::string where = "chunk " + std::to_string(chunk) + " entropy " +
                                  std::to_string(entropy) + " log-probs " +
                                  std::to_string(use_log_probs);
        EXPECT_TRUE(torch::equal(kept.out.log_probs, recomputed.out.log_probs)) << where;
        if (entropy) EXPECT_TRUE(torch::equal(kept.out.entropy, recomputed.out.entropy)) << where;
        EXPECT_TRUE(torch::equal(kept.grads.hidden, recomputed.grads.hidden)) << where;
        EXPECT_TRUE(torch::equal(kept.grads.weight, recomputed.grads.weight)) << where;
      }
    }
  }
}

TEST(LogProbsTest, FiniteDifferenceGradientsInFloat64) {
  Batch b = RandomBatch({{2, 3}, {1, 2}}, 7, 5, torch::kFloat64, /*pad=*/1, /*seed=*/3);
  model::SingleRankGroup group;
  LogProbOptions o;
  o.temperature = 1.3;
  o.chunk_size = 2;
  OurRun ours = RunOurs(b, b.hidden, b.weight, group, o);
  auto loss_at = [&](const torch::Tensor& hidden, const torch::Tensor& weight) {
    torch::NoGradGuard no_grad;
    auto r = ComputeResponseLogProbs(hidden, weight, b.ids, b.packed, group, o);
    EXPECT_TRUE(r.ok());
    const int64_t n = r->log_probs.size(0);
    return ((LossWeights(n, 11, torch::kFloat64) * r->log_probs).sum() +
            (LossWeights(n, 12, torch::kFloat64) * r->entropy).sum())
        .item<double>();
  };
  const double eps = 1e-6;
  auto check = [&](const torch::Tensor& param, const torch::Tensor& grad, bool is_hidden) {
    torch::Tensor flat = param.reshape({-1});
    torch::Tensor g = grad.reshape({-1});
    for (int64_t i = 0; i < flat.size(0); ++i) {
      torch::Tensor plus = param.clone(), minus = param.clone();
      plus.reshape({-1})[i] += eps;
      minus.reshape({-1})[i] -= eps;
      const double numeric = is_hidden
                                 ? (loss_at(plus, b.weight) - loss_at(minus, b.weight)) / (2 * eps)
                                 : (loss_at(b.hidden, plus) - loss_at(b.hidden, minus)) / (2 * eps);
      EXPECT_NEAR(g[i].item<double>(), numeric, 1e-7) << (is_hidden ? "hidden " : "weight ") << i;
    }
  };
  check(b.hidden, ours.grads.hidden, true);
  check(b.weight, ours.grads.weight, false);
}

TEST(LogProbsTest, Bfloat16InputsGiveFloat32LikeTheEngine) {
  Batch b = RandomBatch({{3, 5}, {2, 2}}, 33, 16, torch::kBFloat16);
  model::SingleRankGroup group;
  LogProbOptions o;
  o.temperature = 0.9;
  OurRun ours = RunOurs(b, b.hidden, b.weight, group, o);
  EXPECT_EQ(ours.out.log_probs.scalar_type(), torch::kFloat32);
  EXPECT_EQ(ours.grads.hidden.scalar_type(), torch::kBFloat16);
  // The logits are rounded to bf16 (the LM head runs in the model dtype), then float32.
  Reference ref = ReferenceLogProbs(b.hidden, b.weight, b, 0.9);
  EXPECT_EQ(ref.log_probs.scalar_type(), torch::kFloat32);
  EXPECT_LT(MaxAbsDiff(ours.out.log_probs, ref.log_probs), 2e-6);
  EXPECT_LT(MaxAbsDiff(ours.out.entropy, ref.entropy), 2e-6);
}

TEST(LogProbsTest, WithoutGradAndEmptyResponses) {
  Batch b = RandomBatch({{3, 2}}, 11, 4, torch::kFloat32);
  model::SingleRankGroup group;
  {
    torch::NoGradGuard no_grad;
    auto r = ComputeResponseLogProbs(b.hidden, b.weight, b.ids, b.packed, group, {});
    ASSERT_TRUE(r.ok());
    EXPECT_FALSE(r->log_probs.requires_grad());
  }
  Batch prompt_only = RandomBatch({{4, 0}, {0, 0}}, 11, 4, torch::kFloat32);
  auto r = ComputeResponseLogProbs(prompt_only.hidden, prompt_only.weight, prompt_only.ids,
                                   prompt_only.packed, group, {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->log_probs.size(0), 0);
  EXPECT_EQ(r->offsets, (std::vector<int64_t>{0, 0, 0}));
}

TEST(LogProbsTest, RejectsBadInput) {
  Batch b = RandomBatch({{2, 2}}, 9, 4, torch::kFloat32);
  model::SingleRankGroup group;
  auto code = [&](const torch::Tensor& h, const torch::Tensor& w, const torch::Tensor& ids,
                  const PackedSequences& p, const LogProbOptions& o) {
    return ComputeResponseLogProbs(h, w, ids, p, group, o).status();
  };
  for (double t : {0.0, -1.0, std::nan(""), static_cast<double>(INFINITY)}) {
    LogProbOptions o;
    o.temperature = t;
    Status s = code(b.hidden, b.weight, b.ids, b.packed, o);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << t;
    EXPECT_NE(s.message().find("temperature"), std::string::npos) << s;
  }
  LogProbOptions zero_chunk;
  zero_chunk.chunk_size = 0;
  EXPECT_EQ(code(b.hidden, b.weight, b.ids, b.packed, zero_chunk).code(),
            absl::StatusCode::kInvalidArgument);
  PackedSequences wrong = b.packed;
  wrong.response_lengths[0] = 3;  // 2 + 3 != 4
  EXPECT_EQ(code(b.hidden, b.weight, b.ids, wrong, {}).code(), absl::StatusCode::kInvalidArgument);
  PackedSequences no_prompt{{0, 4}, {0}, {4}};
  Status s = code(b.hidden, b.weight, b.ids, no_prompt, {});
  EXPECT_NE(s.message().find("empty prompt"), std::string::npos) << s;
  torch::Tensor bad_ids = b.ids.clone();
  bad_ids[3] = 9;  // vocabulary is 9
  s = code(b.hidden, b.weight, bad_ids, b.packed, {});
  EXPECT_NE(s.message().find("outside the vocabulary"), std::string::npos) << s;
  EXPECT_EQ(code(b.hidden, b.weight.narrow(1, 0, 3), b.ids, b.packed, {}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(b.hidden, b.weight.to(torch::kFloat64), b.ids, b.packed, {}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(b.hidden.narrow(0, 0, 3), b.weight, b.ids, b.packed, {}).code(),
            absl::StatusCode::kInvalidArgument);
}

// ---- A two-rank tensor-parallel group in one process (test only): each rank runs on its own
// thread and the collectives meet at a barrier.
class TwoThreadCollectives {
 public:
  explicit TwoThreadCollectives(int size) : slots_(size), barrier_(size) {}
  // Every rank's tensor, in rank order.
  std::vector<torch::Tensor> Exchange(int rank, const torch::Tensor& t) {
    slots_[rank] = t.detach().clone();
    barrier_.arrive_and_wait();
    std::vector<torch::Tensor> all = slots_;
    barrier_.arrive_and_wait();  // no rank overwrites its slot before all have read
    return all;
  }

 private:
  std::vector<torch::Tensor> slots_;
  std::barrier<> barrier_;
};

class ThreadRankGroup final : public model::TensorParallelGroup {
 public:
  ThreadRankGroup(TwoThreadCollectives* hub, int rank, int size)
      : hub_(hub), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void AllReduceSum(at::Tensor& tensor) override {
    std::vector<torch::Tensor> all = hub_->Exchange(rank_, tensor);
    torch::Tensor sum = all[0].clone();
    for (size_t r = 1; r < all.size(); ++r) sum += all[r];  // same order on every rank
    tensor.copy_(sum);
  }
  at::Tensor AllGather(const at::Tensor& tensor, int64_t dim) override {
    return torch::cat(hub_->Exchange(rank_, tensor), dim);
  }

 private:
  TwoThreadCollectives* hub_;
  int rank_, size_;
};

TEST(LogProbsTest, TwoRankVocabSplitMatchesOneRank) {
  for (torch::ScalarType dtype : {torch::kFloat32, torch::kFloat64}) {
    const double tol = dtype == torch::kFloat64 ? 1e-12 : 2e-6;
    // V = 38: rank 0 owns ids [0, 19), rank 1 [19, 38); the random targets hit both.
    Batch b = RandomBatch({{3, 5}, {2, 4}, {1, 3}}, 38, 8, dtype, /*pad=*/2, /*seed=*/9);
    LogProbOptions o;
    o.temperature = 0.75;
    o.chunk_size = 4;
    model::SingleRankGroup single;
    OurRun one = RunOurs(b, b.hidden, b.weight, single, o);

    TwoThreadCollectives hub(2);
    std::vector<OurRun> runs(2);
    auto rank_main = [&](int rank) {
      ThreadRankGroup group(&hub, rank, 2);
      torch::Tensor shard = b.weight.narrow(0, rank * 19, 19);
      runs[rank] = RunOurs(b, b.hidden, shard, group, o);
    };
    std::thread t0(rank_main, 0), t1(rank_main, 1);
    t0.join();
    t1.join();
    for (int rank = 0; rank < 2; ++rank) {
      const OurRun& r = runs[rank];
      EXPECT_LT(MaxAbsDiff(r.out.log_probs, one.out.log_probs), tol) << rank;
      EXPECT_LT(MaxAbsDiff(r.out.entropy, one.out.entropy), tol) << rank;
      // hidden feeds both shards: its gradient is all-reduced and complete on every rank.
      EXPECT_LT(MaxAbsDiff(r.grads.hidden, one.grads.hidden), 10 * tol) << rank;
      // Each rank's weight gradient is its rows of the full one.
      EXPECT_LT(MaxAbsDiff(r.grads.weight, one.grads.weight.narrow(0, rank * 19, 19)), 10 * tol)
          << rank;
    }
    EXPECT_TRUE(torch::equal(runs[0].out.log_probs, runs[1].out.log_probs));
  }
}

}  // namespace
}  // namespace slime::train
