// Internal to the trainer module: the save path of checkpoint.cc in three steps, shared by the
// synchronous save (checkpoint.cc) and the background one (checkpoint_writer.cc):
//   CollectCheckpointContent  checks the options and the progress, gathers what the checkpoint
//                             holds (no I/O; the tensors are the caller's)
//   MakeSaveDir               creates <save>
//   WriteAndPublish           writes <save>/.tmp-iter_N, renames it to iter_N, replaces the
//                             tracker, rotates (checkpoint.h, "Save is atomic")
#ifndef SLIME_SRC_TRAIN_CHECKPOINT_INTERNAL_H_
#define SLIME_SRC_TRAIN_CHECKPOINT_INTERNAL_H_

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "slime/common/status.h"
#include "slime/model/checkpoint.h"
#include "slime/model/config.h"
#include "slime/model/weights.h"
#include "slime/train/checkpoint.h"
#include "slime/train/optimizer.h"

namespace slime::train::internal {

// Everything one iteration directory holds. A synchronous save's tensors are the caller's (the
// optimizer state is staged to the host tensor by tensor as it is written); a background save's
// are host copies taken when it was called.
struct CheckpointContent {
  std::string save_dir;
  int64_t iteration = 0;
  int keep_last = 0;
  int64_t max_shard_bytes = 0;
  model::ModelWeights weights;
  model::ModelConfig config;
  std::optional<OptimizerState> optimizer;        // absent: no optimizer.safetensors
  std::vector<model::NamedTensor> extra_weights;  // written as float32
  std::vector<model::NamedTensor> rng;            // generator name -> uint8 state (CPU)
  bool save_rng = false;
  nlohmann::json hf_config;      // config.json
  nlohmann::json trainer_state;  // trainer_state.json
};

// SaveTrainerCheckpoint's checks (checkpoint.h), then the content; the RNG states are read now.
StatusOr<CheckpointContent> CollectCheckpointContent(const SaveCheckpointOptions& options,
                                                     const model::ModelWeights& weights,
                                                     const model::ModelConfig& config,
                                                     const AdamW* optimizer,
                                                     const TrainerProgress& progress);

Status MakeSaveDir(const std::string& save_dir);

// Writes and publishes `c`; returns the iteration directory. `pause` (may be null) runs before
// each file and before the rename (the background save's test hook).
StatusOr<std::string> WriteAndPublish(const CheckpointContent& c,
                                      const std::function<void()>& pause);

}  // namespace slime::train::internal

#endif  // SLIME_SRC_TRAIN_CHECKPOINT_INTERNAL_H_
