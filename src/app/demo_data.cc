// `slime_train make-demo-data` (see include/slime/app/demo_data.h).
#include "slime/app/demo_data.h"

#include <CLI/CLI.hpp>

#include <iostream>

#include "slime/app/cli.h"

namespace slime::app {

void AddMakeDemoDataOptions(CLI::App* app, MakeDemoDataOptions* o) {
  app->add_option("--out", o->out, "Output directory (created if needed)")->required();
  app->add_option("--digits", o->task.digits, "Digits per operand, 1..3")->capture_default_str();
  app->add_option("--train", o->task.num_train, "RL train prompts")->capture_default_str();
  app->add_option("--eval", o->task.num_eval, "Held-out eval prompts")->capture_default_str();
  app->add_option("--sft", o->task.num_sft, "SFT warm-start conversations (first train problems)")
      ->capture_default_str();
  app->add_option("--seed", o->task.seed, "Seed of the problem permutation")
      ->capture_default_str();
}

int RunMakeDemoData(const MakeDemoDataOptions& o) {
  if (Status s = o.task.Validate(); !s.ok()) {
    std::cerr << "slime_train make-demo-data: error: " << s.message() << "\n";
    return kExitUsage;
  }
  if (Status s = data::WriteDemoTask(o.out, o.task); !s.ok()) {
    std::cerr << "slime_train make-demo-data: error: " << s.message() << "\n";
    return kExitFailure;
  }
  std::cout << "slime_train make-demo-data: wrote " << o.task.num_train << " train, "
            << o.task.num_eval << " eval prompts and " << o.task.num_sft
            << " SFT conversations (" << o.task.digits << "-digit addition, seed " << o.task.seed
            << ") to " << o.out << "/{train,eval,sft}.jsonl\n";
  return kExitOk;
}

}  // namespace slime::app
