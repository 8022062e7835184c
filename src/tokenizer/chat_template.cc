// Native chat-template renderers (see chat_template.h).
//
// Each Apply* function follows its family's Jinja template statement by statement; comments
// quote the template's conditions where the logic is not obvious.
#include "slime/tokenizer/chat_template.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <ctime>
#include <limits>
#include <optional>

#include <fmt/format.h>

#include "slime/tokenizer/unicode.h"

namespace slime::tokenizer {
namespace {

using OJson = nlohmann::ordered_json;

constexpr std::string_view kFamilyNames[] = {"qwen2",  "qwen2.5",  "qwen3",
                                             "llama3", "llama3.1", "llama3.2"};

Status Invalid(const std::string& what) { return absl::InvalidArgumentError(what); }

bool Contains(std::string_view s, std::string_view part) {
  return s.find(part) != std::string_view::npos;
}

// ---- Python json.dumps -----------------------------------------------------------------------

void AppendPyString(std::string_view s, std::string* out) {
  out->push_back('"');
  for (char c : s) {
    switch (c) {
      case '"': out->append("\\\""); break;
      case '\\': out->append("\\\\"); break;
      case '\n': out->append("\\n"); break;
      case '\r': out->append("\\r"); break;
      case '\t': out->append("\\t"); break;
      case '\b': out->append("\\b"); break;
      case '\f': out->append("\\f"); break;
      default:
        if (static_cast<uint8_t>(c) < 0x20) {
          out->append(fmt::format("\\u{:04x}", static_cast<int>(c)));
        } else {
          out->push_back(c);
        }
    }
  }
  out->push_back('"');
}

// Python's repr(float): shortest round-trip digits; positional notation when the decimal
// exponent is in [-4, 16), scientific ("1e+16", "1.5e-05") otherwise.
std::string PyFloatRepr(double v) {
  if (v != v) return "NaN";
  if (v == std::numeric_limits<double>::infinity()) return "Infinity";
  if (v == -std::numeric_limits<double>::infinity()) return "-Infinity";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  std::string sci(buf, res.ptr);  // e.g. "-1.2345e+02"
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exp = std::stoi(sci.substr(e + 1));
  if (exp >= -4 && exp < 16) {
    std::string out;
    if (exp < 0) {
      out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    } else if (static_cast<size_t>(exp) + 1 >= digits.size()) {
      out = digits + std::string(exp + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
    }
    return sign + out;
  }
  std::string mantissa = digits.substr(0, 1);
  if (digits.size() > 1) mantissa += "." + digits.substr(1);
  return fmt::format("{}{}e{}{:02d}", sign, mantissa, exp < 0 ? '-' : '+', std::abs(exp));
}

void DumpPy(const OJson& v, int indent, int level, std::string* out) {
  auto newline = [&](int lvl) {
    out->push_back('\n');
    out->append(static_cast<size_t>(indent * lvl), ' ');
  };
  switch (v.type()) {
    case OJson::value_t::null: out->append("null"); return;
    case OJson::value_t::boolean: out->append(v.get<bool>() ? "true" : "false"); return;
    case OJson::value_t::number_integer: out->append(std::to_string(v.get<int64_t>())); return;
    case OJson::value_t::number_unsigned: out->append(std::to_string(v.get<uint64_t>())); return;
    case OJson::value_t::number_float: out->append(PyFloatRepr(v.get<double>())); return;
    case OJson::value_t::string: AppendPyString(v.get_ref<const std::string&>(), out); return;
    case OJson::value_t::array: {
      if (v.empty()) {
        out->append("[]");
        return;
      }
      out->push_back('[');
      bool first = true;
      for (const OJson& item : v) {
        if (!first) out->append(indent < 0 ? ", " : ",");
        first = false;
        if (indent >= 0) newline(level + 1);
        DumpPy(item, indent, level + 1, out);
      }
      if (indent >= 0) newline(level);
      out->push_back(']');
      return;
    }
    case OJson::value_t::object: {
      if (v.empty()) {
        out->append("{}");
        return;
      }
      out->push_back('{');
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) out->append(indent < 0 ? ", " : ",");
        first = false;
        if (indent >= 0) newline(level + 1);
        AppendPyString(it.key(), out);
        out->append(": ");
        DumpPy(it.value(), indent, level + 1, out);
      }
      if (indent >= 0) newline(level);
      out->push_back('}');
      return;
    }
    default: out->append("null"); return;  // binary / discarded: not produced by parsing
  }
}

// Python str() of a JSON scalar (what Jinja prints for `{{ value }}`).
std::string PyStr(const OJson& v) {
  if (v.is_null()) return "None";
  if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_float()) {
    std::string r = PyFloatRepr(v.get<double>());
    return r == "NaN" ? "nan" : r == "Infinity" ? "inf" : r == "-Infinity" ? "-inf" : r;
  }
  return PyJsonDumps(v);
}

