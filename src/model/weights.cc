// Parameter table, loading, random initialisation and saving (see include/slime/model/weights.h).
#include "slime/model/weights.h"

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <cmath>
#include <deque>

#include "slime/model/ffn/feed_forward.h"
#include "torch_util.h"

namespace slime::model {
namespace {

void AddLayerParam(std::vector<ParamSpec>& specs, int layer, const std::string& suffix,
                   std::vector<int64_t> shape, ShardDim shard, ParamInit init,
                   torch::Tensor LayerWeights::*slot) {
  ParamSpec s;
  s.hf_name = fmt::format("model.layers.{}.{}", layer, suffix);
  s.shape = std::move(shape);
  s.shard = shard;
  s.init = init;
  s.layer = layer;
  s.layer_slot = slot;
  specs.push_back(std::move(s));
}

void AddModelParam(std::vector<ParamSpec>& specs, const std::string& name,
                   std::vector<int64_t> shape, ShardDim shard, ParamInit init,
                   torch::Tensor ModelWeights::*slot) {
  ParamSpec s;
  s.hf_name = name;
  s.shape = std::move(shape);
  s.shard = shard;
  s.init = init;
  s.model_slot = slot;
  specs.push_back(std::move(s));
}

// --- Counter-based normal generator -------------------------------------------------------------

inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t ParamKey(uint64_t seed, const std::string& name) {
  uint64_t h = 0xCBF29CE484222325ull;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 0x100000001B3ull;
  return SplitMix64(SplitMix64(seed) ^ h);
}

// Standard normal for element `i` of the stream `key` (Box–Muller on two hashed uniforms).
inline double NormalAt(uint64_t key, uint64_t i) {
  const uint64_t a = SplitMix64(key + 2 * i);
  const uint64_t b = SplitMix64(key + 2 * i + 1);
  const double u1 = static_cast<double>((a >> 11) + 1) * 0x1.0p-53;  // (0, 1]
  const double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;        // [0, 1)
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

// Fills this rank's shard of a normal parameter. The full tensor is viewed as [R, C] (1-D: C=1);
// the shard is rows [r0, r0+r) x cols [c0, c0+c); element (i, j) is stream index (r0+i)*C + c0+j.
torch::Tensor RandomShard(const ParamSpec& spec, uint64_t seed, double stddev, int tp_rank,
                          int tp_size) {
  std::vector<int64_t> local = ShardShape(spec, tp_rank, tp_size);
  const int64_t full_cols = spec.shape.size() > 1 ? spec.shape[1] : 1;
  const int64_t rows = local[0];
  const int64_t cols = local.size() > 1 ? local[1] : 1;
  const int64_t r0 = spec.shard == ShardDim::kRows ? rows * tp_rank : 0;
  const int64_t c0 = spec.shard == ShardDim::kColumns ? cols * tp_rank : 0;
  torch::Tensor out = torch::empty(local, torch::kFloat32);
  float* data = out.data_ptr<float>();
  const uint64_t key = ParamKey(seed, spec.hf_name);
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(cols, 1));
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const uint64_t base = static_cast<uint64_t>((r0 + i) * full_cols + c0);
      float* row = data + i * cols;
      for (int64_t j = 0; j < cols; ++j) {
        row[j] = static_cast<float>(stddev * NormalAt(key, base + static_cast<uint64_t>(j)));
      }
    }
  });
  return out;
}

}  // namespace

