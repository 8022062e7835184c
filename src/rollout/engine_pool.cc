// EnginePool (engine_pool.h): routing, per-engine concurrency, /generate workers, abort.
#include "slime/rollout/engine_pool.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <deque>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "slime/http/client.h"

namespace slime::rollout {

std::string EngineAddress::ToString() const { return fmt::format("{}:{}", host, port); }

StatusOr<EngineAddress> ParseEngineAddress(std::string_view address) {
  std::string_view rest = address;
  if (rest.substr(0, 8) == "https://") {
    return absl::InvalidArgumentError(fmt::format(
        "engine address '{}': https is not supported; use http://host:port", std::string(address)));
  }
  if (rest.substr(0, 7) == "http://") rest.remove_prefix(7);
  while (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  const size_t colon = rest.rfind(':');
  auto bad = [&] {
    return absl::InvalidArgumentError(
        fmt::format("engine address '{}' is not valid: expected http://host:port or host:port",
                    std::string(address)));
  };
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == rest.size()) return bad();
  if (rest.find('/') != std::string_view::npos) return bad();
  int port = 0;
  for (char c : rest.substr(colon + 1)) {
    if (c < '0' || c > '9' || port > 65535) return bad();
    port = port * 10 + (c - '0');
  }
  if (port < 1 || port > 65535) return bad();
  return EngineAddress{std::string(rest.substr(0, colon)), port};
}

namespace {

struct Call {
  nlohmann::json body;
  EnginePool::Done done;
};

bool Retryable(const Status& s) { return absl::IsUnavailable(s); }

}  // namespace

struct EnginePool::Engine {
  int index = 0;
  mutable absl::Mutex mu;
  EngineAddress address ABSL_GUARDED_BY(mu);
  int64_t generation ABSL_GUARDED_BY(mu) = 0;  // bumped by SetEngineUp (a new address)
  bool down ABSL_GUARDED_BY(mu) = false;
  std::deque<Call> queue ABSL_GUARDED_BY(mu);
  int workers ABSL_GUARDED_BY(mu) = 0;       // threads started
  int idle_workers ABSL_GUARDED_BY(mu) = 0;  // threads waiting for a call
  bool stopping ABSL_GUARDED_BY(mu) = false;
  EngineStats stats ABSL_GUARDED_BY(mu);
  std::vector<std::thread> threads;  // touched only under mu (start) and in the destructor
};

EnginePool::EnginePool(EnginePoolOptions options, std::vector<EngineAddress> addresses)
    : options_(std::move(options)) {
  for (auto& a : addresses) {
    engines_.push_back(std::make_unique<Engine>());
    Engine* e = engines_.back().get();
    e->index = static_cast<int>(engines_.size()) - 1;
    absl::MutexLock lock(&e->mu);
    e->address = std::move(a);
  }
}

StatusOr<std::unique_ptr<EnginePool>> EnginePool::Create(EnginePoolOptions options) {
  if (options.addresses.empty()) {
    return absl::InvalidArgumentError(
        "the rollout has no engines: give at least one engine address (http://host:port)");
  }
  if (options.concurrency_per_engine < 1) {
    return absl::InvalidArgumentError(fmt::format(
        "engine concurrency = {} is out of range: must be >= 1", options.concurrency_per_engine));
  }
  if (options.max_attempts < 1) {
    return absl::InvalidArgumentError(
        fmt::format("engine max_attempts = {} must be >= 1", options.max_attempts));
  }
  std::vector<EngineAddress> addresses;
  for (const std::string& a : options.addresses) {
    SLIME_ASSIGN_OR_RETURN(EngineAddress parsed, ParseEngineAddress(a));
    addresses.push_back(std::move(parsed));
  }
  return std::unique_ptr<EnginePool>(new EnginePool(std::move(options), std::move(addresses)));
}

EnginePool::~EnginePool() {
  CancelQueued();
  for (auto& e : engines_) {
    {
      absl::MutexLock lock(&e->mu);
      e->stopping = true;
    }
    for (std::thread& t : e->threads) t.join();
  }
}

void EnginePool::Shutdown() {
  shutdown_.store(true);
  CancelQueued();
}

int EnginePool::num_engines() const { return static_cast<int>(engines_.size()); }

EngineAddress EnginePool::address(int engine) const {
  const Engine* e = engines_.at(engine).get();
  absl::MutexLock lock(&e->mu);
  return e->address;
}

int EnginePool::PickEngine(int64_t num_calls) {
  int best = 0;
  int64_t best_load = -1;
  bool best_up = false;
  for (int i = 0; i < num_engines(); ++i) {
    absl::MutexLock lock(&engines_[i]->mu);
    const int64_t load = engines_[i]->stats.outstanding;
    const bool up = !engines_[i]->down;
    if (best_load < 0 || (up && !best_up) || (up == best_up && load < best_load)) {
      best = i;
      best_load = load;
      best_up = up;
    }
  }
  absl::MutexLock lock(&engines_[best]->mu);
  engines_[best]->stats.outstanding += num_calls;
  return best;
}

void EnginePool::Reserve(int engine, int64_t num_calls) {
  Engine* e = engines_.at(engine).get();
  absl::MutexLock lock(&e->mu);
  e->stats.outstanding += num_calls;
}

void EnginePool::Submit(int engine, nlohmann::json body, Done done) {
  Engine* e = engines_.at(engine).get();
  absl::ReleasableMutexLock lock(&e->mu);
  // After Shutdown nothing would send it (a down engine's queue waits for a recovery that
  // will not come): cancelled at once. Checked under the lock, so CancelQueued, which runs
  // after the flag is set, cancels whatever was queued before.
  if (shutdown_.load()) {
    lock.Release();
    done(absl::CancelledError(fmt::format(
        "the /generate call on engine {} was cancelled: the pool is shut down",
        address(engine).ToString())));
    return;
  }
  e->queue.push_back(Call{std::move(body), std::move(done)});
  // A worker per call in flight, up to the limit; idle ones are reused.
  const int busy = e->workers - e->idle_workers;
  if (e->idle_workers == 0 && busy < options_.concurrency_per_engine && !e->stopping) {
    ++e->workers;
    e->threads.emplace_back([this, e] { WorkerMain(e); });
  }
}

bool EnginePool::TakeDown(Engine* e, int64_t generation, const Status& cause) {
  std::deque<Call> failed;
  std::string address;
  {
    absl::MutexLock lock(&e->mu);
    if (e->down || e->generation != generation) return false;
    e->down = true;
    failed.swap(e->queue);
    e->stats.outstanding -= static_cast<int64_t>(failed.size());
    e->stats.calls += static_cast<int64_t>(failed.size());
    address = e->address.ToString();
  }
  spdlog::warn("rollout: engine {} is down ({}); {} queued call(s) go elsewhere", address,
               std::string(cause.message()), failed.size());
  for (Call& c : failed) {
    c.done(absl::UnavailableError(
        fmt::format("engine {} is down; the /generate call was not sent", address)));
  }
  return true;
}

bool EnginePool::MarkEngineDown(int engine, const Status& cause) {
  Engine* e = engines_.at(engine).get();
  int64_t generation = 0;
  {
    absl::MutexLock lock(&e->mu);
    generation = e->generation;
  }
  return TakeDown(e, generation, cause);
}

Status EnginePool::SetEngineUp(int engine, std::string_view address) {
  SLIME_ASSIGN_OR_RETURN(EngineAddress parsed, ParseEngineAddress(address));
  Engine* e = engines_.at(engine).get();
  absl::MutexLock lock(&e->mu);
  e->address = std::move(parsed);
  ++e->generation;
  e->down = false;
  return absl::OkStatus();
}

bool EnginePool::engine_down(int engine) const {
  const Engine* e = engines_.at(engine).get();
  absl::MutexLock lock(&e->mu);
  return e->down;
}

void EnginePool::CancelQueued() {
  for (auto& e : engines_) {
    std::deque<Call> cancelled;
    {
      absl::MutexLock lock(&e->mu);
      cancelled.swap(e->queue);
      e->stats.outstanding -= static_cast<int64_t>(cancelled.size());
      e->stats.calls += static_cast<int64_t>(cancelled.size());
    }
    for (Call& c : cancelled) {
      c.done(absl::CancelledError(
          fmt::format("the /generate call on engine {} was cancelled before it was sent",
                      address(e->index).ToString())));
    }
  }
}

void EnginePool::WorkerMain(Engine* e) {
  http::ClientOptions client_options;
  client_options.timeout = options_.request_timeout;
  client_options.bearer_token = options_.bearer_token;
  std::unique_ptr<http::Client> client;
  int64_t client_generation = -1;
  std::string where;
  const bool report_loss = static_cast<bool>(options_.on_unreachable);
  while (true) {
    Call call;
    int64_t generation = 0;
    {
      absl::MutexLock lock(&e->mu);
      ++e->idle_workers;
      // A down engine's queue waits (its calls were queued while every engine was down).
      e->mu.Await(absl::Condition(
          +[](Engine* e) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return e->stopping || (!e->queue.empty() && !e->down);
          },
          e));
      --e->idle_workers;
      if (e->stopping && (e->queue.empty() || e->down)) return;
      call = std::move(e->queue.front());
      e->queue.pop_front();
      ++e->stats.in_flight;
      e->stats.max_in_flight = std::max(e->stats.max_in_flight, e->stats.in_flight);
      generation = e->generation;
      if (generation != client_generation) {  // first call, or the engine has a new address
        client = std::make_unique<http::Client>(e->address.host, e->address.port, client_options);
        client_generation = generation;
        where = fmt::format("engine {} /generate", e->address.ToString());
      }
    }
    const std::string body = call.body.dump();
    StatusOr<nlohmann::json> result = absl::UnknownError("not sent");
    bool lost = false;
    for (int attempt = 1;; ++attempt) {
      StatusOr<http::Response> r = client->Post("/generate", body);
      if (!r.ok()) {
        if (report_loss && Retryable(r.status()) && !shutdown_.load()) {
          lost = true;
          result = Status(r.status().code(), fmt::format("{}: the engine is unreachable: {}", where,
                                                         std::string(r.status().message())));
          break;
        }
        if (Retryable(r.status()) && attempt < options_.max_attempts && !shutdown_.load()) {
          std::this_thread::sleep_for(options_.retry_interval);
          continue;
        }
        result = Status(r.status().code(), fmt::format("{} failed after {} attempt(s): {}", where,
                                                       attempt, std::string(r.status().message())));
        break;
      }
      if (r->status < 200 || r->status >= 300) {
        result = http::StatusFromHttp(r->status, where, r->body);
        break;
      }
      nlohmann::json j = nlohmann::json::parse(r->body, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || !j.is_object()) {
        result = absl::InternalError(fmt::format("{} answered a body that is not a JSON object: {}",
                                                 where, r->body.substr(0, 200)));
      } else {
        result = std::move(j);
      }
      break;
    }
    {
      absl::MutexLock lock(&e->mu);
      --e->stats.in_flight;
      --e->stats.outstanding;
      ++e->stats.calls;
    }
    // The engine first (its queued calls fail over), then this call's own completion.
    if (lost && TakeDown(e, generation, result.status())) {
      options_.on_unreachable(e->index, result.status());
    }
    call.done(std::move(result));
  }
}

