// One optimizer step of the Trainer (see include/slime/train/trainer.h, step 5): packing and
// forwarding micro-batches, the step's loss denominators, backward, the DP all-reduce, AdamW.
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "slime/model/decoder.h"
#include "slime/model/pipeline_parallel.h"
#include "slime/train/logprobs.h"
#include "slime/train/losses.h"
#include "slime/train/optimizer.h"
#include "slime/train/trainer.h"
#include "trainer_internal.h"

namespace slime::train {
namespace {

std::string FormatValues(const std::map<std::string, double>& values) {
  std::string out;
  for (const auto& [name, value] : values) {
    if (!out.empty()) out += ' ';
    out += fmt::format("{}={:.6g}", name, value);
  }
  return out;
}

// losses.h's denominators of one step: G or N, and D_i per sample (indexed like the batch).
struct StepDenominators {
  double step = 1.0;
  std::vector<double> per_sample;
};

StepDenominators MakeDenominators(const data::RolloutBatch& batch, const std::vector<int64_t>& ids,
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

// The real (unpadded) tokens of `samples`.
int64_t RealTokens(const data::RolloutBatch& batch, const std::vector<int64_t>& samples) {
  int64_t n = 0;
  for (int64_t i : samples) n += static_cast<int64_t>(batch.samples[i].tokens.size());
  return n;
}

std::vector<int64_t> MicroBatchTokens(const data::RolloutBatch& batch,
                                      const std::vector<MicroBatch>& micro_batches) {
  std::vector<int64_t> tokens;
  for (const MicroBatch& mb : micro_batches) tokens.push_back(RealTokens(batch, mb.samples));
  return tokens;
}

// values[i] summed over the pipeline stages (float64 on the CPU, as ShareStepMetrics).
Status SumOverStages(model::PipelineParallelGroup& pp, std::vector<double>& values) {
  if (pp.size() == 1 || values.empty()) return absl::OkStatus();
  return internal::GuardTorch("trainer: sum the MoE metrics over the pipeline", [&]() -> Status {
    torch::Tensor t = torch::tensor(values, torch::kFloat64);
    SLIME_RETURN_IF_ERROR(pp.AllReduceSum(t));
    for (size_t i = 0; i < values.size(); ++i) {
      values[i] = t[static_cast<int64_t>(i)].item<double>();
    }
    return absl::OkStatus();
  });
}

}  // namespace

namespace internal {

PackedInputs Pack(const data::RolloutBatch& batch, const std::vector<int64_t>& samples,
                  torch::Device device, int64_t pad_multiple) {
  PackedInputs in;
  in.packed.cu_seqlens.reserve(samples.size() + 1);
  in.packed.cu_seqlens.push_back(0);
  std::vector<int64_t> ids;
  for (int64_t i : samples) {
    const data::TrainSample& s = batch.samples[i];
    ids.insert(ids.end(), s.tokens.begin(), s.tokens.end());
    in.packed.cu_seqlens.push_back(static_cast<int64_t>(ids.size()));
    in.packed.prompt_lengths.push_back(s.prompt_length);
    in.packed.response_lengths.push_back(s.response_length);
  }
  in.forward_cu_seqlens = in.packed.cu_seqlens;
  const int64_t padded = PaddedTokens(static_cast<int64_t>(ids.size()), 1, pad_multiple);
  if (padded > static_cast<int64_t>(ids.size())) {
    ids.resize(static_cast<size_t>(padded), 0);  // token 0, a sequence of its own
    in.forward_cu_seqlens.push_back(padded);
  }
  in.ids = torch::tensor(ids, torch::kLong).to(device);
  return in;
}

int64_t PackedTokenCount(const data::RolloutBatch& batch, const std::vector<int64_t>& samples,
                         int64_t pad_multiple) {
  int64_t n = 0;
  for (int64_t i : samples) n += static_cast<int64_t>(batch.samples[i].tokens.size());
  return PaddedTokens(n, 1, pad_multiple);
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

Status AllReduceGradsAndMetrics(const AllReduceSumFn& all_reduce,
                                const std::vector<torch::Tensor>& trainable,
                                std::map<std::string, torch::Tensor>& sums, int64_t bucket_size) {
  return GuardTorch("trainer: DP all-reduce", [&]() -> Status {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> grads;
    for (torch::Tensor p : trainable) {
      if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
      grads.push_back(p.grad());
    }
    for (size_t i = 0; i < grads.size();) {
      size_t j = i + 1;
      int64_t numel = grads[i].numel();
      while (j < grads.size() && grads[j].scalar_type() == grads[i].scalar_type() &&
             grads[j].device() == grads[i].device() && numel + grads[j].numel() <= bucket_size) {
        numel += grads[j++].numel();
      }
      if (j == i + 1) {
        SLIME_RETURN_IF_ERROR(all_reduce(grads[i]));
      } else {
        std::vector<torch::Tensor> flat;
        for (size_t k = i; k < j; ++k) flat.push_back(grads[k].reshape({-1}));
        torch::Tensor bucket = torch::cat(flat);  // [numel]
        SLIME_RETURN_IF_ERROR(all_reduce(bucket));
        int64_t offset = 0;
        for (size_t k = i; k < j; ++k) {
          const int64_t n = grads[k].numel();
          grads[k].copy_(bucket.narrow(0, offset, n).view(grads[k].sizes()));
          offset += n;
        }
      }
      i = j;
    }
    if (!sums.empty()) {
      std::vector<torch::Tensor> values;
      for (const auto& [name, v] : sums) values.push_back(v);
      torch::Tensor stacked = torch::stack(values).cpu();
      SLIME_RETURN_IF_ERROR(all_reduce(stacked));
      size_t k = 0;
      for (auto& [name, v] : sums) v = stacked[k++];
    }
    return absl::OkStatus();
  });
}
StatusOr<std::unique_ptr<GradReducer>> MakeGradReducer(const std::string& who,
                                                       const config::TrainConfig& train,
                                                       int dp_size, bool distributed,
                                                       const AsyncAllReduceSumFn& all_reduce,
                                                       const std::vector<torch::Tensor>& trainable) {
  if (!train.overlap_grad_reduce) return nullptr;
  if (dp_size == 1) {
    spdlog::info("{}: train.overlap_grad_reduce with one data-parallel rank: nothing to sum", who);
    return nullptr;
  }
  if (distributed) {
    spdlog::warn(
        "{}: train.overlap_grad_reduce is not applied with train.use_distributed_optimizer: the "
        "optimizer reduce-scatters the gradients after the backward pass",
        who);
    return nullptr;
  }
  if (!all_reduce) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: train.overlap_grad_reduce with dp_size = {} needs dp_all_reduce_async (the DP "
        "group's asynchronous all-reduce)",
        who, dp_size));
  }
  SLIME_ASSIGN_OR_RETURN(std::unique_ptr<GradReducer> reducer,
                         GradReducer::Create(trainable, train.ddp_bucket_size, all_reduce));
  spdlog::info("{}: gradient all-reduce overlapped with the last backward pass of each step ({} "
               "buckets of up to {} elements)",
               who, reducer->num_buckets(), train.ddp_bucket_size);
  return reducer;
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

// Rollout ids for the scheduler: the samples' own, -1 replaced by ids of their own.
std::vector<int64_t> SchedulingRolloutIds(const data::RolloutBatch& batch) {
  int64_t max_id = -1;
  bool any = false;
  for (const data::TrainSample& s : batch.samples) {
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

StatusOr<ResponseLogProbs> ForwardMicroBatch(model::DecoderModel& model,
                                             const data::RolloutBatch& batch,
                                             const std::vector<int64_t>& samples,
                                             int64_t chunk_size, bool with_entropy,
                                             int64_t pad_multiple, const ForwardHooks& hooks) {
  PackedInputs in;
  Status packed = GuardTorch("trainer: pack a micro-batch", [&]() -> Status {
    in = Pack(batch, samples, model.device(), pad_multiple);
    return absl::OkStatus();
  });
  SLIME_RETURN_IF_ERROR(packed);
  const int64_t padded = in.ids.size(0);
  if (hooks.before) {
    SLIME_RETURN_IF_ERROR(GuardTorch("trainer: before the forward",
                                     [&] { return hooks.before(samples, padded); }));
  }
  SLIME_ASSIGN_OR_RETURN(torch::Tensor hidden, model.ForwardPacked(in.ids, in.forward_cu_seqlens));
  if (hooks.after) {
    SLIME_RETURN_IF_ERROR(GuardTorch("trainer: after the forward",
                                     [&] { return hooks.after(samples, padded); }));
  }
  LogProbOptions o;
  o.temperature = batch.temperature;
  o.chunk_size = chunk_size;
  o.compute_entropy = with_entropy;
  return ComputeResponseLogProbs(hidden, model.weights().lm_head, in.ids, in.packed,
                                 model.tp_group(), o);
}

// Forward-only log-probs of every sample of `micro_batches` into out[sample].
Status ForwardOnly(model::DecoderModel& model, model::PipelineParallelGroup& pp,
                   const data::RolloutBatch& batch,
                   const std::vector<const MicroBatch*>& micro_batches, int64_t chunk_size,
                   bool with_entropy, int64_t pad_multiple, SampleLogProbs& out,
                   const ForwardHooks& hooks) {
  if (pp.size() > 1) {
    return ForwardOnlyPipelined(model, pp, batch, micro_batches, chunk_size, with_entropy,
                                pad_multiple, out, hooks);
  }
  torch::NoGradGuard no_grad;
  for (const MicroBatch* mb : micro_batches) {
    SLIME_ASSIGN_OR_RETURN(ResponseLogProbs r,
                           ForwardMicroBatch(model, batch, mb->samples, chunk_size, with_entropy,
                                             pad_multiple, hooks));
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

}  // namespace internal

using internal::Accumulate;
using internal::Gather;
using internal::GuardTorch;

Status Trainer::SyncTiedEmbeddingGrads() {
  const model::PipelineStage& stage = model_->stage();
  const bool tied = model_->config().tie_word_embeddings;
  if (stage.whole() || !tied || !(stage.is_first() || stage.is_last())) return absl::OkStatus();
  const char* kName = "model.embed_tokens.weight";
  if (!optimizer_->IsTrainable(kName)) return absl::OkStatus();
  return GuardTorch("trainer: sum the tied embedding gradients of the first and last stages",
                    [&]() -> Status {
    torch::NoGradGuard no_grad;
    torch::Tensor table = model_->mutable_weights().embed_tokens;
    if (!table.grad().defined()) table.mutable_grad() = torch::zeros_like(table);
    torch::Tensor grad = table.grad();
    torch::Tensor other = torch::empty_like(grad);
    const int peer = stage.is_first() ? stage.size - 1 : 0;
    SLIME_RETURN_IF_ERROR(options_.pp_group->SendRecv(grad, peer, other, peer));
    grad.add_(other);
    return absl::OkStatus();
  });
}

namespace {

// The loss reducers of this rank's micro-batches of `step`, with the step's denominators.
StatusOr<std::vector<LossReducer>> MakeReducers(const data::RolloutBatch& batch,
                                                const std::vector<int64_t>& rollout_ids,
                                                const StepSchedule& step,
                                                const std::vector<MicroBatch>& micro_batches,
                                                const SampleTensors& tensors, bool per_token) {
  const StepDenominators denominators =
      MakeDenominators(batch, rollout_ids, step.samples, per_token);
  std::vector<LossReducer> reducers;
  reducers.reserve(micro_batches.size());
  for (const MicroBatch& mb : micro_batches) {
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
    reducers.push_back(std::move(reducer));
  }
  return reducers;
}

// ppo: the critic's step on the same micro-batches and denominators (slime trains the critic
// first), its values added to `metrics`. True when it is the whole step: in the first
// num_critic_only_steps rollouts only the critic trains.
StatusOr<bool> TrainCritic(Critic& critic, const data::RolloutBatch& batch,
                           const std::vector<MicroBatch>& micro_batches,
                           const std::vector<LossReducer>& reducers, const SampleTensors& tensors,
                           int64_t num_critic_only_steps, int64_t num_steps,
                           TrainStepMetrics& metrics) {
  std::vector<CriticMicroBatch> critic_mbs;
  for (size_t k = 0; k < micro_batches.size(); ++k) {
    critic_mbs.push_back({&micro_batches[k].samples, &reducers[k]});
  }
  SLIME_ASSIGN_OR_RETURN(
      CriticStepResult critic_step,
      critic.TrainStep(batch, critic_mbs, tensors.values, tensors.returns, metrics.num_samples));
  metrics.values.insert(critic_step.values.begin(), critic_step.values.end());
  const int64_t rollout_id = metrics.rollout_id;
  if (rollout_id < 0 || rollout_id >= num_critic_only_steps) return false;
  metrics.skipped = critic_step.skipped;
  spdlog::info("train: rollout {} critic-only step {}/{} ({} samples): {}", rollout_id,
               metrics.step_in_rollout + 1, num_steps, metrics.num_samples,
               FormatValues(metrics.values));
  return true;
}

}  // namespace

// One optimizer step over this rank's micro-batches of `step` (see the header comment): the
// loss reducers of the micro-batches, the critic's step (ppo), then the actor's.
StatusOr<TrainStepMetrics> Trainer::RunStep(int64_t rollout_id, int64_t step_in_rollout,
                                            int64_t num_steps, const LossTypeSpec& loss,
                                            const data::RolloutBatch& batch,
                                            const std::vector<int64_t>& rollout_ids,
                                            const StepSchedule& step,
                                            const SampleTensors& tensors) {
  const std::vector<MicroBatch>& micro_batches = step.ranks[options_.dp_rank];
  SLIME_ASSIGN_OR_RETURN(std::vector<LossReducer> reducers,
                         MakeReducers(batch, rollout_ids, step, micro_batches, tensors,
                                      options_.config.train.calculate_per_token_loss));
  TrainStepMetrics metrics;
  metrics.rollout_id = rollout_id;
  metrics.step = step_;
  metrics.step_in_rollout = step_in_rollout;
  metrics.num_samples = static_cast<int64_t>(step.samples.size());

  Critic* critic = impl_->critic.get();
  if (critic != nullptr && loss.needs.advantages) {
    SLIME_ASSIGN_OR_RETURN(
        bool critic_only,
        TrainCritic(*critic, batch, micro_batches, reducers, tensors,
                    options_.config.algorithm.num_critic_only_steps, num_steps, metrics));
    if (critic_only) return metrics;
  }

  MoeRouterLoss* moe = impl_->moe_loss.get();
  if (moe != nullptr) {
    moe->BeginStep(RealTokens(batch, step.samples), MicroBatchTokens(batch, micro_batches));
  }
  std::map<std::string, torch::Tensor> sums;
  SLIME_ASSIGN_OR_RETURN(bool overlap_armed,
                         ForwardBackward(loss, batch, micro_batches, reducers, tensors, sums));
  SLIME_RETURN_IF_ERROR(ReduceOverDataParallel(overlap_armed, sums));
  // The routing agreement: this stage's layers' counts, summed over DP above and the stages
  // below (taken out of `sums`, which every stage copies from the last).
  std::vector<double> agreement;  // {matches, slots}
  Status counted = GuardTorch("trainer: read the routing agreement", [&]() -> Status {
    for (const char* name : {internal::kAgreementMatches, internal::kAgreementSlots}) {
      auto it = sums.find(name);
      if (it == sums.end()) break;
      agreement.push_back(it->second.item<double>());
      sums.erase(it);
    }
    return absl::OkStatus();
  });
  SLIME_RETURN_IF_ERROR(counted);
  std::vector<double> moe_values;  // this stage's MoE metrics, MetricNames() order
  if (moe != nullptr) {
    Status taken = GuardTorch("trainer: read the MoE metrics", [&]() -> Status {
      moe_values = moe->TakeStageMetrics(sums);
      return absl::OkStatus();
    });
    SLIME_RETURN_IF_ERROR(taken);
  }
  // Tied embeddings over a pipeline: the first stage's embedding and the last stage's LM head
  // copy are one parameter; each gets the sum of both gradients (after the DP sums, so both
  // copies add the same two numbers) and the two stay equal through identical updates.
  SLIME_RETURN_IF_ERROR(SyncTiedEmbeddingGrads());

  Status read = GuardTorch("trainer: read metrics", [&]() -> Status {
    for (const auto& [name, v] : sums) metrics.values[name] = v.item<double>();
    return absl::OkStatus();
  });
  SLIME_RETURN_IF_ERROR(read);
  // Every stage reports the last stage's loss metrics.
  SLIME_RETURN_IF_ERROR(
      internal::ShareStepMetrics(*options_.pp_group, model_->stage().is_last(), metrics.values));
  // The MoE metrics: each stage holds its own layers' share; their sum is the model's.
  if (moe != nullptr) {
    SLIME_RETURN_IF_ERROR(SumOverStages(*options_.pp_group, moe_values));
    for (size_t i = 0; i < moe_values.size(); ++i) {
      metrics.values[moe->MetricNames()[i]] = moe_values[i];
    }
  }
  if (!agreement.empty()) {
    SLIME_RETURN_IF_ERROR(SumOverStages(*options_.pp_group, agreement));
    if (agreement[1] > 0) metrics.values["routing_agreement"] = agreement[0] / agreement[1];
  }
  SLIME_RETURN_IF_ERROR(ApplyOptimizerStep(num_steps, metrics));
  return metrics;
}

Status Trainer::PrepareRouting(const data::RolloutBatch& batch) {
  impl_->engine_routing.clear();
  impl_->recorded_routing.clear();
  if (!impl_->sparse_model) return absl::OkStatus();
  return GuardTorch("trainer: the samples' routing", [&]() -> Status {
    SLIME_ASSIGN_OR_RETURN(impl_->engine_routing,
                           internal::EngineRouting(batch, model_->config()));
    return absl::OkStatus();
  });
}

internal::ForwardHooks Trainer::PassRoutingHooks(PolicyWeights which, bool old_pass,
                                                 const data::RolloutBatch& batch) {
  const config::AlgorithmConfig& a = options_.config.algorithm;
  if (!impl_->sparse_model || which == PolicyWeights::kTeacher) return {};
  if (a.use_rollout_routing_replay) {
    return internal::ReplayHooks(*model_, batch, impl_->engine_routing);
  }
  if (a.use_routing_replay && old_pass) {
    return internal::RecordHooks(*model_, batch, &impl_->recorded_routing);
  }
  return {};
}

internal::ForwardHooks Trainer::TrainingRoutingHooks(const data::RolloutBatch& batch,
                                                     std::map<std::string, torch::Tensor>& sums) {
  const config::AlgorithmConfig& a = options_.config.algorithm;
  if (!impl_->sparse_model) return {};
  if (a.use_rollout_routing_replay) {
    return internal::ReplayHooks(*model_, batch, impl_->engine_routing);
  }
  if (a.use_routing_replay) {
    // The old-log-prob forward's routing (that pass always runs with use_routing_replay: the
    // config check refuses what would skip it).
    if (impl_->recorded_routing.size() != batch.samples.size()) {
      internal::ForwardHooks missing;
      missing.before = [](const std::vector<int64_t>&, int64_t) {
        return absl::FailedPreconditionError(
            "algorithm.use_routing_replay: the old-log-prob forward recorded no routing for this "
            "batch");
      };
      return missing;
    }
    return internal::ReplayHooks(*model_, batch, impl_->recorded_routing);
  }
  if (!options_.config.rollout.return_routed_experts) return {};
  // Every DP rank and stage sums both counts, zeros included, so the keys agree.
  for (const char* name : {internal::kAgreementMatches, internal::kAgreementSlots}) {
    sums.emplace(name, torch::zeros({}, torch::TensorOptions()
                                            .dtype(torch::kFloat64)
                                            .device(model_->device())));
  }
  return internal::AgreementHooks(*model_, batch, impl_->engine_routing, &sums);
}

// Forward and backward of every micro-batch: the 1F1B pipeline schedule (trainer_pipeline.cc;
// with one stage simply forward, loss, backward per micro-batch). The loss, and so the
// metrics, exist on the last stage only.
StatusOr<bool> Trainer::ForwardBackward(const LossTypeSpec& loss, const data::RolloutBatch& batch,
                                        const std::vector<MicroBatch>& micro_batches,
                                        const std::vector<LossReducer>& reducers,
                                        const SampleTensors& tensors,
                                        std::map<std::string, torch::Tensor>& sums) {
  auto micro_loss = [&](size_t k, const torch::Tensor& hidden,
                        const internal::PackedInputs& packed) -> StatusOr<torch::Tensor> {
    LogProbOptions lo;
    lo.temperature = batch.temperature;
    lo.chunk_size = options_.config.train.log_probs_chunk_size;
    lo.compute_entropy = loss.needs.entropy;
    lo.recompute_logits = options_.config.train.recompute_loss_function;
    SLIME_ASSIGN_OR_RETURN(ResponseLogProbs r,
                           ComputeResponseLogProbs(hidden, model_->weights().lm_head, packed.ids,
                                                   packed.packed, model_->tp_group(), lo));
    SLIME_ASSIGN_OR_RETURN(
        LossOutput out,
        loss.loss(LossContext{reducers[k], r, tensors, micro_batches[k].samples, impl_->policy}));
    Status accumulated = GuardTorch("trainer: accumulate metrics", [&]() -> Status {
      Accumulate(out.metrics, sums);
      return absl::OkStatus();
    });
    SLIME_RETURN_IF_ERROR(accumulated);
    return out.loss;
  };
  std::vector<const std::vector<int64_t>*> mb_samples;
  for (const MicroBatch& mb : micro_batches) mb_samples.push_back(&mb.samples);
  // The MoE router loss (moe_aux_loss.h): its hook attaches each sparse layer's term in the
  // forward (or a recomputed layer's rerun in the backward) of the selected micro-batch.
  MoeRouterLoss* moe = impl_->moe_loss.get();
  internal::MicroBatchHooks hooks;
  if (moe != nullptr) {
    moe->Install(*model_);
    hooks.before_pass = [moe](size_t k) { moe->Select(k); };
  }
  // Routing replay or the routing agreement metric (routing_replay.h), per micro-batch; the
  // model keeps each forward's replay for its recomputation in the backward.
  const internal::ForwardHooks routing = TrainingRoutingHooks(batch, sums);
  auto around = [&](const std::function<Status(const std::vector<int64_t>&, int64_t)>& fn,
                    size_t k) -> Status {
    if (!fn) return absl::OkStatus();
    const int64_t padded = internal::PackedTokenCount(batch, *mb_samples[k], impl_->pad_multiple);
    return GuardTorch("trainer: routing replay", [&] { return fn(*mb_samples[k], padded); });
  };
  hooks.before_forward = [&](size_t k) { return around(routing.before, k); };
  hooks.after_forward = [&](size_t k) -> Status {
    SLIME_RETURN_IF_ERROR(around(routing.after, k));
    if (moe == nullptr) return absl::OkStatus();
    return GuardTorch("trainer: MoE metrics", [&]() -> Status {
      moe->AccumulateMetrics(*model_, sums);
      return absl::OkStatus();
    });
  };
  // train.overlap_grad_reduce: the gradient buckets are posted during the last backward pass.
  GradReducer* overlap = impl_->grad_reducer.get();
  bool armed = false;
  Status scheduled = internal::RunPipelineSchedule(*model_, *options_.pp_group, batch, mb_samples,
                                                   impl_->pad_multiple, micro_loss,
                                                   [overlap, &armed] {
                                                     if (overlap == nullptr) return;
                                                     overlap->Arm();
                                                     armed = true;
                                                   },
                                                   hooks);
  if (moe != nullptr) moe->Uninstall(*model_);
  internal::ResetRouting(*model_);
  if (!scheduled.ok()) {
    if (overlap != nullptr) overlap->Disarm();
    return scheduled;
  }
  return armed;
}

// DP: sum the gradients and the metrics over the group (ZeRO-1: only the metrics; AdamW
// reduce-scatters the gradients; overlapped: wait for the buckets, then the metrics).
Status Trainer::ReduceOverDataParallel(bool overlap_armed,
                                       std::map<std::string, torch::Tensor>& sums) {
  GradReducer* overlap = impl_->grad_reducer.get();
  const int64_t bucket_size = options_.config.train.ddp_bucket_size;
  if (overlap != nullptr) {
    if (!overlap_armed) overlap->Arm();  // no backward pass ran on this rank: post every bucket
    SLIME_RETURN_IF_ERROR(overlap->Finish());
    return internal::AllReduceGradsAndMetrics(options_.dp_all_reduce, {}, sums, bucket_size);
  }
  if (options_.dp_size > 1 && optimizer_->distributed()) {
    return internal::AllReduceGradsAndMetrics(options_.dp_all_reduce, {}, sums, bucket_size);
  }
  if (options_.dp_size > 1) {
    // Expert parallelism: the experts' gradients over the expert-DP group only (trainer.h).
    SLIME_RETURN_IF_ERROR(internal::AllReduceExpertGrads(options_, impl_->expert_trainable));
    return internal::AllReduceGradsAndMetrics(options_.dp_all_reduce, impl_->trainable, sums,
                                              bucket_size);
  }
  return absl::OkStatus();
}

// AdamW at the scheduler's LR, the step counter, the LR schedule (not after a skipped step),
// and the step's log line; grad_norm and lr join `metrics`.
Status Trainer::ApplyOptimizerStep(int64_t num_steps, TrainStepMetrics& metrics) {
  SLIME_ASSIGN_OR_RETURN(OptimizerStepResult result, optimizer_->Step(lr_scheduler_.lr()));
  impl_->actor_backup_current = false;
  ++step_;
  metrics.skipped = result.skipped;
  metrics.values["grad_norm"] = result.grad_norm;
  metrics.values["lr"] = result.lr;
  const int64_t rollout_id = metrics.rollout_id;
  if (result.skipped) {
    spdlog::warn("train: rollout {} step {}: skipped, the gradient norm is {} (not finite)",
                 rollout_id, metrics.step, result.grad_norm);
  } else {
    lr_scheduler_.Step(metrics.num_samples);
  }
  if (rollout_id >= 0) {
    spdlog::info("train: rollout {} step {} ({}/{} of the rollout, {} samples): {}", rollout_id,
                 metrics.step, metrics.step_in_rollout + 1, num_steps, metrics.num_samples,
                 FormatValues(metrics.values));
  } else {
    spdlog::info("train: sft step {} ({} samples): {}", metrics.step, metrics.num_samples,
                 FormatValues(metrics.values));
  }
  return absl::OkStatus();
}

}  // namespace slime::train
