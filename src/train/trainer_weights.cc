// The Trainer's weight copies (see include/slime/train/trainer.h, "Weight swap"): loading and
// holding the reference / teacher / old-actor CPU copies, the swap, the keep_old_actor queue,
// and checkpoints (Save / Load).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "slime/model/checkpoint.h"
#include "slime/model/config.h"
#include "slime/model/decoder.h"
#include "slime/model/pipeline_parallel.h"
#include "slime/model/tensor_parallel.h"
#include "slime/model/weights.h"
#include "slime/train/checkpoint.h"
#include "slime/train/optimizer.h"
#include "slime/train/trainer.h"
#include "trainer_internal.h"

namespace slime::train {
namespace internal {

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

void CopyInto(const std::vector<torch::Tensor>& dst, const std::vector<torch::Tensor>& src) {
  torch::NoGradGuard no_grad;
  for (size_t k = 0; k < dst.size(); ++k) dst[k].copy_(src[k]);
}

StatusOr<std::vector<torch::Tensor>> LoadWeightCopy(
    const std::string& what, const std::string& dir, std::optional<int64_t> ckpt_step,
    const std::vector<std::string>& names, const std::vector<torch::Tensor>& like,
    torch::ScalarType dtype, int tp_rank, int tp_size, const model::ExpertShard& experts) {
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
  wo.tp_rank = tp_rank;
  wo.tp_size = tp_size;
  wo.experts = experts;
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

}  // namespace internal

namespace {

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

}  // namespace

namespace internal {

nlohmann::json LrStateToJson(const LrSchedulerState& s) {
  return nlohmann::json{{"num_steps", s.num_steps},
                        {"max_lr", s.max_lr},
                        {"min_lr", s.min_lr},
                        {"init_lr", s.init_lr},
                        {"warmup_steps", s.warmup_steps},
                        {"decay_steps", s.decay_steps},
                        {"decay_style", s.decay_style}};
}

StatusOr<std::optional<LrScheduler>> ParseLrState(const std::string& text, const std::string& where,
                                                  const LrScheduler& configured,
                                                  LrStateMismatch mismatch) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(fmt::format("{}: lr_scheduler is not a JSON object", where));
  }
  if (j.empty()) return std::optional<LrScheduler>();  // saved without a scheduler
  SLIME_ASSIGN_OR_RETURN(LrSchedulerState state, LrStateFromJson(j, where));
  LrScheduler scheduler = configured;
  Status loaded = scheduler.LoadState(state, mismatch);
  if (!loaded.ok()) {
    return absl::Status(loaded.code(),
                        fmt::format("{}: LR scheduler: {}", where, std::string(loaded.message())));
  }
  return std::optional<LrScheduler>(std::move(scheduler));
}

StatusOr<std::optional<LrScheduler>> ReadLrState(const std::string& path,
                                                 const LrScheduler& configured,
                                                 LrStateMismatch mismatch) {
  std::ifstream file(path);
  nlohmann::json state = nlohmann::json::parse(file, nullptr, /*allow_exceptions=*/false);
  if (state.is_discarded() || !state.is_object() || !state.contains("lr_scheduler")) {
    return std::optional<LrScheduler>();
  }
  return ParseLrState(state["lr_scheduler"].dump(), path, configured, mismatch);
}

}  // namespace internal

using internal::CopyInto;
using internal::CopyTag;
using internal::CpuCopy;
using internal::GuardTorch;
using internal::kOldActor;
using internal::kRolloutActor;
using internal::LrStateToJson;

// ---- Weight swap -------------------------------------------------------------------------------

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

// ---- keep_old_actor ----------------------------------------------------------------------------