Status EnginePool::AbortAll() {
  Status first;
  for (auto& e : engines_) {
    if (engine_down(e->index)) continue;  // its calls fail by themselves
    const EngineAddress a = address(e->index);
    http::ClientOptions o;
    o.timeout = options_.control_timeout;
    o.bearer_token = options_.bearer_token;
    http::Client client(a.host, a.port, o);
    StatusOr<http::Response> r = client.Post("/abort_request", R"({"abort_all": true})");
    Status s = r.ok() ? http::StatusFromHttp(
                            r->status, fmt::format("engine {} /abort_request", a.ToString()), r->body)
                      : r.status();
    if (!s.ok()) {
      spdlog::warn("rollout: abort on engine {} failed: {}", a.ToString(), s.ToString());
      if (first.ok()) first = s;
    }
  }
  return first;
}

StatusOr<nlohmann::json> EnginePool::Loads(int engine) {
  const EngineAddress a = address(engine);
  http::ClientOptions o;
  o.timeout = options_.control_timeout;
  o.bearer_token = options_.bearer_token;
  http::Client client(a.host, a.port, o);
  SLIME_ASSIGN_OR_RETURN(http::Response r, client.Get("/v1/loads"));
  const std::string where = fmt::format("engine {} /v1/loads", a.ToString());
  SLIME_RETURN_IF_ERROR(http::StatusFromHttp(r.status, where, r.body));
  nlohmann::json j = nlohmann::json::parse(r.body, nullptr, false);
  if (j.is_discarded()) {
    return absl::InternalError(fmt::format("{} answered a body that is not JSON", where));
  }
  return j;
}

EngineStats EnginePool::stats(int engine) const {
  const Engine* e = engines_.at(engine).get();
  absl::MutexLock lock(&e->mu);
  return e->stats;
}

void EnginePool::ResetMaxInFlight() {
  for (auto& e : engines_) {
    absl::MutexLock lock(&e->mu);
    e->stats.max_in_flight = e->stats.in_flight;
  }
}

}  // namespace slime::rollout
