// Private to the trainer's sources (trainer*.cc; loss_registry.cc uses the gather helpers): the
// Trainer's hidden state and the helpers those files share. Not installed; include only from
// src/train/.
//
//   trainer_create.cc   Create and its steps
//   trainer.cc          batch checks, TrainRollout / SftStep / ComputeLogProbs (the public
//                       flow of trainer.h)
//   trainer_weights.cc  the CPU weight copies (ref / teacher / old actor), the swap, the
//                       keep_old_actor queue, Save / Load
//   trainer_step.cc     packing and forwarding micro-batches, one optimizer step (RunStep)
//   trainer_pipeline.cc the 1F1B schedule, the forward-only pass through pipeline stages, the
//                       stages' shared metrics
//
// Thread-safety: as the Trainer (one thread).
#ifndef SLIME_SRC_TRAIN_TRAINER_INTERNAL_H_
#define SLIME_SRC_TRAIN_TRAINER_INTERNAL_H_

#include <fmt/format.h>
#include <torch/torch.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "slime/common/status.h"
#include "slime/config/config.h"
#include "slime/model/expert_parallel.h"
#include "slime/train/batching.h"
#include "slime/train/checkpoint_writer.h"
#include "slime/train/critic.h"
#include "slime/train/grad_reducer.h"
#include "slime/train/logprobs.h"
#include "slime/train/loss_registry.h"
#include "slime/train/losses.h"
#include "slime/train/lr_schedule.h"
#include "slime/train/moe_aux_loss.h"
#include "slime/train/trainer.h"
#include "routing_replay.h"
#include "torch_guard.h"

namespace slime::model {
class DecoderModel;
class PipelineParallelGroup;
}  // namespace slime::model

