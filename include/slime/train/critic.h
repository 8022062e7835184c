// Critic: the PPO value model of one replica (advantage_estimator "ppo"; docs/algorithms.md).
//
// Model. The actor's decoder architecture with the LM head replaced by a scalar value head, as
// slime/Megatron build the critic (output_layer → a hidden → 1 linear layer without bias):
//
//   hidden = DecoderModel::ForwardPacked(ids)          [T, hidden]  (after the final norm)
//   V_t    = float32(hidden[p_t] · value_headᵀ)         value_head [1, hidden], model dtype
//
// The value of response token j comes from the row that predicts it (logprobs.h's shift: the
// position before the token), no temperature applied. The decoder's weights come from
// CriticOptions::model_dir (an HF directory or a trainer checkpoint); the value head from that
// checkpoint's extra_weights.safetensors when it has one ("value_head.weight"), else it is
// initialised N(0, 0.02²) (Megatron's init_method_std) from train.seed. The decoder's own LM
// head is never used and is frozen in the critic's optimizer (untied models).
//
// Training. Its own AdamW (train.* optimizer keys, except the LR) and LR schedule
// (train.critic_lr / critic_min_lr, unset = the actor's lr / min_lr; the same warmup, decay and
// length). The Trainer drives it for ppo, in slime's order per rollout: ComputeValues with the
// pre-update critic (these are GAE's V and the value loss's v_old), advantages and returns by
// GAE, then per optimizer step TrainStep on the step's micro-batches with the actor's loss
// reducers (the same denominators), then the actor's step. Value loss: losses.h ValueLoss with
// algorithm.value_clip; metrics value_loss, value_clipfrac (slime's names), reduced like the
// actor's; plus critic_grad_norm and critic_lr.
//
// Checkpoints (checkpoint.h layout): the Trainer saves the critic under <save>/critic/ (its own
// tracker and iter_* directories, same iteration numbers), the value head in
// extra_weights.safetensors, no RNG state (the actor's checkpoint has it).
//
// Data parallelism as the actor's (trainer.h): gradients all-reduced in ddp_bucket_size buckets,
// or with train.use_distributed_optimizer (dp_size > 1) its AdamW is sharded (ZeRO-1).
//
// Thread-safety: one thread (the replica's training thread), like the Trainer. Errors come back
// as Status; nothing throws out of this class.
#ifndef SLIME_TRAIN_CRITIC_H_
#define SLIME_TRAIN_CRITIC_H_

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "slime/common/status.h"
#include "slime/config/config.h"
#include "slime/train/grad_reducer.h"
#include "slime/train/advantages.h"
#include "slime/train/batching.h"
#include "slime/train/lr_schedule.h"

namespace slime::data {
struct RolloutBatch;
}  // namespace slime::data
namespace slime::model {
class DecoderModel;
}  // namespace slime::model

namespace slime::train {

class AdamW;
class AsyncCheckpointWriter;
class LossReducer;

inline constexpr char kValueHeadName[] = "value_head.weight";
inline constexpr char kCriticSubdir[] = "critic";
inline constexpr double kValueHeadInitStd = 0.02;

struct CriticOptions {
  // Initial weights: an HF model directory (value head initialised) or a trainer checkpoint of
  // a critic (a <save> dir — its tracker's iteration — or an iteration dir; value head loaded).
  std::string model_dir;
  torch::Device device = torch::kCPU;
  std::optional<torch::ScalarType> dtype;  // unset: bfloat16 on CUDA, float32 on the CPU
  // Read: train (critic_lr, critic_min_lr, the LR schedule and AdamW keys, log_probs_chunk_size,
  // seed), algorithm.value_clip, data (LR schedule length), checkpoint (keep_last,
  // no_save_optim, no_load_optim).
  config::Config config;
  std::optional<int64_t> train_iters;  // as TrainerOptions::train_iters
  LrStateMismatch lr_state_mismatch = LrStateMismatch::kError;
  int dp_size = 1;  // as TrainerOptions (with train.use_distributed_optimizer, ZeRO-1 too)
  int dp_rank = 0;
  AllReduceSumFn dp_all_reduce;
  AsyncAllReduceSumFn dp_all_reduce_async;  // train.overlap_grad_reduce (as TrainerOptions)
  std::function<Status(const torch::Tensor& input, torch::Tensor& output)> dp_reduce_scatter;
  std::function<Status(const torch::Tensor& input, torch::Tensor& output)> dp_all_gather;
};

// One micro-batch of a critic step: the batch indices packed in order, and the actor's reducer
// of that micro-batch (losses.h: the step's denominators).
struct CriticMicroBatch {
  const std::vector<int64_t>* samples = nullptr;
  const LossReducer* reducer = nullptr;
};

struct CriticStepResult {
  bool skipped = false;                  // non-finite gradient norm (nothing changed)
  std::map<std::string, double> values;  // value_loss, value_clipfrac, critic_grad_norm,
                                         // critic_lr (loss-side values summed over DP ranks)
};

class Critic {
 public:
  // Loads the decoder and the value head (see the header comment), builds the optimizer and the
  // LR schedule. Errors name the option or file.
  static StatusOr<std::unique_ptr<Critic>> Create(CriticOptions options);
  ~Critic();
  Critic(const Critic&) = delete;
  Critic& operator=(const Critic&) = delete;

