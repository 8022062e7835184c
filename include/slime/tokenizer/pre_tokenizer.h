// Normalizer and PreTokenizer: the two text stages of a Hugging Face `tokenizer.json` that run
// before the BPE model.
//
// Supported "normalizer" types: null, NFC, Sequence (of supported types).
// Supported "pre_tokenizer" types: null, Sequence, Split (Regex or String pattern; behaviors
// Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous; invert), ByteLevel
// (add_prefix_space, use_regex with the GPT-2 pattern). Anything else is rejected at load time
// with a message listing these.
//
// Ownership: each owns its compiled regexes. Thread-safety: immutable after FromJson; Normalize
// and Split may run concurrently. Invariants: inputs are valid UTF-8; every word that Split
// produces is non-empty.
#ifndef SLIME_TOKENIZER_PRE_TOKENIZER_H_
#define SLIME_TOKENIZER_PRE_TOKENIZER_H_

#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "slime/common/status.h"
#include "slime/tokenizer/regex.h"

namespace slime::tokenizer {

class Normalizer {
 public:
  // `j` is the "normalizer" value (may be null). Errors name the offending JSON path.
  static StatusOr<std::unique_ptr<Normalizer>> FromJson(const nlohmann::json& j);

  // True when Normalize is the identity (no steps).
  bool empty() const { return steps_.empty(); }
  // Writes the normalized text to `*out` and returns true, or returns false (leaving `*out`
  // alone) when normalization leaves `text` unchanged — the common case, which costs no copy.
  bool Normalize(std::string_view text, std::string* out) const;

 private:
  enum class Step { kNfc };
  static Status AddSteps(const nlohmann::json& j, const std::string& path,
                         std::vector<Step>* steps);
  std::vector<Step> steps_;
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

class PreTokenizer {
 public:
  // `j` is the "pre_tokenizer" value (may be null: the whole text is one word).
  static StatusOr<std::unique_ptr<PreTokenizer>> FromJson(const nlohmann::json& j);

  // Splits `text` into words, appended to `*words`. Views point into `text`, or into strings
  // that Split appends to `*arena` (when a step rewrites text, e.g. add_prefix_space).
  Status Split(std::string_view text, std::deque<std::string>* arena,
               std::vector<std::string_view>* words) const;

  // A ByteLevel step is present: words are byte strings that the model reads through the
  // GPT-2 byte-level alphabet.
  bool byte_level() const { return byte_level_; }

 private:
  struct Step {
    enum class Kind { kSplit, kByteLevel } kind;
    std::unique_ptr<Regex> regex;  // kSplit; kByteLevel with use_regex
    SplitBehavior behavior = SplitBehavior::kIsolated;
    bool invert = false;
    bool add_prefix_space = false;  // kByteLevel
  };
  static Status AddSteps(const nlohmann::json& j, const std::string& path,
                         std::vector<Step>* steps, bool* byte_level);
  // Applies one regex split to `piece`, appending the resulting non-empty pieces.
  static Status SplitPiece(const Regex& regex, SplitBehavior behavior, bool invert,
                           std::string_view piece, std::vector<std::string_view>* out);

  std::vector<Step> steps_;
  bool byte_level_ = false;
};

// Parses a Split "behavior" name.
StatusOr<SplitBehavior> ParseSplitBehavior(std::string_view name);

}  // namespace slime::tokenizer

#endif  // SLIME_TOKENIZER_PRE_TOKENIZER_H_
