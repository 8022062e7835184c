// Runs the real slime_train binary (SLIME_TRAIN_BIN, set by ctest) and checks its command line:
// --version, --help, --dry-run placement for the shipped configs in colocated and disaggregated
// layouts, and that bad input exits non-zero with a message naming the problem (refused keys and
// missing input files included, the latter with the same message as a real start).
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "test_paths.h"

namespace {

struct RunResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

using slime::testing::SourceDir;
using slime::testing::TrainBin;

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The input files of the shipped configs, empty (--dry-run checks that they exist, no more),
// under a temporary directory removed at exit; the configs find them through their ${...}s.
class InputFiles {
 public:
  InputFiles() {
    root_ = std::filesystem::temp_directory_path() /
            ("slime_cli_inputs_" + std::to_string(::getpid()));
    for (const char* file : {"model/config.json", "model/tokenizer.json", "tiny/train.jsonl",
                             "tiny/eval.jsonl", "data/dapo-math-17k/dapo-math-17k.jsonl",
                             "data/aime-2024/aime-2024.jsonl"}) {
      std::filesystem::create_directories((root_ / file).parent_path());
      std::ofstream(root_ / file) << "\n";
    }
  }
  ~InputFiles() {
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }
  // The environment that points the shipped configs at the files.
  std::string Env() const {
    const std::string r = root_.string();
    return "SLIME_TINY_MODEL='" + r + "/model' SLIME_TINY_DATA='" + r +
           "/tiny/train.jsonl' SLIME_TINY_EVAL='" + r + "/tiny/eval.jsonl' QWEN3_4B='" + r +
           "/model' QWEN3_0_6B='" + r + "/model' QWEN3_30B_A3B='" + r + "/model' SLIME_DATA_DIR='" + r +
           "/data'";
  }
  const std::filesystem::path& root() const { return root_; }

 private:
  std::filesystem::path root_;
};

const InputFiles& Inputs() {
  static const InputFiles files;
  return files;
}

// Runs `slime_train <args>` from the source directory (so configs/ resolves).
RunResult RunSlime(const std::string& args) {
  static int counter = 0;
  auto err_path = std::filesystem::temp_directory_path() /
                  ("slime_cli_test_" + std::to_string(::getpid()) + "_" +
                   std::to_string(counter++) + ".err");
  std::string cmd = "cd '" + SourceDir() + "' && " + Inputs().Env() + " '" + TrainBin() + "' " +
                    args + " 2>'" + err_path.string() + "'";
  RunResult r;
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
  RunResult r = RunSlime("--version");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("slime_train 0."), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("torch: "), std::string::npos);
  EXPECT_NE(r.out.find("cuda: "), std::string::npos);
  EXPECT_NE(r.out.find("nccl: "), std::string::npos);
}

TEST(CliTest, HelpListsSubcommands) {
  RunResult r = RunSlime("--help");
  EXPECT_EQ(r.exit_code, 0);
  for (const char* sub :
       {"train", "serve", "agent", "worker", "status", "convert", "init-model", "sft"}) {
    EXPECT_NE(r.out.find(sub), std::string::npos) << sub << " missing from\n" << r.out;
  }
}

TEST(CliTest, DryRunTinyCpuIsDisaggregatedOnCpuSlots) {
  RunResult r = RunSlime("--config configs/grpo-tiny-cpu.yaml --dry-run");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("# resolved configuration"), std::string::npos);
  EXPECT_NE(r.out.find("cluster:"), std::string::npos);
  EXPECT_NE(r.out.find("summary: disaggregated"), std::string::npos) << r.out;
  EXPECT_EQ(CountLines(r.out, "  engine "), 2) << r.out;
  EXPECT_EQ(CountLines(r.out, "  trainer "), 1) << r.out;
  EXPECT_NE(r.out.find("cpu 1"), std::string::npos) << r.out;
}

