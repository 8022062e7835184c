// Test helper: the byte-level BPE tokenizer.json that the fuzz targets, the engine protocol tests
// and the SFT dataset tests build in memory, so that every byte is one token and expected ids can
// be written out by hand. Each caller picks its merges, added tokens and pre-tokenizer, and writes
// its own tokenizer_config.json (eos/bos, chat template). Torch-free (the SLIME_FUZZ clang build
// links it); a pure function, safe from any thread.
#ifndef SLIME_TESTS_SUPPORT_BYTE_TOKENIZER_H_
#define SLIME_TESTS_SUPPORT_BYTE_TOKENIZER_H_

#include <cstdint>
#include <string>
#include <vector>

namespace slime::testing {

// What a ByteTokenizerJson holds beyond the 256 bytes.
struct ByteTokenizerOptions {
  // How text is cut into words before BPE (the decoder is ByteLevel either way).
  enum class PreTokenizer {
    kByteLevel,       // ByteLevel with its own GPT-2 regex (use_regex: true)
    kSplitThenBytes,  // Split by the Qwen2 / Llama-3 regex (Isolated), then ByteLevel, no regex
  };
  struct AddedToken {
    int32_t id;
    std::string content;
    bool special = true;  // false: added but not special (as Qwen3's <think>)
  };

  PreTokenizer pre_tokenizer = PreTokenizer::kByteLevel;
  // Merges of two bytes each, in rank order: merges[i] is token 256 + i (e.g. {"\n\n"}).
  std::vector<std::string> merges;
  // Added tokens with their ids, which follow the merges: 256 + merges.size(), ...
  std::vector<AddedToken> added_tokens;
};

// A byte-level BPE tokenizer.json: ids 0..255 are the bytes (in GPT-2's byte-to-unicode
// spelling), then one token per two-byte merge of `options.merges`, then `options.added_tokens`;
// no normalizer, no post-processor, no unk token, no byte fallback. With default options: the
// 256 bytes alone, no merges, no added tokens. Aborts with a message on a merge that is not two
// bytes (a broken test, not a case to handle).
std::string ByteTokenizerJson(const ByteTokenizerOptions& options = {});

}  // namespace slime::testing

#endif  // SLIME_TESTS_SUPPORT_BYTE_TOKENIZER_H_
