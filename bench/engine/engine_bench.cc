// engine_bench: in-process throughput and latency of the Engine (no HTTP) on a model directory.
// Prints one markdown table (and optionally JSON); scripts/device/bench_engine_hf.py prints the
// same table for HF transformers `generate` on the same weights and GPU
// (scripts/device/engine_bench.sh runs both on the GPU machine).
//
//   engine_bench --model DIR [--device auto|cpu|cuda|cuda:N] [--dtype auto|bfloat16|float32]
//                [--tp 1] (tensor-parallel ranks: devices from --device on)
//                [--prompt-len 128] [--new-tokens 256,1024] [--concurrency 64,256,1024]
//                [--deterministic] [--batch1] [--grpo 64x8] [--greedy] [--warmup 8] [--seed 0]
//                [--max-seconds 300] [--budget-seconds 0] [--json OUT]
//                [engine sizing: --page-size --max-total-tokens --mem-fraction-static
//                 --max-running-requests --chunked-prefill-size --max-batch-tokens]
//
// Every request: a random prompt of --prompt-len ids drawn uniformly from the model's
// vocabulary (seeded), ignore_eos, a fixed max_new_tokens, temperature 1 (or --greedy).
// Cases, in this order (for each --new-tokens value M):
//   throughput NxM     N requests submitted at once through Engine::Submit; the engine runs at
//                      most --max-running-requests of them at a time (column "max run").
//   batch-1 decode M   (--batch1) one request; decode tok/s = (M - 1) / (e2e - TTFT).
//   grpo PxS           (--grpo, after the first M only, with max_new_tokens = that M) P random
//                      prompts, each submitted S times, all P*S at once in group order; once on
//                      an engine with the radix prefix cache and once on one created with
//                      enable_prefix_cache=false (the setting is fixed at Engine::Create, so the
//                      engine is re-created; later points get a prefix-cache engine back).
// Columns: output tok/s = output tokens / wall; total tok/s = (prompt + output) / wall; mean
// TTFT = arrival to first token (the engine's slime_engine_time_to_first_token_seconds
// histogram, read from its metrics registry); e2e p50/p99 from each request's e2e_latency;
// cached % = prompt tokens served from the prefix cache; mean batch = sequences sampled per
// engine step (slime_engine_decode_batch_size).
// Bounds: a point still running after --max-seconds, or at the end of --budget-seconds (counted
// from the start of the program), is cut: its requests are aborted and the row reports the
// tokens produced until then. Points that would start after the budget are skipped.
#include <fmt/format.h>
#include <torch/torch.h>
#include <torch/version.h>

#ifdef SLIME_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "nlohmann/json.hpp"
#include "slime/engine/engine.h"
#include "slime/metrics/registry.h"
#include "slime/model/config.h"

