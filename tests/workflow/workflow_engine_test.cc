// Custom generation against a real engine behind its HTTP server (tiny random-weight Qwen3 on
// CPU, real Qwen3 tokenizer) through the real RolloutCoordinator:
//   * a multi-turn episode against the example calculator environment over real HTTP gives
//     exactly the expected tokens, loss masks and log-probs — the prompt and the observations
//     rendered here independently (ChatML literals), the model's turns from the engine's own
//     answers (recorded at the EngineSession);
//   * segments replace their sample (fresh indices, metadata.segment), `rewarded` skips the
//     reward model, rewards are post-processed per group over the parent samples;
//   * an abort in the middle of an episode ends the rollout promptly; later engine calls
//     return an empty "abort" turn at once;
//   * environments that return garbage or hang are handled per on_env_error (fail, drop,
//     zero_reward) and never hang the rollout.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "nlohmann/json.hpp"
#include "remove_tree.h"
#include "slime/data/prompt_dataset.h"
#include "slime/engine/engine.h"
#include "slime/engine/server.h"
#include "slime/http/response_writer.h"
#include "slime/http/server.h"
#include "slime/metrics/registry.h"
#include "slime/model/init_random_model.h"
#include "slime/reward/reward.h"
#include "slime/rollout/coordinator.h"
#include "slime/tokenizer/tokenizer.h"
#include "slime/workflow/calculator_env.h"
#include "slime/workflow/env_client.h"
#include "slime/workflow/env_generator.h"
#include "test_engine.h"
#include "test_paths.h"

namespace slime::workflow {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;
namespace fs = std::filesystem;
using namespace std::chrono_literals;
using rollout::CustomGenerateResult;
using rollout::CustomGenerator;
using rollout::EngineSession;
using rollout::GenerateTurn;

using slime::testing::SourceDir;

// The calculator environment's reminder when a turn has neither a tool call nor an answer.
constexpr char kReminder[] =
    "No tool call and no final answer. Call the calculator tool, or reply \"Answer: <number>\".";

// Forwards to the coordinator's session and records every call.
struct RecordedCall {
  std::vector<int32_t> input_ids;
  json overrides;
  GenerateTurn turn;
  double seconds = 0;
};
class RecordingSession : public EngineSession {
 public:
  explicit RecordingSession(EngineSession* inner) : inner_(inner) {}
  StatusOr<GenerateTurn> Generate(std::span<const int32_t> ids, const json& overrides) override {
    const auto start = std::chrono::steady_clock::now();
    StatusOr<GenerateTurn> t = inner_->Generate(ids, overrides);
    if (t.ok()) {
      calls.push_back(
          {std::vector<int32_t>(ids.begin(), ids.end()), overrides, *t,
           std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()});
    }
    return t;
  }
  const rollout::SamplingOptions& sampling() const override { return inner_->sampling(); }
  bool aborting() const override { return inner_->aborting(); }
  std::string engine_address() const override { return inner_->engine_address(); }
  std::string request_id() const override { return inner_->request_id(); }
  std::vector<RecordedCall> calls;

 private:
  EngineSession* inner_;
};

// Runs `inner` with a recording session; the calls by sample index.
class Recorder : public CustomGenerator {
 public:
  explicit Recorder(std::shared_ptr<CustomGenerator> inner) : inner_(std::move(inner)) {}
  std::string kind() const override { return inner_->kind(); }
  StatusOr<CustomGenerateResult> Generate(const data::Sample& sample,
                                          EngineSession* session) override {
    RecordingSession recording(session);
    StatusOr<CustomGenerateResult> r = inner_->Generate(sample, &recording);
    std::lock_guard<std::mutex> lock(mu);
    calls[sample.index] = std::move(recording.calls);
    return r;
  }
  std::mutex mu;
  std::map<int64_t, std::vector<RecordedCall>> calls;

