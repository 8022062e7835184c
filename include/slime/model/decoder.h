// DecoderModel: the Llama / Qwen2 / Qwen3 decoder-only LM in plain LibTorch ops.
//
//   x = embed(ids)                                              [T, hidden]
//   per layer:  h = rmsnorm(x)
//               q, k, v = h Wq^T (+bq), h Wk^T (+bk), h Wv^T (+bv)  -> [T, heads, head_dim]
//               q, k = rmsnorm_per_head(q), rmsnorm_per_head(k)      (Qwen3 only)
//               q, k = rope(q, positions), rope(k, positions)
//               x = x + o_proj(attention(q, k, v))                    (AttentionBackend)
//               x = x + ffn(rmsnorm(x))        the layer's feed-forward block (ffn/feed_forward.h;
//                                              dense: down(silu(gate(h)) * up(h)))
//   hidden = rmsnorm(x);  logits = hidden W_lm^T                [T, vocab]
//
// Numerics follow transformers: RMSNorm in float32 then cast back and scaled by the weight in
// the model dtype; RoPE cos/sin computed in float32 and cast to the model dtype; attention
// softmax in float32. Model dtype = the weights' dtype (float32 or bfloat16).
//
// Inputs: token ids [T] (any integer dtype, any device; moved to the model's device) of a packed
// batch; ids must be < vocab_size. Outputs live on the model's device.
//
// The forward passes are differentiable with respect to the weights (training), except
// ForwardWithCache, which runs under NoGradGuard. Errors (bad ids, shapes, LibTorch failures,
// collective failures) come back as Status; nothing throws out of this class.
//
// Pipeline parallelism (pipeline_parallel.h): a DecoderModel may be one stage of a pipeline,
// holding layers [first_layer, end_layer) only (weights().stage). ForwardPacked then takes the
// token ids on the first stage and the previous stage's output [T, hidden] elsewhere, and
// returns the final (normalised) hidden states on the last stage and the residual stream
// [T, hidden] after its last layer elsewhere (what the next stage takes). Logits needs the last
// stage; Forward, ForwardWithCache and FuseProjections need a whole model (the engine's).
//
// Ownership: owns its weights and shares the TP group. Thread-safety: one thread at a time.
#ifndef SLIME_MODEL_DECODER_H_
#define SLIME_MODEL_DECODER_H_

#include <torch/types.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "slime/common/status.h"
#include "slime/model/attention.h"
#include "slime/model/config.h"
#include "slime/model/expert_parallel.h"
#include "slime/model/ffn/feed_forward.h"
#include "slime/model/pipeline_parallel.h"
#include "slime/model/recompute.h"
#include "slime/model/tensor_parallel.h"
#include "slime/model/weights.h"

namespace slime::model {

class DecoderModel {
 public:
  // Validates `weights` against `config` for the group's rank/size (null group: size 1). With an
  // expert-parallel group `ep` of size > 1, weights.experts must be its rank and size
  // (InvalidArgument naming both otherwise); without one, weights.experts must be whole.
  static StatusOr<std::unique_ptr<DecoderModel>> Create(
      ModelConfig config, ModelWeights weights, std::shared_ptr<TensorParallelGroup> tp = nullptr,
      std::shared_ptr<ExpertParallelGroup> ep = nullptr);
  // config.json + safetensors from an HF model directory; this rank's shards. With pp_size > 1
  // only pipeline stage pp_rank's parameters are read (MakePipelineStage's split; fewer layers
  // than stages is an InvalidArgument naming both).
  static StatusOr<std::unique_ptr<DecoderModel>> Load(
      const std::string& model_dir, torch::ScalarType dtype, torch::Device device,
      std::shared_ptr<TensorParallelGroup> tp = nullptr, int pp_rank = 0, int pp_size = 1,
      std::shared_ptr<ExpertParallelGroup> ep = nullptr);

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  // For in-place weight updates (optimizer, weight sync); shapes/dtypes must not change.
  ModelWeights& mutable_weights() { return weights_; }
  TensorParallelGroup& tp_group() { return *tp_; }
  // Expert parallelism (expert_parallel.h): the group whose ranks split the experts, or null
  // (every expert here). Its rank and size are the weights' ExpertShard.
  ExpertParallelGroup* ep_group() const { return ep_.get(); }
  const ExpertShard& experts() const { return weights_.experts; }
  const PipelineStage& stage() const { return weights_.stage; }
  torch::ScalarType dtype() const { return dtype_; }
  torch::Device device() const { return device_; }
  int64_t local_heads() const { return config_.num_attention_heads / tp_->size(); }
  int64_t local_kv_heads() const { return config_.num_key_value_heads / tp_->size(); }

