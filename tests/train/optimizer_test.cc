// AdamW: hand-computed steps, equality with torch::optim::AdamW (reference only), clipping, the
// non-finite skip, bf16 parameters with float32 masters, trainable filters, state export/import.
#include "slime/train/optimizer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "slime/config/config.h"
#include "slime/model/config.h"
#include "slime/model/weights.h"

#ifndef SLIME_MODEL_TEST_DATA_DIR
#define SLIME_MODEL_TEST_DATA_DIR ""  // test_util.h's data dir is not used here
#endif
#include "../model/test_util.h"

namespace slime::train {
namespace {

std::string Msg(const Status& s) { return std::string(s.message()); }

torch::Tensor Param(std::vector<float> values, std::vector<int64_t> shape) {
  return torch::tensor(values, torch::kFloat32).reshape(shape).set_requires_grad(true);
}

void SetGrad(torch::Tensor& p, std::vector<float> values) {
  p.mutable_grad() = torch::tensor(values, torch::kFloat32).reshape(p.sizes()).to(p.dtype());
}

AdamWOptions NoClip() {
  AdamWOptions o;
  o.clip_grad = 0.0;
  return o;
}

const torch::Tensor& StateTensor(const OptimizerState& state, const std::string& name) {
  for (const model::NamedTensor& nt : state.tensors) {
    if (nt.name == name) return nt.tensor;
  }
  ADD_FAILURE() << "no state tensor " << name;
  static torch::Tensor none;
  return none;
}

std::vector<torch::Tensor> CloneState(const AdamW& opt) {
  std::vector<torch::Tensor> out;
  for (const model::NamedTensor& nt : opt.ExportState().tensors) out.push_back(nt.tensor.clone());
  return out;
}

void ExpectNear(const torch::Tensor& t, std::vector<double> expected, double tol) {
  torch::Tensor flat = t.to(torch::kFloat64).reshape({-1});
  ASSERT_EQ(flat.numel(), static_cast<int64_t>(expected.size()));
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR(flat[i].item<double>(), expected[i], tol) << "element " << i;
  }
}

// p = [1, -2, 0.5] (a [1, 3] weight, so decay applies), lr 0.1, weight decay 0.1, betas
// (0.9, 0.999), eps 1e-8, no clipping. Step 1 by hand for p[0] = 1, g = 0.1:
//   p = 1 * (1 - 0.1 * 0.1) = 0.99;  m = 0.1 * 0.1 = 0.01;  v = 0.001 * 0.01 = 1e-5
//   m_hat = 0.01 / 0.1 = 0.1;  sqrt(v_hat) = sqrt(1e-5 / 0.001) = 0.1
//   p = 0.99 - 0.1 * 0.1 / (0.1 + 1e-8) = 0.89000001
// Steps 2 and 3 follow the same formulas (double precision, written out below).
TEST(AdamWTest, MatchesHandComputedSteps) {
  torch::Tensor p = Param({1.0f, -2.0f, 0.5f}, {1, 3});
  AdamWOptions o = NoClip();
  o.weight_decay = 0.1;
  auto opt = AdamW::Create({{"w", p}}, o);
  ASSERT_TRUE(opt.ok()) << opt.status();

  SetGrad(p, {0.1f, -0.2f, 0.3f});
  auto r = (*opt)->Step(0.1);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->skipped);
  EXPECT_EQ(r->step, 1);
  EXPECT_DOUBLE_EQ(r->lr, 0.1);
  EXPECT_NEAR(r->grad_norm, std::sqrt(0.01 + 0.04 + 0.09), 1e-6);
  ExpectNear(p, {0.89000001, -1.880000005, 0.395000003}, 2e-7);
  OptimizerState s = (*opt)->ExportState();
  ExpectNear(StateTensor(s, "w.exp_avg"), {0.01, -0.02, 0.03}, 1e-8);
  ExpectNear(StateTensor(s, "w.exp_avg_sq"), {1e-5, 4e-5, 9e-5}, 1e-11);
  EXPECT_FALSE(p.grad().defined()) << "gradients are consumed by the step";

