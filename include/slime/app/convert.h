// `slime_train convert --from CKPT --to-hf DIR [--ckpt-step N] [--tokenizer DIR] [--dtype D]`:
// the CLI of train::ExportCheckpointToHf (include/slime/train/hf_export.h). Exit codes: 0 done,
// 2 bad input (missing/corrupt checkpoint, existing output, bad option), 1 I/O failure.
#ifndef SLIME_APP_CONVERT_H_
#define SLIME_APP_CONVERT_H_

#include "slime/train/hf_export.h"

namespace CLI {
class App;
}

namespace slime::app {

void AddConvertOptions(CLI::App* app, train::HfExportOptions* options);
int RunConvert(const train::HfExportOptions& options);

}  // namespace slime::app

#endif  // SLIME_APP_CONVERT_H_
