// The trainer under activation recomputation (train.recompute_granularity / recompute_method /
// recompute_num_layers; model/recompute.h), on the CPU in float32: a GRPO run (KL loss to the
// reference, entropy bonus, clipping; 2 rollouts of 2 optimizer steps of 4 micro-batches) with
// each setting against the same run without recomputation must give bitwise the same raw
// micro-batch gradients of every parameter, the same updated weights and the same metrics:
//   - one rank (actor), and PPO's critic (its decoder recomputes too);
//   - TP=2 with sequence parallelism over real Gloo groups between threads (the collectives
//     inside a recomputed layer are issued again in the backward);
//   - PP=2 × TP=2 (each stage recomputes its own layers; block and uniform per stage);
// and the errors: recompute_num_layers beyond a stage's layers, full without its method.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "multi_rank_harness.h"
#include "slime/comm/process_group.h"
#include "slime/comm/tensor_parallel_group.h"
#include "slime/model/decoder.h"
#include "slime/model/recompute.h"
#include "slime/model/weights.h"
#include "slime/train/critic.h"
#include "slime/train/trainer.h"
#include "trainer_test_util.h"

namespace slime::train {
namespace {

using model::testing::TempDir;
using test_util::MakeBatch;
using test_util::Msg;
using test_util::Replace;

// The tiny Qwen3 (q/k norms, untied) with `layers` layers; a vocabulary of 104 (it splits over
// two TP ranks and holds MakeBatch's ids).
std::string ModelDir(const TempDir& dir, int layers, uint64_t seed = 21) {
  std::string json = model::testing::TinyQwen3ConfigJson();
  Replace(json, "\"num_hidden_layers\": 2", "\"num_hidden_layers\": " + std::to_string(layers));
  Replace(json, "\"vocab_size\": 101", "\"vocab_size\": 104");
  return test_util::MakeModelDirFromJson(dir, "m" + std::to_string(layers), json, seed);
}

struct Setting {
  std::optional<std::string> granularity, method;
  std::optional<int> num_layers;
  std::string Name() const {
    if (!granularity.has_value()) return "none";
    std::string s = *granularity;
    if (method.has_value()) s += " " + *method;
    if (num_layers.has_value()) s += " " + std::to_string(*num_layers);
    return s;
  }
};

const Setting kNone{};
Setting Full(const std::string& method, int n) { return {"full", method, n}; }
const Setting kSelective{"selective", std::nullopt, std::nullopt};

config::Config WithSetting(config::Config c, const Setting& s) {
  c.train.recompute_granularity = s.granularity;
  c.train.recompute_method = s.method;
  c.train.recompute_num_layers = s.num_layers;
  return c;
}

// What a run leaves behind, by HF name (the critic's with a "critic/" prefix).
struct RunResult {
  std::map<std::string, torch::Tensor> grads;    // every raw micro-batch gradient, summed
  std::map<std::string, torch::Tensor> weights;  // after the run
  std::vector<TrainRolloutResult> rollouts;
  // The models' settings (model::RecomputeDescription; the critic's empty without one): that
  // the setting reached the model, which tests/model/recompute_test.cc shows recomputes.
  std::string recompute, critic_recompute;
};

// Hooks adding every gradient a backward delivers to a parameter of `m` into grads[prefix+name]
// (on the thread that runs the backward: the rank's own).
void RecordGradients(const model::DecoderModel& m, const std::string& prefix,
                     std::map<std::string, torch::Tensor>& grads) {
  for (const auto& nt : model::NamedParameters(m.weights(), m.config())) {
    if (!nt.tensor.requires_grad()) continue;
    torch::Tensor& sum = grads[prefix + nt.name];
    sum = torch::zeros(nt.tensor.sizes(), torch::kFloat32);
    nt.tensor.register_hook([&sum](const torch::Tensor& g) { sum.add_(g.detach()); });
  }
}

void AddWeights(const model::DecoderModel& m, const std::string& prefix,
                std::map<std::string, torch::Tensor>& out) {
  for (const auto& nt : model::NamedParameters(m.weights(), m.config())) {
    out[prefix + nt.name] = nt.tensor.detach().clone();
  }
}

// Two rollouts of the model-parallel tests' GRPO config (trainer_test_util.h), or of PPO.
void TrainTwoRollouts(TrainerOptions o, RunResult& r) {
  const data::RolloutBatch batch = MakeBatch(8, 15);
  auto created = Trainer::Create(std::move(o));
  ASSERT_TRUE(created.ok()) << created.status();
  Trainer& t = **created;
  r.recompute = model::RecomputeDescription(t.model().recompute());
  if (t.critic() != nullptr) {
    r.critic_recompute = model::RecomputeDescription(t.critic()->model().recompute());
  }
  RecordGradients(t.model(), "", r.grads);
  if (t.critic() != nullptr) RecordGradients(t.critic()->model(), "critic/", r.grads);
  for (int rollout = 0; rollout < 2; ++rollout) {
    auto result = t.TrainRollout(rollout, batch);
    ASSERT_TRUE(result.ok()) << result.status();
    r.rollouts.push_back(*result);
  }
  AddWeights(t.model(), "", r.weights);
  if (t.critic() != nullptr) {
    AddWeights(t.critic()->model(), "critic/", r.weights);
    r.weights["critic/value_head"] = t.critic()->value_head().detach().clone();
  }
}

void ExpectIdentical(const RunResult& got, const RunResult& want, const std::string& what) {
  ASSERT_EQ(got.grads.size(), want.grads.size()) << what;
  for (const auto& [name, g] : want.grads) {
    ASSERT_EQ(got.grads.count(name), 1u) << what << ": " << name;
    // Every parameter takes part, except the critic's LM head (its function is the value head).
    if (name != "critic/lm_head.weight") {
      EXPECT_GT(g.abs().max().item<double>(), 0.0) << what << ": " << name << " got no gradient";
    }
    EXPECT_TRUE(torch::equal(got.grads.at(name), g))
        << what << ": the gradient of " << name << " differs by "
        << (got.grads.at(name) - g).abs().max().item<double>();
  }
  ASSERT_EQ(got.weights.size(), want.weights.size()) << what;
  for (const auto& [name, w] : want.weights) {
    EXPECT_TRUE(torch::equal(got.weights.at(name), w)) << what << ": weight " << name;
  }
  ASSERT_EQ(got.rollouts.size(), want.rollouts.size()) << what;
  for (size_t r = 0; r < want.rollouts.size(); ++r) {
    ASSERT_EQ(got.rollouts[r].steps.size(), want.rollouts[r].steps.size()) << what;
    for (size_t s = 0; s < want.rollouts[r].steps.size(); ++s) {
      EXPECT_EQ(got.rollouts[r].steps[s].values, want.rollouts[r].steps[s].values)
          << what << ": metrics of rollout " << r << " step " << s;
    }
  }
}

TrainerOptions OneRank(const std::string& model_dir, const config::Config& c) {
  TrainerOptions o;
  o.model_dir = model_dir;
  o.config = c;
  return o;
}

TEST(TrainerRecomputeTest, EverySettingTrainsBitwiseLikeNoRecomputation) {
  TempDir dir;
  const std::string model_dir = ModelDir(dir, 3);
  const config::Config base = test_util::ModelParallelConfig();
  RunResult want;
  TrainTwoRollouts(OneRank(model_dir, WithSetting(base, kNone)), want);
  ASSERT_FALSE(HasFailure());
  // The run is not trivial: clipping was active.
  EXPECT_GT(test_util::Value(want.rollouts[0].steps[0], "grad_norm"), base.train.clip_grad);
  for (const Setting& s : {Full("uniform", 1), Full("uniform", 2), Full("uniform", 3),
                           Full("block", 1), Full("block", 3), kSelective}) {
    RunResult got;
    TrainTwoRollouts(OneRank(model_dir, WithSetting(base, s)), got);
    EXPECT_EQ(got.recompute, s.Name());
    ExpectIdentical(got, want, s.Name());
  }
}

TEST(TrainerRecomputeTest, ThePpoCriticRecomputesToo) {
  TempDir dir;
  const std::string model_dir = ModelDir(dir, 2);
  config::Config base = test_util::BaseConfig();
  base.algorithm.advantage_estimator = "ppo";
  base.algorithm.value_clip = 0.2;
  base.train.critic_lr = 1e-3;
  base.train.micro_batch_size = 1;
  RunResult want;
  TrainTwoRollouts(OneRank(model_dir, WithSetting(base, kNone)), want);
  ASSERT_FALSE(HasFailure());
  ASSERT_EQ(want.weights.count("critic/value_head"), 1u);
  for (const Setting& s : {Full("uniform", 1), Full("block", 1), kSelective}) {
    RunResult got;
    TrainTwoRollouts(OneRank(model_dir, WithSetting(base, s)), got);
    EXPECT_EQ(got.recompute, s.Name());
    EXPECT_EQ(got.critic_recompute, s.Name());
    ExpectIdentical(got, want, "ppo, " + s.Name());
  }
}

TEST(TrainerRecomputeTest, BadSettingsAreRefusedNamingTheKey) {
  TempDir dir;
  const std::string model_dir = ModelDir(dir, 2);
  const config::Config base = test_util::ModelParallelConfig();
  auto refused = [&](const Setting& s) {
    auto t = Trainer::Create(OneRank(model_dir, WithSetting(base, s)));
    EXPECT_FALSE(t.ok()) << s.Name();
    return t.ok() ? std::string() : Msg(t.status());
  };
  EXPECT_EQ(refused(Full("block", 3)),
            "trainer: train.recompute_num_layers = 3 is not within 1..2, the layers of pipeline "
            "stage 0 of 1 (layers [0, 2))");
  EXPECT_EQ(refused({"full", std::nullopt, 1}),
            "trainer: train.recompute_granularity: full needs train.recompute_method (uniform or "
            "block) and train.recompute_num_layers");
  EXPECT_EQ(refused({"selective", "uniform", std::nullopt}),
            "trainer: train.recompute_method and train.recompute_num_layers apply only to "
            "train.recompute_granularity: full");
  EXPECT_EQ(refused({"partial", std::nullopt, std::nullopt}),
            "trainer: train.recompute_granularity = \"partial\" is not valid (valid: full, "
            "selective)");
  // The critic checks its own model the same way.
  CriticOptions co;
  co.model_dir = model_dir;
  co.config = WithSetting(base, Full("uniform", 5));
  auto critic = Critic::Create(co);
  ASSERT_FALSE(critic.ok());
  EXPECT_EQ(Msg(critic.status()),
            "critic: train.recompute_num_layers = 5 is not within 1..2, the layers of pipeline "
            "stage 0 of 1 (layers [0, 2))");
}

// ---- Model parallelism over real Gloo groups between threads (multi_rank_harness.h)

// PP × TP ranks (rank = tp_rank · PP + stage), each running body(rank, options with its
// groups).
void OnGrid(int pp, int tp, const std::string& name,
            const std::function<void(int, TrainerOptions)>& body) {
  const int world = pp * tp;
  std::vector<std::vector<int>> pp_groups(tp), tp_groups(pp);
  for (int t = 0; t < tp; ++t) {
    for (int s = 0; s < pp; ++s) {
      pp_groups[t].push_back(t * pp + s);
      tp_groups[s].push_back(t * pp + s);
    }
  }
  using test_util::RankGroups;
  const RankGroups pp_pgs =
      pp > 1 ? test_util::MakeGroups(world, pp_groups, name + "-pp") : RankGroups(world);
  const RankGroups tp_pgs =
      tp > 1 ? test_util::MakeGroups(world, tp_groups, name + "-tp") : RankGroups(world);
  ASSERT_EQ(pp_pgs.size(), static_cast<size_t>(world));
  ASSERT_EQ(tp_pgs.size(), static_cast<size_t>(world));
  test_util::RunRanks(world, [&](int rank) {
    TrainerOptions o;
    if (pp > 1) {
      o.pp_group = std::make_shared<comm::ProcessGroupPipelineParallel>(pp_pgs[rank].at(0));
    }
    if (tp > 1) {
      o.tp_group = std::make_shared<comm::ProcessGroupTensorParallel>(tp_pgs[rank].at(0));
    }
    body(rank, std::move(o));
  });
}

// On every rank of the grid: the run without recomputation, then one per setting on the same
// groups, each compared bitwise with the first.
void ExpectGridMatches(int pp, int tp, int layers, const std::vector<Setting>& settings) {
  TempDir dir;
  const std::string model_dir = ModelDir(dir, layers);
  config::Config base = test_util::ModelParallelConfig();
  base.train.sequence_parallel = tp > 1;
  OnGrid(pp, tp, "recompute", [&](int rank, TrainerOptions groups) {
    auto options = [&](const Setting& s) {
      TrainerOptions o = groups;
      o.model_dir = model_dir;
      o.config = WithSetting(base, s);
      return o;
    };
    RunResult want;
    TrainTwoRollouts(options(kNone), want);
    ASSERT_FALSE(want.grads.empty());
    for (const Setting& s : settings) {
      RunResult got;
      TrainTwoRollouts(options(s), got);
      EXPECT_EQ(got.recompute, s.Name()) << "rank " << rank;
      ExpectIdentical(got, want, "rank " + std::to_string(rank) + ", " + s.Name());
    }
  });
}

TEST(TrainerRecomputeTest, TwoTensorParallelRanksWithSequenceParallelism) {
  ExpectGridMatches(1, 2, 3, {Full("uniform", 2), Full("block", 1), kSelective});
}

TEST(TrainerRecomputeTest, TwoStagesTimesTwoTensorParallelRanks) {
  // 4 layers: each stage holds 2.
  ExpectGridMatches(2, 2, 4, {Full("uniform", 1), Full("uniform", 2), Full("block", 1), kSelective});
}

TEST(TrainerRecomputeTest, NumLayersBeyondAStageIsRefusedOnEveryStage) {
  TempDir dir;
  const std::string model_dir = ModelDir(dir, 4);
  OnGrid(2, 1, "recompute-refused", [&](int rank, TrainerOptions o) {
    o.model_dir = model_dir;
    o.config = WithSetting(test_util::ModelParallelConfig(), Full("block", 3));
    auto t = Trainer::Create(std::move(o));
    ASSERT_FALSE(t.ok()) << "rank " << rank;
    const std::string layers = rank == 0 ? "[0, 2)" : "[2, 4)";
    EXPECT_EQ(Msg(t.status()),
              "trainer: train.recompute_num_layers = 3 is not within 1..2, the layers of "
              "pipeline stage " +
                  std::to_string(rank) + " of 2 (layers " + layers + ")");
  });
}

}  // namespace
}  // namespace slime::train