  SetGrad(p, {0.2f, 0.1f, -0.1f});
  ASSERT_TRUE((*opt)->Step(0.1).ok());
  ExpectNear(p, {0.784581813, -1.834566303, 0.351028148}, 3e-7);
  s = (*opt)->ExportState();
  ExpectNear(StateTensor(s, "w.exp_avg"), {0.029, -0.008, 0.017}, 1e-8);
  ExpectNear(StateTensor(s, "w.exp_avg_sq"), {4.999e-05, 4.996e-05, 9.991e-05}, 1e-10);

  SetGrad(p, {-0.3f, 0.0f, 0.05f});
  r = (*opt)->Step(0.1);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->step, 3);
  ExpectNear(p, {0.783395897, -1.795632711, 0.306975328}, 3e-7);
  s = (*opt)->ExportState();
  EXPECT_EQ(s.step, 3);
  ExpectNear(StateTensor(s, "w.exp_avg"), {-0.0039, -0.0072, 0.0203}, 1e-8);
  ExpectNear(StateTensor(s, "w.exp_avg_sq"), {0.00013994001, 4.991004e-05, 0.00010231009}, 1e-10);
  // Float32 parameters are their own masters: no ".master" tensor.
  EXPECT_FALSE((*opt)->has_master_weights());
  EXPECT_EQ(s.tensors.size(), 2u);
}

// Same update as torch::optim::AdamW, bit for bit, over several steps with a changing lr. The
// 1-D parameter is in a torch group without weight decay (our rule exempts 1-D parameters).
TEST(AdamWTest, EqualsTorchAdamWOnFloat32) {
  torch::manual_seed(7);
  torch::Tensor a = torch::randn({4, 5}).set_requires_grad(true);
  torch::Tensor b = torch::randn({5}).set_requires_grad(true);
  torch::Tensor ra = a.detach().clone().set_requires_grad(true);
  torch::Tensor rb = b.detach().clone().set_requires_grad(true);

  AdamWOptions o = NoClip();
  o.beta1 = 0.8;
  o.beta2 = 0.95;
  o.eps = 1e-6;
  o.weight_decay = 0.05;
  auto opt = AdamW::Create({{"a.weight", a}, {"b.weight", b}}, o);
  ASSERT_TRUE(opt.ok()) << opt.status();

  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(
      std::vector<torch::Tensor>{ra},
      std::make_unique<torch::optim::AdamWOptions>(
          torch::optim::AdamWOptions(1.0).betas({0.8, 0.95}).eps(1e-6).weight_decay(0.05)));
  groups.emplace_back(
      std::vector<torch::Tensor>{rb},
      std::make_unique<torch::optim::AdamWOptions>(
          torch::optim::AdamWOptions(1.0).betas({0.8, 0.95}).eps(1e-6).weight_decay(0.0)));
  torch::optim::AdamW reference(groups, torch::optim::AdamWOptions(1.0));

  const std::vector<double> lrs = {1e-2, 3e-2, 5e-3, 2e-2, 1e-2, 7e-3};
  for (size_t step = 0; step < lrs.size(); ++step) {
    torch::Tensor ga = torch::randn({4, 5});
    torch::Tensor gb = torch::randn({5});
    a.mutable_grad() = ga.clone();
    b.mutable_grad() = gb.clone();
    ra.mutable_grad() = ga.clone();
    rb.mutable_grad() = gb.clone();
    for (auto& group : reference.param_groups()) {
      static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lrs[step]);
    }
    reference.step();
    auto r = (*opt)->Step(lrs[step]);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(torch::equal(a, ra))
        << "step " << step << " max diff " << (a - ra).abs().max().item<double>();
    EXPECT_TRUE(torch::equal(b, rb))
        << "step " << step << " max diff " << (b - rb).abs().max().item<double>();
  }
}

