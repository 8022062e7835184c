// EngineServer: the SGLang-compatible HTTP API of one Engine (docs/http-api.md).
//
// Routes: /generate (single, batch, n > 1, SSE streaming), /health, /health_generate,
// /server_info (+ /get_server_info), /model_info (+ /get_model_info), /flush_cache (GET/POST),
// /abort_request, /pause_generation, /continue_generation, /v1/loads, /get_weight_version
// (+ /weight_version), /release_memory_occupation, /resume_memory_occupation,
// /update_weights_from_disk, /init_weights_update_group, /update_weights_from_distributed,
// /destroy_weights_update_group (src/engine/weights_routes.cc), OpenAI /v1/completions, /v1/chat/completions, /v1/models, and
// Prometheus /metrics.
//
// Threads: the HTTP I/O threads parse JSON and tokenize, then hand requests to the engine
// thread; engine callbacks post each update to a per-request strand on a small worker pool,
// which serializes JSON and writes it to the client. Calls that wait for the engine thread
// (flush, health, memory, weight updates) also wait on the worker pool, never on an I/O thread.
// A client that disconnects has its requests cancelled (their K/V pages are freed).
//
// Ownership: borrows the Engine and the metrics registry, which must outlive the server.
#ifndef SLIME_ENGINE_SERVER_H_
#define SLIME_ENGINE_SERVER_H_

#include <memory>
#include <set>
#include <string>

#include "slime/common/status.h"

namespace slime::metrics {
class Registry;
}

namespace slime::engine {

class Engine;

struct EngineServerOptions {
  std::string host = "127.0.0.1";
  int port = 30000;              // 0 = any free port (tests)
  int http_threads = 2;          // I/O threads: parse, tokenize, write
  int worker_threads = 2;        // serialization and blocking waits
  bool enable_memory_saver = false;  // reported in /server_info (slime checks it)
  double health_timeout_s = 20.0;    // /health_generate answers 503 after this long
  // Weight-update groups: joining (/init_weights_update_group) and each bucket's broadcasts
  // fail with a clear error after this long (SGLang's c10d default is 30 min).
  double weights_group_timeout_s = 1800.0;
  // SGLang's --api-key / --admin-api-key (http::AccessKeys): api_key guards every route but
  // /health; admin_api_key, when set, alone opens the routes that change state (weight
  // updates, memory release/resume, pause/continue, flush, abort, weight version).
  std::string api_key;
  std::string admin_api_key;
};

// The routes admin_api_key guards.
const std::set<std::string>& AdminRoutes();

class EngineServer {
 public:
  static StatusOr<std::unique_ptr<EngineServer>> Start(Engine* engine,
                                                       metrics::Registry* registry,
                                                       EngineServerOptions options);
  ~EngineServer();

  int port() const;
  // Stops accepting, closes connections and joins the threads. Idempotent.
  void Stop();

  class Impl;

 private:
  explicit EngineServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace slime::engine

#endif  // SLIME_ENGINE_SERVER_H_
