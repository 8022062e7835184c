// Pipeline parallelism in training, on CPU:
//   - the stage split (MakePipelineStage) and its errors;
//   - decoder stages chained by hand in one thread (the output of stage 0 fed to stage 1, the
//     gradient of stage 1's input fed back into stage 0's backward) against the whole model:
//     the same hidden states and the same parameter gradients; a stage loads only its own
//     parameters and refuses what needs the whole model;
//   - the Trainer at PP=2 and PP=3 (threads, real c10d Gloo groups over TCPStore on 127.0.0.1)
//     against the single-process trainer: GRPO with a KL loss (a forward-only reference pass
//     through the pipeline), an entropy bonus and gradient clipping; 4 micro-batches per step so
//     the 1F1B warm-up / steady / cool-down phases all run; the same metrics on every stage,
//     the same updated weights, the same forward-only log-probs; with tied embeddings too (the
//     last stage's LM head copy and the gradient sum between the first and last stage); PP=2 ×
//     DP=2; PP=2 × TP=2 (tensor-parallel stages: losses, gradient norm, the raw gradients and
//     the weights with the TP shards gathered, vocab-parallel log-probs from the last stage;
//     untied and tied; with sequence parallelism); PP=2 ×
//     DP=2 with the distributed optimizer (ZeRO-1 per stage);
//   - a PP=2 checkpoint loads at PP=1 (weights bit for bit, AdamW moments: the continuation
//     tracks the run that stayed at PP=1) and a PP=1 checkpoint at PP=2; the same between
//     PP=1 × TP=1 and PP=2 × TP=2, and PP=2 × TP=2 × DP=2 with ZeRO-1; a failed write at
//     PP=2 × TP=2 fails the save on every rank;
//   - the weight export (FullParameter) at PP=2 / PP=3, tied and untied, and PP=2 × TP=2:
//     every full tensor reaches stage 0 once, bit for bit;
//   - Create's refusals: fewer layers than stages, PP × PPO.
// Built a second time with SLIME_PP_GPU_TEST (target train_pipeline_parallel_gpu_test, label
// gpu): then only the CUDA case runs — PP=2 × TP=2 (tied embeddings) with NCCL on cuda:0..3 in
// bfloat16 against one rank on cuda:0; it skips with fewer than four CUDA devices.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "multi_rank_harness.h"
#include "slime/comm/process_group.h"
#include "slime/comm/tensor_parallel_group.h"
#include "slime/model/decoder.h"
#include "slime/model/pipeline_parallel.h"
#include "slime/model/weights.h"
#include "slime/train/optimizer.h"
#include "slime/train/trainer.h"
#include "trainer_test_util.h"

namespace slime::train {
namespace {

using model::testing::TempDir;
using test_util::BaseConfig;
using test_util::ExpectClose;
using test_util::MakeBatch;
using test_util::Replace;
using test_util::Train;

// The tiny Qwen3 (untied, q/k norms) with 4 layers, or the tiny Qwen2 (tied embeddings, q/k/v
// biases) with 2 layers, as an HF directory with random float32 weights.
// With tp > 1 the vocabulary is 104 (it splits over the TP ranks).
std::string MakePpModelDir(const TempDir& dir, uint64_t seed, bool tied = false, int tp = 1) {
  std::string json =
      tied ? model::testing::TinyQwen2ConfigJson() : model::testing::TinyQwen3ConfigJson();
  if (!tied) Replace(json, "\"num_hidden_layers\": 2", "\"num_hidden_layers\": 4");
  const std::string vocab = tp > 1 ? "\"vocab_size\": 104" : "\"vocab_size\": 101";
  if (tied) Replace(json, "\"vocab_size\": 97", vocab);  // MakeBatch's ids
  if (!tied && tp > 1) Replace(json, "\"vocab_size\": 101", vocab);
  return test_util::MakeModelDirFromJson(dir, tied ? "tied" : "m", json, seed);
}

#ifndef SLIME_PP_GPU_TEST  // the stage tests run in the CPU target only
// ---- stages

TEST(PipelineStageTest, SplitsLayersEvenlyAndRefusesMoreStagesThanLayers) {
  auto whole = model::MakePipelineStage(4, 0, 1);
  ASSERT_TRUE(whole.ok());
  EXPECT_TRUE(whole->whole());
  EXPECT_TRUE(whole->HasLayer(3));
  std::vector<std::pair<int64_t, int64_t>> got;
  for (int r = 0; r < 3; ++r) {
    auto s = model::MakePipelineStage(4, r, 3);
    ASSERT_TRUE(s.ok()) << s.status();
    got.emplace_back(s->first_layer, s->end_layer);
  }
  EXPECT_EQ(got, (std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {1, 2}, {2, 4}}));
  auto bad = model::MakePipelineStage(2, 0, 3);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(bad.status().message()).find("pipeline_model_parallel_size = 3"),
            std::string::npos)
      << bad.status();
  EXPECT_NE(std::string(bad.status().message()).find("2 decoder layers"), std::string::npos);
  EXPECT_FALSE(model::MakePipelineStage(4, 2, 2).ok());
}

