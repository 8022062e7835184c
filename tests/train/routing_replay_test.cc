// Routing replay in the trainer (src/train/routing_replay.h; docs/algorithms.md, "Routing
// replay"). The "engine" is the tiny Qwen3-MoE with its routers perturbed, so it routes some
// tokens elsewhere than the trainer's unperturbed model; its routing and log-probs go into the
// batch as a rollout would put them. Then:
//   * R3 (use_rollout_routing_replay): every trainer forward routes each token exactly as the
//     engine did (the model's capture of the trainer's forward equals the batch's routing);
//   * replay off, the routes differ somewhere, routing_agreement (rollout.return_routed_experts)
//     is what a direct count gives, and train_rollout_logprob_abs_diff is larger than with R3;
//   * a dense model refuses both keys, naming them; a sample of the wrong routing size is
//     refused naming the sizes.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "slime/model/decoder.h"
#include "trainer_test_util.h"

namespace slime::train {
namespace {

using test_util::BaseConfig;
using test_util::MakeBatch;
using test_util::MakeModelDir;
using test_util::MakeModelDirFromJson;
using test_util::MakeTrainer;
using test_util::TempDir;

std::string TinyMoeJson() {
  std::ifstream in(std::string(SLIME_TRAIN_TEST_DATA_DIR) + "/model/configs/qwen3-moe-tiny.json");
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// One micro-batch of all 4 samples (so the model's last capture covers every token).
config::Config ReplayConfig() {
  config::Config c = BaseConfig();
  c.train.micro_batch_size = 4;
  return c;
}

// The engine: the model of `dir` with every router's weights moved by noise of `scale`.
std::unique_ptr<model::DecoderModel> PerturbedEngine(const std::string& dir, double scale) {
  auto loaded = model::DecoderModel::Load(dir, torch::kFloat32, torch::kCPU);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  torch::NoGradGuard no_grad;
  torch::manual_seed(17);
  for (const model::NamedTensor& nt :
       model::NamedParameters((*loaded)->weights(), (*loaded)->config())) {
    if (nt.name.find(".mlp.gate.weight") == std::string::npos) continue;
    nt.tensor.add_(torch::randn_like(nt.tensor) * scale * nt.tensor.abs().mean());
  }
  return std::move(*loaded);
}

// Each sample as the engine would return it: routing of its tokens but the last
// ([len − 1, layers, k] int32) and the log-probs of its response tokens at batch.temperature.
void GenerateWithEngine(model::DecoderModel& engine, data::RolloutBatch& batch) {
  torch::NoGradGuard no_grad;
  const int64_t layers = engine.config().num_hidden_layers;
  const int64_t k = engine.config().moe.num_experts_per_tok;
  engine.set_capture_routed_experts(true);
  for (data::TrainSample& s : batch.samples) {
    const int64_t len = static_cast<int64_t>(s.tokens.size());
    const torch::Tensor ids = torch::tensor(s.tokens, torch::kInt).to(torch::kLong);
    auto hidden = engine.ForwardPacked(ids, {0, len});
    ASSERT_TRUE(hidden.ok()) << hidden.status();
    std::vector<torch::Tensor> per_layer;
    for (const torch::Tensor& r : engine.routed_experts())
      per_layer.push_back(r.narrow(0, 0, len - 1));
    const torch::Tensor table = torch::stack(per_layer, 1).to(torch::kInt).contiguous();
    s.rollout_routed_experts.assign(table.data_ptr<int32_t>(),
                                    table.data_ptr<int32_t>() + table.numel());
    s.routed_experts_per_token = layers * k;
    auto logits = engine.Logits(*hidden);
    ASSERT_TRUE(logits.ok()) << logits.status();
    const torch::Tensor lp = torch::log_softmax(*logits / batch.temperature, -1);
    s.rollout_log_probs.clear();
    for (int64_t j = 0; j < s.response_length; ++j) {
      const int64_t pos = s.prompt_length + j - 1;
      s.rollout_log_probs.push_back(lp[pos][s.tokens[pos + 1]].item<float>());
    }
  }
  engine.set_capture_routed_experts(false);
}

// The trainer model's last capture ([T_pad, k] per layer, samples packed in order) against each
// sample's engine rows: (slots agreeing, all slots, rows identical).
struct Comparison {
  double matches = 0, slots = 0;
  bool identical = true;
};
Comparison Compare(const std::vector<torch::Tensor>& captured, const data::RolloutBatch& batch,
                   int64_t layers, int64_t k) {
  Comparison c;
  int64_t total = 0;
  for (const data::TrainSample& s : batch.samples) total += static_cast<int64_t>(s.tokens.size());
  if (captured.empty() || !captured[0].defined() || captured[0].size(0) < total) {
    ADD_FAILURE() << "the capture does not hold the whole batch (one micro-batch expected)";
    c.identical = false;
    return c;
  }
  int64_t offset = 0;
  for (const data::TrainSample& s : batch.samples) {
    const int64_t rows = static_cast<int64_t>(s.tokens.size()) - 1;
    const torch::Tensor engine = torch::tensor(s.rollout_routed_experts, torch::kInt)
                                     .to(torch::kLong)
                                     .reshape({rows, layers, k});
    for (int64_t l = 0; l < layers; ++l) {
      const torch::Tensor got = captured[l].narrow(0, offset, rows);
      const torch::Tensor want = engine.select(1, l);
      c.identical = c.identical && torch::equal(got, want);
      c.matches += (want.unsqueeze(2) == got.unsqueeze(1)).any(2).sum().item<double>();
      c.slots += static_cast<double>(rows * k);
    }
    offset += rows + 1;
  }
  return c;
}

struct TrainedRun {
  double abs_diff = 0;
  std::optional<double> agreement;
  Comparison routes;
};

// One TrainRollout of `batch` on a fresh trainer of `dir`, the model capturing its routing.
TrainedRun TrainOnce(const std::string& dir, const config::Config& c,
                     const data::RolloutBatch& batch) {
  TrainedRun run;
  auto trainer = MakeTrainer(dir, c);
  if (trainer == nullptr) return run;
  model::DecoderModel& m = trainer->model();
  m.set_capture_routed_experts(true);
  // The forward-only pass first (the capture survives the pass: reset only turns it off).
  auto lps = trainer->ComputeLogProbs(batch, PolicyWeights::kActor, false);
  EXPECT_TRUE(lps.ok()) << lps.status();
  run.routes = Compare(m.routed_experts(), batch, m.config().num_hidden_layers,
                       m.config().moe.num_experts_per_tok);
  auto r = trainer->TrainRollout(0, batch);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return run;
  const auto& v = r->steps.at(0).values;
  run.abs_diff = v.at("train_rollout_logprob_abs_diff");
  if (v.count("routing_agreement")) run.agreement = v.at("routing_agreement");
  return run;
}

TEST(RoutingReplayTrainerTest, RolloutReplayFollowsTheEngineAndShrinksTheLogProbGap) {
  TempDir tmp;
  const std::string dir = MakeModelDirFromJson(tmp, "moe", TinyMoeJson(), 31);
  data::RolloutBatch batch = MakeBatch(4, 5);
  auto engine = PerturbedEngine(dir, 0.5);
  GenerateWithEngine(*engine, batch);

  config::Config r3 = ReplayConfig();
  r3.algorithm.use_rollout_routing_replay = true;
  r3.algorithm.use_routing_replay = true;  // what the config check resolves it to
  const TrainedRun replayed = TrainOnce(dir, r3, batch);
  EXPECT_TRUE(replayed.routes.identical) << "the trainer's forward did not route as the engine";
  EXPECT_EQ(replayed.routes.matches, replayed.routes.slots);
  EXPECT_FALSE(replayed.agreement.has_value());  // replayed: nothing to measure

  config::Config off = ReplayConfig();
  off.rollout.return_routed_experts = true;  // routing carried, not replayed: measured
  const TrainedRun own = TrainOnce(dir, off, batch);
  EXPECT_FALSE(own.routes.identical) << "the perturbation moved no route; raise its scale";
  ASSERT_TRUE(own.agreement.has_value());
  EXPECT_NEAR(*own.agreement, own.routes.matches / own.routes.slots, 1e-12);
  EXPECT_LT(*own.agreement, 1.0);
  EXPECT_GT(*own.agreement, 0.0);

  // Replaying the engine's routing leaves only the routers' weights at those experts different.
  EXPECT_LT(replayed.abs_diff, own.abs_diff)
      << "R3 " << replayed.abs_diff << " vs own routing " << own.abs_diff;
}

// A smoke test: use_routing_replay alone records in the old-log-prob pass (two steps, so it
// runs) and the training forwards replay it without error.
TEST(RoutingReplayTrainerTest, RecordedReplayTrainsTwoSteps) {
  TempDir tmp;
  const std::string dir = MakeModelDirFromJson(tmp, "moe", TinyMoeJson(), 32);
  data::RolloutBatch batch = MakeBatch(8, 6);
  config::Config c = ReplayConfig();
  c.algorithm.use_routing_replay = true;
  c.train.global_batch_size = 4;
  auto trainer = MakeTrainer(dir, c);
  ASSERT_NE(trainer, nullptr);
  auto r = trainer->TrainRollout(0, batch);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->steps.size(), 2u);
  EXPECT_NEAR(r->steps[0].values.at("ppo_kl"), 0.0, 1e-6);
}

TEST(RoutingReplayTrainerTest, BadRoutingAndDenseModelsAreRefused) {
  TempDir tmp;
  const std::string moe = MakeModelDirFromJson(tmp, "moe", TinyMoeJson(), 33);
  data::RolloutBatch batch = MakeBatch(4, 7);
  auto engine = PerturbedEngine(moe, 0.0);
  GenerateWithEngine(*engine, batch);
  batch.samples[2].routed_experts_per_token = 3;
  config::Config c = ReplayConfig();
  c.algorithm.use_rollout_routing_replay = true;
  auto trainer = MakeTrainer(moe, c);
  ASSERT_NE(trainer, nullptr);
  auto r = trainer->TrainRollout(0, batch);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("sample 2"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("layers × top_k"), std::string::npos) << r.status();

  // A sample without routing cannot be replayed.
  data::RolloutBatch missing = MakeBatch(4, 7);
  auto r2 = trainer->TrainRollout(0, missing);
  ASSERT_FALSE(r2.ok());
  EXPECT_NE(r2.status().message().find("carries no routing"), std::string::npos) << r2.status();

  const std::string dense = MakeModelDir(tmp, "dense", 34);
  for (const char* key : {"algorithm.use_rollout_routing_replay", "algorithm.use_routing_replay",
                          "rollout.return_routed_experts"}) {
    config::Config d = ReplayConfig();
    const std::string k = key;
    if (k == "algorithm.use_routing_replay") d.algorithm.use_routing_replay = true;
    if (k == "algorithm.use_rollout_routing_replay") d.algorithm.use_rollout_routing_replay = true;
    if (k == "rollout.return_routed_experts") d.rollout.return_routed_experts = true;
    TrainerOptions o;
    o.model_dir = dense;
    o.config = d;
    auto t = Trainer::Create(o);
    ASSERT_FALSE(t.ok()) << key;
    EXPECT_NE(t.status().message().find(k), std::string::npos) << t.status();
  }

  // sft_loss trains on dataset samples: nothing to replay.
  config::Config sft = ReplayConfig();
  sft.algorithm.loss_type = "sft_loss";
  sft.algorithm.use_routing_replay = true;
  TrainerOptions so;
  so.model_dir = moe;
  so.config = sft;
  auto st = Trainer::Create(so);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find("algorithm.use_routing_replay"), std::string::npos)
      << st.status();
}

}  // namespace
}  // namespace slime::train
