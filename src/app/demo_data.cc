// `slime_train make-demo-data` (see include/slime/app/demo_data.h).
#include "slime/app/demo_data.h"

#include <CLI/CLI.hpp>

#include <iostream>

#include "slime/app/cli.h"
#include "slime/tokenizer/byte_level_subset.h"

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

void AddMakeByteTokenizerOptions(CLI::App* app, MakeByteTokenizerOptions* o) {
  app->add_option("--from", o->from, "Directory with a byte-level BPE tokenizer.json (+ config)")
      ->required();
  app->add_option("--out", o->out, "Output directory (created if needed)")->required();
}

int RunMakeByteTokenizer(const MakeByteTokenizerOptions& o) {
  StatusOr<tokenizer::ByteLevelSubsetInfo> info = tokenizer::WriteByteLevelSubset(o.from, o.out);
  if (!info.ok()) {
    std::cerr << "slime_train make-byte-tokenizer: error: " << info.status().message() << "\n";
    return kExitFailure;
  }
  std::cout << "slime_train make-byte-tokenizer: wrote " << o.out
            << "/{tokenizer,tokenizer_config}.json: vocabulary " << info->vocab_size
            << " (256 byte tokens + " << info->special.size() << " added)";
  for (const char* name : {"<|endoftext|>", "<|im_end|>"}) {
    if (auto it = info->special.find(name); it != info->special.end()) {
      std::cout << ", " << name << " = " << it->second;
    }
  }
  std::cout << "\n";
  return kExitOk;
}

}  // namespace slime::app
