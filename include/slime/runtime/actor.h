// Actor types: what a worker process runs, looked up by name in an ActorRegistry.
//
// An actor is an object with named methods that take and return bytes (or protobuf messages,
// serialized). The worker creates one actor per process from the ActorSpec the head sends at
// registration (`actor_type` picks the factory) and runs its methods one at a time, in arrival
// order, on the worker's actor thread — like a Ray actor, an actor never sees two calls at once.
// Later modules (rollout coordinator, engine, trainer) only register a factory:
//
//   registry.Register("trainer", [](const ActorContext& ctx) -> StatusOr<std::unique_ptr<Actor>> {
//     auto actor = std::make_unique<Actor>();
//     actor->AddProtoMethod<TrainRequest, TrainReply>("train", [](const TrainRequest& r) {...});
//     return actor;
//   });
//
// Thread-safety: a registry is filled before the worker starts and read-only afterwards. An
// Actor's methods run on the actor thread only.
#ifndef SLIME_RUNTIME_ACTOR_H_
#define SLIME_RUNTIME_ACTOR_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fmt/format.h"
#include "slime/common/status.h"
#include "slime/v1/runtime.pb.h"

namespace slime::runtime {

// What a factory knows about the process it runs in.
struct ActorContext {
  slime::v1::ActorSpec spec;
  std::string resolved_config;  // the job's resolved config (YAML), identical in every process
  std::string head_address;
};

class Actor {
 public:
  using Method = std::function<StatusOr<std::string>(const std::string& payload)>;

  virtual ~Actor() = default;

  // Adds or replaces a method.
  void AddMethod(const std::string& name, Method method) { methods_[name] = std::move(method); }

  // A method taking and returning protobuf messages; a payload that does not parse as `Req`
  // fails with InvalidArgument naming the method.
  template <typename Req, typename Resp>
  void AddProtoMethod(const std::string& name, std::function<StatusOr<Resp>(const Req&)> fn) {
    methods_[name] = [name, fn = std::move(fn)](const std::string& payload) -> StatusOr<std::string> {
      Req request;
      if (!request.ParseFromString(payload)) {
        return absl::InvalidArgumentError(fmt::format("method '{}': payload is not a {}", name,
                                                      request.GetTypeName()));
      }
      SLIME_ASSIGN_OR_RETURN(Resp reply, fn(request));
      return reply.SerializeAsString();
    };
  }

  // Runs `method`; NotFound (listing the known methods) for an unknown name.
  StatusOr<std::string> Invoke(const std::string& method, const std::string& payload);

  std::vector<std::string> MethodNames() const;

 private:
  std::map<std::string, Method> methods_;
};

using ActorFactory = std::function<StatusOr<std::unique_ptr<Actor>>(const ActorContext&)>;

class ActorRegistry {
 public:
  // InvalidArgument if `type` is empty or already registered.
  Status Register(const std::string& type, ActorFactory factory);
  // NotFound listing the registered types when `type` is unknown.
  StatusOr<std::unique_ptr<Actor>> Create(const std::string& type,
                                          const ActorContext& context) const;
  bool Has(const std::string& type) const { return factories_.count(type) > 0; }

 private:
  std::map<std::string, ActorFactory> factories_;
};

// The built-in test actor type "test" (used by the runtime's tests and benchmark). Methods:
//   echo   returns the payload;
//   sleep  sleeps payload (decimal milliseconds), returns "slept";
//   crash  ends the process at once with _exit(payload as exit code, default 3);
//   abort  raises SIGABRT;
//   info   returns "key=value" lines: actor_id, role, rank, node, pid, incarnation,
//          cuda_visible_devices, config_bytes, config_fnv (a hash of the resolved config);
//   fail   returns an error with the payload as message (InvalidArgument);
//   count  returns how many times it has run in this process ("1", "2", ...), which shows
//          whether a retried request id ran twice.
Status RegisterTestActor(ActorRegistry* registry);

}  // namespace slime::runtime

#endif  // SLIME_RUNTIME_ACTOR_H_
