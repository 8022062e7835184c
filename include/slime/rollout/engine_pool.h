// EnginePool: the rollout coordinator's view of its inference engines — any servers that speak
// SGLang's native HTTP API (our `slime_train serve`, or SGLang itself), given by address.
//
// What it does:
//   * routing: PickEngine gives a whole group to the engine with the fewest outstanding
//     requests (queued here + in flight), so the n samples of a prompt share one engine's prefix
//     cache while the load stays balanced;
//   * a per-engine concurrency limit (slime's sglang_server_concurrency): at most
//     `concurrency_per_engine` /generate calls of this pool are in flight on one engine; the rest
//     wait in that engine's FIFO queue;
//   * POST /generate on worker threads (one synchronous http::Client each, started on demand, up
//     to the limit), with retries when the engine cannot be reached;
//   * end-of-rollout control: CancelQueued drops calls not yet sent, AbortAll asks every engine
//     to abort its requests (/abort_request {"abort_all": true}), Loads reads /v1/loads;
//   * engine loss (when `on_unreachable` is set): a /generate that cannot reach its engine
//     (connection refused, reset or closed mid-answer) is not retried; the engine is marked
//     down, its queued calls fail at once with Unavailable, `on_unreachable` runs once, and
//     PickEngine avoids it until SetEngineUp gives it a (new) address. Calls queued on a down
//     engine (every engine was down) wait there until it is up again.
//
// Errors reported to a call's `done` callback: the engine's non-2xx answer as
// http::StatusFromHttp (naming the engine and the body); an engine that stays unreachable for
// `max_attempts` tries → Unavailable naming its address and the attempts; a call slower than
// `request_timeout` → DeadlineExceeded naming the engine; a call cancelled before it was sent →
// Cancelled.
//
// Threads: every public method may be called from any thread. `done` runs on a worker thread of
// the engine that served the call (it may block: the engine slot stays held meanwhile, as in
// slime, where the reward runs under the same semaphore). The destructor cancels queued calls,
// waits for the in-flight ones and joins the workers; do not destroy the pool from `done`.
#ifndef SLIME_ROLLOUT_ENGINE_POOL_H_
#define SLIME_ROLLOUT_ENGINE_POOL_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "nlohmann/json.hpp"
#include "slime/common/status.h"

namespace slime::rollout {

// "http://host:port", "host:port" (a trailing "/" is allowed; https is not supported).
struct EngineAddress {
  std::string host;
  int port = 0;
  std::string ToString() const;  // "host:port"
};
StatusOr<EngineAddress> ParseEngineAddress(std::string_view address);

struct EnginePoolOptions {
  std::vector<std::string> addresses;  // at least one
  int concurrency_per_engine = 512;    // >= 1 (rollout.engine_concurrency)
  // One /generate call, from connect to the last byte (rollout.request_timeout_s).
  std::chrono::milliseconds request_timeout{std::chrono::hours(1)};
  // Tries per call while the engine refuses connections (slime retries 60 times, 1 s apart).
  int max_attempts = 60;
  std::chrono::milliseconds retry_interval{std::chrono::seconds(1)};
  // Sent as `Authorization: Bearer` on every call (the engines' access key; "" = none).
  std::string bearer_token;
  // Control calls (/abort_request, /v1/loads).
  std::chrono::milliseconds control_timeout{std::chrono::seconds(30)};
  // Set: engine loss is reported instead of retried (file comment). Runs on the worker thread
  // of the failed call, once per loss (a later failure of a call sent to the engine's earlier
  // address does not report it again); it must not block for long.
  std::function<void(int engine, const Status& cause)> on_unreachable;
};

// Counters of one engine, as seen from this pool.
struct EngineStats {
  int64_t outstanding = 0;    // reserved by PickEngine and not yet completed
  int64_t in_flight = 0;      // /generate calls sent and not answered
  int64_t max_in_flight = 0;  // highest in_flight since the last ResetMaxInFlight
  int64_t calls = 0;          // calls answered (any outcome)
};

class EnginePool {
 public:
  using Done = std::function<void(StatusOr<nlohmann::json> response)>;

  // Checks the options (addresses parse, limits >= 1). Does not contact the engines.
  static StatusOr<std::unique_ptr<EnginePool>> Create(EnginePoolOptions options);
  ~EnginePool();
  EnginePool(const EnginePool&) = delete;
  EnginePool& operator=(const EnginePool&) = delete;

  int num_engines() const;
  EngineAddress address(int engine) const;  // the current one (SetEngineUp may change it)

  // The engine with the fewest outstanding calls (lowest index on ties) among those that are
  // up (among all when every engine is down); reserves `num_calls` there. Every reserved call
  // must then be Submitted (each completion releases one).
  int PickEngine(int64_t num_calls);
  // Reserves `num_calls` more on `engine` (custom generation: a sample's engine calls are not
  // known when its group is placed, so each call reserves its own before Submit).
  void Reserve(int engine, int64_t num_calls);

  // Engine loss. MarkEngineDown: as when a call found it unreachable, without `on_unreachable`;
  // true when it was up. SetEngineUp: `address` serves again (a restarted engine's new one);
  // workers reconnect and send its queued calls. InvalidArgument for a bad address.
  bool MarkEngineDown(int engine, const Status& cause);
  Status SetEngineUp(int engine, std::string_view address);
  bool engine_down(int engine) const;

  // Queues POST /generate `body` on `engine`; `done` gets the parsed JSON answer (2xx) or an
  // error (see the file comment). Calls on one engine are sent in submission order.
  void Submit(int engine, nlohmann::json body, Done done);

  // Completes every queued (unsent) call with Cancelled; calls in flight are not touched.
  void CancelQueued();
  // For a job that is stopping: CancelQueued, and calls in flight stop retrying unreachable
  // engines (they fail at once with their last error). Irreversible.
  void Shutdown();
  // POST /abort_request {"abort_all": true} to every engine that is up. Returns the first
  // failure (every engine is still tried).
  Status AbortAll();
  // GET /v1/loads of one engine.
  StatusOr<nlohmann::json> Loads(int engine);

  EngineStats stats(int engine) const;
  void ResetMaxInFlight();

 private:
  struct Engine;
  explicit EnginePool(EnginePoolOptions options, std::vector<EngineAddress> addresses);
  void WorkerMain(Engine* engine);
  // Marks `e` down when `generation` is still its address's; fails its queued calls.
  bool TakeDown(Engine* e, int64_t generation, const Status& cause);

  const EnginePoolOptions options_;
  std::vector<std::unique_ptr<Engine>> engines_;
  std::atomic<bool> shutdown_{false};
};

}  // namespace slime::rollout

#endif  // SLIME_ROLLOUT_ENGINE_POOL_H_
