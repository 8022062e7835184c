// Added tokens and their leftmost-longest search (see added_vocabulary.h).
#include "slime/tokenizer/added_vocabulary.h"

#include <algorithm>
#include <memory>

#include <fmt/format.h>

#include "slime/tokenizer/regex.h"
#include "slime/tokenizer/unicode.h"

namespace slime::tokenizer {
namespace {

absl::string_view AbslView(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Start of the character that ends at `end` (exclusive) in valid UTF-8 `s`.
size_t PrevCharStart(std::string_view s, size_t end) {
  size_t start = end - 1;
  while (start > 0 && (static_cast<uint8_t>(s[start]) & 0xC0) == 0x80) --start;
  return start;
}

// Rust's `c.is_alphanumeric() || c == '_'` for the character `ch` (one UTF-8 character).
bool IsWordChar(std::string_view ch) {
  static const Regex* word = [] {
    StatusOr<std::unique_ptr<Regex>> re = Regex::Compile(R"(^[\p{Alphabetic}\p{N}_])");
    if (!re.ok()) re = Regex::Compile(R"(^[\p{L}\p{N}_])");
    return re.ok() ? re->release() : nullptr;
  }();
  return word != nullptr && word->Search(ch);
}

}  // namespace

int32_t AddedVocabulary::Trie::Child(int32_t node, uint8_t byte) const {
  auto it = edges.find((static_cast<uint64_t>(node) << 8) | byte);
  return it == edges.end() ? -1 : it->second;
}

void AddedVocabulary::Trie::Insert(std::string_view s, int32_t token_index) {
  if (terminal.empty()) terminal.push_back(-1);  // root
  first_byte[static_cast<uint8_t>(s[0])] = true;
  int32_t node = 0;
  for (char c : s) {
    const uint64_t key = (static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(c);
    auto it = edges.find(key);
    if (it == edges.end()) {
      const int32_t child = static_cast<int32_t>(terminal.size());
      terminal.push_back(-1);
      edges.emplace(key, child);
      node = child;
    } else {
      node = it->second;
    }
  }
  terminal[node] = token_index;
}

Status AddedVocabulary::Add(AddedToken token) {
  if (token.content.empty()) {
    return absl::InvalidArgumentError(fmt::format("added token {} has empty content", token.id));
  }
  if (token.id < 0) {
    return absl::InvalidArgumentError(
        fmt::format("added token \"{}\" has negative id {}", token.content, token.id));
  }
  if (by_id_.contains(token.id)) {
    return absl::InvalidArgumentError(fmt::format("added token id {} appears twice", token.id));
  }
  if (by_content_.contains(token.content)) {
    return absl::InvalidArgumentError(
        fmt::format("added token \"{}\" appears twice", token.content));
  }
  const size_t index = tokens_.size();
  by_id_[token.id] = index;
  by_content_[token.content] = index;
  (token.normalized ? normalized_trie_ : raw_trie_)
      .Insert(token.content, static_cast<int32_t>(index));
  if (token.normalized) ++num_normalized_;
  tokens_.push_back(std::move(token));
  return absl::OkStatus();
}

const AddedToken* AddedVocabulary::FindById(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

std::optional<int32_t> AddedVocabulary::FindByContent(std::string_view content) const {
  auto it = by_content_.find(AbslView(content));
  if (it == by_content_.end()) return std::nullopt;
  return tokens_[it->second].id;
}

int32_t AddedVocabulary::LongestAt(const Trie& trie, std::string_view text, size_t pos,
                                   size_t* len) const {
  int32_t best = -1;
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    node = trie.Child(node, static_cast<uint8_t>(text[i]));
    if (node < 0) break;
    if (trie.terminal[node] >= 0) {
      best = trie.terminal[node];
      *len = i + 1 - pos;
    }
  }
  return best;
}

void AddedVocabulary::Split(std::string_view text, bool normalized,
                            std::vector<TextSplit>* out) const {
  const Trie& trie = normalized ? normalized_trie_ : raw_trie_;
  if (trie.terminal.empty()) {
    if (!text.empty()) out->push_back({text, -1});
    return;
  }
  size_t start_offset = 0;  // end of the last emitted piece
  size_t pos = 0;
  while (pos < text.size()) {
    if (!trie.first_byte[static_cast<uint8_t>(text[pos])]) {
      ++pos;
      continue;
    }
    size_t len = 0;
    const int32_t index = LongestAt(trie, text, pos, &len);
    if (index < 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = tokens_[index];
    size_t start = pos;
    size_t stop = pos + len;
    pos = stop;
    if (token.single_word) {
      const bool word_before =
          start > 0 && IsWordChar(text.substr(PrevCharStart(text, start),
                                              start - PrevCharStart(text, start)));
      const bool word_after =
          stop < text.size() && IsWordChar(text.substr(stop, DecodeUtf8(text, stop).length));
      if (word_before || word_after) continue;  // not a whole word: left as text
    }
    if (token.lstrip) {
      size_t new_start = start;
      while (new_start > 0) {
        const size_t prev = PrevCharStart(text, new_start);
        if (!IsUnicodeWhitespace(DecodeUtf8(text, prev).code_point)) break;
        new_start = prev;
      }
      start = std::max(new_start, start_offset);
    }
    if (token.rstrip) {
      while (stop < text.size()) {
        const Utf8Step step = DecodeUtf8(text, stop);
        if (!IsUnicodeWhitespace(step.code_point)) break;
        stop += step.length;
      }
      pos = stop;
    }
    if (start_offset < start) out->push_back({text.substr(start_offset, start - start_offset), -1});
    out->push_back({text.substr(start, stop - start), token.id});
    start_offset = stop;
  }
  if (start_offset < text.size()) out->push_back({text.substr(start_offset), -1});
}

}  // namespace slime::tokenizer
