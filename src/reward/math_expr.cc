// LaTeX -> plain math text, and numeric equality of plain expressions (see math_expr.h).
#include "math_expr.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <vector>

namespace slime::reward::internal {
namespace {

bool IsLetter(char c) { return std::isalpha(static_cast<unsigned char>(c)) != 0; }
bool IsDigit(char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; }

// ---- LaTeX -> text -------------------------------------------------------------------------

class LatexReader {
 public:
  explicit LatexReader(std::string_view s) : s_(s) {}

  // Converts until the end, or until the '}' closing the current group (consumed).
  std::string Convert(bool in_group) {
    std::string out;
    while (pos_ < s_.size()) {
      char c = s_[pos_];
      if (c == '}') {
        ++pos_;
        if (in_group) return out;
        continue;  // a stray closing brace
      }
      if (c == '{') {
        ++pos_;
        out += Convert(/*in_group=*/true);
      } else if (c == '\\') {
        out += Macro();
      } else if (c == '$') {
        ++pos_;  // math-mode delimiters
      } else if (c == '~') {
        ++pos_;
        out += ' ';
      } else {
        out += c;
        ++pos_;
      }
    }
    return out;
  }

 private:
  // One argument: a {group}, or a single (non-space) token.
  std::string Argument() {
    while (pos_ < s_.size() && s_[pos_] == ' ') ++pos_;
    if (pos_ >= s_.size()) return "";
    if (s_[pos_] == '{') {
      ++pos_;
      return Convert(/*in_group=*/true);
    }
    if (s_[pos_] == '\\') return Macro();
    return std::string(1, s_[pos_++]);
  }

  static bool Simple(const std::string& arg) {
    if (arg.empty()) return true;
    bool all_alnum = true;
    for (char c : arg) {
      if (!IsDigit(c) && !IsLetter(c) && c != '.') all_alnum = false;
    }
    return all_alnum;
  }
  static std::string Paren(const std::string& arg) { return Simple(arg) ? arg : "(" + arg + ")"; }

  std::string Macro() {
    ++pos_;  // the backslash
    if (pos_ >= s_.size()) return "";
    if (!IsLetter(s_[pos_])) {
      char c = s_[pos_++];
      switch (c) {
        case '{':
        case '}':
        case '%':
        case '$':
        case '&':
        case '#':
        case '_':
          return std::string(1, c);
        case '\\':
          return " ";
        default:
          return "";  // \, \; \! \  and friends: spacing
      }
    }
    size_t start = pos_;
    while (pos_ < s_.size() && IsLetter(s_[pos_])) ++pos_;
    std::string name(s_.substr(start, pos_ - start));
    if (name == "frac" || name == "dfrac" || name == "tfrac" || name == "cfrac") {
      std::string num = Argument();
      std::string den = Argument();
      return " " + Paren(num) + "/" + Paren(den);
    }
    if (name == "sqrt") {
      std::string index;
      if (pos_ < s_.size() && s_[pos_] == '[') {
        size_t close = s_.find(']', pos_);
        if (close != std::string_view::npos) {
          index = LatexToText(s_.substr(pos_ + 1, close - pos_ - 1));
          pos_ = close + 1;
        }
      }
      std::string arg = Argument();
      if (!index.empty()) return "(" + arg + ")^(1/(" + index + "))";
      return "sqrt(" + arg + ")";
    }
    if (name == "text" || name == "textbf" || name == "textit" || name == "mathrm" ||
        name == "mathbf" || name == "mathit" || name == "mbox" || name == "operatorname" ||
        name == "boxed" || name == "fbox" || name == "mathsf" || name == "textrm") {
      return Argument();
    }
    if (name == "pi") return "pi";
    if (name == "infty") return "inf";
    if (name == "cdot" || name == "times" || name == "ast") return "*";
    if (name == "div") return "/";
    if (name == "cup") return "U";
    if (name == "pm") return "\xC2\xB1";        // ±
    if (name == "circ") return "\xE2\x88\x98";  // ∘
    if (name == "sin" || name == "cos" || name == "tan" || name == "log" || name == "ln" ||
        name == "exp") {
      return name;
    }
    if (name == "alpha" || name == "beta" || name == "gamma" || name == "theta" ||
        name == "lambda" || name == "mu" || name == "sigma" || name == "omega" || name == "phi" ||
        name == "delta" || name == "epsilon") {
      return name;
    }
    return "";  // \left, \right, \displaystyle, unknown macros: dropped, arguments stay
  }