std::vector<ParamSpec> ParameterSpecs(const ModelConfig& c) {
  std::vector<ParamSpec> specs;
  const int64_t h = c.hidden_size;
  AddModelParam(specs, "model.embed_tokens.weight", {c.vocab_size, h}, ShardDim::kRows,
                ParamInit::kNormal, &ModelWeights::embed_tokens);
  for (int l = 0; l < static_cast<int>(c.num_hidden_layers); ++l) {
    AddLayerParam(specs, l, "self_attn.q_proj.weight", {c.q_size(), h}, ShardDim::kRows,
                  ParamInit::kNormal, &LayerWeights::q_proj);
    if (c.qkv_bias) {
      AddLayerParam(specs, l, "self_attn.q_proj.bias", {c.q_size()}, ShardDim::kRows,
                    ParamInit::kZeros, &LayerWeights::q_bias);
    }
    AddLayerParam(specs, l, "self_attn.k_proj.weight", {c.kv_size(), h}, ShardDim::kRows,
                  ParamInit::kNormal, &LayerWeights::k_proj);
    if (c.qkv_bias) {
      AddLayerParam(specs, l, "self_attn.k_proj.bias", {c.kv_size()}, ShardDim::kRows,
                    ParamInit::kZeros, &LayerWeights::k_bias);
    }
    AddLayerParam(specs, l, "self_attn.v_proj.weight", {c.kv_size(), h}, ShardDim::kRows,
                  ParamInit::kNormal, &LayerWeights::v_proj);
    if (c.qkv_bias) {
      AddLayerParam(specs, l, "self_attn.v_proj.bias", {c.kv_size()}, ShardDim::kRows,
                    ParamInit::kZeros, &LayerWeights::v_bias);
    }
    AddLayerParam(specs, l, "self_attn.o_proj.weight", {h, c.q_size()}, ShardDim::kColumns,
                  ParamInit::kNormal, &LayerWeights::o_proj);
    if (c.o_bias) {
      AddLayerParam(specs, l, "self_attn.o_proj.bias", {h}, ShardDim::kReplicated,
                    ParamInit::kZeros, &LayerWeights::o_bias);
    }
    if (c.qk_norm) {
      AddLayerParam(specs, l, "self_attn.q_norm.weight", {c.head_dim}, ShardDim::kReplicated,
                    ParamInit::kOnes, &LayerWeights::q_norm);
      AddLayerParam(specs, l, "self_attn.k_norm.weight", {c.head_dim}, ShardDim::kReplicated,
                    ParamInit::kOnes, &LayerWeights::k_norm);
    }
    FeedForwardFor(c, l).AppendParameterSpecs(c, l, specs);  // "mlp.*"
    AddLayerParam(specs, l, "input_layernorm.weight", {h}, ShardDim::kReplicated, ParamInit::kOnes,
                  &LayerWeights::input_norm);
    AddLayerParam(specs, l, "post_attention_layernorm.weight", {h}, ShardDim::kReplicated,
                  ParamInit::kOnes, &LayerWeights::post_attention_norm);
  }
  AddModelParam(specs, "model.norm.weight", {h}, ShardDim::kReplicated, ParamInit::kOnes,
                &ModelWeights::final_norm);
  if (!c.tie_word_embeddings) {
    AddModelParam(specs, "lm_head.weight", {c.vocab_size, h}, ShardDim::kRows, ParamInit::kNormal,
                  &ModelWeights::lm_head);
  }
  return specs;
}

// Counted from the parameter table, so every feed-forward block's parameters count as its
// specs say (the declaration is in the torch-free config.h).
int64_t ModelConfig::NumParameters() const {
  int64_t total = 0;
  for (const ParamSpec& spec : ParameterSpecs(*this)) {
    int64_t n = 1;
    for (int64_t d : spec.shape) n *= d;
    total += n;
  }
  return total;
}

std::vector<ParamSpec> StageParameterSpecs(const ModelConfig& c, const PipelineStage& stage,
                                           const ExpertShard& experts) {
  std::vector<ParamSpec> specs = ParameterSpecs(c);
  if (stage.whole() && experts.whole()) return specs;
  std::vector<ParamSpec> out;
  for (ParamSpec& spec : specs) {
    bool mine = false;
    if (spec.expert >= 0 && !experts.Holds(spec.expert, c.moe.num_experts)) {
      mine = false;  // another expert-parallel rank's expert
    } else if (stage.whole()) {
      mine = true;
    } else if (spec.layer >= 0) {
      mine = stage.HasLayer(spec.layer);
    } else if (spec.model_slot == &ModelWeights::embed_tokens) {
      mine = stage.is_first() || stage.HoldsTiedCopy(c.tie_word_embeddings);
    } else {
      mine = stage.is_last();  // final norm, lm_head
    }
    if (mine) out.push_back(std::move(spec));
  }
  return out;
}

std::vector<ParamSpec> HeldParameterSpecs(const ModelConfig& config, const ModelWeights& weights) {
  return StageParameterSpecs(config, weights.stage, weights.experts);
}