// Stages chained by hand reproduce the whole model's hidden states and parameter gradients;
// with tied embeddings the first stage's table gradient plus the last stage's copy's is the
// whole model's.
void ExpectStagesMatchTheWholeModel(bool tied) {
  TempDir dir;
  const std::string model_dir = MakePpModelDir(dir, 5, tied);
  auto whole = model::DecoderModel::Load(model_dir, torch::kFloat32, torch::kCPU);
  ASSERT_TRUE(whole.ok()) << whole.status();
  auto s0 = model::DecoderModel::Load(model_dir, torch::kFloat32, torch::kCPU, nullptr, 0, 2);
  auto s1 = model::DecoderModel::Load(model_dir, torch::kFloat32, torch::kCPU, nullptr, 1, 2);
  ASSERT_TRUE(s0.ok()) << s0.status();
  ASSERT_TRUE(s1.ok()) << s1.status();
  const int64_t layers = (*whole)->config().num_hidden_layers;

  // Only their own parameters were loaded.
  EXPECT_TRUE((*s0)->weights().embed_tokens.defined());
  EXPECT_FALSE((*s0)->weights().final_norm.defined());
  EXPECT_FALSE((*s0)->weights().layers[layers - 1].q_proj.defined());
  EXPECT_TRUE((*s1)->weights().final_norm.defined());
  EXPECT_FALSE((*s1)->weights().layers[0].q_proj.defined());
  EXPECT_EQ((*s1)->weights().embed_tokens.defined(), tied);  // the LM head copy
  const size_t all = model::NamedParameters((*whole)->weights(), (*whole)->config()).size();
  const auto p0 = model::NamedParameters((*s0)->weights(), (*s0)->config());
  const auto p1 = model::NamedParameters((*s1)->weights(), (*s1)->config());
  EXPECT_EQ(p0.size() + p1.size(), all + (tied ? 1 : 0));

  // What needs the whole model says so.
  auto logits = (*s0)->Logits(torch::zeros({1, (*s0)->config().hidden_size}));
  EXPECT_EQ(logits.status().code(), absl::StatusCode::kFailedPrecondition) << logits.status();
  auto cached = (*s1)->ForwardWithCache(torch::zeros({1}, torch::kLong), {0, 1}, {nullptr});
  EXPECT_EQ(cached.status().code(), absl::StatusCode::kFailedPrecondition) << cached.status();
  auto bad_input = (*s1)->ForwardPacked(torch::zeros({3}, torch::kLong), {0, 3});
  EXPECT_EQ(bad_input.status().code(), absl::StatusCode::kInvalidArgument) << bad_input.status();

  for (auto* m : {&*whole, &*s0, &*s1}) {
    for (const auto& nt : model::NamedParameters((**m).weights(), (**m).config())) {
      torch::Tensor t = nt.tensor;  // the model's tensor (shared implementation)
      t.set_requires_grad(true);
    }
  }
  const torch::Tensor ids = torch::tensor({3, 7, 1, 9, 4, 2, 8, 5, 6}, torch::kLong);
  const std::vector<int64_t> cu = {0, 4, 9};
  torch::manual_seed(3);
  const torch::Tensor g = torch::randn({9, (*whole)->config().hidden_size});

  auto full = (*whole)->ForwardPacked(ids, cu);
  ASSERT_TRUE(full.ok()) << full.status();
  torch::Tensor logits_whole = *(*whole)->Logits(*full);
  ((*full * g).sum() + logits_whole.square().mean()).backward();

  auto h0 = (*s0)->ForwardPacked(ids, cu);
  ASSERT_TRUE(h0.ok()) << h0.status();
  torch::Tensor x1 = h0->detach().clone().requires_grad_(true);  // what stage 1 receives
  auto h1 = (*s1)->ForwardPacked(x1, cu);
  ASSERT_TRUE(h1.ok()) << h1.status();
  ExpectClose(*h1, *full, "final hidden states", 1e-5);
  torch::Tensor logits_1 = *(*s1)->Logits(*h1);
  ((*h1 * g).sum() + logits_1.square().mean()).backward();
  h0->backward(x1.grad());

  std::map<std::string, torch::Tensor> staged;
  for (const auto& nt : p0) staged[nt.name] = nt.tensor.grad();
  for (const auto& nt : p1) {
    auto it = staged.find(nt.name);
    if (it != staged.end()) {
      it->second = it->second + nt.tensor.grad();  // the tied table: both stages' parts
    } else {
      staged[nt.name] = nt.tensor.grad();
    }
  }
  for (const auto& nt : model::NamedParameters((*whole)->weights(), (*whole)->config())) {
    ASSERT_TRUE(staged[nt.name].defined()) << nt.name;
    ExpectClose(staged[nt.name], nt.tensor.grad(), "grad " + nt.name, 1e-5);
  }
}

TEST(PipelineStageTest, ChainedStagesMatchTheWholeModel) { ExpectStagesMatchTheWholeModel(false); }

TEST(PipelineStageTest, ChainedStagesWithTiedEmbeddingsMatchTheWholeModel) {
  ExpectStagesMatchTheWholeModel(true);
}

#endif  // SLIME_PP_GPU_TEST

// ---- the trainer over Gloo groups

