// Fuzz targets (issue 29): each takes arbitrary bytes, feeds them to one of slime's parsers of
// untrusted input and returns 0. The property is only that every input returns: error statuses
// are expected, crashes, hangs and exceptions escaping are bugs. Each fuzz_<target>.cc defines
// its function and, built with -DSLIME_FUZZ_LIBFUZZER (SLIME_FUZZ=ON, clang), the libFuzzer entry
// point LLVMFuzzerTestOneInput calling it; fuzz_replay_test links all of them (without the entry
// points) and replays tests/fuzz/corpus/<target>/ plus a bounded deterministic mutation loop.
// Threads: one caller at a time (the targets keep process-wide state: a tokenizer, a temp file).
#ifndef SLIME_TESTS_FUZZ_FUZZ_TARGETS_H_
#define SLIME_TESTS_FUZZ_FUZZ_TARGETS_H_

#include <cstddef>
#include <cstdint>

namespace slime::fuzz {

// Raw HTTP/1.1 request bytes → Beast parser (the server's limits) → slime::http::Request
// (path decoding, query parsing) → Router::Dispatch with /generate, /v1/completions and
// /v1/chat/completions handlers that parse the body as the engine server does.
int FuzzHttpRequest(const uint8_t* data, size_t size);
// A /generate body → ParseGenerateRequest (byte tokenizer, limits set).
int FuzzGenerateJson(const uint8_t* data, size_t size);
// A /v1/chat/completions (and /v1/completions) body → ParseChatCompletionRequest /
// ParseCompletionRequest (byte tokenizer with a small chat template).
int FuzzChatJson(const uint8_t* data, size_t size);
// YAML config text → LoadConfigFromString (inputs with a top-level `base:` are skipped: they
// would read files).
int FuzzConfig(const uint8_t* data, size_t size);
// A whole .safetensors file → SafetensorsFile::Open (through a temp file: Open maps a path).
int FuzzSafetensors(const uint8_t* data, size_t size);
// tokenizer.json text → Tokenizer::FromJsonText, then Encode/Decode of a fixed text.
int FuzzTokenizerJson(const uint8_t* data, size_t size);

}  // namespace slime::fuzz

#ifdef SLIME_FUZZ_LIBFUZZER
#define SLIME_FUZZ_ENTRY(fn)                                                  \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { \
    return ::slime::fuzz::fn(data, size);                                     \
  }
#else
#define SLIME_FUZZ_ENTRY(fn)
#endif

#endif  // SLIME_TESTS_FUZZ_FUZZ_TARGETS_H_
