// Trainer: the training side of one model replica. It owns the model (DecoderModel), the AdamW
// optimizer, the LR scheduler and the CPU copies of the other policies (reference, old actor,
// teacher), and runs slime's train_actor order for one rollout at a time
// (docs/algorithms.md, "What one training call does"):
//
//   TrainRollout(rollout_id, batch)
//     0. check the batch; schedule it (batching.h: steps of train.global_batch_size rollouts —
//        unset: rollouts / num_steps_per_rollout, else the whole batch as one step —,
//        micro-batches, this DP rank's share); reset_optimizer_states → AdamW::ResetStates
//     1. reference log-probs   (use_kl_loss or kl_coef != 0)      ref weights swapped in
//     2. teacher log-probs     (use_opd with opd_type "megatron") teacher weights swapped in
//     3. old-actor log-probs   actor (or old_actor with keep_old_actor) weights — SKIPPED when
//        slime skips them: one optimizer step per rollout, policy_loss, kl_coef == 0, no
//        use_rollout_logprobs / get_mismatch_metrics / keep_old_actor / use_opd, not gspo or
//        ppo, no metrics.log_correct_samples (its correct_entropy reads these log-probs). The
//        loss then takes the detached current log-probs as π_old (ratio ≡ 1, ppo_kl ≡ 0).
//        With use_rollout_logprobs the engine's log-probs are π_old and the pass is skipped
//        too (slime recomputes it only for custom TIS functions, which we do not have).
//     ppo: the values of the pre-update critic (critic.h), forward-only on the same
//        micro-batches
//     4. advantages and returns over all of the rank's samples (advantages.h; whitening
//        all-reduced over the DP group; ppo: GAE with algorithm.gamma / lambd)
//     5. per optimizer step (ppo: first the critic's step — value loss on the returns, clipped by
//        value_clip, with the same micro-batches and denominators, its own AdamW and LR; during
//        the first algorithm.num_critic_only_steps rollouts the step ends there and the actor
//        does not train):
//        per micro-batch forward with grad → response log-probs and entropy
//        (logprobs.h) → PolicyLoss with the step's denominators (losses.h: D_i = loss-mask
//        tokens of the step's samples sharing sample i's rollout id, G = rollouts of the step,
//        N = loss-mask tokens of the step) → backward; then the gradients (and metrics) are
//        summed over the DP group, AdamW::Step with the scheduler's lr, and on a successful
//        step the scheduler advances by the step's sample count.
//     6. ref_update_interval: every N rollouts the reference copy becomes the actor.
//   The forward-only passes use exactly the micro-batches of the training steps, so on the
//   first step the recomputed π_old equals the training log-probs bit for bit (ppo_kl == 0 and,
//   with the reference equal to the actor, kl_loss == 0 — slime's CI gates).
//
// Weight swap (no second model on the device). The reference, old-actor and teacher weights
// are CPU tensors (pinned when the model is on CUDA), one per model parameter, in
// model::NamedParameters order and the model's dtype. A forward-only pass under another
// policy (1) copies the live actor parameters into a CPU backup (only when they changed since
// the last backup), (2) copy_()s the other policy's tensors into the live parameters under
// NoGradGuard — the parameter tensor objects stay the same, so the optimizer's handles and
// the autograd leaves are untouched, (3) runs the pass, (4) copy_()s the actor backup back.
// Step 4 runs on every exit path, errors included, and restores the actor bit for bit; the
// optimizer's float32 masters are never touched.
//
// Data parallelism. Every DP rank receives the same data::RolloutBatch (the whole rollout) and
// trains only its micro-batches of each step, picked by the deterministic schedule;
// options.dp_all_reduce sums whitening statistics, metrics and gradients over the group (losses.h's
// denominators already count all ranks, so a SUM gives slime's objective). Gradients go in buckets
// of up to train.ddp_bucket_size elements (consecutive trainable parameters of one dtype and device
// flattened into one tensor, one all-reduce each, copied back; a larger parameter alone). With
// train.use_distributed_optimizer (ZeRO-1, optimizer.h) the gradients are not all-reduced here:
// AdamW reduce-scatters them, updates its 1/dp shard of the float32 masters and Adam moments and
// all-gathers the parameters (the same buckets), so every rank ends the step with the same
// weights; only the metrics are all-reduced here. With dp_size 1 the setting is ignored (logged).
// With train.overlap_grad_reduce (and the plain optimizer) the gradient buckets are summed
// while the step's last micro-batch backward pass runs (grad_reducer.h: hooks on the
// parameters' gradient accumulators post each bucket's all-reduce through dp_all_reduce_async
// as soon as its gradients are final; earlier passes only accumulate, so only the last can
// overlap); the metrics are summed after it. The sums are the synchronous path's.
//
// Tensor parallelism (Megatron-style, model/tensor_parallel.h). With options.tp_group of size
// P every TP rank holds its shard of the sharded parameters (column / row / vocab-parallel) and
// a full copy of the replicated ones (norms, row-parallel biases), receives the same batch and
// runs the same micro-batches as its TP peers; the parallel layers' differentiable
// collectives make the forward, the loss, the metrics and the replicated parameters'
// gradients identical on the TP ranks, and each shard's gradient the slice of the TP=1
// gradient. The gradient norm sums the shards' squares over the TP group and counts the
// replicated parameters once. With TP × DP, the DP group (dp_all_reduce) is the ranks with
// the same TP rank; DP ranks are numbered 0..dp_size-1 within it. TP × ZeRO-1: each TP rank's
// DP group shards that rank's local tensors (its shards and its copies of the replicated
// parameters) as optimizer.h describes; the norm is the DP sum of the shards' squares, then the
// TP sum (replicated parameters on TP rank 0 only), so clipping matches one rank.
// Checkpoints are layout-independent: the files always hold full tensors (checkpoint.h's TP=1
// layout, also an HF directory). At TP > 1, Save is a collective of the TP group — every rank
// all-gathers the shards of the weights and of the AdamW state (with ZeRO-1 first gathered over
// the DP group) to the CPU, TP rank 0 writes them, and an all-reduce tells every rank the
// outcome — and Load reads the full tensors into
// CPU temporaries on every rank and copies its slices in. Chosen over saving shards with their
// layout because the result is what the engine, HF export and a TP=1 trainer read as is, with
// no conversion step; the price is a full CPU copy of the model and its optimizer state on each
// TP rank while saving / loading, and the gather traffic. Not yet at TP > 1: the PPO critic
// (Create fails with Unimplemented). The fused CUDA log-prob kernels are single-rank only (the
// vocab-parallel path is the eager one).
//
// Pipeline parallelism (model/pipeline_parallel.h). With options.pp_group of size P this
// trainer is stage pp_group->rank(): its model holds layers [s·L/P, (s+1)·L/P) (the first stage
// the embedding, the last the final norm and LM head; with tied embeddings the last stage keeps
// its own copy of the table as LM head), loaded from the HF checkpoint stage by stage. Every
// stage receives the same batch and computes the same schedule, so all stages of one DP rank
// run the same micro-batches — the equal micro-batch counts per DP rank of batching.h make the
// stages of different DP ranks agree too. A training step runs the 1F1B schedule
// (trainer_pipeline.cc): the activations [T, hidden] of a micro-batch go forward stage to
// stage (c10d send / recv), the gradients of those activations come back, and the loss (log-
// probs, policy or SFT loss) runs on the last stage only. After the backward passes: the DP
// all-reduce per stage; the tied embedding's two gradients summed between the first and the
// last stage; the gradient norm's sum of squares all-reduced over the stages (the tied copy
// counted once); AdamW per stage; the last stage's step metrics broadcast so every stage
// returns the same TrainStepMetrics. Forward-only passes (ref / teacher / old log-probs,
// ComputeLogProbs) go through the stages the same way without backward, and the last stage
// broadcasts the per-token log-probs (and entropy), so advantages and the rollout values are
// computed identically on every stage. Checkpoints stay layout-independent: at PP > 1 Save is a
// collective of the PP group — every stage sends its parameters and AdamW state to stage 0
// (send / recv in HF parameter order), which writes the whole model as a PP=1 checkpoint, and a
// broadcast tells every stage the outcome — and Load reads the full checkpoint on every stage
// and keeps its own parameters, so a checkpoint loads at any PP size.
// PP × TP: every stage is tensor-parallel (options.tp_group: the ranks of the same stage and DP
// index); the pipeline group joins the ranks of one TP index and DP index, so TP rank t of stage
// s exchanges activations and their gradients with TP rank t of s±1. The hidden states between
// stages are full [T, hidden] and identical on the TP ranks (the row-parallel outputs are
// all-reduced; with train.sequence_parallel a stage gathers its output's token shards and the
// next stage scatters its input), and so are the input gradients, so the schedule is the PP=1
// one per TP index. The loss and the log-probs
// run vocab-parallel on the last stage; with tied embeddings the first stage's vocab shard of
// the table and the last stage's copy of the same shard sum their gradients; the norm is the
// TP sum per stage, then the PP sum. Save at PP > 1 and TP > 1: each stage's TP group gathers
// its shards first, then TP rank 0 of every stage runs the pipeline save above, and a TP
// all-reduce shares the outcome. PP × ZeRO-1: each stage's DP group shards that stage's state
// (the tied LM head copy is a parameter of the last stage's shard, skipped by the norm).
// Not yet at PP > 1 (Create fails with Unimplemented): the PPO critic; interleaved (virtual)
// stages; overlapping the sends with compute.
//
// Expert parallelism (model/expert_parallel.h; train.expert_model_parallel_size = EP, mixture-
// of-experts models). EP is carved out of data parallelism as in Megatron: DP rank d is EP rank
// d % EP and expert-data-parallel rank d / EP. The model holds the experts [ep·E/EP,
// (ep+1)·E/EP) of every sparse layer (with TP > 1 each split over the TP ranks as before) and a
// full copy of everything else; each rank still trains its own micro-batches, and each MoE
// layer sends its routed rows to their experts' ranks and back by all-to-all (the equal
// micro-batch counts per DP rank keep the EP ranks' collectives in step). Gradients: the
// non-expert parameters are summed over the DP group as before; the expert parameters over the
// expert-DP group only (the EP peers hold other experts, and their rows already reached the
// owner through the all-to-all). The gradient norm counts the non-expert parameters on EP rank 0
// only and sums over the EP group, so every expert counts once. Checkpoints hold every expert
// (EP rank 0 writes — at PP > 1 its stages gather to its stage 0 —, each expert sent by its
// owner within its stage), so they load at any EP size. With PP > 1 the EP groups are per stage.
// Not yet with EP > 1 (refused when the config resolves or at Create, naming the keys):
// use_distributed_optimizer, overlap_grad_reduce, ppo.
//
// PPO. With advantage_estimator "ppo" the trainer owns a Critic (critic.h): the same decoder
// with a hidden → 1 value head, its own optimizer and LR schedule. Save writes it under
// <save>/critic/ (same iteration) before the actor; Load reads it back from there.
//
// Padding (train.data_pad_size_multiplier, slime's packing). Every packed micro-batch — of the
// training steps, the forward-only passes and the critic — is padded with token 0 up to a
// multiple of TP size × data_pad_size_multiplier; the padding is a sequence of its own in the
// forward's cu_seqlens, so no real token attends to it, and the log-probs, values and losses
// read real rows only: the padding changes no loss or gradient (tests/train/trainer_test.cc).
//
// What is not here yet: custom loss / advantage / TIS functions, routing replay (no MoE model),
// and context parallelism.
//
// Thread-safety: a Trainer belongs to one thread (the replica's training thread); no method may
// run concurrently with another. Errors (bad batch, bad config, LibTorch failures) come back as
// Status; nothing throws out of this class.
#ifndef SLIME_TRAIN_TRAINER_H_
#define SLIME_TRAIN_TRAINER_H_

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "slime/common/status.h"
#include "slime/config/config.h"
#include "slime/data/rollout_batch.h"
#include "slime/model/checkpoint.h"
#include "slime/train/advantages.h"
#include "slime/train/batching.h"
#include "slime/train/grad_reducer.h"
#include "slime/train/lr_schedule.h"

