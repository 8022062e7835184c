// The decoder's parameters as plain tensors, and the one place where HF tensor names map to them.
//
// ModelWeights holds one tensor per HF parameter (no fusion), so sharding, swapping (weight sync)
// and saving stay a name lookup away. With tensor parallelism each tensor is this rank's shard
// (see tensor_parallel.h for the layouts); shapes below are for TP size P. A layer's
// feed-forward block (ffn/feed_forward.h: dense now, mixture-of-experts next) owns the layout
// of its tensors in LayerWeights::ffn and their part of the parameter list.
//
// ParameterSpecs() lists every parameter of a config with its HF name, full shape, TP split and
// initialisation; loading, random init, saving and NamedParameters() all walk that list — or,
// for a pipeline stage (pipeline_parallel.h), StageParameterSpecs(), the part of it the stage
// holds. A stage's ModelWeights keep `layers` sized to every layer of the config (global layer
// indices and HF names), with only the stage's layers set; `stage` says which.
//
// Random initialisation is counter-based: element i of parameter NAME is a function of
// (seed, NAME, i) only, so the same seed gives the same bytes whatever the thread count, device,
// dtype conversion order or TP split (a rank's shard equals the slice of the full tensor).
// Linear and embedding weights ~ N(0, initializer_range), norms = 1, biases = 0.
//
// Ownership: plain values; tensors share storage when copied. Thread-safety: none (one owner).
#ifndef SLIME_MODEL_WEIGHTS_H_
#define SLIME_MODEL_WEIGHTS_H_

#include <torch/types.h>

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "slime/common/status.h"
#include "slime/model/checkpoint.h"
#include "slime/model/config.h"
#include "slime/model/expert_parallel.h"
#include "slime/model/pipeline_parallel.h"

