// KL estimators, advantage estimators, whitening and OPD against
// numbers computed by hand (each literal's formula is in the comment beside it; the values
// were evaluated with plain python3, not with any implementation of slime).
#include "slime/train/advantages.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <vector>

namespace slime::train {
namespace {

torch::Tensor D(std::vector<double> v) { return torch::tensor(v, torch::kDouble); }

void ExpectValues(const torch::Tensor& t, const std::vector<double>& expected, double tol = 1e-9) {
  ASSERT_EQ(t.dim(), 1);
  ASSERT_EQ(t.size(0), static_cast<int64_t>(expected.size()));
  torch::Tensor c = t.detach().to(torch::kDouble).contiguous();
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR(c[i].item<double>(), expected[i], tol) << "element " << i;
  }
}

std::string Msg(const Status& s) { return std::string(s.message()); }

config::AlgorithmConfig Algo(const std::string& estimator) {
  config::AlgorithmConfig a;
  a.advantage_estimator = estimator;
  return a;
}

// ---- 3.2 KL ------------------------------------------------------------------------------

TEST(ComputeApproxKlTest, EstimatorsMatchHandValues) {
  // d = logp − ref = [.2, 0, −1].
  const torch::Tensor logp = D({-1.0, -0.5, -2.0});
  const torch::Tensor ref = D({-1.2, -0.5, -1.0});
  auto k1 = ComputeApproxKl(logp, ref, KlType::kK1);
  ASSERT_TRUE(k1.ok());
  ExpectValues(*k1, {0.2, 0.0, -1.0}, 1e-12);
  auto k2 = ComputeApproxKl(logp, ref, KlType::kK2);  // d²/2
  ASSERT_TRUE(k2.ok());
  ExpectValues(*k2, {0.02, 0.0, 0.5}, 1e-12);
  // exp(−d) − 1 + d: e^−.2 − .8, 0, e − 2.
  for (KlType t : {KlType::kK3, KlType::kLowVarKl}) {
    auto k3 = ComputeApproxKl(logp, ref, t);
    ASSERT_TRUE(k3.ok());
    ExpectValues(*k3, {0.018730753078, 0.0, 0.718281828459}, 1e-11);
  }
  // Unbiased: × importance ratio [2, 1, .5].
  auto unbiased = ComputeApproxKl(logp, ref, KlType::kK3, D({2.0, 1.0, 0.5}));
  ASSERT_TRUE(unbiased.ok());
  ExpectValues(*unbiased, {0.037461506156, 0.0, 0.35914091423}, 1e-11);
}

TEST(ComputeApproxKlTest, LowVarKlIsClampedAndKeepsFloat32) {
  // d = −15: k3 = e^15 − 16 = 3269001.37; low_var_kl clamps to 10.
  auto k3 = ComputeApproxKl(D({-15.0}), D({0.0}), KlType::kK3);
  auto low = ComputeApproxKl(D({-15.0}), D({0.0}), KlType::kLowVarKl);
  ASSERT_TRUE(k3.ok() && low.ok());
  EXPECT_NEAR(k3->item<double>(), std::exp(15.0) - 16.0, 1e-6);
  EXPECT_EQ(low->item<double>(), 10.0);
  // bf16 inputs are computed in float32.
  auto f = ComputeApproxKl(torch::zeros({2}, torch::kBFloat16), torch::zeros({2}, torch::kBFloat16),
                           KlType::kK1);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->scalar_type(), torch::kFloat);
}

TEST(ComputeApproxKlTest, BadInputIsAnError) {
  auto kl = ComputeApproxKl(D({1, 2, 3}), D({1, 2}), KlType::kK1);
  ASSERT_FALSE(kl.ok());
  EXPECT_NE(Msg(kl.status()).find("3 elements"), std::string::npos);
  auto type = ParseKlType("k4");
  ASSERT_FALSE(type.ok());
  EXPECT_NE(Msg(type.status()).find("k4"), std::string::npos);
  EXPECT_NE(Msg(type.status()).find("low_var_kl"), std::string::npos);
  EXPECT_EQ(*ParseKlType("low_var_kl"), KlType::kLowVarKl);
  EXPECT_EQ(KlTypeName(KlType::kK2), "k2");
}

