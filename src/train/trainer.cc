// The trainer of one model replica (see include/slime/train/trainer.h).
#include "slime/train/trainer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "slime/model/checkpoint.h"
#include "slime/model/config.h"
#include "slime/model/decoder.h"
#include "slime/model/weights.h"
#include "slime/train/checkpoint.h"
#include "slime/train/logprobs.h"
#include "slime/train/losses.h"
#include "slime/train/optimizer.h"

namespace slime::train {
namespace {

std::string FirstLine(const std::exception& e) {
  std::string what = e.what();
  const size_t nl = what.find('\n');
  return nl == std::string::npos ? what : what.substr(0, nl);
}

// Runs `fn`, turning a LibTorch (or any) exception into InternalError with `context`.
template <typename Fn>
auto GuardTorch(const std::string& context, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const std::exception& e) {
    return absl::InternalError(fmt::format("{}: {}", context, FirstLine(e)));
  }
}

constexpr const char* kRef = "ref";
constexpr const char* kTeacher = "teacher";
constexpr const char* kOldActor = "old_actor";
constexpr const char* kRolloutActor = "rollout_actor";

const char* CopyTag(PolicyWeights which) {
  switch (which) {
    case PolicyWeights::kRef:
      return kRef;
    case PolicyWeights::kOldActor:
      return kOldActor;
    case PolicyWeights::kTeacher:
      return kTeacher;
    case PolicyWeights::kActor:
      break;
  }
  return "actor";
}

// A CPU tensor holding a copy of `t` (pinned when `t` lives on a GPU, for fast copies back).
torch::Tensor CpuCopy(const torch::Tensor& t) {
  auto options = torch::TensorOptions().dtype(t.scalar_type()).device(torch::kCPU);
  if (!t.device().is_cpu()) options = options.pinned_memory(true);
  torch::Tensor out = torch::empty(t.sizes(), options);
  out.copy_(t.detach());
  return out;
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

nlohmann::json LrStateToJson(const LrSchedulerState& s) {
  return nlohmann::json{{"num_steps", s.num_steps},
                        {"max_lr", s.max_lr},
                        {"min_lr", s.min_lr},
                        {"init_lr", s.init_lr},
                        {"warmup_steps", s.warmup_steps},
                        {"decay_steps", s.decay_steps},
                        {"decay_style", s.decay_style}};
}

StatusOr<LrSchedulerState> LrStateFromJson(const nlohmann::json& j, const std::string& where) {
  try {
    LrSchedulerState s;
    s.num_steps = j.at("num_steps").get<int64_t>();
    s.max_lr = j.at("max_lr").get<double>();
    s.min_lr = j.at("min_lr").get<double>();
    s.init_lr = j.at("init_lr").get<double>();
    s.warmup_steps = j.at("warmup_steps").get<double>();
    s.decay_steps = j.at("decay_steps").get<int64_t>();
    s.decay_style = j.at("decay_style").get<std::string>();
    return s;
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        fmt::format("{}: lr_scheduler is not a valid LR scheduler state: {}", where, e.what()));
  }
}

// One packed micro-batch: the token ids on the model's device and the layout.
struct PackedInputs {
  torch::Tensor ids;  // [T] int64
  PackedSequences packed;
};

PackedInputs Pack(const RolloutBatch& batch, const std::vector<int64_t>& samples,
                  torch::Device device) {
  PackedInputs in;
  in.packed.cu_seqlens.reserve(samples.size() + 1);
  in.packed.cu_seqlens.push_back(0);
  std::vector<int64_t> ids;
  for (int64_t i : samples) {
    const TrainSample& s = batch.samples[i];
    ids.insert(ids.end(), s.tokens.begin(), s.tokens.end());
    in.packed.cu_seqlens.push_back(static_cast<int64_t>(ids.size()));
    in.packed.prompt_lengths.push_back(s.prompt_length);
    in.packed.response_lengths.push_back(s.response_length);
  }
  in.ids = torch::tensor(ids, torch::kLong).to(device);
  return in;
}

torch::Tensor FloatTensor(const std::vector<float>& values, torch::Device device) {
  return torch::tensor(values, torch::kFloat32).to(device);
}

// Concatenates the per-sample tensors of `samples` (all defined) into one [T] tensor.
torch::Tensor Gather(const std::vector<torch::Tensor>& per_sample,
                     const std::vector<int64_t>& samples) {
  std::vector<torch::Tensor> parts;
  parts.reserve(samples.size());
  for (int64_t i : samples) parts.push_back(per_sample[i]);
  return torch::cat(parts);
}

bool AllDefined(const std::vector<torch::Tensor>& per_sample, const std::vector<int64_t>& samples) {
  for (int64_t i : samples) {
    if (!per_sample[i].defined()) return false;
  }
  return true;
}

std::string FormatValues(const std::map<std::string, double>& values) {
  std::string out;
  for (const auto& [name, value] : values) {
    if (!out.empty()) out += ' ';
    out += fmt::format("{}={:.6g}", name, value);
  }
  return out;
}

}  // namespace

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

