// The OPD teacher against real engines behind their real HTTP servers (tiny random-weight Qwen3
// models on CPU): the teacher client's log-probs are the teacher model's own — computed here
// with the model library's forward, log_softmax(logits / T) at each response position — and
// those the teacher engine reported while generating the same tokens; the rollout coordinator
// asks the teacher for every generated training sample (a different model generates), not for
// eval samples, leaves rewards unscored in pure distillation, and fails a rollout whose teacher
// is unreachable naming the URL and the sample.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <map>

#include "nlohmann/json.hpp"
#include "remove_tree.h"
#include "slime/engine/engine.h"
#include "slime/engine/server.h"
#include "slime/http/client.h"
#include "slime/http/server.h"
#include "slime/metrics/registry.h"
#include "slime/model/decoder.h"
#include "slime/model/init_random_model.h"
#include "slime/reward/reward.h"
#include "slime/rollout/coordinator.h"
#include "slime/rollout/teacher.h"
#include "test_paths.h"

namespace slime::rollout {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;
using slime::testing::SourceDir;

struct EngineUnderTest {
  std::unique_ptr<metrics::Registry> registry;
  std::unique_ptr<engine::Engine> engine;
  std::unique_ptr<engine::EngineServer> server;
  std::string url() const { return "http://127.0.0.1:" + std::to_string(server->port()); }
};

StatusOr<std::unique_ptr<EngineUnderTest>> StartEngine(const std::string& model_dir) {
  auto e = std::make_unique<EngineUnderTest>();
  e->registry = std::make_unique<metrics::Registry>();
  engine::EngineOptions o;
  o.model_path = model_dir;
  o.device = "cpu";
  o.dtype = "float32";
  o.page_size = 4;
  o.max_total_tokens = 8192;
  o.context_length = 256;
  o.random_seed = 1;
  o.metrics = e->registry.get();
  SLIME_ASSIGN_OR_RETURN(e->engine, engine::Engine::Create(o));
  engine::EngineServerOptions so;
  so.port = 0;
  SLIME_ASSIGN_OR_RETURN(e->server,
                         engine::EngineServer::Start(e->engine.get(), e->registry.get(), so));
  return e;
}

// Prompt groups of `n` samples over fixed prompt ids.
class FixedSource : public GroupSource {
 public:
  explicit FixedSource(int n) : n_(n) {}
  StatusOr<std::vector<data::SampleGroup>> GetSamples(int64_t k) override {
    std::vector<data::SampleGroup> out;
    for (int64_t g = 0; g < k; ++g, ++group_) {
      data::SampleGroup group;
      for (int j = 0; j < n_; ++j) {
        data::Sample s;
        s.group_index = group_;
        s.index = next_++;
        s.tokens = {151644, 872, 198, static_cast<int32_t>(1000 + group_), 151645, 198};
        s.prompt_text = "p";
        s.label = "x";
        group.push_back(std::move(s));
      }
      out.push_back(std::move(group));
    }
    return out;
  }

