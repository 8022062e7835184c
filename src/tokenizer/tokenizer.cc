// Tokenizer loading, encode and decode (see tokenizer.h).
#include "slime/tokenizer/tokenizer.h"

#include <cerrno>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "slime/tokenizer/unicode.h"

namespace slime::tokenizer {
namespace {

using Json = nlohmann::json;

Status Invalid(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(fmt::format("{}: {}", path, what));
}

// Prefixes the message of a non-OK status with the name of the file it concerns.
Status InFile(std::string_view source, const Status& status) {
  if (status.ok()) return status;
  return Status(status.code(), fmt::format("{}: {}", source, std::string(status.message())));
}

StatusOr<std::string> ReadFile(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return absl::InvalidArgumentError(fmt::format("{}: is a directory, expected a file", path));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return absl::DataLossError(fmt::format("{}: read error", path));
  return buffer.str();
}

StatusOr<Json> ParseJson(std::string_view text, std::string_view source) {
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(fmt::format("{}: not valid JSON: {}", source, e.what()));
  }
}

// The byte a ByteLevel decoder produces for one token: each character mapped back through the
// byte-level alphabet, or the token's own UTF-8 bytes when some character is outside it.
void AppendByteLevelDecoded(std::string_view token, std::string* out) {
  const size_t mark = out->size();
  for (size_t pos = 0; pos < token.size();) {
    const Utf8Step step = DecodeUtf8(token, pos);
    const int byte = step.valid ? UnicodeToByte(step.code_point) : -1;
    if (byte < 0) {
      out->resize(mark);
      out->append(token);
      return;
    }
    out->push_back(static_cast<char>(byte));
    pos += step.length;
  }
}

// transformers' PreTrainedTokenizerBase.clean_up_tokenization.
std::string CleanUpTokenization(std::string text) {
  static const std::pair<std::string_view, std::string_view> kReplacements[] = {
      {" .", "."},     {" ?", "?"},     {" !", "!"},     {" ,", ","},     {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"},   {" 's", "'s"},   {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kReplacements) {
    std::string out;
    size_t start = 0;
    for (size_t hit; (hit = text.find(from, start)) != std::string::npos;) {
      out.append(text, start, hit - start);
      out.append(to);
      start = hit + from.size();
    }
    if (start == 0) continue;
    out.append(text, start, std::string::npos);
    text = std::move(out);
  }
  return text;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Loading

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromDirectory(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(fmt::format("{}: not a directory (expected a directory holding "
                                           "tokenizer.json and tokenizer_config.json)",
                                           dir));
  }
  const std::string config = (fs::path(dir) / "tokenizer_config.json").string();
  return FromFiles((fs::path(dir) / "tokenizer.json").string(),
                   fs::exists(config, ec) ? config : std::string());
}

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromFiles(const std::string& tokenizer_json,
                                                          const std::string& config_json) {
  SLIME_ASSIGN_OR_RETURN(std::string tokenizer_text, ReadFile(tokenizer_json));
  SLIME_ASSIGN_OR_RETURN(Json tokenizer, ParseJson(tokenizer_text, tokenizer_json));
  tokenizer_text.clear();
  tokenizer_text.shrink_to_fit();

  auto tok = std::unique_ptr<Tokenizer>(new Tokenizer());
  tok->source_ = tokenizer_json;
  SLIME_RETURN_IF_ERROR(InFile(tokenizer_json, tok->LoadTokenizerJson(tokenizer)));
  tokenizer = Json();
  if (config_json.empty()) return tok;

  SLIME_ASSIGN_OR_RETURN(std::string config_text, ReadFile(config_json));
  SLIME_ASSIGN_OR_RETURN(Json config, ParseJson(config_text, config_json));
  std::string extra_template;
  std::error_code ec;
  const auto jinja = std::filesystem::path(config_json).parent_path() / "chat_template.jinja";
  if (std::filesystem::exists(jinja, ec)) {
    SLIME_ASSIGN_OR_RETURN(extra_template, ReadFile(jinja.string()));
  }
  tok->config_source_ = config_json;
  SLIME_RETURN_IF_ERROR(InFile(config_json, tok->LoadConfig(config, extra_template)));
  return tok;
}

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJsonText(std::string_view tokenizer_text,
                                                             std::string_view config_text,
                                                             std::string_view source) {
  SLIME_ASSIGN_OR_RETURN(Json tokenizer, ParseJson(tokenizer_text, source));
  auto tok = std::unique_ptr<Tokenizer>(new Tokenizer());
  tok->source_ = std::string(source);
  SLIME_RETURN_IF_ERROR(InFile(source, tok->LoadTokenizerJson(tokenizer)));
  if (config_text.empty()) return tok;
  const std::string config_source = fmt::format("{} (tokenizer_config)", source);
  SLIME_ASSIGN_OR_RETURN(Json config, ParseJson(config_text, config_source));
  tok->config_source_ = config_source;
  SLIME_RETURN_IF_ERROR(InFile(config_source, tok->LoadConfig(config, "")));
  return tok;
}

Status Tokenizer::LoadTokenizerJson(const Json& j) {
  try {
    if (!j.is_object()) return absl::InvalidArgumentError("expected a JSON object at top level");
    auto field = [&j](const char* key) -> const Json& {
      static const Json kNull;
      auto it = j.find(key);
      return it == j.end() ? kNull : *it;
    };
    SLIME_ASSIGN_OR_RETURN(normalizer_, Normalizer::FromJson(field("normalizer")));
    SLIME_ASSIGN_OR_RETURN(pre_tokenizer_, PreTokenizer::FromJson(field("pre_tokenizer")));
    if (!j.contains("model")) {
      return absl::InvalidArgumentError("missing \"model\" (expected a BPE model object)");
    }
    SLIME_ASSIGN_OR_RETURN(model_, BpeModel::FromJson(j["model"], pre_tokenizer_->byte_level()));

    const Json& added = field("added_tokens");
    if (!added.is_null() && !added.is_array()) return Invalid("added_tokens", "expected an array");
    for (size_t i = 0; i < added.size(); ++i) {
      const Json& a = added[i];
      const std::string path = fmt::format("added_tokens[{}]", i);
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
          !a.contains("content") || !a["content"].is_string()) {
        return Invalid(path, "expected {\"id\": int, \"content\": string, ...}");
      }
      if (a["id"].get<int64_t>() < 0 || a["id"].get<int64_t>() > BpeModel::kMaxTokenId) {
        return Invalid(path, fmt::format("id {} is outside [0, {}]", a["id"].dump(),
                                         BpeModel::kMaxTokenId));
      }
      AddedToken token;
      token.id = a["id"].get<int32_t>();
      token.content = a["content"].get<std::string>();
      auto flag = [&a](const char* key, bool fallback) {
        auto it = a.find(key);
        return (it != a.end() && it->is_boolean()) ? it->get<bool>() : fallback;
      };
      token.special = flag("special", false);
      token.single_word = flag("single_word", false);
      token.lstrip = flag("lstrip", false);
      token.rstrip = flag("rstrip", false);
      token.normalized = flag("normalized", !token.special);
      Status st = added_.Add(std::move(token));
      if (!st.ok()) return Invalid(path, std::string(st.message()));
    }

    SLIME_RETURN_IF_ERROR(LoadPostProcessor(field("post_processor"), "post_processor"));
    SLIME_RETURN_IF_ERROR(LoadDecoder(field("decoder")));

    int32_t max_id = model_->max_id();
    size_t extra = 0;
    for (const AddedToken& t : added_.tokens()) {
      max_id = std::max(max_id, t.id);
      if (model_->IdToToken(t.id) == nullptr) ++extra;
    }
    vocab_size_ = model_->size() + extra;
    id_limit_ = max_id + 1;
    BuildDecodeTables();
    return absl::OkStatus();
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(fmt::format("unexpected JSON structure: {}", e.what()));
  }
}

Status Tokenizer::LoadPostProcessor(const Json& j, const std::string& path) {
  if (j.is_null()) return absl::OkStatus();
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    return Invalid(path, "expected an object with a string \"type\"");
  }
  const std::string type = j["type"].get<std::string>();
  auto set_template = [&](std::vector<PostItem> items) -> Status {
    if (!post_template_.empty()) {
      return Invalid(path, "more than one processor adds special tokens; not supported");
    }
    post_template_ = std::move(items);
    return absl::OkStatus();
  };
  if (type == "ByteLevel") return absl::OkStatus();  // offsets only; ids unchanged
  if (type == "Sequence") {
    if (!j.contains("processors") || !j["processors"].is_array()) {
      return Invalid(path, "Sequence needs an array \"processors\"");
    }
    for (size_t i = 0; i < j["processors"].size(); ++i) {
      SLIME_RETURN_IF_ERROR(
          LoadPostProcessor(j["processors"][i], fmt::format("{}.processors[{}]", path, i)));
    }
    return absl::OkStatus();
  }
  if (type == "TemplateProcessing") {
    if (!j.contains("single") || !j["single"].is_array()) {
      return Invalid(path, "TemplateProcessing needs an array \"single\"");
    }
    const Json empty = Json::object();
    const Json& specials = j.contains("special_tokens") ? j["special_tokens"] : empty;
    std::vector<PostItem> items;
    for (size_t i = 0; i < j["single"].size(); ++i) {
      const Json& item = j["single"][i];
      const std::string item_path = fmt::format("{}.single[{}]", path, i);
      if (item.contains("Sequence")) {
        items.push_back({true, {}});
      } else if (item.contains("SpecialToken") && item["SpecialToken"].contains("id") &&
                 item["SpecialToken"]["id"].is_string()) {
        const std::string name = item["SpecialToken"]["id"].get<std::string>();
        if (!specials.contains(name) || !specials[name].contains("ids") ||
            !specials[name]["ids"].is_array()) {
          return Invalid(item_path, fmt::format("special token \"{}\" is not defined in "
                                                "special_tokens",
                                                name));
        }
        items.push_back({false, specials[name]["ids"].get<std::vector<int32_t>>()});
      } else {
        return Invalid(item_path, "expected {\"Sequence\": ...} or {\"SpecialToken\": ...}");
      }
    }
    return set_template(std::move(items));
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    auto id_of = [&](const char* key) -> StatusOr<int32_t> {
      if (!j.contains(key) || !j[key].is_array() || j[key].size() != 2 ||
          !j[key][1].is_number_integer()) {
        return Invalid(fmt::format("{}.{}", path, key), "expected [token, id]");
      }
      return j[key][1].get<int32_t>();
    };
    SLIME_ASSIGN_OR_RETURN(int32_t cls, id_of("cls"));
    SLIME_ASSIGN_OR_RETURN(int32_t sep, id_of("sep"));
    return set_template({{false, {cls}}, {true, {}}, {false, {sep}}});
  }
  return Invalid(path, fmt::format("unsupported post_processor type \"{}\" (supported: "
                                   "ByteLevel, TemplateProcessing, RobertaProcessing, "
                                   "BertProcessing, Sequence)",
                                   type));
}