// ---- Private state -----------------------------------------------------------------------------

// The per-sample tensors of one rollout, indexed by the sample's position in the batch (only
// this rank's samples are defined). All [R_i] float32 on the model's device.
struct Trainer::SampleTensors {
  std::vector<torch::Tensor> loss_masks;
  std::vector<torch::Tensor> advantages;
  std::vector<torch::Tensor> old_log_probs;      // π_old for the loss; undefined: ratio ≡ 1
  std::vector<torch::Tensor> ref_log_probs;      // use_kl_loss
  std::vector<torch::Tensor> rollout_log_probs;  // when the batch has them
  std::vector<torch::Tensor> opd_reverse_kl;     // use_opd

  explicit SampleTensors(size_t n)
      : loss_masks(n),
        advantages(n),
        old_log_probs(n),
        ref_log_probs(n),
        rollout_log_probs(n),
        opd_reverse_kl(n) {}
};

struct Trainer::Impl {
  AdvantageEstimator estimator = AdvantageEstimator::kGrpo;
  PolicyLossOptions policy;
  BatchingOptions batching;
  bool sft = false;            // loss_type == "sft_loss"
  bool need_ref = false;       // use_kl_loss or kl_coef != 0
  bool teacher_pass = false;   // use_opd with opd_type "megatron"
  bool teacher_given = false;  // use_opd with opd_type "sglang": teacher log-probs in the batch
  bool needs_rollout_log_probs = false;

  // The live parameters (model::NamedParameters order) and the CPU copies of other policies,
  // tensor k of a copy belonging to parameter k.
  std::vector<std::string> names;
  std::vector<torch::Tensor> params;
  std::map<std::string, std::vector<torch::Tensor>> copies;
  std::vector<torch::Tensor> actor_backup;  // the actor while another policy is swapped in
  bool actor_backup_current = false;        // actor_backup equals the live parameters
};

// ---- Create ------------------------------------------------------------------------------------

Trainer::Trainer(TrainerOptions options, std::unique_ptr<model::DecoderModel> model,
                 std::unique_ptr<AdamW> optimizer, LrScheduler lr_scheduler)
    : options_(std::move(options)),
      model_(std::move(model)),
      optimizer_(std::move(optimizer)),
      lr_scheduler_(std::move(lr_scheduler)),
      impl_(std::make_unique<Impl>()) {}

Trainer::~Trainer() = default;

