// Unicode helpers the tokenizer needs: UTF-8 decoding with the "maximal subpart" error rule,
// lossy repair, NFC normalization, the GPT-2 byte-level alphabet, and the two whitespace
// definitions (Rust's `char::is_whitespace` for added tokens, Python's `str.isspace` for chat
// templates).
//
// Thread-safety: every function is pure; the lazily built NFC and byte-level tables are
// immutable after first use (function-local statics). Ownership: results are returned by value.
// Invariants: functions taking "valid UTF-8" require it (check with IsValidUtf8 or repair with
// Utf8Lossy first); the others accept arbitrary bytes.
#ifndef SLIME_TOKENIZER_UNICODE_H_
#define SLIME_TOKENIZER_UNICODE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace slime::tokenizer {

inline constexpr char32_t kReplacementChar = 0xFFFD;

// One step of UTF-8 decoding at `pos` (< s.size()).
struct Utf8Step {
  char32_t code_point;  // kReplacementChar when !valid
  int length;           // bytes consumed: the whole character, or the maximal invalid subpart
  bool valid;
  // !valid only: the invalid subpart is a correct *prefix* of a character cut off by the end of
  // `s` (more bytes could complete it). Streaming decoders hold such tails back.
  bool truncated;
};
Utf8Step DecodeUtf8(std::string_view s, size_t pos);  // defined inline below (hot path)

// Appends the UTF-8 encoding of `cp` (must be a Unicode scalar value).
void AppendUtf8(char32_t cp, std::string* out);

bool IsValidUtf8(std::string_view s);

// Replaces each maximal invalid subpart with U+FFFD (the rule of Rust's String::from_utf8_lossy
// and of the Unicode standard's "best practice"); valid input is returned unchanged.
std::string Utf8Lossy(std::string_view bytes);

// Number of leading bytes of `bytes` that a streaming decoder may emit now: everything except a
// trailing truncated-but-so-far-valid character (at most 3 bytes).
size_t EmittableUtf8Prefix(std::string_view bytes);

// Unicode White_Space (Rust char::is_whitespace).
bool IsUnicodeWhitespace(char32_t cp);
// Python str.isspace for one character (White_Space plus U+001C..U+001F).
bool IsPythonWhitespace(char32_t cp);

// Python's str.strip() / lstrip() / rstrip() with no argument (Python whitespace). `s` must be
// valid UTF-8.
std::string_view PyStrip(std::string_view s);
std::string_view PyLStrip(std::string_view s);
std::string_view PyRStrip(std::string_view s);
// The same with an explicit set of ASCII characters, e.g. PyStripChars(s, "\n").
std::string_view PyStripChars(std::string_view s, std::string_view chars);
std::string_view PyLStripChars(std::string_view s, std::string_view chars);
std::string_view PyRStripChars(std::string_view s, std::string_view chars);

// Canonical combining class of `cp` (0 for starters).
int CanonicalCombiningClass(char32_t cp);

// Unicode Normalization Form C of valid UTF-8 `s`. Text that is already NFC (the common case:
// ASCII, CJK, emoji, precomposed Latin) is detected by a quick check and copied unchanged; only
// the segments around combining or decomposable characters are rewritten. Data: the Unicode
// version reported by NfcUnicodeVersion().
std::string NormalizeNfc(std::string_view s);
// True when NormalizeNfc(s) == s is certain from the quick check alone (no work needed).
bool IsNfcQuick(std::string_view s);
const char* NfcUnicodeVersion();

// The GPT-2 byte-level alphabet used by ByteLevel pre-tokenizers and decoders: every byte maps to
// one printable code point (printable Latin-1 bytes map to themselves, the other 68 to
// U+0100..U+0143).
char32_t ByteToUnicode(uint8_t byte);
// Inverse of ByteToUnicode; -1 for code points outside the alphabet.
int UnicodeToByte(char32_t cp);
// Maps every byte of `bytes` through ByteToUnicode (the token spelling of a byte string).
std::string BytesToByteLevel(std::string_view bytes);

// ---- Implementation details ----------------------------------------------------------------

inline Utf8Step DecodeUtf8(std::string_view s, size_t pos) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data()) + pos;
  const size_t avail = s.size() - pos;
  const uint8_t b0 = p[0];
  if (b0 < 0x80) return {b0, 1, true, false};
  int need;
  char32_t cp;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
    cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {kReplacementChar, 1, false, false};
  }
  for (int i = 1; i <= need; ++i) {
    if (static_cast<size_t>(i) >= avail) return {kReplacementChar, i, false, true};
    const uint8_t b = p[i];
    const uint8_t l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
    if (b < l || b > h) return {kReplacementChar, i, false, false};
    cp = (cp << 6) | (b & 0x3F);
  }
  return {cp, need + 1, true, false};
}

}  // namespace slime::tokenizer

#endif  // SLIME_TOKENIZER_UNICODE_H_