namespace {

using Clock = std::chrono::steady_clock;
using slime::engine::Engine;
using slime::engine::EngineOptions;
using slime::engine::FinishType;
using slime::engine::GenerateInput;
using slime::engine::RequestOutput;

struct Options {
  std::string model;
  std::string device = "auto";
  std::string dtype = "auto";
  int tp = 1;
  int64_t page_size = 16;
  int64_t max_total_tokens = 0;
  double mem_fraction_static = 0.85;
  int64_t max_running_requests = 256;
  int64_t cuda_graph_max_bs = 256;
  bool unfused = false;
  bool deterministic = false;
  int64_t chunked_prefill_size = 8192;
  int64_t max_batch_tokens = 16384;
  int64_t prompt_len = 128;
  std::vector<int64_t> new_tokens = {256, 1024};
  std::vector<int64_t> concurrency = {64, 256, 1024};
  bool batch1 = false;
  std::string grpo;  // "PROMPTSxSAMPLES"
  int64_t grpo_prompts = 0;
  int64_t grpo_samples = 0;
  int64_t warmup = 8;
  uint64_t seed = 0;
  bool greedy = false;
  double max_seconds = 300;
  double budget_seconds = 0;  // 0 = unlimited
  std::string json;
};

Options ParseArgs(int argc, char** argv) {
  Options o;
  CLI::App app{"engine_bench: in-process Engine throughput / latency (one markdown table)"};
  app.add_option("--model", o.model, "HF model directory (config.json, safetensors, tokenizer)")
      ->required()
      ->check(CLI::ExistingDirectory);
  app.add_option("--device", o.device, "auto | cpu | cuda | cuda:N");
  app.add_option("--dtype", o.dtype, "auto | bfloat16 | float16 | float32");
  app.add_option("--tp", o.tp, "tensor-parallel size (devices from --device on, one process)")
      ->check(CLI::Range(1, 64));
  app.add_option("--page-size", o.page_size, "tokens per K/V page")->check(CLI::Range(1, 256));
  app.add_option("--max-total-tokens", o.max_total_tokens,
                 "K/V cache tokens (0 = from --mem-fraction-static on CUDA, 65536 on CPU)");
  app.add_option("--mem-fraction-static", o.mem_fraction_static,
                 "CUDA: fraction of GPU memory for weights + K/V cache")
      ->check(CLI::Range(0.05, 0.99));
  app.add_flag("--unfused", o.unfused,
               "separate q/k/v and gate/up GEMMs and unfused kernels (the previous path, to compare)");
  app.add_flag("--deterministic", o.deterministic,
               "batch-invariant kernels (serve --enable-deterministic-inference)");
  app.add_option("--cuda-graph-max-bs", o.cuda_graph_max_bs,
                 "CUDA: decode batches up to this size replay captured graphs (0 = off)");
  app.add_option("--max-running-requests", o.max_running_requests,
                 "sequences the engine computes concurrently")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--chunked-prefill-size", o.chunked_prefill_size, "prefill tokens per step")
      ->check(CLI::Range(int64_t{16}, int64_t{1} << 24));
  app.add_option("--max-batch-tokens", o.max_batch_tokens,
                 "all tokens of one step (raised to --chunked-prefill-size if lower)")
      ->check(CLI::Range(int64_t{16}, int64_t{1} << 24));
  app.add_option("--prompt-len", o.prompt_len, "prompt ids per request")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--new-tokens", o.new_tokens, "max_new_tokens values (comma-separated)")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--concurrency", o.concurrency,
                 "requests submitted at once per throughput point (comma-separated; "
                 "empty = no throughput points)")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_flag("--batch1", o.batch1, "also measure batch-1 decode tokens/s per --new-tokens value");
  app.add_option("--grpo", o.grpo,
                 "PROMPTSxSAMPLES, e.g. 64x8: group sampling with and without the prefix cache");
  app.add_option("--warmup", o.warmup, "warm-up requests (8 new tokens each) before measuring")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  app.add_option("--seed", o.seed, "seed of the prompts and of the engine's sampling");
  app.add_flag("--greedy", o.greedy, "temperature 0 instead of 1");
  app.add_option("--max-seconds", o.max_seconds,
                 "cut a point after this long (its requests are aborted; the row says so)")
      ->check(CLI::PositiveNumber);
  app.add_option("--budget-seconds", o.budget_seconds,
                 "whole run (from start): later points are cut at it or skipped (0 = no limit)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--json", o.json, "also write the results as JSON to this file");
  try {
    app.parse(argc, argv);
    if (!o.grpo.empty()) {
      const size_t x = o.grpo.find('x');
      try {
        if (x == std::string::npos) throw std::invalid_argument("no x");
        size_t used = 0;
        o.grpo_prompts = std::stoll(o.grpo.substr(0, x), &used);
        if (used != x) throw std::invalid_argument("prompts");
        const std::string s = o.grpo.substr(x + 1);
        o.grpo_samples = std::stoll(s, &used);
        if (used != s.size()) throw std::invalid_argument("samples");
      } catch (const std::exception&) {
        throw CLI::ValidationError("--grpo", "expected PROMPTSxSAMPLES such as 64x8, got '" +
                                                 o.grpo + "'");
      }
      if (o.grpo_prompts < 1 || o.grpo_samples < 1) {
        throw CLI::ValidationError("--grpo", "PROMPTS and SAMPLES must be >= 1, got '" +
                                                 o.grpo + "'");
      }
    }
    if (o.new_tokens.empty()) throw CLI::ValidationError("--new-tokens", "needs a value");
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e));
  }
  o.max_batch_tokens = std::max(o.max_batch_tokens, o.chunked_prefill_size);
  return o;
}

