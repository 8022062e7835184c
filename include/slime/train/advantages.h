// Per-token KL estimators and advantage estimators, exactly as slime computes them
// (docs/algorithms.md, "KL estimators" to "Advantage whitening").
//
// The pipeline for one rollout, in slime's order:
//   1. reward::NormalizeGroupRewards (reward/reward_postprocess.h; the rollout coordinator, on
//      the CPU): raw scalar rewards → r̃ (group normalization for
//      grpo/gspo/cispo/reinforce_plus_plus_baseline), shipped in data::TrainSample::reward.
//   2. ComputeAdvantagesAndReturns (trainer): per-token reward KL (kl_coef), the estimator,
//      on-policy distillation (use_opd), then masked whitening (normalize_advantages).
// Each stage is also a public function of its own so it can be tested and reused.
//
// Layout: a batch of B samples is held per sample. Sample i has R_i response tokens and every
// per-token tensor of it is 1-D [R_i] (response tokens only, prompt excluded), in the order
// the tokens were generated. Scalar rewards are one double per sample.
//
// Numerics: KL is computed in float32 (float64 when the inputs are float64); scans (GAE,
// discounted returns) run on the CPU in double and come back in the dtype and device of their
// input. Results never require grad (advantages are constants of the policy loss).
//
// Thread-safety: every function is pure; concurrent calls are safe. LibTorch errors are caught
// and returned as InternalError with context.
#ifndef SLIME_TRAIN_ADVANTAGES_H_
#define SLIME_TRAIN_ADVANTAGES_H_

#include <torch/types.h>

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "slime/common/status.h"
#include "slime/config/config.h"

