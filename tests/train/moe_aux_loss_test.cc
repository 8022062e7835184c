// The MoE router losses (train/moe_aux_loss.h): the per-layer formula against a direct
// computation, a trainer step on the tiny Qwen3-MoE model against the gradient and metric
// computed here from the model's captured router logits (with and without activation
// recomputation), and the refusal of a coefficient on a dense model.
#include "slime/train/moe_aux_loss.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <fstream>
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
using test_util::Msg;
using test_util::TempDir;

// E · Σ_e f_e · P_e written out with loops over plain numbers (no top-k, no one-hot).
double DirectAux(const torch::Tensor& logits, int64_t k) {
  const torch::Tensor l = logits.detach().to(torch::kFloat64).contiguous();
  const int64_t t = l.size(0), e = l.size(1);
  std::vector<double> slots(e, 0.0), prob(e, 0.0);
  for (int64_t i = 0; i < t; ++i) {
    std::vector<double> p(e);
    double mx = -1e300, sum = 0;
    for (int64_t j = 0; j < e; ++j) mx = std::max(mx, l[i][j].item<double>());
    for (int64_t j = 0; j < e; ++j) sum += p[j] = std::exp(l[i][j].item<double>() - mx);
    for (int64_t j = 0; j < e; ++j) {
      p[j] /= sum;
      prob[j] += p[j] / t;
    }
    // The k largest (first index on ties).
    std::vector<bool> taken(e, false);
    for (int64_t r = 0; r < k; ++r) {
      int64_t best = -1;
      for (int64_t j = 0; j < e; ++j) {
        if (!taken[j] && (best < 0 || p[j] > p[best])) best = j;
      }
      taken[best] = true;
      slots[best] += 1.0 / static_cast<double>(t * k);
    }
  }
  double aux = 0;
  for (int64_t j = 0; j < e; ++j) aux += slots[j] * prob[j];
  return static_cast<double>(e) * aux;
}

TEST(RouterLoadBalanceTest, MatchesTheDirectFormula) {
  torch::manual_seed(3);
  const torch::Tensor logits = torch::randn({13, 6}) * 2.0;
  const RouterBalance b = RouterLoadBalance(logits, 2);
  EXPECT_NEAR(b.aux.item<double>(), DirectAux(logits, 2), 1e-5);
  // z = mean_t (log Σ_e exp(l_te))².
  double z = 0;
  for (int64_t i = 0; i < 13; ++i) {
    double s = 0;
    for (int64_t j = 0; j < 6; ++j) s += std::exp(logits[i][j].item<double>());
    z += std::log(s) * std::log(s) / 13.0;
  }
  EXPECT_NEAR(b.z.item<double>(), z, 1e-4);
  EXPECT_NEAR(b.fraction.sum().item<double>(), 1.0, 1e-6);

  // Perfect balance: every expert gets the same slots and probability -> aux = 1.
  const torch::Tensor uniform = torch::eye(4).repeat({3, 1}) * 5.0;  // token i prefers i % 4
  EXPECT_NEAR(RouterLoadBalance(uniform, 1).aux.item<double>(), 1.0, 1e-6);
}

TEST(RouterLoadBalanceTest, GradientReachesTheLogits) {
  torch::manual_seed(4);
  const torch::Tensor logits = torch::randn({9, 5}).requires_grad_(true);
  RouterBalance b = RouterLoadBalance(logits, 2);
  (b.aux + b.z).backward();
  ASSERT_TRUE(logits.grad().defined());
  EXPECT_GT(logits.grad().abs().max().item<double>(), 0.0);
}

TEST(AttachLossTest, AddsTheLossGradientOnce) {
  const torch::Tensor w = torch::tensor({2.0}).requires_grad_(true);
  const torch::Tensor x = torch::ones({3}) * w;
  const torch::Tensor y = AttachLoss(x, (w * w * 5.0).sum());  // d/dw 5w² = 20
  EXPECT_TRUE(torch::equal(y, x));
  y.sum().backward();  // d/dw 3w = 3
  EXPECT_NEAR(w.grad().item<double>(), 23.0, 1e-6);
}

