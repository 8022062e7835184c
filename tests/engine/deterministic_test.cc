// Deterministic inference (EngineOptions::deterministic_inference, `serve
// --enable-deterministic-inference`): a request's output tokens and log-probs are the same bits
// when it runs alone, among other requests (31 on CPU in float32, 255 on CUDA in bfloat16),
// again with its prompt in the prefix cache, and on an engine that prefills in 16-token chunks
// without a cache — with seeded sampling at temperature 1 and greedy. Its own binary: the mode
// is a process-wide switch. Built twice: engine_deterministic_test (CPU) and, with
// SLIME_DETERMINISTIC_GPU_TEST, engine_deterministic_gpu_test (CUDA, label gpu; skips without
// CUDA).
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <algorithm>
#include <bit>
#include <filesystem>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "engine_test_util.h"
#include "slime/engine/engine.h"
#include "slime/model/batch_invariant.h"

namespace slime::engine {
namespace {

using test_util::RandomModelDir;
using test_util::TestModelConfig;
using test_util::TokenizerDir;

#ifdef SLIME_DETERMINISTIC_GPU_TEST
constexpr const char* kDevice = "cuda";
constexpr const char* kDtype = "bfloat16";
constexpr int kOthers = 255;
#else
constexpr const char* kDevice = "cpu";
constexpr const char* kDtype = "float32";
constexpr int kOthers = 31;
#endif

std::unique_ptr<Engine> MakeEngine(int64_t chunk, bool prefix_cache) {
  EngineOptions o;
  o.model_path = RandomModelDir("deterministic-qwen3", TestModelConfig("qwen3-engine-test.json"),
                                3, "fp32");
  o.device = kDevice;
  o.dtype = kDtype;
  o.page_size = 4;
  o.max_total_tokens = 16384;
  o.context_length = 256;
  o.chunked_prefill_size = chunk;
  o.max_batch_tokens = std::max<int64_t>(chunk, 64);
  o.enable_prefix_cache = prefix_cache;
  o.deterministic_inference = true;
  auto e = Engine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? *std::move(e) : nullptr;
}

std::vector<int32_t> Prompt(int s, int len) {
  std::vector<int32_t> ids;
  for (int i = 0; i < len; ++i) ids.push_back(100 + (s * 131 + i * 29) % 5000);
  return ids;
}

GenerateInput Request(const std::string& rid, std::vector<int32_t> prompt, double temperature,
                      uint64_t seed) {
  GenerateInput in;
  in.rid = rid;
  in.input_ids = std::move(prompt);
  in.sampling.temperature = temperature;
  in.sampling.max_new_tokens = 20;
  in.sampling.ignore_eos = true;
  in.sampling.sampling_seed = seed;
  in.return_logprob = true;
  return in;
}

// Submits every request at once and waits for all; outputs in request order.
std::vector<RequestOutput> RunAll(Engine& engine, const std::vector<GenerateInput>& inputs) {
  std::vector<std::promise<RequestOutput>> done(inputs.size());
  std::vector<std::future<RequestOutput>> futures;
  for (auto& d : done) futures.push_back(d.get_future());
  for (size_t i = 0; i < inputs.size(); ++i) {
    engine.Submit(inputs[i], [&done, i](const RequestOutput& out) {
      if (out.finish.finished()) done[i].set_value(out);
    });
  }
  std::vector<RequestOutput> outs;
  for (auto& f : futures) outs.push_back(f.get());
  return outs;
}

void ExpectSameBits(const RequestOutput& got, const RequestOutput& want, const std::string& how) {
  EXPECT_EQ(got.output_ids, want.output_ids) << how;
  ASSERT_EQ(got.output_logprobs.size(), want.output_logprobs.size()) << how;
  for (size_t i = 0; i < want.output_logprobs.size(); ++i) {
    EXPECT_EQ(std::bit_cast<uint32_t>(got.output_logprobs[i]),
              std::bit_cast<uint32_t>(want.output_logprobs[i]))
        << how << ": token " << i << " log-prob " << got.output_logprobs[i] << " vs "
        << want.output_logprobs[i];
  }
}

class DeterministicEngineTest : public ::testing::TestWithParam<double> {
 protected:
  void SetUp() override {
#ifdef SLIME_DETERMINISTIC_GPU_TEST
    if (!torch::cuda::is_available()) GTEST_SKIP() << "CUDA is not available: a GPU test";
#endif
    if (!std::filesystem::exists(TokenizerDir() + "/tokenizer.json")) {
      GTEST_SKIP() << "Qwen3 tokenizer missing at " << TokenizerDir()
                   << ": run scripts/fetch_test_data.sh";
    }
  }
};

TEST_P(DeterministicEngineTest, ARequestIsTheSameBitsAloneBatchedCachedAndChunked) {
  const double temperature = GetParam();
  const GenerateInput probe = Request("probe", Prompt(0, 45), temperature, 3);
  auto engine = MakeEngine(/*chunk=*/8192, /*prefix_cache=*/true);
  ASSERT_NE(engine, nullptr);
  EXPECT_TRUE(model::BatchInvariant());

  const RequestOutput alone = RunAll(*engine, {probe})[0];
  ASSERT_EQ(alone.output_ids.size(), 20u);

  // Among others of other lengths, seeds and temperatures (the sampler's log-probs go by
  // temperature group), some sharing part of its prompt.
  std::vector<GenerateInput> batch;
  for (int s = 1; s <= kOthers; ++s) {
    std::vector<int32_t> p = Prompt(s, 5 + (s * 7) % 40);
    if (s % 4 == 0) {
      p = Prompt(0, 20);
      p.push_back(7 + s);
    }
    const double t = s % 3 == 0 ? 0.7 : s % 5 == 0 ? 0.0 : temperature;
    batch.push_back(Request("r" + std::to_string(s), p, t, 100 + s));
  }
  batch.insert(batch.begin() + 13, probe);
  const std::vector<RequestOutput> outs = RunAll(*engine, batch);
  ExpectSameBits(outs[13], alone, "among " + std::to_string(kOthers) + " others");

  // Again: its whole prompt is in the prefix cache now.
  const RequestOutput cached = RunAll(*engine, {probe})[0];
  EXPECT_GT(cached.cached_tokens, 0);
  ExpectSameBits(cached, alone, "with a prefix-cache hit");

  // Another engine: 16-token prefill chunks, no prefix cache, among others again.
  auto chunked = MakeEngine(/*chunk=*/16, /*prefix_cache=*/false);
  ASSERT_NE(chunked, nullptr);
  std::vector<GenerateInput> few(batch.begin() + 10, batch.begin() + 18);
  const std::vector<RequestOutput> chunked_outs = RunAll(*chunked, few);
  ExpectSameBits(chunked_outs[3], alone, "16-token prefill chunks, no cache");
}

INSTANTIATE_TEST_SUITE_P(SeededAndGreedy, DeterministicEngineTest, ::testing::Values(1.0, 0.0),
                         [](const auto& info) {
                           return std::string(info.param > 0 ? "Temperature1" : "Greedy");
                         });

}  // namespace
}  // namespace slime::engine
