// The synthetic, verifiable demo task of the quickstart (configs/grpo-tiny-cpu.yaml): addition of
// two `digits`-digit numbers, answer = the exact sum. A tiny random model warm-started by a short
// SFT on a subset of the problems gets some sums right; GRPO with an exact-match reward
// (reward.rm_type: exact_match) then raises the eval accuracy.
//
// Files (JSONL, one object per line, written by WriteDemoTask and by
// `slime_train make-demo-data --out DIR`; the defaults are committed under data/demo/):
//   train.jsonl  RL prompts  {"input": "47+85=", "label": "132"}   (data.prompt_data)
//   eval.jsonl   held-out    same format, no problem in common with train or sft
//   sft.jsonl    warm start  {"messages": [{"role": "user", "content": "47+85="},
//                                          {"role": "assistant", "content": "132"}]}
//                            the first num_sft train problems with correct answers
// Prompts are strings: the job sets data.apply_chat_template: true so they are wrapped as one
// user message, exactly as in the SFT conversations, and label_key: label.
//
// Problems are the pairs (a, b) with a, b in [0, 10^digits); one seeded permutation of all
// pairs (EpochSampler::EpochOrder, identical on every platform) gives eval first, then train,
// so the files depend only on the options.
//
// Thread-safety: pure functions.
#ifndef SLIME_DATA_DEMO_TASK_H_
#define SLIME_DATA_DEMO_TASK_H_

#include <cstdint>
#include <string>

#include "slime/common/status.h"

namespace slime::data {

struct DemoTaskOptions {
  int digits = 2;         // operand digits, 1..3 (10^(2·digits) distinct problems)
  int64_t num_train = 4000;
  int64_t num_eval = 200;
  int64_t num_sft = 1000;  // <= num_train
  uint64_t seed = 1;

  // Errors: digits outside 1..3, a count < 1, num_sft > num_train, num_train + num_eval more
  // than the distinct problems.
  Status Validate() const;
};

struct DemoTaskFiles {
  std::string train;  // contents of train.jsonl
  std::string eval;   // contents of eval.jsonl
  std::string sft;    // contents of sft.jsonl
};

StatusOr<DemoTaskFiles> MakeDemoTask(const DemoTaskOptions& options);

// Writes train.jsonl, eval.jsonl and sft.jsonl into `out_dir` (created if needed), each
// atomically (temporary file + rename). Errors: invalid options, the directory or a file cannot
// be written.
Status WriteDemoTask(const std::string& out_dir, const DemoTaskOptions& options);

}  // namespace slime::data

#endif  // SLIME_DATA_DEMO_TASK_H_
