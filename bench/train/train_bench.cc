// train_bench: training throughput (tokens/s, TFLOP/s, MFU) of the Trainer on a model directory.
// Prints one markdown table (and optionally JSON); scripts/device/bench_train_hf.py prints the
// same table for an HF transformers + PyTorch forward/backward + AdamW of the same model and
// the same token ids on the same GPU.
//
//   train_bench --model DIR [--device cuda|cpu|cuda:N] [--dtype bfloat16|float32]
//               [--seq-len 4096] [--max-tokens-per-gpu 8192] [--samples-per-step 16]
//               [--steps 5] [--warmup 2] [--mode rl,sft] [--seed 0]
//               [--log-probs-chunk-size -1] [--peak-tflops 989]
//               [--write-data FILE] [--json OUT] [--log-level warn] [--tp N] [--deterministic]
//               [--recompute none,full:uniform:1,full:block:N,selective]
//               [--find-max-seq-len CAP] [--search-steps 2] [--search-chunk-size 8192]
//
// --tp N (default 1): Megatron-style tensor parallelism over N ranks, one thread each, on
// devices cuda:0..N-1 (or all on the CPU with --device cpu), joined by a c10d group over a
// TCPStore on 127.0.0.1 (NCCL on CUDA, Gloo on the CPU; comm::ProcessGroupTensorParallel). Every
// rank trains the same samples on its shard; the table is TP rank 0's: tokens/s is the group's,
// MFU is against N × --peak-tflops, peak memory is rank 0's device.
//
// --recompute LIST (default none): activation recomputation settings (train.recompute_*,
// model/recompute.h), comma-separated: none, selective, full:uniform:N or full:block:N. Each
// setting gets its own Trainer (the previous one freed, the CUDA cache emptied) and one row per
// mode, named with the setting when it is not none; peak memory and tokens/s compare them.
//
// --find-max-seq-len CAP (0 = off; one rank only): after the rows, for each --recompute
// setting, the longest single sequence that trains one RL step (TrainRollout of one sample of
// L tokens, one micro-batch of L, log_probs_chunk_size --search-chunk-size so that the LM
// head's buffers do not decide the fit) without running out of device memory: L doubles from
// --seq-len while it fits (up to CAP), then --search-steps bisections (to multiples of 256)
// between the longest fit and the shortest failure. Each probe is a fresh Trainer on an
// emptied CUDA cache; an error other than "out of memory" stops the bench. A second table has,
// per setting, the longest fit, the shortest failure (– when CAP fitted), the peak memory and
// the step time of the longest fit. Memory only: the model's max_position_embeddings is not a
// limit here.
//
// Every optimizer step trains on --samples-per-step fixed-length samples of --seq-len token ids
// (prompt 1 token, response seq_len - 1 tokens, loss mask all 1, so every position but the last
// predicts its next token, as in the HF side's loss), packed into micro-batches of at most
// --max-tokens-per-gpu tokens (train.use_dynamic_batch_size). Modes (one table row each, in the
// order given, on one Trainer):
//   rl   Trainer::TrainRollout on a synthetic rollout (rollout id = the step): GRPO, policy loss,
//        kl_coef 0, one optimizer step per rollout, so slime skips the old-actor pass; per
//        micro-batch: packed forward with grad → response log-probs and entropy → policy loss →
//        backward; then AdamW (float32 masters, clip_grad 1.0). Rewards alternate +1 / -1.
//   sft  Trainer::SftStep on the same kind of batch (SFT loss, same micro-batches, AdamW).
//
// Token ids (identical in bench_train_hf.py): token i of the run — i = sample · seq_len + t,
// samples numbered across the warm-up and timed steps of one mode in order, step s holding
// samples [s · n, (s + 1) · n) for n = --samples-per-step — is
//   SplitMix64(seed + (i + 1) · 0x9E3779B97F4A7C15 mod 2^64) mod vocab_size,
//   SplitMix64(z): z = (z ^ (z >> 30)) · 0xBF58476D1CE4E5B9; z = (z ^ (z >> 27)) ·
//                  0x94D049BB133111EB; return z ^ (z >> 31)   (all mod 2^64).
// Every mode starts again at sample 0. --write-data FILE writes those ids (warm-up + timed
// steps) for bench_train_hf.py --data: one text line
//   "slime-train-bench-ids v1 samples=N seq_len=L vocab=V seed=S\n"
// then N · L little-endian int32 ids, sample after sample. Written atomically.
//
// Timing: a device synchronisation before and after each optimizer step; the step's wall time
// covers the whole Trainer call (batch checks, scheduling, host-to-device copies, forward,
// backward, optimizer). --warmup steps run first and are not counted. tokens/s = samples ·
// seq_len / mean step time. FLOPs per step = 3 × Σ_samples EstimateForwardFlops(seq_len)
// (train_core's FlopsModel, batching.h: forward + backward = 3 × forward, linear layers, causal
// attention 2·q·L² and the LM head over every token; multiply-add = 2 FLOPs). MFU = TFLOP/s /
// --peak-tflops (default 989, the H200's dense bf16 spec; printed in the header; CUDA only).
// Peak memory = the CUDA caching allocator's peak allocated bytes over the timed steps.
// Progress goes to stderr; stdout holds the header line and the table alone.
#include <c10/core/DeviceGuard.h>
#include <fmt/format.h>
#include <torch/torch.h>
#include <torch/version.h>

