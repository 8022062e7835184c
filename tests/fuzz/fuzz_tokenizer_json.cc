// Fuzz target: tokenizer.json text → Tokenizer::FromJsonText (see fuzz_targets.h).
#include <string_view>
#include <vector>

#include "fuzz_targets.h"
#include "slime/tokenizer/tokenizer.h"

namespace slime::fuzz {

int FuzzTokenizerJson(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto tok = tokenizer::Tokenizer::FromJsonText(text, "", "fuzz/tokenizer.json");
  if (!tok.ok()) return 0;
  // A loaded tokenizer must encode and decode whatever it was given.
  std::vector<int32_t> ids = (*tok)->Encode("Hello, world! héllo 你好 \xff <|end|> 123", true);
  (void)(*tok)->Decode(ids);
  std::vector<int32_t> odd = {0, 1, 2, -1, 1 << 30, 255, 256, 257};
  (void)(*tok)->Decode(odd);
  return 0;
}

}  // namespace slime::fuzz

SLIME_FUZZ_ENTRY(FuzzTokenizerJson)
