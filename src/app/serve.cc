// `slime_train serve` (see include/slime/app/serve.h).
#include "slime/app/serve.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>

#include "CLI/CLI.hpp"
#include "fmt/format.h"
#include "slime/app/cli.h"
#include "slime/common/logging.h"
#include "slime/engine/engine.h"
#include "slime/engine/server.h"
#include "slime/http/util.h"
#include "slime/metrics/registry.h"
#include "spdlog/spdlog.h"

namespace slime::app {
namespace {

// Fails early (before a model load that can take minutes) when host:port cannot be bound.
// The server binds again for real after loading; this only catches the common mistakes.
Status CheckPortFree(const std::string& host, int port) {
  if (port == 0) return absl::OkStatus();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string port_s = std::to_string(port);
  if (getaddrinfo(host.c_str(), port_s.c_str(), &hints, &res) != 0 || res == nullptr) {
    return absl::InvalidArgumentError(fmt::format("cannot resolve --host '{}'", host));
  }
  Status status = absl::OkStatus();
  const int fd = socket(res->ai_family, res->ai_socktype, res->ai_protocol);
  if (fd >= 0) {
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, res->ai_addr, res->ai_addrlen) != 0) {
      status = absl::UnavailableError(fmt::format("cannot listen on {}:{} (bind): {}", host, port,
                                                  std::string(strerror(errno))));
    }
    close(fd);
  }
  freeaddrinfo(res);
  return status;
}

}  // namespace

void AddServeOptions(CLI::App* cmd, ServeOptions* o) {
  cmd->add_option("--model,--model-path", o->model_path,
                  "HF model directory (config.json, safetensors, tokenizer)")
      ->required();
  cmd->add_option("--tokenizer,--tokenizer-path", o->tokenizer_path,
                  "Tokenizer directory (default: the model directory)");
  cmd->add_option("--served-model-name", o->served_model_name,
                  "Name reported by /v1/models and /server_info (default: the model path)");
  cmd->add_option("--host", o->host, "Interface to listen on (0.0.0.0 for all)");
  cmd->add_option("--port", o->port, "HTTP port (0 = any free port)")->check(CLI::Range(0, 65535));
  cmd->add_option("--tp,--tp-size", o->tp_size,
                  "Tensor-parallel size: the model split over this many devices (cuda: from "
                  "--device on; cpu: ranks on threads), one process")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--device", o->device, "auto | cpu | cuda | cuda:N");
  cmd->add_option("--dtype", o->dtype, "auto | bfloat16 | float16 | float32");
  cmd->add_option("--page-size", o->page_size, "Tokens per K/V page")->check(CLI::Range(1, 256));
  cmd->add_option("--max-total-tokens", o->max_total_tokens,
                  "K/V cache size in tokens (0 = from --mem-fraction-static on CUDA, 65536 on CPU)");
  cmd->add_option("--mem-fraction-static", o->mem_fraction_static,
                  "CUDA: fraction of GPU memory for weights + K/V cache")
      ->check(CLI::Range(0.05, 0.99));
  cmd->add_option("--max-running-requests", o->max_running_requests,
                  "Sequences computed concurrently")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--chunked-prefill-size", o->chunked_prefill_size, "Prefill tokens per step")
      ->check(CLI::Range(int64_t{16}, int64_t{1} << 24));
  cmd->add_option("--context-length", o->context_length,
                  "Prompt + output limit (0 = the model's max_position_embeddings)");
  cmd->add_flag("--disable-radix-cache", o->disable_radix_cache, "Turn the prefix cache off");
  cmd->add_flag("--enable-deterministic-inference", o->enable_deterministic_inference,
                "Batch-invariant kernels: a request's tokens and log-probs do not depend on the "
                "batch, prefill chunking or prefix-cache hits (CPU and CUDA)");
  cmd->add_flag("--enable-return-routed-experts", o->enable_return_routed_experts,
                "Honour return_routed_experts on /generate (mixture-of-experts models): each "
                "token's experts in meta_info.routed_experts");
  cmd->add_option("--random-seed", o->random_seed, "Seed of requests without sampling_seed");
  cmd->add_option("--stream-interval", o->stream_interval, "Tokens per streamed chunk")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--cuda-graph-max-bs", o->cuda_graph_max_bs,
                  "CUDA: largest decode batch replayed from a captured graph")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  cmd->add_flag("--disable-cuda-graph", o->disable_cuda_graph, "CUDA: run every step eagerly");
  cmd->add_option("--weight-version", o->weight_version, "Initial weight version string");
  cmd->add_flag("--enable-memory-saver", o->enable_memory_saver,
                "Report enable_memory_saver=true (colocated training releases memory)");
  cmd->add_option("--api-key", o->api_key,
                  "Require 'Authorization: Bearer KEY' on every route but /health (401 without)");
  cmd->add_option("--admin-api-key", o->admin_api_key,
                  "Require this key (not --api-key: 403) on the routes that change state: weight "
                  "updates, memory release/resume, pause/continue, flush, abort");
  cmd->add_option("--http-threads", o->http_threads, "HTTP I/O threads")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--log-level", o->log_level, "trace|debug|info|warn|error|critical|off");
}