#ifdef SLIME_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>
#endif

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "nlohmann/json.hpp"
#include "slime/comm/process_group.h"
#include "slime/comm/tensor_parallel_group.h"
#include "slime/common/logging.h"
#include "slime/config/config.h"
#include "slime/model/config.h"
#include "slime/train/batching.h"
#include "slime/train/trainer.h"

namespace {

using Clock = std::chrono::steady_clock;
using slime::data::RolloutBatch;
using slime::data::TrainSample;
using slime::train::Trainer;

constexpr double kH200DenseBf16Tflops = 989.0;

struct Options {
  std::string model;
  std::string device = "cuda";
  std::string dtype = "bfloat16";
  int64_t seq_len = 4096;
  int64_t max_tokens_per_gpu = 8192;
  int64_t samples_per_step = 16;
  int64_t steps = 5;
  int64_t warmup = 2;
  std::vector<std::string> modes = {"rl", "sft"};
  uint64_t seed = 0;
  int64_t log_probs_chunk_size = -1;
  double peak_tflops = kH200DenseBf16Tflops;
  std::string write_data;
  std::string json;
  std::string log_level = "warn";
  int tp = 1;
  bool deterministic = false;
  std::vector<std::string> recompute = {"none"};
  int64_t find_max_seq_len = 0;
  int64_t search_steps = 2;
  int64_t search_chunk_size = 8192;
};

// One --recompute setting: the train.recompute_* keys it sets and its label.
struct RecomputeSetting {
  std::string label;  // as given, e.g. "full:uniform:1"
  std::optional<std::string> granularity, method;
  std::optional<int> num_layers;
};

// "none" | "selective" | "full:uniform:N" | "full:block:N"; nullopt otherwise.
std::optional<RecomputeSetting> ParseRecompute(const std::string& text) {
  RecomputeSetting s;
  s.label = text;
  if (text == "none") return s;
  if (text == "selective") {
    s.granularity = "selective";
    return s;
  }
  for (const std::string method : {"uniform", "block"}) {
    const std::string prefix = "full:" + method + ":";
    if (text.rfind(prefix, 0) != 0) continue;
    const std::string n = text.substr(prefix.size());
    if (n.empty() || n.size() > 6 || n.find_first_not_of("0123456789") != std::string::npos) {
      return std::nullopt;
    }
    s.granularity = "full";
    s.method = method;
    s.num_layers = std::stoi(n);
    return s;
  }
  return std::nullopt;
}

Options ParseArgs(int argc, char** argv) {
  Options o;
  CLI::App app{"train_bench: Trainer training tokens/s, TFLOP/s and MFU (one markdown table)"};
  app.add_option("--model", o.model, "HF model directory (config.json + safetensors)")
      ->required()
      ->check(CLI::ExistingDirectory);
  app.add_option("--device", o.device, "cuda | cuda:N | cpu");
  app.add_option("--dtype", o.dtype, "bfloat16 | float32")
      ->check(CLI::IsMember({"bfloat16", "bf16", "float32", "fp32"}));
  app.add_option("--seq-len", o.seq_len, "tokens per sample (prompt 1 + response seq_len - 1)")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 24));
  app.add_option("--max-tokens-per-gpu", o.max_tokens_per_gpu,
                 "token cap of one packed micro-batch (train.max_tokens_per_gpu)")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 30));
  app.add_option("--samples-per-step", o.samples_per_step,
                 "samples per optimizer step (train.global_batch_size)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--steps", o.steps, "timed optimizer steps per mode")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--warmup", o.warmup, "untimed optimizer steps per mode before the timed ones")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  app.add_option("--mode", o.modes, "rl | sft, comma-separated: one row each, in this order")
      ->delimiter(',')
      ->check(CLI::IsMember({"rl", "sft"}));
  app.add_option("--seed", o.seed, "seed of the token ids and of torch");
  app.add_option("--log-probs-chunk-size", o.log_probs_chunk_size,
                 "train.log_probs_chunk_size: LM-head rows per log-softmax chunk (-1 = all)");
  app.add_option("--tp", o.tp, "tensor-parallel ranks (threads; cuda:0..N-1 or the CPU)")
      ->check(CLI::Range(1, 64));
  app.add_option("--recompute", o.recompute,
                 "activation recomputation settings, one Trainer and row set each: none, "
                 "selective, full:uniform:N, full:block:N")
      ->delimiter(',');
  app.add_option("--find-max-seq-len", o.find_max_seq_len,
                 "search the longest sequence (up to this cap) that trains without running out "
                 "of memory, per --recompute setting (0 = off)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  app.add_option("--search-steps", o.search_steps,
                 "bisections after the doubling of --find-max-seq-len")
      ->check(CLI::Range(int64_t{0}, int64_t{20}));
  app.add_option("--search-chunk-size", o.search_chunk_size,
                 "train.log_probs_chunk_size of the --find-max-seq-len probes")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  app.add_option("--peak-tflops", o.peak_tflops,
                 "peak dense TFLOP/s of the device for MFU (default: H200 bf16 spec)")
      ->check(CLI::PositiveNumber);
  app.add_option("--write-data", o.write_data,
                 "write the token ids of one mode (warm-up + timed steps) for "
                 "bench_train_hf.py --data");
  app.add_flag("--deterministic", o.deterministic,
               "debug.deterministic_mode: batch-invariant kernels");
  app.add_option("--json", o.json, "also write the results as JSON to this file");
  app.add_option("--log-level", o.log_level, "trainer log level (stderr)")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}));
  try {
    app.parse(argc, argv);
    if (o.modes.empty()) throw CLI::ValidationError("--mode", "needs rl, sft or both");
    if (o.seq_len > o.max_tokens_per_gpu) {
      throw CLI::ValidationError(
          "--seq-len", fmt::format("{} exceeds --max-tokens-per-gpu {}: a sample must fit one "
                                   "micro-batch",
                                   o.seq_len, o.max_tokens_per_gpu));
    }
    if (o.recompute.empty()) throw CLI::ValidationError("--recompute", "needs a setting");
    for (const std::string& r : o.recompute) {
      if (!ParseRecompute(r).has_value()) {
        throw CLI::ValidationError(
            "--recompute",
            fmt::format("'{}' is not none, selective, full:uniform:N or full:block:N", r));
      }
    }
    if (o.find_max_seq_len > 0 && o.tp > 1) {
      throw CLI::ValidationError("--find-max-seq-len", "runs on one rank (--tp 1)");
    }
    if (o.find_max_seq_len > 0 && o.find_max_seq_len < o.seq_len) {
      throw CLI::ValidationError(
          "--find-max-seq-len",
          fmt::format("{} is below --seq-len {}, where the search starts", o.find_max_seq_len,
                      o.seq_len));
    }
    if (o.log_probs_chunk_size == 0 || o.log_probs_chunk_size < -1) {
      throw CLI::ValidationError("--log-probs-chunk-size",
                                 fmt::format("must be >= 1 or -1, got {}", o.log_probs_chunk_size));
    }
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e));
  }
  if (o.dtype == "bf16") o.dtype = "bfloat16";
  if (o.dtype == "fp32") o.dtype = "float32";
  return o;
}

