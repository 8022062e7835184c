// Tensor parallelism in training, on CPU with real c10d Gloo groups between threads of this
// process (TCPStore on 127.0.0.1):
//   - each Megatron layer (column-parallel with and without gather_output, row-parallel,
//     vocab-parallel embedding) at TP=2 against the unsharded op: forward and the gradients of
//     the input, the weight shards and the biases;
//   - the vocab-parallel response log-probs and entropy: values and gradients against TP=1;
//   - a GRPO TrainRollout at TP=2 (and TP=2 × DP=2, with and without the distributed
//     optimizer) against the TP=1 trainer: the same metrics (loss, pg_loss, entropy_loss,
//     kl_loss, grad_norm, ...) and, gathering the shards, the same updated weights within
//     float32 tolerance; replicated parameters identical on TP ranks;
//   - checkpoints moving between TP sizes (TP=1 -> TP=2 -> TP=1, weights and AdamW state; the
//     same with TP=2 × DP=2 and ZeRO-1) and the HF export of a checkpoint saved at TP=2;
//   - the weight export's full tensors (Trainer::FullParameter) at TP=2 against TP=1.
// Built a second time with SLIME_TP_GPU_TEST (target train_tensor_parallel_gpu_test, label gpu):
// then only the CUDA case runs — the same TP=2 GRPO comparison with NCCL between cuda:0 and
// cuda:1 in bfloat16 against a TP=1 trainer on cuda:0 (bf16 tolerance), and TP=2 × DP=2 with
// the distributed optimizer on cuda:0..3; each skips with a message on a machine with too few
// CUDA devices.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "multi_rank_harness.h"
#include "slime/comm/process_group.h"
#include "slime/comm/tensor_parallel_group.h"
#include "slime/model/tensor_parallel.h"
#include "slime/model/weights.h"
#include "slime/train/hf_export.h"
#include "slime/train/logprobs.h"
#include "slime/train/optimizer.h"
#include "slime/train/trainer.h"
#include "trainer_test_util.h"

