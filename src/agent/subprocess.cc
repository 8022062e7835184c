#include "subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "fmt/format.h"

namespace slime::agent::internal {

StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Spawn(const ChildSpec& spec) {
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&actions);
  posix_spawnattr_init(&attr);
  const int kAppend = O_WRONLY | O_CREAT | O_APPEND;
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(
      &actions, 1, spec.stdout_path.empty() ? "/dev/null" : spec.stdout_path.c_str(), kAppend,
      0644);
  posix_spawn_file_actions_addopen(
      &actions, 2, spec.stderr_path.empty() ? "/dev/null" : spec.stderr_path.c_str(), kAppend,
      0644);
  posix_spawn_file_actions_addclosefrom_np(&actions, 3);
  if (!spec.working_dir.empty()) {
    posix_spawn_file_actions_addchdir_np(&actions, spec.working_dir.c_str());
  }
  // Own process group (pgid = the child's pid) and default signal handling.
  posix_spawnattr_setpgroup(&attr, 0);
  sigset_t all, none;
  sigfillset(&all);
  sigemptyset(&none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF |
                                      POSIX_SPAWN_SETSIGMASK);

  std::vector<char*> argv = {const_cast<char*>("/bin/sh"), const_cast<char*>("-c"),
                             const_cast<char*>(spec.command.c_str()), nullptr};
  std::vector<char*> envp;
  for (const auto& e : spec.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, "/bin/sh", &actions, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    return absl::InternalError(fmt::format("cannot start agent command `{}`: {}", spec.command,
                                           std::strerror(rc)));
  }
  return std::unique_ptr<ChildProcess>(new ChildProcess(pid));
}

ChildProcess::~ChildProcess() { Kill(); }

bool ChildProcess::Poll(int* wait_status) {
  if (reaped_) return true;
  int status = 0;
  pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == 0) return false;
  if (r < 0 && errno == EINTR) return false;
  reaped_ = true;
  ::kill(-pid_, SIGKILL);  // whatever the shell left running in its group (ESRCH: none)
  if (wait_status != nullptr) *wait_status = r == pid_ ? status : 0;
  return true;
}

void ChildProcess::Kill() {
  if (reaped_) return;
  ::kill(-pid_, SIGKILL);
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  reaped_ = true;
}

std::string DescribeWaitStatus(int wait_status) {
  if (WIFEXITED(wait_status)) return fmt::format("exit status {}", WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) {
    const char* name = sigabbrev_np(WTERMSIG(wait_status));
    return fmt::format("killed by signal SIG{}", name != nullptr ? name : "?");
  }
  return fmt::format("wait status {}", wait_status);
}

}  // namespace slime::agent::internal