namespace slime::train {
namespace internal {

// Tags of the CPU weight copies in Trainer::Impl::copies.
constexpr const char* kRef = "ref";
constexpr const char* kTeacher = "teacher";
constexpr const char* kOldActor = "old_actor";
constexpr const char* kRolloutActor = "rollout_actor";

// The copy tag of `which` ("actor" for kActor, which has no copy).
const char* CopyTag(PolicyWeights which);

// A CPU tensor holding a copy of `t` (pinned when `t` lives on a GPU, for fast copies back).
torch::Tensor CpuCopy(const torch::Tensor& t);

// dst[k].copy_(src[k]) for every k, under NoGradGuard.
void CopyInto(const std::vector<torch::Tensor>& dst, const std::vector<torch::Tensor>& src);

// Reads the weights of `dir` (a trainer checkpoint — <save> or iteration dir — or an HF
// directory) into CPU tensors in the order of `names`, checking every shape against `like`.
// With tp_size > 1 each tensor is this rank's shard (tensor_parallel.h layout) of the full one;
// of the experts only `experts`' block is read (expert parallelism; default: all).
StatusOr<std::vector<torch::Tensor>> LoadWeightCopy(const std::string& what, const std::string& dir,
                                                    std::optional<int64_t> ckpt_step,
                                                    const std::vector<std::string>& names,
                                                    const std::vector<torch::Tensor>& like,
                                                    torch::ScalarType dtype, int tp_rank = 0,
                                                    int tp_size = 1,
                                                    const model::ExpertShard& experts = {});

// The LR schedule of a run (lr_schedule.h, in samples) with peak `lr` and floor `min_lr`, the
// rest from config.train; its length is `train_iters`, else slime's TrainIters from data.* and
// train.global_batch_size (an error names data.num_rollout when that is unknown).
StatusOr<LrSchedule> MakeRunLrSchedule(const config::Config& config,
                                       std::optional<int64_t> train_iters, double lr,
                                       double min_lr);

// Sets `model`'s activation recomputation (model/recompute.h) from train.recompute_granularity,
// recompute_method and recompute_num_layers (full needs both of the others, selective neither);
// InvalidArgument naming the key otherwise, or when recompute_num_layers exceeds the layers of
// the model's pipeline stage. Actor and critic call it after loading their model.
Status ApplyRecompute(const config::TrainConfig& train, model::DecoderModel& model,
                      const char* who);

// The scheduler state as stored in trainer_state.json's "lr_scheduler".
nlohmann::json LrStateToJson(const LrSchedulerState& s);
// `text` (an "lr_scheduler" JSON object read from `where`) loaded into a copy of `configured`
// under `mismatch`; nullopt for an empty object (saved without a scheduler).
StatusOr<std::optional<LrScheduler>> ParseLrState(const std::string& text, const std::string& where,
                                                  const LrScheduler& configured,
                                                  LrStateMismatch mismatch);
// ParseLrState of the "lr_scheduler" of the trainer_state.json at `path`; nullopt when the
// file or the key is missing (the checkpoint load reports those).
StatusOr<std::optional<LrScheduler>> ReadLrState(const std::string& path,
                                                 const LrScheduler& configured,
                                                 LrStateMismatch mismatch);

// One packed micro-batch: the token ids on the model's device and the layout.
// train.data_pad_size_multiplier: the ids are padded with token 0 up to a multiple of
// `pad_multiple` (TP size × data_pad_size_multiplier, slime's padding of packed micro-batches;
// 1 = none). The padding is a sequence of its own in `forward_cu_seqlens` (what the model's
// forward takes), so no real token attends to it; `packed` describes the real sequences only, so
// the log-probs, values and losses read real rows and the padding changes none of them.
struct PackedInputs {
  torch::Tensor ids;  // [T_pad] int64: the samples' T tokens, then T_pad − T zeros
  PackedSequences packed;                   // the real sequences (cu_seqlens end at T)
  std::vector<int64_t> forward_cu_seqlens;  // packed.cu_seqlens, then T_pad when T_pad > T
};
PackedInputs Pack(const data::RolloutBatch& batch, const std::vector<int64_t>& samples,
                  torch::Device device, int64_t pad_multiple);
// The padded token count of `samples` (Pack's T_pad).
int64_t PackedTokenCount(const data::RolloutBatch& batch, const std::vector<int64_t>& samples,
                         int64_t pad_multiple);

// Sums the named 0-dim metric tensors into `sums` (float64).
void Accumulate(const std::map<std::string, torch::Tensor>& metrics,
                std::map<std::string, torch::Tensor>& sums);

// Data parallelism: sums the gradients of `trainable` (a zero gradient where undefined) and
// the metric sums over the DP group through `all_reduce`. Gradients go in buckets: consecutive
// parameters of one dtype and device, up to `bucket_size` elements in all (a larger one alone),
// flattened into one tensor, one all-reduce each, copied back. The metrics (float64 0-dim
// tensors, name order) go in one more all-reduce. An empty `trainable` sums only the metrics.
Status AllReduceGradsAndMetrics(const AllReduceSumFn& all_reduce,
                                const std::vector<torch::Tensor>& trainable,
                                std::map<std::string, torch::Tensor>& sums, int64_t bucket_size);

// Expert parallelism: sums the experts' gradients (a zero gradient where undefined) over the
// expert-data-parallel group (options.edp_all_reduce) when it has more than one rank; with one
// rank only the zeros are filled in. Nothing to do for an empty `experts`.
Status AllReduceExpertGrads(const TrainerOptions& options,
                            const std::vector<torch::Tensor>& experts);

// Expert parallelism's checks (trainer_expert_parallel.cc): the group against
// train.expert_model_parallel_size, the seams, dp_size, and the settings that do not work with
// it yet (use_distributed_optimizer, overlap_grad_reduce, a critic). Resets a size-1 group.
Status SetUpExpertParallel(TrainerOptions& options, bool needs_critic);
// ... and against the model: EP > 1 needs experts, num_experts divisible by EP (errors name
// train.expert_model_parallel_size and num_experts).
Status CheckExpertParallelModel(const TrainerOptions& options, const model::ModelConfig& model);

// train.overlap_grad_reduce (grad_reducer.h) for the trainable parameters of `who` ("trainer",
// "critic"): the reducer when it applies — dp_size > 1 and the plain optimizer —, else null
// (logged: one DP rank has nothing to sum; with train.use_distributed_optimizer the gradients
// are reduce-scattered by the optimizer after the backward pass). InvalidArgument when it
// applies and `all_reduce` is unset.
StatusOr<std::unique_ptr<GradReducer>> MakeGradReducer(const std::string& who,
                                                       const config::TrainConfig& train,
                                                       int dp_size, bool distributed,
                                                       const AsyncAllReduceSumFn& all_reduce,
                                                       const std::vector<torch::Tensor>& trainable);

// A float32 tensor of `values` on `device`.
torch::Tensor FloatTensor(const std::vector<float>& values, torch::Device device);

// Concatenates the per-sample tensors of `samples` (all defined) into one [T] tensor.
torch::Tensor Gather(const std::vector<torch::Tensor>& per_sample,
                     const std::vector<int64_t>& samples);

// True when per_sample[i] is defined for every i in `samples`.
bool AllDefined(const std::vector<torch::Tensor>& per_sample, const std::vector<int64_t>& samples);

// Rollout ids for the scheduler: the samples' own, -1 replaced by ids of their own; empty when
// no sample has an id (every sample is a rollout of its own).
std::vector<int64_t> SchedulingRolloutIds(const data::RolloutBatch& batch);

// The number of distinct rollouts among `num_samples` samples with SchedulingRolloutIds `ids`.
int64_t CountRollouts(const std::vector<int64_t>& ids, size_t num_samples);

// Forward (with the autograd graph when grad mode is on) of one packed micro-batch of `samples`
// → the response log-probs (and entropy). `hooks` run around the model's forward.
StatusOr<ResponseLogProbs> ForwardMicroBatch(model::DecoderModel& model,
                                             const data::RolloutBatch& batch,
                                             const std::vector<int64_t>& samples,
                                             int64_t chunk_size, bool with_entropy,
                                             int64_t pad_multiple, const ForwardHooks& hooks = {});

// Forward-only log-probs of every sample of `micro_batches` into out[sample] (`out` sized to the
// batch beforehand); through the pipeline (ForwardOnlyPipelined) when pp has several stages.
Status ForwardOnly(model::DecoderModel& model, model::PipelineParallelGroup& pp,
                   const data::RolloutBatch& batch,
                   const std::vector<const MicroBatch*>& micro_batches, int64_t chunk_size,
                   bool with_entropy, int64_t pad_multiple, SampleLogProbs& out,
                   const ForwardHooks& hooks = {});

// ---- Pipeline parallelism (trainer_pipeline.cc)

// The last stage's work on micro-batch k of a step: the loss to back-propagate, from the final
// hidden states [T, hidden] of the packed micro-batch `in` (it also accumulates the metrics).
using StageLossFn = std::function<StatusOr<torch::Tensor>(size_t k, const torch::Tensor& hidden,
                                                          const PackedInputs& in)>;

// The forward and backward passes of one training step over `micro_batches` (sample lists) on
// this pipeline stage, with the 1F1B schedule of trainer_pipeline.cc; `loss` runs on the last
// stage only. Gradients accumulate in the stage's parameters. Every stage must run it with the
// same micro-batches. With one stage: forward, loss, backward per micro-batch.
// `before_last_backward` (optional) runs just before the stage's last backward pass of the step
// (GradReducer::Arm). `hooks` (each optional) run on every stage: before_pass(k) just before
// the forward and just before the backward of micro-batch k (the MoE router loss selects the
// micro-batch its hook reads, moe_aux_loss.h), before_forward(k) just before the stage's
// forward (routing replay sets the micro-batch's routing), after_forward(k) right after it.
struct MicroBatchHooks {
  std::function<void(size_t k)> before_pass;
  std::function<Status(size_t k)> before_forward;
  std::function<Status(size_t k)> after_forward;
};
Status RunPipelineSchedule(model::DecoderModel& model, model::PipelineParallelGroup& pp,
                           const data::RolloutBatch& batch,
                           const std::vector<const std::vector<int64_t>*>& micro_batches,
                           int64_t pad_multiple, const StageLossFn& loss,
                           const std::function<void()>& before_last_backward = nullptr,
                           const MicroBatchHooks& hooks = {});

// ForwardOnly through the pipeline (stage size > 1): activations flow stage to stage, the last
// stage computes the log-probs (and entropy), and one broadcast gives every stage all of them,
// so `out` is the same on every stage.
Status ForwardOnlyPipelined(model::DecoderModel& model, model::PipelineParallelGroup& pp,
                            const data::RolloutBatch& batch,
                            const std::vector<const MicroBatch*>& micro_batches, int64_t chunk_size,
                            bool with_entropy, int64_t pad_multiple, SampleLogProbs& out,
                            const ForwardHooks& hooks = {});

// The last stage's step metrics (`values` there) copied into `values` on every stage (names and
// numbers broadcast from the last stage). No-op with one stage.
Status ShareStepMetrics(model::PipelineParallelGroup& pp, bool last_stage,
                        std::map<std::string, double>& values);

}  // namespace internal

// ---- The Trainer's private state ---------------------------------------------------------------

// Create's results: the selected algorithm, the parameters, their CPU copies and the critic.
struct Trainer::Impl {
  TrainerAlgorithm algorithm;  // the loss and estimator rows and what they need
  PolicyLossOptions policy;
  BatchingOptions batching;
  // Pack's padding multiple: TP size × train.data_pad_size_multiplier.
  int64_t pad_multiple = 1;