Status Trainer::OnWeightsSynced() {
  if (!impl_->algorithm.needs.old_actor_copy) return absl::OkStatus();
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

namespace {

// The critic's <save> directory beside the actor's checkpoints: <save>/critic for a <save>
// directory, <save>/critic for an iteration dir <save>/iter_N (checkpoint.h layout).
std::string CriticCheckpointDir(const std::string& actor_dir) {
  std::error_code ec;
  const std::filesystem::path dir(actor_dir);
  if (std::filesystem::exists(dir / kTrainerStateFile, ec)) {
    return (dir.parent_path() / kCriticSubdir).string();
  }
  return (dir / kCriticSubdir).string();
}

// ---- Checkpoints at tensor-parallel size > 1 (trainer.h, "Tensor parallelism"): the files
// always hold full tensors (the TP=1 layout), so a checkpoint loads at any TP size.

// The split dim of every parameter by HF name (-1: replicated).
std::map<std::string, int64_t> ShardDims(const model::ModelConfig& config) {
  std::map<std::string, int64_t> out;
  for (const model::ParamSpec& spec : model::ParameterSpecs(config)) {
    out[spec.hf_name] = static_cast<int64_t>(spec.shard);
  }
  return out;
}

// The parameter an optimizer-state tensor belongs to ("<name>.exp_avg" -> "<name>").
std::string StateParam(const std::string& name) {
  for (const char* suffix : {".master", ".exp_avg_sq", ".exp_avg"}) {
    const std::string s(suffix);
    if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) {
      return name.substr(0, name.size() - s.size());
    }
  }
  return name;
}

// The full tensor of a shard split along `dim` (-1: replicated, the shard itself, detached),
// on the shard's device. An all-gather over the TP group for a split one: all TP ranks call
// this in the same order. Used by Save (below) and by FullParameter (weight export).
torch::Tensor GatherOnDevice(const torch::Tensor& shard, int64_t dim,
                             model::TensorParallelGroup& tp) {
  torch::NoGradGuard no_grad;
  if (dim < 0 || tp.size() == 1) return shard.detach();
  return tp.AllGather(shard.detach().contiguous(), dim);
}

// The same, as a CPU tensor of its own.
torch::Tensor Gather(const torch::Tensor& shard, int64_t dim, model::TensorParallelGroup& tp) {
  torch::Tensor full = GatherOnDevice(shard, dim, tp);
  return full.device().is_cpu() && full.data_ptr() == shard.data_ptr() ? full.clone()
                                                                       : full.to(torch::kCPU);
}

// This rank's slice of a full tensor.
torch::Tensor Slice(const torch::Tensor& full, int64_t dim, const model::TensorParallelGroup& tp) {
  if (dim < 0) return full;
  const int64_t n = full.size(dim) / tp.size();
  return full.narrow(dim, tp.rank() * n, n);
}

// ---- Expert parallelism (trainer.h, "Expert parallelism"): checkpoints and the weight export
// hold every expert, so each expert tensor goes from its owner to the other EP ranks.

// The owner's `tensor` on every rank of the EP group: an all-to-all in which only the owner
// sends (its tensor to each other rank). On the other ranks `tensor` only gives the shape and
// dtype (its values are not read). A tensor of at least one dimension, on the group's device.
torch::Tensor BroadcastFromOwner(const torch::Tensor& tensor, int owner,
                                 model::ExpertParallelGroup& ep) {
  torch::NoGradGuard no_grad;
  const int n = ep.size();
  const int64_t rows = tensor.size(0);
  std::vector<int64_t> send(n, 0), recv(n, 0);
  if (ep.rank() == owner) {
    std::vector<torch::Tensor> copies;
    for (int r = 0; r < n; ++r) {
      if (r == owner) continue;
      send[r] = rows;
      copies.push_back(tensor);
    }
    ep.AllToAll(torch::cat(copies, 0).contiguous(), send, recv);
    return tensor;
  }
  recv[owner] = rows;
  return ep.AllToAll(tensor.narrow(0, 0, 0).contiguous(), send, recv);
}

// The full tensor of parameter `spec` (TP-gathered, see GatherOnDevice) on every EP rank: an
// expert's from its owner, any other parameter from this rank. `mine` is this rank's tensor of
// it (undefined for another rank's expert); `dtype` the full tensor's.
torch::Tensor FullExpertAware(const model::ParamSpec& spec, const torch::Tensor& mine,
                              torch::ScalarType dtype, const model::DecoderModel& model,
                              model::TensorParallelGroup& tp) {
  model::ExpertParallelGroup* ep = model.ep_group();
  if (spec.expert < 0 || ep == nullptr) {
    return GatherOnDevice(mine, static_cast<int64_t>(spec.shard), tp);
  }
  const int owner = model.experts().OwnerOf(spec.expert, model.config().moe.num_experts);
  torch::Tensor full =
      ep->rank() == owner
          ? GatherOnDevice(mine, static_cast<int64_t>(spec.shard), tp).contiguous()
          : torch::empty(spec.shape, torch::TensorOptions().dtype(dtype).device(model.device()));
  return BroadcastFromOwner(full, owner, *ep);
}

// The name of this rank's expert that mirrors another rank's expert parameter `name` (same
// layer and projection, the same place in its block): its optimizer state has the same form.
std::string MirrorExpertName(const model::ParamSpec& spec, const model::DecoderModel& model) {
  const int64_t experts = model.config().moe.num_experts;
  const model::ExpertShard& shard = model.experts();
  const int64_t mirror = shard.first(experts) + spec.expert % shard.count(experts);
  const std::string from = fmt::format(".experts.{}.", spec.expert);
  std::string name = spec.hf_name;
  name.replace(name.find(from), from.size(), fmt::format(".experts.{}.", mirror));
  return name;
}

// Full-size CPU weights of `config` (uninitialised; a checkpoint load fills them).
model::ModelWeights FullSizeBuffers(const model::ModelConfig& config, torch::ScalarType dtype) {
  model::ModelWeights w;
  w.layers.resize(config.num_hidden_layers);
  for (const model::ParamSpec& spec : model::ParameterSpecs(config)) {
    model::ParamSlot(w, spec) = torch::zeros(spec.shape, torch::TensorOptions().dtype(dtype));
  }
  if (config.tie_word_embeddings) w.lm_head = w.embed_tokens;
  return w;
}

// An optimizer over full-size weights with the trainer's options (single-rank).
StatusOr<std::unique_ptr<AdamW>> FullSizeOptimizer(const model::ModelWeights& full,
                                                   const model::ModelConfig& config,
                                                   const AdamW& like) {
  AdamWOptions o = like.options();
  o.tp_rank = 0;
  o.reduce_squared_grad_norm = nullptr;
  o.distributed = false;  // a container for the gathered state, never stepped
  o.dp_size = 1;
  o.dp_rank = 0;
  return AdamW::ForModel(full, config, std::move(o));
}

// ---- Checkpoints at pipeline-parallel size > 1 (trainer.h, "Pipeline parallelism").

// The stage that owns each parameter (by HF name) in a pipeline of `stages`: a layer's stage, 0
// for the embedding (also when the last stage holds a tied copy), the last for the final norm
// and lm_head.
int StageOwner(const model::ParamSpec& spec, const std::vector<model::PipelineStage>& split) {
  const int stages = static_cast<int>(split.size());
  int owner = stages - 1;
  if (spec.layer >= 0) {
    for (int r = 0; r < stages; ++r) {
      if (split[r].HasLayer(spec.layer)) owner = r;
    }
  } else if (spec.model_slot == &model::ModelWeights::embed_tokens) {
    owner = 0;
  }
  return owner;
}

StatusOr<std::vector<model::PipelineStage>> StageSplit(const model::ModelConfig& config,
                                                       int stages) {
  std::vector<model::PipelineStage> split;
  for (int r = 0; r < stages; ++r) {
    SLIME_ASSIGN_OR_RETURN(model::PipelineStage st,
                           model::MakePipelineStage(config.num_hidden_layers, r, stages));
    split.push_back(st);
  }
  return split;
}

StatusOr<std::map<std::string, int>> StageOwners(const model::ModelConfig& config, int stages) {
  SLIME_ASSIGN_OR_RETURN(const std::vector<model::PipelineStage> split, StageSplit(config, stages));
  std::map<std::string, int> out;
  for (const model::ParamSpec& spec : model::ParameterSpecs(config)) {
    out[spec.hf_name] = StageOwner(spec, split);
  }
  return out;
}

// How the writing rank of a Save writes: at once, or host copies queued on `background`
// (checkpoint.async_save). `previous` is the outcome of the background writes queued by earlier
// saves: when one failed, this save reports that failure instead of writing.
struct CheckpointSink {
  AsyncCheckpointWriter* background = nullptr;
  Status previous;

  StatusOr<std::string> Write(const SaveCheckpointOptions& o, const model::ModelWeights& weights,
                              const model::ModelConfig& config, const AdamW* optimizer,
                              const TrainerProgress& progress) const {
    if (!previous.ok()) return previous;
    if (background != nullptr) {
      return SaveTrainerCheckpointAsync(o, weights, config, optimizer, progress, *background);
    }
    return SaveTrainerCheckpoint(o, weights, config, optimizer, progress);
  }
};

// The collective end of a save that one rank (`writer`, named `writer_name` in the error) wrote:
// a one-element float64 flag, 1 where the writer succeeded and 0 elsewhere, goes through `share`
// (a broadcast from the writer or a sum over the group), so every rank returns the writer's
// outcome instead of one rank failing alone. `dir` is this rank's own outcome.
StatusOr<std::string> AgreeOnSaveOutcome(
    const StatusOr<std::string>& dir, bool writer, const std::string& writer_name,
    const SaveCheckpointOptions& o, const std::function<Status(torch::Tensor& flag)>& share) {
  double written = writer && dir.ok() ? 1.0 : 0.0;
  Status told = GuardTorch(
      fmt::format("trainer: share the checkpoint outcome of {}", writer_name), [&]() -> Status {
        torch::Tensor flag = torch::full({1}, written, torch::kFloat64);
        SLIME_RETURN_IF_ERROR(share(flag));
        written = flag.item<double>();
        return absl::OkStatus();
      });
  SLIME_RETURN_IF_ERROR(told);
  if (!dir.ok()) return dir;
  if (written != 1.0) {
    return absl::InternalError(fmt::format(
        "trainer: {} failed to save the checkpoint of iteration {} under {} (its log has the "
        "error)",
        writer_name, o.iteration, o.save_dir));
  }
  return dir;
}

// Every stage sends its parameters and AdamW state to stage 0, in HF parameter order (the tied
// LM head copy is not sent: the first stage's table is the same); stage 0 writes the whole
// model as a PP=1 checkpoint; a broadcast from stage 0 tells every stage the outcome.
// `weights` holds this stage's parameters as full tensors (the model's own at TP = 1, the
// TP-gathered ones at TP > 1, where only TP rank 0 of each stage calls this); `state` is this
// stage's optimizer state in the same per-parameter full form (gathered over DP and TP where
// sharded), required when o.save_optimizer. `model` and `optimizer` give the config, the stage
// and the optimizer's options; stage 0 writes through `sink`.
StatusOr<std::string> SavePipelined(SaveCheckpointOptions o, const TrainerProgress& progress,
                                    const model::ModelWeights& weights, const OptimizerState* state,
                                    const model::DecoderModel& model, const AdamW& optimizer,
                                    model::PipelineParallelGroup& pp, const CheckpointSink& sink) {
  const model::ModelConfig& config = model.config();
  const model::PipelineStage& stage = model.stage();
  SLIME_ASSIGN_OR_RETURN(const auto owners, StageOwners(config, stage.size));
  const std::string tied_copy =
      stage.HoldsTiedCopy(config.tie_word_embeddings) ? "model.embed_tokens.weight" : "";
  StatusOr<std::string> dir =
      (std::filesystem::path(o.save_dir) / IterationDirName(o.iteration)).string();
  o.optimizer_state = nullptr;
  if (stage.is_first()) {
    model::ModelWeights full;
    std::unique_ptr<AdamW> full_optimizer;
    Status made = GuardTorch("trainer: full-size buffers for a pipeline save", [&]() -> Status {
      full = FullSizeBuffers(config, model.dtype());
      return absl::OkStatus();
    });
    SLIME_RETURN_IF_ERROR(made);
    if (o.save_optimizer && state != nullptr) {
      SLIME_ASSIGN_OR_RETURN(full_optimizer, FullSizeOptimizer(full, config, optimizer));
    }
    Status gathered = GuardTorch("trainer: gather the pipeline stages to save", [&]() -> Status {
      torch::NoGradGuard no_grad;
      for (const model::ParamSpec& spec : model::ParameterSpecs(config)) {
        torch::Tensor& dst = model::ParamSlot(full, spec);
        const int from = owners.at(spec.hf_name);
        if (from == 0) {
          dst.copy_(model::ParamSlot(weights, spec));
        } else {
          SLIME_RETURN_IF_ERROR(pp.Recv(dst, from));
        }
      }
      if (full_optimizer == nullptr) return absl::OkStatus();
      std::map<std::string, torch::Tensor> own;
      for (const model::NamedTensor& nt : state->tensors) own[nt.name] = nt.tensor;
      OptimizerState full_state = full_optimizer->ExportState();  // shares its storage
      for (model::NamedTensor& nt : full_state.tensors) {
        const int from = owners.at(StateParam(nt.name));
        if (from != 0) {
          SLIME_RETURN_IF_ERROR(pp.Recv(nt.tensor, from));
          continue;
        }
        auto it = own.find(nt.name);
        if (it == own.end()) {
          return absl::InternalError(fmt::format("stage 0 has no optimizer state {}", nt.name));
        }
        nt.tensor.copy_(it->second);
      }
      full_state.step = state->step;
      return full_optimizer->ImportState(full_state);
    });
    if (gathered.ok()) {
      dir = sink.Write(o, full, config, full_optimizer.get(), progress);
    } else {
      dir = gathered;
    }
  } else {
    Status sent = GuardTorch("trainer: send this pipeline stage to stage 0", [&]() -> Status {
      torch::NoGradGuard no_grad;
      for (const model::ParamSpec& spec : model::StageParameterSpecs(config, stage)) {
        if (spec.hf_name == tied_copy) continue;
        SLIME_RETURN_IF_ERROR(pp.Send(model::ParamSlot(weights, spec).detach(), 0));
      }
      if (!o.save_optimizer || state == nullptr) return absl::OkStatus();
      for (const model::NamedTensor& nt : state->tensors) {
        if (!tied_copy.empty() && StateParam(nt.name) == tied_copy) continue;
        SLIME_RETURN_IF_ERROR(pp.Send(nt.tensor, 0));
      }
      return absl::OkStatus();
    });
    SLIME_RETURN_IF_ERROR(sent);
  }
  return AgreeOnSaveOutcome(dir, stage.is_first(), "pipeline stage 0", o,
                            [&](torch::Tensor& flag) { return pp.Broadcast(flag, 0); });
}

}  // namespace

