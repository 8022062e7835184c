// The decoder: creation, the eager forward passes (training, CPU, unfused inference) and the
// LM head (see include/slime/model/decoder.h). The fused inference path is fused_inference.cc.
#include "slime/model/decoder.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <cmath>
#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "activation_checkpoint.h"
#include "decoder_ops.h"
#include "fused_inference.h"
#include "torch_util.h"

namespace slime::model {

using internal::ApplyRope;
using internal::RmsNorm;

torch::Tensor RopeInverseFrequencies(const ModelConfig& config) {
  const int64_t dim = config.head_dim;
  const RopeConfig& rope = config.rope;
  torch::Tensor exponent = torch::arange(0, dim, 2, torch::kLong).to(torch::kFloat32) / dim;
  torch::Tensor inv_freq = 1.0 / torch::pow(rope.theta, exponent);  // [D/2] float32
  switch (rope.type) {
    case RopeType::kDefault:
      break;
    case RopeType::kLinear:
      inv_freq = inv_freq / rope.factor;
      break;
    case RopeType::kLlama3: {
      const double old_len = static_cast<double>(rope.original_max_position_embeddings);
      const double low_wavelen = old_len / rope.low_freq_factor;
      const double high_wavelen = old_len / rope.high_freq_factor;
      torch::Tensor wavelen = 2 * M_PI / inv_freq;
      torch::Tensor scaled = torch::where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq);
      torch::Tensor smooth = (old_len / wavelen - rope.low_freq_factor) /
                             (rope.high_freq_factor - rope.low_freq_factor);
      torch::Tensor smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled;
      torch::Tensor medium =
          (wavelen < high_wavelen).logical_not() & (wavelen > low_wavelen).logical_not();
      inv_freq = torch::where(medium, smoothed, scaled);
      break;
    }
  }
  return inv_freq;
}

namespace {
// A parameter every stage has: the embedding on the first stage, else its first layer's norm.
const torch::Tensor& AnyParameter(const ModelWeights& w) {
  if (w.embed_tokens.defined()) return w.embed_tokens;
  return w.layers.at(w.stage.first_layer).input_norm;
}

// The tensor of layer parameter `spec` in one layer's weights (ParamSlot's layer half).
torch::Tensor& LayerTensor(LayerWeights& w, const ParamSpec& spec) {
  if (spec.block_slot < 0) return w.*(spec.layer_slot);
  std::deque<torch::Tensor>& params = w.ffn.params;
  if (params.size() <= static_cast<size_t>(spec.block_slot)) params.resize(spec.block_slot + 1);
  return params[spec.block_slot];
}
}  // namespace

DecoderModel::DecoderModel(ModelConfig config, ModelWeights weights,
                           std::shared_ptr<TensorParallelGroup> tp,
                           std::shared_ptr<ExpertParallelGroup> ep)
    : config_(std::move(config)),
      weights_(std::move(weights)),
      tp_(std::move(tp)),
      ep_(std::move(ep)),
      dtype_(AnyParameter(weights_).scalar_type()),
      device_(AnyParameter(weights_).device()) {
  inv_freq_ = RopeInverseFrequencies(config_).to(device_);
  for (int l = 0; l < static_cast<int>(config_.num_hidden_layers); ++l) {
    ffn_.push_back(&FeedForwardFor(config_, l));
  }
  layer_specs_.resize(config_.num_hidden_layers);
  for (ParamSpec& spec : ParameterSpecs(config_)) {
    if (spec.layer >= 0) layer_specs_.at(spec.layer).push_back(std::move(spec));
  }
}

Status DecoderModel::set_routing_replay(std::vector<torch::Tensor> experts) {
  if (experts.empty()) {
    routing_replay_ = nullptr;
    return absl::OkStatus();
  }
  if (static_cast<int64_t>(experts.size()) != config_.num_hidden_layers) {
    return absl::InvalidArgumentError(fmt::format("routing replay for {} layers; the model has {}",
                                       experts.size(), config_.num_hidden_layers));
  }
  routing_replay_ = std::make_shared<const std::vector<torch::Tensor>>(std::move(experts));
  return absl::OkStatus();
}

