// SFT dataset: JSONL conversations → tokens and loss masks; EpochSampler (see sft_dataset.h).
//
// Per line: parse → check the messages → render messages[0..i] for every i → cut the text into
// pieces (untrained | header | trained body) → tokenize each piece → verify against the
// tokenization of the whole text → truncate / skip.
#include "slime/data/sft_dataset.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <random>
#include <string_view>
#include <utility>

namespace slime::data {
namespace {

using OJson = nlohmann::ordered_json;

constexpr std::string_view kRoles[] = {"system", "user", "assistant", "tool"};

Status Invalid(const std::string& what) { return absl::InvalidArgumentError(what); }

// Python-style repr of a short text for error messages: escapes control characters, cuts
// long texts.
std::string Quote(std::string_view s, size_t max_chars = 60) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size() && i < max_chars; ++i) {
    const char c = s[i];
    if (c == '\n') {
      out += "\\n";
    } else if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\x{:02x}", static_cast<int>(c));
    } else {
      out += c;
    }
  }
  if (s.size() > max_chars) out += "...";
  return out + "\"";
}

size_t CommonPrefix(std::string_view a, std::string_view b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

// `loss` or slime's `step_loss_mask`: true/false or 0/1. nullopt when neither is present.
StatusOr<std::optional<bool>> ReadLossFlag(const OJson& m, const std::string& where) {
  std::optional<bool> flag;
  std::string first_key;
  for (const char* key : {"loss", "step_loss_mask"}) {
    auto it = m.find(key);
    if (it == m.end()) continue;
    bool value = false;
    if (it->is_boolean()) {
      value = it->get<bool>();
    } else if (it->is_number_integer() && (it->get<int64_t>() == 0 || it->get<int64_t>() == 1)) {
      value = it->get<int64_t>() == 1;
    } else {
      return Invalid(
          fmt::format("{}.{}: expected true, false, 0 or 1, got {}", where, key, it->dump()));
    }
    if (flag.has_value() && *flag != value) {
      return Invalid(fmt::format("{}: \"{}\" and \"{}\" disagree", where, first_key, key));
    }
    flag = value;
    first_key = key;
  }
  return flag;
}

// Checks every message; returns which ones are trained.
StatusOr<std::vector<bool>> CheckMessages(const OJson& messages, const std::string& key) {
  if (!messages.is_array()) {
    return Invalid(
        fmt::format("\"{}\": expected an array of {{\"role\", \"content\"}} objects, "
                    "got {}",
                    key, messages.type_name()));
  }
  if (messages.empty()) return Invalid(fmt::format("\"{}\": the conversation is empty", key));
  std::vector<bool> trained(messages.size(), false);
  for (size_t i = 0; i < messages.size(); ++i) {
    const OJson& m = messages[i];
    const std::string where = fmt::format("{}[{}]", key, i);
    if (!m.is_object()) {
      return Invalid(fmt::format("{}: expected an object with \"role\" and \"content\", got {}",
                                 where, m.type_name()));
    }
    auto role = m.find("role");
    if (role == m.end()) return Invalid(where + ".role: missing");
    if (!role->is_string()) {
      return Invalid(fmt::format("{}.role: expected a string, got {}", where, role->type_name()));
    }
    const std::string r = role->get<std::string>();
    if (std::find(std::begin(kRoles), std::end(kRoles), r) == std::end(kRoles)) {
      return Invalid(
          fmt::format("{}.role: unknown role {} (expected system, user, assistant or "
                      "tool)",
                      where, Quote(r)));
    }
    auto content = m.find("content");
    if (content == m.end()) {
      auto calls = m.find("tool_calls");
      if (calls == m.end() || calls->is_null()) {
        return Invalid(where + ".content: missing (a string, or null with tool_calls)");
      }
    } else if (!content->is_string() && !content->is_null()) {
      return Invalid(fmt::format("{}.content: expected a string or null, got {}", where,
                                 content->type_name()));
    }
    SLIME_ASSIGN_OR_RETURN(std::optional<bool> flag, ReadLossFlag(m, where));
    trained[i] = flag.value_or(r == "assistant");
  }
  return trained;
}

// Renders prefixes of one conversation with the tokenizer's chat template.
class Renderer {
 public:
  Renderer(const OJson& messages, const OJson& tools, const tokenizer::Tokenizer& tok,
           const tokenizer::ChatTemplateOptions& base)
      : messages_(messages), tok_(tok), options_(base) {
    options_.tools = tools;
  }

  // messages[0..count) (count >= 1), with or without the generation prompt.
  StatusOr<std::string> Render(size_t count, bool generation_prompt) {
    OJson prefix = OJson::array();
    for (size_t i = 0; i < count; ++i) prefix.push_back(messages_[i]);
    return Apply(prefix, generation_prompt);
  }

  // messages[0..i] with the content of message i replaced by `content`.
  StatusOr<std::string> RenderProbe(size_t i, const std::string& content) {
    OJson prefix = OJson::array();
    for (size_t k = 0; k <= i; ++k) prefix.push_back(messages_[k]);
    prefix[i]["content"] = content;
    return Apply(prefix, false);
  }

  const OJson& message(size_t i) const { return messages_[i]; }

 private:
  StatusOr<std::string> Apply(const OJson& prefix, bool generation_prompt) {
    options_.add_generation_prompt = generation_prompt;
    return tok_.ApplyChatTemplate(prefix, options_);
  }

  const OJson& messages_;
  const tokenizer::Tokenizer& tok_;
  tokenizer::ChatTemplateOptions options_;
};

// Where the content of trained message i starts in `text` (the rendering of messages[0..i]),
// i.e. the end of its header; at least `lower_bound` (where the message's rendering starts,
// when known).
StatusOr<size_t> HeaderEnd(Renderer& r, size_t i, const std::string& text, size_t lower_bound,
                           const std::string& key) {
  const std::string where = fmt::format("{}[{}]", key, i);
  size_t end = 0;
  if (r.message(i).at("role") == "assistant") {
    if (i == 0) {
      return Invalid(where +
                     ": a trained assistant message needs a message before it (the "
                     "generation prompt that precedes its turn is rendered from them); "
                     "set \"loss\": false or start with a user turn");
    }
    SLIME_ASSIGN_OR_RETURN(std::string prompt, r.Render(i, /*generation_prompt=*/true));
    if (!text.starts_with(prompt)) {
      const size_t common = CommonPrefix(text, prompt);
      return Invalid(fmt::format(
          "{}: the rendered turn does not start with the template's generation prompt (it "
          "continues {} where the prompt continues {}); e.g. reasoning content in a turn while "
          "enable_thinking is false",
          where, Quote(std::string_view(text).substr(common)),
          Quote(std::string_view(prompt).substr(common))));
    }
    end = prompt.size();
  } else {
    // Two probes that differ in their first character: at least one of them differs from the
    // rendered content right where it starts, so the shorter common prefix ends there.
    SLIME_ASSIGN_OR_RETURN(std::string a, r.RenderProbe(i, "\x01"));
    SLIME_ASSIGN_OR_RETURN(std::string b, r.RenderProbe(i, "\x02"));
    end = std::min(CommonPrefix(text, a), CommonPrefix(text, b));
  }
  if (end < lower_bound) {
    return Invalid(
        fmt::format("{}: cannot locate the header of the message (its rendering "
                    "changes text before it)",
                    where));
  }
  return end;
}

// A span of the rendered text, tokenized on its own.
struct Piece {
  size_t begin = 0;
  size_t end = 0;
  bool trained = false;
  size_t message = 0;  // index of the message the span belongs to
};

// Tokenizes `pieces` of `text` one by one and checks the result against the whole text.
StatusOr<SftSample> BuildSample(const std::string& text, const std::vector<Piece>& pieces,
                                const tokenizer::Tokenizer& tok, const SftDatasetOptions& options,
                                const std::string& key, bool* drifted) {
  SftSample s;
  std::vector<size_t> piece_message;  // [T] message index of each token
  for (const Piece& p : pieces) {
    const std::vector<int32_t> ids =
        tok.Encode(std::string_view(text).substr(p.begin, p.end - p.begin));
    size_t trained_end = 0;
    if (p.trained) {
      // Trained up to and including the last special token (the end-of-turn token).
      trained_end = ids.size();
      for (size_t k = ids.size(); k-- > 0;) {
        if (tok.IsSpecial(ids[k])) {
          trained_end = k + 1;
          break;
        }
      }
    }
    for (size_t k = 0; k < ids.size(); ++k) {
      s.tokens.push_back(ids[k]);
      s.loss_mask.push_back(k < trained_end ? 1 : 0);
      piece_message.push_back(p.message);
    }
  }
  if (!s.loss_mask.empty()) s.loss_mask[0] = 0;
  const std::vector<int32_t> whole = tok.Encode(text);
  if (whole != s.tokens) {
    size_t k = 0;
    while (k < whole.size() && k < s.tokens.size() && whole[k] == s.tokens[k]) ++k;
    if (options.drift == SftDriftPolicy::kFail) {
      auto id = [](const std::vector<int32_t>& v, size_t k) {
        return k < v.size() ? std::to_string(v[k]) : std::string("end");
      };
      const size_t msg =
          piece_message.empty() ? 0 : piece_message[std::min(k, piece_message.size() - 1)];
      return Invalid(fmt::format(
          "{}[{}]: re-tokenization drift: tokenized piece by piece, token {} is {} where the "
          "whole conversation gives {} (a BPE merge across a message or header boundary, e.g. "
          "content starting with a newline); the drift policy keep_pieces would keep the "
          "piecewise ids",
          key, msg, k, id(s.tokens, k), id(whole, k)));
    }
    *drifted = true;
  }
  return s;
}

}  // namespace