[[noreturn]] void Die(const std::string& what) {
  fmt::print(stderr, "train_bench: {}\n", what);
  std::fflush(nullptr);
  std::_Exit(1);
}

// ---- Token ids (the generator shared with bench_train_hf.py; file comment) ---------------------

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;

uint64_t SplitMix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// The ids of sample `sample` (numbered from 0 within a mode): [seq_len].
std::vector<int32_t> SampleIds(uint64_t seed, int64_t vocab, int64_t seq_len, int64_t sample) {
  std::vector<int32_t> ids(static_cast<size_t>(seq_len));
  const uint64_t first = static_cast<uint64_t>(sample) * static_cast<uint64_t>(seq_len);
  for (int64_t t = 0; t < seq_len; ++t) {
    const uint64_t i = first + static_cast<uint64_t>(t);
    ids[static_cast<size_t>(t)] =
        static_cast<int32_t>(SplitMix64(seed + (i + 1) * kGolden) % static_cast<uint64_t>(vocab));
  }
  return ids;
}

void WriteDataFile(const Options& o, int64_t vocab) {
  const int64_t samples = (o.warmup + o.steps) * o.samples_per_step;
  const std::filesystem::path path(o.write_data);
  const std::filesystem::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) Die(fmt::format("--write-data: cannot create {}", tmp.string()));
    out << fmt::format("slime-train-bench-ids v1 samples={} seq_len={} vocab={} seed={}\n", samples,
                       o.seq_len, vocab, o.seed);
    for (int64_t s = 0; s < samples; ++s) {
      for (int32_t id : SampleIds(o.seed, vocab, o.seq_len, s)) {
        const uint32_t v = static_cast<uint32_t>(id);
        const unsigned char le[4] = {
            static_cast<unsigned char>(v), static_cast<unsigned char>(v >> 8),
            static_cast<unsigned char>(v >> 16), static_cast<unsigned char>(v >> 24)};
        out.write(reinterpret_cast<const char*>(le), 4);
      }
    }
    out.flush();
    if (!out) Die(fmt::format("--write-data: cannot write {}", tmp.string()));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec)
    Die(fmt::format("--write-data: cannot rename {} to {}: {}", tmp.string(), path.string(),
                    ec.message()));
  fmt::print(stderr, "train_bench: wrote {} samples x {} ids to {}\n", samples, o.seq_len,
             path.string());
}

