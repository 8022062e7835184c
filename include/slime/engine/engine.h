// Engine: one inference engine — the model, its paged K/V cache, the radix prefix cache, the
// scheduler and the sampler — driven by one engine thread.
//
// Threading (llama.cpp-server style): Submit/Abort/Pause/... may be called from any thread;
// they only enqueue a command and wake the engine thread. The engine thread alone owns the
// model, K/V pages and every live request. Each step it drains commands, asks the scheduler for
// a batch (decodes first, then prefill chunks within the token budget), runs one forward,
// samples, detokenizes, checks stop conditions and reports progress through each request's
// callback. Callbacks run on the engine thread and must be quick (copy and post elsewhere).
//
// A request ends exactly once, with a finish_reason: stop (EOS / stop_token_ids / stop
// string), length (max_new_tokens or the context limit), or abort (Abort*, pause, out of KV
// memory, an internal error). Its last callback carries the finish reason; for streaming
// requests earlier callbacks carry the cumulative output every `stream_interval` tokens.
//
// Pause stops generation until Continue and holds new requests meanwhile; its mode (SGLang's
// /pause_generation modes) says what becomes of the requests in flight: abort ends each with its
// partial output; in_place keeps them where they are, K/V included; retract drops their K/V
// (full pages go to the prefix cache) and puts them back at the head of the queue, to be
// prefilled again over prompt and output so far. Memory release/resume and weight updates run on
// the engine thread between steps, paused or not, so a weight update during an in-place or
// retracting pause lands between two decode steps of the requests it interrupts: their later
// tokens come from the new weights (after an in-place pause attending the K/V the old weights
// wrote; after a retraction over K/V recomputed with the new ones, when the update flushes the
// prefix cache that kept the retracted pages), and each output says which
// tokens came from which version (RequestOutput::weight_versions).
//
// Weight plane (SGLang's distributed update): InitWeightsUpdateGroup joins a c10d group (on a
// helper thread; generation goes on), UpdateWeightsFromDistributed receives one bucket on the
// engine thread between steps — requests in flight wait for it and continue on the new weights
// (slime pauses first, so normally there are none) — and swaps it in all-or-nothing.
//
// Tensor parallelism (options.tp_size = N > 1): the scheduler, sampler, detokenizer and HTTP
// stay single; the ModelRunner drives N model shards, one thread per rank, inside this process
// (model_runner.h). In a weight-update group the engine takes N consecutive ranks
// (rank_offset .. rank_offset + N - 1, one per device, as an SGLang engine of N GPUs does) and
// every rank keeps its shard of the full tensors it receives.
#ifndef SLIME_ENGINE_ENGINE_H_
#define SLIME_ENGINE_ENGINE_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "slime/common/status.h"
#include "slime/engine/request.h"

namespace slime::tokenizer {
class Tokenizer;
}
namespace slime::model {
struct ModelConfig;
}
namespace slime::metrics {
class Registry;
}
namespace slime::comm {
struct ProcessGroupOptions;
class ProcessGroup;
struct IpcBucket;
struct SglangBucket;
}

