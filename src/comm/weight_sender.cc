// The trainer side of SGLang's distributed weight update (see include/slime/comm/weight_sender.h).
#include "slime/comm/weight_sender.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <chrono>
#include <thread>

#include "nlohmann/json.hpp"
#include "slime/comm/cuda_ipc.h"
#include "slime/http/client.h"

namespace slime::comm {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct DtypeEntry {
  const char* name;
  torch::ScalarType type;
};

const std::vector<DtypeEntry>& DtypeTable() {
  static const std::vector<DtypeEntry> table = {
      {"bfloat16", torch::kBFloat16}, {"float16", torch::kFloat16}, {"float32", torch::kFloat32},
      {"float64", torch::kFloat64},   {"int8", torch::kInt8},       {"uint8", torch::kUInt8},
      {"int16", torch::kInt16},       {"int32", torch::kInt32},     {"int64", torch::kInt64},
      {"bool", torch::kBool},
#if TORCH_VERSION_MAJOR >= 2
      {"float8_e4m3fn", at::ScalarType::Float8_e4m3fn},
      {"float8_e5m2", at::ScalarType::Float8_e5m2},
#endif
  };
  return table;
}

std::string Endpoint(const EngineEndpoint& e) { return fmt::format("{}:{}", e.host, e.port); }

// The engine's {"success", "message"} answer as a Status naming the engine and the call.
Status CheckReply(const EngineEndpoint& e, const std::string& path,
                  const StatusOr<http::Response>& r) {
  if (!r.ok()) {
    return Status(r.status().code(),
                  fmt::format("engine {}: {}: {}", Endpoint(e), path, std::string(r.status().message())));
  }
  json j = json::parse(r->body, nullptr, false);
  const bool success = j.is_object() && j.value("success", r->status == 200);
  if (r->status == 200 && success) return absl::OkStatus();
  std::string message = r->body;
  if (j.is_object() && j.contains("message") && j["message"].is_string()) {
    message = j["message"].get<std::string>();
  } else if (j.is_object() && j.contains("error") && j["error"].is_object()) {
    message = j["error"].value("message", r->body);
  }
  return absl::FailedPreconditionError(
      fmt::format("engine {}: {} answered {}: {}", Endpoint(e), path, r->status, message));
}

}  // namespace

StatusOr<torch::ScalarType> ParseDtypeName(const std::string& name) {
  std::string n = name.rfind("torch.", 0) == 0 ? name.substr(6) : name;
  for (const DtypeEntry& e : DtypeTable()) {
    if (n == e.name) return e.type;
  }
  std::string valid;
  for (const DtypeEntry& e : DtypeTable()) valid += (valid.empty() ? "" : ", ") + std::string(e.name);
  return absl::InvalidArgumentError(
      fmt::format("dtype '{}' is not supported (use one of {})", name, valid));
}

std::string DtypeName(torch::ScalarType dtype) {
  for (const DtypeEntry& e : DtypeTable()) {
    if (e.type == dtype) return e.name;
  }
  return c10::toString(dtype);
}

std::vector<std::pair<size_t, size_t>> PlanBuckets(const std::vector<model::NamedTensor>& tensors,
                                                   int64_t bucket_bytes) {
  std::vector<std::pair<size_t, size_t>> buckets;
  size_t begin = 0;
  int64_t bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int64_t n = tensors[i].tensor.numel() * tensors[i].tensor.element_size();
    if (i > begin && bytes + n > bucket_bytes) {
      buckets.emplace_back(begin, i);
      begin = i;
      bytes = 0;
    }
    bytes += n;
  }
  if (begin < tensors.size()) buckets.emplace_back(begin, tensors.size());
  return buckets;
}

namespace {

// Tensor `i` from `fetch`, checked against its entry in `shapes`.
StatusOr<torch::Tensor> Fetch(const std::vector<model::NamedTensor>& shapes,
                              const TensorFetchFn& fetch, size_t i) {
  SLIME_ASSIGN_OR_RETURN(torch::Tensor t, fetch(i));
  const torch::Tensor& like = shapes[i].tensor;
  if (!t.defined() || t.sizes() != like.sizes() || t.scalar_type() != like.scalar_type()) {
    return absl::InternalError(fmt::format(
        "weight sync: '{}' was produced as {} [{}], listed as {} [{}]", shapes[i].name,
        t.defined() ? DtypeName(t.scalar_type()) : "undefined",
        t.defined() ? fmt::format("{}", fmt::join(t.sizes(), ", ")) : "",
        DtypeName(like.scalar_type()), fmt::format("{}", fmt::join(like.sizes(), ", "))));
  }
  return t;
}

}  // namespace

