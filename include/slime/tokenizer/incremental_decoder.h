// IncrementalDecoder: streaming detokenization for generation. Feed token ids as they are
// sampled; each call returns only text that is complete — a UTF-8 character split across tokens
// (an emoji or CJK character made of byte-level tokens) is held back until its last byte
// arrives, so callers never see half a character or a spurious U+FFFD.
//
// The concatenation of all Feed results plus Flush equals
// tokenizer.Decode(all ids, skip_special_tokens, /*clean_up_tokenization_spaces=*/false):
// bytes that can never complete a character become U+FFFD exactly as in Decode. The
// transformers-style space clean-up is not applied while streaming (it is not prefix-stable).
//
// Ownership: borrows the Tokenizer, which must outlive the decoder. Thread-safety: one decoder
// per stream, used by one thread at a time (many decoders may share one Tokenizer).
// Invariants: pending_ holds at most 3 bytes, a proper prefix of a UTF-8 character.
#ifndef SLIME_TOKENIZER_INCREMENTAL_DECODER_H_
#define SLIME_TOKENIZER_INCREMENTAL_DECODER_H_

#include <cstdint>
#include <span>
#include <string>

#include "slime/tokenizer/tokenizer.h"

namespace slime::tokenizer {

class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer* tokenizer, bool skip_special_tokens = false)
      : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

  // Adds ids; returns the text they complete (possibly empty).
  std::string Feed(std::span<const int32_t> ids);
  std::string Feed(int32_t id) { return Feed(std::span<const int32_t>(&id, 1)); }

  // Ends the stream: returns the held-back bytes, each incomplete character as U+FFFD, and
  // resets the decoder for a new stream.
  std::string Flush();

  // True when bytes are held back waiting for the rest of a character.
  bool has_pending() const { return !pending_.empty(); }
  // Number of ids fed since construction or the last Flush (skipped ones included).
  size_t num_ids() const { return num_ids_; }

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_tokens_;
  bool first_token_ = true;
  size_t num_ids_ = 0;
  std::string pending_;
};

}  // namespace slime::tokenizer

#endif  // SLIME_TOKENIZER_INCREMENTAL_DECODER_H_
