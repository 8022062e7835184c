// `slime_train make-demo-data --out DIR [--digits N] [--train N] [--eval N] [--sft N]
// [--seed S]`: writes the quickstart's synthetic addition task (data::WriteDemoTask,
// include/slime/data/demo_task.h): train.jsonl and eval.jsonl prompts and sft.jsonl warm-start
// conversations. The defaults reproduce the committed data/demo/ files byte for byte.
// `slime_train make-byte-tokenizer --from DIR --out DIR`: writes the byte-level subset of a
// byte-level BPE tokenizer (tokenizer::WriteByteLevelSubset: 256 byte tokens + the special
// tokens), the quickstart tiny model's tokenizer; prints the vocabulary size and special ids.
// Exit codes: 0 done, 2 bad option, 1 the files cannot be read or written.
#ifndef SLIME_APP_DEMO_DATA_H_
#define SLIME_APP_DEMO_DATA_H_

#include <string>

#include "slime/data/demo_task.h"

namespace CLI {
class App;
}

namespace slime::app {

struct MakeDemoDataOptions {
  std::string out;
  data::DemoTaskOptions task;
};

void AddMakeDemoDataOptions(CLI::App* app, MakeDemoDataOptions* options);
int RunMakeDemoData(const MakeDemoDataOptions& options);

struct MakeByteTokenizerOptions {
  std::string from;
  std::string out;
};

void AddMakeByteTokenizerOptions(CLI::App* app, MakeByteTokenizerOptions* options);
int RunMakeByteTokenizer(const MakeByteTokenizerOptions& options);

}  // namespace slime::app

#endif  // SLIME_APP_DEMO_DATA_H_
