// Safetensors reader (mmap) and writer (see include/slime/model/safetensors.h).
#include "slime/model/safetensors.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "internal.h"

namespace slime::model {
namespace {

using Json = nlohmann::json;

// safetensors itself refuses headers above 100 MB.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

struct DTypeRow {
  SafetensorsDType dtype;
  const char* name;
  size_t size;
};

constexpr DTypeRow kDTypes[] = {
    {SafetensorsDType::kBool, "BOOL", 1},      {SafetensorsDType::kU8, "U8", 1},
    {SafetensorsDType::kI8, "I8", 1},          {SafetensorsDType::kI16, "I16", 2},
    {SafetensorsDType::kU16, "U16", 2},        {SafetensorsDType::kI32, "I32", 4},
    {SafetensorsDType::kU32, "U32", 4},        {SafetensorsDType::kI64, "I64", 8},
    {SafetensorsDType::kU64, "U64", 8},        {SafetensorsDType::kF16, "F16", 2},
    {SafetensorsDType::kBF16, "BF16", 2},      {SafetensorsDType::kF32, "F32", 4},
    {SafetensorsDType::kF64, "F64", 8},        {SafetensorsDType::kF8E4M3, "F8_E4M3", 1},
    {SafetensorsDType::kF8E5M2, "F8_E5M2", 1},
};

Status HeaderError(const std::string& path, const std::string& what) {
  return absl::DataLossError(fmt::format("{}: corrupt safetensors file: {}", path, what));
}

Status TensorError(const std::string& path, const std::string& tensor, const std::string& what) {
  return absl::DataLossError(
      fmt::format("{}: corrupt safetensors file: tensor '{}': {}", path, tensor, what));
}

// numel * elem_size with overflow detection.
bool CheckedBytes(const std::vector<int64_t>& shape, size_t elem_size, uint64_t* out) {
  uint64_t n = elem_size;
  for (int64_t d : shape) {
    if (d < 0) return false;
    if (d != 0 && n > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(d)) return false;
    n *= static_cast<uint64_t>(d);
  }
  *out = n;
  return true;
}

StatusOr<SafetensorsTensorInfo> ParseEntry(const std::string& path, const std::string& name,
                                           const Json& v, uint64_t data_size) {
  if (!v.is_object()) return TensorError(path, name, "header entry is not an object");
  SafetensorsTensorInfo info;
  info.name = name;
  auto dt = v.find("dtype");
  if (dt == v.end() || !dt->is_string()) return TensorError(path, name, "missing string 'dtype'");
  StatusOr<SafetensorsDType> dtype = ParseSafetensorsDType(dt->get<std::string>());
  if (!dtype.ok()) return TensorError(path, name, std::string(dtype.status().message()));
  info.dtype = *dtype;
  auto shape = v.find("shape");
  if (shape == v.end() || !shape->is_array()) {
    return TensorError(path, name, "missing list 'shape'");
  }
  for (const Json& d : *shape) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0) {
      return TensorError(path, name, fmt::format("bad shape {}", shape->dump()));
    }
    info.shape.push_back(d.get<int64_t>());
  }
  auto offs = v.find("data_offsets");
  if (offs == v.end() || !offs->is_array() || offs->size() != 2 ||
      !(*offs)[0].is_number_unsigned() || !(*offs)[1].is_number_unsigned()) {
    return TensorError(path, name, "'data_offsets' must be two non-negative integers");
  }
  info.begin = (*offs)[0].get<uint64_t>();
  info.end = (*offs)[1].get<uint64_t>();
  if (info.begin > info.end || info.end > data_size) {
    return TensorError(path, name,
                       fmt::format("data_offsets [{}, {}] out of range (data section is {} bytes; "
                                   "the file may be truncated)",
                                   info.begin, info.end, data_size));
  }
  uint64_t expected = 0;
  if (!CheckedBytes(info.shape, SafetensorsDTypeSize(info.dtype), &expected) ||
      expected != info.nbytes()) {
    return TensorError(
        path, name,
        fmt::format("{} bytes for dtype {} and shape {} (expected {})", info.nbytes(),
                    SafetensorsDTypeName(info.dtype), shape->dump(), expected));
  }
  return info;
}

}  // namespace

const char* SafetensorsDTypeName(SafetensorsDType dtype) {
  for (const DTypeRow& r : kDTypes) {
    if (r.dtype == dtype) return r.name;
  }
  return "?";
}

StatusOr<SafetensorsDType> ParseSafetensorsDType(const std::string& name) {
  std::string valid;
  for (const DTypeRow& r : kDTypes) {
    if (name == r.name) return r.dtype;
    valid += valid.empty() ? "" : ", ";
    valid += r.name;
  }
  return absl::InvalidArgumentError(fmt::format("unknown dtype \"{}\" (known: {})", name, valid));
}

size_t SafetensorsDTypeSize(SafetensorsDType dtype) {
  for (const DTypeRow& r : kDTypes) {
    if (r.dtype == dtype) return r.size;
  }
  return 0;
}

int64_t SafetensorsTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

