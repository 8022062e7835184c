// The workflow module without an engine: tool-call parsing, the calculator environment and the
// environment client over real HTTP (a well-behaved environment and broken ones: garbage,
// HTTP errors, a hang), observation rendering with the real Qwen3 and Llama-3.1 tokenizers, and
// the rollout.custom_generate config checks.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <mutex>
#include <vector>

#include "nlohmann/json.hpp"
#include "slime/config/config.h"
#include "slime/http/response_writer.h"
#include "slime/http/server.h"
#include "slime/tokenizer/tokenizer.h"
#include "slime/workflow/calculator_env.h"
#include "slime/workflow/env_client.h"
#include "slime/workflow/episode_render.h"
#include "slime/workflow/factory.h"
#include "test_paths.h"

namespace slime::workflow {
namespace {

using ojson = nlohmann::ordered_json;
using json = nlohmann::json;
using tokenizer::ToolCallFormat;
using namespace std::chrono_literals;

using slime::testing::SourceDir;

TEST(ParseToolCallsTest, HermesBlocksAndLlamaJson) {
  const ojson calls = ParseToolCalls(
      "I will compute.\n<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": "
      "\"2 + 3\"}}\n</tool_call>\n<tool_call>{\"name\": \"calculator\", \"arguments\": "
      "\"{\\\"expression\\\": \\\"4*5\\\"}\"}</tool_call><tool_call>not json</tool_call>"
      "<tool_call>{\"name\": \"x\"",
      ToolCallFormat::kHermes, 2);
  ASSERT_EQ(calls.size(), 2u) << calls.dump();
  EXPECT_EQ(calls[0]["id"].get<std::string>(), "call_2_0");
  EXPECT_EQ(calls[0]["name"].get<std::string>(), "calculator");
  EXPECT_EQ(calls[0]["arguments"]["expression"].get<std::string>(), "2 + 3");
  EXPECT_EQ(calls[1]["arguments"]["expression"].get<std::string>(), "4*5");  // OpenAI-style string arguments
  // Llama 3.1: the whole turn is one JSON object with "parameters".
  const ojson llama = ParseToolCalls(
      " {\"name\": \"calculator\", \"parameters\": {\"expression\": \"7-1\"}}<|eot_id|>",
      ToolCallFormat::kLlamaJson, 1);
  ASSERT_EQ(llama.size(), 1u);
  EXPECT_EQ(llama[0]["arguments"]["expression"].get<std::string>(), "7-1");
  EXPECT_TRUE(ParseToolCalls("{\"name\": \"calculator\"}", ToolCallFormat::kHermes, 1).empty());
  EXPECT_TRUE(ParseToolCalls("Answer: 5", ToolCallFormat::kLlamaJson, 1).empty());
}

TEST(CalculatorTest, ArithmeticAndAnswers) {
  EXPECT_DOUBLE_EQ(*EvaluateArithmetic("2 + 3 * (4 - 1)"), 11);
  EXPECT_DOUBLE_EQ(*EvaluateArithmetic("-(6)/4"), -1.5);
  EXPECT_DOUBLE_EQ(*EvaluateArithmetic("1,234 + 1"), 1235);
  EXPECT_FALSE(EvaluateArithmetic("2 +").ok());
  EXPECT_FALSE(EvaluateArithmetic("1/0").ok());
  EXPECT_FALSE(EvaluateArithmetic("(1").ok());
  EXPECT_NE(EvaluateArithmetic("2 $ 3").status().message().find("position 2"), std::string::npos);
  EXPECT_EQ(FormatNumber(42), "42");
  EXPECT_EQ(FormatNumber(-1.5), "-1.5");
  EXPECT_EQ(*ExtractFinalAnswer("so... Answer: 1,024."), 1024);
  EXPECT_EQ(*ExtractFinalAnswer("\\boxed{-7}"), -7);
  EXPECT_EQ(*ExtractFinalAnswer("Answer: 3 and later \\boxed{4}"), 4);
  EXPECT_FALSE(ExtractFinalAnswer("Answer: none").has_value());
  EXPECT_FALSE(ExtractFinalAnswer("no answer").has_value());
}

TEST(EnvUrlTest, Parses) {
  auto u = ParseEnvUrl("http://127.0.0.1:8765/envs/calc/");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->host, "127.0.0.1");
  EXPECT_EQ(u->port, 8765);
  EXPECT_EQ(u->prefix, "/envs/calc");
  EXPECT_FALSE(ParseEnvUrl("https://x:1").ok());
  EXPECT_FALSE(ParseEnvUrl("http://x").ok());
  EXPECT_NE(ParseEnvUrl("127.0.0.1:80").status().message().find("http://host:port"),
            std::string::npos);
}

data::Sample MakeSample(int64_t index) {
  data::Sample s;
  s.index = index;
  s.group_index = index;
  s.prompt = "ignored";
  s.tokens = {1, 2, 3};
  return s;
}

TEST(CalculatorEnvTest, EpisodeOverHttp) {
  auto env = CalculatorEnv::Start({}, {});
  ASSERT_TRUE(env.ok()) << env.status();
  EnvClient client(*ParseEnvUrl((*env)->url()));
  data::Sample sample = MakeSample(3);
  sample.metadata["question"] = "What is 6 * 7?";
  sample.metadata["answer"] = 42;
  auto reset = client.Reset(sample, 5s);
  ASSERT_TRUE(reset.ok()) << reset.status();
  EXPECT_EQ(reset->observation.get<std::string>().rfind("What is 6 * 7?", 0), 0u);
  ASSERT_TRUE(reset->tools.is_array());
  EXPECT_EQ(reset->tools[0]["function"]["name"].get<std::string>(), "calculator");
  // A tool call: the result comes back, not done.
  ojson action = {{"text", "<tool_call>...</tool_call>"},
                  {"tool_calls",
                   {{{"id", "call_1_0"}, {"name", "calculator"},
                     {"arguments", {{"expression", "6 * 7"}}}},
                    {{"id", "call_1_1"}, {"name", "search"}, {"arguments", ojson::object()}}}}};
  auto step = client.Step(reset->episode_id, action, 5s);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_FALSE(step->done);
  EXPECT_EQ(step->observation.get<std::string>(),
            "calculator(6 * 7) = 42\nerror: unknown tool 'search' (the only tool is calculator)");
  // Neither call nor answer: a reminder.
  step = client.Step(reset->episode_id, {{"text", "hmm"}, {"tool_calls", ojson::array()}}, 5s);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_FALSE(step->done);
  EXPECT_NE(step->observation.get<std::string>().find("Answer: <number>"), std::string::npos);
  // The final answer ends the episode with reward 1.
  step = client.Step(reset->episode_id, {{"text", "Answer: 42"}, {"tool_calls", ojson::array()}},
                     5s);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_TRUE(step->done);
  EXPECT_EQ(step->reward, 1.0);
  EXPECT_TRUE(step->info["correct"].get<bool>());
  EXPECT_EQ((*env)->open_episodes(), 0);
  // The episode is gone: 404 names it; /close of an unknown episode is fine.
  step = client.Step(reset->episode_id, {{"text", "Answer: 42"}}, 5s);
  ASSERT_FALSE(step.ok());
  EXPECT_NE(step.status().message().find("unknown episode"), std::string::npos) << step.status();
  EXPECT_TRUE(client.Close(reset->episode_id, 5s).ok());
  // Questions drawn from the seed and the index are reproducible; a wrong answer gets 0.
  auto r1 = client.Reset(MakeSample(11), 5s);
  auto r2 = client.Reset(MakeSample(11), 5s);
  ASSERT_TRUE(r1.ok() && r2.ok());
  EXPECT_EQ(r1->observation.dump(), r2->observation.dump());
  step = client.Step(r1->episode_id, {{"text", "Answer: 100000"}}, 5s);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_TRUE(step->done);
  EXPECT_EQ(step->reward, 0.0);
}

// An environment that misbehaves on purpose, per route: "garbage", "500", "hang", "nodone".
class BrokenEnv {
 public:
  explicit BrokenEnv(std::string mode) {
    http::Router router;
    auto handler = [this, mode](const http::Request&, std::shared_ptr<http::ResponseWriter> w) {
      if (mode == "garbage") {
        w->Send(200, "<html>not json</html>", "text/html");
      } else if (mode == "500") {
        w->SendJson(500, json{{"error", {{"message", "env exploded"}}}});
      } else if (mode == "nodone") {
        w->SendJson(200, json{{"episode_id", "e"}, {"observation", 5}});
      } else {  // hang: keep the writer, answer never
        std::lock_guard<std::mutex> lock(mu_);
        parked_.push_back(std::move(w));
      }
    };
    router.Add("POST", "/reset", handler);
    router.Add("POST", "/step", handler);
    server_ = *http::Server::Start({}, std::move(router));
  }
  ~BrokenEnv() { server_->Stop(); }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(server_->port()); }

