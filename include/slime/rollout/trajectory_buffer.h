// Trajectories made outside the job (slime's rollout-buffer plugin; docs/http-api.md,
// "Trajectory buffer"): agent frameworks that generate on their own — against the job's engines
// or anything else — POST finished trajectories to the driver's /trajectories, and each rollout
// takes data.rollout_batch_size complete groups (n_samples_per_prompt trajectories sharing a
// "group" id), the groups that completed first first.
//
// A POST body is {"trajectories": [T, ...]}, each T an object:
//   group              string    the prompt group it belongs to (required, not empty)
//   tokens             [int]     prompt + response token ids (required)
//   response_length    int       response tokens at the end of `tokens`, ≥ 1 (required)
//   reward             number    (required)
//   loss_mask          [0 | 1]   response_length entries (default: all 1)
//   rollout_log_probs  [number]  response_length entries, the behaviour log-probs (optional)
//   weight_versions    [string]  the weight version of each generated span, oldest first
//                                (optional; "weight_version": string is the one-span form,
//                                whose version made every loss-mask-1 token)
//   weight_version_tokens [int]  the generated tokens of each weight_versions entry (optional;
//                                feeds rollout/tokens_by_staleness/*)
//   status             string    "completed" or "truncated" (default "completed")
//   label, response    string    (optional), metadata object (optional)
// The whole body is checked before anything is added: the first bad entry's error names
// `trajectories[i].<field>`, and nothing of that body is kept. A group given more than
// n_samples_per_prompt trajectories is refused the same way.
//
// Rewards are the trajectories' own; the rollout's are post-processed (group normalization) as
// the coordinator's. Thread-safety: every method may be called from any thread.
#ifndef SLIME_ROLLOUT_TRAJECTORY_BUFFER_H_
#define SLIME_ROLLOUT_TRAJECTORY_BUFFER_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

#include "nlohmann/json.hpp"
#include "slime/common/status.h"
#include "slime/reward/reward_postprocess.h"
#include "slime/rollout/coordinator.h"

namespace slime::rollout {

class TrajectoryBuffer {
 public:
  struct Options {
    int64_t n_samples_per_prompt = 1;  // trajectories per group
    int64_t rollout_batch_size = 1;    // groups per rollout
    reward::GroupRewardOptions reward_postprocess;
  };
  // Error: n_samples_per_prompt or rollout_batch_size < 1.
  static StatusOr<std::unique_ptr<TrajectoryBuffer>> Create(Options options);

  // Adds the trajectories of a POST body (above); returns how many. InvalidArgument naming the
  // entry and the field when one is bad (nothing added); Unavailable before Open (the job is
  // still restoring its checkpoint's buffer).
  StatusOr<int64_t> Add(std::string_view body);
  // From now on Add takes trajectories.
  void Open();

  // Blocks until rollout_batch_size groups are complete and takes them (rollout_id set on every
  // sample). Cancelled once Cancel() has been called.
  StatusOr<RolloutResult> Take(int64_t rollout_id);
  // Ends a Take in progress and every later one (the job is stopping).
  void Cancel();

  // {"trajectories", "complete_groups", "open_groups", "added", "taken", "groups_per_rollout",
  //  "samples_per_group"}: what a producer polls (GET /trajectories).
  nlohmann::json Stats() const;

  // Every buffered trajectory (complete and open groups), for a checkpoint; RestoreState
  // replaces the buffer with one (InvalidArgument naming what is wrong).
  nlohmann::json State() const;
  Status RestoreState(const nlohmann::json& state);

 private:
  explicit TrajectoryBuffer(Options options) : options_(std::move(options)) {}
  struct Group {
    int64_t group_index = 0;
    data::SampleGroup samples;
  };

  const Options options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Group> open_;                           // by group id
  std::deque<std::pair<std::string, Group>> complete_;          // in completion order
  int64_t next_group_index_ = 0;
  int64_t next_sample_index_ = 0;
  int64_t added_ = 0;
  int64_t taken_ = 0;
  bool cancelled_ = false;
  bool open_for_adds_ = false;
};

}  // namespace slime::rollout

#endif  // SLIME_ROLLOUT_TRAJECTORY_BUFFER_H_