// Exits at once: an engine thread may still be running, so no static destructors.
[[noreturn]] void Die(const std::string& what) {
  fmt::print(stderr, "engine_bench: {}\n", what);
  std::fflush(nullptr);
  std::_Exit(1);
}

std::string ResolveDevice(const std::string& device) {
  if (device != "auto") return device;
  return torch::cuda::is_available() ? "cuda:0" : "cpu";
}

// "NVIDIA H200 (143771 MiB)" for a CUDA device; "cpu (N hardware threads)" otherwise.
std::string DeviceDescription(const std::string& device) {
#ifdef SLIME_WITH_CUDA
  if (device.rfind("cuda", 0) == 0 && torch::cuda::is_available()) {
    int index = 0;
    if (device.size() > 5 && device[4] == ':') index = std::atoi(device.c_str() + 5);
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, index) == cudaSuccess) {
      return fmt::format("{} ({} MiB)", prop.name, prop.totalGlobalMem >> 20);
    }
  }
#endif
  return fmt::format("{} ({} hardware threads)", device, std::thread::hardware_concurrency());
}

// Gives memory held by PyTorch's caching allocator back to the driver, so a second engine sized
// by mem_fraction_static sees the same free memory as the first.
void ReleaseCachedDeviceMemory() {
#ifdef SLIME_WITH_CUDA
  if (torch::cuda::is_available()) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
}

// The value of the sample `name` (no labels) in a Prometheus exposition; 0 when absent.
double SampleValue(const std::string& exposition, const std::string& name) {
  std::istringstream in(exposition);
  for (std::string line; std::getline(in, line);) {
    if (line.size() > name.size() && line.compare(0, name.size(), name) == 0 &&
        line[name.size()] == ' ') {
      return std::strtod(line.c_str() + name.size() + 1, nullptr);
    }
  }
  return 0.0;
}

// Sums and counts of the engine histograms a row reports, read before and after a point.
struct MetricsSnapshot {
  double ttft_sum = 0, ttft_count = 0;
  double batch_sum = 0, batch_count = 0;
  double retractions = 0;

  static MetricsSnapshot Take(const slime::metrics::Registry& registry) {
    const std::string text = registry.Exposition();
    MetricsSnapshot s;
    s.ttft_sum = SampleValue(text, "slime_engine_time_to_first_token_seconds_sum");
    s.ttft_count = SampleValue(text, "slime_engine_time_to_first_token_seconds_count");
    s.batch_sum = SampleValue(text, "slime_engine_decode_batch_size_sum");
    s.batch_count = SampleValue(text, "slime_engine_decode_batch_size_count");
    s.retractions = SampleValue(text, "slime_engine_retractions_total");
    return s;
  }
};

struct Row {
  std::string name;
  std::string kind;  // throughput | batch1 | grpo
  bool prefix_cache = true;
  int64_t requests = 0;
  int64_t max_running = 0;
  int64_t prompt_len = 0;
  int64_t new_tokens = 0;
  double wall_s = 0;
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
  int64_t cached_tokens = 0;
  double ttft_mean_s = 0;
  double e2e_p50_s = 0;
  double e2e_p99_s = 0;
  double decode_tps = 0;  // batch1 only
  double mean_batch = 0;
  int64_t retractions = 0;
  int64_t aborted = 0;
  std::string abort_message;
  bool cut = false;
  std::string skipped;  // why the point did not run ("" = it ran)

  double output_tps() const { return wall_s > 0 ? output_tokens / wall_s : 0; }
  double total_tps() const { return wall_s > 0 ? (prompt_tokens + output_tokens) / wall_s : 0; }
  double cached_fraction() const {
    return prompt_tokens > 0 ? static_cast<double>(cached_tokens) / prompt_tokens : 0;
  }
};

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

// The engine under test. The prefix-cache setting is fixed at Engine::Create, so switching it
// destroys the engine (and its metrics registry) and creates a new one.
class EngineHolder {
 public:
  explicit EngineHolder(const Options& o) : o_(o) {}

