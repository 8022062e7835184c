// Data parallelism of the trainer: the distributed optimizer (ZeRO-1, optimizer.h) against the
// plain AdamW on one rank with the summed gradients (two and three ranks, odd shard boundaries,
// tiny buckets, clipping, weight decay, several steps), its state gathered and imported in the
// layout-independent form, and the Trainer with two real Gloo ranks (threads, TCPStore on
// 127.0.0.1): ZeRO-1 over DP=2 equals one plain rank over several rollouts, checkpoints cross
// between the two layouts, bucketed gradient all-reduce equals the per-parameter one, and bad
// settings are refused with the setting named. Also the multi-rank harness's own contract (its
// grid's groups, a rank's exception reported as a failure).
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "multi_rank_harness.h"
#include "slime/train/checkpoint.h"
#include "slime/train/critic.h"
#include "slime/train/optimizer.h"
#include "slime/train/trainer.h"
#include "trainer_test_util.h"

namespace slime::train {
namespace {

using model::testing::TempDir;
using test_util::BaseConfig;
using test_util::ExpectBitwiseEqual;
using test_util::GridRank;
using test_util::MakeBatch;
using test_util::MakeModelDir;
using test_util::MakeTrainer;
using test_util::Msg;
using test_util::RunGrid;
using test_util::RunRanks;
using test_util::ThreadGroup;
using test_util::Train;
using test_util::Value;
using test_util::Weights;
using test_util::WireDataParallel;

// ---- AdamW: sharded vs plain -----------------------------------------------------------------

// Parameters of awkward sizes (50 trainable elements: shard boundaries fall inside tensors for
// 2 and 3 ranks), one frozen, decay on the matrices only.
struct ParamSet {
  std::vector<torch::Tensor> tensors;
  std::vector<OptimizerParam> Params() const {
    static const char* kNames[] = {"a.weight", "a.bias", "frozen.weight", "b.weight", "norm"};
    std::vector<OptimizerParam> out;
    for (size_t i = 0; i < tensors.size(); ++i) out.push_back({kNames[i], tensors[i]});
    return out;
  }
};

// Deterministic values without the global generator (ranks are threads).
torch::Tensor Wave(const std::vector<int64_t>& shape, double frequency, double scale) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return (torch::sin(torch::arange(n, torch::kFloat64) * frequency + 0.3) * scale)
      .to(torch::kFloat32)
      .reshape(shape);
}

ParamSet MakeParams(torch::ScalarType dtype) {
  ParamSet p;
  int k = 0;
  for (std::vector<int64_t> shape :
       std::vector<std::vector<int64_t>>{{5, 3}, {7}, {2, 2}, {4, 6}, {4}}) {
    p.tensors.push_back(Wave(shape, 0.7 + 0.1 * k++, 1.0).to(dtype).set_requires_grad(true));
  }
  return p;
}

std::vector<torch::Tensor> Clones(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> out;
  for (const torch::Tensor& t : tensors) out.push_back(t.detach().clone());
  return out;
}

// The gradient of parameter i on `rank` at `step` (deterministic, rank-dependent).
torch::Tensor RankGrad(const torch::Tensor& p, int i, int rank, int step) {
  return Wave(p.sizes().vec(), 0.37 + 0.11 * rank + 0.05 * step + 0.013 * i, 1.0 + 0.25 * rank);
}

AdamWOptions Options() {
  AdamWOptions o;
  o.weight_decay = 0.1;
  o.clip_grad = 2.0;  // the summed gradients' norm is ~8-10: clipping is active
  o.freeze_params_name_list = {"^frozen\\."};
  return o;
}

constexpr int kSteps = 4;

// Runs the sharded optimizer on `dp` threads (bucket_size elements per collective) and the plain
// one on the summed gradients; every rank's weights and gathered state must equal the plain
// optimizer's within float32 rounding (the sums may be ordered differently).
void ExpectShardedEqualsPlain(int dp, int64_t bucket_size) {
  ParamSet plain = MakeParams(torch::kFloat32);
  auto reference = AdamW::Create(plain.Params(), Options());
  ASSERT_TRUE(reference.ok()) << reference.status();
  std::vector<ParamSet> ranks;
  for (int r = 0; r < dp; ++r) ranks.push_back(MakeParams(torch::kFloat32));

  ThreadGroup group(dp);
  std::vector<OptimizerState> gathered(dp);
  std::vector<std::vector<double>> norms(dp);
  RunRanks(dp, [&](int rank) {
    AdamWOptions o = Options();
    o.distributed = true;
    o.bucket_size = bucket_size;
    group.Wire(rank, o);
    auto opt = AdamW::Create(ranks[rank].Params(), o);
    ASSERT_TRUE(opt.ok()) << opt.status();
    for (int step = 0; step < kSteps; ++step) {
      for (int i = 0; i < 5; ++i) {
        if (i == 2) continue;  // frozen
        ranks[rank].tensors[i].mutable_grad() = RankGrad(ranks[rank].tensors[i], i, rank, step);
      }
      auto r = (*opt)->Step(0.05);
      ASSERT_TRUE(r.ok()) << r.status();
      norms[rank].push_back(r->grad_norm);
    }
    auto state = (*opt)->GatherState();
    ASSERT_TRUE(state.ok()) << state.status();
    gathered[rank] = *state;
  });

  std::vector<double> plain_norms;
  for (int step = 0; step < kSteps; ++step) {
    for (int i = 0; i < 5; ++i) {
      if (i == 2) continue;
      torch::Tensor sum = torch::zeros(plain.tensors[i].sizes());
      for (int r = 0; r < dp; ++r) sum += RankGrad(plain.tensors[i], i, r, step);
      plain.tensors[i].mutable_grad() = sum;
    }
    auto r = (*reference)->Step(0.05);
    ASSERT_TRUE(r.ok()) << r.status();
    plain_norms.push_back(r->grad_norm);
  }
  EXPECT_GT(plain_norms[0], 2.0) << "clipping should be active";

  const OptimizerState expected = (*reference)->ExportState();
  for (int rank = 0; rank < dp; ++rank) {
    for (int step = 0; step < kSteps; ++step) {
      EXPECT_NEAR(norms[rank][step], plain_norms[step], 1e-5 * plain_norms[step]);
    }
    for (size_t i = 0; i < plain.tensors.size(); ++i) {
      EXPECT_LT((ranks[rank].tensors[i] - plain.tensors[i]).abs().max().item<double>(), 1e-6)
          << "rank " << rank << " tensor " << i;
    }
    ASSERT_EQ(gathered[rank].step, kSteps);
    ASSERT_EQ(gathered[rank].tensors.size(), expected.tensors.size());
    for (size_t k = 0; k < expected.tensors.size(); ++k) {
      EXPECT_EQ(gathered[rank].tensors[k].name, expected.tensors[k].name);
      EXPECT_LT((gathered[rank].tensors[k].tensor - expected.tensors[k].tensor)
                    .abs()
                    .max()
                    .item<double>(),
                1e-6)
          << expected.tensors[k].name;
    }
  }
  // The frozen parameter is untouched everywhere.
  EXPECT_TRUE(torch::equal(ranks[0].tensors[2], MakeParams(torch::kFloat32).tensors[2]));
}

TEST(DistributedOptimizerTest, TwoRanksEqualThePlainOptimizer) {
  ExpectShardedEqualsPlain(2, /*bucket_size=*/6);  // 3 elements of each rank per bucket
}

TEST(DistributedOptimizerTest, ThreeRanksOneBucketEqualThePlainOptimizer) {
  ExpectShardedEqualsPlain(3, /*bucket_size=*/1 << 20);
}

// bfloat16 parameters with float32 masters, one rank: the sharded path (no collectives) is the
// plain optimizer element for element, so the weights and the state are bitwise equal.
TEST(DistributedOptimizerTest, OneRankBf16IsBitwiseThePlainOptimizer) {
  ParamSet plain = MakeParams(torch::kBFloat16);
  ParamSet sharded = MakeParams(torch::kBFloat16);
  auto a = AdamW::Create(plain.Params(), Options());
  AdamWOptions o = Options();
  o.distributed = true;
  o.bucket_size = 5;
  auto b = AdamW::Create(sharded.Params(), o);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE((*b)->distributed());
  EXPECT_TRUE((*b)->has_master_weights());
  EXPECT_EQ((*b)->StateTensors().size(), 3u);  // the shard's master and moments
  for (int step = 0; step < kSteps; ++step) {
    for (int i = 0; i < 5; ++i) {
      if (i == 2) continue;
      const torch::Tensor g = RankGrad(plain.tensors[i], i, 0, step).to(torch::kBFloat16);
      plain.tensors[i].mutable_grad() = g;
      sharded.tensors[i].mutable_grad() = g.clone();
    }
    // Step 2 without a gradient for "norm": the moments only decay.
    if (step == 2) {
      plain.tensors[4].mutable_grad() = torch::Tensor();
      sharded.tensors[4].mutable_grad() = torch::Tensor();
    }
    // Before the last step the moments are reset (reset_optimizer_states) on both.
    if (step == kSteps - 1) {
      (*a)->ResetStates();
      (*b)->ResetStates();
      EXPECT_EQ((*b)->step(), 0);
    }
    auto ra = (*a)->Step(0.05);
    auto rb = (*b)->Step(0.05);
    ASSERT_TRUE(ra.ok() && rb.ok());
    EXPECT_NEAR(ra->grad_norm, rb->grad_norm, 1e-6 * ra->grad_norm);
  }
  ExpectBitwiseEqual(plain.tensors, sharded.tensors);
  auto gathered = (*b)->GatherState();
  ASSERT_TRUE(gathered.ok()) << gathered.status();
  const OptimizerState expected = (*a)->ExportState();
  ASSERT_EQ(gathered->tensors.size(), expected.tensors.size());
  for (size_t k = 0; k < expected.tensors.size(); ++k) {
    EXPECT_EQ(gathered->tensors[k].name, expected.tensors[k].name);
    EXPECT_TRUE(torch::equal(gathered->tensors[k].tensor, expected.tensors[k].tensor))
        << expected.tensors[k].name;
  }
}

// A plain optimizer's state imported into three shards (each keeps its range), then the same
// gradients on both: the weights stay equal; and a gathered sharded state imported into a plain
// optimizer gives back the same tensors.
TEST(DistributedOptimizerTest, StateCrossesBetweenPlainAndSharded) {
  ParamSet plain = MakeParams(torch::kFloat32);
  auto a = AdamW::Create(plain.Params(), Options());
  ASSERT_TRUE(a.ok());
  for (int step = 0; step < 2; ++step) {
    for (int i : {0, 1, 3, 4}) {
      plain.tensors[i].mutable_grad() = RankGrad(plain.tensors[i], i, 0, step);
    }
    ASSERT_TRUE((*a)->Step(0.05).ok());
  }
  OptimizerState saved = (*a)->ExportState();
  for (model::NamedTensor& nt : saved.tensors) nt.tensor = nt.tensor.clone();
  const std::vector<torch::Tensor> saved_weights = Clones(plain.tensors);

  constexpr int kDp = 3;
  ThreadGroup group(kDp);
  std::vector<ParamSet> ranks(kDp);
  std::vector<OptimizerState> regathered(kDp);
  RunRanks(kDp, [&](int rank) {
    ranks[rank] = MakeParams(torch::kFloat32);  // fresh weights: ImportState must not need them
    for (size_t i = 0; i < saved_weights.size(); ++i) {
      torch::NoGradGuard no_grad;
      ranks[rank].tensors[i].copy_(saved_weights[i]);
    }
    AdamWOptions o = Options();
    o.distributed = true;
    o.bucket_size = 4;
    group.Wire(rank, o);
    auto opt = AdamW::Create(ranks[rank].Params(), o);
    ASSERT_TRUE(opt.ok()) << opt.status();
    Status imported = (*opt)->ImportState(saved);
    ASSERT_TRUE(imported.ok()) << imported;
    EXPECT_EQ((*opt)->step(), 2);
    auto state = (*opt)->GatherState(/*keep=*/rank == 0);
    ASSERT_TRUE(state.ok()) << state.status();
    regathered[rank] = *state;
    for (int step = 2; step < 4; ++step) {
      for (int i : {0, 1, 3, 4}) {
        torch::Tensor sum = torch::zeros(ranks[rank].tensors[i].sizes());
        // Rank 0 carries the whole gradient, the others zeros: the sum is rank 0's.
        if (rank == 0) sum = RankGrad(ranks[rank].tensors[i], i, 0, step);
        ranks[rank].tensors[i].mutable_grad() = sum;
      }
      auto r = (*opt)->Step(0.05);
      ASSERT_TRUE(r.ok()) << r.status();
    }
  });
  // Rank 0 kept the gathered state: exactly the imported one. The others kept only the step.
  ASSERT_EQ(regathered[0].tensors.size(), saved.tensors.size());
  for (size_t k = 0; k < saved.tensors.size(); ++k) {
    EXPECT_TRUE(torch::equal(regathered[0].tensors[k].tensor, saved.tensors[k].tensor))
        << saved.tensors[k].name;
  }
  EXPECT_TRUE(regathered[1].tensors.empty());
  EXPECT_EQ(regathered[1].step, 2);

  for (int step = 2; step < 4; ++step) {
    for (int i : {0, 1, 3, 4}) {
      plain.tensors[i].mutable_grad() = RankGrad(plain.tensors[i], i, 0, step);
    }
    ASSERT_TRUE((*a)->Step(0.05).ok());
  }
  for (int rank = 0; rank < kDp; ++rank) {
    for (size_t i = 0; i < plain.tensors.size(); ++i) {
      EXPECT_LT((ranks[rank].tensors[i] - plain.tensors[i]).abs().max().item<double>(), 1e-6)
          << "rank " << rank << " tensor " << i;
    }
  }
}

TEST(DistributedOptimizerTest, BadOptionsAreNamed) {
  ParamSet p = MakeParams(torch::kFloat32);
  AdamWOptions o = Options();
  o.distributed = true;
  o.dp_size = 2;
  o.dp_all_reduce = [](torch::Tensor&) { return absl::OkStatus(); };
  auto missing = AdamW::Create(p.Params(), o);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(Msg(missing.status()),
            "optimizer: the distributed optimizer (train.use_distributed_optimizer) over 2 "
            "data-parallel ranks needs the DP collectives; missing: dp_reduce_scatter, "
            "dp_all_gather");
  o.dp_rank = 2;
  EXPECT_EQ(Msg(o.Validate()),
            "optimizer: dp_rank = 2 and dp_size = 2: need 0 <= dp_rank < dp_size");
  o = Options();
  o.bucket_size = 0;
  EXPECT_EQ(Msg(o.Validate()),
            "optimizer: ddp_bucket_size = 0 is out of range (valid: >= 1 elements)");

  // A non-contiguous parameter cannot be flattened.
  ParamSet q = MakeParams(torch::kFloat32);
  q.tensors[0] = Wave({3, 5}, 0.5, 1.0).t().detach().set_requires_grad(true);
  AdamWOptions d = Options();
  d.distributed = true;
  auto strided = AdamW::Create(q.Params(), d);
  ASSERT_FALSE(strided.ok());
  EXPECT_NE(Msg(strided.status()).find("\"a.weight\" is not contiguous"), std::string::npos)
      << strided.status();
}

// ---- The multi-rank harness itself (multi_rank_harness.h) -------------------------------------

// RunGrid's groups hold the documented ranks: on an MP=2 × DP=3 grid of real Gloo groups, the
// global rank summed over a rank's MP group is the sum of the ranks with its dp_rank, over its DP
// group the sum of the ranks with its mp_rank.
TEST(MultiRankHarnessTest, GridGroupsHoldTheDocumentedRanks) {
  constexpr int kMp = 2, kDp = 3;
  std::vector<std::vector<double>> sums(kMp * kDp);
  RunGrid(kMp, kDp, "grid", [&](const GridRank& g) {
    EXPECT_EQ(g.rank, g.dp_rank * kMp + g.mp_rank);
    ASSERT_NE(g.mp, nullptr);
    ASSERT_NE(g.dp, nullptr);
    EXPECT_EQ(g.mp->rank(), g.mp_rank);
    EXPECT_EQ(g.mp->world_size(), kMp);
    EXPECT_EQ(g.dp->rank(), g.dp_rank);
    EXPECT_EQ(g.dp->world_size(), kDp);
    torch::Tensor over_mp = torch::full({1}, static_cast<double>(g.rank), torch::kFloat64);
    torch::Tensor over_dp = over_mp.clone();
    Status s = g.mp->AllReduceSum(over_mp, "mp");
    ASSERT_TRUE(s.ok()) << s;
    s = g.dp->AllReduceSum(over_dp, "dp");
    ASSERT_TRUE(s.ok()) << s;
    sums[g.rank] = {over_mp.item<double>(), over_dp.item<double>()};
  });
  for (int rank = 0; rank < kMp * kDp; ++rank) {
    double mp_sum = 0, dp_sum = 0;
    for (int m = 0; m < kMp; ++m) mp_sum += (rank / kMp) * kMp + m;
    for (int d = 0; d < kDp; ++d) dp_sum += d * kMp + rank % kMp;
    ASSERT_EQ(sums[rank].size(), 2u) << "rank " << rank;
    EXPECT_EQ(sums[rank][0], mp_sum) << "rank " << rank;
    EXPECT_EQ(sums[rank][1], dp_sum) << "rank " << rank;
  }
}

// An exception escaping a rank's body is a test failure naming the rank (not a terminate), and
// the other ranks still finish.
void ThrowOnRankTwo(int rank) {
  if (rank == 2) throw std::runtime_error("boom");
}

TEST(MultiRankHarnessTest, AnExceptionOnARankIsAFailureNamingTheRank) {
  EXPECT_NONFATAL_FAILURE_ON_ALL_THREADS(RunRanks(3, ThrowOnRankTwo), "rank 2 threw: boom");
}

// ---- Trainer: two real Gloo ranks ---------------------------------------------------------------

// Runs fn(rank, trainer options with the DP seams) on two threads joined by a Gloo group over
// TCPStore on 127.0.0.1 (multi_rank_harness.h). The reduce-scatter and all-gather are built
// from the group's all-reduce (optimizer.h), as the trainer worker wires them.
void RunTwoGlooRanks(const std::string& name,
                     const std::function<void(int rank, TrainerOptions& o)>& fn) {
  RunGrid(/*mp=*/1, /*dp=*/2, name, [&](const GridRank& g) {
    TrainerOptions o;
    WireDataParallel(g, o);
    fn(g.rank, o);
  });
}

config::Config DpConfig() {
  config::Config c = BaseConfig();
  c.algorithm.use_kl_loss = true;
  c.algorithm.kl_loss_coef = 0.05;
  c.algorithm.normalize_advantages = true;
  c.train.micro_batch_size = 1;
  c.train.global_batch_size = 4;  // 2 steps per rollout of 8
  c.train.weight_decay = 0.01;
  c.train.clip_grad = 0.5;  // active on this model
  return c;
}

void ExpectStepsNear(const TrainRolloutResult& a, const TrainRolloutResult& b,
                     const std::string& where) {
  ASSERT_EQ(a.steps.size(), b.steps.size()) << where;
  for (size_t s = 0; s < a.steps.size(); ++s) {
    ASSERT_EQ(a.steps[s].values.size(), b.steps[s].values.size()) << where;
    for (const auto& [name, value] : a.steps[s].values) {
      EXPECT_NEAR(Value(b.steps[s], name), value, 1e-5 * (1.0 + std::abs(value)))
          << name << " at " << where << " step " << s;
    }
  }
}

void ExpectWeightsNear(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b,
                       const std::string& where) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_LT((a[i] - b[i]).abs().max().item<double>(), 1e-5) << where << " tensor " << i;
  }
}

