// Fuzz target: a /generate body → ParseGenerateRequest (see fuzz_targets.h).
#include <string_view>

#include "fuzz_targets.h"
#include "fuzz_util.h"
#include "slime/engine/protocol.h"

namespace slime::fuzz {

int FuzzGenerateJson(const uint8_t* data, size_t size) {
  // The engine server's body parsing (src/engine/server.cc ParseBody).
  StatusOr<nlohmann::json> body =
      engine::ParseJsonBody(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!body.ok()) return 0;
  static engine::UnknownFieldLog log;
  engine::ProtocolLimits limits;
  limits.context_length = 4096;
  limits.vocab_size = 258;
  auto parsed = engine::ParseGenerateRequest(*body, &FuzzTokenizer(), limits, &log);
  if (!parsed.ok()) {
    // The error answer the server would send.
    (void)engine::HttpStatusFor(parsed.status());
    (void)engine::ErrorJson(parsed.status()).dump();
  }
  return 0;
}

}  // namespace slime::fuzz

SLIME_FUZZ_ENTRY(FuzzGenerateJson)