// ---- Trainer

std::string TinyMoeJson() {
  std::ifstream in(std::string(SLIME_TRAIN_TEST_DATA_DIR) + "/model/configs/qwen3-moe-tiny.json");
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Rewards 0: the policy loss has no gradient (its advantages are 0), so the routers' gradient
// is the router loss's alone. One micro-batch of 4 samples, padded (data_pad_size_multiplier).
config::Config MoeConfig(double coeff) {
  config::Config c = BaseConfig();
  c.train.micro_batch_size = 4;
  c.train.only_train_params_name_list = {"\\.mlp\\.gate\\.weight$"};
  c.train.clip_grad = 0.0;
  c.train.moe_aux_loss_coeff = coeff;
  return c;
}

data::RolloutBatch ZeroRewardBatch() {
  data::RolloutBatch b = MakeBatch(4, 11);
  for (data::TrainSample& s : b.samples) s.reward = 0.0;
  return b;
}

struct Expected {
  double aux_metric = 0;   // mean over the sparse layers of aux_l
  double router_norm = 0;  // ‖∇_routers Σ_l aux_l‖ (coefficient 1)
  std::vector<double> imbalance;
};

// The model of `dir` forwarded on the batch's samples (packed, no padding) with its router
// logits captured: the aux terms by DirectAux and the gradient of their sum.
Expected ComputeExpected(const std::string& dir, const data::RolloutBatch& batch) {
  auto loaded = model::DecoderModel::Load(dir, torch::kFloat32, torch::kCPU);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  model::DecoderModel& m = **loaded;
  for (const model::NamedTensor& nt : model::NamedParameters(m.weights(), m.config())) {
    nt.tensor.set_requires_grad(true);
  }
  std::vector<int64_t> ids, cu{0};
  for (const data::TrainSample& s : batch.samples) {
    ids.insert(ids.end(), s.tokens.begin(), s.tokens.end());
    cu.push_back(static_cast<int64_t>(ids.size()));
  }
  m.set_capture_router_logits(true);
  auto hidden = m.ForwardPacked(torch::tensor(ids, torch::kLong), cu);
  EXPECT_TRUE(hidden.ok()) << hidden.status();
  const int64_t k = m.config().moe.num_experts_per_tok, e = m.config().moe.num_experts;
  Expected want;
  torch::Tensor total = torch::zeros({});
  int layers = 0;
  for (const torch::Tensor& logits : m.router_logits()) {
    if (!logits.defined()) continue;
    EXPECT_EQ(logits.size(0), static_cast<int64_t>(ids.size()));
    ++layers;
    want.aux_metric += DirectAux(logits, k);
    const RouterBalance b = RouterLoadBalance(logits, k);
    want.imbalance.push_back(b.fraction.max().item<double>() * e);
    total = total + b.aux;
  }
  EXPECT_EQ(layers, 2);
  want.aux_metric /= layers;
  total.backward();
  double sq = 0;
  for (const model::NamedTensor& nt : model::NamedParameters(m.weights(), m.config())) {
    if (nt.name.find(".mlp.gate.weight") == std::string::npos) continue;
    sq += nt.tensor.grad().pow(2).sum().item<double>();
  }
  want.router_norm = std::sqrt(sq);
  return want;
}

TEST(MoeAuxLossTrainerTest, RouterGradientAndMetricsMatchTheCapturedLogits) {
  TempDir tmp;
  const std::string dir = MakeModelDirFromJson(tmp, "moe", TinyMoeJson(), 21);
  const data::RolloutBatch batch = ZeroRewardBatch();
  const Expected want = ComputeExpected(dir, batch);
  ASSERT_GT(want.router_norm, 0.0);

  // Coefficient 0: no router loss, no gradient (the policy loss has none), no MoE metric.
  auto off = MakeTrainer(dir, MoeConfig(0.0));
  ASSERT_NE(off, nullptr);
  auto r0 = off->TrainRollout(0, batch);
  ASSERT_TRUE(r0.ok()) << r0.status();
  ASSERT_EQ(r0->steps.size(), 1u);
  EXPECT_EQ(r0->steps[0].values.at("grad_norm"), 0.0);
  EXPECT_EQ(r0->steps[0].values.count("moe_aux_loss"), 0u);

  const double coeff = 0.5;
  for (const bool recompute : {false, true}) {
    SCOPED_TRACE(recompute ? "full recompute, uniform 1" : "no recompute");
    config::Config c = MoeConfig(coeff);
    if (recompute) {
      c.train.recompute_granularity = "full";
      c.train.recompute_method = "uniform";
      c.train.recompute_num_layers = 1;
    }
    auto on = MakeTrainer(dir, c);
    ASSERT_NE(on, nullptr);
    auto r = on->TrainRollout(0, batch);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->steps.size(), 1u);
    const std::map<std::string, double>& v = r->steps[0].values;
    // Gradient = coeff · ∇ Σ_l aux_l (one micro-batch: weight 1; padding excluded).
    EXPECT_NEAR(v.at("grad_norm"), coeff * want.router_norm, 1e-4 * coeff * want.router_norm);
    EXPECT_NEAR(v.at("moe_aux_loss"), want.aux_metric, 1e-5);
    ASSERT_EQ(want.imbalance.size(), 2u);
    EXPECT_NEAR(v.at("moe_load_imbalance/layer_0"), want.imbalance[0], 1e-6);
    EXPECT_NEAR(v.at("moe_load_imbalance/layer_1"), want.imbalance[1], 1e-6);
    EXPECT_EQ(v.count("moe_z_loss"), 0u);
    // The routers moved away from the coefficient-0 trainer's (which had no gradient).
    const std::vector<torch::Tensor> before = test_util::Weights(*off);
    const std::vector<torch::Tensor> after = test_util::Weights(*on);
    double moved = 0;
    for (size_t i = 0; i < before.size(); ++i) {
      moved += (after[i] - before[i]).abs().sum().item<double>();
    }
    EXPECT_GT(moved, 0.0);
  }
}