  // The engine with `prefix_cache`, created (and warmed up by `warmup`) when needed.
  Engine& Get(bool prefix_cache, const std::function<void(Engine&, slime::metrics::Registry&)>&
                                     warmup) {
    if (engine_ && prefix_cache_ == prefix_cache) return *engine_;
    engine_.reset();
    registry_.reset();
    ReleaseCachedDeviceMemory();
    registry_ = std::make_unique<slime::metrics::Registry>();
    const Clock::time_point t0 = Clock::now();
    EngineOptions eo;
    eo.model_path = o_.model;
    eo.device = o_.device;
    eo.dtype = o_.dtype;
    eo.tp_size = o_.tp;
    eo.page_size = o_.page_size;
    eo.max_total_tokens = o_.max_total_tokens;
    eo.mem_fraction_static = o_.mem_fraction_static;
    eo.max_running_requests = o_.max_running_requests;
    eo.cuda_graph_max_bs = o_.cuda_graph_max_bs;
    eo.fuse_projections = !o_.unfused;
    eo.deterministic_inference = o_.deterministic;
    eo.chunked_prefill_size = o_.chunked_prefill_size;
    eo.max_batch_tokens = o_.max_batch_tokens;
    eo.enable_prefix_cache = prefix_cache;
    eo.random_seed = o_.seed;
    eo.metrics = registry_.get();
    auto engine = Engine::Create(eo);
    if (!engine.ok()) Die(std::string(engine.status().message()));
    engine_ = *std::move(engine);
    prefix_cache_ = prefix_cache;
    const int64_t kv = engine_->load().num_total_pages * o_.page_size;
    fmt::print(stderr, "engine_bench: engine (prefix cache {}) up in {:.1f}s, KV cache {} tokens\n",
               prefix_cache ? "on" : "off",
               std::chrono::duration<double>(Clock::now() - t0).count(), kv);
    if (kv_tokens_ < 0) kv_tokens_ = kv;
    if (kv != kv_tokens_) {
      notes_.push_back(fmt::format("the engine with prefix cache {} got a KV cache of {} tokens",
                                   prefix_cache ? "on" : "off", kv));
    }
    if (warmup) warmup(*engine_, *registry_);
    return *engine_;
  }

  const slime::metrics::Registry& registry() const { return *registry_; }
  int64_t kv_tokens() const { return kv_tokens_; }
  const std::vector<std::string>& notes() const { return notes_; }
  void Reset() {
    engine_.reset();
    registry_.reset();
  }

 private:
  const Options& o_;
  std::unique_ptr<slime::metrics::Registry> registry_;  // outlives engine_ (declared first)
  std::unique_ptr<Engine> engine_;
  bool prefix_cache_ = true;
  int64_t kv_tokens_ = -1;
  std::vector<std::string> notes_;
};

class Bench {
 public:
  Bench(const Options& o, int64_t vocab, Clock::time_point start)
      : o_(o), vocab_(vocab), start_(start), rng_(o.seed) {}

  std::vector<int32_t> RandomPrompt() {
    std::uniform_int_distribution<int32_t> dist(0, static_cast<int32_t>(vocab_ - 1));
    std::vector<int32_t> ids(static_cast<size_t>(o_.prompt_len));
    for (auto& id : ids) id = dist(rng_);
    return ids;
  }

  GenerateInput MakeInput(const std::string& rid, std::vector<int32_t> prompt,
                          int64_t new_tokens) const {
    GenerateInput in;
    in.rid = rid;
    in.input_ids = std::move(prompt);
    in.sampling.max_new_tokens = new_tokens;
    in.sampling.ignore_eos = true;
    in.sampling.temperature = o_.greedy ? 0.0 : 1.0;
    return in;
  }

  // Seconds left of --budget-seconds (a large number without a budget).
  double BudgetLeft() const {
    if (o_.budget_seconds <= 0) return 1e18;
    return o_.budget_seconds - std::chrono::duration<double>(Clock::now() - start_).count();
  }

