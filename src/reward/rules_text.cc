// Text rule rewards: dapo, f1, gpqa, exact_match (rules.h; behaviour after slime's rm_hub).
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "fmt/format.h"
#include "slime/reward/rules.h"

namespace slime::reward {
namespace {

void ReplaceAll(std::string* s, std::string_view from, std::string_view to) {
  size_t pos = 0;
  while ((pos = s->find(from, pos)) != std::string::npos) {
    s->replace(pos, from.size(), to);
    pos += to.size();
  }
}

std::string Trim(std::string_view s) {
  const char* ws = " \t\n\r\f\v";
  size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return "";
  size_t e = s.find_last_not_of(ws);
  return std::string(s.substr(b, e - b + 1));
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Word characters as Python's Unicode regexes see them (non-ASCII bytes count as letters).
bool IsWordByte(unsigned char c) { return std::isalnum(c) || c == '_' || c >= 0x80; }

// The last `n` code points of UTF-8 `s` (Python's s[-n:]).
std::string_view LastCodePoints(std::string_view s, size_t n) {
  size_t count = 0;
  size_t i = s.size();
  while (i > 0) {
    --i;
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) {  // a lead byte
      if (++count == n) return s.substr(i);
    }
  }
  return s;
}

}  // namespace

std::string_view StripThink(std::string_view text) {
  size_t pos = text.rfind("</think>");
  return pos == std::string_view::npos ? text : text.substr(pos + 8);
}

// ---- dapo ------------------------------------------------------------------------------------

std::string DapoNormalizeFinalAnswer(std::string_view answer) {
  std::string s(answer);
  if (size_t eq = s.rfind('='); eq != std::string::npos) s = s.substr(eq + 1);
  static const std::pair<const char*, const char*> kSubstitutions[] = {
      {"an ", ""},          {"a ", ""},
      {".$", "$"},          {"\\$", ""},
      {"\\ ", ""},          {" ", ""},
      {"mbox", "text"},     {",\\text{and}", ","},
      {"\\text{and}", ","}, {"\\text{m}", "\\text{}"}};
  for (const auto& [before, after] : kSubstitutions) ReplaceAll(&s, before, after);
  static const char* const kRemoved[] = {
      "square",     "ways",       "integers",     "dollars",      "mph",
      "inches",     "hours",      "km",           "units",        "\\ldots",
      "sue",        "points",     "feet",         "minutes",      "digits",
      "cents",      "degrees",    "cm",           "gm",           "pounds",
      "meters",     "meals",      "edges",        "students",     "childrentickets",
      "multiples",  "\\text{s}",  "\\text{.}",    "\\text{\ns}",  "\\text{}^2",
      "\\text{}^3", "\\text{\n}", "\\text{}",     "\\mathrm{th}", "^\\circ",
      "^{\\circ}",  "\\;",        ",\\!",         "{,}",          "\"",
      "\\dots",     "<|im_end|>", "<|endoftext|>"};
  for (const char* expr : kRemoved) ReplaceAll(&s, expr, "");
  static const std::regex kMath(R"((.*?)(\$)(.*?)(\$)(.*))");
  static const std::regex kText(R"((\\text\{)(.*?)(\}))");
  static const std::regex kTextbf(R"((\\textbf\{)(.*?)(\}))");
  static const std::regex kOverline(R"((\\overline\{)(.*?)(\}))");
  static const std::regex kBoxed(R"((\\boxed\{)(.*)(\}))");
  static const std::regex kFrac(R"((frac)([^{])(.))");
  static const std::regex kSqrt(R"((sqrt)([^{]))");
  s = std::regex_replace(s, kMath, "$$$3$$");
  s = std::regex_replace(s, kText, "$2");
  s = std::regex_replace(s, kTextbf, "$2");
  s = std::regex_replace(s, kOverline, "$2");
  s = std::regex_replace(s, kBoxed, "$2");
  s = std::regex_replace(s, kFrac, "frac{$2}{$3}");
  s = std::regex_replace(s, kSqrt, "sqrt{$2}");
  ReplaceAll(&s, "$", "");
  std::string no_commas = s;
  ReplaceAll(&no_commas, ",", "");
  bool digits = !no_commas.empty();
  for (unsigned char c : no_commas) digits &= std::isdigit(c) != 0;
  if (digits) s = no_commas;
  return Trim(s);
}

StatusOr<nlohmann::json> DapoScore(std::string_view response, std::string_view label) {
  std::string solution(LastCodePoints(response, 300));
  static const std::regex kAnswer(R"(Answer\s*:\s*([^\n]+))", std::regex::icase);
  std::string extracted = "[INVALID]";
  for (auto it = std::sregex_iterator(solution.begin(), solution.end(), kAnswer);
       it != std::sregex_iterator(); ++it) {
    extracted = (*it)[1].str();
  }
  std::string pred = DapoNormalizeFinalAnswer(extracted);
  std::string truth = Trim(DapoNormalizeFinalAnswer(label));
  // int(float(gt)): DAPO labels are integers.
  char* end = nullptr;
  double value = std::strtod(truth.c_str(), &end);
  if (truth.empty() || end != truth.c_str() + truth.size() || !std::isfinite(value) ||
      truth.find_first_of("xXpP") != std::string::npos) {
    return absl::InvalidArgumentError(fmt::format(
        "dapo: the label \"{}\" is not a number (dapo labels are integers)", std::string(label)));
  }
  std::string truth_int = fmt::format("{:.0f}", std::trunc(value));
  if (truth_int == "-0") truth_int = "0";
  bool correct = pred == truth_int;
  return nlohmann::json{{"score", correct ? 1.0 : -1.0}, {"acc", correct}, {"pred", pred}};
}

// ---- f1 --------------------------------------------------------------------------------------

std::string SquadNormalize(std::string_view text) {
  static const std::string_view kPunctuation = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";
  std::string no_punct;
  for (char c : Lower(text)) {
    if (kPunctuation.find(c) == std::string_view::npos) no_punct += c;
  }
  // Articles as whole words become a space.
  std::string no_articles;
  size_t i = 0;
  while (i < no_punct.size()) {
    if (!IsWordByte(no_punct[i])) {
      no_articles += no_punct[i++];
      continue;
    }
    size_t start = i;
    while (i < no_punct.size() && IsWordByte(no_punct[i])) ++i;
    std::string_view word(no_punct.data() + start, i - start);
    no_articles +=
        (word == "a" || word == "an" || word == "the") ? std::string(" ") : std::string(word);
  }
  // Collapse whitespace.
  std::string out;
  for (size_t k = 0; k < no_articles.size();) {
    while (k < no_articles.size() && std::isspace(static_cast<unsigned char>(no_articles[k]))) ++k;
    size_t start = k;
    while (k < no_articles.size() && !std::isspace(static_cast<unsigned char>(no_articles[k]))) ++k;
    if (k > start) {
      if (!out.empty()) out += ' ';
      out.append(no_articles, start, k - start);
    }
  }
  return out;
}

double F1Reward(std::string_view response, std::string_view label) {
  std::string pred = SquadNormalize(response);
  std::string truth = SquadNormalize(label);
  static const std::set<std::string> kSpecial = {"yes", "no", "noanswer"};
  if ((kSpecial.count(pred) || kSpecial.count(truth)) && pred != truth) return 0;
  auto tokens = [](const std::string& s) {
    std::vector<std::string> out;
    size_t start = 0;
    while (start < s.size()) {
      size_t end = s.find(' ', start);
      if (end == std::string::npos) end = s.size();
      if (end > start) out.push_back(s.substr(start, end - start));
      start = end + 1;
    }
    return out;
  };
  auto pred_tokens = tokens(pred);
  auto truth_tokens = tokens(truth);
  std::map<std::string, int> truth_counts;
  for (const auto& t : truth_tokens) ++truth_counts[t];
  int same = 0;
  for (const auto& t : pred_tokens) {
    auto it = truth_counts.find(t);
    if (it != truth_counts.end() && it->second > 0) {
      --it->second;
      ++same;
    }
  }
  if (same == 0) return 0;
  double precision = static_cast<double>(same) / pred_tokens.size();
  double recall = static_cast<double>(same) / truth_tokens.size();
  return 2 * precision * recall / (precision + recall);
}

// ---- gpqa ------------------------------------------------------------------------------------

namespace {

std::string GpqaNormalize(std::string_view text) {
  std::string out;
  bool pending_space = false;
  for (char c : Lower(text)) {
    if (std::isalnum(static_cast<unsigned char>(c))) {
      if (pending_space && !out.empty()) out += ' ';
      pending_space = false;
      out += c;
    } else {
      pending_space = true;
    }
  }
  return out;
}

std::string JsonText(const nlohmann::json& v) {
  return v.is_string() ? v.get<std::string>() : v.dump();
}

}  // namespace

std::optional<char> GpqaExtractLetter(std::string_view response, std::string_view valid_letters) {
  std::string_view stripped = StripThink(response);
  if (stripped.empty()) return std::nullopt;
  // Regexes run on at most the last 64 KiB (libstdc++'s matcher recurses per character).
  std::string text(stripped.size() > 65536 ? stripped.substr(stripped.size() - 65536) : stripped);
  static const std::regex kPatterns[] = {
      std::regex(R"((?:answer|option|choice)\s*(?:is\s*:?|:)?\s*\(?([a-z])\)?(?![a-z0-9_]))",
                 std::regex::icase),
      std::regex(R"((?:^|[^a-z0-9_])\(?([a-z])\)?\s*is\s*(?:the\s*)?correct)", std::regex::icase),
      std::regex(R"(final\s*(?:answer|option)\s*(?:is\s*:?|:)?\s*\(?([a-z])\)?(?![a-z0-9_]))",
                 std::regex::icase),
  };
  for (const auto& pattern : kPatterns) {
    std::smatch m;
    if (std::regex_search(text, m, pattern)) {
      char letter = static_cast<char>(std::toupper(static_cast<unsigned char>(m[1].str()[0])));
      if (valid_letters.find(letter) != std::string_view::npos) return letter;
    }
  }
  // Fallback: the last standalone capital letter that is a valid choice.
  for (size_t i = text.size(); i > 0; --i) {
    unsigned char c = text[i - 1];
    if (c < 'A' || c > 'Z') continue;
    bool before_ok = i - 1 == 0 || !IsWordByte(text[i - 2]);
    bool after_ok = i == text.size() || !IsWordByte(text[i]);
    if (before_ok && after_ok && valid_letters.find(static_cast<char>(c)) != std::string::npos) {
      return static_cast<char>(c);
    }
  }
  return std::nullopt;
}

double GpqaReward(std::string_view response, std::string_view label,
                  const nlohmann::json* metadata) {
  static const nlohmann::json kEmpty = nlohmann::json::object();
  const nlohmann::json& meta = metadata != nullptr && metadata->is_object() ? *metadata : kEmpty;

  std::vector<std::string> choices;
  if (auto it = meta.find("choices"); it != meta.end()) {
    if (it->is_array() || it->is_object()) {
      for (const auto& c : *it) choices.push_back(JsonText(c));
    }
  }
  std::string valid;
  if (auto it = meta.find("valid_letters"); it != meta.end() && it->is_array() && !it->empty()) {
    for (const auto& l : *it) {
      std::string s = JsonText(l);
      if (s.size() == 1) valid += static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
    }
  } else if (!choices.empty()) {
    for (size_t i = 0; i < choices.size() && i < 26; ++i) valid += static_cast<char>('A' + i);
  } else {
    valid = "ABCDEFGHIJ";
  }

  std::optional<char> correct;
  if (auto it = meta.find("correct_letter"); it != meta.end() && it->is_string()) {
    std::string s = Trim(it->get<std::string>());
    if (!s.empty()) correct = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
  }
  std::string label_text = Trim(label);
  auto is_letter_label = [&] {
    return label_text.size() == 1 &&
           valid.find(static_cast<char>(std::toupper(static_cast<unsigned char>(label_text[0])))) !=
               std::string::npos;
  };
  if (!correct && is_letter_label()) {
    correct = static_cast<char>(std::toupper(static_cast<unsigned char>(label_text[0])));
  }
  std::string matched_choice;
  if (!correct && !choices.empty() && !label_text.empty()) {
    std::string wanted = GpqaNormalize(label_text);
    for (size_t i = 0; i < choices.size() && i < valid.size(); ++i) {
      if (GpqaNormalize(choices[i]) == wanted) {
        correct = valid[i];
        matched_choice = choices[i];
        break;
      }
    }
  }

  std::optional<char> extracted = GpqaExtractLetter(response, valid);
  if (extracted && correct) return *extracted == *correct ? 1 : 0;

  // No letter to compare: look for the correct choice's text in the response.
  std::vector<std::string> targets;
  if (correct && !choices.empty()) {
    size_t idx = valid.find(*correct);
    if (idx != std::string::npos && idx < choices.size()) targets.push_back(choices[idx]);
  }
  if (!matched_choice.empty()) targets.push_back(matched_choice);
  for (const char* key : {"correct_answer", "answer_text"}) {
    if (auto it = meta.find(key); it != meta.end() && !it->is_null()) {
      targets.push_back(JsonText(*it));
    }
  }
  if (!label_text.empty() && !is_letter_label()) targets.push_back(label_text);
  std::string haystack = " " + GpqaNormalize(StripThink(response)) + " ";
  for (const auto& t : targets) {
    std::string needle = GpqaNormalize(t);
    if (!needle.empty() && haystack.find(" " + needle + " ") != std::string::npos) return 1;
  }
  if (extracted && !correct && !label_text.empty()) {
    return *extracted == std::toupper(static_cast<unsigned char>(label_text[0])) &&
                   label_text.size() == 1
               ? 1
               : 0;
  }
  return 0;
}

// ---- exact match -----------------------------------------------------------------------------

double ExactMatchReward(std::string_view response, std::string_view label) {
  return Trim(StripThink(response)) == Trim(label) ? 1 : 0;
}

}  // namespace slime::reward