  // Sequence parallelism inside the TP group (tensor_parallel.h): the residual stream, the norms
  // and the embedding output hold this rank's SequenceShardOf(T) rows between the parallel
  // layers; every forward still returns the full [T, hidden] (gathered at the end of the
  // stage), so the LM head, log-probs and pipeline transfers are unchanged. Training memory
  // only: the forward computes the same function. No effect at TP size 1 or in the fused
  // inference path.
  void set_sequence_parallel(bool on) { sequence_parallel_ = on; }
  bool sequence_parallel() const { return sequence_parallel_ && tp_->size() > 1; }

  // Activation recomputation of ForwardPacked's training forward (recompute.h): with a recorded
  // graph, the layers or parts of layers the options name keep no activations and run again in
  // the backward; the function and its gradients are unchanged. InvalidArgument (the model
  // unchanged) when the options do not fit this stage's layers.
  Status SetRecompute(const RecomputeOptions& options);
  const RecomputeOptions& recompute() const { return recompute_; }

  // Router logits of the mixture-of-experts layers (ffn/moe.h), for the trainer's load-balancing
  // loss and routing replay. With capture on, every eager forward first resets router_logits()
  // to one undefined tensor per layer, then each sparse layer of this stage stores its logits
  // [T, E] (model dtype; part of the graph when one is recorded); dense layers stay undefined.
  // The fused inference path stores nothing. Under activation recomputation a recomputed
  // layer's entry is the no-graph forward's, replaced by the backward's rerun (same values).
  void set_capture_router_logits(bool on) { capture_router_logits_ = on; }
  const std::vector<torch::Tensor>& router_logits() const { return router_logits_; }
  // The trainer's router loss (train/moe_aux_loss.h), Megatron's MoEAuxLossAutoScaler way:
  // with capture on and a hook set, each sparse layer's output y [T or rows_r, hidden] becomes
  // hook(layer, logits [T, E], y) in every eager forward, the backward's rerun of a recomputed
  // layer included (there the hook runs on the autograd thread, with grad mode on; in the
  // no-graph forward of a recomputed layer it runs with grad mode off). Null: no hook.
  using RouterLossHook = std::function<torch::Tensor(int layer, const torch::Tensor& logits,
                                                     const torch::Tensor& out)>;
  void set_router_loss_hook(RouterLossHook hook) { router_loss_hook_ = std::move(hook); }

  // The experts each row was routed to in the mixture-of-experts layers (routing replay, slime's
  // R3). With capture on, every forward (eager or fused) first resets routed_experts() to one
  // undefined tensor per layer, then each sparse layer of this stage stores [T, k] int64, each
  // row ascending.
  void set_capture_routed_experts(bool on) { capture_routed_experts_ = on; }
  const std::vector<torch::Tensor>& routed_experts() const { return routed_experts_; }
  // Replay: the forwards after this route row t of sparse layer l to experts[l][t] ([T, k]
  // int64 on any device, T the forward's rows) instead of the router's top-k; the weights are
  // the router's probabilities there, so the router still learns. One entry per layer of the
  // model (undefined: that layer routes itself; dense layers ignore theirs); an empty vector
  // turns replay off. A layer recomputed in the backward replays what its forward replayed.
  // InvalidArgument (nothing changed) when the vector has another length.
  Status set_routing_replay(std::vector<torch::Tensor> experts);