Status WeightSender::PostAll(const std::string& path, const std::vector<std::string>& bodies,
                             const std::function<Status()>& during) {
  std::vector<StatusOr<http::Response>> replies(options_.engines.size(),
                                                absl::UnknownError("not sent"));
  std::vector<std::thread> threads;
  http::ClientOptions co;
  co.timeout = std::chrono::milliseconds(static_cast<int64_t>(options_.timeout_s * 1000));
  co.keep_alive = false;
  co.bearer_token = options_.bearer_token;
  for (size_t e = 0; e < options_.engines.size(); ++e) {
    threads.emplace_back([&, e] {
      http::Client client(options_.engines[e].host, options_.engines[e].port, co);
      replies[e] = client.Post(path, bodies[e]);
    });
  }
  Status local = during ? during() : absl::OkStatus();
  for (std::thread& t : threads) t.join();
  // A local broadcast failure usually explains the engines' errors: report it first.
  if (!local.ok()) return local;
  for (size_t e = 0; e < options_.engines.size(); ++e) {
    SLIME_RETURN_IF_ERROR(CheckReply(options_.engines[e], path, replies[e]));
  }
  return absl::OkStatus();
}

namespace {

// Before any collective: every engine accepts the access key on an admin route. A refusal would
// otherwise surface only as the weight-update group's rendezvous timing out (the engine never
// joins). GET /flush_cache changes nothing that the first weight update would not (it flushes the
// prefix cache too); any answer but 401/403 passes, so servers without the route still connect.
Status CheckEngineAccess(const WeightSenderOptions& o) {
  http::ClientOptions co;
  co.timeout = std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000));
  co.keep_alive = false;
  co.bearer_token = o.bearer_token;
  for (const EngineEndpoint& e : o.engines) {
    http::Client client(e.host, e.port, co);
    StatusOr<http::Response> r = client.Get("/flush_cache");
    if (r.ok() && (r->status == 401 || r->status == 403)) {
      return absl::PermissionDeniedError(fmt::format(
          "engine {} refused the job's access key (GET /flush_cache returned HTTP {}){}: "
          "cluster.engine_api_key / cluster.engine_admin_api_key must match the engine's "
          "--api-key / --admin-api-key",
          Endpoint(e), r->status, o.bearer_token.empty() ? ", and the job sent none" : ""));
    }
  }
  return absl::OkStatus();
}

}  // namespace

StatusOr<std::unique_ptr<WeightSender>> WeightSender::Connect(WeightSenderOptions options) {
  if (options.engines.empty()) return absl::InvalidArgumentError("no engines to send weights to");
  if (options.bucket_bytes < 1) {
    return absl::InvalidArgumentError(
        fmt::format("bucket size must be >= 1 byte, got {}", options.bucket_bytes));
  }
  int world = 1;
  for (const EngineEndpoint& e : options.engines) {
    if (e.num_gpus < 1) {
      return absl::InvalidArgumentError(
          fmt::format("engine {} has num_gpus {} (must be >= 1)", Endpoint(e), e.num_gpus));
    }
    world += e.num_gpus;
  }
  std::unique_ptr<WeightSender> sender(new WeightSender(std::move(options)));
  const WeightSenderOptions& o = sender->options_;
  SLIME_RETURN_IF_ERROR(CheckEngineAccess(o));
  if (sender->ipc()) {
    if (!o.device.is_cuda() || !CudaIpcBuilt()) {
      return absl::FailedPreconditionError(fmt::format(
          "the cuda_ipc weight transport needs a CUDA trainer in a CUDA build (device {})",
          o.device.str()));
    }
    spdlog::info("comm: weight sender hands weights to {} colocated engine(s) by CUDA IPC",
                 o.engines.size());
    return sender;
  }
  ProcessGroupOptions po;
  po.master_address = o.master_address;
  po.master_port = o.master_port;
  po.world_size = world;
  po.rank = 0;
  po.group_name = o.group_name;
  po.backend = o.backend;
  po.timeout_s = o.timeout_s;
  SLIME_ASSIGN_OR_RETURN(sender->group_, ProcessGroup::Open(po));
  std::vector<std::string> bodies;
  int offset = 1;
  for (const EngineEndpoint& e : o.engines) {
    bodies.push_back(json{{"master_address", o.master_address},
                          {"master_port", sender->group_->port()},
                          {"rank_offset", offset},
                          {"world_size", world},
                          {"group_name", o.group_name},
                          {"backend", sender->group_->backend()}}
                         .dump());
    offset += e.num_gpus;
  }
  ProcessGroup* pg = sender->group_.get();
  SLIME_RETURN_IF_ERROR(
      sender->PostAll("/init_weights_update_group", bodies, [pg] { return pg->Join(); }));
  spdlog::info("comm: weight sender connected to {} engine(s), group '{}' ({}, world {})",
               o.engines.size(), o.group_name, pg->backend(), world);
  return sender;
}

