// The job's engines and the recovery of a lost one (engine_recovery.h).
#include "engine_recovery.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "slime/http/client.h"
#include "slime/runtime/rpc.h"
#include "spdlog/spdlog.h"

namespace slime::job {
namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

StatusOr<Json> Call(runtime::Head* head, const std::string& actor_id, const std::string& method,
                    const Json& request, std::chrono::milliseconds timeout) {
  runtime::CallOptions options;
  options.timeout = timeout;
  SLIME_ASSIGN_OR_RETURN(std::string reply, head->Handle(actor_id).Call(method, request.dump(), options));
  Json j = Json::parse(reply, nullptr, false);
  if (j.is_discarded()) {
    return absl::InternalError(fmt::format("{} on {}: the reply is not JSON", method, actor_id));
  }
  return j;
}

// resync_engine on every weight exporter at once (EngineRecoveryOptions::trainer_ids); the
// source's reply.
StatusOr<Json> Resync(runtime::Head* head, const std::vector<std::string>& trainer_ids,
                      const Json& request, std::chrono::milliseconds timeout) {
  runtime::CallOptions options;
  options.timeout = timeout;
  SLIME_ASSIGN_OR_RETURN(
      std::vector<std::string> replies,
      head->Group(trainer_ids).CallAll("resync_engine", request.dump(), options));
  Json j = Json::parse(replies.front(), nullptr, false);
  if (j.is_discarded()) {
    return absl::InternalError(
        fmt::format("resync_engine on {}: the reply is not JSON", trainer_ids.front()));
  }
  return j;
}

// GET /health of the engine at `address` answers 200 within a second.
bool Healthy(const std::string& address) {
  StatusOr<std::pair<std::string, int>> hp = runtime::SplitHostPort(address);
  if (!hp.ok()) return false;
  http::ClientOptions co;
  co.timeout = std::chrono::seconds(1);
  http::Client client(hp->first, hp->second, co);
  StatusOr<http::Response> r = client.Get("/health");
  return r.ok() && r->status == 200;
}

}  // namespace

EngineRecoveryImpl::EngineRecoveryImpl(EngineRecoveryOptions options)
    : options_(std::move(options)), addresses_(options_.addresses) {}

StatusOr<std::unique_ptr<EngineRecoveryImpl>> EngineRecoveryImpl::Create(
    EngineRecoveryOptions options) {
  if (options.head == nullptr || options.engine_ids.size() != options.addresses.size() ||
      options.trainer_ids.empty()) {
    return absl::InvalidArgumentError(
        "engine recovery: a head, one address per engine and the trainers are needed");
  }
  std::unique_ptr<EngineRecoveryImpl> r(new EngineRecoveryImpl(std::move(options)));
  for (size_t i = 0; i < r->options_.engine_ids.size(); ++i) {
    const std::string& id = r->options_.engine_ids[i];
    int64_t incarnation = 0;  // external engines: no process of ours
    if (!id.empty()) {
      SLIME_ASSIGN_OR_RETURN(runtime::ActorEndpoint endpoint, r->options_.head->Resolve(id));
      incarnation = endpoint.incarnation;
    }
    r->incarnations_.push_back(incarnation);
    r->restart_counters_.push_back(
        r->options_.metrics == nullptr
            ? nullptr
            : &r->options_.metrics->GetCounter(
                  "slime_engine_restarts_total",
                  "Engines the driver recovered after a restart (new address, weights resynced)",
                  {{"engine", id.empty() ? r->options_.addresses[i] : id}}));
  }
  return r;
}

std::vector<std::string> EngineRecoveryImpl::Addresses() const {
  std::lock_guard<std::mutex> lock(mu_);
  return addresses_;
}

std::vector<EngineHealthTarget> EngineRecoveryImpl::HealthTargets() const {
  std::vector<EngineHealthTarget> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < options_.engine_ids.size(); ++i) {
    const std::string& id = options_.engine_ids[i];
    if (id.empty()) {
      out.push_back({addresses_[i], addresses_[i], 0});
      continue;
    }
    StatusOr<runtime::ActorEndpoint> e = options_.head->Resolve(id);
    if (!e.ok() || e->incarnation != incarnations_[i]) continue;
    out.push_back({id, addresses_[i], incarnations_[i]});
  }
  return out;
}

