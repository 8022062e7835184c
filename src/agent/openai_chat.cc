#include "slime/agent/openai_chat.h"

#include <optional>

#include "fmt/format.h"
#include "slime/http/util.h"

namespace slime::agent {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

bool Fail(ChatRequestError* error, std::string param, std::string message) {
  error->param = std::move(param);
  error->message = error->param.empty() ? std::move(message) : error->param + ": " + message;
  return false;
}

std::string_view TypeName(const ojson& v) { return v.type_name(); }

// content: string, null, or [{"type": "text", "text"}] (joined). null becomes "" (as OpenAI
// servers pass it to chat templates, many of which fail on None). Returns false on error.
bool NormalizeContent(ojson* message, const std::string& where, ChatRequestError* error) {
  auto it = message->find("content");
  if (it != message->end() && it->is_null()) *it = "";
  if (it == message->end() || it->is_string()) return true;
  if (!it->is_array()) {
    return Fail(error, where + ".content",
                fmt::format("must be a string, null or a list of text parts, not {}",
                            TypeName(*it)));
  }
  std::string joined;
  for (size_t j = 0; j < it->size(); ++j) {
    const ojson& part = (*it)[j];
    std::string pw = fmt::format("{}.content[{}]", where, j);
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
        !part["text"].is_string()) {
      return Fail(error, pw, "only {\"type\": \"text\", \"text\": string} parts are supported");
    }
    joined += part["text"].get<std::string>();
  }
  *it = joined;
  return true;
}

bool ValidateToolCalls(const ojson& message, const std::string& where, ChatRequestError* error) {
  auto it = message.find("tool_calls");
  if (it == message.end() || it->is_null()) return true;
  if (!it->is_array()) return Fail(error, where + ".tool_calls", "must be a list");
  for (size_t k = 0; k < it->size(); ++k) {
    const ojson& call = (*it)[k];
    std::string cw = fmt::format("{}.tool_calls[{}]", where, k);
    if (!call.is_object()) return Fail(error, cw, "must be an object");
    const ojson& fn = call.contains("function") ? call["function"] : call;
    if (!fn.is_object() || !fn.contains("name") || !fn["name"].is_string()) {
      return Fail(error, cw + ".function.name", "missing or not a string");
    }
    if (fn.contains("arguments") && !fn["arguments"].is_string() &&
        !fn["arguments"].is_object()) {
      return Fail(error, cw + ".function.arguments", "must be a JSON string or an object");
    }
  }
  return true;
}

bool ParseNumber(const json& body, const char* key, double lo, double hi, ChatRequestError* error,
                 std::optional<double>* out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return true;
  if (!it->is_number() || !(it->get<double>() >= lo && it->get<double>() <= hi)) {
    return Fail(error, key, fmt::format("must be a number in [{}, {}]", lo, hi));
  }
  *out = it->get<double>();
  return true;
}

// Reads one JSON value at the start of `s` (after whitespace); false when it is not an object.
bool ParseObject(std::string_view s, ojson* out) {
  *out = ojson::parse(s, nullptr, /*allow_exceptions=*/false);
  return !out->is_discarded() && out->is_object();
}

std::string Trim(std::string_view s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return "";
  size_t e = s.find_last_not_of(" \t\r\n");
  return std::string(s.substr(b, e - b + 1));
}

ojson ToolCall(std::string_view id_prefix, size_t k, const std::string& name, const ojson& args) {
  return ojson{{"id", fmt::format("{}_{}", id_prefix, k)},
               {"type", "function"},
               {"function",
                {{"name", name}, {"arguments", args.is_string() ? args.get<std::string>()
                                                                : args.dump()}}}};
}

}  // namespace

