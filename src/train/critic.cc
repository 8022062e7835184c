// The PPO critic (see include/slime/train/critic.h).
#include "slime/train/critic.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <utility>

#include "slime/model/decoder.h"
#include "slime/model/safetensors.h"
#include "slime/model/weights.h"
#include "slime/train/checkpoint.h"
#include "slime/train/logprobs.h"
#include "slime/train/losses.h"
#include "slime/train/optimizer.h"
#include "slime/train/trainer.h"
#include "trainer_internal.h"

namespace slime::train {

using internal::GuardTorch;

namespace {

// N(0, kValueHeadInitStd²) values for the head, from `seed` (the same bytes on every machine
// for one standard library: mt19937_64 and a Box–Muller transform of our own).
torch::Tensor InitValueHead(int64_t hidden, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> values(static_cast<size_t>(hidden));
  constexpr double two_pi = 6.283185307179586;
  auto uniform = [&]() { return (static_cast<double>(rng() >> 11) + 0.5) * 0x1.0p-53; };
  for (size_t i = 0; i < values.size(); i += 2) {
    const double r = std::sqrt(-2.0 * std::log(uniform()));
    const double theta = two_pi * uniform();
    values[i] = static_cast<float>(kValueHeadInitStd * r * std::cos(theta));
    if (i + 1 < values.size()) {
      values[i + 1] = static_cast<float>(kValueHeadInitStd * r * std::sin(theta));
    }
  }
  return torch::tensor(values, torch::kFloat32).reshape({1, hidden}).clone();
}

// The value head stored in `dir`'s extra weights, or an undefined tensor when `dir` has none.
StatusOr<torch::Tensor> ReadValueHead(const std::string& dir, int64_t hidden) {
  const std::string path = (std::filesystem::path(dir) / kExtraWeightsFile).string();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return torch::Tensor();
  SLIME_ASSIGN_OR_RETURN(std::shared_ptr<const model::SafetensorsFile> file,
                         model::SafetensorsFile::Open(path));
  const model::SafetensorsTensorInfo* info = file->Find(kValueHeadName);
  if (info == nullptr) return torch::Tensor();
  if (info->shape != std::vector<int64_t>{1, hidden} ||
      info->dtype != model::SafetensorsDType::kF32) {
    return absl::DataLossError(
        fmt::format("{}: \"{}\" must be F32 of shape [1, {}] (the model's hidden size)", path,
                    kValueHeadName, hidden));
  }
  torch::Tensor t = torch::empty({1, hidden}, torch::kFloat32);
  std::memcpy(t.data_ptr(), file->Data(*info), static_cast<size_t>(hidden) * sizeof(float));
  return t;
}

}  // namespace

Critic::Critic(CriticOptions options, std::unique_ptr<model::DecoderModel> model,
               torch::Tensor value_head, std::unique_ptr<AdamW> optimizer, LrScheduler lr_scheduler)
    : options_(std::move(options)),
      model_(std::move(model)),
      value_head_(std::move(value_head)),
      optimizer_(std::move(optimizer)),
      lr_scheduler_(std::move(lr_scheduler)) {}

Critic::~Critic() = default;

StatusOr<std::unique_ptr<Critic>> Critic::Create(CriticOptions options) {
  const config::Config& config = options.config;
  if (options.model_dir.empty()) {
    return absl::InvalidArgumentError("critic: model_dir is empty (an HF model directory)");
  }
  if (options.dp_size < 1 || options.dp_rank < 0 || options.dp_rank >= options.dp_size ||
      (options.dp_size > 1 && !options.dp_all_reduce)) {
    return absl::InvalidArgumentError(fmt::format(
        "critic: dp_rank = {}, dp_size = {}: need 0 <= dp_rank < dp_size and dp_all_reduce "
        "when dp_size > 1",
        options.dp_rank, options.dp_size));
  }
  if (!std::isfinite(config.algorithm.value_clip) || config.algorithm.value_clip < 0) {
    return absl::InvalidArgumentError(
        fmt::format("algorithm.value_clip = {} is not valid (>= 0)", config.algorithm.value_clip));
  }
  // A critic checkpoint (<save> or iteration dir) or an HF directory.
  std::string dir = options.model_dir;
  auto checkpoint_dir = ResolveCheckpointDir(dir);
  if (checkpoint_dir.ok()) {
    dir = *checkpoint_dir;
  } else if (!absl::IsNotFound(checkpoint_dir.status())) {
    return absl::Status(
        checkpoint_dir.status().code(),
        fmt::format("critic weights: {}", std::string(checkpoint_dir.status().message())));
  }
  const torch::ScalarType dtype =
      options.dtype.value_or(options.device.is_cuda() ? torch::kBFloat16 : torch::kFloat32);
  SLIME_ASSIGN_OR_RETURN(std::unique_ptr<model::DecoderModel> model,
                         model::DecoderModel::Load(dir, dtype, options.device));
  SLIME_RETURN_IF_ERROR(internal::ApplyRecompute(config.train, *model, "critic"));
  const int64_t hidden = model->config().hidden_size;
  SLIME_ASSIGN_OR_RETURN(torch::Tensor head, GuardTorch("critic: read the value head", [&]() {
                           return ReadValueHead(dir, hidden);
                         }));
  const bool loaded_head = head.defined();

  const double lr = config.train.critic_lr.value_or(config.train.lr);
  const double min_lr = config.train.critic_min_lr.value_or(config.train.min_lr);
  SLIME_ASSIGN_OR_RETURN(LrSchedule schedule,
                         internal::MakeRunLrSchedule(config, options.train_iters, lr, min_lr));

  std::vector<OptimizerParam> params;
  Status built = GuardTorch("critic: create", [&]() -> Status {
    if (!head.defined()) head = InitValueHead(hidden, static_cast<uint64_t>(config.train.seed));
    head = head.to(options.device, dtype, /*non_blocking=*/false, /*copy=*/true);
    head.set_requires_grad(true);
    for (model::NamedTensor& nt : model::NamedParameters(model->weights(), model->config())) {
      nt.tensor.set_requires_grad(true);
    }
    params = ModelParameters(model->weights(), model->config());
    params.push_back({kValueHeadName, head, /*replicated=*/true});
    return absl::OkStatus();
  });
  SLIME_RETURN_IF_ERROR(built);
  // The decoder's LM head is not part of the critic's function: freeze it (a tied head is the
  // embedding, listed under its own name, and stays trainable).
  AdamWOptions adam = AdamWOptions::FromTrainConfig(config.train);
  adam.distributed = adam.distributed && options.dp_size > 1;
  adam.dp_size = options.dp_size;
  adam.dp_rank = options.dp_rank;
  adam.dp_all_reduce = options.dp_all_reduce;
  adam.dp_reduce_scatter = options.dp_reduce_scatter;
  adam.dp_all_gather = options.dp_all_gather;
  if (!adam.only_train_params_name_list.empty()) {
    adam.only_train_params_name_list.push_back("^value_head\\.weight$");
  } else {
    adam.freeze_params_name_list.push_back("^lm_head\\.weight$");
  }
  SLIME_ASSIGN_OR_RETURN(std::unique_ptr<AdamW> optimizer,
                         AdamW::Create(std::move(params), std::move(adam)));
  spdlog::info("critic: {} on {} ({}), value head {}, lr {}", dir, model->device().str(),
               c10::toString(dtype), loaded_head ? "loaded" : "initialised N(0, 0.02)", lr);
  std::unique_ptr<Critic> critic(new Critic(std::move(options), std::move(model), std::move(head),
                                            std::move(optimizer), LrScheduler(schedule)));
  const CriticOptions& o = critic->options_;
  SLIME_ASSIGN_OR_RETURN(critic->grad_reducer_,
                         internal::MakeGradReducer("critic", o.config.train, o.dp_size,
                                                   critic->optimizer_->distributed(),
                                                   o.dp_all_reduce_async,
                                                   critic->TrainableParameters()));
  return critic;
}

std::vector<torch::Tensor> Critic::TrainableParameters() const {
  const std::vector<torch::Tensor> params = Parameters();
  std::vector<std::string> names;
  for (const model::NamedTensor& nt : model::NamedParameters(model_->weights(), model_->config())) {
    names.push_back(nt.name);
  }
  names.push_back(kValueHeadName);
  std::vector<torch::Tensor> trainable;
  for (size_t k = 0; k < params.size(); ++k) {
    if (optimizer_->IsTrainable(names[k])) trainable.push_back(params[k]);
  }
  return trainable;
}

std::vector<torch::Tensor> Critic::Parameters() const {
  std::vector<torch::Tensor> out;
  for (const model::NamedTensor& nt : model::NamedParameters(model_->weights(), model_->config())) {
    out.push_back(nt.tensor);
  }
  out.push_back(value_head_);
  return out;
}

// ---- Values
// --------------------------------------------------------------------------------------

StatusOr<torch::Tensor> Critic::ForwardValues(const data::RolloutBatch& batch,
                                              const std::vector<int64_t>& samples) {
  internal::PackedInputs in;
  SLIME_RETURN_IF_ERROR(GuardTorch("critic: pack a micro-batch", [&]() -> Status {
    // The critic is one rank (no TP): its micro-batches pad to data_pad_size_multiplier.
    in = internal::Pack(batch, samples, model_->device(),
                        options_.config.train.data_pad_size_multiplier);
    return absl::OkStatus();
  }));
  SLIME_ASSIGN_OR_RETURN(std::vector<int64_t> rows, ResponsePredictorRows(in.packed));
  SLIME_ASSIGN_OR_RETURN(torch::Tensor hidden, model_->ForwardPacked(in.ids, in.forward_cu_seqlens));
  return GuardTorch("critic: value head", [&]() -> StatusOr<torch::Tensor> {
    const torch::Tensor index = torch::tensor(rows, torch::kLong).to(model_->device());
    // [R, hidden] · [hidden, 1] → [R] in the model dtype, then float32 (like the LM head).
    return torch::matmul(hidden.index_select(0, index), value_head_.t())
        .squeeze(-1)
        .to(torch::kFloat32);
  });
}

Status Critic::ComputeValues(const data::RolloutBatch& batch,
                             const std::vector<const MicroBatch*>& micro_batches,
                             std::vector<torch::Tensor>& out) {
  if (out.size() != batch.samples.size()) {
    return absl::InvalidArgumentError(
        fmt::format("critic: {} value slots for {} samples", out.size(), batch.samples.size()));
  }
  torch::NoGradGuard no_grad;
  for (const MicroBatch* mb : micro_batches) {
    SLIME_ASSIGN_OR_RETURN(torch::Tensor values, ForwardValues(batch, mb->samples));
    SLIME_RETURN_IF_ERROR(GuardTorch("critic: split values", [&]() -> Status {
      int64_t offset = 0;
      for (int64_t i : mb->samples) {
        const int64_t r = batch.samples[i].response_length;
        out[i] = values.slice(0, offset, offset + r).detach();
        offset += r;
      }
      return absl::OkStatus();
    }));
  }
  return absl::OkStatus();
}

// ---- Training
// ------------------------------------------------------------------------------------

StatusOr<CriticStepResult> Critic::TrainStep(const data::RolloutBatch& batch,
                                             const std::vector<CriticMicroBatch>& micro_batches,
                                             const std::vector<torch::Tensor>& old_values,
                                             const std::vector<torch::Tensor>& returns,
                                             int64_t num_samples) {
  std::map<std::string, torch::Tensor> sums;
  GradReducer* overlap = grad_reducer_.get();  // train.overlap_grad_reduce
  if (overlap != nullptr) overlap->Disarm();
  for (size_t k = 0; k < micro_batches.size(); ++k) {
    const CriticMicroBatch& mb = micro_batches[k];
    SLIME_ASSIGN_OR_RETURN(torch::Tensor values, ForwardValues(batch, *mb.samples));
    ValueLossInputs in;
    SLIME_RETURN_IF_ERROR(GuardTorch("critic: value loss inputs", [&]() -> Status {
      if (!internal::AllDefined(old_values, *mb.samples) ||
          !internal::AllDefined(returns, *mb.samples)) {
        return absl::InvalidArgumentError("critic: old values or returns missing for a sample");
      }
      in.values = values;
      in.old_values = internal::Gather(old_values, *mb.samples);
      in.returns = internal::Gather(returns, *mb.samples);
      return absl::OkStatus();
    }));
    SLIME_ASSIGN_OR_RETURN(LossOutput loss,
                           ValueLoss(options_.config.algorithm.value_clip, *mb.reducer, in));
    SLIME_RETURN_IF_ERROR(GuardTorch("critic: backward", [&]() -> Status {
      if (overlap != nullptr && k + 1 == micro_batches.size()) overlap->Arm();
      if (loss.loss.requires_grad()) loss.loss.backward();
      internal::Accumulate(loss.metrics, sums);
      return absl::OkStatus();
    }));
  }
  if (overlap != nullptr) {
    if (micro_batches.empty()) overlap->Arm();  // nothing ran: post every bucket now
    SLIME_RETURN_IF_ERROR(overlap->Finish());
    SLIME_RETURN_IF_ERROR(internal::AllReduceGradsAndMetrics(
        options_.dp_all_reduce, {}, sums, options_.config.train.ddp_bucket_size));
  } else if (options_.dp_size > 1 && optimizer_->distributed()) {
    // ZeRO-1: the optimizer reduce-scatters the gradients; only the metrics are summed here.
    SLIME_RETURN_IF_ERROR(internal::AllReduceGradsAndMetrics(
        options_.dp_all_reduce, {}, sums, options_.config.train.ddp_bucket_size));
  } else if (options_.dp_size > 1) {
    SLIME_RETURN_IF_ERROR(internal::AllReduceGradsAndMetrics(options_.dp_all_reduce,
                                                             TrainableParameters(), sums,
                                                             options_.config.train.ddp_bucket_size));
  }
  CriticStepResult result;
  SLIME_RETURN_IF_ERROR(GuardTorch("critic: read metrics", [&]() -> Status {
    for (const auto& [name, v] : sums) result.values[name] = v.item<double>();
    return absl::OkStatus();
  }));
  SLIME_ASSIGN_OR_RETURN(OptimizerStepResult step, optimizer_->Step(lr_scheduler_.lr()));
  ++step_;
  result.skipped = step.skipped;
  result.values["critic_grad_norm"] = step.grad_norm;
  result.values["critic_lr"] = step.lr;
  if (step.skipped) {
    spdlog::warn("critic: step {} skipped, the gradient norm is {} (not finite)", step_ - 1,
                 step.grad_norm);
  } else {
    lr_scheduler_.Step(num_samples);
  }
  return result;
}

// ---- Checkpoints
// ---------------------------------------------------------------------------------

StatusOr<std::string> Critic::Save(const std::string& save_dir, int64_t iteration,
                                   AsyncCheckpointWriter* background, const Status& previous) {
  // Distributed optimizer: gather the shards (every rank) before rank 0 writes.
  const bool sharded = optimizer_->distributed();
  const bool writer = !sharded || options_.dp_rank == 0;
  std::optional<OptimizerState> gathered;
  if (sharded && !options_.config.checkpoint.no_save_optim) {
    SLIME_ASSIGN_OR_RETURN(gathered, optimizer_->GatherState(writer));
  }
  if (!writer) return std::string();
  SLIME_RETURN_IF_ERROR(previous);
  SaveCheckpointOptions o;
  o.optimizer_state = gathered ? &*gathered : nullptr;
  o.save_dir = save_dir;
  o.iteration = iteration;
  o.keep_last = options_.config.checkpoint.keep_last.value_or(0);
  o.save_optimizer = !options_.config.checkpoint.no_save_optim;
  o.save_rng = false;  // the actor's checkpoint holds the process's RNG state
  o.extra_weights.push_back({kValueHeadName, value_head_});
  TrainerProgress progress;
  progress.step = step_;
  progress.rollout_id = iteration;
  progress.lr_scheduler_json = internal::LrStateToJson(lr_scheduler_.State()).dump();
  if (background != nullptr) {
    return SaveTrainerCheckpointAsync(o, model_->weights(), model_->config(), optimizer_.get(),
                                      progress, *background);
  }
  return SaveTrainerCheckpoint(o, model_->weights(), model_->config(), optimizer_.get(), progress);
}

Status Critic::Load(const std::string& load_dir, std::optional<int64_t> ckpt_step) {
  // The LR state is checked before anything changes.
  SLIME_ASSIGN_OR_RETURN(std::string dir, ResolveCheckpointDir(load_dir, ckpt_step));
  const std::string state_path = (std::filesystem::path(dir) / kTrainerStateFile).string();
  SLIME_ASSIGN_OR_RETURN(
      std::optional<LrScheduler> scheduler,
      internal::ReadLrState(state_path, lr_scheduler_, options_.lr_state_mismatch));
  LoadCheckpointOptions o;
  o.load_dir = dir;
  o.load_optimizer = !options_.config.checkpoint.no_load_optim;
  o.load_rng = false;
  o.extra_weights.push_back({kValueHeadName, value_head_});
  SLIME_ASSIGN_OR_RETURN(
      LoadedCheckpoint loaded,
      LoadTrainerCheckpoint(o, model_->mutable_weights(), model_->config(), optimizer_.get()));
  step_ = loaded.progress.step;
  if (scheduler.has_value()) {
    lr_scheduler_ = std::move(*scheduler);
  } else {
    spdlog::warn("critic: {} has no LR scheduler state; the schedule starts from step 0", dir);
  }
  return absl::OkStatus();
}

}  // namespace slime::train
