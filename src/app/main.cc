// slime_train: one binary for the whole RL job (docs/architecture.md, `app`). See `--help`.
#include "slime/app/cli.h"

int main(int argc, char** argv) { return slime::app::RunCli(argc, argv); }