bool ParseChatRequest(std::string_view body_text, bool honor_sampling_params,
                      ChatRequest* request, ChatRequestError* error) {
  ojson body = ojson::parse(body_text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) return Fail(error, "", "the request body is not valid JSON");
  if (!body.is_object()) return Fail(error, "", "the request body must be a JSON object");
  auto model = body.find("model");
  if (model != body.end() && !model->is_null()) {
    if (!model->is_string()) return Fail(error, "model", "must be a string");
    request->model = model->get<std::string>();
  }
  auto messages = body.find("messages");
  if (messages == body.end()) return Fail(error, "messages", "missing (a list of chat messages)");
  if (!messages->is_array() || messages->empty()) {
    return Fail(error, "messages", "must be a non-empty list of chat messages");
  }
  request->messages = ojson::array();
  for (size_t i = 0; i < messages->size(); ++i) {
    ojson m = (*messages)[i];
    std::string where = fmt::format("messages[{}]", i);
    if (!m.is_object()) return Fail(error, where, "must be an object");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      return Fail(error, where + ".role", "missing or not a string");
    }
    std::string r = role->get<std::string>();
    if (r == "developer") m["role"] = r = "system";
    if (r != "system" && r != "user" && r != "assistant" && r != "tool") {
      return Fail(error, where + ".role",
                  fmt::format("\"{}\" is not one of system, developer, user, assistant, tool", r));
    }
    if (!NormalizeContent(&m, where, error)) return false;
    if (r == "assistant" && !ValidateToolCalls(m, where, error)) return false;
    request->messages.push_back(std::move(m));
  }
  auto tools = body.find("tools");
  if (tools != body.end() && !tools->is_null()) {
    if (!tools->is_array()) return Fail(error, "tools", "must be a list of tool definitions");
    for (size_t i = 0; i < tools->size(); ++i) {
      const ojson& t = (*tools)[i];
      if (!t.is_object() || !t.contains("function") || !t["function"].is_object() ||
          !t["function"].contains("name") || !t["function"]["name"].is_string()) {
        return Fail(error, fmt::format("tools[{}].function.name", i), "missing or not a string");
      }
    }
    if (!tools->empty()) request->tools = *tools;
  }
  auto tool_choice = body.find("tool_choice");
  if (tool_choice != body.end() && !tool_choice->is_null() && !tool_choice->is_string() &&
      !tool_choice->is_object()) {
    return Fail(error, "tool_choice", "must be a string or an object");
  }
  if (tool_choice != body.end() && tool_choice->is_string() && *tool_choice == "none") {
    request->tools = nullptr;  // the model is not offered the tools
  }
  auto n = body.find("n");
  if (n != body.end() && !n->is_null() && !(n->is_number_integer() && n->get<int64_t>() == 1)) {
    return Fail(error, "n", "only n = 1 is supported (one choice per call)");
  }
  auto stream = body.find("stream");
  if (stream != body.end() && !stream->is_null()) {
    if (!stream->is_boolean()) return Fail(error, "stream", "must be true or false");
    request->stream = stream->get<bool>();
  }
  auto stream_options = body.find("stream_options");
  if (stream_options != body.end() && stream_options->is_object()) {
    request->include_usage = stream_options->value("include_usage", false);
  }
  json& o = request->overrides;
  for (const char* key : {"max_completion_tokens", "max_tokens"}) {
    auto it = body.find(key);
    if (it == body.end() || it->is_null()) continue;
    if (!it->is_number_integer() || it->get<int64_t>() < 1) {
      return Fail(error, key, "must be a positive integer");
    }
    o["max_new_tokens"] = it->get<int64_t>();
    break;
  }
  auto stop = body.find("stop");
  if (stop != body.end() && !stop->is_null()) {
    json list = json::array();
    if (stop->is_string()) {
      list.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (const auto& s : *stop) {
        if (!s.is_string()) return Fail(error, "stop", "must be a string or a list of strings");
        list.push_back(s.get<std::string>());
      }
    } else {
      return Fail(error, "stop", "must be a string or a list of strings");
    }
    if (!list.empty()) o["stop"] = list;
  }
  json plain = json::parse(body.dump());
  std::optional<double> temperature, top_p, frequency, presence;
  if (!ParseNumber(plain, "temperature", 0, 2, error, &temperature) ||
      !ParseNumber(plain, "top_p", 0, 1, error, &top_p) ||
      !ParseNumber(plain, "frequency_penalty", -2, 2, error, &frequency) ||
      !ParseNumber(plain, "presence_penalty", -2, 2, error, &presence)) {
    return false;
  }
  auto seed = body.find("seed");
  if (seed != body.end() && !seed->is_null() && !seed->is_number_integer()) {
    return Fail(error, "seed", "must be an integer");
  }
  if (honor_sampling_params) {
    if (temperature) o["temperature"] = *temperature;
    if (top_p) o["top_p"] = *top_p;
    if (frequency) o["frequency_penalty"] = *frequency;
    if (presence) o["presence_penalty"] = *presence;
    if (seed != body.end() && seed->is_number_integer()) o["sampling_seed"] = seed->get<int64_t>();
  }
  return true;
}