// ---- SftSample / options ---------------------------------------------------------------------

int64_t SftSample::PromptLength() const {
  auto it = std::find(loss_mask.begin(), loss_mask.end(), 1);
  return it - loss_mask.begin();
}

int64_t SftSample::ResponseLength() const {
  return static_cast<int64_t>(tokens.size()) - PromptLength();
}

int64_t SftSample::NumTrainedTokens() const {
  return std::count(loss_mask.begin(), loss_mask.end(), 1);
}

Status SftDatasetOptions::Validate() const {
  if (messages_key.empty()) return Invalid("sft dataset: messages_key must not be empty");
  if (max_length < 0) {
    return Invalid(
        fmt::format("sft dataset: max_length must be >= 0 (0 = no limit), got {}", max_length));
  }
  if (!template_options.kwargs.is_object()) {
    return Invalid("sft dataset: chat template kwargs must be a JSON object");
  }
  if (!template_options.tools.is_null() && !template_options.tools.is_array()) {
    return Invalid("sft dataset: chat template tools must be null or a JSON array");
  }
  return absl::OkStatus();
}

// ---- TokenizeConversation --------------------------------------------------------------------

StatusOr<SftConversation> TokenizeConversation(const nlohmann::ordered_json& messages,
                                               const nlohmann::ordered_json& tools,
                                               const tokenizer::Tokenizer& tok,
                                               const SftDatasetOptions& options) {
  const std::string& key = options.messages_key;
  SLIME_ASSIGN_OR_RETURN(std::vector<bool> trained, CheckMessages(messages, key));
  const size_t n = messages.size();
  Renderer r(messages, tools, tok, options.template_options);

  SftConversation out;
  if (std::find(trained.begin(), trained.end(), true) == trained.end()) {
    // Nothing to train: the whole text, all zeros (the loader skips it).
    SLIME_ASSIGN_OR_RETURN(std::string text, r.Render(n, /*generation_prompt=*/false));
    SftSample s;
    s.tokens = tok.Encode(text);
    s.loss_mask.assign(s.tokens.size(), 0);
    out.samples.push_back(std::move(s));
    return out;
  }

  std::vector<std::string> texts(n);  // texts[i]: rendering of messages[0..i]
  for (size_t i = 0; i < n; ++i) {
    SLIME_ASSIGN_OR_RETURN(texts[i], r.Render(i + 1, /*generation_prompt=*/false));
  }
  size_t unstable_at = 0;  // first i >= 1 whose rendering does not extend texts[i - 1]
  for (size_t i = 1; i < n && unstable_at == 0; ++i) {
    if (!texts[i].starts_with(texts[i - 1])) unstable_at = i;
  }
  if (unstable_at == 0) {
    // One sample: the whole conversation, cut at message and header boundaries.
    std::vector<Piece> pieces;
    for (size_t i = 0; i < n; ++i) {
      const size_t begin = i == 0 ? 0 : texts[i - 1].size();
      const size_t end = texts[i].size();
      if (!trained[i]) {
        pieces.push_back({begin, end, false, i});
        continue;
      }
      SLIME_ASSIGN_OR_RETURN(size_t header, HeaderEnd(r, i, texts[i], begin, key));
      pieces.push_back({begin, header, false, i});
      pieces.push_back({header, end, true, i});
    }
    SLIME_ASSIGN_OR_RETURN(SftSample s,
                           BuildSample(texts[n - 1], pieces, tok, options, key, &out.drifted));
    out.samples.push_back(std::move(s));
    return out;
  }

  if (options.unstable == SftUnstablePolicy::kFail) {
    const size_t common = CommonPrefix(texts[unstable_at], texts[unstable_at - 1]);
    return Invalid(fmt::format(
        "{}[{}]: appending this message re-renders the earlier ones (the text of {}[0..{}] "
        "continues {} where, with this message, it continues {}); the unstable policy "
        "split_turns would train each turn on its own",
        key, unstable_at, key, unstable_at - 1,
        Quote(std::string_view(texts[unstable_at - 1]).substr(common)),
        Quote(std::string_view(texts[unstable_at]).substr(common))));
  }
  out.split = true;
  for (size_t i = 0; i < n; ++i) {
    if (!trained[i]) continue;
    SLIME_ASSIGN_OR_RETURN(size_t header, HeaderEnd(r, i, texts[i], 0, key));
    const std::vector<Piece> pieces = {{0, header, false, i}, {header, texts[i].size(), true, i}};
    bool drifted = false;
    SLIME_ASSIGN_OR_RETURN(SftSample s, BuildSample(texts[i], pieces, tok, options, key, &drifted));
    s.turn = static_cast<int32_t>(i);
    out.samples.push_back(std::move(s));
    out.drifted = out.drifted || drifted;
  }
  return out;
}