// ---- Weight export ------------------------------------------------------------------------------

std::vector<model::NamedTensor> Trainer::FullParameterShapes() const {
  std::vector<model::NamedTensor> out;
  const auto meta = torch::TensorOptions().dtype(model_->dtype()).device(c10::kMeta);
  for (const model::ParamSpec& spec : model::ParameterSpecs(model_->config())) {
    out.push_back({spec.hf_name, torch::empty(spec.shape, meta)});
  }
  return out;
}

StatusOr<torch::Tensor> Trainer::FullParameter(size_t index) {
  const std::vector<model::ParamSpec> specs = model::ParameterSpecs(model_->config());
  if (index >= specs.size()) {
    return absl::OutOfRangeError(
        fmt::format("trainer: parameter index {} of {}", index, specs.size()));
  }
  const model::ParamSpec& spec = specs[index];
  const model::PipelineStage& stage = model_->stage();
  int owner = 0;
  if (!stage.whole()) {
    SLIME_ASSIGN_OR_RETURN(const std::vector<model::PipelineStage> split,
                           StageSplit(model_->config(), stage.size));
    owner = StageOwner(spec, split);
  }
  return GuardTorch(fmt::format("trainer: the full tensor of {}", spec.hf_name),
                    [&]() -> StatusOr<torch::Tensor> {
                      if (stage.rank != owner && !stage.is_first()) return torch::Tensor();
                      if (stage.rank != owner) {
                        // Stage 0 receives the owner's tensor (a tied LM head copy on the
                        // last stage is never sent: stage 0 owns the table).
                        torch::NoGradGuard no_grad;
                        torch::Tensor full = torch::empty(
                            spec.shape,
                            torch::TensorOptions().dtype(model_->dtype()).device(model_->device()));
                        SLIME_RETURN_IF_ERROR(options_.pp_group->Recv(full, owner));
                        return full;
                      }
                      torch::Tensor full =
                          FullExpertAware(spec, model::ParamSlot(model_->weights(), spec),
                                          model_->dtype(), *model_, model_->tp_group());
                      if (!stage.is_first()) {
                        SLIME_RETURN_IF_ERROR(options_.pp_group->Send(full.contiguous(), 0));
                      }
                      return full;
                    });
}

