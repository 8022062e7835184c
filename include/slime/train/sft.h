// Supervised fine-tuning on a JSONL of chat conversations (`slime_train sft`): the SFT dataset
// (data/sft_dataset.h: chat template, per-token loss masks per message) fed to the Trainer's SFT
// step (trainer.h) epoch after epoch, with progress lines, a JSONL metrics log, checkpoints
// (trainer checkpoints, resumable at the exact sample) and an optional HF export at the end.
// Used to warm-start the tiny demo model of the end-to-end RL run.
//
// One step = `batch_size` samples drawn from a seeded EpochSampler; the loss is slime's SFT loss
// (−mean of the masked log-probs, per sample then over the batch, or per token with
// per_token_loss), AdamW with the configured LR schedule over `epochs` × ceil(N / batch_size)
// steps (or max_steps). Resume (`load`) restores model, optimizer, RNG, LR schedule and the
// sampler position saved in the checkpoint, so the next step is the one an uninterrupted run
// would have taken.
#ifndef SLIME_TRAIN_SFT_H_
#define SLIME_TRAIN_SFT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "slime/common/status.h"

namespace slime::train {

struct SftOptions {
  std::string model_dir;      // HF model directory (config.json + safetensors)
  std::string tokenizer_dir;  // default: model_dir
  std::string data_path;      // JSONL, one conversation per line ({"messages": [...]})
  std::string messages_key = "messages";
  int64_t max_length = 0;     // tokens per sample, longer ones truncated; 0 = no limit
  std::string device = "auto";  // auto (cuda when available) | cpu | cuda | cuda:N
  std::string dtype = "auto";   // auto (bf16 on CUDA, fp32 on CPU) | bf16 | fp32
  int64_t epochs = 1;
  std::optional<int64_t> max_steps;  // stop after this many steps (the LR schedule's length)
  int64_t batch_size = 8;            // samples per optimizer step
  int64_t micro_batch_size = 1;      // samples per micro-batch (fixed), unless max_tokens is set
  std::optional<int64_t> max_tokens_per_micro_batch;  // dynamic packing cap
  double lr = 1e-5;
  double min_lr = 0.0;
  std::string lr_decay_style = "cosine";  // constant | linear | cosine
  int64_t warmup_steps = 0;
  double weight_decay = 0.0;
  double clip_grad = 1.0;
  bool per_token_loss = false;
  uint64_t seed = 1234;
  bool shuffle = true;
  std::string save_dir;             // checkpoints (<save>/iter_NNNNNNN, the iteration = step)
  int64_t save_interval = 0;        // steps between checkpoints; 0 = only at the end
  int keep_last = 0;
  std::string load_dir;             // resume from a checkpoint written by a previous run
  std::string save_hf;              // HF export of the final weights (with the tokenizer files)
  std::string metrics_jsonl;        // one JSON line per step
};

struct SftStepLog {
  int64_t step = 0;  // 1-based
  int64_t epoch = 0;
  double loss = 0, grad_norm = 0, lr = 0;
  int64_t tokens = 0, trained_tokens = 0;
  bool skipped = false;
};

struct SftResult {
  std::vector<SftStepLog> steps;  // the steps this run took
  std::string last_checkpoint;    // iteration directory, or empty
};

// Runs the fine-tuning. Errors name the option or file (bad data line, missing model, bad
// checkpoint, ...). Progress goes to stdout (one line per step) and spdlog.
StatusOr<SftResult> RunSft(const SftOptions& options);

}  // namespace slime::train

#endif  // SLIME_TRAIN_SFT_H_
