// The training losses of slime (docs/algorithms.md, "Policy loss" … "Loss reduction"): the policy
// loss (PPO clip / dual clip / GSPO / CISPO, OPSM, TIS or icepop, entropy bonus, KL loss), the
// PPO critic's clipped value loss, the SFT loss, and slime's loss reduction.
//
// Representation: one packed micro-batch of B samples. Every per-token tensor is 1-D [T], the
// response tokens of the samples concatenated in sample order (prompt tokens excluded):
//
//   sample              0              1          2
//   response tokens     a0 a1 a2       b0 b1      c0 c1 c2 c3          T = Σ R_i = 9
//   response_lengths    {3, 2, 4}
//   loss_mask [T]       1  1  0        1  1       0  1  1  1
//
// log_probs, old_log_probs, advantages, entropy, values, ... all follow that layout. A
// LossReducer is built once per micro-batch from (response_lengths, loss_mask) and the step's
// denominators, and shared by every loss and metric of that micro-batch.
//
// Reduction and step denominators (docs/algorithms.md, "Loss reduction"). Let m be the loss mask.
//   per-rollout mode (default, slime's "sum of sample mean"):
//     Reduce(x) = Σ_i [Σ_{t∈i} x_t m_t] / max(D_i, 1) / G
//     D_i = the loss-mask tokens of all samples of the optimizer step that share sample i's
//           rollout id (ReduceOptions::sample_denominators; by default sample i's own mask
//           sum, the one-sample-per-rollout case), so a rollout split over micro-batches keeps
//           one denominator;
//     G   = the number of rollouts in the optimizer step, over all data-parallel ranks
//           (ReduceOptions::step_denominator).
//   per-token mode (TrainConfig::calculate_per_token_loss):
//     Reduce(x) = Σ_t x_t m_t / N,  N = the loss-mask tokens of the whole optimizer step over
//     all data-parallel ranks (ReduceOptions::step_denominator).
// With those denominators, the loss of each micro-batch is already scaled: summing the losses
// (and their gradients: plain backward() accumulation over micro-batches, all-reduce SUM over
// DP ranks) of one step gives slime's step objective — (1/G)·Σ_rollouts token-mean, or the
// global token mean. A DP layer that averages gradients instead must pass G/dp (N/dp). The
// metrics are scaled the same way: the step's metric is the sum of its micro-batches' values.
// step_denominator = 1 gives slime's raw per-micro-batch reducer (sum of sample means).
//
// Every loss returns the loss (0-dim, connected to the autograd graph of its inputs, also for
// an empty micro-batch) and its metrics (0-dim, detached) under slime's names.
//
// Thread-safety: pure functions; a LossReducer is immutable after Create and may be shared.
// Bad inputs (shapes, missing tensors, out-of-range options) are InvalidArgument naming the
// field; LibTorch exceptions are returned as InternalError.
#ifndef SLIME_TRAIN_LOSSES_H_
#define SLIME_TRAIN_LOSSES_H_

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "slime/common/status.h"
#include "slime/config/config.h"
#include "slime/train/advantages.h"

namespace slime::train {

// ---- 3.9 Reduction -------------------------------------------------------------------------

struct ReduceOptions {
  bool per_token_loss = false;  // TrainConfig::calculate_per_token_loss
  // Per-rollout mode: D_i for each sample of the micro-batch (size B, each >= 0; clamped to
  // at least 1). Empty: each sample's own loss-mask sum. Ignored in per-token mode.
  std::vector<double> sample_denominators;
  // G (per-rollout mode) or N (per-token mode), see the header comment; > 0.
  double step_denominator = 1.0;
};

class LossReducer {
 public:
  // response_lengths: R_i >= 0 per sample; loss_mask: [T] with T = Σ R_i (any dtype, 0/1).
  // Errors: a negative length, T != loss_mask length, sample_denominators of the wrong size or
  // negative, step_denominator <= 0.
  static StatusOr<LossReducer> Create(std::vector<int64_t> response_lengths,
                                      const torch::Tensor& loss_mask, ReduceOptions options = {});