namespace slime::train {
namespace {

using model::testing::TempDir;
using test_util::BaseConfig;
using test_util::ExpectClose;
using test_util::GridRank;
using test_util::MakeBatch;
using test_util::Replace;
using test_util::RunGrid;
using test_util::Train;
using test_util::WireDataParallel;

// ---- groups (multi_rank_harness.h)

// Where a grid of trainers runs: CPU + Gloo + float32 (the CI tests), or global rank r on
// cuda:r with NCCL in `dtype`.
struct Placement {
  bool cuda = false;
  torch::ScalarType dtype = torch::kFloat32;
  double tol = 2e-5;  // relative tolerance of metrics, absolute of weights
  torch::Device device(int rank) const {
    return cuda ? torch::Device(torch::kCUDA, static_cast<int8_t>(rank)) : torch::kCPU;
  }
  test_util::RankGroupOptions groups() const {
    test_util::RankGroupOptions o;
    o.backend = cuda ? "nccl" : "gloo";
    return o;
  }
};

// Runs body(rank, tp_group) on `tp` threads sharing one TP group.
void OnTpRanks(int tp, const std::function<void(int, model::TensorParallelGroup&)>& body) {
  RunGrid(tp, 1, "tp-layers", [&](const GridRank& g) {
    comm::ProcessGroupTensorParallel group(g.mp);
    body(g.rank, group);
  });
}

torch::Tensor Shard(const torch::Tensor& full, int64_t dim, int rank, int size) {
  const int64_t n = full.size(dim) / size;
  return full.narrow(dim, rank * n, n).detach().clone();
}

// ---- layers

struct Reference {
  torch::Tensor y, grad_x, grad_w, grad_b;
};

// y = f(x, w, b), loss = Σ y·g; the gradients of x, w, b.
Reference Unsharded(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                    const torch::Tensor& g,
                    const std::function<torch::Tensor(torch::Tensor, torch::Tensor,
                                                      torch::Tensor)>& f) {
  torch::Tensor xl = x.clone().requires_grad_(), wl = w.clone().requires_grad_();
  torch::Tensor bl = b.defined() ? b.clone().requires_grad_() : b;
  torch::Tensor y = f(xl, wl, bl);
  (y * g).sum().backward();
  return {y.detach(), xl.grad(), wl.grad(), bl.defined() ? bl.grad() : torch::Tensor()};
}

#ifndef SLIME_TP_GPU_TEST  // the layer tests run in the CPU target only
TEST(TensorParallelLayersTest, ColumnParallelMatchesTheUnshardedLinear) {
  torch::manual_seed(1);
  const torch::Tensor x = torch::randn({5, 6}), w = torch::randn({8, 6}), b = torch::randn({8});
  const torch::Tensor g = torch::randn({5, 8});
  const Reference ref = Unsharded(x, w, b, g, [](auto x, auto w, auto b) {
    return torch::linear(x, w, b);
  });
  for (bool gather : {false, true}) {
    OnTpRanks(2, [&](int rank, model::TensorParallelGroup& tp) {
      torch::Tensor xl = x.clone().requires_grad_();
      torch::Tensor wr = Shard(w, 0, rank, 2).requires_grad_();
      torch::Tensor br = Shard(b, 0, rank, 2).requires_grad_();
      torch::Tensor y = model::ColumnParallelLinear(xl, wr, br, tp, gather);
      // Each rank's loss is its columns' part (without gather) or the whole (with gather, the
      // gather's backward keeps this rank's columns): the input gradient is the full one.
      const std::string what = std::string(gather ? "gathered" : "local") + " rank " +
                               std::to_string(rank);
      if (gather) {
        ExpectClose(y, ref.y, "y " + what);
        (y * g).sum().backward();
      } else {
        ExpectClose(y, Shard(ref.y, 1, rank, 2), "y " + what);
        (y * Shard(g, 1, rank, 2)).sum().backward();
      }
      ExpectClose(xl.grad(), ref.grad_x, "grad x " + what);
      ExpectClose(wr.grad(), Shard(ref.grad_w, 0, rank, 2), "grad w " + what);
      ExpectClose(br.grad(), Shard(ref.grad_b, 0, rank, 2), "grad b " + what);
    });
  }
}

TEST(TensorParallelLayersTest, RowParallelMatchesTheUnshardedLinear) {
  torch::manual_seed(2);
  const torch::Tensor x = torch::randn({5, 8}), w = torch::randn({6, 8}), b = torch::randn({6});
  const torch::Tensor g = torch::randn({5, 6});
  const Reference ref = Unsharded(x, w, b, g, [](auto x, auto w, auto b) {
    return torch::linear(x, w, b);
  });
  OnTpRanks(2, [&](int rank, model::TensorParallelGroup& tp) {
    torch::Tensor xr = Shard(x, 1, rank, 2).requires_grad_();
    torch::Tensor wr = Shard(w, 1, rank, 2).requires_grad_();
    torch::Tensor bl = b.clone().requires_grad_();
    torch::Tensor y = model::RowParallelLinear(xr, wr, bl, tp);
    ExpectClose(y, ref.y, "y");
    (y * g).sum().backward();
    ExpectClose(xr.grad(), Shard(ref.grad_x, 1, rank, 2), "grad x");
    ExpectClose(wr.grad(), Shard(ref.grad_w, 1, rank, 2), "grad w");
    ExpectClose(bl.grad(), ref.grad_b, "grad b (replicated, the full gradient)");
  });
}

TEST(TensorParallelLayersTest, VocabParallelEmbeddingMatchesIndexSelect) {
  torch::manual_seed(3);
  const torch::Tensor table = torch::randn({10, 4});
  const torch::Tensor ids = torch::tensor({0, 9, 4, 5, 4, 2}, torch::kLong);
  const torch::Tensor g = torch::randn({6, 4});
  torch::Tensor full = table.clone().requires_grad_();
  const torch::Tensor want = full.index_select(0, ids);
  (want * g).sum().backward();
  const Reference ref{want.detach(), {}, full.grad(), {}};
  OnTpRanks(2, [&](int rank, model::TensorParallelGroup& tp) {
    torch::Tensor er = Shard(table, 0, rank, 2).requires_grad_();
    torch::Tensor y = model::VocabParallelEmbedding(ids, er, tp);
    ExpectClose(y, ref.y, "y");
    (y * g).sum().backward();
    ExpectClose(er.grad(), Shard(ref.grad_w, 0, rank, 2), "grad table");
  });
}

// Log-probs and entropy over a vocab-parallel LM head: values and the gradients of hidden and
// the head (the max / sum-exp all-reduces of docs/algorithms.md) against one rank.
TEST(TensorParallelLayersTest, VocabParallelLogProbsAndEntropyMatchOneRank) {
  torch::manual_seed(4);
  const torch::Tensor hidden = torch::randn({7, 6}), head = torch::randn({12, 6});
  const torch::Tensor ids = torch::tensor({3, 11, 0, 7, 5, 6, 2}, torch::kLong);
  PackedSequences packed{{0, 4, 7}, {2, 1}, {2, 2}};
  const torch::Tensor g_lp = torch::randn({4}), g_ent = torch::randn({4});
  LogProbOptions o;
  o.temperature = 0.7;
  o.chunk_size = 3;
  auto run = [&](const torch::Tensor& h, const torch::Tensor& w,
                 model::TensorParallelGroup& group) {
    auto r = ComputeResponseLogProbs(h, w, ids, packed, group, o);
    EXPECT_TRUE(r.ok()) << r.status();
    ((r->log_probs * g_lp).sum() + (r->entropy * g_ent).sum()).backward();
    return *r;
  };
  model::SingleRankGroup one;
  torch::Tensor h1 = hidden.clone().requires_grad_(), w1 = head.clone().requires_grad_();
  const ResponseLogProbs ref = run(h1, w1, one);
  OnTpRanks(2, [&](int rank, model::TensorParallelGroup& tp) {
    torch::Tensor h = hidden.clone().requires_grad_();
    torch::Tensor w = Shard(head, 0, rank, 2).requires_grad_();
    const ResponseLogProbs r = run(h, w, tp);
    ExpectClose(r.log_probs, ref.log_probs.detach(), "log-probs");
    ExpectClose(r.entropy, ref.entropy.detach(), "entropy");
    ExpectClose(h.grad(), h1.grad(), "grad hidden");
    ExpectClose(w.grad(), Shard(w1.grad(), 0, rank, 2), "grad head");
  });
}

// train.recompute_loss_function false: each rank keeps its chunks' logits for the backward; the
// values and gradients are bitwise those of the recomputing backward.
TEST(TensorParallelLayersTest, VocabParallelKeptLogitsEqualRecomputed) {
  torch::manual_seed(5);
  const torch::Tensor hidden = torch::randn({7, 6}), head = torch::randn({12, 6});
  const torch::Tensor ids = torch::tensor({3, 11, 0, 7, 5, 6, 2}, torch::kLong);
  PackedSequences packed{{0, 4, 7}, {2, 1}, {2, 2}};
  const torch::Tensor g_lp = torch::randn({4}), g_ent = torch::randn({4});
  OnTpRanks(2, [&](int rank, model::TensorParallelGroup& tp) {
    std::vector<torch::Tensor> got[2];
    for (bool recompute : {true, false}) {
      LogProbOptions o;
      o.temperature = 0.7;
      o.chunk_size = 3;
      o.recompute_logits = recompute;
      torch::Tensor h = hidden.clone().requires_grad_();
      torch::Tensor w = Shard(head, 0, rank, 2).requires_grad_();
      auto r = ComputeResponseLogProbs(h, w, ids, packed, tp, o);
      ASSERT_TRUE(r.ok()) << r.status();
      ((r->log_probs * g_lp).sum() + (r->entropy * g_ent).sum()).backward();
      got[recompute ? 0 : 1] = {r->log_probs.detach(), r->entropy.detach(), h.grad(), w.grad()};
    }
    for (size_t i = 0; i < got[0].size(); ++i) {
      EXPECT_TRUE(torch::equal(got[0][i], got[1][i])) << "rank " << rank << " tensor " << i;
    }
  });
}

// ---- the trainer

#endif  // SLIME_TP_GPU_TEST

// The tiny Qwen3 of the trainer tests (q/k norms) with a vocabulary that splits over 2 ranks
// (104); or the tiny Llama 3 (q/k/v and o biases: column- and row-parallel), with tied
// embeddings (one vocab-parallel table for the embedding and the LM head).
std::string MakeTpModelDir(const TempDir& dir, uint64_t seed, bool llama = false) {
  std::string json = llama ? model::testing::TinyLlama3ConfigJson()
                           : model::testing::TinyQwen3ConfigJson();
  Replace(json, llama ? "\"vocab_size\": 89" : "\"vocab_size\": 101", "\"vocab_size\": 104");
  if (llama) Replace(json, "\"tie_word_embeddings\": false", "\"tie_word_embeddings\": true");
  return test_util::MakeModelDirFromJson(dir, "m", json, seed);
}

// GRPO with a KL loss to the reference, an entropy bonus (the entropy's gradient) and clipping
// by the global gradient norm; 8 samples, 2 optimizer steps per rollout (trainer_test_util.h).
config::Config TpConfig() { return test_util::ModelParallelConfig(); }

struct RankResult {
  std::vector<TrainRolloutResult> rollouts;
  std::vector<torch::Tensor> weights;  // NamedParameters order, this rank's shards
};

// Runs body(rank, options) on a TP × DP grid of threads (global rank = dp * tp + tp_rank):
// `options` carries the model, the config and this rank's groups — TP groups share a DP index,
// DP groups a TP rank.
void OnGrid(int tp, int dp, const std::string& model_dir, const config::Config& c,
            const std::function<void(int, TrainerOptions)>& body, const Placement& where = {}) {
  RunGrid(
      tp, dp, "tp",
      [&](const GridRank& g) {
        TrainerOptions o;
        o.model_dir = model_dir;
        o.config = c;
        o.device = where.device(g.rank);
        o.dtype = where.dtype;
        o.tp_group = std::make_shared<comm::ProcessGroupTensorParallel>(g.mp);
        WireDataParallel(g, o);
        body(g.rank, std::move(o));
      },
      where.groups());
}

// Trains `rollouts` rollouts of `batch` on a TP × DP grid.
std::vector<RankResult> TrainGrid(int tp, int dp, const std::string& model_dir,
                                  const config::Config& c, const data::RolloutBatch& batch,
                                  int rollouts, const Placement& where = {}) {
  std::vector<RankResult> out(tp * dp);
  OnGrid(tp, dp, model_dir, c, [&](int rank, TrainerOptions o) {
    auto trainer = Trainer::Create(std::move(o));
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    EXPECT_EQ((*trainer)->optimizer().distributed(),
              c.train.use_distributed_optimizer && dp > 1);
    for (int r = 0; r < rollouts; ++r) {
      auto result = (*trainer)->TrainRollout(r, batch);
      ASSERT_TRUE(result.ok()) << "rank " << rank << ": " << result.status();
      out[rank].rollouts.push_back(*result);
    }
    out[rank].weights = test_util::Weights(**trainer);
    for (torch::Tensor& w : out[rank].weights) w = w.to(torch::kCPU, torch::kFloat32);
  }, where);
  return out;
}

// The full tensors of per-TP-rank shards (NamedParameters order); replicated ones must be
// identical on every rank.
std::vector<torch::Tensor> GatherShards(const std::vector<model::ParamSpec>& specs,
                                        const std::vector<std::vector<torch::Tensor>>& ranks) {
  std::vector<torch::Tensor> out;
  for (size_t i = 0; i < specs.size(); ++i) {
    std::vector<torch::Tensor> shards;
    for (const auto& r : ranks) shards.push_back(r.at(i));
    if (specs[i].shard == model::ShardDim::kReplicated) {
      for (size_t t = 1; t < shards.size(); ++t) {
        EXPECT_TRUE(torch::equal(shards[t], shards[0]))
            << specs[i].hf_name << " differs between TP ranks 0 and " << t;
      }
      out.push_back(shards[0]);
    } else {
      out.push_back(torch::cat(shards, static_cast<int64_t>(specs[i].shard)));
    }
  }
  return out;
}

std::vector<model::ParamSpec> Specs(const std::string& model_dir) {
  auto config = model::LoadModelConfig(model_dir);
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? model::ParameterSpecs(*config) : std::vector<model::ParamSpec>{};
}

// Compares a TP × DP run with the TP=1 one: metrics per step, gathered weights, replicated
// parameters equal on the TP ranks.
void ExpectMatchesOneRank(int tp, int dp, bool llama = false, const Placement& where = {},
                          bool sequence_parallel = false, bool zero = false,
                          bool overlap = false) {
  TempDir dir;
  const std::string model_dir = MakeTpModelDir(dir, 14, llama);
  config::Config c = TpConfig();
  c.train.sequence_parallel = sequence_parallel;  // the TP=1 reference ignores it
  c.train.use_distributed_optimizer = zero;       // no effect on the one-rank trainer
  c.train.overlap_grad_reduce = overlap;           // likewise
  const data::RolloutBatch batch = MakeBatch(8, 15);
  constexpr int kRollouts = 2;

  TrainerOptions so;
  so.model_dir = model_dir;
  so.config = c;
  so.device = where.device(0);
  so.dtype = where.dtype;
  auto created = Trainer::Create(so);
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<Trainer> single = std::move(*created);
  std::vector<TrainRolloutResult> want;
  for (int r = 0; r < kRollouts; ++r) want.push_back(Train(*single, r, batch));
  std::vector<torch::Tensor> want_weights = test_util::Weights(*single);
  for (torch::Tensor& w : want_weights) w = w.to(torch::kCPU, torch::kFloat32);
  single.reset();

  const std::vector<RankResult> got = TrainGrid(tp, dp, model_dir, c, batch, kRollouts, where);
  ASSERT_EQ(got.size(), static_cast<size_t>(tp * dp));
  for (const RankResult& r : got) ASSERT_EQ(r.rollouts.size(), static_cast<size_t>(kRollouts));

  // Metrics: every rank reports the step's reduced values, equal to the TP=1 run's.
  for (int rank = 0; rank < tp * dp; ++rank) {
    for (int r = 0; r < kRollouts; ++r) {
      ASSERT_EQ(got[rank].rollouts[r].steps.size(), want[r].steps.size());
      for (size_t s = 0; s < want[r].steps.size(); ++s) {
        for (const auto& [name, value] : want[r].steps[s].values) {
          EXPECT_NEAR(test_util::Value(got[rank].rollouts[r].steps[s], name), value,
                      where.tol * (1.0 + std::abs(value)))
              << name << " at rank " << rank << " rollout " << r << " step " << s;
        }
      }
    }
  }
  // The clipping was active (so the TP reduction of the norm mattered).
  EXPECT_GT(test_util::Value(want[0].steps[0], "grad_norm"), c.train.clip_grad);

  // Weights: shards gathered along their split dim equal the TP=1 tensors.
  const std::vector<model::ParamSpec> specs = Specs(model_dir);
  ASSERT_EQ(specs.size(), want_weights.size());
  for (int d = 0; d < dp; ++d) {
    std::vector<std::vector<torch::Tensor>> ranks;
    for (int t = 0; t < tp; ++t) ranks.push_back(got[d * tp + t].weights);
    const std::vector<torch::Tensor> full = GatherShards(specs, ranks);
    for (size_t i = 0; i < specs.size(); ++i) {
      ExpectClose(full[i], want_weights[i], specs[i].hf_name + " at dp " + std::to_string(d),
                  where.tol);
    }
  }
  // The weights moved (the comparison is not of two untouched copies).
  auto initial = test_util::MakeTrainer(model_dir, c);
  ASSERT_NE(initial, nullptr);
  EXPECT_GT((test_util::Weights(*initial)[1] - want_weights[1]).abs().max().item<double>(), 1e-4);
}

#ifdef SLIME_TP_GPU_TEST
// The CUDA case: NCCL between cuda:0 and cuda:1, bfloat16, against TP=1 on cuda:0. bf16 rounds
// the TP partial sums differently from the single GEMM, so metrics and weights agree to a few
// bf16 ulps rather than bit for bit.
TEST(TensorParallelGpuTest, TwoGpuTensorParallelMatchesOneGpuInBf16) {
  if (!torch::cuda::is_available() || torch::cuda::device_count() < 2) {
    GTEST_SKIP() << "needs two CUDA devices (found "
                 << (torch::cuda::is_available() ? torch::cuda::device_count() : 0) << ")";
  }
  Placement where;
  where.cuda = true;
  where.dtype = torch::kBFloat16;
  where.tol = 3e-2;
  ExpectMatchesOneRank(2, 1, /*llama=*/false, where);
}

// TP=2 × DP=2 with the distributed optimizer on cuda:0..3 (NCCL reduce-scatter / all-gather of
// the ZeRO-1 buckets in bf16) against TP=1 on cuda:0.
TEST(TensorParallelGpuTest, TwoByTwoGpusWithTheDistributedOptimizerMatchOneGpuInBf16) {
  const int64_t gpus = torch::cuda::is_available() ? torch::cuda::device_count() : 0;
  if (gpus < 4) GTEST_SKIP() << "needs four CUDA devices (found " << gpus << ")";
  Placement where;
  where.cuda = true;
  where.dtype = torch::kBFloat16;
  where.tol = 3e-2;
  ExpectMatchesOneRank(2, 2, /*llama=*/true, where, /*sequence_parallel=*/false, /*zero=*/true);
}
#else
TEST(TensorParallelTrainerTest, TwoTensorParallelRanksMatchOneRank) { ExpectMatchesOneRank(2, 1); }

// Sequence parallelism: the residual stream and norms hold half the tokens per rank (the
// micro-batches have an odd token count, so the shards are uneven); same function, same
// gradients (the norm weights' partial gradients summed over the TP ranks).
TEST(TensorParallelTrainerTest, SequenceParallelMatchesOneRank) {
  ExpectMatchesOneRank(2, 1, /*llama=*/false, {}, /*sequence_parallel=*/true);
}

TEST(TensorParallelTrainerTest, SequenceParallelWithBiasesTiedEmbeddingsAndDataParallel) {
  ExpectMatchesOneRank(2, 2, /*llama=*/true, {}, /*sequence_parallel=*/true);
}

TEST(TensorParallelTrainerTest, TwoTensorParallelRanksMatchOneRankWithBiasesAndTiedEmbeddings) {
  ExpectMatchesOneRank(2, 1, /*llama=*/true);
}

TEST(TensorParallelTrainerTest, TwoByTwoTensorAndDataParallelMatchesOneRank) {
  ExpectMatchesOneRank(2, 2);
}

// TP × ZeRO-1: each TP rank's DP group shards the float32 masters and Adam moments of that
// rank's local tensors; the gradient norm sums the DP shards, then the TP ranks (replicated
// parameters once), so clipping and the updated weights equal the single rank's. Tied
// embeddings and biases (replicated row-parallel biases) included.
TEST(TensorParallelTrainerTest, TwoByTwoWithTheDistributedOptimizerMatchesOneRank) {
  ExpectMatchesOneRank(2, 2, /*llama=*/true, {}, /*sequence_parallel=*/false, /*zero=*/true);
}

// The same with sequence parallelism.
TEST(TensorParallelTrainerTest, TwoByTwoWithTheDistributedOptimizerAndSequenceParallelism) {
  ExpectMatchesOneRank(2, 2, /*llama=*/true, {}, /*sequence_parallel=*/true, /*zero=*/true);
}

// train.overlap_grad_reduce at TP × DP: the DP buckets are posted from the backward pass while
// its TP collectives (the column / row-parallel layers', sequence parallelism's) run on the
// other group; the same training as one rank.
TEST(TensorParallelTrainerTest, TwoByTwoWithOverlappedGradReduceAndSequenceParallelism) {
  ExpectMatchesOneRank(2, 2, /*llama=*/true, {}, /*sequence_parallel=*/true, /*zero=*/false,
                       /*overlap=*/true);
}

// A checkpoint saved at TP=2 × DP=2 with ZeRO-1 (the DP shards gathered, then the TP shards;
// DP rank 0's TP rank 0 writes) loads at TP=1, and a TP=1 checkpoint loads into the sharded
// optimizer: weights bit for bit, and the continuation tracks the run that stayed at TP=1.
TEST(TensorParallelTrainerTest, ZeroOneCheckpointsMoveBetweenTensorParallelSizes) {
  TempDir dir;
  const std::string model_dir = MakeTpModelDir(dir, 25);
  config::Config c = TpConfig();
  c.train.use_distributed_optimizer = true;
  const data::RolloutBatch batch = MakeBatch(8, 26);
  const std::string at_tp1 = dir.Join("save-tp1"), at_grid = dir.Join("save-grid");
  const std::vector<model::ParamSpec> specs = Specs(model_dir);

  auto a = test_util::MakeTrainer(model_dir, c);
  ASSERT_NE(a, nullptr);
  Train(*a, 0, batch);
  ASSERT_TRUE(a->Save(at_tp1, 0).ok());
  const std::vector<torch::Tensor> a_after_0 = test_util::Weights(*a);

  std::vector<std::vector<torch::Tensor>> loaded(4), trained(4);
  std::vector<std::string> saved_dirs(4);
  OnGrid(2, 2, model_dir, c, [&](int rank, TrainerOptions o) {
    auto t = Trainer::Create(std::move(o));
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_TRUE((*t)->optimizer().distributed());
    auto state = (*t)->Load(at_tp1);
    ASSERT_TRUE(state.ok()) << "rank " << rank << ": " << state.status();
    EXPECT_EQ(state->step, 2);
    EXPECT_TRUE(state->optimizer_loaded);
    loaded[rank] = test_util::Weights(**t);
    auto r = (*t)->TrainRollout(1, batch);
    ASSERT_TRUE(r.ok()) << r.status();
    trained[rank] = test_util::Weights(**t);
    auto saved = (*t)->Save(at_grid, 1);  // collective over the DP and the TP group
    ASSERT_TRUE(saved.ok()) << "rank " << rank << ": " << saved.status();
    saved_dirs[rank] = *saved;
  });
  // DP rank 0 (global ranks 0 and 1) returns the directory, DP rank 1 "".
  EXPECT_FALSE(saved_dirs[0].empty());
  EXPECT_EQ(saved_dirs[1], saved_dirs[0]);
  EXPECT_TRUE(saved_dirs[2].empty());
  EXPECT_TRUE(saved_dirs[3].empty());
  for (int d = 0; d < 2; ++d) {
    const std::vector<torch::Tensor> full = GatherShards(specs, {loaded[2 * d], loaded[2 * d + 1]});
    for (size_t i = 0; i < specs.size(); ++i) {
      EXPECT_TRUE(torch::equal(full[i], a_after_0[i])) << specs[i].hf_name << " at dp " << d;
    }
  }

  Train(*a, 1, batch);
  auto b = test_util::MakeTrainer(model_dir, c);
  ASSERT_NE(b, nullptr);
  auto state = b->Load(at_grid);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->step, 4);
  EXPECT_TRUE(state->optimizer_loaded);
  const std::vector<torch::Tensor> trained_full = GatherShards(specs, {trained[0], trained[1]});
  const std::vector<torch::Tensor> b_weights = test_util::Weights(*b);
  const std::vector<torch::Tensor> a_after_1 = test_util::Weights(*a);
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_TRUE(torch::equal(b_weights[i], trained_full[i])) << specs[i].hf_name;
    ExpectClose(b_weights[i], a_after_1[i], specs[i].hf_name + " after rollout 1", 2e-5);
  }
  // One more rollout on both: equal only if the sharded AdamW moments crossed the checkpoint.
  Train(*a, 2, batch);
  Train(*b, 2, batch);
  const std::vector<torch::Tensor> a2 = test_util::Weights(*a), b2 = test_util::Weights(*b);
  for (size_t i = 0; i < specs.size(); ++i) {
    ExpectClose(b2[i], a2[i], specs[i].hf_name + " after rollout 2", 4e-5);
  }
}

