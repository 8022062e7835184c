// The SGLang-compatible HTTP API of an engine (see include/slime/engine/server.h).
#include "slime/engine/server.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/thread_pool.hpp>
#include <chrono>
#include <ctime>
#include <map>
#include <future>
#include <mutex>
#include <string>

#include "nlohmann/json.hpp"
#include "slime/common/build_info.h"
#include "slime/engine/engine.h"
#include "slime/engine/openai.h"
#include "slime/engine/protocol.h"
#include "slime/http/response_writer.h"
#include "slime/http/router.h"
#include "slime/http/server.h"
#include "slime/http/util.h"
#include "slime/metrics/registry.h"
#include "slime/model/config.h"
#include "slime/tokenizer/tokenizer.h"
#include "weights_routes.h"

namespace slime::engine {

namespace asio = boost::asio;
using json = nlohmann::json;
using Writer = std::shared_ptr<http::ResponseWriter>;

namespace {

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string IsoTimestamp() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

void SendError(const Writer& w, int status, std::string_view message) {
  w->SendJson(status, http::ErrorBody(message));
}

// Parses a JSON body (ParseJsonBody: an empty body is {}); a malformed one is answered 400.
std::optional<json> ParseBody(const http::Request& req, const Writer& w) {
  StatusOr<json> body = ParseJsonBody(req.body);
  if (!body.ok()) {
    SendError(w, 400, std::string(body.status().message()));
    return std::nullopt;
  }
  return std::move(body).value();
}

std::vector<std::string> ReadTags(const json& body) {
  std::vector<std::string> tags;
  const json& t = Member(body, "tags");
  if (t.is_array()) {
    for (const auto& x : t) {
      if (x.is_string()) tags.push_back(x.get<std::string>());
    }
  }
  return tags;
}

}  // namespace

class EngineServer::Impl {
 public:
  Impl(Engine* engine, metrics::Registry* registry, EngineServerOptions options)
      : engine_(engine),
        registry_(registry),
        options_(std::move(options)),
        workers_(static_cast<size_t>(std::max(1, options_.worker_threads))) {
    limits_.context_length = engine_->context_length();
    limits_.vocab_size = engine_->model_config().vocab_size;
    limits_.enable_return_routed_experts = engine_->options().enable_return_routed_experts;
    limits_.moe_model = engine_->routes_experts();
  }

  Status Start() {
    http::Router router;
    AddRoutes(router);
    http::AccessKeys keys;
    keys.api_key = options_.api_key;
    keys.admin_key = options_.admin_api_key;
    keys.admin_paths = AdminRoutes();
    router.SetAccessKeys(std::move(keys));
    http::ServerOptions so;
    so.host = options_.host;
    so.port = options_.port;
    so.num_threads = options_.http_threads;
    SLIME_ASSIGN_OR_RETURN(server_, http::Server::Start(so, std::move(router)));
    return absl::OkStatus();
  }

  void Stop() {
    if (server_) server_->Stop();
    workers_.join();
  }

  int port() const { return server_ ? server_->port() : 0; }

 private:
  void AddRoutes(http::Router& r);
  void Generate(const http::Request& req, Writer w);
  void OpenAi(const http::Request& req, Writer w, OpenAiEndpoint endpoint);
  json ServerInfo() const;
  json ModelInfo() const;
  json Loads() const;

  // Runs `fn` on the worker pool (blocking waits never run on I/O threads).
  template <typename Fn>
  void OnWorker(Fn&& fn) {
    asio::post(workers_, std::forward<Fn>(fn));
  }

  Engine* engine_;
  metrics::Registry* registry_;
  EngineServerOptions options_;
  ProtocolLimits limits_;
  UnknownFieldLog unknown_fields_;
  asio::thread_pool workers_;
  std::unique_ptr<http::Server> server_;
};

// ---- /generate

namespace {

// One /generate call in flight: its inputs, the outputs gathered so far, and its writer. Every
// method runs on the call's strand.
struct GenerateCall {
  ParsedGenerate parsed;
  Writer writer;
  const tokenizer::Tokenizer* tok = nullptr;
  std::vector<RequestOutput> outputs;
  size_t remaining = 0;
  std::vector<uint64_t> ids;
  asio::strand<asio::thread_pool::executor_type> strand;