  // Reduce(x) for x [T] (see the header comment): 0-dim, dtype of x, gradient flows to x.
  torch::Tensor Reduce(const torch::Tensor& x) const;
  // Reduce with another 0/1 mask [T] in the numerator and the same denominators (slime keeps
  // the original per-rollout denominators when a TIS function rejects tokens).
  torch::Tensor ReduceWithMask(const torch::Tensor& x, const torch::Tensor& mask) const;
  // Per-sample masked mean broadcast back to the tokens: for t in sample i,
  // out_t = Σ_{u∈i} x_u m_u / max(Σ_{u∈i} m_u, 1) (the sample's own mask, never D_i). [T].
  torch::Tensor SampleMeanPerToken(const torch::Tensor& x) const;

  int64_t num_tokens() const { return num_tokens_; }
  int64_t num_samples() const { return static_cast<int64_t>(response_lengths_.size()); }
  const std::vector<int64_t>& response_lengths() const { return response_lengths_; }
  const ReduceOptions& options() const { return options_; }
  // [T] float64, on the device of the mask passed to Create.
  const torch::Tensor& loss_mask() const { return loss_mask_; }

 private:
  LossReducer() = default;

  std::vector<int64_t> response_lengths_;
  ReduceOptions options_;
  int64_t num_tokens_ = 0;
  torch::Tensor loss_mask_;     // [T] float64 (0/1)
  torch::Tensor token_scale_;   // [T] float64: 1 / (max(D_i, 1) · G), or 1 / N per token
  torch::Tensor sample_index_;  // [T] int64: the sample each token belongs to
};

// ---- 3.6 Policy loss -----------------------------------------------------------------------

// AlgorithmConfig::tis_type: "tis" truncates importance weights to [tis_clip_low, tis_clip];
// "icepop" keeps weights inside that band and zeroes tokens outside it.
enum class TisType { kTis, kIcepop };
StatusOr<TisType> ParseTisType(std::string_view name);

// The policy-gradient objective; each advantage estimator names one (loss_registry.h).
enum class PolicyObjective {
  kPpoClip,  // PPO clip on the per-token ratio (grpo, ppo, reinforce_plus_plus*)
  kGspo,     // PPO clip on the sequence-level ratio (gspo)
  kCispo,    // the CISPO loss (cispo)
};

struct PolicyLossOptions {
  PolicyObjective objective = PolicyObjective::kPpoClip;
  // Clip range [1 − eps_clip, 1 + eps_clip_high], both >= 0; dual clip c > 1 (unset = off).
  double eps_clip = 0.2;
  double eps_clip_high = 0.2;
  std::optional<double> eps_clip_c;
  // Off-policy sequence masking with threshold opsm_delta >= 0.
  bool use_opsm = false;
  double opsm_delta = 1e-4;
  // use_tis weights the loss by old/rollout importance weights; get_mismatch_metrics only
  // reports them. Band [tis_clip_low, tis_clip], 0 <= tis_clip_low <= tis_clip.
  bool use_tis = false;
  bool get_mismatch_metrics = false;
  TisType tis_type = TisType::kTis;
  double tis_clip = 2.0;
  double tis_clip_low = 0.0;
  // KL(π‖π_ref) term; kl_loss_coef >= 0, 0 = logged without a gradient path.
  bool use_kl_loss = false;
  double kl_loss_coef = 0.0;
  KlType kl_loss_type = KlType::kK1;
  bool use_unbiased_kl = false;  // KL × exp(logp − logp_old)
  double entropy_coef = 0.0;     // loss −= entropy_coef · Reduce(H)
  // old_log_probs are the rollout's: the abs-diff metric compares the current logp instead.
  bool use_rollout_logprobs = false;

