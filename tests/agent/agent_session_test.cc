// The agent adapter over real HTTP with the real Qwen3 tokenizer and chat template:
//   * an unmodified agent written with the official `openai` npm client (openai_agent.cjs, run
//     by node through MakeAgentGenerator) drives a session — tool call, streamed answer, error
//     answers — and the recorded sample is checked token for token (ids, masks, log-probs);
//   * the endpoints' errors (unknown session / path / method, bad JSON, context limit, engine
//     error) through our HTTP client;
//   * the agent process's outcomes: timeout, nonzero exit, rollout abort, no model call.
// The engine is a scripted EngineSession (deterministic ids and log-probs): the engine is not
// what is under test here. Skips with a message without scripts/fetch_test_data.sh's tokenizer;
// fails (never skips) without node or the vendored openai package.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "remove_tree.h"
#include "slime/agent/agent_generator.h"
#include "slime/agent/session_server.h"
#include "slime/http/client.h"
#include "slime/rollout/coordinator.h"
#include "test_paths.h"

namespace slime::agent {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ojson = nlohmann::ordered_json;
using Ids = std::vector<int32_t>;
using namespace std::chrono_literals;

using slime::testing::SourceDir;

// node from $SLIME_NODE or $PATH; "" when absent.
std::string FindNode() {
  const char* env = std::getenv("SLIME_NODE");
  if (env != nullptr && *env != '\0') return env;
  std::stringstream path(std::getenv("PATH") != nullptr ? std::getenv("PATH") : "");
  std::string dir;
  while (std::getline(path, dir, ':')) {
    fs::path candidate = fs::path(dir) / "node";
    if (!dir.empty() && ::access(candidate.c_str(), X_OK) == 0) return candidate.string();
  }
  return "";
}

// True while `pid` exists and is not a zombie.
bool Running(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] != 'Z';
}

// A deterministic engine: call k answers script[k] (tokenized, then the end-of-turn id), with
// log-prob -(k + 1) / 10 - i / 100 for output token i. Records what it was asked.
class ScriptedEngine : public rollout::EngineSession {
 public:
  ScriptedEngine(const tokenizer::Tokenizer* tok, std::vector<std::string> script)
      : tok_(tok), script_(std::move(script)) {}

  StatusOr<rollout::GenerateTurn> Generate(std::span<const int32_t> input_ids,
                                           const json& overrides) override {
    std::lock_guard<std::mutex> lock(mu_);
    inputs_.emplace_back(input_ids.begin(), input_ids.end());
    overrides_.push_back(overrides);
    if (!error_.ok()) return error_;
    rollout::GenerateTurn turn;
    if (aborting_) {
      turn.finish_reason = "abort";
      return turn;
    }
    const size_t k = inputs_.size() - 1;
    if (k >= script_.size()) return absl::InternalError("scripted engine: no answer left");
    turn.output_ids = tok_->Encode(script_[k]);
    turn.output_ids.push_back(*tok_->TokenToId("<|im_end|>"));
    for (size_t i = 0; i < turn.output_ids.size(); ++i) {
      turn.log_probs.push_back(-static_cast<float>(k + 1) / 10 - static_cast<float>(i) / 100);
    }
    turn.text = script_[k];
    turn.finish_reason = "stop";
    turn.weight_version = "v7";
    outputs_.push_back(turn);
    return turn;
  }
  const rollout::SamplingOptions& sampling() const override { return sampling_; }
  bool aborting() const override { return aborting_.load(); }
  std::string engine_address() const override { return "scripted:0"; }
  std::string request_id() const override { return "slime-rollout0-0-0"; }

  rollout::SamplingOptions sampling_;
  std::atomic<bool> aborting_{false};
  Status error_;
  std::vector<Ids> inputs() const {
    std::lock_guard<std::mutex> lock(mu_);
    return inputs_;
  }
  std::vector<rollout::GenerateTurn> outputs() const {
    std::lock_guard<std::mutex> lock(mu_);
    return outputs_;
  }
  std::vector<json> overrides() const {
    std::lock_guard<std::mutex> lock(mu_);
    return overrides_;
  }

 private:
  const tokenizer::Tokenizer* tok_;
  std::vector<std::string> script_;
  mutable std::mutex mu_;
  std::vector<Ids> inputs_;
  std::vector<json> overrides_;
  std::vector<rollout::GenerateTurn> outputs_;
};

