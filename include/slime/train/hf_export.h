// HF export of trainer checkpoints (`slime_train convert`): a checkpoint -> an HF model directory
// (safetensors + config.json + tokenizer files) that the engine (`slime_train serve --model DIR`)
// and HF transformers load.
//
// `from` is a checkpoint <save> directory (the tracker, or ckpt_step, picks the iteration) or one
// iteration directory. The weights are loaded and verified against the saved config first
// (shapes, dtypes, every parameter present; an error names the file), optionally cast to
// `dtype`, and written into a temporary sibling of `to_hf` that is renamed into place when
// complete, so `to_hf` is never half-written; an existing non-empty `to_hf` is refused.
// Tokenizer files (tokenizer.json, tokenizer_config.json, special_tokens_map.json,
// generation_config.json) are copied from `tokenizer`, else from the checkpoint directory when it
// has them; without any, the output has weights only and a warning says so.
// Checkpoints always hold full tensors (a TP > 1 Trainer gathers before saving: trainer.h).
#ifndef SLIME_TRAIN_HF_EXPORT_H_
#define SLIME_TRAIN_HF_EXPORT_H_

#include <cstdint>
#include <optional>
#include <string>

#include "slime/common/status.h"

namespace slime::train {

struct HfExportOptions {
  std::string from;
  std::optional<int64_t> ckpt_step;
  std::string to_hf;
  std::string tokenizer;       // directory with tokenizer files; empty = from the checkpoint
  std::string dtype = "auto";  // auto (as saved) | bf16 | fp16 | fp32
};

// Returns the iteration directory that was read. Errors: NotFound / InvalidArgument for a
// missing or corrupt checkpoint or bad options, AlreadyExists for a non-empty `to_hf`, Internal
// for I/O failures.
StatusOr<std::string> ExportCheckpointToHf(const HfExportOptions& options);

}  // namespace slime::train

#endif  // SLIME_TRAIN_HF_EXPORT_H_