namespace slime::model {
struct ModelConfig;
class DecoderModel;
class ExpertParallelGroup;
class PipelineParallelGroup;
class TensorParallelGroup;
}  // namespace slime::model

namespace slime::train {

// The FLOPs model of a model (batching.h): the trainer's cost model for balancing and the
// benchmarks' MFU; sparse layers count their active experts.
FlopsModel FlopsModelOf(const model::ModelConfig& config);

class AdamW;
class Critic;
class LossReducer;
struct LossTypeSpec;
struct SampleTensors;
namespace internal {
struct ForwardHooks;
}

// ---- Data --------------------------------------------------------------------------------------

// Which weights a forward-only pass runs with.
enum class PolicyWeights { kActor, kRef, kOldActor, kTeacher };
std::string_view PolicyWeightsName(PolicyWeights which);  // "actor", "ref", "old_actor", "teacher"

// ---- Results -----------------------------------------------------------------------------------

// One optimizer step. `values` holds slime's names: loss, pg_loss, pg_clipfrac, ppo_kl,
// entropy_loss, and when they apply kl_loss, tis, ois, tis_clipfrac, tis_abs, opsm_clipfrac,
// opd_reverse_kl, train_rollout_logprob_abs_diff (policy loss; the SFT loss has loss only);
// plus grad_norm and lr; with ppo also the critic's value_loss, value_clipfrac,
// critic_grad_norm and critic_lr (critic-only steps carry only those, and `step` does not
// advance). Loss-side values are the step's reduced values (losses.h: the sum
// over micro-batches and DP ranks of the scaled micro-batch values).
struct TrainStepMetrics {
  int64_t rollout_id = 0;
  int64_t step = 0;             // the trainer's optimizer step counter before this step
  int64_t step_in_rollout = 0;  // 0-based
  int64_t num_samples = 0;      // samples of the step over all DP ranks
  bool skipped = false;         // non-finite gradient norm: no update, LR schedule not advanced
  std::map<std::string, double> values;
};

// What this rank trained one sample on (debug.save_debug_train_data): where it was scheduled
// and the per-token tensors the trainer computed for it before the optimizer steps. Vectors
// hold one float per response token, in response order; empty where not computed.
struct TrainedSample {
  int64_t index = 0;            // in the batch
  int64_t step_in_rollout = 0;  // the optimizer step of the rollout it was in
  int64_t micro_batch = 0;      // its micro-batch among this rank's of that step
  std::vector<float> advantages;
  std::vector<float> returns;        // ppo
  std::vector<float> values;         // ppo: the pre-update critic's
  std::vector<float> log_probs;      // π_old of the loss (the old-actor pass or the engine's)
  std::vector<float> ref_log_probs;  // with a reference
  std::vector<float> opd_reverse_kl; // use_opd
};

struct TrainRolloutResult {
  std::vector<TrainStepMetrics> steps;
  // Samples in no step (trailing rollouts that do not fill global_batch_size): batch indices,
  // ascending.
  std::vector<int64_t> dropped_samples;
  // Rollout-side means over this rank's samples (slime's rollout/* from the trainer): reward,
  // raw_reward, response_length, truncated; and, as the mean over samples of each sample's
  // loss-masked token mean, advantages, log_probs (when the old-actor pass ran), entropy
  // (use_rollout_entropy), ref_log_probs, rollout_log_probs, teacher_log_probs when they were
  // computed or given; with ppo also values (the pre-update critic's) and returns; with
  // metrics.log_correct_samples correct_entropy. Not reduced over DP ranks.
  std::map<std::string, double> rollout_values;
  // With debug.save_debug_train_data: this rank's samples, ascending by index (TrainedSample).
  std::vector<TrainedSample> trained;
};

// Per-sample results of a forward-only pass, in the batch's sample order.
struct SampleLogProbs {
  std::vector<torch::Tensor> log_probs;  // [R_i] float32 on the model's device, detached
  std::vector<torch::Tensor> entropy;    // [R_i]; empty unless requested
};

// What Load restored.
struct LoadedTrainerState {
  std::string dir;                      // the iteration directory read
  int64_t rollout_id = 0;               // the rollout the checkpoint was saved after (iteration)
  int64_t step = 0;                     // the optimizer step counter
  std::string extra_state_json = "{}";  // as passed to Save (e.g. the data source's state)
  bool optimizer_loaded = false;
};

// ---- Trainer -----------------------------------------------------------------------------------

struct TrainerOptions {
  // HF model directory (config.json + safetensors) of the initial actor.
  std::string model_dir;
  torch::Device device = torch::kCPU;
  // Unset: bfloat16 on CUDA, float32 on the CPU.
  std::optional<torch::ScalarType> dtype;
  // The resolved configuration. Read: algorithm, train, data (num_rollout, rollout_batch_size,
  // n_samples_per_prompt for the LR schedule length), checkpoint (ref_load, ref_ckpt_step,
  // keep_last, no_save_optim, no_load_optim), weight_sync.interval (keep_old_actor).
  config::Config config;
  // Where the reference weights come from when a reference is needed (use_kl_loss or
  // kl_coef != 0): a trainer checkpoint (its <save> dir or an iteration dir) or an HF
  // directory. Unset: config.checkpoint.ref_load, else model_dir (the initial actor).
  std::optional<std::string> ref_model_dir;
  // ppo: the critic's initial weights (CriticOptions::model_dir). Unset:
  // config.checkpoint.critic_load, else model_dir (the actor's weights, a new value head).
  std::optional<std::string> critic_model_dir;
  // Optimizer steps of the whole run for the LR schedule. Unset: slime's TrainIters from
  // data.num_rollout, data.rollout_batch_size, data.n_samples_per_prompt and
  // train.global_batch_size (an error names data.num_rollout when it is unset).
  std::optional<int64_t> train_iters;
  // What Load does when the checkpoint's LR schedule differs from the configured one.
  LrStateMismatch lr_state_mismatch = LrStateMismatch::kError;
  // Data-parallel seam. dp_all_reduce sums a tensor element-wise over the DP group, in place
  // (gradients on the model's device, small float64 tensors for statistics and metrics);
  // required when dp_size > 1. dp_reduce_scatter and dp_all_gather (optimizer.h's
  // DpReduceScatterSumFn / DpAllGatherFn, 1-D tensors on the model's device) are required when
  // dp_size > 1 and train.use_distributed_optimizer is set.
  int dp_size = 1;
  int dp_rank = 0;
  AllReduceSumFn dp_all_reduce;
  // dp_all_reduce posted without waiting (grad_reducer.h's AsyncAllReduceSumFn, e.g.
  // comm::ProcessGroup::AllReduceSumAsync): required when dp_size > 1 and
  // train.overlap_grad_reduce is set without train.use_distributed_optimizer.
  AsyncAllReduceSumFn dp_all_reduce_async;
  std::function<Status(const torch::Tensor& input, torch::Tensor& output)> dp_reduce_scatter;
  std::function<Status(const torch::Tensor& input, torch::Tensor& output)> dp_all_gather;
  // Tensor parallelism (header comment, "Tensor parallelism"): this trainer is TP rank
  // tp_group->rank() of tp_group->size(). The model loads that rank's shard; the group runs the
  // parallel layers' collectives and the gradient-norm reduction, so it must outlive the
  // trainer. Unset: one rank (model::SingleRankGroup). The DP group above is then the ranks
  // with the same TP rank.
  std::shared_ptr<model::TensorParallelGroup> tp_group;
  // Pipeline parallelism (header comment, "Pipeline parallelism"): this trainer is stage
  // pp_group->rank() of pp_group->size() (comm::ProcessGroupPipelineParallel over the ranks
  // that share a DP index, and at TP > 1 a TP index). It must outlive the trainer. Unset: one
  // stage (model::SinglePipelineStage). config.train.pipeline_model_parallel_size must be 1 or
  // the group's size. The DP group above is then the ranks of the same stage (and TP rank), the
  // TP group the ranks of the same stage and DP index.
  std::shared_ptr<model::PipelineParallelGroup> pp_group;
  // Expert parallelism (header comment, "Expert parallelism"): this trainer is EP rank
  // ep_group->rank() of ep_group->size() = config.train.expert_model_parallel_size
  // (comm::ProcessGroupExpertParallel over the DP ranks of one EP block: the ranks of the same
  // stage and TP rank with DP ranks b·EP .. b·EP + EP - 1). It must outlive the trainer. Unset or
  // size 1: every expert here. ep_all_reduce sums over that group (the gradient norm's expert
  // part); edp_all_reduce over the expert-data-parallel group of edp_size = dp_size / EP ranks
  // (the DP ranks with this EP rank), which sums the expert gradients (required when
  // edp_size > 1).
  std::shared_ptr<model::ExpertParallelGroup> ep_group;
  AllReduceSumFn ep_all_reduce;
  int edp_size = 1;
  AllReduceSumFn edp_all_reduce;
};

class Trainer {
 public:
  // Loads the model (DecoderModel::Load) in the chosen dtype on the device, makes the trainable
  // parameters require grad, builds AdamW (AdamWOptions::FromTrainConfig) and the LR schedule,
  // and loads the CPU copies the configuration needs: ref (see ref_model_dir), teacher
  // (algorithm.opd_teacher_load, opd_teacher_ckpt_step), old_actor (= the initial actor, with
  // keep_old_actor), and the critic with ppo. Errors name the option or file: unsupported
  // settings (custom_loss, routing replay, policy_loss without compute_advantages_and_returns),
  // invalid loss or batching options, a teacher or reference whose parameters differ from the
  // actor's.
  static StatusOr<std::unique_ptr<Trainer>> Create(TrainerOptions options);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // OK, or InvalidArgument naming the sample and field: empty batch, temperature not finite
  // and > 0, tokens.size() != prompt_length + response_length, loss_mask /
  // rollout_log_probs / teacher_log_probs of the wrong length or missing where the config
  // needs them, a token id outside [0, vocab_size), a loss mask value other than 0/1, a
  // non-finite reward, a response without a prompt token.
  Status CheckBatch(const data::RolloutBatch& batch) const;

