// The LibTorch side of the job's worker processes: one TrainerWorker or EngineWorker per process,
// wrapped as runtime actors by job/actors.h (which holds the gRPC/protobuf side; this header
// includes neither LibTorch nor protobuf, so both sides compile apart — docs/architecture.md,
// "Build").
//
// TrainerWorker: one trainer rank (train::Trainer: a full replica at TP 1 and PP 1, else one
// tensor-parallel shard and / or one pipeline stage) plus, on rank 0, the trainer side of the
// weight sync (comm::WeightSender) to the rollout engines.
//
// Rank layout (Megatron's, as runtime/placement.h places them): world_size trainer processes
// = PP × DP × TP with TP = train.tensor_model_parallel_size and PP =
// train.pipeline_model_parallel_size, TP fastest: tp_rank = rank % TP, dp_rank = (rank / TP) %
// DP, pp_rank = rank / (TP·DP) (a world_size that TP × PP does not divide is InvalidArgument
// naming the fields). The ranks of one (pp_rank, dp_rank) form a TP group (the model's
// parallel layers run their collectives in it); the ranks of one (pp_rank, tp_rank) a DP group
// (gradients and metric sums are all-reduced in it, stage by stage); the ranks of one
// (dp_rank, tp_rank) a pipeline group (stage pp_rank of PP: the 1F1B schedule's activations
// and gradients, the pipelined save, the weight export to stage 0; train/trainer.h, "Pipeline
// parallelism"). With expert parallelism (EP = train.expert_model_parallel_size, dividing DP;
// MoE models) DP rank d is EP rank d % EP: the ranks of one (pp_rank, tp_rank, d / EP) form an
// EP group (the MoE layers' all-to-alls), those of one (pp_rank, tp_rank, d % EP) an
// expert-data-parallel group (the experts' gradients; train/trainer.h, "Expert parallelism").
// Every rank receives the whole rollout and trains its DP index's micro-batches
// (train/trainer.h, "Data parallelism"), so the TP ranks and the pipeline stages of a DP index
// run the same micro-batches: stage 0 embeds their tokens, the last stage computes the loss on
// their labels, advantages and masks. The last stage's step metrics are broadcast over the
// pipeline, so every rank's Train reply holds them; the driver reads rank 0's. (The Trainer
// still refuses PP × TP, PP × ZeRO-1 over DP > 1 and PP × PPO at Init.)
//   OpenGroups / JoinGroups   form the three kinds of group before Init (below).
//   Init()            builds the Trainer from the resolved config (model.hf_checkpoint) and, when
//                     checkpoint.load holds a trainer checkpoint, loads it (model, optimizer,
//                     RNG, LR state). An empty or missing load directory is a fresh start, as
//                     slime's "set --load to your --save dir" idiom expects. The request's
//                     "load" (a directory) replaces checkpoint.load: the driver's trainer
//                     failover points a restarted group at the job's newest checkpoint.
//   Train(id, batch)  TrainRollout; the step and rollout metrics as JSON. With
//                     debug.save_debug_train_data every rank writes what it trained on (below).
//   Save(id, extra)   a checkpoint under checkpoint.save at iteration `id` (written in the
//                     background with checkpoint.async_save; WaitForSave waits for it).
//   ConnectEngines / SyncWeights / DisconnectEngines   SGLang's distributed update: pause the
//                     engines, flush, broadcast every parameter in buckets, continue (fully
//                     async: pause in retract mode, the running requests wait, no flush wait).
//   ResyncEngine      one restarted engine gets the current weights (disk transport).
// Weight export at TP > 1 or PP > 1 (SyncWeights, ResyncEngine): the engines take full HF
// tensors, each exactly once. Rank 0 (TP rank 0 of stage 0 of DP rank 0) is the source and the
// only member of the weight-update group; each parameter is all-gathered in the TP group and,
// when a later pipeline stage owns it, sent by that stage to stage 0 over the pipeline group
// just before it goes into a bucket (Trainer::FullParameter; the lazy WeightSender::Send), or,
// for the disk transport, just before it is written (then kept on the CPU until the directory
// is written), so the device holds at most one bucket of gathered tensors. A tied embedding
// goes once, from stage 0 (the last stage's LM head copy is not sent). The other ranks of DP
// rank 0 (the exporters) take part in every gather and send in the same order; the other DP
// ranks send nothing. If the transfer stops early the source still runs the remaining gathers,
// so no peer is left waiting. With expert parallelism (EP > 1) the exporters are the ranks of
// DP ranks 0..EP-1 (the EP group of DP rank 0): each expert's tensor goes from its owner to the
// other EP ranks as it is needed, so the source has every expert; the same ranks take part in
// Save (EP rank 0 writes), ResyncEngine and CheckEngineWeights.
//   ExportHf(dir)     the current weights as an HF directory (checkpoint.save_hf).
// Train data dumps (debug.save_debug_train_data; "{rollout_id}" and "{rank}" in the template
// replaced): after each Train, one JSON document per rank, written atomically (temp file,
// rename): {"format": "slime-cpp train data", "version": 1, "rollout_id", "rank",
// "world_size", "tp_rank", "dp_rank", "pp_rank", "tp_size", "dp_size", "pp_size",
// "temperature", "batch_samples" (the rollout's sample count), "dropped_samples" (batch indices
// in no step), "steps" (Train's step entries), "rollout_values", "samples": [one per sample
// this rank trained, ascending "index" (in the batch): "step_in_rollout", "micro_batch" (among
// the rank's of that step), the batch's "tokens", "prompt_length", "response_length",
// "loss_mask", "reward" (post-processed), "raw_reward", "rollout_id", "truncated",
// "rollout_log_probs" / "teacher_log_probs" when given, and what the trainer computed before the
// optimizer steps, one value per response token, where computed: "advantages", "returns" and
// "values" (ppo), "log_probs" (π_old), "ref_log_probs", "opd_reverse_kl"]}.
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
#include "slime/comm/in_flight.h"
#include "slime/common/status.h"
#include "slime/config/config.h"
#include "slime/data/rollout_batch.h"