const char* kToolsJson = R"([{"type": "function", "function": {"name": "add",
  "description": "Add two integers", "parameters": {"type": "object",
  "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}])";

// The model's tool call, written compactly: the chat template renders it back differently
// ({"name": "add", ...}), so the second prompt has re-tokenization drift unless spliced.
const char* kToolCallText =
    "<tool_call>\n{\"name\":\"add\",\"arguments\":{\"a\":2,\"b\":3}}\n</tool_call>";

class AgentSessionTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string dir = SourceDir() + "/.cache/testdata/qwen3";
    if (!fs::exists(dir + "/tokenizer.json")) {
      skip_ = "Qwen3 tokenizer missing at " + dir + ": run scripts/fetch_test_data.sh";
      return;
    }
    auto tok = tokenizer::Tokenizer::FromDirectory(dir);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = std::shared_ptr<const tokenizer::Tokenizer>(std::move(*tok));
  }
  static void TearDownTestSuite() { tokenizer_.reset(); }

  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    scratch_ = (fs::temp_directory_path() /
                ("slime-agent-test-" + std::to_string(::getpid()) + "-" +
                 ::testing::UnitTest::GetInstance()->current_test_info()->name()))
                   .string();
    testing::RemoveTree(scratch_);
    fs::create_directories(scratch_);
  }
  void TearDown() override {
    if (!scratch_.empty()) testing::RemoveTree(scratch_);
  }

  AgentOptions Options(std::string command, double timeout_s = 60) {
    AgentOptions o;
    o.command = std::move(command);
    o.tokenizer = tokenizer_;
    o.timeout_s = timeout_s;
    o.log_dir = scratch_ + "/logs";
    o.server.model_name = "slime-test";
    return o;
  }

  static data::Sample TaskSample() {
    data::Sample s;
    s.group_index = 4;
    s.index = 9;
    s.prompt = "What is 2 + 3? Use the add tool.";
    s.label = "5";
    s.tokens = {1, 2, 3};
    s.metadata = {{"tools", ojson::parse(kToolsJson)}};
    return s;
  }

  static inline std::shared_ptr<const tokenizer::Tokenizer> tokenizer_;
  static inline std::string skip_;
  std::string scratch_;
};