Status Tokenizer::LoadDecoder(const Json& j) {
  if (j.is_null()) {
    byte_level_decoder_ = false;
    return absl::OkStatus();
  }
  std::vector<const Json*> parts;
  if (j.is_object() && j.value("type", "") == "Sequence" && j.contains("decoders") &&
      j["decoders"].is_array()) {
    for (const Json& d : j["decoders"]) parts.push_back(&d);
  } else {
    parts.push_back(&j);
  }
  for (const Json* d : parts) {
    if (!d->is_object() || d->value("type", "") != "ByteLevel") {
      return Invalid("decoder", fmt::format("unsupported decoder {} (supported: ByteLevel, "
                                            "null)",
                                            d->is_object() ? d->value("type", "?") : d->dump()));
    }
  }
  byte_level_decoder_ = true;
  return absl::OkStatus();
}

StatusOr<std::optional<int32_t>> Tokenizer::ConfigTokenId(const Json& config, const char* key,
                                                          std::string* token) const {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::optional<int32_t>();
  if (it->is_string()) {
    *token = it->get<std::string>();
  } else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    *token = (*it)["content"].get<std::string>();
  } else {
    return Invalid(key, "expected a token string, {\"content\": string}, or null");
  }
  std::optional<int32_t> id = TokenToId(*token);
  if (!id) return Invalid(key, fmt::format("\"{}\" is not in the vocabulary", *token));
  return id;
}