 private:
  std::shared_ptr<CustomGenerator> inner_;
};

// An environment whose /reset answers garbage ("garbage") or whose /step never answers
// ("stephang").
class BrokenEnv {
 public:
  explicit BrokenEnv(const std::string& mode) {
    http::Router router;
    router.Add("POST", "/reset",
               [mode](const http::Request&, std::shared_ptr<http::ResponseWriter> w) {
                 if (mode == "garbage") return w->Send(200, "{\"episode_id\": ", "text/plain");
                 w->SendJson(200, json{{"episode_id", "e1"}, {"observation", "Say something."}});
               });
    router.Add("POST", "/step",
               [this](const http::Request&, std::shared_ptr<http::ResponseWriter> w) {
                 std::lock_guard<std::mutex> lock(mu_);
                 parked_.push_back(std::move(w));
               });
    server_ = *http::Server::Start({}, std::move(router));
  }
  ~BrokenEnv() { server_->Stop(); }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(server_->port()); }

 private:
  std::mutex mu_;
  std::vector<std::shared_ptr<http::ResponseWriter>> parked_;
  std::unique_ptr<http::Server> server_;
};

class WorkflowEngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string tok = SourceDir() + "/.cache/testdata/qwen3";
    if (!fs::exists(tok + "/tokenizer.json")) {
      skip_ = "Qwen3 tokenizer missing at " + tok + ": run scripts/fetch_test_data.sh";
      return;
    }
    model_dir_ = (fs::temp_directory_path() / ("slime-workflow-test-" + std::to_string(::getpid())))
                     .string();
    testing::RemoveTree(model_dir_);
    Status s =
        model::InitRandomModel(SourceDir() + "/tests/data/model/configs/qwen3-engine-test.json",
                               tok, model_dir_, 0, "fp32");
    ASSERT_TRUE(s.ok()) << s;
    auto e = slime::testing::StartTestEngine({.model_dir = model_dir_, .weight_version = "w1"});
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = e->release();
    auto env = CalculatorEnv::Start({}, {});
    ASSERT_TRUE(env.ok()) << env.status();
    env_ = env->release();
  }
  static void TearDownTestSuite() {
    if (env_ != nullptr) env_->Stop();
    delete env_;
    if (engine_ != nullptr) engine_->server->Stop();
    delete engine_;
    if (!model_dir_.empty()) testing::RemoveTree(model_dir_);
  }
  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    ASSERT_NE(engine_, nullptr);
    reward::RewardOptions ro;
    ro.rm_type = "exact_match";
    auto rm = reward::RewardModel::Create(ro);
    ASSERT_TRUE(rm.ok()) << rm.status();
    reward_ = std::move(*rm);
  }

  const tokenizer::Tokenizer& tok() const { return engine_->engine->tokenizer(); }

  std::unique_ptr<data::PromptDataSource> Source(int prompts, int n) {
    std::string text;
    for (int i = 0; i < prompts; ++i) {
      text += json{{"input", "Question " + std::to_string(i)}, {"label", "x"}}.dump() + "\n";
    }
    data::PromptDatasetOptions po;
    po.label_key = "label";
    auto ds = data::PromptDataset::Parse(text, "test.jsonl", tok(), po);
    EXPECT_TRUE(ds.ok()) << ds.status();
    dataset_ = std::make_shared<const data::PromptDataset>(std::move(*ds));
    data::PromptDataSourceOptions so;
    so.n_samples_per_prompt = n;
    auto src = data::PromptDataSource::Create(dataset_, so);
    EXPECT_TRUE(src.ok()) << src.status();
    return std::make_unique<data::PromptDataSource>(std::move(*src));
  }

  rollout::RolloutOptions Options(int batch, int n) {
    rollout::RolloutOptions o;
    o.engines.addresses = {engine_->url()};
    o.engines.max_attempts = 2;
    o.rollout_batch_size = batch;
    o.n_samples_per_prompt = n;
    o.sampling.max_response_len = 6;
    o.custom_generate_concurrency = 4;
    return o;
  }

  std::shared_ptr<EnvGenerator> Env(const std::string& url, OnEnvError policy,
                                    std::chrono::milliseconds timeout = 60s, int max_turns = 3) {
    EnvGeneratorOptions o;
    o.env_url = url;
    o.max_turns = max_turns;
    o.max_total_tokens = 400;
    o.episode_timeout = timeout;
    o.on_env_error = policy;
    auto g = EnvGenerator::Create(o, &tok());
    EXPECT_TRUE(g.ok()) << g.status();
    return g.ok() ? std::shared_ptr<EnvGenerator>(std::move(*g)) : nullptr;
  }

  static std::string skip_;
  static std::string model_dir_;
  static slime::testing::TestEngine* engine_;
  static CalculatorEnv* env_;
  std::shared_ptr<const data::PromptDataset> dataset_;
  std::unique_ptr<reward::RewardModel> reward_;
};

