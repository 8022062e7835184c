#include "reference_decoder.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

#include "slime/model/ffn/dense_mlp.h"

namespace slime::model::testing {
namespace {

using torch::indexing::Slice;

torch::Tensor D(const torch::Tensor& t) { return t.detach().to(torch::kCPU, torch::kFloat64); }

// Per-row RMS normalisation of a [rows, n] matrix, scaled by w [n].
torch::Tensor Norm(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  torch::Tensor out = torch::empty_like(x);
  for (int64_t r = 0; r < x.size(0); ++r) {
    torch::Tensor row = x[r];
    double ms = (row * row).sum().item<double>() / static_cast<double>(row.size(0));
    out[r] = row / std::sqrt(ms + eps) * w;
  }
  return out;
}

// Rotary frequencies from the formulas, in double.
std::vector<double> Frequencies(const ModelConfig& c) {
  const int64_t half = c.head_dim / 2;
  std::vector<double> f(half);
  for (int64_t i = 0; i < half; ++i) {
    double freq = 1.0 / std::pow(c.rope.theta, 2.0 * static_cast<double>(i) / c.head_dim);
    if (c.rope.type == RopeType::kLinear) {
      freq /= c.rope.factor;
    } else if (c.rope.type == RopeType::kLlama3) {
      const double wavelen = 2.0 * M_PI / freq;
      const double old_len = static_cast<double>(c.rope.original_max_position_embeddings);
      const double low = old_len / c.rope.low_freq_factor;    // wavelengths above: scaled
      const double high = old_len / c.rope.high_freq_factor;  // below: unchanged
      if (wavelen > low) {
        freq = freq / c.rope.factor;  // low frequencies: fully interpolated
      } else if (wavelen >= high) {
        const double s = (old_len / wavelen - c.rope.low_freq_factor) /
                         (c.rope.high_freq_factor - c.rope.low_freq_factor);
        freq = (1.0 - s) * freq / c.rope.factor + s * freq;
      }
    }
    f[i] = freq;
  }
  return f;
}

// Rotates pairs (i, i + D/2) of vec [D] by angle pos * f[i].
torch::Tensor Rotate(const torch::Tensor& vec, int64_t pos, const std::vector<double>& f) {
  const int64_t half = static_cast<int64_t>(f.size());
  torch::Tensor out = vec.clone();
  for (int64_t i = 0; i < half; ++i) {
    const double a = vec[i].item<double>();
    const double b = vec[i + half].item<double>();
    const double angle = static_cast<double>(pos) * f[i];
    out[i] = a * std::cos(angle) - b * std::sin(angle);
    out[i + half] = b * std::cos(angle) + a * std::sin(angle);
  }
  return out;
}

torch::Tensor Affine(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
  torch::Tensor y = torch::matmul(x, D(w).t());
  if (b.defined()) y = y + D(b);
  return y;
}

}  // namespace

torch::Tensor ReferenceLogits(const ModelConfig& c, const ModelWeights& w,
                              const std::vector<int64_t>& ids) {
  torch::NoGradGuard no_grad;
  const int64_t len = static_cast<int64_t>(ids.size());
  const int64_t hd = c.head_dim;
  const int64_t heads = c.num_attention_heads;
  const int64_t group = heads / c.num_key_value_heads;
  const std::vector<double> freqs = Frequencies(c);

  torch::Tensor embed = D(w.embed_tokens);
  torch::Tensor x = torch::empty({len, c.hidden_size}, torch::kFloat64);
  for (int64_t t = 0; t < len; ++t) x[t] = embed[ids[t]];

  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const LayerWeights& lw = w.layers[l];
    torch::Tensor h = Norm(x, D(lw.input_norm), c.rms_norm_eps);
    torch::Tensor q = Affine(h, lw.q_proj, lw.q_bias);  // [L, heads*hd]
    torch::Tensor k = Affine(h, lw.k_proj, lw.k_bias);  // [L, kv*hd]
    torch::Tensor v = Affine(h, lw.v_proj, lw.v_bias);
    // Per-head vectors, normalised (Qwen3) and rotated.
    std::vector<std::vector<torch::Tensor>> qh(len), kh(len), vh(len);
    for (int64_t t = 0; t < len; ++t) {
      for (int64_t hh = 0; hh < heads; ++hh) {
        torch::Tensor vec = q[t].index({Slice(hh * hd, (hh + 1) * hd)});
        if (c.qk_norm) vec = Norm(vec.unsqueeze(0), D(lw.q_norm), c.rms_norm_eps)[0];
        qh[t].push_back(Rotate(vec, t, freqs));
      }
      for (int64_t hh = 0; hh < c.num_key_value_heads; ++hh) {
        torch::Tensor vec = k[t].index({Slice(hh * hd, (hh + 1) * hd)});
        if (c.qk_norm) vec = Norm(vec.unsqueeze(0), D(lw.k_norm), c.rms_norm_eps)[0];
        kh[t].push_back(Rotate(vec, t, freqs));
        vh[t].push_back(v[t].index({Slice(hh * hd, (hh + 1) * hd)}));
      }
    }
    // Causal softmax attention, query by query.
    torch::Tensor attn = torch::zeros({len, heads * hd}, torch::kFloat64);
    const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
    for (int64_t t = 0; t < len; ++t) {
      for (int64_t hh = 0; hh < heads; ++hh) {
        const int64_t kvh = hh / group;
        std::vector<double> scores(t + 1);
        double mx = -1e300;
        for (int64_t j = 0; j <= t; ++j) {
          scores[j] = torch::dot(qh[t][hh], kh[j][kvh]).item<double>() * scale;
          mx = std::max(mx, scores[j]);
        }
        double total = 0;
        for (double& s : scores) total += (s = std::exp(s - mx));
        torch::Tensor acc = torch::zeros({hd}, torch::kFloat64);
        for (int64_t j = 0; j <= t; ++j) acc += vh[j][kvh] * (scores[j] / total);
        attn[t].index_put_({Slice(hh * hd, (hh + 1) * hd)}, acc);
      }
    }
    x = x + Affine(attn, lw.o_proj, lw.o_bias);
    h = Norm(x, D(lw.post_attention_norm), c.rms_norm_eps);
    torch::Tensor g = Affine(h, lw.ffn.params[DenseMlp::kGateProj], {});
    torch::Tensor u = Affine(h, lw.ffn.params[DenseMlp::kUpProj], {});
    torch::Tensor act = g / (1.0 + torch::exp(-g)) * u;  // silu(g) * u
    x = x + Affine(act, lw.ffn.params[DenseMlp::kDownProj], {});
  }
  x = Norm(x, D(w.final_norm), c.rms_norm_eps);
  return torch::matmul(x, D(w.lm_head).t());
}

void PerturbBiasesAndNorms(ModelWeights& weights, const ModelConfig& config, uint64_t seed) {
  torch::NoGradGuard no_grad;
  auto gen = at::detail::createCPUGenerator(seed);
  for (const ParamSpec& spec : ParameterSpecs(config)) {
    if (spec.init == ParamInit::kNormal) continue;
    torch::Tensor& t = ParamSlot(weights, spec);
    torch::Tensor noise =
        at::normal(0.0, 0.1, t.sizes(), gen, torch::TensorOptions(torch::kFloat64));
    torch::Tensor base =
        spec.init == ParamInit::kOnes ? torch::ones_like(noise) : torch::zeros_like(noise);
    t.copy_(base + noise);
  }
}

double MaxAbsDiff(const torch::Tensor& a, const torch::Tensor& b) {
  return (D(a) - D(b)).abs().max().item<double>();
}

}  // namespace slime::model::testing
