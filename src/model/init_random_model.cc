// Random-weight HF model directories (see include/slime/model/init_random_model.h).
#include "slime/model/init_random_model.h"

#include <fmt/format.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "internal.h"
#include "slime/model/config.h"
#include "slime/model/weights.h"
#include "torch_util.h"

namespace slime::model {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

struct DTypeChoice {
  torch::ScalarType torch_dtype;
  const char* hf_name;
};

StatusOr<DTypeChoice> ParseDType(const std::string& s) {
  if (s == "bf16" || s == "bfloat16") return DTypeChoice{torch::kBFloat16, "bfloat16"};
  if (s == "fp32" || s == "float32") return DTypeChoice{torch::kFloat32, "float32"};
  return absl::InvalidArgumentError(
      fmt::format("dtype \"{}\" is not supported (use bf16 or fp32)", s));
}

// Largest token id of a tokenizer.json (model vocab and added tokens).
StatusOr<int64_t> MaxTokenId(const std::string& path) {
  SLIME_ASSIGN_OR_RETURN(std::string text, internal::ReadFileToString(path));
  Json root;
  try {
    root = Json::parse(text);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(
        fmt::format("{}: not valid JSON: {}", path, std::string(e.what())));
  }
  if (!root.is_object())
    return absl::InvalidArgumentError(fmt::format("{}: not a JSON object", path));
  int64_t max_id = -1;
  if (auto m = root.find("model"); m != root.end() && m->is_object()) {
    if (auto vocab = m->find("vocab"); vocab != m->end()) {
      if (vocab->is_object()) {  // BPE / WordPiece / WordLevel: token -> id
        for (const auto& [token, id] : vocab->items()) {
          if (id.is_number_integer()) max_id = std::max(max_id, id.get<int64_t>());
        }
      } else if (vocab->is_array()) {  // Unigram: [[token, score], ...], id = index
        max_id = std::max<int64_t>(max_id, static_cast<int64_t>(vocab->size()) - 1);
      }
    }
  }
  if (auto added = root.find("added_tokens"); added != root.end() && added->is_array()) {
    for (const Json& t : *added) {
      if (t.is_object() && t.contains("id") && t["id"].is_number_integer()) {
        max_id = std::max(max_id, t["id"].get<int64_t>());
      }
    }
  }
  if (max_id < 0) {
    return absl::InvalidArgumentError(
        fmt::format("{}: no token ids found (expected model.vocab or added_tokens)", path));
  }
  return max_id;
}

Status CopyFile(const fs::path& from, const fs::path& to) {
  SLIME_ASSIGN_OR_RETURN(std::string bytes, internal::ReadFileToString(from.string()));
  return internal::WriteFileAtomically(to.string(), bytes);
}

Status Build(const InitRandomModelOptions& o, const fs::path& tmp) {
  SLIME_ASSIGN_OR_RETURN(DTypeChoice dtype, ParseDType(o.dtype));
  std::string config_path = o.config_json_path;
  std::error_code ec;
  if (fs::is_directory(config_path, ec))
    config_path = (fs::path(config_path) / "config.json").string();
  SLIME_ASSIGN_OR_RETURN(std::string config_text, internal::ReadFileToString(config_path));
  SLIME_ASSIGN_OR_RETURN(ModelConfig config, ParseModelConfigJson(config_text, config_path));

  const fs::path tokenizer_json = fs::path(o.tokenizer_dir) / "tokenizer.json";
  SLIME_ASSIGN_OR_RETURN(int64_t max_id, MaxTokenId(tokenizer_json.string()));
  if (max_id >= config.vocab_size) {
    return absl::InvalidArgumentError(
        fmt::format("{} has token id {}, but {} sets vocab_size = {} (must be > every token id)",
                    tokenizer_json.string(), max_id, config_path, config.vocab_size));
  }

  // config.json: the input, with the dtype recorded the way transformers reads it.
  Json config_json = Json::parse(config_text);
  config_json["torch_dtype"] = dtype.hf_name;
  if (config_json.contains("dtype")) config_json["dtype"] = dtype.hf_name;
  SLIME_RETURN_IF_ERROR(
      internal::WriteFileAtomically((tmp / "config.json").string(), config_json.dump(2) + "\n"));

  WeightOptions wo;
  wo.dtype = dtype.torch_dtype;
  SLIME_ASSIGN_OR_RETURN(ModelWeights weights, RandomWeights(config, o.seed, wo));
  WriteCheckpointOptions co;
  co.max_shard_bytes = o.max_shard_bytes;
  SLIME_RETURN_IF_ERROR(SaveWeights(tmp.string(), weights, config, co));

  SLIME_RETURN_IF_ERROR(CopyFile(tokenizer_json, tmp / "tokenizer.json"));
  for (const char* name :
       {"tokenizer_config.json", "special_tokens_map.json", "generation_config.json"}) {
    const fs::path src = fs::path(o.tokenizer_dir) / name;
    if (fs::exists(src, ec)) SLIME_RETURN_IF_ERROR(CopyFile(src, tmp / name));
  }
  return absl::OkStatus();
}

}  // namespace

Status InitRandomModel(const InitRandomModelOptions& o) {
  std::error_code ec;
  fs::path out = fs::path(o.out_dir).lexically_normal();
  if (!out.has_filename()) out = out.parent_path();  // "dir/" -> "dir"
  if (o.out_dir.empty()) return absl::InvalidArgumentError("init-model: no output directory given");
  if (fs::exists(out, ec)) {
    if (!fs::is_directory(out, ec) || !fs::is_empty(out, ec)) {
      return absl::FailedPreconditionError(fmt::format(
          "{}: output directory exists and is not empty (refusing to overwrite)", o.out_dir));
    }
  }
  // Build everything beside the target, then rename it into place in one step.
  const fs::path tmp =
      out.parent_path() / fmt::format(".{}.tmp.{}", out.filename().string(), ::getpid());
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) {
    return absl::InternalError(
        fmt::format("{}: cannot create directory: {}", tmp.string(), ec.message()));
  }
  Status st = internal::GuardTorch("init-model", [&]() { return Build(o, tmp); });
  if (st.ok()) {
    if (fs::exists(out, ec)) fs::remove(out, ec);  // empty, checked above
    fs::rename(tmp, out, ec);
    if (ec) {
      st = absl::InternalError(
          fmt::format("cannot rename {} to {}: {}", tmp.string(), o.out_dir, ec.message()));
    }
  }
  if (!st.ok()) fs::remove_all(tmp, ec);
  return st;
}

Status InitRandomModel(const std::string& config_json_path, const std::string& tokenizer_dir,
                       const std::string& out_dir, uint64_t seed, const std::string& dtype) {
  InitRandomModelOptions o;
  o.config_json_path = config_json_path;
  o.tokenizer_dir = tokenizer_dir;
  o.out_dir = out_dir;
  o.seed = seed;
  o.dtype = dtype;
  return InitRandomModel(o);
}

}  // namespace slime::model