TEST(AdamWTest, ClipsByGlobalNormOverAllParameters) {
  // Gradients [3] and [4, 0]: global norm 5, clip to 1 -> g * 1 / (5 + 1e-6).
  torch::Tensor p1 = Param({1.0f}, {1, 1});
  torch::Tensor p2 = Param({1.0f, 1.0f}, {1, 2});
  AdamWOptions o;
  o.clip_grad = 1.0;
  o.weight_decay = 0.0;
  auto opt = AdamW::Create({{"p1", p1}, {"p2", p2}}, o);
  ASSERT_TRUE(opt.ok());
  SetGrad(p1, {3.0f});
  SetGrad(p2, {4.0f, 0.0f});
  auto r = (*opt)->Step(1e-3);
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(r->grad_norm, 5.0, 1e-6) << "the norm is reported before clipping";
  const double c = 1.0 / (5.0 + 1e-6);
  OptimizerState s = (*opt)->ExportState();
  ExpectNear(StateTensor(s, "p1.exp_avg"), {0.1 * 3 * c}, 1e-8);
  ExpectNear(StateTensor(s, "p2.exp_avg"), {0.1 * 4 * c, 0.0}, 1e-8);
  ExpectNear(StateTensor(s, "p2.exp_avg_sq"), {0.001 * 16 * c * c, 0.0}, 1e-10);

  // Below the threshold nothing is scaled.
  SetGrad(p1, {0.3f});
  SetGrad(p2, {0.4f, 0.0f});
  auto opt2 = AdamW::Create({{"p1", p1}, {"p2", p2}}, o);
  ASSERT_TRUE(opt2.ok());
  ASSERT_TRUE((*opt2)->Step(1e-3).ok());
  ExpectNear(StateTensor((*opt2)->ExportState(), "p2.exp_avg"), {0.04, 0.0}, 1e-8);
}

TEST(AdamWTest, NormSeamReducesAndCountsReplicatedParamsOnRankZeroOnly) {
  torch::Tensor sharded = Param({0.0f}, {1, 1});
  torch::Tensor replicated = Param({0.0f}, {1, 1});
  AdamWOptions o;
  o.clip_grad = 0.0;
  o.tp_rank = 1;
  int calls = 0;
  o.reduce_squared_grad_norm = [&calls](torch::Tensor& squared) {
    ++calls;
    EXPECT_EQ(squared.dim(), 0);
    EXPECT_EQ(squared.scalar_type(), torch::kFloat32);
    squared.mul_(4.0);  // as if four ranks held the same local sum
    return absl::OkStatus();
  };
  auto opt = AdamW::Create({{"sharded", sharded, false}, {"replicated", replicated, true}}, o);
  ASSERT_TRUE(opt.ok());
  SetGrad(sharded, {3.0f});
  SetGrad(replicated, {4.0f});  // not counted on rank 1
  auto r = (*opt)->Step(1e-3);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(calls, 1);
  EXPECT_NEAR(r->grad_norm, std::sqrt(4.0 * 9.0), 1e-6);

  o.reduce_squared_grad_norm = [](torch::Tensor&) { return absl::UnavailableError("nccl down"); };
  auto opt2 = AdamW::Create({{"x", sharded}}, o);
  ASSERT_TRUE(opt2.ok());
  SetGrad(sharded, {1.0f});
  auto r2 = (*opt2)->Step(1e-3);
  EXPECT_EQ(r2.status().code(), absl::StatusCode::kUnavailable);
}

