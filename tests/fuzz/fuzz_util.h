// Helpers shared by the fuzz targets: the byte tokenizer they parse with. Test-only.
#ifndef SLIME_TESTS_FUZZ_FUZZ_UTIL_H_
#define SLIME_TESTS_FUZZ_FUZZ_UTIL_H_

#include "slime/tokenizer/tokenizer.h"

namespace slime::fuzz {

// Byte-level BPE tokenizer (tests/support/byte_tokenizer.h: ids 0..255 the bytes, no merges,
// 256 "<|end|>" special EOS, 257 "<|im_end|>" special) with a small ChatML chat template; built
// once per process, never null.
const tokenizer::Tokenizer& FuzzTokenizer();

}  // namespace slime::fuzz

#endif  // SLIME_TESTS_FUZZ_FUZZ_UTIL_H_
