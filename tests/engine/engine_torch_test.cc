// LibTorch parts of the engine: paged attention against the model's packed forward, the
// sampler's math (log-prob definition, truncation, seeding, penalties) on fixed logits, and a
// mixture-of-experts model (qwen3_moe) generating greedily on the CPU.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <future>
#include <map>
#include <numeric>
#include <random>
#include <tuple>

#include "absl/strings/escaping.h"

#include "engine_test_util.h"
#include "slime/engine/engine.h"
#include "slime/engine/model_runner.h"
#include "slime/engine/protocol.h"
#include "slime/model/decoder.h"
#include "slime/engine/sampler.h"
#include "test_paths.h"

namespace slime::engine {
namespace {

std::string FixtureDir() { return slime::testing::SourceDir() + "/tests/data/model/tiny-qwen3"; }

std::unique_ptr<ModelRunner> MakeRunner(int64_t page_size = 4) {
  ModelRunnerOptions o;
  o.model_path = FixtureDir();
  o.dtype = "float32";
  o.device = "cpu";
  o.page_size = page_size;
  o.max_total_tokens = 512;
  auto r = ModelRunner::Create(o);
  EXPECT_TRUE(r.ok()) << r.status();
  return std::move(r).value();
}

std::vector<int32_t> RandomTokens(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

// Reference: the model's own packed forward over each full sequence -> logits [L, V].
torch::Tensor ReferenceLogits(ModelRunner& runner, const std::vector<int32_t>& tokens) {
  std::vector<int64_t> ids(tokens.begin(), tokens.end());
  auto hidden = runner.model().ForwardPacked(torch::tensor(ids), {0, static_cast<int64_t>(ids.size())});
  EXPECT_TRUE(hidden.ok()) << hidden.status();
  auto logits = runner.model().Logits(*hidden);
  EXPECT_TRUE(logits.ok());
  return logits->detach();
}

TEST(PagedAttentionTest, ChunkedPrefillAndBatchedDecodeMatchPackedForward) {
  auto runner = MakeRunner(/*page_size=*/4);
  const int vocab = static_cast<int>(runner->config().vocab_size);
  std::vector<int32_t> a = RandomTokens(14, vocab, 1);  // 11 prompt + 3 decodes
  std::vector<int32_t> b = RandomTokens(10, vocab, 2);  // 7 prompt (4 + 3 chunks) + 3 decodes
  // Deliberately scattered, non-monotonic pages; page 0 is the reserved padding page.
  std::vector<int32_t> pages_a = {9, 3, 17, 5};
  std::vector<int32_t> pages_b = {12, 2, 30};
  torch::Tensor ref_a = ReferenceLogits(*runner, a);
  torch::Tensor ref_b = ReferenceLogits(*runner, b);

  auto check = [&](const HiddenStates& hidden, int64_t row, const torch::Tensor& ref,
                   int64_t pos) {
    auto logits = runner->Logits(hidden, {row});
    ASSERT_TRUE(logits.ok()) << logits.status();
    EXPECT_TRUE(torch::allclose((*logits)[0], ref[pos], 1e-4, 1e-5))
        << "position " << pos << " max diff "
        << ((*logits)[0] - ref[pos]).abs().max().item<float>();
  };

  // Step 1: all of a's prompt (11) + b's first chunk (4).
  std::vector<int32_t> ids(a.begin(), a.begin() + 11);
  ids.insert(ids.end(), b.begin(), b.begin() + 4);
  auto h = runner->Forward(ids, {{11, 11, &pages_a}, {4, 4, &pages_b}});
  ASSERT_TRUE(h.ok()) << h.status();
  for (int p = 0; p < 11; ++p) check(*h, p, ref_a, p);
  for (int p = 0; p < 4; ++p) check(*h, 11 + p, ref_b, p);
  // Step 2: a decodes token 11 while b's second chunk (3) completes its prompt.
  ids = {a[11], b[4], b[5], b[6]};
  h = runner->Forward(ids, {{1, 12, &pages_a}, {3, 7, &pages_b}});
  ASSERT_TRUE(h.ok()) << h.status();
  check(*h, 0, ref_a, 11);
  for (int p = 0; p < 3; ++p) check(*h, 1 + p, ref_b, 4 + p);
  // Steps 3-4: batched decodes with different context lengths (padding + mask).
  for (int s = 0; s < 2; ++s) {
    ids = {a[12 + s], b[7 + s]};
    h = runner->Forward(ids, {{1, 13 + s, &pages_a}, {1, 8 + s, &pages_b}});
    ASSERT_TRUE(h.ok()) << h.status();
    check(*h, 0, ref_a, 12 + s);
    check(*h, 1, ref_b, 7 + s);
  }
}

TEST(PagedAttentionTest, MathAndDefaultImplementationsAgree) {
  auto runner = MakeRunner(2);
  std::vector<int32_t> a = RandomTokens(9, static_cast<int>(runner->config().vocab_size), 3);
  std::vector<int32_t> pages = {4, 8, 1, 7, 6};
  auto h1 = runner->Forward(a, {{9, 9, &pages}});
  ASSERT_TRUE(h1.ok());
  runner->model().set_attention_impl(model::AttentionImpl::kMath);
  auto h2 = runner->Forward(a, {{9, 9, &pages}});
  ASSERT_TRUE(h2.ok());
  EXPECT_TRUE(torch::allclose(h1->rank0(), h2->rank0(), 1e-4, 1e-5));
}

TEST(ModelRunnerTest, BadOptionsAreClearErrors) {
  ModelRunnerOptions o;
  o.model_path = FixtureDir();
  o.device = "cpu";
  o.dtype = "int7";
  auto r = ModelRunner::Create(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(std::string(r.status().message()).find("dtype 'int7'"), std::string::npos);
  o.dtype = "float32";
  o.page_size = 0;
  r = ModelRunner::Create(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(std::string(r.status().message()).find("page_size"), std::string::npos);
  o.page_size = 4;
  o.model_path = "/nonexistent/model";
  EXPECT_FALSE(ModelRunner::Create(o).ok());
}

TEST(ModelRunnerTest, ReleaseResumeAndOffloadOnload) {
  auto runner = MakeRunner();
  std::vector<int32_t> a = RandomTokens(5, 256, 4);
  std::vector<int32_t> pages = {1, 2};
  auto before = runner->Forward(a, {{5, 5, &pages}});
  ASSERT_TRUE(before.ok());
  ASSERT_TRUE(runner->ReleaseKv().ok());
  EXPECT_FALSE(runner->Forward(a, {{5, 5, &pages}}).ok());
  ASSERT_TRUE(runner->ResumeKv().ok());
  ASSERT_TRUE(runner->OffloadWeights().ok());
  EXPECT_FALSE(runner->Forward(a, {{5, 5, &pages}}).ok());
  ASSERT_TRUE(runner->OnloadWeights().ok());
  auto after = runner->Forward(a, {{5, 5, &pages}});
  ASSERT_TRUE(after.ok());
  EXPECT_TRUE(torch::allclose(before->rank0(), after->rank0()));
}

// ---- Sampler

struct RowSpec {
  SamplingParams params;
  std::vector<int32_t> tokens;
  std::vector<int32_t> stop_ids;
  uint64_t seed = 0;
  int64_t num_output = 0;
  int64_t prompt_len = 0;
};

SamplerOutput SampleSpecs(const torch::Tensor& logits, std::vector<RowSpec>& specs) {
  std::vector<SamplerRow> rows;
  for (RowSpec& s : specs) {
    SamplerRow r;
    r.params = &s.params;
    r.tokens = &s.tokens;
    r.prompt_len = s.prompt_len;
    r.num_output = s.num_output;
    r.seed = s.seed;
    r.stop_ids = &s.stop_ids;
    rows.push_back(r);
  }
  return Sample(logits, rows);
}

TEST(SamplerTest, GreedyAndTemperatureLogprobsFollowSglangDefinition) {
  torch::manual_seed(0);
  torch::Tensor logits = torch::randn({3, 50}) * 3;
  std::vector<RowSpec> specs(3);
  specs[0].params.temperature = 0.0;  // greedy
  specs[1].params.temperature = 0.7;
  specs[1].seed = 11;
  specs[2].params.temperature = 1.3;
  specs[2].params.top_p = 0.5;  // truncation must not change the returned logprob
  specs[2].seed = 12;
  SamplerOutput out = SampleSpecs(logits, specs);
  EXPECT_EQ(out.tokens[0], logits[0].argmax().item<int64_t>());
  EXPECT_NEAR(out.logprobs[0], torch::log_softmax(logits[0], -1)[out.tokens[0]].item<float>(), 1e-5);
  EXPECT_NEAR(out.logprobs[1], torch::log_softmax(logits[1] / 0.7, -1)[out.tokens[1]].item<float>(),
              1e-5);
  EXPECT_NEAR(out.logprobs[2], torch::log_softmax(logits[2] / 1.3, -1)[out.tokens[2]].item<float>(),
              1e-5);
}

TEST(SamplerTest, SeededRowsDoNotDependOnTheBatch) {
  torch::manual_seed(1);
  torch::Tensor logits = torch::randn({4, 100});
  std::vector<RowSpec> batch(4);
  for (int i = 0; i < 4; ++i) {
    batch[i].seed = 1000 + i;
    batch[i].num_output = 7;
  }
  SamplerOutput all = SampleSpecs(logits, batch);
  for (int i = 0; i < 4; ++i) {
    std::vector<RowSpec> one = {batch[i]};
    SamplerOutput single = SampleSpecs(logits.narrow(0, i, 1), one);
    EXPECT_EQ(single.tokens[0], all.tokens[i]) << "row " << i;
  }
  // A different position draws different noise.
  std::vector<RowSpec> moved = batch;
  int differ = 0;
  for (int pos = 8; pos < 28; ++pos) {
    for (auto& s : moved) s.num_output = pos;
    differ += SampleSpecs(logits, moved).tokens[0] != all.tokens[0];
  }
  EXPECT_GT(differ, 0);
}

TEST(SamplerTest, EmpiricalFrequenciesMatchTheTruncatedDistribution) {
  // p = softmax(log([0.4, 0.3, 0.2, 0.1])): top_k=2 keeps {0, 1} renormalised to 4/7, 3/7.
  torch::Tensor base = torch::tensor({0.4f, 0.3f, 0.2f, 0.1f}).log().unsqueeze(0);
  const int n = 4000;
  torch::Tensor logits = base.expand({n, 4}).contiguous();
  std::vector<RowSpec> full(n), topk(n), topp(n);
  for (int i = 0; i < n; ++i) {
    full[i].seed = topk[i].seed = topp[i].seed = 77 + i;
    topk[i].params.top_k = 2;
    topp[i].params.top_p = 0.65;  // mass before token 2 is 0.7 > 0.65: keeps {0, 1}
  }
  auto freq = [&](std::vector<RowSpec>& specs) {
    SamplerOutput out = SampleSpecs(logits, specs);
    std::vector<double> f(4, 0);
    for (int32_t t : out.tokens) f[t] += 1.0 / n;
    return f;
  };
  std::vector<double> f = freq(full);
  const double tol = 0.03;  // ~4 standard deviations at n = 4000
  EXPECT_NEAR(f[0], 0.4, tol);
  EXPECT_NEAR(f[1], 0.3, tol);
  EXPECT_NEAR(f[2], 0.2, tol);
  EXPECT_NEAR(f[3], 0.1, tol);
  for (auto* specs : {&topk, &topp}) {
    f = freq(*specs);
    EXPECT_NEAR(f[0], 4.0 / 7, tol);
    EXPECT_NEAR(f[1], 3.0 / 7, tol);
    EXPECT_EQ(f[2] + f[3], 0.0);
  }
}

TEST(SamplerTest, TruncationExtremesAreGreedy) {
  torch::manual_seed(2);
  torch::Tensor logits = torch::randn({3, 64});
  std::vector<RowSpec> specs(3);
  specs[0].params.top_k = 1;
  specs[1].params.top_p = 1e-6;
  specs[2].params.min_p = 1.0;
  for (int i = 0; i < 3; ++i) specs[i].seed = 5 + i;
  SamplerOutput out = SampleSpecs(logits, specs);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(out.tokens[i], logits[i].argmax().item<int64_t>());
}

TEST(SamplerTest, MinNewTokensMasksStopIdsAndShowsInLogprob) {
  torch::Tensor logits = torch::zeros({1, 8});
  logits[0][3] = 10.0;  // EOS would win
  std::vector<RowSpec> specs(1);
  specs[0].params.temperature = 0.0;
  specs[0].params.min_new_tokens = 2;
  specs[0].stop_ids = {3};
  specs[0].num_output = 1;
  SamplerOutput out = SampleSpecs(logits, specs);
  EXPECT_NE(out.tokens[0], 3);
  EXPECT_NEAR(out.logprobs[0], std::log(1.0 / 7.0), 1e-5);  // EOS removed from the softmax
  specs[0].num_output = 2;
  EXPECT_EQ(SampleSpecs(logits, specs).tokens[0], 3);
}

TEST(SamplerTest, PenaltiesAndLogitBias) {
  torch::Tensor logits = torch::tensor({{2.0f, 1.0f, -1.0f, 0.5f}});
  std::vector<RowSpec> specs(1);
  RowSpec& s = specs[0];
  s.params.temperature = 0.0;
  s.prompt_len = 1;
  s.tokens = {2, 0, 0};  // prompt {2}, output {0, 0}
  s.params.repetition_penalty = 2.0;   // 0: 2 -> 1; 2: -1 -> -2
  s.params.frequency_penalty = 0.25;   // 0: -0.5 (two occurrences)
  s.params.presence_penalty = 0.25;    // 0: -0.25
  s.params.logit_bias = {{3, 0.3}};    // 3: 0.5 -> 0.8
  // Expected adjusted logits: {2/2 - 0.5 - 0.25, 1, -2, 0.8} = {0.25, 1, -2, 0.8}
  torch::Tensor expect = torch::tensor({0.25f, 1.0f, -2.0f, 0.8f});
  SamplerOutput out = SampleSpecs(logits, specs);
  EXPECT_EQ(out.tokens[0], 1);
  EXPECT_NEAR(out.logprobs[0], torch::log_softmax(expect, -1)[1].item<float>(), 1e-5);
}

TEST(SamplerTest, TopLogprobsAndTokenLogprobs) {
  torch::manual_seed(3);
  torch::Tensor logits = torch::randn({2, 30});
  SamplerRow r;
  SamplingParams p;
  p.temperature = 0.0;
  r.params = &p;
  r.top_logprobs_num = 3;
  SamplerOutput out = Sample(logits, {r, r});
  ASSERT_EQ(out.top[1].size(), 3u);
  auto ref = torch::log_softmax(logits[1], -1).topk(3);
  for (int j = 0; j < 3; ++j) {
    EXPECT_NEAR(out.top[1][j].first, std::get<0>(ref)[j].item<float>(), 1e-6);
    EXPECT_EQ(out.top[1][j].second, std::get<1>(ref)[j].item<int64_t>());
  }
  torch::Tensor lp = TokenLogprobs(logits, torch::tensor({4, 9}), 0.5);
  EXPECT_NEAR(lp[1].item<float>(), torch::log_softmax(logits[1] / 0.5, -1)[9].item<float>(), 1e-5);
}

TEST(SamplerTest, UniformsAreInOpenUnitIntervalAndDeterministic) {
  double sum = 0;
  for (int64_t p = 0; p < 10000; ++p) {
    const double u = SamplerUniform(42, p);
    ASSERT_GT(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / 10000, 0.5, 0.02);
  EXPECT_EQ(SamplerUniform(42, 3), SamplerUniform(42, 3));
  EXPECT_NE(SamplerUniform(42, 3), SamplerUniform(43, 3));
}

// The real engine on a random Qwen3-MoE (tests/data/model/configs/qwen3-moe-tiny.json: two
// sparse layers of 8 experts, 2 per token): a batch of greedy requests (chunked prefill next to
// decodes) generates, token for token, the argmax of the model's own full forward over the
// sequence so far.
TEST(MoeEngineTest, GreedyTokensAreTheArgmaxOfTheFullForward) {
  if (!std::filesystem::exists(test_util::TokenizerDir() + "/tokenizer.json")) {
    GTEST_SKIP() << "Qwen3 tokenizer missing at " << test_util::TokenizerDir()
                 << " (scripts/fetch_test_data.sh)";
  }
  const std::string dir = test_util::RandomModelDir(
      "engine-moe-cpu", test_util::TestModelConfig("qwen3-moe-tiny.json"), 3, "fp32");
  EngineOptions o;
  o.model_path = dir;
  o.device = "cpu";
  o.dtype = "float32";
  o.page_size = 4;
  o.max_total_tokens = 2048;
  o.context_length = 128;
  o.chunked_prefill_size = 16;
  o.max_batch_tokens = 16;
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto reference = model::DecoderModel::Load(dir, torch::kFloat32, torch::kCPU);
  ASSERT_TRUE(reference.ok()) << reference.status();

  const int new_tokens = 6;
  std::vector<GenerateInput> inputs;
  for (int len : {5, 23, 9}) {
    GenerateInput g;
    g.rid = "r" + std::to_string(inputs.size());
    for (int32_t t : RandomTokens(len, 150000, 10 + len)) g.input_ids.push_back(t);
    g.sampling.max_new_tokens = new_tokens;
    g.sampling.temperature = 0.0;
    g.sampling.ignore_eos = true;
    inputs.push_back(std::move(g));
  }
  std::vector<std::promise<RequestOutput>> done(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    (*engine)->Submit(inputs[i], [&done, i](const RequestOutput& out) {
      if (out.finish.finished()) done[i].set_value(out);
    });
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::future<RequestOutput> f = done[i].get_future();
    ASSERT_EQ(f.wait_for(std::chrono::seconds(120)), std::future_status::ready) << i;
    const RequestOutput out = f.get();
    ASSERT_EQ(out.output_ids.size(), static_cast<size_t>(new_tokens)) << out.finish.message;
    std::vector<int64_t> seq(inputs[i].input_ids.begin(), inputs[i].input_ids.end());
    for (int step = 0; step < new_tokens; ++step) {
      const int64_t len = static_cast<int64_t>(seq.size());
      auto hidden = (*reference)->ForwardPacked(torch::tensor(seq, torch::kLong), {0, len});
      ASSERT_TRUE(hidden.ok()) << hidden.status();
      auto logits = (*reference)->Logits(hidden->narrow(0, len - 1, 1));
      ASSERT_TRUE(logits.ok()) << logits.status();
      const int64_t want = (*logits)[0].argmax().item<int64_t>();
      ASSERT_EQ(out.output_ids[step], want) << "request " << out.rid << ", token " << step;
      seq.push_back(want);
    }
  }
}

// --- routed experts (return_routed_experts, docs/http-api.md) ---------------------------------

// The MoE engine with --enable-return-routed-experts (chunked prefill of 16, pages of 4).
std::unique_ptr<Engine> RoutingEngine(const std::string& dir, bool enable) {
  EngineOptions o;
  o.model_path = dir;
  o.device = "cpu";
  o.dtype = "float32";
  o.page_size = 4;
  o.max_total_tokens = 2048;
  o.context_length = 128;
  o.chunked_prefill_size = 16;
  o.max_batch_tokens = 16;
  o.enable_return_routed_experts = enable;
  auto engine = Engine::Create(o);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? std::move(*engine) : nullptr;
}

// Submits every input at once and waits for their final outputs.
std::vector<RequestOutput> RunAll(Engine& engine, const std::vector<GenerateInput>& inputs) {
  std::vector<std::promise<RequestOutput>> done(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    engine.Submit(inputs[i], [&done, i](const RequestOutput& out) {
      if (out.finish.finished()) done[i].set_value(out);
    });
  }
  std::vector<RequestOutput> outs;
  for (auto& d : done) {
    std::future<RequestOutput> f = d.get_future();
    EXPECT_EQ(f.wait_for(std::chrono::seconds(120)), std::future_status::ready);
    outs.push_back(f.get());
  }
  return outs;
}

// Each request's rows are prompt + output − 1 − routed_experts_start_len, and they are the
// routing a DecoderModel forward over the whole sequence captures at those positions — chunked
// prefill next to decodes, and a second round served from the prefix cache alike.
TEST(MoeEngineTest, RoutedExpertsAreTheFullForwardsRouting) {
  if (!std::filesystem::exists(test_util::TokenizerDir() + "/tokenizer.json")) {
    GTEST_SKIP() << "Qwen3 tokenizer missing at " << test_util::TokenizerDir()
                 << " (scripts/fetch_test_data.sh)";
  }
  const std::string dir = test_util::RandomModelDir(
      "engine-moe-cpu", test_util::TestModelConfig("qwen3-moe-tiny.json"), 3, "fp32");
  std::unique_ptr<Engine> engine = RoutingEngine(dir, true);
  ASSERT_NE(engine, nullptr);
  auto reference = model::DecoderModel::Load(dir, torch::kFloat32, torch::kCPU);
  ASSERT_TRUE(reference.ok()) << reference.status();
  model::DecoderModel& ref = **reference;
  const int64_t layers = ref.config().num_hidden_layers;
  const int64_t k = ref.config().moe.num_experts_per_tok;

  const int new_tokens = 5;
  std::vector<GenerateInput> inputs;
  const std::vector<std::pair<int, int64_t>> shapes = {{5, 0}, {23, 7}, {9, 0}};  // (len, start)
  for (const auto& [len, start] : shapes) {
    GenerateInput g;
    g.rid = "r" + std::to_string(inputs.size());
    for (int32_t t : RandomTokens(len, 150000, 20 + len)) g.input_ids.push_back(t);
    g.sampling.max_new_tokens = new_tokens;
    g.sampling.temperature = 0.0;
    g.sampling.ignore_eos = true;
    g.return_routed_experts = true;
    g.routed_experts_start_len = start;
    inputs.push_back(std::move(g));
  }
  ref.set_capture_routed_experts(true);
  for (int round = 0; round < 2; ++round) {  // round 1: the prompts' pages are in the cache
    const std::vector<RequestOutput> outs = RunAll(*engine, inputs);
    for (size_t i = 0; i < inputs.size(); ++i) {
      const RequestOutput& out = outs[i];
      ASSERT_EQ(out.output_ids.size(), static_cast<size_t>(new_tokens)) << out.finish.message;
      std::vector<int64_t> seq(inputs[i].input_ids.begin(), inputs[i].input_ids.end());
      seq.insert(seq.end(), out.output_ids.begin(), out.output_ids.end());
      const int64_t total = static_cast<int64_t>(seq.size());
      const int64_t start = inputs[i].routed_experts_start_len;
      const int64_t rows = total - 1 - start;
      ASSERT_EQ(static_cast<int64_t>(out.routed_experts.size()), rows * layers * k)
          << "round " << round << ", request " << i;
      auto hidden = ref.ForwardPacked(torch::tensor(seq, torch::kLong), {0, total});
      ASSERT_TRUE(hidden.ok()) << hidden.status();
      std::vector<torch::Tensor> per_layer;
      for (const torch::Tensor& r : ref.routed_experts()) per_layer.push_back(r.narrow(0, start, rows));
      const torch::Tensor want = torch::stack(per_layer, 1).to(torch::kInt);  // [rows, layers, k]
      const torch::Tensor got =
          torch::tensor(out.routed_experts, torch::kInt).reshape({rows, layers, k});
      EXPECT_TRUE(torch::equal(got, want)) << "round " << round << ", request " << i;
      if (round == 1 && start == 0) EXPECT_EQ(out.cached_tokens, 0) << "start 0 bypasses the cache";
    }
  }

  // The JSON answer: base64 of the little-endian int32 rows.
  GenerateInput in = inputs[0];
  RequestOutput out;
  out.routed_experts = {1, 258, -1};
  const nlohmann::json j = GenerateOutputJson(out, in, nullptr, false, false);
  std::string bytes;
  ASSERT_TRUE(absl::Base64Unescape(j["meta_info"]["routed_experts"].get<std::string>(), &bytes));
  EXPECT_EQ(bytes, std::string("\x01\x00\x00\x00\x02\x01\x00\x00\xff\xff\xff\xff", 12));
  in.return_routed_experts = false;
  EXPECT_FALSE(GenerateOutputJson(out, in, nullptr, false, false)["meta_info"].contains(
      "routed_experts"));
}

// The request fields: refused (400 naming the field or the flag) without the serve flag or on a
// dense model, and for a routed_experts_start_len outside the prompt; the engine itself aborts
// such a request with 400 when submitted directly.
TEST(MoeEngineTest, RoutedExpertsNeedTheFlagAndASparseModel) {
  if (!std::filesystem::exists(test_util::TokenizerDir() + "/tokenizer.json")) {
    GTEST_SKIP() << "Qwen3 tokenizer missing at " << test_util::TokenizerDir()
                 << " (scripts/fetch_test_data.sh)";
  }
  auto tok = tokenizer::Tokenizer::FromDirectory(test_util::TokenizerDir());
  ASSERT_TRUE(tok.ok()) << tok.status();
  ProtocolLimits limits;
  limits.context_length = 128;
  limits.vocab_size = 151936;
  const nlohmann::json body = {{"input_ids", {1, 2, 3}},
                               {"sampling_params", {{"max_new_tokens", 4}}},
                               {"return_routed_experts", true}};
  auto parse = [&](const nlohmann::json& b) {
    return ParseGenerateRequest(b, tok->get(), limits, nullptr);
  };
  limits.moe_model = false;
  limits.enable_return_routed_experts = true;
  auto dense = parse(body);
  ASSERT_FALSE(dense.ok());
  EXPECT_NE(dense.status().message().find("return_routed_experts"), std::string::npos);
  EXPECT_NE(dense.status().message().find("mixture-of-experts"), std::string::npos);
  limits.moe_model = true;
  limits.enable_return_routed_experts = false;
  auto off = parse(body);
  ASSERT_FALSE(off.ok());
  EXPECT_NE(off.status().message().find("--enable-return-routed-experts"), std::string::npos);
  limits.enable_return_routed_experts = true;
  nlohmann::json far = body;
  far["routed_experts_start_len"] = 3;
  auto bad_start = parse(far);
  ASSERT_FALSE(bad_start.ok());
  EXPECT_NE(bad_start.status().message().find("routed_experts_start_len"), std::string::npos);
  far["routed_experts_start_len"] = 2;
  auto ok = parse(far);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(ok->inputs[0].return_routed_experts);
  EXPECT_EQ(ok->inputs[0].routed_experts_start_len, 2);
  limits.enable_return_routed_experts = false;  // off by default: neither is needed
  EXPECT_TRUE(parse({{"input_ids", {1, 2}}, {"sampling_params", {{"max_new_tokens", 4}}}}).ok());

  // The engine without the flag, and a dense engine with it: aborted with 400.
  const std::string moe = test_util::RandomModelDir(
      "engine-moe-cpu", test_util::TestModelConfig("qwen3-moe-tiny.json"), 3, "fp32");
  const std::string dense_dir = test_util::RandomModelDir(
      "engine-dense-cpu", test_util::TestModelConfig("qwen3-tiny.json"), 3, "fp32");
  for (const auto& [dir, enable, what] :
       {std::tuple<std::string, bool, std::string>{moe, false, "--enable-return-routed-experts"},
        {dense_dir, true, "mixture-of-experts"}}) {
    std::unique_ptr<Engine> engine = RoutingEngine(dir, enable);
    ASSERT_NE(engine, nullptr);
    GenerateInput g;
    g.rid = "x";
    g.input_ids = {1, 2, 3};
    g.sampling.max_new_tokens = 2;
    g.return_routed_experts = true;
    const RequestOutput out = RunAll(*engine, {g})[0];
    EXPECT_EQ(out.finish.type, FinishType::kAbort);
    EXPECT_EQ(out.finish.status_code.value_or(0), 400);
    EXPECT_NE(out.finish.message.find(what), std::string::npos) << out.finish.message;
  }
}

}  // namespace
}  // namespace slime::engine