// The grid of a PP × DP × TP run: global rank = (dp · TP + tp) · PP + stage. Pipeline groups
// share a DP and a TP index (stage s talks to stage s+1 of its own TP index), TP groups a DP
// index and a stage, DP groups a TP index and a stage.
// With `cuda` (the GPU build of this test) global rank r runs on cuda:r over NCCL in `dtype`,
// compared with `tol`; otherwise CPU, Gloo, float32.
struct Grid {
  int pp = 1, dp = 1, tp = 1;
  bool cuda = false;
  torch::ScalarType dtype = torch::kFloat32;
  double tol = 2e-5;
  bool overlap = false;  // train.overlap_grad_reduce
  int world() const { return pp * dp * tp; }
  torch::Device device(int rank) const {
    return cuda ? torch::Device(torch::kCUDA, static_cast<int8_t>(rank)) : torch::kCPU;
  }
  int rank(int d, int t, int s) const { return (d * tp + t) * pp + s; }
  int stage(int rank) const { return rank % pp; }
  int tp_rank(int rank) const { return (rank / pp) % tp; }
  int dp_rank(int rank) const { return rank / (pp * tp); }
};

// Runs body(rank, options) on the grid's threads (multi_rank_harness.h) with real Gloo (NCCL
// with `cuda`) groups; at dp > 1 the options carry the DP seams, the reduce-scatter and
// all-gather of the distributed optimizer included.
void OnGrid(const Grid& g, const std::string& model_dir, const config::Config& c,
            const std::function<void(int, TrainerOptions)>& body) {
  const int world = g.world();
  std::vector<std::vector<int>> pp_groups, dp_groups, tp_groups;
  for (int d = 0; d < g.dp; ++d) {
    for (int t = 0; t < g.tp; ++t) {
      pp_groups.emplace_back();
      for (int s = 0; s < g.pp; ++s) pp_groups.back().push_back(g.rank(d, t, s));
    }
  }
  for (int t = 0; t < g.tp; ++t) {
    for (int s = 0; s < g.pp; ++s) {
      dp_groups.emplace_back();
      for (int d = 0; d < g.dp; ++d) dp_groups.back().push_back(g.rank(d, t, s));
    }
  }
  for (int d = 0; d < g.dp; ++d) {
    for (int s = 0; s < g.pp; ++s) {
      tp_groups.emplace_back();
      for (int t = 0; t < g.tp; ++t) tp_groups.back().push_back(g.rank(d, t, s));
    }
  }
  test_util::RankGroupOptions how;
  how.backend = g.cuda ? "nccl" : "gloo";
  using test_util::RankGroups;
  const RankGroups pp_pgs = test_util::MakeGroups(world, pp_groups, "pp", how);
  const RankGroups dp_pgs =
      g.dp > 1 ? test_util::MakeGroups(world, dp_groups, "dp", how) : RankGroups(world);
  const RankGroups tp_pgs =
      g.tp > 1 ? test_util::MakeGroups(world, tp_groups, "tp", how) : RankGroups(world);
  ASSERT_EQ(pp_pgs.size(), static_cast<size_t>(world));
  ASSERT_EQ(dp_pgs.size(), static_cast<size_t>(world));
  ASSERT_EQ(tp_pgs.size(), static_cast<size_t>(world));
  test_util::RunRanks(world, [&](int rank) {
    TrainerOptions o;
    o.model_dir = model_dir;
    o.config = c;
    o.device = g.device(rank);
    o.dtype = g.dtype;
    o.pp_group = std::make_shared<comm::ProcessGroupPipelineParallel>(pp_pgs[rank].at(0));
    if (g.tp > 1) {
      o.tp_group = std::make_shared<comm::ProcessGroupTensorParallel>(tp_pgs[rank].at(0));
    }
    test_util::GridRank dp;  // only its data-parallel half: WireDataParallel's input
    dp.rank = rank;
    dp.dp_rank = g.dp_rank(rank);
    dp.dp_size = g.dp;
    if (g.dp > 1) dp.dp = dp_pgs[rank].at(0);
    test_util::WireDataParallel(dp, o);
    body(rank, std::move(o));
  });
}

// GRPO with a KL loss to the reference (a forward-only pass through the pipeline), an entropy
// bonus, advantage whitening and clipping by the global gradient norm; 8 samples, 2 optimizer
// steps of 4 micro-batches per rollout (trainer_test_util.h).
config::Config PpConfig() { return test_util::ModelParallelConfig(); }

struct StageResult {
  std::vector<TrainRolloutResult> rollouts;
  std::map<std::string, torch::Tensor> weights;  // this stage's, by HF name
  std::map<std::string, torch::Tensor> grads;    // RecordGradients' sums, by HF name
  SampleLogProbs log_probs;                      // ComputeLogProbs after training
};

// Adds every gradient that a backward pass delivers to a parameter of `t` into grads[name]:
// the raw gradients of every micro-batch of the run (this rank's backward only: before the DP
// sums, the tied-table exchange and clipping). Hooks on the model's leaf tensors, called on the
// thread that runs the backward (the rank's own).
void RecordGradients(const Trainer& t, std::map<std::string, torch::Tensor>& grads) {
  for (const auto& nt : model::NamedParameters(t.model().weights(), t.model().config())) {
    torch::Tensor& sum = grads[nt.name];
    sum = torch::zeros(nt.tensor.sizes(), torch::kFloat32);
    nt.tensor.register_hook([&sum](const torch::Tensor& g) {
      sum.add_(g.detach().to(torch::kCPU, torch::kFloat32));
    });
  }
}

