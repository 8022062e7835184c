// Response log-probs and entropy over a vocab-parallel LM head (see
// include/slime/train/logprobs.h).
#include "slime/train/logprobs.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "slime/model/batch_invariant.h"
#include "slime/model/fused_train.h"

namespace slime::train {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The dtype the softmax runs in: float32, or float64 for float64 inputs (gradient checks).
torch::ScalarType ComputeDtype(torch::ScalarType input) {
  return input == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
}

// z - m for one chunk: [C, V/P] in the compute dtype, z = float(h Wᵀ) / temperature. A fresh
// buffer the caller may modify in place.
torch::Tensor ShiftedLogits(const torch::Tensor& hidden, const torch::Tensor& weight,
                            double temperature, const torch::Tensor& row_max) {
  torch::Tensor z = model::Linear(hidden, weight).to(ComputeDtype(hidden.scalar_type()));
  if (temperature != 1.0) z.div_(temperature);
  if (row_max.defined()) z.sub_(row_max.unsqueeze(1));
  return z;
}

// The logits' column of each target on this rank, and whether this rank owns it.
struct LocalTargets {
  torch::Tensor index;  // [C] int64, 0 where not owned
  torch::Tensor owned;  // [C] bool
};

LocalTargets Localize(const torch::Tensor& targets, int64_t vocab_start, int64_t vocab_local) {
  torch::Tensor local = targets - vocab_start;
  torch::Tensor owned = (local >= 0) & (local < vocab_local);
  return {torch::where(owned, local, torch::zeros_like(local)), owned};
}

model::TensorParallelGroup* GroupFrom(AutogradContext* ctx) {
  return reinterpret_cast<model::TensorParallelGroup*>(
      static_cast<intptr_t>(ctx->saved_data["group"].toInt()));
}

// One chunk of rows through the vocab-parallel log-softmax, with a hand-written backward that
// recomputes the chunk's logits (so no [C, V] tensor is saved between forward and backward),
// or, with keep_logits, reuses the logits the forward kept.
//   forward(hidden [C, H], weight [V/P, H], targets [C] int64 global ids, temperature, group,
//           with_entropy, keep_logits) -> {log_probs [C]} or {log_probs [C], entropy [C]}
// Saved per chunk: hidden, weight, targets and per row m (global max of z), log S
// (S = Σ_v exp(z_v - m) over all ranks) and, with entropy, E_p[z - m]; with keep_logits also
// the chunk's logits (z - m in the compute dtype, or the model-dtype logits on the fused path).
// On one rank with CUDA tensors the fused kernels of model/fused_train.h compute the same rows in
// one pass over the model-dtype logits (no [C, V] float32 buffer) and the backward in one
// in-place pass.
class VocabParallelLogProbChunk : public torch::autograd::Function<VocabParallelLogProbChunk> {
 public:
  static variable_list forward(AutogradContext* ctx, torch::Tensor hidden, torch::Tensor weight,
                               torch::Tensor targets, double temperature,
                               model::TensorParallelGroup* group, bool with_entropy,
                               bool keep_logits) {
    const int64_t vocab_local = weight.size(0);
    const bool parallel = group->size() > 1;
    ctx->saved_data["temperature"] = temperature;
    ctx->saved_data["group"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(group));
    ctx->saved_data["kept"] = keep_logits;
    ctx->set_materialize_grads(false);
    if (!parallel && model::FusedTrainingApplies(hidden)) {
      // One pass over the model-dtype logits; no [C, V] float32 buffer.
      const torch::Tensor logits = torch::linear(hidden, weight).contiguous();
      model::LogSoftmaxRows r =
          model::FusedLogSoftmaxRows(logits, targets, temperature, with_entropy);
      ctx->save_for_backward({hidden, weight, targets, r.row_max, r.log_sum, r.mean_shifted,
                              keep_logits ? logits : torch::Tensor()});
      ctx->saved_data["fused"] = true;
      if (with_entropy) return {r.log_probs, r.entropy};
      return {r.log_probs};
    }
    ctx->saved_data["fused"] = false;
    torch::Tensor z = ShiftedLogits(hidden, weight, temperature, torch::Tensor());  // [C, V/P]
    if (!parallel && model::BatchInvariant() && model::InvariantKernelsServe(z.device())) {
      // Deterministic mode: the engine's sums (model/batch_invariant.h), so a token's log-prob
      // is the engine's to the bit.
      const model::SoftmaxStats st = model::InvariantSoftmaxStats(z, with_entropy);
      LocalTargets t = Localize(targets, 0, vocab_local);
      const torch::Tensor target_z = z.gather(1, t.index.unsqueeze(1)).squeeze(1) - st.max;
      variable_list out = {target_z - st.log_sum};
      if (with_entropy) out.push_back(st.log_sum - st.mean_shifted);
      ctx->save_for_backward({hidden, weight, targets, st.max, st.log_sum, st.mean_shifted,
                              keep_logits ? z.sub_(st.max.unsqueeze(1)) : torch::Tensor()});
      return out;
    }
    torch::Tensor m = std::get<0>(z.max(1));                                        // [C]
    if (parallel) m = std::get<0>(group->AllGather(m.unsqueeze(1), 1).max(1));      // [C, P] -> [C]
    z.sub_(m.unsqueeze(1));
    LocalTargets t = Localize(targets, group->rank() * vocab_local, vocab_local);
    torch::Tensor target_z =
        torch::where(t.owned, z.gather(1, t.index.unsqueeze(1)).squeeze(1), torch::zeros_like(m));
    torch::Tensor e = z.exp();  // [C, V/P]
    torch::Tensor sum_e = e.sum(1);
    torch::Tensor sum_ez;
    if (with_entropy) sum_ez = e.mul_(z).sum(1);  // Σ exp(z - m)·(z - m)
    if (parallel) {
      torch::Tensor partial =
          with_entropy ? torch::stack({target_z, sum_e, sum_ez}) : torch::stack({target_z, sum_e});
      group->AllReduceSum(partial);
      target_z = partial[0];
      sum_e = partial[1];
      if (with_entropy) sum_ez = partial[2];
    }
    torch::Tensor log_s = sum_e.log();
    torch::Tensor log_probs = target_z - log_s;
    torch::Tensor mean_z;  // E_p[z - m]
    variable_list out = {log_probs};
    if (with_entropy) {
      mean_z = sum_ez / sum_e;
      out.push_back(log_s - mean_z);  // H = log S - E_p[z - m]
    }
    ctx->save_for_backward({hidden, weight, targets, m, log_s, mean_z,
                            keep_logits ? z : torch::Tensor()});
    return out;
  }