// The critic's decoder parameters and value head (clones).
std::vector<torch::Tensor> CriticWeights(const Trainer& trainer) {
  const Critic& critic = *trainer.critic();
  std::vector<torch::Tensor> out;
  for (const model::NamedTensor& nt :
       model::NamedParameters(critic.model().weights(), critic.model().config())) {
    out.push_back(nt.tensor.detach().clone());
  }
  out.push_back(critic.value_head().detach().clone());
  return out;
}

constexpr int kRollouts = 3;

// ZeRO-1 over two Gloo ranks trains what one plain rank trains: the same loss and metrics at
// every step of three rollouts (six optimizer steps, so the Adam moments matter), the same
// weights, and both ranks bitwise alike.
TEST(DataParallelTrainerTest, ZeroOneOverTwoGlooRanksMatchesOnePlainRank) {
  TempDir dir;
  const std::string model_dir = MakeModelDir(dir, "m", 14);
  config::Config c = DpConfig();
  const data::RolloutBatch batch = MakeBatch(8, 15);

  auto single = MakeTrainer(model_dir, c);
  ASSERT_NE(single, nullptr);
  EXPECT_FALSE(single->optimizer().distributed());
  std::vector<TrainRolloutResult> expected;
  for (int rollout = 0; rollout < kRollouts; ++rollout) {
    expected.push_back(Train(*single, rollout, batch));
  }

  config::Config zc = c;
  zc.train.use_distributed_optimizer = true;
  zc.train.ddp_bucket_size = 3000;  // several buckets over ~30k parameters
  std::vector<std::unique_ptr<Trainer>> ranks(2);
  std::vector<std::vector<TrainRolloutResult>> results(2);
  RunTwoGlooRanks("zero1", [&](int rank, TrainerOptions& o) {
    o.model_dir = model_dir;
    o.config = zc;
    auto trainer = Trainer::Create(o);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    EXPECT_TRUE((*trainer)->optimizer().distributed());
    for (int rollout = 0; rollout < kRollouts; ++rollout) {
      auto r = (*trainer)->TrainRollout(rollout, batch);
      ASSERT_TRUE(r.ok()) << r.status();
      results[rank].push_back(*r);
    }
    ranks[rank] = std::move(*trainer);
  });
  ASSERT_NE(ranks[0], nullptr);
  ASSERT_NE(ranks[1], nullptr);
  ExpectBitwiseEqual(Weights(*ranks[0]), Weights(*ranks[1]));
  ExpectWeightsNear(Weights(*single), Weights(*ranks[0]), "zero-1 vs plain");
  ASSERT_EQ(results[0].size(), static_cast<size_t>(kRollouts));
  for (int rollout = 0; rollout < kRollouts; ++rollout) {
    ASSERT_EQ(expected[rollout].steps.size(), 2u);
    EXPECT_EQ(results[0][rollout].steps.size(), 2u);
    for (size_t s = 0; s < results[0][rollout].steps.size(); ++s) {
      EXPECT_EQ(results[0][rollout].steps[s].values, results[1][rollout].steps[s].values);
    }
    ExpectStepsNear(expected[rollout], results[0][rollout], "rollout " + std::to_string(rollout));
  }
  EXPECT_GT(Value(expected[0].steps[0], "grad_norm"), c.train.clip_grad);  // clipping was on
}

