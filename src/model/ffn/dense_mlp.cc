// The dense MLP block (see include/slime/model/ffn/dense_mlp.h).
#include "slime/model/ffn/dense_mlp.h"

#include <torch/torch.h>

#include "decoder_ops.h"
#include "fused_inference.h"

#ifdef SLIME_MODEL_FUSED_KERNELS
#include "cuda/fused_ops.h"
#endif

namespace slime::model {

void DenseMlp::AppendParameterSpecs(const ModelConfig& c, int layer,
                                    std::vector<ParamSpec>& specs) const {
  const int64_t h = c.hidden_size, inter = c.intermediate_size;
  specs.push_back(FeedForwardParam(layer, "gate_proj.weight", {inter, h}, ShardDim::kRows,
                                   ParamInit::kNormal, kGateProj));
  specs.push_back(FeedForwardParam(layer, "up_proj.weight", {inter, h}, ShardDim::kRows,
                                   ParamInit::kNormal, kUpProj));
  specs.push_back(FeedForwardParam(layer, "down_proj.weight", {h, inter}, ShardDim::kColumns,
                                   ParamInit::kNormal, kDownProj));
}

torch::Tensor DenseMlp::Forward(const FeedForwardWeights& w, const torch::Tensor& h,
                                const FeedForwardContext& ctx) const {
  // h is inside the TP region already: one all-reduce of its gradient for gate and up together.
  torch::Tensor gate = ColumnParallelLinear(h, w.params[kGateProj], {}, ctx.tp, false, true);
  torch::Tensor up = ColumnParallelLinear(h, w.params[kUpProj], {}, ctx.tp, false, true);
  // gate, up [T, I/P] -> [T, hidden] (or this rank's sequence rows)
  return ctx.RowParallel(internal::SiluMul(gate, up), w.params[kDownProj], {});
}

void DenseMlp::FuseProjections(FeedForwardWeights& w) const {
  torch::Tensor& gate = w.params[kGateProj];
  torch::Tensor& up = w.params[kUpProj];
  const int64_t ni = gate.size(0);
  w.fused.assign(1, torch::cat({gate, up}, 0));  // [2 I/P, hidden]
  const torch::Tensor& gate_up = w.fused[kGateUpProj];
  gate = gate_up.narrow(0, 0, ni);
  up = gate_up.narrow(0, ni, ni);
}

void DenseMlp::UnfuseProjections(FeedForwardWeights& w) const {
  if (w.fused.empty()) return;
  for (int slot : {kGateProj, kUpProj}) {
    torch::Tensor& t = w.params[slot];
    if (t.defined()) t = t.clone();
  }
  w.fused.clear();
}

#ifdef SLIME_MODEL_FUSED_KERNELS
namespace {
// SiLU·up inside the gate|up small-m GEMM at decode steps (off: SLIME_DECODE_UNFUSE=silu_gemm).
bool SiluGemmEnabled() {
  static const bool on = cuda::DecodeFusionEnabled("silu_gemm");
  return on;
}
}  // namespace

bool DenseMlp::FoldsNorm(const FeedForwardWeights& w) const {
  return SiluGemmEnabled() && w.fused[kGateUpProj].is_contiguous() &&
         w.params[kDownProj].is_contiguous();
}

torch::Tensor DenseMlp::FusedForward(const FeedForwardWeights& w, const torch::Tensor& h,
                                     const internal::FusedForwardState& s) const {
  const torch::Tensor& gate_up = w.fused[kGateUpProj];  // [2 I/P, hidden]
  const int64_t inter = gate_up.size(0) / 2;
  torch::Tensor act;  // [T, I/P] = SiLU(gate)·up
  if (s.small_gemm && SiluGemmEnabled() && gate_up.is_contiguous()) {
    // Decode: the gate/up GEMM writes SiLU(gate)·up directly.
    act = torch::empty({s.t, inter}, h.options());
    internal::CheckLaunch(
        cuda::LaunchSmallGemmSiluMul(h.data_ptr(), gate_up.data_ptr(), act.data_ptr(), s.t, inter,
                                     s.n, s.dt, internal::CurrentStream()),
        "small-m gate/up GEMM + SiLU");
  } else {
    torch::Tensor gu = s.Linear(h, gate_up, {}, false);  // [T, 2 I/P]
    act = torch::empty({s.t, inter}, gu.options());
    internal::CheckLaunch(cuda::LaunchSiluMulPacked(gu.data_ptr(), act.data_ptr(), s.t, inter, s.dt,
                                                    internal::CurrentStream()),
                          "fused SiLU*up");
  }
  return s.Linear(act, w.params[kDownProj], {}, true);  // [T, hidden]
}

void DenseMlp::FusedForwardFolded(const FeedForwardWeights& w, const torch::Tensor& norm_weight,
                                  const internal::FusedForwardState& s) const {
  const torch::Tensor& gate_up = w.fused[kGateUpProj];  // [2 I/P, hidden]
  const int64_t inter = gate_up.size(0) / 2;
  torch::Tensor act = torch::empty({s.t, inter}, s.residual.options());  // [T, I/P]
  internal::CheckLaunch(
      cuda::LaunchNormSmallGemmSiluMul(
          s.residual.data_ptr(), norm_weight.data_ptr(), static_cast<float>(s.eps),
          gate_up.data_ptr(), act.data_ptr(), s.t, inter, s.n, s.dt, internal::CurrentStream()),
      "small-m GEMM with RMSNorm");
  s.LinearIntoResidual(act, w.params[kDownProj], {});
}
#else
bool DenseMlp::FoldsNorm(const FeedForwardWeights&) const { return false; }

torch::Tensor DenseMlp::FusedForward(const FeedForwardWeights&, const torch::Tensor&,
                                     const internal::FusedForwardState&) const {
  TORCH_CHECK(false, "fused forward without the fused kernels");
  return {};
}

void DenseMlp::FusedForwardFolded(const FeedForwardWeights&, const torch::Tensor&,
                                  const internal::FusedForwardState&) const {
  TORCH_CHECK(false, "fused forward without the fused kernels");
}
#endif

}  // namespace slime::model
