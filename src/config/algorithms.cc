// The algorithm name tables (include/slime/config/algorithms.h).
#include "slime/config/algorithms.h"

#include <iterator>

namespace slime::config {

const AdvantageEstimatorInfo* FindAdvantageEstimator(std::string_view name) {
  for (const AdvantageEstimatorInfo& info : kAdvantageEstimators) {
    if (info.name == name) return &info;
  }
  return nullptr;
}

std::vector<std::string> AdvantageEstimatorNames() {
  std::vector<std::string> names;
  for (const AdvantageEstimatorInfo& info : kAdvantageEstimators) names.emplace_back(info.name);
  return names;
}

std::vector<std::string> LossTypeNames() {
  return std::vector<std::string>(std::begin(kLossTypes), std::end(kLossTypes));
}

std::string JoinNames(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& name : names) {
    if (!out.empty()) out += ", ";
    out += name;
  }
  return out;
}

}  // namespace slime::config
