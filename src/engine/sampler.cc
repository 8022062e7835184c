// The sampler (see include/slime/engine/sampler.h).
#include "slime/engine/sampler.h"

#include <torch/torch.h>

#include <algorithm>
#include <limits>
#include <map>

#include "slime/model/batch_invariant.h"

#ifdef SLIME_ENGINE_PAGED_KERNEL
#include <ATen/cuda/CUDAContext.h>

#include "cuda/sample.h"
#endif

namespace slime::engine {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

int64_t RowKey(uint64_t seed, int64_t position) {
  return static_cast<int64_t>(SplitMix64(SplitMix64(seed) ^ static_cast<uint64_t>(position)));
}

// Applies bias, penalties and the min_new_tokens mask to row `b` of `logits` (float32, in place).
void AdjustRow(torch::Tensor& logits, int64_t b, const SamplerRow& row) {
  const SamplingParams& p = *row.params;
  const int64_t vocab = logits.size(1);
  torch::Tensor r = logits[b];
  if (!p.logit_bias.empty()) {
    for (const auto& [id, bias] : p.logit_bias) {
      if (id >= 0 && id < vocab) r[id] += bias;
    }
  }
  if (p.has_penalties() && row.tokens != nullptr) {
    auto opts = torch::TensorOptions().dtype(torch::kLong);
    const auto& toks = *row.tokens;
    if (p.repetition_penalty != 1.0 && !toks.empty()) {
      std::vector<int64_t> ids(toks.begin(), toks.end());
      torch::Tensor idx = torch::tensor(ids, opts).to(logits.device());
      torch::Tensor vals = r.index_select(0, idx);
      vals = torch::where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty);
      r.index_put_({idx}, vals);
    }
    const int64_t n_out = static_cast<int64_t>(toks.size()) - row.prompt_len;
    if ((p.frequency_penalty != 0.0 || p.presence_penalty != 0.0) && n_out > 0) {
      std::vector<int64_t> ids(toks.begin() + row.prompt_len, toks.end());
      torch::Tensor idx = torch::tensor(ids, opts).to(logits.device());
      torch::Tensor counts = torch::zeros({vocab}, logits.options());
      counts.index_add_(0, idx, torch::ones({n_out}, logits.options()));
      r -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(torch::kFloat32);
    }
  }
  if (row.num_output < p.min_new_tokens && row.stop_ids != nullptr) {
    for (int32_t id : *row.stop_ids) {
      if (id >= 0 && id < vocab) r[id] = -std::numeric_limits<float>::infinity();
    }
  }
}

}  // namespace

