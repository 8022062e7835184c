// The generate plugin ABI from the host's side: real shared libraries (the example self_check
// plugin and the test plugins of plugins/test_plugin.c) loaded with LoadGeneratePlugin and
// driven through a deterministic in-test EngineSession. What is under test is the boundary:
// version checks, marshalling, spans/masks/log-probs/rewards/status, error messages, threads.
#include "slime/plugin/plugin_generator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "slime/plugin/generate_plugin.h"
#include "slime/rollout/coordinator.h"

namespace slime::plugin {
namespace {

using data::Sample;
using data::SampleStatus;
using rollout::CustomGenerator;
using rollout::GenerateTurn;

// A deterministic engine: for input ids x (n = x.size()) it answers
//   output_ids[k] = 100 * n + x.back() + k,   log_probs[k] = -0.125 * (k + 1),
// three tokens and "stop", or max_new_tokens (< 3) tokens and "length" when the overrides
// say so; text = the ids written out; weight version "v3". An input holding 666 fails with
// Unavailable. It records every call's input and overrides.
class FakeEngine : public rollout::EngineSession {
 public:
  StatusOr<GenerateTurn> Generate(std::span<const int32_t> input_ids,
                                  const nlohmann::json& overrides) override {
    calls.emplace_back(input_ids.begin(), input_ids.end());
    call_overrides.push_back(overrides);
    if (std::find(input_ids.begin(), input_ids.end(), 666) != input_ids.end()) {
      return absl::UnavailableError("engine 127.0.0.1:1 is gone");
    }
    return Answer(std::vector<int32_t>(input_ids.begin(), input_ids.end()),
                  overrides.value("max_new_tokens", 3));
  }
  const rollout::SamplingOptions& sampling() const override { return sampling_options; }
  bool aborting() const override { return abort_flag; }
  std::string engine_address() const override { return "127.0.0.1:1"; }
  std::string request_id() const override { return "slime-rollout0-11-0"; }

  static GenerateTurn Answer(const std::vector<int32_t>& x, int max_new_tokens) {
    GenerateTurn t;
    const int n = std::min(3, max_new_tokens);
    for (int k = 0; k < n; ++k) {
      const int32_t id = static_cast<int32_t>(100 * x.size()) + x.back() + k;
      t.output_ids.push_back(id);
      t.log_probs.push_back(-0.125f * static_cast<float>(k + 1));
      t.text += std::to_string(id);
    }
    t.finish_reason = n == 3 ? "stop" : "length";
    t.weight_version = "v3";
    return t;
  }