// ---- Message access --------------------------------------------------------------------------

struct Msg {
  std::string role;
  std::string content;
  const OJson* raw;
};

// `structured_tool_content`: tool/ipython messages may carry JSON content (llama3.1 encodes it).
StatusOr<std::vector<Msg>> ReadMessages(const OJson& messages,
                                        bool structured_tool_content = false) {
  if (!messages.is_array() || messages.empty()) {
    return Invalid("chat template: messages must be a non-empty array of {\"role\", "
                   "\"content\"} objects");
  }
  std::vector<Msg> out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const OJson& m = messages[i];
    if (!m.is_object()) return Invalid(fmt::format("messages[{}]: expected an object", i));
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      return Invalid(fmt::format("messages[{}]: missing string \"role\"", i));
    }
    Msg msg{role->get<std::string>(), "", &m};
    auto content = m.find("content");
    const bool tool_role = msg.role == "tool" || msg.role == "ipython";
    if (content != m.end() && !content->is_null() &&
        !(structured_tool_content && tool_role && !content->is_string())) {
      if (!content->is_string()) {
        return Invalid(fmt::format("messages[{}].content: expected a string or null (content "
                                   "lists are not supported by these templates)",
                                   i));
      }
      msg.content = content->get<std::string>();
    }
    out.push_back(std::move(msg));
  }
  return out;
}

// The tool_calls array of a message, or nullptr when absent, null or empty.
const OJson* ToolCalls(const Msg& m) {
  auto it = m.raw->find("tool_calls");
  if (it == m.raw->end() || !it->is_array() || it->empty()) return nullptr;
  return &*it;
}

struct ToolCall {
  std::string name;
  const OJson* arguments;  // never null
};

StatusOr<ToolCall> ReadToolCall(const OJson& tc, size_t msg_index, size_t call_index) {
  const std::string where = fmt::format("messages[{}].tool_calls[{}]", msg_index, call_index);
  if (!tc.is_object()) return Invalid(where + ": expected an object");
  const OJson* f = &tc;
  if (auto it = tc.find("function"); it != tc.end() && it->is_object()) f = &*it;
  auto name = f->find("name");
  if (name == f->end() || !name->is_string()) return Invalid(where + ": missing function name");
  static const OJson kEmpty = OJson::object();
  auto args = f->find("arguments");
  return ToolCall{name->get<std::string>(), args == f->end() ? &kEmpty : &*args};
}

bool HasTools(const OJson& tools) { return tools.is_array() && !tools.empty(); }

StatusOr<OJson> CheckedTools(const OJson& tools) {
  if (!tools.is_null() && !tools.is_array()) {
    return Invalid("chat template: tools must be an array of tool definitions or null");
  }
  return tools;
}

