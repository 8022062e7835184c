#include "fuzz_util.h"

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "byte_tokenizer.h"

namespace slime::fuzz {

const tokenizer::Tokenizer& FuzzTokenizer() {
  static const std::unique_ptr<tokenizer::Tokenizer> tok = [] {
    slime::testing::ByteTokenizerOptions options;
    options.added_tokens = {{256, "<|end|>"}, {257, "<|im_end|>"}};
    const nlohmann::json config{
        {"eos_token", "<|end|>"},
        {"chat_template",
         "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
         "{% if message['content'] is string %}{{ message['content'] }}"
         "{% else %}{% for part in message['content'] %}{{ part['text'] }}{% endfor %}{% endif %}"
         "{% if message.tool_calls %}{% for call in message.tool_calls %}<tool_call>"
         "{{ call.function.name }} {{ call.function.arguments | tojson }}</tool_call>"
         "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
         "{% if tools %}{% for tool in tools %}{{ tool | tojson }}{% endfor %}{% endif %}"
         "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"}};
    auto made = tokenizer::Tokenizer::FromJsonText(slime::testing::ByteTokenizerJson(options),
                                                   config.dump(), "fuzz-tokenizer");
    if (!made.ok()) {
      std::fprintf(stderr, "fuzz tokenizer: %s\n", made.status().ToString().c_str());
      std::abort();
    }
    return std::move(made).value();
  }();
  return *tok;
}

}  // namespace slime::fuzz