  rollout::SamplingOptions sampling_options;
  bool abort_flag = false;
  std::vector<std::vector<int32_t>> calls;
  std::vector<nlohmann::json> call_overrides;
};

Sample MakeSample(int64_t index, std::vector<int32_t> prompt_ids, const std::string& mode) {
  Sample s;
  s.group_index = index / 2;
  s.index = index;
  s.rollout_id = 4;
  s.prompt = "what is 1+2?";
  s.prompt_text = "what is 1+2?";
  s.label = "3";
  s.tokens = std::move(prompt_ids);
  s.metadata = {{"mode", mode}};
  return s;
}

std::unique_ptr<CustomGenerator> Load(const std::string& path, const std::string& config = "") {
  auto loaded = LoadGeneratePlugin({path, config});
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  return loaded.ok() ? *std::move(loaded) : nullptr;
}

std::string LoadError(const std::string& path, const std::string& config = "") {
  auto loaded = LoadGeneratePlugin({path, config});
  return loaded.ok() ? "(loaded)" : std::string(loaded.status().message());
}

std::string Abs(const char* path) { return std::filesystem::absolute(path).string(); }

// ---- loading and version checks -------------------------------------------------------------

TEST(PluginLoad, LoadsTheExampleAndTheTestPlugin) {
  auto example = Load(PLUGIN_SELF_CHECK, R"({"verify_ids": [50]})");
  ASSERT_NE(example, nullptr);
  EXPECT_EQ(example->kind(), "plugin");
  ASSERT_NE(Load(PLUGIN_GOOD), nullptr);
}

TEST(PluginLoad, RefusesAnotherMajorVersionNamingBoth) {
  EXPECT_EQ(LoadError(PLUGIN_MAJOR2),
            "generate plugin " + Abs(PLUGIN_MAJOR2) +
                ": it was built for generate plugin ABI 2.3, this slime-cpp speaks 1.0 (the major "
                "versions must match): rebuild the plugin against this slime-cpp's "
                "include/slime/plugin/generate_plugin.h");
  EXPECT_EQ(LoadError(PLUGIN_MAJOR0),
            "generate plugin " + Abs(PLUGIN_MAJOR0) +
                ": it was built for generate plugin ABI 0.3, this slime-cpp speaks 1.0 (the major "
                "versions must match): rebuild the plugin against this slime-cpp's "
                "include/slime/plugin/generate_plugin.h");
  EXPECT_EQ(LoadGeneratePlugin({PLUGIN_MAJOR2, ""}).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(PluginLoad, AcceptsANewerMinorVersionAndUsesIt) {
  auto gen = Load(PLUGIN_NEWER_MINOR);
  ASSERT_NE(gen, nullptr);
  FakeEngine engine;
  auto out = gen->Generate(MakeSample(11, {1, 2, 3}, "two_turns"), &engine);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->segments.size(), 1u);
  // Its name appears in errors: the table was read.
  auto bad = gen->Generate(MakeSample(11, {1}, "no_status"), &engine);
  EXPECT_EQ(bad.status().message(),
            "generate plugin 'newer' 2.0 (" + Abs(PLUGIN_NEWER_MINOR) +
                "): sample 11: bad output: segment 0 has no status (call set_status)");
}

TEST(PluginLoad, RefusesATableSmallerThanVersionOnes) {
  EXPECT_EQ(LoadError(PLUGIN_SMALL_TABLE),
            "generate plugin " + Abs(PLUGIN_SMALL_TABLE) + ": its table (ABI 1.0) is " +
                std::to_string(offsetof(slime_generate_plugin, generate)) +
                " bytes, smaller than ABI 1.0's " + std::to_string(sizeof(slime_generate_plugin)) +
                ": set struct_size = sizeof(slime_generate_plugin)");
}

TEST(PluginLoad, MissingEntrySymbolNamesFileAndSymbol) {
  EXPECT_EQ(LoadError(PLUGIN_NO_ENTRY),
            "generate plugin " + Abs(PLUGIN_NO_ENTRY) +
                ": it does not export slime_generate_plugin_entry (a generate plugin exports that "
                "one symbol with SLIME_GENERATE_PLUGIN_EXPORT, see "
                "include/slime/plugin/generate_plugin.h)");
}

TEST(PluginLoad, InitFailureCarriesThePluginsMessage) {
  EXPECT_EQ(LoadError(PLUGIN_INIT_FAIL), "generate plugin 'test' 0.1 (" + Abs(PLUGIN_INIT_FAIL) +
                                             "): init returned 3: model file policy.bin not found");
  EXPECT_EQ(LoadError(PLUGIN_GOOD, R"({"x": "refuse"})"),
            "generate plugin 'test' 0.1 (" + Abs(PLUGIN_GOOD) +
                R"(): init returned 2: config {"x": "refuse"} refused)");
  EXPECT_EQ(LoadError(PLUGIN_SELF_CHECK, R"({"verify_text": "x"})"),
            "generate plugin 'self_check' 1.0.0 (" + Abs(PLUGIN_SELF_CHECK) +
                "): init returned 1: config.verify_ids is missing or empty: give the "
                "verification instruction's token ids, e.g. {\"verify_ids\": [12, 34]}");
  EXPECT_EQ(LoadGeneratePlugin({PLUGIN_INIT_FAIL, ""}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PluginLoad, BadPathsAndConfigs) {
  EXPECT_EQ(LoadError("/nonexistent/libx.so"),
            "generate plugin /nonexistent/libx.so: no such file (expected a shared library .so)");
  EXPECT_EQ(LoadGeneratePlugin({"/nonexistent/libx.so", ""}).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(LoadError(""), "generate plugin: no path given (a shared library .so)");
  const std::string not_a_library =
      (std::filesystem::temp_directory_path() / "slime_plugin_test_not_a_library.so").string();
  std::ofstream(not_a_library) << "not an ELF file\n";
  const std::string error = LoadError(not_a_library);
  std::filesystem::remove(not_a_library);
  EXPECT_EQ(error.rfind("generate plugin " + not_a_library + ": cannot load it: ", 0), 0u) << error;
  const std::string bad_json = LoadError(PLUGIN_GOOD, "{verify");
  EXPECT_EQ(
      bad_json.rfind("generate plugin " + Abs(PLUGIN_GOOD) + ": its config is not valid JSON: ", 0),
      0u)
      << bad_json;
}

// ---- generate: what comes out -----------------------------------------------------------------

TEST(PluginGenerate, TwoTurnsGiveExactSpansMasksAndLogProbs) {
  auto gen = Load(PLUGIN_GOOD);
  ASSERT_NE(gen, nullptr);
  FakeEngine engine;
  auto out = gen->Generate(MakeSample(11, {1, 2, 3}, "two_turns"), &engine);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->segments.size(), 1u);
  EXPECT_FALSE(out->rewarded);
  const Sample& s = out->segments[0];
  // answer 303 304 305 (stop) · injected 7 8 · second turn on 8 tokens, 2 allowed: 808 809.
  EXPECT_EQ(s.tokens, (std::vector<int32_t>{1, 2, 3, 303, 304, 305, 7, 8, 808, 809}));
  EXPECT_EQ(s.response_length, 7);
  EXPECT_EQ(s.loss_mask, (std::vector<uint8_t>{1, 1, 1, 0, 0, 1, 1}));
  EXPECT_EQ(s.rollout_log_probs,
            (std::vector<float>{-0.125f, -0.25f, -0.375f, 0.0f, 0.0f, -0.125f, -0.25f}));
  EXPECT_EQ(s.response, "303304305<v>808809");
  EXPECT_EQ(s.status, SampleStatus::kTruncated);
  EXPECT_EQ(s.weight_versions, (std::vector<std::string>{"v3", "v3"}));
  EXPECT_EQ(s.metadata.dump(), R"({"mode":"two_turns","turns":2})");
  EXPECT_EQ(s.index, 11);
  EXPECT_EQ(s.group_index, 5);
  EXPECT_EQ(s.rollout_id, 4);
  EXPECT_EQ(s.label, "3");
  EXPECT_EQ(s.prompt_text, "what is 1+2?");
  // What the engine was asked.
  ASSERT_EQ(engine.calls.size(), 2u);
  EXPECT_EQ(engine.calls[0], (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(engine.calls[1], (std::vector<int32_t>{1, 2, 3, 303, 304, 305, 7, 8}));
  EXPECT_EQ(engine.call_overrides[0].dump(), "{}");
  EXPECT_EQ(engine.call_overrides[1].dump(), R"({"max_new_tokens":2})");
}

TEST(PluginGenerate, SegmentsAndRewards) {
  auto gen = Load(PLUGIN_GOOD);
  ASSERT_NE(gen, nullptr);
  FakeEngine engine;
  auto out = gen->Generate(MakeSample(11, {5, 6}, "segments"), &engine);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(out->rewarded);
  ASSERT_EQ(out->segments.size(), 2u);
  const Sample& a = out->segments[0];
  EXPECT_EQ(a.tokens, (std::vector<int32_t>{5, 6, 206, 207, 208}));
  EXPECT_EQ(a.response_length, 3);
  EXPECT_EQ(a.loss_mask, (std::vector<uint8_t>{1, 1, 1}));
  EXPECT_EQ(a.rollout_log_probs, (std::vector<float>{-0.125f, -0.25f, -0.375f}));
  EXPECT_EQ(a.reward, 1.0);
  EXPECT_EQ(a.raw_reward.dump(), R"({"acc":true})");
  EXPECT_EQ(a.status, SampleStatus::kCompleted);
  // Segment 1's prompt is the first turn's whole context: 5 tokens, last 208 → 708 709 710.
  const Sample& b = out->segments[1];
  EXPECT_EQ(b.tokens, (std::vector<int32_t>{5, 6, 206, 207, 208, 708, 709, 710}));
  EXPECT_EQ(b.PromptLength(), 5);
  EXPECT_EQ(b.response, "708709710");
  EXPECT_EQ(b.reward, 0.5);
  EXPECT_EQ(b.raw_reward.dump(), "0.5");
  EXPECT_EQ(b.status, SampleStatus::kTruncated);
  EXPECT_EQ(b.index, 11);
  EXPECT_EQ(b.group_index, 5);
}

TEST(PluginGenerate, AnEngineCallMayReadThePreviousTurn) {
  // The second call's input ids point into the first turn's memory, which must stay valid
  // until that call has read them (valgrind would flag it otherwise).
  auto gen = Load(PLUGIN_GOOD);
  ASSERT_NE(gen, nullptr);
  FakeEngine engine;
  auto out = gen->Generate(MakeSample(2, {9}, "chain"), &engine);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(engine.calls.size(), 2u);
  EXPECT_EQ(engine.calls[1], (std::vector<int32_t>{109, 110, 111}));
  // 3 input ids, last 111 → 411 412 413.
  EXPECT_EQ(out->segments[0].tokens, (std::vector<int32_t>{9, 411, 412, 413}));
  EXPECT_EQ(out->segments[0].status, SampleStatus::kCompleted);
}

TEST(PluginGenerate, InputsReachThePlugin) {
  // The aborting mode echoes engine->aborting(); the sampling params are checked through the
  // example (max_context_len) below.
  auto gen = Load(PLUGIN_GOOD);
  ASSERT_NE(gen, nullptr);
  FakeEngine engine;
  engine.abort_flag = true;
  auto out = gen->Generate(MakeSample(3, {1}, "aborting"), &engine);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->segments[0].status, SampleStatus::kAborted);
  EXPECT_EQ(out->segments[0].metadata["aborting"].get<int>(), 1);
  EXPECT_EQ(out->segments[0].response_length, 0);
  engine.abort_flag = false;
  out = gen->Generate(MakeSample(3, {1}, "aborting"), &engine);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->segments[0].metadata["aborting"].get<int>(), 0);
}

TEST(PluginGenerate, SamplingParamsJsonUsesSglangNames) {
  rollout::SamplingOptions s;
  s.temperature = 0.7;
  s.top_k = 20;
  s.max_response_len = 64;
  s.max_context_len = 512;
  s.stop = {"</s>"};
  s.stop_token_ids = {2};
  EXPECT_EQ(SamplingParamsJson(s), (nlohmann::json{{"temperature", 0.7},
                                                   {"top_p", 1.0},
                                                   {"top_k", 20},
                                                   {"skip_special_tokens", false},
                                                   {"max_new_tokens", 64},
                                                   {"max_context_len", 512},
                                                   {"stop", {"</s>"}},
                                                   {"stop_token_ids", {2}}}));
}

// ---- generate: errors ---------------------------------------------------------------------------

class PluginErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    gen_ = Load(PLUGIN_GOOD);
    ASSERT_NE(gen_, nullptr);
  }
  Status Gen(const std::string& mode, std::vector<int32_t> prompt = {1, 2, 3}) {
    return gen_->Generate(MakeSample(11, std::move(prompt), mode), &engine_).status();
  }
  std::string Who() const { return "generate plugin 'test' 0.1 (" + Abs(PLUGIN_GOOD) + "): "; }

  std::unique_ptr<CustomGenerator> gen_;
  FakeEngine engine_;
};

TEST_F(PluginErrors, LogProbCountMismatch) {
  const Status st = Gen("bad_logprobs");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(),
            Who() + "sample 11: bad output: segment 0: append_span: 2 log-probs for 3 ids");
}

TEST_F(PluginErrors, MissingOrUnknownStatus) {
  EXPECT_EQ(Gen("no_status").message(),
            Who() + "sample 11: bad output: segment 0 has no status (call set_status)");
  EXPECT_EQ(Gen("bad_status").message(),
            Who() +
                "sample 11: bad output: segment 0: set_status: unknown status 9 (expected "
                "SLIME_GENERATE_STATUS_COMPLETED 1, TRUNCATED 2, ABORTED 3 or FAILED 4)");
  EXPECT_EQ(Gen("nothing").message(),
            Who() +
                "sample 11: bad output: generate returned without building a segment "
                "(append the response and call set_status)");
}

TEST_F(PluginErrors, RewardOnSomeSegmentsOnly) {
  EXPECT_EQ(Gen("rewards_partial").message(),
            Who() +
                "sample 11: bad output: a reward was set on segment(s) 0 but not on 1 (set it "
                "on every segment, or on none to use the reward model)");
}

TEST_F(PluginErrors, PluginAndEngineErrors) {
  Status st = Gen("error");
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(st.message(), Who() + "sample 11: generate returned 5: the judge service is down");
  EXPECT_EQ(Gen("engine_error").message(),
            Who() +
                "sample 11: generate returned 1: engine->generate: overrides must be a JSON "
                "object, got: [1]");
  // An engine failure passed on keeps the engine's code (a lost engine stays Unavailable).
  st = Gen("two_turns", {1, 666});
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(st.message(), Who() + "sample 11: generate returned 1: engine 127.0.0.1:1 is gone");
  // Unknown mode: the metadata reached the plugin as JSON.
  EXPECT_EQ(Gen("zzz").message(),
            Who() + R"(sample 11: generate returned 1: unknown mode in metadata {"mode":"zzz"})");
}

// ---- the example plugin -------------------------------------------------------------------------

constexpr char kSelfCheckConfig[] =
    R"({"verify_ids": [50, 51, 52], "verify_text": " Check:", "verify_max_new_tokens": 4})";

TEST(SelfCheckPlugin, AnswerThenVerify) {
  auto gen = Load(PLUGIN_SELF_CHECK, kSelfCheckConfig);
  ASSERT_NE(gen, nullptr);
  FakeEngine engine;
  auto out = gen->Generate(MakeSample(8, {4, 5}, "-"), &engine);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->segments.size(), 1u);
  EXPECT_FALSE(out->rewarded);
  const Sample& s = out->segments[0];
  // answer on [4 5]: 205 206 207; verify on 8 tokens: 852 853 854, "stop".
  EXPECT_EQ(s.tokens, (std::vector<int32_t>{4, 5, 205, 206, 207, 50, 51, 52, 852, 853, 854}));
  EXPECT_EQ(s.loss_mask, (std::vector<uint8_t>{1, 1, 1, 0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(s.rollout_log_probs,
            (std::vector<float>{-0.125f, -0.25f, -0.375f, 0, 0, 0, -0.125f, -0.25f, -0.375f}));
  EXPECT_EQ(s.response, "205206207 Check:852853854");
  EXPECT_EQ(s.status, SampleStatus::kCompleted);
  EXPECT_EQ(s.metadata["self_check"].dump(), R"({"answer_tokens":3,"verify_tokens":3})");
  ASSERT_EQ(engine.call_overrides.size(), 2u);
  EXPECT_EQ(engine.call_overrides[0].dump(), "{}");
  EXPECT_EQ(engine.call_overrides[1].dump(), R"({"max_new_tokens":4})");
}

TEST(SelfCheckPlugin, TruncatedAnswerOrNoRoomIsNotVerified) {
  auto gen = Load(PLUGIN_SELF_CHECK, R"({"verify_ids": [50, 51, 52], "answer_max_new_tokens": 2})");
  ASSERT_NE(gen, nullptr);
  FakeEngine engine;
  auto out = gen->Generate(MakeSample(8, {4, 5}, "-"), &engine);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->segments[0].tokens, (std::vector<int32_t>{4, 5, 205, 206}));
  EXPECT_EQ(out->segments[0].status, SampleStatus::kTruncated);
  EXPECT_EQ(engine.calls.size(), 1u);

  // Context cap 8: 2 prompt + 3 answer + 3 instruction leaves no room for a verification.
  gen = Load(PLUGIN_SELF_CHECK, kSelfCheckConfig);
  FakeEngine capped;
  capped.sampling_options.max_context_len = 8;
  out = gen->Generate(MakeSample(8, {4, 5}, "-"), &capped);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->segments[0].tokens, (std::vector<int32_t>{4, 5, 205, 206, 207}));
  EXPECT_EQ(out->segments[0].status, SampleStatus::kTruncated);
  EXPECT_EQ(capped.calls.size(), 1u);

  FakeEngine aborting;
  aborting.abort_flag = true;
  out = gen->Generate(MakeSample(8, {4, 5}, "-"), &aborting);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->segments[0].status, SampleStatus::kAborted);
  EXPECT_EQ(aborting.calls.size(), 0u);
}

// ---- threads ------------------------------------------------------------------------------------

TEST(PluginThreads, ConcurrentGenerateCallsStayApart) {
  auto test_plugin = Load(PLUGIN_GOOD);
  auto self_check = Load(PLUGIN_SELF_CHECK, kSelfCheckConfig);
  ASSERT_NE(test_plugin, nullptr);
  ASSERT_NE(self_check, nullptr);
  constexpr int kThreads = 8;
  constexpr int kPerThread = 40;
  std::atomic<int> mismatches{0};
  std::atomic<int> done{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        FakeEngine engine;
        const int32_t a = 1000 + t * 100 + i;
        std::vector<int32_t> prompt(1 + (i % 4), a);
        const bool example = (i + t) % 2 == 0;
        auto out = (example ? self_check : test_plugin)
                       ->Generate(MakeSample(t * kPerThread + i, prompt, "two_turns"), &engine);
        if (!out.ok() || out->segments.size() != 1) {
          ++mismatches;
          continue;
        }
        // The expected response, computed from the engine's rule.
        const std::vector<int32_t> inject =
            example ? std::vector<int32_t>{50, 51, 52} : std::vector<int32_t>{7, 8};
        std::vector<int32_t> expected = prompt;
        GenerateTurn first = FakeEngine::Answer(prompt, 3);
        expected.insert(expected.end(), first.output_ids.begin(), first.output_ids.end());
        expected.insert(expected.end(), inject.begin(), inject.end());
        GenerateTurn second = FakeEngine::Answer(expected, example ? 4 : 2);
        expected.insert(expected.end(), second.output_ids.begin(), second.output_ids.end());
        const Sample& s = out->segments[0];
        if (s.tokens != expected || s.index != t * kPerThread + i ||
            s.rollout_log_probs.size() != static_cast<size_t>(s.response_length)) {
          ++mismatches;
        }
        ++done;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(done.load(), kThreads * kPerThread);
}

}  // namespace
}  // namespace slime::plugin