Status DecoderModel::SetRecompute(const RecomputeOptions& options) {
  SLIME_RETURN_IF_ERROR(ValidateRecompute(options, weights_.stage, config_.num_hidden_layers));
  recompute_ = options;
  return absl::OkStatus();
}

StatusOr<std::unique_ptr<DecoderModel>> DecoderModel::Create(
    ModelConfig config, ModelWeights weights, std::shared_ptr<TensorParallelGroup> tp,
    std::shared_ptr<ExpertParallelGroup> ep) {
  if (tp == nullptr) tp = MakeSingleRankGroup();
  if (ep != nullptr && ep->size() == 1) ep = nullptr;
  const ExpertShard want = ep == nullptr ? ExpertShard{} : ExpertShard{ep->rank(), ep->size()};
  if (weights.experts.rank != want.rank || weights.experts.size != want.size) {
    return absl::InvalidArgumentError(fmt::format(
        "the weights hold expert block {} of {}, but the expert-parallel group is rank {} of {}",
        weights.experts.rank, weights.experts.size, want.rank, want.size));
  }
  SLIME_RETURN_IF_ERROR(ValidateWeights(weights, config, tp->rank(), tp->size()));
  const torch::ScalarType dt = AnyParameter(weights).scalar_type();
  if (dt != torch::kFloat32 && dt != torch::kBFloat16 && dt != torch::kFloat16) {
    return absl::InvalidArgumentError(
        fmt::format("model weights must be float32, bfloat16 or float16, got {}",
                    std::string(c10::toString(dt))));
  }
  return internal::GuardTorch(
      "creating the decoder", [&]() -> StatusOr<std::unique_ptr<DecoderModel>> {
        return std::unique_ptr<DecoderModel>(
            new DecoderModel(std::move(config), std::move(weights), std::move(tp), std::move(ep)));
      });
}

StatusOr<std::unique_ptr<DecoderModel>> DecoderModel::Load(
    const std::string& model_dir, torch::ScalarType dtype, torch::Device device,
    std::shared_ptr<TensorParallelGroup> tp, int pp_rank, int pp_size,
    std::shared_ptr<ExpertParallelGroup> ep) {
  if (tp == nullptr) tp = MakeSingleRankGroup();
  SLIME_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(model_dir));
  SLIME_ASSIGN_OR_RETURN(PipelineStage stage,
                         MakePipelineStage(config.num_hidden_layers, pp_rank, pp_size));
  SLIME_ASSIGN_OR_RETURN(CheckpointReader reader, CheckpointReader::Open(model_dir));
  WeightOptions options;
  options.dtype = dtype;
  options.device = device;
  options.tp_rank = tp->rank();
  options.tp_size = tp->size();
  options.stage = stage;
  if (ep != nullptr) options.experts = ExpertShard{ep->rank(), ep->size()};
  SLIME_ASSIGN_OR_RETURN(ModelWeights weights, LoadWeights(reader, config, options));
  return Create(std::move(config), std::move(weights), std::move(tp), std::move(ep));
}

Status DecoderModel::CheckIds(const torch::Tensor& ids) const {
  if (!ids.defined() || ids.dim() != 1 || !c10::isIntegralType(ids.scalar_type(), false)) {
    return absl::InvalidArgumentError(fmt::format(
        "input_ids must be a 1-D integer tensor [T], got {}",
        ids.defined() ? fmt::format("{} {}", std::string(c10::toString(ids.scalar_type())),
                                    internal::ShapeString(ids.sizes()))
                      : std::string("an undefined tensor")));
  }
  if (ids.numel() == 0) return absl::InvalidArgumentError("input_ids is empty");
  const int64_t lo = ids.min().item<int64_t>();
  const int64_t hi = ids.max().item<int64_t>();
  if (lo < 0 || hi >= config_.vocab_size) {
    return absl::InvalidArgumentError(
        fmt::format("input_ids contain {} outside the vocabulary [0, {})", lo < 0 ? lo : hi,
                    config_.vocab_size));
  }
  return absl::OkStatus();
}

