// ModelRunner: the model and its paged K/V cache, run one scheduled batch at a time.
//
// Owns the DecoderModel (weights on the engine device) and the PagedKvCache sized at start.
// Forward() takes the batch's new tokens and, per item, its page table and context length, runs
// the decoder over PagedAttention under inference mode and returns the final hidden states;
// Logits() turns chosen rows of them into float32 logits.
//
// Memory occupation (colocated training): ReleaseKv()/ResumeKv() free and re-allocate the K/V
// pools (contents lost); OffloadWeights()/OnloadWeights() move the weights' device memory to
// pinned host memory and back (model::StorageOffloader: contents kept, unlike SGLang, which
// discards them; every weight tensor and fused view stays the same object, at a new address,
// so the decode CUDA graphs are captured again).
//
// Thread-safety: the engine thread only. LibTorch errors surface as Status.
#ifndef SLIME_ENGINE_MODEL_RUNNER_H_
#define SLIME_ENGINE_MODEL_RUNNER_H_

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "slime/common/status.h"
#include "slime/engine/paged_kv.h"
#include "slime/model/decoder.h"
#include "slime/model/offload.h"

namespace slime::engine {

struct ModelRunnerOptions {
  std::string model_path;          // HF directory: config.json + *.safetensors
  std::string dtype = "auto";      // auto (bfloat16 on CUDA, float32 on CPU), bfloat16, float16, float32
  std::string device = "auto";     // auto (cuda:0 when available), cpu, cuda, cuda:N
  int64_t page_size = 16;
  int64_t max_total_tokens = 0;    // K/V slots; 0 = from mem_fraction_static (CUDA) or 65,536 (CPU)
  double mem_fraction_static = 0.85;  // CUDA: fraction of device memory for weights + K/V
  // CUDA: stack q|k|v and gate|up into one GEMM each and run the fused norm/RoPE/K-V-store
  // kernels (DecoderModel::FuseProjections). Off only to measure or test the unfused path.
  bool fuse_projections = true;
};

class ModelRunner {
 public:
  static StatusOr<std::unique_ptr<ModelRunner>> Create(const ModelRunnerOptions& options);

  const model::ModelConfig& config() const { return model_->config(); }
  model::DecoderModel& model() { return *model_; }
  PagedKvCache& kv() { return *kv_; }
  torch::Device device() const { return model_->device(); }
  torch::ScalarType dtype() const { return model_->dtype(); }
  int64_t num_pages() const { return kv_->num_pages(); }
  int64_t page_size() const { return kv_->page_size(); }

  // input_ids [T] host int32 values (the batch's new tokens in item order); items describe each
  // sequence's run of them. -> hidden [T, hidden] on the device.
  StatusOr<torch::Tensor> Forward(const std::vector<int32_t>& input_ids,
                                  const std::vector<PagedItem>& items);
  // hidden rows `rows` -> logits [R, vocab] float32.
  StatusOr<torch::Tensor> Logits(const torch::Tensor& hidden, const std::vector<int64_t>& rows);

  Status ReleaseKv();
  Status ResumeKv();
  Status OffloadWeights();
  Status OnloadWeights();
  bool weights_offloaded() const { return weights_offloaded_; }

  // Replaces every weight with the tensors of an HF safetensors directory (same architecture and
  // shapes; the error names the first mismatch). Copies in place, so views stay valid.
  Status LoadWeightsFromDisk(const std::string& model_path);
  // Replaces the weights named in `tensors` (HF names, full unsharded shapes, the engine's
  // dtype; any device) and leaves the others alone: any subset in any order, as SGLang's
  // load_weights accepts. lm_head.weight of a tied model is ignored. All or nothing: an unknown
  // name or a shape/dtype mismatch changes nothing and names the tensor (InvalidArgument).
  // Copies in place, so the fused q|k|v and gate|up buffers and captured CUDA graphs see the
  // new values.
  Status UpdateWeights(const std::vector<model::NamedTensor>& tensors);

  // CUDA graphs for decode-only steps (CUDA builds with the paged decode kernel; elsewhere a
  // no-op): one graph per batch size up to max_batch (padded up to the next captured size),
  // covering the whole forward and the LM head, over static input buffers whose page tables
  // cover `context_length` tokens. Released/offloaded memory drops the graphs; resuming
  // captures them again.
  Status CaptureDecodeGraphs(int64_t max_batch, int64_t context_length);
  bool has_decode_graphs() const;
  // A decode-only step (every item has one new token; rows in item order) through a graph:
  // logits [items.size(), vocab] float32, valid until the next call. NotFound when no captured
  // graph fits (the caller runs Forward + Logits instead).
  StatusOr<torch::Tensor> DecodeLogits(const std::vector<int32_t>& input_ids,
                                       const std::vector<PagedItem>& items);

  ~ModelRunner();

 private:
  struct DecodeGraphs;
  ModelRunner() = default;
  void DropGraphs();
  // FailedPrecondition while the weights' device memory is released.
  Status CheckWeightsResident() const;
  std::unique_ptr<DecodeGraphs> graphs_;
  int64_t graph_max_batch_ = 0;
  int64_t graph_context_ = 0;
  std::unique_ptr<model::DecoderModel> model_;
  std::unique_ptr<PagedKvCache> kv_;
  bool weights_offloaded_ = false;
  model::StorageOffloader weight_offloader_;
  bool fuse_projections_ = true;
};

}  // namespace slime::engine

#endif  // SLIME_ENGINE_MODEL_RUNNER_H_
