// Trainer::Create and its steps (see include/slime/train/trainer.h): the options' checks, the
// parallel groups, the model, optimizer and LR schedule, the CPU weight copies and the critic.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "slime/model/batch_invariant.h"
#include "slime/model/config.h"
#include "slime/model/decoder.h"
#include "slime/model/pipeline_parallel.h"
#include "slime/model/tensor_parallel.h"
#include "slime/model/weights.h"
#include "slime/train/loss_registry.h"
#include "slime/train/optimizer.h"
#include "slime/train/trainer.h"
#include "trainer_internal.h"

namespace slime::train {

using internal::CpuCopy;
using internal::GuardTorch;
using internal::kOldActor;
using internal::kRef;
using internal::kRolloutActor;
using internal::kTeacher;
using internal::LoadWeightCopy;

FlopsModel FlopsModelOf(const model::ModelConfig& model) {
  FlopsModel f;
  f.num_layers = model.num_hidden_layers;
  f.hidden_size = model.hidden_size;
  f.num_attention_heads = model.num_attention_heads;
  f.num_key_value_heads = model.num_key_value_heads;
  f.head_dim = model.head_dim;
  f.intermediate_size = model.intermediate_size;
  f.vocab_size = model.vocab_size;
  for (int64_t l = 0; l < model.num_hidden_layers; ++l) f.sparse_layers += model.moe.IsSparseLayer(l);
  f.num_experts = model.moe.num_experts;
  f.experts_per_token = model.moe.num_experts_per_tok;
  f.moe_intermediate_size = model.moe.moe_intermediate_size;
  return f;
}

namespace {

using WeightCopies = std::map<std::string, std::vector<torch::Tensor>>;

// ---- Checks
// --------------------------------------------------------------------------------------

// The model directory and the data-parallel seam.
Status CheckTrainerOptions(const TrainerOptions& options) {
  if (options.model_dir.empty()) {
    return absl::InvalidArgumentError("trainer: model_dir is empty (an HF model directory)");
  }
  if (options.dp_size < 1 || options.dp_rank < 0 || options.dp_rank >= options.dp_size) {
    return absl::InvalidArgumentError(
        fmt::format("trainer: dp_rank = {} and dp_size = {}: need 0 <= dp_rank < dp_size",
                    options.dp_rank, options.dp_size));
  }
  if (options.dp_size > 1 && !options.dp_all_reduce) {
    return absl::InvalidArgumentError(fmt::format(
        "trainer: dp_size = {} needs dp_all_reduce (the DP group's all-reduce)", options.dp_size));
  }
  if (options.config.train.use_distributed_optimizer && options.dp_size > 1 &&
      (!options.dp_reduce_scatter || !options.dp_all_gather)) {
    return absl::InvalidArgumentError(fmt::format(
        "trainer: train.use_distributed_optimizer with dp_size = {} needs dp_reduce_scatter and "
        "dp_all_gather (the DP group's collectives)",
        options.dp_size));
  }
  return absl::OkStatus();
}

// The batching options a training step uses (global_batch_size is set per rollout).
BatchingOptions MakeBatchingOptions(const config::TrainConfig& train,
                                    const model::ModelConfig& model, int dp_size) {
  BatchingOptions o;
  o.micro_batch_size = train.micro_batch_size;
  o.use_dynamic_batch_size = train.use_dynamic_batch_size;
  if (train.max_tokens_per_gpu.has_value()) o.max_tokens_per_gpu = *train.max_tokens_per_gpu;
  o.context_parallel_size = train.context_parallel_size;
  o.data_parallel_size = dp_size;
  o.balance_data = train.balance_data || train.balance_by_flops;
  o.balance_by_flops = train.balance_by_flops;
  o.flops_model = FlopsModelOf(model);
  return o;
}

// The settings of `config` the trainer does not support; errors name the option.
Status CheckSupported(const config::Config& config, const TrainerAlgorithm& algorithm) {
  const config::AlgorithmConfig& a = config.algorithm;
  if (algorithm.needs.advantages && !a.compute_advantages_and_returns) {
    return absl::UnimplementedError(fmt::format(
        "algorithm.compute_advantages_and_returns = false needs a custom advantage function, "
        "which the trainer does not support with loss_type {}",
        algorithm.loss->name));
  }
  if (a.use_routing_replay && !algorithm.needs.advantages) {
    return absl::InvalidArgumentError(fmt::format(
        "algorithm.{} replays the routing of a rollout or of the old-log-prob forward; loss_type "
        "{} trains on dataset samples without either: set it to false",
        a.use_rollout_routing_replay ? "use_rollout_routing_replay" : "use_routing_replay",
        algorithm.loss->name));
  }
  if (a.use_rollout_logprobs && a.use_tis) {
    return absl::InvalidArgumentError(
        "algorithm.use_rollout_logprobs and algorithm.use_tis cannot both be set (TIS weights "
        "compare the recomputed old log-probs with the rollout's)");
  }
  if (a.use_opd) {
    const std::string type = a.opd_type.value_or("");
    if (type != "megatron" && type != "sglang") {
      return absl::InvalidArgumentError(fmt::format(
          "algorithm.opd_type = \"{}\" is not valid with use_opd (valid: megatron, sglang)", type));
    }
    if (type == "megatron" && !a.opd_teacher_load.has_value()) {
      return absl::InvalidArgumentError(
          "algorithm.opd_teacher_load is required with use_opd and opd_type megatron");
    }
  }
  // Tensor and pipeline parallelism come from TrainerOptions::tp_group / pp_group (checked
  // against tensor_model_parallel_size / pipeline_model_parallel_size in Create); context
  // parallelism is not here yet.
  if (config.train.context_parallel_size != 1) {
    return absl::UnimplementedError(
        fmt::format("train.context_parallel_size = {}: the trainer supports only 1 so far",
                    config.train.context_parallel_size));
  }
  return absl::OkStatus();
}

// ---- Parallel groups
// -----------------------------------------------------------------------------

// Tensor parallelism: this rank loads its shard; the group goes to the model (its parallel
// layers and the vocab-parallel log-probs) and to the optimizer's gradient norm. Unset: one rank.
Status SetUpTensorParallel(TrainerOptions& options, const TrainerAlgorithm& algorithm) {
  if (options.tp_group == nullptr) options.tp_group = model::MakeSingleRankGroup();
  const int tp_size = options.tp_group->size();
  const int tp_rank = options.tp_group->rank();
  if (tp_size < 1 || tp_rank < 0 || tp_rank >= tp_size) {
    return absl::InvalidArgumentError(
        fmt::format("trainer: the tensor-parallel group says rank {} of {}", tp_rank, tp_size));
  }
  // train.tensor_model_parallel_size names the group's size; 1 (the default) accepts any group
  // (callers that build the group themselves, as the in-process tests do).
  const int configured_tp = options.config.train.tensor_model_parallel_size;
  if (configured_tp != 1 && configured_tp != tp_size) {
    return absl::InvalidArgumentError(fmt::format(
        "trainer: train.tensor_model_parallel_size = {}, but the trainer's tensor-parallel group "
        "(TrainerOptions::tp_group) has {} rank(s)",
        configured_tp, tp_size));
  }
  if (tp_size > 1 && algorithm.needs.critic) {
    return absl::UnimplementedError(fmt::format(
        "trainer: advantage_estimator {} with tensor parallelism (tp size {}) is not supported "
        "yet (the critic is single-rank); use a tensor-parallel size of 1",
        algorithm.estimator->name, tp_size));
  }
  return absl::OkStatus();
}

// Pipeline parallelism: this stage's layers; the group carries the schedule's sends and
// receives, the tied embedding's gradient sum and the gradient norm's sum over the stages.
// Unset: one stage. PP × TP: each stage's layers are tensor-parallel; the pipeline group joins
// the ranks of one TP index (the hidden states between stages are full on every TP rank).
// PP × ZeRO-1: each stage's DP group shards that stage's parameters.
Status SetUpPipelineParallel(TrainerOptions& options, const TrainerAlgorithm& algorithm) {
  if (options.pp_group == nullptr) options.pp_group = model::MakeSinglePipelineStage();
  const int pp_size = options.pp_group->size();
  const int pp_rank = options.pp_group->rank();
  if (pp_size < 1 || pp_rank < 0 || pp_rank >= pp_size) {
    return absl::InvalidArgumentError(
        fmt::format("trainer: the pipeline-parallel group says stage {} of {}", pp_rank, pp_size));
  }
  const int configured_pp = options.config.train.pipeline_model_parallel_size;
  if (configured_pp != 1 && configured_pp != pp_size) {
    return absl::InvalidArgumentError(fmt::format(
        "trainer: train.pipeline_model_parallel_size = {}, but the pipeline group has {} "
        "stage(s){}",
        configured_pp, pp_size, pp_size == 1 ? " (TrainerOptions::pp_group is unset)" : ""));
  }
  if (pp_size > 1 && algorithm.needs.critic) {
    return absl::UnimplementedError(fmt::format(
        "trainer: pipeline parallelism ({} stages) is not supported yet with advantage_estimator "
        "{} (the critic is single-stage); use one pipeline stage or another estimator",
        pp_size, algorithm.estimator->name));
  }
  return absl::OkStatus();
}

// ---- Model and optimizer
// -------------------------------------------------------------------------

// This rank's shard of this stage's layers in `dtype`, sequence parallel as configured
// (train.sequence_parallel, resolved off at TP size 1: the residual stream and norms keep 1/TP
// of the tokens per rank between the parallel layers, model/tensor_parallel.h).
// With expert parallelism only this EP rank's experts are read.
StatusOr<std::unique_ptr<model::DecoderModel>> LoadActor(const TrainerOptions& options,
                                                         torch::ScalarType dtype) {
  if (options.ep_group != nullptr) {
    SLIME_ASSIGN_OR_RETURN(model::ModelConfig config, model::LoadModelConfig(options.model_dir));
    SLIME_RETURN_IF_ERROR(internal::CheckExpertParallelModel(options, config));
  }
  SLIME_ASSIGN_OR_RETURN(std::unique_ptr<model::DecoderModel> model,
                         model::DecoderModel::Load(options.model_dir, dtype, options.device,
                                                   options.tp_group, options.pp_group->rank(),
                                                   options.pp_group->size(), options.ep_group));
  model->set_sequence_parallel(options.config.train.sequence_parallel);
  SLIME_RETURN_IF_ERROR(internal::ApplyRecompute(options.config.train, *model, "trainer"));
  return model;
}

// The model's parameters (model::NamedParameters order), made to require grad.
Status CollectParameters(model::DecoderModel& model, std::vector<std::string>& names,
                         std::vector<torch::Tensor>& params) {
  return GuardTorch("trainer: create", [&]() -> Status {
    for (model::NamedTensor& nt : model::NamedParameters(model.weights(), model.config())) {
      nt.tensor.set_requires_grad(true);
      names.push_back(nt.name);
      params.push_back(nt.tensor);
    }
    return absl::OkStatus();
  });
}

// AdamW over the model. The gradient norm: sharded parameters' squares summed over the TP
// group, replicated ones (identical on every TP rank) counted on TP rank 0 only
// (AdamWOptions::tp_rank), then the stages' sums over the PP group (a tied LM head copy not
// counted); with the distributed optimizer (ZeRO-1, also at TP > 1: each TP rank's DP group
// shards that rank's local tensors) each DP rank sums its shard and the DP all-reduce runs first.
StatusOr<std::unique_ptr<AdamW>> MakeOptimizer(const TrainerOptions& options,
                                               const model::DecoderModel& model) {
  const std::shared_ptr<model::TensorParallelGroup> tp = options.tp_group;
  const std::shared_ptr<model::PipelineParallelGroup> pp = options.pp_group;
  AdamWOptions adam = AdamWOptions::FromTrainConfig(options.config.train);
  adam.tp_rank = tp->rank();
  // Expert parallelism: the non-expert parameters count on EP rank 0, the EP group sums last.
  AllReduceSumFn ep_sum;
  if (options.ep_group != nullptr) {
    ep_sum = options.ep_all_reduce;
    adam.ep_rank = options.ep_group->rank();
  }
  if (tp->size() > 1 || pp->size() > 1 || ep_sum) {
    adam.reduce_squared_grad_norm = [tp, pp, ep_sum](torch::Tensor& squared_norm) -> Status {
      return GuardTorch(
          "trainer: all-reduce the squared gradient norm over the TP / PP / EP groups",
          [&]() -> Status {
            tp->AllReduceSum(squared_norm);
            SLIME_RETURN_IF_ERROR(pp->AllReduceSum(squared_norm));
            return ep_sum ? ep_sum(squared_norm) : absl::OkStatus();
          });
    };
  }
  if (adam.distributed && options.dp_size == 1) {
    spdlog::info(
        "trainer: train.use_distributed_optimizer with one data-parallel rank: nothing to shard, "
        "the plain optimizer is used");
    adam.distributed = false;
  }
  adam.dp_size = options.dp_size;
  adam.dp_rank = options.dp_rank;
  adam.dp_all_reduce = options.dp_all_reduce;
  adam.dp_reduce_scatter = options.dp_reduce_scatter;
  adam.dp_all_gather = options.dp_all_gather;
  return AdamW::ForModel(model.weights(), model.config(), std::move(adam));
}

// Expert parallelism: moves the experts' parameters (model::ParamSpec::expert) out of
// `trainable` (summed over the DP group) into `expert_trainable` (summed over the expert-DP
// group), keeping the order. `names` / `params` are the model's parameters (CollectParameters).
void SplitExpertParameters(const model::DecoderModel& model, const std::vector<std::string>& names,
                           const std::vector<torch::Tensor>& params,
                           std::vector<torch::Tensor>& trainable,
                           std::vector<torch::Tensor>& expert_trainable) {
  std::set<std::string> experts;
  for (const model::ParamSpec& spec : model::HeldParameterSpecs(model.config(), model.weights())) {
    if (spec.expert >= 0) experts.insert(spec.hf_name);
  }
  std::vector<torch::Tensor> dense;
  for (const torch::Tensor& t : trainable) {
    bool expert = false;
    for (size_t k = 0; k < params.size(); ++k) {
      if (params[k].is_same(t)) {
        expert = experts.count(names[k]) > 0;
        break;
      }
    }
    (expert ? expert_trainable : dense).push_back(t);
  }
  trainable = std::move(dense);
}

// The parameters the optimizer trains (`trainable_names`), in its order.
std::vector<torch::Tensor> TrainableSubset(const std::vector<std::string>& trainable_names,
                                           const std::vector<std::string>& names,
                                           const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> trainable;
  for (const std::string& name : trainable_names) {
    const auto k = std::find(names.begin(), names.end(), name) - names.begin();
    trainable.push_back(params[k]);
  }
  return trainable;
}

// ---- CPU weight copies and the critic
// ------------------------------------------------------------

// The actor's parameters, which every weight copy mirrors tensor for tensor.
struct ActorParameters {
  const std::vector<std::string>& names;
  const std::vector<torch::Tensor>& params;
  torch::ScalarType dtype;
  int tp_rank = 0;
  int tp_size = 1;
  model::ExpertShard experts;  // the actor's block of experts (expert parallelism)
};

// A CPU copy of the actor's current weights.
StatusOr<std::vector<torch::Tensor>> CloneActor(const ActorParameters& actor) {
  return GuardTorch("trainer: copy the actor weights",
                    [&]() -> StatusOr<std::vector<torch::Tensor>> {
                      std::vector<torch::Tensor> out;
                      for (const torch::Tensor& p : actor.params) {
                        out.push_back(p.device().is_cpu() ? p.detach().clone() : CpuCopy(p));
                      }
                      return out;
                    });
}

// The reference: ref_model_dir, else checkpoint.ref_load (at ref_ckpt_step), else — or when it
// is the actor's own directory — the actor's initial weights.
StatusOr<std::vector<torch::Tensor>> ReferenceWeights(const TrainerOptions& options,
                                                      const ActorParameters& actor) {
  const config::CheckpointConfig& checkpoint = options.config.checkpoint;
  std::optional<std::string> dir = options.ref_model_dir;
  std::optional<int64_t> ckpt_step;
  if (!dir.has_value() && checkpoint.ref_load.has_value()) {
    dir = *checkpoint.ref_load;
    if (checkpoint.ref_ckpt_step.has_value()) ckpt_step = *checkpoint.ref_ckpt_step;
  }
  if (!dir.has_value() || *dir == options.model_dir) return CloneActor(actor);
  return GuardTorch("trainer: load the reference weights", [&]() {
    return LoadWeightCopy("reference", *dir, ckpt_step, actor.names, actor.params, actor.dtype,
                          actor.tp_rank, actor.tp_size, actor.experts);
  });
}

// The teacher of on-policy distillation: algorithm.opd_teacher_load at opd_teacher_ckpt_step.
StatusOr<std::vector<torch::Tensor>> TeacherWeights(const config::AlgorithmConfig& algorithm,
                                                    const ActorParameters& actor) {
  std::optional<int64_t> ckpt_step;
  if (algorithm.opd_teacher_ckpt_step.has_value()) ckpt_step = *algorithm.opd_teacher_ckpt_step;
  return GuardTorch("trainer: load the teacher weights", [&]() {
    return LoadWeightCopy("teacher", *algorithm.opd_teacher_load, ckpt_step, actor.names,
                          actor.params, actor.dtype, actor.tp_rank, actor.tp_size, actor.experts);
  });
}

// The CPU copies `needs` asks for: ref, teacher, old_actor (and rollout_actor with
// weight_sync.interval 1), keyed by their tags (trainer_internal.h).
StatusOr<WeightCopies> MakeWeightCopies(const TrainerOptions& options, const TrainerNeeds& needs,
                                        const ActorParameters& actor) {
  WeightCopies copies;
  if (needs.reference) {
    SLIME_ASSIGN_OR_RETURN(copies[kRef], ReferenceWeights(options, actor));
  }
  if (needs.teacher_pass) {
    SLIME_ASSIGN_OR_RETURN(copies[kTeacher], TeacherWeights(options.config.algorithm, actor));
  }
  if (needs.old_actor_copy) {
    SLIME_ASSIGN_OR_RETURN(copies[kOldActor], CloneActor(actor));
    if (options.config.weight_sync.interval == 1) {
      SLIME_ASSIGN_OR_RETURN(copies[kRolloutActor], CloneActor(actor));
    }
  }
  return copies;
}

// The critic (critic.h), from critic_model_dir, checkpoint.critic_load or the actor's initial
// weights, with the actor's device, dtype and DP seam.
StatusOr<std::unique_ptr<Critic>> MakeCritic(const TrainerOptions& options,
                                             torch::ScalarType dtype) {
  CriticOptions co;
  co.model_dir = options.critic_model_dir.value_or(
      options.config.checkpoint.critic_load.value_or(options.model_dir));
  co.device = options.device;
  co.dtype = dtype;
  co.config = options.config;
  co.train_iters = options.train_iters;
  co.lr_state_mismatch = options.lr_state_mismatch;
  co.dp_size = options.dp_size;
  co.dp_rank = options.dp_rank;
  co.dp_all_reduce = options.dp_all_reduce;
  co.dp_all_reduce_async = options.dp_all_reduce_async;
  co.dp_reduce_scatter = options.dp_reduce_scatter;
  co.dp_all_gather = options.dp_all_gather;
  return Critic::Create(std::move(co));
}

void LogCreated(const TrainerOptions& options, const model::DecoderModel& model,
                torch::ScalarType dtype, const TrainerAlgorithm& algorithm,
                const WeightCopies& copies, const AdamW& optimizer) {
  std::vector<std::string> tags;
  for (const auto& [tag, tensors] : copies) tags.push_back(tag);
  spdlog::info(
      "trainer: {} on {} ({}), loss {}, estimator {}, CPU copies [{}], dp rank {}/{}{}, tp rank "
      "{}/{}, pp stage {}/{}",
      options.model_dir, model.device().str(), c10::toString(dtype), algorithm.loss->name,
      algorithm.estimator->name, fmt::join(tags, ", "), options.dp_rank, options.dp_size,
      optimizer.distributed() ? " (distributed optimizer)" : "", options.tp_group->rank(),
      options.tp_group->size(), options.pp_group->rank(), options.pp_group->size());
}

}  // namespace

namespace internal {

Status ApplyRecompute(const config::TrainConfig& train, model::DecoderModel& model,
                      const char* who) {
  model::RecomputeOptions o;
  const bool method_or_layers =
      train.recompute_method.has_value() || train.recompute_num_layers.has_value();
  const std::string granularity = train.recompute_granularity.value_or("");
  if (granularity == "full") {
    if (!train.recompute_method.has_value() || !train.recompute_num_layers.has_value()) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: train.recompute_granularity: full needs train.recompute_method (uniform or "
          "block) and train.recompute_num_layers",
          who));
    }
    o.granularity = model::RecomputeGranularity::kFull;
    if (*train.recompute_method == "uniform") {
      o.method = model::RecomputeMethod::kUniform;
    } else if (*train.recompute_method == "block") {
      o.method = model::RecomputeMethod::kBlock;
    } else {
      return absl::InvalidArgumentError(
          fmt::format("{}: train.recompute_method = \"{}\" is not valid (valid: uniform, block)",
                      who, *train.recompute_method));
    }
    o.num_layers = *train.recompute_num_layers;
  } else if (method_or_layers) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: train.recompute_method and train.recompute_num_layers apply only to "
        "train.recompute_granularity: full",
        who));
  } else if (granularity == "selective") {
    o.granularity = model::RecomputeGranularity::kSelective;
  } else if (!granularity.empty()) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: train.recompute_granularity = \"{}\" is not valid (valid: full, selective)", who,
        granularity));
  }
  Status set = model.SetRecompute(o);
  if (!set.ok()) {
    return absl::InvalidArgumentError(
        fmt::format("{}: train.{}", who, std::string(set.message())));
  }
  if (o.granularity != model::RecomputeGranularity::kNone) {
    spdlog::info("{}: activation recomputation: {}", who, model::RecomputeDescription(o));
  }
  return absl::OkStatus();
}