// Decodes the escapes of a Jinja string literal body (\n, \t, \\, \', \").
std::string UnescapeJinja(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      const char c = s[++i];
      out.push_back(c == 'n' ? '\n' : c == 't' ? '\t' : c);
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

// The literal default system prompt of a ChatML template: the text of a string literal
// '<|im_start|>system\n...<|im_end|>' that is not a concatenation.
std::optional<std::string> FindDefaultSystem(std::string_view jinja) {
  for (std::string_view head : {"<|im_start|>system\\n", "<|im_start|>system\n"}) {
    for (size_t at = jinja.find(head); at != std::string_view::npos;
         at = jinja.find(head, at + 1)) {
      const size_t begin = at + head.size();
      const size_t end = jinja.find("<|im_end|>", begin);
      if (end == std::string_view::npos) continue;
      std::string_view body = jinja.substr(begin, end - begin);
      bool quoted = false;
      for (size_t i = 0; i < body.size(); ++i) {
        if ((body[i] == '\'' || body[i] == '"') && (i == 0 || body[i - 1] != '\\')) quoted = true;
      }
      if (!quoted && !body.empty()) return UnescapeJinja(body);
    }
  }
  return std::nullopt;
}

std::string TodayDate() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[32];
  const size_t n = std::strftime(buf, sizeof(buf), "%d %b %Y", &tm);
  return std::string(buf, n);
}

}  // namespace

std::string_view ChatTemplateFamilyName(ChatTemplateFamily family) {
  return kFamilyNames[static_cast<int>(family)];
}

std::string SupportedChatTemplateFamilies() {
  std::string out;
  for (std::string_view name : kFamilyNames) {
    if (!out.empty()) out += ", ";
    out += name;
  }
  return out;
}

StatusOr<ChatTemplateFamily> ParseChatTemplateFamily(std::string_view name) {
  for (size_t i = 0; i < std::size(kFamilyNames); ++i) {
    if (kFamilyNames[i] == name) return static_cast<ChatTemplateFamily>(i);
  }
  return Invalid(fmt::format("unknown chat template family \"{}\" (supported: {})", name,
                             SupportedChatTemplateFamilies()));
}

std::string PyJsonDumps(const OJson& value, int indent) {
  std::string out;
  DumpPy(value, indent, 0, &out);
  return out;
}

// ---- Recognition -----------------------------------------------------------------------------

ChatTemplate ChatTemplate::ForFamily(ChatTemplateFamily family, std::string bos_token,
                                     std::string eos_token) {
  ChatTemplate t;
  t.family_ = family;
  t.bos_token_ = std::move(bos_token);
  t.eos_token_ = std::move(eos_token);
  if (family == ChatTemplateFamily::kQwen25) {
    t.default_system_ = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
    t.has_default_system_ = true;
  } else if (family == ChatTemplateFamily::kQwen2) {
    t.default_system_ = "You are a helpful assistant.";
    t.has_default_system_ = true;
  }
  return t;
}

StatusOr<ChatTemplate> ChatTemplate::FromJinja(std::string_view jinja, std::string bos_token,
                                               std::string eos_token) {
  auto unsupported = [&](std::string_view why) {
    return Invalid(fmt::format("unsupported chat_template ({}); supported families: {}", why,
                               SupportedChatTemplateFamilies()));
  };
  auto make = [&](ChatTemplateFamily family) {
    ChatTemplate t = ForFamily(family, bos_token, eos_token);
    t.default_system_.clear();
    t.has_default_system_ = false;
    return t;
  };
  if (Contains(jinja, "<|start_header_id|>") && Contains(jinja, "<|eot_id|>")) {
    if (Contains(jinja, "Cutting Knowledge Date")) {
      if (Contains(jinja, "builtin_tools")) return make(ChatTemplateFamily::kLlama31);
      if (Contains(jinja, "strftime_now")) return make(ChatTemplateFamily::kLlama32);
      return unsupported("a Llama-3.x template with a date header but neither builtin_tools "
                         "nor strftime_now");
    }
    if (Contains(jinja, "tools") || Contains(jinja, "ipython")) {
      return unsupported("a Llama-3 template with tools but no date header");
    }
    ChatTemplate t = make(ChatTemplateFamily::kLlama3);
    t.generation_prompt_always_ = !Contains(jinja, "add_generation_prompt");
    return t;
  }
  if (Contains(jinja, "<|im_start|>") && Contains(jinja, "<|im_end|>")) {
    if (Contains(jinja, "<think>") || Contains(jinja, "reasoning_content")) {
      if (Contains(jinja, "enable_thinking") && Contains(jinja, "reasoning_content") &&
          Contains(jinja, "<tool_response>")) {
        return make(ChatTemplateFamily::kQwen3);
      }
      return unsupported("a ChatML template with <think> handling other than Qwen3's "
                         "enable_thinking template");
    }
    const bool tools = Contains(jinja, "<tools>");
    if (!tools && Contains(jinja, "tool")) {
      return unsupported("a ChatML template with a tool format other than Qwen's <tools>");
    }
    ChatTemplate t = make(tools ? ChatTemplateFamily::kQwen25 : ChatTemplateFamily::kQwen2);
    std::optional<std::string> system = FindDefaultSystem(jinja);
    if (system) {
      t.default_system_ = *system;
      t.has_default_system_ = true;
    } else if (tools || Contains(jinja, "!= 'system'") || Contains(jinja, "!= \"system\"")) {
      return unsupported("a ChatML template whose default system prompt is not a literal");
    }
    return t;
  }
  return unsupported("neither ChatML (<|im_start|>) nor Llama-3 header tokens");
}