// The batch of optimizer step `step` (0-based within a mode, warm-up steps included): `n`
// samples of `seq_len` ids.
RolloutBatch MakeBatch(uint64_t seed, int64_t vocab, int64_t seq_len, int64_t n, int64_t step) {
  RolloutBatch batch;
  batch.temperature = 1.0;
  for (int64_t j = 0; j < n; ++j) {
    TrainSample s;
    s.tokens = SampleIds(seed, vocab, seq_len, step * n + j);
    s.prompt_length = 1;
    s.response_length = seq_len - 1;
    s.loss_mask.assign(static_cast<size_t>(s.response_length), 1.0f);
    s.reward = j % 2 == 0 ? 1.0 : -1.0;
    s.raw_reward = j % 2 == 0 ? 1.0 : 0.0;
    batch.samples.push_back(std::move(s));
  }
  return batch;
}

// ---- Device ------------------------------------------------------------------------------------

void Sync(const torch::Device& d) {
  if (d.is_cuda()) torch::cuda::synchronize(d.has_index() ? d.index() : -1);
}

// "NVIDIA H200 (143771 MiB)" for a CUDA device; "cpu (N hardware threads)" otherwise.
std::string DeviceDescription(const torch::Device& d) {
#ifdef SLIME_WITH_CUDA
  if (d.is_cuda()) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, d.has_index() ? d.index() : 0) == cudaSuccess) {
      return fmt::format("{} ({} MiB)", prop.name, prop.totalGlobalMem >> 20);
    }
  }
#endif
  return fmt::format("{} ({} hardware threads)", d.str(), std::thread::hardware_concurrency());
}

// The CUDA caching allocator's peak statistics (stat index 0 = the aggregate over pools, in
// LibTorch 1.13 and 2.x alike); -1 where there is no CUDA.
void ResetPeakMemory(const torch::Device& d) {
#ifdef SLIME_WITH_CUDA
  if (d.is_cuda()) {
    c10::cuda::CUDACachingAllocator::resetPeakStats(
        static_cast<c10::DeviceIndex>(d.has_index() ? d.index() : 0));
  }
#endif
}

// Returns the CUDA caching allocator's free blocks to the device (between Trainers).
void EmptyCache(const torch::Device& d) {
#ifdef SLIME_WITH_CUDA
  if (d.is_cuda()) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
}

int64_t PeakMemoryBytes(const torch::Device& d) {
#ifdef SLIME_WITH_CUDA
  if (d.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(
        static_cast<c10::DeviceIndex>(d.has_index() ? d.index() : 0));
    return stats.allocated_bytes[0].peak;
  }
#endif
  return -1;
}

// ---- Rows --------------------------------------------------------------------------------------

struct Row {
  std::string name;
  std::string mode;
  std::string recompute = "none";
  int64_t samples = 0;
  int64_t seq_len = 0;
  int64_t micro_batches = 0;   // per optimizer step
  std::vector<double> step_s;  // timed steps
  double flops_per_step = 0;
  int64_t peak_bytes = -1;
  double last_loss = NAN;
  double last_grad_norm = NAN;
  int64_t skipped_steps = 0;
  std::string note;

  double mean_s() const {
    double sum = 0;
    for (double s : step_s) sum += s;
    return step_s.empty() ? 0 : sum / static_cast<double>(step_s.size());
  }
  double min_s() const {
    return step_s.empty() ? 0 : *std::min_element(step_s.begin(), step_s.end());
  }
  double tokens_per_s() const {
    return mean_s() > 0 ? static_cast<double>(samples * seq_len) / mean_s() : 0;
  }
  double tflops() const { return mean_s() > 0 ? flops_per_step / mean_s() / 1e12 : 0; }
};

double Metric(const slime::train::TrainStepMetrics& m, const char* name) {
  auto it = m.values.find(name);
  return it == m.values.end() ? NAN : it->second;
}

