// The trainer of one model replica (see include/slime/train/trainer.h): batch checks, the
// forward-only passes, TrainRollout's steps and SftStep. Create is in trainer_create.cc, one
// optimizer step in trainer_step.cc.
#include "slime/train/trainer.h"

#include <fmt/format.h>
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
using internal::FloatTensor;
using internal::ForwardHooks;
using internal::ForwardOnly;
using internal::GuardTorch;
using internal::kRef;
using internal::SchedulingRolloutIds;

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
         !a.use_routing_replay && !options_.config.metrics.log_correct_samples;
}

// ---- Batch checks ------------------------------------------------------------------------------

namespace {

// Sample i's lengths, token ids (inside the vocabulary) and loss mask (0/1 per response token).
Status CheckSampleTokens(size_t i, const data::TrainSample& s, int64_t vocab) {
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
          fmt::format("batch: samples[{}].tokens[{}] = {} is outside the vocabulary [0, {})", i, t,
                      s.tokens[t], vocab));
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
  return absl::OkStatus();
}

// Sample i's rollout and teacher log-probs (one per response token, present where `needs` reads
// them) and its reward.
Status CheckSampleInputs(size_t i, const data::TrainSample& s, const TrainerNeeds& needs) {
  if (!s.rollout_log_probs.empty() &&
      static_cast<int64_t>(s.rollout_log_probs.size()) != s.response_length) {
    return absl::InvalidArgumentError(
        fmt::format("batch: samples[{}].rollout_log_probs has {} values for response_length = "
                    "{}",
                    i, s.rollout_log_probs.size(), s.response_length));
  }
  if (s.rollout_log_probs.empty() && needs.rollout_log_probs && s.response_length > 0) {
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
  if (s.teacher_log_probs.empty() && needs.teacher_in_batch && s.response_length > 0) {
    return absl::InvalidArgumentError(fmt::format(
        "batch: samples[{}].teacher_log_probs is empty, but use_opd with opd_type sglang needs "
        "the teacher's log-probs",
        i));
  }
  if (!std::isfinite(s.reward)) {
    return absl::InvalidArgumentError(
        fmt::format("batch: samples[{}].reward = {} is not finite", i, s.reward));
  }
  return absl::OkStatus();
}

}  // namespace

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
    SLIME_RETURN_IF_ERROR(CheckSampleTokens(i, batch.samples[i], vocab));
    SLIME_RETURN_IF_ERROR(CheckSampleInputs(i, batch.samples[i], impl_->algorithm.needs));
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
  SLIME_RETURN_IF_ERROR(PrepareRouting(batch));
  const ForwardHooks routing = PassRoutingHooks(which, /*old_pass=*/false, batch);
  Status passed = WithPolicyWeights(which, [&]() -> Status {
    return ForwardOnly(*model_, *options_.pp_group, batch, mbs,
                       options_.config.train.log_probs_chunk_size,
                       with_entropy, impl_->pad_multiple, out, routing);
  });
  internal::ResetRouting(*model_);
  SLIME_RETURN_IF_ERROR(passed);
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

// This rank's share of a rollout's schedule: its micro-batches of every step, in order, and
// its samples, ascending.
void TakeRankShare(const RolloutSchedule& schedule, int dp_rank,
                   std::vector<const MicroBatch*>& micro_batches, std::vector<int64_t>& local) {
  for (const StepSchedule& step : schedule.steps) {
    for (const MicroBatch& mb : step.ranks[dp_rank]) {
      micro_batches.push_back(&mb);
      local.insert(local.end(), mb.samples.begin(), mb.samples.end());
    }
  }
  std::sort(local.begin(), local.end());
}

// The loss masks and (when the batch has them) the rollout log-probs of the samples `local`,
// on `device`.
Status LoadLocalTensors(const data::RolloutBatch& batch, const std::vector<int64_t>& local,
                        torch::Device device, SampleTensors& tensors) {
  return GuardTorch("trainer: batch to tensors", [&]() -> Status {
    for (int64_t i : local) {
      const data::TrainSample& s = batch.samples[i];
      tensors.loss_masks[i] = FloatTensor(s.loss_mask, device);
      if (static_cast<int64_t>(s.rollout_log_probs.size()) == s.response_length) {
        tensors.rollout_log_probs[i] = FloatTensor(s.rollout_log_probs, device);
      }
    }
    return absl::OkStatus();
  });
}

// The forward-only passes of one rollout (trainer.h steps 1–3) and what was derived from them,
// per batch sample.
struct PolicyPasses {
  explicit PolicyPasses(size_t n) : values(n), teacher_by_sample(n) {}
  bool skip_old = false;  // no old-actor pass: π_old is the rollout's or the current policy
  SampleLogProbs ref, teacher, old;
  std::vector<torch::Tensor> values;             // ppo: the pre-update critic's values
  std::vector<torch::Tensor> teacher_by_sample;  // computed or shipped teacher log-probs
};

