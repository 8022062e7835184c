// model_bench: prefill, decode and train-forward throughput of DecoderModel on a random-weight
// model (default: Qwen3-0.6B shape, bf16, CUDA). Prints one table; scripts/device/
// bench_model_hf.py prints the same table for HF transformers on the same machine.
//
//   model_bench [--config CONFIG_JSON] [--device cuda|cpu] [--dtype bf16|fp32] [--iters N]
//               [--quick] [--attention auto|sdpa|math]
//
// Cases (tokens/s counts the tokens processed per iteration):
//   prefill 1xL      one sequence through the KV-cache path, logits of the last token only
//   prefill BxL      packed no-grad forward, logits of each sequence's last token
//   decode 1 tok     batch-1 decode steps after a 128-token prompt (KV cache), logits each step
//   train fwd BxL    packed forward with autograd, logits of every token
//   train fwd+bwd    the same plus backward of logits.sum()
// TFLOP/s counts matmul FLOPs (2 per MAC; x3 with backward) including causal attention.
#include <fmt/format.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "slime/model/decoder.h"

#ifndef SLIME_MODEL_BENCH_CONFIG
#define SLIME_MODEL_BENCH_CONFIG "tests/data/model/configs/qwen3-0.6b.json"
#endif

namespace {

using slime::model::AttentionImpl;
using slime::model::DecoderModel;
using slime::model::KvCache;
using slime::model::ModelConfig;

struct Options {
  std::string config = SLIME_MODEL_BENCH_CONFIG;
  std::string device = "cuda";
  std::string dtype = "bf16";
  std::string attention = "auto";
  int iters = 5;
  bool quick = false;
};


Options ParseArgs(int argc, char** argv) {
  Options o;
  CLI::App app{"model_bench: DecoderModel prefill / decode / train-forward throughput"};
  app.add_option("--config", o.config, "HF config.json of the model to benchmark");
  app.add_option("--device", o.device)->check(CLI::IsMember({"cuda", "cpu"}));
  app.add_option("--dtype", o.dtype)->check(CLI::IsMember({"bf16", "fp32"}));
  app.add_option("--attention", o.attention)->check(CLI::IsMember({"auto", "sdpa", "math"}));
  app.add_option("--iters", o.iters, "timed iterations per case")->check(CLI::Range(1, 1 << 20));
  app.add_flag("--quick", o.quick, "small shapes only (CPU smoke run)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e));
  }
  return o;
}

void Sync(const torch::Device& d) {
  if (d.is_cuda()) torch::cuda::synchronize();
}

// Mean milliseconds per call of `fn` over `iters` timed runs after one warm-up.
double TimeMs(const torch::Device& d, int iters, const std::function<void()>& fn) {
  fn();
  Sync(d);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) fn();
  Sync(d);
  auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::milli>(t1 - t0).count() / iters;
}

template <typename T>
T Check(slime::StatusOr<T> v) {
  if (!v.ok()) {
    fmt::print(stderr, "model_bench: {}\n", std::string(v.status().message()));
    std::exit(1);
  }
  return *std::move(v);
}

// Forward matmul FLOPs for `seqs` sequences of `len` tokens with `logit_rows` LM-head rows.
double ForwardFlops(const ModelConfig& c, int64_t seqs, int64_t len, int64_t logit_rows,
                    int64_t past = 0) {
  const double h = static_cast<double>(c.hidden_size);
  const double per_token_layer =
      2.0 * (h * c.q_size() + 2 * h * c.kv_size() + c.q_size() * h + 3 * h * c.intermediate_size);
  const double tokens = static_cast<double>(seqs * len);
  // Causal attention: QK^T and PV, each 2*D per (query, visible key) per head.
  const double visible =
      static_cast<double>(seqs) * (static_cast<double>(len) * past + len * (len + 1) / 2.0);
  const double attn = 4.0 * c.num_attention_heads * c.head_dim * visible;
  return c.num_hidden_layers * (per_token_layer * tokens + attn) +
         2.0 * h * c.vocab_size * logit_rows;
}

struct Row {
  std::string name;
  int64_t tokens;
  double ms;
  double flops;
};

}  // namespace

