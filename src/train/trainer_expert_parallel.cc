// The trainer's expert parallelism (include/slime/train/trainer.h, "Expert parallelism"): the
// checks of the group and the settings, and the expert gradients' sum over the
// expert-data-parallel group.
#include <fmt/format.h>
#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "slime/model/config.h"
#include "slime/model/expert_parallel.h"
#include "slime/train/trainer.h"
#include "torch_guard.h"
#include "trainer_internal.h"

namespace slime::train::internal {

Status SetUpExpertParallel(TrainerOptions& options, bool needs_critic) {
  if (options.ep_group != nullptr && options.ep_group->size() == 1) options.ep_group = nullptr;
  const int ep = options.ep_group == nullptr ? 1 : options.ep_group->size();
  const config::TrainConfig& train = options.config.train;
  const int configured = train.expert_model_parallel_size;
  if (configured != ep) {
    return absl::InvalidArgumentError(fmt::format(
        "trainer: train.expert_model_parallel_size = {}, but the trainer's expert-parallel "
        "group (TrainerOptions::ep_group) has {} rank(s)",
        configured, ep));
  }
  if (ep == 1) return absl::OkStatus();
  if (options.dp_size % ep != 0 || options.edp_size * ep != options.dp_size) {
    return absl::InvalidArgumentError(fmt::format(
        "trainer: train.expert_model_parallel_size = {} must divide the data-parallel size {} "
        "(expert parallelism is carved out of data parallelism), with {} expert-data-parallel "
        "ranks; TrainerOptions::edp_size is {}",
        ep, options.dp_size, options.dp_size / ep, options.edp_size));
  }
  if (!options.ep_all_reduce || (options.edp_size > 1 && !options.edp_all_reduce)) {
    return absl::InvalidArgumentError(
        fmt::format("trainer: expert parallelism (EP {}, expert-DP {}) needs ep_all_reduce{}", ep,
                    options.edp_size, options.edp_size > 1 ? " and edp_all_reduce" : ""));
  }
  if (train.use_distributed_optimizer) {
    return absl::UnimplementedError(fmt::format(
        "trainer: train.expert_model_parallel_size = {} with train.use_distributed_optimizer is "
        "not supported yet; set one of them off",
        ep));
  }
  if (train.overlap_grad_reduce) {
    return absl::UnimplementedError(fmt::format(
        "trainer: train.expert_model_parallel_size = {} with train.overlap_grad_reduce is not "
        "supported yet; set one of them off",
        ep));
  }
  if (needs_critic) {
    return absl::UnimplementedError(
        fmt::format("trainer: train.expert_model_parallel_size = {} with the PPO critic "
                    "(algorithm.advantage_estimator ppo) is not supported yet",
                    ep));
  }
  return absl::OkStatus();
}

Status CheckExpertParallelModel(const TrainerOptions& options, const model::ModelConfig& model) {
  const int ep = options.config.train.expert_model_parallel_size;
  if (ep == 1) return absl::OkStatus();
  if (model.moe.num_experts <= 0) {
    return absl::InvalidArgumentError(fmt::format(
        "trainer: train.expert_model_parallel_size = {} needs a mixture-of-experts model; {} "
        "(model_type {}) has no experts (num_experts)",
        ep, options.model_dir, model.model_type));
  }
  if (model.moe.num_experts % ep != 0) {
    return absl::InvalidArgumentError(
        fmt::format("trainer: the model's num_experts = {} is not divisible by "
                    "train.expert_model_parallel_size = {}",
                    model.moe.num_experts, ep));
  }
  return absl::OkStatus();
}

Status AllReduceExpertGrads(const TrainerOptions& options,
                            const std::vector<torch::Tensor>& experts) {
  if (experts.empty()) return absl::OkStatus();
  if (options.edp_size > 1) {
    std::map<std::string, torch::Tensor> no_metrics;
    return AllReduceGradsAndMetrics(options.edp_all_reduce, experts, no_metrics,
                                    options.config.train.ddp_bucket_size);
  }
  return GuardTorch("trainer: expert gradients", [&]() -> Status {
    torch::NoGradGuard no_grad;
    for (torch::Tensor p : experts) {
      if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    }
    return absl::OkStatus();
  });
}

}  // namespace slime::train::internal