// The estimator's inputs for the samples `local`, in that order. Without an old-actor pass
// (kl_coef == 0, no OPD, not ppo) only the shape of the log-probs is read.
StatusOr<AdvantageInputs> GatherAdvantageInputs(const data::RolloutBatch& batch,
                                                const std::vector<int64_t>& local,
                                                const SampleTensors& tensors,
                                                const TrainerNeeds& needs,
                                                bool use_rollout_logprobs, torch::Device device,
                                                PolicyPasses& p) {
  AdvantageInputs in;
  Status built = GuardTorch("trainer: advantage inputs", [&]() -> Status {
    for (int64_t i : local) {
      const data::TrainSample& s = batch.samples[i];
      in.rewards.push_back(s.reward);
      in.loss_masks.push_back(tensors.loss_masks[i]);
      if (use_rollout_logprobs) {
        in.log_probs.push_back(tensors.rollout_log_probs[i]);
      } else if (!p.skip_old) {
        in.log_probs.push_back(p.old.log_probs[i]);
      } else {
        in.log_probs.push_back(torch::zeros_like(tensors.loss_masks[i]));
      }
      if (needs.reference) in.ref_log_probs.push_back(p.ref.log_probs[i]);
      if (p.values[i].defined()) in.values.push_back(p.values[i]);
      if (needs.teacher_pass) {
        p.teacher_by_sample[i] = p.teacher.log_probs[i];
      } else if (needs.teacher_in_batch) {
        p.teacher_by_sample[i] = FloatTensor(s.teacher_log_probs, device);
      }
      if (p.teacher_by_sample[i].defined()) in.teacher_log_probs.push_back(p.teacher_by_sample[i]);
    }
    return absl::OkStatus();
  });
  SLIME_RETURN_IF_ERROR(built);
  return in;
}

// The estimator's outputs (in `local` order) and the tensors the loss reads, into the per-sample
// `tensors`.
void StoreAdvantages(const AdvantageOutputs& adv, const std::vector<int64_t>& local,
                     const PolicyPasses& p, const TrainerNeeds& needs, bool use_rollout_logprobs,
                     bool has_critic, SampleTensors& tensors) {
  for (size_t k = 0; k < local.size(); ++k) {
    const int64_t i = local[k];
    tensors.advantages[i] = adv.advantages[k];
    if (!adv.opd_reverse_kl.empty()) tensors.opd_reverse_kl[i] = adv.opd_reverse_kl[k];
    if (has_critic) {
      tensors.values[i] = p.values[i];
      tensors.returns[i] = adv.returns[k];
    }
    if (needs.reference) tensors.ref_log_probs[i] = p.ref.log_probs[i];
    if (use_rollout_logprobs) {
      tensors.old_log_probs[i] = tensors.rollout_log_probs[i];
    } else if (!p.skip_old) {
      tensors.old_log_probs[i] = p.old.log_probs[i];
    }
  }
}

// metrics.log_correct_samples' correct_entropy (slime): over the samples of `local` whose raw
// reward is 1, the mean of each one's loss-masked mean of −log π_old (the old-actor pass, or the
// engine's log-probs when they are π_old); 0 without correct samples.
Status RecordCorrectEntropy(const data::RolloutBatch& batch, const PolicyPasses& p,
                            const SampleTensors& tensors, const std::vector<int64_t>& local,
                            std::map<std::string, double>& values) {
  const std::vector<torch::Tensor>& log_probs =
      p.skip_old ? tensors.rollout_log_probs : p.old.log_probs;
  std::vector<int64_t> correct;
  for (int64_t i : local) {
    if (batch.samples[i].raw_reward == 1.0) correct.push_back(i);
  }
  if (correct.empty()) {
    values["correct_entropy"] = 0.0;
    return absl::OkStatus();
  }
  return GuardTorch("trainer: correct_entropy", [&]() -> Status {
    std::optional<double> mean = MeanOfSampleMeans(log_probs, tensors.loss_masks, correct);
    if (mean.has_value()) values["correct_entropy"] = -*mean;
    return absl::OkStatus();
  });
}

