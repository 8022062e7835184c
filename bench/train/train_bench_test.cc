// CPU smoke test of the real train_bench binary on a tiny random Qwen3 model: both modes run 2
// timed steps and report finite, positive tokens/s (no timing assertion); the token-id file
// written for bench_train_hf.py follows the documented format and generator; bad options are
// reported with the option named.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "slime/model/config.h"
#include "slime/model/weights.h"

#ifndef SLIME_MODEL_TEST_DATA_DIR
#define SLIME_MODEL_TEST_DATA_DIR ""  // test_util.h's data dir is not used here
#endif
#include "../../tests/model/test_util.h"

namespace {

using slime::model::testing::TempDir;

struct BenchResult {
  int exit_code = -1;
  std::string out, err;
};

// `train_bench <args>`, stdout and stderr captured.
BenchResult RunTrainBench(const TempDir& dir, const std::string& args) {
  const std::string err_path = dir.Join("stderr.txt");
  const std::string cmd =
      std::string("'") + SLIME_TRAIN_BENCH_BIN + "' " + args + " 2>'" + err_path + "'";
  BenchResult r;
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.out.append(buf.data(), n);
  const int status = ::pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = slime::model::testing::ReadFile(err_path);
  return r;
}

// The tiny Qwen3 config (vocab 101) with random float32 weights.
std::string MakeModelDir(const TempDir& dir) {
  const std::string path = dir.Join("model");
  auto config =
      slime::model::ParseModelConfigJson(slime::model::testing::TinyQwen3ConfigJson(), "tiny");
  EXPECT_TRUE(config.ok()) << config.status();
  auto weights = slime::model::RandomWeights(*config, 3, {});
  EXPECT_TRUE(weights.ok()) << weights.status();
  slime::model::testing::WriteFile(path + "/config.json",
                                   slime::model::testing::TinyQwen3ConfigJson());
  const slime::Status saved = slime::model::SaveWeights(path, *weights, *config);
  EXPECT_TRUE(saved.ok()) << saved;
  return path;
}

TEST(TrainBenchTest, BothModesReportFiniteThroughputOnTheCpu) {
  TempDir dir;
  const std::string model = MakeModelDir(dir);
  const std::string json = dir.Join("out.json");
  const BenchResult r = RunTrainBench(
      dir, "--model '" + model +
               "' --device cpu --dtype float32 --seq-len 32 "
               "--max-tokens-per-gpu 64 --samples-per-step 4 --steps 2 --warmup 1 --mode rl,sft "
               "--json '" +
               json + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("| case | samples/step | seq len |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| slime-cpp rl (GRPO TrainRollout) | 4 | 32 | 64 | 2 |"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("| slime-cpp sft (SftStep) | 4 | 32 | 64 | 2 |"), std::string::npos)
      << r.out;

  const nlohmann::json j = nlohmann::json::parse(slime::model::testing::ReadFile(json));
  ASSERT_EQ(j["rows"].size(), 2u) << j.dump(2);
  EXPECT_EQ(j["rows"][0]["mode"], "rl");
  EXPECT_EQ(j["rows"][1]["mode"], "sft");
  EXPECT_TRUE(j["peak_tflops"].is_null());  // no MFU on the CPU
  for (const nlohmann::json& row : j["rows"]) {
    const double tps = row["tokens_per_s"].get<double>();
    EXPECT_TRUE(std::isfinite(tps) && tps > 0) << row.dump();
    EXPECT_EQ(row["step_s"].size(), 2u);
    EXPECT_EQ(row["micro_batches_per_step"], 2);
    EXPECT_TRUE(row["loss_last"].is_number()) << row.dump();
    EXPECT_TRUE(row["mfu"].is_null());
    EXPECT_TRUE(row["peak_memory_bytes"].is_null());
    EXPECT_EQ(row["skipped_steps"], 0);
    // FLOPs per step = 3 × samples × forward FLOPs of one sequence (batching.h's formula).
    EXPECT_DOUBLE_EQ(row["flops_per_step"].get<double>(),
                     3.0 * 4 * j["forward_flops_per_sample"].get<double>());
  }
}

// --recompute: one Trainer and row per setting (named with the setting); --find-max-seq-len:
// the search's plumbing (on the CPU nothing runs out of memory, so every probe up to the cap
// fits and there is no failure to report).
TEST(TrainBenchTest, RecomputeSettingsAndTheLongestSequenceSearch) {
  TempDir dir;
  const std::string model = MakeModelDir(dir);
  const std::string json = dir.Join("out.json");
  const BenchResult r = RunTrainBench(
      dir, "--model '" + model +
               "' --device cpu --dtype float32 --seq-len 16 --max-tokens-per-gpu 32 "
               "--samples-per-step 2 --steps 1 --warmup 0 --mode rl "
               "--recompute none,full:uniform:1,selective --find-max-seq-len 48 "
               "--search-steps 1 --json '" +
               json + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("| slime-cpp rl (GRPO TrainRollout) | 2 | 16 |"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("| slime-cpp rl (GRPO TrainRollout), recompute full:uniform:1 | 2 | 16 |"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("| full:uniform:1 | 48 | – |"), std::string::npos) << r.out;
  const nlohmann::json j = nlohmann::json::parse(slime::model::testing::ReadFile(json));
  ASSERT_EQ(j["rows"].size(), 3u) << j.dump(2);
  EXPECT_EQ(j["rows"][1]["recompute"], "full:uniform:1");
  EXPECT_EQ(j["rows"][2]["recompute"], "selective");
  // The same samples and weights: recomputation changes neither the loss nor the gradients.
  EXPECT_EQ(j["rows"][0]["loss_last"], j["rows"][1]["loss_last"]);
  EXPECT_EQ(j["rows"][0]["grad_norm_last"], j["rows"][1]["grad_norm_last"]);
  EXPECT_EQ(j["rows"][0]["grad_norm_last"], j["rows"][2]["grad_norm_last"]);
  ASSERT_EQ(j["max_seq_len"].size(), 3u) << j.dump(2);
  for (const nlohmann::json& s : j["max_seq_len"]) {
    EXPECT_EQ(s["longest_fit"], 48) << s.dump();  // 16, 32, then the cap
    EXPECT_TRUE(s["first_oom"].is_null()) << s.dump();
  }

  BenchResult bad = RunTrainBench(dir, "--model '" + model + "' --device cpu --recompute full:x:1");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--recompute"), std::string::npos) << bad.err;
  bad = RunTrainBench(dir, "--model '" + model +
                               "' --device cpu --dtype float32 --seq-len 16 --max-tokens-per-gpu "
                               "32 --samples-per-step 2 --steps 1 --recompute full:block:5");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("train.recompute_num_layers = 5 is not within 1..2"), std::string::npos)
      << bad.err;
}

// The file bench_train_hf.py --data reads: a header line, then little-endian int32 ids from the
// SplitMix64 generator of the file comment (golden values computed independently in Python).
TEST(TrainBenchTest, WritesTheDocumentedTokenIdFile) {
  TempDir dir;
  const std::string model = MakeModelDir(dir);
  const std::string ids = dir.Join("ids.bin");
  const BenchResult r = RunTrainBench(
      dir, "--model '" + model +
               "' --device cpu --dtype float32 --seq-len 16 "
               "--max-tokens-per-gpu 32 --samples-per-step 2 --steps 1 --warmup 1 --mode sft "
               "--write-data '" +
               ids + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string bytes = slime::model::testing::ReadFile(ids);
  const std::string header = "slime-train-bench-ids v1 samples=4 seq_len=16 vocab=101 seed=0\n";
  ASSERT_EQ(bytes.substr(0, header.size()), header);
  ASSERT_EQ(bytes.size(), header.size() + 4 * 16 * 4);
  std::vector<int32_t> v(4 * 16);
  std::memcpy(v.data(), bytes.data() + header.size(), v.size() * 4);  // little-endian host
  const std::vector<int32_t> golden = {67, 26, 88, 12, 14, 87, 73, 81};
  for (size_t i = 0; i < golden.size(); ++i) EXPECT_EQ(v[i], golden[i]) << "id " << i;
  for (int32_t id : v) EXPECT_TRUE(id >= 0 && id < 101) << id;
  EXPECT_FALSE(std::filesystem::exists(ids + ".tmp"));
}

TEST(TrainBenchTest, BadOptionsNameTheOption) {
  TempDir dir;
  const std::string model = MakeModelDir(dir);
  BenchResult r = RunTrainBench(
      dir, "--model '" + model + "' --device cpu --seq-len 100 --max-tokens-per-gpu 64");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--seq-len"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--max-tokens-per-gpu 64"), std::string::npos) << r.err;

  r = RunTrainBench(dir, "--model '" + model + "' --device cpu --mode ppo");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--mode"), std::string::npos) << r.err;

  const std::string empty = dir.Join("empty");
  std::filesystem::create_directories(empty);
  r = RunTrainBench(dir, "--model '" + empty + "' --device cpu");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("config.json"), std::string::npos) << r.err;
}

}  // namespace