// ---- 3.3 Estimators ----------------------------------------------------------------------

TEST(EstimatorTest, GrpoFamilyBroadcastsTheRewardAndIgnoresRewardKl) {
  for (const char* name : {"grpo", "gspo", "cispo"}) {
    config::AlgorithmConfig a = Algo(name);
    a.kl_coef = 0.5;  // computed (and returned) but not applied to grpo-family advantages
    AdvantageInputs in;
    in.rewards = {0.5, -1.5};
    in.log_probs = {D({-1.0, -0.5}), D({-0.1, -0.2, -0.3})};
    in.ref_log_probs = {D({-1.2, -0.5}), D({-0.1, -0.2, -0.3})};
    in.loss_masks = {D({1, 1}), D({1, 1, 0})};
    auto out = ComputeAdvantagesAndReturns(a, in);
    ASSERT_TRUE(out.ok()) << name << ": " << out.status();
    ExpectValues(out->advantages[0], {0.5, 0.5});
    ExpectValues(out->advantages[1], {-1.5, -1.5, -1.5});
    ExpectValues(out->returns[1], {-1.5, -1.5, -1.5});
    ExpectValues(out->kl[0], {0.2, 0.0}, 1e-12);  // k1 = logp − ref
  }
}

TEST(EstimatorTest, ReinforcePlusPlusDiscountsMaskedKlRewards) {
  // ρ = −.1·kl·m = [−.02, .01, −.03, 0 (masked)], + r = 1 at the last masked-in token (t = 2):
  // G2 = .97, G1 = .01 + .9·.97 = .883, G0 = −.02 + .9·.883 = .7747, G3 = 0.
  auto g = ReinforcePlusPlusReturns({1.0}, {D({0.2, -0.1, 0.3, 0.4})}, {D({1, 1, 1, 0})}, 0.1, 0.9);
  ASSERT_TRUE(g.ok());
  ExpectValues((*g)[0], {0.7747, 0.883, 0.97, 0.0}, 1e-12);

  auto bad = ReinforcePlusPlusReturns({1.0}, {D({0.2, 0.1})}, {D({0, 0})}, 0.1, 0.9);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(Msg(bad.status()).find("sample 0"), std::string::npos);
}

TEST(EstimatorTest, ReinforcePlusPlusPipelineWhitensOverAllTokens) {
  // k1 kl: sample 0 = [.2, .1, −.3, −.4] mask [1,1,1,0], r = 1 → G = [.8053, .917, 1.03, 0];
  //        sample 1 = [0, −.3] mask [1,1], r = −1 → ρ = [0, .03 − 1] → G = [−.873, −.97].
  // Whitening over the 5 masked tokens (Bessel), applied to all 6:
  //   a' = (a − μ)/sqrt(σ² + 1e-8).
  config::AlgorithmConfig a = Algo("reinforce_plus_plus");
  a.kl_coef = 0.1;
  a.gamma = 0.9;
  a.normalize_advantages = true;
  AdvantageInputs in;
  in.rewards = {1.0, -1.0};
  in.log_probs = {D({-1.0, -0.5, -2.0, -0.7}), D({-0.2, -0.4})};
  in.ref_log_probs = {D({-1.2, -0.6, -1.7, -0.3}), D({-0.2, -0.1})};
  in.loss_masks = {D({1, 1, 1, 0}), D({1, 1})};
  auto out = ComputeAdvantagesAndReturns(a, in);
  ASSERT_TRUE(out.ok()) << out.status();
  ExpectValues(out->returns[0], {0.8053, 0.917, 1.03, 0.0}, 1e-12);
  ExpectValues(out->returns[1], {-0.873, -0.97}, 1e-12);
  ExpectValues(out->advantages[0],
               {0.616696233379, 0.727187971587, 0.838965647661, -0.179892815671}, 1e-10);
  ExpectValues(out->advantages[1], {-1.04344955207, -1.13940030056}, 1e-10);
}