std::map<std::string, torch::Tensor> WeightsByName(const Trainer& t) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& nt : model::NamedParameters(t.model().weights(), t.model().config())) {
    out[nt.name] = nt.tensor.detach().to(torch::kCPU, torch::kFloat32, false, /*copy=*/true);
  }
  return out;
}

// The split dim of every parameter by HF name (-1: replicated over the TP ranks).
std::map<std::string, int64_t> ShardDims(const std::string& model_dir) {
  auto config = model::LoadModelConfig(model_dir);
  EXPECT_TRUE(config.ok()) << config.status();
  std::map<std::string, int64_t> out;
  if (!config.ok()) return out;
  for (const model::ParamSpec& spec : model::ParameterSpecs(*config)) {
    out[spec.hf_name] = static_cast<int64_t>(spec.shard);
  }
  return out;
}

// One stage's parameter as a full tensor: the TP shards of it concatenated along its split dim
// (a replicated one must be identical on every TP rank).
struct StageWeight {
  std::string name;
  int stage;
  torch::Tensor full;
};

// The parameters of DP rank d's stages, TP shards gathered; the tied table appears twice (the
// first stage's and the last stage's copy).
using RankTensors = std::map<std::string, torch::Tensor>;  // one rank's tensors by HF name
std::vector<StageWeight> GatherStages(const std::vector<RankTensors>& ranks, const Grid& g, int d,
                                      const std::map<std::string, int64_t>& dims) {
  std::vector<StageWeight> out;
  for (int s = 0; s < g.pp; ++s) {
    for (const auto& [name, first] : ranks[g.rank(d, 0, s)]) {
      std::vector<torch::Tensor> shards;
      for (int t = 0; t < g.tp; ++t) shards.push_back(ranks[g.rank(d, t, s)].at(name));
      const int64_t dim = dims.at(name);
      if (dim < 0) {
        for (int t = 1; t < g.tp; ++t) {
          EXPECT_TRUE(torch::equal(shards[t], shards[0]))
              << name << " differs between TP ranks 0 and " << t << " of stage " << s;
        }
        out.push_back({name, s, shards[0]});
      } else {
        out.push_back({name, s, torch::cat(shards, dim)});
      }
    }
  }
  return out;
}

