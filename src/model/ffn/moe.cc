// The sparse mixture-of-experts block (see include/slime/model/ffn/moe.h).
#include "slime/model/ffn/moe.h"

#include <fmt/format.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <string>
#include <tuple>

#include "decoder_ops.h"
#include "fused_inference.h"
#include "slime/model/batch_invariant.h"
#include "slime/model/expert_parallel.h"

// The engine's grouped-GEMM path: torch's grouped matmul (LibTorch >= 2.8, bf16 on Hopper).
#if defined(SLIME_MODEL_FUSED_KERNELS) && \
    (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 8))
#define SLIME_MOE_GROUPED_MM 1
#include <ATen/cuda/CUDAContext.h>

#include "cuda/fused_ops.h"
#endif

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
    for (size_t i = specs.size() - 3; i < specs.size(); ++i) specs[i].expert = e;
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

namespace {

// Experts [first, first + counts.size()) over their contiguous rows of x [rows, hidden]
// (counts[j] rows for expert first + j, in that order): [rows, hidden] (this rank's partial sum
// under TP). Experts without rows are skipped; with no rows at all, x itself ([0, hidden]) is
// returned, so the graph still runs back through x.
torch::Tensor RunExperts(const FeedForwardWeights& w, const torch::Tensor& x,
                         const std::vector<int64_t>& counts, int64_t first) {
  std::vector<torch::Tensor> outs;
  int64_t start = 0;
  for (size_t j = 0; j < counts.size(); ++j) {
    const int64_t rows = counts[j], e = first + static_cast<int64_t>(j);
    if (rows == 0) continue;
    const torch::Tensor xe = x.narrow(0, start, rows);
    auto weight = [&](MoeBlock::ExpertProj proj) {
      return w.params[MoeBlock::ExpertSlot(e, proj)];
    };
    const torch::Tensor gate = Linear(xe, weight(MoeBlock::kExpertGateProj));
    const torch::Tensor up = Linear(xe, weight(MoeBlock::kExpertUpProj));
    outs.push_back(Linear(internal::SiluMul(gate, up), weight(MoeBlock::kExpertDownProj)));
    start += rows;
  }
  return outs.empty() ? x : torch::cat(outs, 0);
}

// Expert parallelism (expert_parallel.h): this rank's grouped rows x [T·k, hidden] (counts[e]
// rows for expert e, ascending e) go to the owners of their experts, each owner runs its
// experts over the rows of every rank of the group, and the outputs come back: [T·k, hidden]
// in x's order.
//   1. counts: an all-to-all of the per-expert counts tells each owner how many rows of each
//      of its experts every rank sends ([N·L], source-major; L = E/N experts a rank);
//   2. dispatch: the rows, source-major (each source's rows in ascending expert id);
//   3. the owner reorders them expert-major (expert j's rows of source 0, of source 1, ...) and
//      runs each expert over its rows once;
//   4. combine: back to source-major and the reverse all-to-all (the dispatch's splits swapped).
// Both all-to-alls are differentiable (their backward is the reverse exchange).
torch::Tensor RunOnOwners(const FeedForwardWeights& w, const torch::Tensor& x,
                          const std::vector<int64_t>& counts, const FeedForwardContext& ctx) {
  ExpertParallelGroup& ep = *ctx.ep;
  const int n = ep.size();
  const int64_t num_experts = static_cast<int64_t>(counts.size()), local = num_experts / n;
  TORCH_CHECK(num_experts % n == 0, "moe layer ", ctx.layer, ": ", num_experts,
              " experts do not split over ", n, " expert-parallel ranks");
  const ExpertShard shard{ep.rank(), n};
  const int64_t first = shard.first(num_experts);

  // 1. counts: send_splits[r] rows go to rank r; recv[s·L + j] rows of local expert j from s.
  std::vector<int64_t> send_splits(n, 0), per_rank(n, local);
  for (int64_t e = 0; e < num_experts; ++e) send_splits[e / local] += counts[e];
  const torch::Tensor sent_counts = torch::tensor(counts, torch::kInt64).to(x.device());
  const torch::Tensor got_counts =
      ep.AllToAll(sent_counts, per_rank, per_rank).to(torch::kCPU).contiguous();  // [N·L]
  const int64_t* rc = got_counts.data_ptr<int64_t>();
  std::vector<int64_t> recv_splits(n, 0), expert_rows(local, 0);
  for (int s = 0; s < n; ++s) {
    for (int64_t j = 0; j < local; ++j) {
      recv_splits[s] += rc[s * local + j];
      expert_rows[j] += rc[s * local + j];
    }
  }

  // 2. dispatch: [R, hidden], source-major.
  const torch::Tensor received = AllToAllRows(x, send_splits, recv_splits, ep);

  // 3. expert-major order of the received rows: perm[i] = the received row at position i.
  std::vector<int64_t> source_start(n, 0);
  for (int s = 1; s < n; ++s) source_start[s] = source_start[s - 1] + recv_splits[s - 1];
  std::vector<int64_t> perm;
  perm.reserve(static_cast<size_t>(source_start[n - 1] + recv_splits[n - 1]));
  std::vector<int64_t> cursor = source_start;  // next row of each source
  for (int64_t j = 0; j < local; ++j) {
    for (int s = 0; s < n; ++s) {
      for (int64_t i = 0; i < rc[s * local + j]; ++i) perm.push_back(cursor[s]++);
    }
  }
  const torch::Tensor order = torch::tensor(perm, torch::kInt64).to(x.device());
  const torch::Tensor inverse =
      torch::empty_like(order).scatter_(0, order, torch::arange(order.numel(), order.options()));
  const torch::Tensor by_expert = received.index_select(0, order);
  const torch::Tensor computed = RunExperts(w, by_expert, expert_rows, first);

  // 4. combine: source-major again, then back to the senders.
  return AllToAllRows(computed.index_select(0, inverse), recv_splits, send_splits, ep);
}

}  // namespace