// Warm-up then timed optimizer steps of one mode.
Row RunMode(Trainer& trainer, const Options& o, const std::string& mode, int64_t vocab,
            const slime::train::FlopsModel& fm, const torch::Device& device, int64_t micro_batches,
            bool progress) {
  Row row;
  row.mode = mode;
  row.name = mode == "rl" ? "slime-cpp rl (GRPO TrainRollout)" : "slime-cpp sft (SftStep)";
  row.samples = o.samples_per_step;
  row.seq_len = o.seq_len;
  row.micro_batches = micro_batches;
  row.flops_per_step = 3.0 * static_cast<double>(o.samples_per_step) *
                       slime::train::EstimateForwardFlops(fm, o.seq_len);
  for (int64_t step = 0; step < o.warmup + o.steps; ++step) {
    const bool timed = step >= o.warmup;
    const RolloutBatch batch = MakeBatch(o.seed, vocab, o.seq_len, o.samples_per_step, step);
    if (step == o.warmup) ResetPeakMemory(device);
    Sync(device);
    const Clock::time_point t0 = Clock::now();
    slime::train::TrainStepMetrics metrics;
    if (mode == "rl") {
      auto r = trainer.TrainRollout(step, batch);
      if (!r.ok())
        Die(fmt::format("{} step {}: {}", mode, step, std::string(r.status().message())));
      if (r->steps.size() != 1) {
        Die(fmt::format("{} step {}: the rollout ran {} optimizer steps, expected 1", mode, step,
                        r->steps.size()));
      }
      metrics = std::move(r->steps[0]);
    } else {
      auto r = trainer.SftStep(batch);
      if (!r.ok())
        Die(fmt::format("{} step {}: {}", mode, step, std::string(r.status().message())));
      metrics = std::move(*r);
    }
    Sync(device);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    row.last_loss = Metric(metrics, "loss");
    row.last_grad_norm = Metric(metrics, "grad_norm");
    if (metrics.skipped) ++row.skipped_steps;
    if (timed) row.step_s.push_back(s);
    if (progress)
      fmt::print(stderr,
                 "train_bench: {} step {}{}: {:.3f} s, {:.0f} tokens/s, loss {:.4f}, "
                 "grad_norm {:.4f}{}\n",
                 mode, step, timed ? "" : " (warm-up)", s,
                 static_cast<double>(o.samples_per_step * o.seq_len) / s, row.last_loss,
                 row.last_grad_norm, metrics.skipped ? " (skipped: non-finite grad norm)" : "");
  }
  row.peak_bytes = PeakMemoryBytes(device);
  if (row.skipped_steps > 0)
    row.note = fmt::format("{} steps skipped (non-finite grad norm)", row.skipped_steps);
  return row;
}

std::string WithCommas(double v) {
  std::string s = fmt::format("{:.0f}", v);
  const size_t start = s[0] == '-' ? 1 : 0;
  for (int i = static_cast<int>(s.size()) - 3; i > static_cast<int>(start); i -= 3) {
    s.insert(static_cast<size_t>(i), ",");
  }
  return s;
}

// The same columns as bench_train_hf.py's table. peak_tflops <= 0: no MFU column value.
void PrintTable(const std::vector<Row>& rows, int64_t micro_batch_tokens, double peak_tflops) {
  fmt::print(
      "| case | samples/step | seq len | micro-batch tokens | micro-batches | step s (mean) | "
      "step s (min) | tokens/s | TFLOP/s | MFU % | peak mem GiB | loss (last) | note |\n");
  fmt::print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
  for (const Row& r : rows) {
    const std::string mfu =
        peak_tflops > 0 ? fmt::format("{:.1f}", 100.0 * r.tflops() / peak_tflops) : "–";
    const std::string mem =
        r.peak_bytes >= 0 ? fmt::format("{:.1f}", static_cast<double>(r.peak_bytes) / (1 << 30))
                          : "–";
    fmt::print(
        "| {} | {} | {} | {} | {} | {:.3f} | {:.3f} | {} | {:.1f} | {} | {} | {:.4f} | {} |\n",
        r.name, r.samples, r.seq_len, micro_batch_tokens, r.micro_batches, r.mean_s(), r.min_s(),
        WithCommas(r.tokens_per_s()), r.tflops(), mfu, mem, r.last_loss, r.note);
  }
}

nlohmann::json ToJson(const Row& r, double peak_tflops) {
  nlohmann::json j = {
      {"name", r.name},
      {"mode", r.mode},
      {"recompute", r.recompute},
      {"samples_per_step", r.samples},
      {"seq_len", r.seq_len},
      {"micro_batches_per_step", r.micro_batches},
      {"step_s", r.step_s},
      {"step_s_mean", r.mean_s()},
      {"step_s_min", r.min_s()},
      {"tokens_per_s", r.tokens_per_s()},
      {"flops_per_step", r.flops_per_step},
      {"tflops", r.tflops()},
      {"mfu", peak_tflops > 0 ? nlohmann::json(r.tflops() / peak_tflops) : nullptr},
      {"peak_memory_bytes", r.peak_bytes >= 0 ? nlohmann::json(r.peak_bytes) : nullptr},
      {"skipped_steps", r.skipped_steps},
      {"note", r.note}};
  j["loss_last"] = std::isfinite(r.last_loss) ? nlohmann::json(r.last_loss) : nullptr;
  j["grad_norm_last"] =
      std::isfinite(r.last_grad_norm) ? nlohmann::json(r.last_grad_norm) : nullptr;
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

void WriteJsonFile(const std::string& path, const nlohmann::json& j) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << j.dump(2) << "\n";
    out.flush();
    if (!out) Die("--json: cannot write " + tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) Die(fmt::format("--json: cannot rename {} to {}: {}", tmp, path, ec.message()));
}

// ---- Longest sequence that fits (--find-max-seq-len) -----------------------------------------

bool IsOutOfMemory(const slime::Status& s) {
  std::string m(s.message());
  for (char& ch : m) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  // The caching allocator's "CUDA out of memory", or a library's failed workspace allocation.
  return m.find("out of memory") != std::string::npos ||
         m.find("alloc_failed") != std::string::npos;
}