ojson ReplyMessage(std::string_view text, ToolCallSyntax syntax, bool has_tools,
                   std::string_view id_prefix) {
  ojson message = {{"role", "assistant"}, {"content", std::string(text)}};
  if (!has_tools || syntax == ToolCallSyntax::kNone) return message;
  ojson calls = ojson::array();
  std::string content;
  if (syntax == ToolCallSyntax::kHermes) {
    constexpr std::string_view kOpen = "<tool_call>", kClose = "</tool_call>";
    size_t pos = 0;
    while (pos < text.size()) {
      size_t open = text.find(kOpen, pos);
      if (open == std::string_view::npos) break;
      size_t close = text.find(kClose, open + kOpen.size());
      if (close == std::string_view::npos) break;
      ojson call;
      std::string inner = Trim(text.substr(open + kOpen.size(), close - open - kOpen.size()));
      if (!ParseObject(inner, &call) || !call.contains("name") || !call["name"].is_string()) {
        break;  // a malformed call: the rest stays content
      }
      content += text.substr(pos, open - pos);
      calls.push_back(ToolCall(id_prefix, calls.size(), call["name"].get<std::string>(),
                               call.value("arguments", ojson::object())));
      pos = close + kClose.size();
    }
    content += text.substr(pos);
  } else {  // kLlamaJson
    ojson call;
    std::string trimmed = Trim(text);
    if (ParseObject(trimmed, &call) && call.contains("name") && call["name"].is_string() &&
        (call.contains("parameters") || call.contains("arguments"))) {
      calls.push_back(ToolCall(id_prefix, 0, call["name"].get<std::string>(),
                               call.contains("parameters") ? call["parameters"]
                                                           : call["arguments"]));
    } else {
      content = std::string(text);
    }
  }
  if (calls.empty()) return message;
  std::string trimmed = Trim(content);
  message["content"] = trimmed.empty() ? ojson(nullptr) : ojson(trimmed);
  message["tool_calls"] = std::move(calls);
  return message;
}

std::string OpenAiFinishReason(std::string_view engine_finish_reason, const ojson& reply) {
  if (engine_finish_reason == "length") return "length";
  if (reply.contains("tool_calls")) return "tool_calls";
  return "stop";
}

ojson CompletionBody(const CompletionInfo& info, const ojson& reply,
                     const std::string& finish_reason) {
  return ojson{{"id", info.id},
               {"object", "chat.completion"},
               {"created", info.created},
               {"model", info.model},
               {"choices", ojson::array({ojson{{"index", 0},
                                               {"message", reply},
                                               {"logprobs", nullptr},
                                               {"finish_reason", finish_reason}}})},
               {"usage",
                {{"prompt_tokens", info.prompt_tokens},
                 {"completion_tokens", info.completion_tokens},
                 {"total_tokens", info.prompt_tokens + info.completion_tokens}}}};
}

std::vector<std::string> CompletionEvents(const CompletionInfo& info, const ojson& reply,
                                          const std::string& finish_reason, bool include_usage) {
  auto chunk = [&](ojson delta, ojson finish) {
    return ojson{{"id", info.id},
                 {"object", "chat.completion.chunk"},
                 {"created", info.created},
                 {"model", info.model},
                 {"choices", ojson::array({ojson{{"index", 0},
                                                 {"delta", std::move(delta)},
                                                 {"logprobs", nullptr},
                                                 {"finish_reason", std::move(finish)}}})}};
  };
  std::vector<std::string> events;
  auto add = [&events](const ojson& c) {
    events.push_back("data: " + c.dump(-1, ' ', false, ojson::error_handler_t::replace) + "\n\n");
  };
  add(chunk({{"role", "assistant"}, {"content", ""}}, nullptr));
  if (reply["content"].is_string() && !reply["content"].get<std::string>().empty()) {
    add(chunk({{"content", reply["content"]}}, nullptr));
  }
  if (reply.contains("tool_calls")) {
    const ojson& calls = reply["tool_calls"];
    for (size_t k = 0; k < calls.size(); ++k) {
      ojson call = calls[k];
      call["index"] = k;
      add(chunk({{"tool_calls", ojson::array({call})}}, nullptr));
    }
  }
  add(chunk(ojson::object(), finish_reason));
  if (include_usage) {
    ojson usage = {{"id", info.id},
                   {"object", "chat.completion.chunk"},
                   {"created", info.created},
                   {"model", info.model},
                   {"choices", ojson::array()},
                   {"usage",
                    {{"prompt_tokens", info.prompt_tokens},
                     {"completion_tokens", info.completion_tokens},
                     {"total_tokens", info.prompt_tokens + info.completion_tokens}}}};
    add(usage);
  }
  events.emplace_back(http::kSseDone);
  return events;
}

json OpenAiError(std::string_view message, std::string_view type, std::string_view param,
                 std::string_view code) {
  return json{{"error",
               {{"message", std::string(message)},
                {"type", std::string(type)},
                {"param", param.empty() ? json(nullptr) : json(std::string(param))},
                {"code", code.empty() ? json(nullptr) : json(std::string(code))}}}};
}

}  // namespace slime::agent
