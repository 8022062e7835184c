// Small string helpers shared by config validation, CLI and error messages.
// Thread-safety: all functions are pure.
#ifndef SLIME_COMMON_STRINGS_H_
#define SLIME_COMMON_STRINGS_H_

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace slime {

// Levenshtein distance between `a` and `b`.
int EditDistance(std::string_view a, std::string_view b);

// The candidate closest to `word` by edit distance, if it is close enough to be a plausible typo
// (distance ≤ max(2, |word| / 3)). Used for "did you mean" suggestions.
std::optional<std::string> ClosestMatch(std::string_view word,
                                        const std::vector<std::string>& candidates);

// "a, b, c" — for messages that list the allowed values.
std::string JoinQuoted(const std::vector<std::string>& items, std::string_view sep = ", ");

}  // namespace slime

#endif  // SLIME_COMMON_STRINGS_H_
