#include "internal.h"

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace slime::model::internal {

StatusOr<std::string> ReadFileToString(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    return absl::NotFoundError(fmt::format("{}: file not found", path));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InternalError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::InternalError(fmt::format("{}: read failed", path));
  return ss.str();
}

StatusOr<AtomicFileWriter> AtomicFileWriter::Open(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  std::string tmp =
      fmt::format("{}.tmp.{}.{}", path, static_cast<long>(::getpid()), counter.fetch_add(1));
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    return absl::InternalError(fmt::format("{}: cannot create: {}", tmp, std::strerror(errno)));
  }
  return AtomicFileWriter(path, tmp, f);
}

AtomicFileWriter::AtomicFileWriter(AtomicFileWriter&& other) noexcept
    : path_(std::move(other.path_)), tmp_path_(std::move(other.tmp_path_)), file_(other.file_) {
  other.file_ = nullptr;
}

AtomicFileWriter::~AtomicFileWriter() {
  if (file_ != nullptr) {
    std::fclose(file_);
    std::remove(tmp_path_.c_str());
  }
}

Status AtomicFileWriter::Write(const void* data, size_t size) {
  if (file_ == nullptr) return absl::FailedPreconditionError("write after commit");
  if (size > 0 && std::fwrite(data, 1, size, file_) != size) {
    return absl::InternalError(
        fmt::format("{}: write failed: {}", tmp_path_, std::strerror(errno)));
  }
  return absl::OkStatus();
}

Status AtomicFileWriter::Commit() {
  if (file_ == nullptr) return absl::FailedPreconditionError("commit twice");
  std::FILE* f = file_;
  file_ = nullptr;
  bool ok = std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  int err = errno;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    std::remove(tmp_path_.c_str());
    return absl::InternalError(fmt::format("{}: flush failed: {}", tmp_path_, std::strerror(err)));
  }
  if (std::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    err = errno;
    std::remove(tmp_path_.c_str());
    return absl::InternalError(
        fmt::format("cannot rename {} to {}: {}", tmp_path_, path_, std::strerror(err)));
  }
  return absl::OkStatus();
}

Status WriteFileAtomically(const std::string& path, const std::string& contents) {
  SLIME_ASSIGN_OR_RETURN(AtomicFileWriter w, AtomicFileWriter::Open(path));
  SLIME_RETURN_IF_ERROR(w.Write(contents.data(), contents.size()));
  return w.Commit();
}

}  // namespace slime::model::internal
