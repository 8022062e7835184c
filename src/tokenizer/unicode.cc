// Unicode helpers: UTF-8, NFC, byte-level alphabet, whitespace (see unicode.h).
#include "slime/tokenizer/unicode.h"

#include <algorithm>
#include <array>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "unicode_tables.h"

namespace slime::tokenizer {
namespace {

namespace ud = unicode_data;

// Hangul syllable composition constants (Unicode §3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr int kLCount = 19, kVCount = 21, kTCount = 28;
constexpr int kNCount = kVCount * kTCount;  // 588
constexpr int kSCount = kLCount * kNCount;  // 11172

bool IsContinuation(uint8_t b) { return (b & 0xC0) == 0x80; }

// Decoding tables and quick-check bits, built once.
class NfcData {
 public:
  static const NfcData& Get() {
    static const NfcData* data = new NfcData();
    return *data;
  }

  // Quick check: NFC_QC=Yes and ccc=0, i.e. the character never changes and never combines
  // with what precedes it.
  bool IsSafe(char32_t cp) const {
    if (cp < 0x300) return true;
    return !((unsafe_[cp >> 6] >> (cp & 63)) & 1);
  }

  const ud::Decomposition* FindDecomposition(char32_t cp) const {
    const ud::Decomposition* begin = ud::kDecompositions;
    const ud::Decomposition* end = begin + ud::kNumDecompositions;
    const ud::Decomposition* it = std::lower_bound(
        begin, end, cp, [](const ud::Decomposition& d, char32_t c) { return d.code_point < c; });
    return (it != end && it->code_point == cp) ? it : nullptr;
  }

  // Primary composite of (a, b), or 0.
  char32_t Compose(char32_t a, char32_t b) const {
    if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
      return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
    }
    if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
        b < kTBase + kTCount) {
      return a + (b - kTBase);
    }
    auto it = compose_.find((static_cast<uint64_t>(a) << 21) | b);
    return it == compose_.end() ? 0 : it->second;
  }

 private:
  NfcData() : unsafe_(0x110000 / 64, 0) {
    auto mark = [this](char32_t cp) { unsafe_[cp >> 6] |= uint64_t{1} << (cp & 63); };
    for (int i = 0; i < ud::kNumCccRanges; ++i) {
      for (uint32_t cp = ud::kCccRanges[i].first; cp <= ud::kCccRanges[i].last; ++cp) mark(cp);
    }
    for (int i = 0; i < ud::kNumDecompositions; ++i) {
      const ud::Decomposition& d = ud::kDecompositions[i];
      if (d.composes) {
        compose_[(static_cast<uint64_t>(d.first) << 21) | d.second] = d.code_point;
        mark(d.second);  // may combine with the preceding character
      } else {
        mark(d.code_point);  // NFC maps it to something else
      }
    }
    for (char32_t cp = kVBase; cp < kVBase + kVCount; ++cp) mark(cp);
    for (char32_t cp = kTBase + 1; cp < kTBase + kTCount; ++cp) mark(cp);
  }

  std::vector<uint64_t> unsafe_;  // bit per code point: not safe for the quick check
  absl::flat_hash_map<uint64_t, char32_t> compose_;
};

void DecomposeInto(const NfcData& data, char32_t cp, std::vector<char32_t>* out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const int s = static_cast<int>(cp - kSBase);
    out->push_back(kLBase + s / kNCount);
    out->push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out->push_back(kTBase + s % kTCount);
    return;
  }
  const ud::Decomposition* d = data.FindDecomposition(cp);
  if (d == nullptr) {
    out->push_back(cp);
    return;
  }
  DecomposeInto(data, d->first, out);
  if (d->second != 0) DecomposeInto(data, d->second, out);
}

