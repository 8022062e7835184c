// TensorBoardWriter: the metrics records of a run as a TensorBoard event file
// (`metrics.tensorboard_dir`; docs/operations.md "TensorBoard").
//
// Open() creates the directory if needed and a new file in it,
// `events.out.tfevents.<unix seconds, 10 digits>.<hostname>.<pid>.<n>` (TensorBoard reads every
// file with "tfevents" in its name, oldest name first; a restarted run adds a file and never
// touches an older one). The file is TFRecord-framed (tfrecord.h) `slime.v1.tensorboard.Event`
// messages (proto/slime/v1/tensorboard.proto, wire-compatible with TensorFlow's Event): first
// one carrying file_version "brain.Event:2", then one per Write().
//
// Write(record) maps one metrics record (record_sink.h) to one Event:
//   wall_time  the record's "time" (Unix seconds), or now when it has none;
//   step       its "step" when it has one (an optimizer step), else its "rollout_id" — the
//              same numbers the JSONL log carries, so each tag is plotted on the axis of the
//              records that carry it;
//   values     every other field whose value is a number or a boolean (1/0), with the field
//              name as the tag, as a 32-bit float (simple_value; NaN stays NaN). Strings,
//              arrays, objects and nulls are not scalars and are skipped.
// A record without "step" and "rollout_id" is refused (InvalidArgument); one without values
// writes nothing.
//
// Each Event is written with a single write(2) of the whole framed record, no user-space
// buffer: on return it is in the file for a live TensorBoard to read, and a crash leaves at
// most a partial last record, which readers skip as not yet written. When a write fails part
// way (disk full), the file is truncated back to its last complete record, so later records
// stay readable; if even that fails, every later Write() fails.
//
// Ownership: the writer owns the file descriptor and closes it on destruction.
// Threads: Write() may be called from any thread; records never interleave.
#ifndef SLIME_METRICS_TENSORBOARD_WRITER_H_
#define SLIME_METRICS_TENSORBOARD_WRITER_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "nlohmann/json.hpp"
#include "slime/common/status.h"
#include "slime/metrics/record_sink.h"

namespace slime::metrics {

class TensorBoardWriter : public RecordSink {
 public:
  // The first record of every file.
  static constexpr const char* kFileVersion = "brain.Event:2";

  // Creates `dir` (and its parents) if missing and a new event file in it.
  static StatusOr<std::unique_ptr<TensorBoardWriter>> Open(const std::string& dir);
  ~TensorBoardWriter() override;
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One metrics record as one Event (see above).
  Status Write(const nlohmann::json& record) override;

  // One Event of scalars `values` (tag, value) at `step`, stamped `wall_time`.
  Status WriteScalars(int64_t step, double wall_time,
                      const std::vector<std::pair<std::string, double>>& values);

  // The event file.
  const std::string& path() const { return path_; }

 private:
  TensorBoardWriter(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}

  // Frames and appends one serialized Event (see the header comment for failures).
  Status Append(const std::string& event);

  const std::string path_;
  std::mutex mu_;
  int fd_ ABSL_GUARDED_BY(mu_);
  uint64_t size_ ABSL_GUARDED_BY(mu_) = 0;  // bytes of complete records in the file
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace slime::metrics

#endif  // SLIME_METRICS_TENSORBOARD_WRITER_H_