StatusOr<std::shared_ptr<const SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT) return absl::NotFoundError(fmt::format("{}: file not found", path));
    return absl::InternalError(fmt::format("{}: cannot open: {}", path, std::strerror(err)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return absl::InternalError(fmt::format("{}: cannot stat: {}", path, std::strerror(err)));
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    return HeaderError(path, fmt::format("file is {} bytes, too short for the 8-byte header "
                                         "length",
                                         file_size));
  }
  void* map = ::mmap(nullptr, file_size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  int map_err = errno;
  ::close(fd);
  if (map == MAP_FAILED) {
    return absl::InternalError(fmt::format("{}: mmap failed: {}", path, std::strerror(map_err)));
  }
  std::shared_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->mapping_ = map;
  file->mapping_size_ = file_size;
  const uint8_t* bytes = static_cast<const uint8_t*>(map);

  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  if (header_len > file_size - 8) {
    return HeaderError(path, fmt::format("header length {} exceeds the {} bytes after it (file "
                                         "truncated or not a safetensors file)",
                                         header_len, file_size - 8));
  }
  if (header_len > kMaxHeaderBytes) {
    return HeaderError(path, fmt::format("header length {} exceeds the 100 MB limit", header_len));
  }
  const uint64_t data_size = file_size - 8 - header_len;
  file->data_start_ = bytes + 8 + header_len;

  Json header;
  try {
    header = Json::parse(bytes + 8, bytes + 8 + header_len);
  } catch (const Json::exception& e) {
    return HeaderError(path, fmt::format("header is not valid JSON: {}", std::string(e.what())));
  }
  if (!header.is_object()) return HeaderError(path, "header is not a JSON object");

  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) return HeaderError(path, "__metadata__ is not an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) {
          return HeaderError(path,
                             fmt::format("__metadata__ value of '{}' is not a string", m.key()));
        }
        file->metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    SLIME_ASSIGN_OR_RETURN(SafetensorsTensorInfo info, ParseEntry(path, it.key(), *it, data_size));
    file->tensors_.push_back(std::move(info));
  }
  std::sort(file->tensors_.begin(), file->tensors_.end(),
            [](const SafetensorsTensorInfo& a, const SafetensorsTensorInfo& b) {
              return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
            });
  for (size_t i = 1; i < file->tensors_.size(); ++i) {
    const auto& prev = file->tensors_[i - 1];
    const auto& cur = file->tensors_[i];
    if (cur.begin < prev.end) {
      return TensorError(path, cur.name,
                         fmt::format("data overlaps tensor '{}' ([{}, {}] vs [{}, {}])", prev.name,
                                     cur.begin, cur.end, prev.begin, prev.end));
    }
  }
  for (size_t i = 0; i < file->tensors_.size(); ++i) file->index_[file->tensors_[i].name] = i;
  return std::shared_ptr<const SafetensorsFile>(std::move(file));
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapping_size_);
}

const SafetensorsTensorInfo* SafetensorsFile::Find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Status WriteSafetensors(const std::string& path, const std::vector<SafetensorsWriteEntry>& entries,
                        const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsStreamEntry> streamed;
  streamed.reserve(entries.size());
  for (const SafetensorsWriteEntry& e : entries) {
    if (e.nbytes > 0 && e.data == nullptr) {
      return absl::InvalidArgumentError(fmt::format("{}: tensor '{}': no data", path, e.name));
    }
    const void* data = e.data;
    streamed.push_back(SafetensorsStreamEntry{
        e.name, e.dtype, e.shape, e.nbytes, [data]() -> StatusOr<const void*> { return data; }});
  }
  return WriteSafetensorsStreamed(path, streamed, metadata);
}

Status WriteSafetensorsStreamed(const std::string& path,
                                const std::vector<SafetensorsStreamEntry>& entries,
                                const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) {
    Json meta = Json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = meta;
  }
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const SafetensorsStreamEntry& e : entries) {
    if (e.name.empty() || e.name == "__metadata__" || !seen.insert(e.name).second) {
      return absl::InvalidArgumentError(
          fmt::format("{}: tensor name '{}' is empty, reserved or repeated", path, e.name));
    }
    uint64_t expected = 0;
    if (!CheckedBytes(e.shape, SafetensorsDTypeSize(e.dtype), &expected) || expected != e.nbytes) {
      return absl::InvalidArgumentError(
          fmt::format("{}: tensor '{}': {} bytes given, dtype {} and shape need {}", path, e.name,
                      e.nbytes, SafetensorsDTypeName(e.dtype), expected));
    }
    if (!e.fill) {
      return absl::InvalidArgumentError(fmt::format("{}: tensor '{}': no data", path, e.name));
    }
    header[e.name] = {{"dtype", SafetensorsDTypeName(e.dtype)},
                      {"shape", e.shape},
                      {"data_offsets", {offset, offset + e.nbytes}}};
    offset += e.nbytes;
  }
  std::string text = header.dump();
  // Pad with spaces so the data section starts 8-byte aligned.
  text.append((8 - text.size() % 8) % 8, ' ');
  uint8_t len[8];
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));

  SLIME_ASSIGN_OR_RETURN(internal::AtomicFileWriter w, internal::AtomicFileWriter::Open(path));
  SLIME_RETURN_IF_ERROR(w.Write(len, sizeof(len)));
  SLIME_RETURN_IF_ERROR(w.Write(text.data(), text.size()));
  for (const SafetensorsStreamEntry& e : entries) {
    StatusOr<const void*> data = e.fill();
    if (!data.ok()) {
      return Status(data.status().code(),
                    fmt::format("{}: tensor '{}': {}", path, e.name,
                                std::string(data.status().message())));
    }
    if (e.nbytes > 0 && *data == nullptr) {
      return absl::InvalidArgumentError(fmt::format("{}: tensor '{}': no data", path, e.name));
    }
    SLIME_RETURN_IF_ERROR(w.Write(*data, e.nbytes));
  }
  return w.Commit();
}

}  // namespace slime::model
