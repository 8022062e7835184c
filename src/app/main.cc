// slime_train: one binary for the whole RL job (DESIGN.md §3). See `slime_train --help`.
#include "slime/app/cli.h"

int main(int argc, char** argv) { return slime::app::RunCli(argc, argv); }
