// MoeBlock: the sparse mixture-of-experts feed-forward block of Qwen3-MoE layers (table name
// "moe"; HF Qwen3MoeSparseMoeBlock). With E = num_experts, k = num_experts_per_tok and
// I = moe_intermediate_size (config.h, MoeConfig):
//
//   logits = h Wr^T                                   h [T, hidden], Wr [E, hidden] -> [T, E]
//   p      = softmax(logits) in float32               [T, E]
//   w, idx = topk(p, k)                               [T, k] (torch::topk's order on ties)
//   idx, w = idx in ascending expert id, w with them  (so a replayed routing sums alike)
//   w      = w / sum(w)  if norm_topk_prob; then cast to h's dtype
//   y[t]   = sum_j w[t, j] * expert_{idx[t, j]}(h[t]) expert_e(x) = down_e(silu(gate_e(x)) * up_e(x))
//
// Computed grouped, never per token: the T·k token slots are sorted by expert id (each token's
// slots first ordered by expert id), expert e runs three GEMMs over its contiguous rows, the
// weighted rows go back to their slots and each token's k rows are summed in ascending expert
// id — HF's order of adding (its index_add_ per expert), with no atomics, so the result is
// deterministic on CUDA too. Experts no token chose are skipped (their weights get no gradient).
//
// HF parameters, under "model.layers.{l}.mlp.": "gate.weight" [E, hidden] (the router),
// "experts.{e}.gate_proj.weight" / "up_proj.weight" [I, hidden], "experts.{e}.down_proj.weight"
// [hidden, I]. Tensor parallelism shards each expert like the dense MLP (gate/up
// column-parallel [I/P, hidden], down row-parallel [hidden, I/P]); the router is replicated and
// enters the TP region (its gradient, a partial sum per rank, is all-reduced). Every rank
// routes identically; the weighted partial outputs are summed over the ranks once at the end
// (FeedForwardContext::ReducePartial; reduce-scattered under sequence parallelism).
//
// Expert parallelism (expert_parallel.h; FeedForwardContext::ep of size N > 1): this rank holds
// only the experts [r·E/N, (r+1)·E/N) (the other experts' slots of params stay undefined). The
// routing is computed as above on this rank's own rows; the grouped rows then go by all-to-all
// to their experts' owners, which run each of their experts once over the rows of every rank,
// and the outputs come back by the reverse all-to-all into the grouped order, so the weighting
// and the per-token sum are the ones above. Every rank of the group must call Forward (and its
// backward) for the same layers in the same order, a rank with T = 0 included.
//
// Routing replay (slime's R3): with FeedForwardContext::replay_experts, idx is given instead of
// chosen by top-k (the engine's routing of the same tokens), and w = p at idx, renormalised the
// same way; with FeedForwardContext::routed_experts, Forward stores the idx it used.
//
// Router logits: when FeedForwardContext::router_logits is set, Forward stores the layer's
// logits [T, E] (h's dtype, differentiable) there — DecoderModel::set_capture_router_logits;
// the trainer's load-balancing loss and routing replay build on it.
//
// Inference (the engine on CUDA): FuseProjections stacks the experts into two tensors,
// gate|up [E, 2 I/P, hidden] and down [E, hidden, I/P] (the per-expert params become views of
// them). Where GroupedGemm holds (bf16 on Hopper or Blackwell, LibTorch >= 2.8, not deterministic
// mode), FusedForward runs each projection for all experts as one grouped GEMM over the
// expert-sorted rows, with the group sizes counted on the device, so a step never waits on the
// host and decode CUDA graphs capture it. Elsewhere (CPU, fp32, deterministic mode, whose
// batch-invariant GEMMs run per expert) FusedForward is the eager Forward, whose per-expert loop
// reads the group sizes on the host (WaitsOnHost: the engine then runs decode eagerly).
// The grouped GEMM rounds like cuBLAS's per-expert GEMMs only up to accumulation order.
//
// Thread-safety: immutable (see feed_forward.h).
#ifndef SLIME_MODEL_FFN_MOE_H_
#define SLIME_MODEL_FFN_MOE_H_

#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "slime/model/ffn/feed_forward.h"

namespace slime::model {

class MoeBlock final : public FeedForwardBlock {
 public:
  // FeedForwardWeights::params of a sparse layer (shapes for TP size P):
  //   params[kRouter]                           [E, hidden]   replicated  "mlp.gate.weight"
  //   params[ExpertSlot(e, kExpertGateProj)]    [I/P, hidden] column-par. "mlp.experts.{e}.gate_proj.weight"
  //   params[ExpertSlot(e, kExpertUpProj)]      [I/P, hidden] column-par. "mlp.experts.{e}.up_proj.weight"
  //   params[ExpertSlot(e, kExpertDownProj)]    [hidden, I/P] row-par.    "mlp.experts.{e}.down_proj.weight"
  static constexpr int kRouter = 0;
  enum ExpertProj : int { kExpertGateProj = 0, kExpertUpProj = 1, kExpertDownProj = 2 };
  static constexpr int ExpertSlot(int64_t expert, ExpertProj proj) {
    return 1 + 3 * static_cast<int>(expert) + proj;
  }

  // The routing of T tokens: each token's k experts and their weights (see the file comment).
  struct Routing {
    torch::Tensor weights;  // [T, k] h's dtype (renormalised when norm_topk_prob)
    torch::Tensor experts;  // [T, k] int64 expert ids, ascending in each row
  };
  // router_logits [T, E] -> the top-k routing, as HF computes it; `dtype` is h's.
  static Routing Route(const torch::Tensor& router_logits, int64_t top_k, bool norm_topk_prob,
                       torch::ScalarType dtype);
  // router_logits [T, E] routed to the given experts [T, k] (int64, distinct in each row, any
  // order): the weights are the probabilities Route would give them. With `experts` equal to
  // Route's choice, the result is Route's bit for bit. Fails (c10::Error) on a shape or id out
  // of range.
  static Routing Replay(const torch::Tensor& router_logits, const torch::Tensor& experts,
                        bool norm_topk_prob, torch::ScalarType dtype);

  // Whether FusedForward takes the grouped-GEMM path for these (fused) weights.
  static bool GroupedGemm(const FeedForwardWeights& w);

  std::string_view name() const override { return "moe"; }
  void AppendParameterSpecs(const ModelConfig& config, int layer,
                            std::vector<ParamSpec>& specs) const override;
  torch::Tensor Forward(const FeedForwardWeights& w, const torch::Tensor& h,
                        const FeedForwardContext& ctx) const override;
  void FuseProjections(FeedForwardWeights& w) const override;
  void UnfuseProjections(FeedForwardWeights& w) const override;
  bool FoldsNorm(const FeedForwardWeights& w) const override;
  bool WaitsOnHost(const FeedForwardWeights& w) const override;
  torch::Tensor FusedForward(const FeedForwardWeights& w, const torch::Tensor& h,
                             const internal::FusedForwardState& state) const override;
  void FusedForwardFolded(const FeedForwardWeights& w, const torch::Tensor& norm_weight,
                          const internal::FusedForwardState& state) const override;
};

}  // namespace slime::model

#endif  // SLIME_MODEL_FFN_MOE_H_
