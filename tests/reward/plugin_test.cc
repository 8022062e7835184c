// Reward plugins: real shared libraries (tests/reward/plugins, examples/reward_plugin) loaded
// into forked worker processes. Crashes and hangs must come back as errors, never take the
// test process down or block it.
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <fstream>

#include "gtest/gtest.h"
#include "slime/reward/reward.h"

namespace slime::reward {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

RewardOptions PluginModel(const char* path) {
  return {.custom_rm_path = path, .plugin = {.timeout = 2s, .num_processes = 2}};
}

std::string Message(const Status& s) { return std::string(s.message()); }

TEST(PluginTest, GoodPluginScoresWithTypeAndMetadata) {
  auto model = RewardModel::Create(PluginModel(PLUGIN_GOOD));
  ASSERT_TRUE(model.ok()) << model.status();
  RewardSample sample{.prompt = "Say hi", .response = "hello", .label = "hi"};
  EXPECT_EQ((*model)->Score(sample)->reward, 5.0);  // the response length
  nlohmann::json meta = {{"rm_type", "custom"}, {"note", "bonus"}};
  sample.metadata = &meta;
  EXPECT_EQ((*model)->Score(sample)->reward, 1105.0);

  auto refused = (*model)->Score({.response = "error: no"});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(Message(refused.status()).find("refusing response \"error: no\""), std::string::npos)
      << refused.status();
}

TEST(PluginTest, CrashIsAnErrorAndTheWorkerComesBack) {
  auto model = RewardModel::Create(PluginModel(PLUGIN_FAULTS));
  ASSERT_TRUE(model.ok()) << model.status();
  auto segv = (*model)->Score({.response = "please segv now"});
  ASSERT_FALSE(segv.ok());
  EXPECT_EQ(segv.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(Message(segv.status()).find("SIGSEGV"), std::string::npos) << segv.status();
  auto abort = (*model)->Score({.response = "abort"});
  EXPECT_NE(Message(abort.status()).find("SIGABRT"), std::string::npos) << abort.status();
  // The next call gets a fresh worker.
  EXPECT_EQ((*model)->Score({.response = "fine"})->reward, 4.0);
}

TEST(PluginTest, HangTimesOutAndTheWorkerComesBack) {
  RewardOptions options = PluginModel(PLUGIN_FAULTS);
  options.plugin.timeout = 300ms;
  auto model = RewardModel::Create(options);
  ASSERT_TRUE(model.ok()) << model.status();
  auto start = Clock::now();
  auto hang = (*model)->Score({.response = "hang forever"});
  auto took = Clock::now() - start;
  ASSERT_FALSE(hang.ok());
  EXPECT_EQ(hang.status().code(), absl::StatusCode::kDeadlineExceeded) << hang.status();
  EXPECT_NE(Message(hang.status()).find("300 ms"), std::string::npos);
  EXPECT_LT(took, 3s);
  EXPECT_EQ((*model)->Score({.response = "ok"})->reward, 2.0);
}

TEST(PluginTest, ErrorPolicyValueInABatch) {
  RewardOptions options = PluginModel(PLUGIN_FAULTS);
  options.plugin.timeout = 500ms;
  options.on_error = OnError::kValue;
  options.error_reward = -7;
  options.num_workers = 3;
  options.plugin.num_processes = 3;
  auto model = RewardModel::Create(options);
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<std::string> responses;
  for (int i = 0; i < 24; ++i) {
    responses.push_back(i == 5 ? "segv" : i == 17 ? "hang" : std::string(i + 1, 'x'));
  }
  std::vector<RewardSample> samples;
  for (const auto& r : responses) samples.push_back({.response = r});
  auto results = (*model)->ScoreBatch(samples);
  ASSERT_TRUE(results.ok()) << results.status();
  for (int i = 0; i < 24; ++i) {
    if (i == 5 || i == 17) {
      EXPECT_EQ((*results)[i].reward, -7) << i;
      EXPECT_FALSE((*results)[i].error.empty());
    } else {
      EXPECT_EQ((*results)[i].reward, i + 1) << i;
      EXPECT_TRUE((*results)[i].error.empty());
    }
  }
}

TEST(PluginTest, LoadErrorsNameTheProblem) {
  auto no_score = RewardModel::Create(PluginModel(PLUGIN_NO_SCORE));
  EXPECT_EQ(no_score.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(Message(no_score.status()).find("slime_reward_v1"), std::string::npos)
      << no_score.status();
  auto version = RewardModel::Create(PluginModel(PLUGIN_VERSION));
  EXPECT_NE(Message(version.status()).find("ABI version 7"), std::string::npos) << version.status();
  auto init = RewardModel::Create(PluginModel(PLUGIN_INIT_FAIL));
  EXPECT_NE(Message(init.status()).find("weights.bin not found"), std::string::npos)
      << init.status();
  // A file that is not a shared library.
  std::string junk = ::testing::TempDir() + "/not_a_plugin.so";
  std::ofstream(junk) << "this is text";
  auto not_elf = RewardModel::Create(PluginModel(junk.c_str()));
  EXPECT_EQ(not_elf.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(Message(not_elf.status()).find("cannot load it"), std::string::npos)
      << not_elf.status();
  // group_rm needs the batch entry.
  RewardOptions group = PluginModel(PLUGIN_NO_BATCH);
  group.group_rm = true;
  auto no_batch = RewardModel::Create(group);
  EXPECT_NE(Message(no_batch.status()).find("slime_reward_batch_v1"), std::string::npos)
      << no_batch.status();
}

TEST(PluginTest, GroupRmIsOneCall) {
  RewardOptions options = PluginModel(PLUGIN_GOOD);
  options.group_rm = true;
  auto model = RewardModel::Create(options);
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<RewardSample> group(3, RewardSample{.response = "abc"});
  auto results = (*model)->ScoreGroup(group);
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_EQ((*results)[0].reward, 30);
  EXPECT_EQ((*results)[1].reward, 31);
  EXPECT_EQ((*results)[2].reward, 32);
  group[1].response = "error";
  auto failed = (*model)->ScoreGroup(group);
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(Message(failed.status()).find("group member 1 refused"), std::string::npos);
}

TEST(PluginTest, WorkersDoNotHoldTheParentsDescriptors) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);  // inherited across fork (no CLOEXEC)
  auto model = RewardModel::Create(PluginModel(PLUGIN_GOOD));
  ASSERT_TRUE(model.ok()) << model.status();
  ::close(fds[1]);
  // If the worker had kept the write end, this read would block instead of seeing EOF.
  pollfd p{fds[0], POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 2000), 1);
  char c;
  EXPECT_EQ(::read(fds[0], &c, 1), 0);
  ::close(fds[0]);
}

TEST(PluginTest, ExamplePlugin) {
  ::setenv("KEYWORD_REWARD_MISS", "-0.25", 1);
  auto model = RewardModel::Create(PluginModel(PLUGIN_EXAMPLE));
  ASSERT_TRUE(model.ok()) << model.status();
  const std::string hit =
      "<think>France's capital... Lyon? No, Paris.</think>\nLet me state it clearly.\n"
      "The answer is PARIS.\n";
  EXPECT_EQ((*model)->Score({.response = hit, .label = "Paris"})->reward, 1.0);
  EXPECT_EQ((*model)->Score({.response = "<think>Paris</think>\nLyon", .label = "Paris"})->reward,
            -0.25);
  nlohmann::json meta = {{"max_chars", 20}};
  EXPECT_EQ((*model)->Score({.response = hit, .label = "Paris", .metadata = &meta})->reward, 0.5);
  EXPECT_FALSE((*model)->Score({.response = hit}).ok());  // no label
  ::unsetenv("KEYWORD_REWARD_MISS");
  ::setenv("KEYWORD_REWARD_MISS", "lots", 1);
  auto bad_env = RewardModel::Create(PluginModel(PLUGIN_EXAMPLE));
  ::unsetenv("KEYWORD_REWARD_MISS");
  EXPECT_NE(Message(bad_env.status()).find("KEYWORD_REWARD_MISS=\"lots\""), std::string::npos)
      << bad_env.status();
}

}  // namespace
}  // namespace slime::reward
