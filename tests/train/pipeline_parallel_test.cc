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
//     DP=2;
//   - a PP=2 checkpoint loads at PP=1 (weights bit for bit, AdamW moments: the continuation
//     tracks the run that stayed at PP=1) and a PP=1 checkpoint at PP=2;
//   - Create's refusals: fewer layers than stages, PP × TP, PP × PPO.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "multi_rank_harness.h"
#include "slime/comm/process_group.h"
#include "slime/comm/tensor_parallel_group.h"
#include "slime/model/decoder.h"
#include "slime/model/pipeline_parallel.h"
#include "slime/model/weights.h"
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

// The tiny Qwen3 (untied, q/k norms) with 4 layers, or the tiny Qwen2 (tied embeddings, q/k/v
// biases) with 2 layers, as an HF directory with random float32 weights.
std::string MakePpModelDir(const TempDir& dir, uint64_t seed, bool tied = false) {
  std::string json =
      tied ? model::testing::TinyQwen2ConfigJson() : model::testing::TinyQwen3ConfigJson();
  if (!tied) Replace(json, "\"num_hidden_layers\": 2", "\"num_hidden_layers\": 4");
  if (tied) Replace(json, "\"vocab_size\": 97", "\"vocab_size\": 101");  // MakeBatch's ids
  return test_util::MakeModelDirFromJson(dir, tied ? "tied" : "m", json, seed);
}

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

// ---- the trainer over Gloo groups

// Runs body(rank, options) on a PP × DP grid of threads (global rank = dp * pp + stage):
// pipeline groups share a DP index, DP groups a stage (multi_rank_harness.h).
void OnGrid(int pp, int dp, const std::string& model_dir, const config::Config& c,
            const std::function<void(int, TrainerOptions)>& body) {
  RunGrid(pp, dp, "pp", [&](const GridRank& g) {
    TrainerOptions o;
    o.model_dir = model_dir;
    o.config = c;
    o.pp_group = std::make_shared<comm::ProcessGroupPipelineParallel>(g.mp);
    WireDataParallel(g, o);
    body(g.rank, std::move(o));
  });
}

// GRPO with a KL loss to the reference (a forward-only pass through the pipeline), an entropy
// bonus, advantage whitening and clipping by the global gradient norm; 8 samples, 2 optimizer
// steps of 4 micro-batches per rollout (trainer_test_util.h).
config::Config PpConfig() { return test_util::ModelParallelConfig(); }

struct StageResult {
  std::vector<TrainRolloutResult> rollouts;
  std::map<std::string, torch::Tensor> weights;  // this stage's, by HF name
  SampleLogProbs log_probs;                      // ComputeLogProbs after training
};

std::map<std::string, torch::Tensor> WeightsByName(const Trainer& t) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& nt : model::NamedParameters(t.model().weights(), t.model().config())) {
    out[nt.name] = nt.tensor.detach().clone();
  }
  return out;
}