torch::Tensor MoeBlock::Forward(const FeedForwardWeights& w, const torch::Tensor& h,
                                const FeedForwardContext& ctx) const {
  const MoeConfig& m = ctx.config.moe;
  const int64_t t = h.size(0), k = m.num_experts_per_tok, hidden = h.size(1);
  // Under expert parallelism a rank without tokens still takes part in the exchanges.
  const bool expert_parallel = ctx.ep != nullptr && ctx.ep->size() > 1;
  if (t == 0 && !expert_parallel) return ctx.ReducePartial(torch::zeros_like(h));
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

  // Every slot's expert output, in the grouped order: [T·k, hidden] (this rank's partial sum
  // under TP) — computed here, or by the experts' owners under expert parallelism.
  const torch::Tensor x = h.index_select(0, g.tokens);  // [T·k, hidden]
  const torch::Tensor expert_out =
      expert_parallel ? RunOnOwners(w, x, g.counts, ctx) : RunExperts(w, x, g.counts, 0);
  // Weighted rows back in slot order [T, k, hidden]; each token's k rows summed in ascending
  // expert id, starting from the first (HF: zeros, then index_add_ expert by expert).
  const torch::Tensor weighted = expert_out * g.weights.unsqueeze(1);
  const torch::Tensor slots = weighted.index_select(0, g.inverse).view({t, k, hidden});
  torch::Tensor out = slots.select(1, 0);
  for (int64_t j = 1; j < k; ++j) out = out + slots.select(1, j);
  return ctx.ReducePartial(out.contiguous());  // [T, hidden] or this rank's sequence rows
}

namespace {

// The stacked expert weights of FeedForwardWeights::fused (FuseProjections).
constexpr int kExpertsGateUp = 0;  // [E, 2 I/P, hidden]: expert e's gate rows over its up rows
constexpr int kExpertsDown = 1;    // [E, hidden, I/P]

int64_t ExpertCount(const FeedForwardWeights& w) {
  return (static_cast<int64_t>(w.params.size()) - 1) / 3;
}

}  // namespace

void MoeBlock::FuseProjections(FeedForwardWeights& w) const {
  const int64_t experts = ExpertCount(w);
  if (!w.fused.empty() || experts <= 0) return;
  for (int64_t e = 0; e < experts; ++e) {
    for (ExpertProj p : {kExpertGateProj, kExpertUpProj, kExpertDownProj}) {
      if (!w.params[ExpertSlot(e, p)].defined()) return;  // not every expert here: stay separate
    }
  }
  const torch::Tensor& gate0 = w.params[ExpertSlot(0, kExpertGateProj)];
  const int64_t inter = gate0.size(0), hidden = gate0.size(1);
  // Copied in expert by expert, each separate tensor replaced by its view as it goes, so memory
  // grows by at most one expert's weights.
  torch::Tensor gate_up = torch::empty({experts, 2 * inter, hidden}, gate0.options());
  torch::Tensor down = torch::empty({experts, hidden, inter}, gate0.options());
  for (int64_t e = 0; e < experts; ++e) {
    torch::Tensor& gate = w.params[ExpertSlot(e, kExpertGateProj)];
    torch::Tensor& up = w.params[ExpertSlot(e, kExpertUpProj)];
    torch::Tensor& d = w.params[ExpertSlot(e, kExpertDownProj)];
    gate_up[e].narrow(0, 0, inter).copy_(gate);
    gate_up[e].narrow(0, inter, inter).copy_(up);
    down[e].copy_(d);
    gate = gate_up[e].narrow(0, 0, inter);
    up = gate_up[e].narrow(0, inter, inter);
    d = down[e];
  }
  w.fused = {gate_up, down};
}

void MoeBlock::UnfuseProjections(FeedForwardWeights& w) const {
  if (w.fused.empty()) return;
  for (size_t slot = 1; slot < w.params.size(); ++slot) {
    torch::Tensor& t = w.params[slot];
    if (t.defined()) t = t.clone();
  }
  w.fused.clear();
}