// Full NFC of one valid UTF-8 segment: canonical decomposition, canonical ordering, composition.
void NfcSegment(const NfcData& data, std::string_view seg, std::string* out) {
  std::vector<char32_t> cps;
  cps.reserve(seg.size() + 4);
  for (size_t pos = 0; pos < seg.size();) {
    Utf8Step step = DecodeUtf8(seg, pos);
    DecomposeInto(data, step.code_point, &cps);
    pos += step.length;
  }
  // Canonical ordering: stable sort of every run of non-starters by combining class.
  for (size_t i = 0; i < cps.size();) {
    if (CanonicalCombiningClass(cps[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < cps.size() && CanonicalCombiningClass(cps[j]) != 0) ++j;
    std::stable_sort(cps.begin() + i, cps.begin() + j, [](char32_t a, char32_t b) {
      return CanonicalCombiningClass(a) < CanonicalCombiningClass(b);
    });
    i = j;
  }
  // Canonical composition.
  std::vector<char32_t> result;
  result.reserve(cps.size());
  int starter = -1;
  int last_ccc = 0;
  for (char32_t c : cps) {
    const int ccc = CanonicalCombiningClass(c);
    if (starter >= 0) {
      const bool adjacent = result.size() == static_cast<size_t>(starter) + 1;
      if (adjacent || (last_ccc != 0 && last_ccc < ccc)) {
        const char32_t composite = data.Compose(result[starter], c);
        if (composite != 0) {
          result[starter] = composite;
          continue;
        }
      }
    }
    if (ccc == 0) starter = static_cast<int>(result.size());
    last_ccc = ccc;
    result.push_back(c);
  }
  for (char32_t c : result) AppendUtf8(c, out);
}

struct ByteLevelTables {
  std::array<char32_t, 256> byte_to_cp;
  std::array<int16_t, 0x144> cp_to_byte;  // all alphabet code points are < 0x144
  ByteLevelTables() {
    cp_to_byte.fill(-1);
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      byte_to_cp[b] = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + next++);
      cp_to_byte[byte_to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteLevelTables& ByteLevel() {
  static const ByteLevelTables* tables = new ByteLevelTables();
  return *tables;
}

template <typename Pred>
std::string_view LStripIf(std::string_view s, Pred pred) {
  size_t pos = 0;
  while (pos < s.size()) {
    Utf8Step step = DecodeUtf8(s, pos);
    if (!pred(step.code_point)) break;
    pos += step.length;
  }
  return s.substr(pos);
}

template <typename Pred>
std::string_view RStripIf(std::string_view s, Pred pred) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && IsContinuation(static_cast<uint8_t>(s[start]))) --start;
    Utf8Step step = DecodeUtf8(s.substr(0, end), start);
    if (!pred(step.code_point)) break;
    end = start;
  }
  return s.substr(0, end);
}

}  // namespace

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool IsValidUtf8(std::string_view s) {
  for (size_t pos = 0; pos < s.size();) {
    if (static_cast<uint8_t>(s[pos]) < 0x80) {
      ++pos;
      continue;
    }
    Utf8Step step = DecodeUtf8(s, pos);
    if (!step.valid) return false;
    pos += step.length;
  }
  return true;
}

std::string Utf8Lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t run = 0;  // start of the pending valid run
  for (size_t pos = 0; pos < bytes.size();) {
    if (static_cast<uint8_t>(bytes[pos]) < 0x80) {
      ++pos;
      continue;
    }
    Utf8Step step = DecodeUtf8(bytes, pos);
    if (step.valid) {
      pos += step.length;
      continue;
    }
    out.append(bytes.substr(run, pos - run));
    AppendUtf8(kReplacementChar, &out);
    pos += step.length;
    run = pos;
  }
  out.append(bytes.substr(run));
  return out;
}

size_t EmittableUtf8Prefix(std::string_view bytes) {
  // Only the last 3 bytes can start a truncated character.
  const size_t from = bytes.size() > 3 ? bytes.size() - 3 : 0;
  for (size_t pos = from; pos < bytes.size(); ++pos) {
    const uint8_t b = static_cast<uint8_t>(bytes[pos]);
    if (IsContinuation(b)) continue;
    Utf8Step step = DecodeUtf8(bytes, pos);
    if (!step.valid && step.truncated) return pos;
  }
  return bytes.size();
}

