// Weight-plane HTTP routes (see src/engine/weights_routes.h).
#include "weights_routes.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <future>
#include <functional>
#include <memory>
#include <string>

#include "nlohmann/json.hpp"
#include "slime/comm/cuda_ipc.h"
#include "slime/comm/process_group.h"
#include "slime/comm/weight_sender.h"
#include "slime/engine/engine.h"
#include "slime/engine/protocol.h"
#include "slime/http/response_writer.h"
#include "slime/http/router.h"
#include "slime/http/util.h"

namespace slime::engine {
namespace {

using json = nlohmann::json;
using Writer = std::shared_ptr<http::ResponseWriter>;

void Reply(const Writer& w, const Status& s, const std::string& ok_message) {
  w->SendJson(s.ok() ? 200 : 400,
              {{"success", s.ok()}, {"message", s.ok() ? ok_message : std::string(s.message())}});
}

// The body as a JSON object, or an error naming the route.
StatusOr<json> Body(const http::Request& req, const char* route) {
  if (req.body.find_first_not_of(" \t\r\n") == std::string::npos) return json::object();
  json j = json::parse(req.body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(fmt::format("{}: the body must be a JSON object", route));
  }
  return j;
}

StatusOr<std::string> String(const json& body, const char* key, const char* def = nullptr) {
  const json& v = Member(body, key);
  if (v.is_null() && def != nullptr) return std::string(def);
  if (!v.is_string()) {
    return absl::InvalidArgumentError(fmt::format("{} must be a string{}", key,
                                                  def ? "" : " (required)"));
  }
  return v.get<std::string>();
}

StatusOr<int64_t> Int(const json& body, const char* key, int64_t lo, int64_t hi) {
  const json& v = Member(body, key);
  if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > hi) {
    return absl::InvalidArgumentError(
        fmt::format("{} must be an integer in [{}, {}] (required), got {}", key, lo, hi, v.dump()));
  }
  return v.get<int64_t>();
}

StatusOr<bool> Bool(const json& body, const char* key, bool def) {
  const json& v = Member(body, key);
  if (v.is_null()) return def;
  if (!v.is_boolean()) return absl::InvalidArgumentError(fmt::format("{} must be a boolean", key));
  return v.get<bool>();
}

StatusOr<comm::ProcessGroupOptions> ParseInit(const json& body, double timeout_s) {
  comm::ProcessGroupOptions o;
  SLIME_ASSIGN_OR_RETURN(o.master_address, String(body, "master_address"));
  SLIME_ASSIGN_OR_RETURN(int64_t port, Int(body, "master_port", 1, 65535));
  SLIME_ASSIGN_OR_RETURN(int64_t world, Int(body, "world_size", 2, 1 << 20));
  SLIME_ASSIGN_OR_RETURN(int64_t offset, Int(body, "rank_offset", 1, world - 1));
  SLIME_ASSIGN_OR_RETURN(o.group_name, String(body, "group_name", "weight_update_group"));
  SLIME_ASSIGN_OR_RETURN(o.backend, String(body, "backend", "nccl"));
  if (o.group_name.empty()) return absl::InvalidArgumentError("group_name must not be empty");
  o.master_port = static_cast<int>(port);
  o.world_size = static_cast<int>(world);
  o.rank = static_cast<int>(offset);  // the first of this engine's tp_size ranks (Engine adds r)
  o.timeout_s = timeout_s;
  return o;
}

StatusOr<DistributedWeightsUpdate> ParseUpdate(const json& body) {
  DistributedWeightsUpdate u;
  const json& names = Member(body, "names");
  const json& dtypes = Member(body, "dtypes");
  const json& shapes = Member(body, "shapes");
  if (!names.is_array() || !dtypes.is_array() || !shapes.is_array()) {
    return absl::InvalidArgumentError("names, dtypes and shapes must be arrays (required)");
  }
  if (names.size() != dtypes.size() || names.size() != shapes.size()) {
    return absl::InvalidArgumentError(fmt::format(
        "names, dtypes and shapes must have the same length, got {}, {} and {}", names.size(),
        dtypes.size(), shapes.size()));
  }
  for (size_t i = 0; i < names.size(); ++i) {
    if (!names[i].is_string() || names[i].get<std::string>().empty()) {
      return absl::InvalidArgumentError(fmt::format("names[{}] must be a non-empty string", i));
    }
    const std::string name = names[i].get<std::string>();
    if (!dtypes[i].is_string()) {
      return absl::InvalidArgumentError(fmt::format("dtypes[{}] ('{}') must be a string", i, name));
    }
    StatusOr<torch::ScalarType> dt = comm::ParseDtypeName(dtypes[i].get<std::string>());
    if (!dt.ok()) {
      return absl::InvalidArgumentError(fmt::format("tensor '{}': {}", name, std::string(dt.status().message())));
    }
    std::vector<int64_t> shape;
    bool valid = shapes[i].is_array();
    for (size_t k = 0; valid && k < shapes[i].size(); ++k) {
      valid = shapes[i][k].is_number_integer() && shapes[i][k].get<int64_t>() >= 0;
      if (valid) shape.push_back(shapes[i][k].get<int64_t>());
    }
    if (!valid) {
      return absl::InvalidArgumentError(fmt::format(
          "tensor '{}': shapes[{}] must be a list of non-negative integers, got {}", name, i,
          shapes[i].dump()));
    }
    u.names.push_back(name);
    u.dtypes.push_back(dtypes[i].get<std::string>());
    u.shapes.push_back(std::move(shape));
  }
  SLIME_ASSIGN_OR_RETURN(u.group_name, String(body, "group_name", "weight_update_group"));
  SLIME_ASSIGN_OR_RETURN(u.flush_cache, Bool(body, "flush_cache", true));
  const json& version = Member(body, "weight_version");
  if (!version.is_null() && !version.is_string()) {
    return absl::InvalidArgumentError("weight_version must be a string or null");
  }
  if (version.is_string()) u.weight_version = version.get<std::string>();
  const json& format = Member(body, "load_format");
  if (!format.is_null()) {
    return absl::InvalidArgumentError(fmt::format(
        "load_format {} is not supported (null: one broadcast per tensor)", format.dump()));
  }
  return u;
}

// POST /update_weights_from_tensor, either of
//   {"load_format": "slime_cuda_ipc", "ipc_buckets": [bucket], ...}   (comm/cuda_ipc.h), or
//   {"load_format": "flattened_bucket", "serialized_named_tensors": [entry per TP rank], ...}
//   (SGLang's, as slime's colocated trainer sends it; comm/torch_pickle.h),
// with "flush_cache" and "weight_version". Every entry is decoded and checked here, on the HTTP
// thread, so a bad one is a 400 that changes nothing.
StatusOr<TensorWeightsUpdate> ParseTensorUpdate(const json& body) {
  const json& format = Member(body, "load_format");
  const std::string f = format.is_string() ? format.get<std::string>() : "";
  TensorWeightsUpdate u;
  if (f == "slime_cuda_ipc") {
    const json& buckets = Member(body, "ipc_buckets");
    if (!buckets.is_array() || buckets.size() != 1) {
      return absl::InvalidArgumentError(fmt::format(
          "ipc_buckets must be an array with one bucket per engine GPU (this engine has 1), got {}",
          buckets.is_array() ? std::to_string(buckets.size()) + " entries" : buckets.dump()));
    }
    StatusOr<comm::IpcBucket> bucket = comm::IpcBucketFromJson(buckets[0]);
    if (!bucket.ok()) {
      return absl::InvalidArgumentError(
          fmt::format("ipc_buckets[0]: {}", std::string(bucket.status().message())));
    }
    u.bucket = std::make_shared<const comm::IpcBucket>(*std::move(bucket));
  } else if (f == "flattened_bucket") {
    const json& entries = Member(body, "serialized_named_tensors");
    if (!entries.is_array() || entries.empty()) {
      return absl::InvalidArgumentError(
          "serialized_named_tensors must be a non-empty array of strings (one per engine TP "
          "rank: base64 of the pickled {flattened_tensor, metadata})");
    }
    for (size_t i = 0; i < entries.size(); ++i) {
      if (!entries[i].is_string()) {
        return absl::InvalidArgumentError(
            fmt::format("serialized_named_tensors[{}] must be a string", i));
      }
      StatusOr<comm::SglangBucket> b = comm::DecodeSglangBucket(entries[i].get<std::string>());
      if (!b.ok()) {
        return absl::InvalidArgumentError(fmt::format("serialized_named_tensors[{}]: {}", i,
                                                      std::string(b.status().message())));
      }
      u.sglang.push_back(std::make_shared<const comm::SglangBucket>(*std::move(b)));
    }
  } else {
    return absl::InvalidArgumentError(fmt::format(
        "load_format {} is not supported: this route takes \"flattened_bucket\" (SGLang's "
        "serialized_named_tensors) or \"slime_cuda_ipc\" (a CUDA IPC buffer described in "
        "JSON); SGLang's per-tensor form (load_format null) is not accepted, use "
        "/update_weights_from_distributed or /update_weights_from_disk",
        format.dump()));
  }
  SLIME_ASSIGN_OR_RETURN(u.flush_cache, Bool(body, "flush_cache", true));
  const json& version = Member(body, "weight_version");
  if (!version.is_null() && !version.is_string()) {
    return absl::InvalidArgumentError("weight_version must be a string or null");
  }
  if (version.is_string()) u.weight_version = version.get<std::string>();
  return u;
}

// GET|POST /get_weights_by_name {"name": str, "truncate_size": int = 100} (GET may pass both
// as query parameters instead): SGLang's answer, the parameter's first truncate_size rows in
// float32 as a bare JSON (nested) list; 400 {"error": {"message"}} otherwise.
struct WeightsByNameQuery {
  std::string name;
  int64_t truncate_size = 100;
};

StatusOr<WeightsByNameQuery> ParseWeightsByName(const http::Request& req) {
  json body = json::object();
  if (req.body.find_first_not_of(" \t\r\n") != std::string::npos) {
    SLIME_ASSIGN_OR_RETURN(body, Body(req, "/get_weights_by_name"));
  } else {
    for (const auto& [k, v] : req.query) {
      if (k == "name") body["name"] = v;
      if (k == "truncate_size") {
        json n = json::parse(v, nullptr, false);
        body["truncate_size"] = n.is_discarded() ? json(v) : n;
      }
    }
  }
  WeightsByNameQuery q;
  SLIME_ASSIGN_OR_RETURN(q.name, String(body, "name"));
  if (!Member(body, "truncate_size").is_null()) {
    SLIME_ASSIGN_OR_RETURN(q.truncate_size, Int(body, "truncate_size", 0, int64_t{1} << 40));
  }
  return q;
}

// values[offset ...] shaped as shape[dim ...], as nested JSON lists (numpy's tolist()).
json NestedList(const std::vector<int64_t>& shape, const std::vector<float>& values, size_t dim,
                size_t& offset) {
  json out = json::array();
  for (int64_t i = 0; i < shape[dim]; ++i) {
    if (dim + 1 == shape.size()) {
      out.push_back(values[offset++]);
    } else {
      out.push_back(NestedList(shape, values, dim + 1, offset));
    }
  }
  return out;
}

// A weight-update route: parse the body (`parse`), abort everything in flight when asked
// (abort_all_requests), queue the update on the engine (`start`) and answer once it is done.
template <typename Parse, typename Start>
void AddUpdateRoute(http::Router& r, const std::string& path, Engine* engine,
                    const std::function<void(std::function<void()>)>& on_worker, Parse parse,
                    Start start) {
  r.Add("POST", path, [path, engine, on_worker, parse, start](const http::Request& req, Writer w) {
    StatusOr<json> body = Body(req, path.c_str());
    if (!body.ok()) return Reply(w, body.status(), "");
    auto u = parse(*body);
    if (!u.ok()) return Reply(w, u.status(), "");
    StatusOr<bool> abort_all = Bool(*body, "abort_all_requests", false);
    if (!abort_all.ok()) return Reply(w, abort_all.status(), "");
    if (*abort_all) engine->Abort("", true);
    auto f = std::make_shared<std::future<Status>>(start(engine, *std::move(u)));
    on_worker([f, w, path] {
      Status s = f->get();
      if (!s.ok()) spdlog::warn("engine: {}: {}", path.substr(1), std::string(s.message()));
      Reply(w, s, "Succeeded to update parameter online.");
    });
  });
}

}  // namespace

