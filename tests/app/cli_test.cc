// Runs the real slime_train binary (SLIME_TRAIN_BIN, set by ctest) and checks its command line:
// --version, --help, --dry-run placement for the shipped configs in colocated and disaggregated
// layouts, and that bad input exits non-zero with a message naming the problem.
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace {

struct Result {
  int exit_code = -1;
  std::string out;
  std::string err;
};

std::string SourceDir() {
  const char* v = std::getenv("SLIME_SOURCE_DIR");
  return v != nullptr && *v != '\0' ? v : SLIME_SOURCE_DIR_DEFAULT;
}

std::string TrainBin() {
  const char* v = std::getenv("SLIME_TRAIN_BIN");
  return v != nullptr && *v != '\0' ? v : SLIME_TRAIN_BIN_DEFAULT;
}

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs `slime_train <args>` from the source directory (so configs/ resolves).
Result RunSlime(const std::string& args) {
  static int counter = 0;
  auto err_path = std::filesystem::temp_directory_path() /
                  ("slime_cli_test_" + std::to_string(::getpid()) + "_" +
                   std::to_string(counter++) + ".err");
  std::string cmd = "cd '" + SourceDir() + "' && SLIME_TINY_MODEL=/tmp/tiny '" +
                    TrainBin() + "' " + args + " 2>'" + err_path.string() + "'";
  Result r;
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) {
    ADD_FAILURE() << "popen failed for " << cmd;
    return r;
  }
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.out.append(buf.data(), n);
  int status = ::pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = ReadFile(err_path);
  std::filesystem::remove(err_path);
  return r;
}

int CountLines(const std::string& text, const std::string& prefix) {
  int n = 0;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(prefix, 0) == 0) ++n;
  }
  return n;
}

TEST(CliTest, VersionReportsTorchCudaAndNccl) {
  Result r = RunSlime("--version");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("slime_train 0."), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("torch: "), std::string::npos);
  EXPECT_NE(r.out.find("cuda: "), std::string::npos);
  EXPECT_NE(r.out.find("nccl: "), std::string::npos);
}

TEST(CliTest, HelpListsSubcommands) {
  Result r = RunSlime("--help");
  EXPECT_EQ(r.exit_code, 0);
  for (const char* sub : {"train", "serve", "agent", "worker", "convert", "init-model"}) {
    EXPECT_NE(r.out.find(sub), std::string::npos) << sub << " missing from\n" << r.out;
  }
}

TEST(CliTest, DryRunTinyCpuIsDisaggregatedOnCpuSlots) {
  Result r = RunSlime("--config configs/grpo-tiny-cpu.yaml --dry-run");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("# resolved configuration"), std::string::npos);
  EXPECT_NE(r.out.find("cluster:"), std::string::npos);
  EXPECT_NE(r.out.find("summary: disaggregated"), std::string::npos) << r.out;
  EXPECT_EQ(CountLines(r.out, "  engine "), 2) << r.out;
  EXPECT_EQ(CountLines(r.out, "  trainer "), 1) << r.out;
  EXPECT_NE(r.out.find("cpu 1"), std::string::npos) << r.out;
}

TEST(CliTest, DryRunQwen3_4BRecipeIsColocatedTp2OnEightGpus) {
  Result r = RunSlime("--config configs/qwen3-4b-grpo-8gpu.yaml --dry-run");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("DP 4 × TP 2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("engines 4 × 2 GPUs"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("summary: colocated"), std::string::npos) << r.out;
  EXPECT_EQ(CountLines(r.out, "  trainer "), 8);
}

TEST(CliTest, DryRunDisaggregatedOverTwoNodesUsesDisjointNodes) {
  Result r = RunSlime(
      "--config configs/qwen3-4b-grpo-8gpu.yaml --dry-run --set cluster.colocate=false "
      "--set cluster.num_nodes=2 --set cluster.rollout_num_gpus=8");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("summary: disaggregated"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("node0 8/8, node1 8/8"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("engine  0    node1 gpu 0-1"), std::string::npos) << r.out;
}

TEST(CliTest, DryRunWritesNothing) {
  auto run_dir = std::filesystem::temp_directory_path() /
                 ("slime_cli_dry_" + std::to_string(::getpid()));
  std::filesystem::remove_all(run_dir);
  Result r = RunSlime("--config configs/grpo-tiny-cpu.yaml --dry-run --set cluster.run_dir=" +
                 run_dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(std::filesystem::exists(run_dir));
}

TEST(CliTest, NotEnoughGpusIsAClearPlacementError) {
  Result r = RunSlime(
      "--config configs/qwen3-4b-grpo-8gpu.yaml --dry-run --set cluster.colocate=false "
      "--set cluster.rollout_num_gpus=4");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("needs 12 GPUs"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("cluster.num_nodes"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("terminate"), std::string::npos) << r.err;
}

TEST(CliTest, UnknownKeySuggestsTheRightOne) {
  Result r = RunSlime("--config configs/grpo-tiny-cpu.yaml --dry-run --set algorithm.eps_clp=0.3");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("algorithm.eps_clp"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("did you mean 'algorithm.eps_clip'"), std::string::npos) << r.err;
}

TEST(CliTest, MissingConfigFileIsNamed) {
  Result r = RunSlime("--config configs/does-not-exist.yaml --dry-run");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("configs/does-not-exist.yaml"), std::string::npos) << r.err;
}

TEST(CliTest, BadLogLevelListsValidLevels) {
  Result r = RunSlime("--config configs/grpo-tiny-cpu.yaml --dry-run --log-level loud");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("'loud'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("'debug'"), std::string::npos) << r.err;
}

TEST(CliTest, ValidationErrorExitsWithoutStackTrace) {
  Result r = RunSlime("--config configs/grpo-tiny-cpu.yaml --dry-run --set rollout.temperature=0");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("rollout.temperature"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("terminate"), std::string::npos) << r.err;
}

TEST(CliTest, ExplicitTrainSubcommandEqualsDefault) {
  Result a = RunSlime("--config configs/grpo-tiny-cpu.yaml --dry-run");
  Result b = RunSlime("train --config configs/grpo-tiny-cpu.yaml --dry-run");
  EXPECT_EQ(a.exit_code, 0);
  EXPECT_EQ(a.out, b.out);
}

TEST(CliTest, SubcommandsNotBuiltYetSaySo) {
  Result r = RunSlime("convert --from /tmp/a --to-hf /tmp/b");
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_NE(r.err.find("not built yet"), std::string::npos) << r.err;
}

TEST(CliTest, MissingRequiredOptionIsAUsageError) {
  Result r = RunSlime("serve");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--model"), std::string::npos) << r.err;
}

}  // namespace