// A PP × DP × TP run against the single-process trainer (with `zero` the distributed optimizer
// over the DP ranks, with `sp` sequence parallelism inside the TP groups).
void ExpectMatchesOneStage(const Grid& g, bool tied, bool zero = false, bool sp = false) {
  TempDir dir;
  const std::string model_dir = MakePpModelDir(dir, 14, tied, g.tp);
  config::Config c = PpConfig();
  c.train.use_distributed_optimizer = zero;
  c.train.sequence_parallel = sp;  // the one-rank reference ignores it
  c.train.overlap_grad_reduce = g.overlap;  // likewise
  const data::RolloutBatch batch = MakeBatch(8, 15);
  constexpr int kRollouts = 2;

  TrainerOptions so;
  so.model_dir = model_dir;
  so.config = c;
  so.device = g.device(0);
  so.dtype = g.dtype;
  auto created = Trainer::Create(so);
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<Trainer> single = std::move(*created);
  std::map<std::string, torch::Tensor> want_grads;
  RecordGradients(*single, want_grads);
  std::vector<TrainRolloutResult> want;
  for (int r = 0; r < kRollouts; ++r) want.push_back(Train(*single, r, batch));
  const std::map<std::string, torch::Tensor> want_weights = WeightsByName(*single);
  const SampleLogProbs want_lp = test_util::LogProbs(*single, batch);
  ASSERT_EQ(want.size(), static_cast<size_t>(kRollouts));
  ASSERT_FALSE(want[0].steps.empty());
  // The run is not trivial: clipping was active and there were several micro-batches per step.
  EXPECT_GT(test_util::Value(want[0].steps[0], "grad_norm"), c.train.clip_grad);

  const int world = g.world();
  std::vector<StageResult> got(world);
  OnGrid(g, model_dir, c, [&](int rank, TrainerOptions o) {
    auto trainer = Trainer::Create(std::move(o));
    ASSERT_TRUE(trainer.ok()) << "rank " << rank << ": " << trainer.status();
    EXPECT_EQ((*trainer)->optimizer().distributed(), zero && g.dp > 1);
    EXPECT_EQ(std::as_const(**trainer).model().sequence_parallel(), sp && g.tp > 1);
    RecordGradients(**trainer, got[rank].grads);
    for (int r = 0; r < kRollouts; ++r) {
      auto result = (*trainer)->TrainRollout(r, batch);
      ASSERT_TRUE(result.ok()) << "rank " << rank << ": " << result.status();
      got[rank].rollouts.push_back(*result);
    }
    got[rank].weights = WeightsByName(**trainer);
    auto lp = (*trainer)->ComputeLogProbs(batch);
    ASSERT_TRUE(lp.ok()) << "rank " << rank << ": " << lp.status();
    got[rank].log_probs = *lp;
  });

  const double kTol = g.tol;
  for (int rank = 0; rank < world; ++rank) {
    ASSERT_EQ(got[rank].rollouts.size(), static_cast<size_t>(kRollouts)) << rank;
    // Every rank reports the step's metrics (the loss ones come from the last stage; grad_norm
    // sums the TP shards, the stages and the DP shards).
    for (int r = 0; r < kRollouts; ++r) {
      ASSERT_EQ(got[rank].rollouts[r].steps.size(), want[r].steps.size());
      for (size_t s = 0; s < want[r].steps.size(); ++s) {
        for (const auto& [name, value] : want[r].steps[s].values) {
          EXPECT_NEAR(test_util::Value(got[rank].rollouts[r].steps[s], name), value,
                      kTol * (1.0 + std::abs(value)))
              << name << " at rank " << rank << " rollout " << r << " step " << s;
        }
      }
    }
    // Forward-only log-probs through the pipeline (vocab-parallel on the last stage at TP > 1),
    // the same on every rank.
    ASSERT_EQ(got[rank].log_probs.log_probs.size(), want_lp.log_probs.size());
    for (size_t i = 0; i < want_lp.log_probs.size(); ++i) {
      ExpectClose(got[rank].log_probs.log_probs[i], want_lp.log_probs[i],
                  "log-probs of sample " + std::to_string(i) + " at rank " + std::to_string(rank),
                  kTol);
    }
  }
  // Weights: the stages of each DP rank together hold every parameter (TP shards gathered),
  // equal to the one-stage run's (the tied copy on the last stage equal to the first stage's
  // table).
  const std::map<std::string, int64_t> dims = ShardDims(model_dir);
  std::vector<std::map<std::string, torch::Tensor>> rank_weights;
  for (const StageResult& r : got) rank_weights.push_back(r.weights);
  for (int d = 0; d < g.dp; ++d) {
    std::map<std::string, int> seen;
    std::map<std::string, torch::Tensor> table;
    for (const StageWeight& w : GatherStages(rank_weights, g, d, dims)) {
      ++seen[w.name];
      ASSERT_EQ(want_weights.count(w.name), 1u) << w.name;
      ExpectClose(w.full, want_weights.at(w.name),
                  w.name + " at dp " + std::to_string(d) + " stage " + std::to_string(w.stage),
                  kTol);
      if (w.name == "model.embed_tokens.weight") {
        if (table.count(w.name) > 0) {
          EXPECT_TRUE(torch::equal(table[w.name], w.full)) << "the tied copies drifted apart";
        }
        table[w.name] = w.full;
      }
    }
    for (const auto& [name, w] : want_weights) {
      const bool is_table = name == "model.embed_tokens.weight";
      EXPECT_EQ(seen[name], tied && is_table && g.pp > 1 ? 2 : 1) << name;
    }
  }
  // Gradients: the raw micro-batch gradients of the run, TP shards gathered, summed over the DP
  // ranks (each trains its own micro-batches) and over the tied table's two copies, equal the
  // one-rank run's.
  std::vector<std::map<std::string, torch::Tensor>> rank_grads;
  for (const StageResult& r : got) rank_grads.push_back(r.grads);
  std::map<std::string, torch::Tensor> grads;
  for (int d = 0; d < g.dp; ++d) {
    for (const StageWeight& w : GatherStages(rank_grads, g, d, dims)) {
      torch::Tensor& sum = grads[w.name];
      sum = sum.defined() ? sum + w.full : w.full;
    }
  }
  ASSERT_EQ(grads.size(), want_grads.size());
  for (const auto& [name, want_g] : want_grads) {
    ASSERT_EQ(grads.count(name), 1u) << name;
    EXPECT_GT(want_g.abs().max().item<double>(), 0.0) << name << " got no gradient";
    ExpectClose(grads.at(name), want_g, "gradient of " + name,
                kTol * (1.0 + want_g.abs().max().item<double>()));
  }
  // The weights moved (the comparison is not of two untouched copies).
  auto initial = test_util::MakeTrainer(model_dir, c);
  ASSERT_NE(initial, nullptr);
  const auto before = WeightsByName(*initial);
  EXPECT_GT((before.at("model.norm.weight") - want_weights.at("model.norm.weight"))
                .abs()
                .max()
                .item<double>(),
            1e-4);
}

#ifdef SLIME_PP_GPU_TEST
// The CUDA case: PP=2 × TP=2 on cuda:0..3 over NCCL in bfloat16 against one rank on cuda:0
// (bf16 tolerance: the TP partial sums and the stages round differently from one GEMM).
TEST(PipelineParallelGpuTest, TwoStagesTimesTwoTensorParallelGpusMatchOneGpuInBf16) {
  const int64_t gpus = torch::cuda::is_available() ? torch::cuda::device_count() : 0;
  if (gpus < 4) GTEST_SKIP() << "needs four CUDA devices (found " << gpus << ")";
  Grid g{2, 1, 2};
  g.cuda = true;
  g.dtype = torch::kBFloat16;
  g.tol = 3e-2;
  ExpectMatchesOneStage(g, /*tied=*/true);
}
#else

void ExpectMatchesOneStage(int pp, int dp, bool tied) {
  ExpectMatchesOneStage(Grid{pp, dp, 1}, tied);
}

TEST(PipelineParallelTrainerTest, TwoStagesMatchOneStage) { ExpectMatchesOneStage(2, 1, false); }

TEST(PipelineParallelTrainerTest, ThreeStagesMatchOneStage) { ExpectMatchesOneStage(3, 1, false); }

