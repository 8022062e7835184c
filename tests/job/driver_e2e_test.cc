// The real `slime_train --config` on a tiny random Qwen3 model on CPU: the driver starts a
// trainer and two engines as worker processes, runs slime's loop (eval → generate → train →
// save → Gloo weight sync → eval), writes metrics, resumes from its checkpoint, serves
// Prometheus /metrics (checked with promtool) and stops cleanly on SIGTERM.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "promtool.h"
#include "remove_tree.h"
#include "slime/http/client.h"

namespace slime {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;

std::string SourceDir() {
  const char* env = std::getenv("SLIME_SOURCE_DIR");
  return env != nullptr && *env != '\0' ? env : SLIME_SOURCE_DIR_DEFAULT;
}
std::string TrainBin() {
  const char* v = std::getenv("SLIME_TRAIN_BIN");
  return v != nullptr && *v != '\0' ? v : SLIME_TRAIN_BIN_DEFAULT;
}
fs::path TestDataDir() {
  const char* v = std::getenv("SLIME_TEST_DATA");
  return v != nullptr && *v != '\0' ? fs::path(v) : fs::path(SourceDir()) / ".cache/testdata";
}
std::string ReadFile(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// slime_train in its own process group, stdout and stderr to files, run from the source dir.
class Child {
 public:
  Child(std::vector<std::string> args, const fs::path& dir) : out_(dir / "stdout"), err_(dir / "stderr") {
    args.insert(args.begin(), TrainBin());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::string out = out_.string(), err = err_.string(), src = SourceDir();
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setpgid(0, 0);
      int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (o >= 0) ::dup2(o, STDOUT_FILENO);
      if (e >= 0) ::dup2(e, STDERR_FILENO);
      if (::chdir(src.c_str()) != 0) ::_exit(126);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::setpgid(pid_, pid_);
  }
  ~Child() {
    if (pid_ > 0 && !exit_code_) {
      ::kill(-pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  // The exit code (128+N for a signal), or nullopt after `timeout`.
  std::optional<int> Wait(std::chrono::seconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (!exit_code_ && Clock::now() < deadline) {
      int status = 0;
      pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return exit_code_;
  }
  void Signal(int sig) { ::kill(pid_, sig); }
  std::string out() const { return ReadFile(out_); }
  std::string err() const { return ReadFile(err_); }

 private:
  fs::path out_, err_;
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
};

std::vector<Json> ReadJsonl(const fs::path& path) {
  std::vector<Json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) out.push_back(Json::parse(line));
  }
  return out;
}

class DriverE2eTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const fs::path tokenizer = TestDataDir() / "qwen3";
    if (!fs::exists(tokenizer / "tokenizer.json")) {
      skip_ = new std::string(tokenizer.string() + " missing: run scripts/fetch_test_data.sh");
      return;
    }
    root_ = new fs::path(fs::temp_directory_path() / ("slime_driver_e2e_" + std::to_string(::getpid())));
    testing::RemoveTree(*root_);
    fs::create_directories(*root_);
    Child init({"init-model", "--config", SourceDir() + "/tests/data/model/configs/qwen3-tiny.json",
                "--tokenizer", tokenizer.string(), "--out", (*root_ / "model").string(), "--dtype",
                "fp32", "--seed", "3"},
               *root_);
    std::optional<int> code = init.Wait(std::chrono::seconds(120));
    if (code != 0) init_error_ = new std::string("init-model failed: " + init.err());
  }
  static void TearDownTestSuite() {
    if (root_ != nullptr) testing::RemoveTree(*root_);
    delete root_;
    root_ = nullptr;
  }
  void SetUp() override {
    if (skip_ != nullptr) GTEST_SKIP() << *skip_;
    if (init_error_ != nullptr) FAIL() << *init_error_;
    dir_ = *root_ / ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::create_directories(dir_);
  }

  // A config for the tiny model: 2 engines + 1 trainer on CPU slots, 4 prompts × 2 samples of
  // at most 6 tokens per rollout, eval on 6 held-out prompts every rollout.
  fs::path WriteConfig(int num_rollout, const std::string& extra = "") {
    const std::string src = SourceDir();
    std::string yaml = "cluster:\n"
                       "  device: cpu\n"
                       "  cpu_slots_per_node: 4\n"
                       "  actor_num_nodes: 1\n"
                       "  actor_num_gpus_per_node: 1\n"
                       "  rollout_num_gpus: 2\n"
                       "  rollout_num_gpus_per_engine: 1\n"
                       "  run_dir: " + (dir_ / "run").string() + "\n"
                       "model:\n"
                       "  hf_checkpoint: " + (*root_ / "model").string() + "\n"
                       "data:\n"
                       "  prompt_data: " + src + "/data/demo/train.jsonl@[0:40]\n"
                       "  label_key: label\n"
                       "  apply_chat_template: true\n"
                       "  rollout_batch_size: 4\n"
                       "  n_samples_per_prompt: 2\n"
                       "  num_rollout: " + std::to_string(num_rollout) + "\n"
                       "eval:\n"
                       "  interval: 1\n"
                       "  temperature: 0.0\n"
                       "  datasets:\n"
                       "    - name: add2\n"
                       "      path: " + src + "/data/demo/eval.jsonl@[0:6]\n"
                       "rollout:\n"
                       "  max_response_len: 6\n"
                       "  shuffle: true\n"
                       "reward:\n"
                       "  rm_type: exact_match\n"
                       "train:\n"
                       "  bf16: false\n"
                       "  lr: 1.0e-4\n"
                       "  global_batch_size: 8\n"
                       "  micro_batch_size: 4\n"
                       "checkpoint:\n"
                       "  save: " + (dir_ / "ckpt").string() + "\n"
                       "  load: " + (dir_ / "ckpt").string() + "\n"
                       "  save_interval: 1\n" + extra;
    const fs::path path = dir_ / "job.yaml";
    std::ofstream(path) << yaml;
    return path;
  }

  static std::string* skip_;
  static std::string* init_error_;
  static fs::path* root_;
  fs::path dir_;
};
std::string* DriverE2eTest::skip_ = nullptr;
std::string* DriverE2eTest::init_error_ = nullptr;
fs::path* DriverE2eTest::root_ = nullptr;

TEST_F(DriverE2eTest, TrainsSavesAndAnInterruptedRunResumesAtTheNextRollout) {
  const fs::path config = WriteConfig(3);
  {
    // Interrupted (SIGTERM) once rollout 1 is trained, saved, synced and evaluated.
    Child run({"--config", config.string()}, dir_);
    const auto deadline = Clock::now() + std::chrono::seconds(400);
    while (run.out().find("rollout 1/3 |") == std::string::npos && Clock::now() < deadline &&
           !run.Wait(std::chrono::seconds(0))) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    run.Signal(SIGTERM);
    std::optional<int> code = run.Wait(std::chrono::seconds(60));
    ASSERT_EQ(code, 128 + SIGTERM) << "stdout:\n" << run.out() << "\nstderr:\n" << run.err();
    const std::string out = run.out();
    EXPECT_NE(out.find("eval @ rollout 0 | add2"), std::string::npos) << out;
    EXPECT_NE(out.find("rollout 0/3 | reward"), std::string::npos) << out;
    EXPECT_NE(run.err().find("stopped by signal"), std::string::npos) << run.err();
  }
  // The checkpoint of rollout 1, with the data source's position beside it.
  EXPECT_EQ(ReadFile(dir_ / "ckpt" / "latest_checkpointed_iteration.txt").substr(0, 1), "1");
  EXPECT_TRUE(fs::exists(dir_ / "ckpt" / "rollout" / "data_source_state_1.json"));
  EXPECT_TRUE(fs::exists(dir_ / "ckpt" / "rollout" / "coordinator_state_1.json"));

  std::vector<Json> records = ReadJsonl(dir_ / "run" / "metrics.jsonl");
  int rollouts = 0, steps = 0, evals = 0;
  for (const Json& r : records) {
    if (r.contains("rollout/raw_reward")) {
      ++rollouts;
      for (const char* key : {"perf/rollout_time", "perf/train_time", "perf/save_time",
                              "perf/update_weights_time", "perf/step_time", "train/loss",
                              "rollout/response_len/mean"}) {
        EXPECT_TRUE(r.contains(key)) << key << " missing in " << r.dump();
      }
    }
    if (r.contains("step") && r.contains("train/pg_loss")) ++steps;
    if (r.contains("eval/add2")) ++evals;
  }
  EXPECT_EQ(rollouts, 2);
  EXPECT_EQ(steps, 2);  // global_batch_size 8 = one optimizer step per rollout
  EXPECT_EQ(evals, 3);  // before training and after rollouts 0 and 1

  // The same command again continues at rollout 2 and finishes the run.
  Child again({"--config", config.string()}, dir_);
  std::optional<int> code = again.Wait(std::chrono::seconds(400));
  ASSERT_EQ(code, 0) << "stdout:\n" << again.out() << "\nstderr:\n" << again.err();
  const std::string out = again.out();
  EXPECT_NE(out.find("at rollout 2"), std::string::npos) << out;
  EXPECT_EQ(out.find("rollout 1/3"), std::string::npos) << out;
  EXPECT_EQ(out.find("eval @ rollout 0 "), std::string::npos) << "no eval before training on resume";
  EXPECT_NE(out.find("rollout 2/3 | reward"), std::string::npos) << out;
  EXPECT_NE(out.find("done: rollouts 2..2"), std::string::npos) << out;
  EXPECT_EQ(ReadFile(dir_ / "ckpt" / "latest_checkpointed_iteration.txt").substr(0, 1), "2");
  // The data source continued: rollout 2 took the 4 prompts after rollout 1's.
  Json state = Json::parse(ReadFile(dir_ / "ckpt" / "rollout" / "data_source_state_2.json"));
  EXPECT_EQ(state.at("sample_offset").get<int64_t>(), 12);  // 3 rollouts × 4 prompts
}

TEST_F(DriverE2eTest, ServesMetricsAndStopsEveryProcessOnSigterm) {
  const fs::path config = WriteConfig(1000, "metrics:\n  prometheus_port: 0\n");
  Child run({"--config", config.string()}, dir_);
  // driver.json names the metrics endpoint; wait for the first rollout's gauges.
  const fs::path driver_file = dir_ / "run" / "driver.json";
  std::string exposition;
  const auto deadline = Clock::now() + std::chrono::seconds(300);
  while (Clock::now() < deadline) {
    if (fs::exists(driver_file)) {
      Json d = Json::parse(ReadFile(driver_file), nullptr, false);
      if (!d.is_discarded()) {
        http::Client client("127.0.0.1", d.at("metrics_port").get<int>());
        auto resp = client.Get("/metrics");
        if (resp.ok() && resp->status == 200 &&
            resp->body.find("slime_rollout_raw_reward") != std::string::npos) {
          exposition = resp->body;
          break;
        }
      }
    }
    if (run.Wait(std::chrono::seconds(0))) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  ASSERT_FALSE(exposition.empty()) << "no rollout metrics on the driver's /metrics\nstdout:\n"
                                   << run.out() << "\nstderr:\n" << run.err();
  for (const char* name : {"slime_train_loss", "slime_perf_step_time", "slime_perf_update_weights_bytes_per_seconds", "slime_driver_rollout_id",
                           "slime_runtime_nodes_alive"}) {
    EXPECT_NE(exposition.find(name), std::string::npos) << name << "\n" << exposition;
  }
  testing::PromtoolResult check = testing::PromtoolCheckMetrics(exposition);
  ASSERT_TRUE(check.ran) << check.output;
  EXPECT_EQ(check.exit_code, 0) << check.output << "\n" << exposition;

  run.Signal(SIGTERM);
  std::optional<int> code = run.Wait(std::chrono::seconds(60));
  ASSERT_TRUE(code.has_value()) << "the driver did not stop within 60 s of SIGTERM";
  EXPECT_EQ(*code, 128 + SIGTERM) << run.err();
  // Every worker process is gone: head.json's run dir has no live workers left (their logs
  // say they stopped) — check that no process still has the run dir's head address.
  Json head = Json::parse(ReadFile(dir_ / "run" / "head.json"));
  const std::string address = head.at("address").get<std::string>();
  const std::string ps = [] {
    std::string out;
    FILE* p = ::popen("ps -eo args", "r");
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    ::pclose(p);
    return out;
  }();
  EXPECT_EQ(ps.find("--head " + address), std::string::npos) << ps;
}

TEST_F(DriverE2eTest, BadDatasetLineFailsBeforeAnyWorkerStarts) {
  const fs::path data = dir_ / "bad.jsonl";
  std::ofstream(data) << "{\"input\": \"1+1=\", \"label\": \"2\"}\n{not json\n";
  const fs::path config = WriteConfig(1, "");
  std::string yaml = ReadFile(config);
  const std::string from = SourceDir() + "/data/demo/train.jsonl@[0:40]";
  yaml.replace(yaml.find(from), from.size(), data.string());
  std::ofstream(config) << yaml;
  Child run({"--config", config.string(), "--set", "data.on_bad_line=fail"}, dir_);
  std::optional<int> code = run.Wait(std::chrono::seconds(60));
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 2) << run.err();
  EXPECT_NE(run.err().find("bad.jsonl:2"), std::string::npos) << run.err();
  EXPECT_FALSE(fs::exists(dir_ / "run" / "head.json")) << "no runtime should have started";
}

}  // namespace
}  // namespace slime