// ---- Loading ---------------------------------------------------------------------------------

namespace {

// Turns lines into samples and keeps the counts.
class LineReader {
 public:
  LineReader(std::string_view source, const tokenizer::Tokenizer& tok,
             const SftDatasetOptions& options)
      : source_(source), tok_(tok), options_(options) {}

  // One physical line (without '\n'); `line_no` is 1-based.
  Status Add(std::string_view line, int64_t line_no) {
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos) return absl::OkStatus();
    ++data_.stats.lines;
    StatusOr<SftConversation> conv = Convert(line);
    if (!conv.ok()) {
      const std::string error =
          fmt::format("{}:{}: {}", source_, line_no, std::string(conv.status().message()));
      if (options_.bad_line == SftBadLinePolicy::kFail) return Invalid(error);
      ++data_.stats.bad_lines;
      if (data_.stats.bad_lines <= options_.max_logged_bad_lines) {
        spdlog::warn("sft dataset: skipping bad line: {}", error);
      }
      return absl::OkStatus();
    }
    if (conv->split) ++data_.stats.split_lines;
    if (conv->drifted) ++data_.stats.drifted;
    for (SftSample& s : conv->samples) {
      s.line = line_no;
      const int64_t max = options_.max_length;
      if (max > 0 && static_cast<int64_t>(s.tokens.size()) > max) {
        if (options_.overlong == SftOverlongPolicy::kDrop) {
          ++data_.stats.overlong_dropped;
          continue;
        }
        s.tokens.resize(max);
        s.loss_mask.resize(max);
        s.truncated = true;
      }
      if (s.NumTrainedTokens() == 0) {
        ++data_.stats.no_trained_token;
        continue;
      }
      if (s.truncated) ++data_.stats.truncated;
      data_.samples.push_back(std::move(s));
    }
    return absl::OkStatus();
  }