namespace slime::engine {

struct EngineOptions {
  std::string model_path;          // HF directory: config.json, safetensors, tokenizer files
  std::string tokenizer_path;      // default: model_path
  std::string served_model_name;   // default: model_path
  std::string dtype = "auto";
  std::string device = "auto";  // with tp_size > 1 on CUDA: rank 0's device (cuda = cuda:0)
  // Tensor-parallel ranks (devices on CUDA, threads with Gloo on CPU); must divide the model's
  // heads, KV heads, intermediate size and vocabulary (`serve --tp`,
  // cluster.rollout_num_gpus_per_engine in a job).
  int tp_size = 1;
  int64_t page_size = 16;
  int64_t max_total_tokens = 0;    // K/V token slots; 0 = from mem_fraction_static / CPU default
  double mem_fraction_static = 0.85;
  int64_t max_running_requests = 256;
  int64_t chunked_prefill_size = 8192;   // prefill tokens per step
  int64_t max_batch_tokens = 16384;      // all tokens of one step
  int64_t context_length = 0;            // 0 = the model's max_position_embeddings
  bool enable_prefix_cache = true;
  uint64_t random_seed = 0;              // seeds of requests without sampling_seed
  int64_t stream_interval = 1;
  int64_t cuda_graph_max_bs = 256;       // decode steps up to this batch replay CUDA graphs; 0 = off
  bool fuse_projections = true;          // CUDA: fused q|k|v and gate|up GEMMs + fused kernels
  // Batch-invariant kernels (model/batch_invariant.h; `serve --enable-deterministic-inference`,
  // debug.deterministic_mode in a job): a request's tokens and log-probs do not depend on the
  // batch, chunking or prefix-cache hits, and equal the trainer's log-probs to the bit. Turns
  // the process-wide switch on. CPU and CUDA (the CUDA kernels in CUDA builds); decode CUDA
  // graphs and the fused decode kernels are off in the mode.
  bool deterministic_inference = false;
  // SGLang's --enable-return-routed-experts: honour GenerateInput::return_routed_experts (a
  // mixture-of-experts model; otherwise such a request is a 400 naming the flag).
  bool enable_return_routed_experts = false;
  std::string weight_version = "default";
  metrics::Registry* metrics = nullptr;  // not owned; null = no metrics
};

// One /update_weights_from_distributed bucket: tensors `names[i]` of `dtypes[i]` (torch names,
// "bfloat16") and full HF `shapes[i]`, broadcast from rank 0 of `group_name` in list order.
struct DistributedWeightsUpdate {
  std::vector<std::string> names;
  std::vector<std::string> dtypes;
  std::vector<std::vector<int64_t>> shapes;
  std::string group_name = "weight_update_group";
  bool flush_cache = true;
  std::optional<std::string> weight_version;  // stamped on success when set
};

// One /update_weights_from_tensor bucket: a colocated trainer's CUDA IPC buffer (comm/cuda_ipc.h).
// Exactly one of `bucket` (ours, load_format "slime_cuda_ipc") and `sglang` (SGLang's
// "flattened_bucket": one entry per TP rank, entry i for rank i) is set.
struct TensorWeightsUpdate {
  std::shared_ptr<const comm::IpcBucket> bucket;
  std::vector<std::shared_ptr<const comm::SglangBucket>> sglang;
  bool flush_cache = true;
  std::optional<std::string> weight_version;  // stamped on success when set
};

// Counts the HTTP layer reports in /v1/loads and /metrics (updated by the engine thread).
struct EngineLoad {
  int64_t num_running = 0;
  int64_t num_waiting = 0;
  int64_t num_used_pages = 0;
  int64_t num_total_pages = 0;
  int64_t num_cached_pages = 0;
};

class Engine {
 public:
  using Callback = std::function<void(const RequestOutput&)>;

  // Loads model and tokenizer, sizes the caches and starts the engine thread.
  static StatusOr<std::unique_ptr<Engine>> Create(EngineOptions options);
  ~Engine();  // Stop()

  // Aborts everything in flight (each gets its final callback) and joins the engine thread.
  void Stop();

  // Queues a request; returns its engine-internal id. Inputs must be validated (ids in range,
  // prompt fits the context). `on_update` gets cumulative outputs, the last one finished.
  uint64_t Submit(GenerateInput input, Callback on_update);
  // Aborts one request by internal id (client disconnect).
  void Cancel(uint64_t id);
  // SGLang /abort_request: requests whose rid starts with `rid_prefix` (empty + all = all).
  void Abort(std::string rid_prefix, bool all);
  enum class PauseMode { kAbort, kInPlace, kRetract };
  void Pause(PauseMode mode = PauseMode::kAbort);
  void Continue();
  bool paused() const { return paused_.load(); }