  std::string_view s_;
  size_t pos_ = 0;
};

// ---- expressions ---------------------------------------------------------------------------

enum class Tok { kNum, kSym, kFunc, kPi, kOp, kLParen, kRParen, kEnd };

struct Token {
  Token(Tok t, double n = 0, char o = 0, std::string nm = "")
      : type(t), num(n), op(o), name(std::move(nm)) {}
  Tok type;
  double num;
  char op;           // kOp: + - * / ^ !; kSym: the letter
  std::string name;  // kFunc
};

const char* const kFunctions[] = {"sqrt", "sin", "cos", "tan", "log", "ln", "exp", "abs"};

bool Tokenize(std::string_view s, std::vector<Token>* out) {
  size_t i = 0;
  while (i < s.size()) {
    char c = s[i];
    if (c == ' ') {
      ++i;
    } else if (IsDigit(c) || (c == '.' && i + 1 < s.size() && IsDigit(s[i + 1]))) {
      size_t start = i;
      while (i < s.size() && (IsDigit(s[i]) || s[i] == '.')) ++i;
      std::string text(s.substr(start, i - start));
      if (text.find('.') != text.rfind('.')) return false;  // "1.2.3"
      out->push_back({Tok::kNum, std::strtod(text.c_str(), nullptr)});
    } else if (IsLetter(c)) {
      size_t start = i;
      while (i < s.size() && IsLetter(s[i])) ++i;
      std::string word(s.substr(start, i - start));
      for (char& ch : word) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      // Split a run of letters into known names and single-letter variables ("pir" -> pi r).
      size_t k = 0;
      while (k < word.size()) {
        bool matched = false;
        for (const char* f : kFunctions) {
          std::string_view fn(f);
          if (word.compare(k, fn.size(), fn) == 0) {
            out->push_back({Tok::kFunc, 0, 0, std::string(fn)});
            k += fn.size();
            matched = true;
            break;
          }
        }
        if (matched) continue;
        if (word.compare(k, 2, "pi") == 0) {
          out->push_back({Tok::kPi});
          k += 2;
          continue;
        }
        if (word.compare(k, 3, "inf") == 0 || word.compare(k, 2, "oo") == 0) return false;
        out->push_back({Tok::kSym, 0, word[k]});
        ++k;
      }
    } else if (c == '*' && i + 1 < s.size() && s[i + 1] == '*') {
      out->push_back({Tok::kOp, 0, '^'});
      i += 2;
    } else if (c == '+' || c == '-' || c == '*' || c == '/' || c == '^' || c == '!') {
      out->push_back({Tok::kOp, 0, c});
      ++i;
    } else if (c == '(' || c == '[') {
      out->push_back({Tok::kLParen});
      ++i;
    } else if (c == ')' || c == ']') {
      out->push_back({Tok::kRParen});
      ++i;
    } else {
      return false;  // '=', ',', '<', unicode symbols, ...: not an expression we evaluate
    }
  }
  out->push_back({Tok::kEnd});
  return true;
}

// Recursive-descent evaluator over the tokens. Returns nullopt on a syntax error.
class Evaluator {
 public:
  Evaluator(const std::vector<Token>& toks, const std::function<double(char)>& value_of)
      : toks_(toks), value_of_(value_of) {}

  std::optional<double> Run() {
    auto v = Expr();
    if (!v || Peek().type != Tok::kEnd) return std::nullopt;
    return v;
  }

 private:
  const Token& Peek() const { return toks_[pos_]; }
  bool IsOp(char op) const { return Peek().type == Tok::kOp && Peek().op == op; }
  bool StartsAtom() const {
    Tok t = Peek().type;
    return t == Tok::kNum || t == Tok::kSym || t == Tok::kFunc || t == Tok::kPi ||
           t == Tok::kLParen;
  }

  std::optional<double> Expr() {
    if (++depth_ > 200) return std::nullopt;
    auto v = Term();
    while (v && (IsOp('+') || IsOp('-'))) {
      char op = toks_[pos_++].op;
      auto r = Term();
      if (!r) return std::nullopt;
      v = op == '+' ? *v + *r : *v - *r;
    }
    --depth_;
    return v;
  }

  std::optional<double> Term() {
    auto v = Factor();
    while (v) {
      if (IsOp('*') || IsOp('/')) {
        char op = toks_[pos_++].op;
        auto r = Factor();
        if (!r) return std::nullopt;
        v = op == '*' ? *v * *r : *v / *r;
      } else if (StartsAtom()) {  // implicit multiplication: 2x, 2sqrt(3), (a)(b)
        auto r = Power();
        if (!r) return std::nullopt;
        v = *v * *r;
      } else {
        break;
      }
    }
    return v;
  }

