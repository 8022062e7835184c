#include "slime/metrics/jsonl_writer.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "fmt/format.h"

namespace slime::metrics {

StatusOr<std::unique_ptr<JsonlWriter>> JsonlWriter::Open(const std::string& path) {
  std::filesystem::path p(path);
  if (p.has_parent_path()) {
    std::error_code ec;
    std::filesystem::create_directories(p.parent_path(), ec);
    if (ec) {
      return absl::UnavailableError(fmt::format("cannot create directory {} for metrics file: {}",
                                                p.parent_path().string(), ec.message()));
    }
  }
  std::FILE* file = std::fopen(path.c_str(), "ae");  // append, close-on-exec
  if (file == nullptr) {
    return absl::UnavailableError(
        fmt::format("cannot open metrics file {} for appending: {}", path, std::strerror(errno)));
  }
  return std::unique_ptr<JsonlWriter>(new JsonlWriter(path, file));
}

JsonlWriter::~JsonlWriter() {
  std::lock_guard<std::mutex> lock(mu_);
  if (file_ != nullptr) std::fclose(file_);
}

Status JsonlWriter::Write(const nlohmann::json& record) {
  std::string line = record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  line += '\n';
  std::lock_guard<std::mutex> lock(mu_);
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0) {
    int err = errno;
    std::clearerr(file_);
    return absl::DataLossError(
        fmt::format("writing a line to metrics file {} failed: {}", path_, std::strerror(err)));
  }
  return absl::OkStatus();
}

}  // namespace slime::metrics
