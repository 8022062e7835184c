// The job's actor types, registered in every worker process's ActorRegistry (runtime/actor.h):
// the runtime wrappers around workers/workers.h. Payloads: the `train` request is a
// slime.v1.TrainBatchProto (proto/slime/v1/job.proto); every other request and every reply is a
// JSON object.
//
// Factory input: ActorSpec.init_payload = {"device": "cpu"|"cuda", "num_threads": N,
// "world_size": W} (JSON; all optional: device from cluster.device, threads from LibTorch,
// trainers 1) and the job's resolved config; the actor's rank is ActorSpec.rank.
//
//   "engine"   (role engine; restartable) starts the engine and its HTTP server at creation, on
//              the worker's bind host ($SLIME_BIND_HOST, else 127.0.0.1) and a free port.
//     address            {} → {"host", "port"}
//   "trainer"  (role trainer) builds nothing at creation (errors come back from init).
//     open_groups        {"master_address"} → {"tp"?: {"master_address", "master_port"},
//                        "dp"?: {...}, "pp"?: {...}} (the groups this rank leads)
//     join_groups        {"tp": [...], "dp": [...], "pp": [...]} → TrainerWorker::JoinGroups's
//                        reply
//                        (both before init, world_size > 1; workers/workers.h)
//     init               {} → TrainerWorker::Init's reply
//     train              TrainBatchProto → TrainerWorker::Train's reply
//     save               {"rollout_id", "extra_state"} → {"dir", "seconds", "background",
//                        "wait_seconds", "write_seconds"}
//     wait_save          {} → {"seconds", "wait_seconds"} (checkpoint.async_save: the
//                        background write of the last save has finished)
//     connect_engines    {"engines": [{"host", "port", "num_gpus"}], "master_address"} → {}
//     sync_weights       {"weight_version"} → {"bytes", "tensors", "buckets", "seconds", ...}
//                        (every rank at once; rank 0 sends)
//     resync_engine      {"host", "port"} → {"weight_version", "dir", "bytes", "seconds"}
//                        (every rank of DP rank 0 at once; rank 0 writes and answers)
//     disconnect_engines {} → {}
//     export_hf          {"dir"} → {"dir", "from"}
// A request that is not the expected JSON or proto is InvalidArgument naming the method.
#ifndef SLIME_JOB_ACTORS_H_
#define SLIME_JOB_ACTORS_H_

#include "slime/common/status.h"
#include "slime/runtime/actor.h"

namespace slime::job {

inline constexpr char kTrainerActorType[] = "trainer";
inline constexpr char kEngineActorType[] = "engine";

Status RegisterJobActors(runtime::ActorRegistry* registry);

}  // namespace slime::job

#endif  // SLIME_JOB_ACTORS_H_