// The rollout-side means of what the passes and the estimator produced (rank-local).
Status RecordPassMeans(const PolicyPasses& p, const SampleTensors& tensors,
                       const std::vector<int64_t>& local, const TrainerNeeds& needs,
                       bool has_critic, bool has_teacher, std::map<std::string, double>& values) {
  return GuardTorch("trainer: rollout values", [&]() -> Status {
    auto put = [&](const char* name, std::optional<double> v) {
      if (v.has_value()) values[name] = *v;
    };
    put("advantages", MeanOfSampleMeans(tensors.advantages, tensors.loss_masks, local));
    if (has_critic) {
      put("values", MeanOfSampleMeans(tensors.values, tensors.loss_masks, local));
      put("returns", MeanOfSampleMeans(tensors.returns, tensors.loss_masks, local));
    }
    if (!p.skip_old) {
      put("log_probs", MeanOfSampleMeans(p.old.log_probs, tensors.loss_masks, local));
    }
    if (!p.old.entropy.empty()) {
      put("entropy", MeanOfSampleMeans(p.old.entropy, tensors.loss_masks, local));
    }
    if (needs.reference) {
      put("ref_log_probs", MeanOfSampleMeans(p.ref.log_probs, tensors.loss_masks, local));
    }
    if (has_teacher) {
      put("teacher_log_probs", MeanOfSampleMeans(p.teacher_by_sample, tensors.loss_masks, local));
    }
    put("rollout_log_probs",
        MeanOfSampleMeans(tensors.rollout_log_probs, tensors.loss_masks, local));
    return absl::OkStatus();
  });
}

// The rollout-side means of the samples `local` themselves: reward, raw_reward,
// response_length, truncated.
void RecordSampleMeans(const data::RolloutBatch& batch, const std::vector<int64_t>& local,
                       std::map<std::string, double>& values) {
  if (local.empty()) return;
  double reward = 0, raw_reward = 0, length = 0, truncated = 0;
  for (int64_t i : local) {
    reward += batch.samples[i].reward;
    raw_reward += batch.samples[i].raw_reward;
    length += static_cast<double>(batch.samples[i].response_length);
    truncated += batch.samples[i].truncated ? 1.0 : 0.0;
  }
  const double count = static_cast<double>(local.size());
  values["reward"] = reward / count;
  values["raw_reward"] = raw_reward / count;
  values["response_length"] = length / count;
  values["truncated"] = truncated / count;
}

// debug.save_debug_train_data: this rank's samples of `schedule` with their tensors, ascending.
Status RecordTrainedSamples(const RolloutSchedule& schedule, int dp_rank,
                            const SampleTensors& tensors, std::vector<TrainedSample>& out) {
  return GuardTorch("trainer: record the trained samples", [&]() -> Status {
    auto floats = [](const torch::Tensor& t) {
      std::vector<float> v;
      if (!t.defined()) return v;
      torch::Tensor c = t.detach().to(torch::kCPU, torch::kFloat32).contiguous();
      v.assign(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
      return v;
    };
    for (size_t s = 0; s < schedule.steps.size(); ++s) {
      const std::vector<MicroBatch>& mbs = schedule.steps[s].ranks[dp_rank];
      for (size_t k = 0; k < mbs.size(); ++k) {
        for (int64_t i : mbs[k].samples) {
          TrainedSample t;
          t.index = i;
          t.step_in_rollout = static_cast<int64_t>(s);
          t.micro_batch = static_cast<int64_t>(k);
          t.advantages = floats(tensors.advantages[i]);
          t.returns = floats(tensors.returns[i]);
          t.values = floats(tensors.values[i]);
          t.log_probs = floats(tensors.old_log_probs[i]);
          t.ref_log_probs = floats(tensors.ref_log_probs[i]);
          t.opd_reverse_kl = floats(tensors.opd_reverse_kl[i]);
          out.push_back(std::move(t));
        }
      }
    }
    std::sort(out.begin(), out.end(),
              [](const TrainedSample& a, const TrainedSample& b) { return a.index < b.index; });
    return absl::OkStatus();
  });
}

}  // namespace

StatusOr<TrainRolloutResult> Trainer::TrainRollout(int64_t rollout_id,
                                                   const data::RolloutBatch& batch) {
  SLIME_RETURN_IF_ERROR(CheckBatch(batch));
  const size_t n = batch.samples.size();

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
  std::vector<int64_t> local;
  TakeRankShare(schedule, options_.dp_rank, micro_batches, local);

  TrainRolloutResult result;
  result.dropped_samples = schedule.dropped;
  if (options_.config.train.reset_optimizer_states) optimizer_->ResetStates();
  SampleTensors tensors(n);
  SLIME_RETURN_IF_ERROR(LoadLocalTensors(batch, local, model_->device(), tensors));
  SLIME_RETURN_IF_ERROR(PrepareRouting(batch));

  // 1–4. The forward-only passes and the advantages.
  if (impl_->algorithm.needs.advantages) {
    SLIME_RETURN_IF_ERROR(
        PrepareAdvantages(batch, micro_batches, local, num_steps, tensors, result.rollout_values));
  }
  RecordSampleMeans(batch, local, result.rollout_values);
  if (options_.config.debug.save_debug_train_data.has_value()) {
    SLIME_RETURN_IF_ERROR(RecordTrainedSamples(schedule, options_.dp_rank, tensors, result.trained));
  }

  // 5. The optimizer steps.
  for (int64_t s = 0; s < num_steps; ++s) {
    SLIME_ASSIGN_OR_RETURN(TrainStepMetrics metrics,
                           RunStep(rollout_id, s, num_steps, *impl_->algorithm.loss, batch, ids,
                                   schedule.steps[s], tensors));
    result.steps.push_back(std::move(metrics));
  }

  // 6. The reference follows the actor every ref_update_interval rollouts.
  SLIME_RETURN_IF_ERROR(FollowActorWithReference(rollout_id));
  return result;
}