namespace slime::model {

// One layer's feed-forward block tensors, laid out by the layer's block (ffn/feed_forward.h;
// FeedForwardFor picks the block of a layer). `params` holds the block's parameters at the
// indices its parameter specs name (ParamSpec::block_slot; the dense MLP's are
// DenseMlp::Slot); `fused` its inference-only stacked buffers (FeedForwardBlock::
// FuseProjections), empty otherwise. A deque: ParamSlot grows `params` on first use without
// moving the tensors already there, so pointers into it stay valid.
struct FeedForwardWeights {
  std::deque<torch::Tensor> params;
  std::vector<torch::Tensor> fused;
};

struct LayerWeights {
  torch::Tensor input_norm;           // [hidden]
  torch::Tensor q_proj;               // [heads/P * head_dim, hidden]       column-parallel
  torch::Tensor q_bias;               // [heads/P * head_dim] or undefined
  torch::Tensor k_proj;               // [kv_heads/P * head_dim, hidden]    column-parallel
  torch::Tensor k_bias;               // [kv_heads/P * head_dim] or undefined
  torch::Tensor v_proj;               // [kv_heads/P * head_dim, hidden]    column-parallel
  torch::Tensor v_bias;               // [kv_heads/P * head_dim] or undefined
  torch::Tensor o_proj;               // [hidden, heads/P * head_dim]       row-parallel
  torch::Tensor o_bias;               // [hidden] or undefined
  torch::Tensor q_norm;               // [head_dim] (Qwen3) or undefined
  torch::Tensor k_norm;               // [head_dim] (Qwen3) or undefined
  torch::Tensor post_attention_norm;  // [hidden]
  FeedForwardWeights ffn;             // the feed-forward block's (dense: gate, up, down)
  // Inference only (DecoderModel::FuseProjections): q|k|v stacked along the output rows in one
  // buffer; q_proj..v_proj (and the q/k/v biases) are then views into it, so in-place weight
  // updates reach both (the block stacks its own projections in ffn.fused). Undefined otherwise.
  torch::Tensor qkv_proj;             // [(heads + 2 kv_heads)/P * head_dim, hidden]
  torch::Tensor qkv_bias;             // [(heads + 2 kv_heads)/P * head_dim] or undefined
};

struct ModelWeights {
  // First pipeline stage (and the last one's tied LM head copy); undefined elsewhere.
  torch::Tensor embed_tokens;  // [vocab/P, hidden]  vocab-parallel
  std::vector<LayerWeights> layers;  // every layer of the config; the stage's are set
  torch::Tensor final_norm;  // [hidden]  last pipeline stage only
  torch::Tensor
      lm_head;  // [vocab/P, hidden]  vocab-parallel; same tensor as embed_tokens when tied
  PipelineStage stage;  // which part of the model these are (default: all of it)
  // Which experts of the mixture-of-experts layers these hold (expert_parallel.h; default: all).
  // The others' slots in LayerWeights::ffn.params stay undefined.
  ExpertShard experts;
};

// How a parameter is split over tensor-parallel ranks.
enum class ShardDim { kReplicated = -1, kRows = 0, kColumns = 1 };
enum class ParamInit { kNormal, kOnes, kZeros };

struct ParamSpec {
  std::string hf_name;         // e.g. "model.layers.3.self_attn.q_proj.weight"
  std::vector<int64_t> shape;  // full, unsharded
  ShardDim shard = ShardDim::kReplicated;
  ParamInit init = ParamInit::kNormal;
  int layer = -1;  // -1: not a layer parameter
  // Where the tensor lives: a member of the layer's LayerWeights (layer >= 0, block_slot < 0),
  // LayerWeights::ffn.params[block_slot] (a feed-forward block parameter), or a member of
  // ModelWeights (layer < 0).
  torch::Tensor LayerWeights::*layer_slot = nullptr;
  int block_slot = -1;
  torch::Tensor ModelWeights::*model_slot = nullptr;
  // The expert a mixture-of-experts expert parameter belongs to (held by one expert-parallel
  // rank, ExpertShard); -1 for every other parameter.
  int64_t expert = -1;
};

// Every stored parameter of `config`, in HF order (embeddings, layers, norm, lm_head). With
// tied embeddings lm_head.weight is absent (HF does not store it).
std::vector<ParamSpec> ParameterSpecs(const ModelConfig& config);

// The parameters a pipeline stage holds, in ParameterSpecs order: the embedding on the first
// stage (and, with tied embeddings, on a last stage as its LM head copy — same HF name), its
// layers, the final norm and lm_head on the last stage. The whole list for a whole model. With
// an expert shard, only its experts' parameters among the expert parameters.
std::vector<ParamSpec> StageParameterSpecs(const ModelConfig& config, const PipelineStage& stage,
                                           const ExpertShard& experts = {});
// The parameters `weights` hold: StageParameterSpecs(config, weights.stage, weights.experts).
std::vector<ParamSpec> HeldParameterSpecs(const ModelConfig& config, const ModelWeights& weights);

// Checks an expert shard against `config`: size 1, or a mixture-of-experts model whose
// num_experts divides by the size (InvalidArgument naming both otherwise).
Status ValidateExpertShard(const ModelConfig& config, const ExpertShard& experts);

// The tensor of `weights` that `spec` names (layers must already be sized). The mutable form
// grows a layer's ffn.params to reach a block slot; the const form returns an undefined tensor
// for a block slot not there yet.
torch::Tensor& ParamSlot(ModelWeights& weights, const ParamSpec& spec);
const torch::Tensor& ParamSlot(const ModelWeights& weights, const ParamSpec& spec);

// Shape of rank `tp_rank`'s shard of `spec` in a group of `tp_size`.
std::vector<int64_t> ShardShape(const ParamSpec& spec, int tp_rank, int tp_size);

struct WeightOptions {
  torch::ScalarType dtype = torch::kFloat32;
  torch::Device device = torch::kCPU;
  int tp_rank = 0;
  int tp_size = 1;
  PipelineStage stage;  // load / generate only this stage's parameters
  ExpertShard experts;  // ... and of the experts only this block (expert parallelism)
};

// Loads this rank's shard of every parameter from `checkpoint`, checking names, shapes and
// dtypes against `config`. Tensors the model does not use are ignored.
StatusOr<ModelWeights> LoadWeights(const CheckpointReader& checkpoint, const ModelConfig& config,
                                   const WeightOptions& options);

// Deterministic random weights (see the header comment). Generated on CPU in float32, then
// converted to options.dtype and moved to options.device.
StatusOr<ModelWeights> RandomWeights(const ModelConfig& config, uint64_t seed,
                                     const WeightOptions& options);

// Checks that every parameter of weights.stage is present with its shard shape, and that all
// share one dtype and device; the error names the HF parameter.
Status ValidateWeights(const ModelWeights& weights, const ModelConfig& config, int tp_rank,
                       int tp_size);

// (HF name, tensor) for every parameter of weights.stage in ParameterSpecs order; shards when TP
// size > 1. A pipeline stage's tied LM head copy is listed as "model.embed_tokens.weight".
std::vector<NamedTensor> NamedParameters(const ModelWeights& weights, const ModelConfig& config);

// Writes the weights of a TP-size-1, whole (one pipeline stage, every expert) model as an HF
// checkpoint directory (safetensors only; the caller writes config.json).
Status SaveWeights(const std::string& dir, const ModelWeights& weights, const ModelConfig& config,
                   const WriteCheckpointOptions& options = {});

}  // namespace slime::model

#endif  // SLIME_MODEL_WEIGHTS_H_
