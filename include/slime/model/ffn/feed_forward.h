// The feed-forward block of a decoder layer, as a seam: one interface that the decoder, the
// parameter table and the fused inference path call, with one implementation per kind of block
// (DenseMlp, ffn/dense_mlp.h; MoeBlock, ffn/moe.h, Qwen3-MoE's sparse layers), picked per layer by name
// from the block table in src/model/ffn/registry.cc. A new block is a folder of its own
// (header here, source in src/model/ffn/) and a row in that table; docs/architecture.md
// ("Adding a feed-forward block") lists the steps.
//
// A block is stateless (one instance per kind, shared by every layer and model); what it needs
// of a layer comes in as arguments: the config and layer index, the layer's FeedForwardWeights
// (weights.h) and, in the forwards, the tensor-parallel group. The block owns
//   - its parameters: HF names under "model.layers.{l}.mlp.", full shapes, TP split and init,
//     and where each lives in FeedForwardWeights::params (ParamSpec::block_slot);
//   - the eager forward (autograd, TP-aware, the fused training ops of fused_train.h on CUDA);
//   - the inference projection fusion (stacked buffers in FeedForwardWeights::fused, the
//     separate projections turned into views of them so in-place updates reach both);
//   - its part of the fused inference forward (CUDA, InferenceMode; src/model/fused_inference.h).
// Every forward must compute exactly what the eager one does, in the same dtype roundings.
//
// Thread-safety: blocks are immutable; their methods may run on any thread (per the weights'
// owner's rules). LibTorch stays out of this header beyond <torch/types.h>.
#ifndef SLIME_MODEL_FFN_FEED_FORWARD_H_
#define SLIME_MODEL_FFN_FEED_FORWARD_H_

#include <torch/types.h>

#include <string_view>
#include <vector>

#include "slime/model/config.h"
#include "slime/model/expert_parallel.h"
#include "slime/model/tensor_parallel.h"
#include "slime/model/weights.h"

namespace slime::model {

namespace internal {
struct FusedForwardState;  // src/model/fused_inference.h
}  // namespace internal

// What a block's eager forward needs from the layer around it.
struct FeedForwardContext {
  const ModelConfig& config;
  int layer;
  TensorParallelGroup& tp;
  // Sequence parallelism (DecoderModel::sequence_parallel()): the block's row-parallel output
  // ends in this rank's rows of the sequence instead of all T.
  bool sequence_parallel = false;
  // When set, a routed block (moe) stores the layer's router logits [T, E] here (h's dtype,
  // differentiable); other blocks leave it alone. DecoderModel::set_capture_router_logits.
  torch::Tensor* router_logits = nullptr;
  // Routing replay (DecoderModel::set_routing_replay): when set, a routed block sends row t to the
  // experts (*replay_experts)[t] ([T, k] int64) instead of its router's top-k; the weights are
  // still the router's probabilities at those experts. Other blocks ignore it.
  const torch::Tensor* replay_experts = nullptr;
  // When set, a routed block stores the experts it sent each row to here: [T, k] int64, each row
  // ascending (DecoderModel::set_capture_routed_experts). Other blocks leave it alone.
  torch::Tensor* routed_experts = nullptr;
  // Expert parallelism (expert_parallel.h; the group given to DecoderModel::Create / Load): a
  // routed block whose group has more than one rank holds only its block of experts and runs
  // the others' rows for them by all-to-all. Null: every expert is here. Dense blocks ignore it.
  ExpertParallelGroup* ep = nullptr;

  // y = sum_r x_r W_r^T + b of a row-parallel weight (tensor_parallel.h): all-reduced [T, out],
  // or under sequence parallelism reduce-scattered to this rank's rows [rows_r, out].
  torch::Tensor RowParallel(const torch::Tensor& x, const torch::Tensor& weight,
                            const torch::Tensor& bias) const;
  // The sum over the ranks of this rank's partial output y_r [T, out] (e.g. a block that sums
  // several row-parallel products itself): all-reduced, or reduce-scattered to [rows_r, out].
  torch::Tensor ReducePartial(const torch::Tensor& partial) const;
};

class FeedForwardBlock {
 public:
  virtual ~FeedForwardBlock() = default;

  // The block's name in the block table ("dense").
  virtual std::string_view name() const = 0;

  // Appends layer `layer`'s parameters to `specs`, in HF order (FeedForwardParam builds one).
  virtual void AppendParameterSpecs(const ModelConfig& config, int layer,
                                    std::vector<ParamSpec>& specs) const = 0;

  // The eager forward. h [T, hidden]: the post-attention RMSNorm of the residual stream, already
  // inside the TP region (copy-to-region, or all-gathered from the sequence shards), all T rows
  // on every rank. Returns what the layer adds to its residual stream: [T, hidden], or this
  // rank's sequence rows [rows_r, hidden] under sequence parallelism (ctx.RowParallel).
  // Differentiable with respect to h and the weights.
  virtual torch::Tensor Forward(const FeedForwardWeights& w, const torch::Tensor& h,
                                const FeedForwardContext& ctx) const = 0;

  // Inference (DecoderModel::FuseProjections, under NoGradGuard): stacks projections that share
  // an input into w.fused and makes the separate params views of them (same values, no extra
  // memory, in-place updates of either reach both). UnfuseProjections makes the params separate
  // tensors again and clears w.fused.
  virtual void FuseProjections(FeedForwardWeights& w) const = 0;
  virtual void UnfuseProjections(FeedForwardWeights& w) const = 0;

  // The fused inference forward (CUDA builds with the fused kernels, FuseProjections done,
  // InferenceMode; DecoderModel::FusedForward). Two forms, bit-identical to each other:
  //   FusedForward: h [T, hidden] is the post-attention norm; returns the block output
  //     [T, hidden], which the next add + RMSNorm kernel adds to the residual.
  //   FusedForwardFolded (single-row decode steps where every layer's block FoldsNorm): the
  //     block applies the post-attention norm (`norm_weight` [hidden]) to state.residual inside
  //     its first GEMM and adds its output into state.residual in place in its last.
  virtual bool FoldsNorm(const FeedForwardWeights& w) const = 0;
  // Whether the inference forward of these weights waits on the host mid-step (e.g. reads group
  // sizes back), which a CUDA graph cannot capture: the engine then runs decode steps eagerly.
  virtual bool WaitsOnHost(const FeedForwardWeights&) const { return false; }
  virtual torch::Tensor FusedForward(const FeedForwardWeights& w, const torch::Tensor& h,
                                     const internal::FusedForwardState& state) const = 0;
  virtual void FusedForwardFolded(const FeedForwardWeights& w, const torch::Tensor& norm_weight,
                                  const internal::FusedForwardState& state) const = 0;
};

// The name of layer `layer`'s block: "moe" for the sparse layers of Qwen3-MoE
// (MoeConfig::IsSparseLayer: decoder_sparse_step, mlp_only_layers), "dense" for every other.
std::string_view FeedForwardName(const ModelConfig& config, int layer);

// The block named FeedForwardName(config, layer), from the block table.
const FeedForwardBlock& FeedForwardFor(const ModelConfig& config, int layer);

// A parameter of layer `layer`'s block: "model.layers.{layer}.mlp.{suffix}" at params[slot].
ParamSpec FeedForwardParam(int layer, std::string_view suffix, std::vector<int64_t> shape,
                           ShardDim shard, ParamInit init, int slot);

}  // namespace slime::model

#endif  // SLIME_MODEL_FFN_FEED_FORWARD_H_
