// A byte-level subset of a byte-level BPE tokenizer: its 256 byte tokens and its added (special)
// tokens, no merges. Text still round-trips (every byte is a token), the chat template and the
// special tokens stay the same strings, but the vocabulary shrinks from ~150k to ~280 ids.
//
// What it is for: the quickstart's tiny model (configs/tiny-model). With Qwen3's full vocabulary
// the LM head is 98% of a hidden-128 model and dominates every CPU step; with the subset the
// same architecture trains ~10x faster and Adam no longer spreads each RL step's noise over
// 150k unused rows (docs/data.md "Warm start").
//
// New ids: the byte tokens keep their relative order and take 0..255 (for GPT-2-style
// vocabularies such as Qwen's and Llama 3's they are already 0..255); the added tokens follow in
// the order of their old ids, 256, 257, ... Everything that names ids is rewritten:
// tokenizer.json (model.vocab, model.merges emptied, added_tokens, a TemplateProcessing
// post-processor's special token ids) and tokenizer_config.json (added_tokens_decoder).
// Other keys (pre-tokenizer, decoder, normalizer, chat template) are kept as they are.
#ifndef SLIME_TOKENIZER_BYTE_LEVEL_SUBSET_H_
#define SLIME_TOKENIZER_BYTE_LEVEL_SUBSET_H_

#include <cstdint>
#include <map>
#include <string>

#include "slime/common/status.h"

namespace slime::tokenizer {

struct ByteLevelSubsetInfo {
  int64_t vocab_size = 0;                  // 256 + the added tokens: ids are [0, vocab_size)
  std::map<std::string, int64_t> special;  // added token content -> new id
};

// Reads `from_dir`/tokenizer.json and tokenizer_config.json, writes the subset to `out_dir`
// (created if needed; each file atomically). Errors name the file and what is wrong: not a BPE
// model, no ByteLevel pre-tokenizer, a byte of the alphabet missing from the vocabulary, an id
// in tokenizer_config.json or the post-processor that is not an added token.
StatusOr<ByteLevelSubsetInfo> WriteByteLevelSubset(const std::string& from_dir,
                                                   const std::string& out_dir);

}  // namespace slime::tokenizer

#endif  // SLIME_TOKENIZER_BYTE_LEVEL_SUBSET_H_
