// decode_step_bench: where the time of one batch-1 (or batch-B) decode step goes, below the
// Engine. Builds a ModelRunner on a model directory, captures its decode CUDA graphs and times,
// per step, over a context that grows from --context by one position a step:
//
//   replay    graph replays back to back (DecodeLogits only, no sampling, no read-back): the
//             device time of the forward + LM head, the floor the engine step could reach;
//   + sample  DecodeLogits, then Sample (the fused sampler) and its read-back each step: what
//             the engine's decode loop does before its host bookkeeping;
//
// and prints ms per step and steps/s for each. The engine's batch-1 decode tokens/s
// (engine_bench --batch1) minus "+ sample" is the engine's own host work per step
// (schedule, build, accept, emit). CUDA only (the graphs need the paged kernel).
//
//   decode_step_bench --model DIR [--batch 1] [--context 128] [--steps 256] [--repeats 3]
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "slime/engine/model_runner.h"
#include "slime/engine/request.h"
#include "slime/engine/sampler.h"

namespace {

using slime::engine::ModelRunner;
using slime::engine::ModelRunnerOptions;
using slime::engine::PagedItem;
using slime::engine::SamplerRow;
using slime::engine::SamplingParams;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"decode_step_bench: device time vs engine-loop time of decode steps"};
  std::string model;
  std::string dtype = "bfloat16";
  int64_t batch = 1, context = 128, steps = 256, repeats = 3;
  app.add_option("--model", model, "HF model directory")->required();
  app.add_option("--dtype", dtype, "bfloat16 | float16 | float32");
  app.add_option("--batch", batch, "decode rows per step")->check(CLI::Range(1, 256));
  app.add_option("--context", context, "context length at the first step")->check(CLI::Range(1, 1 << 16));
  app.add_option("--steps", steps, "steps per timed run")->check(CLI::Range(1, 1 << 16));
  app.add_option("--repeats", repeats, "timed runs per mode (the best is reported)")->check(CLI::Range(1, 100));
  CLI11_PARSE(app, argc, argv);

  if (!torch::cuda::is_available()) {
    std::fprintf(stderr, "decode_step_bench: needs CUDA (the decode graphs are CUDA graphs)\n");
    return 1;
  }
  ModelRunnerOptions ro;
  ro.model_path = model;
  ro.dtype = dtype;
  ro.device = "cuda";
  const int64_t max_context = context + steps + 1;
  ro.page_size = 16;
  const int64_t pages_per_seq = (max_context + ro.page_size - 1) / ro.page_size;
  ro.max_total_tokens = (batch * pages_per_seq + 2) * ro.page_size;
  auto runner_or = ModelRunner::Create(ro);
  if (!runner_or.ok()) {
    std::fprintf(stderr, "decode_step_bench: %s\n", std::string(runner_or.status().message()).c_str());
    return 1;
  }
  ModelRunner& runner = **runner_or;
  if (auto s = runner.CaptureDecodeGraphs(batch, max_context); !s.ok()) {
    std::fprintf(stderr, "decode_step_bench: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  if (!runner.has_decode_graphs()) {
    std::fprintf(stderr, "decode_step_bench: this build has no decode graphs\n");
    return 1;
  }

  // Sequence b owns pages 1 + b*pages_per_seq ... (page 0 is the padding slot). The K/V
  // contents are whatever the pool holds: timing does not depend on them.
  std::vector<std::vector<int32_t>> pages(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t p = 0; p < pages_per_seq; ++p) {
      pages[static_cast<size_t>(b)].push_back(static_cast<int32_t>(1 + b * pages_per_seq + p));
    }
  }
  SamplingParams greedy;
  greedy.temperature = 0;
  std::vector<int32_t> history(static_cast<size_t>(context), 1);
  std::vector<int32_t> stop_ids;

  auto run = [&](bool sample) {
    std::vector<int32_t> ids(static_cast<size_t>(batch), 1);
    std::vector<PagedItem> items(static_cast<size_t>(batch));
    std::vector<SamplerRow> rows(static_cast<size_t>(batch));
    torch::cuda::synchronize();
    const double t0 = Now();
    for (int64_t s = 0; s < steps; ++s) {
      for (int64_t b = 0; b < batch; ++b) {
        items[static_cast<size_t>(b)] = {1, context + s + 1, &pages[static_cast<size_t>(b)]};
      }
      auto logits = runner.DecodeLogits(ids, items);
      if (!logits.ok()) {
        std::fprintf(stderr, "decode_step_bench: %s\n", std::string(logits.status().message()).c_str());
        std::exit(1);
      }
      if (sample) {
        for (int64_t b = 0; b < batch; ++b) {
          SamplerRow& r = rows[static_cast<size_t>(b)];
          r.params = &greedy;
          r.tokens = &history;
          r.prompt_len = context;
          r.num_output = s;
          r.stop_ids = &stop_ids;
          r.need_logprob = true;
        }
        auto out = slime::engine::Sample(*logits, rows);
        for (int64_t b = 0; b < batch; ++b) ids[static_cast<size_t>(b)] = out.tokens[static_cast<size_t>(b)];
      }
    }
    torch::cuda::synchronize();
    return (Now() - t0) / static_cast<double>(steps);
  };

  run(true);  // warm-up: allocator, sampler scratch, first replays
  double best_replay = 1e9, best_sample = 1e9;
  for (int64_t r = 0; r < repeats; ++r) {
    best_replay = std::min(best_replay, run(false));
    best_sample = std::min(best_sample, run(true));
  }
  fmt::print("decode_step_bench: batch {}, context {}..{}, {} steps, best of {}\n", batch, context,
             context + steps, steps, repeats);
  fmt::print("| mode | ms / step | steps/s |\n|---|---:|---:|\n");
  fmt::print("| replay (device floor) | {:.3f} | {:.0f} |\n", best_replay * 1e3, 1.0 / best_replay);
  fmt::print("| + sample + read-back | {:.3f} | {:.0f} |\n", best_sample * 1e3, 1.0 / best_sample);
  return 0;
}
