// The job's actor types, registered in every worker process's ActorRegistry (runtime/actor.h):
// the runtime wrappers around workers/workers.h. Payloads: the `train` request is a
// slime.v1.TrainBatchProto (proto/slime/v1/job.proto); every other request and every reply is a
// JSON object.
//
// Factory input: ActorSpec.init_payload = {"device": "cpu"|"cuda", "num_threads": N} (JSON; both
// optional: device from cluster.device, threads from LibTorch) and the job's resolved config.
//
//   "engine"   (role engine; restartable) starts the engine and its HTTP server at creation, on
//              the worker's bind host ($SLIME_BIND_HOST, else 127.0.0.1) and a free port.
//     address            {} → {"host", "port"}
//   "trainer"  (role trainer) builds nothing at creation (errors come back from init).
//     init               {} → TrainerWorker::Init's reply
//     train              TrainBatchProto → TrainerWorker::Train's reply
//     save               {"rollout_id", "extra_state"} → {"dir", "seconds"}
//     connect_engines    {"engines": [{"host", "port", "num_gpus"}], "master_address"} → {}
//     sync_weights       {"weight_version"} → {"bytes", "tensors", "buckets", "seconds", ...}
//     resync_engine      {"host", "port"} → {"weight_version", "dir", "bytes", "seconds"}
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