namespace {

// Reads the weights of `dir` (a trainer checkpoint — <save> or iteration dir — or an HF
// directory) into CPU tensors in the order of `names`, checking every shape against `like`.
StatusOr<std::vector<torch::Tensor>> LoadWeightCopy(const std::string& what, const std::string& dir,
                                                    std::optional<int64_t> ckpt_step,
                                                    const std::vector<std::string>& names,
                                                    const std::vector<torch::Tensor>& like,
                                                    torch::ScalarType dtype) {
  std::string resolved = dir;
  auto checkpoint_dir = ResolveCheckpointDir(dir, ckpt_step);
  if (checkpoint_dir.ok()) {
    resolved = *checkpoint_dir;
  } else if (!absl::IsNotFound(checkpoint_dir.status()) || ckpt_step.has_value()) {
    return absl::Status(
        checkpoint_dir.status().code(),
        fmt::format("{} weights: {}", what, std::string(checkpoint_dir.status().message())));
  }
  auto config = model::LoadModelConfig(resolved);
  if (!config.ok()) {
    return absl::Status(
        config.status().code(),
        fmt::format("{} weights: {}", what, std::string(config.status().message())));
  }
  auto reader = model::CheckpointReader::Open(resolved);
  if (!reader.ok()) {
    return absl::Status(
        reader.status().code(),
        fmt::format("{} weights: {}", what, std::string(reader.status().message())));
  }
  model::WeightOptions wo;
  wo.dtype = dtype;
  wo.device = torch::kCPU;
  auto weights = model::LoadWeights(*reader, *config, wo);
  if (!weights.ok()) {
    return absl::Status(
        weights.status().code(),
        fmt::format("{} weights: {}", what, std::string(weights.status().message())));
  }
  std::map<std::string, torch::Tensor> by_name;
  for (model::NamedTensor& nt : model::NamedParameters(*weights, *config)) {
    by_name.emplace(nt.name, nt.tensor);
  }
  std::vector<torch::Tensor> out;
  out.reserve(names.size());
  for (size_t k = 0; k < names.size(); ++k) {
    auto it = by_name.find(names[k]);
    if (it == by_name.end()) {
      return absl::InvalidArgumentError(
          fmt::format("{} weights in {}: parameter {} of the actor is missing (the {} model must "
                      "have the actor's architecture)",
                      what, resolved, names[k], what));
    }
    if (it->second.sizes() != like[k].sizes()) {
      return absl::InvalidArgumentError(fmt::format(
          "{} weights in {}: parameter {} has shape [{}], the actor's is [{}]", what, resolved,
          names[k], fmt::join(it->second.sizes(), ", "), fmt::join(like[k].sizes(), ", ")));
    }
    // The loaded tensor is already a CPU tensor of its own; pin it for a GPU model.
    out.push_back(like[k].device().is_cpu() ? it->second.contiguous() : CpuCopy(it->second));
  }
  spdlog::info("trainer: loaded the {} weights from {}", what, resolved);
  return out;
}

// Resolves what Create needs from the config; errors name the option.
Status CheckSupported(const config::Config& config) {
  const config::AlgorithmConfig& a = config.algorithm;
  if (a.loss_type != "policy_loss" && a.loss_type != "sft_loss") {
    return absl::UnimplementedError(fmt::format(
        "algorithm.loss_type = \"{}\" is not supported by the trainer (valid: policy_loss, "
        "sft_loss)",
        a.loss_type));
  }
  if (a.loss_type == "policy_loss" && !a.compute_advantages_and_returns) {
    return absl::UnimplementedError(
        "algorithm.compute_advantages_and_returns = false needs a custom advantage function, "
        "which the trainer does not support with loss_type policy_loss");
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
  if (config.train.tensor_model_parallel_size != 1 ||
      config.train.pipeline_model_parallel_size != 1 || config.train.context_parallel_size != 1) {
    return absl::UnimplementedError(
        fmt::format("train.tensor_model_parallel_size = {}, pipeline_model_parallel_size = {}, "
                    "context_parallel_size = {}: the trainer supports only 1 for each so far",
                    config.train.tensor_model_parallel_size,
                    config.train.pipeline_model_parallel_size, config.train.context_parallel_size));
  }
  return absl::OkStatus();
}

}  // namespace

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
  SLIME_RETURN_IF_ERROR(CheckSupported(config));
  SLIME_ASSIGN_OR_RETURN(AdvantageEstimator estimator,
                         ParseAdvantageEstimator(config.algorithm.advantage_estimator));
  const bool sft = config.algorithm.loss_type == "sft_loss";
  if (estimator == AdvantageEstimator::kPpo && !sft) {
    return absl::UnimplementedError(
        "algorithm.advantage_estimator = \"ppo\" needs a critic (value head and value loss), "
        "which the trainer does not have yet; use grpo, gspo, cispo, reinforce_plus_plus or "
        "reinforce_plus_plus_baseline");
  }
  SLIME_ASSIGN_OR_RETURN(PolicyLossOptions policy, PolicyLossOptions::FromConfig(config.algorithm));
  SLIME_RETURN_IF_ERROR(ParseKlType(config.algorithm.kl_loss_type).status());

  const torch::ScalarType dtype =
      options.dtype.value_or(options.device.is_cuda() ? torch::kBFloat16 : torch::kFloat32);
  SLIME_ASSIGN_OR_RETURN(std::unique_ptr<model::DecoderModel> model,
                         model::DecoderModel::Load(options.model_dir, dtype, options.device));

  BatchingOptions batching = MakeBatchingOptions(config.train, model->config(), options.dp_size);
  SLIME_RETURN_IF_ERROR(ValidateBatchingOptions(batching));

