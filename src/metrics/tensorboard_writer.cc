#include "slime/metrics/tensorboard_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <system_error>

#include "fmt/format.h"
#include "slime/metrics/tfrecord.h"
#include "slime/v1/tensorboard.pb.h"

namespace slime::metrics {
namespace {

namespace tb = ::slime::v1::tensorboard;

double UnixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string HostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  std::string host(name);
  for (char& c : host) {
    if (c == '/') c = '_';  // never a path separator in the file name
  }
  return host;
}

// Writes all of `data` at the end of `fd` (O_APPEND); on failure returns errno and how many
// bytes did reach the file.
int WriteAll(int fd, const std::string& data, size_t* written) {
  *written = 0;
  while (*written < data.size()) {
    const ssize_t n = ::write(fd, data.data() + *written, data.size() - *written);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return EIO;
    *written += static_cast<size_t>(n);
  }
  return 0;
}

// The Event's step: "step" if the record has one, else "rollout_id".
StatusOr<int64_t> StepOf(const nlohmann::json& record) {
  for (const char* key : {"step", "rollout_id"}) {
    auto it = record.find(key);
    if (it == record.end()) continue;
    if (!it->is_number_integer()) {
      return absl::InvalidArgumentError(
          fmt::format("metrics record: \"{}\" must be an integer, got {}", key, it->dump()));
    }
    return it->get<int64_t>();
  }
  return absl::InvalidArgumentError(fmt::format(
      "metrics record has neither \"step\" nor \"rollout_id\" to place it on TensorBoard's "
      "step axis: {}",
      record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)));
}

}  // namespace

StatusOr<std::unique_ptr<TensorBoardWriter>> TensorBoardWriter::Open(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir)) {
    return absl::UnavailableError(
        fmt::format("cannot create the TensorBoard directory {}: {}", dir,
                    ec ? ec.message() : std::string("it exists and is not a directory")));
  }
  // A name no other writer has: this process's sequence number, and O_EXCL against the rest.
  static std::atomic<int> sequence{0};
  const std::string prefix =
      fmt::format("events.out.tfevents.{:010d}.{}.{}.", static_cast<int64_t>(std::time(nullptr)),
                  HostName(), static_cast<int64_t>(::getpid()));
  std::string path;
  int fd = -1;
  for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
    path = (std::filesystem::path(dir) / (prefix + std::to_string(sequence++))).string();
    fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) {
    return absl::UnavailableError(
        fmt::format("cannot create the TensorBoard event file {}: {}", path, std::strerror(errno)));
  }
  std::unique_ptr<TensorBoardWriter> writer(new TensorBoardWriter(path, fd));
  tb::Event first;
  first.set_wall_time(UnixSeconds());
  first.set_file_version(kFileVersion);
  SLIME_RETURN_IF_ERROR(writer->Append(first.SerializeAsString()));
  return writer;
}

TensorBoardWriter::~TensorBoardWriter() {
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ >= 0) ::close(fd_);
}

Status TensorBoardWriter::Write(const nlohmann::json& record) {
  if (!record.is_object()) {
    return absl::InvalidArgumentError(
        fmt::format("metrics record must be a JSON object, got {}",
                    record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)));
  }
  SLIME_ASSIGN_OR_RETURN(const int64_t step, StepOf(record));
  auto time = record.find("time");
  const double wall_time =
      time != record.end() && time->is_number() ? time->get<double>() : UnixSeconds();
  std::vector<std::pair<std::string, double>> values;
  for (const auto& [key, value] : record.items()) {
    if (key == "time" || key == "step" || key == "rollout_id") continue;  // the axes
    if (value.is_number()) {
      values.emplace_back(key, value.get<double>());
    } else if (value.is_boolean()) {
      values.emplace_back(key, value.get<bool>() ? 1.0 : 0.0);
    }
  }
  if (values.empty()) return absl::OkStatus();
  return WriteScalars(step, wall_time, values);
}

Status TensorBoardWriter::WriteScalars(int64_t step, double wall_time,
                                       const std::vector<std::pair<std::string, double>>& values) {
  tb::Event event;
  event.set_wall_time(wall_time);
  event.set_step(step);
  tb::Summary* summary = event.mutable_summary();
  for (const auto& [tag, value] : values) {
    tb::Summary::Value* v = summary->add_value();
    v->set_tag(tag);
    v->set_simple_value(static_cast<float>(value));
  }
  return Append(event.SerializeAsString());
}

Status TensorBoardWriter::Append(const std::string& event) {
  std::string framed;
  AppendTfRecord(event, &framed);
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_) {
    return absl::DataLossError(fmt::format(
        "TensorBoard event file {}: an earlier write failed and could not be undone", path_));
  }
  size_t written = 0;
  const int err = WriteAll(fd_, framed, &written);
  if (err == 0) {
    size_ += framed.size();
    return absl::OkStatus();
  }
  // Cut a partial record off again, or readers would stop at it forever.
  if (written > 0 && ::ftruncate(fd_, static_cast<off_t>(size_)) != 0) broken_ = true;
  return absl::DataLossError(fmt::format("writing a record to TensorBoard event file {} failed: {}",
                                         path_, std::strerror(err)));
}

}  // namespace slime::metrics
