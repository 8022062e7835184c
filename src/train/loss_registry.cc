// The tables of losses and advantage estimators (include/slime/train/loss_registry.h): each row's
// function is a short adapter over losses.h / advantages.h.
#include "slime/train/loss_registry.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <iterator>
#include <string>
#include <utility>

#include "slime/common/check.h"
#include "trainer_internal.h"

namespace slime::train {

using internal::AllDefined;
using internal::Gather;
using internal::GuardTorch;

namespace {

// ---- Losses ----------------------------------------------------------------------------------

// policy_loss: the per-token inputs of PolicyLoss gathered for the micro-batch.
StatusOr<LossOutput> PolicyGradientLoss(const LossContext& c) {
  PolicyLossInputs in;
  Status built = GuardTorch("trainer: policy loss inputs", [&]() -> Status {
    in.log_probs = c.current.log_probs;
    in.advantages = Gather(c.tensors.advantages, c.samples);
    if (AllDefined(c.tensors.old_log_probs, c.samples)) {
      in.old_log_probs = Gather(c.tensors.old_log_probs, c.samples);
    }
    in.entropy = c.policy.entropy_coef != 0 ? c.current.entropy : c.current.entropy.detach();
    if (c.policy.use_kl_loss) in.ref_log_probs = Gather(c.tensors.ref_log_probs, c.samples);
    if (AllDefined(c.tensors.rollout_log_probs, c.samples)) {
      in.rollout_log_probs = Gather(c.tensors.rollout_log_probs, c.samples);
    }
    if (AllDefined(c.tensors.opd_reverse_kl, c.samples)) {
      in.opd_reverse_kl = Gather(c.tensors.opd_reverse_kl, c.samples);
    }
    return absl::OkStatus();
  });
  SLIME_RETURN_IF_ERROR(built);
  return PolicyLoss(c.policy, c.reducer, in);
}

// sft_loss: the token NLL of the current log-probs.
StatusOr<LossOutput> TokenNllLoss(const LossContext& c) {
  return SftLoss(c.reducer, c.current.log_probs);
}

// clang-format off
constexpr LossTypeSpec kLossTypes[] = {
    // name           function             needs {advantages, entropy}
    {"policy_loss",   &PolicyGradientLoss, {.advantages = true,  .entropy = true}},
    {"sft_loss",      &TokenNllLoss,       {.advantages = false, .entropy = false}},
};
// clang-format on

// ---- Advantage estimators --------------------------------------------------------------------

// grpo, gspo, cispo: A = returns = r̃ on every response token.
StatusOr<AdvantagesAndReturns> GroupRewardAdvantages(const config::AlgorithmConfig& algorithm,
                                                     const AdvantageInputs& inputs,
                                                     const std::vector<torch::Tensor>& kl) {
  AdvantagesAndReturns out;
  SLIME_ASSIGN_OR_RETURN(out.advantages, GrpoAdvantages(inputs.rewards, kl));
  out.returns = out.advantages;
  return out;
}

// reinforce_plus_plus: discounted returns of the KL-penalized token rewards; returns = A.
StatusOr<AdvantagesAndReturns> ReinforcePlusPlus(const config::AlgorithmConfig& algorithm,
                                                 const AdvantageInputs& inputs,
                                                 const std::vector<torch::Tensor>& kl) {
  AdvantagesAndReturns out;
  SLIME_ASSIGN_OR_RETURN(out.advantages,
                         ReinforcePlusPlusReturns(inputs.rewards, kl, inputs.loss_masks,
                                                  algorithm.kl_coef, algorithm.gamma));
  out.returns = out.advantages;
  return out;
}

// reinforce_plus_plus_baseline: r̃ − kl_coef · kl per token; returns = A.
StatusOr<AdvantagesAndReturns> ReinforcePlusPlusBaseline(const config::AlgorithmConfig& algorithm,
                                                         const AdvantageInputs& inputs,
                                                         const std::vector<torch::Tensor>& kl) {
  AdvantagesAndReturns out;
  SLIME_ASSIGN_OR_RETURN(
      out.advantages, ReinforcePlusPlusBaselineAdvantages(inputs.rewards, kl, algorithm.kl_coef));
  out.returns = out.advantages;
  return out;
}

// ppo: token rewards ρ_t = −kl_coef · kl_t, plus r̃_i at the last response token (whatever its
// mask), then GAE over the critic's values.
StatusOr<AdvantagesAndReturns> PpoGae(const config::AlgorithmConfig& algorithm,
                                      const AdvantageInputs& inputs,
                                      const std::vector<torch::Tensor>& kl) {
  std::vector<torch::Tensor> token_rewards;
  Status status = GuardTorch("ppo token rewards", [&]() -> Status {
    for (size_t i = 0; i < kl.size(); ++i) {
      torch::Tensor rho = kl[i] * (-algorithm.kl_coef);
      const int64_t length = inputs.loss_masks[i].size(0);
      if (length > 0) rho[length - 1] += inputs.rewards[i];
      token_rewards.push_back(std::move(rho));
    }
    return absl::OkStatus();
  });
  SLIME_RETURN_IF_ERROR(status);
  return GaeAdvantagesAndReturns(token_rewards, inputs.values, algorithm.gamma, algorithm.lambd);
}

// clang-format off
constexpr AdvantageEstimatorSpec kAdvantageEstimators[] = {
    // name                          function                    policy objective            always_old_log_probs
    {"grpo",                         &GroupRewardAdvantages,     PolicyObjective::kPpoClip,  false},
    {"gspo",                         &GroupRewardAdvantages,     PolicyObjective::kGspo,     true},
    {"cispo",                        &GroupRewardAdvantages,     PolicyObjective::kCispo,    false},
    {"reinforce_plus_plus",          &ReinforcePlusPlus,         PolicyObjective::kPpoClip,  false},
    {"reinforce_plus_plus_baseline", &ReinforcePlusPlusBaseline, PolicyObjective::kPpoClip,  false},
    {"ppo",                          &PpoGae,                    PolicyObjective::kPpoClip,  true},
};
// clang-format on

template <typename Row>
std::vector<std::string> NamesOf(std::span<const Row> rows) {
  std::vector<std::string> names;
  for (const Row& row : rows) names.emplace_back(row.name);
  return names;
}

}  // namespace

// ---- Lookups ---------------------------------------------------------------------------------

std::span<const LossTypeSpec> LossTypes() { return kLossTypes; }

StatusOr<const LossTypeSpec*> FindLossType(std::string_view name) {
  for (const LossTypeSpec& row : kLossTypes) {
    if (row.name == name) return &row;
  }
  return absl::UnimplementedError(
      fmt::format("algorithm.loss_type = \"{}\" is not supported by the trainer (valid: {})", name,
                  config::JoinNames(NamesOf(LossTypes()))));
}

std::span<const AdvantageEstimatorSpec> AdvantageEstimators() { return kAdvantageEstimators; }

StatusOr<const AdvantageEstimatorSpec*> FindAdvantageEstimator(std::string_view name) {
  for (const AdvantageEstimatorSpec& row : kAdvantageEstimators) {
    if (row.name == name) return &row;
  }
  return absl::InvalidArgumentError(fmt::format("unknown advantage_estimator '{}': valid are {}",
                                                name,
                                                config::JoinNames(NamesOf(AdvantageEstimators()))));
}

const config::AdvantageEstimatorInfo& AdvantageEstimatorSpec::info() const {
  const config::AdvantageEstimatorInfo* info = config::FindAdvantageEstimator(name);
  SLIME_CHECK(info != nullptr, "advantage estimator '{}' has no row in config/algorithms.h", name);
  return *info;
}

// ---- What a configuration needs --------------------------------------------------------------

StatusOr<TrainerAlgorithm> SelectAlgorithm(const config::AlgorithmConfig& algorithm) {
  TrainerAlgorithm out;
  SLIME_ASSIGN_OR_RETURN(out.loss, FindLossType(algorithm.loss_type));
  SLIME_ASSIGN_OR_RETURN(out.estimator, FindAdvantageEstimator(algorithm.advantage_estimator));
  TrainerNeeds& needs = out.needs;
  needs.advantages = out.loss->needs.advantages;
  if (!needs.advantages) return out;
  const bool opd = algorithm.use_opd;
  needs.critic = out.estimator->info().critic;
  needs.reference = algorithm.use_kl_loss || algorithm.kl_coef != 0;
  needs.teacher_pass = opd && algorithm.opd_type == "megatron";
  needs.teacher_in_batch = opd && algorithm.opd_type == "sglang";
  needs.old_actor_copy = algorithm.keep_old_actor;
  needs.rollout_log_probs =
      algorithm.use_tis || algorithm.get_mismatch_metrics || algorithm.use_rollout_logprobs;
  return out;
}

}  // namespace slime::train