  // The LR schedule, in samples (lr_schedule.h).
  LrScheduleConfig lr;
  lr.lr = config.train.lr;
  lr.min_lr = config.train.min_lr;
  lr.lr_decay_style = config.train.lr_decay_style;
  if (config.train.lr_decay_iters.has_value()) lr.lr_decay_iters = *config.train.lr_decay_iters;
  lr.lr_warmup_iters = config.train.lr_warmup_iters;
  lr.lr_warmup_fraction = config.train.lr_warmup_fraction;
  lr.lr_warmup_init = config.train.lr_warmup_init;
  lr.global_batch_size = config.train.global_batch_size.value_or(1);
  if (options.train_iters.has_value()) {
    lr.train_iters = *options.train_iters;
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
  SLIME_ASSIGN_OR_RETURN(LrSchedule schedule, MakeLrSchedule(lr));

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
  SLIME_ASSIGN_OR_RETURN(std::unique_ptr<AdamW> optimizer,
                         AdamW::ForModel(model->weights(), model->config(),
                                         AdamWOptions::FromTrainConfig(config.train)));

  impl->estimator = estimator;
  impl->policy = policy;
  impl->batching = batching;
  impl->sft = sft;
  impl->need_ref = !sft && (config.algorithm.use_kl_loss || config.algorithm.kl_coef != 0);
  impl->teacher_pass = !sft && config.algorithm.use_opd && config.algorithm.opd_type == "megatron";
  impl->teacher_given = !sft && config.algorithm.use_opd && config.algorithm.opd_type == "sglang";
  impl->needs_rollout_log_probs =
      !sft && (config.algorithm.use_tis || config.algorithm.get_mismatch_metrics ||
               config.algorithm.use_rollout_logprobs);

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
  if (impl->need_ref) {
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
            return LoadWeightCopy("reference", *dir, ckpt_step, impl->names, impl->params, dtype);
          }));
    }
  }
  if (impl->teacher_pass) {
    std::optional<int64_t> ckpt_step;
    if (config.algorithm.opd_teacher_ckpt_step.has_value()) {
      ckpt_step = *config.algorithm.opd_teacher_ckpt_step;
    }
    SLIME_ASSIGN_OR_RETURN(impl->copies[kTeacher],
                           GuardTorch("trainer: load the teacher weights", [&]() {
                             return LoadWeightCopy("teacher", *config.algorithm.opd_teacher_load,
                                                   ckpt_step, impl->names, impl->params, dtype);
                           }));
  }
  if (!sft && config.algorithm.keep_old_actor) {
    SLIME_ASSIGN_OR_RETURN(impl->copies[kOldActor], clone_actor());
    if (config.weight_sync.interval == 1) {
      SLIME_ASSIGN_OR_RETURN(impl->copies[kRolloutActor], clone_actor());
    }
  }

  std::vector<std::string> tags;
  for (const auto& [tag, tensors] : impl->copies) tags.push_back(tag);
  spdlog::info("trainer: {} on {} ({}), loss {}, estimator {}, CPU copies [{}], dp rank {}/{}",
               options.model_dir, model->device().str(), c10::toString(dtype),
               config.algorithm.loss_type, AdvantageEstimatorName(estimator), fmt::join(tags, ", "),
               options.dp_rank, options.dp_size);
  std::unique_ptr<Trainer> trainer(new Trainer(std::move(options), std::move(model),
                                               std::move(optimizer), LrScheduler(schedule)));
  trainer->impl_ = std::move(impl);
  return trainer;
}

model::DecoderModel& Trainer::model() {
  impl_->actor_backup_current = false;
  return *model_;
}

bool Trainer::has_weights(PolicyWeights which) const {
  if (which == PolicyWeights::kActor) return true;
  return impl_->copies.count(CopyTag(which)) > 0;
}

bool Trainer::SkipsOldLogProbs(int64_t num_steps) const {
  const config::AlgorithmConfig& a = options_.config.algorithm;
  return num_steps == 1 && !impl_->sft && a.kl_coef == 0 && !a.use_rollout_logprobs &&
         !a.get_mismatch_metrics && impl_->estimator != AdvantageEstimator::kPpo &&
         !a.keep_old_actor && !a.use_opd && !a.use_routing_replay &&
         impl_->estimator != AdvantageEstimator::kGspo;
}

// ---- Batch checks ------------------------------------------------------------------------------