 private:
  std::mutex mu_;
  std::vector<std::shared_ptr<http::ResponseWriter>> parked_;
  std::unique_ptr<http::Server> server_;
};

TEST(EnvClientTest, BrokenEnvironmentsAreErrorsNamingTheUrl) {
  for (const std::string mode : {"garbage", "500", "nodone", "hang"}) {
    SCOPED_TRACE(mode);
    BrokenEnv env(mode);
    EnvClient client(*ParseEnvUrl(env.url()));
    const auto start = std::chrono::steady_clock::now();
    auto reset = client.Reset(MakeSample(0), 500ms);
    ASSERT_FALSE(reset.ok());
    EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
    EXPECT_NE(reset.status().message().find(env.url() + "/reset"), std::string::npos)
        << reset.status();
    if (mode == "hang") {
      EXPECT_TRUE(absl::IsDeadlineExceeded(reset.status())) << reset.status();
    }
    if (mode == "nodone") {
      EXPECT_NE(reset.status().message().find("observation"), std::string::npos);
    }
  }
  EnvClient nobody(*ParseEnvUrl("http://127.0.0.1:1"));
  auto r = nobody.Reset(MakeSample(0), 1s);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("http://127.0.0.1:1/reset"), std::string::npos);
}

class RendererTest : public ::testing::Test {
 protected:
  std::unique_ptr<tokenizer::Tokenizer> Load(const std::string& name) {
    const std::string dir = SourceDir() + "/.cache/testdata/" + name;
    if (!std::filesystem::exists(dir + "/tokenizer.json")) return nullptr;
    auto t = tokenizer::Tokenizer::FromDirectory(dir);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? std::move(*t) : nullptr;
  }
};

