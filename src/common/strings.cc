#include "slime/common/strings.h"

#include <algorithm>
#include <numeric>

namespace slime {

int EditDistance(std::string_view a, std::string_view b) {
  std::vector<int> prev(b.size() + 1), cur(b.size() + 1);
  std::iota(prev.begin(), prev.end(), 0);
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = static_cast<int>(i);
    for (size_t j = 1; j <= b.size(); ++j) {
      int substitute = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, substitute});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::optional<std::string> ClosestMatch(std::string_view word,
                                        const std::vector<std::string>& candidates) {
  std::optional<std::string> best;
  int best_distance = std::max<int>(2, static_cast<int>(word.size()) / 3) + 1;
  for (const std::string& candidate : candidates) {
    int d = EditDistance(word, candidate);
    if (d < best_distance) {
      best_distance = d;
      best = candidate;
    }
  }
  return best;
}

std::string JoinQuoted(const std::vector<std::string>& items, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += sep;
    out += '\'';
    out += items[i];
    out += '\'';
  }
  return out;
}

}  // namespace slime