StatusOr<std::string> ChatTemplate::Apply(const OJson& messages,
                                          const ChatTemplateOptions& options) const {
  if (!options.kwargs.is_object()) return Invalid("chat template: kwargs must be an object");
  switch (family_) {
    case ChatTemplateFamily::kQwen2:
    case ChatTemplateFamily::kQwen25:
      return ApplyQwen(messages, options);
    case ChatTemplateFamily::kQwen3:
      return ApplyQwen3(messages, options);
    case ChatTemplateFamily::kLlama3:
      return ApplyLlama3(messages, options);
    case ChatTemplateFamily::kLlama31:
    case ChatTemplateFamily::kLlama32:
      return ApplyLlama31(messages, options);
  }
  return Invalid("chat template: unknown family");
}

// ---- Qwen2 / Qwen2.5 -------------------------------------------------------------------------

namespace {

constexpr std::string_view kQwenToolsHeader =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
constexpr std::string_view kQwenToolsFooter =
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
    "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n";

// A run of tool messages becomes one user turn of <tool_response> blocks.
void AppendQwenToolResponse(const std::vector<Msg>& msgs, size_t i, std::string* out) {
  if (i == 0 || msgs[i - 1].role != "tool") out->append("<|im_start|>user");
  out->append("\n<tool_response>\n");
  out->append(msgs[i].content);
  out->append("\n</tool_response>");
  if (i + 1 == msgs.size() || msgs[i + 1].role != "tool") out->append("<|im_end|>\n");
}

void AppendQwenTools(const OJson& tools, std::string* out) {
  out->append(kQwenToolsHeader);
  for (const OJson& tool : tools) {
    out->append("\n");
    out->append(PyJsonDumps(tool));
  }
  out->append(kQwenToolsFooter);
}

}  // namespace