  // Submits every input at once and waits for all to finish, or cuts the point (aborts its
  // requests) after --max-seconds or at the end of --budget-seconds. Fills everything in `row`
  // but its name, kind and shape.
  void Run(Engine& engine, const slime::metrics::Registry& registry,
           std::vector<GenerateInput> inputs, Row& row) {
    // What a row needs of each finished request (output ids can be long: not kept).
    struct Done {
      int64_t prompt_tokens = 0;
      int64_t output_tokens = 0;
      int64_t cached_tokens = 0;
      slime::engine::FinishReason finish;
      double e2e_latency = 0;
    };
    struct Shared {
      std::mutex mu;
      std::condition_variable cv;
      int64_t pending = 0;
      Clock::time_point last_finish;
      std::vector<Done> outputs;
    };
    row.max_running = o_.max_running_requests;
    const double limit_s = std::min(o_.max_seconds, BudgetLeft());
    if (limit_s <= 0) {
      row.skipped = "skipped: --budget-seconds spent";
      return;
    }
    auto shared = std::make_shared<Shared>();
    shared->pending = static_cast<int64_t>(inputs.size());
    shared->outputs.resize(inputs.size());
    // Every rid of a point is "<point>/<i>": a cut aborts that prefix.
    const std::string rid_prefix =
        inputs.empty() ? "" : inputs[0].rid.substr(0, inputs[0].rid.find('/') + 1);
    engine.FlushCache().get();  // earlier points' prompts out of the radix cache
    const MetricsSnapshot before = MetricsSnapshot::Take(registry);
    const Clock::time_point t0 = Clock::now();
    for (size_t i = 0; i < inputs.size(); ++i) {
      engine.Submit(std::move(inputs[i]), [shared, i](const RequestOutput& out) {
        if (!out.finish.finished()) return;
        std::lock_guard<std::mutex> lock(shared->mu);
        Done& done = shared->outputs[i];
        done.prompt_tokens = out.prompt_tokens;
        done.output_tokens = static_cast<int64_t>(out.output_ids.size());
        done.cached_tokens = out.cached_tokens;
        done.finish = out.finish;
        done.e2e_latency = out.e2e_latency;
        shared->last_finish = Clock::now();
        if (--shared->pending == 0) shared->cv.notify_all();
      });
    }
    {
      std::unique_lock<std::mutex> lock(shared->mu);
      const auto deadline =
          t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(limit_s));
      if (!shared->cv.wait_until(lock, deadline, [&] { return shared->pending == 0; })) {
        row.cut = true;
        lock.unlock();
        engine.Abort(rid_prefix, /*all=*/false);
        lock.lock();
        shared->cv.wait(lock, [&] { return shared->pending == 0; });
      }
    }
    const MetricsSnapshot after = MetricsSnapshot::Take(registry);
    row.wall_s = std::chrono::duration<double>(shared->last_finish - t0).count();
    std::vector<double> e2e;
    for (const Done& out : shared->outputs) {
      row.prompt_tokens += out.prompt_tokens;
      row.output_tokens += out.output_tokens;
      row.cached_tokens += out.cached_tokens;
      e2e.push_back(out.e2e_latency);
      if (out.finish.type == FinishType::kAbort) {
        ++row.aborted;
        if (row.abort_message.empty()) row.abort_message = out.finish.message;
      }
    }
    row.e2e_p50_s = Percentile(e2e, 0.50);
    row.e2e_p99_s = Percentile(e2e, 0.99);
    const double ttft_n = after.ttft_count - before.ttft_count;
    row.ttft_mean_s = ttft_n > 0 ? (after.ttft_sum - before.ttft_sum) / ttft_n : 0;
    const double steps = after.batch_count - before.batch_count;
    row.mean_batch = steps > 0 ? (after.batch_sum - before.batch_sum) / steps : 0;
    row.retractions = static_cast<int64_t>(after.retractions - before.retractions);
    if (row.kind == "batch1" && !shared->outputs.empty()) {
      const double decode_s = shared->outputs[0].e2e_latency - row.ttft_mean_s;
      if (decode_s > 0 && row.output_tokens > 1) {
        row.decode_tps = static_cast<double>(row.output_tokens - 1) / decode_s;
      }
    }
  }

  Row Throughput(Engine& engine, const slime::metrics::Registry& registry, int64_t n,
                 int64_t m) {
    Row row;
    row.kind = "throughput";
    row.name = fmt::format("throughput {}x{}", n, m);
    row.requests = n;
    row.prompt_len = o_.prompt_len;
    row.new_tokens = m;
    std::vector<GenerateInput> inputs;
    for (int64_t i = 0; i < n; ++i) {
      inputs.push_back(MakeInput(fmt::format("tp{}x{}/{}", n, m, i), RandomPrompt(), m));
    }
    Run(engine, registry, std::move(inputs), row);
    Report(row);
    return row;
  }

  Row Batch1(Engine& engine, const slime::metrics::Registry& registry, int64_t m) {
    Row row;
    row.kind = "batch1";
    row.name = fmt::format("batch-1 decode {}", m);
    row.requests = 1;
    row.prompt_len = o_.prompt_len;
    row.new_tokens = m;
    std::vector<GenerateInput> inputs;
    inputs.push_back(MakeInput(fmt::format("b1x{}/0", m), RandomPrompt(), m));
    Run(engine, registry, std::move(inputs), row);
    Report(row);
    return row;
  }

  // P prompts, drawn once so that both engines see the same ones.
  std::vector<std::vector<int32_t>> GrpoPrompts() {
    std::vector<std::vector<int32_t>> prompts;
    for (int64_t p = 0; p < o_.grpo_prompts; ++p) prompts.push_back(RandomPrompt());
    return prompts;
  }

  Row Grpo(Engine& engine, const slime::metrics::Registry& registry,
           const std::vector<std::vector<int32_t>>& prompts, bool prefix_cache) {
    const int64_t m = o_.new_tokens.front();
    Row row;
    row.kind = "grpo";
    row.prefix_cache = prefix_cache;
    row.name = fmt::format("grpo {}x{} {}", o_.grpo_prompts, o_.grpo_samples,
                           prefix_cache ? "prefix cache" : "no cache");
    row.requests = o_.grpo_prompts * o_.grpo_samples;
    row.prompt_len = o_.prompt_len;
    row.new_tokens = m;
    std::vector<GenerateInput> inputs;
    // Group order, as slime submits them: all samples of prompt 0, then prompt 1, ...
    for (int64_t p = 0; p < o_.grpo_prompts; ++p) {
      for (int64_t s = 0; s < o_.grpo_samples; ++s) {
        inputs.push_back(MakeInput(fmt::format("grpo{}/{}-{}", prefix_cache ? "c" : "n", p, s),
                                   prompts[static_cast<size_t>(p)], m));
      }
    }
    Run(engine, registry, std::move(inputs), row);
    Report(row);
    return row;
  }

  // A few short requests (kernels, allocator, first-call setup) before anything is timed.
  void Warmup(Engine& engine, const slime::metrics::Registry& registry) {
    if (o_.warmup <= 0) return;
    Row row;
    row.kind = "warmup";
    std::vector<GenerateInput> inputs;
    for (int64_t i = 0; i < o_.warmup; ++i) {
      inputs.push_back(MakeInput(fmt::format("warmup/{}", i), RandomPrompt(), 8));
    }
    Run(engine, registry, std::move(inputs), row);
    if (row.aborted > 0) Die(fmt::format("warm-up request aborted: {}", row.abort_message));
    fmt::print(stderr, "engine_bench: warm-up {} requests in {:.2f}s\n", o_.warmup, row.wall_s);
  }

 private:
  // Progress on stderr, so stdout holds the table alone.
  static void Report(const Row& r) {
    if (!r.skipped.empty()) {
      fmt::print(stderr, "engine_bench: {}: {}\n", r.name, r.skipped);
      return;
    }
    fmt::print(stderr, "engine_bench: {}: {:.2f}s, {} output tokens, {:.0f} tok/s{}{}\n", r.name,
               r.wall_s, r.output_tokens, r.output_tps(), r.cut ? " (cut)" : "",
               r.aborted > 0 ? fmt::format(", {} aborted: {}", r.aborted, r.abort_message) : "");
  }

  const Options& o_;
  const int64_t vocab_;
  const Clock::time_point start_;
  std::mt19937_64 rng_;
};

