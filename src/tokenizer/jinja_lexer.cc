// The lexer of the Jinja interpreter (jinja_internal.h): template text, `{{ }}` / `{% %}` tags
// and their tokens, comments dropped. Whitespace control as transformers configures Jinja:
//   * `-` after a tag's opening strips all whitespace before it, `-` before its closing all
//     whitespace after it;
//   * trim_blocks: the first newline after a `%}` or `#}` is dropped;
//   * lstrip_blocks: spaces and tabs between the start of a line and a `{%` or `{#` are
//     dropped (not when the tag opens with `{%+`).
#include <cctype>

#include <fmt/format.h>

#include "jinja_internal.h"

namespace slime::tokenizer::jinja {
namespace {

constexpr std::string_view kOps2[] = {"==", "!=", "<=", ">=", "//", "**"};
constexpr std::string_view kOps1 = "+-*/%~|.,:()[]{}<>=";

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

class Lexer {
 public:
  explicit Lexer(std::string_view src) : src_(src) {}

  std::vector<Token> Run() {
    bool strip_next = false;    // the previous tag ended with `-`
    bool trim_newline = false;  // the previous tag was a block or comment (trim_blocks)
    while (pos_ < src_.size()) {
      const size_t at = FindTagStart(pos_);
      std::string text(src_.substr(pos_, at - pos_));
      if (trim_newline) {
        if (text.starts_with("\r\n")) {
          text.erase(0, 2);
        } else if (text.starts_with("\n")) {
          text.erase(0, 1);
        }
      }
      if (strip_next) {
        size_t n = 0;
        while (n < text.size() && IsSpace(text[n])) ++n;
        text.erase(0, n);
      }
      if (at < src_.size()) StripBeforeTag(at, &text);
      const int text_line = line_;
      Advance(at);
      if (!text.empty()) tokens_.push_back(Token{Tok::kText, std::move(text), text_line});
      if (at >= src_.size()) break;
      const char kind = src_[at + 1];
      Advance(at + 2);
      if (pos_ < src_.size() && (src_[pos_] == '-' || src_[pos_] == '+')) Advance(pos_ + 1);
      if (kind == '#') {
        LexComment(&strip_next);
        trim_newline = true;
        continue;
      }
      if (kind == '%' && LexRaw(&strip_next)) {
        trim_newline = true;
        continue;
      }
      tokens_.push_back(Token{kind == '{' ? Tok::kVarBegin : Tok::kBlockBegin, "", line_});
      strip_next = LexTag(kind == '{' ? '}' : '%');
      trim_newline = kind == '%';
    }
    tokens_.push_back(Token{Tok::kEnd, "", line_});
    return std::move(tokens_);
  }

 private:
  size_t FindTagStart(size_t from) const {
    for (size_t p = src_.find('{', from); p != std::string_view::npos; p = src_.find('{', p + 1)) {
      if (p + 1 < src_.size() && (src_[p + 1] == '{' || src_[p + 1] == '%' || src_[p + 1] == '#')) {
        return p;
      }
    }
    return src_.size();
  }

  // `{%-`: strip all whitespace before; lstrip_blocks for `{%` and `{#` at a line's start.
  void StripBeforeTag(size_t at, std::string* text) const {
    const char kind = src_[at + 1];
    const char modifier = at + 2 < src_.size() ? src_[at + 2] : '\0';
    if (modifier == '-') {
      while (!text->empty() && IsSpace(text->back())) text->pop_back();
      return;
    }
    if (kind == '{' || modifier == '+') return;
    size_t start = at;
    while (start > 0 && (src_[start - 1] == ' ' || src_[start - 1] == '\t')) --start;
    if (start != 0 && src_[start - 1] != '\n') return;
    size_t n = at - start;
    while (n > 0 && !text->empty() && (text->back() == ' ' || text->back() == '\t')) {
      text->pop_back();
      --n;
    }
  }