TEST_F(RendererTest, Qwen3ToolResultsAndEndOfTurn) {
  auto tok = Load("qwen3");
  if (tok == nullptr) GTEST_SKIP() << "Qwen3 tokenizer missing: run scripts/fetch_test_data.sh";
  auto r = EpisodeRenderer::Create(tok.get(), ojson::object());
  ASSERT_TRUE(r.ok()) << r.status();
  const ojson tool = r->ObservationMessages("calculator(2 + 3) = 5", /*had_tool_calls=*/true);
  auto text = r->ObservationText(tool);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text,
            "<|im_end|>\n<|im_start|>user\n<tool_response>\ncalculator(2 + 3) = 5\n"
            "</tool_response><|im_end|>\n<|im_start|>assistant\n");
  text = r->ObservationText(r->ObservationMessages("try again", false));
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "<|im_end|>\n<|im_start|>user\ntry again<|im_end|>\n<|im_start|>assistant\n");
  // The model's own <|im_end|> is not repeated; a turn cut by length gets it from us.
  const std::vector<int32_t> im_end = tok->Encode("<|im_end|>");
  ASSERT_EQ(im_end.size(), 1u);
  const std::vector<int32_t> after = tok->Encode(
      "\n<|im_start|>user\ntry again<|im_end|>\n<|im_start|>assistant\n");
  const std::vector<int32_t> stopped = {tok->Encode("hi")[0], im_end[0]};
  auto ids = r->Observation(r->ObservationMessages("try again", false), stopped);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, after);
  ids = r->Observation(r->ObservationMessages("try again", false), tok->Encode("hi"));
  ASSERT_TRUE(ids.ok());
  std::vector<int32_t> with_end = im_end;
  with_end.insert(with_end.end(), after.begin(), after.end());
  EXPECT_EQ(*ids, with_end);
  // The prompt with tools is the chat template's rendering.
  const ojson tools = ojson::parse(R"([{"type": "function", "function": {"name": "calculator"}}])");
  std::string prompt_text;
  auto prompt = r->Prompt(EpisodeRenderer::InitialMessages("What is 1 + 1?"), tools, &prompt_text);
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  tokenizer::ChatTemplateOptions o;
  o.add_generation_prompt = true;
  o.tools = tools;
  EXPECT_EQ(prompt_text,
            *tok->ApplyChatTemplate(ojson::parse(R"([{"role":"user","content":"What is 1 + 1?"}])"), o));
  EXPECT_NE(prompt_text.find("<tools>"), std::string::npos);
  EXPECT_EQ(*prompt, tok->Encode(prompt_text));
}