Status Trainer::CheckBatch(const RolloutBatch& batch) const {
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
    const TrainSample& s = batch.samples[i];
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
    if (s.rollout_log_probs.empty() && impl_->needs_rollout_log_probs && s.response_length > 0) {
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
    if (s.teacher_log_probs.empty() && impl_->teacher_given && s.response_length > 0) {
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

// ---- Weight swap -------------------------------------------------------------------------------

namespace {

void CopyInto(const std::vector<torch::Tensor>& dst, const std::vector<torch::Tensor>& src) {
  torch::NoGradGuard no_grad;
  for (size_t k = 0; k < dst.size(); ++k) dst[k].copy_(src[k]);
}

}  // namespace

// The swap of the header comment.
Status Trainer::WithPolicyWeights(PolicyWeights which, const std::function<Status()>& fn) {
  if (which == PolicyWeights::kActor) return fn();
  Impl& impl = *impl_;
  auto it = impl.copies.find(CopyTag(which));
  if (it == impl.copies.end()) {
    return absl::FailedPreconditionError(
        fmt::format("trainer: no {} weights are kept (the configuration does not use them)",
                    PolicyWeightsName(which)));
  }
  bool swapped = false;
  Status status = GuardTorch(
      fmt::format("trainer: swap in the {} weights", PolicyWeightsName(which)), [&]() -> Status {
        if (!impl.actor_backup_current) {
          if (impl.actor_backup.size() != impl.params.size()) {
            impl.actor_backup.clear();
            for (const torch::Tensor& p : impl.params) impl.actor_backup.push_back(CpuCopy(p));
          } else {
            CopyInto(impl.actor_backup, impl.params);
          }
          impl.actor_backup_current = true;
        }
        swapped = true;  // from here on the live parameters may differ from the actor
        CopyInto(impl.params, it->second);
        return absl::OkStatus();
      });
  if (status.ok()) status = fn();
  if (swapped) {
    // Always restore, also after a failure in the middle of the swap or of `fn`.
    Status restored = GuardTorch("trainer: restore the actor weights", [&]() -> Status {
      CopyInto(impl.params, impl.actor_backup);
      return absl::OkStatus();
    });
    if (!restored.ok()) {
      spdlog::error("{} (the model's weights are now undefined)", std::string(restored.message()));
      return restored;
    }
  }
  return status;
}

// ---- Forward passes ----------------------------------------------------------------------------

namespace {

StatusOr<ResponseLogProbs> ForwardMicroBatch(model::DecoderModel& model, const RolloutBatch& batch,
                                             const std::vector<int64_t>& samples,
                                             int64_t chunk_size, bool with_entropy) {
  PackedInputs in;
  Status packed = GuardTorch("trainer: pack a micro-batch", [&]() -> Status {
    in = Pack(batch, samples, model.device());
    return absl::OkStatus();
  });
  SLIME_RETURN_IF_ERROR(packed);
  SLIME_ASSIGN_OR_RETURN(torch::Tensor hidden, model.ForwardPacked(in.ids, in.packed.cu_seqlens));
  LogProbOptions o;
  o.temperature = batch.temperature;
  o.chunk_size = chunk_size;
  o.compute_entropy = with_entropy;
  return ComputeResponseLogProbs(hidden, model.weights().lm_head, in.ids, in.packed,
                                 model.tp_group(), o);
}

// Forward-only log-probs of every sample of `micro_batches` into out[sample].
Status ForwardOnly(model::DecoderModel& model, const RolloutBatch& batch,
                   const std::vector<const MicroBatch*>& micro_batches, int64_t chunk_size,
                   bool with_entropy, SampleLogProbs& out) {
  torch::NoGradGuard no_grad;
  for (const MicroBatch* mb : micro_batches) {
    SLIME_ASSIGN_OR_RETURN(ResponseLogProbs r,
                           ForwardMicroBatch(model, batch, mb->samples, chunk_size, with_entropy));
    Status split = GuardTorch("trainer: split log-probs", [&]() -> Status {
      for (size_t k = 0; k < mb->samples.size(); ++k) {
        const int64_t i = mb->samples[k];
        out.log_probs[i] = r.log_probs.slice(0, r.offsets[k], r.offsets[k + 1]).detach();
        if (with_entropy) {
          out.entropy[i] = r.entropy.slice(0, r.offsets[k], r.offsets[k + 1]).detach();
        }
      }
      return absl::OkStatus();
    });
    SLIME_RETURN_IF_ERROR(split);
  }
  return absl::OkStatus();
}

}  // namespace

StatusOr<SampleLogProbs> Trainer::ComputeLogProbs(const RolloutBatch& batch, PolicyWeights which,
                                                  bool with_entropy) {
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
    return ForwardOnly(*model_, batch, mbs, options_.config.train.log_probs_chunk_size,
                       with_entropy, out);
  }));
  return out;
}

// ---- Training ----------------------------------------------------------------------------------

namespace {

// Rollout ids for the scheduler: the samples' own, -1 replaced by ids of their own.
std::vector<int64_t> SchedulingRolloutIds(const RolloutBatch& batch) {
  int64_t max_id = -1;
  bool any = false;
  for (const TrainSample& s : batch.samples) {
    if (s.rollout_id >= 0) {
      any = true;
      max_id = std::max(max_id, s.rollout_id);
    }
  }
  if (!any) return {};
  std::vector<int64_t> ids(batch.samples.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t id = batch.samples[i].rollout_id;
    ids[i] = id >= 0 ? id : max_id + 1 + static_cast<int64_t>(i);
  }
  return ids;
}

int64_t CountRollouts(const std::vector<int64_t>& ids, size_t num_samples) {
  if (ids.empty()) return static_cast<int64_t>(num_samples);
  return static_cast<int64_t>(std::set<int64_t>(ids.begin(), ids.end()).size());
}

// losses.h's denominators of one step: G or N, and D_i per sample (indexed like the batch).
struct StepDenominators {
  double step = 1.0;
  std::vector<double> per_sample;
};

StepDenominators MakeDenominators(const RolloutBatch& batch, const std::vector<int64_t>& ids,
                                  const std::vector<int64_t>& step_samples, bool per_token) {
  StepDenominators d;
  d.per_sample.assign(batch.samples.size(), 0.0);
  auto id_of = [&](int64_t i) { return ids.empty() ? i : ids[i]; };
  auto mask_sum = [&](int64_t i) {
    double sum = 0;
    for (float m : batch.samples[i].loss_mask) sum += m;
    return sum;
  };
  std::map<int64_t, double> rollout_tokens;
  double tokens = 0;
  for (int64_t i : step_samples) {
    const double m = mask_sum(i);
    rollout_tokens[id_of(i)] += m;
    tokens += m;
  }
  for (int64_t i : step_samples) d.per_sample[i] = rollout_tokens[id_of(i)];
  d.step = per_token ? std::max(tokens, 1.0) : static_cast<double>(rollout_tokens.size());
  return d;
}

// Sums the named 0-dim metric tensors into `sums` (float64).
void Accumulate(const std::map<std::string, torch::Tensor>& metrics,
                std::map<std::string, torch::Tensor>& sums) {
  for (const auto& [name, value] : metrics) {
    torch::Tensor v = value.detach().to(torch::kFloat64);
    auto it = sums.find(name);
    if (it == sums.end()) {
      sums.emplace(name, v.clone());
    } else {
      it->second.add_(v);
    }
  }
}

}  // namespace

