// Safetensors files: a memory-mapped reader and an atomic writer (torch-free).
//
// Format: 8 bytes little-endian u64 N, then N bytes of JSON header
//   {"__metadata__": {str: str}, NAME: {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}}
// then the data section; offsets are relative to its start.
//
// SafetensorsFile::Open validates everything before returning: header length within the file,
// header JSON, every dtype known, shapes non-negative, offsets inside the data section,
// byte size == numel * element size, no overlaps. Errors name the file (and the tensor).
//
// Ownership: a SafetensorsFile owns its mapping (private, copy-on-write, so tensors built on it
// with from_blob may be written without touching the file) and is shared via shared_ptr; keep
// the pointer alive while anything points into Data(). Thread-safety: immutable after Open, so
// any thread may read it. WriteSafetensors writes PATH.tmp.* and renames it over PATH.
#ifndef SLIME_MODEL_SAFETENSORS_H_
#define SLIME_MODEL_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "slime/common/status.h"

namespace slime::model {

enum class SafetensorsDType {
  kBool,
  kU8,
  kI8,
  kI16,
  kU16,
  kI32,
  kU32,
  kI64,
  kU64,
  kF16,
  kBF16,
  kF32,
  kF64,
  kF8E4M3,
  kF8E5M2,
};

// "F32", "BF16", ...
const char* SafetensorsDTypeName(SafetensorsDType dtype);
// Inverse of SafetensorsDTypeName; the error lists the valid names.
StatusOr<SafetensorsDType> ParseSafetensorsDType(const std::string& name);
size_t SafetensorsDTypeSize(SafetensorsDType dtype);

struct SafetensorsTensorInfo {
  std::string name;
  SafetensorsDType dtype = SafetensorsDType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets into the data section, [begin, end)
  uint64_t end = 0;

  int64_t numel() const;
  uint64_t nbytes() const { return end - begin; }
};

class SafetensorsFile {
 public:
  static StatusOr<std::shared_ptr<const SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // All tensors, ordered by data offset.
  const std::vector<SafetensorsTensorInfo>& tensors() const { return tensors_; }
  // nullptr when absent.
  const SafetensorsTensorInfo* Find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // First byte of the tensor's data inside the mapping (valid while this object lives).
  const uint8_t* Data(const SafetensorsTensorInfo& info) const { return data_start_ + info.begin; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* mapping_ = nullptr;  // owned mmap region (nullptr for an empty data section)
  size_t mapping_size_ = 0;
  const uint8_t* data_start_ = nullptr;
  std::vector<SafetensorsTensorInfo> tensors_;
  std::unordered_map<std::string, size_t> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
};

// One tensor to write; `data` must hold exactly numel(shape) * SafetensorsDTypeSize(dtype)
// bytes (little-endian) and stay valid during the call.
struct SafetensorsWriteEntry {
  std::string name;
  SafetensorsDType dtype = SafetensorsDType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t nbytes = 0;
};

// Writes a .safetensors file atomically. Names must be unique and not "__metadata__".
Status WriteSafetensors(const std::string& path, const std::vector<SafetensorsWriteEntry>& entries,
                        const std::map<std::string, std::string>& metadata = {});

// One tensor of a streamed write: the header fields, and `fill`, which the writer calls when it
// reaches the tensor and which returns a pointer to its nbytes bytes, valid until the next
// `fill` call or the end of the write (so a caller can stage one tensor at a time in a buffer
// it reuses).
struct SafetensorsStreamEntry {
  std::string name;
  SafetensorsDType dtype = SafetensorsDType::kF32;
  std::vector<int64_t> shape;
  size_t nbytes = 0;
  std::function<StatusOr<const void*>()> fill;
};

// WriteSafetensors for data that should not all be in memory at once (a large model's
// optimizer state beside a colocated run's offload buffers): the header is written from the
// entries, then each tensor's bytes as its `fill` provides them. Atomic as WriteSafetensors: a
// failed `fill` (its error is returned, naming the file and tensor) leaves no file.
Status WriteSafetensorsStreamed(const std::string& path,
                                const std::vector<SafetensorsStreamEntry>& entries,
                                const std::map<std::string, std::string>& metadata = {});

}  // namespace slime::model

#endif  // SLIME_MODEL_SAFETENSORS_H_
