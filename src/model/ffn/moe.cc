// The sparse mixture-of-experts block (see include/slime/model/ffn/moe.h).
#include "slime/model/ffn/moe.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <string>
#include <tuple>

#include "decoder_ops.h"
#include "fused_inference.h"
#include "slime/model/batch_invariant.h"

namespace slime::model {
namespace {

// The T·k token slots grouped by expert: slot s = t·k + j is token t's j-th expert after each
// token's experts were put in ascending id order.
struct Grouping {
  torch::Tensor order;    // [T·k] slots sorted by (expert id, slot): expert e's rows contiguous
  torch::Tensor inverse;  // [T·k] position of slot s in `order`
  torch::Tensor tokens;   // [T·k] token of order[i]
  torch::Tensor weights;  // [T·k] routing weight of order[i] (h's dtype)
  std::vector<int64_t> counts;  // [E] rows of each expert (host)
};

Grouping Group(const MoeBlock::Routing& r, int64_t num_experts) {
  const int64_t t = r.experts.size(0), k = r.experts.size(1), n = t * k;
  // HF adds a token's expert outputs in ascending expert id: Route's order.
  const torch::Tensor weights = r.weights.reshape({n});
  const torch::Tensor flat = r.experts.reshape({n});  // int64
  // Unique keys (expert, slot): any sort gives the stable order, on every LibTorch version.
  const torch::Tensor slots = torch::arange(n, flat.options());
  const torch::Tensor order = std::get<1>((flat * n + slots).sort(/*dim=*/0));
  Grouping g;
  g.order = order;
  g.inverse = torch::empty_like(order).scatter_(0, order, slots);
  g.tokens = torch::div(order, k, "trunc");
  g.weights = weights.index_select(0, order);
  const torch::Tensor counts =
      torch::bincount(flat, /*weights=*/{}, num_experts).to(torch::kCPU).contiguous();
  const int64_t* c = counts.data_ptr<int64_t>();
  g.counts.assign(c, c + num_experts);
  return g;
}

}  // namespace

void MoeBlock::AppendParameterSpecs(const ModelConfig& c, int layer,
                                    std::vector<ParamSpec>& specs) const {
  const int64_t h = c.hidden_size, inter = c.moe.moe_intermediate_size;
  specs.push_back(FeedForwardParam(layer, "gate.weight", {c.moe.num_experts, h},
                                   ShardDim::kReplicated, ParamInit::kNormal, kRouter));
  for (int64_t e = 0; e < c.moe.num_experts; ++e) {
    const std::string p = fmt::format("experts.{}.", e);
    specs.push_back(FeedForwardParam(layer, p + "gate_proj.weight", {inter, h}, ShardDim::kRows,
                                     ParamInit::kNormal, ExpertSlot(e, kExpertGateProj)));
    specs.push_back(FeedForwardParam(layer, p + "up_proj.weight", {inter, h}, ShardDim::kRows,
                                     ParamInit::kNormal, ExpertSlot(e, kExpertUpProj)));
    specs.push_back(FeedForwardParam(layer, p + "down_proj.weight", {h, inter},
                                     ShardDim::kColumns, ParamInit::kNormal,
                                     ExpertSlot(e, kExpertDownProj)));
  }
}

namespace {

// The routing of probs [T, E] (float32) to experts [T, k]: both in ascending expert id, the
// weights renormalised over that order when asked.
MoeBlock::Routing RouteTo(const torch::Tensor& probs, const torch::Tensor& experts,
                          bool norm_topk_prob, torch::ScalarType dtype) {
  const torch::Tensor sorted = std::get<0>(experts.sort(/*dim=*/1));
  torch::Tensor weights = probs.gather(1, sorted);
  if (norm_topk_prob) weights = weights / weights.sum(-1, /*keepdim=*/true);
  return MoeBlock::Routing{weights.to(dtype), sorted};
}

}  // namespace

MoeBlock::Routing MoeBlock::Route(const torch::Tensor& router_logits, int64_t top_k,
                                  bool norm_topk_prob, torch::ScalarType dtype) {
  const torch::Tensor probs = torch::softmax(router_logits, -1, torch::kFloat32);  // [T, E]
  const torch::Tensor experts = std::get<1>(torch::topk(probs, top_k, /*dim=*/-1));  // [T, k]
  return RouteTo(probs, experts, norm_topk_prob, dtype);
}

MoeBlock::Routing MoeBlock::Replay(const torch::Tensor& router_logits,
                                   const torch::Tensor& experts, bool norm_topk_prob,
                                   torch::ScalarType dtype) {
  TORCH_CHECK(experts.dim() == 2 && experts.size(0) == router_logits.size(0),
              "moe routing replay: experts ", experts.sizes(), " for ", router_logits.size(0),
              " rows");
  const torch::Tensor ids = experts.to(router_logits.device(), torch::kInt64);
  if (ids.numel() > 0) {
    const int64_t lo = ids.min().item<int64_t>(), hi = ids.max().item<int64_t>();
    TORCH_CHECK(lo >= 0 && hi < router_logits.size(1), "moe routing replay: expert ids [", lo,
                ", ", hi, "] outside [0, ", router_logits.size(1), ")");
  }
  const torch::Tensor probs = torch::softmax(router_logits, -1, torch::kFloat32);
  return RouteTo(probs, ids, norm_topk_prob, dtype);
}

torch::Tensor MoeBlock::Forward(const FeedForwardWeights& w, const torch::Tensor& h,
                                const FeedForwardContext& ctx) const {
  const MoeConfig& m = ctx.config.moe;
  const int64_t t = h.size(0), k = m.num_experts_per_tok, hidden = h.size(1);
  if (t == 0) return ctx.ReducePartial(torch::zeros_like(h));
  // The router is replicated, but each rank's partial output depends on it: its gradient is a
  // partial sum over the ranks, all-reduced by copy-to-region (as q_norm / k_norm).
  const torch::Tensor logits = Linear(h, CopyToTensorParallelRegion(w.params[kRouter], ctx.tp));
  if (ctx.router_logits != nullptr) *ctx.router_logits = logits;  // [T, E]
  const Routing routing =
      ctx.replay_experts != nullptr
          ? Replay(logits, *ctx.replay_experts, m.norm_topk_prob, h.scalar_type())
          : Route(logits, k, m.norm_topk_prob, h.scalar_type());
  TORCH_CHECK(routing.experts.size(1) == k, "moe routing replay: ", routing.experts.size(1),
              " experts a row for layer ", ctx.layer, ", whose tokens take ", k);
  if (ctx.routed_experts != nullptr) *ctx.routed_experts = routing.experts;
  const Grouping g = Group(routing, m.num_experts);

  // Expert e over its rows of the gathered input: [rows_e, hidden] -> [rows_e, hidden] (this
  // rank's partial sum under TP).
  const torch::Tensor x = h.index_select(0, g.tokens);  // [T·k, hidden]
  std::vector<torch::Tensor> outs;
  int64_t start = 0;
  for (int64_t e = 0; e < m.num_experts; ++e) {
    const int64_t rows = g.counts[e];
    if (rows == 0) continue;
    const torch::Tensor xe = x.narrow(0, start, rows);
    const torch::Tensor gate = Linear(xe, w.params[ExpertSlot(e, kExpertGateProj)]);
    const torch::Tensor up = Linear(xe, w.params[ExpertSlot(e, kExpertUpProj)]);
    outs.push_back(Linear(internal::SiluMul(gate, up), w.params[ExpertSlot(e, kExpertDownProj)]));
    start += rows;
  }
  // Weighted rows back in slot order [T, k, hidden]; each token's k rows summed in ascending
  // expert id, starting from the first (HF: zeros, then index_add_ expert by expert).
  const torch::Tensor weighted = torch::cat(outs, 0) * g.weights.unsqueeze(1);
  const torch::Tensor slots = weighted.index_select(0, g.inverse).view({t, k, hidden});
  torch::Tensor out = slots.select(1, 0);
  for (int64_t j = 1; j < k; ++j) out = out + slots.select(1, j);
  return ctx.ReducePartial(out.contiguous());  // [T, hidden] or this rank's sequence rows
}

void MoeBlock::FuseProjections(FeedForwardWeights&) const {}

void MoeBlock::UnfuseProjections(FeedForwardWeights& w) const { w.fused.clear(); }

bool MoeBlock::FoldsNorm(const FeedForwardWeights&) const { return false; }

torch::Tensor MoeBlock::FusedForward(const FeedForwardWeights& w, const torch::Tensor& h,
                                     const internal::FusedForwardState& s) const {
  TORCH_CHECK(s.config != nullptr && s.tp != nullptr,
              "moe fused forward: the state names no config or TP group");
  FeedForwardContext ctx{*s.config, s.layer, *s.tp};
  ctx.replay_experts = s.replay_experts;
  ctx.routed_experts = s.routed_experts;
  return Forward(w, h, ctx);
}

void MoeBlock::FusedForwardFolded(const FeedForwardWeights&, const torch::Tensor&,
                                  const internal::FusedForwardState&) const {
  TORCH_CHECK(false, "the moe block has no folded fused forward (FoldsNorm is false)");
}

}  // namespace slime::model
