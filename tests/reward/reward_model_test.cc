// RewardModel: type resolution (metadata > sample > default), boxed_ prefix, reward_key, the
// error policy, batches, and the config mapping.
#include "gtest/gtest.h"
#include "slime/config/config.h"
#include "slime/reward/reward.h"

namespace slime::reward {
namespace {

std::unique_ptr<RewardModel> MakeModel(RewardOptions options) {
  auto model = RewardModel::Create(std::move(options));
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(*model) : nullptr;
}

const std::string kMathResponse =
    "We have 3 boxes with 4 apples each, so 3 * 4 = 12 apples.\n\nThe answer is \\boxed{12}.";

TEST(RewardModelTest, DefaultTypeAndPerSampleOverrides) {
  auto model = MakeModel({.rm_type = "math"});
  ASSERT_NE(model, nullptr);
  RewardSample sample{.response = kMathResponse, .label = "12"};
  EXPECT_EQ(model->Score(sample)->reward, 1.0);

  // metadata.rm_type wins over the sample's and the default type.
  nlohmann::json meta = {{"rm_type", "exact_match"}};
  RewardSample exact{.response = " 12 ", .label = "12", .metadata = &meta, .rm_type = "f1"};
  EXPECT_EQ(model->Score(exact)->reward, 1.0);
  exact.response = "12 apples";
  EXPECT_EQ(model->Score(exact)->reward, 0.0);  // f1 would give 2/3
  // The sample's type wins over the default.
  RewardSample f1{.response = "12 apples", .label = "12", .rm_type = "f1"};
  EXPECT_NEAR(model->Score(f1)->reward, 2.0 / 3.0, 1e-12);
}

TEST(RewardModelTest, BoxedPrefixExtractsFirst) {
  auto model = MakeModel({.rm_type = "boxed_f1"});
  ASSERT_NE(model, nullptr);
  RewardSample sample{.response = "The city on the Seine is \\boxed{Paris}.", .label = "Paris"};
  EXPECT_EQ(model->Score(sample)->reward, 1.0);
  // Without a boxed answer the response becomes "".
  sample.response = "Paris";
  EXPECT_EQ(model->Score(sample)->reward, 0.0);
}

TEST(RewardModelTest, DapoMappingAndRewardKey) {
  RewardSample sample{.response = "2 + 2 = 4\nAnswer: 4", .label = "4"};
  auto plain = MakeModel({.rm_type = "dapo"});
  auto result = plain->Score(sample);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->reward, 1.0);
  EXPECT_EQ(result->fields["pred"], "4");

  auto by_acc = MakeModel({.rm_type = "dapo", .reward_key = "acc"});
  sample.label = "5";
  EXPECT_EQ(by_acc->Score(sample)->reward, 0.0);  // acc false -> 0 (score would be -1)