TEST(AdamWTest, NonFiniteNormSkipsWithoutChangingAnything) {
  for (float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    torch::Tensor p = Param({1.0f, 2.0f, 3.0f}, {1, 3}).to(torch::kBFloat16).detach();
    p.set_requires_grad(true);
    torch::Tensor q = Param({0.5f}, {1});
    auto opt = AdamW::Create({{"p", p}, {"q", q}}, AdamWOptions{});
    ASSERT_TRUE(opt.ok());
    SetGrad(p, {0.1f, 0.2f, 0.3f});
    SetGrad(q, {0.1f});
    ASSERT_TRUE((*opt)->Step(0.01).ok());

    const torch::Tensor p_before = p.detach().clone();
    const torch::Tensor q_before = q.detach().clone();
    const std::vector<torch::Tensor> state_before = CloneState(**opt);
    SetGrad(p, {0.1f, bad, 0.3f});
    SetGrad(q, {0.1f});
    auto r = (*opt)->Step(0.01);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->skipped);
    EXPECT_FALSE(std::isfinite(r->grad_norm));
    EXPECT_EQ(r->step, 1);
    EXPECT_EQ((*opt)->step(), 1);
    EXPECT_TRUE(torch::equal(p, p_before));
    EXPECT_TRUE(torch::equal(q, q_before));
    const std::vector<torch::Tensor> state_after = CloneState(**opt);
    ASSERT_EQ(state_before.size(), state_after.size());
    for (size_t i = 0; i < state_before.size(); ++i) {
      EXPECT_TRUE(torch::equal(state_before[i], state_after[i])) << "state tensor " << i;
    }
    EXPECT_FALSE(p.grad().defined());
    EXPECT_FALSE(q.grad().defined());
  }
}

// lr 1e-3 moves a weight of 1.0 by about 1e-3 per step; bf16's spacing below 1.0 is 2^-8, so a
// bf16-only update rounds back to 1.0 every time, while the float32 master accumulates it.
TEST(AdamWTest, Bf16ParamsKeepFloat32MastersThatAccumulateSmallUpdates) {
  torch::Tensor p = torch::ones({1, 4}, torch::kBFloat16).set_requires_grad(true);
  torch::Tensor naive = torch::ones({1, 4}, torch::kBFloat16);
  AdamWOptions o = NoClip();
  o.weight_decay = 0.0;
  auto opt = AdamW::Create({{"w", p}}, o);
  ASSERT_TRUE(opt.ok());
  EXPECT_TRUE((*opt)->has_master_weights());
  const int steps = 20;
  for (int i = 0; i < steps; ++i) {
    p.mutable_grad() = torch::full({1, 4}, 0.5, torch::kBFloat16);  // a bf16 gradient
    auto r = (*opt)->Step(1e-3);
    ASSERT_TRUE(r.ok()) << r.status();
    naive.add_(-1e-3);  // the same step size applied in bf16 alone
  }
  const OptimizerState s = (*opt)->ExportState();
  const torch::Tensor& master = StateTensor(s, "w.master");
  EXPECT_EQ(master.scalar_type(), torch::kFloat32);
  // Constant gradient: m_hat = g, v_hat = g^2, so every step moves by lr * g / (|g| + eps).
  ExpectNear(master,
             {1.0 - steps * 1e-3, 1.0 - steps * 1e-3, 1.0 - steps * 1e-3, 1.0 - steps * 1e-3},
             1e-5);
  EXPECT_TRUE(torch::equal(naive, torch::ones({1, 4}, torch::kBFloat16)))
      << "bf16 alone loses the updates";
  EXPECT_EQ(p.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(p, master.to(torch::kBFloat16))) << "param = bf16(master)";
  EXPECT_LT(p.to(torch::kFloat32).max().item<float>(), 1.0f);
}

TEST(AdamWTest, WeightDecaySkipsBiasesAndOneDimensionalParams) {
  torch::Tensor w = Param({1.0f, 1.0f}, {1, 2});
  torch::Tensor bias = Param({1.0f, 1.0f}, {1, 2});  // 2-D but named ".bias"
  torch::Tensor norm = Param({1.0f, 1.0f}, {2});
  AdamWOptions o = NoClip();
  o.weight_decay = 0.5;
  auto opt = AdamW::Create({{"l.weight", w}, {"l.bias", bias}, {"norm.weight", norm}}, o);
  ASSERT_TRUE(opt.ok());
  // No gradients at all: zero gradients, so only weight decay moves anything.
  auto r = (*opt)->Step(0.1);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->grad_norm, 0.0);
  ExpectNear(w, {0.95, 0.95}, 1e-7);
  ExpectNear(bias, {1.0, 1.0}, 0.0);
  ExpectNear(norm, {1.0, 1.0}, 0.0);
}