void AddWeightsRoutes(http::Router& r, Engine* engine, WeightsRoutesOptions options,
                      std::function<void(std::function<void()>)> on_worker) {
  r.Add("POST", "/init_weights_update_group",
        [engine, options, on_worker](const http::Request& req, Writer w) {
          StatusOr<json> body = Body(req, "/init_weights_update_group");
          StatusOr<comm::ProcessGroupOptions> o =
              body.ok() ? ParseInit(*body, options.group_timeout_s)
                        : StatusOr<comm::ProcessGroupOptions>(body.status());
          if (!o.ok()) return Reply(w, o.status(), "");
          auto f = std::make_shared<std::future<Status>>(engine->InitWeightsUpdateGroup(*o));
          on_worker([f, w, name = o->group_name] {
            Status s = f->get();
            if (!s.ok()) spdlog::warn("engine: init_weights_update_group '{}': {}", name, std::string(s.message()));
            Reply(w, s, "Succeeded to initialize custom process group.");
          });
        });
  AddUpdateRoute(r, "/update_weights_from_distributed", engine, on_worker, ParseUpdate,
                 [](Engine* e, DistributedWeightsUpdate u) {
                   return e->UpdateWeightsFromDistributed(std::move(u));
                 });
  AddUpdateRoute(r, "/update_weights_from_tensor", engine, on_worker, ParseTensorUpdate,
                 [](Engine* e, TensorWeightsUpdate u) {
                   return e->UpdateWeightsFromTensor(std::move(u));
                 });
  // GET /weights_checksum: {"success": true, "weight_version", "dtype", "tensors": [{"name",
  // "checksum"}, ...]} in HF parameter order, computed on the engine thread between steps (the
  // hashing itself takes the engine thread for about a second per GB of weights); 400 with
  // "message" when the weights are released.
  r.Add("GET", "/weights_checksum", [engine, on_worker](const http::Request&, Writer w) {
    auto f = std::make_shared<std::future<StatusOr<Engine::WeightChecksumList>>>(
        engine->WeightChecksums());
    on_worker([f, w, engine] {
      StatusOr<Engine::WeightChecksumList> list = f->get();
      if (!list.ok()) return Reply(w, list.status(), "");
      json tensors = json::array();
      for (const auto& [name, checksum] : list->checksums) {
        tensors.push_back({{"name", name}, {"checksum", checksum}});
      }
      w->SendJson(200, {{"success", true},
                        {"weight_version", engine->weight_version()},
                        {"dtype", list->dtype},
                        {"tensors", std::move(tensors)}});
    });
  });
  auto weights_by_name = [engine, on_worker](const http::Request& req, Writer w) {
    StatusOr<WeightsByNameQuery> q = ParseWeightsByName(req);
    if (!q.ok()) return w->SendJson(400, http::ErrorBody(std::string(q.status().message())));
    auto f = std::make_shared<std::future<StatusOr<Engine::WeightSlice>>>(
        engine->WeightByName(q->name, q->truncate_size));
    on_worker([f, w] {
      StatusOr<Engine::WeightSlice> slice = f->get();
      if (!slice.ok()) {
        return w->SendJson(400, http::ErrorBody(std::string(slice.status().message())));
      }
      size_t offset = 0;
      w->SendJson(200, NestedList(slice->shape, slice->values, 0, offset));
    });
  };
  r.Add("GET", "/get_weights_by_name", weights_by_name);
  r.Add("POST", "/get_weights_by_name", weights_by_name);
  r.Add("POST", "/destroy_weights_update_group",
        [engine, on_worker](const http::Request& req, Writer w) {
          StatusOr<json> body = Body(req, "/destroy_weights_update_group");
          StatusOr<std::string> name = body.ok() ? String(*body, "group_name", "weight_update_group")
                                                 : StatusOr<std::string>(body.status());
          if (!name.ok()) return Reply(w, name.status(), "");
          on_worker([engine, w, n = *name] {
            Reply(w, engine->DestroyWeightsUpdateGroup(n),
                  "Succeeded to destroy custom process group.");
          });
        });
}

}  // namespace slime::engine