  // Forward-only log-probs (and entropy) of every sample's response tokens under `which`
  // (FailedPrecondition when this trainer keeps no such copy), micro-batched as one training
  // step over the whole batch would be.
  StatusOr<SampleLogProbs> ComputeLogProbs(const data::RolloutBatch& batch,
                                           PolicyWeights which = PolicyWeights::kActor,
                                           bool with_entropy = false);

  // Trains on one rollout (the order in the header comment). With loss_type "sft_loss" the
  // steps use the SFT loss and steps 1–4 are skipped.
  StatusOr<TrainRolloutResult> TrainRollout(int64_t rollout_id, const data::RolloutBatch& batch);

  // One optimizer step of the SFT loss (−Reduce(log p) over the loss-masked tokens; per-token
  // or per-rollout reduction as train.calculate_per_token_loss says) over every sample of the
  // batch, micro-batched like a training step. global_batch_size does not apply: the batch is
  // the step.
  StatusOr<TrainStepMetrics> SftStep(const data::RolloutBatch& batch);

  // The keep_old_actor queue, to call after the actor's weights were pushed to the engines:
  // with weight_sync.interval == 1, old_actor ← rollout_actor and rollout_actor ← actor (the
  // data of the next rollout comes from the weights pushed one sync earlier); otherwise
  // old_actor ← actor. No-op without keep_old_actor.
  Status OnWeightsSynced();