  // ∂logp/∂z_v = onehot(target)_v - p_v (onehot only on the owning rank);
  // ∂H/∂z_v = p_v · (E_p[z] - z_v). Then through the temperature and the LM head.
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    torch::NoGradGuard no_grad;
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& hidden = saved[0];
    const torch::Tensor& weight = saved[1];
    const torch::Tensor& targets = saved[2];
    const torch::Tensor& m = saved[3];
    const torch::Tensor& log_s = saved[4];
    const torch::Tensor& mean_z = saved[5];
    // The kept logits (keep_logits) are used once: the backward overwrites them in place.
    const torch::Tensor kept = ctx->saved_data["kept"].toBool() ? saved[6] : torch::Tensor();
    const double temperature = ctx->saved_data["temperature"].toDouble();
    model::TensorParallelGroup* group = GroupFrom(ctx);
    const torch::Tensor g_lp = grad_outputs[0];
    const torch::Tensor g_ent = grad_outputs.size() > 1 ? grad_outputs[1] : torch::Tensor();
    variable_list grads(7);
    if (!g_lp.defined() && !g_ent.defined()) return grads;

    torch::Tensor grad_logits;  // ∂loss/∂logits [C, V/P] in the model dtype
    if (ctx->saved_data["fused"].toBool()) {
      grad_logits = kept.defined() ? kept : torch::linear(hidden, weight).contiguous();
      model::LogSoftmaxRows rows;
      rows.row_max = m;
      rows.log_sum = log_s;
      rows.mean_shifted = mean_z;
      model::FusedLogSoftmaxBackwardInPlace(grad_logits, targets, rows, g_lp, g_ent, temperature);
    } else {
      grad_logits = EagerGradLogits(hidden, weight, targets, m, log_s, mean_z, kept, g_lp, g_ent,
                                    temperature, *group);
    }
    if (ctx->needs_input_grad(0)) {
      torch::Tensor grad_hidden = grad_logits.mm(weight);  // [C, H], this shard's part
      if (group->size() > 1) group->AllReduceSum(grad_hidden);
      grads[0] = grad_hidden;
    }
    if (ctx->needs_input_grad(1)) grads[1] = grad_logits.t().mm(hidden);  // [V/P, H]
    return grads;
  }

