#include "slime/common/atomic_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace slime {

Status WriteFileAtomically(const std::string& path, const std::string& contents) {
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    return absl::InternalError(fmt::format("{}: cannot create: {}", tmp, std::strerror(errno)));
  }
  bool ok = std::fwrite(contents.data(), 1, contents.size(), f) == contents.size();
  ok = ok && std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  const int err = errno;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    return absl::InternalError(fmt::format("{}: write failed: {}", tmp, std::strerror(err)));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int rename_err = errno;
    std::remove(tmp.c_str());
    return absl::InternalError(
        fmt::format("cannot rename {} to {}: {}", tmp, path, std::strerror(rename_err)));
  }
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  const std::string dir = parent.empty() ? "." : parent.string();
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
  return absl::OkStatus();
}

}  // namespace slime