int RunServe(const ServeOptions& o) {
  if (Status s = CheckLogLevel(o.log_level); !s.ok()) {
    std::cerr << "slime_train serve: error: --log-level: " << s.message() << "\n";
    return kExitUsage;
  }
  LogOptions lo;
  lo.level = o.log_level;
  lo.role = "serve";
  if (Status s = InitLogging(lo); !s.ok()) {
    std::cerr << "slime_train serve: error: " << s.message() << "\n";
    return kExitUsage;
  }
  // Block the stop signals before any thread starts, so only sigwait below receives them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);
  if (auto fds = http::RaiseFileDescriptorLimit(65536); fds.ok()) {
    spdlog::debug("serve: file descriptor limit {}", *fds);
  }

  if (Status s = CheckPortFree(o.host, o.port); !s.ok()) {
    std::cerr << "slime_train serve: error: " << s.message() << "\n";
    return kExitUsage;
  }
  metrics::Registry registry;
  engine::EngineOptions eo;
  eo.model_path = o.model_path;
  eo.tokenizer_path = o.tokenizer_path;
  eo.served_model_name = o.served_model_name;
  eo.device = o.device;
  eo.tp_size = o.tp_size;
  eo.dtype = o.dtype;
  eo.page_size = o.page_size;
  eo.max_total_tokens = o.max_total_tokens;
  eo.mem_fraction_static = o.mem_fraction_static;
  eo.max_running_requests = o.max_running_requests;
  eo.chunked_prefill_size = o.chunked_prefill_size;
  eo.max_batch_tokens = std::max<int64_t>(o.chunked_prefill_size, 16384);
  eo.context_length = o.context_length;
  eo.enable_prefix_cache = !o.disable_radix_cache;
  eo.deterministic_inference = o.enable_deterministic_inference;
  eo.enable_return_routed_experts = o.enable_return_routed_experts;
  eo.random_seed = static_cast<uint64_t>(o.random_seed);
  eo.stream_interval = o.stream_interval;
  eo.cuda_graph_max_bs = o.disable_cuda_graph ? 0 : o.cuda_graph_max_bs;
  eo.weight_version = o.weight_version;
  eo.metrics = &registry;
  auto engine = engine::Engine::Create(eo);
  if (!engine.ok()) {
    std::cerr << "slime_train serve: error: " << engine.status().message() << "\n";
    return engine.status().code() == absl::StatusCode::kInternal ? kExitFailure : kExitUsage;
  }
  engine::EngineServerOptions so;
  so.host = o.host;
  so.port = o.port;
  so.api_key = o.api_key;
  so.admin_api_key = o.admin_api_key;
  so.http_threads = o.http_threads;
  so.enable_memory_saver = o.enable_memory_saver;
  auto server = engine::EngineServer::Start(engine->get(), &registry, so);
  if (!server.ok()) {
    std::cerr << "slime_train serve: error: " << server.status().message() << "\n";
    return kExitUsage;
  }
  std::cout << fmt::format("slime_train serve: listening on http://{}:{}", o.host,
                           (*server)->port())
            << std::endl;
  int sig = 0;
  sigwait(&stop_signals, &sig);
  spdlog::info("serve: {} received, shutting down", sig == SIGINT ? "SIGINT" : "SIGTERM");
  (*server)->Stop();
  (*engine)->Stop();
  std::cout << "slime_train serve: stopped" << std::endl;
  return kExitOk;
}

}  // namespace slime::app