WeightSender::~WeightSender() {
  Status s = Disconnect();
  if (!s.ok()) spdlog::warn("comm: weight sender disconnect: {}", std::string(s.message()));
}

Status WeightSender::Disconnect() {
  if (!group_) return absl::OkStatus();
  group_.reset();
  std::vector<std::string> bodies(options_.engines.size(),
                                  json{{"group_name", options_.group_name}}.dump());
  return PostAll("/destroy_weights_update_group", bodies, nullptr);
}

StatusOr<SyncStats> WeightSender::Send(const std::vector<model::NamedTensor>& tensors,
                                       const std::string& weight_version, bool flush_cache) {
  return Send(
      tensors, [&tensors](size_t i) -> StatusOr<torch::Tensor> { return tensors[i].tensor; },
      weight_version, flush_cache);
}

StatusOr<SyncStats> WeightSender::Send(const std::vector<model::NamedTensor>& tensors,
                                       const TensorFetchFn& fetch,
                                       const std::string& weight_version, bool flush_cache) {
  if (ipc()) return SendIpc(tensors, fetch, weight_version, flush_cache);
  if (!group_) return absl::FailedPreconditionError("weight sender is disconnected");
  const auto t0 = Clock::now();
  SyncStats stats;
  const torch::Device dev = group_->device();
  const auto buckets = PlanBuckets(tensors, options_.bucket_bytes);
  for (size_t b = 0; b < buckets.size(); ++b) {
    const auto [begin, end] = buckets[b];
    std::vector<torch::Tensor> payload;
    std::vector<std::string> names;
    json dtypes = json::array(), shapes = json::array();
    for (size_t i = begin; i < end; ++i) {
      StatusOr<torch::Tensor> fetched = Fetch(tensors, fetch, i);
      if (!fetched.ok()) {
        return Status(fetched.status().code(),
                      fmt::format("preparing bucket {} of {}: {}", b + 1, buckets.size(),
                                  std::string(fetched.status().message())));
      }
      try {
        torch::NoGradGuard no_grad;
        torch::Tensor t = fetched->detach();
        if (options_.dtype && t.scalar_type() != *options_.dtype) t = t.to(*options_.dtype);
        t = t.to(dev).contiguous();
        names.push_back(tensors[i].name);
        dtypes.push_back(DtypeName(t.scalar_type()));
        shapes.push_back(t.sizes().vec());
        stats.bytes += t.numel() * t.element_size();
        payload.push_back(std::move(t));
      } catch (const std::exception& e) {
        return absl::InternalError(fmt::format("preparing bucket {} of {} for '{}': {}", b + 1,
                                               buckets.size(), tensors[i].name,
                                               std::string(e.what()).substr(0, 300)));
      }
    }
    // The last bucket carries the version, so engines report it only once all weights are in.
    json body = {{"names", names},
                 {"dtypes", dtypes},
                 {"shapes", shapes},
                 {"group_name", options_.group_name},
                 {"flush_cache", flush_cache && b + 1 == buckets.size()},
                 {"weight_version", b + 1 == buckets.size() ? json(weight_version) : json()},
                 {"load_format", nullptr}};
    std::vector<std::string> bodies(options_.engines.size(), body.dump());
    ProcessGroup* pg = group_.get();
    Status s = PostAll("/update_weights_from_distributed", bodies,
                       [&] { return pg->Broadcast(payload, 0, names); });
    if (!s.ok()) {
      return Status(s.code(), fmt::format("weight sync, bucket {} of {} ({} tensors from '{}'): {}",
                                          b + 1, buckets.size(), names.size(), names.front(),
                                          std::string(s.message())));
    }
    stats.tensors += static_cast<int64_t>(names.size());
    ++stats.buckets;
  }
  stats.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return stats;
}

