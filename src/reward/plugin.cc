// Custom reward plugins (plugin_abi.h) run in forked worker processes.
//
// Each worker is a fork of this process connected by a Unix socket pair. The child closes every
// other inherited descriptor, restores default signal handling, dlopens the plugin, answers a
// handshake (ABI version, batch entry, init result) and then serves requests one at a time
// until the socket closes. The parent talks to it with non-blocking I/O and a deadline, so a
// child that crashes (EOF; waitpid names the signal) or hangs (deadline; SIGKILL) turns into an
// error and the worker is started again on its next use. The child only uses the socket,
// dlopen/dlsym, malloc and the plugin before _exit: no locks of the parent (loggers, pools)
// are touched after fork.
//
// Wire format (host byte order, one machine): strings are u32 length + bytes.
//   handshake  child -> parent  i32 rc, u8 has_batch, string message
//   request    parent -> child  u8 kind (1 one sample, 2 a group), u32 n, n x 5 strings
//                               (prompt, response, label, metadata_json, rm_type)
//   response   child -> parent  i32 rc, then n x f64 (rc == 0) or a string message
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "fmt/format.h"
#include "slime/reward/plugin_abi.h"
#include "slime/reward/reward.h"
#include "spdlog/spdlog.h"

namespace slime::reward {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kErrLen = 1024;
constexpr int kChildFd = 3;

// ---- child side: blocking I/O on kChildFd, no logging ---------------------------------------

bool ChildWrite(const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::send(kChildFd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

bool ChildRead(void* buf, size_t size) {
  char* p = static_cast<char*>(buf);
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::read(kChildFd, p + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

bool ChildReadString(std::string* out) {
  uint32_t len = 0;
  if (!ChildRead(&len, sizeof(len))) return false;
  out->assign(len, '\0');
  return len == 0 || ChildRead(out->data(), len);
}

void Put(std::string* out, const void* data, size_t size) {
  out->append(static_cast<const char*>(data), size);
}
void PutString(std::string* out, std::string_view s) {
  uint32_t len = static_cast<uint32_t>(s.size());
  Put(out, &len, sizeof(len));
  out->append(s.data(), s.size());
}

[[noreturn]] void ChildMain(int fd, const char* path) {
  // Only fd 0-2 and the socket stay open: the parent's sockets must not outlive it here.
  if (fd != kChildFd) {
    ::dup2(fd, kChildFd);
  } else {
    ::fcntl(kChildFd, F_SETFD, 0);
  }
#ifdef SYS_close_range
  if (::syscall(SYS_close_range, kChildFd + 1, ~0U, 0) != 0)
#endif
  {
    for (int i = kChildFd + 1; i < 65536; ++i) ::close(i);
  }
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGPIPE, SIGTERM, SIGINT, SIGCHLD}) {
    ::signal(sig, SIG_DFL);
  }
  rlimit no_core{0, 0};  // a crashing plugin must not dump the parent's whole image
  ::setrlimit(RLIMIT_CORE, &no_core);
  sigset_t none;
  sigemptyset(&none);
  ::pthread_sigmask(SIG_SETMASK, &none, nullptr);

  auto handshake = [](int rc, bool has_batch, std::string_view message) {
    std::string out;
    int32_t code = rc;
    uint8_t batch = has_batch ? 1 : 0;
    Put(&out, &code, sizeof(code));
    Put(&out, &batch, sizeof(batch));
    PutString(&out, message);
    ChildWrite(out);
  };

  void* lib = ::dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* e = ::dlerror();
    handshake(1, false, fmt::format("cannot load it: {}", e ? e : "unknown dlopen error"));
    ::_exit(0);
  }
  auto version =
      reinterpret_cast<slime_reward_abi_version_fn>(::dlsym(lib, "slime_reward_abi_version"));
  auto score = reinterpret_cast<slime_reward_v1_fn>(::dlsym(lib, "slime_reward_v1"));
  auto batch = reinterpret_cast<slime_reward_batch_v1_fn>(::dlsym(lib, "slime_reward_batch_v1"));
  auto init = reinterpret_cast<slime_reward_init_fn>(::dlsym(lib, "slime_reward_init"));
  if (version == nullptr || score == nullptr) {
    handshake(1, false,
              fmt::format("it does not export {} (a reward plugin exports "
                          "slime_reward_abi_version and slime_reward_v1, see plugin_abi.h)",
                          version == nullptr ? "slime_reward_abi_version" : "slime_reward_v1"));
    ::_exit(0);
  }
  int v = version();
  if (v != SLIME_REWARD_ABI_VERSION) {
    handshake(1, false,
              fmt::format("it was built for reward ABI version {}, this build supports {}", v,
                          SLIME_REWARD_ABI_VERSION));
    ::_exit(0);
  }
  char err[kErrLen];
  if (init != nullptr) {
    err[0] = '\0';
    if (init(err, kErrLen) != 0) {
      err[kErrLen - 1] = '\0';
      handshake(1, false, fmt::format("slime_reward_init failed: {}", err));
      ::_exit(0);
    }
  }
  handshake(0, batch != nullptr, "");

  while (true) {
    uint8_t kind = 0;
    uint32_t n = 0;
    if (!ChildRead(&kind, sizeof(kind)) || !ChildRead(&n, sizeof(n))) ::_exit(0);
    std::vector<std::string> fields(static_cast<size_t>(n) * 5);
    for (auto& f : fields) {
      if (!ChildReadString(&f)) ::_exit(0);
    }
    std::vector<slime_reward_input> inputs(n);
    for (uint32_t i = 0; i < n; ++i) {
      const std::string* f = &fields[i * 5];
      inputs[i] = {f[0].c_str(), f[0].size(),  f[1].c_str(), f[1].size(),  f[2].c_str(),
                   f[2].size(),  f[3].c_str(), f[3].size(),  f[4].c_str(), f[4].size()};
    }
    std::vector<double> rewards(n, 0.0);
    err[0] = '\0';
    int rc = 0;
    if (kind == 2 && batch != nullptr) {
      rc = batch(inputs.data(), n, rewards.data(), err, kErrLen);
    } else {
      for (uint32_t i = 0; i < n && rc == 0; ++i) rc = score(&inputs[i], &rewards[i], err, kErrLen);
    }
    err[kErrLen - 1] = '\0';
    std::string out;
    int32_t code = rc;
    Put(&out, &code, sizeof(code));
    if (rc == 0) {
      Put(&out, rewards.data(), rewards.size() * sizeof(double));
    } else {
      PutString(&out, err[0] != '\0' ? err : "the plugin returned an error without a message");
    }
    if (!ChildWrite(out)) ::_exit(0);
  }
}

// ---- parent side -----------------------------------------------------------------------------

std::string SignalName(int sig) {
  switch (sig) {
    case SIGSEGV:
      return "SIGSEGV";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGILL:
      return "SIGILL";
    case SIGABRT:
      return "SIGABRT";
    case SIGKILL:
      return "SIGKILL";
    case SIGTERM:
      return "SIGTERM";
    default:
      return fmt::format("signal {}", sig);
  }
}

struct Worker {
  pid_t pid = -1;
  int fd = -1;
  bool has_batch = false;
  bool alive() const { return pid > 0; }
};

class PluginRewardFn : public RewardFn {
 public:
  PluginRewardFn(PluginOptions options) : options_(std::move(options)) {}
  ~PluginRewardFn() override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& w : idle_) Stop(w.get(), /*kill_first=*/true);
  }

