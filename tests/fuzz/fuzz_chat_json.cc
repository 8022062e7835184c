// Fuzz target: an OpenAI chat / completions body → ParseChatCompletionRequest /
// ParseCompletionRequest (see fuzz_targets.h).
#include <string_view>

#include "fuzz_targets.h"
#include "fuzz_util.h"
#include "slime/engine/openai.h"

namespace slime::fuzz {

int FuzzChatJson(const uint8_t* data, size_t size) {
  // The engine server's body parsing (src/engine/server.cc ParseBody).
  StatusOr<nlohmann::json> body =
      engine::ParseJsonBody(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!body.ok()) return 0;
  static engine::UnknownFieldLog log;
  engine::OpenAiContext ctx;
  ctx.tok = &FuzzTokenizer();
  ctx.limits.context_length = 4096;
  ctx.limits.vocab_size = 258;
  ctx.log = &log;
  for (bool chat : {true, false}) {
    auto parsed = chat ? engine::ParseChatCompletionRequest(*body, ctx)
                       : engine::ParseCompletionRequest(*body, ctx);
    if (!parsed.ok()) (void)engine::OpenAiErrorJson(parsed.status()).dump();
  }
  return 0;
}

}  // namespace slime::fuzz

SLIME_FUZZ_ENTRY(FuzzChatJson)
