// The example generate plugin (examples/plugins/self_check) through the real rollout
// coordinator against a real engine behind its HTTP server (tiny random-weight Qwen3 on CPU,
// the real Qwen3 tokenizer; skips with a message until scripts/fetch_test_data.sh has run).
// Greedy sampling, so every turn can be replayed on the engine and compared exactly: the answer
// span, the injected verification ids (loss mask 0, log-prob 0) and the verification span.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <memory>

#include "nlohmann/json.hpp"
#include "remove_tree.h"
#include "slime/data/prompt_dataset.h"
#include "slime/engine/engine.h"
#include "slime/engine/server.h"
#include "slime/http/client.h"
#include "slime/model/init_random_model.h"
#include "slime/plugin/plugin_generator.h"
#include "slime/reward/reward.h"
#include "slime/rollout/coordinator.h"
#include "test_engine.h"
#include "test_paths.h"

namespace slime::plugin {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

using slime::testing::SourceDir;

// One greedy /generate on the engine (stopping on `stop_ids`): output ids and log-probs.
struct Replay {
  std::vector<int32_t> ids;
  std::vector<float> log_probs;
  std::string finish_reason;
};
Replay Greedy(int port, const std::vector<int32_t>& input_ids, int max_new_tokens,
              const std::vector<int>& stop_ids = {}) {
  http::Client client("127.0.0.1", port);
  json sp = {{"temperature", 0.0}, {"max_new_tokens", max_new_tokens}};
  if (!stop_ids.empty()) sp["stop_token_ids"] = stop_ids;
  json body = {{"input_ids", input_ids}, {"sampling_params", sp}, {"return_logprob", true}};
  auto r = client.Post("/generate", body.dump());
  EXPECT_TRUE(r.ok()) << r.status();
  Replay out;
  if (!r.ok()) return out;
  const json answer = r->Json();
  for (const auto& id : answer["output_ids"]) out.ids.push_back(id.get<int32_t>());
  for (const auto& e : answer["meta_info"]["output_token_logprobs"]) {
    out.log_probs.push_back(e[0].get<float>());
  }
  out.finish_reason = answer["meta_info"]["finish_reason"]["type"].get<std::string>();
  return out;
}

TEST(PluginEngineTest, SelfCheckThroughTheCoordinator) {
  const std::string tok = SourceDir() + "/.cache/testdata/qwen3";
  if (!fs::exists(tok + "/tokenizer.json")) {
    GTEST_SKIP() << "Qwen3 tokenizer missing at " << tok << ": run scripts/fetch_test_data.sh";
  }
  const std::string model_dir =
      (fs::temp_directory_path() / ("slime-plugin-test-" + std::to_string(::getpid()))).string();
  testing::RemoveTree(model_dir);
  struct Cleanup {
    std::string dir;
    ~Cleanup() { testing::RemoveTree(dir); }
  } cleanup{model_dir};
  ASSERT_TRUE(
      model::InitRandomModel(SourceDir() + "/tests/data/model/configs/qwen3-engine-test.json", tok,
                             model_dir, 0, "fp32")
          .ok());
  auto served = slime::testing::StartTestEngine({.model_dir = model_dir, .weight_version = "w1"});
  ASSERT_TRUE(served.ok()) << served.status();
  const int port = (*served)->port();
  engine::Engine* const engine = (*served)->engine.get();

  // The plugin, with the instruction tokenized by the model's tokenizer.
  const std::vector<int32_t> verify_ids = engine->tokenizer().Encode(" Check your answer:");
  ASSERT_FALSE(verify_ids.empty());
  json config = {{"verify_ids", verify_ids},
                 {"verify_text", " Check your answer:"},
                 {"answer_max_new_tokens", 6},
                 {"verify_max_new_tokens", 4}};
  auto plugin = LoadGeneratePlugin({PLUGIN_SELF_CHECK, config.dump()});
  ASSERT_TRUE(plugin.ok()) << plugin.status();

  // Prompts and rewards (exact_match on the label: the random model scores 0).
  std::string rows;
  for (int i = 0; i < 3; ++i) {
    rows += json{{"input", "What is " + std::to_string(i) + "+1?"}, {"label", "x"}}.dump() + "\n";
  }
  data::PromptDatasetOptions po;
  po.label_key = "label";
  auto ds = data::PromptDataset::Parse(rows, "test.jsonl", engine->tokenizer(), po);
  ASSERT_TRUE(ds.ok()) << ds.status();
  auto dataset = std::make_shared<const data::PromptDataset>(std::move(*ds));
  data::PromptDataSourceOptions dso;
  dso.n_samples_per_prompt = 2;
  auto source = data::PromptDataSource::Create(dataset, dso);
  ASSERT_TRUE(source.ok()) << source.status();
  rollout::PromptGroupSource groups(&*source);
  reward::RewardOptions ro;
  ro.rm_type = "exact_match";
  auto rm = reward::RewardModel::Create(ro);
  ASSERT_TRUE(rm.ok()) << rm.status();

  // Each prompt's greedy first token is a stop token: every answer stops ("stop") and is
  // verified; the verification runs until its own budget or one of those tokens.
  std::vector<int> stop_ids;
  for (const data::Prompt& p : dataset->prompts()) {
    const Replay first = Greedy(port, p.tokens, 1);
    ASSERT_EQ(first.ids.size(), 1u);
    stop_ids.push_back(first.ids[0]);
  }

  rollout::RolloutOptions o;
  o.engines.addresses = {"http://127.0.0.1:" + std::to_string(port)};
  o.engines.concurrency_per_engine = 4;
  o.rollout_batch_size = 3;
  o.n_samples_per_prompt = 2;
  o.sampling.temperature = 0.0;
  o.sampling.max_response_len = 16;
  o.sampling.stop_token_ids = stop_ids;
  o.custom_generator = std::shared_ptr<rollout::CustomGenerator>(std::move(*plugin));
  o.custom_generate_concurrency = 4;
  rollout::RolloutCoordinator coordinator;
  ASSERT_TRUE(coordinator.Configure(o, &groups, rm->get()).ok());
  auto result = coordinator.Generate(0);
  ASSERT_TRUE(result.ok()) << result.status();

  ASSERT_EQ(result->groups.size(), 3u);
  int verified = 0;
  for (const auto& group : result->groups) {
    ASSERT_EQ(group.size(), 2u);
    for (const data::Sample& s : group) {
      ASSERT_TRUE(s.Validate().ok()) << s.Validate();
      const std::vector<int32_t> prompt(s.tokens.begin(), s.tokens.begin() + s.PromptLength());
      // The answer, replayed greedily on the engine.
      const Replay answer = Greedy(port, prompt, 6, stop_ids);
      ASSERT_FALSE(answer.ids.empty());
      const size_t a = answer.ids.size();
      std::vector<int32_t> expected = prompt;
      expected.insert(expected.end(), answer.ids.begin(), answer.ids.end());
      std::vector<uint8_t> mask(a, 1);
      std::vector<float> lps = answer.log_probs;
      if (answer.finish_reason == "stop") {
        expected.insert(expected.end(), verify_ids.begin(), verify_ids.end());
        mask.insert(mask.end(), verify_ids.size(), 0);
        lps.insert(lps.end(), verify_ids.size(), 0.0f);
        const Replay verify = Greedy(port, expected, 4, stop_ids);
        ++verified;
        expected.insert(expected.end(), verify.ids.begin(), verify.ids.end());
        mask.insert(mask.end(), verify.ids.size(), 1);
        lps.insert(lps.end(), verify.log_probs.begin(), verify.log_probs.end());
      } else {
        EXPECT_EQ(s.status, data::SampleStatus::kTruncated);
      }
      EXPECT_EQ(s.tokens, expected) << "sample " << s.index;
      EXPECT_EQ(s.loss_mask, mask) << "sample " << s.index;
      ASSERT_EQ(s.rollout_log_probs.size(), lps.size());
      for (size_t i = 0; i < lps.size(); ++i) {
        EXPECT_NEAR(s.rollout_log_probs[i], lps[i], 1e-4) << "sample " << s.index << " " << i;
      }
      EXPECT_EQ(s.metadata["self_check"]["answer_tokens"].get<size_t>(), a);
      EXPECT_EQ(s.weight_versions.front(), "w1");
      EXPECT_EQ(s.reward, 0.0);  // scored by exact_match: the plugin set none
    }
  }
  EXPECT_EQ(verified, 6) << "every answer stopped on a stop token, so every one is verified";
  (*served)->server->Stop();
}

}  // namespace
}  // namespace slime::plugin