bool IsUnicodeWhitespace(char32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  if (cp < 0x85) return false;
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

bool IsPythonWhitespace(char32_t cp) {
  return (cp >= 0x1C && cp <= 0x1F) || IsUnicodeWhitespace(cp);
}

std::string_view PyStrip(std::string_view s) { return PyRStrip(PyLStrip(s)); }
std::string_view PyLStrip(std::string_view s) { return LStripIf(s, IsPythonWhitespace); }
std::string_view PyRStrip(std::string_view s) { return RStripIf(s, IsPythonWhitespace); }

std::string_view PyStripChars(std::string_view s, std::string_view chars) {
  return PyRStripChars(PyLStripChars(s, chars), chars);
}
std::string_view PyLStripChars(std::string_view s, std::string_view chars) {
  const size_t pos = s.find_first_not_of(chars);
  return pos == std::string_view::npos ? s.substr(s.size()) : s.substr(pos);
}
std::string_view PyRStripChars(std::string_view s, std::string_view chars) {
  const size_t pos = s.find_last_not_of(chars);
  return pos == std::string_view::npos ? s.substr(0, 0) : s.substr(0, pos + 1);
}

int CanonicalCombiningClass(char32_t cp) {
  if (cp < 0x300) return 0;
  const ud::CccRange* begin = ud::kCccRanges;
  const ud::CccRange* end = begin + ud::kNumCccRanges;
  const ud::CccRange* it = std::upper_bound(
      begin, end, cp, [](char32_t c, const ud::CccRange& r) { return c < r.first; });
  if (it == begin) return 0;
  --it;
  return cp <= it->last ? it->ccc : 0;
}

bool IsNfcQuick(std::string_view s) {
  const NfcData& data = NfcData::Get();
  for (size_t pos = 0; pos < s.size();) {
    if (static_cast<uint8_t>(s[pos]) < 0x80) {
      ++pos;
      continue;
    }
    Utf8Step step = DecodeUtf8(s, pos);
    if (!data.IsSafe(step.code_point)) return false;
    pos += step.length;
  }
  return true;
}

std::string NormalizeNfc(std::string_view s) {
  const NfcData& data = NfcData::Get();
  std::string out;
  size_t emitted = 0;     // bytes of `s` already written to `out`
  size_t last_safe = 0;   // start of the last safe character (a segment may begin there)
  for (size_t pos = 0; pos < s.size();) {
    if (static_cast<uint8_t>(s[pos]) < 0x80) {
      last_safe = pos++;
      continue;
    }
    Utf8Step step = DecodeUtf8(s, pos);
    if (data.IsSafe(step.code_point)) {
      last_safe = pos;
      pos += step.length;
      continue;
    }
    // An unsafe character: rewrite from the last safe starter up to the next safe character.
    const size_t seg_start = std::max(last_safe, emitted);
    size_t seg_end = pos + step.length;
    while (seg_end < s.size()) {
      Utf8Step next = DecodeUtf8(s, seg_end);
      if (data.IsSafe(next.code_point)) break;
      seg_end += next.length;
    }
    if (out.empty()) out.reserve(s.size() + 8);
    out.append(s.substr(emitted, seg_start - emitted));
    NfcSegment(data, s.substr(seg_start, seg_end - seg_start), &out);
    emitted = seg_end;
    last_safe = seg_end;
    pos = seg_end;
  }
  if (emitted == 0) return std::string(s);
  out.append(s.substr(emitted));
  return out;
}

const char* NfcUnicodeVersion() { return ud::kUnicodeVersion; }

char32_t ByteToUnicode(uint8_t byte) { return ByteLevel().byte_to_cp[byte]; }

int UnicodeToByte(char32_t cp) {
  return cp < ByteLevel().cp_to_byte.size() ? ByteLevel().cp_to_byte[cp] : -1;
}

std::string BytesToByteLevel(std::string_view bytes) {
  const ByteLevelTables& t = ByteLevel();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) AppendUtf8(t.byte_to_cp[static_cast<uint8_t>(c)], &out);
  return out;
}

}  // namespace slime::tokenizer