TEST_F(RendererTest, Llama3WithoutToolRoleGetsToolResultsAsUserTurns) {
  // The cached "llama3_1" test tokenizer carries the plain Llama-3 template (no tool role).
  auto tok = Load("llama3_1");
  if (tok == nullptr) GTEST_SKIP() << "Llama-3 tokenizer missing: run scripts/fetch_test_data.sh";
  auto r = EpisodeRenderer::Create(tok.get(), ojson::object());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->tool_call_format(), ToolCallFormat::kNone);
  EXPECT_FALSE(r->has_tool_role());
  auto text = r->ObservationText(r->ObservationMessages("calculator(2 + 3) = 5", true));
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text,
            "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\ncalculator(2 + 3) = 5"
            "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(CustomGenerateConfigTest, ResolveChecks) {
  const std::string base =
      "model: {hf_checkpoint: /m}\ndata: {prompt_data: /p.jsonl, rollout_batch_size: 1, "
      "num_rollout: 1}\ncluster: {rollout_num_gpus: 1, actor_num_gpus_per_node: 1}\n"
      "train: {global_batch_size: 1, micro_batch_size: 1}\n";
  const auto load = [&](const std::string& extra) {
    std::vector<std::string> warnings;
    return config::LoadConfigFromString(base + extra, ".", {}, &warnings);
  };
  auto c = load("rollout: {custom_generate: env}\n");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("rollout.custom_generate 'env' requires an env_url"),
            std::string::npos)
      << c.status();
  c = load("rollout: {custom_generate: plugin}\n");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("custom_generate_path"), std::string::npos) << c.status();
  c = load("rollout: {custom_generate: agent}\n");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("agent_command"), std::string::npos) << c.status();
  c = load("rollout: {custom_generate: env, env_url: 'localhost:1'}\n");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("not an http://host:port"), std::string::npos);
  c = load("rollout: {custom_generate: env, env_url: 'http://h:1', partial_rollout: true}\n");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("partial_rollout"), std::string::npos);
  c = load("rollout: {custom_generate: plugin, custom_generate_path: /x.so, "
           "custom_generate_config: 'not a map'}\n");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("custom_generate_config must be JSON object"),
            std::string::npos);
  c = load("rollout: {on_env_error: retry}\n");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("on_env_error"), std::string::npos);
  // Eval datasets inherit custom_generate and env_url, or override them.
  c = load(
      "rollout: {custom_generate: env, env_url: 'http://h:1', max_context_len: 512}\n"
      "eval: {datasets: [{name: a, path: /a.jsonl}, {name: b, path: /b.jsonl, custom_generate: "
      "none}, {name: c, path: /c.jsonl, env_url: 'http://h:2'}]}\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rollout.max_total_tokens, 512);
  EXPECT_EQ(c->rollout.max_turns, 8);
  EXPECT_EQ(c->rollout.on_env_error, "fail");
  EXPECT_EQ(c->eval.datasets[0].custom_generate, "env");
  EXPECT_EQ(c->eval.datasets[0].env_url, "http://h:1");
  EXPECT_EQ(c->eval.datasets[1].custom_generate, "none");
  EXPECT_EQ(c->eval.datasets[2].env_url, "http://h:2");
  c = load(
      "rollout: {max_context_len: 100}\n"
      "eval: {datasets: [{name: a, path: /a.jsonl, custom_generate: env}]}\n");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("eval.datasets[0].custom_generate 'env' requires"),
            std::string::npos)
      << c.status();
}