  void Advance(size_t to) {
    for (; pos_ < to && pos_ < src_.size(); ++pos_) {
      if (src_[pos_] == '\n') ++line_;
    }
  }

  void LexComment(bool* strip_next) {
    const int start_line = line_;
    const size_t end = src_.find("#}", pos_);
    if (end == std::string_view::npos) Fail(start_line, "unclosed comment '{#'");
    *strip_next = end > pos_ && src_[end - 1] == '-';
    Advance(end + 2);
  }

  // `{% raw %}...{% endraw %}` (the opening `{%` already consumed): its body becomes text as
  // written. Returns false, consuming nothing, when the tag is not `raw`.
  bool LexRaw(bool* strip_next) {
    size_t p = pos_;
    auto skip_spaces = [&] {
      while (p < src_.size() && IsSpace(src_[p])) ++p;
    };
    skip_spaces();
    if (src_.substr(p, 3) != "raw") return false;
    p += 3;
    skip_spaces();
    const bool strip_body_start = p < src_.size() && src_[p] == '-';
    if (strip_body_start) ++p;
    if (src_.substr(p, 2) != "%}") return false;
    const int start_line = line_;
    const size_t body = p + 2;
    for (size_t at = src_.find("{%", body); at != std::string_view::npos; at = src_.find("{%", at + 2)) {
      size_t q = at + 2;
      const bool strip_body_end = q < src_.size() && src_[q] == '-';
      if (strip_body_end) ++q;
      while (q < src_.size() && IsSpace(src_[q])) ++q;
      if (src_.substr(q, 6) != "endraw") continue;
      q += 6;
      while (q < src_.size() && IsSpace(src_[q])) ++q;
      const bool strip_after = q < src_.size() && src_[q] == '-';
      if (strip_after) ++q;
      if (src_.substr(q, 2) != "%}") continue;
      std::string text(src_.substr(body, at - body));
      if (strip_body_start) {
        size_t n = 0;
        while (n < text.size() && IsSpace(text[n])) ++n;
        text.erase(0, n);
      }
      if (strip_body_end) {
        while (!text.empty() && IsSpace(text.back())) text.pop_back();
      }
      if (!text.empty()) tokens_.push_back(Token{Tok::kText, std::move(text), start_line});
      *strip_next = strip_after;
      Advance(q + 2);
      return true;
    }
    Fail(start_line, "'raw' is never closed (expected 'endraw')");
  }

  // The tokens of one tag up to its closing `}}` / `%}`; returns whether it closed with `-`.
  bool LexTag(char closer) {
    const int start_line = line_;
    int depth = 0;  // open brackets: a `}}` inside a dict literal does not close the tag
    while (true) {
      while (pos_ < src_.size() && IsSpace(src_[pos_])) Advance(pos_ + 1);
      if (pos_ >= src_.size()) {
        Fail(start_line, closer == '}' ? "unclosed '{{'" : "unclosed '{%'");
      }
      std::string_view rest = src_.substr(pos_);
      const std::string close = std::string(1, closer) + "}";
      if (depth == 0 || closer == '%') {
        if (rest.starts_with("-" + close) || rest.starts_with("+" + close)) {
          tokens_.push_back(Token{closer == '}' ? Tok::kVarEnd : Tok::kBlockEnd, "", line_});
          const bool strip = rest[0] == '-';
          Advance(pos_ + 3);
          return strip;
        }
        if (rest.starts_with(close) && depth == 0) {
          tokens_.push_back(Token{closer == '}' ? Tok::kVarEnd : Tok::kBlockEnd, "", line_});
          Advance(pos_ + 2);
          return false;
        }
      }
      const char c = rest[0];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t n = 1;
        while (n < rest.size() && (std::isalnum(static_cast<unsigned char>(rest[n])) || rest[n] == '_')) ++n;
        tokens_.push_back(Token{Tok::kName, std::string(rest.substr(0, n)), line_});
        Advance(pos_ + n);
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        LexNumber(rest);
      } else if (c == '\'' || c == '"') {
        LexString(rest);
      } else {
        std::string op;
        for (std::string_view two : kOps2) {
          if (rest.starts_with(two)) op = two;
        }
        if (op.empty() && kOps1.find(c) != std::string_view::npos) op = std::string(1, c);
        if (op.empty()) Fail(line_, fmt::format("unexpected character '{}'", c));
        if (op == "(" || op == "[" || op == "{") ++depth;
        if ((op == ")" || op == "]" || op == "}") && depth > 0) --depth;
        tokens_.push_back(Token{Tok::kOp, op, line_});
        Advance(pos_ + op.size());
      }
    }
  }