 private:
  int n_;
  int64_t group_ = 0;
  int64_t next_ = 0;
};

class TeacherEngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string tok = SourceDir() + "/.cache/testdata/qwen3";
    if (!fs::exists(tok + "/tokenizer.json")) {
      skip_ = "Qwen3 tokenizer missing at " + tok + ": run scripts/fetch_test_data.sh";
      return;
    }
    root_ =
        (fs::temp_directory_path() / ("slime-teacher-test-" + std::to_string(::getpid()))).string();
    testing::RemoveTree(root_);
    const std::string config = SourceDir() + "/tests/data/model/configs/qwen3-engine-test.json";
    for (const char* name : {"student", "teacher"}) {
      const uint64_t seed = std::string(name) == "student" ? 0 : 1;
      Status s = model::InitRandomModel(config, tok, root_ + "/" + name, seed, "fp32");
      ASSERT_TRUE(s.ok()) << s;
      auto e = StartEngine(root_ + "/" + name);
      ASSERT_TRUE(e.ok()) << e.status();
      (std::string(name) == "student" ? student_ : teacher_) = e->release();
    }
  }
  static void TearDownTestSuite() {
    for (EngineUnderTest* e : {student_, teacher_}) {
      if (e == nullptr) continue;
      e->server->Stop();
      delete e;
    }
    student_ = teacher_ = nullptr;
    if (!root_.empty()) testing::RemoveTree(root_);
  }
  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    ASSERT_NE(teacher_, nullptr) << "the engines did not start (see the suite set-up)";
  }

  static TeacherOptions Teacher(const std::string& url, double temperature) {
    TeacherOptions o;
    o.url = url;
    o.temperature = temperature;
    o.timeout = std::chrono::seconds(60);
    o.max_attempts = 2;
    o.backoff_initial = std::chrono::milliseconds(10);
    o.backoff_max = std::chrono::milliseconds(20);
    return o;
  }

  // Model `name`'s own log-probs of tokens[p:] under log_softmax(logits / temperature).
  static std::vector<float> ReferenceLogProbs(const std::string& name,
                                              const std::vector<int32_t>& tokens, int64_t p,
                                              double temperature) {
    static std::map<std::string, std::unique_ptr<model::DecoderModel>> models;
    auto& m = models[name];
    if (m == nullptr) {
      auto loaded = model::DecoderModel::Load(root_ + "/" + name, torch::kFloat32, torch::kCPU);
      EXPECT_TRUE(loaded.ok()) << loaded.status();
      if (!loaded.ok()) return {};
      m = std::move(*loaded);
    }
    torch::NoGradGuard no_grad;
    torch::Tensor ids = torch::tensor(std::vector<int64_t>(tokens.begin(), tokens.end()));
    const int64_t t = ids.size(0);
    auto hidden = m->ForwardPacked(ids, {0, t});
    EXPECT_TRUE(hidden.ok()) << hidden.status();
    if (!hidden.ok()) return {};
    auto logits = m->Logits(*hidden);
    EXPECT_TRUE(logits.ok()) << logits.status();
    if (!logits.ok()) return {};
    torch::Tensor lps = torch::log_softmax(logits->to(torch::kFloat32) / temperature, -1);
    std::vector<float> out;
    for (int64_t q = p; q < t; ++q) out.push_back(lps[q - 1][tokens[q]].item<float>());
    return out;
  }

  static std::string skip_;
  static std::string root_;
  static EngineUnderTest* student_;
  static EngineUnderTest* teacher_;
};
std::string TeacherEngineTest::skip_;
std::string TeacherEngineTest::root_;
EngineUnderTest* TeacherEngineTest::student_ = nullptr;
EngineUnderTest* TeacherEngineTest::teacher_ = nullptr;

