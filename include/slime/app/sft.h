// `slime_train sft --model DIR --data FILE.jsonl [options]`: supervised fine-tuning on chat
// conversations (the CLI of train::RunSft, include/slime/train/sft.h). Exit codes: 0 done, 2 bad
// input (option, data line, model, checkpoint), 1 a failure while training.
#ifndef SLIME_APP_SFT_H_
#define SLIME_APP_SFT_H_

#include "slime/train/sft.h"

namespace CLI {
class App;
}

namespace slime::app {

void AddSftOptions(CLI::App* app, train::SftOptions* options);
int RunSftCommand(const train::SftOptions& options);

}  // namespace slime::app

#endif  // SLIME_APP_SFT_H_