StatusOr<std::string> ChatTemplate::ApplyQwen(const OJson& messages,
                                              const ChatTemplateOptions& options) const {
  SLIME_ASSIGN_OR_RETURN(std::vector<Msg> msgs, ReadMessages(messages));
  SLIME_ASSIGN_OR_RETURN(OJson tools, CheckedTools(options.tools));
  std::string out;
  if (family_ == ChatTemplateFamily::kQwen2) {
    if (HasTools(tools)) return Invalid("chat template qwen2 does not render tools");
    for (size_t i = 0; i < msgs.size(); ++i) {
      if (ToolCalls(msgs[i]) != nullptr) {
        return Invalid(fmt::format("messages[{}]: chat template qwen2 does not render "
                                   "tool_calls",
                                   i));
      }
      if (i == 0 && msgs[0].role != "system" && has_default_system_) {
        out += "<|im_start|>system\n" + default_system_ + "<|im_end|>\n";
      }
      out += "<|im_start|>" + msgs[i].role + "\n" + msgs[i].content + "<|im_end|>\n";
    }
    if (options.add_generation_prompt) out += "<|im_start|>assistant\n";
    return out;
  }

  // Qwen2.5.
  const bool first_is_system = msgs[0].role == "system";
  if (HasTools(tools)) {
    out += "<|im_start|>system\n";
    out += first_is_system ? msgs[0].content : default_system_;
    out += "\n\n";
    AppendQwenTools(tools, &out);
  } else {
    out += "<|im_start|>system\n" + (first_is_system ? msgs[0].content : default_system_) +
           "<|im_end|>\n";
  }
  for (size_t i = 0; i < msgs.size(); ++i) {
    const Msg& m = msgs[i];
    const OJson* calls = ToolCalls(m);
    if (m.role == "user" || (m.role == "system" && i != 0) ||
        (m.role == "assistant" && calls == nullptr)) {
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    } else if (m.role == "assistant") {
      out += "<|im_start|>" + m.role;
      if (!m.content.empty()) out += "\n" + m.content;
      for (size_t j = 0; j < calls->size(); ++j) {
        SLIME_ASSIGN_OR_RETURN(ToolCall tc, ReadToolCall((*calls)[j], i, j));
        out += "\n<tool_call>\n{\"name\": \"" + tc.name + "\", \"arguments\": " +
               PyJsonDumps(*tc.arguments) + "}\n</tool_call>";
      }
      out += "<|im_end|>\n";
    } else if (m.role == "tool") {
      AppendQwenToolResponse(msgs, i, &out);
    }
  }
  if (options.add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

// ---- Qwen3 -----------------------------------------------------------------------------------

StatusOr<std::string> ChatTemplate::ApplyQwen3(const OJson& messages,
                                               const ChatTemplateOptions& options) const {
  SLIME_ASSIGN_OR_RETURN(std::vector<Msg> msgs, ReadMessages(messages));
  SLIME_ASSIGN_OR_RETURN(OJson tools, CheckedTools(options.tools));
  std::string out;
  if (HasTools(tools)) {
    out += "<|im_start|>system\n";
    if (msgs[0].role == "system") out += msgs[0].content + "\n\n";
    AppendQwenTools(tools, &out);
  } else if (msgs[0].role == "system") {
    out += "<|im_start|>system\n" + msgs[0].content + "<|im_end|>\n";
  }
  // The last user query that is not a tool response; thinking before it is dropped.
  const size_t n = msgs.size();
  size_t last_query = n - 1;
  for (size_t k = n; k-- > 0;) {
    const std::string& c = msgs[k].content;
    const bool tool_response =
        c.starts_with("<tool_response>") && c.ends_with("</tool_response>");
    if (msgs[k].role == "user" && !tool_response) {
      last_query = k;
      break;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const Msg& m = msgs[i];
    if (m.role == "user" || (m.role == "system" && i != 0)) {
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    } else if (m.role == "assistant") {
      std::string content = m.content;
      std::string reasoning;
      auto rc = m.raw->find("reasoning_content");
      if (rc != m.raw->end() && !rc->is_null()) {
        if (!rc->is_string()) {
          return Invalid(fmt::format("messages[{}].reasoning_content: expected a string", i));
        }
        reasoning = rc->get<std::string>();
      } else if (const size_t close = content.find("</think>"); close != std::string::npos) {
        // content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n')
        std::string_view before = PyRStripChars(std::string_view(content).substr(0, close), "\n");
        const size_t open = before.rfind("<think>");
        if (open != std::string_view::npos) before = before.substr(open + 7);
        reasoning = std::string(PyLStripChars(before, "\n"));
        // content.split('</think>')[-1].lstrip('\n')
        const size_t last = content.rfind("</think>");
        content = std::string(PyLStripChars(std::string_view(content).substr(last + 8), "\n"));
      }
      if (i > last_query && (i + 1 == n || !reasoning.empty())) {
        out += "<|im_start|>" + m.role + "\n<think>\n" +
               std::string(PyStripChars(reasoning, "\n")) + "\n</think>\n\n" +
               std::string(PyLStripChars(content, "\n"));
      } else {
        out += "<|im_start|>" + m.role + "\n" + content;
      }
      if (const OJson* calls = ToolCalls(m)) {
        for (size_t j = 0; j < calls->size(); ++j) {
          if ((j == 0 && !content.empty()) || j > 0) out += "\n";
          SLIME_ASSIGN_OR_RETURN(ToolCall tc, ReadToolCall((*calls)[j], i, j));
          out += "<tool_call>\n{\"name\": \"" + tc.name + "\", \"arguments\": ";
          out += tc.arguments->is_string() ? tc.arguments->get<std::string>()
                                           : PyJsonDumps(*tc.arguments);
          out += "}\n</tool_call>";
        }
      }
      out += "<|im_end|>\n";
    } else if (m.role == "tool") {
      AppendQwenToolResponse(msgs, i, &out);
    }
  }
  if (options.add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    // {%- if enable_thinking is defined and enable_thinking is false %}
    auto it = options.kwargs.find("enable_thinking");
    if (it != options.kwargs.end() && it->is_boolean() && !it->get<bool>()) {
      out += "<think>\n\n</think>\n\n";
    }
  }
  return out;
}

// ---- Llama-3 ---------------------------------------------------------------------------------

StatusOr<std::string> ChatTemplate::ApplyLlama3(const OJson& messages,
                                                const ChatTemplateOptions& options) const {
  SLIME_ASSIGN_OR_RETURN(std::vector<Msg> msgs, ReadMessages(messages));
  if (HasTools(options.tools)) return Invalid("chat template llama3 does not render tools");
  std::string out;
  for (size_t i = 0; i < msgs.size(); ++i) {
    if (ToolCalls(msgs[i]) != nullptr) {
      return Invalid(fmt::format("messages[{}]: chat template llama3 does not render "
                                 "tool_calls",
                                 i));
    }
    if (i == 0) out += bos_token_;
    out += "<|start_header_id|>" + msgs[i].role + "<|end_header_id|>\n\n" +
           std::string(PyStrip(msgs[i].content)) + "<|eot_id|>";
  }
  if (options.add_generation_prompt || generation_prompt_always_) {
    out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  }
  return out;
}

StatusOr<std::string> ChatTemplate::ApplyLlama31(const OJson& messages,
                                                 const ChatTemplateOptions& options) const {
  SLIME_ASSIGN_OR_RETURN(std::vector<Msg> msgs,
                         ReadMessages(messages, /*structured_tool_content=*/true));
  const OJson& kwargs = options.kwargs;
  OJson tools = options.tools;
  if (auto it = kwargs.find("custom_tools"); it != kwargs.end()) tools = *it;
  SLIME_ASSIGN_OR_RETURN(tools, CheckedTools(tools));
  const bool has_tools = !tools.is_null();  // `tools is not none`: an empty list counts
  bool tools_in_user_message = true;
  if (auto it = kwargs.find("tools_in_user_message"); it != kwargs.end() && it->is_boolean()) {
    tools_in_user_message = it->get<bool>();
  }
  std::string date = family_ == ChatTemplateFamily::kLlama31 ? "26 Jul 2024" : TodayDate();
  if (auto it = kwargs.find("date_string"); it != kwargs.end() && it->is_string()) {
    date = it->get<std::string>();
  }
  std::vector<std::string> builtin;
  bool has_builtin = false;
  if (auto it = kwargs.find("builtin_tools");
      family_ == ChatTemplateFamily::kLlama31 && it != kwargs.end() && !it->is_null()) {
    if (!it->is_array()) return Invalid("chat template: builtin_tools must be an array");
    for (const OJson& b : *it) {
      if (!b.is_string()) return Invalid("chat template: builtin_tools must hold strings");
      builtin.push_back(b.get<std::string>());
    }
    has_builtin = true;
  }
  constexpr std::string_view kFormat =
      "Respond in the format {\"name\": function name, \"parameters\": dictionary of argument "
      "name and its value}.Do not use variables.\n\n";

  std::string out = bos_token_;
  size_t first = 0;
  std::string system_message;
  if (msgs[0].role == "system") {
    system_message = std::string(PyStrip(msgs[0].content));
    first = 1;
  }
  out += "<|start_header_id|>system<|end_header_id|>\n\n";
  if (has_builtin || has_tools) out += "Environment: ipython\n";
  if (has_builtin) {
    std::string names;
    for (const std::string& b : builtin) {
      if (b == "code_interpreter") continue;
      if (!names.empty()) names += ", ";
      names += b;
    }
    out += "Tools: " + names + "\n\n";
  }
  out += "Cutting Knowledge Date: December 2023\nToday Date: " + date + "\n\n";
  if (has_tools && !tools_in_user_message) {
    out += "You have access to the following functions. To call a function, please respond "
           "with JSON for a function call.";
    out += kFormat;
    for (const OJson& t : tools) out += PyJsonDumps(t, 4) + "\n\n";
  }
  out += system_message + "<|eot_id|>";
  if (tools_in_user_message && has_tools) {
    if (first >= msgs.size()) {
      return Invalid("chat template: Cannot put tools in the first user message when there's "
                     "no first user message!");
    }
    if (auto c = msgs[first].raw->find("content");
        c != msgs[first].raw->end() && !c->is_null() && !c->is_string()) {
      return Invalid(fmt::format("messages[{}].content: the message that carries the tools must "
                                 "have string content",
                                 first));
    }
    out += "<|start_header_id|>user<|end_header_id|>\n\n";
    out += "Given the following functions, please respond with a JSON for a function call with "
           "its proper arguments that best answers the given prompt.\n\n";
    out += kFormat;
    for (const OJson& t : tools) out += PyJsonDumps(t, 4) + "\n\n";
    out += std::string(PyStrip(msgs[first].content)) + "<|eot_id|>";
    ++first;
  }
  for (size_t i = first; i < msgs.size(); ++i) {
    const Msg& m = msgs[i];
    const OJson* calls = ToolCalls(m);
    if (m.role != "ipython" && m.role != "tool" && calls == nullptr) {
      out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" +
             std::string(PyStrip(m.content)) + "<|eot_id|>";
    } else if (calls != nullptr) {
      if (calls->size() != 1) {
        return Invalid(fmt::format("messages[{}]: This model only supports single tool-calls at "
                                   "once!",
                                   i));
      }
      SLIME_ASSIGN_OR_RETURN(ToolCall tc, ReadToolCall((*calls)[0], i, 0));
      out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      if (has_builtin && std::find(builtin.begin(), builtin.end(), tc.name) != builtin.end()) {
        out += "<|python_tag|>" + tc.name + ".call(";
        if (!tc.arguments->is_object()) {
          return Invalid(fmt::format("messages[{}]: builtin tool arguments must be an object", i));
        }
        bool first_arg = true;
        for (auto it = tc.arguments->begin(); it != tc.arguments->end(); ++it) {
          if (!it.value().is_string()) {
            return Invalid(fmt::format("messages[{}]: builtin tool argument \"{}\" must be a "
                                       "string",
                                       i, it.key()));
          }
          if (!first_arg) out += ", ";
          first_arg = false;
          out += it.key() + "=\"" + it.value().get<std::string>() + "\"";
        }
        out += ")";
      } else {
        out += "{\"name\": \"" + tc.name + "\", \"parameters\": " +
               PyJsonDumps(*tc.arguments) + "}";
      }
      out += has_builtin ? "<|eom_id|>" : "<|eot_id|>";
    } else {
      out += "<|start_header_id|>ipython<|end_header_id|>\n\n";
      // `content is mapping or content is iterable`: true for strings too, so tool results
      // are always JSON-encoded (a string result appears quoted).
      auto content = m.raw->find("content");
      if (content == m.raw->end() || content->is_null()) {
        out += "None";
      } else if (content->is_string() || content->is_array() || content->is_object()) {
        out += PyJsonDumps(*content);
      } else {
        out += PyStr(*content);
      }
      out += "<|eot_id|>";
    }
  }
  if (options.add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

}  // namespace slime::tokenizer
