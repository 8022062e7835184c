// Policy / value / SFT losses and slime's reduction against numbers computed by hand (each
// literal's formula is in the comment beside it; the values were evaluated with plain python3
// from the formulas of docs/algorithms.md), finite-difference gradient checks in double
// precision, and slime's CI gates (ratio ≡ 1 ⇒ ppo_kl = pg_clipfrac = 0; logp = ref ⇒ kl = 0).
#include "slime/train/losses.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "slime/train/loss_registry.h"

namespace slime::train {
namespace {

torch::Tensor D(std::vector<double> v) { return torch::tensor(v, torch::kDouble); }

double Item(const torch::Tensor& t) { return t.item<double>(); }

std::string Msg(const Status& s) { return std::string(s.message()); }

// The micro-batch used by most tests: three samples of 2, 2 and 1 response tokens.
//   sample            0            1              2
//   loss_mask         1    1       1    0         1
//   logp             −1   −.5     −2   −.3       −.2
//   logp^old        −1.1 −.9     −1.6 −.3       −1.6     ratio = exp(logp − old):
//                                                          1.105 1.492 .670 1 4.055
//   A                 1    1      −1   −1        −1
//   H                .5   .6      .7   .8        .9
//   logp^ref        −1.2 −.5     −1.8 −.3       −.25
//   logp^roll       −1   −1      −1.5 −.3       −2      w = exp(old − roll):
//                                                          .905 1.105 .905 1 1.492
// Reduce(x) = (x0 + x1)/2 + x2/1 + x4/1 (per-rollout mean, one sample per rollout, G = 1).
struct Batch {
  std::vector<int64_t> lengths = {2, 2, 1};
  torch::Tensor mask = D({1, 1, 1, 0, 1});
  torch::Tensor logp = D({-1.0, -0.5, -2.0, -0.3, -0.2});
  torch::Tensor old = D({-1.1, -0.9, -1.6, -0.3, -1.6});
  torch::Tensor adv = D({1.0, 1.0, -1.0, -1.0, -1.0});
  torch::Tensor entropy = D({0.5, 0.6, 0.7, 0.8, 0.9});
  torch::Tensor ref = D({-1.2, -0.5, -1.8, -0.3, -0.25});
  torch::Tensor rollout = D({-1.0, -1.0, -1.5, -0.3, -2.0});