StatusOr<SyncStats> WeightSender::SendIpc(const std::vector<model::NamedTensor>& tensors,
                                          const TensorFetchFn& fetch,
                                          const std::string& weight_version, bool flush_cache) {
  const auto t0 = Clock::now();
  SyncStats stats;
  const auto buckets = PlanBuckets(tensors, options_.bucket_bytes);
  int64_t capacity = 0;
  for (const auto& [begin, end] : buckets) {
    std::vector<model::NamedTensor> part(tensors.begin() + begin, tensors.begin() + end);
    capacity = std::max(capacity, IpcExportBuffer::PackedBytes(part, options_.dtype));
  }
  if (capacity == 0) return stats;
  SLIME_ASSIGN_OR_RETURN(std::unique_ptr<IpcExportBuffer> buffer,
                         IpcExportBuffer::Create(options_.device, capacity));
  for (size_t b = 0; b < buckets.size(); ++b) {
    const auto [begin, end] = buckets[b];
    std::vector<model::NamedTensor> part;
    Status s = absl::OkStatus();
    for (size_t i = begin; i < end && s.ok(); ++i) {
      StatusOr<torch::Tensor> fetched = Fetch(tensors, fetch, i);
      s = fetched.status();
      if (s.ok()) part.push_back({tensors[i].name, *std::move(fetched)});
    }
    StatusOr<IpcBucket> bucket =
        s.ok() ? buffer->Pack(part, options_.dtype) : StatusOr<IpcBucket>(s);
    s = bucket.status();
    if (s.ok()) {
      // One entry per engine GPU (SGLang's serialized_named_tensors shape); our engines have one.
      json body = {{"load_format", "slime_cuda_ipc"},
                   {"ipc_buckets", json::array({IpcBucketToJson(*bucket)})},
                   {"flush_cache", flush_cache && b + 1 == buckets.size()},
                   {"weight_version", b + 1 == buckets.size() ? json(weight_version) : json()}};
      std::vector<std::string> bodies(options_.engines.size(), body.dump());
      s = PostAll("/update_weights_from_tensor", bodies, nullptr);
    }
    if (!s.ok()) {
      return Status(s.code(), fmt::format("weight sync (CUDA IPC), bucket {} of {} ({} tensors "
                                          "from '{}'): {}",
                                          b + 1, buckets.size(), end - begin, tensors[begin].name,
                                          std::string(s.message())));
    }
    for (const IpcTensor& t : bucket->tensors) {
      int64_t n = static_cast<int64_t>(c10::elementSize(t.dtype));
      for (int64_t d : t.shape) n *= d;
      stats.bytes += n;
    }
    stats.tensors += static_cast<int64_t>(part.size());
    ++stats.buckets;
  }
  stats.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return stats;
}

Status WeightSender::PauseEngines(InFlight in_flight) {
  const std::string body = in_flight == InFlight::kKeep ? R"({"mode":"retract"})" : "{}";
  std::vector<std::string> bodies(options_.engines.size(), body);
  SLIME_RETURN_IF_ERROR(PostAll("/pause_generation", bodies, nullptr));
  if (in_flight == InFlight::kKeep) return absl::OkStatus();  // retracted requests are waiting, not idle
  for (const EngineEndpoint& e : options_.engines) {
    http::Client client(e.host, e.port, http::ClientOptions{.bearer_token = options_.bearer_token});
    const auto deadline = Clock::now() + std::chrono::milliseconds(
                                             static_cast<int64_t>(options_.timeout_s * 1000));
    while (true) {
      StatusOr<http::Response> r = client.Get("/flush_cache");
      if (r.ok() && r->status == 200) break;
      if (Clock::now() >= deadline) {
        return absl::DeadlineExceededError(fmt::format(
            "engine {}: /flush_cache did not succeed within {} s: {}", Endpoint(e),
            options_.timeout_s, r.ok() ? r->body : std::string(r.status().message())));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  return absl::OkStatus();
}

Status WeightSender::ContinueEngines() {
  for (size_t e = 0; e < options_.engines.size(); ++e) {
    http::Client client(options_.engines[e].host, options_.engines[e].port,
                        http::ClientOptions{.bearer_token = options_.bearer_token});
    StatusOr<http::Response> r = client.Post("/continue_generation", "{}");
    if (!r.ok() || r->status != 200) {
      return absl::UnavailableError(fmt::format(
          "engine {}: /continue_generation failed: {}", Endpoint(options_.engines[e]),
          r.ok() ? r->body : std::string(r.status().message())));
    }
  }
  return absl::OkStatus();
}

}  // namespace slime::comm