  StatusOr<SftDataset> Finish() {
    SftDatasetStats& st = data_.stats;
    st.samples = static_cast<int64_t>(data_.samples.size());
    const std::string counts = fmt::format(
        "{} lines: {} bad, {} samples without a trained token, {} over max_length {} dropped, "
        "{} truncated, {} split into turns, {} with re-tokenization drift",
        st.lines, st.bad_lines, st.no_trained_token, st.overlong_dropped, options_.max_length,
        st.truncated, st.split_lines, st.drifted);
    if (data_.samples.empty()) {
      return Invalid(fmt::format("{}: no SFT samples ({})", source_, counts));
    }
    if (st.bad_lines + st.no_trained_token + st.overlong_dropped + st.truncated + st.split_lines +
            st.drifted >
        0) {
      spdlog::warn("sft dataset {}: {} samples from {}", source_, st.samples, counts);
    }
    return std::move(data_);
  }

 private:
  StatusOr<SftConversation> Convert(std::string_view line) const {
    OJson row;
    try {
      row = OJson::parse(line);
    } catch (const nlohmann::json::exception& e) {
      return Invalid(fmt::format("malformed JSON: {}", e.what()));
    }
    if (!row.is_object()) {
      return Invalid(fmt::format("expected a JSON object with \"{}\", got {}",
                                 options_.messages_key, row.type_name()));
    }
    auto messages = row.find(options_.messages_key);
    if (messages == row.end()) {
      return Invalid(fmt::format("missing \"{}\" (the list of {{\"role\", \"content\"}} messages)",
                                 options_.messages_key));
    }
    OJson tools = options_.template_options.tools;
    if (!options_.tools_key.empty()) {
      auto it = row.find(options_.tools_key);
      if (it != row.end() && !it->is_null()) {
        tools = *it;
        if (it->is_string()) {
          try {
            tools = OJson::parse(it->get<std::string>());
          } catch (const nlohmann::json::exception& e) {
            return Invalid(
                fmt::format("\"{}\": a string that is not JSON: {}", options_.tools_key, e.what()));
          }
        }
        if (!tools.is_array()) {
          return Invalid(fmt::format("\"{}\": expected an array of tool definitions, got {}",
                                     options_.tools_key, tools.type_name()));
        }
      }
    }
    return TokenizeConversation(*messages, tools, tok_, options_);
  }

