// The LibTorch side of the job's worker processes: one TrainerWorker or EngineWorker per process,
// wrapped as runtime actors by job/actors.h (which holds the gRPC/protobuf side; this header
// includes neither LibTorch nor protobuf, so both sides compile apart — docs/architecture.md,
// "Build").
//
// TrainerWorker: one trainer replica (train::Trainer) plus, on DP rank 0, the trainer side of
// the weight sync (comm::WeightSender) to the rollout engines.
//   Init()            builds the Trainer from the resolved config (model.hf_checkpoint) and, when
//                     checkpoint.load holds a trainer checkpoint, loads it (model, optimizer,
//                     RNG, LR state). An empty or missing load directory is a fresh start, as
//                     slime's "set --load to your --save dir" idiom expects.
//   Train(id, batch)  TrainRollout; the step and rollout metrics as JSON.
//   Save(id, extra)   a checkpoint under checkpoint.save at iteration `id`.
//   ConnectEngines / SyncWeights / DisconnectEngines   SGLang's distributed update: pause the
//                     engines, flush, broadcast every parameter in buckets, continue.
//   ResyncEngine      one restarted engine gets the current weights (disk transport).
//   ExportHf(dir)     the current weights as an HF directory (checkpoint.save_hf).
// EngineWorker: an inference engine (engine::Engine) and its SGLang-compatible HTTP server on
// a free port of `host`.
//
// Threads: a worker belongs to its actor thread (the runtime calls actor methods one at a
// time). Errors come back as Status naming the operation; nothing throws.
#ifndef SLIME_WORKERS_WORKERS_H_
#define SLIME_WORKERS_WORKERS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "nlohmann/json.hpp"
#include "slime/common/status.h"
#include "slime/config/config.h"
#include "slime/train/rollout_batch.h"

namespace slime::workers {

struct WorkerOptions {
  config::Config config;   // the job's resolved config
  std::string device;      // "cpu" or "cuda" (the process sees its GPUs as cuda:0..)
  int num_threads = 0;     // CPU: LibTorch intra-op threads (0 = LibTorch's default)
  int rank = 0;            // trainer: DP rank; engine: engine index
  int world_size = 1;      // trainer: DP size
};

class TrainerWorker {
 public:
  static std::unique_ptr<TrainerWorker> Create(WorkerOptions options);
  ~TrainerWorker();
  TrainerWorker(const TrainerWorker&) = delete;
  TrainerWorker& operator=(const TrainerWorker&) = delete;

  // {"loaded": bool, "dir": "...", "rollout_id": I, "step": S, "extra_state": {...},
  //  "num_parameters": N, "device": "cpu"}; rollout_id is −1 on a fresh start.
  StatusOr<nlohmann::json> Init();
  // Data parallelism over world_size trainer processes (after Init): rank 0's OpenDpGroup
  // ({"master_address": its host}) starts the group's store and answers {"master_address",
  // "master_port"}; then JoinDpGroup with that answer on every rank at once (rank 0 included)
  // forms the c10d group (Gloo on CPU, NCCL on CUDA) that gradients and metric sums are
  // all-reduced in. Train refuses to run on a world_size > 1 trainer before that.
  StatusOr<nlohmann::json> OpenDpGroup(const nlohmann::json& request);
  StatusOr<nlohmann::json> JoinDpGroup(const nlohmann::json& request);
  // {"steps": [{"step", "step_in_rollout", "num_samples", "skipped", "values": {...}}],
  //  "rollout_values": {...}, "dropped_samples": n, "seconds": s}
  StatusOr<nlohmann::json> Train(int64_t rollout_id, const train::RolloutBatch& batch);
  // {"dir": iteration directory, "seconds": s}. FailedPrecondition without checkpoint.save.
  // Ranks other than 0 write nothing (their state equals rank 0's): {"written": false}.
  StatusOr<nlohmann::json> Save(int64_t rollout_id, const nlohmann::json& extra_state);
  // request: {"engines": [{"host", "port", "num_gpus"}], "master_address": host,
  //           "group_name": "..."}; backend gloo on CPU, nccl on CUDA.
  Status ConnectEngines(const nlohmann::json& request);
  // Pause → send every parameter (weight_sync.buffer_size buckets) → continue; then the
  // trainer's keep_old_actor queue. {"bytes", "tensors", "buckets", "seconds", "gb_per_s"}.
  StatusOr<nlohmann::json> SyncWeights(const std::string& weight_version);
  // One (restarted) engine, {"host", "port"}, gets the trainer's current weights through the
  // disk transport (an HF directory under weight_sync.disk_dir, default <run_dir>/weight_sync,
  // loaded with /update_weights_from_disk; the disk transport's own directory is reused when it
  // holds these weights), whatever weight_sync.transport is; the weight-update group is not
  // touched. The weights are labelled with the version they are: the last synced one, or
  // rollout_id + 1 once rollout_id was trained. {"weight_version", "dir", "bytes", "seconds"}.
  StatusOr<nlohmann::json> ResyncEngine(const nlohmann::json& request);
  // Leaves the weight-update group (ConnectEngines again re-forms it; a failed leave — an
  // engine that died — is logged there, not fatal).
  Status DisconnectEngines();
  // {"dir": dir}
  StatusOr<nlohmann::json> ExportHf(const std::string& dir);
  // cluster.offload_train: the model's weights and gradients and the optimizer state move to
  // pinned host memory and their device memory goes back to the driver; ResumeMemory brings them
  // back (Train, Save, SyncWeights and ResyncEngine also do, first). The PPO critic stays.
  // {"bytes", "seconds"}; no-ops when already there (CPU trainers move nothing).
  StatusOr<nlohmann::json> ReleaseMemory();
  StatusOr<nlohmann::json> ResumeMemory();

 private:
  struct Impl;
  explicit TrainerWorker(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class EngineWorker {
 public:
  // Loads model.hf_checkpoint, starts the engine thread and the HTTP server on `host`, any free
  // port. The engine's sampling seed base is rollout.seed + rank.
  static StatusOr<std::unique_ptr<EngineWorker>> Start(WorkerOptions options,
                                                       const std::string& host);
  ~EngineWorker();  // stops the server (in-flight requests abort), then the engine
  EngineWorker(const EngineWorker&) = delete;
  EngineWorker& operator=(const EngineWorker&) = delete;

  const std::string& host() const;
  int port() const;

 private:
  struct Impl;
  explicit EngineWorker(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace slime::workers

#endif  // SLIME_WORKERS_WORKERS_H_