// A checkpoint saved at TP=1 loads at TP=2 (each rank's shards are the slices) and one saved at
// TP=2 (gathered, written by TP rank 0) loads at TP=1: the weights bit for bit, and the AdamW
// moments too — the continuation at TP=1 from the TP=2 checkpoint tracks the run that stayed at
// TP=1. The TP=2 checkpoint also exports to an HF directory the model loads.
TEST(TensorParallelTrainerTest, CheckpointsMoveBetweenTensorParallelSizes) {
  TempDir dir;
  const std::string model_dir = MakeTpModelDir(dir, 21);
  const config::Config c = TpConfig();
  const data::RolloutBatch batch = MakeBatch(8, 22);
  const std::string at_tp1 = dir.Join("save-tp1"), at_tp2 = dir.Join("save-tp2");
  const std::vector<model::ParamSpec> specs = Specs(model_dir);

  auto a = test_util::MakeTrainer(model_dir, c);
  ASSERT_NE(a, nullptr);
  Train(*a, 0, batch);
  ASSERT_TRUE(a->Save(at_tp1, 0).ok());
  const std::vector<torch::Tensor> a_after_0 = test_util::Weights(*a);

  std::vector<std::vector<torch::Tensor>> loaded(2), trained(2);
  OnGrid(2, 1, model_dir, c, [&](int rank, TrainerOptions o) {
    auto t = Trainer::Create(std::move(o));
    ASSERT_TRUE(t.ok()) << t.status();
    auto state = (*t)->Load(at_tp1);
    ASSERT_TRUE(state.ok()) << "rank " << rank << ": " << state.status();
    EXPECT_EQ(state->step, 2);
    EXPECT_TRUE(state->optimizer_loaded);
    loaded[rank] = test_util::Weights(**t);
    auto r = (*t)->TrainRollout(1, batch);
    ASSERT_TRUE(r.ok()) << r.status();
    trained[rank] = test_util::Weights(**t);
    auto saved = (*t)->Save(at_tp2, 1);
    ASSERT_TRUE(saved.ok()) << "rank " << rank << ": " << saved.status();
    EXPECT_TRUE(std::filesystem::exists(*saved + "/trainer_state.json")) << *saved;
  });
  const std::vector<torch::Tensor> loaded_full = GatherShards(specs, loaded);
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_TRUE(torch::equal(loaded_full[i], a_after_0[i])) << specs[i].hf_name;
  }

  Train(*a, 1, batch);
  auto b = test_util::MakeTrainer(model_dir, c);
  ASSERT_NE(b, nullptr);
  auto state = b->Load(at_tp2);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->step, 4);
  const std::vector<torch::Tensor> trained_full = GatherShards(specs, trained);
  const std::vector<torch::Tensor> b_weights = test_util::Weights(*b);
  const std::vector<torch::Tensor> a_after_1 = test_util::Weights(*a);
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_TRUE(torch::equal(b_weights[i], trained_full[i])) << specs[i].hf_name;
    ExpectClose(b_weights[i], a_after_1[i], specs[i].hf_name + " after rollout 1", 2e-5);
  }
  // One more rollout on both: equal only if the AdamW moments crossed the TP=2 checkpoint.
  Train(*a, 2, batch);
  Train(*b, 2, batch);
  const std::vector<torch::Tensor> a2 = test_util::Weights(*a), b2 = test_util::Weights(*b);
  for (size_t i = 0; i < specs.size(); ++i) {
    ExpectClose(b2[i], a2[i], specs[i].hf_name + " after rollout 2", 4e-5);
  }

  HfExportOptions hf;
  hf.from = at_tp2;
  hf.to_hf = dir.Join("hf");
  auto exported = ExportCheckpointToHf(hf);
  ASSERT_TRUE(exported.ok()) << exported.status();
  auto model = model::DecoderModel::Load(hf.to_hf, torch::kFloat32, torch::kCPU);
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<model::NamedTensor> hf_weights =
      model::NamedParameters((*model)->weights(), (*model)->config());
  ASSERT_EQ(hf_weights.size(), specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_TRUE(torch::equal(hf_weights[i].tensor, trained_full[i])) << specs[i].hf_name;
  }
}

