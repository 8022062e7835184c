// The algorithm names a config may choose — algorithm.advantage_estimator and
// algorithm.loss_type — and what each estimator implies outside the trainer's LibTorch code,
// one row per name. Readers:
//   - the config check takes the allowed values of both keys from here (fields_train_side.cc:
//     an unknown name is refused naming the key and listing these), and warns about or refuses
//     the options an estimator ignores or needs (resolve.cc);
//   - placement asks whether the job runs a critic (UseCritic in config.h);
//   - reward post-processing (reward/reward_postprocess.h) reads how an estimator normalizes
//     the rewards of a prompt group.
//
// Why a second table beside the trainer's (train/loss_registry.h, which maps each name to its
// function and to what the trainer prepares for it): those functions need LibTorch, and config
// is below train in the module layering, so the config check cannot link train. The names and
// the torch-free properties therefore live here, the functions there, and
// tests/train/loss_registry_test.cc checks that both tables list the same names in the same
// order, so they cannot drift. Adding a loss or an estimator: docs/architecture.md, "Losses and
// advantage estimators by name".
//
// Thread-safety: constant tables and pure functions.
#ifndef SLIME_CONFIG_ALGORITHMS_H_
#define SLIME_CONFIG_ALGORITHMS_H_

#include <string>
#include <string_view>
#include <vector>

namespace slime::config {

// The torch-free properties of one advantage estimator.
struct AdvantageEstimatorInfo {
  std::string_view name;  // the value of algorithm.advantage_estimator
  // The advantages need a value model: the job places and trains a PPO critic.
  bool critic = false;
  // algorithm.kl_coef folds a KL penalty into the token rewards (otherwise a nonzero kl_coef
  // has no effect and the config check warns).
  bool reward_kl = false;
  // The config check refuses the estimator unless algorithm.normalize_advantages is on.
  bool needs_normalize_advantages = false;
  // Reward post-processing with algorithm.rewards_normalization on: subtract the mean of the
  // prompt group; then divide by the group's std (+ε) unless algorithm.grpo_std_normalization
  // is off (Dr.GRPO).
  bool group_mean_baseline = false;
  bool group_std_scaling = false;
};

// clang-format off
inline constexpr AdvantageEstimatorInfo kAdvantageEstimators[] = {
    // name                           critic reward_kl needs_normalize mean_baseline std_scaling
    {"grpo",                          false, false,    false,          true,         true},
    {"gspo",                          false, false,    false,          true,         true},
    {"cispo",                         false, false,    false,          true,         true},
    {"reinforce_plus_plus",           false, true,     true,           false,        false},
    {"reinforce_plus_plus_baseline",  false, true,     true,           true,         false},
    {"ppo",                           true,  true,     false,          false,        false},
};
// clang-format on

// The values of algorithm.loss_type, in the order of train/loss_registry.h's table.
inline constexpr std::string_view kLossTypes[] = {"policy_loss", "sft_loss"};

// The row of `name`; nullptr when it is not an estimator.
const AdvantageEstimatorInfo* FindAdvantageEstimator(std::string_view name);

// The names of the two tables, in table order (the config check's allowed values).
std::vector<std::string> AdvantageEstimatorNames();
std::vector<std::string> LossTypeNames();

// "a, b, c": the names for an error message.
std::string JoinNames(const std::vector<std::string>& names);

}  // namespace slime::config

#endif  // SLIME_CONFIG_ALGORITHMS_H_