  std::optional<double> Factor() {
    if (IsOp('-') || IsOp('+')) {
      char op = toks_[pos_++].op;
      if (++depth_ > 200) return std::nullopt;
      auto v = Factor();
      --depth_;
      if (!v) return std::nullopt;
      return op == '-' ? -*v : *v;
    }
    return Power();
  }

  std::optional<double> Power() {
    auto base = Postfix();
    if (!base) return std::nullopt;
    if (IsOp('^')) {
      ++pos_;
      if (++depth_ > 200) return std::nullopt;
      auto exponent = Factor();  // right-associative; allows 2^-1
      --depth_;
      if (!exponent) return std::nullopt;
      return std::pow(*base, *exponent);
    }
    return base;
  }

  std::optional<double> Postfix() {
    auto v = Primary();
    while (v && IsOp('!')) {
      ++pos_;
      if (*v < 0 || *v > 170 || *v != std::floor(*v)) return std::nan("");
      v = std::tgamma(*v + 1);
    }
    return v;
  }

  std::optional<double> Primary() {
    const Token& t = Peek();
    switch (t.type) {
      case Tok::kNum:
        ++pos_;
        return t.num;
      case Tok::kSym:
        ++pos_;
        return value_of_(t.op);
      case Tok::kPi:
        ++pos_;
        return M_PI;
      case Tok::kLParen: {
        ++pos_;
        auto v = Expr();
        if (!v || Peek().type != Tok::kRParen) return std::nullopt;
        ++pos_;
        return v;
      }
      case Tok::kFunc: {
        std::string name = t.name;
        ++pos_;
        if (++depth_ > 200) return std::nullopt;
        auto arg = Postfix();
        --depth_;
        if (!arg) return std::nullopt;
        if (name == "sqrt") return std::sqrt(*arg);
        if (name == "sin") return std::sin(*arg);
        if (name == "cos") return std::cos(*arg);
        if (name == "tan") return std::tan(*arg);
        if (name == "log" || name == "ln") return std::log(*arg);
        if (name == "exp") return std::exp(*arg);
        return std::fabs(*arg);
      }
      default:
        return std::nullopt;
    }
  }

  const std::vector<Token>& toks_;
  const std::function<double(char)>& value_of_;
  size_t pos_ = 0;
  int depth_ = 0;
};

// Values of the variables at evaluation point `point` (fixed, irrational-looking numbers so that
// different expressions rarely agree by accident).
double PointValue(int point, char letter) {
  static const double kBase[] = {0.7390851332, 1.6180339887, 2.2360679775};
  int k = (letter - 'a' + 1) % 26;
  return kBase[point % 3] + 0.1376 * k + 0.0419 * k * (point + 1);
}

}  // namespace

std::string LatexToText(std::string_view latex) {
  LatexReader reader(latex);
  std::string out = reader.Convert(/*in_group=*/false);
  // Trim like pylatexenc's caller does.
  size_t b = out.find_first_not_of(" \t\n\r");
  if (b == std::string::npos) return "";
  size_t e = out.find_last_not_of(" \t\n\r");
  return out.substr(b, e - b + 1);
}

std::optional<double> EvaluateExpression(std::string_view expr,
                                         const std::function<double(char)>& value_of) {
  std::vector<Token> toks;
  if (!Tokenize(expr, &toks)) return std::nullopt;
  return Evaluator(toks, value_of).Run();
}

bool ExpressionsEqual(std::string_view a, std::string_view b) {
  bool has_letters = false;
  for (char c : std::string(a) + std::string(b)) has_letters |= IsLetter(c);
  int points = has_letters ? 3 : 1;
  int compared = 0;
  for (int p = 0; p < points; ++p) {
    auto value_of = [p](char letter) { return PointValue(p, letter); };
    auto va = EvaluateExpression(a, value_of);
    auto vb = EvaluateExpression(b, value_of);
    if (!va || !vb) return false;
    if (!std::isfinite(*va) || !std::isfinite(*vb)) continue;  // a pole at this point
    double scale = std::max({1.0, std::fabs(*va), std::fabs(*vb)});
    if (std::fabs(*va - *vb) > 1e-11 * scale) return false;
    ++compared;
  }
  return compared > 0;
}

}  // namespace slime::reward::internal