// One optimizer step over this rank's micro-batches of `step` (see the header comment).
StatusOr<TrainStepMetrics> Trainer::RunStep(int64_t rollout_id, int64_t step_in_rollout,
                                            int64_t num_steps, bool sft, const RolloutBatch& batch,
                                            const std::vector<int64_t>& rollout_ids,
                                            const StepSchedule& step,
                                            const SampleTensors& tensors) {
  const bool per_token = options_.config.train.calculate_per_token_loss;
  const StepDenominators denominators =
      MakeDenominators(batch, rollout_ids, step.samples, per_token);

  std::map<std::string, torch::Tensor> sums;
  for (const MicroBatch& mb : step.ranks[options_.dp_rank]) {
    SLIME_ASSIGN_OR_RETURN(
        ResponseLogProbs r,
        ForwardMicroBatch(*model_, batch, mb.samples, options_.config.train.log_probs_chunk_size,
                          /*with_entropy=*/!sft));
    std::vector<int64_t> lengths;
    std::vector<double> sample_denominators;
    for (int64_t i : mb.samples) {
      lengths.push_back(batch.samples[i].response_length);
      sample_denominators.push_back(denominators.per_sample[i]);
    }
    ReduceOptions ro;
    ro.per_token_loss = per_token;
    ro.sample_denominators = std::move(sample_denominators);
    ro.step_denominator = denominators.step;
    torch::Tensor mask;
    Status gathered = GuardTorch("trainer: gather the micro-batch", [&]() -> Status {
      mask = Gather(tensors.loss_masks, mb.samples);
      return absl::OkStatus();
    });
    SLIME_RETURN_IF_ERROR(gathered);
    SLIME_ASSIGN_OR_RETURN(LossReducer reducer, LossReducer::Create(lengths, mask, ro));

    StatusOr<LossOutput> loss = absl::InternalError("unset");
    if (sft) {
      loss = SftLoss(reducer, r.log_probs);
    } else {
      PolicyLossInputs in;
      Status built = GuardTorch("trainer: policy loss inputs", [&]() -> Status {
        in.log_probs = r.log_probs;
        in.advantages = Gather(tensors.advantages, mb.samples);
        if (AllDefined(tensors.old_log_probs, mb.samples)) {
          in.old_log_probs = Gather(tensors.old_log_probs, mb.samples);
        }
        in.entropy = impl_->policy.entropy_coef != 0 ? r.entropy : r.entropy.detach();
        if (impl_->policy.use_kl_loss) in.ref_log_probs = Gather(tensors.ref_log_probs, mb.samples);
        if (AllDefined(tensors.rollout_log_probs, mb.samples)) {
          in.rollout_log_probs = Gather(tensors.rollout_log_probs, mb.samples);
        }
        if (AllDefined(tensors.opd_reverse_kl, mb.samples)) {
          in.opd_reverse_kl = Gather(tensors.opd_reverse_kl, mb.samples);
        }
        return absl::OkStatus();
      });
      SLIME_RETURN_IF_ERROR(built);
      loss = PolicyLoss(impl_->policy, reducer, in);
    }
    if (!loss.ok()) return loss.status();
    Status backward = GuardTorch("trainer: backward", [&]() -> Status {
      if (loss->loss.requires_grad()) loss->loss.backward();
      Accumulate(loss->metrics, sums);
      return absl::OkStatus();
    });
    SLIME_RETURN_IF_ERROR(backward);
  }

  // DP: sum the gradients and the metrics over the group.
  if (options_.dp_size > 1) {
    Status reduced = GuardTorch("trainer: DP all-reduce", [&]() -> Status {
      torch::NoGradGuard no_grad;
      for (const std::string& name : optimizer_->TrainableNames()) {
        const auto k =
            std::find(impl_->names.begin(), impl_->names.end(), name) - impl_->names.begin();
        torch::Tensor& p = impl_->params[k];
        if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
        torch::Tensor g = p.grad();
        SLIME_RETURN_IF_ERROR(options_.dp_all_reduce(g));
      }
      if (!sums.empty()) {
        std::vector<torch::Tensor> values;
        for (const auto& [name, v] : sums) values.push_back(v);
        torch::Tensor stacked = torch::stack(values).cpu();
        SLIME_RETURN_IF_ERROR(options_.dp_all_reduce(stacked));
        size_t k = 0;
        for (auto& [name, v] : sums) v = stacked[k++];
      }
      return absl::OkStatus();
    });
    SLIME_RETURN_IF_ERROR(reduced);
  }

  TrainStepMetrics metrics;
  metrics.rollout_id = rollout_id;
  metrics.step = step_;
  metrics.step_in_rollout = step_in_rollout;
  metrics.num_samples = static_cast<int64_t>(step.samples.size());
  Status read = GuardTorch("trainer: read metrics", [&]() -> Status {
    for (const auto& [name, v] : sums) metrics.values[name] = v.item<double>();
    return absl::OkStatus();
  });
  SLIME_RETURN_IF_ERROR(read);

  SLIME_ASSIGN_OR_RETURN(OptimizerStepResult result, optimizer_->Step(lr_scheduler_.lr()));
  impl_->actor_backup_current = false;
  ++step_;
  metrics.skipped = result.skipped;
  metrics.values["grad_norm"] = result.grad_norm;
  metrics.values["lr"] = result.lr;
  if (result.skipped) {
    spdlog::warn("train: rollout {} step {}: skipped, the gradient norm is {} (not finite)",
                 rollout_id, metrics.step, result.grad_norm);
  } else {
    lr_scheduler_.Step(metrics.num_samples);
  }
  if (rollout_id >= 0) {
    spdlog::info("train: rollout {} step {} ({}/{} of the rollout, {} samples): {}", rollout_id,
                 metrics.step, step_in_rollout + 1, num_steps, metrics.num_samples,
                 FormatValues(metrics.values));
  } else {
    spdlog::info("train: sft step {} ({} samples): {}", metrics.step, metrics.num_samples,
                 FormatValues(metrics.values));
  }
  return metrics;
}

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

