// The decoder's fused inference path (CUDA, c10::InferenceMode; docs/architecture.md, "Fused
// inference path"): the projection fusion, the shared state and GEMM helpers of
// fused_inference.h, and DecoderModel::FusedForward — a layer is add + RMSNorm, the q|k|v GEMM,
// q/k norm + RoPE (+ the K/V store), attention, the o GEMM, add + RMSNorm and the feed-forward
// block's fused forward; single-row decode steps fold the norms and residual adds into the GEMMs.
// The kernels are src/model/cuda's, launched from here and from the blocks (ffn/).
#include "fused_inference.h"

#include <torch/torch.h>

#include <optional>

#include "decoder_ops.h"
#include "slime/model/batch_invariant.h"
#include "slime/model/decoder.h"

#ifdef SLIME_MODEL_FUSED_KERNELS
#include <ATen/cuda/CUDAContext.h>

#include "cuda/fused_ops.h"
#endif

namespace slime::model {
namespace internal {

bool InferenceKernelsApply(const torch::Tensor& x) {
#ifdef SLIME_MODEL_FUSED_KERNELS
  // Deterministic mode takes the eager ops and batch-invariant kernels instead.
  return x.is_cuda() && !BatchInvariant() && c10::InferenceMode::is_enabled() && x.is_contiguous() &&
         (x.scalar_type() == torch::kBFloat16 || x.scalar_type() == torch::kFloat32 ||
          x.scalar_type() == torch::kHalf);
#else
  (void)x;
  return false;
#endif
}

cuda::DType KernelDType(const torch::Tensor& x) {
  return x.scalar_type() == torch::kBFloat16 ? cuda::DType::kBFloat16
         : x.scalar_type() == torch::kHalf   ? cuda::DType::kFloat16
                                             : cuda::DType::kFloat32;
}

void* CurrentStream() {
#ifdef SLIME_MODEL_FUSED_KERNELS
  return at::cuda::getCurrentCUDAStream().stream();
#else
  TORCH_CHECK(false, "no CUDA stream: the fused kernels are not built");
  return nullptr;
#endif
}

void CheckLaunch(int err, const char* what) {
  TORCH_CHECK(err == 0, what, " failed with CUDA error ", err);
}

torch::Tensor FusedForwardState::Linear(const torch::Tensor& in, const torch::Tensor& weight,
                                        const torch::Tensor& b, bool row_parallel) const {
#ifdef SLIME_MODEL_FUSED_KERNELS
  if (small_gemm && in.is_contiguous() && weight.is_contiguous() &&
      cuda::SmallGemmSupported(t, in.size(1), dt)) {
    torch::Tensor y = torch::empty({t, weight.size(0)}, in.options());
    CheckLaunch(cuda::LaunchSmallGemm(in.data_ptr(), weight.data_ptr(),
                                      b.defined() ? b.data_ptr() : nullptr, y.data_ptr(), t,
                                      weight.size(0), in.size(1), dt, CurrentStream()),
                "small-m GEMM");
    return y;
  }
#endif
  return row_parallel ? RowParallelLinear(in, weight, b, *tp)
                      : ColumnParallelLinear(in, weight, b, *tp, false);
}

#ifdef SLIME_MODEL_FUSED_KERNELS
torch::Tensor FusedForwardState::AddNorm(const torch::Tensor& delta,
                                         const torch::Tensor& norm_weight) const {
  torch::Tensor y = torch::empty_like(residual);
  CheckLaunch(
      cuda::LaunchAddRmsNorm(residual.data_ptr(), delta.defined() ? delta.data_ptr() : nullptr,
                             norm_weight.data_ptr(), y.data_ptr(), t, static_cast<int>(n),
                             static_cast<float>(eps), dt, CurrentStream()),
      "fused add+RMSNorm");
  return y;
}

torch::Tensor FusedForwardState::NormLinear(const torch::Tensor& norm_weight,
                                            const torch::Tensor& weight,
                                            const torch::Tensor& b) const {
  torch::Tensor y = torch::empty({t, weight.size(0)}, residual.options());
  CheckLaunch(cuda::LaunchNormSmallGemm(residual.data_ptr(), norm_weight.data_ptr(),
                                        static_cast<float>(eps), weight.data_ptr(),
                                        b.defined() ? b.data_ptr() : nullptr, y.data_ptr(), t,
                                        weight.size(0), n, dt, CurrentStream()),
              "small-m GEMM with RMSNorm");
  return y;
}

void FusedForwardState::LinearIntoResidual(const torch::Tensor& x, const torch::Tensor& weight,
                                           const torch::Tensor& b) const {
  const torch::Tensor in = x.contiguous();
  CheckLaunch(cuda::LaunchSmallGemmAddResidual(
                  in.data_ptr(), weight.data_ptr(), b.defined() ? b.data_ptr() : nullptr,
                  residual.data_ptr(), t, weight.size(0), in.size(1), dt, CurrentStream()),
              "small-m GEMM into the residual");
}
#else
torch::Tensor FusedForwardState::AddNorm(const torch::Tensor&, const torch::Tensor&) const {
  TORCH_CHECK(false, "fused forward without the fused kernels");
  return {};
}
torch::Tensor FusedForwardState::NormLinear(const torch::Tensor&, const torch::Tensor&,
                                            const torch::Tensor&) const {
  TORCH_CHECK(false, "fused forward without the fused kernels");
  return {};
}
void FusedForwardState::LinearIntoResidual(const torch::Tensor&, const torch::Tensor&,
                                           const torch::Tensor&) const {
  TORCH_CHECK(false, "fused forward without the fused kernels");
}
#endif

}  // namespace internal

// ---- projection fusion

bool DecoderModel::projections_fused() const {
  return !weights_.layers.empty() && weights_.layers.front().qkv_proj.defined();
}

bool DecoderModel::ForwardWaitsOnHost() const {
  for (size_t l = 0; l < weights_.layers.size(); ++l) {
    if (ffn_[l]->WaitsOnHost(weights_.layers[l].ffn)) return true;
  }
  return false;
}

void DecoderModel::FuseProjections() {
#ifdef SLIME_MODEL_FUSED_KERNELS
  if (projections_fused() || !weights_.stage.whole() || weights_.layers.empty() ||
      !weights_.layers.front().q_proj.is_cuda() || !cuda::QkNormRopeSupported(config_.head_dim)) {
    return;
  }
  torch::NoGradGuard no_grad;  // not InferenceMode: the weights must stay updatable in place
  for (size_t l = 0; l < weights_.layers.size(); ++l) {
    LayerWeights& w = weights_.layers[l];
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
    ffn_[l]->FuseProjections(w.ffn);
  }
#endif
}

void DecoderModel::UnfuseProjections() {
  if (!projections_fused()) return;
  torch::NoGradGuard no_grad;
  for (size_t l = 0; l < weights_.layers.size(); ++l) {
    LayerWeights& w = weights_.layers[l];
    for (torch::Tensor* t : {&w.q_proj, &w.k_proj, &w.v_proj, &w.q_bias, &w.k_bias, &w.v_bias}) {
      if (t->defined()) *t = t->clone();
    }
    w.qkv_proj = torch::Tensor();
    w.qkv_bias = torch::Tensor();
    ffn_[l]->UnfuseProjections(w.ffn);
  }
}

// ---- the fused forward

#ifdef SLIME_MODEL_FUSED_KERNELS
namespace {

// Single-row decode steps on one rank fold the RMSNorms into the q|k|v and first feed-forward
// GEMMs and the residual adds into the o and last feed-forward GEMMs (five kernels a layer, the
// same bits as the separate kernels), where every layer's weights and block allow it. One row
// only: at 2, 4 and 8 rows the folded kernels measured slower than the separate ones
// (docs/benchmarks.md, "Five kernels a layer").
bool FoldNorms(const ModelWeights& weights, const std::vector<const FeedForwardBlock*>& ffn,
               const internal::FusedForwardState& s) {
  static const bool norm_gemm = cuda::DecodeFusionEnabled("norm_gemm");
  if (!s.small_gemm || !norm_gemm || s.t != 1 || !cuda::NormGemmSupported(s.t, s.n, s.dt)) {
    return false;
  }
  for (size_t l = 0; l < weights.layers.size(); ++l) {
    const LayerWeights& w = weights.layers[l];
    if (!w.qkv_proj.defined()) continue;  // not this pipeline stage's layer
    if (!w.qkv_proj.is_contiguous() || !w.o_proj.is_contiguous() || !ffn[l]->FoldsNorm(w.ffn)) {
      return false;
    }
  }
  return true;
}

}  // namespace

// The backend's raw-q|k|v kernel (decode steps of the paged engine: q/k norm + RoPE and the K/V
// store inside the attention kernel) where it takes the step; otherwise q/k norm + RoPE on the
// fused q|k|v rows in place (and the K/V store where the backend lets the kernel write its cache),
// then the backend's Attend.
torch::Tensor DecoderModel::FusedAttention(int l, const torch::Tensor& qkv, const LayerWeights& w,
                                           const torch::Tensor& cos, const torch::Tensor& sin,
                                           AttentionBackend& attention) {
  const int64_t t = qkv.size(0);
  const int64_t d = config_.head_dim;
  const int64_t heads = local_heads(), kv_heads = local_kv_heads();
  const double eps = config_.rms_norm_eps;
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
  if (std::optional<torch::Tensor> fused = attention.AttendRawQkv(l, raw)) {
    return *std::move(fused);
  }
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
  a.dtype = internal::KernelDType(qkv);
  internal::CheckLaunch(cuda::LaunchQkNormRope(a, internal::CurrentStream()),
                        "fused q/k norm + RoPE");
  torch::Tensor q = qkv.narrow(1, 0, heads * d).view({t, heads, d});
  torch::Tensor k, v;
  if (!kv) {
    k = qkv.narrow(1, heads * d, kv_heads * d).view({t, kv_heads, d});
    v = qkv.narrow(1, (heads + kv_heads) * d, kv_heads * d).view({t, kv_heads, d});
  }
  return attention.Attend(l, q, k, v);  // [T, heads, D]
}
#else
torch::Tensor DecoderModel::FusedAttention(int, const torch::Tensor&, const LayerWeights&,
                                           const torch::Tensor&, const torch::Tensor&,
                                           AttentionBackend&) {
  TORCH_CHECK(false, "fused forward without the fused kernels");
  return {};
}
#endif

torch::Tensor DecoderModel::FusedForward(const torch::Tensor& x_in, const torch::Tensor& cos,
                                         const torch::Tensor& sin, AttentionBackend& attention) {
#ifdef SLIME_MODEL_FUSED_KERNELS
  internal::FusedForwardState s;
  s.t = x_in.size(0);
  s.n = config_.hidden_size;
  s.eps = config_.rms_norm_eps;
  s.dt = internal::KernelDType(x_in);
  s.tp = tp_.get();
  s.config = &config_;
  // Decode steps (a few rows, one rank): our small-m GEMM streams the weights near HBM bandwidth;
  // otherwise the Megatron-style layers (cuBLAS, and the all-reduce of row-parallel outputs).
  s.small_gemm = tp_->size() == 1 && cuda::SmallGemmSupported(s.t, s.n, s.dt);
  s.residual = x_in.contiguous();  // the embedding output, owned by the caller's frame
  const bool fold = FoldNorms(weights_, ffn_, s);
  torch::Tensor delta;  // the block output AddNorm adds; undefined: already in s.residual
  torch::Tensor h;      // [T, hidden] the normed input of the next GEMM
  if (!fold) h = internal::RmsNorm(s.residual, weights_.layers[0].input_norm, s.eps);
  for (int l = 0; l < static_cast<int>(config_.num_hidden_layers); ++l) {
    const LayerWeights& w = weights_.layers[l];
    s.layer = l;
    s.routed_experts = capture_routed_experts_ ? &routed_experts_[l] : nullptr;
    s.replay_experts = routing_replay_ != nullptr && (*routing_replay_)[l].defined()
                           ? &(*routing_replay_)[l]
                           : nullptr;
    torch::Tensor qkv;  // [T, (heads + 2 kv_heads) D]
    if (fold) {
      qkv = s.NormLinear(w.input_norm, w.qkv_proj, w.qkv_bias);
    } else {
      if (l > 0) h = s.AddNorm(delta, w.input_norm);
      qkv = s.Linear(h, w.qkv_proj, w.qkv_bias, false);
    }
    const torch::Tensor o = FusedAttention(l, qkv, w, cos, sin, attention).reshape({s.t, -1});
    if (fold) {
      s.LinearIntoResidual(o, w.o_proj, w.o_bias);
      ffn_[l]->FusedForwardFolded(w.ffn, w.post_attention_norm, s);
      continue;
    }
    delta = s.Linear(o, w.o_proj, w.o_bias, true);
    h = s.AddNorm(delta, w.post_attention_norm);
    delta = ffn_[l]->FusedForward(w.ffn, h, s);
  }
  return s.AddNorm(delta, weights_.final_norm);  // folded: `delta` undefined, the sum in place
#else
  TORCH_CHECK(false, "fused forward without the fused kernels");
  return {};
#endif
}

}  // namespace slime::model