  std::string name() const override { return "plugin " + options_.path; }

  // Starts one worker and keeps it idle: the load check of LoadRewardPlugin.
  Status Warm(bool need_batch) {
    auto worker = Acquire();
    Status status = Spawn(worker.get());
    bool has_batch = worker->has_batch;
    Release(std::move(worker));
    if (!status.ok()) return status;
    if (need_batch && !has_batch) {
      return absl::FailedPreconditionError(
          fmt::format("reward plugin {}: reward.group_rm is set but it does not export "
                      "slime_reward_batch_v1",
                      options_.path));
    }
    return absl::OkStatus();
  }

  StatusOr<RewardValue> Score(const RewardSample& sample) override {
    SLIME_ASSIGN_OR_RETURN(auto rewards, Call(1, std::span<const RewardSample>(&sample, 1)));
    return RewardValue{rewards[0], nullptr};
  }

  StatusOr<std::vector<RewardValue>> ScoreGroup(std::span<const RewardSample> samples) override {
    if (samples.empty()) return std::vector<RewardValue>{};
    SLIME_ASSIGN_OR_RETURN(auto rewards, Call(2, samples));
    std::vector<RewardValue> out;
    for (double r : rewards) out.push_back({r, nullptr});
    return out;
  }

 private:
  std::unique_ptr<Worker> Acquire() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !idle_.empty() || created_ < options_.num_processes; });
    if (!idle_.empty()) {
      auto w = std::move(idle_.back());
      idle_.pop_back();
      return w;
    }
    ++created_;
    return std::make_unique<Worker>();
  }

  void Release(std::unique_ptr<Worker> w) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      idle_.push_back(std::move(w));
    }
    cv_.notify_one();
  }

  // Ends the worker's process; returns how it ended ("crashed with SIGSEGV", ...).
  static std::string Stop(Worker* w, bool kill_first) {
    if (!w->alive()) return "not running";
    if (w->fd >= 0) ::close(w->fd);
    w->fd = -1;
    int status = 0;
    pid_t r = 0;
    if (!kill_first) {  // it is exiting by itself (EOF seen): give it a moment to be reaped
      for (int i = 0; i < 100 && (r = ::waitpid(w->pid, &status, WNOHANG)) == 0; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    if (r == 0) {
      ::kill(w->pid, SIGKILL);
      r = ::waitpid(w->pid, &status, 0);
    }
    w->pid = -1;
    if (r < 0) return "ended (not reaped)";
    if (WIFSIGNALED(status)) return "crashed with " + SignalName(WTERMSIG(status));
    return fmt::format("exited with status {}", WEXITSTATUS(status));
  }

  Status WaitFor(int fd, short events, Clock::time_point deadline) {
    while (true) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return absl::DeadlineExceededError("timed out");
      pollfd p{fd, events, 0};
      int n = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count() + 1, 1 << 30)));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return absl::InternalError(fmt::format("poll: {}", std::strerror(errno)));
      if (n > 0) return absl::OkStatus();
    }
  }

  Status SendAll(Worker* w, const std::string& data, Clock::time_point deadline) {
    size_t done = 0;
    while (done < data.size()) {
      SLIME_RETURN_IF_ERROR(WaitFor(w->fd, POLLOUT, deadline));
      ssize_t n = ::send(w->fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n < 0) return absl::UnavailableError("the worker closed its socket");
      done += static_cast<size_t>(n);
    }
    return absl::OkStatus();
  }

  Status RecvAll(Worker* w, void* buf, size_t size, Clock::time_point deadline) {
    char* p = static_cast<char*>(buf);
    size_t done = 0;
    while (done < size) {
      SLIME_RETURN_IF_ERROR(WaitFor(w->fd, POLLIN, deadline));
      ssize_t n = ::recv(w->fd, p + done, size - done, 0);
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n <= 0) return absl::UnavailableError("the worker closed its socket");
      done += static_cast<size_t>(n);
    }
    return absl::OkStatus();
  }

  Status RecvString(Worker* w, std::string* out, Clock::time_point deadline) {
    uint32_t len = 0;
    SLIME_RETURN_IF_ERROR(RecvAll(w, &len, sizeof(len), deadline));
    out->assign(len, '\0');
    return len == 0 ? absl::OkStatus() : RecvAll(w, out->data(), len, deadline);
  }

  // An I/O failure with the worker: ends it and says how.
  Status Fail(Worker* w, const Status& io, std::string_view during) {
    bool timed_out = io.code() == absl::StatusCode::kDeadlineExceeded;
    std::string how = Stop(w, /*kill_first=*/timed_out);
    if (timed_out) {
      return absl::DeadlineExceededError(
          fmt::format("reward plugin {} did not answer {} within {} ms; its worker was killed",
                      options_.path, during, options_.timeout.count()));
    }
    return absl::InternalError(fmt::format("reward plugin {}: its worker {} {} ({})", options_.path,
                                           how, during, std::string(io.message())));
  }

  Status Spawn(Worker* w) {
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
      return absl::InternalError(fmt::format("socketpair: {}", std::strerror(errno)));
    }
    std::string path = options_.path;
    pid_t pid = ::fork();
    if (pid < 0) {
      ::close(fds[0]);
      ::close(fds[1]);
      return absl::ResourceExhaustedError(fmt::format("fork: {}", std::strerror(errno)));
    }
    if (pid == 0) ChildMain(fds[1], path.c_str());
    ::close(fds[1]);
    ::fcntl(fds[0], F_SETFL, ::fcntl(fds[0], F_GETFL) | O_NONBLOCK);
    w->pid = pid;
    w->fd = fds[0];
    auto deadline = Clock::now() + options_.timeout;
    int32_t rc = 0;
    uint8_t has_batch = 0;
    std::string message;
    Status io = RecvAll(w, &rc, sizeof(rc), deadline);
    if (io.ok()) io = RecvAll(w, &has_batch, sizeof(has_batch), deadline);
    if (io.ok()) io = RecvString(w, &message, deadline);
    if (!io.ok()) return Fail(w, io, "while loading");
    if (rc != 0) {
      Stop(w, /*kill_first=*/false);
      return absl::FailedPreconditionError(
          fmt::format("reward plugin {}: {}", options_.path, message));
    }
    w->has_batch = has_batch != 0;
    return absl::OkStatus();
  }

  StatusOr<std::vector<double>> Call(uint8_t kind, std::span<const RewardSample> samples) {
    std::string request;
    Put(&request, &kind, sizeof(kind));
    uint32_t n = static_cast<uint32_t>(samples.size());
    Put(&request, &n, sizeof(n));
    for (const auto& s : samples) {
      PutString(&request, s.prompt);
      PutString(&request, s.response);
      PutString(&request, s.label);
      PutString(&request, s.metadata != nullptr && !s.metadata->is_null() ? s.metadata->dump()
                                                                          : std::string("{}"));
      PutString(&request, s.rm_type);
    }
    auto worker = Acquire();
    auto result = CallOn(worker.get(), request, n);
    Release(std::move(worker));
    return result;
  }

  StatusOr<std::vector<double>> CallOn(Worker* w, const std::string& request, uint32_t n) {
    if (!w->alive()) SLIME_RETURN_IF_ERROR(Spawn(w));
    auto deadline = Clock::now() + options_.timeout;
    const std::string during =
        n == 1 ? "while scoring a sample" : fmt::format("while scoring a group of {}", n);
    Status io = SendAll(w, request, deadline);
    int32_t rc = 0;
    if (io.ok()) io = RecvAll(w, &rc, sizeof(rc), deadline);
    if (!io.ok()) return Fail(w, io, during);
    if (rc != 0) {
      std::string message;
      io = RecvString(w, &message, deadline);
      if (!io.ok()) return Fail(w, io, during);
      return absl::InvalidArgumentError(
          fmt::format("reward plugin {} returned error {}: {}", options_.path, rc, message));
    }
    std::vector<double> rewards(n);
    io = RecvAll(w, rewards.data(), n * sizeof(double), deadline);
    if (!io.ok()) return Fail(w, io, during);
    return rewards;
  }

  const PluginOptions options_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Worker>> idle_ ABSL_GUARDED_BY(mu_);
  int created_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

StatusOr<std::unique_ptr<RewardFn>> LoadRewardPlugin(const PluginOptions& options,
                                                     bool need_batch) {
  if (options.path.empty()) return absl::InvalidArgumentError("reward plugin: empty path");
  std::error_code ec;
  if (!std::filesystem::is_regular_file(options.path, ec)) {
    return absl::NotFoundError(fmt::format(
        "reward plugin {}: no such file (reward.custom_rm_path must name a shared library)",
        options.path));
  }
  if (options.timeout.count() <= 0 || options.num_processes < 1) {
    return absl::InvalidArgumentError(
        fmt::format("reward plugin {}: timeout must be > 0 and num_processes >= 1 (got {} ms, {})",
                    options.path, options.timeout.count(), options.num_processes));
  }
  auto fn = std::make_unique<PluginRewardFn>(options);
  SLIME_RETURN_IF_ERROR(fn->Warm(need_batch));
  spdlog::info("reward plugin {} loaded ({} worker processes at most, {} ms per call)",
               options.path, options.num_processes, options.timeout.count());
  return std::unique_ptr<RewardFn>(std::move(fn));
}

}  // namespace slime::reward
