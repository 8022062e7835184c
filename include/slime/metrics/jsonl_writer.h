// JsonlWriter: appends one JSON object per line to a file (JSON Lines), e.g. the per-step
// metrics of a training run (`<run_dir>/metrics.jsonl`).
//
// The file is opened in append mode, so a resumed run continues the same file; its parent
// directory is created if missing. Every Write() emits one complete line and flushes it to the
// operating system before returning, so a crash loses at most the line being written and a
// reader tailing the file never sees half a line from us.
//
// A RecordSink (record_sink.h): the job's metrics log is one of its sinks.
//
// Ownership: the writer owns the file handle and closes it on destruction.
// Threads: Write() may be called from any thread; lines from concurrent writers never
// interleave (one mutex around format+write+flush).
#ifndef SLIME_METRICS_JSONL_WRITER_H_
#define SLIME_METRICS_JSONL_WRITER_H_

#include <cstdio>
#include <memory>
#include <mutex>
#include <string>

#include "absl/base/thread_annotations.h"
#include "nlohmann/json.hpp"
#include "slime/common/status.h"
#include "slime/metrics/record_sink.h"

namespace slime::metrics {

class JsonlWriter : public RecordSink {
 public:
  // Opens (creating if needed) `path` for appending.
  static StatusOr<std::unique_ptr<JsonlWriter>> Open(const std::string& path);
  ~JsonlWriter() override;
  JsonlWriter(const JsonlWriter&) = delete;
  JsonlWriter& operator=(const JsonlWriter&) = delete;

  // Appends `record` as one line (compact dump, UTF-8 as given; invalid UTF-8 in strings is
  // replaced by U+FFFD rather than failing). The record should be an object; other JSON values
  // are written as they are.
  Status Write(const nlohmann::json& record) override;

  const std::string& path() const { return path_; }

 private:
  JsonlWriter(std::string path, std::FILE* file) : path_(std::move(path)), file_(file) {}

  const std::string path_;
  std::mutex mu_;
  std::FILE* file_ ABSL_GUARDED_BY(mu_);
};

}  // namespace slime::metrics

#endif  // SLIME_METRICS_JSONL_WRITER_H_
