// The trainer of one model replica (see include/slime/train/trainer.h).
#include "slime/train/trainer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "slime/model/config.h"
#include "slime/model/decoder.h"
#include "slime/model/pipeline_parallel.h"
#include "slime/model/tensor_parallel.h"
#include "slime/model/weights.h"
#include "slime/train/logprobs.h"
#include "slime/train/losses.h"
#include "slime/train/optimizer.h"
#include "trainer_internal.h"

namespace slime::train {

using internal::AllDefined;
using internal::CopyInto;
using internal::CopyTag;
using internal::CountRollouts;
using internal::CpuCopy;
using internal::FloatTensor;
using internal::ForwardOnly;
using internal::GuardTorch;
using internal::kOldActor;
using internal::kRef;
using internal::kRolloutActor;
using internal::kTeacher;
using internal::LoadWeightCopy;
using internal::SchedulingRolloutIds;

namespace {

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
  FlopsModel f;
  f.num_layers = model.num_hidden_layers;
  f.hidden_size = model.hidden_size;
  f.num_attention_heads = model.num_attention_heads;
  f.num_key_value_heads = model.num_key_value_heads;
  f.head_dim = model.head_dim;
  f.intermediate_size = model.intermediate_size;
  f.vocab_size = model.vocab_size;
  o.flops_model = f;
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
  if (a.use_routing_replay || a.use_rollout_routing_replay) {
    return absl::UnimplementedError(
        "algorithm.use_routing_replay / use_rollout_routing_replay: routing replay is for MoE "
        "models, which the trainer does not support");
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

}  // namespace

namespace internal {

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

std::string_view PolicyWeightsName(PolicyWeights which) {
  switch (which) {
    case PolicyWeights::kActor:
      return "actor";
    case PolicyWeights::kRef:
      return "ref";
    case PolicyWeights::kOldActor:
      return "old_actor";
    case PolicyWeights::kTeacher:
      return "teacher";
  }
  return "unknown";
}

// ---- Create ------------------------------------------------------------------------------------

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
  if (config.train.use_distributed_optimizer && options.dp_size > 1 &&
      (!options.dp_reduce_scatter || !options.dp_all_gather)) {
    return absl::InvalidArgumentError(fmt::format(
        "trainer: train.use_distributed_optimizer with dp_size = {} needs dp_reduce_scatter and "
        "dp_all_gather (the DP group's collectives)",
        options.dp_size));
  }
  SLIME_ASSIGN_OR_RETURN(TrainerAlgorithm algorithm, SelectAlgorithm(config.algorithm));
  const TrainerNeeds& needs = algorithm.needs;
  SLIME_RETURN_IF_ERROR(CheckSupported(config, algorithm));
  if (config.train.recompute_granularity.has_value() || config.train.recompute_loss_function) {
    spdlog::warn(
        "trainer: activation recomputation (train.recompute_granularity, "
        "recompute_loss_function) is not implemented: the settings are accepted for slime "
        "compatibility and every activation is kept; lower train.max_tokens_per_gpu if memory "
        "runs out");
  }
  SLIME_ASSIGN_OR_RETURN(PolicyLossOptions policy, PolicyLossOptions::FromConfig(config.algorithm));
  SLIME_RETURN_IF_ERROR(ParseKlType(config.algorithm.kl_loss_type).status());

  // Tensor parallelism: this rank loads its shard; the group goes to the model (its parallel
  // layers and the vocab-parallel log-probs) and to the optimizer's gradient norm.
  if (options.tp_group == nullptr) options.tp_group = model::MakeSingleRankGroup();
  const std::shared_ptr<model::TensorParallelGroup> tp = options.tp_group;
  const int tp_size = tp->size();
  const int tp_rank = tp->rank();
  if (tp_size < 1 || tp_rank < 0 || tp_rank >= tp_size) {
    return absl::InvalidArgumentError(fmt::format(
        "trainer: the tensor-parallel group says rank {} of {}", tp_rank, tp_size));
  }
  // train.tensor_model_parallel_size names the group's size; 1 (the default) accepts any group
  // (callers that build the group themselves, as the in-process tests do).
  const int configured_tp = config.train.tensor_model_parallel_size;
  if (configured_tp != 1 && configured_tp != tp_size) {
    return absl::InvalidArgumentError(fmt::format(
        "trainer: train.tensor_model_parallel_size = {}, but the trainer's tensor-parallel group "
        "(TrainerOptions::tp_group) has {} rank(s)",
        configured_tp, tp_size));
  }
  if (tp_size > 1 && needs.critic) {
    return absl::UnimplementedError(fmt::format(
        "trainer: advantage_estimator {} with tensor parallelism (tp size {}) is not supported "
        "yet (the critic is single-rank); use a tensor-parallel size of 1",
        algorithm.estimator->name, tp_size));
  }