  void set_attention_impl(AttentionImpl impl) { attention_impl_ = impl; }
  AttentionImpl attention_impl() const { return attention_impl_; }

  // Final hidden states [T, hidden] for ids [T] at positions [T] (int64), attention delegated to
  // `attention`.
  StatusOr<torch::Tensor> Forward(const torch::Tensor& input_ids, const torch::Tensor& position_ids,
                                  AttentionBackend& attention);

  // Forward for callers that validated their inputs (the engine checks ids at the HTTP edge):
  // ids and positions [T] int64 already on the model's device; no host synchronisation, no
  // Status wrapping (LibTorch errors throw c10::Error). -> [T, hidden]
  torch::Tensor ForwardUnchecked(const torch::Tensor& input_ids, const torch::Tensor& position_ids,
                                 AttentionBackend& attention) {
    return ForwardImpl(input_ids, position_ids, attention);
  }

  // Packed variable-length batch: sequence b is ids[cu[b]:cu[b+1]], positions restart at 0,
  // attention is causal within each sequence. -> [T, hidden]
  // The training forward: recomputes activations in the backward as SetRecompute says.
  // On a pipeline stage after the first, `input_ids` is the previous stage's output [T, hidden]
  // (converted to the model's dtype and device; autograd flows back into it), and on a stage
  // before the last the result is this stage's output (header comment).
  StatusOr<torch::Tensor> ForwardPacked(const torch::Tensor& input_ids,
                                        const std::vector<int64_t>& cu_seqlens);

  // Incremental forward: sequence b's new tokens ids[cu[b]:cu[b+1]] continue caches[b] (their
  // positions start at its length); the caches grow by their new tokens on success and are
  // unchanged on failure. -> [T, hidden]
  StatusOr<torch::Tensor> ForwardWithCache(const torch::Tensor& input_ids,
                                           const std::vector<int64_t>& cu_seqlens,
                                           const std::vector<KvCache*>& caches);
  // One sequence.
  StatusOr<torch::Tensor> ForwardWithCache(const torch::Tensor& input_ids, KvCache& cache);

  // Logits [T, vocab] (or this rank's [T, vocab/P] when !gather) of hidden [T, hidden], in the
  // model dtype. Last pipeline stage only.
  StatusOr<torch::Tensor> Logits(const torch::Tensor& hidden, bool gather = true);

  // Inference on CUDA: stacks q|k|v of every layer into one weight, and the feed-forward
  // block's projections as the block says (dense: gate|up) — the separate projections become
  // views into them, so memory does not grow — which lets the forward under c10::InferenceMode
  // run one GEMM for each and the fused norm/RoPE/K-V-store kernels (9 kernels per layer at
  // decode; src/model/fused_inference.cc). A no-op where the fused kernels are not built or the
  // model is not on CUDA. Unfuse before moving weights between devices.
  void FuseProjections();
  void UnfuseProjections();
  bool projections_fused() const;
  // Whether an inference forward waits on the host mid-step (a block's
  // FeedForwardBlock::WaitsOnHost, e.g. MoE layers off the grouped-GEMM path): a CUDA graph
  // cannot capture such a step.
  bool ForwardWaitsOnHost() const;

  // An empty cache for one sequence of up to `capacity` tokens, on the model's device and dtype.
  KvCache NewKvCache(int64_t capacity) const;

 private:
  // The layers' routing replay of one forward (set_routing_replay), shared with the recomputed
  // regions it starts; null or empty: none.
  using RoutingReplay = std::shared_ptr<const std::vector<torch::Tensor>>;