// The job's factory builds every kind from the config: the example plugin (loaded through the
// C ABI), an agent (its session server started with the Qwen3 tokenizer) and an environment;
// a plugin path that is not a library fails naming the key.
TEST(CustomGenerateFactoryTest, BuildsPluginAgentAndEnvGenerators) {
  const std::string tok_dir = SourceDir() + "/.cache/testdata/qwen3";
  if (!std::filesystem::exists(tok_dir + "/tokenizer.json")) {
    GTEST_SKIP() << tok_dir << " missing: run scripts/fetch_test_data.sh";
  }
  auto tok = tokenizer::Tokenizer::FromDirectory(tok_dir);
  ASSERT_TRUE(tok.ok()) << tok.status();
  const std::string base =
      "model: {hf_checkpoint: " + tok_dir +
      "}\ndata: {prompt_data: /p.jsonl, rollout_batch_size: 1, num_rollout: 1}\n"
      "cluster: {rollout_num_gpus: 1, actor_num_gpus_per_node: 1, run_dir: " +
      ::testing::TempDir() + "/factory_run}\n"
      "train: {global_batch_size: 1, micro_batch_size: 1}\n";
  const auto make = [&](const std::string& rollout, const std::string& kind) {
    std::vector<std::string> warnings;
    auto c = config::LoadConfigFromString(base + rollout, ".", {}, &warnings);
    EXPECT_TRUE(c.ok()) << c.status();
    return MakeCustomGenerator(*c, &**tok, kind, c->rollout.env_url.value_or(""));
  };
  auto plugin = make("rollout: {custom_generate: plugin, custom_generate_path: " +
                         std::string(SLIME_SELF_CHECK_PLUGIN) +
                         ", custom_generate_config: '{\"verify_ids\": [1, 2]}'}\n",
                     "plugin");
  ASSERT_TRUE(plugin.ok()) << plugin.status();
  EXPECT_EQ((*plugin)->kind(), "plugin");
  auto agent = make("rollout: {custom_generate: agent, agent_command: [/bin/true]}\n", "agent");
  ASSERT_TRUE(agent.ok()) << agent.status();
  EXPECT_EQ((*agent)->kind(), "agent");
  auto env = make("rollout: {custom_generate: env, env_url: 'http://127.0.0.1:9'}\n", "env");
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ((*env)->kind(), "env");
  auto bad = make("rollout: {custom_generate: plugin, custom_generate_path: " + tok_dir +
                      "/tokenizer.json}\n",
                  "plugin");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("rollout.custom_generate plugin"), std::string::npos)
      << bad.status();
}

}  // namespace
}  // namespace slime::workflow