  std::string source_;
  const tokenizer::Tokenizer& tok_;
  const SftDatasetOptions& options_;
  SftDataset data_;
};

Status CheckSetup(std::string_view source, const tokenizer::Tokenizer& tok,
                  const SftDatasetOptions& options) {
  SLIME_RETURN_IF_ERROR(options.Validate());
  if (!tok.chat_template().ok()) {
    return Invalid(fmt::format("{}: the tokenizer {} has no usable chat template: {}", source,
                               tok.source(), std::string(tok.chat_template().status().message())));
  }
  return absl::OkStatus();
}

}  // namespace

StatusOr<SftDataset> ParseSftJsonl(std::string_view text, std::string_view source,
                                   const tokenizer::Tokenizer& tok,
                                   const SftDatasetOptions& options) {
  SLIME_RETURN_IF_ERROR(CheckSetup(source, tok, options));
  LineReader reader(source, tok, options);
  int64_t line_no = 0;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    const std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    SLIME_RETURN_IF_ERROR(reader.Add(line, ++line_no));
  }
  return reader.Finish();
}

StatusOr<SftDataset> LoadSftDataset(const std::string& path, const tokenizer::Tokenizer& tok,
                                    const SftDatasetOptions& options) {
  SLIME_RETURN_IF_ERROR(CheckSetup(path, tok, options));
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        fmt::format("cannot open the SFT dataset {}: {}", path, std::strerror(errno)));
  }
  LineReader reader(path, tok, options);
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) SLIME_RETURN_IF_ERROR(reader.Add(line, ++line_no));
  if (in.bad()) return absl::DataLossError(fmt::format("error reading the SFT dataset {}", path));
  return reader.Finish();
}

