// ModelRunner: the model and its paged K/V cache, run one scheduled batch at a time.
//
// Owns the DecoderModel (weights on the engine device) and the PagedKvCache sized at start.
// Forward() takes the batch's new tokens and, per item, its page table and context length, runs
// the decoder over PagedAttention under inference mode and returns the final hidden states;
// Logits() turns chosen rows of them into float32 logits.
//
// Tensor parallelism (options.tp_size = N > 1; docs/architecture.md, "Tensor-parallel engine"):
// one process drives N ranks. Rank r holds its shard of the weights (a DecoderModel over
// model::TensorParallelGroup of a real c10d group: NCCL between cuda:first+r on CUDA, Gloo on
// CPU) and its own PagedKvCache with the local KV heads; every rank's cache has the same pages,
// so the one scheduler's page tables serve all of them. Forward/Logits run the same batch on
// every rank at once — rank 0 on the calling thread, ranks 1..N-1 on one thread each of this
// runner, each under its device's guard — and the logits are all-gathered from the
// vocab-parallel LM head; only rank 0's copy is returned (it feeds the sampler). A collective
// that fails or outlives tp_timeout_s throws inside the forward and surfaces as a Status that
// names the group, the collective and its sequence number; the group is then broken and every
// later step fails the same way (restart the engine).
//
// Memory occupation (colocated training): ReleaseKv()/ResumeKv() free and re-allocate the K/V
// pools (contents lost); OffloadWeights()/OnloadWeights() move the weights' device memory to
// pinned host memory and back (model::StorageOffloader: contents kept, unlike SGLang, which
// discards them; every weight tensor and fused view stays the same object, at a new address,
// so the decode CUDA graphs are captured again). Both act on every rank.
//
// Thread-safety: the engine thread only. LibTorch errors surface as Status.
#ifndef SLIME_ENGINE_MODEL_RUNNER_H_
#define SLIME_ENGINE_MODEL_RUNNER_H_

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "slime/common/status.h"
#include "slime/engine/paged_kv.h"
#include "slime/model/decoder.h"
#include "slime/model/offload.h"

namespace slime::comm {
class ProcessGroup;
}

namespace slime::engine {

struct ModelRunnerOptions {
  std::string model_path;          // HF directory: config.json + *.safetensors
  std::string dtype = "auto";      // auto (bfloat16 on CUDA, float32 on CPU), bfloat16, float16, float32
  // auto (cuda:0 when available), cpu, cuda, cuda:N. With tp_size > 1 on CUDA this is rank 0's
  // device and rank r runs on the r-th device after it (cuda = cuda:0).
  std::string device = "auto";
  int64_t page_size = 16;
  int64_t max_total_tokens = 0;    // K/V slots; 0 = from mem_fraction_static (CUDA) or 65,536 (CPU)
  double mem_fraction_static = 0.85;  // CUDA: fraction of device memory for weights + K/V
  // CUDA: stack q|k|v and gate|up into one GEMM each and run the fused norm/RoPE/K-V-store
  // kernels (DecoderModel::FuseProjections). Off only to measure or test the unfused path.
  bool fuse_projections = true;
  // Tensor-parallel ranks driven by this runner (see the file comment). Must divide the model's
  // num_attention_heads, num_key_value_heads, intermediate_size and vocab_size; on CUDA the
  // devices device..device+tp_size-1 must exist.
  int tp_size = 1;
  double tp_timeout_s = 600;  // the TP group's rendezvous and each of its collectives
};

// The final hidden states of one forward: per TP rank [T, hidden] on that rank's device (the
// same values on every rank). Logits() needs all of them.
struct HiddenStates {
  std::vector<torch::Tensor> per_rank;
  const torch::Tensor& rank0() const { return per_rank.front(); }
};

class ModelRunner {
 public:
  static StatusOr<std::unique_ptr<ModelRunner>> Create(const ModelRunnerOptions& options);

  const model::ModelConfig& config() const { return ranks_.front()->model->config(); }
  int tp_size() const { return static_cast<int>(ranks_.size()); }
  // Rank `rank`'s model shard and K/V cache (rank 0's by default). Collective-free use only:
  // a forward of one rank's model at tp_size > 1 waits for peers that never come.
  model::DecoderModel& model(int rank = 0) { return *ranks_[rank]->model; }
  PagedKvCache& kv(int rank = 0) { return *ranks_[rank]->kv; }
  torch::Device device(int rank = 0) const { return ranks_[rank]->model->device(); }
  torch::ScalarType dtype() const { return ranks_.front()->model->dtype(); }
  int64_t num_pages() const { return ranks_.front()->kv->num_pages(); }
  int64_t page_size() const { return ranks_.front()->kv->page_size(); }

  // Runs fn(rank) for every rank concurrently — rank 0 on the calling thread, the others on
  // their own threads — each under a device guard for its rank's device, and waits for all.
  // Returns the lowest rank's error (exceptions become Internal). What must run on every rank
  // at once (collectives: a forward, a weight broadcast) goes through here.
  Status OnEveryRank(const std::function<Status(int rank)>& fn);