  explicit GenerateCall(asio::thread_pool& pool) : strand(asio::make_strand(pool)) {}

  void OnUpdate(size_t i, const RequestOutput& out) {
    const bool finished = out.finish.finished();
    if (parsed.stream) {
      const int status = HttpStatusForFinish(out.finish);
      if (status != 200) {
        writer->Write(http::SseEvent(http::ErrorBody(out.finish.message)));
      } else {
        writer->Write(http::SseEvent(GenerateOutputJson(out, parsed.inputs[i], tok,
                                                        parsed.return_text_in_logprobs,
                                                        parsed.is_batch)));
      }
      if (finished && --remaining == 0) {
        writer->Write(std::string(http::kSseDone));
        writer->Finish();
      }
      return;
    }
    if (!finished) return;
    outputs[i] = out;
    if (--remaining > 0) return;
    const int status = HttpStatusForOutputs(outputs);
    if (status != 200) {
      for (const RequestOutput& o : outputs) {
        if (HttpStatusForFinish(o.finish) == status) {
          writer->SendJson(status, http::ErrorBody(o.finish.message));
          return;
        }
      }
    }
    if (!parsed.is_batch) {
      writer->SendJson(200, GenerateOutputJson(outputs[0], parsed.inputs[0], tok,
                                               parsed.return_text_in_logprobs));
      return;
    }
    json arr = json::array();
    for (size_t k = 0; k < outputs.size(); ++k) {
      arr.push_back(GenerateOutputJson(outputs[k], parsed.inputs[k], tok,
                                       parsed.return_text_in_logprobs));
    }
    writer->SendJson(200, arr);
  }
};

}  // namespace

void EngineServer::Impl::Generate(const http::Request& req, Writer w) {
  std::optional<json> body = ParseBody(req, w);
  if (!body) return;
  StatusOr<ParsedGenerate> parsed =
      ParseGenerateRequest(*body, &engine_->tokenizer(), limits_, &unknown_fields_);
  if (!parsed.ok()) {
    w->SendJson(HttpStatusFor(parsed.status()), ErrorJson(parsed.status()));
    return;
  }
  auto call = std::make_shared<GenerateCall>(workers_);
  call->parsed = std::move(parsed).value();
  call->writer = w;
  call->tok = &engine_->tokenizer();
  call->outputs.resize(call->parsed.inputs.size());
  call->remaining = call->parsed.inputs.size();
  if (call->parsed.stream) w->StartStream();
  for (size_t i = 0; i < call->parsed.inputs.size(); ++i) {
    GenerateInput in = call->parsed.inputs[i];
    call->ids.push_back(engine_->Submit(std::move(in), [call, i](const RequestOutput& out) {
      asio::post(call->strand, [call, i, out] { call->OnUpdate(i, out); });
    }));
  }
  Engine* engine = engine_;
  std::vector<uint64_t> ids = call->ids;
  w->OnClose([engine, ids] {
    for (uint64_t id : ids) engine->Cancel(id);
  });
}

// ---- OpenAI

namespace {

struct OpenAiCall {
  ParsedOpenAi parsed;
  OpenAiContext ctx;
  Writer writer;
  std::string id;
  int64_t created = 0;
  std::unique_ptr<OpenAiStream> stream;
  std::vector<RequestOutput> outputs;
  size_t remaining = 0;
  asio::strand<asio::thread_pool::executor_type> strand;

  explicit OpenAiCall(asio::thread_pool& pool) : strand(asio::make_strand(pool)) {}

