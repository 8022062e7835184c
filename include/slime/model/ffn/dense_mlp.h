// DenseMlp: the feed-forward block of Llama / Qwen2 / Qwen3 layers (table name "dense"):
//
//   y = down(silu(gate(h)) * up(h))        h [T, hidden] -> y [T, hidden]
//
// gate and up are column-parallel (each rank computes its intermediate/P columns), down is
// row-parallel (the partial sums all-reduced, or reduce-scattered under sequence parallelism);
// no biases. SiLU·up runs on the fused training kernel on CUDA (fused_train.h), the inference
// kernel under InferenceMode, eager LibTorch elsewhere. FuseProjections stacks gate over up in
// one [2 intermediate/P, hidden] weight for the fused inference path, whose decode steps run the
// gate|up GEMM with SiLU·up inside (and, at one row, the post-attention RMSNorm too).
//
// Thread-safety: immutable (see feed_forward.h).
#ifndef SLIME_MODEL_FFN_DENSE_MLP_H_
#define SLIME_MODEL_FFN_DENSE_MLP_H_

#include <string_view>
#include <vector>

#include "slime/model/ffn/feed_forward.h"

namespace slime::model {

class DenseMlp final : public FeedForwardBlock {
 public:
  // FeedForwardWeights::params of a dense layer (shapes for TP size P).
  enum Slot : int {
    kGateProj = 0,  // [intermediate/P, hidden]  column-parallel   "mlp.gate_proj.weight"
    kUpProj = 1,    // [intermediate/P, hidden]  column-parallel   "mlp.up_proj.weight"
    kDownProj = 2,  // [hidden, intermediate/P]  row-parallel      "mlp.down_proj.weight"
  };
  // FeedForwardWeights::fused after FuseProjections: gate_proj and up_proj are views of it.
  enum FusedSlot : int {
    kGateUpProj = 0,  // [2 intermediate/P, hidden]: the gate rows, then the up rows
  };

  std::string_view name() const override { return "dense"; }
  void AppendParameterSpecs(const ModelConfig& config, int layer,
                            std::vector<ParamSpec>& specs) const override;
  torch::Tensor Forward(const FeedForwardWeights& w, const torch::Tensor& h,
                        const FeedForwardContext& ctx) const override;
  void FuseProjections(FeedForwardWeights& w) const override;
  void UnfuseProjections(FeedForwardWeights& w) const override;
  bool FoldsNorm(const FeedForwardWeights& w) const override;
  torch::Tensor FusedForward(const FeedForwardWeights& w, const torch::Tensor& h,
                             const internal::FusedForwardState& state) const override;
  void FusedForwardFolded(const FeedForwardWeights& w, const torch::Tensor& norm_weight,
                          const internal::FusedForwardState& state) const override;
};

}  // namespace slime::model

#endif  // SLIME_MODEL_FFN_DENSE_MLP_H_