// Checkpoints cross layouts: a ZeRO-1 DP=2 save (collective; rank 0 writes) resumes on one plain
// rank, and a plain save resumes as ZeRO-1 over DP=2; either way the next rollout equals the
// uninterrupted plain run.
TEST(DataParallelTrainerTest, CheckpointsCrossBetweenZeroOneAndOnePlainRank) {
  TempDir dir;
  const std::string model_dir = MakeModelDir(dir, "m", 21);
  config::Config c = DpConfig();
  const data::RolloutBatch batch = MakeBatch(8, 23);
  config::Config zc = c;
  zc.train.use_distributed_optimizer = true;
  zc.train.ddp_bucket_size = 5000;

  // The uninterrupted plain run; its checkpoint after rollout 1.
  auto single = MakeTrainer(model_dir, c);
  ASSERT_NE(single, nullptr);
  Train(*single, 0, batch);
  Train(*single, 1, batch);
  auto plain_saved = single->Save(dir.Join("plain"), 1);
  ASSERT_TRUE(plain_saved.ok()) << plain_saved.status();
  const TrainRolloutResult expected = Train(*single, 2, batch);
  const std::vector<torch::Tensor> expected_weights = Weights(*single);

  // ZeRO-1 over DP=2: two rollouts, a collective save; then resume the plain checkpoint.
  std::vector<std::string> zero_dirs(2, "unset");
  std::vector<TrainRolloutResult> resumed(2);
  std::vector<std::vector<torch::Tensor>> resumed_weights(2);
  RunTwoGlooRanks("zero1-ckpt", [&](int rank, TrainerOptions& o) {
    o.model_dir = model_dir;
    o.config = zc;
    auto a = Trainer::Create(o);
    ASSERT_TRUE(a.ok()) << a.status();
    for (int rollout = 0; rollout < 2; ++rollout) {
      auto r = (*a)->TrainRollout(rollout, batch);
      ASSERT_TRUE(r.ok()) << r.status();
    }
    auto saved = (*a)->Save(dir.Join("zero"), 1);
    ASSERT_TRUE(saved.ok()) << saved.status();
    zero_dirs[rank] = *saved;

    auto b = Trainer::Create(o);
    ASSERT_TRUE(b.ok()) << b.status();
    auto loaded = (*b)->Load(dir.Join("plain"));
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_TRUE(loaded->optimizer_loaded);
    auto r = (*b)->TrainRollout(2, batch);
    ASSERT_TRUE(r.ok()) << r.status();
    resumed[rank] = *r;
    resumed_weights[rank] = Weights(**b);
  });
  EXPECT_EQ(zero_dirs[0], dir.Join("zero") + "/iter_0000001");
  EXPECT_EQ(zero_dirs[1], "");  // rank 1 takes part in the gather, rank 0 writes
  for (int rank = 0; rank < 2; ++rank) {
    ExpectStepsNear(expected, resumed[rank], "plain -> zero-1, rank " + std::to_string(rank));
    ExpectWeightsNear(expected_weights, resumed_weights[rank], "plain -> zero-1");
  }

  // The ZeRO-1 checkpoint holds the full per-parameter state; one plain rank resumes from it.
  auto plain = MakeTrainer(model_dir, c);
  ASSERT_NE(plain, nullptr);
  auto loaded = plain->Load(dir.Join("zero"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(loaded->optimizer_loaded);
  EXPECT_EQ(loaded->step, 4);
  EXPECT_EQ(plain->optimizer().step(), 4);
  const TrainRolloutResult from_zero = Train(*plain, 2, batch);
  ExpectStepsNear(expected, from_zero, "zero-1 -> plain");
  ExpectWeightsNear(expected_weights, Weights(*plain), "zero-1 -> plain");
}

// PPO: the critic's optimizer is sharded too. DP=2 ZeRO-1 equals one plain rank (actor and
// critic metrics, both models' weights); its collective save (actor and critic) resumes on one
// plain rank.
TEST(DataParallelTrainerTest, PpoCriticWithZeroOneMatchesAndResumesOnOnePlainRank) {
  TempDir dir;
  const std::string model_dir = MakeModelDir(dir, "m", 51);
  config::Config c = DpConfig();
  c.algorithm.advantage_estimator = "ppo";
  c.algorithm.use_kl_loss = false;
  c.algorithm.kl_loss_coef = 0.0;
  c.algorithm.gamma = 1.0;
  c.algorithm.lambd = 0.95;
  c.algorithm.value_clip = 0.2;
  c.train.critic_lr = 1e-3;
  const data::RolloutBatch batch = MakeBatch(8, 53);

  auto single = MakeTrainer(model_dir, c);
  ASSERT_NE(single, nullptr);
  const TrainRolloutResult first = Train(*single, 0, batch);
  const TrainRolloutResult second = Train(*single, 1, batch);
  ASSERT_TRUE(first.steps.front().values.count("value_loss"));

  config::Config zc = c;
  zc.train.use_distributed_optimizer = true;
  zc.train.ddp_bucket_size = 4000;
  std::vector<TrainRolloutResult> zero_first(2);
  std::vector<std::vector<torch::Tensor>> critic_weights(2);
  RunTwoGlooRanks("zero1-ppo", [&](int rank, TrainerOptions& o) {
    o.model_dir = model_dir;
    o.config = zc;
    auto trainer = Trainer::Create(o);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    ASSERT_NE((*trainer)->critic(), nullptr);
    EXPECT_TRUE((*trainer)->critic()->optimizer().distributed());
    auto r = (*trainer)->TrainRollout(0, batch);
    ASSERT_TRUE(r.ok()) << r.status();
    zero_first[rank] = *r;
    critic_weights[rank] = CriticWeights(**trainer);
    auto saved = (*trainer)->Save(dir.Join("ppo"), 0);
    ASSERT_TRUE(saved.ok()) << saved.status();
  });
  ExpectStepsNear(first, zero_first[0], "ppo rollout 0");
  ExpectBitwiseEqual(critic_weights[0], critic_weights[1]);
  const std::vector<torch::Tensor> expected_critic = CriticWeights(*single);
  // The single trainer is past rollout 1; the critic after rollout 0 comes from a rerun.
  auto rerun = MakeTrainer(model_dir, c);
  ASSERT_NE(rerun, nullptr);
  Train(*rerun, 0, batch);
  const std::vector<torch::Tensor> critic_after_first = CriticWeights(*rerun);
  ExpectWeightsNear(critic_after_first, critic_weights[0], "ppo critic, rollout 0");

  // One plain rank resumes the ZeRO-1 checkpoint (actor and critic) and trains rollout 1 as the
  // uninterrupted run did.
  auto resumed = MakeTrainer(model_dir, c);
  ASSERT_NE(resumed, nullptr);
  auto loaded = resumed->Load(dir.Join("ppo"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(loaded->optimizer_loaded);
  EXPECT_EQ(resumed->critic()->step(), 2);  // two critic steps in rollout 0
  ExpectStepsNear(second, Train(*resumed, 1, batch), "ppo rollout 1 after the zero-1 checkpoint");
  ExpectWeightsNear(Weights(*single), Weights(*resumed), "ppo actor after resume");
  const std::vector<torch::Tensor> resumed_critic = CriticWeights(*resumed);
  ExpectWeightsNear(expected_critic, resumed_critic, "ppo critic after resume");
}

// ---- Bucketed gradient all-reduce ---------------------------------------------------------------

// Plain DP=2 with one parameter per all-reduce (ddp_bucket_size 1) and with every gradient in
// one bucket: bitwise the same training (a sum of two values does not depend on the grouping),
// with far fewer and larger all-reduces in the second run.
TEST(DataParallelTrainerTest, BucketedAllReduceEqualsPerParameter) {
  TempDir dir;
  const std::string model_dir = MakeModelDir(dir, "m", 31);
  const data::RolloutBatch batch = MakeBatch(8, 33);
  struct Run {
    std::vector<torch::Tensor> weights;
    std::vector<TrainRolloutResult> results;
    std::vector<int64_t> sizes;  // numel of every all-reduce of rank 0
  };
  auto run = [&](int64_t bucket_size) {
    config::Config c = DpConfig();
    c.train.ddp_bucket_size = bucket_size;
    ThreadGroup group(2);
    std::vector<Run> out(2);
    RunRanks(2, [&](int rank) {
      TrainerOptions o;
      o.model_dir = model_dir;
      o.config = c;
      group.Wire(rank, o);
      o.dp_all_reduce = [&group, &out, rank](torch::Tensor& t) {  // counting the all-reduces
        out[rank].sizes.push_back(t.numel());
        return group.AllReduceSum(rank, t);
      };
      auto trainer = Trainer::Create(o);
      ASSERT_TRUE(trainer.ok()) << trainer.status();
      for (int rollout = 0; rollout < 2; ++rollout) {
        auto r = (*trainer)->TrainRollout(rollout, batch);
        ASSERT_TRUE(r.ok()) << r.status();
        out[rank].results.push_back(*r);
      }
      out[rank].weights = Weights(**trainer);
    });
    return out[0];
  };
  const Run per_parameter = run(1);
  const Run bucketed = run(1 << 24);
  ExpectBitwiseEqual(per_parameter.weights, bucketed.weights);
  ASSERT_EQ(per_parameter.results.size(), bucketed.results.size());
  for (size_t r = 0; r < bucketed.results.size(); ++r) {
    ASSERT_EQ(per_parameter.results[r].steps.size(), bucketed.results[r].steps.size());
    for (size_t s = 0; s < bucketed.results[r].steps.size(); ++s) {
      EXPECT_EQ(per_parameter.results[r].steps[s].values, bucketed.results[r].steps[s].values);
    }
  }
  int64_t trainable = 0;
  for (const torch::Tensor& w : bucketed.weights) trainable += w.numel();
  // Per parameter: one all-reduce per tensor in each of the 4 steps; bucketed: one for all of
  // them (the statistics and metrics all-reduces are the same in both runs).
  EXPECT_EQ(per_parameter.sizes.size(), bucketed.sizes.size() + 4 * (bucketed.weights.size() - 1));
  EXPECT_NE(std::find(bucketed.sizes.begin(), bucketed.sizes.end(), trainable),
            bucketed.sizes.end())
      << "no all-reduce of all " << trainable << " gradient elements";
  EXPECT_EQ(std::find(per_parameter.sizes.begin(), per_parameter.sizes.end(), trainable),
            per_parameter.sizes.end());
}

// ---- Overlapped gradient all-reduce ------------------------------------------------------------

// train.overlap_grad_reduce over two Gloo ranks, PPO (the actor's and the critic's reducers),
// small buckets: bitwise the synchronous run's training (weights of both models, every metric),
// with every gradient element posted through the asynchronous all-reduce and none through the
// synchronous one (which keeps the statistics and metrics).
TEST(DataParallelTrainerTest, OverlappedGradReduceEqualsTheSynchronousPath) {
  TempDir dir;
  const std::string model_dir = MakeModelDir(dir, "m", 61);
  const data::RolloutBatch batch = MakeBatch(8, 63);
  config::Config c = DpConfig();
  c.algorithm.advantage_estimator = "ppo";
  c.algorithm.use_kl_loss = false;
  c.algorithm.kl_loss_coef = 0.0;
  c.algorithm.value_clip = 0.2;
  c.train.critic_lr = 1e-3;
  c.train.ddp_bucket_size = 3000;  // several buckets over ~30k parameters
  struct Run {
    std::vector<torch::Tensor> weights, critic;
    std::vector<TrainRolloutResult> results;
    int64_t async_elements = 0;  // posted by the reducers, rank 0
    int64_t largest_sync = 0;    // numel of the largest synchronous all-reduce, rank 0
  };
  auto run = [&](bool overlap) {
    config::Config rc = c;
    rc.train.overlap_grad_reduce = overlap;
    std::vector<Run> out(2);
    RunTwoGlooRanks(overlap ? "overlap" : "sync", [&](int rank, TrainerOptions& o) {
      o.model_dir = model_dir;
      o.config = rc;
      AllReduceSumFn sync = o.dp_all_reduce;
      AsyncAllReduceSumFn async = o.dp_all_reduce_async;
      Run& r = out[rank];
      o.dp_all_reduce = [sync, &r](torch::Tensor& t) {
        r.largest_sync = std::max(r.largest_sync, t.numel());
        return sync(t);
      };
      o.dp_all_reduce_async = [async, &r](torch::Tensor& t) {
        r.async_elements += t.numel();
        return async(t);
      };
      auto trainer = Trainer::Create(o);
      ASSERT_TRUE(trainer.ok()) << trainer.status();
      for (int rollout = 0; rollout < 2; ++rollout) {
        auto result = (*trainer)->TrainRollout(rollout, batch);
        ASSERT_TRUE(result.ok()) << result.status();
        r.results.push_back(*result);
      }
      r.weights = Weights(**trainer);
      r.critic = CriticWeights(**trainer);
    });
    EXPECT_EQ(out[0].async_elements, out[1].async_elements);
    return out[0];
  };
  const Run sync = run(false);
  const Run overlapped = run(true);
  ExpectBitwiseEqual(sync.weights, overlapped.weights);
  ExpectBitwiseEqual(sync.critic, overlapped.critic);
  ASSERT_EQ(sync.results.size(), overlapped.results.size());
  for (size_t r = 0; r < sync.results.size(); ++r) {
    ASSERT_EQ(sync.results[r].steps.size(), overlapped.results[r].steps.size());
    for (size_t s = 0; s < sync.results[r].steps.size(); ++s) {
      EXPECT_EQ(sync.results[r].steps[s].values, overlapped.results[r].steps[s].values);
    }
  }
  int64_t trainable = 0;  // actor + critic (the critic's LM head is frozen)
  for (const torch::Tensor& w : sync.weights) trainable += w.numel();
  for (const torch::Tensor& w : sync.critic) trainable += w.numel();
  trainable -= sync.weights.back().numel();  // the untied test model's LM head, in the critic
  const int64_t steps = 2 * 2;               // 2 rollouts x 2 optimizer steps
  EXPECT_EQ(sync.async_elements, 0);
  EXPECT_GT(sync.largest_sync, 3000);  // gradient buckets
  EXPECT_EQ(overlapped.async_elements, steps * trainable);
  EXPECT_LT(overlapped.largest_sync, 100) << "a gradient went through the synchronous all-reduce";
}

// ---- Bad settings -------------------------------------------------------------------------------

TEST(DataParallelTrainerTest, SettingsAreCheckedAndOneRankIgnoresZero) {
  TempDir dir;
  const std::string model_dir = MakeModelDir(dir, "m", 41);
  config::Config c = DpConfig();
  c.train.use_distributed_optimizer = true;

  // DP=2 with ZeRO-1 but without the collectives it needs.
  TrainerOptions o;
  o.model_dir = model_dir;
  o.config = c;
  o.dp_size = 2;
  o.dp_rank = 0;
  o.dp_all_reduce = [](torch::Tensor&) { return absl::OkStatus(); };
  auto missing = Trainer::Create(o);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(Msg(missing.status()),
            "trainer: train.use_distributed_optimizer with dp_size = 2 needs dp_reduce_scatter "
            "and dp_all_gather (the DP group's collectives)");

  // One rank: nothing to shard; the plain optimizer trains exactly as without the setting.
  auto with = MakeTrainer(model_dir, c);
  config::Config off = c;
  off.train.use_distributed_optimizer = false;
  auto without = MakeTrainer(model_dir, off);
  ASSERT_NE(with, nullptr);
  ASSERT_NE(without, nullptr);
  EXPECT_FALSE(with->optimizer().distributed());
  const data::RolloutBatch batch = MakeBatch(8, 43);
  Train(*with, 0, batch);
  Train(*without, 0, batch);
  ExpectBitwiseEqual(Weights(*with), Weights(*without));
}

// SaveTrainerCheckpoint refuses a distributed optimizer without its gathered state (its
// ExportState would be a shard).
TEST(DataParallelTrainerTest, CheckpointOfAShardedOptimizerNeedsTheGatheredState) {
  TempDir dir;
  auto config = model::ParseModelConfigJson(model::testing::TinyQwen3ConfigJson(), "tiny");
  ASSERT_TRUE(config.ok());
  auto weights = model::RandomWeights(*config, 3, {});
  ASSERT_TRUE(weights.ok());
  for (model::NamedTensor& nt : model::NamedParameters(*weights, *config)) {
    nt.tensor.set_requires_grad(true);
  }
  AdamWOptions o;
  o.distributed = true;
  auto opt = AdamW::ForModel(*weights, *config, o);
  ASSERT_TRUE(opt.ok()) << opt.status();
  SaveCheckpointOptions so;
  so.save_dir = dir.Join("ckpt");
  auto refused = SaveTrainerCheckpoint(so, *weights, *config, opt->get(), TrainerProgress{});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(Msg(refused.status()),
            "checkpoint save: the optimizer is distributed (train.use_distributed_optimizer); "
            "pass its GatherState() as SaveCheckpointOptions::optimizer_state");
  auto gathered = (*opt)->GatherState();
  ASSERT_TRUE(gathered.ok());
  so.optimizer_state = &*gathered;
  auto saved = SaveTrainerCheckpoint(so, *weights, *config, opt->get(), TrainerProgress{});
  ASSERT_TRUE(saved.ok()) << saved.status();
  // The file holds the per-parameter form a plain optimizer loads.
  auto plain_weights = model::RandomWeights(*config, 4, {});
  ASSERT_TRUE(plain_weights.ok());
  auto plain = AdamW::ForModel(*plain_weights, *config, AdamWOptions{});
  ASSERT_TRUE(plain.ok());
  LoadCheckpointOptions lo;
  lo.load_dir = dir.Join("ckpt");
  auto loaded = LoadTrainerCheckpoint(lo, *plain_weights, *config, plain->get());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(loaded->optimizer_loaded);
}

}  // namespace
}  // namespace slime::train