  // Empties the prefix cache; false (nothing done) while requests are in flight.
  std::future<bool> FlushCache();
  // Loads new weights from an HF directory between steps; sets the weight version on success.
  std::future<Status> UpdateWeightsFromDisk(std::string model_path, std::string weight_version);
  // Joins weight-update group `options.group_name` as ranks options.rank .. options.rank +
  // tp_size - 1 (blocks helper threads until every rank has joined or options.timeout_s
  // passes). AlreadyExists when the name is taken; InvalidArgument when the ranks do not fit
  // options.world_size.
  std::future<Status> InitWeightsUpdateGroup(const comm::ProcessGroupOptions& options);
  // Receives one bucket from rank 0 into fresh buffers on the engine thread (every TP rank on its
  // own device), then replaces the named weights (all or none: an unknown name or a shape/dtype
  // mismatch changes nothing and names the tensor), flushes the prefix cache if asked and stamps
  // the version. The bucket is received even when it is then rejected, so the group stays in
  // step with the sender.
  std::future<Status> UpdateWeightsFromDistributed(DistributedWeightsUpdate update);
  // Maps the bucket's buffer (the same GPU only), copies its tensors into the weights on the
  // engine thread (all or none, as above), waits for the copies and unmaps it; flushes the
  // prefix cache if asked and stamps the version. FailedPrecondition at tp_size > 1.
  std::future<Status> UpdateWeightsFromTensor(TensorWeightsUpdate update);
  // NotFound when no such group exists.
  Status DestroyWeightsUpdateGroup(const std::string& group_name);
  // tags: "kv_cache", "weights" (empty = both). Release needs no request in flight.
  std::future<Status> ReleaseMemory(std::vector<std::string> tags);
  std::future<Status> ResumeMemory(std::vector<std::string> tags);
  // ModelRunner::WeightChecksums on the engine thread, between steps (so never halfway through
  // a weight update): (HF name, checksum) per parameter, and the dtype the engine holds them in
  // (comm's name, e.g. "bfloat16").
  struct WeightChecksumList {
    std::string dtype;
    std::vector<std::pair<std::string, std::string>> checksums;
  };
  std::future<StatusOr<WeightChecksumList>> WeightChecksums();
  // SGLang's /get_weights_by_name: the first `truncate_size` entries along dim 0 of the full
  // parameter `hf_name` (an HF name), read on the engine thread between steps and converted to
  // float32; `shape` is that slice's shape ([min(truncate_size, rows), ...]), `values` its
  // elements in row-major order. NotFound for a name the model does not have.
  struct WeightSlice {
    std::vector<int64_t> shape;
    std::vector<float> values;
  };
  std::future<StatusOr<WeightSlice>> WeightByName(std::string hf_name, int64_t truncate_size);
  // Resolves when the engine thread is responsive and a one-token forward succeeds (or the
  // engine is demonstrably generating); never waits behind queued requests.
  std::future<Status> HealthCheck();

  std::string weight_version() const;
  void set_weight_version(std::string v);
  EngineLoad load() const;
  bool memory_released() const { return memory_released_.load(); }

  const EngineOptions& options() const { return options_; }
  const tokenizer::Tokenizer& tokenizer() const { return *tokenizer_; }
  const model::ModelConfig& model_config() const;
  // The model has a sparse (mixture-of-experts) layer: return_routed_experts applies.
  bool routes_experts() const;
  int64_t context_length() const { return context_length_; }
  const std::vector<int32_t>& eos_token_ids() const { return eos_ids_; }

  class Impl;  // the engine thread's state (engine.cc)

 private:
  Engine() = default;
  void Post(std::function<void(Impl&)> command);
  void ThreadMain();

  EngineOptions options_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  std::unique_ptr<Impl> impl_;
  std::vector<int32_t> eos_ids_;
  int64_t context_length_ = 0;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void(Impl&)>> commands_;  // guarded by mu_
  bool stopping_ = false;                             // guarded by mu_
  std::string weight_version_;                        // guarded by mu_
  EngineLoad load_;                                   // guarded by mu_
  std::mutex groups_mu_;
  // Per group name, TP rank r's member at [r].
  std::map<std::string, std::vector<std::shared_ptr<comm::ProcessGroup>>>
      weight_groups_;                     // guarded by groups_mu_
  std::set<std::string> joining_groups_;  // guarded by groups_mu_
  std::atomic<uint64_t> next_id_{1};
  std::atomic<bool> paused_{false};
  std::atomic<bool> memory_released_{false};
  std::thread thread_;
};

}  // namespace slime::engine

#endif  // SLIME_ENGINE_ENGINE_H_