Status Tokenizer::LoadConfig(const Json& config, std::string_view extra_template) {
  try {
    if (!config.is_object()) return absl::InvalidArgumentError("expected a JSON object");
    std::string unused;
    SLIME_ASSIGN_OR_RETURN(bos_id_, ConfigTokenId(config, "bos_token", &bos_token_));
    SLIME_ASSIGN_OR_RETURN(eos_id_, ConfigTokenId(config, "eos_token", &eos_token_));
    SLIME_ASSIGN_OR_RETURN(pad_id_, ConfigTokenId(config, "pad_token", &unused));
    SLIME_ASSIGN_OR_RETURN(unk_id_, ConfigTokenId(config, "unk_token", &unused));
    if (auto it = config.find("clean_up_tokenization_spaces"); it != config.end()) {
      if (!it->is_boolean()) return Invalid("clean_up_tokenization_spaces", "expected a bool");
      clean_up_tokenization_spaces_ = it->get<bool>();
    }
    std::string jinja(extra_template);
    if (auto it = config.find("chat_template"); it != config.end() && !it->is_null()) {
      if (it->is_string()) {
        jinja = it->get<std::string>();
      } else if (it->is_array()) {
        // Named templates: [{"name": ..., "template": ...}]; "default" is what transformers
        // uses without an explicit choice.
        jinja.clear();
        for (const Json& t : *it) {
          if (t.is_object() && t.value("name", "") == "default" && t.contains("template") &&
              t["template"].is_string()) {
            jinja = t["template"].get<std::string>();
          }
        }
        if (jinja.empty()) {
          return Invalid("chat_template", "a list of named templates without \"default\"");
        }
      } else {
        return Invalid("chat_template", "expected a string or a list of named templates");
      }
    }
    if (jinja.empty()) {
      chat_template_ = absl::NotFoundError("no chat_template in tokenizer_config.json");
    } else {
      chat_template_ = ChatTemplate::FromJinja(jinja, bos_token_, eos_token_);
    }
    return absl::OkStatus();
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(fmt::format("unexpected JSON structure: {}", e.what()));
  }
}

