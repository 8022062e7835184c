// OutputText: the detokenized output of one request, built token by token, with SGLang's stop
// string matching and stop trimming (docs/http-api.md §1.5; SGLang's detokenizer_manager.py).
//
// Feed each sampled token; the text grows through a tokenizer::IncrementalDecoder, so a UTF-8
// character split across tokens appears only once complete. Stop strings are matched on the text
// produced so far, across token boundaries: after each token only the tail that can hold a match
// ending in the new text is searched (for a stop string s: the last |s| - 1 old bytes plus the
// new ones), so the cost per token does not grow with the output.
// When several stop strings complete on the same token, the one starting first wins (ties: the
// longer). Stop tokens (EOS, stop_token_ids) are decided by the engine, not here; Text() only
// trims them.
//
// Final text (Text):
//   * finished by a stop token → the text of all tokens but the last (the stop token must be
//     the last token fed), unless no_stop_trim;
//   * finished by a stop string → the text before the string; with no_stop_trim, up to the end of
//     the string (anything the same token produced after it is cut, as newer SGLang does);
//   * otherwise → the decode of every token (an incomplete trailing character becomes U+FFFD).
// Every variant equals tokenizer.Decode(ids, skip_special_tokens) cut as described.
//
// Detokenization options: skip_special_tokens drops special tokens from the text (and so from
// stop matching, as in SGLang). spaces_between_special_tokens has no effect: the tokenizers we
// load are byte-level BPE "fast" tokenizers, for which Hugging Face ignores that flag too.
// PartialText() never holds back a possible stop-string prefix (SGLang streams it too).
// min_new_tokens does not suppress stop strings (SGLang masks only EOS / stop token ids).
//
// Ownership: borrows the Tokenizer, which must outlive this object. Thread-safety: one object per
// request, used by one thread at a time. Invariant: text_ holds only complete characters and
// equals the decode of the tokens fed so far minus the decoder's held-back bytes.
#ifndef SLIME_ENGINE_OUTPUT_TEXT_H_
#define SLIME_ENGINE_OUTPUT_TEXT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "slime/engine/request.h"
#include "slime/tokenizer/incremental_decoder.h"
#include "slime/tokenizer/tokenizer.h"

namespace slime::engine {

class OutputText {
 public:
  // Uses params.stop, skip_special_tokens (and documents spaces_between_special_tokens).
  OutputText(const tokenizer::Tokenizer* tok, const SamplingParams& params);

  // Appends one sampled token. Returns the stop string whose match completed with this token
  // (reported once; later calls return nullopt and the first match stays the one that counts).
  std::optional<std::string> Feed(int32_t token);

  // The text so far for a streamed chunk: every complete character (no trimming).
  const std::string& PartialText() const { return text_; }

  // The final text of a request that ended with `finish` (see the file comment).
  std::string Text(const FinishReason& finish, bool no_stop_trim) const;

  size_t num_tokens() const { return num_tokens_; }
  // The stop string Feed reported, if any, and where it starts in PartialText().
  const std::optional<std::string>& matched_stop() const { return matched_stop_; }
  size_t matched_stop_pos() const { return matched_pos_; }

 private:
  std::vector<std::string> stops_;
  tokenizer::IncrementalDecoder decoder_;
  // Decoder and text length before the latest token: the stop-token trim point.
  tokenizer::IncrementalDecoder prev_decoder_;
  size_t prev_text_size_ = 0;
  std::string text_;
  size_t num_tokens_ = 0;
  std::optional<std::string> matched_stop_;
  size_t matched_pos_ = 0;
};

}  // namespace slime::engine

#endif  // SLIME_ENGINE_OUTPUT_TEXT_H_
