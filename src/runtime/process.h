// Child processes of a node agent: spawn with a clean contract, describe how they ended.
//
// A spawned child gets its own process group (so the agent can kill it and anything it starts
// with one kill(-pgid)), PR_SET_PDEATHSIG(SIGKILL) (so it dies when the agent thread that
// forked it dies, e.g. when the agent or the in-process head is killed with -9), stdin from
// /dev/null, stdout/stderr appended to its log file and no other file descriptor of the parent
// (every descriptor from 3 up is closed before exec, close-on-exec or not).
//
// REQUIRES: SpawnProcess is called from a thread that lives as long as the children should
// (the death signal follows the forking *thread*, not the process).
#ifndef SLIME_SRC_RUNTIME_PROCESS_H_
#define SLIME_SRC_RUNTIME_PROCESS_H_

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include "slime/common/status.h"

namespace slime::runtime {

struct SpawnOptions {
  std::string binary;
  std::vector<std::string> args;              // argv[1..]
  std::map<std::string, std::string> env;     // set on top of this process's environment
  std::string log_path;                       // stdout+stderr, appended; created with parents
};

// Returns the child's pid (also its process group id).
StatusOr<pid_t> SpawnProcess(const SpawnOptions& options);

// "exited with code 3", "killed by signal 9 (SIGKILL)".
std::string DescribeWaitStatus(int wait_status);

// The absolute path of the running executable.
std::string SelfExecutable();

}  // namespace slime::runtime

#endif  // SLIME_SRC_RUNTIME_PROCESS_H_