  // At TP > 1 Save and Load must run on every rank of the TP group (see "Tensor parallelism"),
  // at PP > 1 on every stage of the pipeline (stage 0 writes and returns the directory, the
  // others return it too once stage 0 reported success); at both, on every rank of the stages'
  // TP groups (TP rank 0 of stage 0 writes).
  // Saves a checkpoint (checkpoint.h) at iteration `rollout_id` under `save_dir`: model,
  // optimizer (unless checkpoint.no_save_optim), RNG, the step counter, the LR scheduler state
  // and `extra_state_json` (a JSON object, e.g. the data source's state); keeps the newest
  // checkpoint.keep_last. Returns the iteration directory. With the distributed optimizer over
  // dp_size > 1 ranks Save is collective: every DP rank calls it (the shards are gathered into
  // the full per-parameter state first, for the actor and then the critic, before anything is
  // written); DP rank 0 writes and returns the directory, the others return "". Otherwise the
  // caller picks one rank to save (the ranks' states are identical).
  //
  // Background saves (checkpoint.async_save, or mode kBackground): the same collectives run
  // inside Save (the DP, TP and PP gathers, the outcome shared with the writer's peers), then
  // the writing rank copies what it writes to host memory and queues the files on its
  // background writer (checkpoint.h, checkpoint_writer.h) instead of writing them; Save returns
  // the directory the write will publish. Every Save, background or not, first waits for the
  // writes queued by earlier ones (checkpoints are published in order); a failure of those
  // becomes this Save's error on the writing rank and, through the shared outcome, on every rank
  // that takes part — this save is then not written. WaitForSave waits without saving.
  enum class SaveMode {
    kAsConfigured,  // checkpoint.async_save says
    kSynchronous,
    kBackground,
  };
  StatusOr<std::string> Save(const std::string& save_dir, int64_t rollout_id,
                             const std::string& extra_state_json = "{}",
                             SaveMode mode = SaveMode::kAsConfigured);
  // Waits for the background writes of earlier Saves (none: returns at once); their first
  // failure (the message names the iteration directory), reported once.
  Status WaitForSave();
  // Of the last Save or WaitForSave: seconds spent waiting for earlier background writes, and
  // the seconds those writes took on the writer's thread (0 when there were none).
  struct BackgroundSaveTimes {
    double wait_seconds = 0;
    double write_seconds = 0;
  };
  BackgroundSaveTimes last_background_save() const;
  // Loads a checkpoint (a <save> dir — the tracker's iteration or ckpt_step — or an iteration
  // dir) into the model, optimizer (unless checkpoint.no_load_optim) and RNG, and restores the
  // step counter and the LR scheduler. With keep_old_actor the old-actor copies become the
  // loaded weights (slime loads old_actor from --load). On error nothing was changed, except
  // when the LR state alone is rejected after the weights were loaded (then the error says so).
  StatusOr<LoadedTrainerState> Load(const std::string& load_dir,
                                    std::optional<int64_t> ckpt_step = std::nullopt);

