// `slime_train render-chat --tokenizer DIR --messages FILE.json [--tools FILE.json]
// [--add-generation-prompt] [--kwargs JSON] [--ids]`: renders a conversation with the
// tokenizer's chat template (tokenizer::ChatTemplate, the Jinja interpreter) and prints the text
// exactly as Hugging Face apply_chat_template(..., tokenize=False) would return it (no newline
// added), or with --ids the token ids (add_special_tokens=False, as tokenize=True) as a JSON
// array. Useful to check a model's template before training on it.
//
// --messages: a JSON array of messages, or an object with "messages" (and optionally "tools").
// --tools: a JSON array of tool definitions. --kwargs: a JSON object of template variables,
// e.g. '{"enable_thinking": false}'.
// Exit codes: 0 done; 2 bad option, unreadable or malformed input, or the template failed
// (the message names the file, the field or the template line).
#ifndef SLIME_APP_RENDER_CHAT_H_
#define SLIME_APP_RENDER_CHAT_H_

#include <string>

namespace CLI {
class App;
}

namespace slime::app {

struct RenderChatOptions {
  std::string tokenizer_dir;
  std::string messages_file;
  std::string tools_file;
  std::string kwargs_json;
  bool add_generation_prompt = false;
  bool ids = false;
};

void AddRenderChatOptions(CLI::App* app, RenderChatOptions* options);
int RunRenderChat(const RenderChatOptions& options);

}  // namespace slime::app

#endif  // SLIME_APP_RENDER_CHAT_H_
