// Rule rewards (slime's rm_hub) as pure functions, plus the answer extraction and normalisation
// they are built from. RewardFn wrappers over these live in reward.cc; tests call them directly.
//
// Faithful to slime's Python where the behaviour is defined there (docs/rewards.md lists the
// rules); where slime relies on sympy (symbolic equality) we check numeric identity instead
// (math_expr.h), and where slime's letter regex misreads "answer is (C)" as "I" we require a
// standalone letter. Text is UTF-8; lower-casing and character classes are ASCII (non-ASCII
// bytes count as word characters, like letters in Python's Unicode regexes).
//
// Thread-safety: all functions are pure.
#ifndef SLIME_REWARD_RULES_H_
#define SLIME_REWARD_RULES_H_

#include <optional>
#include <string>
#include <string_view>

#include "nlohmann/json.hpp"
#include "slime/common/status.h"

namespace slime::reward {

// ---- boxed answers (math_utils) ----

// The last "\boxed{...}" (or, when there is none, the last "\fbox{...}") with balanced braces,
// including the command: "\boxed{\frac{1}{2}}". nullopt when absent or unbalanced.
std::optional<std::string> LastBoxedOnly(std::string_view text);
// The content of the last boxed / fbox answer: "\frac{1}{2}". nullopt when there is none.
std::optional<std::string> ExtractBoxedAnswer(std::string_view text);

// ---- math grading (math_utils: mathd string normalisation + a symbolic-equality grader) ----

// Hendrycks' MATH normalisation: strips \text{..} around the whole answer, \left/\right,
// "\!", degrees, "\$", units after "\text{ ", "\%", spaces; dfrac/tfrac -> frac; "x = " prefixes
// of up to two characters; \frac12 -> \frac{1}{2}; \sqrt3 -> \sqrt{3}; "0.5" -> \frac{1}{2};
// "a/b" -> \frac{a}{b}. An answer the rules cannot handle is returned trimmed.
std::string MathdNormalize(std::string_view answer);
bool GradeMathd(std::string_view given, std::string_view ground_truth);
// PRM800K-style normalisation (units, "million", \text{}, %, $, LaTeX -> plain text, lower case,
// integers canonical) used before the equality check.
std::string SympyNormalize(std::string_view answer);
// Tuple/interval aware equality: elements compared pairwise; two fractions must be written the
// same (unreduced fractions are wrong); an integer ground truth needs an integer answer; other
// elements are equal when their expressions agree numerically (variables sampled).
bool GradeSympy(std::string_view given, std::string_view ground_truth);

// ---- rewards ----

// "math": the last boxed answer of the response against the label (itself unboxed when it
// holds \boxed). 1 if GradeMathd or GradeSympy, else 0 (also 0 for an empty label).
double MathReward(std::string_view response, std::string_view label);

// "deepscaler": the text after the last "</think>" (or after the first "###Response"; neither:
// 0), then its boxed answer graded like math. 1/0.
double DeepscalerReward(std::string_view response, std::string_view label);

// "dapo": Minerva-style. On the last 300 characters, the last "Answer: ..." line (any case) is
// normalised (normalize_final_answer) and compared with the normalised label cast to an integer
// (DAPO labels are integers). Returns {"score": +1/-1, "acc": bool, "pred": string}.
// InvalidArgument when the label is not a number.
StatusOr<nlohmann::json> DapoScore(std::string_view response, std::string_view label);
// DAPO's answer normalisation (exposed for tests).
std::string DapoNormalizeFinalAnswer(std::string_view answer);

// "f1": SQuAD token F1 after lower-casing and removing punctuation, articles and extra spaces;
// "yes"/"no"/"noanswer" must match exactly. In [0, 1].
double F1Reward(std::string_view response, std::string_view label);
std::string SquadNormalize(std::string_view text);

// "gpqa": multiple choice. The text after the last "</think>" is searched for the chosen letter
// ("answer is X", "X is correct", "final answer: X", else the last standalone valid capital);
// the correct letter comes from metadata.correct_letter, a one-letter label, or the label text
// matched against metadata.choices. Without a letter, a normalised match of the correct choice
// text in the response counts. 1/0. `metadata` may be null.
double GpqaReward(std::string_view response, std::string_view label,
                  const nlohmann::json* metadata);
// The chosen letter (exposed for tests); `valid_letters` are upper-case.
std::optional<char> GpqaExtractLetter(std::string_view response, std::string_view valid_letters);

// "exact_match" (slime-cpp): the text after the last "</think>", trimmed, equals the trimmed
// label. 1/0.
double ExactMatchReward(std::string_view response, std::string_view label);

// Text after the last "</think>", or all of it.
std::string_view StripThink(std::string_view text);

}  // namespace slime::reward

#endif  // SLIME_REWARD_RULES_H_
