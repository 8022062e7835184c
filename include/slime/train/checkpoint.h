// Trainer checkpoints: model weights, optimizer state, RNG states and trainer progress in one
// directory per iteration, laid out like Megatron/slime (iteration = rollout id in slime):
//
//   <save>/latest_checkpointed_iteration.txt   the newest complete iteration, e.g. "10"
//   <save>/iter_0000010/
//     config.json                 HF config of the model (with torch_dtype = the weights' dtype)
//     model.safetensors           HF names and the model's dtype (or model-0000i-of-0000N +
//                                 model.safetensors.index.json): the directory is an HF model
//                                 directory the engine and transformers load as it is
//     optimizer.safetensors       AdamW::ExportState() / GatherState() (float32
//                                 "<name>.master|exp_avg|exp_avg_sq", full per-parameter
//                                 tensors whatever the data-parallel layout, so a ZeRO-1 run's
//                                 state loads with any dp size, sharded or not), metadata
//                                 {"step": N}; absent with save_optimizer = false
//     rng_state.safetensors       uint8 generator states: "cpu", and "cuda:<i>" per visible GPU;
//                                 absent with save_rng = false
//     extra_weights.safetensors   float32 tensors beyond the decoder's (the critic's
//                                 "value_head.weight"); only when the caller passes some
//     trainer_state.json          format + format_version, iteration, step, rollout_id,
//                                 lr_scheduler and data_source (opaque JSON objects of their
//                                 owners), model_config (the HF config), model_dtype, and which
//                                 optional files are present; written last
//
// Save is atomic: everything goes into <save>/.tmp-iter_0000010/ (each file fsynced), the
// directory is fsynced and renamed to iter_0000010 (an existing directory of that iteration is
// first moved aside and removed afterwards), then the tracker is replaced atomically (temporary
// file + rename), then older iterations beyond keep_last are removed. A save interrupted at any
// point leaves the previous checkpoint and tracker intact; its leftover .tmp-iter_* / .trash-*
// entries are ignored by loads and removed by the next save. One process saves into a <save>
// directory at a time.
//
// Load verifies everything before touching the model or the optimizer: format_version, the
// model config (architecture, sizes, heads, vocab, norms, RoPE; the saved trainer_state.json and
// config.json both), every weight present with the right shape and a floating dtype (converted
// to the model's dtype), the optimizer state matching the trainable parameters, the RNG state
// sizes. Each error names the file and what is wrong; on error nothing was changed. Weights are
// read into CPU temporaries first and copied in place into the model's tensors afterwards.
//
// The files hold full (TP=1, PP=1) tensors: `weights` here must be a TP=1 whole model's. A
// tensor-parallel Trainer gathers its shards before saving and slices after loading (trainer.h,
// "Tensor parallelism"); a pipeline-parallel one gathers the stages to stage 0 and keeps its
// stage's part after loading ("Pipeline parallelism"), so a checkpoint loads at any TP / PP size.
//
// Background saves (checkpoint.async_save): SaveTrainerCheckpointAsync checks what
// SaveTrainerCheckpoint checks and creates <save>, then copies everything the checkpoint holds
// to host memory (pinned when it lives on a GPU) — weights, optimizer state, extra weights, the
// RNG states and the progress — and queues the write of those copies on an
// AsyncCheckpointWriter (checkpoint_writer.h). The caller may change the model and the
// optimizer as soon as it returns. The write makes the same files, byte for byte, through the
// same temporary directory, fsyncs, rename and tracker-last order as the synchronous save; its
// error comes back from the writer's Wait(). The host copies cost the checkpoint's size in host
// memory until the write is done (the synchronous save streams the optimizer state tensor by
// tensor instead).
// Test hook: with $SLIME_TEST_ASYNC_SAVE_DELAY_MS set to N > 0 a background write sleeps N ms
// before each file and before publishing, so a test can act (kill the process, break the
// directory) while a write is certainly in progress. Never set it outside tests.
// Thread-safety: none; call from the trainer's thread while no forward/backward runs.
#ifndef SLIME_TRAIN_CHECKPOINT_H_
#define SLIME_TRAIN_CHECKPOINT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "slime/common/status.h"
#include "slime/model/checkpoint.h"

namespace slime::model {
struct ModelWeights;
struct ModelConfig;
}  // namespace slime::model

