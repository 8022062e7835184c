// BpeModel: the "model" section of a Hugging Face `tokenizer.json` with "type": "BPE" — a
// vocabulary (token → id) and ranked merges — and the merge algorithm that turns one
// pre-tokenized word into ids.
//
// Supported fields: vocab, merges (both the "a b" string form and the ["a", "b"] pair form),
// ignore_merges, unk_token, fuse_unk, byte_fallback; dropout must be null or 0, and
// continuing_subword_prefix / end_of_word_suffix must be null or empty.
//
// Words: with `byte_level` (a ByteLevel pre-tokenizer is present) a word is raw bytes and each
// byte starts as the token of its byte-level character; otherwise a word is UTF-8 text and each
// character starts as its own token (unknown characters go to byte fallback, unk, or are dropped,
// as in Hugging Face). Merging repeatedly applies the lowest-ranked adjacent pair, leftmost first.
//
// Ownership: owns vocabulary and merges. Encode memoizes word → ids in a bounded cache that
// each thread keeps for itself (a few models per thread), so there is no lock on the hot path.
// Thread-safety: immutable after FromJson; Encode may run concurrently from any number of
// threads.
// Invariants: ids are unique; every merge's parts and result are in the vocabulary.
#ifndef SLIME_TOKENIZER_BPE_MODEL_H_
#define SLIME_TOKENIZER_BPE_MODEL_H_

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "slime/common/status.h"

namespace slime::tokenizer {

class BpeModel {
 public:
  // Largest accepted token id: bounds the per-id tables (real vocabularies are far smaller).
  static constexpr int32_t kMaxTokenId = (1 << 22) - 1;

  // `model` is the "model" object of tokenizer.json. Errors name the JSON path (e.g.
  // "model.merges[12]") and what is wrong.
  static StatusOr<std::unique_ptr<BpeModel>> FromJson(const nlohmann::json& model,
                                                      bool byte_level);

  // Appends the ids of one word. Empty words produce nothing.
  void Encode(std::string_view word, std::vector<int32_t>* ids) const;

  std::optional<int32_t> TokenToId(std::string_view token) const;
  // nullptr for ids outside the vocabulary.
  const std::string* IdToToken(int32_t id) const;

  // Number of vocabulary entries; ids are in [0, max_id()].
  size_t size() const { return vocab_.size(); }
  int32_t max_id() const { return static_cast<int32_t>(id_to_token_.size()) - 1; }
  size_t num_merges() const { return merges_.size(); }
  bool byte_level() const { return byte_level_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  using Ids = absl::InlinedVector<int32_t, 6>;
  static constexpr size_t kMaxCachedWordBytes = 256;

  BpeModel() = default;
  static uint64_t PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  // Initial symbols of `word` (before any merge), appended to `*symbols`.
  void InitialSymbols(std::string_view word, Ids* symbols) const;
  // Applies the merges to `*symbols` in place.
  void ApplyMerges(Ids* symbols) const;
  void EncodeUncached(std::string_view word, Ids* out) const;

  absl::flat_hash_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;  // "" for ids absent from the vocabulary
  std::vector<bool> id_present_;
  absl::flat_hash_map<uint64_t, Merge> merges_;
  std::array<int32_t, 256> byte_ids_{};  // byte-level: id of each byte's character, or -1
  bool byte_level_ = false;
  bool ignore_merges_ = false;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  std::optional<int32_t> unk_id_;
  std::array<int32_t, 256> fallback_ids_{};  // byte_fallback: id of "<0xHH>", or -1
  uint64_t cache_key_ = 0;  // unique per instance: names this model's per-thread word caches
};

}  // namespace slime::tokenizer

#endif  // SLIME_TOKENIZER_BPE_MODEL_H_
