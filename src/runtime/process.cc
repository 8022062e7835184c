#include "process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "fmt/format.h"

extern char** environ;

namespace slime::runtime {

StatusOr<pid_t> SpawnProcess(const SpawnOptions& options) {
  // Everything the child needs is prepared before fork(): after it, only async-signal-safe
  // calls are allowed (the parent has other threads).
  std::error_code ec;
  if (!options.log_path.empty()) {
    std::filesystem::create_directories(std::filesystem::path(options.log_path).parent_path(), ec);
  }
  const int log_fd = options.log_path.empty()
                         ? -1
                         : ::open(options.log_path.c_str(),
                                  O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (!options.log_path.empty() && log_fd < 0) {
    return absl::InternalError(
        fmt::format("cannot open log file {}: {}", options.log_path, std::strerror(errno)));
  }
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    const std::string name = eq == nullptr ? *e : std::string(*e, eq - *e);
    if (options.env.count(name) == 0) env_strings.emplace_back(*e);
  }
  for (const auto& [k, v] : options.env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_strings = {options.binary};
  argv_strings.insert(argv_strings.end(), options.args.begin(), options.args.end());
  std::vector<char*> argv;
  for (std::string& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  // Where the child's fallback close loop ends (close_range needs Linux 5.9).
  struct rlimit files {};
  const int max_fd = ::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY
                         ? static_cast<int>(std::min<rlim_t>(files.rlim_cur, 1 << 20))
                         : 65536;

  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    if (log_fd >= 0) ::close(log_fd);
    return absl::InternalError(fmt::format("fork failed: {}", std::strerror(err)));
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the parent died before prctl took effect
    // Default signal dispositions and an empty mask for the new program.
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    const int null_fd = ::open("/dev/null", O_RDONLY);
    if (null_fd >= 0) ::dup2(null_fd, 0);
    if (log_fd >= 0) {
      ::dup2(log_fd, 1);
      ::dup2(log_fd, 2);
    }
    // Nothing else of this process reaches the worker: sockets opened without close-on-exec
    // (Boost.Asio's, e.g. the driver's /metrics listener and its HTTP connections to engines)
    // would otherwise live on in every worker, which would then hold the parent's listening
    // ports and keep connections the parent closed open.
    if (::close_range(3, ~0U, 0) != 0) {
      for (int fd = 3; fd < max_fd; ++fd) ::close(fd);
    }
    ::execve(argv[0], argv.data(), envp.data());
    static const char kMsg[] = "slime runtime: execve of the worker binary failed\n";
    (void)!::write(2, kMsg, sizeof(kMsg) - 1);
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also from the parent, so a kill(-pid) right after fork works
  if (log_fd >= 0) ::close(log_fd);
  return pid;
}

std::string DescribeWaitStatus(int wait_status) {
  if (WIFEXITED(wait_status)) return fmt::format("exited with code {}", WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) {
    const int sig = WTERMSIG(wait_status);
    const char* abbrev = sigabbrev_np(sig);
    return fmt::format("killed by signal {} (SIG{}){}", sig, abbrev == nullptr ? "?" : abbrev,
                       WCOREDUMP(wait_status) ? ", core dumped" : "");
  }
  return fmt::format("ended with wait status {:#x}", wait_status);
}

std::string SelfExecutable() {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : p.string();
}

}  // namespace slime::runtime