namespace slime::train {

class AdamW;
class AsyncCheckpointWriter;
struct OptimizerState;

inline constexpr int kCheckpointFormatVersion = 1;
inline constexpr char kCheckpointTrackerFile[] = "latest_checkpointed_iteration.txt";
inline constexpr char kTrainerStateFile[] = "trainer_state.json";
inline constexpr char kOptimizerStateFile[] = "optimizer.safetensors";
inline constexpr char kRngStateFile[] = "rng_state.safetensors";
inline constexpr char kExtraWeightsFile[] = "extra_weights.safetensors";
// The test hook of background saves (see the header comment).
inline constexpr char kAsyncSaveTestDelayEnv[] = "SLIME_TEST_ASYNC_SAVE_DELAY_MS";

// "iter_0000010" (Megatron's 7-digit name).
std::string IterationDirName(int64_t iteration);

// The caller's progress, stored in trainer_state.json.
struct TrainerProgress {
  int64_t step = 0;        // optimizer steps taken in the run (what the LR schedule counts)
  int64_t rollout_id = 0;  // the last completed rollout
  // Opaque JSON objects owned by the LR schedule and the data source ("{}" when unused).
  std::string lr_scheduler_json = "{}";
  std::string data_source_json = "{}";
};

struct SaveCheckpointOptions {
  std::string save_dir;        // <save>; created when missing
  int64_t iteration = 0;       // directory number (slime: the rollout id), >= 0
  int keep_last = 0;           // keep the newest keep_last iterations (the one just saved always
                               // survives, older ones go first); 0 keeps all
  bool save_optimizer = true;  // false = checkpoint.no_save_optim
  // The optimizer state to write instead of optimizer->ExportState(): a distributed optimizer's
  // GatherState() (its ExportState is not available). Not owned; must outlive the call.
  const OptimizerState* optimizer_state = nullptr;
  bool save_rng = true;
  int64_t max_shard_bytes = int64_t{4} << 30;  // model weights per safetensors file
  // Trained tensors that are not decoder parameters (the critic's value head), written as
  // float32 under their names into extra_weights.safetensors. Empty: no such file.
  std::vector<model::NamedTensor> extra_weights;
};

// Saves a checkpoint as described above; returns the iteration directory. `optimizer` may be null
// (no optimizer state then, unless options.optimizer_state is given); a distributed optimizer
// needs options.optimizer_state. Errors: bad options (empty save_dir, negative iteration or
// keep_last, a distributed optimizer without optimizer_state), progress JSON that is not an
// object, invalid weights, TP size > 1, I/O errors (naming the path). On error the previous
// checkpoints and the tracker are as they were.
StatusOr<std::string> SaveTrainerCheckpoint(const SaveCheckpointOptions& options,
                                            const model::ModelWeights& weights,
                                            const model::ModelConfig& config,
                                            const AdamW* optimizer,
                                            const TrainerProgress& progress);

// SaveTrainerCheckpoint in the background (see the header comment): returns the iteration
// directory the queued write will publish. Errors returned here are those SaveTrainerCheckpoint
// reports before writing (options, progress JSON, weights, creating <save>) and a failed host
// copy; the write's own errors come from writer.Wait(), naming that directory.
StatusOr<std::string> SaveTrainerCheckpointAsync(const SaveCheckpointOptions& options,
                                                 const model::ModelWeights& weights,
                                                 const model::ModelConfig& config,
                                                 const AdamW* optimizer,
                                                 const TrainerProgress& progress,
                                                 AsyncCheckpointWriter& writer);

struct LoadCheckpointOptions {
  // A <save> directory (the tracker picks the iteration) or one iteration directory.
  std::string load_dir;
  // With a <save> directory: load iter_<ckpt_step> instead of the tracker's (slime's ckpt_step).
  std::optional<int64_t> ckpt_step;
  bool load_optimizer = true;  // false = checkpoint.no_load_optim
  bool load_rng = true;
  // Tensors to fill in place from extra_weights.safetensors, by name (see SaveCheckpointOptions);
  // each must be there with the same shape. Checked with everything else, applied with the
  // model's weights (before the optimizer state).
  std::vector<model::NamedTensor> extra_weights;
};

struct LoadedCheckpoint {
  std::string dir;  // the iteration directory read
  int64_t iteration = 0;
  TrainerProgress progress;
  bool optimizer_loaded = false;
  bool rng_loaded = false;
};

// The iteration directory a load of `load_dir` would read: the tracker's (or ckpt_step's)
// iteration under a <save> directory, or `load_dir` itself when it holds trainer_state.json.
// NotFound when it is neither (e.g. an HF model directory, which callers load as weights only).
StatusOr<std::string> ResolveCheckpointDir(const std::string& load_dir,
                                           std::optional<int64_t> ckpt_step = std::nullopt);

// Loads a checkpoint into `weights` (in place) and, with load_optimizer and a non-null
// `optimizer`, into the optimizer; restores the RNG states with load_rng. Without the optimizer
// state, a non-null optimizer's masters are reloaded from the new weights (its moments are kept).
// Errors (nothing changed): see the header comment; a checkpoint saved without optimizer state
// while load_optimizer is set is an error that suggests no_load_optim.
StatusOr<LoadedCheckpoint> LoadTrainerCheckpoint(const LoadCheckpointOptions& options,
                                                 model::ModelWeights& weights,
                                                 const model::ModelConfig& config,
                                                 AdamW* optimizer);

}  // namespace slime::train

#endif  // SLIME_TRAIN_CHECKPOINT_H_