Status EngineRecoveryImpl::ConnectTrainer() {
  SLIME_ASSIGN_OR_RETURN(runtime::ActorEndpoint trainer0,
                         options_.head->Resolve(options_.trainer_ids.front()));
  SLIME_ASSIGN_OR_RETURN(auto trainer_host, runtime::SplitHostPort(trainer0.address));
  Json engines = Json::array();
  for (const std::string& a : Addresses()) {
    SLIME_ASSIGN_OR_RETURN(auto hp, runtime::SplitHostPort(a));
    engines.push_back({{"host", hp.first}, {"port", hp.second}, {"num_gpus", options_.num_gpus_per_engine}});
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    changed_ = false;
  }
  Status s =
      Call(options_.head, options_.trainer_ids.front(), "connect_engines",
           {{"engines", engines},
            {"master_address", trainer_host.first},
            {"group_name", kWeightUpdateGroup}},
           std::chrono::hours(24))
          .status();
  if (!s.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    changed_ = true;
  }
  return s;
}

Status EngineRecoveryImpl::ReconnectIfChanged() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!changed_) return absl::OkStatus();
  }
  spdlog::info("weight sync: re-forming the weight-update group with the engines at {}",
               fmt::join(Addresses(), ", "));
  return ConnectTrainer();
}

std::vector<int> EngineRecoveryImpl::ReplacedEngines() {
  std::vector<int> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < options_.engine_ids.size(); ++i) {
    if (options_.engine_ids[i].empty()) continue;  // external: not ours to restart
    StatusOr<runtime::ActorEndpoint> e = options_.head->Resolve(options_.engine_ids[i]);
    if (!e.ok() || e->incarnation != incarnations_[i]) out.push_back(static_cast<int>(i));
  }
  return out;
}

int EngineRecoveryImpl::HeadRestarts(const std::string& actor_id) const {
  slime::v1::StatusReply status = options_.head->Snapshot();
  for (const auto& a : status.actors()) {
    if (a.actor_id() == actor_id) return a.restarts();
  }
  return -1;
}