StatusOr<LrSchedule> MakeRunLrSchedule(const config::Config& config,
                                       std::optional<int64_t> train_iters, double lr_value,
                                       double min_lr) {
  LrScheduleConfig lr;
  lr.lr = lr_value;
  lr.min_lr = min_lr;
  lr.lr_decay_style = config.train.lr_decay_style;
  if (config.train.lr_decay_iters.has_value()) lr.lr_decay_iters = *config.train.lr_decay_iters;
  lr.lr_warmup_iters = config.train.lr_warmup_iters;
  lr.lr_warmup_fraction = config.train.lr_warmup_fraction;
  lr.lr_warmup_init = config.train.lr_warmup_init;
  lr.global_batch_size = config.train.global_batch_size.value_or(1);
  if (train_iters.has_value()) {
    lr.train_iters = *train_iters;
  } else {
    if (!config.data.num_rollout.has_value() || !config.train.global_batch_size.has_value()) {
      return absl::InvalidArgumentError(
          "trainer: the LR schedule length is unknown: data.num_rollout and "
          "train.global_batch_size must be set (a resolved config), or TrainerOptions::"
          "train_iters");
    }
    lr.train_iters = TrainIters(*config.data.num_rollout, config.data.rollout_batch_size,
                                config.data.n_samples_per_prompt, *config.train.global_batch_size);
  }
  if (lr.train_iters < 1 && !config.train.lr_decay_iters.has_value()) {
    return absl::InvalidArgumentError(fmt::format(
        "trainer: the run has {} optimizer steps (data.num_rollout × rollout_batch_size × "
        "n_samples_per_prompt / global_batch_size); the LR schedule needs at least 1",
        lr.train_iters));
  }
  return MakeLrSchedule(lr);
}

}  // namespace internal