Status Trainer::WaitForSave() {
  impl_->background_save = {};
  if (impl_->checkpoint_writer == nullptr) return absl::OkStatus();
  const auto start = std::chrono::steady_clock::now();
  Status s = impl_->checkpoint_writer->Wait(&impl_->background_save.write_seconds);
  impl_->background_save.wait_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return s;
}

Trainer::BackgroundSaveTimes Trainer::last_background_save() const {
  return impl_->background_save;
}

StatusOr<std::string> Trainer::Save(const std::string& save_dir, int64_t rollout_id,
                                    const std::string& extra_state_json, SaveMode mode) {
  // Earlier background writes first (checkpoints are published in order); only the writing
  // rank has any, and their failure is this save's outcome (CheckpointSink).
  CheckpointSink sink;
  sink.previous = WaitForSave();
  const bool background = mode == SaveMode::kBackground || (mode == SaveMode::kAsConfigured &&
                                                            options_.config.checkpoint.async_save);
  if (background) {
    if (impl_->checkpoint_writer == nullptr) {
      impl_->checkpoint_writer = std::make_unique<AsyncCheckpointWriter>();
    }
    sink.background = impl_->checkpoint_writer.get();
  }
  // Distributed optimizer: every rank gathers the shards (the actor's here, the critic's in its
  // Save) before any rank writes, so a failed write cannot leave a peer waiting in a
  // collective; DP rank 0 writes.
  const bool sharded = optimizer_->distributed();
  const bool writer = !sharded || options_.dp_rank == 0;
  std::optional<OptimizerState> gathered;
  if (sharded && !options_.config.checkpoint.no_save_optim) {
    SLIME_ASSIGN_OR_RETURN(gathered, optimizer_->GatherState(writer));
  }
  // The critic first: the actor's tracker is the commit point of the pair (in the background
  // too: the writer runs its writes in order and skips the actor's after a failed critic's).
  // The critic runs at TP = PP = 1 only, so its writer may return an earlier failure here
  // without leaving a peer in a collective.
  if (impl_->critic != nullptr) {
    SLIME_RETURN_IF_ERROR(
        impl_->critic
            ->Save(CriticCheckpointDir(save_dir), rollout_id, sink.background, sink.previous)
            .status());
  }
  if (!writer) return std::string();
  SaveCheckpointOptions o;
  o.optimizer_state = gathered ? &*gathered : nullptr;
  o.save_dir = save_dir;
  o.iteration = rollout_id;
  o.keep_last = options_.config.checkpoint.keep_last.value_or(0);
  o.save_optimizer = !options_.config.checkpoint.no_save_optim;
  TrainerProgress progress;
  progress.step = step_;
  progress.rollout_id = rollout_id;
  progress.lr_scheduler_json = LrStateToJson(lr_scheduler_.State()).dump();
  progress.data_source_json = extra_state_json;
  model::TensorParallelGroup& tp = model_->tp_group();
  const model::PipelineStage& stage = model_->stage();
  const bool ep = !model_->experts().whole();
  if (tp.size() == 1 && stage.whole() && !ep) {
    return sink.Write(o, model_->weights(), model_->config(), optimizer_.get(), progress);
  }
  // EP > 1: every EP rank takes part in the experts' exchange; EP rank 0 writes (at PP > 1 its
  // stages gather to its stage 0).
  const bool ep_writer = !ep || model_->experts().rank == 0;
  // TP > 1 and / or PP > 1: this stage's parameters and optimizer state as full tensors —
  // gathered over the TP group to the CPU at TP > 1 (every TP rank of the stage takes part),
  // the model's own tensors at TP = 1.
  const model::ModelConfig& config = model_->config();
  const std::map<std::string, int64_t> dims = ShardDims(config);
  auto full_tensor = [&](const torch::Tensor& t, int64_t dim) {
    return tp.size() == 1 ? t.detach() : Gather(t, dim, tp);
  };
  model::ModelWeights full;
  std::optional<OptimizerState> full_state;
  // A CPU tensor of its own (the gathers may return the model's own tensor).
  auto to_cpu = [](const torch::Tensor& t, const torch::Tensor& own) {
    return t.device().is_cpu() && own.defined() && t.data_ptr() == own.data_ptr()
               ? t.clone()
               : t.to(torch::kCPU);
  };
  Status tp_gathered = GuardTorch("trainer: gather this stage's shards to save", [&]() -> Status {
    full.layers.resize(config.num_hidden_layers);
    for (const model::ParamSpec& spec : model::StageParameterSpecs(config, stage)) {
      const torch::Tensor& mine = model::ParamSlot(model_->weights(), spec);
      model::ParamSlot(full, spec) =
          ep ? to_cpu(FullExpertAware(spec, mine, model_->dtype(), *model_, tp), mine)
             : full_tensor(mine, static_cast<int64_t>(spec.shard));
    }
    if (config.tie_word_embeddings) full.lm_head = full.embed_tokens;
    if (o.save_optimizer) {
      const OptimizerState state = gathered ? *gathered : optimizer_->ExportState();
      full_state.emplace();
      full_state->step = state.step;
      if (!ep) {
        for (const model::NamedTensor& nt : state.tensors) {
          auto it = dims.find(StateParam(nt.name));
          full_state->tensors.push_back(
              {nt.name, full_tensor(nt.tensor, it == dims.end() ? -1 : it->second)});
        }
        return absl::OkStatus();
      }
      // EP: every parameter's state in the full parameter order; another rank's expert's from
      // its owner, in the form of this rank's mirror expert (same suffixes, dtype and shape).
      std::map<std::string, torch::Tensor> by_name;
      for (const model::NamedTensor& nt : state.tensors) by_name[nt.name] = nt.tensor;
      for (const model::ParamSpec& spec : model::StageParameterSpecs(config, stage)) {
        const bool held = model_->experts().Holds(spec.expert, config.moe.num_experts);
        const std::string like =
            spec.expert < 0 || held ? spec.hf_name : MirrorExpertName(spec, *model_);
        for (const char* suffix : {".master", ".exp_avg", ".exp_avg_sq"}) {
          auto it = by_name.find(like + suffix);
          if (it == by_name.end()) continue;
          const torch::Tensor mine = spec.expert < 0 || held ? it->second : torch::Tensor();
          full_state->tensors.push_back(
              {spec.hf_name + suffix,
               to_cpu(FullExpertAware(spec, mine, it->second.scalar_type(), *model_, tp), mine)});
        }
      }
    }
    return absl::OkStatus();
  });
  SLIME_RETURN_IF_ERROR(tp_gathered);
  o.optimizer_state = nullptr;  // the full-size optimizer below carries the state
  StatusOr<std::string> dir =
      (std::filesystem::path(save_dir) / IterationDirName(rollout_id)).string();
  if (!stage.whole()) {
    // PP > 1: TP rank 0 of every stage (of EP rank 0) takes part in the pipeline gather to
    // stage 0 (its PP group); stage 0's TP rank 0 writes.
    if (tp.rank() == 0 && ep_writer) {
      dir = SavePipelined(o, progress, full, full_state ? &*full_state : nullptr, *model_,
                          *optimizer_, *options_.pp_group, sink);
    }
    if (tp.size() == 1 && !ep) return dir;
  } else if (tp.rank() == 0 && ep_writer) {
    // PP = 1, TP > 1 or EP > 1: TP rank 0 (of EP rank 0) writes the gathered model as a TP=1,
    // EP=1 checkpoint.
    std::unique_ptr<AdamW> full_optimizer;
    if (full_state) {
      auto created = FullSizeOptimizer(full, config, *optimizer_);
      if (created.ok()) full_optimizer = std::move(*created);
      Status imported = created.ok() ? full_optimizer->ImportState(*full_state) : created.status();
      if (!imported.ok()) dir = imported;
    }
    if (dir.ok()) dir = sink.Write(o, full, config, full_optimizer.get(), progress);
  }
  // One all-reduce tells every TP rank whether TP rank 0's part (the write, or at PP > 1 the
  // pipeline's outcome) worked; with EP > 1 a second one over the EP group tells the EP ranks
  // whether EP rank 0's write did.
  return AgreeOnSaveOutcome(
      dir, tp.rank() == 0 && ep_writer,
      ep ? "tensor-parallel rank 0 of expert-parallel rank 0" : "tensor-parallel rank 0", o,
      [&](torch::Tensor& flag) -> Status {
        flag = flag.to(model_->device());
        tp.AllReduceSum(flag);
        return ep ? options_.ep_all_reduce(flag) : absl::OkStatus();
      });
}

