#include "slime/app/cli.h"

#include <iostream>

#include "CLI/CLI.hpp"
#include "slime/app/version.h"

namespace slime::app {

int RunCli(int argc, char** argv) {
  CLI::App cli{"slime_train: native RL post-training for LLMs"};
  bool version = false;
  cli.add_flag("--version", version, "Print version, git hash, torch, CUDA and NCCL and exit");
  try {
    cli.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return cli.exit(e);
  }
  if (version) {
    std::cout << VersionReport();
    return kExitOk;
  }
  return kExitOk;
}

}  // namespace slime::app
