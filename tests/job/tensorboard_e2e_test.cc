// metrics.tensorboard_dir end to end: the real `slime_train` runs the quickstart's job
// (configs/grpo-tiny-cpu.yaml: 1 trainer + 2 engines on CPU slots) on a tiny random Qwen3 model
// for 2 rollouts with `--set metrics.tensorboard_dir=DIR`, then resumes for a third; the event
// files of both runs, read with the test reader (tests/support/tfevents_reader.h: framing and
// both CRCs checked, Events decoded), carry exactly the scalars of metrics.jsonl — per tag, the
// same steps (a record's "step", else its "rollout_id") with the same values (as 32-bit floats)
// and times, in the same order.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "child_process.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "remove_tree.h"
#include "test_paths.h"
#include "tfevents_reader.h"

namespace slime {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using slime::testing::SourceDir;
using slime::testing::TestDataDir;

// slime_train with `args` and `env` run to its end (its process group killed after `timeout`):
// the exit code (nullopt after the timeout) and its stdout and stderr (files <name>.* in `dir`).
struct TrainRun {
  std::optional<int> code;
  std::string log;
};
TrainRun RunTrain(std::vector<std::string> args, const std::map<std::string, std::string>& env,
                  const fs::path& dir, const std::string& name, std::chrono::seconds timeout) {
  testing::Child child(std::move(args), dir, {.name = name, .env = env});
  TrainRun run;
  run.code = child.Wait(timeout);
  run.log = child.out() + child.err();
  return run;
}

// One scalar as TensorBoard plots it.
struct Point {
  int64_t step;
  double wall_time;
  float value;
};

bool SamePoint(const Point& a, const Point& b) {
  return a.step == b.step && a.wall_time == b.wall_time &&
         (a.value == b.value || (std::isnan(a.value) && std::isnan(b.value)));
}

std::string Show(const std::vector<Point>& points) {
  std::string out;
  for (const Point& p : points) {
    out += "(" + std::to_string(p.step) + ", " + std::to_string(p.value) + ") ";
  }
  return out;
}

// What the event files should hold, from metrics.jsonl: per tag, in line order. A NaN is
// written to JSON as null, so a null is expected back as NaN.
std::map<std::string, std::vector<Point>> ExpectedFromJsonl(const fs::path& path) {
  std::map<std::string, std::vector<Point>> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const Json r = Json::parse(line);
    const int64_t step =
        r.contains("step") ? r["step"].get<int64_t>() : r["rollout_id"].get<int64_t>();
    const double time = r["time"].get<double>();
    for (const auto& [key, value] : r.items()) {
      if (key == "time" || key == "step" || key == "rollout_id") continue;
      if (value.is_number()) {
        out[key].push_back({step, time, static_cast<float>(value.get<double>())});
      } else if (value.is_boolean()) {
        out[key].push_back({step, time, value.get<bool>() ? 1.0f : 0.0f});
      } else if (value.is_null()) {
        out[key].push_back({step, time, std::nanf("")});
      }
    }
  }
  return out;
}

