// Math rule rewards: boxed extraction, the mathd and PRM800K normalisations, the grader, and the
// math / deepscaler rewards (rules.h; the behaviour follows slime's rm_hub/math_utils.py).
#include <cmath>
#include <cstdlib>
#include <regex>
#include <string>
#include <vector>

#include "fmt/format.h"
#include "math_expr.h"
#include "slime/reward/rules.h"

namespace slime::reward {
namespace {

void ReplaceAll(std::string* s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  size_t pos = 0;
  while ((pos = s->find(from, pos)) != std::string::npos) {
    s->replace(pos, from.size(), to);
    pos += to.size();
  }
}

std::vector<std::string> Split(const std::string& s, std::string_view sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t pos = s.find(sep, start);
    if (pos == std::string::npos) {
      parts.push_back(s.substr(start));
      return parts;
    }
    parts.push_back(s.substr(start, pos - start));
    start = pos + sep.size();
  }
}

std::string Trim(std::string_view s) {
  const char* ws = " \t\n\r\f\v";
  size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return "";
  size_t e = s.find_last_not_of(ws);
  return std::string(s.substr(b, e - b + 1));
}

// "^\\text{(.+?)}$" on the whole answer: the content, else nullopt.
std::optional<std::string> EnclosingText(const std::string& s) {
  const std::string_view left = "\\text{";
  if (s.size() <= left.size() + 1 || s.compare(0, left.size(), left) != 0 || s.back() != '}') {
    return std::nullopt;
  }
  std::string inner = s.substr(left.size(), s.size() - left.size() - 1);
  if (inner.find('\n') != std::string::npos) return std::nullopt;
  return inner;
}

// Python's float(): the whole (trimmed) string must be a decimal number.
std::optional<double> ParseFloat(std::string_view text) {
  std::string s = Trim(text);
  if (s.empty() || s.find_first_of("xXpP") != std::string::npos) return std::nullopt;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size()) return std::nullopt;
  return v;
}

bool IsIntValued(double x) { return std::isfinite(x) && std::fabs(x - std::round(x)) <= 1e-7; }

std::string IntString(double x) { return fmt::format("{:.0f}", x); }

// Hendrycks' _strip_string; nullopt where the Python raises (the caller then keeps the answer).
std::optional<std::string> StripString(std::string s) {
  ReplaceAll(&s, "\n", "");
  ReplaceAll(&s, "\\!", "");
  ReplaceAll(&s, "\\\\", "\\");
  ReplaceAll(&s, "tfrac", "frac");
  ReplaceAll(&s, "dfrac", "frac");
  ReplaceAll(&s, "\\left", "");
  ReplaceAll(&s, "\\right", "");
  ReplaceAll(&s, "^{\\circ}", "");
  ReplaceAll(&s, "^\\circ", "");
  ReplaceAll(&s, "\\$", "");
  // Units on the right: "\text{ " only introduces units.
  if (s.find("\\text{ ") != std::string::npos) {
    auto parts = Split(s, "\\text{ ");
    if (parts.size() != 2) return std::nullopt;
    s = parts[0];
  }
  ReplaceAll(&s, "\\%", "");
  ReplaceAll(&s, " .", " 0.");
  ReplaceAll(&s, "{.", "{0.");
  if (s.empty()) return s;
  if (s[0] == '.') s = "0" + s;
  // "k = 5" -> "5" when the left side is at most two characters.
  {
    auto parts = Split(s, "=");
    if (parts.size() == 2 && parts[0].size() <= 2) s = parts[1];
  }
  // \sqrt3 -> \sqrt{3}
  if (s.find("\\sqrt") != std::string::npos) {
    auto parts = Split(s, "\\sqrt");
    std::string fixed = parts[0];
    for (size_t i = 1; i < parts.size(); ++i) {
      const std::string& p = parts[i];
      if (p.empty()) return std::nullopt;
      if (p[0] != '{') {
        fixed += "\\sqrt{" + p.substr(0, 1) + "}" + p.substr(1);
      } else {
        fixed += "\\sqrt" + p;
      }
    }
    s = fixed;
  }
  ReplaceAll(&s, " ", "");
  // \frac12 -> \frac{1}{2}, \frac1{72} -> \frac{1}{72}
  {
    auto parts = Split(s, "\\frac");
    std::string fixed = parts[0];
    bool give_up = false;
    for (size_t i = 1; i < parts.size() && !give_up; ++i) {
      const std::string& p = parts[i];
      fixed += "\\frac";
      if (p.empty()) return std::nullopt;
      if (p[0] == '{') {
        fixed += p;
        continue;
      }
      if (p.size() < 2) {
        give_up = true;  // Python returns the string as it was before this step
        break;
      }
      char a = p[0], b = p[1];
      if (b != '{') {
        fixed += std::string("{") + a + "}{" + b + "}" + p.substr(2);
      } else {
        fixed += std::string("{") + a + "}" + b + p.substr(2);
      }
    }
    if (!give_up) s = fixed;
  }
  if (s == "0.5") s = "\\frac{1}{2}";
  // "a/b" with canonical integers -> \frac{a}{b}
  {
    auto parts = Split(s, "/");
    static const std::regex kInt("^-?(0|[1-9][0-9]*)$");
    if (parts.size() == 2 && std::regex_match(parts[0], kInt) && std::regex_match(parts[1], kInt) &&
        parts[0] != "-0" && parts[1] != "-0") {
      s = "\\frac{" + parts[0] + "}{" + parts[1] + "}";
    }
  }
  return s;
}