struct Probe {
  bool fits = false;
  double step_s = 0;
  int64_t peak_bytes = -1;
};

// One RL step of one sequence of `seq_len` ids on a fresh Trainer (file comment).
Probe ProbeSeqLen(const Options& o, slime::train::TrainerOptions to, int64_t vocab,
                  const torch::Device& device, int64_t seq_len) {
  slime::config::Config& c = to.config;
  c.train.global_batch_size = 1;
  c.train.max_tokens_per_gpu = static_cast<int>(seq_len);
  c.train.log_probs_chunk_size = static_cast<int>(o.search_chunk_size);
  to.train_iters = 1;
  Probe p;
  EmptyCache(device);
  ResetPeakMemory(device);
  {
    auto trainer = Trainer::Create(to);
    if (!trainer.ok()) Die(std::string(trainer.status().message()));
    Sync(device);
    const Clock::time_point t0 = Clock::now();
    auto r = (*trainer)->TrainRollout(0, MakeBatch(o.seed, vocab, seq_len, 1, 0));
    Sync(device);
    p.step_s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (!r.ok() && !IsOutOfMemory(r.status())) {
      Die(fmt::format("--find-max-seq-len at {} tokens: {}", seq_len,
                      std::string(r.status().message())));
    }
    p.fits = r.ok();
    p.peak_bytes = PeakMemoryBytes(device);
  }
  EmptyCache(device);
  fmt::print(stderr, "train_bench: search {} tokens: {} ({:.2f} s, peak {:.1f} GiB)\n", seq_len,
             p.fits ? "fits" : "out of memory", p.step_s,
             static_cast<double>(p.peak_bytes) / (1 << 30));
  return p;
}

struct SearchResult {
  std::string recompute;
  int64_t longest_fit = 0;  // 0: not even --seq-len
  int64_t first_oom = -1;   // -1: the cap fitted
  Probe at_longest;
};

SearchResult SearchLongest(const Options& o, const slime::train::TrainerOptions& to, int64_t vocab,
                           const torch::Device& device, const std::string& label) {
  SearchResult r;
  r.recompute = label;
  int64_t length = o.seq_len;
  for (;;) {
    const Probe p = ProbeSeqLen(o, to, vocab, device, length);
    if (!p.fits) {
      r.first_oom = length;
      break;
    }
    r.longest_fit = length;
    r.at_longest = p;
    if (length >= o.find_max_seq_len) break;
    length = std::min(length * 2, o.find_max_seq_len);
  }
  for (int64_t i = 0; i < o.search_steps && r.longest_fit > 0 && r.first_oom > 0; ++i) {
    const int64_t mid = (r.longest_fit + r.first_oom) / 2 / 256 * 256;
    if (mid <= r.longest_fit) break;
    const Probe p = ProbeSeqLen(o, to, vocab, device, mid);
    if (p.fits) {
      r.longest_fit = mid;
      r.at_longest = p;
    } else {
      r.first_oom = mid;
    }
  }
  return r;
}

void PrintSearchTable(const std::vector<SearchResult>& results, const Options& o) {
  fmt::print("\nlongest sequence that trains (one RL step of one sample, log_probs_chunk_size {}, "
             "cap {}):\n",
             o.search_chunk_size, o.find_max_seq_len);
  fmt::print("| recompute | longest fit (tokens) | shortest failure | peak mem GiB at the longest | "
             "step s at the longest |\n");
  fmt::print("|---|---:|---:|---:|---:|\n");
  for (const SearchResult& r : results) {
    const std::string mem =
        r.at_longest.peak_bytes >= 0
            ? fmt::format("{:.1f}", static_cast<double>(r.at_longest.peak_bytes) / (1 << 30))
            : "–";
    fmt::print("| {} | {} | {} | {} | {:.2f} |\n", r.recompute,
               r.longest_fit > 0 ? WithCommas(static_cast<double>(r.longest_fit))
                                 : fmt::format("< {}", o.seq_len),
               r.first_oom > 0 ? WithCommas(static_cast<double>(r.first_oom)) : "–", mem,
               r.at_longest.step_s);
  }
}