StatusOr<rollout::RecoveredEngine> EngineRecoveryImpl::RecoverExternal(int engine,
                                                                       const Status& cause) {
  const auto start = Clock::now();
  std::string address;
  {
    std::lock_guard<std::mutex> lock(mu_);
    address = addresses_.at(engine);
  }
  spdlog::warn("external engine {} lost ({}); waiting up to {:.0f} s "
               "(fault_tolerance.health_check_timeout) for it to answer /health again",
               address, std::string(cause.message()), options_.health_check_timeout_s);
  const auto deadline =
      start + std::chrono::milliseconds(static_cast<int64_t>(options_.health_check_timeout_s * 1000));
  while (!Healthy(address)) {
    if (options_.head->job_failed()) {
      return absl::FailedPreconditionError(fmt::format(
          "external engine {} was lost ({}) and the job failed meanwhile: {}", address,
          std::string(cause.message()), options_.head->failure()));
    }
    if (Clock::now() > deadline) {
      return absl::UnavailableError(fmt::format(
          "external engine {} (cluster.rollout_external_engine_addrs) does not answer: /generate: "
          "{}; /health failed for {:.0f} s (fault_tolerance.health_check_timeout). External "
          "engines are not restarted by slime_train: restart it at the same address",
          address, std::string(cause.message()), options_.health_check_timeout_s));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  // It may be a new server with its own weights: give it the trainer's (disk transport, so a
  // shared file system is needed); failing that, it keeps its weights until the next sync,
  // which re-forms the weight-update group with it either way.
  SLIME_ASSIGN_OR_RETURN(auto hp, runtime::SplitHostPort(address));
  std::string version;
  StatusOr<Json> resync = Resync(options_.head, options_.trainer_ids,
                                 {{"host", hp.first}, {"port", hp.second}}, std::chrono::hours(24));
  if (resync.ok()) {
    version = resync->value("weight_version", std::string());
  } else {
    spdlog::warn("external engine {}: loading the trainer's weights from disk failed ({}); it "
                 "generates with the weights it has until the next weight sync",
                 address, std::string(resync.status().message()));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    changed_ = true;
  }
  if (restart_counters_[engine] != nullptr) restart_counters_[engine]->Increment();
  spdlog::warn("external engine {} answers again after {:.1f} s{}", address, Since(start),
               version.empty() ? "" : fmt::format("; weights resynced (weight_version {})", version));
  return rollout::RecoveredEngine{address, !version.empty(), version};
}

StatusOr<rollout::RecoveredEngine> EngineRecoveryImpl::Recover(int engine, const Status& cause) {
  if (options_.engine_ids.at(engine).empty()) return RecoverExternal(engine, cause);
  const auto start = Clock::now();
  const std::string& id = options_.engine_ids.at(engine);
  std::string old_address;
  int64_t known_incarnation = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    old_address = addresses_.at(engine);
    known_incarnation = incarnations_.at(engine);
  }
  spdlog::warn("engine {} at {} lost ({}); waiting for the runtime head to restart it", id,
               old_address, std::string(cause.message()));
  // The head's whole restart schedule (every backoff, every start attempt) plus a margin: the
  // head decides before this; the deadline only guards against waiting forever.
  const double schedule_s =
      options_.restart_backoff_s * (std::pow(2.0, options_.max_restarts) - 1) +
      (options_.max_restarts + 1) * (options_.start_timeout_s + 15.0) + 30.0;
  const auto deadline = start + std::chrono::milliseconds(static_cast<int64_t>(schedule_s * 1000));
  const auto unanswered_deadline =
      start + std::chrono::milliseconds(static_cast<int64_t>(options_.health_check_timeout_s * 1000));
  runtime::ActorEndpoint endpoint;
  while (true) {
    StatusOr<runtime::ActorEndpoint> e = options_.head->Resolve(id);
    if (e.ok() && e->incarnation != known_incarnation) {
      endpoint = *e;
      break;  // a new process is up
    }
    if (e.ok() && Healthy(old_address)) {
      spdlog::warn("engine {} at {} answers again (same process); its lost requests are retried",
                   id, old_address);
      return rollout::RecoveredEngine{old_address, false, ""};
    }
    if (!e.ok() && absl::IsFailedPrecondition(e.status())) {  // dead: the head gave up
      const std::string failure = options_.head->job_failed() ? options_.head->failure()
                                                              : std::string(e.status().message());
      return absl::FailedPreconditionError(fmt::format(
          "engine {} at {} was lost ({}) and is not restarted "
          "(fault_tolerance.max_engine_restarts = {}): {}",
          id, old_address, std::string(cause.message()), options_.max_restarts, failure));
    }
    if (options_.head->job_failed()) {
      return absl::FailedPreconditionError(fmt::format(
          "engine {} was lost ({}) and the job failed meanwhile: {}", id,
          std::string(cause.message()), options_.head->failure()));
    }
    const auto now = Clock::now();
    if (e.ok() && now > unanswered_deadline) {
      return absl::UnavailableError(fmt::format(
          "engine {} at {} does not answer (/generate: {}; /health fails for {:.0f} s, "
          "fault_tolerance.health_check_timeout) but its worker process is alive; see {}", id,
          old_address, std::string(cause.message()), options_.health_check_timeout_s,
          "its log under <run_dir>/logs/" + id + ".log"));
    }
    if (now > deadline) {
      return absl::DeadlineExceededError(fmt::format(
          "engine {} at {} was lost ({}) and no new process came up within {:.0f} s", id,
          old_address, std::string(cause.message()), schedule_s));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const double restart_s = Since(start);
  SLIME_ASSIGN_OR_RETURN(Json address, Call(options_.head, id, "address", Json::object(),
                                            std::chrono::seconds(60)));
  std::string new_address;
  try {
    new_address = fmt::format("{}:{}", address.at("host").get<std::string>(),
                              address.at("port").get<int>());
  } catch (const Json::exception& ex) {
    return absl::InternalError(fmt::format("address on {}: bad reply: {}", id, ex.what()));
  }
  SLIME_ASSIGN_OR_RETURN(auto hp, runtime::SplitHostPort(new_address));
  const auto sync_start = Clock::now();
  StatusOr<Json> resync = Resync(options_.head, options_.trainer_ids,
                                 {{"host", hp.first}, {"port", hp.second}}, std::chrono::hours(24));
  if (!resync.ok()) {
    return Status(resync.status().code(),
                  fmt::format("engine {} restarted at {}, but giving it the trainer's weights "
                              "failed: {}",
                              id, new_address, std::string(resync.status().message())));
  }
  const std::string version = resync->value("weight_version", std::string());
  {
    std::lock_guard<std::mutex> lock(mu_);
    addresses_[engine] = new_address;
    incarnations_[engine] = endpoint.incarnation;
    changed_ = true;
  }
  if (restart_counters_[engine] != nullptr) restart_counters_[engine]->Increment();
  if (options_.on_address_change) options_.on_address_change();
  spdlog::warn(
      "engine {} restarted (restart {}/{}) at {} with weight_version {}: {:.1f} s lost "
      "({:.1f} s waiting for the new process, {:.1f} s loading the weights)",
      id, HeadRestarts(id), options_.max_restarts, new_address, version, Since(start), restart_s,
      Since(sync_start));
  return rollout::RecoveredEngine{new_address, true, version};
}

}  // namespace slime::job