TEST(EstimatorTest, ReinforcePlusPlusBaselineSubtractsKlFromTheCenteredReward) {
  // A = r̃ − .1·k3(logp, ref), k3 = exp(−d) − 1 + d with d = [.2, .1, −.3, −.4].
  config::AlgorithmConfig a = Algo("reinforce_plus_plus_baseline");
  a.kl_coef = 0.1;
  a.kl_loss_type = "k3";
  AdvantageInputs in;
  in.rewards = {0.5};
  in.log_probs = {D({-1.0, -0.5, -2.0, -0.7})};
  in.ref_log_probs = {D({-1.2, -0.6, -1.7, -0.3})};
  in.loss_masks = {D({1, 1, 1, 0})};
  auto out = ComputeAdvantagesAndReturns(a, in);
  ASSERT_TRUE(out.ok()) << out.status();
  ExpectValues(out->advantages[0], {0.498126924692, 0.499516258196, 0.495014119242, 0.490817530236},
               1e-11);
}

TEST(EstimatorTest, GaeMatchesTheRecursion) {
  // V = [.5, .4, .3], ρ = [0, 0, 1], γ = .9, λ = .8:
  // δ2 = 1 − .3 = .7 → A2 = .7; δ1 = .9·.3 − .4 = −.13 → A1 = −.13 + .72·.7 = .374;
  // δ0 = .9·.4 − .5 = −.14 → A0 = −.14 + .72·.374 = .12928; Ret = A + V.
  auto gae = GaeAdvantagesAndReturns({D({0, 0, 1})}, {D({0.5, 0.4, 0.3})}, 0.9, 0.8);
  ASSERT_TRUE(gae.ok());
  ExpectValues(gae->advantages[0], {0.12928, 0.374, 0.7}, 1e-12);
  ExpectValues(gae->returns[0], {0.62928, 0.774, 1.0}, 1e-12);
}

TEST(EstimatorTest, PpoAddsTheRewardAtTheLastTokenAndTheKlPenaltyEverywhere) {
  // k1 kl = [.2, 0, −1], kl_coef .1 → ρ = [−.02, 0, .1 + 1]; then GAE with γ .9, λ .8:
  // A = [.16112, .446, .8], Ret = A + V.
  config::AlgorithmConfig a = Algo("ppo");
  a.kl_coef = 0.1;
  a.gamma = 0.9;
  a.lambd = 0.8;
  AdvantageInputs in;
  in.rewards = {1.0};
  in.log_probs = {D({-1.0, -0.5, -2.0})};
  in.ref_log_probs = {D({-1.2, -0.5, -1.0})};
  in.loss_masks = {D({1, 1, 0})};  // the reward goes to the last token whatever its mask
  in.values = {D({0.5, 0.4, 0.3})};
  auto out = ComputeAdvantagesAndReturns(a, in);
  ASSERT_TRUE(out.ok()) << out.status();
  ExpectValues(out->advantages[0], {0.16112, 0.446, 0.8}, 1e-12);
  ExpectValues(out->returns[0], {0.66112, 0.846, 1.1}, 1e-12);
}

// ---- 3.4 / 3.5 ---------------------------------------------------------------------------

TEST(OnPolicyDistillationTest, SubtractsTheScaledReverseKl) {
  // reverse KL = student − teacher = [.5, −1]; A' = 1 − .5·[.5, −1] = [.75, 1.5].
  std::vector<torch::Tensor> adv = {D({1.0, 1.0})};
  auto rk = ApplyOnPolicyDistillation(&adv, {D({-1.0, -2.0})}, {D({-1.5, -1.0})}, 0.5);
  ASSERT_TRUE(rk.ok());
  ExpectValues(adv[0], {0.75, 1.5});
  ExpectValues((*rk)[0], {0.5, -1.0});

  // In the pipeline OPD comes after the estimator; returns keep the pre-OPD values.
  config::AlgorithmConfig a = Algo("grpo");
  a.use_opd = true;
  a.opd_kl_coef = 0.5;
  AdvantageInputs in;
  in.rewards = {1.0};
  in.log_probs = {D({-1.0, -2.0})};
  in.loss_masks = {D({1, 1})};
  in.teacher_log_probs = {D({-1.5, -1.0})};
  auto out = ComputeAdvantagesAndReturns(a, in);
  ASSERT_TRUE(out.ok()) << out.status();
  ExpectValues(out->advantages[0], {0.75, 1.5});
  ExpectValues(out->returns[0], {1.0, 1.0});
  ExpectValues(out->opd_reverse_kl[0], {0.5, -1.0});
}