// The options' config with the train.recompute_* keys of `s`.
slime::train::TrainerOptions WithRecompute(slime::train::TrainerOptions to,
                                           const RecomputeSetting& s) {
  to.config.train.recompute_granularity = s.granularity;
  to.config.train.recompute_method = s.method;
  to.config.train.recompute_num_layers = s.num_layers;
  return to;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = ParseArgs(argc, argv);
  slime::LogOptions log;
  log.level = o.log_level;
  log.role = "train_bench";
  if (slime::Status s = slime::InitLogging(log); !s.ok()) Die(std::string(s.message()));
  torch::Device device = torch::kCPU;
  try {
    device = torch::Device(o.device);
  } catch (const std::exception&) {
    Die(fmt::format("--device: '{}' is not a device (cuda, cuda:N or cpu)", o.device));
  }
  if (!device.is_cuda() && !device.is_cpu()) {
    Die(fmt::format("--device: '{}' is not cuda, cuda:N or cpu", o.device));
  }
  if (device.is_cuda() && !torch::cuda::is_available()) {
    Die("--device cuda: CUDA is not available (use --device cpu for a smoke run)");
  }
  auto config = slime::model::LoadModelConfig(o.model);
  if (!config.ok()) Die(std::string(config.status().message()));
  const slime::model::ModelConfig& mc = *config;
  const int64_t vocab = mc.vocab_size;
  if (!o.write_data.empty()) WriteDataFile(o, vocab);

  // GRPO with the policy loss, one optimizer step per rollout of samples_per_step samples,
  // packed micro-batches; a constant tiny LR (throughput, not learning, is measured).
  slime::config::Config c = slime::config::DefaultConfig();
  c.algorithm.advantage_estimator = "grpo";
  c.algorithm.loss_type = "policy_loss";
  c.train.lr = 1e-6;
  c.train.min_lr = 1e-6;
  c.train.lr_decay_style = "constant";
  c.train.seed = static_cast<int>(o.seed);
  c.train.global_batch_size = static_cast<int>(o.samples_per_step);
  c.train.use_dynamic_batch_size = true;
  c.train.max_tokens_per_gpu = static_cast<int>(o.max_tokens_per_gpu);
  c.train.log_probs_chunk_size = static_cast<int>(o.log_probs_chunk_size);
  c.debug.deterministic_mode = o.deterministic;
  slime::train::TrainerOptions to;
  to.model_dir = o.model;
  to.dtype = o.dtype == "bfloat16" ? torch::kBFloat16 : torch::kFloat32;
  to.config = c;
  to.train_iters = (o.warmup + o.steps) * static_cast<int64_t>(o.modes.size());
  if (o.tp > 1 && device.is_cuda() && torch::cuda::device_count() < o.tp) {
    Die(fmt::format("--tp {}: only {} CUDA devices", o.tp, torch::cuda::device_count()));
  }

  const slime::train::FlopsModel fm = slime::train::FlopsModelOf(mc);  // active FLOPs for MoE

  // The micro-batches of one step, as the trainer schedules them.
  std::vector<int64_t> token_counts(static_cast<size_t>(o.samples_per_step), o.seq_len);
  slime::train::BatchingOptions bo;
  bo.global_batch_size = o.samples_per_step;
  bo.use_dynamic_batch_size = true;
  bo.max_tokens_per_gpu = o.max_tokens_per_gpu;
  auto schedule = slime::train::ScheduleRollout(token_counts, {}, bo);
  if (!schedule.ok()) Die(std::string(schedule.status().message()));
  const int64_t micro_batches = schedule->steps.at(0).num_micro_batches_per_rank();
  const int64_t micro_batch_tokens = schedule->steps.at(0).ranks.at(0).at(0).tokens;

  // One trainer per TP rank, each on its own thread and device; rank 0's rows are reported.
  auto rank_device = [&](int rank) {
    return device.is_cuda()
               ? torch::Device(torch::kCUDA, static_cast<int8_t>(
                                                 (device.has_index() ? device.index() : 0) + rank))
               : device;
  };
  std::promise<int> port_promise;
  std::shared_future<int> port = port_promise.get_future().share();
  auto run_rank = [&](int rank) -> std::vector<Row> {
    const torch::Device d = rank_device(rank);
    c10::DeviceGuard guard(d);
    slime::train::TrainerOptions ro = to;
    ro.device = d;
    if (o.tp > 1) {
      slime::comm::ProcessGroupOptions po;
      po.world_size = o.tp;
      po.rank = rank;
      po.group_name = "train_bench_tp";
      po.backend = d.is_cuda() ? "nccl" : "gloo";
      po.cuda_device = d.is_cuda() ? d.index() : 0;
      po.timeout_s = 600;
      if (rank > 0) {
        po.master_port = port.get();
        if (po.master_port < 0) throw std::runtime_error("rank 0 could not open the group");
      }
      auto opened = slime::comm::ProcessGroup::Open(po);
      if (rank == 0) port_promise.set_value(opened.ok() ? (*opened)->port() : -1);
      if (!opened.ok()) throw std::runtime_error(std::string(opened.status().message()));
      std::shared_ptr<slime::comm::ProcessGroup> group = std::move(*opened);
      if (slime::Status s = group->Join(); !s.ok())
        throw std::runtime_error(std::string(s.message()));
      ro.tp_group = std::make_shared<slime::comm::ProcessGroupTensorParallel>(group);
    }
    std::vector<Row> out;
    // One Trainer per recompute setting, freed before the next one loads.
    for (const std::string& label : o.recompute) {
      const RecomputeSetting setting = *ParseRecompute(label);
      torch::manual_seed(o.seed);
      EmptyCache(d);
      const Clock::time_point t_load = Clock::now();
      auto trainer = Trainer::Create(WithRecompute(ro, setting));
      if (!trainer.ok()) throw std::runtime_error(std::string(trainer.status().message()));
      if (rank == 0) {
        fmt::print(stderr, "train_bench: trainer (recompute {}) up in {:.1f}s\n", label,
                   std::chrono::duration<double>(Clock::now() - t_load).count());
      }
      for (const std::string& mode : o.modes) {
        Row row = RunMode(**trainer, o, mode, vocab, fm, d, micro_batches, rank == 0);
        row.recompute = label;
        if (label != "none") row.name += ", recompute " + label;
        out.push_back(std::move(row));
      }
    }
    EmptyCache(d);
    return out;
  };
  std::vector<Row> rows;
  if (o.tp == 1) {
    try {
      rows = run_rank(0);
    } catch (const std::exception& e) {
      Die(e.what());
    }
  } else {
    std::vector<std::future<std::vector<Row>>> ranks;
    for (int r = 0; r < o.tp; ++r) ranks.push_back(std::async(std::launch::async, run_rank, r));
    std::string errors;
    for (int r = 0; r < o.tp; ++r) {
      try {
        std::vector<Row> got = ranks[r].get();
        if (r == 0) rows = std::move(got);
      } catch (const std::exception& e) {
        errors += fmt::format("{}TP rank {}: {}", errors.empty() ? "" : "; ", r, e.what());
      }
    }
    if (!errors.empty()) Die(errors);
  }
  std::vector<SearchResult> searches;
  if (o.find_max_seq_len > 0) {
    slime::train::TrainerOptions so = to;
    so.device = rank_device(0);
    c10::DeviceGuard guard(so.device);
    for (const std::string& label : o.recompute) {
      searches.push_back(
          SearchLongest(o, WithRecompute(so, *ParseRecompute(label)), vocab, so.device, label));
    }
  }
  const double peak = device.is_cuda() ? o.peak_tflops * o.tp : 0.0;
  std::string device_desc = DeviceDescription(device);
  if (o.tp > 1) device_desc = fmt::format("{} x {} (TP={})", o.tp, device_desc, o.tp);
  const double fwd_flops = slime::train::EstimateForwardFlops(fm, o.seq_len);
  fmt::print(
      "slime-cpp Trainer | {} {} layers, {:.1f}M params | device {} | dtype {} | {} timed steps "
      "after {} warm-up | FLOPs/token (fwd+bwd) {:.3f} GFLOP | peak {} | torch {}\n",
      mc.model_type, mc.num_hidden_layers, static_cast<double>(mc.NumParameters()) / 1e6,
      device_desc, o.dtype, o.steps, o.warmup,
      3.0 * fwd_flops / static_cast<double>(o.seq_len) / 1e9,
      peak > 0 ? fmt::format("{:g} TFLOP/s", peak) : std::string("– (no MFU on the CPU)"),
      TORCH_VERSION);
  PrintTable(rows, micro_batch_tokens, peak);
  if (!searches.empty()) PrintSearchTable(searches, o);

  if (!o.json.empty()) {
    nlohmann::json j;
    j["bench"] = "train_bench";
    j["date"] = UtcNow();
    j["model"] = o.model;
    j["model_type"] = mc.model_type;
    j["num_parameters"] = mc.NumParameters();
    j["device"] = device_desc;
    j["dtype"] = o.dtype;
    j["torch"] = TORCH_VERSION;
    j["peak_tflops"] = peak > 0 ? nlohmann::json(peak) : nullptr;
    j["forward_flops_per_sample"] = fwd_flops;
    j["options"] = {{"seq_len", o.seq_len},
                    {"max_tokens_per_gpu", o.max_tokens_per_gpu},
                    {"micro_batch_tokens", micro_batch_tokens},
                    {"samples_per_step", o.samples_per_step},
                    {"steps", o.steps},
                    {"warmup", o.warmup},
                    {"seed", o.seed},
                    {"log_probs_chunk_size", o.log_probs_chunk_size},
                    {"tp", o.tp},
                    {"recompute", o.recompute},
                    {"find_max_seq_len", o.find_max_seq_len},
                    {"search_steps", o.search_steps},
                    {"search_chunk_size", o.search_chunk_size}};
    j["rows"] = nlohmann::json::array();
    for (const Row& r : rows) j["rows"].push_back(ToJson(r, peak));
    j["max_seq_len"] = nlohmann::json::array();
    for (const SearchResult& r : searches) {
      j["max_seq_len"].push_back(
          {{"recompute", r.recompute},
           {"longest_fit", r.longest_fit},
           {"first_oom", r.first_oom > 0 ? nlohmann::json(r.first_oom) : nullptr},
           {"peak_memory_bytes", r.at_longest.peak_bytes >= 0
                                     ? nlohmann::json(r.at_longest.peak_bytes)
                                     : nullptr},
           {"step_s", r.at_longest.step_s}});
    }
    WriteJsonFile(o.json, j);
  }
  return 0;
}