  void OnUpdate(size_t i, const RequestOutput& out) {
    const bool finished = out.finish.finished();
    if (stream) {
      if (HttpStatusForFinish(out.finish) != 200) {
        writer->Write(http::SseEvent(http::ErrorBody(out.finish.message)));
      } else {
        for (const json& chunk : stream->OnOutput(out)) writer->Write(http::SseEvent(chunk));
      }
      if (finished && --remaining == 0) {
        if (auto usage = stream->UsageChunk()) writer->Write(http::SseEvent(*usage));
        writer->Write(std::string(http::kSseDone));
        writer->Finish();
      }
      return;
    }
    if (!finished) return;
    outputs[i] = out;
    if (--remaining > 0) return;
    const int status = HttpStatusForOutputs(outputs);
    if (status != 200) {
      for (const RequestOutput& o : outputs) {
        if (HttpStatusForFinish(o.finish) == status) {
          writer->SendJson(status, OpenAiErrorJson(absl::InvalidArgumentError(o.finish.message)));
          return;
        }
      }
    }
    writer->SendJson(200, OpenAiResponseJson(parsed, outputs, ctx, id, created));
  }
};

}  // namespace

void EngineServer::Impl::OpenAi(const http::Request& req, Writer w, OpenAiEndpoint endpoint) {
  std::optional<json> body = ParseBody(req, w);
  if (!body) return;
  auto call = std::make_shared<OpenAiCall>(workers_);
  call->ctx.tok = &engine_->tokenizer();
  call->ctx.limits = limits_;
  call->ctx.served_model_name = engine_->options().served_model_name;
  call->ctx.log = &unknown_fields_;
  StatusOr<ParsedOpenAi> parsed = endpoint == OpenAiEndpoint::kCompletions
                                      ? ParseCompletionRequest(*body, call->ctx)
                                      : ParseChatCompletionRequest(*body, call->ctx);
  if (!parsed.ok()) {
    w->SendJson(HttpStatusFor(parsed.status()), OpenAiErrorJson(parsed.status()));
    return;
  }
  call->parsed = std::move(parsed).value();
  call->writer = w;
  call->id = NewOpenAiId(endpoint);
  call->created = UnixSeconds();
  call->outputs.resize(call->parsed.inputs.size());
  call->remaining = call->parsed.inputs.size();
  if (call->parsed.stream) {
    call->stream = std::make_unique<OpenAiStream>(call->parsed, call->ctx, call->id, call->created);
    w->StartStream();
  }
  std::vector<uint64_t> ids;
  for (size_t i = 0; i < call->parsed.inputs.size(); ++i) {
    GenerateInput in = call->parsed.inputs[i];
    ids.push_back(engine_->Submit(std::move(in), [call, i](const RequestOutput& out) {
      asio::post(call->strand, [call, i, out] { call->OnUpdate(i, out); });
    }));
  }
  Engine* engine = engine_;
  w->OnClose([engine, ids] {
    for (uint64_t id : ids) engine->Cancel(id);
  });
}

// ---- Info and control

json EngineServer::Impl::ServerInfo() const {
  const EngineOptions& o = engine_->options();
  const EngineLoad load = engine_->load();
  json info = {
      {"model_path", o.model_path},
      {"tokenizer_path", o.tokenizer_path},
      {"served_model_name", o.served_model_name},
      {"tp_size", o.tp_size},
      {"dp_size", 1},
      {"pp_size", 1},
      {"ep_size", 1},
      {"moe_dp_size", 1},
      {"num_gpus", o.tp_size},  // devices (or CPU ranks) this engine drives
      {"enable_memory_saver", options_.enable_memory_saver},
      {"disaggregation_mode", "null"},
      {"disaggregation_bootstrap_port", nullptr},
      {"encoder_only", false},
      {"enable_return_routed_experts", o.enable_return_routed_experts},
      {"dtype", o.dtype},
      {"device", o.device},
      {"context_length", engine_->context_length()},
      {"page_size", o.page_size},
      {"mem_fraction_static", o.mem_fraction_static},
      {"max_running_requests", o.max_running_requests},
      {"chunked_prefill_size", o.chunked_prefill_size},
      {"max_prefill_tokens", o.chunked_prefill_size},
      {"disable_radix_cache", !o.enable_prefix_cache},
      {"enable_deterministic_inference", o.deterministic_inference},
      {"random_seed", o.random_seed},
      {"stream_interval", o.stream_interval},
      {"host", options_.host},
      {"port", port()},
      {"max_total_num_tokens", load.num_total_pages * o.page_size},
      {"max_req_input_len", engine_->context_length() - 1},
      {"weight_version", engine_->weight_version()},
      {"version", SLIME_VERSION},
      {"engine", "slime-cpp"},
  };
  info["internal_states"] = json::array({json{
      {"num_running_reqs", load.num_running},
      {"num_waiting_reqs", load.num_waiting},
      {"paused", engine_->paused()},
      {"memory_released", engine_->memory_released()},
  }});
  return info;
}

json EngineServer::Impl::ModelInfo() const {
  const EngineOptions& o = engine_->options();
  const model::ModelConfig& c = engine_->model_config();
  std::string arch = c.model_type == "qwen3"   ? "Qwen3ForCausalLM"
                     : c.model_type == "qwen2" ? "Qwen2ForCausalLM"
                                               : "LlamaForCausalLM";
  return {{"model_path", o.model_path},
          {"tokenizer_path", o.tokenizer_path},
          {"is_generation", true},
          {"preferred_sampling_params", nullptr},
          {"weight_version", engine_->weight_version()},
          {"has_image_understanding", false},
          {"has_audio_understanding", false},
          {"model_type", c.model_type},
          {"architectures", json::array({arch})}};
}

json EngineServer::Impl::Loads() const {
  const EngineLoad l = engine_->load();
  const int64_t page = engine_->options().page_size;
  const int64_t total = l.num_total_pages * page;
  const int64_t used = l.num_used_pages * page;
  json load = {{"dp_rank", 0},
               {"timestamp", IsoTimestamp()},
               {"num_running_reqs", l.num_running},
               {"num_waiting_reqs", l.num_waiting},
               {"num_reqs", l.num_running + l.num_waiting},
               {"num_used_tokens", used},
               {"num_total_tokens", total},
               {"max_total_num_tokens", total},
               {"token_usage", total > 0 ? static_cast<double>(used) / total : 0.0},
               {"num_cached_tokens", l.num_cached_pages * page}};
  return {{"timestamp", IsoTimestamp()},
          {"version", SLIME_VERSION},
          {"accelerator", engine_->options().device},
          {"num_accelerators", 1},
          {"loads", json::array({load})},
          {"aggregate",
           {{"total_running_reqs", l.num_running},
            {"total_waiting_reqs", l.num_waiting},
            {"total_reqs", l.num_running + l.num_waiting}}}};
}

const std::set<std::string>& AdminRoutes() {
  static const auto* routes = new std::set<std::string>{
      "/init_weights_update_group", "/update_weights_from_distributed",
      "/update_weights_from_tensor", "/update_weights_from_disk",
      "/destroy_weights_update_group", "/update_weight_version",
      "/release_memory_occupation", "/resume_memory_occupation",
      "/pause_generation", "/continue_generation",
      "/flush_cache", "/abort_request"};
  return *routes;
}

void EngineServer::Impl::AddRoutes(http::Router& r) {
  auto generate = [this](const http::Request& req, Writer w) { Generate(req, std::move(w)); };
  r.Add("POST", "/generate", generate);
  r.Add("PUT", "/generate", generate);
  r.Add("POST", "/v1/completions", [this](const http::Request& req, Writer w) {
    OpenAi(req, std::move(w), OpenAiEndpoint::kCompletions);
  });
  r.Add("POST", "/v1/chat/completions", [this](const http::Request& req, Writer w) {
    OpenAi(req, std::move(w), OpenAiEndpoint::kChatCompletions);
  });
  r.Add("GET", "/v1/models", [this](const http::Request&, Writer w) {
    w->SendJson(200, ModelsJson(engine_->options().served_model_name, UnixSeconds(),
                                engine_->context_length()));
  });
  r.Add("GET", "/health", [](const http::Request&, Writer w) { w->Send(200, "", "text/plain"); });
  r.Add("GET", "/health_generate", [this](const http::Request&, Writer w) {
    auto f = std::make_shared<std::future<Status>>(engine_->HealthCheck());
    const double timeout = options_.health_timeout_s;
    OnWorker([f, w, timeout] {
      if (f->wait_for(std::chrono::duration<double>(timeout)) != std::future_status::ready) {
        SendError(w, 503, fmt::format("engine made no progress within {} s", timeout));
        return;
      }
      Status s = f->get();
      if (s.ok()) {
        w->Send(200, "", "text/plain");
      } else {
        SendError(w, 503, std::string(s.message()));
      }
    });
  });
  auto server_info = [this](const http::Request&, Writer w) { w->SendJson(200, ServerInfo()); };
  r.Add("GET", "/server_info", server_info);
  r.Add("GET", "/get_server_info", server_info);
  auto model_info = [this](const http::Request&, Writer w) { w->SendJson(200, ModelInfo()); };
  r.Add("GET", "/model_info", model_info);
  r.Add("GET", "/get_model_info", model_info);
  auto weight_version = [this](const http::Request&, Writer w) {
    w->SendJson(200, {{"weight_version", engine_->weight_version()}});
  };
  r.Add("GET", "/get_weight_version", weight_version);
  r.Add("GET", "/weight_version", weight_version);
  r.Add("POST", "/update_weight_version", [this](const http::Request& req, Writer w) {
    std::optional<json> body = ParseBody(req, w);
    if (!body) return;
    const json& v = Member(*body, "new_version");
    if (!v.is_string()) {
      SendError(w, 400, "new_version must be a string");
      return;
    }
    if (Member(*body, "abort_all_requests").is_boolean() &&
        Member(*body, "abort_all_requests").get<bool>()) {
      engine_->Abort("", true);
    }
    engine_->set_weight_version(v.get<std::string>());
    w->SendJson(200, {{"success", true},
                      {"message", "weight version updated"},
                      {"new_version", v.get<std::string>()}});
  });
  auto flush = [this](const http::Request&, Writer w) {
    auto f = std::make_shared<std::future<bool>>(engine_->FlushCache());
    OnWorker([f, w] {
      if (f->get()) {
        w->Send(200, "Cache flushed.\n", "text/plain");
      } else {
        w->Send(400, "Cache not flushed: requests are still running or waiting.\n", "text/plain");
      }
    });
  };
  r.Add("GET", "/flush_cache", flush);
  r.Add("POST", "/flush_cache", flush);
  r.Add("POST", "/abort_request", [this](const http::Request& req, Writer w) {
    std::optional<json> body = ParseBody(req, w);
    if (!body) return;
    const json& rid = Member(*body, "rid");
    const json& all = Member(*body, "abort_all");
    if (!rid.is_null() && !rid.is_string()) {
      SendError(w, 400, "rid must be a string");
      return;
    }
    if (!all.is_null() && !all.is_boolean()) {
      SendError(w, 400, "abort_all must be a boolean");
      return;
    }
    const bool abort_all = all.is_boolean() && all.get<bool>();
    const std::string prefix = rid.is_string() ? rid.get<std::string>() : "";
    if (abort_all || !prefix.empty()) engine_->Abort(prefix, abort_all);
    w->Send(200, "", "text/plain");
  });
  r.Add("POST", "/pause_generation", [this](const http::Request& req, Writer w) {
    std::optional<json> body = ParseBody(req, w);
    if (!body) return;
    const json& mode = Member(*body, "mode");
    static const std::map<std::string, Engine::PauseMode> kModes = {
        {"abort", Engine::PauseMode::kAbort},
        {"in_place", Engine::PauseMode::kInPlace},
        {"retract", Engine::PauseMode::kRetract}};
    const auto known = mode.is_string() ? kModes.find(mode.get<std::string>()) : kModes.end();
    if (!mode.is_null() && known == kModes.end()) {
      SendError(w, 400,
                fmt::format("pause_generation: mode must be \"abort\" (in-flight requests end "
                            "with their partial output), \"in_place\" (they stay, K/V kept) or "
                            "\"retract\" (they return to the queue, K/V dropped); got {}",
                            mode.dump()));
      return;
    }
    engine_->Pause(mode.is_null() ? Engine::PauseMode::kAbort : known->second);
    w->SendJson(200, {{"message", "Generation paused successfully."}, {"status", "ok"}});
  });
  r.Add("POST", "/continue_generation", [this](const http::Request& req, Writer w) {
    if (!ParseBody(req, w)) return;
    engine_->Continue();
    w->SendJson(200, {{"message", "Generation continued successfully."}, {"status", "ok"}});
  });
  r.Add("GET", "/v1/loads", [this](const http::Request&, Writer w) { w->SendJson(200, Loads()); });
  auto memory = [this](bool release) {
    return [this, release](const http::Request& req, Writer w) {
      std::optional<json> body = ParseBody(req, w);
      if (!body) return;
      std::vector<std::string> tags = ReadTags(*body);
      for (const std::string& t : tags) {
        if (t != "weights" && t != "kv_cache" && t != "cuda_graph") {
          SendError(w, 400,
                    fmt::format("tags: unknown tag '{}' (use weights, kv_cache, cuda_graph)", t));
          return;
        }
      }
      auto f = std::make_shared<std::future<Status>>(release ? engine_->ReleaseMemory(tags)
                                                             : engine_->ResumeMemory(tags));
      OnWorker([f, w] {
        Status s = f->get();
        if (s.ok()) {
          w->SendJson(200, nullptr);
        } else {
          w->SendJson(400, ErrorJson(s));
        }
      });
    };
  };
  r.Add("POST", "/release_memory_occupation", memory(true));
  r.Add("POST", "/resume_memory_occupation", memory(false));
  r.Add("POST", "/update_weights_from_disk", [this](const http::Request& req, Writer w) {
    std::optional<json> body = ParseBody(req, w);
    if (!body) return;
    const json& path = Member(*body, "model_path");
    if (!path.is_string() || path.get<std::string>().empty()) {
      SendError(w, 400, "model_path must be a non-empty string (an HF safetensors directory)");
      return;
    }
    const json& version = Member(*body, "weight_version");
    if (!version.is_null() && !version.is_string()) {
      SendError(w, 400, "weight_version must be a string or null");
      return;
    }
    if (Member(*body, "abort_all_requests").is_boolean() &&
        Member(*body, "abort_all_requests").get<bool>()) {
      engine_->Abort("", true);
    }
    std::string v = version.is_string() ? version.get<std::string>() : engine_->weight_version();
    auto f = std::make_shared<std::future<Status>>(
        engine_->UpdateWeightsFromDisk(path.get<std::string>(), v));
    OnWorker([f, w] {
      Status s = f->get();
      w->SendJson(s.ok() ? 200 : 400,
                  {{"success", s.ok()},
                   {"message", s.ok() ? std::string("Succeeded to update model weights.")
                                      : std::string(s.message())},
                   {"num_paused_requests", 0}});
    });
  });
  WeightsRoutesOptions wo;
  wo.group_timeout_s = options_.weights_group_timeout_s;
  AddWeightsRoutes(r, engine_, wo, [this](std::function<void()> fn) { OnWorker(std::move(fn)); });
  if (registry_ != nullptr) {
    metrics::Registry* reg = registry_;
    r.Add("GET", "/metrics", [reg](const http::Request&, Writer w) {
      w->Send(200, reg->Exposition(), "text/plain; version=0.0.4");
    });
  }
}

// ---- EngineServer

EngineServer::EngineServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
EngineServer::~EngineServer() { Stop(); }

StatusOr<std::unique_ptr<EngineServer>> EngineServer::Start(Engine* engine,
                                                            metrics::Registry* registry,
                                                            EngineServerOptions options) {
  auto impl = std::make_unique<Impl>(engine, registry, std::move(options));
  SLIME_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<EngineServer>(new EngineServer(std::move(impl)));
}

int EngineServer::port() const { return impl_->port(); }

void EngineServer::Stop() {
  if (impl_) impl_->Stop();
}

}  // namespace slime::engine