  auto missing = MakeModel({.rm_type = "dapo", .reward_key = "accuracy"});
  auto error = missing->Score(sample);
  ASSERT_FALSE(error.ok());
  EXPECT_NE(std::string(error.status().message()).find("'acc', 'pred', 'score'"), std::string::npos)
      << error.status();
}

TEST(RewardModelTest, ErrorPolicy) {
  nlohmann::json meta = {{"rm_type", "deepscalr"}};
  RewardSample sample{.response = "x", .label = "1", .metadata = &meta};
  auto fail = MakeModel({.rm_type = "math"});
  auto error = fail->Score(sample);
  ASSERT_FALSE(error.ok());
  EXPECT_EQ(error.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(error.status().message()).find("did you mean \"deepscaler\""),
            std::string::npos)
      << error.status();

  auto value = MakeModel({.rm_type = "math", .on_error = OnError::kValue, .error_reward = -0.5});
  auto replaced = value->Score(sample);
  ASSERT_TRUE(replaced.ok()) << replaced.status();
  EXPECT_EQ(replaced->reward, -0.5);
  EXPECT_NE(replaced->error.find("deepscalr"), std::string::npos);

  // dapo with a non-numeric label, ifbench (not built), no type at all.
  RewardSample dapo{.response = "Answer: 3", .label = "three", .rm_type = "dapo"};
  EXPECT_EQ(value->Score(dapo)->reward, -0.5);
  RewardSample ifbench{.response = "x", .rm_type = "ifbench"};
  EXPECT_EQ(fail->Score(ifbench).status().code(), absl::StatusCode::kUnimplemented);
  auto untyped = MakeModel({});
  EXPECT_EQ(untyped->Score({.response = "x"}).status().code(), absl::StatusCode::kInvalidArgument);
  // remote_rm asked for by a sample without a URL.
  RewardSample remote{.response = "x", .rm_type = "remote_rm"};
  EXPECT_EQ(fail->Score(remote).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(RewardModelTest, CreateValidatesOptions) {
  EXPECT_EQ(RewardModel::Create({.rm_type = "maths"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RewardModel::Create({.rm_type = "remote_rm"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RewardModel::Create({.rm_type = "math", .num_workers = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto bad_url = RewardModel::Create({.rm_type = "remote_rm", .remote = {.url = "https://x/"}});
  ASSERT_FALSE(bad_url.ok());
  EXPECT_NE(std::string(bad_url.status().message()).find("https"), std::string::npos);
  auto missing_plugin = RewardModel::Create({.custom_rm_path = "/nonexistent/plugin.so"});
  EXPECT_EQ(missing_plugin.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(RewardModel::Create({.rm_type = "boxed_gpqa"}).ok());
}

TEST(RewardModelTest, BatchKeepsOrderAcrossThreads) {
  auto model = MakeModel({.rm_type = "math", .num_workers = 4});
  std::vector<std::string> responses, labels;
  for (int i = 0; i < 200; ++i) {
    responses.push_back("Adding up, " + std::to_string(i) + " + 1 gives \\boxed{" +
                        std::to_string(i + 1) + "}.");
    labels.push_back(std::to_string(i % 3 == 0 ? i + 1 : i + 2));
  }
  std::vector<RewardSample> samples;
  for (int i = 0; i < 200; ++i) samples.push_back({.response = responses[i], .label = labels[i]});
  auto results = model->ScoreBatch(samples);
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), 200u);
  for (int i = 0; i < 200; ++i) EXPECT_EQ((*results)[i].reward, i % 3 == 0 ? 1.0 : 0.0) << i;
  // With on_error = fail the first failing sample's error comes back.
  samples[150].rm_type = "nonsense";
  EXPECT_FALSE(model->ScoreBatch(samples).ok());
}

TEST(RewardModelTest, OptionsFromConfig) {
  config::RewardConfig c;
  c.rm_type = "remote_rm";
  c.rm_url = "http://127.0.0.1:9/score";
  c.reward_key = "score";
  c.rm_timeout_s = 2.5;
  c.rm_max_attempts = 3;
  c.plugin_timeout_s = 0.25;
  c.on_error = "value";
  c.error_reward = -1;
  c.num_workers = 5;
  RewardOptions o = RewardOptionsFromConfig(c);
  EXPECT_EQ(o.rm_type, "remote_rm");
  EXPECT_EQ(o.remote.url, "http://127.0.0.1:9/score");
  EXPECT_EQ(o.reward_key, "score");
  EXPECT_EQ(o.remote.timeout.count(), 2500);
  EXPECT_EQ(o.remote.max_attempts, 3);
  EXPECT_EQ(o.plugin.timeout.count(), 250);
  EXPECT_EQ(o.plugin.num_processes, 5);
  EXPECT_EQ(o.on_error, OnError::kValue);
  EXPECT_EQ(o.error_reward, -1);
  EXPECT_EQ(o.num_workers, 5);
}

}  // namespace
}  // namespace slime::reward
