#include "fuzz_util.h"

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "slime/tokenizer/unicode.h"

namespace slime::fuzz {

const tokenizer::Tokenizer& FuzzTokenizer() {
  static const std::unique_ptr<tokenizer::Tokenizer> tok = [] {
    using Json = nlohmann::json;
    Json vocab = Json::object();
    for (int b = 0; b < 256; ++b) {
      std::string s;
      tokenizer::AppendUtf8(tokenizer::ByteToUnicode(static_cast<uint8_t>(b)), &s);
      vocab[s] = b;
    }
    auto added = [](int id, const char* content) {
      return Json{{"id", id},        {"content", content},  {"single_word", false},
                  {"lstrip", false}, {"rstrip", false},     {"normalized", false},
                  {"special", true}};
    };
    const Json byte_level{{"type", "ByteLevel"},
                          {"add_prefix_space", false},
                          {"trim_offsets", false},
                          {"use_regex", true}};
    Json j;
    j["version"] = "1.0";
    j["truncation"] = nullptr;
    j["padding"] = nullptr;
    j["added_tokens"] = Json::array({added(256, "<|end|>"), added(257, "<|im_end|>")});
    j["normalizer"] = nullptr;
    j["pre_tokenizer"] = byte_level;
    j["post_processor"] = nullptr;
    j["decoder"] = byte_level;
    j["model"] = Json{{"type", "BPE"},
                      {"dropout", nullptr},
                      {"unk_token", nullptr},
                      {"continuing_subword_prefix", ""},
                      {"end_of_word_suffix", ""},
                      {"fuse_unk", false},
                      {"byte_fallback", false},
                      {"ignore_merges", false},
                      {"vocab", vocab},
                      {"merges", Json::array()}};
    const Json config{
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
    auto made = tokenizer::Tokenizer::FromJsonText(j.dump(), config.dump(), "fuzz-tokenizer");
    if (!made.ok()) {
      std::fprintf(stderr, "fuzz tokenizer: %s\n", made.status().ToString().c_str());
      std::abort();
    }
    return std::move(made).value();
  }();
  return *tok;
}

}  // namespace slime::fuzz
