// Losses and advantage estimators by name. algorithm.loss_type and algorithm.advantage_estimator
// each select one row of a table here (loss_registry.cc), which gives the function and what the
// trainer must prepare for it; the trainer branches on those rows (SelectAlgorithm's
// TrainerNeeds), not on names (Trainer::SftStep asks for the sft_loss row).
//
//   loss_type     function             needs
//   policy_loss   PolicyLoss           advantages — so the estimator and what it reads (old-actor,
//                                      reference and teacher log-probs, the critic) — and the
//                                      entropy of the current policy
//   sft_loss      SftLoss              the current log-probs only
//
//   advantage_estimator            function (over advantages.h)         objective  old pass
//   grpo                           GrpoAdvantages: A = r̃ per token       PPO clip   as needed
//   gspo                           GrpoAdvantages                       GSPO       always
//   cispo                          GrpoAdvantages                       CISPO      as needed
//   reinforce_plus_plus            ReinforcePlusPlusReturns             PPO clip   as needed
//   reinforce_plus_plus_baseline   ReinforcePlusPlusBaselineAdvantages  PPO clip   as needed
//   ppo                            GAE over the KL-penalized token      PPO clip   always
//                                  rewards and the critic's values
// ("old pass": whether the old-actor log-probs are recomputed even for a single on-policy
// step; otherwise only when an option needs them, trainer.h step 3.)
//
// The estimators' torch-free properties — the critic, whether kl_coef applies, whether
// normalize_advantages is required, how rewards are normalized per group — are the rows of
// config/algorithms.h: the config check, placement and reward post-processing read them without
// linking train (config is below train in the layering). That table is also where the config
// check gets the valid names, so tests/train/loss_registry_test.cc checks that both tables list
// the same names in the same order.
//
// Adding a loss: a LossFn and a row of kLossTypes (loss_registry.cc), and its name in
// config::kLossTypes. Adding an estimator: an AdvantageFn and a row of kAdvantageEstimators
// here, and a row of config::kAdvantageEstimators (docs/architecture.md, "Losses and advantage
// estimators by name").
//
// Thread-safety: constant tables; the functions are as thread-safe as losses.h/advantages.h.
#ifndef SLIME_TRAIN_LOSS_REGISTRY_H_
#define SLIME_TRAIN_LOSS_REGISTRY_H_

#include <torch/types.h>

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "slime/common/status.h"
#include "slime/config/algorithms.h"
#include "slime/config/config.h"
#include "slime/train/advantages.h"
#include "slime/train/logprobs.h"
#include "slime/train/losses.h"

namespace slime::train {

// ---- Losses ----------------------------------------------------------------------------------

// The per-sample tensors of the rollout being trained, indexed like the batch (undefined for
// samples of other ranks and for what the configuration does not compute). [R_i] float32 each,
// on the model's device.
struct SampleTensors {
  std::vector<torch::Tensor> loss_masks;
  std::vector<torch::Tensor> advantages;
  std::vector<torch::Tensor> old_log_probs;      // π_old for the loss; undefined: ratio ≡ 1
  std::vector<torch::Tensor> ref_log_probs;      // use_kl_loss
  std::vector<torch::Tensor> rollout_log_probs;  // when the batch has them
  std::vector<torch::Tensor> opd_reverse_kl;     // use_opd
  std::vector<torch::Tensor> values;             // ppo: the pre-update critic's values
  std::vector<torch::Tensor> returns;            // ppo: GAE returns (the critic's target)

