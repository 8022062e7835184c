// Learning-rate schedule with the semantics of Megatron's OptimizerParamScheduler as slime
// drives it. Pure arithmetic, no LibTorch.
//
// Units. Megatron counts scheduler steps in *samples*: every successful optimizer step advances
// the scheduler by the step's global batch size (slime passes the samples of the step), and the
// iteration-valued flags are multiplied by global_batch_size:
//   decay_steps  = (lr_decay_iters, default train_iters) × global_batch_size
//   warmup_steps = lr_warmup_fraction × decay_steps        if lr_warmup_fraction is set
//                  lr_warmup_iters × global_batch_size     otherwise
//   train_iters  = num_rollout × rollout_batch_size × n_samples_per_prompt / global_batch_size
//                  (slime, integer division; see TrainIters)
//
// LR at num_steps = s (LearningRate), with max = lr, min = min_lr, init = lr_warmup_init:
//   warmup_steps > 0 and s <= warmup_steps:  init + (max - init) · s / warmup_steps
//   constant:                                max
//   s > decay_steps:                         min
//   otherwise, r = (s - warmup_steps) / (decay_steps - warmup_steps) in [0, 1]:
//     linear  min + (max - min) · (1 - r)
//     cosine  min + (max - min) · 0.5 · (cos(π r) + 1)
// (The warmup test comes first, so a constant schedule still warms up.)
//
// Use: the optimizer step k uses lr() read before it; after a *successful* step (not one skipped
// for a non-finite gradient) call Step(samples of the step). A fresh scheduler is at 0, so the
// first step uses init when there is warmup, else max.
//
// Thread-safety: LrScheduler is a plain value owned by the trainer thread; the free functions
// are pure.
#ifndef SLIME_TRAIN_LR_SCHEDULE_H_
#define SLIME_TRAIN_LR_SCHEDULE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "slime/common/status.h"

namespace slime::train {

enum class LrDecayStyle { kConstant, kLinear, kCosine };

// "constant", "linear", "cosine" (the values of train.lr_decay_style); InvalidArgument listing
// them otherwise.
StatusOr<LrDecayStyle> ParseLrDecayStyle(std::string_view name);
std::string_view LrDecayStyleName(LrDecayStyle style);

// A resolved schedule, steps in samples.
struct LrSchedule {
  double max_lr = 1e-6;
  double min_lr = 0.0;
  double init_lr = 0.0;       // lr at step 0 of the warmup (lr_warmup_init)
  double warmup_steps = 0.0;  // may be fractional (lr_warmup_fraction × decay_steps)
  int64_t decay_steps = 1;
  LrDecayStyle decay_style = LrDecayStyle::kLinear;
};

// Megatron's constructor checks: 0 <= min_lr <= max_lr, init_lr <= max_lr, decay_steps > 0,
// 0 <= warmup_steps < decay_steps. InvalidArgument naming the value otherwise.
Status ValidateLrSchedule(const LrSchedule& schedule);

// The train.* fields the schedule derives from, plus the run length.
struct LrScheduleConfig {
  double lr = 1e-6;
  double min_lr = 0.0;
  std::string lr_decay_style = "linear";
  std::optional<int64_t> lr_decay_iters;  // unset: train_iters
  int64_t lr_warmup_iters = 0;
  std::optional<double> lr_warmup_fraction;  // wins over lr_warmup_iters
  double lr_warmup_init = 0.0;
  int64_t train_iters = 1;        // optimizer steps of the whole run (TrainIters)
  int64_t global_batch_size = 1;  // samples per optimizer step
};

// slime's train_iters: num_rollout × rollout_batch_size × n_samples_per_prompt /
// global_batch_size (integer division).
int64_t TrainIters(int64_t num_rollout, int64_t rollout_batch_size, int64_t n_samples_per_prompt,
                   int64_t global_batch_size);

// Resolves and validates a schedule (units in the file comment).
StatusOr<LrSchedule> MakeLrSchedule(const LrScheduleConfig& config);

// The learning rate after `num_steps` samples of training (formula in the file comment).
// REQUIRES: ValidateLrSchedule(schedule).ok(), num_steps >= 0.
double LearningRate(const LrSchedule& schedule, int64_t num_steps);

// The checkpointed state of a scheduler: num_steps plus the schedule it ran with, so a resume
// can tell whether the configuration changed. Every field is a JSON number or string.
struct LrSchedulerState {
  int64_t num_steps = 0;
  double max_lr = 0.0;
  double min_lr = 0.0;
  double init_lr = 0.0;
  double warmup_steps = 0.0;
  int64_t decay_steps = 0;
  std::string decay_style;  // LrDecayStyleName
};

// What LoadState does when the checkpoint's schedule differs from the configured one
// (Megatron: default error; --override-opt-param-scheduler keeps the configured one;
// --use-checkpoint-opt-param-scheduler takes the checkpoint's).
enum class LrStateMismatch { kError, kUseConfigured, kUseCheckpoint };

class LrScheduler {
 public:
  // REQUIRES: ValidateLrSchedule(schedule).ok().
  explicit LrScheduler(const LrSchedule& schedule);

  // The learning rate for the next optimizer step.
  double lr() const { return LearningRate(schedule_, num_steps_); }
  int64_t num_steps() const { return num_steps_; }
  const LrSchedule& schedule() const { return schedule_; }

  // Advances by `increment` samples (>= 0) after a successful optimizer step.
  void Step(int64_t increment);

  LrSchedulerState State() const;
  // Restores num_steps (and, with kUseCheckpoint, the schedule) from a checkpoint.
  // InvalidArgument for a malformed state (negative num_steps, unknown decay style, invalid
  // schedule); FailedPrecondition naming every differing field under kError.
  Status LoadState(const LrSchedulerState& state,
                   LrStateMismatch on_mismatch = LrStateMismatch::kError);

 private:
  LrSchedule schedule_;
  int64_t num_steps_ = 0;
};

}  // namespace slime::train

#endif  // SLIME_TRAIN_LR_SCHEDULE_H_