  LossReducer Reducer(ReduceOptions options = {}) const {
    auto r = LossReducer::Create(lengths, mask, std::move(options));
    EXPECT_TRUE(r.ok()) << r.status();
    return *r;
  }
  PolicyLossInputs Inputs() const {
    PolicyLossInputs in;
    in.log_probs = logp.clone().requires_grad_(true);
    in.old_log_probs = old;
    in.advantages = adv;
    return in;
  }
};

PolicyLossOptions PpoOptions() {
  PolicyLossOptions o;
  o.eps_clip = 0.2;
  o.eps_clip_high = 0.28;
  return o;
}

double MetricOf(const LossOutput& out, const std::string& name) {
  auto it = out.metrics.find(name);
  EXPECT_NE(it, out.metrics.end()) << "missing metric " << name;
  if (it == out.metrics.end()) return NAN;
  EXPECT_FALSE(it->second.requires_grad()) << name;
  return Item(it->second);
}

ReduceOptions Step(double g) {
  ReduceOptions o;
  o.step_denominator = g;
  return o;
}
ReduceOptions PerToken(double n) {
  ReduceOptions o;
  o.per_token_loss = true;
  o.step_denominator = n;
  return o;
}
ReduceOptions Denominators(std::vector<double> d, double g = 1.0) {
  ReduceOptions o;
  o.sample_denominators = std::move(d);
  o.step_denominator = g;
  return o;
}

// Central finite differences of `f` at `x` against the autograd gradient `grad`.
void ExpectGradientMatchesFiniteDifferences(const std::function<double(const torch::Tensor&)>& f,
                                            const torch::Tensor& x, const torch::Tensor& grad) {
  const double h = 1e-6;
  ASSERT_TRUE(grad.defined());
  for (int64_t i = 0; i < x.size(0); ++i) {
    torch::Tensor plus = x.detach().clone();
    torch::Tensor minus = x.detach().clone();
    plus[i] += h;
    minus[i] -= h;
    const double fd = (f(plus) - f(minus)) / (2 * h);
    EXPECT_NEAR(Item(grad[i]), fd, 1e-7 + 1e-6 * std::abs(fd)) << "token " << i;
  }
}

// ---- 3.9 Reduction -------------------------------------------------------------------------

TEST(LossReducerTest, SumOfSampleMeansPerTokenAndGivenDenominators) {
  const torch::Tensor x = D({1, 2, 3, 4, 5});
  const torch::Tensor mask = D({1, 1, 0, 1, 1});
  // Samples {1,2,3} (mask 1 1 0) and {4,5}: (1+2)/2 + (4+5)/2 = 6.
  auto r = LossReducer::Create({3, 2}, mask);
  ASSERT_TRUE(r.ok());
  EXPECT_DOUBLE_EQ(Item(r->Reduce(x)), 6.0);
  // Step-wide G = 3 rollouts: 6 / 3.
  r = LossReducer::Create({3, 2}, mask, Step(3));
  EXPECT_DOUBLE_EQ(Item(r->Reduce(x)), 2.0);
  // Per-token over N = 4 step tokens: (1+2+4+5)/4 = 3.
  r = LossReducer::Create({3, 2}, mask, PerToken(4));
  EXPECT_DOUBLE_EQ(Item(r->Reduce(x)), 3.0);
  // Given D_i = {4, 2}: 3/4 + 9/2 = 5.25. D_i = 0 counts as 1: 3/1 + 9/2 = 7.5.
  r = LossReducer::Create({3, 2}, mask, Denominators({4, 2}));
  EXPECT_DOUBLE_EQ(Item(r->Reduce(x)), 5.25);
  r = LossReducer::Create({3, 2}, mask, Denominators({0, 2}));
  EXPECT_DOUBLE_EQ(Item(r->Reduce(x)), 7.5);
  // Numerator with another mask, same denominators: (1+0)/2 + (0+5)/2 = 3.
  r = LossReducer::Create({3, 2}, mask);
  EXPECT_DOUBLE_EQ(Item(r->ReduceWithMask(x, D({1, 0, 0, 0, 1}))), 3.0);
  // Per-sample mean broadcast: [1.5, 1.5, 1.5, 4.5, 4.5].
  EXPECT_TRUE(torch::allclose(r->SampleMeanPerToken(x), D({1.5, 1.5, 1.5, 4.5, 4.5})));
}

TEST(LossReducerTest, MicroBatchesOfOneStepSumToTheStepObjective) {
  // One step, G = 2 rollouts: rollout A = samples a1 [1, 2] and a2 [3, 4] (D = 4 tokens),
  // rollout B = sample b [10] (D = 1). Step objective = (token-mean(A) + token-mean(B)) / 2 =
  // (2.5 + 10) / 2 = 6.25. Micro-batch 1 = {a1}, micro-batch 2 = {a2, b}.
  auto mb1 = LossReducer::Create({2}, D({1, 1}), Denominators({4}, 2));
  auto mb2 = LossReducer::Create({2, 1}, D({1, 1, 1}), Denominators({4, 1}, 2));
  ASSERT_TRUE(mb1.ok() && mb2.ok());
  const double step = Item(mb1->Reduce(D({1, 2}))) + Item(mb2->Reduce(D({3, 4, 10})));
  EXPECT_DOUBLE_EQ(step, 6.25);
  // Per-token mode: N = 5 step tokens; sum of micro-batches = (1+2+3+4+10)/5 = 4.
  auto t1 = LossReducer::Create({2}, D({1, 1}), PerToken(5));
  auto t2 = LossReducer::Create({2, 1}, D({1, 1, 1}), PerToken(5));
  EXPECT_DOUBLE_EQ(Item(t1->Reduce(D({1, 2}))) + Item(t2->Reduce(D({3, 4, 10}))), 4.0);
}

TEST(LossReducerTest, BadInputIsAnError) {
  auto r = LossReducer::Create({3, 2}, D({1, 1, 1, 1}));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(Msg(r.status()).find("loss_mask has 4 tokens"), std::string::npos);
  r = LossReducer::Create({2, -1}, D({1}));
  EXPECT_NE(Msg(r.status()).find("response_lengths[1]"), std::string::npos);
  r = LossReducer::Create({1, 1}, D({1, 1}), Denominators({1}));
  EXPECT_NE(Msg(r.status()).find("sample_denominators"), std::string::npos);
  r = LossReducer::Create({1, 1}, D({1, 1}), Step(0));
  EXPECT_NE(Msg(r.status()).find("step_denominator"), std::string::npos);
}

// ---- 3.6 Policy loss -----------------------------------------------------------------------

TEST(PolicyLossTest, PpoClipMatchesHandValues) {
  // Per token L = max(−ρA, −clip(ρ, .8, 1.28)A): [−1.10517, −1.28 (clipped), .8 (clipped),
  // (masked), 4.05520]; clipfrac [0, 1, 1, ·, 0].
  // pg_loss = (−1.10517 − 1.28)/2 + .8 + 4.05520 = 3.66261450781; pg_clipfrac = .5 + 1 = 1.5;
  // ppo_kl = Reduce(old − logp) = (−.1 − .4)/2 + .4 − 1.4 = −1.25.
  Batch b;
  auto out = PolicyLoss(PpoOptions(), b.Reducer(), b.Inputs());
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_NEAR(Item(out->loss), 3.66261450781, 1e-10);
  EXPECT_NEAR(MetricOf(*out, "pg_loss"), 3.66261450781, 1e-10);
  EXPECT_NEAR(MetricOf(*out, "loss"), 3.66261450781, 1e-10);
  EXPECT_NEAR(MetricOf(*out, "pg_clipfrac"), 1.5, 1e-12);
  EXPECT_NEAR(MetricOf(*out, "ppo_kl"), -1.25, 1e-12);
  EXPECT_TRUE(out->loss.requires_grad());
  // Only the metrics of enabled features are reported.
  for (const char* absent : {"kl_loss", "entropy_loss", "tis", "ois", "opsm_clipfrac",
                             "train_rollout_logprob_abs_diff"}) {
    EXPECT_EQ(out->metrics.count(absent), 0u) << absent;
  }
}

TEST(PolicyLossTest, DualClipBoundsNegativeAdvantageTokens) {
  // c = 3: the last token (A = −1, L = 4.05520) becomes min(3, 4.05520) = 3:
  // pg_loss = 3.66261450781 − 1.05520 = 2.60741454096.
  Batch b;
  PolicyLossOptions o = PpoOptions();
  o.eps_clip_c = 3.0;
  auto out = PolicyLoss(o, b.Reducer(), b.Inputs());
  ASSERT_TRUE(out.ok());
  EXPECT_NEAR(MetricOf(*out, "pg_loss"), 2.60741454096, 1e-10);
}

TEST(PolicyLossTest, FullObjectiveWithEntropyKlAndTis) {
  // TIS weights clamp(w, .95, 1.2) = [.95, 1.105, .95, 1, 1.2] multiply L:
  //   pg_loss = 4.39397438656;  entropy_loss = (.5+.6)/2 + .7 + .9 = 2.15;
  //   kl_loss = Reduce(exp(−d) − 1 + d), d = logp − ref: .0319975591999;
  //   loss = pg − .01·2.15 + .1·kl = 4.37567414248.
  // tis = Reduce(w) = 3.40166628373; tis_clipfrac = Reduce(1[clamp ≠ w]) = 2.5;
  // tis_abs = Reduce(|w − 1|) = .687154029625; ois = Reduce(ρ) = 6.02401782074;
  // train_rollout_logprob_abs_diff = Reduce(|old − roll|) = .1 + .1 + .4 = .6.
  Batch b;
  PolicyLossOptions o = PpoOptions();
  o.entropy_coef = 0.01;
  o.use_kl_loss = true;
  o.kl_loss_coef = 0.1;
  o.kl_loss_type = KlType::kK3;
  o.use_tis = true;
  o.tis_clip_low = 0.95;
  o.tis_clip = 1.2;
  PolicyLossInputs in = b.Inputs();
  in.entropy = b.entropy;
  in.ref_log_probs = b.ref;
  in.rollout_log_probs = b.rollout;
  auto out = PolicyLoss(o, b.Reducer(), in);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_NEAR(Item(out->loss), 4.37567414248, 1e-10);
  EXPECT_NEAR(MetricOf(*out, "pg_loss"), 4.39397438656, 1e-10);
  EXPECT_NEAR(MetricOf(*out, "entropy_loss"), 2.15, 1e-12);
  EXPECT_NEAR(MetricOf(*out, "kl_loss"), 0.0319975591999, 1e-11);
  EXPECT_NEAR(MetricOf(*out, "tis"), 3.40166628373, 1e-10);
  EXPECT_NEAR(MetricOf(*out, "tis_clipfrac"), 2.5, 1e-12);
  EXPECT_NEAR(MetricOf(*out, "tis_abs"), 0.687154029625, 1e-10);
  EXPECT_NEAR(MetricOf(*out, "ois"), 6.02401782074, 1e-10);
  EXPECT_NEAR(MetricOf(*out, "train_rollout_logprob_abs_diff"), 0.6, 1e-12);

  // get_mismatch_metrics alone reports the same TIS metrics but leaves the loss unweighted.
  o.use_tis = false;
  o.get_mismatch_metrics = true;
  out = PolicyLoss(o, b.Reducer(), in);
  ASSERT_TRUE(out.ok());
  EXPECT_NEAR(MetricOf(*out, "pg_loss"), 3.66261450781, 1e-10);
  EXPECT_NEAR(MetricOf(*out, "tis"), 3.40166628373, 1e-10);
}

TEST(PolicyLossTest, IcepopZeroesTokensOutsideTheBand) {
  // Weights w inside [.95, 1.2], else 0: [0, 1.105, 0, 1, 0] → only token 1 keeps its loss:
  // pg_loss = −1.28·1.10517/2 = −.707309387568; tis_clipfrac = Reduce([1,0,1,·,1]) = 2.5.
  Batch b;
  PolicyLossOptions o = PpoOptions();
  o.use_tis = true;
  o.tis_type = TisType::kIcepop;
  o.tis_clip_low = 0.95;
  o.tis_clip = 1.2;
  PolicyLossInputs in = b.Inputs();
  in.rollout_log_probs = b.rollout;
  auto out = PolicyLoss(o, b.Reducer(), in);
  ASSERT_TRUE(out.ok());
  EXPECT_NEAR(MetricOf(*out, "pg_loss"), -0.707309387568, 1e-10);
  EXPECT_NEAR(MetricOf(*out, "tis_clipfrac"), 2.5, 1e-12);
}

TEST(PolicyLossTest, IcepopFromZeroIsAReaLsDecoupledPpo) {
  // AReaL's decoupled PPO (fully async training): the clip is taken against the proximal policy
  // (logp_old, recomputed by the trainer before the step), and each token's loss is weighted by
  // the proximal/behaviour ratio w = exp(old − roll), tokens with w over the cap masked out:
  //   L_t = −w_t · 1[w_t ≤ cap] · min(ρ_t A_t, clip(ρ_t, 1 − ε, 1 + ε) A_t).
  // Written here from that definition, it equals icepop over [0, cap] (docs/algorithms.md).
  Batch b;
  const double eps = 0.2;
  for (const double cap : {1.2, 1.5, 5.0}) {
    PolicyLossOptions o;
    o.eps_clip = eps;
    o.eps_clip_high = eps;
    o.use_tis = true;
    o.tis_type = TisType::kIcepop;
    o.tis_clip_low = 0.0;
    o.tis_clip = cap;
    PolicyLossInputs in = b.Inputs();
    in.rollout_log_probs = b.rollout;
    auto out = PolicyLoss(o, b.Reducer(), in);
    ASSERT_TRUE(out.ok()) << out.status();

    const torch::Tensor ratio = (b.logp - b.old).exp();
    const torch::Tensor w = (b.old - b.rollout).exp();
    const torch::Tensor kept = (w <= cap).to(torch::kDouble);
    const torch::Tensor surrogate =
        torch::min(ratio * b.adv, ratio.clamp(1 - eps, 1 + eps) * b.adv);
    const torch::Tensor decoupled = -w * kept * surrogate;
    EXPECT_NEAR(MetricOf(*out, "pg_loss"), Item(b.Reducer().Reduce(decoupled)), 1e-12) << cap;
  }
}

TEST(PolicyLossTest, GspoUsesTheSequenceLevelRatio) {
  // Δ per sample = masked mean of old − logp: [−.25, −.25 | .4, .4 (mask of sample 1 = {1,0})
  // | −1.4]; ρ_i = exp(−Δ_i) = 1.284, .670, 4.055. With ε_high .28 sample 0 is clipped:
  // pg_loss = −1.28 + .8 + 4.05520 = 3.57519996684, pg_clipfrac = 1 + 1 = 2, ppo_kl = −1.25.
  Batch b;
  PolicyLossOptions o = PpoOptions();
  o.objective = PolicyObjective::kGspo;
  auto out = PolicyLoss(o, b.Reducer(), b.Inputs());
  ASSERT_TRUE(out.ok());
  EXPECT_NEAR(MetricOf(*out, "pg_loss"), 3.57519996684, 1e-10);
  EXPECT_NEAR(MetricOf(*out, "pg_clipfrac"), 2.0, 1e-12);
  EXPECT_NEAR(MetricOf(*out, "ppo_kl"), -1.25, 1e-12);
  // ε_high .3 leaves sample 0 unclipped: −1.28403 + .8 + 4.05520 = 3.57117455016.
  o.eps_clip_high = 0.3;
  out = PolicyLoss(o, b.Reducer(), b.Inputs());
  ASSERT_TRUE(out.ok());
  EXPECT_NEAR(MetricOf(*out, "pg_loss"), 3.57117455016, 1e-10);
  EXPECT_NEAR(MetricOf(*out, "pg_clipfrac"), 1.0, 1e-12);
}

TEST(PolicyLossTest, CispoClipsTheRatioUnderStopGradient) {
  // ε_low = 1 (no lower bound), ε_high = .28: ρ̂ = clamp(ρ, 0, 1.28) = [1.105, 1.28, .670, 1,
  // 1.28]; L = −ρ̂·A·logp → pg_loss = −.724054633033; clipfrac = .5 + 1 (token 1, token 4) = 1.5.
  // ∂loss/∂logp_t = −ρ̂_t·A_t·m_t/len: [−.552585459038, −.64, .670320046036, 0, 1.28].
  Batch b;
  PolicyLossOptions o = PpoOptions();
  o.objective = PolicyObjective::kCispo;
  o.eps_clip = 1.0;
  PolicyLossInputs in = b.Inputs();
  auto out = PolicyLoss(o, b.Reducer(), in);
  ASSERT_TRUE(out.ok());
  EXPECT_NEAR(MetricOf(*out, "pg_loss"), -0.724054633033, 1e-10);
  EXPECT_NEAR(MetricOf(*out, "pg_clipfrac"), 1.5, 1e-12);
  out->loss.backward();
  const torch::Tensor expected = D({-0.552585459038, -0.64, 0.670320046036, 0.0, 1.28});
  EXPECT_TRUE(torch::allclose(in.log_probs.grad(), expected, 1e-9, 1e-10)) << in.log_probs.grad();
}

TEST(PolicyLossTest, OpsmMasksNegativeAdvantagesOfOffPolicySamples) {
  // s_i = [−.25, .4, −1.4]; only sample 1 exceeds δ = 1e-4, and only its masked-in token 2
  // has A < 0: its loss .8 is dropped → pg_loss = 3.66261450781 − .8; opsm_clipfrac = 1/1.
  Batch b;
  PolicyLossOptions o = PpoOptions();
  o.use_opsm = true;
  auto out = PolicyLoss(o, b.Reducer(), b.Inputs());
  ASSERT_TRUE(out.ok());
  EXPECT_NEAR(MetricOf(*out, "pg_loss"), 2.86261450781, 1e-10);
  EXPECT_NEAR(MetricOf(*out, "opsm_clipfrac"), 1.0, 1e-12);
}

TEST(PolicyLossTest, LossAndMetricsScaleWithTheStepDenominator) {
  Batch b;
  auto out = PolicyLoss(PpoOptions(), b.Reducer(Step(4)), b.Inputs());
  ASSERT_TRUE(out.ok());
  EXPECT_NEAR(Item(out->loss), 3.66261450781 / 4, 1e-10);
  EXPECT_NEAR(MetricOf(*out, "pg_clipfrac"), 1.5 / 4, 1e-12);
  EXPECT_NEAR(MetricOf(*out, "ppo_kl"), -1.25 / 4, 1e-12);
}

TEST(PolicyLossTest, KlLossWithZeroCoefficientIsLoggedWithoutGradient) {
  Batch b;
  PolicyLossOptions o = PpoOptions();
  o.use_kl_loss = true;
  o.kl_loss_type = KlType::kK3;
  PolicyLossInputs in = b.Inputs();
  in.ref_log_probs = b.ref;
  auto out = PolicyLoss(o, b.Reducer(), in);
  ASSERT_TRUE(out.ok());
  EXPECT_NEAR(MetricOf(*out, "kl_loss"), 0.0319975591999, 1e-11);
  EXPECT_NEAR(Item(out->loss), 3.66261450781, 1e-10);
  // Unbiased KL weights each token by exp(logp − old): Reduce = .0296826018175.
  o.use_unbiased_kl = true;
  out = PolicyLoss(o, b.Reducer(), in);
  ASSERT_TRUE(out.ok());
  EXPECT_NEAR(MetricOf(*out, "kl_loss"), 0.0296826018175, 1e-11);
}

// ---- slime's CI gates ------------------------------------------------------------------------

TEST(PolicyLossCiGateTest, RatioOneGivesZeroPpoKlAndClipfrac) {
  Batch b;
  for (const char* e : {"grpo", "gspo", "cispo", "ppo"}) {
    auto estimator = FindAdvantageEstimator(e);
    ASSERT_TRUE(estimator.ok()) << estimator.status();
    PolicyLossOptions o = PpoOptions();
    o.objective = (*estimator)->objective;
    o.eps_clip_c = 3.0;
    for (bool skip_old : {true, false}) {
      PolicyLossInputs in = b.Inputs();
      // On-policy first step: old log-probs are the current ones (or not passed at all).
      in.old_log_probs = skip_old ? torch::Tensor() : b.logp.clone();
      auto out = PolicyLoss(o, b.Reducer(), in);
      ASSERT_TRUE(out.ok());
      EXPECT_EQ(MetricOf(*out, "ppo_kl"), 0.0) << e;
      EXPECT_EQ(MetricOf(*out, "pg_clipfrac"), 0.0) << e;
    }
  }
}

TEST(PolicyLossCiGateTest, PolicyEqualToReferenceGivesZeroKlLoss) {
  Batch b;
  for (KlType type : {KlType::kK1, KlType::kK2, KlType::kK3, KlType::kLowVarKl}) {
    for (bool unbiased : {false, true}) {
      PolicyLossOptions o = PpoOptions();
      o.use_kl_loss = true;
      o.kl_loss_coef = 0.5;
      o.kl_loss_type = type;
      o.use_unbiased_kl = unbiased;
      PolicyLossInputs in = b.Inputs();
      in.ref_log_probs = b.logp.clone();
      auto out = PolicyLoss(o, b.Reducer(), in);
      ASSERT_TRUE(out.ok());
      EXPECT_EQ(MetricOf(*out, "kl_loss"), 0.0) << KlTypeName(type);
    }
  }
}

// ---- Gradients -----------------------------------------------------------------------------

// Autograd gradient of the policy loss w.r.t. log-probs against central differences.
// `move_old_with_logp` perturbs logp^old together with logp, which holds the ratio fixed: the
// CISPO gradient is by design (stop-gradient on the clipped ratio) the derivative along those
// directions, not the derivative of the loss value.
void CheckPolicyGradient(const PolicyLossOptions& o, const Batch& b, bool with_extras,
                         bool move_old_with_logp = false) {
  LossReducer reducer = b.Reducer();
  auto make_inputs = [&](const torch::Tensor& logp) {
    PolicyLossInputs in = b.Inputs();
    in.log_probs = logp;
    if (move_old_with_logp) in.old_log_probs = b.old + (logp.detach() - b.logp);
    if (with_extras) {
      in.entropy = b.entropy;
      in.ref_log_probs = b.ref;
      in.rollout_log_probs = b.rollout;
    }
    return in;
  };
  PolicyLossInputs in = make_inputs(b.logp.clone().requires_grad_(true));
  auto out = PolicyLoss(o, reducer, in);
  ASSERT_TRUE(out.ok()) << out.status();
  out->loss.backward();
  auto f = [&](const torch::Tensor& logp) {
    auto r = PolicyLoss(o, reducer, make_inputs(logp));
    EXPECT_TRUE(r.ok());
    return Item(r->loss);
  };
  ExpectGradientMatchesFiniteDifferences(f, in.log_probs, in.log_probs.grad());
}

TEST(GradientTest, PpoWithDualClipTisAndUnbiasedKlMatchesFiniteDifferences) {
  PolicyLossOptions o = PpoOptions();
  o.eps_clip_c = 5.0;  // keeps token 4 (L = 4.055) on the ratio branch, away from the kink
  o.use_tis = true;
  o.tis_clip_low = 0.95;
  o.tis_clip = 1.2;
  o.use_kl_loss = true;
  o.kl_loss_coef = 0.3;
  o.kl_loss_type = KlType::kK3;
  o.use_unbiased_kl = true;
  o.entropy_coef = 0.01;
  CheckPolicyGradient(o, Batch{}, true);
}

TEST(GradientTest, GspoCispoAndKlTypesMatchFiniteDifferences) {
  PolicyLossOptions gspo = PpoOptions();
  gspo.objective = PolicyObjective::kGspo;
  gspo.eps_clip_high = 0.3;  // sample 0 unclipped: the gradient flows through its mean ratio
  CheckPolicyGradient(gspo, Batch{}, false);

  PolicyLossOptions cispo = PpoOptions();
  cispo.objective = PolicyObjective::kCispo;
  cispo.eps_clip = 1.0;
  CheckPolicyGradient(cispo, Batch{}, false, /*move_old_with_logp=*/true);

  // The KL loss alone (A = 0 removes the policy term).
  for (KlType type : {KlType::kK1, KlType::kK2, KlType::kK3, KlType::kLowVarKl}) {
    Batch b;
    b.adv = torch::zeros({5}, torch::kDouble);
    PolicyLossOptions kl = PpoOptions();
    kl.use_kl_loss = true;
    kl.kl_loss_coef = 1.0;
    kl.kl_loss_type = type;
    kl.use_unbiased_kl = type == KlType::kLowVarKl;
    CheckPolicyGradient(kl, b, true);
  }
}

TEST(GradientTest, ValueLossMatchesFiniteDifferences) {
  Batch b;
  LossReducer reducer = b.Reducer();
  const torch::Tensor old_values = D({0.7, 0.55, 1.5, 0.3, 0.1});
  const torch::Tensor returns = D({1.5, 0.0, 1.2, 9.0, -0.5});
  torch::Tensor values = D({1.0, 0.5, 2.0, 0.3, 0.0}).requires_grad_(true);
  auto out = ValueLoss(0.2, reducer, {values, old_values, returns});
  ASSERT_TRUE(out.ok());
  out->loss.backward();
  auto f = [&](const torch::Tensor& v) {
    return Item(ValueLoss(0.2, reducer, {v, old_values, returns})->loss);
  };
  ExpectGradientMatchesFiniteDifferences(f, values, values.grad());
}

// ---- 3.7 / 3.8 -------------------------------------------------------------------------------

TEST(ValueLossTest, ClippedValueLossMatchesHandValues) {
  // c = .2; v − v_old = [.3, −.05, .5, 0, −.1] → v̂ = [.9, .5, 1.7, .3, 0];
  // L = max((v̂ − R)², (v − R)²) = [.36, .25, .64, ·, .25];
  // value_loss = (.36 + .25)/2 + .64 + .25 = 1.195; value_clipfrac = .5 + 1 + 0 = 1.5.
  Batch b;
  auto out = ValueLoss(0.2, b.Reducer(),
                       {D({1.0, 0.5, 2.0, 0.3, 0.0}).requires_grad_(true),
                        D({0.7, 0.55, 1.5, 0.3, 0.1}), D({1.5, 0.0, 1.2, 9.0, -0.5})});
  ASSERT_TRUE(out.ok());
  EXPECT_NEAR(Item(out->loss), 1.195, 1e-12);
  EXPECT_NEAR(MetricOf(*out, "value_loss"), 1.195, 1e-12);
  EXPECT_NEAR(MetricOf(*out, "value_clipfrac"), 1.5, 1e-12);
  EXPECT_FALSE(ValueLoss(-0.1, b.Reducer(), {b.logp, b.logp, b.logp}).ok());
}

TEST(SftLossTest, NegativeMeanLogProb) {
  // −Reduce(logp) = −[(−1 − .5)/2 − 2 − .2] = 2.95.
  Batch b;
  torch::Tensor logp = b.logp.clone().requires_grad_(true);
  auto out = SftLoss(b.Reducer(), logp);
  ASSERT_TRUE(out.ok());
  EXPECT_NEAR(Item(out->loss), 2.95, 1e-12);
  EXPECT_NEAR(MetricOf(*out, "loss"), 2.95, 1e-12);
  out->loss.backward();
  EXPECT_TRUE(torch::allclose(logp.grad(), D({-0.5, -0.5, -1.0, 0.0, -1.0})));
}

// ---- Edge cases and bad input ----------------------------------------------------------------

TEST(PolicyLossTest, EmptyMicroBatchStaysConnectedAndFloat32Works) {
  auto reducer = LossReducer::Create({}, torch::zeros({0}));
  ASSERT_TRUE(reducer.ok());
  PolicyLossInputs in;
  in.log_probs = torch::zeros({0}, torch::kFloat).requires_grad_(true);
  in.advantages = torch::zeros({0}, torch::kFloat);
  auto out = PolicyLoss(PpoOptions(), *reducer, in);
  ASSERT_TRUE(out.ok());
  EXPECT_TRUE(out->loss.requires_grad());
  EXPECT_EQ(Item(out->loss), 0.0);
  out->loss.backward();

  Batch b;
  in = b.Inputs();
  in.log_probs = b.logp.to(torch::kFloat).requires_grad_(true);
  in.old_log_probs = b.old.to(torch::kFloat);
  in.advantages = b.adv.to(torch::kFloat);
  out = PolicyLoss(PpoOptions(), b.Reducer(), in);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->loss.scalar_type(), torch::kFloat);
  EXPECT_NEAR(Item(out->loss), 3.66261450781, 1e-5);
}

TEST(PolicyLossTest, BadInputNamesWhatIsWrong) {
  Batch b;
  PolicyLossInputs in = b.Inputs();
  in.advantages = D({1, 1, 1});
  auto out = PolicyLoss(PpoOptions(), b.Reducer(), in);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(Msg(out.status()).find("advantages"), std::string::npos);
  EXPECT_NE(Msg(out.status()).find("(5)"), std::string::npos) << out.status();

  in = b.Inputs();
  PolicyLossOptions o = PpoOptions();
  o.use_kl_loss = true;
  EXPECT_NE(Msg(PolicyLoss(o, b.Reducer(), in).status()).find("ref_log_probs"), std::string::npos);
  o = PpoOptions();
  o.use_tis = true;
  EXPECT_NE(Msg(PolicyLoss(o, b.Reducer(), in).status()).find("rollout_log_probs"),
            std::string::npos);
  o = PpoOptions();
  o.entropy_coef = 0.1;
  EXPECT_NE(Msg(PolicyLoss(o, b.Reducer(), in).status()).find("entropy"), std::string::npos);

  o = PpoOptions();
  o.eps_clip_c = 0.5;
  EXPECT_NE(Msg(PolicyLoss(o, b.Reducer(), in).status()).find("eps_clip_c"), std::string::npos);
  o = PpoOptions();
  o.eps_clip = -0.1;
  EXPECT_NE(Msg(o.Validate()).find("eps_clip = -0.1"), std::string::npos);
  o = PpoOptions();
  o.tis_clip_low = 3;
  EXPECT_NE(Msg(o.Validate()).find("tis_clip"), std::string::npos);

  config::AlgorithmConfig a;
  a.tis_type = "mis";
  EXPECT_NE(Msg(PolicyLossOptions::FromConfig(a).status()).find("mis"), std::string::npos);
  a = config::AlgorithmConfig();
  a.advantage_estimator = "dapo";
  EXPECT_NE(Msg(PolicyLossOptions::FromConfig(a).status()).find("dapo"), std::string::npos);
  a = config::AlgorithmConfig();
  a.eps_clip = 0.3;  // unresolved: eps_clip_high falls back to eps_clip
  auto from = PolicyLossOptions::FromConfig(a);
  ASSERT_TRUE(from.ok());
  EXPECT_EQ(from->eps_clip_high, 0.3);

  EXPECT_NE(Msg(SftLoss(b.Reducer(), D({1})).status()).find("log_probs"), std::string::npos);
}

}  // namespace
}  // namespace slime::train