std::string WorkflowEngineTest::skip_;
std::string WorkflowEngineTest::model_dir_;
slime::testing::TestEngine* WorkflowEngineTest::engine_ = nullptr;
CalculatorEnv* WorkflowEngineTest::env_ = nullptr;

TEST_F(WorkflowEngineTest, CalculatorEpisodeTokensMasksAndLogProbsAreExact) {
  auto source = Source(2, 2);
  rollout::PromptGroupSource groups(source.get());
  auto recorder = std::make_shared<Recorder>(Env(env_->url(), OnEnvError::kFail));
  rollout::RolloutCoordinator c;
  rollout::RolloutOptions o = Options(2, 2);
  o.custom_generator = recorder;
  ASSERT_TRUE(c.Configure(o, &groups, reward_.get()).ok());
  std::vector<rollout::RolloutProgress> progress;
  c.SetProgressCallback([&](const rollout::RolloutProgress& p) { progress.push_back(p); });
  auto result = c.Generate(0);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->groups.size(), 2u);

  const int32_t im_end = tok().Encode("<|im_end|>").at(0);
  EnvClient client(*ParseEnvUrl(env_->url()));
  int64_t total_tokens = 0;
  for (const auto& group : result->groups) {
    ASSERT_EQ(group.size(), 2u);
    for (const data::Sample& s : group) {
      SCOPED_TRACE("sample " + std::to_string(s.index));
      const std::vector<RecordedCall>& calls = recorder->calls.at(s.index);
      ASSERT_EQ(calls.size(), 3u) << "max_turns turns (the random model never answers)";
      // The prompt: the environment's first observation (same question for the same index)
      // and its tools, through the model's chat template.
      auto reset = client.Reset(s, 5s);
      ASSERT_TRUE(reset.ok()) << reset.status();
      ASSERT_TRUE(client.Close(reset->episode_id, 5s).ok());  // the test's own episode
      tokenizer::ChatTemplateOptions co;
      co.add_generation_prompt = true;
      co.tools = reset->tools;
      auto prompt_text = tok().ApplyChatTemplate(
          ojson::array({ojson{{"role", "user"}, {"content", reset->observation}}}), co);
      ASSERT_TRUE(prompt_text.ok()) << prompt_text.status();
      std::vector<int32_t> tokens = tok().Encode(*prompt_text);
      EXPECT_EQ(s.prompt_text, *prompt_text);
      std::vector<uint8_t> mask;
      std::vector<float> log_probs;
      for (size_t k = 0; k < calls.size(); ++k) {
        const GenerateTurn& t = calls[k].turn;
        EXPECT_EQ(calls[k].input_ids, tokens) << "turn " << k << " continues the episode";
        EXPECT_EQ(calls[k].overrides["max_new_tokens"].get<int64_t>(),
                  std::min<int64_t>(6, 400 - static_cast<int64_t>(tokens.size())));
        ASSERT_FALSE(t.output_ids.empty());
        ASSERT_EQ(t.log_probs.size(), t.output_ids.size());
        total_tokens += static_cast<int64_t>(t.output_ids.size());
        tokens.insert(tokens.end(), t.output_ids.begin(), t.output_ids.end());
        mask.insert(mask.end(), t.output_ids.size(), 1);
        log_probs.insert(log_probs.end(), t.log_probs.begin(), t.log_probs.end());
        if (k + 1 == calls.size()) break;  // no observation after the last turn
        const std::string obs = std::string(t.output_ids.back() == im_end ? "" : "<|im_end|>") +
                                "\n<|im_start|>user\n" + kReminder +
                                "<|im_end|>\n<|im_start|>assistant\n";
        const std::vector<int32_t> obs_ids = tok().Encode(obs);
        tokens.insert(tokens.end(), obs_ids.begin(), obs_ids.end());
        mask.insert(mask.end(), obs_ids.size(), 0);
        log_probs.insert(log_probs.end(), obs_ids.size(), 0.0f);
      }
      EXPECT_EQ(s.tokens, tokens);
      EXPECT_EQ(s.loss_mask, mask);
      EXPECT_EQ(s.rollout_log_probs, log_probs);
      EXPECT_EQ(s.response_length, static_cast<int64_t>(mask.size()));
      EXPECT_EQ(s.status, data::SampleStatus::kTruncated);
      EXPECT_EQ(s.reward, 0.0);
      EXPECT_EQ(s.metadata["env"]["turns"].get<int>(), 3);
      EXPECT_FALSE(s.metadata["env"]["done"].get<bool>());
      EXPECT_EQ(s.weight_versions, std::vector<std::string>(3, "w1"));
      EXPECT_TRUE(s.Validate().ok());
    }
  }
  ASSERT_FALSE(progress.empty());
  EXPECT_EQ(progress.back().samples_done, 4);
  EXPECT_EQ(progress.back().response_tokens, total_tokens);
  EXPECT_EQ(env_->open_episodes(), 0) << "every episode was closed";
}