Status DecoderModel::CheckWhole(const char* what) const {
  if (weights_.stage.whole()) return absl::OkStatus();
  return absl::FailedPreconditionError(fmt::format(
      "{} needs the whole model; this is pipeline stage {} of {} (layers [{}, {}))", what,
      weights_.stage.rank, weights_.stage.size, weights_.stage.first_layer,
      weights_.stage.end_layer));
}

torch::Tensor DecoderModel::Layer(int index, const LayerWeights& w, const torch::Tensor& x,
                                  const torch::Tensor& cos, const torch::Tensor& sin,
                                  AttentionBackend& attention, const RoutingReplay& replay,
                                  const std::shared_ptr<AttentionBackend>& checkpointed_attention) {
  const double eps = config_.rms_norm_eps;
  const int64_t t = cos.size(0);  // all T tokens (x holds this rank's rows under SP)
  const int64_t d = config_.head_dim;
  TensorParallelGroup& tp = *tp_;
  const bool sp = sequence_parallel();
  // The input of the column-parallel layers: normed x entering the TP region once for q/k/v
  // (one all-reduce of its gradient in training) or, under SP, all-gathered from the sequence
  // shards (reduce-scatter of the gradient; the norm weight then sees only this rank's rows).
  auto region_input = [&](const torch::Tensor& in, const torch::Tensor& norm) {
    if (!sp) return CopyToTensorParallelRegion(RmsNorm(in, norm, eps), tp);
    return GatherFromSequenceParallelRegion(
        RmsNorm(in, CopyToTensorParallelRegion(norm, tp), eps), tp, t, /*reduce_grad=*/true);
  };
  FeedForwardContext ctx{config_, index, tp, sp};
  ctx.ep = ep_.get();
  if (capture_router_logits_) ctx.router_logits = &router_logits_.at(index);
  if (capture_routed_experts_) ctx.routed_experts = &routed_experts_.at(index);
  if (replay != nullptr && (*replay)[index].defined()) ctx.replay_experts = &(*replay)[index];

  // Attention block.
  torch::Tensor h = region_input(x, w.input_norm);  // [T, hidden]
  torch::Tensor q = ColumnParallelLinear(h, w.q_proj, w.q_bias, tp, false, true).view({t, -1, d});
  torch::Tensor k = ColumnParallelLinear(h, w.k_proj, w.k_bias, tp, false, true).view({t, -1, d});
  torch::Tensor v = ColumnParallelLinear(h, w.v_proj, w.v_bias, tp, false, true).view({t, -1, d});
  // q [T, heads/P, D], k/v [T, kv_heads/P, D]
  if (config_.qk_norm) {
    // q_norm / k_norm are replicated, but each rank applies them to its own heads only: their
    // gradient is a partial sum over heads, so the weights enter the TP region (all-reduce of
    // the gradient) like a column-parallel input.
    q = RmsNorm(q, CopyToTensorParallelRegion(w.q_norm, tp), eps);
    k = RmsNorm(k, CopyToTensorParallelRegion(w.k_norm, tp), eps);
  }
  q = ApplyRope(q, cos, sin);
  k = ApplyRope(k, cos, sin);
  torch::Tensor a;  // [T, heads/P, D]
  if (checkpointed_attention != nullptr) {
    // Selective recomputation: q, k, v are kept, the scores and probabilities are not.
    a = internal::Checkpoint(
        [attend = checkpointed_attention, index](const std::vector<torch::Tensor>& in) {
          return attend->Attend(index, in[0], in[1], in[2]);
        },
        {q, k, v});
  } else {
    a = attention.Attend(index, q, k, v);
  }
  torch::Tensor out = x + ctx.RowParallel(a.reshape({t, -1}), w.o_proj, w.o_bias);

  // Feed-forward block (ffn/feed_forward.h).
  h = region_input(out, w.post_attention_norm);
  torch::Tensor y = out + ffn_[index]->Forward(w.ffn, h, ctx);  // [T or rows_r, hidden]
  if (router_loss_hook_ && ctx.router_logits != nullptr && ctx.router_logits->defined()) {
    y = router_loss_hook_(index, *ctx.router_logits, y);
  }
  return y;
}

