// `slime_train sft` (see include/slime/app/sft.h).
#include "slime/app/sft.h"

#include <CLI/CLI.hpp>

#include <iostream>

#include "slime/app/cli.h"
#include "slime/common/logging.h"

namespace slime::app {

void AddSftOptions(CLI::App* app, train::SftOptions* o) {
  app->add_option("--model", o->model_dir, "HF model directory to fine-tune")->required();
  app->add_option("--data", o->data_path, "JSONL of conversations ({\"messages\": [...]})")
      ->required();
  app->add_option("--tokenizer", o->tokenizer_dir, "Tokenizer directory (default: --model)");
  app->add_option("--messages-key", o->messages_key, "Key of the message list in each line");
  app->add_option("--max-length", o->max_length, "Truncate samples to this many tokens (0 = off)");
  app->add_option("--device", o->device, "auto | cpu | cuda | cuda:N");
  app->add_option("--dtype", o->dtype, "auto (bf16 on CUDA, fp32 on CPU) | bf16 | fp32");
  app->add_option("--epochs", o->epochs, "Passes over the data");
  app->add_option("--max-steps", o->max_steps, "Stop after this many optimizer steps");
  app->add_option("--batch-size", o->batch_size, "Samples per optimizer step");
  app->add_option("--micro-batch-size", o->micro_batch_size, "Samples per micro-batch");
  app->add_option("--max-tokens-per-micro-batch", o->max_tokens_per_micro_batch,
                  "Pack micro-batches up to this many tokens instead");
  app->add_option("--lr", o->lr, "Peak learning rate");
  app->add_option("--min-lr", o->min_lr, "Learning rate at the end of the decay");
  app->add_option("--lr-decay-style", o->lr_decay_style, "constant | linear | cosine");
  app->add_option("--warmup-steps", o->warmup_steps, "Linear warmup steps");
  app->add_option("--weight-decay", o->weight_decay, "AdamW weight decay");
  app->add_option("--clip-grad", o->clip_grad, "Gradient clipping by global norm (0 = off)");
  app->add_flag("--per-token-loss", o->per_token_loss,
                "Average over all trained tokens of the step instead of per sample");
  app->add_option("--seed", o->seed, "Seed of the shuffle and of the model's RNG");
  app->add_flag("!--no-shuffle", o->shuffle, "Keep the file order");
  app->add_option("--save", o->save_dir, "Checkpoint directory");
  app->add_option("--save-interval", o->save_interval, "Steps between checkpoints (0 = at the end)");
  app->add_option("--keep-last", o->keep_last, "Checkpoints kept (0 = all)");
  app->add_option("--load", o->load_dir, "Resume from this checkpoint");
  app->add_option("--save-hf", o->save_hf, "Export the final weights as an HF directory");
  app->add_option("--metrics-jsonl", o->metrics_jsonl, "Append one JSON line per step here");
}

int RunSftCommand(const train::SftOptions& o) {
  if (Status s = InitLogging({.role = "sft"}); !s.ok()) {
    std::cerr << "slime_train sft: error: " << s.message() << "\n";
    return kExitUsage;
  }
  StatusOr<train::SftResult> r = train::RunSft(o);
  if (!r.ok()) {
    std::cerr << "slime_train sft: error: " << r.status().message() << "\n";
    const absl::StatusCode code = r.status().code();
    return code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kNotFound ||
                   code == absl::StatusCode::kAlreadyExists ||
                   code == absl::StatusCode::kFailedPrecondition
               ? kExitUsage
               : kExitFailure;
  }
  return kExitOk;
}

}  // namespace slime::app
