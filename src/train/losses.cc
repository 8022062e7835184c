// Policy, value and SFT losses and slime's loss reduction (docs/algorithms.md).
#include "slime/train/losses.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <cmath>
#include <exception>
#include <utility>

#include "slime/train/loss_registry.h"
#include "torch_guard.h"

namespace slime::train {

using internal::GuardTorch;

namespace {

// `t` must be a floating 1-D tensor of `tokens` elements (when `required` or defined).
Status CheckTokens(std::string_view name, const torch::Tensor& t, int64_t tokens, bool required) {
  if (!t.defined()) {
    if (!required) return absl::OkStatus();
    return absl::InvalidArgumentError(fmt::format("{} is required", name));
  }
  if (t.dim() != 1 || t.size(0) != tokens) {
    return absl::InvalidArgumentError(
        fmt::format("{} must be 1-D with one value per response token of the micro-batch ({}), "
                    "got {} dims and {} elements",
                    name, tokens, t.dim(), t.numel()));
  }
  if (!t.is_floating_point()) {
    return absl::InvalidArgumentError(fmt::format("{} must be floating point", name));
  }
  return absl::OkStatus();
}

Status CheckMin(std::string_view name, double value, double min) {
  if (!std::isfinite(value) || value < min) {
    return absl::InvalidArgumentError(
        fmt::format("{} = {} is out of range: must be a finite value >= {}", name, value, min));
  }
  return absl::OkStatus();
}

torch::Tensor Metric(const torch::Tensor& t) { return t.detach(); }

}  // namespace

// ---- 3.9 Reduction -------------------------------------------------------------------------

StatusOr<LossReducer> LossReducer::Create(std::vector<int64_t> response_lengths,
                                          const torch::Tensor& loss_mask, ReduceOptions options) {
  int64_t total = 0;
  for (size_t i = 0; i < response_lengths.size(); ++i) {
    if (response_lengths[i] < 0) {
      return absl::InvalidArgumentError(
          fmt::format("response_lengths[{}] = {} is negative", i, response_lengths[i]));
    }
    total += response_lengths[i];
  }
  if (!loss_mask.defined() || loss_mask.dim() != 1) {
    return absl::InvalidArgumentError("loss_mask must be a 1-D tensor [T]");
  }
  if (loss_mask.size(0) != total) {
    return absl::InvalidArgumentError(fmt::format(
        "loss_mask has {} tokens but the response lengths sum to {}", loss_mask.size(0), total));
  }
  const size_t b = response_lengths.size();
  if (!options.per_token_loss && !options.sample_denominators.empty() &&
      options.sample_denominators.size() != b) {
    return absl::InvalidArgumentError(
        fmt::format("sample_denominators has {} entries for {} samples",
                    options.sample_denominators.size(), b));
  }
  for (size_t i = 0; i < options.sample_denominators.size(); ++i) {
    if (!std::isfinite(options.sample_denominators[i]) || options.sample_denominators[i] < 0) {
      return absl::InvalidArgumentError(
          fmt::format("sample_denominators[{}] = {} is out of range: must be a finite value >= 0",
                      i, options.sample_denominators[i]));
    }
  }
  if (!std::isfinite(options.step_denominator) || options.step_denominator <= 0) {
    return absl::InvalidArgumentError(
        fmt::format("step_denominator = {} is out of range: must be a finite value > 0",
                    options.step_denominator));
  }

  LossReducer reducer;
  reducer.response_lengths_ = std::move(response_lengths);
  reducer.num_tokens_ = total;
  Status status = GuardTorch("LossReducer", [&]() -> Status {
    const torch::Device device = loss_mask.device();
    const auto f64 = torch::TensorOptions().dtype(torch::kDouble).device(device);
    reducer.loss_mask_ = loss_mask.detach().to(f64);
    std::vector<int64_t> index;
    index.reserve(total);
    for (size_t i = 0; i < b; ++i) {
      index.insert(index.end(), reducer.response_lengths_[i], static_cast<int64_t>(i));
    }
    reducer.sample_index_ =
        torch::tensor(index, torch::TensorOptions().dtype(torch::kLong)).to(device);
    if (options.per_token_loss) {
      reducer.token_scale_ = torch::full({total}, 1.0 / options.step_denominator, f64);
      return absl::OkStatus();
    }
    torch::Tensor per_sample;  // [B] D_i
    if (options.sample_denominators.empty()) {
      per_sample = torch::zeros({static_cast<int64_t>(b)}, f64)
                       .index_add(0, reducer.sample_index_, reducer.loss_mask_);
    } else {
      per_sample = torch::tensor(options.sample_denominators, torch::kDouble).to(device);
    }
    torch::Tensor scale = 1.0 / (per_sample.clamp_min(1.0) * options.step_denominator);
    reducer.token_scale_ = scale.index_select(0, reducer.sample_index_);
    return absl::OkStatus();
  });
  SLIME_RETURN_IF_ERROR(status);
  reducer.options_ = std::move(options);
  return reducer;
}

torch::Tensor LossReducer::Reduce(const torch::Tensor& x) const {
  return ReduceWithMask(x, loss_mask_);
}

torch::Tensor LossReducer::ReduceWithMask(const torch::Tensor& x, const torch::Tensor& mask) const {
  const torch::Tensor weight = mask.to(torch::kDouble) * token_scale_;
  return (x * weight.to(x.scalar_type())).sum();
}

torch::Tensor LossReducer::SampleMeanPerToken(const torch::Tensor& x) const {
  const torch::Tensor m = loss_mask_.to(x.scalar_type());
  const int64_t b = num_samples();
  torch::Tensor sums = torch::zeros({b}, x.options()).index_add(0, sample_index_, x * m);
  torch::Tensor counts = torch::zeros({b}, m.options()).index_add(0, sample_index_, m);
  return (sums / counts.clamp_min(1.0)).index_select(0, sample_index_);
}

// ---- 3.6 Policy loss -----------------------------------------------------------------------

StatusOr<TisType> ParseTisType(std::string_view name) {
  if (name == "tis") return TisType::kTis;
  if (name == "icepop") return TisType::kIcepop;
  return absl::InvalidArgumentError(
      fmt::format("unknown tis_type '{}': valid are tis, icepop", name));
}

StatusOr<PolicyLossOptions> PolicyLossOptions::FromConfig(
    const config::AlgorithmConfig& algorithm) {
  PolicyLossOptions o;
  SLIME_ASSIGN_OR_RETURN(const AdvantageEstimatorSpec* estimator,
                         FindAdvantageEstimator(algorithm.advantage_estimator));
  o.objective = estimator->objective;
  o.eps_clip = algorithm.eps_clip;
  o.eps_clip_high = algorithm.eps_clip_high.value_or(algorithm.eps_clip);
  o.eps_clip_c = algorithm.eps_clip_c;
  o.use_opsm = algorithm.use_opsm;
  o.opsm_delta = algorithm.opsm_delta;
  o.use_tis = algorithm.use_tis;
  o.get_mismatch_metrics = algorithm.get_mismatch_metrics;
  SLIME_ASSIGN_OR_RETURN(o.tis_type, ParseTisType(algorithm.tis_type));
  o.tis_clip = algorithm.tis_clip;
  o.tis_clip_low = algorithm.tis_clip_low;
  o.use_kl_loss = algorithm.use_kl_loss;
  o.kl_loss_coef = algorithm.kl_loss_coef;
  SLIME_ASSIGN_OR_RETURN(o.kl_loss_type, ParseKlType(algorithm.kl_loss_type));
  o.use_unbiased_kl = algorithm.use_unbiased_kl;
  o.entropy_coef = algorithm.entropy_coef;
  o.use_rollout_logprobs = algorithm.use_rollout_logprobs;
  SLIME_RETURN_IF_ERROR(o.Validate());
  return o;
}

Status PolicyLossOptions::Validate() const {
  SLIME_RETURN_IF_ERROR(CheckMin("eps_clip", eps_clip, 0.0));
  SLIME_RETURN_IF_ERROR(CheckMin("eps_clip_high", eps_clip_high, 0.0));
  if (eps_clip_c.has_value() && !(std::isfinite(*eps_clip_c) && *eps_clip_c > 1.0)) {
    return absl::InvalidArgumentError(fmt::format(
        "eps_clip_c = {} is out of range: the dual-clip constant must be > 1 (or unset)",
        *eps_clip_c));
  }
  SLIME_RETURN_IF_ERROR(CheckMin("opsm_delta", opsm_delta, 0.0));
  SLIME_RETURN_IF_ERROR(CheckMin("tis_clip_low", tis_clip_low, 0.0));
  if (!std::isfinite(tis_clip) || tis_clip < tis_clip_low) {
    return absl::InvalidArgumentError(
        fmt::format("tis_clip = {} is out of range: must be finite and >= tis_clip_low ({})",
                    tis_clip, tis_clip_low));
  }
  SLIME_RETURN_IF_ERROR(CheckMin("kl_loss_coef", kl_loss_coef, 0.0));
  if (!std::isfinite(entropy_coef)) {
    return absl::InvalidArgumentError(
        fmt::format("entropy_coef = {} is out of range: must be finite", entropy_coef));
  }
  return absl::OkStatus();
}

StatusOr<LossOutput> PolicyLoss(const PolicyLossOptions& options, const LossReducer& reducer,
                                const PolicyLossInputs& inputs) {
  SLIME_RETURN_IF_ERROR(options.Validate());
  const int64_t t = reducer.num_tokens();
  const bool mismatch = options.use_tis || options.get_mismatch_metrics;
  SLIME_RETURN_IF_ERROR(CheckTokens("log_probs", inputs.log_probs, t, true));
  SLIME_RETURN_IF_ERROR(CheckTokens("advantages", inputs.advantages, t, true));
  SLIME_RETURN_IF_ERROR(CheckTokens("old_log_probs", inputs.old_log_probs, t, false));
  SLIME_RETURN_IF_ERROR(
      CheckTokens("entropy (entropy_coef != 0)", inputs.entropy, t, options.entropy_coef != 0));
  SLIME_RETURN_IF_ERROR(
      CheckTokens("ref_log_probs (use_kl_loss)", inputs.ref_log_probs, t, options.use_kl_loss));
  SLIME_RETURN_IF_ERROR(CheckTokens("rollout_log_probs (use_tis / get_mismatch_metrics)",
                                    inputs.rollout_log_probs, t, mismatch));
  SLIME_RETURN_IF_ERROR(CheckTokens("opd_reverse_kl", inputs.opd_reverse_kl, t, false));

  return GuardTorch("PolicyLoss", [&]() -> StatusOr<LossOutput> {
    LossOutput out;
    const torch::Tensor& log_probs = inputs.log_probs;
    const torch::Tensor old_log_probs =
        inputs.old_log_probs.defined() ? inputs.old_log_probs.detach() : log_probs.detach();
    const torch::Tensor advantages = inputs.advantages.detach();

    // Δ = logp^old − logp per token, or (GSPO) the sample's masked mean of it.
    torch::Tensor ppo_kl = old_log_probs - log_probs;
    if (options.objective == PolicyObjective::kGspo) {
      ppo_kl = reducer.SampleMeanPerToken(ppo_kl);
    }
    const torch::Tensor ratio = (-ppo_kl).exp();
    const double low = 1.0 - options.eps_clip;
    const double high = 1.0 + options.eps_clip_high;

    torch::Tensor pg_losses, clipfrac;
    if (options.objective == PolicyObjective::kCispo) {
      const torch::Tensor truncated = ratio.clamp(low, high);
      pg_losses = -truncated.detach() * advantages * log_probs;
      clipfrac = truncated.ne(ratio).to(log_probs.scalar_type());
    } else {
      const torch::Tensor loss1 = -ratio * advantages;
      const torch::Tensor loss2 = -ratio.clamp(low, high) * advantages;
      pg_losses = torch::maximum(loss1, loss2);
      clipfrac = loss2.gt(loss1).to(log_probs.scalar_type());
      if (options.eps_clip_c.has_value()) {
        const torch::Tensor loss3 = -(*options.eps_clip_c) * advantages;
        pg_losses = torch::where(advantages < 0, torch::minimum(loss3, pg_losses), pg_losses);
      }
    }

    if (options.use_opsm) {
      // Sequence-level off-policyness s_i = masked mean of (logp^old − logp) over sample i.
      const torch::Tensor seq_kl = reducer.SampleMeanPerToken((old_log_probs - log_probs).detach());
      const torch::Tensor masked =
          ((advantages < 0) & (seq_kl > options.opsm_delta)).to(log_probs.scalar_type()) *
          reducer.loss_mask().to(log_probs.scalar_type());
      pg_losses = pg_losses * (1.0 - masked);
      out.metrics["opsm_clipfrac"] = Metric(reducer.Reduce(masked));
    }

    if (mismatch) {
      // Importance weight of the recomputed old policy against the rollout engine's.
      const torch::Tensor rollout = inputs.rollout_log_probs.detach().to(old_log_probs.dtype());
      const torch::Tensor w = (old_log_probs - rollout).exp();
      torch::Tensor weights;
      if (options.tis_type == TisType::kTis) {
        weights = w.clamp(options.tis_clip_low, options.tis_clip);
      } else {
        const torch::Tensor inside = (w >= options.tis_clip_low) & (w <= options.tis_clip);
        weights = torch::where(inside, w, torch::zeros_like(w));
      }
      out.metrics["tis"] = Metric(reducer.Reduce(w));
      out.metrics["tis_clipfrac"] = Metric(reducer.Reduce(weights.ne(w).to(w.scalar_type())));
      out.metrics["tis_abs"] = Metric(reducer.Reduce((w - 1.0).abs()));
      out.metrics["ois"] = Metric(reducer.Reduce(ratio.detach()));
      if (options.use_tis) pg_losses = pg_losses * weights;
    }

    const torch::Tensor pg_loss = reducer.Reduce(pg_losses);
    torch::Tensor loss = pg_loss;
    out.metrics["pg_loss"] = Metric(pg_loss);
    out.metrics["pg_clipfrac"] = Metric(reducer.Reduce(clipfrac));
    out.metrics["ppo_kl"] = Metric(reducer.Reduce(ppo_kl.detach()));

    if (inputs.entropy.defined()) {
      const torch::Tensor entropy_loss = reducer.Reduce(inputs.entropy);
      out.metrics["entropy_loss"] = Metric(entropy_loss);
      // The entropy graph is only used when it contributes (slime materializes its gradient
      // only for entropy_coef != 0).
      if (options.entropy_coef != 0) loss = loss - options.entropy_coef * entropy_loss;
    }

    if (options.use_kl_loss) {
      // kl_loss_coef == 0 logs the KL without a gradient path through it.
      const bool with_grad = options.kl_loss_coef != 0;
      const torch::Tensor kl_log_probs = with_grad ? log_probs : log_probs.detach();
      torch::Tensor importance_ratio;
      if (options.use_unbiased_kl) importance_ratio = (kl_log_probs - old_log_probs).exp();
      StatusOr<torch::Tensor> kl = ComputeApproxKl(kl_log_probs, inputs.ref_log_probs.detach(),
                                                   options.kl_loss_type, importance_ratio);
      if (!kl.ok()) return kl.status();
      const torch::Tensor kl_loss = reducer.Reduce(*kl);
      out.metrics["kl_loss"] = Metric(kl_loss);
      if (with_grad) loss = loss + options.kl_loss_coef * kl_loss.to(loss.scalar_type());
    }

    if (inputs.rollout_log_probs.defined()) {
      const torch::Tensor compared =
          options.use_rollout_logprobs ? log_probs.detach() : old_log_probs;
      const torch::Tensor rollout = inputs.rollout_log_probs.detach().to(compared.dtype());
      out.metrics["train_rollout_logprob_abs_diff"] =
          Metric(reducer.Reduce((compared - rollout).abs()));
    }
    if (inputs.opd_reverse_kl.defined()) {
      out.metrics["opd_reverse_kl"] = Metric(reducer.Reduce(inputs.opd_reverse_kl.detach()));
    }
    out.metrics["loss"] = Metric(loss);
    out.loss = std::move(loss);
    return out;
  });
}

// ---- 3.7 Value loss ------------------------------------------------------------------------

StatusOr<LossOutput> ValueLoss(double value_clip, const LossReducer& reducer,
                               const ValueLossInputs& inputs) {
  SLIME_RETURN_IF_ERROR(CheckMin("value_clip", value_clip, 0.0));
  const int64_t t = reducer.num_tokens();
  SLIME_RETURN_IF_ERROR(CheckTokens("values", inputs.values, t, true));
  SLIME_RETURN_IF_ERROR(CheckTokens("old_values", inputs.old_values, t, true));
  SLIME_RETURN_IF_ERROR(CheckTokens("returns", inputs.returns, t, true));
  return GuardTorch("ValueLoss", [&]() -> StatusOr<LossOutput> {
    const torch::Tensor& values = inputs.values;
    const torch::Tensor old_values = inputs.old_values.detach().to(values.dtype());
    const torch::Tensor returns = inputs.returns.detach().to(values.dtype());
    const torch::Tensor clipfrac =
        ((values.detach() - old_values).abs() > value_clip).to(values.scalar_type());
    const torch::Tensor clipped = old_values + (values - old_values).clamp(-value_clip, value_clip);
    const torch::Tensor surrogate1 = (clipped - returns).pow(2);
    const torch::Tensor surrogate2 = (values - returns).pow(2);
    LossOutput out;
    out.loss = reducer.Reduce(torch::maximum(surrogate1, surrogate2));
    out.metrics["value_loss"] = Metric(out.loss);
    out.metrics["value_clipfrac"] = Metric(reducer.Reduce(clipfrac));
    return out;
  });
}

// ---- 3.8 SFT loss --------------------------------------------------------------------------

StatusOr<LossOutput> SftLoss(const LossReducer& reducer, const torch::Tensor& log_probs) {
  SLIME_RETURN_IF_ERROR(CheckTokens("log_probs", log_probs, reducer.num_tokens(), true));
  return GuardTorch("SftLoss", [&]() -> StatusOr<LossOutput> {
    LossOutput out;
    out.loss = -reducer.Reduce(log_probs);
    out.metrics["loss"] = Metric(out.loss);
    return out;
  });
}

}  // namespace slime::train
