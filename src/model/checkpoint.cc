// HF checkpoint reader and writer (see include/slime/model/checkpoint.h).
#include "slime/model/checkpoint.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>

#include "internal.h"
#include "torch_util.h"

namespace slime::model {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

bool IsPlainFileName(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos && name != "." && name != "..";
}

}  // namespace

StatusOr<CheckpointReader> CheckpointReader::Open(const std::string& dir) {
  CheckpointReader reader;
  reader.dir_ = dir;
  const fs::path single = fs::path(dir) / kSafetensorsSingleFile;
  const fs::path index = fs::path(dir) / kSafetensorsIndexFile;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(fmt::format("{}: model directory not found", dir));
  }
  if (fs::exists(single, ec)) {
    SLIME_ASSIGN_OR_RETURN(std::shared_ptr<const SafetensorsFile> file,
                           SafetensorsFile::Open(single.string()));
    for (const SafetensorsTensorInfo& info : file->tensors()) {
      reader.where_[info.name] = Location{file, &info};
    }
    return reader;
  }
  if (!fs::exists(index, ec)) {
    return absl::NotFoundError(fmt::format("{}: neither {} nor {} found", dir,
                                           kSafetensorsSingleFile, kSafetensorsIndexFile));
  }
  const std::string index_path = index.string();
  SLIME_ASSIGN_OR_RETURN(std::string text, internal::ReadFileToString(index_path));
  Json root;
  try {
    root = Json::parse(text);
  } catch (const Json::exception& e) {
    return absl::DataLossError(
        fmt::format("{}: not valid JSON: {}", index_path, std::string(e.what())));
  }
  if (!root.is_object() || !root.contains("weight_map") || !root["weight_map"].is_object()) {
    return absl::DataLossError(
        fmt::format("{}: expected an object with a 'weight_map' object", index_path));
  }
  std::map<std::string, std::shared_ptr<const SafetensorsFile>> shards;
  for (auto it = root["weight_map"].begin(); it != root["weight_map"].end(); ++it) {
    if (!it->is_string() || !IsPlainFileName(it->get<std::string>())) {
      return absl::DataLossError(
          fmt::format("{}: weight_map['{}'] must be a file name in the same directory, got {}",
                      index_path, it.key(), it->dump()));
    }
    const std::string shard_name = it->get<std::string>();
    auto shard = shards.find(shard_name);
    if (shard == shards.end()) {
      SLIME_ASSIGN_OR_RETURN(std::shared_ptr<const SafetensorsFile> file,
                             SafetensorsFile::Open((fs::path(dir) / shard_name).string()));
      shard = shards.emplace(shard_name, std::move(file)).first;
    }
    const SafetensorsTensorInfo* info = shard->second->Find(it.key());
    if (info == nullptr) {
      return absl::DataLossError(fmt::format("{}: tensor '{}' is listed in {} but is not in {}",
                                             dir, it.key(), kSafetensorsIndexFile,
                                             shard->second->path()));
    }
    reader.where_[it.key()] = Location{shard->second, info};
  }
  return reader;
}

std::vector<std::string> CheckpointReader::TensorNames() const {
  std::vector<std::string> names;
  names.reserve(where_.size());
  for (const auto& [name, loc] : where_) names.push_back(name);
  return names;
}

StatusOr<const SafetensorsTensorInfo*> CheckpointReader::Info(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) {
    return absl::NotFoundError(
        fmt::format("{}: tensor '{}' not found in the checkpoint", dir_, name));
  }
  return it->second.info;
}

StatusOr<std::string> CheckpointReader::FileOf(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) {
    return absl::NotFoundError(
        fmt::format("{}: tensor '{}' not found in the checkpoint", dir_, name));
  }
  return it->second.file->path();
}

