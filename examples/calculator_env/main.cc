// slime_calculator_env: serves the example calculator environment (workflow/calculator_env.h)
// over the tool-environment protocol of docs/http-api.md until SIGINT or SIGTERM.
//
//   slime_calculator_env [--host 127.0.0.1] [--port 0] [--seed 1] [--max-operand 99]
//
// Prints "calculator env listening on http://host:port" once it serves (port 0 = a free one),
// so a script can read the address from the first line of stdout.
#include <fmt/format.h>
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "slime/workflow/calculator_env.h"

int main(int argc, char** argv) {
  slime::http::ServerOptions server;
  slime::workflow::CalculatorEnvOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--host" && has_value) {
      server.host = argv[++i];
    } else if (arg == "--port" && has_value) {
      server.port = std::atoi(argv[++i]);
    } else if (arg == "--seed" && has_value) {
      options.seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (arg == "--max-operand" && has_value) {
      options.max_operand = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr,
                   "usage: %s [--host H] [--port P] [--seed S] [--max-operand N]\n"
                   "unknown or incomplete argument: %s\n",
                   argv[0], arg.c_str());
      return 2;
    }
  }
  // Stop signals go to sigwait below only (blocked before the server's threads start).
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  auto env = slime::workflow::CalculatorEnv::Start(server, options);
  if (!env.ok()) {
    std::fprintf(stderr, "slime_calculator_env: %s\n", env.status().ToString().c_str());
    return 1;
  }
  std::printf("calculator env listening on %s\n", (*env)->url().c_str());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&stop, &sig);
  (*env)->Stop();
  return 0;
}