  // Pipeline parallelism: this stage's layers; the group carries the schedule's sends and
  // receives, the tied embedding's gradient sum and the gradient norm's sum over the stages.
  if (options.pp_group == nullptr) options.pp_group = model::MakeSinglePipelineStage();
  const std::shared_ptr<model::PipelineParallelGroup> pp = options.pp_group;
  const int pp_size = pp->size();
  const int pp_rank = pp->rank();
  if (pp_size < 1 || pp_rank < 0 || pp_rank >= pp_size) {
    return absl::InvalidArgumentError(fmt::format(
        "trainer: the pipeline-parallel group says stage {} of {}", pp_rank, pp_size));
  }
  if (config.train.pipeline_model_parallel_size != 1 &&
      config.train.pipeline_model_parallel_size != pp_size) {
    return absl::InvalidArgumentError(fmt::format(
        "trainer: train.pipeline_model_parallel_size = {}, but the pipeline group has {} "
        "stage(s){}",
        config.train.pipeline_model_parallel_size, pp_size,
        pp_size == 1 ? " (TrainerOptions::pp_group is unset)" : ""));
  }
  // PP × TP: each stage's layers are tensor-parallel; the pipeline group joins the ranks of one
  // TP index (the hidden states between stages are full on every TP rank). PP × ZeRO-1: each
  // stage's DP group shards that stage's parameters.
  if (pp_size > 1 && needs.critic) {
    return absl::UnimplementedError(fmt::format(
        "trainer: pipeline parallelism ({} stages) is not supported yet with advantage_estimator "
        "{} (the critic is single-stage); use one pipeline stage or another estimator",
        pp_size, algorithm.estimator->name));
  }

  const torch::ScalarType dtype =
      options.dtype.value_or(options.device.is_cuda() ? torch::kBFloat16 : torch::kFloat32);
  SLIME_ASSIGN_OR_RETURN(std::unique_ptr<model::DecoderModel> model,
                         model::DecoderModel::Load(options.model_dir, dtype, options.device, tp,
                                                   pp_rank, pp_size));
  // train.sequence_parallel (resolved off at TP size 1): the residual stream and norms keep
  // 1/TP of the tokens per rank between the parallel layers (model/tensor_parallel.h).
  model->set_sequence_parallel(config.train.sequence_parallel);

  BatchingOptions batching = MakeBatchingOptions(config.train, model->config(), options.dp_size);
  SLIME_RETURN_IF_ERROR(ValidateBatchingOptions(batching));

  SLIME_ASSIGN_OR_RETURN(LrSchedule schedule,
                         internal::MakeRunLrSchedule(config, options.train_iters, config.train.lr,
                                                     config.train.min_lr));