TEST(TensorboardE2eTest, EventFilesCarryTheJsonlScalarsAcrossAResume) {
  const fs::path tokenizer = TestDataDir() / "qwen3";
  if (!fs::exists(tokenizer / "tokenizer.json")) {
    GTEST_SKIP() << tokenizer.string() << " missing: run scripts/fetch_test_data.sh";
  }
  const fs::path dir =
      fs::temp_directory_path() / ("slime_tensorboard_e2e_" + std::to_string(::getpid()));
  testing::RemoveTree(dir.string());
  fs::create_directories(dir);
  struct Cleanup {
    fs::path dir;
    ~Cleanup() { testing::RemoveTree(dir.string()); }
  } cleanup{dir};

  TrainRun run =
      RunTrain({"init-model", "--config", SourceDir() + "/tests/data/model/configs/qwen3-tiny.json",
                "--tokenizer", tokenizer.string(), "--out", (dir / "model").string(), "--dtype",
                "fp32", "--seed", "3"},
               {}, dir, "init", std::chrono::seconds(120));
  ASSERT_EQ(run.code, 0) << run.log;

  // The quickstart's job on the tiny model, 64 of the demo prompts and 8 held-out ones.
  const std::map<std::string, std::string> env = {
      {"SLIME_TINY_MODEL", (dir / "model").string()},
      {"SLIME_TINY_DATA", SourceDir() + "/data/demo/train.jsonl@[0:64]"},
      {"SLIME_TINY_EVAL", SourceDir() + "/data/demo/eval.jsonl@[0:8]"}};
  const fs::path tb = dir / "tb";
  // The LR schedule's length is part of the checkpoint: fixed, so the longer run may resume.
  auto job = [&](int num_rollout) {
    std::vector<std::string> args = {"--config", "configs/grpo-tiny-cpu.yaml"};
    for (const std::string& set :
         {"cluster.run_dir=" + (dir / "run").string(), "checkpoint.save=" + (dir / "ckpt").string(),
          "checkpoint.load=" + (dir / "ckpt").string(), std::string("checkpoint.save_interval=1"),
          "data.num_rollout=" + std::to_string(num_rollout), std::string("train.lr_decay_iters=3"),
          "metrics.tensorboard_dir=" + tb.string()}) {
      args.insert(args.end(), {"--set", set});
    }
    return args;
  };
  run = RunTrain(job(2), env, dir, "first", std::chrono::seconds(600));
  ASSERT_EQ(run.code, 0) << run.log;
  ASSERT_EQ(testing::EventFilesIn(tb).size(), 1u);
  // The same job resumed for one more rollout adds a file beside the first.
  run = RunTrain(job(3), env, dir, "second", std::chrono::seconds(600));
  ASSERT_EQ(run.code, 0) << run.log;
  ASSERT_NE(run.log.find("rollout 2/3"), std::string::npos) << run.log;

  const std::vector<fs::path> files = testing::EventFilesIn(tb);
  ASSERT_EQ(files.size(), 2u);
  std::map<std::string, std::vector<Point>> actual;
  for (const fs::path& file : files) {
    testing::EventFile read = testing::ReadEventFile(file);
    ASSERT_EQ(read.error, "") << file;
    EXPECT_EQ(read.tail_bytes, 0u) << file;
    ASSERT_FALSE(read.events.empty()) << file;
    EXPECT_EQ(read.events[0].file_version(), "brain.Event:2") << file;
    for (size_t i = 1; i < read.events.size(); ++i) {
      const auto& event = read.events[i];
      ASSERT_TRUE(event.has_summary()) << file << " event " << i;
      for (const auto& v : event.summary().value()) {
        actual[v.tag()].push_back({event.step(), event.wall_time(), v.simple_value()});
      }
    }
  }

  const std::map<std::string, std::vector<Point>> expected =
      ExpectedFromJsonl(dir / "run" / "metrics.jsonl");
  for (const char* tag : {"rollout/raw_reward", "train/loss", "train/grad_norm", "eval/add1",
                          "eval/add1_train", "perf/step_time", "perf/rollout_time"}) {
    EXPECT_TRUE(expected.count(tag)) << tag << " is not in metrics.jsonl";
  }
  EXPECT_EQ(expected.at("rollout/raw_reward").size(), 3u);  // rollouts 0, 1 and 2
  std::vector<std::string> expected_tags, actual_tags;
  for (const auto& [tag, points] : expected) expected_tags.push_back(tag);
  for (const auto& [tag, points] : actual) actual_tags.push_back(tag);
  ASSERT_EQ(actual_tags, expected_tags);
  for (const auto& [tag, want] : expected) {
    const std::vector<Point>& got = actual.at(tag);
    bool same = got.size() == want.size();
    for (size_t i = 0; same && i < want.size(); ++i) same = SamePoint(got[i], want[i]);
    EXPECT_TRUE(same) << tag << "\n  metrics.jsonl: " << Show(want)
                      << "\n  events:        " << Show(got);
  }
}

}  // namespace
}  // namespace slime
