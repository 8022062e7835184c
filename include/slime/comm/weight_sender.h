// WeightSender: the trainer side of SGLang's distributed weight update (docs/http-api.md,
// "Weight sync"): rank 0 of a c10d group whose other ranks are engine GPUs.
//
//   Connect()  opens the group's store (rank 0), POSTs /init_weights_update_group to every engine
//              at once (engine e joins as ranks rank_offset_e .. rank_offset_e + gpus_e - 1),
//              joins the group itself, then waits for every engine's reply.
//   Send()     plans buckets of at most bucket_bytes (a larger tensor is its own bucket), and per
//              bucket POSTs /update_weights_from_distributed (names, dtypes, shapes, group_name,
//              weight_version, flush_cache) to every engine at once, broadcasts each tensor from
//              rank 0 in list order (one broadcast per tensor), then waits for every reply.
//   Disconnect()  POSTs /destroy_weights_update_group and drops the group.
//
// backend "cuda_ipc" (engines on the trainer's own GPU, colocated): no group. Send() allocates
// one device buffer of max(bucket_bytes, the largest tensor) on `device`, and per bucket copies
// the tensors into it and POSTs /update_weights_from_tensor (load_format "slime_cuda_ipc", the
// buffer's CUDA IPC handle and each tensor's offset; comm/cuda_ipc.h) to every engine, which
// copies them out before it answers; the buffer is freed when Send returns.
//
// The tensors are HF-named and full (unsharded): model::NamedParameters() of a TP-size-1 model,
// or — the lazy form of Send — their shapes plus a function that produces each one just before
// its bucket goes out (a tensor-parallel trainer all-gathers each parameter there, so at most
// one bucket of full tensors exists at a time; workers/workers.h). They are moved to the
// backend's device (CPU for gloo, CUDA for nccl) and, when `dtype` is set, converted, one
// bucket at a time. Pausing generation and flushing the prefix cache around a
// sync (slime's pause → flush → transfer → continue) are the caller's; see PauseEngines() /
// ContinueEngines().
//
// Errors name the engine and the bucket; a failed bucket leaves the group broken (Disconnect and
// Connect again). Thread-safety: one thread at a time; HTTP calls run on helper threads.
#ifndef SLIME_COMM_WEIGHT_SENDER_H_
#define SLIME_COMM_WEIGHT_SENDER_H_

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "slime/comm/in_flight.h"
#include "slime/comm/process_group.h"
#include "slime/common/status.h"
#include "slime/model/checkpoint.h"

namespace slime::comm {

// torch dtype names as SGLang sends them ("bfloat16", "float32", ...; an optional "torch."
// prefix is accepted). InvalidArgument lists the valid names.
StatusOr<torch::ScalarType> ParseDtypeName(const std::string& name);
std::string DtypeName(torch::ScalarType dtype);

// Consecutive index ranges [begin, end) of `tensors` whose bytes stay within bucket_bytes; a
// tensor larger than that is a bucket of its own. Order is preserved.
std::vector<std::pair<size_t, size_t>> PlanBuckets(const std::vector<model::NamedTensor>& tensors,
                                                   int64_t bucket_bytes);

// The lazy form's producer: tensor `index` of the list, full and HF-named as listed. Send calls
// it once per tensor in list order (0, 1, ...), stopping at the first failure; a producer that
// runs collectives must let its peers finish the sequence when Send stops early.
using TensorFetchFn = std::function<StatusOr<torch::Tensor>(size_t index)>;

struct EngineEndpoint {
  std::string host = "127.0.0.1";
  int port = 0;
  int num_gpus = 1;  // ranks this engine takes in the group
};

struct WeightSenderOptions {
  std::vector<EngineEndpoint> engines;
  std::string master_address = "127.0.0.1";  // what engines dial to reach this process
  int master_port = 0;                         // 0 = a free port
  std::string group_name = "weight_update_group";
  std::string bearer_token;                    // engines' access key (`Authorization: Bearer`)
  std::string backend = "auto";                // gloo | nccl | auto | cuda_ipc
  torch::Device device = torch::kCPU;          // cuda_ipc: the trainer's GPU
  int64_t bucket_bytes = int64_t{512} << 20;   // weight_sync.buffer_size
  double timeout_s = 600.0;                    // rendezvous, each bucket's broadcasts and replies
  std::optional<torch::ScalarType> dtype;      // convert before sending (e.g. bf16 engines)
};

struct SyncStats {
  int64_t bytes = 0;
  int64_t tensors = 0;
  int64_t buckets = 0;
  double seconds = 0;
  double gb_per_s() const { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0; }
};

class WeightSender {
 public:
  static StatusOr<std::unique_ptr<WeightSender>> Connect(WeightSenderOptions options);
  ~WeightSender();  // Disconnect(), errors logged

  // weight_version: stamped by the engines on success (slime sends "1", "2", ...).
  StatusOr<SyncStats> Send(const std::vector<model::NamedTensor>& tensors,
                           const std::string& weight_version, bool flush_cache = true);
  // The lazy form: `shapes` names every tensor with its full shape and dtype (only sizes and
  // dtype are read: meta tensors do); `fetch` produces the values (TensorFetchFn). A produced
  // tensor whose shape or dtype differs from its entry fails the sync, naming it.
  StatusOr<SyncStats> Send(const std::vector<model::NamedTensor>& shapes,
                           const TensorFetchFn& fetch, const std::string& weight_version,
                           bool flush_cache = true);
  Status Disconnect();

  // On every engine: POST /pause_generation, then (kAbort) GET /flush_cache retried until 200 or
  // the timeout; POST /continue_generation {}.
  Status PauseEngines(InFlight in_flight = InFlight::kAbort);
  Status ContinueEngines();

  const WeightSenderOptions& options() const { return options_; }

 private:
  explicit WeightSender(WeightSenderOptions options) : options_(std::move(options)) {}
  // POSTs `bodies[e]` to `path` on every engine e in parallel; the first failure names the
  // engine. `during` runs on this thread while the calls are in flight.
  Status PostAll(const std::string& path, const std::vector<std::string>& bodies,
                 const std::function<Status()>& during);
  bool ipc() const { return options_.backend == "cuda_ipc"; }
  StatusOr<SyncStats> SendIpc(const std::vector<model::NamedTensor>& shapes,
                              const TensorFetchFn& fetch, const std::string& weight_version,
                              bool flush_cache);

  WeightSenderOptions options_;
  std::unique_ptr<ProcessGroup> group_;
};

}  // namespace slime::comm

#endif  // SLIME_COMM_WEIGHT_SENDER_H_
