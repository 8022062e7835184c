// BPE vocabulary, merges and the merge algorithm (see bpe_model.h).
#include "slime/tokenizer/bpe_model.h"

#include <algorithm>
#include <atomic>

#include <fmt/format.h>

#include "slime/tokenizer/unicode.h"

namespace slime::tokenizer {
namespace {

using Json = nlohmann::json;

Status Invalid(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(fmt::format("{}: {}", path, what));
}

absl::string_view AbslView(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// One candidate merge in the heap of ApplyMerges.
struct Candidate {
  int32_t rank;
  int32_t pos;       // left symbol
  int32_t left_id;   // ids when pushed, to detect stale entries
  int32_t right_id;
  int32_t new_id;
};
struct CandidateAfter {
  bool operator()(const Candidate& a, const Candidate& b) const {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  }
};

// Per-thread word caches, one slot per recently used model (least recently used slot evicted).
using CachedIds = absl::InlinedVector<int32_t, 6>;
constexpr int kCacheSlots = 4;
constexpr size_t kMaxCachedWords = 1 << 15;  // per slot; the slot is cleared when full

struct WordCache {
  uint64_t owner = 0;  // BpeModel::cache_key_, 0 = free
  uint64_t last_use = 0;
  absl::flat_hash_map<std::string, CachedIds> map;
};

WordCache& ThreadWordCache(uint64_t owner) {
  thread_local std::array<WordCache, kCacheSlots> slots;
  thread_local uint64_t tick = 0;
  ++tick;
  WordCache* victim = &slots[0];
  for (WordCache& slot : slots) {
    if (slot.owner == owner) {
      slot.last_use = tick;
      return slot;
    }
    if (slot.last_use < victim->last_use) victim = &slot;
  }
  victim->map.clear();
  victim->owner = owner;
  victim->last_use = tick;
  return *victim;
}

std::atomic<uint64_t> next_cache_key{1};

}  // namespace

StatusOr<std::unique_ptr<BpeModel>> BpeModel::FromJson(const Json& model, bool byte_level) {
  if (!model.is_object()) return Invalid("model", "expected an object");
  auto type = model.find("type");
  if (type != model.end() && !(type->is_string() && type->get<std::string>() == "BPE")) {
    return Invalid("model.type", fmt::format("unsupported model type {} (supported: BPE)",
                                             type->dump()));
  }
  auto bpe = std::unique_ptr<BpeModel>(new BpeModel());
  bpe->byte_level_ = byte_level;
  bpe->cache_key_ = next_cache_key.fetch_add(1);

  // Options.
  if (auto it = model.find("dropout"); it != model.end() && !it->is_null()) {
    if (!it->is_number() || it->get<double>() != 0.0) {
      return Invalid("model.dropout", "BPE dropout is not supported (must be null or 0)");
    }
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto it = model.find(key);
    if (it != model.end() && !it->is_null() &&
        !(it->is_string() && it->get<std::string>().empty())) {
      return Invalid(fmt::format("model.{}", key), "only null or \"\" is supported");
    }
  }
  auto flag = [&model](const char* key) {
    auto it = model.find(key);
    return it != model.end() && it->is_boolean() && it->get<bool>();
  };
  bpe->ignore_merges_ = flag("ignore_merges");
  bpe->byte_fallback_ = flag("byte_fallback");
  bpe->fuse_unk_ = flag("fuse_unk");

  // Vocabulary.
  auto vocab = model.find("vocab");
  if (vocab == model.end() || !vocab->is_object()) {
    return Invalid("model.vocab", "missing or not an object of token → id");
  }
  bpe->vocab_.reserve(vocab->size());
  int64_t max_id = -1;
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() > BpeModel::kMaxTokenId) {
      return Invalid("model.vocab",
                     fmt::format("token {} has invalid id {} (ids are integers in [0, {}])",
                                 Json(it.key()).dump(), it.value().dump(), kMaxTokenId));
    }
    max_id = std::max(max_id, it.value().get<int64_t>());
    bpe->vocab_.emplace(it.key(), static_cast<int32_t>(it.value().get<int64_t>()));
  }
  bpe->id_to_token_.assign(static_cast<size_t>(max_id + 1), std::string());
  bpe->id_present_.assign(static_cast<size_t>(max_id + 1), false);
  for (const auto& [token, id] : bpe->vocab_) {
    if (bpe->id_present_[id]) {
      return Invalid("model.vocab", fmt::format("id {} is used by two tokens, {} and {}", id,
                                                Json(bpe->id_to_token_[id]).dump(),
                                                Json(token).dump()));
    }
    bpe->id_present_[id] = true;
    bpe->id_to_token_[id] = token;
  }

  // Merges.
  auto merges = model.find("merges");
  if (merges == model.end() || !merges->is_array()) {
    return Invalid("model.merges", "missing or not an array");
  }
  bpe->merges_.reserve(merges->size());
  for (size_t i = 0; i < merges->size(); ++i) {
    const Json& m = (*merges)[i];
    std::string left, right;
    if (m.is_string()) {
      const std::string& s = m.get_ref<const std::string&>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        return Invalid(fmt::format("model.merges[{}]", i),
                       fmt::format("{} is not of the form \"left right\"", m.dump()));
      }
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      return Invalid(fmt::format("model.merges[{}]", i),
                     fmt::format("{} is neither \"left right\" nor [\"left\", \"right\"]",
                                 m.dump()));
    }
    std::optional<int32_t> a = bpe->TokenToId(left), b = bpe->TokenToId(right),
                           c = bpe->TokenToId(left + right);
    if (!a || !b || !c) {
      const std::string& missing = !a ? left : !b ? right : left + right;
      return Invalid(fmt::format("model.merges[{}]", i),
                     fmt::format("merge {} uses {}, which is not in the vocabulary", m.dump(),
                                 Json(missing).dump()));
    }
    bpe->merges_[PairKey(*a, *b)] = Merge{static_cast<int32_t>(i), *c};
  }

  // Unknown-token handling and the per-byte initial symbols.
  if (auto it = model.find("unk_token"); it != model.end() && !it->is_null()) {
    if (!it->is_string()) return Invalid("model.unk_token", "expected a string or null");
    bpe->unk_id_ = bpe->TokenToId(it->get<std::string>());
    if (!bpe->unk_id_) {
      return Invalid("model.unk_token",
                     fmt::format("{} is not in the vocabulary", it->dump()));
    }
  }
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    AppendUtf8(ByteToUnicode(static_cast<uint8_t>(b)), &ch);
    bpe->byte_ids_[b] = bpe->TokenToId(ch).value_or(-1);
    bpe->fallback_ids_[b] = bpe->TokenToId(fmt::format("<0x{:02X}>", b)).value_or(-1);
  }
  return bpe;
}