StatusOr<torch::Tensor> CheckpointReader::Load(const std::string& name,
                                               const LoadTensorOptions& options) const {
  auto it = where_.find(name);
  if (it == where_.end()) {
    return absl::NotFoundError(
        fmt::format("{}: tensor '{}' not found in the checkpoint", dir_, name));
  }
  const SafetensorsFile& file = *it->second.file;
  const SafetensorsTensorInfo& info = *it->second.info;
  const std::string& path = file.path();
  if (!options.expected_shape.empty() && options.expected_shape != info.shape) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: tensor '{}' has shape {}, but the model config needs {}", path, name,
        internal::ShapeString(info.shape), internal::ShapeString(options.expected_shape)));
  }
  StatusOr<torch::ScalarType> stored = internal::ToTorchDType(info.dtype);
  if (!stored.ok()) {
    return absl::InvalidArgumentError(
        fmt::format("{}: tensor '{}': {}", path, name, std::string(stored.status().message())));
  }
  if (options.dtype.has_value() && c10::isFloatingType(*options.dtype) &&
      !internal::IsFloatingSafetensorsDType(info.dtype)) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: tensor '{}' has dtype {}, expected a floating-point dtype (F32, BF16, F16)", path,
        name, SafetensorsDTypeName(info.dtype)));
  }
  const TensorSlice& slice = options.slice;
  if (slice.dim >= 0) {
    if (slice.dim >= static_cast<int64_t>(info.shape.size()) || slice.parts < 1 || slice.rank < 0 ||
        slice.rank >= slice.parts || info.shape[slice.dim] % slice.parts != 0) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: tensor '{}' of shape {} cannot be split into {} parts along dim {} (part {})", path,
          name, internal::ShapeString(info.shape), slice.parts, slice.dim, slice.rank));
    }
  }
  return internal::GuardTorch(
      fmt::format("{}: loading tensor '{}'", path, name), [&]() -> StatusOr<torch::Tensor> {
        std::shared_ptr<const SafetensorsFile> keep = it->second.file;
        void* data = const_cast<uint8_t*>(file.Data(info));
        const size_t elem = SafetensorsDTypeSize(info.dtype);
        torch::Tensor t;
        if (info.nbytes() == 0) {
          t = torch::empty(info.shape, torch::TensorOptions().dtype(*stored));
        } else {
          t = torch::from_blob(
              data, info.shape, [keep](void*) mutable { keep.reset(); },
              torch::TensorOptions().dtype(*stored));
          // Misaligned data (possible after odd-sized tensors of narrower dtypes) is copied.
          if (reinterpret_cast<uintptr_t>(data) % elem != 0) t = t.clone();
        }
        if (slice.dim >= 0) {
          const int64_t part = info.shape[slice.dim] / slice.parts;
          t = t.narrow(slice.dim, part * slice.rank, part);
        }
        const torch::ScalarType want = options.dtype.value_or(*stored);
        if (want != t.scalar_type() || options.device != t.device() || !t.is_contiguous()) {
          t = t.contiguous().to(options.device, want);
        }
        return t;
      });
}

Status WriteCheckpoint(const std::string& dir, const std::vector<NamedTensor>& tensors,
                       const WriteCheckpointOptions& options) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    return absl::InternalError(fmt::format("{}: cannot create directory: {}", dir, ec.message()));

  // Plan shards.
  std::vector<std::vector<size_t>> shards;
  int64_t current = 0;
  int64_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i].tensor.defined()) {
      return absl::InvalidArgumentError(
          fmt::format("{}: tensor '{}' is undefined", dir, tensors[i].name));
    }
    const int64_t bytes = static_cast<int64_t>(tensors[i].tensor.numel()) *
                          static_cast<int64_t>(tensors[i].tensor.element_size());
    if (shards.empty() || (current > 0 && current + bytes > options.max_shard_bytes)) {
      shards.emplace_back();
      current = 0;
    }
    shards.back().push_back(i);
    current += bytes;
    total += bytes;
  }
  if (shards.empty()) shards.emplace_back();
  const size_t n = shards.size();
  auto shard_name = [n](size_t i) {
    return n == 1 ? std::string(kSafetensorsSingleFile)
                  : fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, n);
  };

  Json weight_map = Json::object();
  for (size_t s = 0; s < n; ++s) {
    std::vector<torch::Tensor> host;
    std::vector<SafetensorsWriteEntry> entries;
    for (size_t i : shards[s]) {
      const NamedTensor& nt = tensors[i];
      StatusOr<SafetensorsDType> dtype = internal::ToSafetensorsDType(nt.tensor.scalar_type());
      if (!dtype.ok()) {
        return absl::InvalidArgumentError(fmt::format("{}: tensor '{}': {}", dir, nt.name,
                                                      std::string(dtype.status().message())));
      }
      SLIME_RETURN_IF_ERROR(internal::GuardTorch(
          fmt::format("{}: preparing tensor '{}'", dir, nt.name), [&]() -> Status {
            host.push_back(nt.tensor.detach().to(torch::kCPU).contiguous());
            return absl::OkStatus();
          }));
      const torch::Tensor& h = host.back();
      entries.push_back(SafetensorsWriteEntry{
          nt.name, *dtype, std::vector<int64_t>(h.sizes().begin(), h.sizes().end()), h.data_ptr(),
          static_cast<size_t>(h.numel()) * h.element_size()});
      weight_map[nt.name] = shard_name(s);
    }
    SLIME_RETURN_IF_ERROR(
        WriteSafetensors((fs::path(dir) / shard_name(s)).string(), entries, options.metadata));
  }

  // Remove model files of the other layout or an older shard count, then write the index.
  const std::regex shard_re(R"(model-\d{5}-of-\d{5}\.safetensors)");
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    bool ours = false;
    for (size_t s = 0; s < n; ++s) ours = ours || name == shard_name(s);
    bool stale =
        !ours && (std::regex_match(name, shard_re) || (n > 1 && name == kSafetensorsSingleFile) ||
                  (n == 1 && name == kSafetensorsIndexFile));
    if (stale) fs::remove(entry.path(), ec);
  }
  if (n > 1) {
    Json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    SLIME_RETURN_IF_ERROR(internal::WriteFileAtomically(
        (fs::path(dir) / kSafetensorsIndexFile).string(), index.dump(2) + "\n"));
  }
  return absl::OkStatus();
}

}  // namespace slime::model