TEST_F(AgentSessionTest, OpenAiNodeClientDrivesASessionAndTheSampleIsExact) {
  const std::string node = FindNode();
  ASSERT_FALSE(node.empty())
      << "node not found (PATH or SLIME_NODE): install nodejs (scripts/setup.sh); this test "
         "runs an agent written with the openai npm client";
  const std::string modules = SLIME_AGENT_NODE_MODULES;
  ASSERT_TRUE(fs::exists(modules + "/openai/package.json"))
      << "the vendored openai package is not unpacked at " << modules
      << " (tests/agent/CMakeLists.txt unpacks tests/data/npm/openai-*.tgz at configure time)";

  AgentOptions options =
      Options(node + " " + SourceDir() + "/tests/agent/openai_agent.cjs");
  options.env["NODE_PATH"] = modules;
  auto generator = MakeAgentGenerator(options);
  ASSERT_TRUE(generator.ok()) << generator.status();
  EXPECT_EQ((*generator)->kind(), "agent");
  ScriptedEngine engine(tokenizer_.get(), {kToolCallText, "The answer is 5."});
  engine.sampling_.max_response_len = 100;

  auto result = (*generator)->Generate(TaskSample(), &engine);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->segments.size(), 1u);
  EXPECT_FALSE(result->rewarded);
  const data::Sample& s = result->segments[0];

  // What the engine was asked: the first prompt is the Qwen3 rendering with the tools ...
  const auto inputs = engine.inputs();
  const auto outputs = engine.outputs();
  ASSERT_EQ(inputs.size(), 2u);
  tokenizer::ChatTemplateOptions copts;
  copts.add_generation_prompt = true;
  copts.tools = ojson::parse(kToolsJson);
  auto first_text = tokenizer_->ApplyChatTemplate(
      ojson::array({ojson{{"role", "user"}, {"content", TaskSample().prompt}}}), copts);
  ASSERT_TRUE(first_text.ok()) << first_text.status();
  EXPECT_EQ(inputs[0], tokenizer_->Encode(*first_text));
  // ... the second is the first + exactly the generated ids + the tool result, no drift.
  const Ids& out0 = outputs[0].output_ids;
  Ids between = tokenizer_->Encode(
      "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n"
      "<|im_start|>assistant\n");
  Ids second = inputs[0];
  second.insert(second.end(), out0.begin(), out0.end());
  second.insert(second.end(), between.begin(), between.end());
  EXPECT_EQ(inputs[1], second);
  // max_tokens reached the engine (capped by the rollout's max_response_len for the second).
  EXPECT_EQ(engine.overrides()[0], (json{{"max_new_tokens", 64}}));
  EXPECT_EQ(engine.overrides()[1], (json{{"max_new_tokens", 100}}));

  // The sample: prompt = first input; response = out0 (1) + between (0) + out1 (1).
  const Ids& out1 = outputs[1].output_ids;
  Ids tokens = second;
  tokens.insert(tokens.end(), out1.begin(), out1.end());
  EXPECT_EQ(s.tokens, tokens);
  EXPECT_EQ(s.PromptLength(), static_cast<int64_t>(inputs[0].size()));
  std::vector<uint8_t> mask(out0.size(), 1);
  mask.insert(mask.end(), between.size(), 0);
  mask.insert(mask.end(), out1.size(), 1);
  EXPECT_EQ(s.loss_mask, mask);
  std::vector<float> lps = outputs[0].log_probs;
  lps.insert(lps.end(), between.size(), 0.0f);
  lps.insert(lps.end(), outputs[1].log_probs.begin(), outputs[1].log_probs.end());
  EXPECT_EQ(s.rollout_log_probs, lps);
  EXPECT_EQ(s.status, data::SampleStatus::kCompleted);
  EXPECT_EQ(s.group_index, 4);
  EXPECT_EQ(s.index, 9);
  EXPECT_EQ(s.label, "5");
  EXPECT_EQ(s.prompt, TaskSample().prompt);
  EXPECT_EQ(s.weight_versions, (std::vector<std::string>{"v7", "v7"}));
  EXPECT_EQ(s.metadata["agent_turns"], 2);
  EXPECT_TRUE(s.Validate().ok()) << s.Validate();

  // The agent saw the streamed answer and usage.
  const std::string session = s.metadata["agent_session"].get<std::string>();
  std::ifstream log(options.log_dir + "/agent-" + session + ".log");
  std::string line;
  ASSERT_TRUE(std::getline(log, line)) << "the agent printed nothing; " << [&] {
    std::string files;
    for (const auto& e : fs::directory_iterator(options.log_dir)) files += e.path().string() + " ";
    return files;
  }();
  json summary = json::parse(line);
  EXPECT_EQ(summary["answer"], "The answer is 5.");
  EXPECT_EQ(summary["finish"], "stop");
  EXPECT_EQ(summary["usage"]["prompt_tokens"], inputs[1].size());
  EXPECT_EQ(summary["usage"]["completion_tokens"], out1.size());
}

TEST_F(AgentSessionTest, MaxTurnsStopsTheAgentAndTruncatesTheSample) {
  const std::string node = FindNode();
  ASSERT_FALSE(node.empty()) << "node not found (PATH or SLIME_NODE): install nodejs";
  AgentOptions options = Options(node + " " + SourceDir() + "/tests/agent/openai_agent.cjs");
  options.env["NODE_PATH"] = SLIME_AGENT_NODE_MODULES;
  options.max_turns = 1;
  auto generator = MakeAgentGenerator(options);
  ASSERT_TRUE(generator.ok()) << generator.status();
  ScriptedEngine engine(tokenizer_.get(), {kToolCallText, "The answer is 5."});
  auto result = (*generator)->Generate(TaskSample(), &engine);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(engine.inputs().size(), 1u);
  ASSERT_EQ(result->segments.size(), 1u);
  const data::Sample& s = result->segments[0];
  Ids tokens = engine.inputs()[0];
  const Ids out0 = engine.outputs()[0].output_ids;
  tokens.insert(tokens.end(), out0.begin(), out0.end());
  EXPECT_EQ(s.tokens, tokens);
  EXPECT_EQ(s.loss_mask, std::vector<uint8_t>(out0.size(), 1));
  EXPECT_EQ(s.status, data::SampleStatus::kTruncated);
}