TEST_F(TeacherEngineTest, LogProbsAreTheTeacherModelsOwn) {
  for (double temperature : {1.0, 0.6}) {
    SCOPED_TRACE("temperature " + std::to_string(temperature));
    data::Sample s;
    s.index = 4;
    s.tokens = {151644, 872, 198, 9707, 11, 1879, 0, 151645, 198, 77091, 198, 40, 1079, 264, 1273};
    s.response_length = 5;  // "I am a test"-like ids after the assistant header
    s.loss_mask.assign(5, 1);
    s.status = data::SampleStatus::kCompleted;
    auto client = TeacherClient::Create(Teacher(teacher_->url(), temperature));
    ASSERT_TRUE(client.ok()) << client.status();
    auto got = (*client)->ResponseLogProbs(s);
    ASSERT_TRUE(got.ok()) << got.status();
    const std::vector<float> want =
        ReferenceLogProbs("teacher", s.tokens, s.PromptLength(), temperature);
    ASSERT_EQ(got->size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR((*got)[i], want[i], 1e-4) << i;
    // The check can tell the models apart: the student's numbers differ.
    const std::vector<float> student =
        ReferenceLogProbs("student", s.tokens, s.PromptLength(), temperature);
    float diff = 0;
    for (size_t i = 0; i < want.size(); ++i) diff += std::abs(student[i] - want[i]);
    EXPECT_GT(diff, 1e-3);
  }
}

TEST_F(TeacherEngineTest, LogProbsMatchWhatTheTeacherReportedWhileGeneratingThem) {
  // The teacher engine samples a response at T = 0.8 and reports each token's log-prob; scoring
  // prompt + that response afterwards (prefill only) gives the same numbers.
  const std::vector<int32_t> prompt = {151644, 872, 198, 2500, 151645, 198, 151644, 77091, 198};
  http::Client http("127.0.0.1", teacher_->server->port());
  json req = {
      {"input_ids", prompt},
      {"sampling_params",
       {{"temperature", 0.8}, {"max_new_tokens", 8}, {"ignore_eos", true}, {"sampling_seed", 5}}},
      {"return_logprob", true}};
  auto resp = http.Post("/generate", req.dump());
  ASSERT_TRUE(resp.ok()) << resp.status();
  ASSERT_EQ(resp->status, 200) << resp->body;
  const json out = json::parse(resp->body);
  data::Sample s;
  s.index = 9;
  s.tokens = prompt;
  std::vector<float> generated;
  for (const json& t : out["meta_info"]["output_token_logprobs"]) {
    s.tokens.push_back(t[1].get<int32_t>());
    generated.push_back(t[0].get<float>());
  }
  s.response_length = static_cast<int64_t>(generated.size());
  ASSERT_EQ(s.response_length, 8);
  s.loss_mask.assign(8, 1);
  s.status = data::SampleStatus::kTruncated;
  auto client = TeacherClient::Create(Teacher(teacher_->url() + "/generate", 0.8));
  ASSERT_TRUE(client.ok()) << client.status();
  auto got = (*client)->ResponseLogProbs(s);
  ASSERT_TRUE(got.ok()) << got.status();
  for (size_t i = 0; i < generated.size(); ++i) EXPECT_NEAR((*got)[i], generated[i], 1e-4) << i;
}

TEST_F(TeacherEngineTest, TheCoordinatorScoresEveryTrainingSampleWithTheTeacher) {
  reward::RewardOptions ro;
  ro.rm_type = "exact_match";
  auto rm = reward::RewardModel::Create(ro);
  ASSERT_TRUE(rm.ok()) << rm.status();
  FixedSource source(3);
  RolloutOptions o;
  o.engines.addresses = {student_->url()};
  o.engines.max_attempts = 2;
  o.rollout_batch_size = 2;
  o.n_samples_per_prompt = 3;
  o.sampling.max_response_len = 6;
  o.sampling.temperature = 0.9;
  o.deterministic = true;
  o.teacher = Teacher(teacher_->url(), 0.9);
  o.score_rewards = false;  // pure distillation
  EvalDataset eval;
  eval.name = "held_out";
  data::Sample prompt;
  prompt.tokens = {151644, 872, 198, 5000, 151645, 198};
  prompt.label = "x";
  eval.prompts = {prompt};
  eval.n_samples = 2;
  eval.sampling.max_response_len = 4;
  RolloutCoordinator c;
  ASSERT_TRUE(c.Configure(o, &source, rm->get(), {eval}).ok());
  auto r = c.Generate(0);
  ASSERT_TRUE(r.ok()) << r.status();
  auto client = TeacherClient::Create(Teacher(teacher_->url(), 0.9));
  ASSERT_TRUE(client.ok()) << client.status();
  int samples = 0;
  for (const data::SampleGroup& g : r->groups) {
    for (const data::Sample& s : g) {
      ++samples;
      ASSERT_GT(s.response_length, 0);
      ASSERT_EQ(static_cast<int64_t>(s.teacher_log_probs.size()), s.response_length) << s.index;
      // The teacher's numbers, not the generating student's.
      auto again = (*client)->ResponseLogProbs(s);
      ASSERT_TRUE(again.ok()) << again.status();
      for (size_t i = 0; i < again->size(); ++i) {
        EXPECT_NEAR(s.teacher_log_probs[i], (*again)[i], 1e-4) << s.index;
      }
      const std::vector<float> want = ReferenceLogProbs("teacher", s.tokens, s.PromptLength(), 0.9);
      for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(s.teacher_log_probs[i], want[i], 1e-4);
      float gap = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        gap += std::abs(s.teacher_log_probs[i] - s.rollout_log_probs[i]);
      }
      EXPECT_GT(gap, 1e-3) << "teacher and student are different models";
      EXPECT_TRUE(s.raw_reward.is_null()) << "pure distillation scores no reward";
      EXPECT_EQ(s.reward, 0.0);
    }
  }
  EXPECT_EQ(samples, 6);
  // Eval samples are scored by the reward model, never sent to the teacher.
  auto e = c.Eval(0);
  ASSERT_TRUE(e.ok()) << e.status();
  for (const auto& g : e->datasets.at("held_out")) {
    for (const auto& s : g) {
      EXPECT_TRUE(s.teacher_log_probs.empty());
      EXPECT_FALSE(s.raw_reward.is_null());
    }
  }
}

TEST_F(TeacherEngineTest, AnUnreachableTeacherFailsTheRolloutNamingItAndTheSample) {
  int port = 0;
  {
    auto s = http::Server::Start({}, http::Router());
    ASSERT_TRUE(s.ok());
    port = (*s)->port();
  }
  const std::string url = "http://127.0.0.1:" + std::to_string(port);
  reward::RewardOptions ro;
  ro.rm_type = "exact_match";
  auto rm = reward::RewardModel::Create(ro);
  ASSERT_TRUE(rm.ok()) << rm.status();
  FixedSource source(2);
  RolloutOptions o;
  o.engines.addresses = {student_->url()};
  o.rollout_batch_size = 1;
  o.n_samples_per_prompt = 2;
  o.sampling.max_response_len = 3;
  o.teacher = Teacher(url, 1.0);
  RolloutCoordinator c;
  ASSERT_TRUE(c.Configure(o, &source, rm->get()).ok());
  auto r = c.Generate(0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_NE(r.status().message().find("OPD teacher " + url), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("sample "), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("after 2 attempts"), std::string::npos) << r.status();
}

}  // namespace
}  // namespace slime::rollout
