// Private to the reward module: what slime's math grader gets from pylatexenc and sympy.
//
// LatexToText turns a LaTeX answer into plain math text ("\frac{1}{2}" -> "1/2",
// "2\sqrt{3}" -> "2sqrt(3)", "\pi r^2" -> "pir^2"), the job pylatexenc's LatexNodes2Text does in
// slime. Groups lose their braces, formatting macros (\text, \mathrm, \left, ...) keep only their
// content, and unknown macros are dropped.
//
// ExpressionsEqual decides whether two plain expressions are the same number or function: where
// slime asks sympy whether simplify(a - b) == 0, we evaluate both in double precision
// (+ - * / ^ !, parentheses, implicit multiplication, sqrt/sin/cos/tan/log/ln/exp/abs, pi;
// every other letter is a variable) at a few fixed points and compare with a relative
// tolerance of 1e-11. Anything that does not parse is "not equal", as a sympy error is in slime.
//
// Thread-safety: pure functions.
#ifndef SLIME_REWARD_MATH_EXPR_H_
#define SLIME_REWARD_MATH_EXPR_H_

#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace slime::reward::internal {

std::string LatexToText(std::string_view latex);

// The value of `expr` with every variable set by `value_of(letter)`; nullopt when it does not
// parse. (Non-finite results are returned as they are.)
std::optional<double> EvaluateExpression(std::string_view expr,
                                         const std::function<double(char)>& value_of);

bool ExpressionsEqual(std::string_view a, std::string_view b);

}  // namespace slime::reward::internal

#endif  // SLIME_REWARD_MATH_EXPR_H_