// Two engine turns, returned as two segments; even samples rewarded by the generator.
class SplitGenerator : public CustomGenerator {
 public:
  std::string kind() const override { return "plugin"; }
  StatusOr<CustomGenerateResult> Generate(const data::Sample& sample,
                                          EngineSession* session) override {
    CustomGenerateResult r;
    data::Sample first = sample;
    SLIME_ASSIGN_OR_RETURN(GenerateTurn t1,
                           session->Generate(first.tokens, {{"max_new_tokens", 3}}));
    SLIME_RETURN_IF_ERROR(first.AppendResponse(t1.output_ids, t1.log_probs, true, t1.text));
    first.status = data::SampleStatus::kCompleted;
    data::Sample second = sample;
    second.tokens = first.tokens;
    SLIME_ASSIGN_OR_RETURN(GenerateTurn t2,
                           session->Generate(second.tokens, {{"max_new_tokens", 2}}));
    SLIME_RETURN_IF_ERROR(second.AppendResponse(t2.output_ids, t2.log_probs, true, t2.text));
    second.status = data::SampleStatus::kTruncated;
    r.rewarded = sample.index % 2 == 0;
    if (r.rewarded) {
      first.reward = static_cast<double>(sample.index);
      second.reward = static_cast<double>(sample.index) + 0.5;
    }
    r.segments = {std::move(first), std::move(second)};
    return r;
  }
};

