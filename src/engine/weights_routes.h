// The weight-plane routes of the engine's HTTP API (SGLang's distributed weight update):
// /init_weights_update_group, /update_weights_from_distributed, /destroy_weights_update_group,
// and /update_weights_from_tensor (a colocated trainer's CUDA IPC buffer; comm/cuda_ipc.h); and
// ours, GET /weights_checksum (per-tensor checksums, comm/weight_checksum.h), which the trainer
// compares after a sync with weight_sync.check_weight_update_equal; and SGLang's
// GET|POST /get_weights_by_name (a parameter's first rows in float32, as a bare JSON list).
// Request and response JSON follow SGLang (docs/http-api.md, "Weight sync"): every answer is
// {"success": bool, "message": str}, 200 on success and 400 on failure, except
// /get_weights_by_name (the list, or 400 {"error": {"message"}}).
//
// Handlers run on HTTP I/O threads only to parse; the blocking waits (joining a group, the
// broadcast of a bucket) run through `on_worker` on the server's worker pool.
#ifndef SLIME_ENGINE_WEIGHTS_ROUTES_H_
#define SLIME_ENGINE_WEIGHTS_ROUTES_H_

#include <functional>

namespace slime::http {
class Router;
}

namespace slime::engine {

class Engine;

struct WeightsRoutesOptions {
  double group_timeout_s = 1800.0;  // rendezvous and each bucket's broadcasts
};

void AddWeightsRoutes(http::Router& router, Engine* engine, WeightsRoutesOptions options,
                      std::function<void(std::function<void()>)> on_worker);

}  // namespace slime::engine

#endif  // SLIME_ENGINE_WEIGHTS_ROUTES_H_
