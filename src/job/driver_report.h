// The driver's outputs (internal to the job module): metrics records to the JSONL log, the
// TensorBoard event file and Prometheus gauges, the rollout progress line and the per-rollout
// summary on the console.
#ifndef SLIME_JOB_DRIVER_REPORT_H_
#define SLIME_JOB_DRIVER_REPORT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "slime/common/status.h"
#include "slime/metrics/record_sink.h"
#include "slime/metrics/registry.h"
#include "slime/rollout/coordinator.h"

namespace slime::job {

using MetricValues = std::map<std::string, double>;

// A slime metric as a Prometheus gauge: "rollout/raw_reward" → "slime_rollout_raw_reward"
// (runs of characters outside [A-Za-z0-9] become one '_'; abbreviated units become base units,
// the value multiplied by `scale`).
struct PrometheusMetric {
  std::string name;
  double scale = 1.0;
};
PrometheusMetric PrometheusName(const std::string& metric);

// One /metrics endpoint of the job, for <run_dir>/prometheus_targets.json.
struct PrometheusTarget {
  std::string address;    // host:port
  std::string component;  // "driver" or "engine"
  std::string engine;     // the engine's actor id (stable across restarts); "" for the driver
};

// Writes `targets` (atomically) as a Prometheus file_sd_configs file: a JSON list of target
// groups, one per target, labelled slime_component and, for engines, slime_engine. Prometheus
// re-reads the file when it changes, so a restarted engine's new port is picked up.
Status WritePrometheusTargets(const std::string& path, const std::vector<PrometheusTarget>& targets);

class DriverReport {
 public:
  // `jsonl_path` empty: no JSONL log; `tensorboard_dir` empty: no event file.
  static StatusOr<std::unique_ptr<DriverReport>> Create(const std::string& jsonl_path,
                                                        const std::string& tensorboard_dir,
                                                        metrics::Registry* registry,
                                                        int64_t num_rollout);

  // Hands the record {"time", "rollout_id", [step], values...} to every sink (the JSONL log,
  // the event file) and sets the gauges.
  Status Record(int64_t rollout_id, std::optional<int64_t> step, const MetricValues& values);

  // The live progress of a generate or eval (a carriage-return line on a terminal, a line every
  // 10 s otherwise).
  void Progress(const rollout::RolloutProgress& p);
  // Ends a progress line (before other output).
  void EndProgress();
  // One line: "rollout 3/20 | reward 0.41 | len 5.2 | ..." from the rollout's values.
  void Summary(int64_t rollout_id, const MetricValues& values);
  void EvalSummary(int64_t rollout_id, const MetricValues& values);

 private:
  DriverReport(std::vector<std::unique_ptr<metrics::RecordSink>> sinks,
               metrics::Registry* registry, int64_t num_rollout);

  std::vector<std::unique_ptr<metrics::RecordSink>> sinks_;
  metrics::Registry* registry_;
  int64_t num_rollout_;
  bool tty_;
  std::mutex mu_;
  bool progress_open_ = false;
  double last_progress_line_s_ = -1e9;
};

}  // namespace slime::job

#endif  // SLIME_JOB_DRIVER_REPORT_H_