TEST(PipelineParallelTrainerTest, TwoStagesWithTiedEmbeddingsMatchOneStage) {
  ExpectMatchesOneStage(2, 1, true);
}

TEST(PipelineParallelTrainerTest, TwoStagesTimesTwoDataParallelMatchOneStage) {
  ExpectMatchesOneStage(2, 2, false);
}

// train.overlap_grad_reduce: each stage's DP buckets posted from its last backward pass of the
// step (the 1F1B cool-down on stage 0, the steady phase on the last stage); tied embeddings,
// whose two copies are summed after the DP sums.
TEST(PipelineParallelTrainerTest, TwoStagesTimesTwoDataParallelWithOverlappedGradReduce) {
  Grid g{2, 2, 1};
  g.overlap = true;
  ExpectMatchesOneStage(g, /*tied=*/true);
}

// Weight export (the workers' weight sync) at PP > 1: FullParameter(i) on every rank at once (a
// collective of the pipeline group, and of the owning stage's TP group at TP > 1) gives every
// TP rank of stage 0 the one-rank trainer's parameter i bit for bit, whichever stage owns it —
// also the tied table, sent once by stage 0 —, the owner its own tensor, and the other stages
// nothing; FullParameterShapes lists the whole model everywhere.
void ExpectFullParametersReachStageZero(const Grid& g, bool tied) {
  TempDir dir;
  const std::string model_dir = MakePpModelDir(dir, 21, tied, g.tp);
  const config::Config c = PpConfig();
  auto single = test_util::MakeTrainer(model_dir, c);
  ASSERT_NE(single, nullptr);
  const std::vector<model::NamedTensor> want = std::as_const(*single).FullParameterShapes();
  const int world = g.world();
  std::vector<std::vector<torch::Tensor>> got(world);
  std::vector<size_t> shapes(world);
  std::vector<Status> past_end(world);
  OnGrid(g, model_dir, c, [&](int rank, TrainerOptions o) {
    auto trainer = Trainer::Create(std::move(o));
    ASSERT_TRUE(trainer.ok()) << "rank " << rank << ": " << trainer.status();
    shapes[rank] = std::as_const(**trainer).FullParameterShapes().size();
    for (size_t i = 0; i < want.size(); ++i) {
      auto full = (*trainer)->FullParameter(i);
      ASSERT_TRUE(full.ok()) << "rank " << rank << " parameter " << i << ": " << full.status();
      got[rank].push_back(full->defined() ? full->clone() : torch::Tensor());
    }
    past_end[rank] = (*trainer)->FullParameter(want.size()).status();
  });
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(shapes[r], want.size()) << "rank " << r;
    EXPECT_EQ(past_end[r].code(), absl::StatusCode::kOutOfRange) << past_end[r];
    ASSERT_EQ(got[r].size(), want.size()) << "rank " << r;
  }
  std::vector<int> owned(g.pp, 0);
  for (size_t i = 0; i < want.size(); ++i) {
    const std::string& name = want[i].name;
    auto expected = single->FullParameter(i);
    ASSERT_TRUE(expected.ok()) << expected.status();
    for (int t = 0; t < g.tp; ++t) {
      const torch::Tensor& first = got[g.rank(0, t, 0)][i];
      ASSERT_TRUE(first.defined()) << name << " did not reach stage 0, TP rank " << t;
      EXPECT_TRUE(torch::equal(first, *expected)) << name << " at stage 0, TP rank " << t;
      for (int s = 1; s < g.pp; ++s) {
        const torch::Tensor& at = got[g.rank(0, t, s)][i];
        if (!at.defined()) continue;
        if (t == 0) ++owned[s];
        EXPECT_TRUE(torch::equal(at, *expected)) << name << " at its owner, stage " << s;
        EXPECT_NE(name, "model.embed_tokens.weight") << "stage " << s << " sent the table";
      }
    }
  }
  for (int s = 1; s < g.pp; ++s) EXPECT_GT(owned[s], 0) << "stage " << s << " owns parameters";
}

TEST(PipelineParallelTrainerTest, FullParametersOfEveryStageReachStageZero) {
  ExpectFullParametersReachStageZero(Grid{2, 1, 1}, /*tied=*/false);
  ExpectFullParametersReachStageZero(Grid{3, 1, 1}, /*tied=*/false);
  ExpectFullParametersReachStageZero(Grid{2, 1, 1}, /*tied=*/true);
}

// The same at PP=2 × TP=2: the owning stage gathers its TP shards, then each TP rank sends
// the full tensor to stage 0's rank of its TP index.
TEST(PipelineParallelTrainerTest, FullParametersOfTensorParallelStagesReachStageZero) {
  ExpectFullParametersReachStageZero(Grid{2, 1, 2}, /*tied=*/true);
}

// PP × TP: each stage's layers split over two TP ranks; stage 0's TP rank t sends its (full,
// replicated) hidden states to stage 1's TP rank t. Losses, gradient norm (TP shards summed,
// replicated parameters once, stages summed), updated weights and vocab-parallel log-probs
// from the last stage equal the single rank's.
TEST(PipelineParallelTrainerTest, TwoStagesTimesTwoTensorParallelMatchOneRank) {
  ExpectMatchesOneStage(Grid{2, 1, 2}, /*tied=*/false);
}