TEST_F(WorkflowEngineTest, SegmentsReplaceTheSampleAndRewardedSkipsTheRewardModel) {
  auto source = Source(2, 3);
  rollout::PromptGroupSource groups(source.get());
  rollout::RolloutCoordinator c;
  rollout::RolloutOptions o = Options(2, 3);
  o.custom_generator = std::make_shared<SplitGenerator>();
  ASSERT_TRUE(c.Configure(o, &groups, reward_.get()).ok());
  int64_t done = 0;
  c.SetProgressCallback([&](const rollout::RolloutProgress& p) { done = p.samples_done; });
  auto result = c.Generate(0);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(done, 6) << "samples, not segments";
  ASSERT_EQ(result->groups.size(), 2u);
  std::set<int64_t> indices;
  size_t flat = 0;
  for (const auto& g : result->groups) {
    ASSERT_EQ(g.size(), 6u) << "3 samples × 2 segments";
    std::vector<double> raw;
    std::vector<double> parents;
    for (size_t k = 0; k < g.size(); ++k) {
      const data::Sample& s = g[k];
      const data::Sample& parent = g[k - k % 2];
      EXPECT_TRUE(indices.insert(s.index).second) << "index " << s.index << " twice";
      EXPECT_EQ(s.group_index, g.front().group_index);
      EXPECT_EQ(s.rollout_id, 0);
      EXPECT_TRUE(s.Validate().ok());
      const int64_t segment = s.metadata["segment"].get<int64_t>();
      EXPECT_EQ(segment, static_cast<int64_t>(k % 2));
      // Even samples: the generator's rewards; odd ones: exact_match against "x" (0).
      const bool rewarded = parent.index % 2 == 0;
      const double expected =
          rewarded ? static_cast<double>(parent.index) + (segment == 1 ? 0.5 : 0.0) : 0.0;
      EXPECT_EQ(s.reward, expected) << "k " << k;
      if (!rewarded) {
        EXPECT_FALSE(s.raw_reward.is_null()) << "scored by the reward model";
      }
      if (segment == 1) {
        EXPECT_GE(s.index, int64_t{1} << 48) << "a fresh index for a later segment";
        EXPECT_EQ(s.PromptLength(), static_cast<int64_t>(parent.tokens.size()));
        EXPECT_EQ(s.status, data::SampleStatus::kTruncated);
      } else {
        EXPECT_LT(s.index, 6);
        parents.push_back(s.reward);
      }
      raw.push_back(s.reward);
    }
    // GRPO over the parents (segment 0), applied to every segment.
    double mean = 0;
    for (double r : parents) mean += r;
    mean /= static_cast<double>(parents.size());
    double var = 0;
    for (double r : parents) var += (r - mean) * (r - mean);
    const double std = std::sqrt(var / static_cast<double>(parents.size() - 1));
    for (size_t k = 0; k < g.size(); ++k) {
      EXPECT_NEAR(result->rewards.at(flat + k), (raw[k] - mean) / (std + 1e-6), 1e-9);
      EXPECT_EQ(result->raw_rewards.at(flat + k), raw[k]);
    }
    flat += g.size();
  }
  EXPECT_EQ(result->rewards.size(), flat);
}

// Group 0: one short turn. Group 1: turns until the rollout is cut short, then one more call.
class AbortProbe : public CustomGenerator {
 public:
  std::string kind() const override { return "plugin"; }
  StatusOr<CustomGenerateResult> Generate(const data::Sample& sample,
                                          EngineSession* session) override {
    data::Sample s = sample;
    for (int turn = 0; turn < 500; ++turn) {
      const int64_t room = 500 - static_cast<int64_t>(s.tokens.size());
      if (room <= 0) s.tokens.resize(sample.tokens.size());  // start over: keep it going
      SLIME_ASSIGN_OR_RETURN(GenerateTurn t, session->Generate(s.tokens, {{"max_new_tokens", 16},
                                                                          {"ignore_eos", true}}));
      if (t.finish_reason == "abort") {
        const auto start = std::chrono::steady_clock::now();
        SLIME_ASSIGN_OR_RETURN(GenerateTurn again, session->Generate(s.tokens, json::object()));
        std::lock_guard<std::mutex> lock(mu);
        after_abort_reason = again.finish_reason;
        after_abort_ids = again.output_ids.size();
        after_abort_s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        aborted = true;
        s.status = data::SampleStatus::kAborted;
        return CustomGenerateResult{{s}, false};
      }
      if (sample.group_index == 0) {
        SLIME_RETURN_IF_ERROR(s.AppendResponse(t.output_ids, t.log_probs, true, t.text));
        s.status = data::SampleStatus::kCompleted;
        return CustomGenerateResult{{s}, false};
      }
      s.tokens.insert(s.tokens.end(), t.output_ids.begin(), t.output_ids.end());
    }
    return absl::InternalError("the rollout was never cut short");
  }
  std::mutex mu;
  bool aborted = false;
  std::string after_abort_reason;
  size_t after_abort_ids = 99;
  double after_abort_s = 99;
};