std::string StripProperlyFormattedCommas(std::string expr) {
  static const std::regex kComma(R"((\d)(,)(\d\d\d)($|\D))");
  while (true) {
    std::string next = std::regex_replace(expr, kComma, "$1$3$4");
    if (next == expr) return next;
    expr = next;
  }
}

bool StrIsInt(const std::string& x) {
  auto v = ParseFloat(StripProperlyFormattedCommas(x));
  return v && IsIntValued(*v);
}

bool IsFrac(const std::string& expr) {
  static const std::regex kFrac("^-?[0-9]+.?/0*[1-9][0-9]*.?$");
  return std::regex_match(expr, kFrac);
}

std::vector<std::string> SplitTuple(std::string expr) {
  expr = StripProperlyFormattedCommas(expr);
  if (expr.empty()) return {};
  const std::string_view kTupleChars = "()[]";
  if (expr.size() > 2 && kTupleChars.find(expr.front()) != std::string_view::npos &&
      kTupleChars.find(expr.back()) != std::string_view::npos &&
      expr.substr(1, expr.size() - 2).find_first_of("()[]") == std::string::npos) {
    std::vector<std::string> elems;
    for (const auto& e : Split(expr.substr(1, expr.size() - 2), ",")) elems.push_back(Trim(e));
    return elems;
  }
  return {expr};
}

// sympy would hang or misread these; slime does not try (should_allow_eval).
bool ShouldAllowEval(const std::string& expr) {
  std::string letters_only = expr;
  ReplaceAll(&letters_only, "sqrt", "");
  ReplaceAll(&letters_only, "frac", "");
  bool seen[256] = {};
  int unknown = 0;
  for (unsigned char c : letters_only) {
    if (std::isalpha(c) && !seen[c]) {
      seen[c] = true;
      ++unknown;
    }
  }
  if (unknown > 2) return false;
  if (expr.find("^{") != std::string::npos || expr.find("^(") != std::string::npos) return false;
  static const std::regex kBad1(R"(\^[0-9]+\^)");
  static const std::regex kBad2(R"(\^[0-9][0-9]+)");
  return !std::regex_search(expr, kBad1) && !std::regex_search(expr, kBad2);
}

bool AreEqualUnderEvaluation(const std::string& truth, const std::string& given) {
  if (!ShouldAllowEval("(" + truth + ")-(" + given + ")")) return false;
  return internal::ExpressionsEqual(truth, given);
}

std::optional<std::string> ExtractAnswer(std::string_view passage) {
  if (passage.find("\\boxed") == std::string_view::npos &&
      passage.find("\\fbox") == std::string_view::npos) {
    return std::nullopt;
  }
  return ExtractBoxedAnswer(passage);
}

}  // namespace

std::optional<std::string> LastBoxedOnly(std::string_view text) {
  size_t idx = text.rfind("\\boxed");
  if (idx == std::string_view::npos) idx = text.rfind("\\fbox");
  if (idx == std::string_view::npos) return std::nullopt;
  int open = 0;
  for (size_t i = idx; i < text.size(); ++i) {
    if (text[i] == '{') ++open;
    if (text[i] == '}') {
      --open;
      if (open == 0) return std::string(text.substr(idx, i - idx + 1));
    }
  }
  return std::nullopt;
}

std::optional<std::string> ExtractBoxedAnswer(std::string_view text) {
  auto boxed = LastBoxedOnly(text);
  if (!boxed) return std::nullopt;
  for (std::string_view left : {std::string_view("\\boxed{"), std::string_view("\\fbox{")}) {
    if (boxed->compare(0, left.size(), left) == 0 && boxed->back() == '}') {
      return boxed->substr(left.size(), boxed->size() - left.size() - 1);
    }
  }
  return std::nullopt;  // e.g. "\boxed 5}" or "\boxedanswer{...}"
}

std::string MathdNormalize(std::string_view answer) {
  std::string s = Trim(answer);
  if (auto inner = EnclosingText(s)) s = Trim(*inner);
  auto stripped = StripString(s);
  return stripped ? *stripped : s;
}

bool GradeMathd(std::string_view given, std::string_view ground_truth) {
  return MathdNormalize(ground_truth) == MathdNormalize(given);
}

