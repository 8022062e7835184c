#include "driver_report.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>

#include "fmt/format.h"
#include "slime/common/atomic_file.h"
#include "slime/metrics/jsonl_writer.h"
#include "slime/metrics/tensorboard_writer.h"
#include "spdlog/spdlog.h"

namespace slime::job {
namespace {

double UnixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The first of `keys` present in `values`.
std::optional<double> First(const MetricValues& values, std::initializer_list<const char*> keys) {
  for (const char* k : keys) {
    auto it = values.find(k);
    if (it != values.end()) return it->second;
  }
  return std::nullopt;
}

}  // namespace

PrometheusMetric PrometheusName(const std::string& metric) {
  // Words between separators; units are spelled out in base units (Prometheus naming rules,
  // which promtool's linter enforces): tokens_per_sec → tokens_per_seconds,
  // update_weights_gb_per_s → update_weights_bytes_per_seconds (value × 1e9).
  struct Unit {
    const char* name;
    double scale;
  };
  static const std::map<std::string, Unit> kUnits = {
      {"s", {"seconds", 1}},      {"sec", {"seconds", 1}},   {"secs", {"seconds", 1}},
      {"ms", {"seconds", 1e-3}},  {"gb", {"bytes", 1e9}},    {"mb", {"bytes", 1e6}},
      {"kb", {"bytes", 1e3}},     {"b", {"bytes", 1}}};
  PrometheusMetric out{"slime", 1.0};
  std::string word;
  auto flush = [&] {
    if (word.empty()) return;
    auto it = kUnits.find(word);
    if (it != kUnits.end()) {
      out.name += std::string("_") + it->second.name;
      out.scale *= it->second.scale;
    } else {
      out.name += "_" + word;
    }
    word.clear();
  };
  for (char c : metric) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (ok) {
      word.push_back(c);
    } else {
      flush();
    }
  }
  flush();
  return out;
}

Status WritePrometheusTargets(const std::string& path,
                              const std::vector<PrometheusTarget>& targets) {
  nlohmann::json groups = nlohmann::json::array();
  for (const PrometheusTarget& t : targets) {
    nlohmann::json labels = {{"slime_component", t.component}};
    if (!t.engine.empty()) labels["slime_engine"] = t.engine;
    groups.push_back({{"targets", {t.address}}, {"labels", labels}});
  }
  return WriteFileAtomically(path, groups.dump(2) + "\n");
}

StatusOr<std::unique_ptr<DriverReport>> DriverReport::Create(const std::string& jsonl_path,
                                                             const std::string& tensorboard_dir,
                                                             metrics::Registry* registry,
                                                             int64_t num_rollout) {
  std::vector<std::unique_ptr<metrics::RecordSink>> sinks;
  if (!jsonl_path.empty()) {
    SLIME_ASSIGN_OR_RETURN(sinks.emplace_back(), metrics::JsonlWriter::Open(jsonl_path));
  }
  if (!tensorboard_dir.empty()) {
    auto tensorboard = metrics::TensorBoardWriter::Open(tensorboard_dir);
    if (!tensorboard.ok()) {
      return Status(tensorboard.status().code(),
                    "metrics.tensorboard_dir: " + std::string(tensorboard.status().message()));
    }
    spdlog::info("metrics: TensorBoard events in {}", (*tensorboard)->path());
    sinks.push_back(std::move(*tensorboard));
  }
  return std::unique_ptr<DriverReport>(new DriverReport(std::move(sinks), registry, num_rollout));
}

DriverReport::DriverReport(std::vector<std::unique_ptr<metrics::RecordSink>> sinks,
                           metrics::Registry* registry, int64_t num_rollout)
    : sinks_(std::move(sinks)),
      registry_(registry),
      num_rollout_(num_rollout),
      tty_(isatty(STDOUT_FILENO) != 0) {}