double SamplerUniform(uint64_t seed, int64_t position) {
  const uint64_t x = static_cast<uint64_t>(RowKey(seed, position));
  return (static_cast<double>(x >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

torch::Tensor TokenLogprobs(const torch::Tensor& logits, const torch::Tensor& targets,
                            double temperature) {
  if (model::BatchInvariant() && model::InvariantKernelsServe(logits.device())) {
    return model::InvariantTokenLogProbs(logits, targets, temperature);
  }
  torch::Tensor scaled = logits.to(torch::kFloat32);
  if (temperature >= 1e-6 && temperature != 1.0) scaled = scaled / temperature;
  return torch::log_softmax(scaled, -1)
      .gather(1, targets.to(logits.device(), torch::kLong).unsqueeze(1))
      .squeeze(1);
}

namespace {

// Deterministic mode (model/batch_invariant.h): the chosen tokens' log-probs [B] by the trainer's
// computation on the same logits and temperature, so the two agree to the bit. Its row
// statistics do not depend on the row count, so the rows of one temperature go in one call
// (usually the whole batch).
torch::Tensor InvariantChosenLogprobs(const torch::Tensor& logits, const torch::Tensor& chosen,
                                      const std::vector<SamplerRow>& rows) {
  std::map<double, std::vector<int64_t>> by_temperature;
  for (size_t b = 0; b < rows.size(); ++b) {
    by_temperature[rows[b].params->temperature].push_back(static_cast<int64_t>(b));
  }
  if (by_temperature.size() == 1) {
    return model::InvariantTokenLogProbs(logits, chosen, rows[0].params->temperature);
  }
  torch::Tensor out = torch::empty({logits.size(0)}, logits.options().dtype(torch::kFloat32));
  for (const auto& [temperature, members] : by_temperature) {
    const torch::Tensor index = torch::tensor(members, torch::kLong).to(logits.device());
    out.index_copy_(0, index,
                    model::InvariantTokenLogProbs(logits.index_select(0, index),
                                                  chosen.index_select(0, index), temperature));
  }
  return out;
}

}  // namespace

#ifdef SLIME_ENGINE_PAGED_KERNEL
// The fused kernel: logits float32 [B, V] on CUDA with contiguous rows, no truncation. Its tokens
// depend on the row only (cuda/sample.h); in deterministic mode the log-probs are replaced by
// InvariantChosenLogprobs before the one read-back.
SamplerOutput SampleFused(const torch::Tensor& logits, const std::vector<SamplerRow>& rows) {
  const int64_t batch = logits.size(0);
  torch::Tensor host =
      torch::empty({batch, 2}, torch::TensorOptions().dtype(torch::kFloat32).pinned_memory(true));
  float* hp = host.data_ptr<float>();
  for (int64_t b = 0; b < batch; ++b) {
    const SamplingParams& p = *rows[b].params;
    hp[2 * b] = p.greedy() ? 0.f : static_cast<float>(p.temperature);
    hp[2 * b + 1] = static_cast<float>(SamplerUniform(rows[b].seed, rows[b].num_output));
  }
  torch::Tensor params = torch::empty(
      {batch, 2}, torch::TensorOptions().dtype(torch::kFloat32).device(logits.device()));
  params.copy_(host, /*non_blocking=*/true);
  torch::Tensor out =
      torch::empty({2, batch}, torch::TensorOptions().dtype(torch::kFloat64).device(logits.device()));
  torch::Tensor scratch =
      torch::empty({cuda::FusedSampleScratchBytes(static_cast<int>(batch))},
                   torch::TensorOptions().dtype(torch::kUInt8).device(logits.device()));
  cuda::FusedSampleArgs a;
  a.logits = logits.data_ptr<float>();
  a.row_stride = logits.stride(0);
  a.batch = static_cast<int>(batch);
  a.vocab = static_cast<int>(logits.size(1));
  a.params = params.data_ptr<float>();
  a.out = out.data_ptr<double>();
  a.scratch = scratch.data_ptr();
  const int err = cuda::LaunchFusedSample(a, at::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == 0, "fused sampling kernel failed with CUDA error ", err);
  if (model::BatchInvariant() && model::InvariantKernelsServe(logits.device())) {
    out[1].copy_(InvariantChosenLogprobs(logits, out[0].to(torch::kLong), rows));
  }
  // Read back through a reused pinned buffer (a pageable .cpu() copy stages through a bounce
  // buffer and allocates every step).
  thread_local torch::Tensor pinned;
  if (!pinned.defined() || pinned.numel() < out.numel()) {
    pinned = torch::empty({std::max<int64_t>(out.numel(), 64)},
                          torch::TensorOptions().dtype(torch::kFloat64).pinned_memory(true));
  }
  torch::Tensor packed = pinned.narrow(0, 0, out.numel());
  packed.copy_(out.view({-1}), /*non_blocking=*/true);
  at::cuda::getCurrentCUDAStream().synchronize();
  SamplerOutput res;
  res.tokens.resize(batch);
  res.logprobs.resize(batch);
  res.top.resize(batch);
  const double* pk = packed.data_ptr<double>();
  for (int64_t b = 0; b < batch; ++b) {
    res.tokens[b] = static_cast<int32_t>(pk[b]);
    res.logprobs[b] = static_cast<float>(pk[batch + b]);
  }
  return res;
}
#endif

SamplerOutput Sample(const torch::Tensor& logits_in, const std::vector<SamplerRow>& rows,
                     SamplerPath path) {
  torch::NoGradGuard no_grad;
  const int64_t batch = logits_in.size(0);
  const int64_t vocab = logits_in.size(1);
  const torch::Device device = logits_in.device();
  auto needs_adjust = [](const SamplerRow& row) {
    const SamplingParams& p = *row.params;
    return !p.logit_bias.empty() || p.has_penalties() ||
           (row.num_output < p.min_new_tokens && row.stop_ids != nullptr &&
            !row.stop_ids->empty());
  };
  bool any_adjust = false, any_logprob = false;
  for (const SamplerRow& row : rows) {
    any_adjust = any_adjust || needs_adjust(row);
    any_logprob = any_logprob || row.need_logprob || row.top_logprobs_num > 0;
  }
  torch::Tensor logits = logits_in.to(torch::kFloat32);
  if (any_adjust && logits.data_ptr() == logits_in.data_ptr()) logits = logits.clone();

  std::vector<float> temps(batch), top_ps(batch), min_ps(batch);
  std::vector<int64_t> top_ks(batch);
  std::vector<uint8_t> greedy(batch);
  bool any_filter = false, any_sampled = false;
  int64_t max_top = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const SamplerRow& row = rows[b];
    const SamplingParams& p = *row.params;
    if (needs_adjust(row)) AdjustRow(logits, b, row);
    greedy[b] = p.greedy();
    temps[b] = greedy[b] ? 1.0f : static_cast<float>(p.temperature);
    top_ps[b] = static_cast<float>(p.top_p);
    top_ks[b] = p.top_k < 0 ? vocab : std::min<int64_t>(p.top_k, vocab);
    min_ps[b] = static_cast<float>(p.min_p);
    if (!greedy[b]) {
      any_sampled = true;
      any_filter = any_filter || p.top_p < 1.0 || top_ks[b] < vocab || p.min_p > 0.0;
    }
    max_top = std::max(max_top, row.top_logprobs_num);
  }
#ifdef SLIME_ENGINE_PAGED_KERNEL
  if (path == SamplerPath::kAuto && device.is_cuda() && !any_filter && max_top == 0 &&
      logits.stride(1) == 1 && vocab <= std::numeric_limits<int>::max()) {
    return SampleFused(logits, rows);
  }
#endif
  auto fopts = torch::TensorOptions().dtype(torch::kFloat32);
  auto lopts = torch::TensorOptions().dtype(torch::kLong);
  // log_softmax(logits / T) [B, V]: the returned log-probs, and the sampled rows' distribution.
  torch::Tensor logprobs;
  if (any_logprob || any_sampled) {
    const bool unit_temp = std::all_of(temps.begin(), temps.end(), [](float t) { return t == 1.f; });
    torch::Tensor scaled =
        unit_temp ? logits : logits / torch::tensor(temps, fopts).to(device).unsqueeze(1);
    logprobs = torch::log_softmax(scaled, -1);
  }
  torch::Tensor chosen = logits.argmax(1);  // greedy rows
  if (any_sampled) {
    // Only the sampled rows pay for truncation and noise.
    std::vector<int64_t> sel, sel_top_k;
    std::vector<float> sel_top_p, sel_min_p;
    for (int64_t b = 0; b < batch; ++b) {
      if (greedy[b]) continue;
      sel.push_back(b);
      sel_top_k.push_back(top_ks[b]);
      sel_top_p.push_back(top_ps[b]);
      sel_min_p.push_back(min_ps[b]);
    }
    const bool all_sampled = static_cast<int64_t>(sel.size()) == batch;
    torch::Tensor sel_t = torch::tensor(sel, lopts).to(device);
    torch::Tensor probs = (all_sampled ? logprobs : logprobs.index_select(0, sel_t)).exp();
    if (any_filter) {
      auto sorted = probs.sort(1, /*descending=*/true);
      torch::Tensor sp = std::get<0>(sorted), si = std::get<1>(sorted);
      torch::Tensor rank = torch::arange(vocab, lopts.device(device)).unsqueeze(0);
      torch::Tensor keep = rank < torch::tensor(sel_top_k, lopts).to(device).unsqueeze(1);
      torch::Tensor before = sp.cumsum(1) - sp;
      keep = keep & (before <= torch::tensor(sel_top_p, fopts).to(device).unsqueeze(1));
      keep = keep & (sp >= torch::tensor(sel_min_p, fopts).to(device).unsqueeze(1) *
                               sp.narrow(1, 0, 1));
      keep.narrow(1, 0, 1).fill_(true);  // the most likely token always survives
      probs = torch::zeros_like(probs).scatter_(1, si, sp * keep.to(torch::kFloat32));
    }
    // Inverse-CDF sampling with one uniform per row: the first token whose cumulative
    // (unnormalised, truncated) mass exceeds u * total.
    std::vector<double> us;
    us.reserve(sel.size());
    for (int64_t b : sel) us.push_back(SamplerUniform(rows[b].seed, rows[b].num_output));
    torch::Tensor cdf = probs.cumsum(1);  // [S, V]
    torch::Tensor target =
        torch::tensor(us, torch::TensorOptions().dtype(torch::kFloat64)).to(device).to(torch::kFloat32) *
        cdf.narrow(1, vocab - 1, 1).squeeze(1);
    torch::Tensor sampled =
        at::searchsorted(cdf, target.unsqueeze(1), /*out_int32=*/false, /*right=*/true)
            .squeeze(1)
            .clamp_max(vocab - 1);
    if (all_sampled) {
      chosen = sampled;
    } else {
      chosen.index_copy_(0, sel_t, sampled);
    }
  }
  torch::Tensor chosen_lp;
  if (logprobs.defined() && model::BatchInvariant() && model::InvariantKernelsServe(device)) {
    chosen_lp = InvariantChosenLogprobs(logits, chosen, rows);
  } else {
    chosen_lp = logprobs.defined() ? logprobs.gather(1, chosen.unsqueeze(1)).squeeze(1)
                                   : torch::zeros({batch}, fopts.device(device));
  }
  // One transfer: ids (exact in float64) and log-probs side by side.
  torch::Tensor packed =
      torch::stack({chosen.to(torch::kFloat64), chosen_lp.to(torch::kFloat64)}).cpu();
  SamplerOutput out;
  out.tokens.resize(batch);
  out.logprobs.resize(batch);
  out.top.resize(batch);
  auto acc = packed.accessor<double, 2>();
  for (int64_t b = 0; b < batch; ++b) {
    out.tokens[b] = static_cast<int32_t>(acc[0][b]);
    out.logprobs[b] = static_cast<float>(acc[1][b]);
  }
  if (max_top > 0) {
    auto top = logprobs.topk(std::min(max_top, vocab), 1);
    torch::Tensor tv = std::get<0>(top).cpu(), ti = std::get<1>(top).cpu();
    auto av = tv.accessor<float, 2>();
    auto ai = ti.accessor<int64_t, 2>();
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t j = 0; j < std::min(rows[b].top_logprobs_num, vocab); ++j) {
        out.top[b].emplace_back(av[b][j], static_cast<int32_t>(ai[b][j]));
      }
    }
  }
  return out;
}

}  // namespace slime::engine