TEST_F(WorkflowEngineTest, AbortMidEpisodeEndsTheRolloutPromptly) {
  auto source = Source(2, 1);
  rollout::PromptGroupSource groups(source.get());
  rollout::RolloutCoordinator c;
  rollout::RolloutOptions o = Options(1, 1);
  o.over_sampling_batch_size = 2;
  auto probe = std::make_shared<AbortProbe>();
  o.custom_generator = probe;
  ASSERT_TRUE(c.Configure(o, &groups, reward_.get()).ok());
  const auto start = std::chrono::steady_clock::now();
  auto result = c.Generate(0);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_LT(seconds, 60);
  ASSERT_EQ(result->groups.size(), 1u);
  EXPECT_EQ(result->groups[0][0].group_index, 0);
  EXPECT_EQ(result->metrics.at("rollout/aborted_samples"), 1);
  EXPECT_TRUE(c.partial_rollout_buffer().empty()) << "aborted custom samples are not recycled";
  std::lock_guard<std::mutex> lock(probe->mu);
  EXPECT_TRUE(probe->aborted);
  EXPECT_EQ(probe->after_abort_reason, "abort");
  EXPECT_EQ(probe->after_abort_ids, 0u);
  EXPECT_LT(probe->after_abort_s, 0.05) << "after the abort a call returns at once";
}

TEST_F(WorkflowEngineTest, EnvironmentErrorsAreHandledPerPolicy) {
  BrokenEnv garbage("garbage");
  BrokenEnv hang("stephang");
  struct Case {
    std::string name;
    const BrokenEnv* env;
    OnEnvError policy;
  };
  for (const Case& k :
       {Case{"garbage/fail", &garbage, OnEnvError::kFail},
        Case{"garbage/drop", &garbage, OnEnvError::kDrop},
        Case{"garbage/zero_reward", &garbage, OnEnvError::kZeroReward},
        Case{"hang/fail", &hang, OnEnvError::kFail}, Case{"hang/drop", &hang, OnEnvError::kDrop},
        Case{"hang/zero_reward", &hang, OnEnvError::kZeroReward}}) {
    SCOPED_TRACE(k.name);
    auto source = Source(1, 2);
    rollout::PromptGroupSource groups(source.get());
    rollout::RolloutCoordinator c;
    rollout::RolloutOptions o = Options(1, 2);
    o.custom_generator = Env(k.env->url(), k.policy, 1500ms);
    ASSERT_TRUE(c.Configure(o, &groups, reward_.get()).ok());
    const auto start = std::chrono::steady_clock::now();
    auto result = c.Generate(0);
    EXPECT_LT(std::chrono::steady_clock::now() - start, 20s) << "never a hang";
    const bool hang_case = k.env == &hang;
    if (k.policy == OnEnvError::kFail) {
      ASSERT_FALSE(result.ok());
      const std::string m(result.status().message());
      EXPECT_NE(m.find(k.env->url()), std::string::npos) << m;
      EXPECT_NE(m.find("sample "), std::string::npos) << m;
      EXPECT_NE(m.find("on_env_error: fail"), std::string::npos) << m;
      if (hang_case) {
        EXPECT_TRUE(absl::IsDeadlineExceeded(result.status())) << m;
      }
      continue;
    }
    ASSERT_TRUE(result.ok()) << result.status();
    ASSERT_EQ(result->groups.size(), 1u);
    for (const data::Sample& s : result->groups[0]) {
      EXPECT_TRUE(s.Validate().ok());
      EXPECT_EQ(s.reward, 0.0);
      ASSERT_TRUE(s.metadata.contains("env_error"));
      EXPECT_NE(s.metadata["env_error"].get<std::string>().find(k.env->url()), std::string::npos);
      EXPECT_GE(s.response_length, 1) << "the trainer gets a response";
      if (hang_case) {
        EXPECT_EQ(s.loss_mask.front(), 1) << "the model's first turn was generated";
      } else {
        EXPECT_EQ(s.response_length, 1);
        EXPECT_EQ(s.loss_mask, std::vector<uint8_t>{0});
      }
      if (k.policy == OnEnvError::kDrop) {
        EXPECT_EQ(s.status, data::SampleStatus::kFailed);
        EXPECT_TRUE(s.remove_sample);
      } else {
        EXPECT_EQ(s.status, data::SampleStatus::kTruncated);
        EXPECT_FALSE(s.remove_sample);
      }
    }
  }
}

}  // namespace
}  // namespace slime::workflow