  auto impl = std::make_unique<Impl>();
  Status status = GuardTorch("trainer: create", [&]() -> Status {
    for (model::NamedTensor& nt : model::NamedParameters(model->weights(), model->config())) {
      nt.tensor.set_requires_grad(true);
      impl->names.push_back(nt.name);
      impl->params.push_back(nt.tensor);
    }
    return absl::OkStatus();
  });
  SLIME_RETURN_IF_ERROR(status);
  // The gradient norm: sharded parameters' squares summed over the TP group, replicated ones
  // (identical on every TP rank) counted on TP rank 0 only (AdamWOptions::tp_rank), then the
  // stages' sums over the PP group (a tied LM head copy not counted); with the distributed
  // optimizer (ZeRO-1, also at TP > 1: each TP rank's DP group shards that rank's local
  // tensors) each DP rank sums its shard and the DP all-reduce runs first.
  AdamWOptions adam = AdamWOptions::FromTrainConfig(config.train);
  adam.tp_rank = tp_rank;
  if (tp_size > 1 || pp_size > 1) {
    adam.reduce_squared_grad_norm = [tp, pp](torch::Tensor& squared_norm) -> Status {
      return GuardTorch("trainer: all-reduce the squared gradient norm over the TP / PP groups",
                        [&]() -> Status {
                          tp->AllReduceSum(squared_norm);
                          return pp->AllReduceSum(squared_norm);
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
  SLIME_ASSIGN_OR_RETURN(std::unique_ptr<AdamW> optimizer,
                         AdamW::ForModel(model->weights(), model->config(), std::move(adam)));

  // The parameters the optimizer trains; with train.overlap_grad_reduce the reducer hooks them.
  for (const std::string& name : optimizer->TrainableNames()) {
    const auto k = std::find(impl->names.begin(), impl->names.end(), name) - impl->names.begin();
    impl->trainable.push_back(impl->params[k]);
  }
  SLIME_ASSIGN_OR_RETURN(impl->grad_reducer,
                         internal::MakeGradReducer("trainer", config.train, options.dp_size,
                                                   optimizer->distributed(),
                                                   options.dp_all_reduce_async, impl->trainable));
  impl->algorithm = algorithm;
  impl->policy = policy;
  impl->batching = batching;

  // The CPU copies.
  auto clone_actor = [&]() -> StatusOr<std::vector<torch::Tensor>> {
    return GuardTorch("trainer: copy the actor weights",
                      [&]() -> StatusOr<std::vector<torch::Tensor>> {
                        std::vector<torch::Tensor> out;
                        for (const torch::Tensor& p : impl->params) {
                          out.push_back(p.device().is_cpu() ? p.detach().clone() : CpuCopy(p));
                        }
                        return out;
                      });
  };
  if (needs.reference) {
    std::optional<std::string> dir = options.ref_model_dir;
    std::optional<int64_t> ckpt_step;
    if (!dir.has_value() && config.checkpoint.ref_load.has_value()) {
      dir = *config.checkpoint.ref_load;
      if (config.checkpoint.ref_ckpt_step.has_value()) ckpt_step = *config.checkpoint.ref_ckpt_step;
    }
    if (!dir.has_value() || *dir == options.model_dir) {
      SLIME_ASSIGN_OR_RETURN(impl->copies[kRef], clone_actor());
    } else {
      SLIME_ASSIGN_OR_RETURN(
          impl->copies[kRef], GuardTorch("trainer: load the reference weights", [&]() {
            return LoadWeightCopy("reference", *dir, ckpt_step, impl->names, impl->params, dtype,
                                  tp_rank, tp_size);
          }));
    }
  }
  if (needs.teacher_pass) {
    std::optional<int64_t> ckpt_step;
    if (config.algorithm.opd_teacher_ckpt_step.has_value()) {
      ckpt_step = *config.algorithm.opd_teacher_ckpt_step;
    }
    SLIME_ASSIGN_OR_RETURN(impl->copies[kTeacher],
                           GuardTorch("trainer: load the teacher weights", [&]() {
                             return LoadWeightCopy("teacher", *config.algorithm.opd_teacher_load,
                                                   ckpt_step, impl->names, impl->params, dtype,
                                                   tp_rank, tp_size);
                           }));
  }
  if (needs.old_actor_copy) {
    SLIME_ASSIGN_OR_RETURN(impl->copies[kOldActor], clone_actor());
    if (config.weight_sync.interval == 1) {
      SLIME_ASSIGN_OR_RETURN(impl->copies[kRolloutActor], clone_actor());
    }
  }

  // ppo: the critic (critic.h), from critic_model_dir, checkpoint.critic_load or the actor's
  // initial weights.
  if (needs.critic) {
    CriticOptions co;
    co.model_dir = options.critic_model_dir.value_or(
        config.checkpoint.critic_load.value_or(options.model_dir));
    co.device = options.device;
    co.dtype = dtype;
    co.config = config;
    co.train_iters = options.train_iters;
    co.lr_state_mismatch = options.lr_state_mismatch;
    co.dp_size = options.dp_size;
    co.dp_rank = options.dp_rank;
    co.dp_all_reduce = options.dp_all_reduce;
    co.dp_all_reduce_async = options.dp_all_reduce_async;
    co.dp_reduce_scatter = options.dp_reduce_scatter;
    co.dp_all_gather = options.dp_all_gather;
    SLIME_ASSIGN_OR_RETURN(impl->critic, Critic::Create(std::move(co)));
  }

  std::vector<std::string> tags;
  for (const auto& [tag, tensors] : impl->copies) tags.push_back(tag);
  spdlog::info(
      "trainer: {} on {} ({}), loss {}, estimator {}, CPU copies [{}], dp rank {}/{}{}, tp rank "
      "{}/{}, pp stage {}/{}",
      options.model_dir, model->device().str(), c10::toString(dtype), config.algorithm.loss_type,
      algorithm.estimator->name, fmt::join(tags, ", "), options.dp_rank, options.dp_size,
      optimizer->distributed() ? " (distributed optimizer)" : "", tp_rank, tp_size, pp_rank,
      pp_size);
  std::unique_ptr<Trainer> trainer(new Trainer(std::move(options), std::move(model),
                                               std::move(optimizer), LrScheduler(schedule)));
  trainer->impl_ = std::move(impl);
  return trainer;
}

model::DecoderModel& Trainer::model() {
  impl_->actor_backup_current = false;
  return *model_;
}

const Critic* Trainer::critic() const { return impl_->critic.get(); }

bool Trainer::has_weights(PolicyWeights which) const {
  if (which == PolicyWeights::kActor) return true;
  return impl_->copies.count(CopyTag(which)) > 0;
}

bool Trainer::SkipsOldLogProbs(int64_t num_steps) const {
  const config::AlgorithmConfig& a = options_.config.algorithm;
  const TrainerAlgorithm& algorithm = impl_->algorithm;
  return num_steps == 1 && algorithm.needs.advantages && a.kl_coef == 0 &&
         !a.use_rollout_logprobs && !a.get_mismatch_metrics &&
         !algorithm.estimator->always_old_log_probs && !a.keep_old_actor && !a.use_opd &&
         !a.use_routing_replay;
}

// ---- Batch checks ------------------------------------------------------------------------------

Status Trainer::CheckBatch(const data::RolloutBatch& batch) const {
  if (!std::isfinite(batch.temperature) || batch.temperature <= 0) {
    return absl::InvalidArgumentError(fmt::format(
        "batch: temperature = {} is not valid: the rollout temperature must be finite and > 0",
        batch.temperature));
  }
  if (batch.samples.empty()) {
    return absl::InvalidArgumentError("batch: samples is empty");
  }
  const int64_t vocab = model_->config().vocab_size;
  for (size_t i = 0; i < batch.samples.size(); ++i) {
    const data::TrainSample& s = batch.samples[i];
    if (s.prompt_length < 0 || s.response_length < 0) {
      return absl::InvalidArgumentError(
          fmt::format("batch: samples[{}]: prompt_length = {} and response_length = {} must be "
                      ">= 0",
                      i, s.prompt_length, s.response_length));
    }
    if (static_cast<int64_t>(s.tokens.size()) != s.prompt_length + s.response_length) {
      return absl::InvalidArgumentError(fmt::format(
          "batch: samples[{}].tokens has {} ids, but prompt_length + response_length = {} + {}", i,
          s.tokens.size(), s.prompt_length, s.response_length));
    }
    if (s.tokens.empty()) {
      return absl::InvalidArgumentError(fmt::format("batch: samples[{}].tokens is empty", i));
    }
    if (s.response_length > 0 && s.prompt_length < 1) {
      return absl::InvalidArgumentError(fmt::format(
          "batch: samples[{}].prompt_length = 0: a response needs at least one prompt token", i));
    }
    for (size_t t = 0; t < s.tokens.size(); ++t) {
      if (s.tokens[t] < 0 || s.tokens[t] >= vocab) {
        return absl::InvalidArgumentError(
            fmt::format("batch: samples[{}].tokens[{}] = {} is outside the vocabulary [0, {})", i,
                        t, s.tokens[t], vocab));
      }
    }
    if (static_cast<int64_t>(s.loss_mask.size()) != s.response_length) {
      return absl::InvalidArgumentError(
          fmt::format("batch: samples[{}].loss_mask has {} values for response_length = {}", i,
                      s.loss_mask.size(), s.response_length));
    }
    for (size_t t = 0; t < s.loss_mask.size(); ++t) {
      if (s.loss_mask[t] != 0.0f && s.loss_mask[t] != 1.0f) {
        return absl::InvalidArgumentError(fmt::format(
            "batch: samples[{}].loss_mask[{}] = {} (valid: 0 or 1)", i, t, s.loss_mask[t]));
      }
    }
    if (!s.rollout_log_probs.empty() &&
        static_cast<int64_t>(s.rollout_log_probs.size()) != s.response_length) {
      return absl::InvalidArgumentError(
          fmt::format("batch: samples[{}].rollout_log_probs has {} values for response_length = "
                      "{}",
                      i, s.rollout_log_probs.size(), s.response_length));
    }
    if (s.rollout_log_probs.empty() && impl_->algorithm.needs.rollout_log_probs &&
        s.response_length > 0) {
      return absl::InvalidArgumentError(fmt::format(
          "batch: samples[{}].rollout_log_probs is empty, but use_tis, get_mismatch_metrics or "
          "use_rollout_logprobs needs the engine's log-probs",
          i));
    }
    if (!s.teacher_log_probs.empty() &&
        static_cast<int64_t>(s.teacher_log_probs.size()) != s.response_length) {
      return absl::InvalidArgumentError(
          fmt::format("batch: samples[{}].teacher_log_probs has {} values for response_length = "
                      "{}",
                      i, s.teacher_log_probs.size(), s.response_length));
    }
    if (s.teacher_log_probs.empty() && impl_->algorithm.needs.teacher_in_batch &&
        s.response_length > 0) {
      return absl::InvalidArgumentError(fmt::format(
          "batch: samples[{}].teacher_log_probs is empty, but use_opd with opd_type sglang needs "
          "the teacher's log-probs",
          i));
    }
    if (!std::isfinite(s.reward)) {
      return absl::InvalidArgumentError(
          fmt::format("batch: samples[{}].reward = {} is not finite", i, s.reward));
    }
  }
  return absl::OkStatus();
}

// ---- Forward-only passes -----------------------------------------------------------------------

StatusOr<SampleLogProbs> Trainer::ComputeLogProbs(const data::RolloutBatch& batch,
                                                  PolicyWeights which, bool with_entropy) {
  SLIME_RETURN_IF_ERROR(CheckBatch(batch));
  std::vector<int64_t> samples(batch.samples.size());
  std::vector<int64_t> token_counts(batch.samples.size());
  for (size_t i = 0; i < samples.size(); ++i) {
    samples[i] = static_cast<int64_t>(i);
    token_counts[i] = static_cast<int64_t>(batch.samples[i].tokens.size());
  }
  BatchingOptions o = impl_->batching;
  o.data_parallel_size = 1;  // every sample, here
  SLIME_ASSIGN_OR_RETURN(StepSchedule schedule, ScheduleStep(samples, token_counts, o));
  std::vector<const MicroBatch*> mbs;
  for (const MicroBatch& mb : schedule.ranks[0]) mbs.push_back(&mb);

  SampleLogProbs out;
  out.log_probs.resize(samples.size());
  if (with_entropy) out.entropy.resize(samples.size());
  SLIME_RETURN_IF_ERROR(WithPolicyWeights(which, [&]() -> Status {
    return ForwardOnly(*model_, *options_.pp_group, batch, mbs,
                       options_.config.train.log_probs_chunk_size,
                       with_entropy, out);
  }));
  return out;
}

// ---- Training ----------------------------------------------------------------------------------

namespace {

// Rollouts per optimizer step: train.global_batch_size, else rollouts / num_steps_per_rollout,
// else the whole batch in one step.
int64_t GlobalBatchSize(const config::TrainConfig& train, int64_t num_rollouts) {
  if (train.global_batch_size.has_value()) return *train.global_batch_size;
  if (train.num_steps_per_rollout.has_value() && *train.num_steps_per_rollout > 0) {
    return std::max<int64_t>(1, num_rollouts / *train.num_steps_per_rollout);
  }
  return num_rollouts;
}

// Mean over `samples` of each sample's loss-masked token mean of `per_sample` (slime's
// rollout/* convention); nullopt when a sample has no tensor.
std::optional<double> MeanOfSampleMeans(const std::vector<torch::Tensor>& per_sample,
                                        const std::vector<torch::Tensor>& masks,
                                        const std::vector<int64_t>& samples) {
  if (samples.empty() || !AllDefined(per_sample, samples)) return std::nullopt;
  double sum = 0;
  for (int64_t i : samples) {
    const torch::Tensor m = masks[i].to(torch::kFloat64);
    const double denominator = std::max(m.sum().item<double>(), 1.0);
    sum += (per_sample[i].detach().to(torch::kFloat64) * m).sum().item<double>() / denominator;
  }
  return sum / static_cast<double>(samples.size());
}

}  // namespace

StatusOr<TrainRolloutResult> Trainer::TrainRollout(int64_t rollout_id,
                                                   const data::RolloutBatch& batch) {
  SLIME_RETURN_IF_ERROR(CheckBatch(batch));
  const config::AlgorithmConfig& algorithm = options_.config.algorithm;
  const size_t n = batch.samples.size();
  const TrainerNeeds& needs = impl_->algorithm.needs;

  // 0. Schedule: steps, micro-batches, this rank's share.
  std::vector<int64_t> token_counts(n);
  for (size_t i = 0; i < n; ++i) {
    token_counts[i] = static_cast<int64_t>(batch.samples[i].tokens.size());
  }
  const std::vector<int64_t> ids = SchedulingRolloutIds(batch);
  BatchingOptions batching = impl_->batching;
  batching.global_batch_size = GlobalBatchSize(options_.config.train, CountRollouts(ids, n));
  SLIME_ASSIGN_OR_RETURN(RolloutSchedule schedule, ScheduleRollout(token_counts, ids, batching));
  const int64_t num_steps = static_cast<int64_t>(schedule.steps.size());
  std::vector<const MicroBatch*> micro_batches;
  std::vector<int64_t> local;  // this rank's samples, ascending
  for (const StepSchedule& step : schedule.steps) {
    for (const MicroBatch& mb : step.ranks[options_.dp_rank]) {
      micro_batches.push_back(&mb);
      local.insert(local.end(), mb.samples.begin(), mb.samples.end());
    }
  }
  std::sort(local.begin(), local.end());

  TrainRolloutResult result;
  result.dropped_samples = schedule.dropped;
  if (options_.config.train.reset_optimizer_states) optimizer_->ResetStates();

  SampleTensors tensors(n);
  Status copied = GuardTorch("trainer: batch to tensors", [&]() -> Status {
    const torch::Device device = model_->device();
    for (int64_t i : local) {
      const data::TrainSample& s = batch.samples[i];
      tensors.loss_masks[i] = FloatTensor(s.loss_mask, device);
      if (static_cast<int64_t>(s.rollout_log_probs.size()) == s.response_length) {
        tensors.rollout_log_probs[i] = FloatTensor(s.rollout_log_probs, device);
      }
    }
    return absl::OkStatus();
  });
  SLIME_RETURN_IF_ERROR(copied);

  SampleLogProbs ref, teacher, old;
  const bool skip_old = SkipsOldLogProbs(num_steps) || algorithm.use_rollout_logprobs;
  if (needs.advantages) {
    const int64_t chunk = options_.config.train.log_probs_chunk_size;
    auto forward = [&](PolicyWeights which, bool with_entropy, SampleLogProbs& out) {
      out.log_probs.resize(n);
      if (with_entropy) out.entropy.resize(n);
      return WithPolicyWeights(which, [&]() -> Status {
        return ForwardOnly(*model_, *options_.pp_group, batch, micro_batches, chunk, with_entropy,
                           out);
      });
    };
    // 1–3. Reference, teacher and old-actor log-probs.
    if (needs.reference) SLIME_RETURN_IF_ERROR(forward(PolicyWeights::kRef, false, ref));
    if (needs.teacher_pass) SLIME_RETURN_IF_ERROR(forward(PolicyWeights::kTeacher, false, teacher));
    if (!skip_old) {
      SLIME_RETURN_IF_ERROR(
          forward(algorithm.keep_old_actor ? PolicyWeights::kOldActor : PolicyWeights::kActor,
                  algorithm.use_rollout_entropy, old));
    }

    // ppo: the pre-update critic's values (GAE's V and the value loss's v_old).
    std::vector<torch::Tensor> values(n);
    if (impl_->critic != nullptr) {
      SLIME_RETURN_IF_ERROR(impl_->critic->ComputeValues(batch, micro_batches, values));
    }

    // 4. Advantages and returns over this rank's samples.
    AdvantageInputs in;
    std::vector<torch::Tensor> teacher_by_sample(n);
    Status built = GuardTorch("trainer: advantage inputs", [&]() -> Status {
      for (int64_t i : local) {
        const data::TrainSample& s = batch.samples[i];
        in.rewards.push_back(s.reward);
        in.loss_masks.push_back(tensors.loss_masks[i]);
        if (algorithm.use_rollout_logprobs) {
          in.log_probs.push_back(tensors.rollout_log_probs[i]);
        } else if (!skip_old) {
          in.log_probs.push_back(old.log_probs[i]);
        } else {
          // Skipped pass: kl_coef == 0, no OPD, not ppo, so only the shape is read.
          in.log_probs.push_back(torch::zeros_like(tensors.loss_masks[i]));
        }
        if (needs.reference) in.ref_log_probs.push_back(ref.log_probs[i]);
        if (values[i].defined()) in.values.push_back(values[i]);
        if (needs.teacher_pass) {
          teacher_by_sample[i] = teacher.log_probs[i];
        } else if (needs.teacher_in_batch) {
          teacher_by_sample[i] = FloatTensor(s.teacher_log_probs, model_->device());
        }
        if (teacher_by_sample[i].defined()) in.teacher_log_probs.push_back(teacher_by_sample[i]);
      }
      return absl::OkStatus();
    });
    SLIME_RETURN_IF_ERROR(built);
    AllReduceSumFn all_reduce;
    if (options_.dp_size > 1) all_reduce = options_.dp_all_reduce;
    SLIME_ASSIGN_OR_RETURN(AdvantageOutputs adv,
                           ComputeAdvantagesAndReturns(algorithm, in, all_reduce));
    for (size_t k = 0; k < local.size(); ++k) {
      const int64_t i = local[k];
      tensors.advantages[i] = adv.advantages[k];
      if (!adv.opd_reverse_kl.empty()) tensors.opd_reverse_kl[i] = adv.opd_reverse_kl[k];
      if (impl_->critic != nullptr) {
        tensors.values[i] = values[i];
        tensors.returns[i] = adv.returns[k];
      }
      if (needs.reference) tensors.ref_log_probs[i] = ref.log_probs[i];
      if (algorithm.use_rollout_logprobs) {
        tensors.old_log_probs[i] = tensors.rollout_log_probs[i];
      } else if (!skip_old) {
        tensors.old_log_probs[i] = old.log_probs[i];
      }
    }
    // Rollout-side values (rank-local).
    Status logged = GuardTorch("trainer: rollout values", [&]() -> Status {
      auto put = [&](const char* name, std::optional<double> v) {
        if (v.has_value()) result.rollout_values[name] = *v;
      };
      put("advantages", MeanOfSampleMeans(tensors.advantages, tensors.loss_masks, local));
      if (impl_->critic != nullptr) {
        put("values", MeanOfSampleMeans(tensors.values, tensors.loss_masks, local));
        put("returns", MeanOfSampleMeans(tensors.returns, tensors.loss_masks, local));
      }
      if (!skip_old) put("log_probs", MeanOfSampleMeans(old.log_probs, tensors.loss_masks, local));
      if (!old.entropy.empty()) {
        put("entropy", MeanOfSampleMeans(old.entropy, tensors.loss_masks, local));
      }
      if (needs.reference) {
        put("ref_log_probs", MeanOfSampleMeans(ref.log_probs, tensors.loss_masks, local));
      }
      if (!in.teacher_log_probs.empty()) {
        put("teacher_log_probs", MeanOfSampleMeans(teacher_by_sample, tensors.loss_masks, local));
      }
      put("rollout_log_probs",
          MeanOfSampleMeans(tensors.rollout_log_probs, tensors.loss_masks, local));
      return absl::OkStatus();
    });
    SLIME_RETURN_IF_ERROR(logged);
  }
  if (!local.empty()) {
    double reward = 0, raw_reward = 0, length = 0, truncated = 0;
    for (int64_t i : local) {
      reward += batch.samples[i].reward;
      raw_reward += batch.samples[i].raw_reward;
      length += static_cast<double>(batch.samples[i].response_length);
      truncated += batch.samples[i].truncated ? 1.0 : 0.0;
    }
    const double count = static_cast<double>(local.size());
    result.rollout_values["reward"] = reward / count;
    result.rollout_values["raw_reward"] = raw_reward / count;
    result.rollout_values["response_length"] = length / count;
    result.rollout_values["truncated"] = truncated / count;
  }

  // 5. The optimizer steps.
  for (int64_t s = 0; s < num_steps; ++s) {
    SLIME_ASSIGN_OR_RETURN(TrainStepMetrics metrics,
                           RunStep(rollout_id, s, num_steps, *impl_->algorithm.loss, batch, ids,
                                   schedule.steps[s], tensors));
    result.steps.push_back(std::move(metrics));
  }

  // 6. The reference follows the actor every ref_update_interval rollouts.
  if (algorithm.ref_update_interval.has_value() && *algorithm.ref_update_interval > 0 &&
      (rollout_id + 1) % *algorithm.ref_update_interval == 0 && has_weights(PolicyWeights::kRef)) {
    Status updated = GuardTorch("trainer: update the reference weights", [&]() -> Status {
      CopyInto(impl_->copies[kRef], impl_->params);
      return absl::OkStatus();
    });
    SLIME_RETURN_IF_ERROR(updated);
    spdlog::info("trainer: the reference weights are now the actor's (rollout {})", rollout_id);
  }
  return result;
}

StatusOr<TrainStepMetrics> Trainer::SftStep(const data::RolloutBatch& batch) {
  SLIME_RETURN_IF_ERROR(CheckBatch(batch));
  const size_t n = batch.samples.size();
  std::vector<int64_t> samples(n), token_counts(n);
  for (size_t i = 0; i < n; ++i) {
    samples[i] = static_cast<int64_t>(i);
    token_counts[i] = static_cast<int64_t>(batch.samples[i].tokens.size());
  }
  const std::vector<int64_t> ids = SchedulingRolloutIds(batch);
  SLIME_ASSIGN_OR_RETURN(StepSchedule step, ScheduleStep(samples, token_counts, impl_->batching));
  SampleTensors tensors(n);
  Status copied = GuardTorch("trainer: batch to tensors", [&]() -> Status {
    for (const MicroBatch& mb : step.ranks[options_.dp_rank]) {
      for (int64_t i : mb.samples) {
        tensors.loss_masks[i] = FloatTensor(batch.samples[i].loss_mask, model_->device());
      }
    }
    return absl::OkStatus();
  });
  SLIME_RETURN_IF_ERROR(copied);
  SLIME_ASSIGN_OR_RETURN(const LossTypeSpec* sft_loss, FindLossType("sft_loss"));
  return RunStep(/*rollout_id=*/-1, 0, 1, *sft_loss, batch, ids, step, tensors);
}

}  // namespace slime::train