Status DriverReport::Record(int64_t rollout_id, std::optional<int64_t> step,
                            const MetricValues& values) {
  nlohmann::ordered_json record;
  record["time"] = UnixSeconds();
  record["rollout_id"] = rollout_id;
  if (step) record["step"] = *step;
  for (const auto& [key, value] : values) record[key] = value;
  if (registry_ != nullptr) {
    registry_->GetGauge("slime_driver_rollout_id", "The rollout the driver is on").Set(
        static_cast<double>(rollout_id));
    for (const auto& [key, value] : values) {
      const PrometheusMetric m = PrometheusName(key);
      registry_->GetGauge(m.name, "slime metric " + key + " (latest value)").Set(value * m.scale);
    }
  }
  // One object for every sink, so the log and the event file carry the same values.
  const nlohmann::json same_for_all = record;
  for (const auto& sink : sinks_) SLIME_RETURN_IF_ERROR(sink->Write(same_for_all));
  return absl::OkStatus();
}

void DriverReport::Progress(const rollout::RolloutProgress& p) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string line = fmt::format(
      "{} {}: {}/{} samples, {} response tokens, {:.0f} tok/s, {:.1f} s",
      p.eval ? "eval @ rollout" : "rollout", p.rollout_id, p.samples_done, p.samples_target,
      p.response_tokens, p.tokens_per_s, p.elapsed_s);
  if (tty_) {
    std::cout << "\r\033[K" << line << std::flush;
    progress_open_ = true;
  } else if (p.elapsed_s - last_progress_line_s_ >= 10.0 || p.samples_done == p.samples_target) {
    if (p.elapsed_s < last_progress_line_s_) last_progress_line_s_ = -1e9;
    std::cout << line << std::endl;
    last_progress_line_s_ = p.elapsed_s;
  }
}

void DriverReport::EndProgress() {
  std::lock_guard<std::mutex> lock(mu_);
  if (progress_open_) std::cout << "\r\033[K" << std::flush;
  progress_open_ = false;
  last_progress_line_s_ = -1e9;
}

void DriverReport::Summary(int64_t rollout_id, const MetricValues& v) {
  EndProgress();
  std::string line = fmt::format("rollout {}/{}", rollout_id, num_rollout_);
  auto add = [&](const char* label, std::initializer_list<const char*> keys, const char* spec) {
    if (std::optional<double> x = First(v, keys)) {
      line += fmt::format(" | {} ", label) + fmt::format(fmt::runtime(spec), *x);
    }
  };
  add("reward", {"rollout/raw_reward"}, "{:.3f}");
  add("len", {"rollout/response_len/mean"}, "{:.1f}");
  add("trunc", {"rollout/truncated_ratio"}, "{:.2f}");
  add("loss", {"train/loss"}, "{:.4f}");
  add("kl", {"train/kl_loss", "train/ppo_kl"}, "{:.5f}");
  add("clipfrac", {"train/pg_clipfrac"}, "{:.3f}");
  add("entropy", {"train/entropy_loss"}, "{:.3f}");
  add("grad", {"train/grad_norm"}, "{:.3f}");
  std::string times;
  for (const auto& [label, key] : std::initializer_list<std::pair<const char*, const char*>>{
           {"rollout", "perf/rollout_time"},
           {"wait", "perf/rollout_wait_time"},
           {"train", "perf/train_time"},
           {"save", "perf/save_time"},
           {"sync", "perf/update_weights_time"},
           {"eval", "perf/eval_time"}}) {
    auto it = v.find(key);
    if (it != v.end()) times += fmt::format(" {} {:.1f}s", label, it->second);
  }
  if (!times.empty()) line += " |" + times;
  add("step", {"perf/step_time"}, "{:.1f}s");
  std::cout << line << std::endl;
}

void DriverReport::EvalSummary(int64_t rollout_id, const MetricValues& v) {
  EndProgress();
  std::string line = fmt::format("eval @ rollout {}", rollout_id);
  for (const auto& [key, value] : v) {
    // eval/<name> is the dataset's mean reward; the pass@k and length keys follow it.
    if (key.rfind("eval/", 0) != 0 || key.find('/', 5) != std::string::npos) continue;
    if (key.find("-truncated_ratio") != std::string::npos) continue;
    line += fmt::format(" | {} {:.3f}", key.substr(5), value);
  }
  std::cout << line << std::endl;
}

}  // namespace slime::job