  // input_ids [T] host int32 values (the batch's new tokens in item order); items describe each
  // sequence's run of them. -> hidden [T, hidden] per rank.
  StatusOr<HiddenStates> Forward(const std::vector<int32_t>& input_ids,
                                 const std::vector<PagedItem>& items);
  // hidden rows `rows` -> logits [R, vocab] float32 on rank 0's device (gathered over the
  // vocab-parallel LM head at tp_size > 1).
  StatusOr<torch::Tensor> Logits(const HiddenStates& hidden, const std::vector<int64_t>& rows);
  // A one-token forward (token 0 at position 0, no K/V cache) and its logits on every rank.
  Status HealthCheck();

  Status ReleaseKv();
  Status ResumeKv();
  Status OffloadWeights();
  Status OnloadWeights();
  bool weights_offloaded() const { return weights_offloaded_; }

  // Replaces every weight with the tensors of an HF safetensors directory (same architecture and
  // shapes; the error names the first mismatch); each rank reads its shard. Copies in place, so
  // views stay valid.
  Status LoadWeightsFromDisk(const std::string& model_path);
  // Replaces the weights named in `tensors` (HF names, full unsharded shapes, the engine's
  // dtype; any device) and leaves the others alone: any subset in any order, as SGLang's
  // load_weights accepts. Each rank copies its shard (the rows or columns of its TP slice) into
  // its weights. lm_head.weight of a tied model is ignored. All or nothing: an unknown name or a
  // shape/dtype mismatch changes nothing on any rank and names the tensor (InvalidArgument).
  // Copies in place, so the fused q|k|v and gate|up buffers and captured CUDA graphs see the
  // new values. At tp_size > 1 on CUDA it returns once every device finished its copies
  // (the sources may be another device's memory, e.g. a mapped IPC buffer).
  Status UpdateWeights(const std::vector<model::NamedTensor>& tensors);
  // (HF name, comm::TensorChecksum of the full tensor in the engine's dtype) for every
  // parameter, in model::ParameterSpecs order; at tp_size > 1 each full tensor is the ranks'
  // shards joined along their split dimension (in host memory, one tensor at a time).
  // FailedPrecondition while the weights are offloaded. For weight_sync.check_weight_update_equal.
  StatusOr<std::vector<std::pair<std::string, std::string>>> WeightChecksums();
  // The full parameter `hf_name` (an HF name, as WeightChecksums lists them; lm_head.weight of
  // a tied model is embed_tokens.weight) on the CPU in the engine's dtype, the ranks' shards
  // joined as above. NotFound names a valid name; FailedPrecondition while offloaded.
  StatusOr<torch::Tensor> WeightByName(const std::string& hf_name);
  // The same for rank `rank` alone (full tensors in, its shard kept); for a caller that
  // received the full tensors on every rank (a weight broadcast inside OnEveryRank). Safe to
  // call for different ranks concurrently.
  Status UpdateRankWeights(int rank, const std::vector<model::NamedTensor>& tensors);

  // CUDA graphs for decode-only steps (CUDA builds with the paged decode kernel; elsewhere a
  // no-op): one graph per batch size up to max_batch (padded up to the next captured size),
  // covering the whole forward and the LM head, over static input buffers whose page tables
  // cover `context_length` tokens. Released/offloaded memory drops the graphs; resuming
  // captures them again. Off at tp_size > 1 (logged): the TP collectives wait on the host
  // with a deadline (comm::ProcessGroup's watchdog), which a graph capture cannot contain.
  Status CaptureDecodeGraphs(int64_t max_batch, int64_t context_length);
  bool has_decode_graphs() const;
  // A decode-only step (every item has one new token; rows in item order) through a graph:
  // logits [items.size(), vocab] float32, valid until the next call. NotFound when no captured
  // graph fits (the caller runs Forward + Logits instead).
  StatusOr<torch::Tensor> DecodeLogits(const std::vector<int32_t>& input_ids,
                                       const std::vector<PagedItem>& items);

  ~ModelRunner();

 private:
  // The full tensor of `spec` on the CPU (the ranks' shards joined along their split dim).
  StatusOr<torch::Tensor> FullWeight(const model::ParamSpec& spec) const;
  struct DecodeGraphs;
  class RankThreads;
  // One tensor-parallel rank: its model shard, K/V cache, weight offloader and its member of
  // the TP process group (null at tp_size 1).
  struct Rank {
    std::unique_ptr<model::DecoderModel> model;
    std::unique_ptr<PagedKvCache> kv;
    model::StorageOffloader weight_offloader;
    std::shared_ptr<comm::ProcessGroup> group;
  };
  ModelRunner() = default;
  void DropGraphs();
  // FailedPrecondition while the weights' device memory is released.
  Status CheckWeightsResident() const;
  std::unique_ptr<DecodeGraphs> graphs_;
  int64_t graph_max_batch_ = 0;
  int64_t graph_context_ = 0;
  std::vector<torch::Device> devices_;        // [tp_size]: rank r's device
  std::vector<std::unique_ptr<Rank>> ranks_;  // [tp_size]; ranks_[r]->model is rank r's shard
  std::unique_ptr<RankThreads> threads_;      // ranks 1..tp_size-1 (null at tp_size 1)
  bool weights_offloaded_ = false;
  bool fuse_projections_ = true;
};

}  // namespace slime::engine

#endif  // SLIME_ENGINE_MODEL_RUNNER_H_