StatusOr<LoadedTrainerState> Trainer::Load(const std::string& load_dir,
                                           std::optional<int64_t> ckpt_step) {
  // Check the LR scheduler state (trainer_state.json, checkpoint.h) and that the critic's
  // checkpoint of the same iteration exists before anything changes.
  if (auto dir = ResolveCheckpointDir(load_dir, ckpt_step); dir.ok()) {
    const std::string path = (std::filesystem::path(*dir) / kTrainerStateFile).string();
    SLIME_RETURN_IF_ERROR(
        internal::ReadLrState(path, lr_scheduler_, options_.lr_state_mismatch).status());
    if (impl_->critic != nullptr) {
      const std::string iteration = std::filesystem::path(*dir).filename().string();
      const std::string critic_dir =
          (std::filesystem::path(CriticCheckpointDir(load_dir)) / iteration).string();
      auto critic_ok = ResolveCheckpointDir(critic_dir);
      if (!critic_ok.ok()) {
        return absl::Status(critic_ok.status().code(),
                            fmt::format("ppo: the critic's checkpoint of {}: {}", *dir,
                                        std::string(critic_ok.status().message())));
      }
    }
  }

  LoadCheckpointOptions o;
  o.load_dir = load_dir;
  o.ckpt_step = ckpt_step;
  o.load_optimizer = !options_.config.checkpoint.no_load_optim;
  model::TensorParallelGroup& tp = model_->tp_group();
  const model::PipelineStage& stage = model_->stage();
  StatusOr<LoadedCheckpoint> load_result = absl::InternalError("unset");
  if (tp.size() == 1 && stage.whole() && model_->experts().whole()) {
    load_result =
        LoadTrainerCheckpoint(o, model_->mutable_weights(), model_->config(), optimizer_.get());
  } else {
    // TP > 1 or PP > 1: the checkpoint holds the whole model's full tensors; load them into
    // full-size CPU temporaries (and a full-size optimizer), then copy this rank's slices of
    // this stage's parameters in. No collective: every rank reads.
    const model::ModelConfig& config = model_->config();
    std::unique_ptr<AdamW> full_optimizer;
    model::ModelWeights full;
    Status made = GuardTorch("trainer: full-size buffers for a tensor-parallel load", [&]() -> Status {
      full = FullSizeBuffers(config, model_->dtype());
      return absl::OkStatus();
    });
    SLIME_RETURN_IF_ERROR(made);
    SLIME_ASSIGN_OR_RETURN(full_optimizer, FullSizeOptimizer(full, config, *optimizer_));
    load_result = LoadTrainerCheckpoint(o, full, config, full_optimizer.get());
    if (load_result.ok()) {
      const std::map<std::string, int64_t> dims = ShardDims(config);
      Status sliced = GuardTorch("trainer: slice the checkpoint for this rank", [&]() -> Status {
        torch::NoGradGuard no_grad;
        std::set<std::string> mine;
        for (const model::ParamSpec& spec : model::HeldParameterSpecs(config, model_->weights())) {
          mine.insert(spec.hf_name);
          model::ParamSlot(model_->mutable_weights(), spec)
              .copy_(Slice(model::ParamSlot(full, spec), static_cast<int64_t>(spec.shard), tp));
        }
        if (load_result->optimizer_loaded) {
          OptimizerState state = full_optimizer->ExportState();
          // This stage's parameters only (every one of them at PP = 1).
          std::vector<model::NamedTensor> kept;
          for (model::NamedTensor& nt : state.tensors) {
            if (mine.count(StateParam(nt.name)) > 0) kept.push_back(std::move(nt));
          }
          state.tensors = std::move(kept);
          for (model::NamedTensor& nt : state.tensors) {
            auto it = dims.find(StateParam(nt.name));
            nt.tensor = Slice(nt.tensor, it == dims.end() ? -1 : it->second, tp)
                            .contiguous()
                            .to(model_->device());
          }
          return optimizer_->ImportState(state);
        }
        optimizer_->ReloadMastersFromParams();
        return absl::OkStatus();
      });
      SLIME_RETURN_IF_ERROR(sliced);
    }
  }
  SLIME_ASSIGN_OR_RETURN(LoadedCheckpoint loaded, std::move(load_result));
  impl_->actor_backup_current = false;
  step_ = loaded.progress.step;

  LoadedTrainerState out;
  out.dir = loaded.dir;
  out.rollout_id = loaded.progress.rollout_id;
  out.step = loaded.progress.step;
  out.extra_state_json = loaded.progress.data_source_json;
  out.optimizer_loaded = loaded.optimizer_loaded;

  auto scheduler =
      internal::ParseLrState(loaded.progress.lr_scheduler_json,
                             (std::filesystem::path(loaded.dir) / kTrainerStateFile).string(),
                             lr_scheduler_, options_.lr_state_mismatch);
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
  if (impl_->algorithm.needs.old_actor_copy) {
    Status copied = GuardTorch("trainer: old-actor weights from the checkpoint", [&]() -> Status {
      for (const char* tag : {kOldActor, kRolloutActor}) {
        auto it = impl_->copies.find(tag);
        if (it != impl_->copies.end()) CopyInto(it->second, impl_->params);
      }
      return absl::OkStatus();
    });
    SLIME_RETURN_IF_ERROR(copied);
  }
  if (impl_->critic != nullptr) {
    Status critic = impl_->critic->Load(CriticCheckpointDir(load_dir), loaded.iteration);
    if (!critic.ok()) {
      return absl::Status(critic.code(), fmt::format("ppo critic: {} (the actor was loaded)",
                                                     std::string(critic.message())));
    }
  }
  return out;
}

}  // namespace slime::train