  // Forward-only values of the samples of `micro_batches` into out[sample] ([R_i] float32 on
  // the model's device, detached). `out` must have one slot per batch sample.
  Status ComputeValues(const data::RolloutBatch& batch,
                       const std::vector<const MicroBatch*>& micro_batches,
                       std::vector<torch::Tensor>& out);

  // One optimizer step of the value loss over this rank's micro-batches of a step: per
  // micro-batch forward with grad → ValueLoss(values, old_values, returns) → backward; the
  // gradients and metrics are summed over the DP group; AdamW with the scheduler's LR; the
  // scheduler advances by `num_samples` (the step's samples over all ranks) unless skipped.
  // old_values and returns are per batch sample ([R_i], defined for every sample used).
  StatusOr<CriticStepResult> TrainStep(const data::RolloutBatch& batch,
                                       const std::vector<CriticMicroBatch>& micro_batches,
                                       const std::vector<torch::Tensor>& old_values,
                                       const std::vector<torch::Tensor>& returns,
                                       int64_t num_samples);

  // Saves at iteration `iteration` under `save_dir` (checkpoint.h; keep_last and no_save_optim
  // from the config, no RNG state). Returns the iteration directory. With the distributed
  // optimizer over dp_size > 1 ranks it is collective like Trainer::Save (the state is gathered
  // before anything is written; DP rank 0 writes, the others return ""). With `background`
  // the writing rank queues the write there (SaveTrainerCheckpointAsync) instead of writing;
  // when `previous` is an error (an earlier background write failed, Trainer::Save) it returns
  // that error instead of writing, after the collectives.
  StatusOr<std::string> Save(const std::string& save_dir, int64_t iteration,
                             AsyncCheckpointWriter* background = nullptr,
                             const Status& previous = absl::OkStatus());
  // Loads a critic checkpoint (a <save> dir with ckpt_step or its tracker, or an iteration dir):
  // decoder, value head, optimizer (unless no_load_optim), step counter and LR scheduler. On
  // error nothing was changed, except when the LR state alone is rejected (the error says so).
  Status Load(const std::string& load_dir, std::optional<int64_t> ckpt_step = std::nullopt);

  const model::DecoderModel& model() const { return *model_; }
  const torch::Tensor& value_head() const { return value_head_; }  // [1, hidden]
  const AdamW& optimizer() const { return *optimizer_; }
  const LrScheduler& lr_scheduler() const { return lr_scheduler_; }
  int64_t step() const { return step_; }
  // Every trained tensor (decoder parameters in NamedParameters order, then the value head).
  std::vector<torch::Tensor> Parameters() const;

 private:
  Critic(CriticOptions options, std::unique_ptr<model::DecoderModel> model,
         torch::Tensor value_head, std::unique_ptr<AdamW> optimizer, LrScheduler lr_scheduler);
  // The tensors of Parameters() the optimizer trains.
  std::vector<torch::Tensor> TrainableParameters() const;
  // Values [T] of one packed micro-batch (with the autograd graph when grad mode is on).
  StatusOr<torch::Tensor> ForwardValues(const data::RolloutBatch& batch,
                                        const std::vector<int64_t>& samples);

  CriticOptions options_;
  std::unique_ptr<model::DecoderModel> model_;
  torch::Tensor value_head_;  // [1, hidden], model dtype, requires grad
  std::unique_ptr<AdamW> optimizer_;
  LrScheduler lr_scheduler_;
  std::unique_ptr<GradReducer> grad_reducer_;  // train.overlap_grad_reduce, when it applies
  int64_t step_ = 0;
};

}  // namespace slime::train

#endif  // SLIME_TRAIN_CRITIC_H_