torch::Tensor DecoderModel::RecomputedRun(const LayerRun& run, const torch::Tensor& x,
                                          const torch::Tensor& cos, const torch::Tensor& sin,
                                          std::shared_ptr<AttentionBackend> attention,
                                          RoutingReplay replay) {
  // The region's inputs: x, then every parameter the run's layers hold, in spec order.
  std::vector<torch::Tensor> inputs{x};
  std::vector<const ParamSpec*> slots;  // inputs[1 + i] is slots[i]'s tensor
  for (int64_t l = run.first; l < run.end; ++l) {
    for (const ParamSpec& spec : layer_specs_[l]) {
      const torch::Tensor& t = ParamSlot(std::as_const(weights_), spec);
      if (!t.defined()) continue;
      inputs.push_back(t);
      slots.push_back(&spec);
    }
  }
  auto region = [this, run, cos, sin, attention = std::move(attention), replay = std::move(replay),
                 slots = std::move(slots)](const std::vector<torch::Tensor>& in) {
    // The layers' weights with every parameter replaced by the region's input for it.
    std::vector<LayerWeights> w(weights_.layers.begin() + run.first,
                                weights_.layers.begin() + run.end);
    for (size_t i = 0; i < slots.size(); ++i) {
      LayerTensor(w[slots[i]->layer - run.first], *slots[i]) = in[1 + i];
    }
    torch::Tensor h = in[0];
    for (int64_t l = run.first; l < run.end; ++l) {
      h = Layer(static_cast<int>(l), w[l - run.first], h, cos, sin, *attention, replay);
    }
    return h;
  };
  return internal::Checkpoint(std::move(region), inputs);
}

torch::Tensor DecoderModel::StageLayers(torch::Tensor x, const torch::Tensor& cos,
                                        const torch::Tensor& sin, AttentionBackend& attention,
                                        const std::shared_ptr<AttentionBackend>& owned) {
  const PipelineStage& stage = weights_.stage;
  const int64_t end = stage.end_layer < 0 ? config_.num_hidden_layers : stage.end_layer;
  const bool recompute = owned != nullptr && recompute_.granularity != RecomputeGranularity::kNone &&
                         torch::GradMode::is_enabled() && !projections_fused();
  const RoutingReplay replay = routing_replay_;  // this forward's, for its recomputed regions
  if (!recompute) {
    for (int64_t l = stage.first_layer; l < end; ++l) {
      x = Layer(static_cast<int>(l), weights_.layers[l], x, cos, sin, attention, replay);
    }
    return x;
  }
  const std::shared_ptr<AttentionBackend> selective = recompute_.selective() ? owned : nullptr;
  for (const LayerRun& run : RecomputePlan(recompute_, stage.first_layer, end)) {
    if (run.recompute) {
      x = RecomputedRun(run, x, cos, sin, owned, replay);
      continue;
    }
    for (int64_t l = run.first; l < run.end; ++l) {
      x = Layer(static_cast<int>(l), weights_.layers[l], x, cos, sin, attention, replay, selective);
    }
  }
  return x;
}