  void LexNumber(std::string_view rest) {
    size_t n = 0;
    while (n < rest.size() && (std::isdigit(static_cast<unsigned char>(rest[n])) || rest[n] == '_')) ++n;
    bool is_float = false;
    if (n + 1 < rest.size() && rest[n] == '.' && std::isdigit(static_cast<unsigned char>(rest[n + 1]))) {
      is_float = true;
      ++n;
      while (n < rest.size() && std::isdigit(static_cast<unsigned char>(rest[n]))) ++n;
    }
    if (n < rest.size() && (rest[n] == 'e' || rest[n] == 'E')) {
      size_t m = n + 1;
      if (m < rest.size() && (rest[m] == '+' || rest[m] == '-')) ++m;
      if (m < rest.size() && std::isdigit(static_cast<unsigned char>(rest[m]))) {
        is_float = true;
        n = m;
        while (n < rest.size() && std::isdigit(static_cast<unsigned char>(rest[n]))) ++n;
      }
    }
    std::string digits;
    for (char ch : rest.substr(0, n)) {
      if (ch != '_') digits += ch;
    }
    Token t{is_float ? Tok::kFloat : Tok::kInt, digits, line_};
    if (is_float) {
      t.float_value = std::stod(digits);
    } else {
      try {
        t.int_value = std::stoll(digits);
      } catch (...) {
        Fail(line_, fmt::format("integer literal {} is too large", digits));
      }
    }
    tokens_.push_back(std::move(t));
    Advance(pos_ + n);
  }

  void LexString(std::string_view rest) {
    const char quote = rest[0];
    std::string value;
    size_t n = 1;
    for (; n < rest.size() && rest[n] != quote; ++n) {
      if (rest[n] != '\\' || n + 1 >= rest.size()) {
        value += rest[n];
        continue;
      }
      const char e = rest[++n];
      switch (e) {
        case 'n': value += '\n'; break;
        case 't': value += '\t'; break;
        case 'r': value += '\r'; break;
        case '0': value += '\0'; break;
        case 'b': value += '\b'; break;
        case 'f': value += '\f'; break;
        case '\\': value += '\\'; break;
        case '\'': value += '\''; break;
        case '"': value += '"'; break;
        case '\n': break;  // a line continuation
        case 'u':
        case 'x': {
          const size_t len = e == 'u' ? 4 : 2;
          if (n + len >= rest.size()) Fail(line_, "truncated escape in string literal");
          const uint32_t cp = std::stoul(std::string(rest.substr(n + 1, len)), nullptr, 16);
          AppendUtf8(cp, &value);
          n += len;
          break;
        }
        default: value += '\\'; value += e; break;  // Python keeps unknown escapes
      }
    }
    if (n >= rest.size()) Fail(line_, "unterminated string literal");
    tokens_.push_back(Token{Tok::kString, std::move(value), line_});
    Advance(pos_ + n + 1);
  }

  static void AppendUtf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xc0 | (cp >> 6)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else {
      out->push_back(static_cast<char>(0xe0 | (cp >> 12)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    }
  }

  std::string_view src_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> Lex(std::string_view source) { return Lexer(source).Run(); }

}  // namespace slime::tokenizer::jinja