TEST(AdamWTest, ResetAndStatelessAdam) {
  torch::Tensor p = Param({1.0f}, {1, 1});
  AdamWOptions o = NoClip();
  o.weight_decay = 0.0;
  auto opt = AdamW::Create({{"p", p}}, o);
  ASSERT_TRUE(opt.ok());
  SetGrad(p, {0.5f});
  ASSERT_TRUE((*opt)->Step(0.1).ok());
  (*opt)->ResetStates();
  EXPECT_EQ((*opt)->step(), 0);
  for (const model::NamedTensor& nt : (*opt)->ExportState().tensors) {
    EXPECT_EQ(nt.tensor.abs().sum().item<float>(), 0.0f) << nt.name;
  }

  // Stateless: every step is -lr * g / (|g| + eps), whatever the history.
  torch::Tensor q = Param({1.0f}, {1, 1});
  o.stateless = true;
  auto sl = AdamW::Create({{"q", q}}, o);
  ASSERT_TRUE(sl.ok());
  const std::vector<float> grads = {0.5f, -2.0f, 0.25f};
  double expected = 1.0;
  for (float g : grads) {
    SetGrad(q, {g});
    auto r = (*sl)->Step(0.1);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->step, 1);
    expected -= 0.1 * g / (std::fabs(g) + 1e-8);
    ExpectNear(q, {expected}, 1e-6);
  }
}