Status ValidateExpertShard(const ModelConfig& config, const ExpertShard& experts) {
  if (experts.size < 1 || experts.rank < 0 || experts.rank >= experts.size) {
    return absl::InvalidArgumentError(fmt::format(
        "expert-parallel rank {} of {} is not a rank of the group", experts.rank, experts.size));
  }
  if (experts.whole()) return absl::OkStatus();
  if (config.moe.num_experts <= 0) {
    return absl::InvalidArgumentError(fmt::format(
        "expert parallelism (size {}) needs a mixture-of-experts model; model_type '{}' has no "
        "experts",
        experts.size, config.model_type));
  }
  if (config.moe.num_experts % experts.size != 0) {
    return absl::InvalidArgumentError(fmt::format(
        "model config ({}): num_experts = {} is not divisible by the expert-parallel size {}",
        config.model_type, config.moe.num_experts, experts.size));
  }
  return absl::OkStatus();
}

namespace {
// The stage of `options` checked against the config's layers.
Status CheckStage(const ModelConfig& config, const PipelineStage& stage) {
  SLIME_ASSIGN_OR_RETURN(PipelineStage want,
                         MakePipelineStage(config.num_hidden_layers, stage.rank, stage.size));
  if (want.first_layer != stage.first_layer || want.end_layer != stage.end_layer) {
    return absl::InvalidArgumentError(fmt::format(
        "pipeline stage {} of {} holds layers [{}, {}), but the even split of {} layers gives "
        "[{}, {})",
        stage.rank, stage.size, stage.first_layer, stage.end_layer, config.num_hidden_layers,
        want.first_layer, want.end_layer));
  }
  return absl::OkStatus();
}
}  // namespace

torch::Tensor& ParamSlot(ModelWeights& weights, const ParamSpec& spec) {
  if (spec.layer < 0) return weights.*(spec.model_slot);
  LayerWeights& layer = weights.layers.at(spec.layer);
  if (spec.block_slot < 0) return layer.*(spec.layer_slot);
  std::deque<torch::Tensor>& params = layer.ffn.params;
  if (params.size() <= static_cast<size_t>(spec.block_slot)) params.resize(spec.block_slot + 1);
  return params[spec.block_slot];
}

const torch::Tensor& ParamSlot(const ModelWeights& weights, const ParamSpec& spec) {
  if (spec.layer < 0) return weights.*(spec.model_slot);
  const LayerWeights& layer = weights.layers.at(spec.layer);
  if (spec.block_slot < 0) return layer.*(spec.layer_slot);
  static const torch::Tensor kUnset;
  const std::deque<torch::Tensor>& params = layer.ffn.params;
  return static_cast<size_t>(spec.block_slot) < params.size() ? params[spec.block_slot] : kUnset;
}

std::vector<int64_t> ShardShape(const ParamSpec& spec, int tp_rank, int tp_size) {
  std::vector<int64_t> shape = spec.shape;
  const int dim = static_cast<int>(spec.shard);
  if (dim >= 0 && dim < static_cast<int>(shape.size())) shape[dim] /= tp_size;
  return shape;
}

StatusOr<ModelWeights> LoadWeights(const CheckpointReader& checkpoint, const ModelConfig& config,
                                   const WeightOptions& options) {
  SLIME_RETURN_IF_ERROR(ValidateTensorParallel(config, options.tp_size));
  SLIME_RETURN_IF_ERROR(CheckStage(config, options.stage));
  SLIME_RETURN_IF_ERROR(ValidateExpertShard(config, options.experts));
  ModelWeights w;
  w.stage = options.stage;
  w.experts = options.experts;
  w.layers.resize(config.num_hidden_layers);
  for (const ParamSpec& spec : HeldParameterSpecs(config, w)) {
    LoadTensorOptions o;
    o.expected_shape = spec.shape;
    if (spec.shard != ShardDim::kReplicated && options.tp_size > 1) {
      o.slice = TensorSlice{static_cast<int64_t>(spec.shard), options.tp_rank, options.tp_size};
    }
    o.dtype = options.dtype;
    o.device = options.device;
    StatusOr<torch::Tensor> t = checkpoint.Load(spec.hf_name, o);
    if (!t.ok()) {
      if (absl::IsNotFound(t.status())) {
        return absl::NotFoundError(
            fmt::format("{}: tensor '{}' is missing (required by the {} config with {} layers{})",
                        checkpoint.dir(), spec.hf_name, config.model_type, config.num_hidden_layers,
                        config.tie_word_embeddings ? ", tied embeddings" : ""));
      }
      return t.status();
    }
    ParamSlot(w, spec) = *std::move(t);
  }
  if (config.tie_word_embeddings && w.stage.is_last()) w.lm_head = w.embed_tokens;
  return w;
}