StatusOr<TrainRolloutResult> Trainer::TrainRollout(int64_t rollout_id, const RolloutBatch& batch) {
  SLIME_RETURN_IF_ERROR(CheckBatch(batch));
  const config::AlgorithmConfig& algorithm = options_.config.algorithm;
  const size_t n = batch.samples.size();
  const bool sft = impl_->sft;

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
      const TrainSample& s = batch.samples[i];
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
  if (!sft) {
    const int64_t chunk = options_.config.train.log_probs_chunk_size;
    auto forward = [&](PolicyWeights which, bool with_entropy, SampleLogProbs& out) {
      out.log_probs.resize(n);
      if (with_entropy) out.entropy.resize(n);
      return WithPolicyWeights(which, [&]() -> Status {
        return ForwardOnly(*model_, batch, micro_batches, chunk, with_entropy, out);
      });
    };
    // 1–3. Reference, teacher and old-actor log-probs.
    if (impl_->need_ref) SLIME_RETURN_IF_ERROR(forward(PolicyWeights::kRef, false, ref));
    if (impl_->teacher_pass)
      SLIME_RETURN_IF_ERROR(forward(PolicyWeights::kTeacher, false, teacher));
    if (!skip_old) {
      SLIME_RETURN_IF_ERROR(
          forward(algorithm.keep_old_actor ? PolicyWeights::kOldActor : PolicyWeights::kActor,
                  algorithm.use_rollout_entropy, old));
    }

    // 4. Advantages and returns over this rank's samples.
    AdvantageInputs in;
    std::vector<torch::Tensor> teacher_by_sample(n);
    Status built = GuardTorch("trainer: advantage inputs", [&]() -> Status {
      for (int64_t i : local) {
        const TrainSample& s = batch.samples[i];
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
        if (impl_->need_ref) in.ref_log_probs.push_back(ref.log_probs[i]);
        if (impl_->teacher_pass) {
          teacher_by_sample[i] = teacher.log_probs[i];
        } else if (impl_->teacher_given) {
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
      if (impl_->need_ref) tensors.ref_log_probs[i] = ref.log_probs[i];
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
      if (!skip_old) put("log_probs", MeanOfSampleMeans(old.log_probs, tensors.loss_masks, local));
      if (!old.entropy.empty()) {
        put("entropy", MeanOfSampleMeans(old.entropy, tensors.loss_masks, local));
      }
      if (impl_->need_ref) {
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
    SLIME_ASSIGN_OR_RETURN(TrainStepMetrics metrics, RunStep(rollout_id, s, num_steps, sft, batch,
                                                             ids, schedule.steps[s], tensors));
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

StatusOr<TrainStepMetrics> Trainer::SftStep(const RolloutBatch& batch) {
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
  return RunStep(/*rollout_id=*/-1, 0, 1, /*sft=*/true, batch, ids, step, tensors);
}

// ---- keep_old_actor ----------------------------------------------------------------------------

Status Trainer::OnWeightsSynced() {
  if (!options_.config.algorithm.keep_old_actor || impl_->sft) return absl::OkStatus();
  return GuardTorch("trainer: update the old-actor weights", [&]() -> Status {
    auto& copies = impl_->copies;
    if (copies.count(kRolloutActor) > 0) {
      CopyInto(copies[kOldActor], copies[kRolloutActor]);
      CopyInto(copies[kRolloutActor], impl_->params);
    } else {
      CopyInto(copies[kOldActor], impl_->params);
    }
    return absl::OkStatus();
  });
}

// ---- Checkpoints -------------------------------------------------------------------------------

StatusOr<std::string> Trainer::Save(const std::string& save_dir, int64_t rollout_id,
                                    const std::string& extra_state_json) {
  SaveCheckpointOptions o;
  o.save_dir = save_dir;
  o.iteration = rollout_id;
  o.keep_last = options_.config.checkpoint.keep_last.value_or(0);
  o.save_optimizer = !options_.config.checkpoint.no_save_optim;
  TrainerProgress progress;
  progress.step = step_;
  progress.rollout_id = rollout_id;
  progress.lr_scheduler_json = LrStateToJson(lr_scheduler_.State()).dump();
  progress.data_source_json = extra_state_json;
  return SaveTrainerCheckpoint(o, model_->weights(), model_->config(), optimizer_.get(), progress);
}

StatusOr<LoadedTrainerState> Trainer::Load(const std::string& load_dir,
                                           std::optional<int64_t> ckpt_step) {
  // Check the LR scheduler state before anything changes (trainer_state.json, checkpoint.h).
  auto parse_lr = [&](const std::string& text,
                      const std::string& where) -> StatusOr<std::optional<LrScheduler>> {
    nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return absl::InvalidArgumentError(
          fmt::format("{}: lr_scheduler is not a JSON object", where));
    }
    if (j.empty()) return std::optional<LrScheduler>();  // saved without a scheduler
    SLIME_ASSIGN_OR_RETURN(LrSchedulerState state, LrStateFromJson(j, where));
    LrScheduler scheduler = lr_scheduler_;
    Status loaded = scheduler.LoadState(state, options_.lr_state_mismatch);
    if (!loaded.ok()) {
      return absl::Status(
          loaded.code(), fmt::format("{}: LR scheduler: {}", where, std::string(loaded.message())));
    }
    return std::optional<LrScheduler>(std::move(scheduler));
  };
  if (auto dir = ResolveCheckpointDir(load_dir, ckpt_step); dir.ok()) {
    const std::string path = (std::filesystem::path(*dir) / kTrainerStateFile).string();
    std::ifstream file(path);
    nlohmann::json state = nlohmann::json::parse(file, nullptr, /*allow_exceptions=*/false);
    if (!state.is_discarded() && state.is_object() && state.contains("lr_scheduler")) {
      SLIME_RETURN_IF_ERROR(parse_lr(state["lr_scheduler"].dump(), path).status());
    }
  }

  LoadCheckpointOptions o;
  o.load_dir = load_dir;
  o.ckpt_step = ckpt_step;
  o.load_optimizer = !options_.config.checkpoint.no_load_optim;
  SLIME_ASSIGN_OR_RETURN(
      LoadedCheckpoint loaded,
      LoadTrainerCheckpoint(o, model_->mutable_weights(), model_->config(), optimizer_.get()));
  impl_->actor_backup_current = false;
  step_ = loaded.progress.step;

  LoadedTrainerState out;
  out.dir = loaded.dir;
  out.rollout_id = loaded.progress.rollout_id;
  out.step = loaded.progress.step;
  out.extra_state_json = loaded.progress.data_source_json;
  out.optimizer_loaded = loaded.optimizer_loaded;

  auto scheduler = parse_lr(loaded.progress.lr_scheduler_json,
                            (std::filesystem::path(loaded.dir) / kTrainerStateFile).string());
  if (!scheduler.ok()) {
    return absl::Status(scheduler.status().code(),
                        fmt::format("{} (the weights and optimizer state were loaded)",
                                    std::string(scheduler.status().message())));
  }
  if (scheduler->has_value()) {
    lr_scheduler_ = std::move(**scheduler);
  } else {
    spdlog::warn("trainer: {} has no LR scheduler state; the schedule starts from step 0",
                 loaded.dir);
  }
  if (options_.config.algorithm.keep_old_actor && !impl_->sft) {
    Status copied = GuardTorch("trainer: old-actor weights from the checkpoint", [&]() -> Status {
      for (const char* tag : {kOldActor, kRolloutActor}) {
        auto it = impl_->copies.find(tag);
        if (it != impl_->copies.end()) CopyInto(it->second, impl_->params);
      }
      return absl::OkStatus();
    });
    SLIME_RETURN_IF_ERROR(copied);
  }
  return out;
}

}  // namespace slime::train