TEST(WhitenTest, MaskedStatisticsWithBessel) {
  // Masked tokens {1,2,3}: μ = 2, E[a²] − μ² = 14/3 − 4 = 2/3, × 3/2 = 1 → (a − 2)/sqrt(1+1e-8).
  auto w = MaskedWhiten(D({1, 2, 3, 4}), D({1, 1, 1, 0}));
  ASSERT_TRUE(w.ok());
  const double s = std::sqrt(1.0 + 1e-8);
  ExpectValues(*w, {-1 / s, 0.0, 1 / s, 2 / s}, 1e-12);

  auto none = MaskedWhiten(D({1, 2}), D({0, 0}));
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(WhitenTest, StatisticsGoThroughTheAllReduce) {
  // This process holds [1, 2]; a fake peer holds [3] (Σa = 3, Σa² = 9, Σm = 1): the global
  // statistics are those of {1, 2, 3}: μ = 2, σ² = 1.
  int calls = 0;
  AllReduceSumFn peer = [&](torch::Tensor& stats) -> Status {
    ++calls;
    stats += torch::tensor({3.0, 9.0, 1.0}, torch::kDouble);
    return absl::OkStatus();
  };
  auto w = MaskedWhiten(D({1, 2}), D({1, 1}), peer);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(calls, 1);
  const double s = std::sqrt(1.0 + 1e-8);
  ExpectValues(*w, {-1 / s, 0.0}, 1e-12);

  AllReduceSumFn failing = [](torch::Tensor&) -> Status {
    return absl::UnavailableError("peer gone");
  };
  EXPECT_EQ(MaskedWhiten(D({1, 2}), D({1, 1}), failing).status().code(),
            absl::StatusCode::kUnavailable);
}

// ---- Bad input to the pipeline -----------------------------------------------------------

TEST(ComputeAdvantagesTest, BadInputNamesWhatIsWrong) {
  AdvantageInputs in;
  in.rewards = {1.0, 0.0};
  in.log_probs = {D({-1.0, -0.5}), D({-0.1, -0.2})};
  in.loss_masks = {D({1, 1}), D({1, 1, 1})};

  auto out = ComputeAdvantagesAndReturns(Algo("grpo"), in);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(Msg(out.status()).find("log_probs[1] has 2 tokens"), std::string::npos) << out.status();

  in.log_probs[1] = D({-0.1, -0.2, -0.3});
  ASSERT_TRUE(ComputeAdvantagesAndReturns(Algo("grpo"), in).ok());

  out = ComputeAdvantagesAndReturns(Algo("a2c"), in);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(Msg(out.status()).find("a2c"), std::string::npos);

  config::AlgorithmConfig bad_kl = Algo("grpo");
  bad_kl.kl_loss_type = "k9";
  EXPECT_NE(Msg(ComputeAdvantagesAndReturns(bad_kl, in).status()).find("k9"), std::string::npos);

  config::AlgorithmConfig gamma = Algo("ppo");
  gamma.gamma = 1.5;
  EXPECT_NE(Msg(ComputeAdvantagesAndReturns(gamma, in).status()).find("gamma"), std::string::npos);

  // ppo without critic values, KL penalty without reference log-probs, OPD without a teacher.
  EXPECT_NE(Msg(ComputeAdvantagesAndReturns(Algo("ppo"), in).status()).find("values"),
            std::string::npos);
  config::AlgorithmConfig kl = Algo("reinforce_plus_plus");
  kl.kl_coef = 0.1;
  EXPECT_NE(Msg(ComputeAdvantagesAndReturns(kl, in).status()).find("ref_log_probs"),
            std::string::npos);
  config::AlgorithmConfig opd = Algo("grpo");
  opd.use_opd = true;
  EXPECT_NE(Msg(ComputeAdvantagesAndReturns(opd, in).status()).find("teacher_log_probs"),
            std::string::npos);

  in.rewards = {1.0};
  EXPECT_NE(Msg(ComputeAdvantagesAndReturns(Algo("grpo"), in).status()).find("rewards"),
            std::string::npos);
}

}  // namespace
}  // namespace slime::train