std::string SympyNormalize(std::string_view answer) {
  std::string expr(answer);
  if (auto inner = EnclosingText(expr)) expr = *inner;
  ReplaceAll(&expr, "\\%", "%");
  ReplaceAll(&expr, "\\$", "$");
  ReplaceAll(&expr, "$", "");
  ReplaceAll(&expr, "%", "");
  ReplaceAll(&expr, " or ", " , ");
  ReplaceAll(&expr, " and ", " , ");
  ReplaceAll(&expr, "million", "*10^6");
  ReplaceAll(&expr, "billion", "*10^9");
  ReplaceAll(&expr, "trillion", "*10^12");
  static const std::vector<std::regex> kUnits = [] {
    std::vector<std::regex> units;
    for (const char* unit :
         {"degree", "cm", "centimeter", "meter", "mile", "second", "minute", "hour", "day", "week",
          "month", "year", "foot", "feet", "inch", "yard"}) {
      units.emplace_back(std::string(unit) + R"((es)?(s)? *(\^[0-9]+)?)");
    }
    return units;
  }();
  for (const auto& unit : kUnits) expr = std::regex_replace(expr, unit, "");
  static const std::regex kCirc(R"(\^ *\\circ)");
  expr = std::regex_replace(expr, kCirc, "");
  if (!expr.empty() && expr.front() == '{' && expr.back() == '}') {
    expr = expr.substr(1, expr.size() - 2);
  }
  static const std::regex kThinSpace(R"(,\\! *)");
  expr = std::regex_replace(expr, kThinSpace, "");
  if (auto v = ParseFloat(expr); v && IsIntValued(*v)) expr = IntString(std::round(*v));
  if (expr.find('\\') != std::string::npos) {
    ReplaceAll(&expr, "\\tfrac", "\\frac");
    ReplaceAll(&expr, "\\dfrac", "\\frac");
    expr = internal::LatexToText(expr);
  }
  static const std::regex kMinus("- *");
  expr = std::regex_replace(expr, kMinus, "-");
  static const std::regex kMixed("([0-9]) +([0-9])");  // "7 3/4" -> "7+3/4"
  expr = std::regex_replace(expr, kMixed, "$1+$2");
  ReplaceAll(&expr, " ", "");
  ReplaceAll(&expr, "{", "");
  ReplaceAll(&expr, "}", "");
  for (char& c : expr) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (StrIsInt(expr)) {
    std::string no_commas = expr;
    ReplaceAll(&no_commas, ",", "");
    if (auto v = ParseFloat(no_commas)) expr = IntString(std::trunc(*v));
  }
  return expr;
}

bool GradeSympy(std::string_view given, std::string_view ground_truth) {
  std::string truth = SympyNormalize(ground_truth);
  std::string answer = SympyNormalize(given);
  if (truth == answer) return true;
  if (answer.empty()) return false;
  auto truth_elems = SplitTuple(truth);
  auto given_elems = SplitTuple(answer);
  if (truth_elems.size() > 1 &&
      (truth.front() != answer.front() || truth.back() != answer.back())) {
    return false;  // (a, b) vs [a, b]: open vs closed interval
  }
  if (truth_elems.size() != given_elems.size()) return false;
  for (size_t i = 0; i < truth_elems.size(); ++i) {
    const std::string& t = truth_elems[i];
    const std::string& g = given_elems[i];
    bool ok;
    if (IsFrac(t) && IsFrac(g)) {
      ok = t == g;  // unreduced fractions are not accepted
    } else if (StrIsInt(t) != StrIsInt(g)) {
      ok = false;  // an integer answer must be given as an integer
    } else {
      ok = AreEqualUnderEvaluation(t, g);
    }
    if (!ok) return false;
  }
  return true;
}

double MathReward(std::string_view response, std::string_view label) {
  if (label.empty()) return 0;
  std::string truth(label);
  if (truth.find("\\boxed") != std::string::npos) {
    auto inner = ExtractAnswer(truth);
    if (!inner) return 0;
    truth = *inner;
  }
  auto given = ExtractAnswer(response);
  if (!given) return 0;
  return GradeMathd(*given, truth) || GradeSympy(*given, truth) ? 1 : 0;
}

double DeepscalerReward(std::string_view response, std::string_view label) {
  std::string_view solution;
  if (size_t pos = response.rfind("</think>"); pos != std::string_view::npos) {
    solution = response.substr(pos + 8);
  } else if (size_t first = response.find("###Response"); first != std::string_view::npos) {
    solution = response.substr(first + 11);
    size_t second = solution.find("###Response");
    if (second != std::string_view::npos) solution = solution.substr(0, second);
  } else {
    return 0;
  }
  auto given = ExtractAnswer(solution);
  if (!given || label.empty()) return 0;
  std::string truth(label);
  if (truth.find("\\boxed") != std::string::npos) {
    auto inner = ExtractAnswer(truth);
    if (!inner) return 0;
    truth = *inner;
  }
  return GradeMathd(*given, truth) || GradeSympy(*given, truth) ? 1 : 0;
}

}  // namespace slime::reward
