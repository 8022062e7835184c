// The decoder forward (see include/slime/model/decoder.h).
#include "slime/model/decoder.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <cmath>
#include <optional>

#include "slime/model/fused_train.h"
#include "torch_util.h"

#ifdef SLIME_MODEL_FUSED_KERNELS
#include <ATen/cuda/CUDAContext.h>

#include "cuda/fused_ops.h"
#endif

namespace slime::model {
namespace {

#ifdef SLIME_MODEL_FUSED_KERNELS
// The fused inference kernels serve the engine (InferenceMode); training on CUDA uses the
// autograd functions of fused_train.h, CPU the eager ops below.
bool Fusable(const torch::Tensor& x) {
  return x.is_cuda() && c10::InferenceMode::is_enabled() && x.is_contiguous() &&
         (x.scalar_type() == torch::kBFloat16 || x.scalar_type() == torch::kFloat32 ||
          x.scalar_type() == torch::kHalf);
}
cuda::DType FusedType(const torch::Tensor& x) {
  return x.scalar_type() == torch::kBFloat16 ? cuda::DType::kBFloat16
         : x.scalar_type() == torch::kHalf   ? cuda::DType::kFloat16
                                             : cuda::DType::kFloat32;
}
void* Stream() { return at::cuda::getCurrentCUDAStream().stream(); }
#endif

// x [..., n] -> weight * (x / rms(x)) with the normalisation in float32.
torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  if (FusedTrainingApplies(x) && weight.scalar_type() == x.scalar_type() &&
      weight.dim() == 1 && weight.numel() == x.size(-1) && x.size(-1) <= 12288) {
    return FusedRmsNorm(x, weight, eps);
  }
#ifdef SLIME_MODEL_FUSED_KERNELS
  if (Fusable(x) && weight.is_contiguous() && weight.scalar_type() == x.scalar_type() &&
      weight.numel() == x.size(-1)) {
    torch::Tensor y = torch::empty_like(x);
    const int err = cuda::LaunchRmsNorm(x.data_ptr(), weight.data_ptr(), y.data_ptr(),
                                        x.numel() / x.size(-1), static_cast<int>(x.size(-1)),
                                        static_cast<float>(eps), FusedType(x), Stream());
    TORCH_CHECK(err == 0, "fused RMSNorm failed with CUDA error ", err);
    return y;
  }
#endif
  torch::Tensor xf = x.to(torch::kFloat32);
  torch::Tensor var = xf.pow(2).mean(-1, /*keepdim=*/true);
  xf = xf * torch::rsqrt(var + eps);
  return weight * xf.to(x.scalar_type());
}

// [..., D] -> [-x2, x1] with x1, x2 the halves of the last dim.
torch::Tensor RotateHalf(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// x [T, heads, D] rotated by cos/sin [T, 1, D]: x * cos + rotate_half(x) * sin.
torch::Tensor ApplyRope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  if (FusedTrainingApplies(x) && x.dim() == 3 && x.size(2) % 2 == 0 &&
      cos.scalar_type() == x.scalar_type() && sin.scalar_type() == x.scalar_type() &&
      cos.numel() == x.size(0) * x.size(2) && sin.numel() == cos.numel()) {
    return FusedRope(x, cos, sin);
  }
#ifdef SLIME_MODEL_FUSED_KERNELS
  if (Fusable(x) && cos.is_contiguous() && sin.is_contiguous() &&
      cos.scalar_type() == x.scalar_type() && cos.numel() == x.size(0) * x.size(2)) {
    torch::Tensor y = torch::empty_like(x);
    const int err = cuda::LaunchRope(x.data_ptr(), cos.data_ptr(), sin.data_ptr(), y.data_ptr(),
                                     x.size(0), static_cast<int>(x.size(1)),
                                     static_cast<int>(x.size(2)), FusedType(x), Stream());
    TORCH_CHECK(err == 0, "fused RoPE failed with CUDA error ", err);
    return y;
  }
#endif
  return x * cos + RotateHalf(x) * sin;
}

// silu(gate) * up.
torch::Tensor SiluMul(const torch::Tensor& gate, const torch::Tensor& up) {
  if (FusedTrainingApplies(gate) && up.sizes() == gate.sizes() &&
      up.scalar_type() == gate.scalar_type()) {
    return FusedSiluMul(gate, up);
  }
#ifdef SLIME_MODEL_FUSED_KERNELS
  if (Fusable(gate) && up.is_contiguous() && up.sizes() == gate.sizes() &&
      up.scalar_type() == gate.scalar_type()) {
    torch::Tensor y = torch::empty_like(gate);
    const int err = cuda::LaunchSiluMul(gate.data_ptr(), up.data_ptr(), y.data_ptr(),
                                        gate.numel(), FusedType(gate), Stream());
    TORCH_CHECK(err == 0, "fused SiLU*up failed with CUDA error ", err);
    return y;
  }
#endif
  return torch::silu(gate) * up;
}

}  // namespace

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
}  // namespace