TEST(CliTest, DryRunQwen3_4BRecipeIsColocatedTp2OnEightGpus) {
  RunResult r = RunSlime("--config configs/qwen3-4b-grpo-8gpu.yaml --dry-run");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("DP 4 × TP 2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("engines 4 × 2 GPUs"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("summary: colocated"), std::string::npos) << r.out;
  EXPECT_EQ(CountLines(r.out, "  trainer "), 8);
}

TEST(CliTest, DryRunQwen3_30bA3bRecipeIsColocatedWithEightWayExpertParallelism) {
  RunResult r = RunSlime("--config configs/qwen3-30b-a3b-grpo-8gpu.yaml --dry-run");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("DP 8 × TP 1 × PP 1 × CP 1 (DP = EP 8 × expert-DP 1)"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("expert_model_parallel_size: 8"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("engines 8 × 1 GPU"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("summary: colocated"), std::string::npos) << r.out;
  EXPECT_EQ(CountLines(r.out, "  trainer "), 8);
}

TEST(CliTest, DryRunDisaggregatedOverTwoNodesUsesDisjointNodes) {
  RunResult r = RunSlime(
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
  RunResult r = RunSlime("--config configs/grpo-tiny-cpu.yaml --dry-run --set cluster.run_dir=" +
                 run_dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(std::filesystem::exists(run_dir));
}

TEST(CliTest, NotEnoughGpusIsAClearPlacementError) {
  RunResult r = RunSlime(
      "--config configs/qwen3-4b-grpo-8gpu.yaml --dry-run --set cluster.colocate=false "
      "--set cluster.rollout_num_gpus=4");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("needs 12 GPUs"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("cluster.num_nodes"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("terminate"), std::string::npos) << r.err;
}

TEST(CliTest, TheAsyncLoopsRefuseWhatTheyCannotHonour) {
  const std::string job = "--config configs/grpo-tiny-cpu.yaml --dry-run ";
  struct Case {
    std::string args;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {"--set rollout.max_staleness=2",
            "rollout.max_staleness is for the fully asynchronous loop only"},
           {"--async --set rollout.max_staleness=2",
            "rollout.max_staleness is for the fully asynchronous loop only"},
           {"--set rollout.stale_samples=drop",
            "rollout.stale_samples is for the fully asynchronous loop only"},
           {"--fully-async --set rollout.stale_samples=regenerate",
            "rollout.stale_samples: regenerate starts samples continued by "
            "rollout.partial_rollout over"},
           {"--fully-async --set rollout.stale_samples=resample", "rollout.stale_samples"},
           {"--async --fully-async", "--async and --fully-async are two different loops"},
           {"--fully-async --set cluster.colocate=true", "--fully-async: cluster.colocate is true"},
           {"--fully-async --set weight_sync.interval=3",
            "weight_sync.interval 3 lets the engines' weights fall 2 versions behind, more than "
            "rollout.max_staleness 1 allows"},
           {"--fully-async --set debug.rollout_only=true", "debug.rollout_only leaves only one"},
           {"--fully-async --set rollout.max_staleness=-1", "rollout.max_staleness"},
       }) {
    RunResult r = RunSlime(job + c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.args << "\n" << r.err;
  }
  // Within the bound: the plan prints; so it does colocated without offload (engines and
  // trainers share each device at once).
  RunResult ok = RunSlime(job +
                          "--fully-async --set weight_sync.interval=3 --set rollout.max_staleness=2");
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  ok = RunSlime(job +
                "--fully-async --set rollout.partial_rollout=true "
                "--set rollout.stale_samples=regenerate");
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  for (const char* loop : {"--fully-async", "--async"}) {
    ok = RunSlime(job + loop +
                  " --set cluster.colocate=true --set cluster.offload_train=false"
                  " --set cluster.offload_rollout=false");
    EXPECT_EQ(ok.exit_code, 0) << loop << "\n" << ok.err;
  }
}

TEST(CliTest, UnknownKeySuggestsTheRightOne) {
  RunResult r = RunSlime("--config configs/grpo-tiny-cpu.yaml --dry-run --set algorithm.eps_clp=0.3");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("algorithm.eps_clp"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("did you mean 'algorithm.eps_clip'"), std::string::npos) << r.err;
}

TEST(CliTest, UnknownLossOrEstimatorListsTheValidNames) {
  RunResult r =
      RunSlime("--config configs/grpo-tiny-cpu.yaml --dry-run --set algorithm.loss_type=dpo_loss");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("algorithm.loss_type: 'dpo_loss' is not one of 'policy_loss', 'sft_loss'"),
            std::string::npos)
      << r.err;
  r = RunSlime(
      "--config configs/grpo-tiny-cpu.yaml --dry-run --set algorithm.advantage_estimator=rloo");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("algorithm.advantage_estimator: 'rloo' is not one of 'grpo'"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("'ppo'"), std::string::npos) << r.err;
}

TEST(CliTest, MissingConfigFileIsNamed) {
  RunResult r = RunSlime("--config configs/does-not-exist.yaml --dry-run");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("configs/does-not-exist.yaml"), std::string::npos) << r.err;
}

TEST(CliTest, BadLogLevelListsValidLevels) {
  RunResult r = RunSlime("--config configs/grpo-tiny-cpu.yaml --dry-run --log-level loud");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("'loud'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("'debug'"), std::string::npos) << r.err;
}

TEST(CliTest, ValidationErrorExitsWithoutStackTrace) {
  RunResult r = RunSlime("--config configs/grpo-tiny-cpu.yaml --dry-run --set rollout.temperature=0");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("rollout.temperature"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("terminate"), std::string::npos) << r.err;
}

TEST(CliTest, DryRunRefusesAKeyWhoseFeatureIsNotThere) {
  RunResult r =
      RunSlime("--config configs/grpo-tiny-cpu.yaml --dry-run --set weight_sync.mode=delta");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("weight_sync.mode = delta: not supported (delta weight sync is later work)"),
            std::string::npos)
      << r.err;
  r = RunSlime("--config configs/grpo-tiny-cpu.yaml --dry-run --set train.context_parallel_size=2");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("train.context_parallel_size = 2: not supported"), std::string::npos)
      << r.err;
}

TEST(CliTest, DryRunNamesEachMissingInputFile) {
  RunResult r = RunSlime(
      "--config configs/grpo-tiny-cpu.yaml --dry-run --set model.hf_checkpoint=/nonexistent/model "
      "--set 'data.prompt_data=/nonexistent/train.jsonl@[0:8]' "
      "--set 'eval.datasets=[{name: held_out, path: /nonexistent/eval.jsonl}]'");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_EQ(r.out.find("# placement plan"), std::string::npos) << r.out;
  for (const char* line :
       {"3 input files are missing:",
        "model.hf_checkpoint: /nonexistent/model does not exist (expected a Hugging Face model "
        "directory with config.json and tokenizer.json)",
        "data.prompt_data: /nonexistent/train.jsonl does not exist (expected a .jsonl prompt "
        "dataset)",
        "eval.datasets[0].path (dataset 'held_out'): /nonexistent/eval.jsonl does not exist"}) {
    EXPECT_NE(r.err.find(line), std::string::npos) << line << "\n" << r.err;
  }
}

TEST(CliTest, DryRunNamesAModelDirectoryWithoutItsTokenizer) {
  const std::filesystem::path model = Inputs().root() / "model-without-tokenizer";
  std::filesystem::create_directories(model);
  std::ofstream(model / "config.json") << "{}\n";
  RunResult r = RunSlime(
      "--config configs/grpo-tiny-cpu.yaml --dry-run --set model.hf_checkpoint=" + model.string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("model.hf_checkpoint: " + (model / "tokenizer.json").string() +
                       " does not exist (expected the tokenizer, read from the model directory)"),
            std::string::npos)
      << r.err;
}

// The first line starting with `prefix`, or "".
std::string LineStartingWith(const std::string& text, const std::string& prefix) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(prefix, 0) == 0) return line;
  }
  return "";
}

