// The driver: what `slime_train --config F` runs — slime's train.py loop over our runtime
// (docs/algorithms.md, "The synchronous loop" and "Resume").
//
//   setup     load the tokenizer and the prompt data (bad data fails here, before any process
//             starts; data.num_rollout defaults to dataset size / rollout_batch_size ×
//             num_epoch), start the runtime head and this node's agent, wait for
//             cluster.num_nodes nodes, place and start the actors (engines, trainers) as worker
//             processes, ask every engine for its HTTP address, `init` the trainers (which resume
//             from checkpoint.load when it holds a checkpoint: the next rollout is the loaded one
//             + 1, the data source continues where it was saved), connect trainer rank 0 to the
//             engines' weight-update group and push the weights once (slime always does, so the
//             engines' hf_checkpoint only has to have the right architecture).
//   loop      for rollout_id in [start, num_rollout):
//               eval before training (rollout 0, eval.interval set, not skip_eval_before_train);
//               generate (the rollout coordinator runs in this process, against the engines over
//               the SGLang HTTP API; progress on the console);
//               train (the batch goes to every trainer as a protobuf over gRPC);
//               save (checkpoint.save_interval, and at the last rollout): the data source and
//               coordinator state under <save>/rollout/, then the trainer checkpoint, whose
//               tracker is written last;
//               sync the weights (every weight_sync.interval rollouts; weight_version = the
//               next rollout id);
//               eval (every eval.interval rollouts).
//   async     DriverOptions::async_train (`slime_train train --async`): slime's train_async.py
//             instead — rollout k+1 generates on the engines while the trainers train on
//             rollout k, so samples are one policy version stale (weight_versions shows it);
//             the weight sync waits for the generation in flight; a checkpoint of k keeps the
//             data source as it was after rollout k was drawn (the prefetched rollout is
//             discarded on stop and regenerated on resume). Not with cluster.colocate.
//             Schedule and extra metrics: src/job/driver_async.h.
//   fully async  DriverOptions::loop kFullyAsync (`slime_train train --fully-async`): the engines
//             generate rollout after rollout on a producer thread while the trainers train; a
//             weight update lands between decode steps without draining them (running requests
//             keep their tokens and continue with the new weights, each token tagged with its
//             version); rollout j starts only while j − the engines' weight version ≤
//             rollout.max_staleness, and samples over the bound are dropped from the loss.
//             Eval runs on the producer between generations, at one weight version. A
//             checkpoint of k keeps the data source as it was after rollout k was drawn.
//             Schedule and metrics: src/job/driver_async.h. Not with cluster.colocate.
//   debug     debug.rollout_only: generate (and save_debug_rollout_data) only;
//             debug.load_debug_rollout_data: train only, on rollouts saved earlier by
//             save_debug_rollout_data (no engines).
//   metrics   one JSON line per rollout and per optimizer step in metrics.jsonl_path (slime's
//             names: rollout/*, train/*, perf/*, eval/*), the same values as Prometheus gauges
//             (slime_<name with / and other symbols as _>) plus the runtime head's on GET
//             /metrics of the driver's HTTP server (metrics.prometheus_port, else a free port;
//             the address is in <run_dir>/driver.json), a one-line summary per rollout.
//
// Exit codes: 0 done; 1 the job failed (an actor died, a call failed: one message names what);
// 2 bad configuration or data; 128+N after signal N (SIGINT/SIGTERM stop every actor first).
#ifndef SLIME_JOB_DRIVER_H_
#define SLIME_JOB_DRIVER_H_

#include <string>

#include "slime/common/signal_watcher.h"
#include "slime/common/status.h"
#include "slime/config/config.h"
#include "slime/runtime/placement.h"

namespace slime::job {

// Which loop runs the rollouts (above).
enum class TrainLoop {
  kSync,        // generate, train, sync, one after another
  kOneStepOff,  // --async
  kFullyAsync,  // --fully-async
};

struct DriverOptions {
  config::Config config;                 // resolved
  runtime::PlacementRequest placement;   // what to place (app::PlanJob's request)
  std::string head_node_name = "node0";  // this node's name in the runtime
  double start_timeout_s = 600;          // nodes and actors must be up within this
  TrainLoop loop = TrainLoop::kSync;     // --async, --fully-async (above)
};

// Errors: the config cannot run `loop` (cluster.colocate with an async loop, trainer failover,
// rollout.max_staleness without --fully-async); the message names the key and the flag.
Status CheckLoopConfig(const config::Config& config, TrainLoop loop);

// Errors: a file the job reads does not exist (model.hf_checkpoint with its config.json and
// tokenizer.json, data.prompt_data, eval.datasets[].path, reward.custom_rm_path,
// rollout.custom_generate_path, checkpoint.ref_load / critic_load, algorithm.opd_teacher_load,
// each when the job would read it). One line per missing file, naming the key and the path.
// The driver's setup checks this first; `slime_train --dry-run` calls it too.
Status CheckInputFiles(const config::Config& config);

// Runs the job to the end; returns the process exit code (see above). `signals` (constructed
// before any other thread started) gets the handler that stops every actor on SIGINT/SIGTERM.
int RunDriver(DriverOptions options, SignalWatcher* signals);

}  // namespace slime::job

#endif  // SLIME_JOB_DRIVER_H_
