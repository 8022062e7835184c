// From a resolved config to the placement plan of the job: which nodes and devices there are,
// and which actor goes where. Used by `--dry-run` and, later, by the head at job start.
//
// The cluster is the one the config describes (`cluster.num_nodes` nodes of
// `cluster.num_gpus_per_node` GPUs or `cluster.cpu_slots_per_node` CPU slots), so a plan can be
// checked on a laptop before it is submitted. `cluster.device: auto` picks GPUs when this
// machine's LibTorch sees a CUDA device, CPU slots otherwise.
// Thread-safety: pure functions.
#ifndef SLIME_APP_JOB_PLAN_H_
#define SLIME_APP_JOB_PLAN_H_

#include <string>
#include <vector>

#include "slime/common/status.h"
#include "slime/config/config.h"
#include "slime/runtime/placement.h"

namespace slime::app {

struct JobPlan {
  std::vector<runtime::NodeResources> nodes;
  runtime::PlacementRequest request;
  runtime::PlacementPlan plan;
  std::string device_note;  // how the device kind was chosen, for the dry-run header
};

// `cuda_available` is what this machine's LibTorch reports (used when cluster.device is auto).
StatusOr<JobPlan> PlanJob(const config::Config& config, bool cuda_available);

}  // namespace slime::app

#endif  // SLIME_APP_JOB_PLAN_H_