TEST(CliTest, DryRunReportsAMissingFileAsTheRealStartDoes) {
  const std::filesystem::path run_dir = Inputs().root() / "run";
  const std::string args = "--config configs/grpo-tiny-cpu.yaml --set cluster.run_dir=" +
                           run_dir.string() + " --set data.prompt_data=/nonexistent/train.jsonl";
  RunResult dry = RunSlime(args + " --dry-run");
  RunResult start = RunSlime(args);  // fails in the driver's setup, before any process starts
  EXPECT_EQ(dry.exit_code, 2) << dry.err;
  EXPECT_EQ(start.exit_code, 2) << start.err;
  const std::string error = LineStartingWith(dry.err, "slime_train: error: ");
  EXPECT_NE(error.find("data.prompt_data: /nonexistent/train.jsonl does not exist"),
            std::string::npos)
      << dry.err;
  EXPECT_EQ(LineStartingWith(start.err, "slime_train: error: "), error) << start.err;
}

TEST(CliTest, ExplicitTrainSubcommandEqualsDefault) {
  RunResult a = RunSlime("--config configs/grpo-tiny-cpu.yaml --dry-run");
  RunResult b = RunSlime("train --config configs/grpo-tiny-cpu.yaml --dry-run");
  EXPECT_EQ(a.exit_code, 0);
  EXPECT_EQ(a.out, b.out);
}