std::optional<int32_t> BpeModel::TokenToId(std::string_view token) const {
  auto it = vocab_.find(AbslView(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::IdToToken(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || !id_present_[id]) {
    return nullptr;
  }
  return &id_to_token_[id];
}

void BpeModel::InitialSymbols(std::string_view word, Ids* symbols) const {
  // Pending unknown run: (id, fused) — emitted before the next known symbol.
  bool pending_unk = false;
  auto flush_unk = [&] {
    if (pending_unk) symbols->push_back(*unk_id_);
    pending_unk = false;
  };
  auto unknown = [&](std::string_view bytes) {
    if (byte_fallback_) {
      bool all = true;
      for (char c : bytes) all = all && fallback_ids_[static_cast<uint8_t>(c)] >= 0;
      if (all) {
        flush_unk();
        for (char c : bytes) symbols->push_back(fallback_ids_[static_cast<uint8_t>(c)]);
        return;
      }
    }
    if (!unk_id_) return;  // no unk token: the character is dropped, as in Hugging Face
    if (!(pending_unk && fuse_unk_)) flush_unk();
    pending_unk = true;
  };
  if (byte_level_) {
    for (char c : word) {
      const int32_t id = byte_ids_[static_cast<uint8_t>(c)];
      if (id >= 0) {
        flush_unk();
        symbols->push_back(id);
      } else {
        std::string ch;
        AppendUtf8(ByteToUnicode(static_cast<uint8_t>(c)), &ch);
        unknown(ch);
      }
    }
  } else {
    for (size_t pos = 0; pos < word.size();) {
      const int len = DecodeUtf8(word, pos).length;
      std::string_view ch = word.substr(pos, len);
      pos += len;
      if (std::optional<int32_t> id = TokenToId(ch)) {
        flush_unk();
        symbols->push_back(*id);
      } else {
        unknown(ch);
      }
    }
  }
  flush_unk();
}

void BpeModel::ApplyMerges(Ids* symbols) const {
  const int n = static_cast<int>(symbols->size());
  if (n < 2) return;
  thread_local std::vector<int32_t> next, prev;
  thread_local std::vector<Candidate> heap;
  next.resize(n);
  prev.resize(n);
  heap.clear();
  int32_t* sym = symbols->data();
  for (int i = 0; i < n; ++i) {
    next[i] = i + 1 < n ? i + 1 : -1;
    prev[i] = i - 1;
  }
  auto push = [&](int32_t pos) {
    if (pos < 0) return;  // (before reading next[pos]: a merge at position 0 pushes prev = -1)
    const int32_t right = next[pos];
    if (right < 0) return;
    auto it = merges_.find(PairKey(sym[pos], sym[right]));
    if (it == merges_.end()) return;
    heap.push_back({it->second.rank, pos, sym[pos], sym[right], it->second.new_id});
    std::push_heap(heap.begin(), heap.end(), CandidateAfter());
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), CandidateAfter());
    const Candidate c = heap.back();
    heap.pop_back();
    const int32_t right = next[c.pos];
    if (sym[c.pos] != c.left_id || right < 0 || sym[right] != c.right_id) continue;  // stale
    sym[c.pos] = c.new_id;
    sym[right] = -1;
    next[c.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = c.pos;
    push(prev[c.pos]);
    push(c.pos);
  }
  int out = 0;
  for (int i = 0; i >= 0; i = next[i]) sym[out++] = sym[i];
  symbols->resize(out);
}

void BpeModel::EncodeUncached(std::string_view word, Ids* out) const {
  if (ignore_merges_) {
    std::optional<int32_t> whole =
        byte_level_ ? TokenToId(BytesToByteLevel(word)) : TokenToId(word);
    if (whole) {
      out->push_back(*whole);
      return;
    }
  }
  InitialSymbols(word, out);
  ApplyMerges(out);
}

void BpeModel::Encode(std::string_view word, std::vector<int32_t>* ids) const {
  if (word.empty()) return;
  if (word.size() > kMaxCachedWordBytes) {
    Ids tmp;
    EncodeUncached(word, &tmp);
    ids->insert(ids->end(), tmp.begin(), tmp.end());
    return;
  }
  WordCache& cache = ThreadWordCache(cache_key_);
  auto it = cache.map.find(AbslView(word));
  if (it != cache.map.end()) {
    ids->insert(ids->end(), it->second.begin(), it->second.end());
    return;
  }
  Ids tmp;
  EncodeUncached(word, &tmp);
  ids->insert(ids->end(), tmp.begin(), tmp.end());
  if (cache.map.size() >= kMaxCachedWords) cache.map.clear();
  cache.map.emplace(std::string(word), std::move(tmp));
}

}  // namespace slime::tokenizer