// A save that TP rank 0 cannot write (the save directory is a regular file) fails on both
// ranks: rank 0 with its own error, rank 1 naming rank 0 — neither returns a directory that
// holds no checkpoint, and neither hangs.
TEST(TensorParallelTrainerTest, AFailedWriteOnRankZeroFailsTheSaveOnEveryRank) {
  TempDir dir;
  const std::string model_dir = MakeTpModelDir(dir, 23);
  const config::Config c = TpConfig();
  const std::string not_a_dir = dir.Join("a-file");
  std::ofstream(not_a_dir) << "not a directory\n";
  std::vector<std::string> errors(2);
  OnGrid(2, 1, model_dir, c, [&](int rank, TrainerOptions o) {
    auto t = Trainer::Create(std::move(o));
    ASSERT_TRUE(t.ok()) << t.status();
    auto saved = (*t)->Save(not_a_dir, 0);
    ASSERT_FALSE(saved.ok()) << "rank " << rank << " returned " << *saved;
    errors[rank] = std::string(saved.status().message());
  });
  EXPECT_THAT(errors[1], ::testing::HasSubstr("tensor-parallel rank 0 failed to save"));
  EXPECT_THAT(errors[1], ::testing::HasSubstr(not_a_dir));
  EXPECT_THAT(errors[0], ::testing::Not(::testing::HasSubstr("tensor-parallel rank 0 failed")));
}