std::string Fmt(double v, int digits) { return fmt::format("{:.{}f}", v, digits); }

std::string WithCommas(double v) {
  std::string s = fmt::format("{:.0f}", v);
  const size_t start = s[0] == '-' ? 1 : 0;
  for (int i = static_cast<int>(s.size()) - 3; i > static_cast<int>(start); i -= 3) {
    s.insert(static_cast<size_t>(i), ",");
  }
  return s;
}

void PrintTable(const std::vector<Row>& rows) {
  fmt::print(
      "| case | requests | max run | prompt | new | wall s | output tok/s | total tok/s | "
      "decode tok/s | mean TTFT ms | e2e p50 s | e2e p99 s | cached % | mean batch | note |\n");
  fmt::print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
  for (const Row& r : rows) {
    if (!r.skipped.empty()) {
      fmt::print("| {} | {} | {} | {} | {} | – | – | – | – | – | – | – | – | – | {} |\n", r.name,
                 r.requests, r.max_running, r.prompt_len, r.new_tokens, r.skipped);
      continue;
    }
    std::string note;
    if (r.cut) note = "cut (time limit): tokens until then";
    if (r.aborted > 0) {
      note += fmt::format("{}{} aborted", note.empty() ? "" : "; ", r.aborted);
      if (!r.cut) note += ": " + r.abort_message.substr(0, 60);
    }
    if (r.retractions > 0) {
      note += fmt::format("{}{} retractions", note.empty() ? "" : "; ", r.retractions);
    }
    fmt::print("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
               r.name, r.requests, r.max_running, r.prompt_len, r.new_tokens, Fmt(r.wall_s, 2),
               WithCommas(r.output_tps()), WithCommas(r.total_tps()),
               r.kind == "batch1" ? Fmt(r.decode_tps, 1) : "–", Fmt(r.ttft_mean_s * 1e3, 1),
               Fmt(r.e2e_p50_s, 2), Fmt(r.e2e_p99_s, 2), Fmt(100.0 * r.cached_fraction(), 1),
               Fmt(r.mean_batch, 1), note);
  }
}