torch::Tensor DecoderModel::ForwardImpl(const torch::Tensor& ids, const torch::Tensor& positions,
                                        AttentionBackend& attention,
                                        const std::shared_ptr<AttentionBackend>& owned) {
  const PipelineStage& stage = weights_.stage;
  const bool sp = sequence_parallel();
  const int64_t total = ids.size(0);
  if (capture_router_logits_) router_logits_.assign(config_.num_hidden_layers, torch::Tensor());
  if (capture_routed_experts_) routed_experts_.assign(config_.num_hidden_layers, torch::Tensor());
  // [T, hidden] (or this rank's sequence shard under SP): the embedding, or (a later pipeline
  // stage) the previous stage's output.
  torch::Tensor x;
  if (stage.is_first()) {
    x = sp ? VocabParallelEmbeddingToSequenceShard(ids, weights_.embed_tokens, *tp_)
           : VocabParallelEmbedding(ids, weights_.embed_tokens, *tp_);
  } else {
    x = sp ? ScatterToSequenceParallelRegion(ids, *tp_) : ids;
  }
  // RoPE tables in float32, then the model dtype, as transformers: [T, 1, D].
  torch::Tensor freqs = positions.to(torch::kFloat32).unsqueeze(1) * inv_freq_.unsqueeze(0);
  torch::Tensor emb = torch::cat({freqs, freqs}, -1);
  torch::Tensor cos = emb.cos().to(dtype_).unsqueeze(1);
  torch::Tensor sin = emb.sin().to(dtype_).unsqueeze(1);
  if (!sp && projections_fused() && internal::InferenceKernelsApply(x)) {
    return FusedForward(x, cos, sin, attention);  // fused_inference.cc
  }
  x = StageLayers(x, cos, sin, attention, owned);
  // Under SP the stage's output is gathered to all T rows. Its gradient arrives identical on
  // every rank (the next stage scatters its input; the LM head's input enters copy-to-region),
  // so each rank keeps its own rows of it rather than reduce-scattering.
  if (!stage.is_last()) {  // the residual stream, for the next stage
    return sp ? GatherFromSequenceParallelRegion(x, *tp_, total, /*reduce_grad=*/false) : x;
  }
  if (!sp) return RmsNorm(x, weights_.final_norm, config_.rms_norm_eps);
  return GatherFromSequenceParallelRegion(
      RmsNorm(x, CopyToTensorParallelRegion(weights_.final_norm, *tp_), config_.rms_norm_eps),
      *tp_, total, /*reduce_grad=*/false);
}

StatusOr<torch::Tensor> DecoderModel::Forward(const torch::Tensor& input_ids,
                                              const torch::Tensor& position_ids,
                                              AttentionBackend& attention) {
  return internal::GuardTorch("decoder forward", [&]() -> StatusOr<torch::Tensor> {
    SLIME_RETURN_IF_ERROR(CheckWhole("Forward"));
    SLIME_RETURN_IF_ERROR(CheckIds(input_ids));
    if (!position_ids.defined() || position_ids.sizes() != input_ids.sizes()) {
      return absl::InvalidArgumentError("position_ids must have the shape of input_ids [T]");
    }
    return ForwardImpl(input_ids.to(device_, torch::kLong), position_ids.to(device_, torch::kLong),
                       attention);
  });
}

StatusOr<torch::Tensor> DecoderModel::ForwardPacked(const torch::Tensor& input_ids,
                                                    const std::vector<int64_t>& cu_seqlens) {
  return internal::GuardTorch("decoder packed forward", [&]() -> StatusOr<torch::Tensor> {
    torch::Tensor input;
    if (weights_.stage.is_first()) {
      SLIME_RETURN_IF_ERROR(CheckIds(input_ids));
      input = input_ids.to(device_, torch::kLong);
    } else {
      if (!input_ids.defined() || input_ids.dim() != 2 ||
          input_ids.size(1) != config_.hidden_size || !input_ids.is_floating_point()) {
        return absl::InvalidArgumentError(fmt::format(
            "pipeline stage {}: the input must be the previous stage's hidden states [T, {}], got "
            "{}",
            weights_.stage.rank, config_.hidden_size,
            input_ids.defined() ? internal::ShapeString(input_ids.sizes()) : "undefined"));
      }
      input = input_ids.to(device_, dtype_);
    }
    SLIME_RETURN_IF_ERROR(ValidateCuSeqlens(cu_seqlens, input.size(0)));
    // Owned by the recomputed regions too (they run it again in the backward).
    auto attention = std::make_shared<VarlenAttention>(cu_seqlens, attention_impl_);
    return ForwardImpl(input, VarlenPositions(cu_seqlens).to(device_), *attention, attention);
  });
}