  // Weight export (weight sync, HF directories written for the engines): the actor's
  // parameters as full, unsharded HF tensors, one at a time, so at most one gathered tensor
  // per call is alive. FullParameterShapes() lists them in model::NamedParameters order (=
  // model::ParameterSpecs order) as tensors on the meta device (name, full shape, the model's
  // dtype; no storage). FullParameter(i) is parameter i's values on the model's device: at
  // TP = 1 the parameter itself (detached, no copy); at TP > 1 a collective of the TP group —
  // an all-gather of the shards for a sharded parameter, nothing for a replicated one — so
  // every TP rank must call it with the same indices in the same order (the ranks that only
  // take part drop the result). The same gather as Save's at TP > 1. At PP > 1 it is a
  // collective of the pipeline group too: the stage that owns parameter i (its layer's stage;
  // stage 0 for the embedding — a tied LM head copy on the last stage is never sent — the last
  // stage for the final norm and lm_head) sends it to stage 0, which returns it; the owner
  // returns its own tensor and the other stages an undefined one. Every stage must call it with
  // the same indices in the same order (workers/workers.h: the weight sync's exporters).
  std::vector<model::NamedTensor> FullParameterShapes() const;
  StatusOr<torch::Tensor> FullParameter(size_t index);

  // Mutable access marks the CPU backup of the actor stale (the caller may change the weights in
  // place, e.g. a weight load); the next swap backs the actor up again.
  model::DecoderModel& model();
  const model::DecoderModel& model() const { return *model_; }
  const AdamW& optimizer() const { return *optimizer_; }
  const LrScheduler& lr_scheduler() const { return lr_scheduler_; }
  int64_t step() const { return step_; }
  // The PPO critic; nullptr unless advantage_estimator is "ppo".
  const Critic* critic() const;
  bool has_weights(PolicyWeights which) const;
  // True when TrainRollout skips the old-actor pass for a rollout of `num_steps` optimizer
  // steps (slime's can_reuse_log_probs_in_loss; header comment, step 3).
  bool SkipsOldLogProbs(int64_t num_steps) const;