nlohmann::json ToJson(const Row& r) {
  nlohmann::json j = {{"name", r.name},
                      {"kind", r.kind},
                      {"prefix_cache", r.prefix_cache},
                      {"requests", r.requests},
                      {"max_running_requests", r.max_running},
                      {"prompt_len", r.prompt_len},
                      {"new_tokens", r.new_tokens}};
  if (!r.skipped.empty()) {
    j["skipped"] = r.skipped;
    return j;
  }
  j.update({{"wall_s", r.wall_s},
            {"prompt_tokens", r.prompt_tokens},
            {"output_tokens", r.output_tokens},
            {"cached_tokens", r.cached_tokens},
            {"cached_fraction", r.cached_fraction()},
            {"output_tokens_per_s", r.output_tps()},
            {"total_tokens_per_s", r.total_tps()},
            {"decode_tokens_per_s", r.kind == "batch1" ? nlohmann::json(r.decode_tps) : nullptr},
            {"ttft_mean_s", r.ttft_mean_s},
            {"e2e_p50_s", r.e2e_p50_s},
            {"e2e_p99_s", r.e2e_p99_s},
            {"mean_decode_batch", r.mean_batch},
            {"retractions", r.retractions},
            {"aborted", r.aborted},
            {"abort_message", r.abort_message},
            {"cut", r.cut}});
  return j;
}