TEST(MoeAuxLossTrainerTest, ZLossIsReportedAndAddsGradient) {
  TempDir tmp;
  const std::string dir = MakeModelDirFromJson(tmp, "moe", TinyMoeJson(), 22);
  config::Config c = MoeConfig(0.0);
  c.train.moe_z_loss_coeff = 1e-2;
  auto trainer = MakeTrainer(dir, c);
  ASSERT_NE(trainer, nullptr);
  auto r = trainer->TrainRollout(0, ZeroRewardBatch());
  ASSERT_TRUE(r.ok()) << r.status();
  const std::map<std::string, double>& v = r->steps[0].values;
  EXPECT_GT(v.at("moe_z_loss"), 0.0);
  EXPECT_GT(v.at("grad_norm"), 0.0);
  EXPECT_EQ(v.count("moe_aux_loss"), 1u);  // the balance metrics come with either loss
}

TEST(MoeAuxLossTrainerTest, DenseModelRefusesTheCoefficientsNamingTheKey) {
  TempDir tmp;
  const std::string dir = MakeModelDir(tmp, "dense", 23);
  for (const char* key : {"moe_aux_loss_coeff", "moe_z_loss_coeff"}) {
    config::Config c = BaseConfig();
    (std::string(key) == "moe_aux_loss_coeff" ? c.train.moe_aux_loss_coeff
                                              : c.train.moe_z_loss_coeff) = 1e-3;
    TrainerOptions o;
    o.model_dir = dir;
    o.config = c;
    auto trainer = Trainer::Create(o);
    ASSERT_FALSE(trainer.ok());
    EXPECT_EQ(trainer.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(Msg(trainer.status()).find(std::string("train.") + key), std::string::npos)
        << Msg(trainer.status());
  }
  // 0 (the default) is fine on a dense model.
  EXPECT_NE(MakeTrainer(dir, BaseConfig()), nullptr);
}

}  // namespace
}  // namespace slime::train
