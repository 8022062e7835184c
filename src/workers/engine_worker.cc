// EngineWorker (include/slime/workers/workers.h).
#include <torch/torch.h>

#include <utility>

#include "fmt/format.h"
#include "slime/engine/engine.h"
#include "slime/engine/server.h"
#include "slime/metrics/registry.h"
#include "slime/workers/workers.h"
#include "spdlog/spdlog.h"

namespace slime::workers {

struct EngineWorker::Impl {
  std::string host;
  metrics::Registry registry;
  std::unique_ptr<engine::Engine> engine;
  std::unique_ptr<engine::EngineServer> server;
};

EngineWorker::EngineWorker(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

EngineWorker::~EngineWorker() {
  if (impl_->server) impl_->server->Stop();
  if (impl_->engine) impl_->engine->Stop();
}

const std::string& EngineWorker::host() const { return impl_->host; }
int EngineWorker::port() const { return impl_->server->port(); }

StatusOr<std::unique_ptr<EngineWorker>> EngineWorker::Start(WorkerOptions options,
                                                            const std::string& host) {
  const config::Config& config = options.config;
  if (options.num_threads > 0) at::set_num_threads(options.num_threads);
  auto impl = std::make_unique<Impl>();
  impl->host = host;
  engine::EngineOptions eo;
  eo.model_path = config.model.hf_checkpoint;
  eo.served_model_name = config.model.model_name.value_or(config.model.hf_checkpoint);
  eo.device = options.device == "cuda" ? "cuda" : "cpu";
  // slime's --rollout-num-gpus-per-engine is the engine's tensor-parallel size; the head made
  // this worker's bundle exactly that many devices (CUDA_VISIBLE_DEVICES), so ranks take
  // cuda:0..N-1 (or N Gloo ranks on CPU slots).
  eo.tp_size = config.cluster.rollout_num_gpus_per_engine;
  eo.dtype = "auto";
  if (config.rollout.mem_fraction_static) eo.mem_fraction_static = *config.rollout.mem_fraction_static;
  eo.random_seed = static_cast<uint64_t>(config.rollout.seed + options.rank);
  eo.deterministic_inference = config.debug.deterministic_mode;
  eo.enable_return_routed_experts =
      config.rollout.return_routed_experts || config.algorithm.use_rollout_routing_replay;
  eo.metrics = &impl->registry;
  auto engine = engine::Engine::Create(eo);
  if (!engine.ok()) {
    if (eo.tp_size > 1 && absl::IsInvalidArgument(engine.status())) {
      return absl::InvalidArgumentError(fmt::format(
          "cluster.rollout_num_gpus_per_engine = {} (each engine's tensor-parallel size): {}",
          eo.tp_size, std::string(engine.status().message())));
    }
    return engine.status();
  }
  impl->engine = *std::move(engine);
  engine::EngineServerOptions so;
  so.host = host;
  so.port = 0;
  so.weights_group_timeout_s = 60.0 * config.cluster.distributed_timeout_minutes;
  so.api_key = config.cluster.engine_api_key;
  so.admin_api_key = config.cluster.engine_admin_api_key;
  SLIME_ASSIGN_OR_RETURN(impl->server,
                         engine::EngineServer::Start(impl->engine.get(), &impl->registry, so));
  spdlog::info("engine {}: serving {} on http://{}:{} ({}, tp_size {})", options.rank,
               eo.model_path, host, impl->server->port(), eo.device, eo.tp_size);
  return std::unique_ptr<EngineWorker>(new EngineWorker(std::move(impl)));
}

}  // namespace slime::workers