Status Trainer::PrepareAdvantages(const data::RolloutBatch& batch,
                                  const std::vector<const MicroBatch*>& micro_batches,
                                  const std::vector<int64_t>& local, int64_t num_steps,
                                  SampleTensors& tensors,
                                  std::map<std::string, double>& rollout_values) {
  const config::AlgorithmConfig& algorithm = options_.config.algorithm;
  const TrainerNeeds& needs = impl_->algorithm.needs;
  const size_t n = batch.samples.size();
  const int64_t chunk = options_.config.train.log_probs_chunk_size;
  auto forward = [&](PolicyWeights which, bool with_entropy, SampleLogProbs& out,
                     bool old_pass = false) {
    out.log_probs.resize(n);
    if (with_entropy) out.entropy.resize(n);
    const ForwardHooks routing = PassRoutingHooks(which, old_pass, batch);
    Status passed = WithPolicyWeights(which, [&]() -> Status {
      return ForwardOnly(*model_, *options_.pp_group, batch, micro_batches, chunk, with_entropy,
                         impl_->pad_multiple, out, routing);
    });
    internal::ResetRouting(*model_);
    return passed;
  };
  // 1–3. Reference, teacher and old-actor log-probs.
  PolicyPasses p(n);
  p.skip_old = SkipsOldLogProbs(num_steps) || algorithm.use_rollout_logprobs;
  if (needs.reference) SLIME_RETURN_IF_ERROR(forward(PolicyWeights::kRef, false, p.ref));
  if (needs.teacher_pass) SLIME_RETURN_IF_ERROR(forward(PolicyWeights::kTeacher, false, p.teacher));
  if (!p.skip_old) {
    SLIME_RETURN_IF_ERROR(
        forward(algorithm.keep_old_actor ? PolicyWeights::kOldActor : PolicyWeights::kActor,
                algorithm.use_rollout_entropy, p.old, /*old_pass=*/true));
  }
  // ppo: the pre-update critic's values (GAE's V and the value loss's v_old).
  Critic* critic = impl_->critic.get();
  if (critic != nullptr) {
    SLIME_RETURN_IF_ERROR(critic->ComputeValues(batch, micro_batches, p.values));
  }

  // 4. Advantages and returns over this rank's samples.
  SLIME_ASSIGN_OR_RETURN(AdvantageInputs in, GatherAdvantageInputs(batch, local, tensors, needs,
                                                                   algorithm.use_rollout_logprobs,
                                                                   model_->device(), p));
  AllReduceSumFn all_reduce;
  if (options_.dp_size > 1) all_reduce = options_.dp_all_reduce;
  SLIME_ASSIGN_OR_RETURN(AdvantageOutputs adv,
                         ComputeAdvantagesAndReturns(algorithm, in, all_reduce));
  StoreAdvantages(adv, local, p, needs, algorithm.use_rollout_logprobs, critic != nullptr, tensors);
  if (options_.config.metrics.log_correct_samples) {
    SLIME_RETURN_IF_ERROR(RecordCorrectEntropy(batch, p, tensors, local, rollout_values));
  }
  return RecordPassMeans(p, tensors, local, needs, critic != nullptr, !in.teacher_log_probs.empty(),
                         rollout_values);
}

Status Trainer::FollowActorWithReference(int64_t rollout_id) {
  const std::optional<int>& interval = options_.config.algorithm.ref_update_interval;
  if (!interval.has_value() || *interval <= 0 || (rollout_id + 1) % *interval != 0 ||
      !has_weights(PolicyWeights::kRef)) {
    return absl::OkStatus();
  }
  Status updated = GuardTorch("trainer: update the reference weights", [&]() -> Status {
    CopyInto(impl_->copies[kRef], impl_->params);
    return absl::OkStatus();
  });
  SLIME_RETURN_IF_ERROR(updated);
  spdlog::info("trainer: the reference weights are now the actor's (rollout {})", rollout_id);
  return absl::OkStatus();
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
  SLIME_RETURN_IF_ERROR(PrepareRouting(batch));
  SLIME_ASSIGN_OR_RETURN(const LossTypeSpec* sft_loss, FindLossType("sft_loss"));
  return RunStep(/*rollout_id=*/-1, 0, 1, *sft_loss, batch, ids, step, tensors);
}

}  // namespace slime::train
