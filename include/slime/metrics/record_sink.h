// RecordSink: somewhere the metrics records of a run go (docs/operations.md "Metrics").
//
// A metrics record is one JSON object per logged step: "time" (Unix seconds), the integers that
// place it ("rollout_id", and "step" for an optimizer step) and the metric values by name
// ("rollout/raw_reward", "train/loss", ...). The job hands every record to each of its sinks, so
// they all see the same values: JsonlWriter keeps the whole object as one line,
// TensorBoardWriter the numbers as scalars.
//
// Threads: implementations accept Write() from any thread.
#ifndef SLIME_METRICS_RECORD_SINK_H_
#define SLIME_METRICS_RECORD_SINK_H_

#include "nlohmann/json.hpp"
#include "slime/common/status.h"

namespace slime::metrics {

class RecordSink {
 public:
  virtual ~RecordSink() = default;
  // Stores `record` durably enough that a reader following the file sees it on return.
  virtual Status Write(const nlohmann::json& record) = 0;
};

}  // namespace slime::metrics

#endif  // SLIME_METRICS_RECORD_SINK_H_