// The same with tied embeddings: the first stage's vocab-parallel table shard and the last
// stage's LM head copy of the same shard sum their gradients.
TEST(PipelineParallelTrainerTest, TwoStagesTimesTwoTensorParallelWithTiedEmbeddingsMatchOneRank) {
  ExpectMatchesOneStage(Grid{2, 1, 2}, /*tied=*/true);
}

// PP × TP with sequence parallelism: inside a stage the residual stream is split along the
// tokens over the TP ranks; between stages it travels whole (each stage gathers its output and
// the next scatters its input).
TEST(PipelineParallelTrainerTest, TwoStagesTimesTwoTensorParallelWithSequenceParallelism) {
  ExpectMatchesOneStage(Grid{2, 1, 2}, /*tied=*/true, /*zero=*/false, /*sp=*/true);
}

// PP × ZeRO-1: each stage's DP group shards that stage's optimizer state.
TEST(PipelineParallelTrainerTest, TwoStagesTimesTwoDataParallelWithTheDistributedOptimizer) {
  ExpectMatchesOneStage(Grid{2, 2, 1}, /*tied=*/true, /*zero=*/true);
}

// A checkpoint saved on the grid (gathered to stage 0 — over the TP group first at TP > 1, over
// the DP group first with the distributed optimizer — and written as one model) loads at
// PP=1 × TP=1 with the weights bit for bit and the AdamW state (the continuation tracks the run
// that stayed on one rank); a one-rank checkpoint loads on the grid.
void ExpectCheckpointsMoveBetweenLayouts(const Grid& g, bool zero = false) {
  TempDir dir;
  const std::string model_dir = MakePpModelDir(dir, 21, /*tied=*/false, g.tp);
  config::Config c = PpConfig();
  c.train.use_distributed_optimizer = zero;
  const data::RolloutBatch batch = MakeBatch(8, 22);
  const std::string at_one = dir.Join("save-one"), at_grid = dir.Join("save-grid");

  auto a = test_util::MakeTrainer(model_dir, c);
  ASSERT_NE(a, nullptr);
  Train(*a, 0, batch);
  ASSERT_TRUE(a->Save(at_one, 0).ok());
  const auto a_after_0 = WeightsByName(*a);

  const int world = g.world();
  std::vector<std::map<std::string, torch::Tensor>> loaded(world), trained(world);
  OnGrid(g, model_dir, c, [&](int rank, TrainerOptions o) {
    const int dp_rank = o.dp_rank;
    auto t = Trainer::Create(std::move(o));
    ASSERT_TRUE(t.ok()) << t.status();
    auto state = (*t)->Load(at_one);
    ASSERT_TRUE(state.ok()) << "rank " << rank << ": " << state.status();
    EXPECT_EQ(state->step, 2);
    EXPECT_TRUE(state->optimizer_loaded);
    loaded[rank] = WeightsByName(**t);
    auto r = (*t)->TrainRollout(1, batch);
    ASSERT_TRUE(r.ok()) << r.status();
    trained[rank] = WeightsByName(**t);
    // Without the distributed optimizer the DP ranks' states are identical and one DP rank
    // saves; with it every rank takes part (DP rank 0 writes).
    if (!zero && dp_rank != 0) return;
    auto saved = (*t)->Save(at_grid, 1);
    ASSERT_TRUE(saved.ok()) << "rank " << rank << ": " << saved.status();
    EXPECT_EQ(saved->empty(), dp_rank != 0) << "rank " << rank << ": " << *saved;
  });
  const std::map<std::string, int64_t> dims = ShardDims(model_dir);
  for (int d = 0; d < g.dp; ++d) {
    for (const StageWeight& w : GatherStages(loaded, g, d, dims)) {
      EXPECT_TRUE(torch::equal(w.full, a_after_0.at(w.name))) << w.name << " at dp " << d;
    }
  }

  Train(*a, 1, batch);
  auto b = test_util::MakeTrainer(model_dir, c);
  ASSERT_NE(b, nullptr);
  auto state = b->Load(at_grid);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->step, 4);
  EXPECT_TRUE(state->optimizer_loaded);
  const auto b_weights = WeightsByName(*b);
  const auto a_after_1 = WeightsByName(*a);
  size_t checked = 0;
  for (const StageWeight& w : GatherStages(trained, g, 0, dims)) {
    EXPECT_TRUE(torch::equal(b_weights.at(w.name), w.full)) << w.name;
    ExpectClose(b_weights.at(w.name), a_after_1.at(w.name), w.name + " after rollout 1", 2e-5);
    ++checked;
  }
  EXPECT_EQ(checked, b_weights.size());
  // One more rollout on both: equal only if the AdamW moments crossed the grid's checkpoint.
  Train(*a, 2, batch);
  Train(*b, 2, batch);
  const auto a2 = WeightsByName(*a), b2 = WeightsByName(*b);
  for (const auto& [name, w] : a2) ExpectClose(b2.at(name), w, name + " after rollout 2", 4e-5);
}

TEST(PipelineParallelTrainerTest, CheckpointsMoveBetweenPipelineSizes) {
  ExpectCheckpointsMoveBetweenLayouts(Grid{2, 1, 1});
}

