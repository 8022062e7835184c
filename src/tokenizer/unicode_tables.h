// Generated Unicode data for NFC normalization (definitions in unicode_tables.cc, produced by
// gen_unicode_tables.py). Private to the tokenizer module; read through unicode.h.
// Thread-safety: constant data. Invariants: both tables sorted by code point, no overlaps.
#ifndef SLIME_SRC_TOKENIZER_UNICODE_TABLES_H_
#define SLIME_SRC_TOKENIZER_UNICODE_TABLES_H_

#include <cstdint>

namespace slime::tokenizer::unicode_data {

struct CccRange {
  uint32_t first;
  uint32_t last;
  uint8_t ccc;  // canonical combining class, never 0 in the table
};

struct Decomposition {
  uint32_t code_point;
  uint32_t first;
  uint32_t second;  // 0 for a singleton decomposition
  uint8_t composes;  // 1: `first second` recomposes to `code_point` under NFC
};

extern const char kUnicodeVersion[];
extern const CccRange kCccRanges[];
extern const int kNumCccRanges;
extern const Decomposition kDecompositions[];
extern const int kNumDecompositions;

}  // namespace slime::tokenizer::unicode_data

#endif  // SLIME_SRC_TOKENIZER_UNICODE_TABLES_H_
