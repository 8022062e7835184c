// Test helper: a real engine on CPU behind its real HTTP server, for the tests of what talks to
// engines (rollout coordinator, teacher client, multi-turn workflows, generate plugins).
//
// StartTestEngine loads `model_dir` (usually the tiny random Qwen3 of
// tests/data/model/configs/qwen3-engine-test.json, written by model::InitRandomModel) in
// float32 with 4-token pages and sampling seed 1, with its own metrics registry, and serves it on
// a free port of 127.0.0.1. Header-only; the test links slime::engine.
#ifndef SLIME_TESTS_SUPPORT_TEST_ENGINE_H_
#define SLIME_TESTS_SUPPORT_TEST_ENGINE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "slime/common/status.h"
#include "slime/engine/engine.h"
#include "slime/engine/server.h"
#include "slime/metrics/registry.h"

namespace slime::testing {

struct TestEngine {
  std::unique_ptr<metrics::Registry> registry;
  std::unique_ptr<engine::Engine> engine;
  std::unique_ptr<engine::EngineServer> server;

  int port() const { return server->port(); }
  // http://127.0.0.1:PORT
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port()); }
};

struct TestEngineSpec {
  std::string model_dir;
  std::string weight_version = "default";  // shows which engine served a sample
  int64_t max_total_tokens = 16384;
  int64_t context_length = 512;
  bool enable_return_routed_experts = false;  // serve --enable-return-routed-experts (MoE)
};

inline StatusOr<std::unique_ptr<TestEngine>> StartTestEngine(const TestEngineSpec& spec) {
  auto e = std::make_unique<TestEngine>();
  e->registry = std::make_unique<metrics::Registry>();
  engine::EngineOptions o;
  o.model_path = spec.model_dir;
  o.device = "cpu";
  o.dtype = "float32";
  o.page_size = 4;
  o.max_total_tokens = spec.max_total_tokens;
  o.context_length = spec.context_length;
  o.random_seed = 1;
  o.weight_version = spec.weight_version;
  o.enable_return_routed_experts = spec.enable_return_routed_experts;
  o.metrics = e->registry.get();
  SLIME_ASSIGN_OR_RETURN(e->engine, engine::Engine::Create(o));
  engine::EngineServerOptions so;
  so.port = 0;
  SLIME_ASSIGN_OR_RETURN(e->server,
                         engine::EngineServer::Start(e->engine.get(), e->registry.get(), so));
  return e;
}

}  // namespace slime::testing

#endif  // SLIME_TESTS_SUPPORT_TEST_ENGINE_H_
