// Private helpers of the model module: whole-file reads and atomic file writes.
// Torch-free. Thread-safety: each object is used by one thread.
#ifndef SLIME_SRC_MODEL_INTERNAL_H_
#define SLIME_SRC_MODEL_INTERNAL_H_

#include <cstdio>
#include <string>

#include "slime/common/status.h"

namespace slime::model::internal {

// Reads the whole file; NotFound / Internal errors name the path.
StatusOr<std::string> ReadFileToString(const std::string& path);

// Writes `path` atomically: bytes go to a temporary file beside it, which Commit() flushes,
// fsyncs and renames over `path`. Destroying an uncommitted writer removes the temporary.
class AtomicFileWriter {
 public:
  static StatusOr<AtomicFileWriter> Open(const std::string& path);
  AtomicFileWriter(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter& operator=(AtomicFileWriter&&) = delete;
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  ~AtomicFileWriter();

  Status Write(const void* data, size_t size);
  Status Commit();

 private:
  AtomicFileWriter(std::string path, std::string tmp_path, std::FILE* file)
      : path_(std::move(path)), tmp_path_(std::move(tmp_path)), file_(file) {}
  std::string path_;
  std::string tmp_path_;
  std::FILE* file_ = nullptr;  // owned; null once committed or moved from
};

// Writes a small file atomically.
Status WriteFileAtomically(const std::string& path, const std::string& contents);

}  // namespace slime::model::internal

#endif  // SLIME_SRC_MODEL_INTERNAL_H_
