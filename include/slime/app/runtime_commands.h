// The runtime's subcommands of `slime_train` (docs/operations.md, "Multi-node"):
//
//   agent  --head H:P [--token-file F] [--node-name N] [--bind HOST] [--fake-gpus N]
//          A node agent for a job whose head runs elsewhere (SLURM starts one per node).
//   worker --head H:P --actor ID
//          Internal: one actor process, started by an agent (token and incarnation come in the
//          environment, never on the command line).
//   status --head H:P --token-file F | --run-dir D
//          Prints the head's status view (nodes, actors, states, restarts).
//   runtime-check (hidden) --run-dir D --workers N [--role engine|trainer] [--nodes K] [--hold]
//          Starts a head and the in-process agent, places N built-in `test` actors, calls them,
//          prints the status view; with --hold it keeps the job up until Ctrl-C/SIGTERM or a
//          failure. Used by the multiproc tests and as a smoke test of a cluster.
//
// Each Run* returns the process exit code (slime/app/cli.h; plus 128+signal when a job was
// stopped by SIGINT/SIGTERM). Signal handling: the Run* functions block SIGINT/SIGTERM/SIGUSR1
// in the calling thread before any other thread starts and wait for them on a dedicated thread.
#ifndef SLIME_APP_RUNTIME_COMMANDS_H_
#define SLIME_APP_RUNTIME_COMMANDS_H_

#include <string>

namespace CLI {
class App;
}  // namespace CLI

namespace slime::runtime {
class ActorRegistry;
}  // namespace slime::runtime

namespace slime::app {

struct RuntimeCommands {
  CLI::App* agent = nullptr;
  CLI::App* worker = nullptr;
  CLI::App* status = nullptr;
  CLI::App* check = nullptr;
  struct Values;
  Values* values = nullptr;  // owned by AddRuntimeCommands' static storage
};

// Adds the four subcommands to `cli`.
RuntimeCommands AddRuntimeCommands(CLI::App* cli);
// Runs whichever of them was parsed; -1 when none was.
int RunRuntimeCommand(const RuntimeCommands& commands);

// Every actor type a worker process can run (the built-in `test` type plus those of later
// modules). Filled once; read-only afterwards.
const runtime::ActorRegistry& WorkerActorRegistry();

}  // namespace slime::app

#endif  // SLIME_APP_RUNTIME_COMMANDS_H_
