// The job's actor types (include/slime/job/actors.h).
#include "slime/job/actors.h"

#include <cstdlib>
#include <memory>
#include <string>

#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "slime/config/config.h"
#include "slime/job/train_batch_codec.h"
#include "slime/runtime/rpc.h"
#include "slime/workers/workers.h"

namespace slime::job {
namespace {

using Json = nlohmann::json;

StatusOr<Json> ParseRequest(const std::string& method, const std::string& payload) {
  if (payload.empty()) return Json::object();
  Json j = Json::parse(payload, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(
        fmt::format("method '{}': request is not a JSON object", method));
  }
  return j;
}

// Adds `name` taking and returning JSON objects.
void AddJsonMethod(runtime::Actor* actor, const std::string& name,
                   std::function<StatusOr<Json>(const Json&)> fn) {
  actor->AddMethod(name, [name, fn = std::move(fn)](const std::string& payload)
                             -> StatusOr<std::string> {
    SLIME_ASSIGN_OR_RETURN(Json request, ParseRequest(name, payload));
    try {
      SLIME_ASSIGN_OR_RETURN(Json reply, fn(request));
      return reply.dump();
    } catch (const Json::exception& e) {
      return absl::InvalidArgumentError(fmt::format("method '{}': bad request: {}", name, e.what()));
    }
  });
}

// The worker options from the actor's spec and the job's config.
StatusOr<workers::WorkerOptions> OptionsFor(const runtime::ActorContext& ctx) {
  workers::WorkerOptions o;
  SLIME_ASSIGN_OR_RETURN(o.config, config::LoadConfigFromString(ctx.resolved_config, ".", {}));
  o.rank = ctx.spec.rank();
  o.device = ctx.spec.devices_are_gpus() ? "cuda" : "cpu";
  SLIME_ASSIGN_OR_RETURN(Json init, ParseRequest("init_payload", ctx.spec.init_payload()));
  try {
    o.device = init.value("device", o.device);
    o.num_threads = init.value("num_threads", 0);
    o.world_size = init.value("world_size", 1);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(fmt::format("actor {}: bad init_payload: {}",
                                                  ctx.spec.actor_id(), e.what()));
  }
  if (o.device != "cpu" && o.device != "cuda") {
    return absl::InvalidArgumentError(
        fmt::format("actor {}: device '{}' is not cpu or cuda", ctx.spec.actor_id(), o.device));
  }
  return o;
}

// Actors own their worker through a shared_ptr the method closures hold.
class TrainerActor : public runtime::Actor {
 public:
  explicit TrainerActor(workers::WorkerOptions options)
      : worker_(workers::TrainerWorker::Create(std::move(options))) {
    workers::TrainerWorker* w = worker_.get();
    AddJsonMethod(this, "init", [w](const Json& r) { return w->Init(r); });
    AddJsonMethod(this, "open_groups", [w](const Json& r) { return w->OpenGroups(r); });
    AddJsonMethod(this, "join_groups", [w](const Json& r) { return w->JoinGroups(r); });
    AddMethod("train", [w](const std::string& payload) -> StatusOr<std::string> {
      SLIME_ASSIGN_OR_RETURN(DecodedTrainBatch decoded, DecodeTrainBatch(payload));
      SLIME_ASSIGN_OR_RETURN(Json reply, w->Train(decoded.rollout_id, decoded.batch));
      return reply.dump();
    });
    AddJsonMethod(this, "save", [w](const Json& r) {
      return w->Save(r.at("rollout_id").get<int64_t>(), r.value("extra_state", Json::object()));
    });
    AddJsonMethod(this, "wait_save", [w](const Json&) { return w->WaitForSave(); });
    AddJsonMethod(this, "connect_engines", [w](const Json& r) -> StatusOr<Json> {
      SLIME_RETURN_IF_ERROR(w->ConnectEngines(r));
      return Json::object();
    });
    AddJsonMethod(this, "sync_weights", [w](const Json& r) {
      // "keep_requests": the engines' running requests continue across the update (fully async).
      return w->SyncWeights(r.at("weight_version").get<std::string>(),
                            r.value("keep_requests", false) ? comm::InFlight::kKeep
                                                            : comm::InFlight::kAbort);
    });
    AddJsonMethod(this, "resync_engine", [w](const Json& r) { return w->ResyncEngine(r); });
    AddJsonMethod(this, "check_engine_weights",
                  [w](const Json&) { return w->CheckEngineWeights(); });
    AddJsonMethod(this, "disconnect_engines", [w](const Json&) -> StatusOr<Json> {
      SLIME_RETURN_IF_ERROR(w->DisconnectEngines());
      return Json::object();
    });
    AddJsonMethod(this, "release_memory", [w](const Json&) { return w->ReleaseMemory(); });
    AddJsonMethod(this, "resume_memory", [w](const Json&) { return w->ResumeMemory(); });
    AddJsonMethod(this, "export_hf",
                  [w](const Json& r) { return w->ExportHf(r.at("dir").get<std::string>()); });
  }

 private:
  std::unique_ptr<workers::TrainerWorker> worker_;
};

class EngineActor : public runtime::Actor {
 public:
  explicit EngineActor(std::unique_ptr<workers::EngineWorker> worker) : worker_(std::move(worker)) {
    workers::EngineWorker* w = worker_.get();
    AddJsonMethod(this, "address", [w](const Json&) -> StatusOr<Json> {
      return Json{{"host", w->host()}, {"port", w->port()}};
    });
  }

 private:
  std::unique_ptr<workers::EngineWorker> worker_;
};

}  // namespace

Status RegisterJobActors(runtime::ActorRegistry* registry) {
  SLIME_RETURN_IF_ERROR(registry->Register(
      kTrainerActorType,
      [](const runtime::ActorContext& ctx) -> StatusOr<std::unique_ptr<runtime::Actor>> {
        SLIME_ASSIGN_OR_RETURN(workers::WorkerOptions options, OptionsFor(ctx));
        return std::unique_ptr<runtime::Actor>(new TrainerActor(std::move(options)));
      }));
  return registry->Register(
      kEngineActorType,
      [](const runtime::ActorContext& ctx) -> StatusOr<std::unique_ptr<runtime::Actor>> {
        SLIME_ASSIGN_OR_RETURN(workers::WorkerOptions options, OptionsFor(ctx));
        const char* bind = std::getenv(runtime::kBindHostEnv);
        const std::string host = bind != nullptr && *bind != '\0' ? bind : "127.0.0.1";
        SLIME_ASSIGN_OR_RETURN(std::unique_ptr<workers::EngineWorker> worker,
                               workers::EngineWorker::Start(std::move(options), host));
        return std::unique_ptr<runtime::Actor>(new EngineActor(std::move(worker)));
      });
}

}  // namespace slime::job