int main(int argc, char** argv) {
  Options o = ParseArgs(argc, argv);
  if (o.device == "cuda" && !torch::cuda::is_available()) {
    fmt::print(stderr,
               "model_bench: CUDA is not available (use --device cpu --quick for a smoke "
               "run)\n");
    return 1;
  }
  const torch::Device device = o.device == "cuda" ? torch::Device(torch::kCUDA) : torch::kCPU;
  const torch::ScalarType dtype = o.dtype == "bf16" ? torch::kBFloat16 : torch::kFloat32;
  ModelConfig c = Check(slime::model::LoadModelConfig(o.config));
  slime::model::WeightOptions wo;
  wo.dtype = dtype;
  wo.device = device;
  auto t_init = std::chrono::steady_clock::now();
  auto weights = Check(slime::model::RandomWeights(c, 0, wo));
  const double init_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_init).count();
  auto model = Check(DecoderModel::Create(c, std::move(weights)));
  model->set_attention_impl(o.attention == "sdpa"   ? AttentionImpl::kSdpa
                            : o.attention == "math" ? AttentionImpl::kMath
                                                    : AttentionImpl::kAuto);
  const bool sdpa =
      o.attention == "sdpa" || (o.attention == "auto" && slime::model::SdpaAvailable());

  auto ids = [&](int64_t n) {
    return torch::randint(0, c.vocab_size, {n}, torch::TensorOptions(torch::kLong)).to(device);
  };
  auto last_rows = [](const torch::Tensor& hidden, const std::vector<int64_t>& cu) {
    std::vector<int64_t> last;
    for (size_t b = 1; b < cu.size(); ++b) last.push_back(cu[b] - 1);
    return hidden.index_select(0, torch::tensor(last, torch::kLong).to(hidden.device()));
  };
  std::vector<Row> rows;

  const std::vector<int64_t> prefill_lens =
      o.quick ? std::vector<int64_t>{32, 128} : std::vector<int64_t>{128, 1024, 4096};
  for (int64_t len : prefill_lens) {
    torch::Tensor x = ids(len);
    KvCache cache = model->NewKvCache(len);
    double ms = TimeMs(device, o.iters, [&] {
      cache.Truncate(0).IgnoreError();
      torch::Tensor h = Check(model->ForwardWithCache(x, cache));
      Check(model->Logits(h.narrow(0, len - 1, 1)));
    });
    rows.push_back(
        {fmt::format("prefill 1x{} (kv cache)", len), len, ms, ForwardFlops(c, 1, len, 1)});
  }

  const int64_t pb = o.quick ? 2 : 8, pl = o.quick ? 64 : 1024;
  {
    std::vector<int64_t> cu;
    for (int64_t b = 0; b <= pb; ++b) cu.push_back(b * pl);
    torch::Tensor x = ids(pb * pl);
    torch::NoGradGuard no_grad;
    double ms = TimeMs(device, o.iters, [&] {
      torch::Tensor h = Check(model->ForwardPacked(x, cu));
      Check(model->Logits(last_rows(h, cu)));
    });
    rows.push_back(
        {fmt::format("prefill {}x{} (packed)", pb, pl), pb * pl, ms, ForwardFlops(c, pb, pl, pb)});
  }

  {
    const int64_t prompt = o.quick ? 16 : 128, steps = o.quick ? 16 : 128;
    torch::Tensor x = ids(prompt + steps);
    KvCache cache = model->NewKvCache(prompt + steps);
    double ms = TimeMs(device, std::max(1, o.iters / 2), [&] {
      cache.Truncate(0).IgnoreError();
      Check(model->ForwardWithCache(x.narrow(0, 0, prompt), cache));
      for (int64_t s = 0; s < steps; ++s) {
        torch::Tensor h = Check(model->ForwardWithCache(x.narrow(0, prompt + s, 1), cache));
        Check(model->Logits(h));
      }
    });
    // Report decode only: subtract one prefill of the prompt.
    double prefill_ms = TimeMs(device, o.iters, [&] {
      cache.Truncate(0).IgnoreError();
      Check(model->ForwardWithCache(x.narrow(0, 0, prompt), cache));
    });
    double flops = 0;
    for (int64_t s = 0; s < steps; ++s) flops += ForwardFlops(c, 1, 1, 1, prompt + s);
    rows.push_back({fmt::format("decode 1 seq, {} steps", steps), steps, ms - prefill_ms, flops});
  }

  std::vector<std::pair<int64_t, int64_t>> train_shapes =
      o.quick ? std::vector<std::pair<int64_t, int64_t>>{{2, 64}}
              : std::vector<std::pair<int64_t, int64_t>>{{8, 1024}, {4, 4096}};
  for (auto [b, l] : train_shapes) {
    std::vector<int64_t> cu;
    for (int64_t i = 0; i <= b; ++i) cu.push_back(i * l);
    torch::Tensor x = ids(b * l);
    for (auto& w : slime::model::NamedParameters(model->weights(), c)) {
      w.tensor.requires_grad_(true);
    }
    double fwd =
        TimeMs(device, o.iters, [&] { Check(model->Logits(Check(model->ForwardPacked(x, cu)))); });
    rows.push_back(
        {fmt::format("train fwd {}x{}", b, l), b * l, fwd, ForwardFlops(c, b, l, b * l)});
    double fwd_bwd = TimeMs(device, o.iters, [&] {
      torch::Tensor logits = Check(model->Logits(Check(model->ForwardPacked(x, cu))));
      logits.sum().backward();
      for (auto& w : slime::model::NamedParameters(model->weights(), c)) {
        w.tensor.mutable_grad() = torch::Tensor();
      }
    });
    rows.push_back({fmt::format("train fwd+bwd {}x{}", b, l), b * l, fwd_bwd,
                    3 * ForwardFlops(c, b, l, b * l)});
    for (auto& w : slime::model::NamedParameters(model->weights(), c)) {
      w.tensor.requires_grad_(false);
    }
  }

  fmt::print(
      "slime-cpp DecoderModel | {} {} layers, {:.1f}M params | {} | {} | attention={} | "
      "torch {} | random init {:.1f}s\n",
      c.model_type, c.num_hidden_layers, c.NumParameters() / 1e6, o.dtype, o.device,
      sdpa ? "sdpa" : "math", TORCH_VERSION, init_s);
  fmt::print("| {:<28} | {:>11} | {:>10} | {:>12} | {:>8} |\n", "case", "tokens/iter", "ms/iter",
             "tokens/s", "TFLOP/s");
  fmt::print("|{:-<30}|{:->13}|{:->12}|{:->14}|{:->10}|\n", "", "", "", "", "");
  for (const Row& r : rows) {
    fmt::print("| {:<28} | {:>11} | {:>10.2f} | {:>12.0f} | {:>8.1f} |\n", r.name, r.tokens, r.ms,
               r.tokens / (r.ms / 1e3), r.flops / (r.ms / 1e3) / 1e12);
  }
  return 0;
}