namespace slime::train {

// ---- Names -------------------------------------------------------------------------------
// (AlgorithmConfig::advantage_estimator selects a row of loss_registry.h.)

// AlgorithmConfig::kl_loss_type; used for the reward KL and for the KL loss.
enum class KlType { kK1, kK2, kK3, kLowVarKl };

// "k1", "k2", "k3", "low_var_kl"; anything else is InvalidArgument listing those names.
StatusOr<KlType> ParseKlType(std::string_view name);
std::string_view KlTypeName(KlType type);

// ---- 3.2 Per-token KL ----------------------------------------------------------------------

// KL estimate per token between the policy of `log_probs` and the base policy of
// `base_log_probs` (both [n], same shape), with d = log_probs − base_log_probs:
//   k1: d;  k2: d² / 2;  k3 and low_var_kl: exp(−d) − 1 + d (non-negative).
// When `importance_ratio` is defined ([n], slime's use_unbiased_kl: exp(logp − logp_old)) the
// estimate is multiplied by it; low_var_kl is then clamped to [−10, 10]. Gradients flow
// through every defined input. Errors: shapes differ, non-floating inputs.
StatusOr<torch::Tensor> ComputeApproxKl(const torch::Tensor& log_probs,
                                        const torch::Tensor& base_log_probs, KlType type,
                                        const torch::Tensor& importance_ratio = {});

// ---- 3.3 Estimators (per sample, [R_i] tensors) --------------------------------------------

// grpo / gspo / cispo: A_{i,t} = R_{i,t} = r̃_i on every response token (the reward KL is not
// applied). `like[i]` gives the shape, dtype and device of sample i.
StatusOr<std::vector<torch::Tensor>> GrpoAdvantages(const std::vector<double>& rewards,
                                                    const std::vector<torch::Tensor>& like);

// reinforce_plus_plus_baseline: A_{i,t} = r̃_i − kl_coef · kl_{i,t} (r̃ already group-mean
// centered by reward::NormalizeGroupRewards).
StatusOr<std::vector<torch::Tensor>> ReinforcePlusPlusBaselineAdvantages(
    const std::vector<double>& rewards, const std::vector<torch::Tensor>& kl, double kl_coef);

// reinforce_plus_plus: token rewards ρ_t = −kl_coef · kl_t · m_t, plus r_i at the last token
// with m = 1; G_t = Σ_{k≥t} γ^{k−t} ρ_k over the whole response. Returns G (= A).
// Errors: a sample whose loss mask is all zero (its reward would have no token; slime asserts).
StatusOr<std::vector<torch::Tensor>> ReinforcePlusPlusReturns(
    const std::vector<double>& rewards, const std::vector<torch::Tensor>& kl,
    const std::vector<torch::Tensor>& loss_masks, double kl_coef, double gamma);

struct AdvantagesAndReturns {
  std::vector<torch::Tensor> advantages;  // [R_i] each
  std::vector<torch::Tensor> returns;     // [R_i] each
};

// ppo (GAE): given the token rewards ρ_{i,t} and the critic's values V_{i,t} (both [R_i]),
// δ_t = ρ_t + γ V_{t+1} − V_t with V_{R_i} = 0, A_t = δ_t + γλ A_{t+1}, Ret_t = A_t + V_t.
StatusOr<AdvantagesAndReturns> GaeAdvantagesAndReturns(
    const std::vector<torch::Tensor>& token_rewards, const std::vector<torch::Tensor>& values,
    double gamma, double lambd);

// ---- 3.4 On-policy distillation --------------------------------------------------------------

// A_{i,t} ← A_{i,t} − opd_kl_coef · (logp^student_{i,t} − logp^teacher_{i,t}), in place on the
// vector (new tensors; the old ones are not modified). Returns the per-token reverse KL
// (student − teacher), which the policy loss logs as opd_reverse_kl.
StatusOr<std::vector<torch::Tensor>> ApplyOnPolicyDistillation(
    std::vector<torch::Tensor>* advantages, const std::vector<torch::Tensor>& student_log_probs,
    const std::vector<torch::Tensor>& teacher_log_probs, double opd_kl_coef);

// ---- 3.5 Whitening -----------------------------------------------------------------------

// Sums a small float64 tensor element-wise over the processes that share the whitening
// statistics (slime: the DP×CP group), in place. The tensor lives on the device of the
// advantages (on the CPU for a process without samples, which must still join). Empty
// function = this process alone.
using AllReduceSumFn = std::function<Status(torch::Tensor&)>;

// Masked whitening over all tokens of the step: values and mask are flat [N] (mask 0/1).
//   μ = Σ a m / Σ m,  σ² = (Σ a² m / Σ m − μ²) · N/(N−1) with N = Σ m (Bessel only if N ≥ 2),
//   a' = (a − μ) / sqrt(σ² + 1e-8)   for every token, masked or not.
// Σ a m, Σ a² m and Σ m are all-reduced through `all_reduce` first. Errors: shapes differ,
// the (global) mask sum is 0 (FailedPrecondition), or the all-reduce fails.
StatusOr<torch::Tensor> MaskedWhiten(const torch::Tensor& values, const torch::Tensor& mask,
                                     const AllReduceSumFn& all_reduce = {});

// ---- The whole stage --------------------------------------------------------------------

struct AdvantageInputs {
  std::vector<double> rewards;                   // r̃_i (NormalizeGroupRewards output), size B
  std::vector<torch::Tensor> log_probs;          // [R_i] π_old (the rollout's log-probs when
                                                 // use_rollout_logprobs); always required
  std::vector<torch::Tensor> ref_log_probs;      // [R_i]; required when kl_coef != 0
  std::vector<torch::Tensor> loss_masks;         // [R_i] 0/1; always required
  std::vector<torch::Tensor> values;             // [R_i] critic values; ppo only
  std::vector<torch::Tensor> teacher_log_probs;  // [R_i]; use_opd only
};

struct AdvantageOutputs {
  std::vector<torch::Tensor> advantages;      // [R_i] after OPD and whitening
  std::vector<torch::Tensor> returns;         // [R_i] before OPD and whitening (critic target)
  std::vector<torch::Tensor> kl;              // [R_i] reward KL (zeros when kl_coef == 0)
  std::vector<torch::Tensor> opd_reverse_kl;  // [R_i] when use_opd, else empty
};

// slime's compute_advantages_and_returns: kl_t = KLest(logp^old, logp^ref) with kl_loss_type
// (zeros when kl_coef == 0), then the estimator of `algorithm` (its AdvantageFn in
// loss_registry.h):
//   grpo/gspo/cispo: GrpoAdvantages; returns = advantages.
//   ppo: ρ_t = −kl_coef · kl_t, + r̃_i at the last response token (whatever its mask); GAE.
//   reinforce_plus_plus: ReinforcePlusPlusReturns; returns = advantages.
//   reinforce_plus_plus_baseline: ReinforcePlusPlusBaselineAdvantages; returns = advantages.
// then ApplyOnPolicyDistillation (use_opd, student = log_probs) and MaskedWhiten over all
// tokens of all samples (normalize_advantages).
// Errors name the offending field and sample: counts that differ from B, a tensor whose
// length differs from the sample's loss mask, missing ref / values (an estimator with a
// critic) / teacher inputs, an unknown estimator or KL type, gamma or lambd outside [0, 1],
// negative kl_coef or opd_kl_coef.
StatusOr<AdvantageOutputs> ComputeAdvantagesAndReturns(const config::AlgorithmConfig& algorithm,
                                                       const AdvantageInputs& inputs,
                                                       const AllReduceSumFn& all_reduce = {});

}  // namespace slime::train

#endif  // SLIME_TRAIN_ADVANTAGES_H_
