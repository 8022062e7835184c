// The debug modes' saved rollouts (internal to the job module): slime's
// --save-debug-rollout-data / --load-debug-rollout-data / --load-debug-rollout-data-subsample.
//
// File format (one JSON document per rollout, written atomically: temp file, then rename):
//   {"format": "slime-cpp rollout data", "version": 1, "rollout_id": N,
//    "samples": [[sample, ...] per prompt group],   rollout::SampleToJson of each sample
//    "raw_rewards": [...], "rewards": [...],        one per sample, flattened in group order
//    "metrics": {...}}                              the rollout's metrics as generated
// A path template names the rollout with "{rollout_id}" (debug.save_debug_rollout_data,
// debug.load_debug_rollout_data).
//
// Thread-safety: free functions on values and files; call them from one thread per file.
#ifndef SLIME_SRC_JOB_DEBUG_DATA_H_
#define SLIME_SRC_JOB_DEBUG_DATA_H_

#include <cstdint>
#include <string>

#include "slime/common/status.h"
#include "slime/rollout/coordinator.h"

namespace slime::job {

// `pattern` with every "{rollout_id}" replaced by `rollout_id`.
std::string DebugRolloutPath(const std::string& pattern, int64_t rollout_id);

// Writes `result` to `path` (its directory created) in the format above.
Status SaveDebugRollout(const std::string& path, const rollout::RolloutResult& result);

// Reads a file written by SaveDebugRollout; the result carries `rollout_id`. NotFound when the
// file cannot be opened, InvalidArgument naming the file (and group) when it is not one.
StatusOr<rollout::RolloutResult> LoadDebugRollout(const std::string& path, int64_t rollout_id);

// debug.load_debug_rollout_data_subsample: keeps `fraction` (0 < fraction <= 1) of the prompt
// groups, slime's way on whole groups: keep = max(1, floor(groups × fraction)) groups, the first
// keep / 2 and the last keep − keep / 2 of them, in their order (so a group's samples stay
// together for the group-normalized rewards). raw_rewards and rewards follow their samples.
// InvalidArgument when fraction is outside (0, 1] or the reward lists do not have one entry per
// sample.
StatusOr<rollout::RolloutResult> SubsampleRollout(rollout::RolloutResult result, double fraction);

}  // namespace slime::job

#endif  // SLIME_SRC_JOB_DEBUG_DATA_H_
