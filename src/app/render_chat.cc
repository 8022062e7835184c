// `slime_train render-chat` (see include/slime/app/render_chat.h).
#include "slime/app/render_chat.h"

#include <CLI/CLI.hpp>

#include <fstream>
#include <iostream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "slime/app/cli.h"
#include "slime/tokenizer/tokenizer.h"

namespace slime::app {
namespace {

using OJson = nlohmann::ordered_json;

int Fail(const std::string& message) {
  std::cerr << "slime_train render-chat: error: " << message << "\n";
  return kExitUsage;
}

StatusOr<OJson> ReadJsonFile(const std::string& path, const char* what) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(fmt::format("{} {}: cannot open the file", what, path));
  std::stringstream s;
  s << in.rdbuf();
  OJson j = OJson::parse(s.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError(fmt::format("{} {}: not valid JSON", what, path));
  }
  return j;
}

}  // namespace

void AddRenderChatOptions(CLI::App* app, RenderChatOptions* o) {
  app->add_option("--tokenizer", o->tokenizer_dir,
                  "Directory with tokenizer.json and tokenizer_config.json (its chat_template, or "
                  "chat_template.jinja)")
      ->required();
  app->add_option("--messages", o->messages_file,
                  "JSON file: an array of messages, or {\"messages\": [...], \"tools\": [...]}")
      ->required();
  app->add_option("--tools", o->tools_file, "JSON file: an array of tool definitions");
  app->add_flag("--add-generation-prompt", o->add_generation_prompt,
                "Append the header that starts the assistant's turn");
  app->add_option("--kwargs", o->kwargs_json,
                  "JSON object of extra template variables, e.g. '{\"enable_thinking\": false}'");
  app->add_flag("--ids", o->ids, "Print the token ids (a JSON array) instead of the text");
}

int RunRenderChat(const RenderChatOptions& o) {
  StatusOr<OJson> input = ReadJsonFile(o.messages_file, "--messages");
  if (!input.ok()) return Fail(std::string(input.status().message()));
  tokenizer::ChatTemplateOptions options;
  options.add_generation_prompt = o.add_generation_prompt;
  OJson messages = *input;
  if (input->is_object()) {
    if (!input->contains("messages")) {
      return Fail(fmt::format("--messages {}: an object needs a \"messages\" array", o.messages_file));
    }
    messages = (*input)["messages"];
    if (input->contains("tools")) options.tools = (*input)["tools"];
  }
  if (!messages.is_array()) {
    return Fail(fmt::format("--messages {}: expected an array of messages, got {}",
                            o.messages_file, messages.type_name()));
  }
  if (!o.tools_file.empty()) {
    StatusOr<OJson> tools = ReadJsonFile(o.tools_file, "--tools");
    if (!tools.ok()) return Fail(std::string(tools.status().message()));
    if (!tools->is_array()) {
      return Fail(fmt::format("--tools {}: expected an array of tool definitions, got {}",
                              o.tools_file, tools->type_name()));
    }
    options.tools = *tools;
  }
  if (!o.kwargs_json.empty()) {
    OJson kwargs = OJson::parse(o.kwargs_json, nullptr, /*allow_exceptions=*/false);
    if (kwargs.is_discarded() || !kwargs.is_object()) {
      return Fail(fmt::format("--kwargs: expected a JSON object like '{{\"enable_thinking\": "
                              "false}}', got '{}'", o.kwargs_json));
    }
    options.kwargs = std::move(kwargs);
  }
  auto tok = tokenizer::Tokenizer::FromDirectory(o.tokenizer_dir);
  if (!tok.ok()) return Fail(fmt::format("--tokenizer: {}", std::string(tok.status().message())));
  if (!(*tok)->chat_template().ok()) {
    return Fail(fmt::format("--tokenizer {}: no usable chat template: {}", o.tokenizer_dir,
                            std::string((*tok)->chat_template().status().message())));
  }
  StatusOr<std::string> text = (*tok)->ApplyChatTemplate(messages, options);
  if (!text.ok()) return Fail(std::string(text.status().message()));
  if (o.ids) {
    std::cout << OJson((*tok)->Encode(*text, /*add_special_tokens=*/false)).dump() << "\n";
  } else {
    std::cout << *text << std::flush;
  }
  return kExitOk;
}

}  // namespace slime::app