// Save at PP=2 × TP=2, load at PP=1 × TP=1, and the other way round.
TEST(PipelineParallelTrainerTest, CheckpointsMoveBetweenOneRankAndTwoStagesTimesTwoTensorParallel) {
  ExpectCheckpointsMoveBetweenLayouts(Grid{2, 1, 2});
}

// PP=2 × TP=2 × DP=2 with the distributed optimizer: the save gathers the DP shards, then the
// TP shards, then the stages.
TEST(PipelineParallelTrainerTest, CheckpointsMoveBetweenOneRankAndAFullGridWithZeroOne) {
  ExpectCheckpointsMoveBetweenLayouts(Grid{2, 2, 2}, /*zero=*/true);
}

// A save that stage 0's TP rank 0 cannot write (the save directory is a regular file) fails on
// all four ranks of a PP=2 × TP=2 grid — the writer with its own error, stage 1's TP rank 0
// naming pipeline stage 0, the other TP ranks naming their TP rank 0 — and nobody hangs.
TEST(PipelineParallelTrainerTest, AFailedWriteFailsTheSaveOnEveryRankOfTensorParallelStages) {
  TempDir dir;
  const std::string model_dir = MakePpModelDir(dir, 23, /*tied=*/false, /*tp=*/2);
  const std::string not_a_dir = dir.Join("a-file");
  model::testing::WriteFile(not_a_dir, "not a directory\n");
  const Grid g{2, 1, 2};
  std::vector<std::string> errors(g.world());
  OnGrid(g, model_dir, PpConfig(), [&](int rank, TrainerOptions o) {
    auto t = Trainer::Create(std::move(o));
    ASSERT_TRUE(t.ok()) << t.status();
    auto saved = (*t)->Save(not_a_dir, 0);
    ASSERT_FALSE(saved.ok()) << "rank " << rank << " returned " << *saved;
    errors[rank] = std::string(saved.status().message());
  });
  const int writer = g.rank(0, 0, 0);
  EXPECT_EQ(errors[writer].find("pipeline stage 0 failed"), std::string::npos) << errors[writer];
  EXPECT_EQ(errors[writer].find("tensor-parallel rank 0 failed"), std::string::npos)
      << errors[writer];
  EXPECT_NE(errors[g.rank(0, 0, 1)].find("pipeline stage 0 failed to save"), std::string::npos)
      << errors[g.rank(0, 0, 1)];
  for (int s = 0; s < g.pp; ++s) {
    const std::string& e = errors[g.rank(0, 1, s)];
    EXPECT_NE(e.find("tensor-parallel rank 0 failed to save"), std::string::npos) << e;
    EXPECT_NE(e.find(not_a_dir), std::string::npos) << e;
  }
}

// ---- refusals at Create (no peer is contacted: a stand-in group is enough)

class FakeStages final : public model::PipelineParallelGroup {
 public:
  FakeStages(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Status Send(const at::Tensor&, int) override { return Unused(); }
  Status Recv(at::Tensor&, int) override { return Unused(); }
  Status SendRecv(const at::Tensor&, int, at::Tensor&, int) override { return Unused(); }
  Status Broadcast(at::Tensor&, int) override { return Unused(); }
  Status AllReduceSum(at::Tensor&) override { return Unused(); }

 private:
  static Status Unused() {
    ADD_FAILURE() << "Create talked to the pipeline group";
    return absl::InternalError("unused");
  }
  int rank_, size_;
};

Status CreateWith(const std::string& model_dir, const config::Config& c, int stage, int stages) {
  TrainerOptions o;
  o.model_dir = model_dir;
  o.config = c;
  o.pp_group = std::make_shared<FakeStages>(stage, stages);
  return Trainer::Create(std::move(o)).status();
}

TEST(PipelineParallelTrainerTest, CreateRefusesBadSplitsAndUnsupportedCombinations) {
  TempDir dir;
  const std::string model_dir = test_util::MakeModelDir(dir, "two-layers", 3);  // 2 layers
  const config::Config c = PpConfig();
  for (int stage = 0; stage < 3; ++stage) {
    Status s = CreateWith(model_dir, c, stage, 3);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(std::string(s.message()).find("pipeline_model_parallel_size = 3 is larger than "
                                            "the model's 2 decoder layers"),
              std::string::npos)
        << s;
  }
  config::Config ppo = c;
  ppo.algorithm.advantage_estimator = "ppo";
  Status critic = CreateWith(model_dir, ppo, 1, 2);
  EXPECT_EQ(critic.code(), absl::StatusCode::kUnimplemented) << critic;
  EXPECT_NE(std::string(critic.message()).find("ppo"), std::string::npos) << critic;

  config::Config mismatch = c;
  mismatch.train.pipeline_model_parallel_size = 4;
  Status sized = CreateWith(model_dir, mismatch, 0, 2);
  EXPECT_EQ(sized.code(), absl::StatusCode::kInvalidArgument) << sized;
  EXPECT_NE(std::string(sized.message()).find("pipeline_model_parallel_size = 4"),
            std::string::npos)
      << sized;

  // A well-formed stage is created without a word to its peers.
  EXPECT_TRUE(CreateWith(model_dir, c, 1, 2).ok());
}

#endif  // SLIME_PP_GPU_TEST

}  // namespace
}  // namespace slime::train