  // The live parameters (model::NamedParameters order) and the CPU copies of other policies,
  // tensor k of a copy belonging to parameter k.
  std::vector<std::string> names;
  std::vector<torch::Tensor> params;
  // The optimizer's trainable subset of params, in order — without the experts' parameters
  // under expert parallelism (EP > 1), which are in expert_trainable (summed over the
  // expert-data-parallel group instead of the DP group).
  std::vector<torch::Tensor> trainable;
  std::vector<torch::Tensor> expert_trainable;
  std::map<std::string, std::vector<torch::Tensor>> copies;
  std::vector<torch::Tensor> actor_backup;  // the actor while another policy is swapped in
  bool actor_backup_current = false;        // actor_backup equals the live parameters

  std::unique_ptr<Critic> critic;             // TrainerNeeds::critic (advantage_estimator "ppo")
  std::unique_ptr<GradReducer> grad_reducer;  // train.overlap_grad_reduce, when it applies
  // train.moe_aux_loss_coeff / moe_z_loss_coeff on a model with sparse layers; else null.
  std::unique_ptr<MoeRouterLoss> moe_loss;
  // Routing replay (routing_replay.h), for the batch being trained: the engine's routing of
  // its samples (whenever they carry it) and, with algorithm.use_routing_replay alone, what the
  // old-log-prob forward routed.
  bool sparse_model = false;  // the model has mixture-of-experts layers
  internal::SampleRouting engine_routing;
  internal::SampleRouting recorded_routing;

  // Background saves (Trainer::Save): the writer is made by the first one; the times of the
  // last Save / WaitForSave.
  std::unique_ptr<AsyncCheckpointWriter> checkpoint_writer;
  Trainer::BackgroundSaveTimes background_save;
};

}  // namespace slime::train

#endif  // SLIME_SRC_TRAIN_TRAINER_INTERNAL_H_