// ---- EpochSampler ----------------------------------------------------------------------------

namespace {

// Uniform in [0, n), n >= 1, without modulo bias: draws below the largest multiple of n that
// fits in 2^64 are accepted.
uint64_t UniformBelow(std::mt19937_64& gen, uint64_t n) {
  const uint64_t rem = (std::numeric_limits<uint64_t>::max() % n + 1) % n;  // 2^64 mod n
  for (;;) {
    const uint64_t x = gen();
    if (rem == 0 || x < 0 - rem) return x % n;  // 0 - rem == 2^64 - rem
  }
}

}  // namespace

StatusOr<EpochSampler> EpochSampler::Create(int64_t num_samples, uint64_t seed, bool shuffle) {
  if (num_samples < 1) {
    return Invalid(fmt::format("epoch sampler: needs at least one sample, got {}", num_samples));
  }
  return EpochSampler(num_samples, seed, shuffle);
}

std::vector<int64_t> EpochSampler::EpochOrder(int64_t num_samples, uint64_t seed, int64_t epoch,
                                              bool shuffle) {
  std::vector<int64_t> order(static_cast<size_t>(std::max<int64_t>(num_samples, 0)));
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  if (!shuffle) return order;
  std::mt19937_64 gen(seed + static_cast<uint64_t>(epoch));
  for (size_t i = order.size(); i > 1; --i) {  // Fisher–Yates, from the back
    const size_t j = static_cast<size_t>(UniformBelow(gen, i));
    std::swap(order[i - 1], order[j]);
  }
  return order;
}

void EpochSampler::BuildOrder() {
  if (order_epoch_ == epoch_) return;
  order_ = EpochOrder(num_samples_, seed_, epoch_, shuffle_);
  order_epoch_ = epoch_;
}

int64_t EpochSampler::Next() {
  BuildOrder();
  const int64_t index = order_[static_cast<size_t>(offset_)];
  if (++offset_ == num_samples_) {
    ++epoch_;
    offset_ = 0;
  }
  return index;
}

std::vector<int64_t> EpochSampler::Next(int64_t count) {
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(std::max<int64_t>(count, 0)));
  for (int64_t k = 0; k < count; ++k) out.push_back(Next());
  return out;
}

Status EpochSampler::Restore(const EpochSamplerState& state) {
  if (state.epoch < 0 || state.offset < 0 || state.offset >= num_samples_) {
    return Invalid(
        fmt::format("epoch sampler: cannot restore epoch {}, offset {} (valid: epoch "
                    ">= 0, offset in [0, {}) for {} samples)",
                    state.epoch, state.offset, num_samples_, num_samples_));
  }
  epoch_ = state.epoch;
  offset_ = state.offset;
  return absl::OkStatus();
}

}  // namespace slime::data
