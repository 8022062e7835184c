// KL estimators and advantage estimators (docs/algorithms.md).
#include "slime/train/advantages.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <utility>

#include "slime/train/loss_registry.h"
#include "torch_guard.h"

namespace slime::train {

using internal::GuardTorch;

namespace {

// float64 stays float64 (tests, gradient checks); everything else is computed in float32.
torch::ScalarType ComputeDtype(const torch::Tensor& t) {
  return t.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
}

// Copies a 1-D tensor to a host vector of doubles.
std::vector<double> ToHost(const torch::Tensor& t) {
  torch::Tensor c = t.detach().to(torch::kCPU, torch::kDouble).contiguous();
  const double* p = c.data_ptr<double>();
  return std::vector<double>(p, p + c.numel());
}

// A host vector as a tensor with `options` (dtype and device of the sample it belongs to).
torch::Tensor FromHost(const std::vector<double>& v, const torch::TensorOptions& options) {
  torch::Tensor host = torch::empty({static_cast<int64_t>(v.size())}, torch::kDouble);
  std::copy(v.begin(), v.end(), host.data_ptr<double>());
  return host.to(options);
}

// Checks that `tensors` has one 1-D tensor per sample, of the sample's length.
Status CheckPerSample(std::string_view name, const std::vector<torch::Tensor>& tensors,
                      const std::vector<int64_t>& lengths) {
  if (tensors.size() != lengths.size()) {
    return absl::InvalidArgumentError(
        fmt::format("{} has {} entries for {} samples", name, tensors.size(), lengths.size()));
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    const torch::Tensor& t = tensors[i];
    if (!t.defined() || t.dim() != 1) {
      return absl::InvalidArgumentError(
          fmt::format("{}[{}] must be a 1-D tensor of the sample's response tokens", name, i));
    }
    if (t.size(0) != lengths[i]) {
      return absl::InvalidArgumentError(
          fmt::format("{}[{}] has {} tokens but sample {} has {} response tokens (loss mask)", name,
                      i, t.size(0), i, lengths[i]));
    }
    if (!t.is_floating_point()) {
      return absl::InvalidArgumentError(fmt::format("{}[{}] must be floating point", name, i));
    }
  }
  return absl::OkStatus();
}

Status CheckUnitInterval(std::string_view name, double value) {
  if (!(value >= 0.0 && value <= 1.0)) {
    return absl::InvalidArgumentError(
        fmt::format("algorithm.{} = {} is out of range: must be in [0, 1]", name, value));
  }
  return absl::OkStatus();
}

Status CheckNonNegative(std::string_view name, double value) {
  if (!(value >= 0.0) || !std::isfinite(value)) {
    return absl::InvalidArgumentError(
        fmt::format("algorithm.{} = {} is out of range: must be a finite value >= 0", name, value));
  }
  return absl::OkStatus();
}

}  // namespace

// ---- Names -------------------------------------------------------------------------------

StatusOr<KlType> ParseKlType(std::string_view name) {
  if (name == "k1") return KlType::kK1;
  if (name == "k2") return KlType::kK2;
  if (name == "k3") return KlType::kK3;
  if (name == "low_var_kl") return KlType::kLowVarKl;
  return absl::InvalidArgumentError(
      fmt::format("unknown kl_loss_type '{}': valid are k1, k2, k3, low_var_kl", name));
}

std::string_view KlTypeName(KlType type) {
  switch (type) {
    case KlType::kK1:
      return "k1";
    case KlType::kK2:
      return "k2";
    case KlType::kK3:
      return "k3";
    case KlType::kLowVarKl:
      return "low_var_kl";
  }
  return "?";
}

// ---- 3.2 Per-token KL ----------------------------------------------------------------------

StatusOr<torch::Tensor> ComputeApproxKl(const torch::Tensor& log_probs,
                                        const torch::Tensor& base_log_probs, KlType type,
                                        const torch::Tensor& importance_ratio) {
  if (!log_probs.defined() || !base_log_probs.defined()) {
    return absl::InvalidArgumentError("ComputeApproxKl: log_probs and base_log_probs are required");
  }
  if (log_probs.sizes() != base_log_probs.sizes()) {
    return absl::InvalidArgumentError(
        fmt::format("ComputeApproxKl: log_probs has {} elements but base_log_probs has {}",
                    log_probs.numel(), base_log_probs.numel()));
  }
  if (importance_ratio.defined() && importance_ratio.sizes() != log_probs.sizes()) {
    return absl::InvalidArgumentError(
        fmt::format("ComputeApproxKl: importance_ratio has {} elements but log_probs has {}",
                    importance_ratio.numel(), log_probs.numel()));
  }
  if (!log_probs.is_floating_point() || !base_log_probs.is_floating_point() ||
      (importance_ratio.defined() && !importance_ratio.is_floating_point())) {
    return absl::InvalidArgumentError("ComputeApproxKl: inputs must be floating point");
  }
  return GuardTorch("ComputeApproxKl", [&]() -> StatusOr<torch::Tensor> {
    const torch::ScalarType dtype =
        base_log_probs.scalar_type() == torch::kDouble ? torch::kDouble : ComputeDtype(log_probs);
    torch::Tensor d = log_probs.to(dtype) - base_log_probs.to(dtype);
    torch::Tensor kl;
    switch (type) {
      case KlType::kK1:
        kl = d;
        break;
      case KlType::kK2:
        kl = d * d / 2.0;
        break;
      case KlType::kK3:
      case KlType::kLowVarKl: {
        torch::Tensor u = -d;  // log(π_base / π)
        kl = u.exp() - 1.0 - u;
        break;
      }
    }
    if (importance_ratio.defined()) kl = importance_ratio.to(dtype) * kl;
    if (type == KlType::kLowVarKl) kl = kl.clamp(-10.0, 10.0);
    return kl;
  });
}

// ---- 3.3 Estimators ----------------------------------------------------------------------

StatusOr<std::vector<torch::Tensor>> GrpoAdvantages(const std::vector<double>& rewards,
                                                    const std::vector<torch::Tensor>& like) {
  if (rewards.size() != like.size()) {
    return absl::InvalidArgumentError(
        fmt::format("GrpoAdvantages: {} rewards for {} samples", rewards.size(), like.size()));
  }
  return GuardTorch("GrpoAdvantages", [&]() -> StatusOr<std::vector<torch::Tensor>> {
    std::vector<torch::Tensor> out;
    out.reserve(like.size());
    for (size_t i = 0; i < like.size(); ++i) {
      out.push_back(torch::full_like(like[i].detach(), rewards[i]));
    }
    return out;
  });
}

StatusOr<std::vector<torch::Tensor>> ReinforcePlusPlusBaselineAdvantages(
    const std::vector<double>& rewards, const std::vector<torch::Tensor>& kl, double kl_coef) {
  if (rewards.size() != kl.size()) {
    return absl::InvalidArgumentError(
        fmt::format("ReinforcePlusPlusBaselineAdvantages: {} rewards for {} samples",
                    rewards.size(), kl.size()));
  }
  return GuardTorch("ReinforcePlusPlusBaselineAdvantages",
                    [&]() -> StatusOr<std::vector<torch::Tensor>> {
                      std::vector<torch::Tensor> out;
                      out.reserve(kl.size());
                      for (size_t i = 0; i < kl.size(); ++i) {
                        torch::Tensor k = kl[i].detach();
                        out.push_back(torch::full_like(k, rewards[i]) - kl_coef * k);
                      }
                      return out;
                    });
}

StatusOr<std::vector<torch::Tensor>> ReinforcePlusPlusReturns(
    const std::vector<double>& rewards, const std::vector<torch::Tensor>& kl,
    const std::vector<torch::Tensor>& loss_masks, double kl_coef, double gamma) {
  if (rewards.size() != kl.size() || loss_masks.size() != kl.size()) {
    return absl::InvalidArgumentError(
        fmt::format("ReinforcePlusPlusReturns: {} rewards, {} kl and {} loss masks must agree",
                    rewards.size(), kl.size(), loss_masks.size()));
  }
  return GuardTorch("ReinforcePlusPlusReturns", [&]() -> StatusOr<std::vector<torch::Tensor>> {
    std::vector<torch::Tensor> out;
    out.reserve(kl.size());
    for (size_t i = 0; i < kl.size(); ++i) {
      if (kl[i].numel() != loss_masks[i].numel()) {
        return absl::InvalidArgumentError(
            fmt::format("ReinforcePlusPlusReturns: sample {} has {} kl values but {} mask values",
                        i, kl[i].numel(), loss_masks[i].numel()));
      }
      const std::vector<double> k = ToHost(kl[i]);
      const std::vector<double> m = ToHost(loss_masks[i]);
      int64_t last = -1;
      for (int64_t t = static_cast<int64_t>(m.size()) - 1; t >= 0; --t) {
        if (m[t] != 0) {
          last = t;
          break;
        }
      }
      if (last < 0) {
        return absl::InvalidArgumentError(fmt::format(
            "reinforce_plus_plus: sample {} has no token with loss mask 1, so its reward has no "
            "token to go to (slime asserts the same)",
            i));
      }
      std::vector<double> g(k.size());
      double running = 0.0;
      for (int64_t t = static_cast<int64_t>(k.size()) - 1; t >= 0; --t) {
        double rho = -kl_coef * k[t] * m[t];
        if (t == last) rho += rewards[i];
        running = rho + gamma * running;
        g[t] = running;
      }
      out.push_back(FromHost(g, kl[i].options()));
    }
    return out;
  });
}

StatusOr<AdvantagesAndReturns> GaeAdvantagesAndReturns(
    const std::vector<torch::Tensor>& token_rewards, const std::vector<torch::Tensor>& values,
    double gamma, double lambd) {
  if (token_rewards.size() != values.size()) {
    return absl::InvalidArgumentError(
        fmt::format("GaeAdvantagesAndReturns: {} reward tensors for {} value tensors",
                    token_rewards.size(), values.size()));
  }
  return GuardTorch("GaeAdvantagesAndReturns", [&]() -> StatusOr<AdvantagesAndReturns> {
    AdvantagesAndReturns out;
    for (size_t i = 0; i < values.size(); ++i) {
      if (token_rewards[i].numel() != values[i].numel()) {
        return absl::InvalidArgumentError(
            fmt::format("GaeAdvantagesAndReturns: sample {} has {} rewards but {} values", i,
                        token_rewards[i].numel(), values[i].numel()));
      }
      const std::vector<double> r = ToHost(token_rewards[i]);
      const std::vector<double> v = ToHost(values[i]);
      std::vector<double> adv(v.size());
      double last_gae = 0.0;
      for (int64_t t = static_cast<int64_t>(v.size()) - 1; t >= 0; --t) {
        const double next_value = t + 1 < static_cast<int64_t>(v.size()) ? v[t + 1] : 0.0;
        const double delta = r[t] + gamma * next_value - v[t];
        last_gae = delta + gamma * lambd * last_gae;
        adv[t] = last_gae;
      }
      torch::Tensor a = FromHost(adv, values[i].options());
      out.returns.push_back(a + values[i].detach());
      out.advantages.push_back(std::move(a));
    }
    return out;
  });
}

// ---- 3.4 On-policy distillation ----------------------------------------------------------

StatusOr<std::vector<torch::Tensor>> ApplyOnPolicyDistillation(
    std::vector<torch::Tensor>* advantages, const std::vector<torch::Tensor>& student_log_probs,
    const std::vector<torch::Tensor>& teacher_log_probs, double opd_kl_coef) {
  const size_t b = advantages->size();
  if (student_log_probs.size() != b || teacher_log_probs.size() != b) {
    return absl::InvalidArgumentError(fmt::format(
        "on-policy distillation: {} advantages, {} student and {} teacher log-prob tensors must "
        "agree",
        b, student_log_probs.size(), teacher_log_probs.size()));
  }
  for (size_t i = 0; i < b; ++i) {
    const int64_t n = (*advantages)[i].numel();
    if (student_log_probs[i].numel() != n || teacher_log_probs[i].numel() != n) {
      return absl::InvalidArgumentError(fmt::format(
          "on-policy distillation: sample {} has {} advantages, {} student and {} teacher "
          "log-probs",
          i, n, student_log_probs[i].numel(), teacher_log_probs[i].numel()));
    }
  }
  return GuardTorch("ApplyOnPolicyDistillation", [&]() -> StatusOr<std::vector<torch::Tensor>> {
    std::vector<torch::Tensor> reverse_kl;
    reverse_kl.reserve(b);
    for (size_t i = 0; i < b; ++i) {
      torch::Tensor rk = student_log_probs[i].detach() - teacher_log_probs[i].detach();
      (*advantages)[i] = (*advantages)[i] - opd_kl_coef * rk;
      reverse_kl.push_back(std::move(rk));
    }
    return reverse_kl;
  });
}

// ---- 3.5 Whitening -----------------------------------------------------------------------

StatusOr<torch::Tensor> MaskedWhiten(const torch::Tensor& values, const torch::Tensor& mask,
                                     const AllReduceSumFn& all_reduce) {
  if (!values.defined() || !mask.defined() || values.sizes() != mask.sizes()) {
    return absl::InvalidArgumentError(fmt::format(
        "MaskedWhiten: values ({} elements) and mask ({} elements) must have the same shape",
        values.defined() ? values.numel() : 0, mask.defined() ? mask.numel() : 0));
  }
  torch::Tensor stats;
  Status status = GuardTorch("MaskedWhiten", [&]() -> Status {
    torch::Tensor v = values.detach().to(torch::kDouble);
    torch::Tensor m = mask.detach().to(torch::kDouble);
    stats = torch::stack({(v * m).sum(), (v * v * m).sum(), m.sum()});
    return absl::OkStatus();
  });
  SLIME_RETURN_IF_ERROR(status);
  if (all_reduce) SLIME_RETURN_IF_ERROR(all_reduce(stats));
  return GuardTorch("MaskedWhiten", [&]() -> StatusOr<torch::Tensor> {
    const std::vector<double> s = ToHost(stats);
    const double sum = s[0], sum_sq = s[1], count = s[2];
    if (count == 0) {
      return absl::FailedPreconditionError(
          "MaskedWhiten: the loss mask sum over all participating processes is zero (no "
          "response token to whiten)");
    }
    const double mean = sum / count;
    double var = sum_sq / count - mean * mean;
    if (count >= 2) var *= count / (count - 1);
    const double inv_std = 1.0 / std::sqrt(var + 1e-8);
    return (values.detach() - mean) * inv_std;
  });
}

// ---- The whole stage --------------------------------------------------------------------

namespace {

// The options' ranges and the inputs' shapes; returns R_i per sample (the loss masks define B
// and every R_i). Every input the options need must be there.
StatusOr<std::vector<int64_t>> CheckAdvantageInputs(const config::AlgorithmConfig& algorithm,
                                                    const AdvantageEstimatorSpec& estimator,
                                                    const AdvantageInputs& inputs) {
  SLIME_RETURN_IF_ERROR(CheckUnitInterval("gamma", algorithm.gamma));
  SLIME_RETURN_IF_ERROR(CheckUnitInterval("lambd", algorithm.lambd));
  SLIME_RETURN_IF_ERROR(CheckNonNegative("kl_coef", algorithm.kl_coef));
  SLIME_RETURN_IF_ERROR(CheckNonNegative("opd_kl_coef", algorithm.opd_kl_coef));
  const size_t b = inputs.loss_masks.size();
  std::vector<int64_t> lengths(b);
  for (size_t i = 0; i < b; ++i) {
    const torch::Tensor& m = inputs.loss_masks[i];
    if (!m.defined() || m.dim() != 1) {
      return absl::InvalidArgumentError(
          fmt::format("loss_masks[{}] must be a 1-D tensor of the sample's response tokens", i));
    }
    lengths[i] = m.size(0);
  }
  if (inputs.rewards.size() != b) {
    return absl::InvalidArgumentError(
        fmt::format("rewards has {} entries for {} samples", inputs.rewards.size(), b));
  }
  for (size_t i = 0; i < b; ++i) {
    if (!std::isfinite(inputs.rewards[i])) {
      return absl::InvalidArgumentError(
          fmt::format("reward of sample {} is {}: rewards must be finite", i, inputs.rewards[i]));
    }
  }
  SLIME_RETURN_IF_ERROR(CheckPerSample("log_probs", inputs.log_probs, lengths));
  if (algorithm.kl_coef != 0) {
    SLIME_RETURN_IF_ERROR(
        CheckPerSample("ref_log_probs (kl_coef != 0)", inputs.ref_log_probs, lengths));
  }
  if (estimator.info().critic) {
    SLIME_RETURN_IF_ERROR(
        CheckPerSample(fmt::format("values ({})", estimator.name), inputs.values, lengths));
  }
  if (algorithm.use_opd) {
    SLIME_RETURN_IF_ERROR(
        CheckPerSample("teacher_log_probs (use_opd)", inputs.teacher_log_probs, lengths));
  }
  return lengths;
}

// The reward KL per sample: KLest(π_old, π_ref), or zeros when kl_coef == 0 (no reference).
StatusOr<std::vector<torch::Tensor>> RewardKl(const config::AlgorithmConfig& algorithm,
                                              KlType kl_type, const AdvantageInputs& inputs) {
  std::vector<torch::Tensor> out;
  for (size_t i = 0; i < inputs.loss_masks.size(); ++i) {
    if (algorithm.kl_coef != 0) {
      SLIME_ASSIGN_OR_RETURN(
          torch::Tensor kl,
          ComputeApproxKl(inputs.log_probs[i].detach(), inputs.ref_log_probs[i].detach(), kl_type));
      out.push_back(std::move(kl));
    } else {
      SLIME_ASSIGN_OR_RETURN(
          torch::Tensor zeros, GuardTorch("reward kl", [&]() -> StatusOr<torch::Tensor> {
            const torch::Tensor& lp = inputs.log_probs[i];
            return torch::zeros_like(lp.detach(), lp.options().dtype(ComputeDtype(lp)));
          }));
      out.push_back(std::move(zeros));
    }
  }
  return out;
}

// MaskedWhiten over all tokens of all samples, in place. Runs even without local samples:
// every process must join the all-reduce.
Status WhitenAdvantages(std::vector<torch::Tensor>& advantages,
                        const std::vector<torch::Tensor>& loss_masks,
                        const std::vector<int64_t>& lengths, const AllReduceSumFn& all_reduce) {
  torch::Tensor flat_advantages, flat_masks;
  Status status = GuardTorch("whitening", [&]() -> Status {
    if (loss_masks.empty()) {
      flat_advantages = torch::zeros({0}, torch::kDouble);
      flat_masks = torch::zeros({0}, torch::kDouble);
      return absl::OkStatus();
    }
    flat_advantages = torch::cat(advantages);
    std::vector<torch::Tensor> masks;
    masks.reserve(loss_masks.size());
    for (const torch::Tensor& m : loss_masks) {
      masks.push_back(m.to(flat_advantages.device(), torch::kDouble));
    }
    flat_masks = torch::cat(masks);
    return absl::OkStatus();
  });
  SLIME_RETURN_IF_ERROR(status);
  SLIME_ASSIGN_OR_RETURN(torch::Tensor whitened,
                         MaskedWhiten(flat_advantages, flat_masks, all_reduce));
  return GuardTorch("whitening", [&]() -> Status {
    advantages = whitened.split_with_sizes(lengths);
    return absl::OkStatus();
  });
}

}  // namespace

StatusOr<AdvantageOutputs> ComputeAdvantagesAndReturns(const config::AlgorithmConfig& algorithm,
                                                       const AdvantageInputs& inputs,
                                                       const AllReduceSumFn& all_reduce) {
  SLIME_ASSIGN_OR_RETURN(const AdvantageEstimatorSpec* estimator,
                         FindAdvantageEstimator(algorithm.advantage_estimator));
  SLIME_ASSIGN_OR_RETURN(KlType kl_type, ParseKlType(algorithm.kl_loss_type));
  SLIME_ASSIGN_OR_RETURN(std::vector<int64_t> lengths,
                         CheckAdvantageInputs(algorithm, *estimator, inputs));

  AdvantageOutputs out;
  SLIME_ASSIGN_OR_RETURN(out.kl, RewardKl(algorithm, kl_type, inputs));
  SLIME_ASSIGN_OR_RETURN(AdvantagesAndReturns estimated,
                         estimator->advantages(algorithm, inputs, out.kl));
  std::vector<torch::Tensor> advantages = std::move(estimated.advantages);
  out.returns = std::move(estimated.returns);
  if (algorithm.use_opd) {
    SLIME_ASSIGN_OR_RETURN(
        out.opd_reverse_kl,
        ApplyOnPolicyDistillation(&advantages, inputs.log_probs, inputs.teacher_log_probs,
                                  algorithm.opd_kl_coef));
  }
  if (algorithm.normalize_advantages) {
    SLIME_RETURN_IF_ERROR(WhitenAdvantages(advantages, inputs.loss_masks, lengths, all_reduce));
  }
  out.advantages = std::move(advantages);
  return out;
}

}  // namespace slime::train
