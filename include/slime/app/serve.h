// `slime_train serve`: one standalone SGLang-compatible engine (docs/http-api.md).
//
// Loads the model and tokenizer, starts the engine thread and the HTTP server, prints
// "slime_train serve: listening on http://HOST:PORT" on stdout once requests are accepted, and
// runs until SIGINT/SIGTERM, then stops the server (in-flight requests end with abort) and exits
// with 0. Configuration errors exit with 2 and a message naming the option.
#ifndef SLIME_APP_SERVE_H_
#define SLIME_APP_SERVE_H_

#include <cstdint>
#include <string>

namespace CLI {
class App;
}

namespace slime::app {

struct ServeOptions {
  std::string model_path;
  std::string tokenizer_path;
  std::string served_model_name;
  std::string host = "127.0.0.1";
  int port = 30000;
  int tp_size = 1;
  std::string device = "auto";
  std::string dtype = "auto";
  int64_t page_size = 16;
  int64_t max_total_tokens = 0;
  double mem_fraction_static = 0.85;
  int64_t max_running_requests = 256;
  int64_t chunked_prefill_size = 8192;
  int64_t context_length = 0;
  bool disable_radix_cache = false;
  bool enable_deterministic_inference = false;
  bool enable_return_routed_experts = false;
  int64_t random_seed = 0;
  int64_t stream_interval = 1;
  int64_t cuda_graph_max_bs = 256;
  bool disable_cuda_graph = false;
  std::string weight_version = "default";
  bool enable_memory_saver = false;
  int http_threads = 2;
  std::string api_key;        // --api-key (never logged)
  std::string admin_api_key;  // --admin-api-key (never logged)
  std::string log_level = "info";
};

// Registers the serve options on `cmd`.
void AddServeOptions(CLI::App* cmd, ServeOptions* options);

// Runs the server until a signal arrives; returns the process exit code.
int RunServe(const ServeOptions& options);

}  // namespace slime::app

#endif  // SLIME_APP_SERVE_H_