TEST(AdamWTest, TrainableFilters) {
  const model::ModelConfig config =
      *model::ParseModelConfigJson(model::testing::TinyQwen3ConfigJson(), "tiny-qwen3");
  auto make = [&config](const AdamWOptions& o) {
    auto weights = model::RandomWeights(config, 1, {});
    EXPECT_TRUE(weights.ok());
    for (model::NamedTensor& nt : model::NamedParameters(*weights, config)) {
      nt.tensor.set_requires_grad(true);
    }
    auto opt = AdamW::ForModel(*weights, config, o);
    return std::make_pair(*weights, std::move(opt));
  };

  AdamWOptions only;
  only.only_train_params_name_list = {"q_proj", "^lm_head"};
  auto [w1, opt1] = make(only);
  ASSERT_TRUE(opt1.ok()) << opt1.status();
  EXPECT_EQ((*opt1)->TrainableNames(),
            (std::vector<std::string>{"model.layers.0.self_attn.q_proj.weight",
                                      "model.layers.1.self_attn.q_proj.weight", "lm_head.weight"}));
  EXPECT_FALSE(w1.layers[0].k_proj.requires_grad()) << "frozen params stop requiring grad";
  EXPECT_TRUE(w1.layers[0].q_proj.requires_grad());
  // A frozen parameter is not updated even with a gradient.
  const torch::Tensor k_before = w1.layers[0].k_proj.detach().clone();
  w1.layers[0].k_proj.mutable_grad() = torch::ones_like(k_before);
  w1.layers[0].q_proj.mutable_grad() = torch::ones_like(w1.layers[0].q_proj);
  const torch::Tensor q_before = w1.layers[0].q_proj.detach().clone();
  ASSERT_TRUE((*opt1)->Step(0.1).ok());
  EXPECT_TRUE(torch::equal(w1.layers[0].k_proj, k_before));
  EXPECT_FALSE(torch::equal(w1.layers[0].q_proj, q_before));
  EXPECT_EQ((*opt1)->ExportState().tensors.size(), 6u);  // 3 params x (exp_avg, exp_avg_sq)

  AdamWOptions freeze;
  freeze.freeze_params_name_list = {"layers\\.1\\.", "embed"};
  auto [w2, opt2] = make(freeze);
  ASSERT_TRUE(opt2.ok());
  EXPECT_FALSE((*opt2)->IsTrainable("model.embed_tokens.weight"));
  EXPECT_FALSE((*opt2)->IsTrainable("model.layers.1.mlp.up_proj.weight"));
  EXPECT_TRUE((*opt2)->IsTrainable("model.layers.0.mlp.up_proj.weight"));
  EXPECT_TRUE((*opt2)->IsTrainable("model.norm.weight"));

  AdamWOptions both;
  both.only_train_params_name_list = {"a"};
  both.freeze_params_name_list = {"b"};
  auto [w3, opt3] = make(both);
  EXPECT_EQ(opt3.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(Msg(opt3.status()).find("mutually exclusive"), std::string::npos);

  AdamWOptions bad_regex;
  bad_regex.freeze_params_name_list = {"(unclosed"};
  auto [w4, opt4] = make(bad_regex);
  EXPECT_NE(Msg(opt4.status()).find("(unclosed"), std::string::npos) << opt4.status();

  AdamWOptions nothing;
  nothing.only_train_params_name_list = {"no_such_param"};
  auto [w5, opt5] = make(nothing);
  EXPECT_NE(Msg(opt5.status()).find("no parameter is left trainable"), std::string::npos)
      << opt5.status();
}

TEST(AdamWTest, ModelParametersFlagReplicatedAndFromTrainConfig) {
  const model::ModelConfig config =
      *model::ParseModelConfigJson(model::testing::TinyQwen3ConfigJson(), "tiny-qwen3");
  auto weights = model::RandomWeights(config, 1, {});
  ASSERT_TRUE(weights.ok());
  const std::vector<OptimizerParam> params = ModelParameters(*weights, config);
  ASSERT_FALSE(params.empty());
  EXPECT_EQ(params.front().name, "model.embed_tokens.weight");
  for (const OptimizerParam& p : params) {
    const bool is_norm = p.name.find("norm") != std::string::npos;
    EXPECT_EQ(p.replicated, is_norm) << p.name;
  }

  config::TrainConfig train;
  train.adam_beta1 = 0.85;
  train.adam_beta2 = 0.98;
  train.adam_eps = 1e-5;
  train.weight_decay = 0.1;
  train.clip_grad = 0.5;
  train.use_stateless_adam = true;
  train.freeze_params_name_list = {"embed"};
  const AdamWOptions o = AdamWOptions::FromTrainConfig(train);
  EXPECT_EQ(o.beta1, 0.85);
  EXPECT_EQ(o.beta2, 0.98);
  EXPECT_EQ(o.eps, 1e-5);
  EXPECT_EQ(o.weight_decay, 0.1);
  EXPECT_EQ(o.clip_grad, 0.5);
  EXPECT_TRUE(o.stateless);
  EXPECT_EQ(o.freeze_params_name_list, std::vector<std::string>{"embed"});

  AdamWOptions bad;
  bad.beta2 = 1.0;
  EXPECT_NE(Msg(bad.Validate()).find("adam_beta2"), std::string::npos);
  bad = AdamWOptions{};
  bad.clip_grad = -1.0;
  EXPECT_NE(Msg(bad.Validate()).find("clip_grad"), std::string::npos);
}

TEST(AdamWTest, ExportImportContinuesIdentically) {
  torch::manual_seed(11);
  torch::Tensor a = torch::randn({3, 4}).to(torch::kBFloat16).set_requires_grad(true);
  torch::Tensor b = torch::randn({4}).set_requires_grad(true);
  auto opt = AdamW::Create({{"a.weight", a}, {"b.weight", b}}, AdamWOptions{});
  ASSERT_TRUE(opt.ok());
  for (int i = 0; i < 2; ++i) {
    a.mutable_grad() = torch::randn({3, 4}).to(torch::kBFloat16);
    b.mutable_grad() = torch::randn({4});
    ASSERT_TRUE((*opt)->Step(1e-2).ok());
  }
  OptimizerState exported = (*opt)->ExportState();
  for (model::NamedTensor& nt : exported.tensors) nt.tensor = nt.tensor.clone();

  // A second optimizer over other values takes over the state (and the masters' values).
  torch::Tensor a2 = torch::zeros({3, 4}, torch::kBFloat16).set_requires_grad(true);
  torch::Tensor b2 = b.detach().clone().set_requires_grad(true);
  auto opt2 = AdamW::Create({{"a.weight", a2}, {"b.weight", b2}}, AdamWOptions{});
  ASSERT_TRUE(opt2.ok());
  ASSERT_TRUE((*opt2)->ImportState(exported).ok());
  EXPECT_EQ((*opt2)->step(), 2);
  EXPECT_TRUE(torch::equal(a2, a)) << "the master overwrites the bf16 parameter";

  const torch::Tensor ga = torch::randn({3, 4}).to(torch::kBFloat16);
  const torch::Tensor gb = torch::randn({4});
  a.mutable_grad() = ga.clone();
  b.mutable_grad() = gb.clone();
  a2.mutable_grad() = ga.clone();
  b2.mutable_grad() = gb.clone();
  ASSERT_TRUE((*opt)->Step(1e-2).ok());
  ASSERT_TRUE((*opt2)->Step(1e-2).ok());
  EXPECT_TRUE(torch::equal(a, a2));
  EXPECT_TRUE(torch::equal(b, b2));

  // Validation names the offending tensor.
  OptimizerState missing = exported;
  missing.tensors.pop_back();
  EXPECT_NE(Msg((*opt2)->ValidateState(missing)).find("b.weight.exp_avg_sq\" is missing"),
            std::string::npos)
      << (*opt2)->ValidateState(missing);
  OptimizerState wrong_shape = exported;
  wrong_shape.tensors[1].tensor = torch::zeros({4, 3});
  EXPECT_NE(Msg((*opt2)->ValidateState(wrong_shape)).find("shape [4, 3]"), std::string::npos);
  OptimizerState wrong_dtype = exported;
  wrong_dtype.tensors[1].tensor = wrong_dtype.tensors[1].tensor.to(torch::kFloat64);
  EXPECT_NE(Msg((*opt2)->ValidateState(wrong_dtype)).find("float32 is required"),
            std::string::npos);
  OptimizerState unknown = exported;
  unknown.tensors.push_back({"c.weight.exp_avg", torch::zeros({1})});
  EXPECT_NE(Msg((*opt2)->ValidateState(unknown)).find("c.weight.exp_avg"), std::string::npos);
  // A failed import changes nothing.
  const torch::Tensor a2_before = a2.detach().clone();
  EXPECT_FALSE((*opt2)->ImportState(wrong_shape).ok());
  EXPECT_TRUE(torch::equal(a2, a2_before));
  EXPECT_EQ((*opt2)->step(), 3);
}

TEST(AdamWTest, BadLearningRateAndShapeChange) {
  torch::Tensor p = Param({1.0f, 2.0f}, {1, 2});
  auto opt = AdamW::Create({{"p", p}}, AdamWOptions{});
  ASSERT_TRUE(opt.ok());
  EXPECT_EQ((*opt)->Step(-1.0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*opt)->Step(std::nan("")).status().code(), absl::StatusCode::kInvalidArgument);
  p.mutable_grad() = torch::ones({2, 1});
  EXPECT_NE(Msg((*opt)->Step(0.1).status()).find("gradient of \"p\""), std::string::npos);

  EXPECT_EQ(AdamW::Create({{"p", p}, {"p", p}}, AdamWOptions{}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AdamW::Create({{"i", torch::ones({2}, torch::kLong)}}, AdamWOptions{}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace slime::train