 private:
  static torch::Tensor EagerGradLogits(const torch::Tensor& hidden, const torch::Tensor& weight,
                                       const torch::Tensor& targets, const torch::Tensor& m,
                                       const torch::Tensor& log_s, const torch::Tensor& mean_z,
                                       const torch::Tensor& kept, const torch::Tensor& g_lp,
                                       const torch::Tensor& g_ent,
                                       double temperature, model::TensorParallelGroup& group) {
    // z - m  [C, V/P]: the kept forward buffer, or computed again.
    torch::Tensor z = kept.defined() ? kept : ShiftedLogits(hidden, weight, temperature, m);
    torch::Tensor p = (z - log_s.unsqueeze(1)).exp_();                // softmax [C, V/P]
    torch::Tensor grad_z;                                             // ∂loss/∂z [C, V/P]
    if (g_ent.defined()) {
      // g_ent·(E[z] - z) - g_lp, times p
      z.neg_().add_(mean_z.unsqueeze(1)).mul_(g_ent.unsqueeze(1));
      if (g_lp.defined()) z.sub_(g_lp.unsqueeze(1));
      grad_z = z.mul_(p);
    } else {
      grad_z = p.mul_(-g_lp.unsqueeze(1));
    }
    if (g_lp.defined()) {
      const int64_t vocab_local = weight.size(0);
      LocalTargets t = Localize(targets, group.rank() * vocab_local, vocab_local);
      grad_z.scatter_add_(1, t.index.unsqueeze(1),
                          torch::where(t.owned, g_lp, torch::zeros_like(g_lp)).unsqueeze(1));
    }
    if (temperature != 1.0) grad_z.div_(temperature);
    return grad_z.to(hidden.scalar_type());
  }
};

Status CheckInputs(const torch::Tensor& hidden, const torch::Tensor& weight,
                   const torch::Tensor& input_ids, int64_t total_tokens) {
  auto bad = [](const std::string& msg) { return absl::InvalidArgumentError(msg); };
  if (!hidden.defined() || hidden.dim() != 2) return bad("hidden must be a [T, hidden] tensor");
  if (!weight.defined() || weight.dim() != 2 || weight.size(1) != hidden.size(1)) {
    return bad(fmt::format("lm_head_weight must be [V/P, {}] to match hidden", hidden.size(1)));
  }
  if (weight.size(0) < 1) return bad("lm_head_weight has no vocabulary rows");
  if (!torch::isFloatingType(hidden.scalar_type()) ||
      hidden.scalar_type() != weight.scalar_type()) {
    return bad(fmt::format("hidden ({}) and lm_head_weight ({}) must share a floating dtype",
                           c10::toString(hidden.scalar_type()),
                           c10::toString(weight.scalar_type())));
  }
  if (hidden.device() != weight.device()) {
    return bad(fmt::format("hidden ({}) and lm_head_weight ({}) are on different devices",
                           hidden.device().str(), weight.device().str()));
  }
  if (!input_ids.defined() || input_ids.dim() != 1 ||
      !torch::isIntegralType(input_ids.scalar_type(), /*includeBool=*/false)) {
    return bad("input_ids must be a [T] integer tensor");
  }
  if (hidden.size(0) < total_tokens || input_ids.size(0) < total_tokens) {
    return bad(fmt::format(
        "the packed sequences hold {} tokens but hidden has {} rows and input_ids {} ids",
        total_tokens, hidden.size(0), input_ids.size(0)));
  }
  return absl::OkStatus();
}

}  // namespace

StatusOr<std::vector<int64_t>> ResponsePredictorRows(const PackedSequences& packed) {
  const size_t b = packed.prompt_lengths.size();
  if (packed.cu_seqlens.size() != b + 1 || packed.response_lengths.size() != b) {
    return absl::InvalidArgumentError(fmt::format(
        "packed layout: {} cu_seqlens, {} prompt lengths and {} response lengths; need B + 1, "
        "B and B",
        packed.cu_seqlens.size(), b, packed.response_lengths.size()));
  }
  if (packed.cu_seqlens[0] != 0) {
    return absl::InvalidArgumentError(
        fmt::format("packed layout: cu_seqlens[0] must be 0, got {}", packed.cu_seqlens[0]));
  }
  std::vector<int64_t> rows;
  for (size_t i = 0; i < b; ++i) {
    const int64_t start = packed.cu_seqlens[i];
    const int64_t length = packed.cu_seqlens[i + 1] - start;
    const int64_t prompt = packed.prompt_lengths[i];
    const int64_t response = packed.response_lengths[i];
    if (prompt < 0 || response < 0 || prompt + response != length) {
      return absl::InvalidArgumentError(
          fmt::format("packed layout: sequence {} has {} tokens but prompt {} + response {}", i,
                      length, prompt, response));
    }
    if (response > 0 && prompt < 1) {
      return absl::InvalidArgumentError(fmt::format(
          "packed layout: sequence {} has an empty prompt; the first response token needs a "
          "position before it",
          i));
    }
    for (int64_t j = 0; j < response; ++j) rows.push_back(start + prompt + j - 1);
  }
  return rows;
}

