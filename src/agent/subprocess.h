// ChildProcess: one agent program started with /bin/sh -c in a process group of its own
// (agent_generator.cc). Internal to the agent module.
//
// The child gets a given environment, stdin /dev/null, stdout and stderr redirected to files, and
// no descriptor of ours beyond 0-2 (so it never holds the session server's sockets). Spawned with
// posix_spawn (safe in a multi-threaded process). The destructor kills the whole group and reaps
// the child if that has not happened yet, so no process outlives its owner.
// Threads: one owner thread.
#ifndef SLIME_SRC_AGENT_SUBPROCESS_H_
#define SLIME_SRC_AGENT_SUBPROCESS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "slime/common/status.h"

namespace slime::agent::internal {

struct ChildSpec {
  std::string command;           // run as /bin/sh -c command
  std::vector<std::string> env;  // the complete environment, "KEY=VALUE" each
  std::string working_dir;       // "" = inherit
  std::string stdout_path;       // appended to; "" = /dev/null
  std::string stderr_path;       // appended to; "" = /dev/null
};

class ChildProcess {
 public:
  // Errors: the spawn failed (naming the command and errno's text).
  static StatusOr<std::unique_ptr<ChildProcess>> Spawn(const ChildSpec& spec);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // True once the shell has exited (then `wait_status` holds waitpid's status). Never blocks.
  // After the shell exits, what it left behind in its group is killed.
  bool Poll(int* wait_status);
  // SIGKILLs the process group and reaps the shell. Idempotent.
  void Kill();
  pid_t pid() const { return pid_; }

 private:
  explicit ChildProcess(pid_t pid) : pid_(pid) {}
  pid_t pid_;
  bool reaped_ = false;
};

// "exit status N" or "killed by signal SIGNAME" for a waitpid status.
std::string DescribeWaitStatus(int wait_status);

}  // namespace slime::agent::internal

#endif  // SLIME_SRC_AGENT_SUBPROCESS_H_