  // From a resolved AlgorithmConfig (eps_clip_high unset = eps_clip; the objective of the
  // advantage_estimator's row in loss_registry.h); validated.
  static StatusOr<PolicyLossOptions> FromConfig(const config::AlgorithmConfig& algorithm);
  // Range checks; the error names the option, its value and the valid range.
  Status Validate() const;
};

// Per-token inputs, all [T] in the packed layout. Only log_probs and entropy carry gradients;
// the others are treated as constants (detached).
struct PolicyLossInputs {
  torch::Tensor log_probs;          // logp under the policy being trained (requires grad)
  torch::Tensor advantages;         // A
  torch::Tensor old_log_probs;      // logp^old; undefined = log_probs (ratio ≡ 1: slime skips
                                    // the old-log-prob pass when training on-policy)
  torch::Tensor entropy;            // H (with grad); optional unless entropy_coef != 0
  torch::Tensor ref_log_probs;      // logp^ref; required with use_kl_loss
  torch::Tensor rollout_log_probs;  // logp^roll; required with use_tis / get_mismatch_metrics;
                                    // when given, train_rollout_logprob_abs_diff is reported
  torch::Tensor opd_reverse_kl;     // from ComputeAdvantagesAndReturns (use_opd); logged only
};

struct LossOutput {
  torch::Tensor loss;                            // 0-dim; call backward() on it
  std::map<std::string, torch::Tensor> metrics;  // 0-dim, detached, scaled like the loss
};

// slime's policy_loss_function. Per token, Δ_t = logp^old_t − logp_t (GSPO: the sample's
// masked mean of Δ, broadcast) and ρ_t = exp(−Δ_t):
//   PPO:   L = max(−ρA, −clip(ρ, 1−ε_low, 1+ε_high)·A), clipfrac = 1[second > first];
//          dual clip (eps_clip_c = c): L = min(−cA, L) where A < 0.
//   CISPO: L = −sg(clip(ρ, 1−ε_low, 1+ε_high))·A·logp, clipfrac = 1[clip(ρ) ≠ ρ].
//   OPSM:  L_t ← 0 where A_t < 0, m_t = 1 and the sample's masked mean Δ > opsm_delta.
//   TIS:   w = exp(logp^old − logp^roll); tis: L ← L·clamp(w, lo, hi); icepop: L ← L·w inside
//          [lo, hi], 0 outside (metrics with get_mismatch_metrics, loss weighted only with
//          use_tis).
//   loss = Reduce(L) − entropy_coef·Reduce(H) + kl_loss_coef·Reduce(KLest(logp, logp^ref)
//          [× exp(logp − logp^old) when use_unbiased_kl]).
// Metrics: loss, pg_loss, pg_clipfrac, ppo_kl (= Reduce(Δ)); entropy_loss (entropy given);
// kl_loss (use_kl_loss); tis, ois (= Reduce(ρ)), tis_clipfrac, tis_abs (= Reduce(|w − 1|))
// (use_tis or get_mismatch_metrics); train_rollout_logprob_abs_diff (= Reduce(|logp^old −
// logp^roll|), the current logp with use_rollout_logprobs) when rollout_log_probs is given;
// opsm_clipfrac (use_opsm); opd_reverse_kl (when given).
StatusOr<LossOutput> PolicyLoss(const PolicyLossOptions& options, const LossReducer& reducer,
                                const PolicyLossInputs& inputs);

// ---- 3.7 Value loss ------------------------------------------------------------------------

struct ValueLossInputs {
  torch::Tensor values;      // [T] critic values being trained (requires grad)
  torch::Tensor old_values;  // [T] the values of the forward-only pass (GAE's V)
  torch::Tensor returns;     // [T] GAE returns
};

// v̂ = v_old + clip(v − v_old, −c, c); L = max((v̂ − Ret)², (v − Ret)²) (no ½);
// loss = Reduce(L). Metrics: value_loss, value_clipfrac (= Reduce(1[|v − v_old| > c])).
// Errors: value_clip < 0, shapes.
StatusOr<LossOutput> ValueLoss(double value_clip, const LossReducer& reducer,
                               const ValueLossInputs& inputs);

// ---- 3.8 SFT loss --------------------------------------------------------------------------

// loss = −Reduce(logp) (token NLL over the loss-masked response). Metrics: loss.
StatusOr<LossOutput> SftLoss(const LossReducer& reducer, const torch::Tensor& log_probs);

}  // namespace slime::train

#endif  // SLIME_TRAIN_LOSSES_H_