// ---------------------------------------------------------------------------------------------
// Encode

void Tokenizer::EncodeWords(std::string_view normalized, std::vector<int32_t>* ids) const {
  // Per-thread scratch; `arena` only fills when a pre-tokenizer step rewrites text.
  thread_local std::vector<std::string_view> words;
  thread_local std::deque<std::string> arena;
  words.clear();
  arena.clear();
  Status st = pre_tokenizer_->Split(normalized, &arena, &words);
  if (!st.ok()) {
    // Only a PCRE2 resource limit can get here; encode the text as one word rather than fail.
    spdlog::warn("tokenizer {}: pre-tokenizer failed ({}); encoding {} bytes as one word",
                 source_, std::string(st.message()), normalized.size());
    words.assign(1, normalized);
  }
  for (std::string_view word : words) model_->Encode(word, ids);
}

void Tokenizer::EncodeText(std::string_view text, std::vector<int32_t>* ids) const {
  std::string normalized_storage;
  std::string_view normalized = text;
  if (!normalizer_->empty() && normalizer_->Normalize(text, &normalized_storage)) {
    normalized = normalized_storage;
  }
  if (!added_.has_normalized_tokens()) {
    EncodeWords(normalized, ids);
    return;
  }
  std::vector<TextSplit> splits;
  added_.Split(normalized, /*normalized=*/true, &splits);
  for (const TextSplit& s : splits) {
    if (s.id >= 0) {
      ids->push_back(s.id);
    } else {
      EncodeWords(s.text, ids);
    }
  }
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_special_tokens) const {
  std::string repaired;
  if (!IsValidUtf8(text)) {
    repaired = Utf8Lossy(text);
    text = repaired;
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  std::vector<TextSplit> splits;
  added_.Split(text, /*normalized=*/false, &splits);
  for (const TextSplit& s : splits) {
    if (s.id >= 0) {
      ids.push_back(s.id);
    } else {
      EncodeText(s.text, &ids);
    }
  }
  if (!add_special_tokens || post_template_.empty()) return ids;
  std::vector<int32_t> out;
  out.reserve(ids.size() + 4);
  for (const PostItem& item : post_template_) {
    const std::vector<int32_t>& part = item.is_sequence ? ids : item.ids;
    out.insert(out.end(), part.begin(), part.end());
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Decode and lookups

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  if (std::optional<int32_t> id = added_.FindByContent(token)) return id;
  return model_->TokenToId(token);
}

std::optional<std::string> Tokenizer::IdToToken(int32_t id) const {
  if (const AddedToken* t = added_.FindById(id)) return t->content;
  if (const std::string* t = model_->IdToToken(id)) return *t;
  return std::nullopt;
}

void Tokenizer::BuildDecodeTables() {
  token_bytes_.assign(static_cast<size_t>(id_limit_), std::string());
  id_flags_.assign(static_cast<size_t>(id_limit_), 0);
  auto set = [this](int32_t id, const std::string& token, uint8_t flags) {
    id_flags_[id] = flags;
    if (byte_level_decoder_) {
      AppendByteLevelDecoded(token, &token_bytes_[id]);
    } else {
      token_bytes_[id] = token;
    }
  };
  for (int32_t id = 0; id <= model_->max_id(); ++id) {
    if (const std::string* token = model_->IdToToken(id)) set(id, *token, kIdPresent);
  }
  for (const AddedToken& t : added_.tokens()) {  // added tokens take precedence, as in HF
    token_bytes_[t.id].clear();
    set(t.id, t.content, static_cast<uint8_t>(kIdPresent | (t.special ? kIdSpecial : 0)));
  }
}

std::string Tokenizer::Decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  // transformers >= 5 ignores clean_up_tokenization_spaces for BPE tokenizers (it would strip
  // real spaces before punctuation), and every model this tokenizer loads is BPE; SGLang decodes
  // through transformers, so we match it. The 3-argument form still offers the clean-up.
  return Decode(ids, skip_special_tokens, /*clean_up_tokenization_spaces=*/false);
}

std::string Tokenizer::Decode(std::span<const int32_t> ids, bool skip_special_tokens,
                              bool clean_up_tokenization_spaces) const {
  std::string bytes;
  bytes.reserve(ids.size() * 4);
  bool first = true;
  for (int32_t id : ids) {
    if (!IsKnown(id) || (skip_special_tokens && IsSpecial(id))) continue;
    if (!first) bytes.append(token_separator());
    first = false;
    bytes.append(TokenBytes(id));
  }
  std::string text = Utf8Lossy(bytes);
  return clean_up_tokenization_spaces ? CleanUpTokenization(std::move(text)) : text;
}

StatusOr<std::string> Tokenizer::ApplyChatTemplate(const nlohmann::ordered_json& messages,
                                                   const ChatTemplateOptions& options) const {
  if (!chat_template_.ok()) {
    return InFile(config_source_.empty() ? source_ + " (no tokenizer_config.json)" : config_source_,
                  chat_template_.status());
  }
  return chat_template_->Apply(messages, options);
}

}  // namespace slime::tokenizer