DecoderModel::DecoderModel(ModelConfig config, ModelWeights weights,
                           std::shared_ptr<TensorParallelGroup> tp)
    : config_(std::move(config)),
      weights_(std::move(weights)),
      tp_(std::move(tp)),
      dtype_(AnyParameter(weights_).scalar_type()),
      device_(AnyParameter(weights_).device()) {
  inv_freq_ = RopeInverseFrequencies(config_).to(device_);
}

StatusOr<std::unique_ptr<DecoderModel>> DecoderModel::Create(
    ModelConfig config, ModelWeights weights, std::shared_ptr<TensorParallelGroup> tp) {
  if (tp == nullptr) tp = MakeSingleRankGroup();
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
            new DecoderModel(std::move(config), std::move(weights), std::move(tp)));
      });
}

StatusOr<std::unique_ptr<DecoderModel>> DecoderModel::Load(
    const std::string& model_dir, torch::ScalarType dtype, torch::Device device,
    std::shared_ptr<TensorParallelGroup> tp, int pp_rank, int pp_size) {
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
  SLIME_ASSIGN_OR_RETURN(ModelWeights weights, LoadWeights(reader, config, options));
  return Create(std::move(config), std::move(weights), std::move(tp));
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

torch::Tensor DecoderModel::Layer(int index, const torch::Tensor& x, const torch::Tensor& cos,
                                  const torch::Tensor& sin, AttentionBackend& attention) {
  const LayerWeights& w = weights_.layers[index];
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
  auto row_parallel = [&](const torch::Tensor& in, const torch::Tensor& weight,
                          const torch::Tensor& bias) {
    return sp ? RowParallelLinearToSequenceShard(in, weight, bias, tp)
              : RowParallelLinear(in, weight, bias, tp);
  };

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
  torch::Tensor a = attention.Attend(index, q, k, v);  // [T, heads/P, D]
  torch::Tensor out = x + row_parallel(a.reshape({t, -1}), w.o_proj, w.o_bias);

  // MLP block.
  h = region_input(out, w.post_attention_norm);
  torch::Tensor gate = ColumnParallelLinear(h, w.gate_proj, {}, tp, false, true);  // [T, I/P]
  torch::Tensor up = ColumnParallelLinear(h, w.up_proj, {}, tp, false, true);      // [T, I/P]
  return out + row_parallel(SiluMul(gate, up), w.down_proj, {});  // [T or rows_r, hidden]
}

torch::Tensor DecoderModel::ForwardImpl(const torch::Tensor& ids, const torch::Tensor& positions,
                                        AttentionBackend& attention) {
  const PipelineStage& stage = weights_.stage;
  const bool sp = sequence_parallel();
  const int64_t total = ids.size(0);
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
#ifdef SLIME_MODEL_FUSED_KERNELS
  if (!sp && projections_fused() && Fusable(x) && c10::InferenceMode::is_enabled()) {
    return FusedForward(x, cos, sin, attention);
  }
#endif
  const int64_t end = stage.end_layer < 0 ? config_.num_hidden_layers : stage.end_layer;
  for (int l = static_cast<int>(stage.first_layer); l < static_cast<int>(end); ++l) {
    x = Layer(l, x, cos, sin, attention);
  }
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
    VarlenAttention attention(cu_seqlens, attention_impl_);
    return ForwardImpl(input, VarlenPositions(cu_seqlens).to(device_), attention);
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

// ---- fused inference path

bool DecoderModel::projections_fused() const {
  return !weights_.layers.empty() && weights_.layers.front().qkv_proj.defined();
}

void DecoderModel::FuseProjections() {
#ifdef SLIME_MODEL_FUSED_KERNELS
  if (projections_fused() || !weights_.stage.whole() || weights_.layers.empty() ||
      !weights_.layers.front().q_proj.is_cuda() ||
      !cuda::QkNormRopeSupported(config_.head_dim)) {
    return;
  }
  torch::NoGradGuard no_grad;  // not InferenceMode: the weights must stay updatable in place
  for (LayerWeights& w : weights_.layers) {
    const int64_t nq = w.q_proj.size(0), nk = w.k_proj.size(0), nv = w.v_proj.size(0);
    w.qkv_proj = torch::cat({w.q_proj, w.k_proj, w.v_proj}, 0);
    w.q_proj = w.qkv_proj.narrow(0, 0, nq);
    w.k_proj = w.qkv_proj.narrow(0, nq, nk);
    w.v_proj = w.qkv_proj.narrow(0, nq + nk, nv);
    if (w.q_bias.defined()) {
      w.qkv_bias = torch::cat({w.q_bias, w.k_bias, w.v_bias}, 0);
      w.q_bias = w.qkv_bias.narrow(0, 0, nq);
      w.k_bias = w.qkv_bias.narrow(0, nq, nk);
      w.v_bias = w.qkv_bias.narrow(0, nq + nk, nv);
    }
    const int64_t ni = w.gate_proj.size(0);
    w.gate_up_proj = torch::cat({w.gate_proj, w.up_proj}, 0);
    w.gate_proj = w.gate_up_proj.narrow(0, 0, ni);
    w.up_proj = w.gate_up_proj.narrow(0, ni, ni);
  }
#endif
}

void DecoderModel::UnfuseProjections() {
  if (!projections_fused()) return;
  torch::NoGradGuard no_grad;
  for (LayerWeights& w : weights_.layers) {
    for (torch::Tensor* t : {&w.q_proj, &w.k_proj, &w.v_proj, &w.q_bias, &w.k_bias, &w.v_bias,
                             &w.gate_proj, &w.up_proj}) {
      if (t->defined()) *t = t->clone();
    }
    w.qkv_proj = torch::Tensor();
    w.qkv_bias = torch::Tensor();
    w.gate_up_proj = torch::Tensor();
  }
}

#ifdef SLIME_MODEL_FUSED_KERNELS
// q/k norm + RoPE on the fused q|k|v rows in place (and the K/V store where the backend lets the
// kernel write its cache), then the backend's attention. Returns [T, heads, D].
torch::Tensor DecoderModel::QkNormRopeAttend(int l, const torch::Tensor& qkv,
                                             const LayerWeights& w, const torch::Tensor& cos,
                                             const torch::Tensor& sin,
                                             AttentionBackend& attention) {
  const int64_t t = qkv.size(0);
  const int64_t d = config_.head_dim;
  const int64_t heads = local_heads(), kv_heads = local_kv_heads();
  const double eps = config_.rms_norm_eps;
  const cuda::DType dt = FusedType(qkv);
  std::optional<AttentionBackend::KvWriteTarget> kv = attention.DirectKvWrite(l);
  cuda::QkNormRopeArgs a;
  a.qkv = qkv.data_ptr();
  a.tokens = t;
  a.row_stride = qkv.size(1);
  a.heads = static_cast<int>(heads);
  a.kv_heads = static_cast<int>(kv_heads);
  a.d = static_cast<int>(d);
  a.q_norm = config_.qk_norm ? w.q_norm.data_ptr() : nullptr;
  a.k_norm = config_.qk_norm ? w.k_norm.data_ptr() : nullptr;
  a.eps = static_cast<float>(eps);
  a.cos = cos.data_ptr();
  a.sin = sin.data_ptr();
  if (kv) {
    a.k_cache = kv->k_cache.data_ptr();
    a.v_cache = kv->v_cache.data_ptr();
    a.slots = kv->slots.data_ptr<int64_t>();
  }
  a.dtype = dt;
  const int err = cuda::LaunchQkNormRope(a, Stream());
  TORCH_CHECK(err == 0, "fused q/k norm + RoPE failed with CUDA error ", err);
  torch::Tensor q = qkv.narrow(1, 0, heads * d).view({t, heads, d});
  torch::Tensor k, v;
  if (!kv) {
    k = qkv.narrow(1, heads * d, kv_heads * d).view({t, kv_heads, d});
    v = qkv.narrow(1, (heads + kv_heads) * d, kv_heads * d).view({t, kv_heads, d});
  }
  return attention.Attend(l, q, k, v);  // [T, heads, D]
}
#endif

torch::Tensor DecoderModel::FusedForward(const torch::Tensor& x_in, const torch::Tensor& cos,
                                         const torch::Tensor& sin, AttentionBackend& attention) {
#ifdef SLIME_MODEL_FUSED_KERNELS
  const double eps = config_.rms_norm_eps;
  const int64_t t = x_in.size(0);
  const int64_t n = config_.hidden_size;
  const int64_t heads = local_heads(), kv_heads = local_kv_heads();
  TensorParallelGroup& tp = *tp_;
  const cuda::DType dt = FusedType(x_in);
  // `residual` is the running x of the eager Layer: each block's output is added into it, in
  // place, by the next AddRmsNorm (one kernel for "out = x + block; h = norm(out)") or, in decode
  // steps, by the block's last GEMM itself (fuse_norm below).
  torch::Tensor residual = x_in.contiguous();  // the embedding output, owned by the caller's frame
  torch::Tensor delta;  // the block output AddRmsNorm adds; undefined: already in `residual`
  auto add_norm = [&](const torch::Tensor& w) {
    torch::Tensor y = torch::empty_like(residual);
    const int err = cuda::LaunchAddRmsNorm(residual.data_ptr(),
                                           delta.defined() ? delta.data_ptr() : nullptr,
                                           w.data_ptr(), y.data_ptr(), t, static_cast<int>(n),
                                           static_cast<float>(eps), dt, Stream());
    TORCH_CHECK(err == 0, "fused add+RMSNorm failed with CUDA error ", err);
    return y;
  };
  // Decode steps (a few rows, one rank): our small-m GEMM streams the weights near HBM bandwidth;
  // otherwise the Megatron-style layers (cuBLAS, and the all-reduce of row-parallel outputs).
  const bool small_gemm = tp.size() == 1 && cuda::SmallGemmSupported(t, n, dt);
  static const bool silu_gemm = cuda::DecodeFusionEnabled("silu_gemm");
  auto linear = [&](const torch::Tensor& in, const torch::Tensor& weight, const torch::Tensor& b,
                    bool row_parallel) {
    if (small_gemm && in.is_contiguous() && weight.is_contiguous() &&
        cuda::SmallGemmSupported(t, in.size(1), dt)) {
      torch::Tensor y = torch::empty({t, weight.size(0)}, in.options());
      const int err = cuda::LaunchSmallGemm(in.data_ptr(), weight.data_ptr(),
                                            b.defined() ? b.data_ptr() : nullptr, y.data_ptr(), t,
                                            weight.size(0), in.size(1), dt, Stream());
      TORCH_CHECK(err == 0, "small-m GEMM failed with CUDA error ", err);
      return y;
    }
    return row_parallel ? RowParallelLinear(in, weight, b, tp)
                        : ColumnParallelLinear(in, weight, b, tp, false);
  };
  // Decode steps: the RMSNorms inside the q|k|v and gate|up GEMMs, the residual adds inside the
  // o and down GEMMs (five kernels a layer; the same bits as the separate kernels).
  static const bool norm_gemm = cuda::DecodeFusionEnabled("norm_gemm");
  auto weights_contiguous = [&] {
    for (const LayerWeights& w : weights_.layers) {
      if (!w.qkv_proj.defined()) continue;  // not this pipeline stage's layer
      if (!w.qkv_proj.is_contiguous() || !w.o_proj.is_contiguous() ||
          !w.gate_up_proj.is_contiguous() || !w.down_proj.is_contiguous()) {
        return false;
      }
    }
    return true;
  };
  // One row only: at 2, 4 and 8 rows the folded kernels measured slower than the separate ones
  // (docs/benchmarks.md, "Five kernels a layer").
  const bool fuse_norm = small_gemm && silu_gemm && norm_gemm && t == 1 &&
                         cuda::NormGemmSupported(t, n, dt) && weights_contiguous();
  auto norm_linear = [&](const torch::Tensor& norm_w, const torch::Tensor& weight,
                         const torch::Tensor& b, bool silu) {
    const int64_t out = silu ? weight.size(0) / 2 : weight.size(0);
    torch::Tensor y = torch::empty({t, out}, residual.options());
    const float e = static_cast<float>(eps);
    const int err =
        silu ? cuda::LaunchNormSmallGemmSiluMul(residual.data_ptr(), norm_w.data_ptr(), e,
                                                weight.data_ptr(), y.data_ptr(), t, out, n, dt,
                                                Stream())
             : cuda::LaunchNormSmallGemm(residual.data_ptr(), norm_w.data_ptr(), e,
                                         weight.data_ptr(), b.defined() ? b.data_ptr() : nullptr,
                                         y.data_ptr(), t, out, n, dt, Stream());
    TORCH_CHECK(err == 0, "small-m GEMM with RMSNorm failed with CUDA error ", err);
    return y;
  };
  auto linear_into_residual = [&](const torch::Tensor& x, const torch::Tensor& weight,
                                  const torch::Tensor& b) {
    const torch::Tensor in = x.contiguous();
    const int err = cuda::LaunchSmallGemmAddResidual(
        in.data_ptr(), weight.data_ptr(), b.defined() ? b.data_ptr() : nullptr,
        residual.data_ptr(), t, weight.size(0), in.size(1), dt, Stream());
    TORCH_CHECK(err == 0, "small-m GEMM into the residual failed with CUDA error ", err);
  };
  torch::Tensor h;
  if (!fuse_norm) h = RmsNorm(residual, weights_.layers[0].input_norm, eps);
  for (int l = 0; l < static_cast<int>(config_.num_hidden_layers); ++l) {
    const LayerWeights& w = weights_.layers[l];
    torch::Tensor qkv;
    if (fuse_norm) {
      qkv = norm_linear(w.input_norm, w.qkv_proj, w.qkv_bias, false);
    } else {
      if (l > 0) h = add_norm(w.input_norm);
      qkv = linear(h, w.qkv_proj, w.qkv_bias, false);
    }
    // Decode steps of the paged engine: q/k norm + RoPE and the K/V store inside the attention
    // kernel; otherwise our q/k norm + RoPE kernel, then the backend's Attend.
    AttentionBackend::RawQkv raw;
    raw.qkv = qkv;
    if (config_.qk_norm) {
      raw.q_norm = w.q_norm;
      raw.k_norm = w.k_norm;
    }
    raw.cos = cos;
    raw.sin = sin;
    raw.eps = eps;
    raw.heads = heads;
    raw.kv_heads = kv_heads;
    torch::Tensor o;
    if (std::optional<torch::Tensor> fused = attention.AttendRawQkv(l, raw)) {
      o = *std::move(fused);
    } else {
      o = QkNormRopeAttend(l, qkv, w, cos, sin, attention);
    }
    if (fuse_norm) {
      linear_into_residual(o.reshape({t, -1}), w.o_proj, w.o_bias);
      torch::Tensor act = norm_linear(w.post_attention_norm, w.gate_up_proj, {}, true);
      linear_into_residual(act, w.down_proj, {});
      continue;
    }
    delta = linear(o.reshape({t, -1}), w.o_proj, w.o_bias, true);
    h = add_norm(w.post_attention_norm);
    const int64_t inter = w.gate_up_proj.size(0) / 2;
    torch::Tensor act;
    if (small_gemm && silu_gemm && w.gate_up_proj.is_contiguous()) {
      // Decode: the gate/up GEMM writes SiLU(gate)·up directly.
      act = torch::empty({t, inter}, h.options());
      const int err2 = cuda::LaunchSmallGemmSiluMul(h.data_ptr(), w.gate_up_proj.data_ptr(),
                                                    act.data_ptr(), t, inter, n, dt, Stream());
      TORCH_CHECK(err2 == 0, "small-m gate/up GEMM + SiLU failed with CUDA error ", err2);
    } else {
      torch::Tensor gu = linear(h, w.gate_up_proj, {}, false);  // [T, 2 I/P]
      act = torch::empty({t, inter}, gu.options());
      const int err2 =
          cuda::LaunchSiluMulPacked(gu.data_ptr(), act.data_ptr(), t, inter, dt, Stream());
      TORCH_CHECK(err2 == 0, "fused SiLU*up failed with CUDA error ", err2);
    }
    delta = linear(act, w.down_proj, {}, true);
  }
  return add_norm(weights_.final_norm);  // fused decode: `delta` undefined, the sum is in place
#else
  TORCH_CHECK(false, "fused forward without the fused kernels");
  return {};
#endif
}

KvCache DecoderModel::NewKvCache(int64_t capacity) const {
  return KvCache(config_.num_hidden_layers, capacity, local_kv_heads(), config_.head_dim,
                 torch::TensorOptions().dtype(dtype_).device(device_));
}

}  // namespace slime::model
