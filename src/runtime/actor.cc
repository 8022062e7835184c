#include "slime/runtime/actor.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "absl/strings/str_join.h"

namespace slime::runtime {

StatusOr<std::string> Actor::Invoke(const std::string& method, const std::string& payload) {
  auto it = methods_.find(method);
  if (it == methods_.end()) {
    return absl::NotFoundError(fmt::format("unknown actor method '{}' (this actor has: {})",
                                           method, absl::StrJoin(MethodNames(), ", ")));
  }
  return it->second(payload);
}

std::vector<std::string> Actor::MethodNames() const {
  std::vector<std::string> names;
  for (const auto& [name, fn] : methods_) names.push_back(name);
  return names;
}

Status ActorRegistry::Register(const std::string& type, ActorFactory factory) {
  if (type.empty()) return absl::InvalidArgumentError("actor registry: empty actor type");
  if (!factories_.emplace(type, std::move(factory)).second) {
    return absl::InvalidArgumentError(
        fmt::format("actor registry: type '{}' is registered twice", type));
  }
  return absl::OkStatus();
}

StatusOr<std::unique_ptr<Actor>> ActorRegistry::Create(const std::string& type,
                                                       const ActorContext& context) const {
  auto it = factories_.find(type);
  if (it == factories_.end()) {
    std::vector<std::string> known;
    for (const auto& [name, f] : factories_) known.push_back(name);
    return absl::NotFoundError(fmt::format("unknown actor type '{}' (registered: {})", type,
                                           absl::StrJoin(known, ", ")));
  }
  return it->second(context);
}

namespace {

uint64_t Fnv1a(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

StatusOr<int> ParseInt(const std::string& text, const char* what) {
  if (text.empty() || text.size() > 9) {
    return absl::InvalidArgumentError(fmt::format("{}: want a decimal number, got '{}'", what, text));
  }
  int v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') {
      return absl::InvalidArgumentError(
          fmt::format("{}: want a decimal number, got '{}'", what, text));
    }
    v = v * 10 + (c - '0');
  }
  return v;
}

}  // namespace

Status RegisterTestActor(ActorRegistry* registry) {
  return registry->Register("test", [](const ActorContext& ctx) -> StatusOr<std::unique_ptr<Actor>> {
    auto actor = std::make_unique<Actor>();
    actor->AddMethod("echo", [](const std::string& p) -> StatusOr<std::string> { return p; });
    actor->AddMethod("sleep", [](const std::string& p) -> StatusOr<std::string> {
      SLIME_ASSIGN_OR_RETURN(int ms, ParseInt(p, "sleep"));
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      return std::string("slept");
    });
    actor->AddMethod("crash", [](const std::string& p) -> StatusOr<std::string> {
      StatusOr<int> code = ParseInt(p, "crash");
      ::_exit(code.ok() ? *code : 3);
    });
    actor->AddMethod("abort", [](const std::string&) -> StatusOr<std::string> {
      ::raise(SIGABRT);
      return std::string();
    });
    actor->AddMethod("fail", [](const std::string& p) -> StatusOr<std::string> {
      return absl::InvalidArgumentError(p);
    });
    auto calls = std::make_shared<int>(0);  // the actor thread is the only user
    actor->AddMethod("count", [calls](const std::string&) -> StatusOr<std::string> {
      return std::to_string(++*calls);
    });
    actor->AddMethod("info", [ctx](const std::string&) -> StatusOr<std::string> {
      const char* cuda = std::getenv("CUDA_VISIBLE_DEVICES");
      return fmt::format(
          "actor_id={}\nrole={}\nrank={}\nnode={}\npid={}\nincarnation={}\n"
          "cuda_visible_devices={}\nconfig_bytes={}\nconfig_fnv={:016x}\n",
          ctx.spec.actor_id(), ctx.spec.role(), ctx.spec.rank(), ctx.spec.node_name(),
          ::getpid(), ctx.spec.incarnation(), cuda == nullptr ? "<unset>" : cuda,
          ctx.resolved_config.size(), Fnv1a(ctx.resolved_config));
    });
    return actor;
  });
}

}  // namespace slime::runtime