StatusOr<ResponseLogProbs> ComputeResponseLogProbs(const torch::Tensor& hidden,
                                                   const torch::Tensor& lm_head_weight,
                                                   const torch::Tensor& input_ids,
                                                   const PackedSequences& packed,
                                                   model::TensorParallelGroup& group,
                                                   const LogProbOptions& options) {
  if (!std::isfinite(options.temperature) || options.temperature <= 0.0) {
    return absl::InvalidArgumentError(fmt::format(
        "temperature must be a finite number > 0 (the rollout temperature that divides the "
        "logits), got {}",
        options.temperature));
  }
  if (options.chunk_size != -1 && options.chunk_size < 1) {
    return absl::InvalidArgumentError(fmt::format(
        "log-probs chunk size must be >= 1 or -1 (all rows at once), got {}", options.chunk_size));
  }
  SLIME_ASSIGN_OR_RETURN(std::vector<int64_t> rows, ResponsePredictorRows(packed));
  SLIME_RETURN_IF_ERROR(CheckInputs(hidden, lm_head_weight, input_ids, packed.cu_seqlens.back()));

  ResponseLogProbs result;
  result.offsets.push_back(0);
  for (int64_t r : packed.response_lengths) result.offsets.push_back(result.offsets.back() + r);
  try {
    const auto opts =
        torch::TensorOptions().dtype(ComputeDtype(hidden.scalar_type())).device(hidden.device());
    const auto count = static_cast<int64_t>(rows.size());
    if (count == 0) {
      result.log_probs = torch::zeros({0}, opts);
      if (options.compute_entropy) result.entropy = torch::zeros({0}, opts);
      return result;
    }
    const torch::Tensor index =
        torch::tensor(rows, torch::TensorOptions().dtype(torch::kLong)).to(hidden.device());
    const torch::Tensor targets =
        input_ids.to(hidden.device(), torch::kLong).index_select(0, index + 1);  // [R]
    const int64_t vocab = lm_head_weight.size(0) * group.size();
    const int64_t lo = targets.min().item<int64_t>(), hi = targets.max().item<int64_t>();
    if (lo < 0 || hi >= vocab) {
      return absl::InvalidArgumentError(fmt::format(
          "a response token id ({}) is outside the vocabulary [0, {})", lo < 0 ? lo : hi, vocab));
    }
    const torch::Tensor h = hidden.index_select(0, index);  // [R, hidden]
    const int64_t chunk = options.chunk_size == -1 ? count : options.chunk_size;
    // Keep the logits only where a backward will use them.
    const bool keep_logits = !options.recompute_logits && torch::GradMode::is_enabled() &&
                             (hidden.requires_grad() || lm_head_weight.requires_grad());
    std::vector<torch::Tensor> log_probs, entropy;
    for (int64_t s = 0; s < count; s += chunk) {
      const int64_t c = std::min(chunk, count - s);
      variable_list out = VocabParallelLogProbChunk::apply(
          h.narrow(0, s, c), lm_head_weight, targets.narrow(0, s, c), options.temperature, &group,
          options.compute_entropy, keep_logits);
      log_probs.push_back(out[0]);
      if (options.compute_entropy) entropy.push_back(out[1]);
    }
    result.log_probs = log_probs.size() == 1 ? log_probs[0] : torch::cat(log_probs);
    if (options.compute_entropy) {
      result.entropy = entropy.size() == 1 ? entropy[0] : torch::cat(entropy);
    }
    return result;
  } catch (const c10::Error& e) {
    return absl::InternalError(fmt::format("response log-probs: {}", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(fmt::format("response log-probs: {}", e.what()));
  }
}

}  // namespace slime::train