std::string UtcNow() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  const Clock::time_point start = Clock::now();
  const Options o = ParseArgs(argc, argv);
  const std::string device = ResolveDevice(o.device);
  const std::string device_desc = DeviceDescription(device);

  EngineHolder holder(o);
  std::unique_ptr<Bench> bench;
  auto warmup = [&](Engine& e, slime::metrics::Registry& r) { bench->Warmup(e, r); };
  // The model's shape is known once an engine is up; the warm-up needs the Bench, so the first
  // engine is created without it and warmed up right after.
  Engine& first = holder.Get(/*prefix_cache=*/true, nullptr);
  const slime::model::ModelConfig& mc = first.model_config();
  const int64_t params = mc.NumParameters();
  const std::string model_type = mc.model_type;
  const int64_t layers = mc.num_hidden_layers;
  const int64_t max_new = *std::max_element(o.new_tokens.begin(), o.new_tokens.end());
  if (o.prompt_len + max_new > first.context_length()) {
    Die(fmt::format("--prompt-len {} + --new-tokens {} exceeds the context length {}",
                    o.prompt_len, max_new, first.context_length()));
  }
  bench = std::make_unique<Bench>(o, mc.vocab_size, start);
  bench->Warmup(first, holder.registry());

  // Order: for each --new-tokens value its throughput points and batch-1 decode; the GRPO pair
  // right after the first value (it uses that value). Short points come first, so a budget
  // cuts the longest ones.
  std::vector<Row> rows;
  for (size_t k = 0; k < o.new_tokens.size(); ++k) {
    const int64_t m = o.new_tokens[k];
    for (int64_t n : o.concurrency) {
      Engine& e = holder.Get(true, warmup);
      rows.push_back(bench->Throughput(e, holder.registry(), n, m));
    }
    if (o.batch1) {
      Engine& e = holder.Get(true, warmup);
      rows.push_back(bench->Batch1(e, holder.registry(), m));
    }
    if (k == 0 && o.grpo_prompts > 0) {
      const auto prompts = bench->GrpoPrompts();
      for (bool cache : {true, false}) {
        if (bench->BudgetLeft() <= 0) {
          Row row;
          row.kind = "grpo";
          row.name = fmt::format("grpo {}x{} {}", o.grpo_prompts, o.grpo_samples,
                                 cache ? "prefix cache" : "no cache");
          row.requests = o.grpo_prompts * o.grpo_samples;
          row.prompt_len = o.prompt_len;
          row.new_tokens = m;
          row.max_running = o.max_running_requests;
          row.skipped = "skipped: --budget-seconds spent";
          rows.push_back(row);
          continue;
        }
        Engine& e = holder.Get(cache, warmup);
        rows.push_back(bench->Grpo(e, holder.registry(), prompts, cache));
      }
    }
  }
  holder.Reset();

  fmt::print(
      "slime-cpp Engine (in-process) | {} {} layers, {:.1f}M params | device {} | dtype {} | "
      "KV cache {} tokens, page {} | max running {} | chunked prefill {} | {} | torch {}\n",
      model_type, layers, params / 1e6, device_desc, o.dtype, holder.kv_tokens(), o.page_size,
      o.max_running_requests, o.chunked_prefill_size, o.greedy ? "greedy" : "temperature 1",
      TORCH_VERSION);
  for (const std::string& n : holder.notes()) fmt::print("note: {}\n", n);
  PrintTable(rows);

  if (!o.json.empty()) {
    nlohmann::json j;
    j["bench"] = "engine_bench";
    j["date"] = UtcNow();
    j["model"] = o.model;
    j["model_type"] = model_type;
    j["num_parameters"] = params;
    j["device"] = device_desc;
    j["dtype"] = o.dtype;
    j["torch"] = TORCH_VERSION;
    j["notes"] = holder.notes();
    j["options"] = {{"page_size", o.page_size},
                    {"max_total_tokens", o.max_total_tokens},
                    {"kv_cache_tokens", holder.kv_tokens()},
                    {"mem_fraction_static", o.mem_fraction_static},
                    {"max_running_requests", o.max_running_requests},
                    {"chunked_prefill_size", o.chunked_prefill_size},
                    {"max_batch_tokens", o.max_batch_tokens},
                    {"prompt_len", o.prompt_len},
                    {"greedy", o.greedy},
                    {"seed", o.seed},
                    {"max_seconds", o.max_seconds},
                    {"budget_seconds", o.budget_seconds}};
    j["rows"] = nlohmann::json::array();
    for (const Row& r : rows) j["rows"].push_back(ToJson(r));
    std::ofstream out(o.json);
    out << j.dump(2) << "\n";
    if (!out) Die("cannot write " + o.json);
  }
  return 0;
}
