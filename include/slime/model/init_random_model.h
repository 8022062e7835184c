// InitRandomModel: writes a complete random-weight HF model directory from a config.json — the
// library side of `slime_train init-model`. Torch-free header.
//
// The output directory gets config.json (the input file's JSON with its dtype field set to the
// chosen dtype; all other keys kept), the weights as safetensors (model.safetensors, or shards
// plus model.safetensors.index.json above max_shard_bytes), and the tokenizer files
// (tokenizer.json required; tokenizer_config.json, special_tokens_map.json and
// generation_config.json when present). Weights follow RandomWeights(): same config + seed +
// dtype => same bytes. The tokenizer's largest token id must fit the config's vocab_size.
//
// `out_dir` must be absent or empty (nothing is overwritten). Files are written atomically.
// Thread-safety: independent calls may run concurrently on different out_dirs.
#ifndef SLIME_MODEL_INIT_RANDOM_MODEL_H_
#define SLIME_MODEL_INIT_RANDOM_MODEL_H_

#include <cstdint>
#include <string>

#include "slime/common/status.h"

namespace slime::model {

struct InitRandomModelOptions {
  std::string config_json_path;  // an HF config.json (or a directory holding one)
  std::string tokenizer_dir;     // holds tokenizer.json
  std::string out_dir;
  uint64_t seed = 0;
  std::string dtype = "bf16";  // "bf16" | "bfloat16" | "fp32" | "float32"
  int64_t max_shard_bytes = int64_t{4} << 30;
};

Status InitRandomModel(const InitRandomModelOptions& options);

// The CLI's shape: `init-model --config C --tokenizer T --out O [--seed N] [--dtype bf16|fp32]`.
Status InitRandomModel(const std::string& config_json_path, const std::string& tokenizer_dir,
                       const std::string& out_dir, uint64_t seed, const std::string& dtype);

}  // namespace slime::model

#endif  // SLIME_MODEL_INIT_RANDOM_MODEL_H_