// A PP × DP run against the single-process trainer.
void ExpectMatchesOneStage(int pp, int dp, bool tied) {
  TempDir dir;
  const std::string model_dir = MakePpModelDir(dir, 14, tied);
  const config::Config c = PpConfig();
  const RolloutBatch batch = MakeBatch(8, 15);
  constexpr int kRollouts = 2;

  auto single = test_util::MakeTrainer(model_dir, c);
  ASSERT_NE(single, nullptr);
  std::vector<TrainRolloutResult> want;
  for (int r = 0; r < kRollouts; ++r) want.push_back(Train(*single, r, batch));
  const std::map<std::string, torch::Tensor> want_weights = WeightsByName(*single);
  const SampleLogProbs want_lp = test_util::LogProbs(*single, batch);
  ASSERT_EQ(want.size(), static_cast<size_t>(kRollouts));
  ASSERT_FALSE(want[0].steps.empty());
  // The run is not trivial: clipping was active and there were several micro-batches per step.
  EXPECT_GT(test_util::Value(want[0].steps[0], "grad_norm"), c.train.clip_grad);

  std::vector<StageResult> got(pp * dp);
  OnGrid(pp, dp, model_dir, c, [&](int rank, TrainerOptions o) {
    auto trainer = Trainer::Create(std::move(o));
    ASSERT_TRUE(trainer.ok()) << "rank " << rank << ": " << trainer.status();
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

  constexpr double kTol = 2e-5;
  for (int rank = 0; rank < pp * dp; ++rank) {
    ASSERT_EQ(got[rank].rollouts.size(), static_cast<size_t>(kRollouts)) << rank;
    // Every stage reports the step's metrics (the loss ones come from the last stage).
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
    // Forward-only log-probs through the pipeline, the same on every stage.
    ASSERT_EQ(got[rank].log_probs.log_probs.size(), want_lp.log_probs.size());
    for (size_t i = 0; i < want_lp.log_probs.size(); ++i) {
      ExpectClose(got[rank].log_probs.log_probs[i], want_lp.log_probs[i],
                  "log-probs of sample " + std::to_string(i) + " at rank " + std::to_string(rank),
                  kTol);
    }
  }
  // Weights: the stages of each DP rank together hold every parameter, equal to the one-stage
  // run's (the tied copy on the last stage equal to the first stage's table).
  for (int d = 0; d < dp; ++d) {
    std::map<std::string, int> seen;
    for (int s = 0; s < pp; ++s) {
      for (const auto& [name, w] : got[d * pp + s].weights) {
        ++seen[name];
        ASSERT_EQ(want_weights.count(name), 1u) << name;
        ExpectClose(w, want_weights.at(name), name + " at dp " + std::to_string(d) + " stage " +
                                                  std::to_string(s),
                    kTol);
      }
    }
    for (const auto& [name, w] : want_weights) {
      const bool table = name == "model.embed_tokens.weight";
      EXPECT_EQ(seen[name], tied && table ? 2 : 1) << name;
    }
    if (tied) {
      EXPECT_TRUE(torch::equal(got[d * pp].weights.at("model.embed_tokens.weight"),
                               got[d * pp + pp - 1].weights.at("model.embed_tokens.weight")))
          << "the tied copies drifted apart";
    }
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

TEST(PipelineParallelTrainerTest, TwoStagesMatchOneStage) { ExpectMatchesOneStage(2, 1, false); }

TEST(PipelineParallelTrainerTest, ThreeStagesMatchOneStage) { ExpectMatchesOneStage(3, 1, false); }

TEST(PipelineParallelTrainerTest, TwoStagesWithTiedEmbeddingsMatchOneStage) {
  ExpectMatchesOneStage(2, 1, true);
}

TEST(PipelineParallelTrainerTest, TwoStagesTimesTwoDataParallelMatchOneStage) {
  ExpectMatchesOneStage(2, 2, false);
}

// A checkpoint saved at PP=2 (gathered to stage 0, written as one model) loads at PP=1 with the
// weights bit for bit and the AdamW state (the continuation tracks the run that stayed at PP=1);
// a PP=1 checkpoint loads at PP=2.
TEST(PipelineParallelTrainerTest, CheckpointsMoveBetweenPipelineSizes) {
  TempDir dir;
  const std::string model_dir = MakePpModelDir(dir, 21);
  const config::Config c = PpConfig();
  const RolloutBatch batch = MakeBatch(8, 22);
  const std::string at_pp1 = dir.Join("save-pp1"), at_pp2 = dir.Join("save-pp2");

  auto a = test_util::MakeTrainer(model_dir, c);
  ASSERT_NE(a, nullptr);
  Train(*a, 0, batch);
  ASSERT_TRUE(a->Save(at_pp1, 0).ok());
  const auto a_after_0 = WeightsByName(*a);

  std::vector<std::map<std::string, torch::Tensor>> loaded(2), trained(2);
  OnGrid(2, 1, model_dir, c, [&](int rank, TrainerOptions o) {
    auto t = Trainer::Create(std::move(o));
    ASSERT_TRUE(t.ok()) << t.status();
    auto state = (*t)->Load(at_pp1);
    ASSERT_TRUE(state.ok()) << "stage " << rank << ": " << state.status();
    EXPECT_EQ(state->step, 2);
    EXPECT_TRUE(state->optimizer_loaded);
    loaded[rank] = WeightsByName(**t);
    auto r = (*t)->TrainRollout(1, batch);
    ASSERT_TRUE(r.ok()) << r.status();
    trained[rank] = WeightsByName(**t);
    auto saved = (*t)->Save(at_pp2, 1);
    ASSERT_TRUE(saved.ok()) << "stage " << rank << ": " << saved.status();
  });
  for (const auto& stage : loaded) {
    for (const auto& [name, w] : stage) {
      EXPECT_TRUE(torch::equal(w, a_after_0.at(name))) << name;
    }
  }

  Train(*a, 1, batch);
  auto b = test_util::MakeTrainer(model_dir, c);
  ASSERT_NE(b, nullptr);
  auto state = b->Load(at_pp2);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->step, 4);
  EXPECT_TRUE(state->optimizer_loaded);
  const auto b_weights = WeightsByName(*b);
  const auto a_after_1 = WeightsByName(*a);
  size_t checked = 0;
  for (const auto& stage : trained) {
    for (const auto& [name, w] : stage) {
      EXPECT_TRUE(torch::equal(b_weights.at(name), w)) << name;
      ExpectClose(b_weights.at(name), a_after_1.at(name), name + " after rollout 1", 2e-5);
      ++checked;
    }
  }
  EXPECT_EQ(checked, b_weights.size());
  // One more rollout on both: equal only if the AdamW moments crossed the PP=2 checkpoint.
  Train(*a, 2, batch);
  Train(*b, 2, batch);
  const auto a2 = WeightsByName(*a), b2 = WeightsByName(*b);
  for (const auto& [name, w] : a2) ExpectClose(b2.at(name), w, name + " after rollout 2", 4e-5);
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

class FakeTensorParallel final : public model::TensorParallelGroup {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  void AllReduceSum(at::Tensor&) override { ADD_FAILURE() << "unused"; }
  at::Tensor AllGather(const at::Tensor& t, int64_t) override { return t; }
};

Status CreateWith(const std::string& model_dir, const config::Config& c, int stage, int stages,
                  bool tp = false) {
  TrainerOptions o;
  o.model_dir = model_dir;
  o.config = c;
  o.pp_group = std::make_shared<FakeStages>(stage, stages);
  if (tp) o.tp_group = std::make_shared<FakeTensorParallel>();
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
  Status tp = CreateWith(model_dir, c, 0, 2, /*tp=*/true);
  EXPECT_EQ(tp.code(), absl::StatusCode::kUnimplemented) << tp;
  EXPECT_NE(std::string(tp.message()).find("tensor parallelism"), std::string::npos) << tp;

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

}  // namespace
}  // namespace slime::train
