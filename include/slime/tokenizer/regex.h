// Regex: a compiled PCRE2 pattern (UTF-8, Unicode properties) for the pre-tokenizer's Split
// steps. Patterns written for Hugging Face `tokenizers` (Oniguruma syntax) compile unchanged for
// the constructs those tokenizers use: \p{L}, \p{N}, \s, (?i:...), (?!...), {m,n}. One
// difference is bridged: Oniguruma's \s is exactly Unicode White_Space, PCRE2's (with UCP) also
// matches U+180E, so \s / \S are compiled as \p{White_Space} / \P{White_Space}.
//
// Ownership: owns the compiled code (and its JIT code when PCRE2 JIT is available).
// Thread-safety: immutable after Compile; FindAll may be called concurrently from any number of
// threads (each thread keeps its own PCRE2 match data and JIT stack).
// Invariants: subjects must be valid UTF-8 (checked by callers; no per-match UTF check is done).
#ifndef SLIME_TOKENIZER_REGEX_H_
#define SLIME_TOKENIZER_REGEX_H_

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "slime/common/status.h"

namespace slime::tokenizer {

class Regex {
 public:
  // `pattern` is a regular expression, or with `literal` a plain string to find.
  static StatusOr<std::unique_ptr<Regex>> Compile(std::string_view pattern, bool literal = false);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends to `*matches` the [start, end) byte ranges of the successive non-overlapping,
  // non-empty matches in `text`, leftmost first (an empty match only advances the search by one
  // character). Fails only when PCRE2 hits a resource limit.
  Status FindAll(std::string_view text, std::vector<std::pair<size_t, size_t>>* matches) const;

  // True when the pattern matches somewhere in `text`.
  bool Search(std::string_view text) const;

  const std::string& pattern() const { return pattern_; }
  bool jit() const { return jit_; }

 private:
  Regex() = default;
  // Runs one match at `offset`: 1 and sets [*start, *end) on a match, 0 on none, <0 on error.
  int MatchAt(std::string_view text, size_t offset, size_t* start, size_t* end) const;

  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

// \s → \p{White_Space}, \S → \P{White_Space}; other escapes (including \\s) are kept.
std::string TranslateWhitespaceClasses(std::string_view pattern);

}  // namespace slime::tokenizer

#endif  // SLIME_TOKENIZER_REGEX_H_
