// Learning-rate schedule (see include/slime/train/lr_schedule.h).
#include "slime/train/lr_schedule.h"

#include <fmt/format.h>

#include <cmath>
#include <numbers>
#include <vector>

#include "slime/common/check.h"

namespace slime::train {

StatusOr<LrDecayStyle> ParseLrDecayStyle(std::string_view name) {
  if (name == "constant") return LrDecayStyle::kConstant;
  if (name == "linear") return LrDecayStyle::kLinear;
  if (name == "cosine") return LrDecayStyle::kCosine;
  return absl::InvalidArgumentError(
      fmt::format("lr_decay_style '{}' is not supported; valid: constant, linear, cosine", name));
}

std::string_view LrDecayStyleName(LrDecayStyle style) {
  switch (style) {
    case LrDecayStyle::kConstant:
      return "constant";
    case LrDecayStyle::kLinear:
      return "linear";
    case LrDecayStyle::kCosine:
      return "cosine";
  }
  return "unknown";
}

Status ValidateLrSchedule(const LrSchedule& s) {
  auto bad = [](const std::string& msg) { return absl::InvalidArgumentError(msg); };
  if (!std::isfinite(s.max_lr) || !std::isfinite(s.min_lr) || !std::isfinite(s.init_lr) ||
      !std::isfinite(s.warmup_steps)) {
    return bad("learning-rate schedule values must be finite");
  }
  if (s.min_lr < 0) return bad(fmt::format("min_lr must be >= 0, got {}", s.min_lr));
  if (s.max_lr < s.min_lr) {
    return bad(fmt::format("lr ({}) must be >= min_lr ({})", s.max_lr, s.min_lr));
  }
  if (s.init_lr < 0 || s.init_lr > s.max_lr) {
    return bad(fmt::format("lr_warmup_init ({}) must be in [0, lr = {}]", s.init_lr, s.max_lr));
  }
  if (s.decay_steps <= 0) {
    return bad(fmt::format("lr decay steps must be > 0, got {} samples", s.decay_steps));
  }
  if (s.warmup_steps < 0 || s.warmup_steps >= static_cast<double>(s.decay_steps)) {
    return bad(
        fmt::format("lr warmup ({} samples) must be shorter than the decay ({} samples); lower "
                    "lr_warmup_iters / lr_warmup_fraction or raise lr_decay_iters",
                    s.warmup_steps, s.decay_steps));
  }
  return absl::OkStatus();
}

int64_t TrainIters(int64_t num_rollout, int64_t rollout_batch_size, int64_t n_samples_per_prompt,
                   int64_t global_batch_size) {
  SLIME_CHECK(global_batch_size >= 1, "global_batch_size {}", global_batch_size);
  return num_rollout * rollout_batch_size * n_samples_per_prompt / global_batch_size;
}

StatusOr<LrSchedule> MakeLrSchedule(const LrScheduleConfig& c) {
  if (c.global_batch_size < 1) {
    return absl::InvalidArgumentError(
        fmt::format("global_batch_size must be >= 1, got {}", c.global_batch_size));
  }
  if (c.train_iters < 1 && !c.lr_decay_iters) {
    return absl::InvalidArgumentError(fmt::format(
        "the run has {} optimizer steps (train_iters); the lr schedule needs at least one or "
        "an explicit lr_decay_iters",
        c.train_iters));
  }
  if (c.lr_warmup_iters < 0) {
    return absl::InvalidArgumentError(
        fmt::format("lr_warmup_iters must be >= 0, got {}", c.lr_warmup_iters));
  }
  LrSchedule s;
  SLIME_ASSIGN_OR_RETURN(s.decay_style, ParseLrDecayStyle(c.lr_decay_style));
  s.max_lr = c.lr;
  s.min_lr = c.min_lr;
  s.init_lr = c.lr_warmup_init;
  s.decay_steps = c.lr_decay_iters.value_or(c.train_iters) * c.global_batch_size;
  s.warmup_steps = c.lr_warmup_fraction
                       ? *c.lr_warmup_fraction * static_cast<double>(s.decay_steps)
                       : static_cast<double>(c.lr_warmup_iters * c.global_batch_size);
  SLIME_RETURN_IF_ERROR(ValidateLrSchedule(s));
  return s;
}

double LearningRate(const LrSchedule& s, int64_t num_steps) {
  const auto steps = static_cast<double>(num_steps);
  if (s.warmup_steps > 0 && steps <= s.warmup_steps) {
    return s.init_lr + (s.max_lr - s.init_lr) * steps / s.warmup_steps;
  }
  if (s.decay_style == LrDecayStyle::kConstant) return s.max_lr;
  if (num_steps > s.decay_steps) return s.min_lr;
  const double ratio =
      (steps - s.warmup_steps) / (static_cast<double>(s.decay_steps) - s.warmup_steps);
  SLIME_CHECK(ratio >= 0.0 && ratio <= 1.0, "decay ratio {} at step {}", ratio, num_steps);
  double coeff = 0.0;
  switch (s.decay_style) {
    case LrDecayStyle::kLinear:
      coeff = 1.0 - ratio;
      break;
    case LrDecayStyle::kCosine:
      coeff = 0.5 * (std::cos(std::numbers::pi * ratio) + 1.0);
      break;
    case LrDecayStyle::kConstant:
      coeff = 1.0;
      break;
  }
  return s.min_lr + coeff * (s.max_lr - s.min_lr);
}

LrScheduler::LrScheduler(const LrSchedule& schedule) : schedule_(schedule) {
  const Status valid = ValidateLrSchedule(schedule_);
  SLIME_CHECK(valid.ok(), "{}", valid.ToString());
}

void LrScheduler::Step(int64_t increment) {
  SLIME_CHECK(increment >= 0, "lr scheduler increment {}", increment);
  num_steps_ += increment;
}

LrSchedulerState LrScheduler::State() const {
  LrSchedulerState st;
  st.num_steps = num_steps_;
  st.max_lr = schedule_.max_lr;
  st.min_lr = schedule_.min_lr;
  st.init_lr = schedule_.init_lr;
  st.warmup_steps = schedule_.warmup_steps;
  st.decay_steps = schedule_.decay_steps;
  st.decay_style = std::string(LrDecayStyleName(schedule_.decay_style));
  return st;
}

Status LrScheduler::LoadState(const LrSchedulerState& st, LrStateMismatch on_mismatch) {
  if (st.num_steps < 0) {
    return absl::InvalidArgumentError(
        fmt::format("lr scheduler state: num_steps must be >= 0, got {}", st.num_steps));
  }
  LrSchedule saved;
  saved.max_lr = st.max_lr;
  saved.min_lr = st.min_lr;
  saved.init_lr = st.init_lr;
  saved.warmup_steps = st.warmup_steps;
  saved.decay_steps = st.decay_steps;
  auto style = ParseLrDecayStyle(st.decay_style);
  if (!style.ok()) {
    return absl::InvalidArgumentError(
        fmt::format("lr scheduler state: {}", std::string(style.status().message())));
  }
  saved.decay_style = *style;
  if (Status valid = ValidateLrSchedule(saved); !valid.ok()) {
    return absl::InvalidArgumentError(
        fmt::format("lr scheduler state: {}", std::string(valid.message())));
  }
  std::vector<std::string> diffs;
  auto compare = [&](const char* name, auto configured, auto checkpoint) {
    if (configured != checkpoint) {
      diffs.push_back(
          fmt::format("{}: configured {}, checkpoint {}", name, configured, checkpoint));
    }
  };
  compare("max_lr", schedule_.max_lr, saved.max_lr);
  compare("min_lr", schedule_.min_lr, saved.min_lr);
  compare("init_lr", schedule_.init_lr, saved.init_lr);
  compare("warmup_steps", schedule_.warmup_steps, saved.warmup_steps);
  compare("decay_steps", schedule_.decay_steps, saved.decay_steps);
  compare("decay_style", LrDecayStyleName(schedule_.decay_style),
          LrDecayStyleName(saved.decay_style));
  if (!diffs.empty()) {
    switch (on_mismatch) {
      case LrStateMismatch::kError: {
        std::string all;
        for (const auto& d : diffs) all += (all.empty() ? "" : "; ") + d;
        return absl::FailedPreconditionError(fmt::format(
            "the checkpoint's lr schedule differs from the configured one ({}); keep the "
            "configuration of the run being resumed",
            all));
      }
      case LrStateMismatch::kUseConfigured:
        break;
      case LrStateMismatch::kUseCheckpoint:
        schedule_ = saved;
        break;
    }
  }
  num_steps_ = st.num_steps;
  return absl::OkStatus();
}

}  // namespace slime::train
