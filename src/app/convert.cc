// `slime_train convert` (see include/slime/app/convert.h).
#include "slime/app/convert.h"

#include <CLI/CLI.hpp>

#include <iostream>

#include "slime/app/cli.h"
#include "slime/common/logging.h"

namespace slime::app {

void AddConvertOptions(CLI::App* app, train::HfExportOptions* o) {
  app->add_option("--from", o->from, "Checkpoint <save> directory or one iter_NNNNNNN directory")
      ->required();
  app->add_option("--ckpt-step", o->ckpt_step,
                  "Iteration to read from a <save> directory (default: the tracker's)");
  app->add_option("--to-hf", o->to_hf, "Output HF model directory (must not exist or be empty)")
      ->required();
  app->add_option("--tokenizer", o->tokenizer,
                  "Directory whose tokenizer files are copied (default: the checkpoint's, if any)");
  app->add_option("--dtype", o->dtype, "auto (as saved) | bf16 | fp16 | fp32");
}

int RunConvert(const train::HfExportOptions& o) {
  if (Status s = InitLogging({.role = "convert"}); !s.ok()) {
    std::cerr << "slime_train convert: error: " << s.message() << "\n";
    return kExitUsage;
  }
  StatusOr<std::string> r = train::ExportCheckpointToHf(o);
  if (!r.ok()) {
    std::cerr << "slime_train convert: error: " << r.status().message() << "\n";
    return r.status().code() == absl::StatusCode::kInternal ? kExitFailure : kExitUsage;
  }
  std::cout << "slime_train convert: wrote HF model " << o.to_hf << " from " << *r << "\n";
  return kExitOk;
}

}  // namespace slime::app
