// Which layers a stage recomputes (see include/slime/model/recompute.h).
#include "slime/model/recompute.h"

#include <fmt/format.h>

#include <algorithm>

namespace slime::model {

std::string RecomputeDescription(const RecomputeOptions& options) {
  switch (options.granularity) {
    case RecomputeGranularity::kNone:
      return "none";
    case RecomputeGranularity::kSelective:
      return "selective";
    case RecomputeGranularity::kFull:
      break;
  }
  return fmt::format("full {} {}",
                     options.method == RecomputeMethod::kUniform ? "uniform" : "block",
                     options.num_layers);
}

Status ValidateRecompute(const RecomputeOptions& options, const PipelineStage& stage,
                         int64_t num_model_layers) {
  if (!options.full()) return absl::OkStatus();
  const int64_t end = stage.end_layer < 0 ? num_model_layers : stage.end_layer;
  const int64_t layers = end - stage.first_layer;
  if (options.num_layers < 1 || options.num_layers > layers) {
    return absl::InvalidArgumentError(fmt::format(
        "recompute_num_layers = {} is not within 1..{}, the layers of pipeline stage {} of {} "
        "(layers [{}, {}))",
        options.num_layers, layers, stage.rank, stage.size, stage.first_layer, end));
  }
  return absl::OkStatus();
}

std::vector<LayerRun> RecomputePlan(const RecomputeOptions& options, int64_t first, int64_t end) {
  std::vector<LayerRun> runs;
  if (first >= end) return runs;
  if (!options.full()) return {{first, end, false}};
  const int64_t n = std::max<int64_t>(options.num_layers, 1);
  if (options.method == RecomputeMethod::kUniform) {
    for (int64_t l = first; l < end; l += n) runs.push_back({l, std::min(l + n, end), true});
    return runs;
  }
  const int64_t recomputed_end = std::min(first + n, end);
  for (int64_t l = first; l < recomputed_end; ++l) runs.push_back({l, l + 1, true});
  if (recomputed_end < end) runs.push_back({recomputed_end, end, false});
  return runs;
}

}  // namespace slime::model
