// The `slime_train` command line: subcommands (docs/architecture.md, `app`) and their dispatch.
//
// RunCli parses argv, runs the chosen subcommand and returns the process exit code. It never
// calls exit() itself, so tests can drive it in-process. Errors a user can cause are printed
// to stderr as one clear message (no stack trace) and yield a non-zero code.
#ifndef SLIME_APP_CLI_H_
#define SLIME_APP_CLI_H_

namespace slime::app {

// Exit codes of slime_train.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;      // the job ran and failed
inline constexpr int kExitUsage = 2;        // bad command line or configuration
inline constexpr int kExitNotBuilt = 3;     // subcommand exists in the design but not yet here

int RunCli(int argc, char** argv);

}  // namespace slime::app

#endif  // SLIME_APP_CLI_H_