  DecoderModel(ModelConfig config, ModelWeights weights, std::shared_ptr<TensorParallelGroup> tp,
               std::shared_ptr<ExpertParallelGroup> ep);
  // `owned`, when set, is `attention` owned here, so that it outlives the forward: recomputed
  // regions run it again in the backward. Without it nothing is recomputed.
  torch::Tensor ForwardImpl(const torch::Tensor& ids, const torch::Tensor& positions,
                            AttentionBackend& attention,
                            const std::shared_ptr<AttentionBackend>& owned = nullptr);
  // The fused inference forward (FuseProjections done, CUDA, InferenceMode); -> [T, hidden].
  // In fused_inference.cc with the rest of the inference fast path.
  torch::Tensor FusedForward(const torch::Tensor& x, const torch::Tensor& cos,
                             const torch::Tensor& sin, AttentionBackend& attention);
  // FusedForward's attention of layer l on the q|k|v GEMM's rows qkv [T, (heads + 2 kv_heads)
  // D]: the backend's raw-q|k|v kernel, else q/k norm + RoPE in place, then its Attend.
  // -> [T, heads, D]
  torch::Tensor FusedAttention(int l, const torch::Tensor& qkv, const LayerWeights& w,
                               const torch::Tensor& cos, const torch::Tensor& sin,
                               AttentionBackend& attention);
  // Layer `index` on x with the weights `w` (the layer's own, or their aliases when a recomputed
  // run is run again). With `checkpointed_attention` the core attention goes through it as a
  // checkpointed region (selective recomputation). -> [T or rows_r, hidden]
  torch::Tensor Layer(int index, const LayerWeights& w, const torch::Tensor& x,
                      const torch::Tensor& cos, const torch::Tensor& sin,
                      AttentionBackend& attention, const RoutingReplay& replay,
                      const std::shared_ptr<AttentionBackend>& checkpointed_attention = nullptr);
  // This stage's layers on x: one after the other, or, when a graph is recorded, recompute is
  // on and `owned` is set, by the recompute plan.
  torch::Tensor StageLayers(torch::Tensor x, const torch::Tensor& cos, const torch::Tensor& sin,
                            AttentionBackend& attention,
                            const std::shared_ptr<AttentionBackend>& owned);
  // Layers [run.first, run.end) on x as one checkpointed region (activation_checkpoint.h): its
  // inputs are x and the layers' parameters.
  torch::Tensor RecomputedRun(const LayerRun& run, const torch::Tensor& x,
                              const torch::Tensor& cos, const torch::Tensor& sin,
                              std::shared_ptr<AttentionBackend> attention, RoutingReplay replay);
  Status CheckIds(const torch::Tensor& ids) const;
  // FailedPrecondition naming `what` unless this is a whole model (one pipeline stage).
  Status CheckWhole(const char* what) const;

  ModelConfig config_;
  ModelWeights weights_;
  std::shared_ptr<TensorParallelGroup> tp_;
  std::shared_ptr<ExpertParallelGroup> ep_;  // null: every expert here
  torch::ScalarType dtype_;
  torch::Device device_;
  torch::Tensor inv_freq_;  // [head_dim / 2] float32 on device_
  std::vector<const FeedForwardBlock*> ffn_;  // layer -> its feed-forward block (FeedForwardFor)
  std::vector<std::vector<ParamSpec>> layer_specs_;  // layer -> its parameters' specs
  RecomputeOptions recompute_;
  AttentionImpl attention_impl_ = AttentionImpl::kAuto;
  bool sequence_parallel_ = false;
  bool capture_router_logits_ = false;
  std::vector<torch::Tensor> router_logits_;  // layer -> [T, E] or undefined (capture on)
  RouterLossHook router_loss_hook_;
  bool capture_routed_experts_ = false;
  std::vector<torch::Tensor> routed_experts_;  // layer -> [T, k] int64 or undefined (capture on)
  RoutingReplay routing_replay_;               // layer -> [T, k] int64 or undefined; null: off
};

// RoPE inverse frequencies [head_dim / 2] (float32, CPU) for the config's rope type, computed as
// transformers does.
torch::Tensor RopeInverseFrequencies(const ModelConfig& config);

}  // namespace slime::model

#endif  // SLIME_MODEL_DECODER_H_