 private:
  struct Impl;
  Trainer(TrainerOptions options, std::unique_ptr<model::DecoderModel> model,
          std::unique_ptr<AdamW> optimizer, LrScheduler lr_scheduler);
  // PP > 1 with tied embeddings: the first and the last stage sum their two gradients of the
  // table (header comment, "Pipeline parallelism"). No-op otherwise.
  Status SyncTiedEmbeddingGrads();
  // Runs `fn` with `which`'s weights swapped into the model, then restores the actor.
  Status WithPolicyWeights(PolicyWeights which, const std::function<Status()>& fn);

  // TrainRollout's steps (trainer.cc). Steps 1–4: the reference / teacher / old-actor passes
  // over `micro_batches`, the critic's values and the advantages of this rank's samples `local`
  // into `tensors`; their rollout-side means into `rollout_values`.
  Status PrepareAdvantages(const data::RolloutBatch& batch,
                           const std::vector<const MicroBatch*>& micro_batches,
                           const std::vector<int64_t>& local, int64_t num_steps,
                           SampleTensors& tensors, std::map<std::string, double>& rollout_values);
  // Step 6: the reference weights become the actor's every ref_update_interval rollouts.
  Status FollowActorWithReference(int64_t rollout_id);

  // One optimizer step of `loss` over this rank's micro-batches of `step` (trainer_step.cc).
  StatusOr<TrainStepMetrics> RunStep(int64_t rollout_id, int64_t step_in_rollout, int64_t num_steps,
                                     const LossTypeSpec& loss, const data::RolloutBatch& batch,
                                     const std::vector<int64_t>& rollout_ids,
                                     const StepSchedule& step, const SampleTensors& tensors);
  // RunStep's steps. The forward and backward passes of every micro-batch (the pipeline
  // schedule), the loss metrics summed into `sums`; true when the last backward pass armed the
  // overlapped gradient reducer.
  StatusOr<bool> ForwardBackward(const LossTypeSpec& loss, const data::RolloutBatch& batch,
                                 const std::vector<MicroBatch>& micro_batches,
                                 const std::vector<LossReducer>& reducers,
                                 const SampleTensors& tensors,
                                 std::map<std::string, torch::Tensor>& sums);
  // The gradients and `sums` summed over the DP group, as the optimizer and the overlapped
  // reducer need.
  Status ReduceOverDataParallel(bool overlap_armed, std::map<std::string, torch::Tensor>& sums);
  // AdamW, the step counter and the LR schedule; grad_norm and lr join `metrics`.
  Status ApplyOptimizerStep(int64_t num_steps, TrainStepMetrics& metrics);

  // Routing replay (src/train/routing_replay.h). The engine's routing of `batch`'s samples
  // into the Impl (a sparse model only; errors name the sample), the recorded one cleared.
  Status PrepareRouting(const data::RolloutBatch& batch);
  // The hooks of a forward-only pass with `which` weights (`old_pass`: the old-log-prob pass):
  // replay the engine's routing (R3, not for the teacher) or record it (use_routing_replay).
  internal::ForwardHooks PassRoutingHooks(PolicyWeights which, bool old_pass,
                                          const data::RolloutBatch& batch);
  // The hooks of the training forwards: replay (R3 or the recorded routing) or, with
  // rollout.return_routed_experts alone, the routing agreement counts into `sums`.
  internal::ForwardHooks TrainingRoutingHooks(const data::RolloutBatch& batch,
                                              std::map<std::string, torch::Tensor>& sums);

  TrainerOptions options_;
  std::unique_ptr<model::DecoderModel> model_;
  std::unique_ptr<AdamW> optimizer_;
  LrScheduler lr_scheduler_;
  std::unique_ptr<Impl> impl_;  // weight copies, parsed options, schedules
  int64_t step_ = 0;
};

}  // namespace slime::train

#endif  // SLIME_TRAIN_TRAINER_H_