// Serves `session` on a thread until stopped (what the generator's loop does).
class Servant {
 public:
  explicit Servant(std::shared_ptr<AgentSession> s)
      : thread_([this, s] {
          while (!stop_) s->Serve(10ms);
        }) {}
  ~Servant() {
    stop_ = true;
    thread_.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

TEST_F(AgentSessionTest, EndpointErrorsAreOpenAiShaped) {
  SessionServerOptions so;
  so.model_name = "m";
  auto server = AgentSessionServer::Start(so, tokenizer_);
  ASSERT_TRUE(server.ok()) << server.status();
  ScriptedEngine engine(tokenizer_.get(), {"hello"});
  engine.sampling_.max_context_len = 40;
  auto session = (*server)->Open("s-1", &engine);
  ASSERT_TRUE(session.ok()) << session.status();
  EXPECT_EQ((*session)->base_url(),
            "http://127.0.0.1:" + std::to_string((*server)->port()) + "/sessions/s-1/v1");
  EXPECT_EQ((*server)->Open("s-1", &engine).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ((*server)->Open("bad/id", &engine).status().code(),
            absl::StatusCode::kInvalidArgument);
  Servant servant(*session);
  http::Client client("127.0.0.1", (*server)->port());

  auto models = client.Get("/sessions/s-1/v1/models");
  ASSERT_TRUE(models.ok()) << models.status();
  EXPECT_EQ(models->status, 200);
  EXPECT_EQ(models->Json()["data"][0]["id"], "m");

  auto unknown = client.Post("/sessions/nope/v1/chat/completions", "{}");
  ASSERT_TRUE(unknown.ok());
  EXPECT_EQ(unknown->status, 404);
  EXPECT_EQ(unknown->Json()["error"]["code"], "session_not_found");
  EXPECT_NE(unknown->Json()["error"]["message"].get<std::string>().find("\"nope\""),
            std::string::npos);
  auto no_path = client.Get("/sessions/s-1/v1/embeddings");
  ASSERT_TRUE(no_path.ok());
  EXPECT_EQ(no_path->status, 404);
  auto wrong_method = client.Get("/sessions/s-1/v1/chat/completions");
  ASSERT_TRUE(wrong_method.ok());
  EXPECT_EQ(wrong_method->status, 405);
  EXPECT_EQ(wrong_method->Header("allow"), "POST");

  auto bad_json = client.Post("/sessions/s-1/v1/chat/completions", "{not json");
  ASSERT_TRUE(bad_json.ok());
  EXPECT_EQ(bad_json->status, 400);
  EXPECT_EQ(bad_json->Json()["error"]["type"], "invalid_request_error");
  auto bad_field = client.Post("/sessions/s-1/v1/chat/completions",
                               R"({"messages": [{"role": "user", "content": "x"}], "top_p": 7})");
  ASSERT_TRUE(bad_field.ok());
  EXPECT_EQ(bad_field->status, 400);
  EXPECT_EQ(bad_field->Json()["error"]["param"], "top_p");

  // Over the rollout's context limit (40 tokens): refused before the engine is called.
  std::string long_text(400, 'x');
  auto too_long = client.Post("/sessions/s-1/v1/chat/completions",
                              json{{"messages", {{{"role", "user"}, {"content", long_text}}}}}.dump());
  ASSERT_TRUE(too_long.ok());
  EXPECT_EQ(too_long->status, 400);
  EXPECT_EQ(too_long->Json()["error"]["code"], "context_length_exceeded");
  EXPECT_TRUE(engine.inputs().empty());

  // A call that fits: max_new_tokens capped to the context left; the answer is OpenAI format.
  auto ok = client.Post("/sessions/s-1/v1/chat/completions",
                        json{{"messages", {{{"role", "user"}, {"content", "hi"}}}}}.dump());
  ASSERT_TRUE(ok.ok());
  ASSERT_EQ(ok->status, 200) << ok->body;
  json body = ok->Json();
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["model"], "m");
  EXPECT_EQ(body["choices"][0]["message"], (json{{"role", "assistant"}, {"content", "hello"}}));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  const int prompt_tokens = body["usage"]["prompt_tokens"];
  EXPECT_EQ(engine.overrides()[0], (json{{"max_new_tokens", 40 - prompt_tokens}}));
  EXPECT_EQ((*session)->turns().size(), 1u);

  // An engine error: 502 to the agent, remembered for the rollout.
  engine.error_ = absl::UnavailableError("engine down");
  auto failed = client.Post("/sessions/s-1/v1/chat/completions",
                            json{{"messages", {{{"role", "user"}, {"content", "hi"}}}}}.dump());
  ASSERT_TRUE(failed.ok());
  EXPECT_EQ(failed->status, 502);
  EXPECT_EQ((*session)->engine_error().code(), absl::StatusCode::kUnavailable);

  // A closed session answers 404.
  (*server)->Close("s-1");
  auto closed = client.Get("/sessions/s-1/v1/models");
  ASSERT_TRUE(closed.ok());
  EXPECT_EQ(closed->status, 404);
}

TEST_F(AgentSessionTest, AgentProcessOutcomes) {
  ScriptedEngine engine(tokenizer_.get(), {});
  {  // nonzero exit: an error naming the command, the exit status and stderr's tail
    auto gen = MakeAgentGenerator(Options("echo 'tool crashed' >&2; exit 3"));
    ASSERT_TRUE(gen.ok()) << gen.status();
    auto r = (*gen)->Generate(TaskSample(), &engine);
    ASSERT_FALSE(r.ok());
    const std::string message(r.status().message());
    EXPECT_NE(message.find("`echo 'tool crashed' >&2; exit 3`"), std::string::npos) << message;
    EXPECT_NE(message.find("exit status 3"), std::string::npos) << message;
    EXPECT_NE(message.find("tool crashed"), std::string::npos) << message;
  }
  {  // timeout: the process group (a child that would outlive the shell too) is killed
    const std::string pidfile = scratch_ + "/grandchild.pid";
    auto gen = MakeAgentGenerator(
        Options("sleep 30 & echo $! > " + pidfile + "; wait", /*timeout_s=*/0.5));
    ASSERT_TRUE(gen.ok());
    auto start = std::chrono::steady_clock::now();
    auto r = (*gen)->Generate(TaskSample(), &engine);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
    ASSERT_EQ(r->segments.size(), 1u);
    EXPECT_EQ(r->segments[0].status, data::SampleStatus::kFailed);
    EXPECT_NE(r->segments[0].metadata["agent_error"].get<std::string>().find("within 0.5 s"),
              std::string::npos);
    std::ifstream in(pidfile);
    pid_t grandchild = 0;
    ASSERT_TRUE(in >> grandchild);
    // Killed: gone, or a zombie waiting for init to reap it.
    bool gone = false;
    for (int i = 0; i < 100 && !gone; ++i) {
      gone = !Running(grandchild);
      if (!gone) std::this_thread::sleep_for(20ms);
    }
    EXPECT_TRUE(gone) << "the agent's child " << grandchild << " outlived the timeout";
  }
  {  // the rollout aborting: the agent is killed and the sample is aborted
    auto gen = MakeAgentGenerator(Options("sleep 30"));
    ASSERT_TRUE(gen.ok());
    std::thread aborter([&engine] {
      std::this_thread::sleep_for(200ms);
      engine.aborting_ = true;
    });
    auto start = std::chrono::steady_clock::now();
    auto r = (*gen)->Generate(TaskSample(), &engine);
    aborter.join();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
    ASSERT_EQ(r->segments.size(), 1u);
    EXPECT_EQ(r->segments[0].status, data::SampleStatus::kAborted);
    engine.aborting_ = false;
  }
  {  // exit 0 without a model call: a failed sample that says so; the env reached the agent
    auto gen = MakeAgentGenerator(
        Options("test \"$SLIME_LABEL\" = 5 && test -n \"$SLIME_SESSION_ID\" && "
                "case \"$OPENAI_BASE_URL\" in http://127.0.0.1:*/sessions/$SLIME_SESSION_ID/v1) "
                "exit 0;; esac; exit 7"));
    ASSERT_TRUE(gen.ok());
    auto r = (*gen)->Generate(TaskSample(), &engine);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->segments.size(), 1u);
    EXPECT_EQ(r->segments[0].status, data::SampleStatus::kFailed);
    EXPECT_NE(r->segments[0].metadata["agent_error"].get<std::string>().find(
                  "without calling the model"),
              std::string::npos);
  }
  EXPECT_FALSE(MakeAgentGenerator(Options("")).ok());
  EXPECT_FALSE(MakeAgentGenerator(Options("true", 0)).ok());
  AgentOptions no_tok = Options("true");
  no_tok.tokenizer = nullptr;
  EXPECT_FALSE(MakeAgentGenerator(no_tok).ok());
}

}  // namespace
}  // namespace slime::agent