  explicit SampleTensors(size_t n)
      : loss_masks(n),
        advantages(n),
        old_log_probs(n),
        ref_log_probs(n),
        rollout_log_probs(n),
        opd_reverse_kl(n),
        values(n),
        returns(n) {}
};

// What a loss reads for one packed micro-batch (losses.h's layout, [T] tensors).
struct LossContext {
  const LossReducer& reducer;           // the micro-batch's reduction and denominators
  const ResponseLogProbs& current;      // the trained policy: log_probs [T] with grad, and
                                        // entropy [T] when LossNeeds::entropy
  const SampleTensors& tensors;         // the rollout's per-sample tensors
  const std::vector<int64_t>& samples;  // the micro-batch's batch indices, in packed order
  const PolicyLossOptions& policy;      // algorithm.* as the policy loss reads them
};
using LossFn = StatusOr<LossOutput> (*)(const LossContext& context);

struct LossNeeds {
  // The loss trains on advantages: before the optimizer steps the trainer runs the estimator
  // and the passes it reads (trainer.h, steps 1–4), with the critic, the reference, the
  // teacher and the old-actor copies the configuration asks for. False: the loss reads only
  // the current log-probs, and those options are ignored.
  bool advantages = false;
  // The training forward pass computes the current policy's per-token entropy.
  bool entropy = false;
};

struct LossTypeSpec {
  std::string_view name;  // algorithm.loss_type
  LossFn loss;
  LossNeeds needs;
};

// Every loss type, in config::kLossTypes order.
std::span<const LossTypeSpec> LossTypes();
// The row of `name`. Unimplemented for another name (slime's custom_loss included), listing the
// valid ones.
StatusOr<const LossTypeSpec*> FindLossType(std::string_view name);

// ---- Advantage estimators --------------------------------------------------------------------

// The estimator proper, over the local samples (AdvantageInputs' layout, [R_i] each): the
// advantages and returns before on-policy distillation and whitening, given `kl`, the
// per-token reward KL (zeros when kl_coef == 0). ComputeAdvantagesAndReturns has checked the
// inputs the estimator needs (values when it has a critic).
using AdvantageFn = StatusOr<AdvantagesAndReturns> (*)(const config::AlgorithmConfig& algorithm,
                                                       const AdvantageInputs& inputs,
                                                       const std::vector<torch::Tensor>& kl);

struct AdvantageEstimatorSpec {
  std::string_view name;  // algorithm.advantage_estimator
  AdvantageFn advantages;
  PolicyObjective objective;  // the policy loss's family (losses.h)
  // The old-actor log-probs are computed even for a single on-policy optimizer step (slime's
  // can_reuse_log_probs_in_loss does not hold).
  bool always_old_log_probs = false;

  // The torch-free row of the same name (config/algorithms.h): critic, reward KL, ...
  const config::AdvantageEstimatorInfo& info() const;
};

// Every estimator, in config::kAdvantageEstimators order.
std::span<const AdvantageEstimatorSpec> AdvantageEstimators();
// The row of `name`. InvalidArgument for another name, listing the valid ones.
StatusOr<const AdvantageEstimatorSpec*> FindAdvantageEstimator(std::string_view name);

// ---- What a configuration needs --------------------------------------------------------------

// The loss's and the estimator's needs combined with the options that ask for more; all false
// for a loss without advantages.
struct TrainerNeeds {
  bool advantages = false;         // LossNeeds::advantages: trainer.h steps 1–4 run
  bool critic = false;             // the estimator's critic (ppo)
  bool reference = false;          // reference log-probs: use_kl_loss or kl_coef != 0
  bool teacher_pass = false;       // teacher log-probs computed: use_opd, opd_type megatron
  bool teacher_in_batch = false;   // teacher log-probs shipped: use_opd, opd_type sglang
  bool old_actor_copy = false;     // keep_old_actor: the old-actor (and rollout-actor) copies
  bool rollout_log_probs = false;  // the engine's log-probs in the batch: use_tis,
                                   // get_mismatch_metrics or use_rollout_logprobs
};

// The rows a configuration selects and what they need.
struct TrainerAlgorithm {
  const LossTypeSpec* loss = nullptr;
  const AdvantageEstimatorSpec* estimator = nullptr;
  TrainerNeeds needs;
};
// Errors: FindLossType's and FindAdvantageEstimator's.
StatusOr<TrainerAlgorithm> SelectAlgorithm(const config::AlgorithmConfig& algorithm);

}  // namespace slime::train

#endif  // SLIME_TRAIN_LOSS_REGISTRY_H_