StatusOr<torch::Tensor> DecoderModel::ForwardWithCache(const torch::Tensor& input_ids,
                                                       const std::vector<int64_t>& cu_seqlens,
                                                       const std::vector<KvCache*>& caches) {
  return internal::GuardTorch("decoder KV-cache forward", [&]() -> StatusOr<torch::Tensor> {
    SLIME_RETURN_IF_ERROR(CheckWhole("ForwardWithCache"));
    SLIME_RETURN_IF_ERROR(CheckIds(input_ids));
    SLIME_RETURN_IF_ERROR(ValidateCuSeqlens(cu_seqlens, input_ids.size(0)));
    for (size_t b = 0; b < caches.size(); ++b) {
      const KvCache* c = caches[b];
      if (c == nullptr) continue;  // reported by KvCacheAttention::Create
      const bool ok = c->num_layers() == config_.num_hidden_layers &&
                      c->keys(0).size(1) == local_kv_heads() &&
                      c->keys(0).size(2) == config_.head_dim &&
                      c->keys(0).scalar_type() == dtype_ && c->keys(0).device() == device_;
      if (!ok) {
        return absl::InvalidArgumentError(fmt::format(
            "KV cache {} does not fit this model (want {} layers of [*, {}, {}] {} on {})", b,
            config_.num_hidden_layers, local_kv_heads(), config_.head_dim,
            std::string(c10::toString(dtype_)), device_.str()));
      }
    }
    SLIME_ASSIGN_OR_RETURN(KvCacheAttention attention,
                           KvCacheAttention::Create(cu_seqlens, caches, attention_impl_));
    torch::NoGradGuard no_grad;
    torch::Tensor hidden = ForwardImpl(input_ids.to(device_, torch::kLong),
                                       attention.Positions().to(device_), attention);
    attention.Commit();
    return hidden;
  });
}

StatusOr<torch::Tensor> DecoderModel::ForwardWithCache(const torch::Tensor& input_ids,
                                                       KvCache& cache) {
  const int64_t n = input_ids.defined() && input_ids.dim() == 1 ? input_ids.size(0) : 0;
  return ForwardWithCache(input_ids, {0, n}, std::vector<KvCache*>{&cache});
}

StatusOr<torch::Tensor> DecoderModel::Logits(const torch::Tensor& hidden, bool gather) {
  return internal::GuardTorch("decoder logits", [&]() -> StatusOr<torch::Tensor> {
    if (!weights_.stage.is_last()) {
      return absl::FailedPreconditionError(fmt::format(
          "Logits: pipeline stage {} of {} has no LM head (the last stage has it)",
          weights_.stage.rank, weights_.stage.size));
    }
    if (!hidden.defined() || hidden.dim() != 2 || hidden.size(1) != config_.hidden_size) {
      return absl::InvalidArgumentError(fmt::format("hidden must be [T, {}]", config_.hidden_size));
    }
    return VocabParallelLmHead(hidden, weights_.lm_head, *tp_, gather);  // [T, vocab(/P)]
  });
}

KvCache DecoderModel::NewKvCache(int64_t capacity) const {
  return KvCache(config_.num_hidden_layers, capacity, local_kv_heads(), config_.head_dim,
                 torch::TensorOptions().dtype(dtype_).device(device_));
}

}  // namespace slime::model