bool MoeBlock::FoldsNorm(const FeedForwardWeights&) const { return false; }

bool MoeBlock::GroupedGemm(const FeedForwardWeights& w) {
#ifdef SLIME_MOE_GROUPED_MM
  if (w.fused.size() != 2 || BatchInvariant()) return false;
  const torch::Tensor& gate_up = w.fused[kExpertsGateUp];
  // The grouped GEMM wants 16-byte rows: hidden and I/P multiples of 8 bf16 values.
  if (!gate_up.is_cuda() || gate_up.scalar_type() != torch::kBFloat16 ||
      gate_up.size(1) % 16 != 0 || gate_up.size(2) % 8 != 0) {
    return false;
  }
  // torch's CUTLASS kernel runs on sm90 / sm100; elsewhere it falls back to a per-group loop
  // that reads the offsets on the host.
  const int major = at::cuda::getDeviceProperties(gate_up.get_device())->major;
  return major == 9 || major == 10;
#else
  (void)w;
  return false;
#endif
}

bool MoeBlock::WaitsOnHost(const FeedForwardWeights& w) const { return !GroupedGemm(w); }

#ifdef SLIME_MOE_GROUPED_MM
namespace {

// The expert computation of GroupedGemm's path: every expert's rows in one grouped GEMM per
// projection, the group sizes found on the device (no host sync: decode CUDA graphs capture it).
// Returns the partial block output [T, hidden], each token's k weighted rows summed in ascending
// expert id as Forward does.
torch::Tensor GroupedExperts(const FeedForwardWeights& w, const torch::Tensor& h,
                             const MoeBlock::Routing& r, const internal::FusedForwardState& s) {
  const torch::Tensor& gate_up = w.fused[kExpertsGateUp];  // [E, 2 I/P, hidden]
  const torch::Tensor& down = w.fused[kExpertsDown];       // [E, hidden, I/P]
  const int64_t t = h.size(0), k = r.experts.size(1), n = t * k, hidden = h.size(1);
  const int64_t inter = gate_up.size(1) / 2;
  const torch::Tensor flat = r.experts.reshape({n});
  const torch::Tensor slots = torch::arange(n, flat.options());
  const torch::Tensor order = std::get<1>((flat * n + slots).sort(/*dim=*/0));
  const torch::Tensor inverse = torch::empty_like(order).scatter_(0, order, slots);
  const torch::Tensor counts = torch::zeros({gate_up.size(0)}, flat.options())
                                   .scatter_add_(0, flat, torch::ones_like(flat));
  const torch::Tensor offsets = counts.cumsum(0).to(torch::kInt32);  // [E] end of each group
  const torch::Tensor x = h.index_select(0, torch::div(order, k, "trunc"));  // [T·k, hidden]
  const torch::Tensor gu = at::_grouped_mm(x, gate_up.transpose(1, 2), offsets);  // [T·k, 2I/P]
  torch::Tensor act = torch::empty({n, inter}, gu.options());
  internal::CheckLaunch(cuda::LaunchSiluMulPacked(gu.data_ptr(), act.data_ptr(), n, inter, s.dt,
                                                  internal::CurrentStream()),
                        "moe SiLU*up");
  const torch::Tensor y = at::_grouped_mm(act, down.transpose(1, 2), offsets);  // [T·k, hidden]
  const torch::Tensor weighted = y * r.weights.reshape({n}).index_select(0, order).unsqueeze(1);
  const torch::Tensor rows = weighted.index_select(0, inverse).view({t, k, hidden});
  torch::Tensor out = rows.select(1, 0);
  for (int64_t j = 1; j < k; ++j) out = out + rows.select(1, j);
  return out.contiguous();
}

}  // namespace
#endif

torch::Tensor MoeBlock::FusedForward(const FeedForwardWeights& w, const torch::Tensor& h,
                                     const internal::FusedForwardState& s) const {
  TORCH_CHECK(s.config != nullptr && s.tp != nullptr,
              "moe fused forward: the state names no config or TP group");
  FeedForwardContext ctx{*s.config, s.layer, *s.tp};
  ctx.replay_experts = s.replay_experts;
  ctx.routed_experts = s.routed_experts;
#ifdef SLIME_MOE_GROUPED_MM
  if (GroupedGemm(w) && s.replay_experts == nullptr && h.size(0) > 0) {
    const MoeConfig& m = s.config->moe;
    const Routing routing = Route(Linear(h, w.params[kRouter]), m.num_experts_per_tok,
                                  m.norm_topk_prob, h.scalar_type());
    if (s.routed_experts != nullptr) *s.routed_experts = routing.experts;
    return ctx.ReducePartial(GroupedExperts(w, h, routing, s));
  }
#endif
  return Forward(w, h, ctx);
}

void MoeBlock::FusedForwardFolded(const FeedForwardWeights&, const torch::Tensor&,
                                  const internal::FusedForwardState&) const {
  TORCH_CHECK(false, "the moe block has no folded fused forward (FoldsNorm is false)");
}

}  // namespace slime::model