namespace slime::workers {

struct WorkerOptions {
  config::Config config;   // the job's resolved config
  std::string device;      // "cpu" or "cuda" (the process sees its GPUs as cuda:0..)
  int num_threads = 0;     // CPU: LibTorch intra-op threads (0 = LibTorch's default)
  int rank = 0;            // trainer: global rank (layout above); engine: engine index
  int world_size = 1;      // trainer: the number of trainer processes (PP × DP × TP)
};

class TrainerWorker {
 public:
  static std::unique_ptr<TrainerWorker> Create(WorkerOptions options);
  ~TrainerWorker();
  TrainerWorker(const TrainerWorker&) = delete;
  TrainerWorker& operator=(const TrainerWorker&) = delete;

  // {"loaded": bool, "dir": "...", "rollout_id": I, "step": S, "extra_state": {...},
  //  "num_parameters": N, "device": "cpu"}; rollout_id is −1 on a fresh start.
  StatusOr<nlohmann::json> Init(const nlohmann::json& request = nlohmann::json::object());
  // The trainer's process groups (world_size > 1), formed BEFORE Init (the model loads its TP
  // shard and runs its collectives in the TP group). OpenGroups({"master_address": this
  // rank's host}) on every rank: a group leader — TP rank 0 of a TP group, DP rank 0 of a DP
  // group (rank 0 leads both of its groups) — starts its groups' stores and answers
  // {"tp": {"master_address", "master_port"}} and/or {"dp": {...}}; other ranks answer {}.
  // Then JoinGroups on every rank at once with {"tp": [endpoint of the TP group of stage p and
  // dp_rank d at index p·DP + d], "dp": [endpoint of the DP group of stage p and tp_rank t at
  // index p·TP + t], "pp": [endpoint of the pipeline of dp_rank d and tp_rank t at index
  // d·TP + t], with expert parallelism also "ep": [the EP group of stage p, tp_rank t and DP
  // block d / EP at index (p·DP/EP + d/EP)·TP + t], "edp": [the expert-DP group of stage p,
  // tp_rank t and EP rank d % EP at index (p·EP + d%EP)·TP + t]} (a kind with one rank per
  // group is left out; each kind's leaders, taken in rank order, come in index order): each
  // rank connects to its groups' stores and joins the TP group, then the DP group, then the
  // pipeline group, then the EP and expert-DP groups (c10d, Gloo on CPU, NCCL on CUDA).
  // Answers {"rank", "world_size", "tp_size", "dp_size", "pp_size", "tp_rank", "dp_rank",
  // "pp_rank", "backend", "seconds"}. Init refuses to run on a world_size > 1 trainer before
  // that.
  StatusOr<nlohmann::json> OpenGroups(const nlohmann::json& request);
  StatusOr<nlohmann::json> JoinGroups(const nlohmann::json& request);
  // {"steps": [{"step", "step_in_rollout", "num_samples", "skipped", "values": {...}}],
  //  "rollout_values": {...}, "dropped_samples": n, "seconds": s}
  StatusOr<nlohmann::json> Train(int64_t rollout_id, const data::RolloutBatch& batch);
  // {"dir": iteration directory, "seconds": s}. FailedPrecondition without checkpoint.save.
  // DP ranks other than 0 write nothing (their state equals DP rank 0's): {"written": false};
  // with ZeRO-1 they take part (the shards are gathered), and at TP > 1 or PP > 1 the ranks of
  // DP rank 0 take part (the TP shards are gathered, the stages send theirs to stage 0): rank 0
  // writes, the others answer {"written": false}. Call it on every rank.
  // checkpoint.async_save: the writing rank returns once its host copies are taken and the
  // files are written in the background ({"background": true}); every Save first waits for the
  // previous background write, whose failure becomes this Save's error (on every rank that
  // takes part). Also "wait_seconds" (that wait) and "write_seconds" (how long that write ran).
  StatusOr<nlohmann::json> Save(int64_t rollout_id, const nlohmann::json& extra_state);
  // Waits for a background checkpoint write (checkpoint.async_save) to finish: {"seconds":
  // write seconds, "wait_seconds"}; its failure as the error, naming the iteration directory.
  // Returns at once when none is in flight (every rank but the writing one).
  StatusOr<nlohmann::json> WaitForSave();
  // request: {"engines": [{"host", "port", "num_gpus"}], "master_address": host,
  //           "group_name": "..."}; backend gloo on CPU, nccl on CUDA. Rank 0 only (the source;
  //           the engines join one weight-update group whatever the trainer's layout).
  Status ConnectEngines(const nlohmann::json& request);
  // Call it on every rank at once. The source (rank 0): pause → send every parameter as a full
  // tensor (weight_sync.buffer_size buckets, or the disk transport) → continue; {"source": true,
  // "bytes", "tensors", "buckets", "seconds", "gb_per_s"}. The other ranks of DP rank 0 take
  // part in the gathers and sends to stage 0; other DP ranks send nothing ({"source": false,
  // "seconds"}). Then, on
  // every rank, the trainer's keep_old_actor queue (each rank keeps its own).
  // `in_flight`: what the engines' running requests do meanwhile (comm::InFlight: aborted, as
  // between rollouts, or kept across the update, as in fully async training).
  StatusOr<nlohmann::json> SyncWeights(const std::string& weight_version,
                                       comm::InFlight in_flight = comm::InFlight::kAbort);
  // One (restarted) engine, {"host", "port"}, gets the trainer's current weights through the
  // disk transport (an HF directory under weight_sync.disk_dir, default <run_dir>/weight_sync,
  // loaded with /update_weights_from_disk; the disk transport's own directory is reused when it
  // holds these weights), whatever weight_sync.transport is; the weight-update group is not
  // touched. The weights are labelled with the version they are: the last synced one, or
  // rollout_id + 1 once rollout_id was trained. {"weight_version", "dir", "bytes", "seconds"}.
  // At TP > 1 or PP > 1 call it on every rank of DP rank 0 at once (the parameters are gathered
  // and sent to stage 0; the peers answer {"source": false, "seconds"}); FailedPrecondition on
  // other DP ranks.
  StatusOr<nlohmann::json> ResyncEngine(const nlohmann::json& request);
  // weight_sync.check_weight_update_equal, after a sync (call it on every rank at once): the
  // source asks every connected engine for GET /weights_checksum and compares each tensor's
  // checksum with its own full tensor's in the engine's dtype (comm/weight_checksum.h); the other
  // ranks of DP rank 0 take part in the gathers. DataLoss naming the engine and the tensor (the
  // first five, and how many more) when they differ or the engine lacks one; the engine's error
  // when it cannot answer. {"source", "engines", "tensors", "seconds"}.
  StatusOr<nlohmann::json> CheckEngineWeights();
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