std::filesystem::path TestDataDir() {
  const char* v = std::getenv("SLIME_TEST_DATA");
  return v != nullptr && *v != '\0' ? std::filesystem::path(v)
                                     : std::filesystem::path(SourceDir()) / ".cache/testdata";
}

TEST(CliTest, InitModelWritesALoadableHfDirectory) {
  auto tokenizer = TestDataDir() / "qwen3";
  ASSERT_TRUE(std::filesystem::exists(tokenizer / "tokenizer.json"))
      << tokenizer << " missing: run scripts/fetch_test_data.sh";
  auto out = std::filesystem::temp_directory_path() /
             ("slime_cli_init_" + std::to_string(::getpid()));
  std::filesystem::remove_all(out);
  RunResult r = RunSlime("init-model --config tests/data/model/configs/qwen3-tiny.json --tokenizer " +
                         tokenizer.string() + " --out " + out.string() + " --seed 7 --dtype fp32");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json",
                        "tokenizer_config.json"}) {
    EXPECT_TRUE(std::filesystem::exists(out / f)) << f;
  }
  // Same seed, same bytes.
  auto again = out.string() + "_again";
  std::filesystem::remove_all(again);
  r = RunSlime("init-model --config tests/data/model/configs/qwen3-tiny.json --tokenizer " +
               tokenizer.string() + " --out " + again + " --seed 7 --dtype fp32");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(ReadFile(out / "model.safetensors"),
            ReadFile(std::filesystem::path(again) / "model.safetensors"));
  std::filesystem::remove_all(out);
  std::filesystem::remove_all(again);
}

TEST(CliTest, InitModelBadConfigIsNamed) {
  RunResult r = RunSlime("init-model --config /nonexistent/config.json --tokenizer /tmp --out /tmp/x");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("/nonexistent/config.json"), std::string::npos) << r.err;
}

TEST(CliTest, AgentWithoutJobTokenIsAUsageError) {
  RunResult r = RunSlime("agent --head 127.0.0.1:1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("no job token"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--token-file"), std::string::npos) << r.err;
}

TEST(CliTest, MissingRequiredOptionIsAUsageError) {
  RunResult r = RunSlime("serve");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--model"), std::string::npos) << r.err;
}

}  // namespace
