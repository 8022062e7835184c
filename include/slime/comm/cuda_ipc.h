// CUDA IPC hand-over of weights between two processes on one GPU (the colocated trainer and
// engine): the trainer copies a bucket of tensors into one device buffer of its own and sends a
// CUDA IPC handle to it (64 bytes) with each tensor's name, dtype, shape and byte offset; the
// engine maps the buffer into its address space, copies the tensors into its weights, waits for
// the copies and unmaps it before it answers, so the trainer may then reuse or free the buffer.
// No network and no host copy: one device-to-device copy on each side.
//
// The wire form (JSON, the `ipc_buckets` entries of POST /update_weights_from_tensor with
// load_format "slime_cuda_ipc"; docs/http-api.md):
//   {"handle": "<128 hex digits>", "device_uuid": "GPU-…", "bytes": N,
//    "tensors": [{"name": "...", "dtype": "bfloat16", "shape": [..], "offset": N}, ...]}
// SGLang's own payload for this route (load_format "flattened_bucket": pickled torch tensors,
// decoded by comm/torch_pickle.h) is opened by SglangImportedBucket: a CUDA IPC block of the
// sender on this engine's GPU, or a CPU tensor in shared memory.
//
// CPU builds: CudaIpcBuilt() is false and Create/Open answer Unimplemented; the JSON form works
// everywhere. Thread-safety: an object is used by one thread at a time.
#ifndef SLIME_COMM_CUDA_IPC_H_
#define SLIME_COMM_CUDA_IPC_H_

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "slime/common/status.h"
#include "slime/comm/torch_pickle.h"
#include "slime/model/checkpoint.h"

namespace slime::comm {

struct IpcTensor {
  std::string name;
  torch::ScalarType dtype = torch::kFloat32;
  std::vector<int64_t> shape;
  int64_t offset = 0;  // bytes from the start of the buffer
};

struct IpcBucket {
  std::string handle;       // cudaIpcMemHandle_t, hex
  std::string device_uuid;  // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" of the exporting GPU
  int64_t bytes = 0;        // size of the buffer
  std::vector<IpcTensor> tensors;
};

nlohmann::json IpcBucketToJson(const IpcBucket& bucket);
// Checks every field: a hex handle of the right length, known dtypes, non-negative shapes, each
// tensor inside [0, bytes). InvalidArgument names the field (and the tensor).
StatusOr<IpcBucket> IpcBucketFromJson(const nlohmann::json& j);

// True when this build has CUDA (the hand-over itself also needs the GPU at run time).
bool CudaIpcBuilt();
// The UUID of a CUDA device as nvidia-smi prints it.
StatusOr<std::string> DeviceUuid(torch::Device device);

// Trainer side: a cudaMalloc'ed buffer of `capacity` bytes that other processes can map.
class IpcExportBuffer {
 public:
  static StatusOr<std::unique_ptr<IpcExportBuffer>> Create(torch::Device device, int64_t capacity);
  ~IpcExportBuffer();  // cudaFree
  IpcExportBuffer(const IpcExportBuffer&) = delete;
  IpcExportBuffer& operator=(const IpcExportBuffer&) = delete;

  // Copies `tensors` (converted to `dtype` when set) to 256-byte aligned offsets, waits for the
  // copies, and describes them. InvalidArgument when they do not fit the capacity.
  StatusOr<IpcBucket> Pack(const std::vector<model::NamedTensor>& tensors,
                           std::optional<torch::ScalarType> dtype);
  int64_t capacity() const { return capacity_; }
  // The bytes Pack needs for `tensors` (alignment included).
  static int64_t PackedBytes(const std::vector<model::NamedTensor>& tensors,
                             std::optional<torch::ScalarType> dtype);

 private:
  IpcExportBuffer() = default;
  void* data_ = nullptr;
  int64_t capacity_ = 0;
  torch::Device device_ = torch::kCPU;
  std::string handle_;
  std::string uuid_;
};

// Engine side: the bucket's buffer mapped into this process on `device`, viewed as its tensors.
class IpcImportedBucket {
 public:
  // FailedPrecondition when `device` is not the exporting GPU (the UUIDs differ).
  static StatusOr<std::unique_ptr<IpcImportedBucket>> Open(const IpcBucket& bucket,
                                                           torch::Device device);
  ~IpcImportedBucket();  // waits for the device, then unmaps
  IpcImportedBucket(const IpcImportedBucket&) = delete;
  IpcImportedBucket& operator=(const IpcImportedBucket&) = delete;

  // Views into the mapped memory; valid while this object lives.
  const std::vector<model::NamedTensor>& tensors() const { return tensors_; }

 private:
  IpcImportedBucket() = default;
  void* base_ = nullptr;
  torch::Device device_ = torch::kCPU;
  std::vector<model::NamedTensor> tensors_;
};

// Engine side of SGLang's flattened bucket (comm/torch_pickle.h), as torch's consumer does it:
// a CUDA tensor's block is mapped with cudaIpcOpenMemHandle (after waiting for the producer's
// IPC event when it sent one), a CPU tensor's shared-memory file is mapped read-only; the
// tensors are views into it. The destructor waits for the device, unmaps, and for CUDA
// decrements the producer's reference counter (its shared-memory counter file), so the
// producer's torch.cuda.ipc_collect() can free the block, exactly as a torch consumer would.
class SglangImportedBucket {
 public:
  // FailedPrecondition when the bucket is on another GPU (UUIDs differ), a CUDA bucket meets a
  // CPU engine or a CPU build; NotFound when the shared-memory file is gone.
  static StatusOr<std::unique_ptr<SglangImportedBucket>> Open(const SglangBucket& bucket,
                                                              torch::Device device);
  ~SglangImportedBucket();
  SglangImportedBucket(const SglangImportedBucket&) = delete;
  SglangImportedBucket& operator=(const SglangImportedBucket&) = delete;

  // Views into the mapped memory (dtype and shape from the metadata); valid while this lives.
  const std::vector<model::NamedTensor>& tensors() const { return tensors_; }

 private:
  SglangImportedBucket() = default;
  Status View(const SglangBucket& bucket, char* data, torch::Device device);
  void ReleaseRefCounter();

  std::vector<model::NamedTensor> tensors_;
  torch::Device device_ = torch::kCPU;
  void* cuda_base_ = nullptr;  // cudaIpcOpenMemHandle's mapping
  void* map_ = nullptr;        // the shared-memory mapping (CPU)
  size_t map_bytes_ = 0;
  std::string ref_counter_file_;
  int64_t ref_counter_offset_ = 0;
};

}  // namespace slime::comm

#endif  // SLIME_COMM_CUDA_IPC_H_