StatusOr<ModelWeights> RandomWeights(const ModelConfig& config, uint64_t seed,
                                     const WeightOptions& options) {
  SLIME_RETURN_IF_ERROR(ValidateTensorParallel(config, options.tp_size));
  SLIME_RETURN_IF_ERROR(CheckStage(config, options.stage));
  SLIME_RETURN_IF_ERROR(ValidateExpertShard(config, options.experts));
  return internal::GuardTorch("random model weights", [&]() -> StatusOr<ModelWeights> {
    ModelWeights w;
    w.stage = options.stage;
    w.experts = options.experts;
    w.layers.resize(config.num_hidden_layers);
    for (const ParamSpec& spec : HeldParameterSpecs(config, w)) {
      torch::Tensor t;
      switch (spec.init) {
        case ParamInit::kOnes:
          t = torch::ones(ShardShape(spec, options.tp_rank, options.tp_size), torch::kFloat32);
          break;
        case ParamInit::kZeros:
          t = torch::zeros(ShardShape(spec, options.tp_rank, options.tp_size), torch::kFloat32);
          break;
        case ParamInit::kNormal:
          t = RandomShard(spec, seed, config.initializer_range, options.tp_rank, options.tp_size);
          break;
      }
      ParamSlot(w, spec) = t.to(options.device, options.dtype);
    }
    if (config.tie_word_embeddings && w.stage.is_last()) w.lm_head = w.embed_tokens;
    return w;
  });
}

Status ValidateWeights(const ModelWeights& weights, const ModelConfig& config, int tp_rank,
                       int tp_size) {
  SLIME_RETURN_IF_ERROR(ValidateTensorParallel(config, tp_size));
  SLIME_RETURN_IF_ERROR(CheckStage(config, weights.stage));
  SLIME_RETURN_IF_ERROR(ValidateExpertShard(config, weights.experts));
  if (static_cast<int64_t>(weights.layers.size()) != config.num_hidden_layers) {
    return absl::InvalidArgumentError(fmt::format("model weights have {} layers, config has {}",
                                                  weights.layers.size(), config.num_hidden_layers));
  }
  const torch::Tensor* first = nullptr;
  for (const ParamSpec& spec : HeldParameterSpecs(config, weights)) {
    const torch::Tensor& t = ParamSlot(weights, spec);
    if (!t.defined()) {
      return absl::InvalidArgumentError(fmt::format("parameter '{}' is not set", spec.hf_name));
    }
    std::vector<int64_t> want = ShardShape(spec, tp_rank, tp_size);
    if (t.sizes() != c10::IntArrayRef(want)) {
      return absl::InvalidArgumentError(fmt::format("parameter '{}' has shape {}, expected {}",
                                                    spec.hf_name, internal::ShapeString(t.sizes()),
                                                    internal::ShapeString(want)));
    }
    if (first == nullptr) {
      first = &t;
    } else if (t.scalar_type() != first->scalar_type() || t.device() != first->device()) {
      return absl::InvalidArgumentError(
          fmt::format("parameter '{}' is {} on {}, but others are {} on {}", spec.hf_name,
                      std::string(c10::toString(t.scalar_type())), t.device().str(),
                      std::string(c10::toString(first->scalar_type())), first->device().str()));
    }
  }
  if (weights.stage.is_last() && !weights.lm_head.defined()) {
    return absl::InvalidArgumentError("parameter 'lm_head.weight' is not set");
  }
  return absl::OkStatus();
}

std::vector<NamedTensor> NamedParameters(const ModelWeights& weights, const ModelConfig& config) {
  std::vector<NamedTensor> out;
  for (const ParamSpec& spec : HeldParameterSpecs(config, weights)) {
    out.push_back(NamedTensor{spec.hf_name, ParamSlot(weights, spec)});
  }
  return out;
}

Status SaveWeights(const std::string& dir, const ModelWeights& weights, const ModelConfig& config,
                   const WriteCheckpointOptions& options) {
  if (!weights.stage.whole()) {
    return absl::InvalidArgumentError(fmt::format(
        "SaveWeights needs the whole model, not pipeline stage {} of {}", weights.stage.rank,
        weights.stage.size));
  }
  if (!weights.experts.whole()) {
    return absl::InvalidArgumentError(
        fmt::format("SaveWeights needs every expert, not expert-parallel rank {} of {}'s block",
                    weights.experts.rank, weights.experts.size));
  }
  SLIME_RETURN_IF_ERROR(ValidateWeights(weights, config, 0, 1));
  return WriteCheckpoint(dir, NamedParameters(weights, config), options);
}

}  // namespace slime::model
