// Trainer checkpoint -> HF model directory (see include/slime/train/hf_export.h).
#include "slime/train/hf_export.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "slime/model/config.h"
#include "slime/model/decoder.h"
#include "slime/model/weights.h"
#include "slime/train/checkpoint.h"

namespace slime::train {
namespace {

namespace fs = std::filesystem;

constexpr const char* kTokenizerFiles[] = {"tokenizer.json", "tokenizer_config.json",
                                           "special_tokens_map.json", "generation_config.json"};

StatusOr<torch::ScalarType> ParseDtype(const std::string& name, torch::ScalarType saved) {
  if (name == "auto") return saved;
  if (name == "bf16" || name == "bfloat16") return torch::kBFloat16;
  if (name == "fp16" || name == "float16") return torch::kFloat16;
  if (name == "fp32" || name == "float32") return torch::kFloat32;
  return absl::InvalidArgumentError(
      fmt::format("--dtype: '{}' is not one of auto, bf16, fp16, fp32", name));
}

const char* HfDtypeName(torch::ScalarType t) {
  return t == torch::kBFloat16 ? "bfloat16" : t == torch::kFloat16 ? "float16" : "float32";
}

StatusOr<nlohmann::json> ReadJson(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(fmt::format("{}: cannot be read", path.string()));
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(fmt::format("{}: not a JSON object", path.string()));
  }
  return j;
}

Status WriteText(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::InternalError(fmt::format("{}: write failed", path.string()));
  return absl::OkStatus();
}

// The dtype the checkpoint's config.json records (float32 when absent).
torch::ScalarType SavedDtype(const nlohmann::json& config) {
  const std::string d = config.value("torch_dtype", std::string("float32"));
  return d == "bfloat16" ? torch::kBFloat16 : d == "float16" ? torch::kFloat16 : torch::kFloat32;
}

Status Build(const HfExportOptions& o, const fs::path& iter_dir, const fs::path& tmp) {
  SLIME_ASSIGN_OR_RETURN(nlohmann::json config_json, ReadJson(iter_dir / "config.json"));
  SLIME_ASSIGN_OR_RETURN(torch::ScalarType dtype, ParseDtype(o.dtype, SavedDtype(config_json)));
  // Loading verifies every parameter against the config (names, shapes, dtypes).
  SLIME_ASSIGN_OR_RETURN(std::unique_ptr<model::DecoderModel> m,
                         model::DecoderModel::Load(iter_dir.string(), dtype, torch::kCPU));
  SLIME_RETURN_IF_ERROR(model::SaveWeights(tmp.string(), m->weights(), m->config()));
  config_json["torch_dtype"] = HfDtypeName(dtype);
  SLIME_RETURN_IF_ERROR(WriteText(tmp / "config.json", config_json.dump(2) + "\n"));

  const fs::path tok_dir = o.tokenizer.empty() ? iter_dir : fs::path(o.tokenizer);
  std::error_code ec;
  if (!o.tokenizer.empty() && !fs::exists(tok_dir / "tokenizer.json", ec)) {
    return absl::InvalidArgumentError(
        fmt::format("--tokenizer {}: no tokenizer.json there", tok_dir.string()));
  }
  int copied = 0;
  for (const char* name : kTokenizerFiles) {
    if (!fs::exists(tok_dir / name, ec)) continue;
    fs::copy_file(tok_dir / name, tmp / name, fs::copy_options::overwrite_existing, ec);
    if (ec) {
      return absl::InternalError(
          fmt::format("copying {} to {}: {}", (tok_dir / name).string(), tmp.string(), ec.message()));
    }
    ++copied;
  }
  if (copied == 0) {
    spdlog::warn("convert: no tokenizer files in {}; the output has weights only (pass --tokenizer "
                 "DIR to serve it)",
                 tok_dir.string());
  }
  return absl::OkStatus();
}

}  // namespace

StatusOr<std::string> ExportCheckpointToHf(const HfExportOptions& o) {
  SLIME_ASSIGN_OR_RETURN(std::string iter_dir, ResolveCheckpointDir(o.from, o.ckpt_step));
  const fs::path out = fs::path(o.to_hf).lexically_normal();
  std::error_code ec;
  if (fs::exists(out, ec) && !(fs::is_directory(out, ec) && fs::is_empty(out, ec))) {
    return absl::AlreadyExistsError(
        fmt::format("--to-hf {}: exists and is not an empty directory (refusing to overwrite)",
                    out.string()));
  }
  const fs::path parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
  fs::create_directories(parent, ec);
  const fs::path tmp =
      parent / fmt::format(".tmp-{}-{}", out.filename().string(), static_cast<long>(::getpid()));
  fs::remove_all(tmp, ec);
  if (!fs::create_directory(tmp, ec)) {
    return absl::InternalError(fmt::format("cannot create {}: {}", tmp.string(), ec.message()));
  }
  Status s = Build(o, iter_dir, tmp);
  if (s.ok()) {
    if (fs::exists(out, ec)) fs::remove(out, ec);  // the empty directory
    fs::rename(tmp, out, ec);
    if (ec) {
      s = absl::InternalError(
          fmt::format("renaming {} to {}: {}", tmp.string(), out.string(), ec.message()));
    }
  }
  if (!s.ok()) {
    fs::remove_all(tmp, ec);
    return s;
  }
  return iter_dir;
}
}  // namespace slime::train
