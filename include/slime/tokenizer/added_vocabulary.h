// AddedVocabulary: the "added_tokens" of a Hugging Face `tokenizer.json` (special tokens such as
// <|im_start|> and plain added tokens such as <think>), and the search that cuts input text
// around them before normalization and pre-tokenization.
//
// Matching follows Hugging Face: leftmost-longest over all added tokens; tokens with
// "normalized": false are matched on the raw text, those with "normalized": true on normalized
// text (a second pass); "single_word" requires no word character (alphanumeric or '_') on either
// side; "lstrip" / "rstrip" absorb adjacent whitespace into the token.
//
// Ownership: owns the token table and two byte tries. Thread-safety: immutable after Add/Build;
// Split may run concurrently. Invariants: ids are unique and contents non-empty.
#ifndef SLIME_TOKENIZER_ADDED_VOCABULARY_H_
#define SLIME_TOKENIZER_ADDED_VOCABULARY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "slime/common/status.h"

namespace slime::tokenizer {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
};

// A piece of input: either an added token (id >= 0) or text to tokenize (id == -1).
struct TextSplit {
  std::string_view text;
  int32_t id = -1;
};

class AddedVocabulary {
 public:
  AddedVocabulary() = default;

  // Adds one token; fails on an empty content or a duplicate id/content.
  Status Add(AddedToken token);

  // Cuts `text` around the added tokens of one pass (`normalized` selects which tokens take
  // part) and appends the pieces; concatenated, piece texts cover `text` except whitespace that
  // lstrip/rstrip tokens absorbed.
  void Split(std::string_view text, bool normalized, std::vector<TextSplit>* out) const;

  bool has_normalized_tokens() const { return num_normalized_ > 0; }
  bool empty() const { return tokens_.empty(); }
  const std::vector<AddedToken>& tokens() const { return tokens_; }

  // Lookups; nullptr / nullopt when absent.
  const AddedToken* FindById(int32_t id) const;
  std::optional<int32_t> FindByContent(std::string_view content) const;

 private:
  // Byte trie over token contents: node 0 is the root.
  struct Trie {
    absl::flat_hash_map<uint64_t, int32_t> edges;  // (node << 8 | byte) → child node
    std::vector<int32_t> terminal;                 // node → token index, or -1
    bool first_byte[256] = {};
    int32_t Child(int32_t node, uint8_t byte) const;
    void Insert(std::string_view s, int32_t token_index);
  };
  // Longest token starting at `pos`: its index and length, or -1.
  int32_t LongestAt(const Trie& trie, std::string_view text, size_t pos, size_t* len) const;

  std::vector<AddedToken> tokens_;
  absl::flat_hash_map<int32_t, size_t> by_id_;
  absl::flat_hash_map<std::string, size_t> by_content_;
  Trie raw_trie_;         // tokens with normalized == false
  Trie normalized_trie_;  // tokens with normalized == true
  int num_normalized_ = 0;
};

}  // namespace slime::tokenizer

#endif  // SLIME_TOKENIZER_ADDED_VOCABULARY_H_