// Weight export (weight sync): FullParameter(i) on both TP ranks (a collective) gives the TP=1
// trainer's parameter i — bit for bit, the all-gather only moves bytes — and FullParameterShapes
// lists the full shapes; tensor_model_parallel_size must match the group's size.
TEST(TensorParallelTrainerTest, FullParametersEqualTheUnshardedTrainersAndTheSizeIsChecked) {
  TempDir dir;
  const std::string model_dir = MakeTpModelDir(dir, 31, /*llama=*/true);
  config::Config c = TpConfig();
  auto one = test_util::MakeTrainer(model_dir, c);
  ASSERT_NE(one, nullptr);
  const std::vector<torch::Tensor> want = test_util::Weights(*one);
  c.train.tensor_model_parallel_size = 2;
  std::vector<std::vector<torch::Tensor>> got(2);
  OnGrid(2, 1, model_dir, c, [&](int rank, TrainerOptions o) {
    auto t = Trainer::Create(std::move(o));
    ASSERT_TRUE(t.ok()) << t.status();
    const std::vector<model::NamedTensor> shapes = std::as_const(**t).FullParameterShapes();
    ASSERT_EQ(shapes.size(), want.size());
    for (size_t i = 0; i < shapes.size(); ++i) {
      EXPECT_EQ(shapes[i].tensor.sizes(), want[i].sizes()) << shapes[i].name;
      auto full = (*t)->FullParameter(i);
      ASSERT_TRUE(full.ok()) << full.status();
      got[rank].push_back(full->clone());
    }
    EXPECT_FALSE((*t)->FullParameter(shapes.size()).ok());
  });
  for (int rank : {0, 1}) {
    ASSERT_EQ(got[rank].size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_TRUE(torch::equal(got[rank][i], want[i])) << "rank " << rank << " parameter " << i;
    }
  }
  c.train.tensor_model_parallel_size = 4;
  OnGrid(2, 1, model_dir, c, [&](int rank, TrainerOptions o) {
    auto t = Trainer::Create(std::move(o));
    ASSERT_FALSE(t.ok());
    EXPECT_NE(std::string(t.status().message()).find("train.tensor_model_parallel_size = 4"),
              std::string::npos)
        << t.status();
  });
}

TEST(TensorParallelTrainerTest, AVocabThatDoesNotSplitIsRejected) {
  TempDir dir;
  const std::string model_dir = test_util::MakeModelDir(dir, "odd", 3);  // vocab 101
  OnGrid(2, 1, model_dir, TpConfig(), [&](int rank, TrainerOptions o) {
    auto trainer = Trainer::Create(o);
    ASSERT_FALSE(trainer.ok());
    EXPECT_NE(std::string(trainer.status().message()).find("101"), std::string::npos)
        << trainer.status();
  });
}

#endif  // SLIME_TP_GPU_TEST

}  // namespace
}  // namespace slime::train