// ---- Create
// --------------------------------------------------------------------------------------

Trainer::Trainer(TrainerOptions options, std::unique_ptr<model::DecoderModel> model,
                 std::unique_ptr<AdamW> optimizer, LrScheduler lr_scheduler)
    : options_(std::move(options)),
      model_(std::move(model)),
      optimizer_(std::move(optimizer)),
      lr_scheduler_(std::move(lr_scheduler)),
      impl_(std::make_unique<Impl>()) {}

Trainer::~Trainer() = default;

StatusOr<std::unique_ptr<Trainer>> Trainer::Create(TrainerOptions options) {
  const config::Config& config = options.config;
  SLIME_RETURN_IF_ERROR(CheckTrainerOptions(options));
  SLIME_ASSIGN_OR_RETURN(TrainerAlgorithm algorithm, SelectAlgorithm(config.algorithm));
  SLIME_RETURN_IF_ERROR(CheckSupported(config, algorithm));
  SLIME_ASSIGN_OR_RETURN(PolicyLossOptions policy, PolicyLossOptions::FromConfig(config.algorithm));
  SLIME_RETURN_IF_ERROR(ParseKlType(config.algorithm.kl_loss_type).status());
  SLIME_RETURN_IF_ERROR(SetUpTensorParallel(options, algorithm));
  SLIME_RETURN_IF_ERROR(SetUpPipelineParallel(options, algorithm));
  SLIME_RETURN_IF_ERROR(internal::SetUpExpertParallel(options, algorithm.needs.critic));
  if (config.debug.deterministic_mode) {
    // Batch-invariant kernels (model/batch_invariant.h): the engines' log-probs to the bit.
    if (!model::InvariantKernelsServe(options.device)) {
      return absl::InvalidArgumentError(
          "debug.deterministic_mode: this build has no batch-invariant kernels for " +
          options.device.str());
    }
    model::SetBatchInvariant(true);
    spdlog::info("trainer: debug.deterministic_mode: batch-invariant kernels on");
  }

  const torch::ScalarType dtype =
      options.dtype.value_or(options.device.is_cuda() ? torch::kBFloat16 : torch::kFloat32);
  SLIME_ASSIGN_OR_RETURN(std::unique_ptr<model::DecoderModel> model, LoadActor(options, dtype));
  SLIME_RETURN_IF_ERROR(CheckMoeLossConfig(config.train, model->config()));
  SLIME_RETURN_IF_ERROR(internal::CheckRoutingReplayConfig(config, model->config()));
  BatchingOptions batching = MakeBatchingOptions(config.train, model->config(), options.dp_size);
  SLIME_RETURN_IF_ERROR(ValidateBatchingOptions(batching));
  SLIME_ASSIGN_OR_RETURN(LrSchedule schedule,
                         internal::MakeRunLrSchedule(config, options.train_iters, config.train.lr,
                                                     config.train.min_lr));

  auto impl = std::make_unique<Impl>();
  SLIME_RETURN_IF_ERROR(CollectParameters(*model, impl->names, impl->params));
  SLIME_ASSIGN_OR_RETURN(std::unique_ptr<AdamW> optimizer, MakeOptimizer(options, *model));
  // With train.overlap_grad_reduce the reducer hooks the trainable parameters.
  impl->trainable = TrainableSubset(optimizer->TrainableNames(), impl->names, impl->params);
  if (options.ep_group != nullptr) {
    SplitExpertParameters(*model, impl->names, impl->params, impl->trainable,
                          impl->expert_trainable);
  }
  SLIME_ASSIGN_OR_RETURN(
      impl->grad_reducer,
      internal::MakeGradReducer("trainer", config.train, options.dp_size, optimizer->distributed(),
                                options.dp_all_reduce_async, impl->trainable));
  for (int64_t l = 0; l < model->config().num_hidden_layers; ++l) {
    impl->sparse_model = impl->sparse_model || model->config().moe.IsSparseLayer(l);
  }
  impl->moe_loss = MoeRouterLoss::Create(config.train, model->config(), model->stage(),
                                         options.tp_group->size());
  impl->algorithm = algorithm;
  impl->policy = policy;
  impl->batching = batching;
  impl->pad_multiple =
      static_cast<int64_t>(options.tp_group->size()) * config.train.data_pad_size_multiplier;
  const ActorParameters actor{
      impl->names,     impl->params, dtype, options.tp_group->rank(), options.tp_group->size(),
      model->experts()};
  SLIME_ASSIGN_OR_RETURN(impl->copies, MakeWeightCopies(options, algorithm.needs, actor));
  if (algorithm.needs.critic) {
    SLIME_ASSIGN_OR_RETURN(impl->critic, MakeCritic(options, dtype));
  }

  LogCreated(options, *model, dtype, algorithm, impl->copies, *optimizer);
  std::unique_ptr<Trainer> trainer(new Trainer(std::move(options), std::move(model),
                                               std::move(optimizer), LrScheduler(schedule)));
  trainer->impl_ = std::move(impl);
  return trainer;
}

}  // namespace slime::train
