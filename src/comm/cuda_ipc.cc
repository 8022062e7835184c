// CUDA IPC weight hand-over (see include/slime/comm/cuda_ipc.h).
#include "slime/comm/cuda_ipc.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#ifdef SLIME_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>

#include "slime/comm/weight_sender.h"

namespace slime::comm {
namespace {

using json = nlohmann::json;

constexpr int64_t kAlign = 256;
constexpr size_t kHandleBytes = 64;  // sizeof(cudaIpcMemHandle_t)

int64_t AlignUp(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

int64_t TensorBytes(torch::ScalarType dtype, const std::vector<int64_t>& shape) {
  int64_t n = static_cast<int64_t>(c10::elementSize(dtype));
  for (int64_t d : shape) n *= d;
  return n;
}

bool Unhex(const std::string& hex, unsigned char* out, size_t n) {
  if (hex.size() != 2 * n) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < n; ++i) {
    const int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<unsigned char>(hi << 4 | lo);
  }
  return true;
}

#ifdef SLIME_WITH_CUDA
std::string Hex(const unsigned char* data, size_t n) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    out.push_back(kDigits[data[i] >> 4]);
    out.push_back(kDigits[data[i] & 15]);
  }
  return out;
}

int DeviceIndex(torch::Device device) { return device.has_index() ? device.index() : 0; }

Status CudaError(cudaError_t err, const std::string& what) {
  cudaGetLastError();  // reset the last-error state so later calls do not report this one
  const std::string message =
      fmt::format("{}: {} ({})", what, cudaGetErrorString(err), cudaGetErrorName(err));
  return err == cudaErrorMemoryAllocation ? absl::ResourceExhaustedError(message)
                                          : absl::InternalError(message);
}
#define SLIME_CUDA_RETURN_IF_ERROR(expr, what)        \
  do {                                                \
    const cudaError_t slime_err_ = (expr);            \
    if (slime_err_ != cudaSuccess) return CudaError(slime_err_, what); \
  } while (0)
#endif

}  // namespace

json IpcBucketToJson(const IpcBucket& bucket) {
  json tensors = json::array();
  for (const IpcTensor& t : bucket.tensors) {
    tensors.push_back(
        {{"name", t.name}, {"dtype", DtypeName(t.dtype)}, {"shape", t.shape}, {"offset", t.offset}});
  }
  return {{"handle", bucket.handle},
          {"device_uuid", bucket.device_uuid},
          {"bytes", bucket.bytes},
          {"tensors", std::move(tensors)}};
}

StatusOr<IpcBucket> IpcBucketFromJson(const json& j) {
  if (!j.is_object()) return absl::InvalidArgumentError("an IPC bucket must be a JSON object");
  IpcBucket b;
  const json& handle = j.contains("handle") ? j["handle"] : json();
  unsigned char raw[kHandleBytes];
  if (!handle.is_string() || !Unhex(handle.get<std::string>(), raw, kHandleBytes)) {
    return absl::InvalidArgumentError(
        fmt::format("handle must be a string of {} hex digits (a cudaIpcMemHandle_t)", 2 * kHandleBytes));
  }
  b.handle = handle.get<std::string>();
  const json& uuid = j.contains("device_uuid") ? j["device_uuid"] : json();
  if (!uuid.is_string() || uuid.get<std::string>().empty()) {
    return absl::InvalidArgumentError("device_uuid must be a non-empty string (\"GPU-...\")");
  }
  b.device_uuid = uuid.get<std::string>();
  const json& bytes = j.contains("bytes") ? j["bytes"] : json();
  if (!bytes.is_number_integer() || bytes.get<int64_t>() < 0) {
    return absl::InvalidArgumentError("bytes must be a non-negative integer");
  }
  b.bytes = bytes.get<int64_t>();
  const json& tensors = j.contains("tensors") ? j["tensors"] : json();
  if (!tensors.is_array()) return absl::InvalidArgumentError("tensors must be an array");
  for (size_t i = 0; i < tensors.size(); ++i) {
    const json& t = tensors[i];
    IpcTensor it;
    if (!t.is_object() || !t.contains("name") || !t["name"].is_string() ||
        t["name"].get<std::string>().empty()) {
      return absl::InvalidArgumentError(fmt::format("tensors[{}].name must be a non-empty string", i));
    }
    it.name = t["name"].get<std::string>();
    if (!t.contains("dtype") || !t["dtype"].is_string()) {
      return absl::InvalidArgumentError(fmt::format("tensor '{}': dtype must be a string", it.name));
    }
    StatusOr<torch::ScalarType> dtype = ParseDtypeName(t["dtype"].get<std::string>());
    if (!dtype.ok()) {
      return absl::InvalidArgumentError(
          fmt::format("tensor '{}': {}", it.name, std::string(dtype.status().message())));
    }
    it.dtype = *dtype;
    bool valid = t.contains("shape") && t["shape"].is_array();
    for (size_t k = 0; valid && k < t["shape"].size(); ++k) {
      valid = t["shape"][k].is_number_integer() && t["shape"][k].get<int64_t>() >= 0;
      if (valid) it.shape.push_back(t["shape"][k].get<int64_t>());
    }
    if (!valid) {
      return absl::InvalidArgumentError(fmt::format(
          "tensor '{}': shape must be a list of non-negative integers", it.name));
    }
    if (!t.contains("offset") || !t["offset"].is_number_integer() || t["offset"].get<int64_t>() < 0) {
      return absl::InvalidArgumentError(
          fmt::format("tensor '{}': offset must be a non-negative integer", it.name));
    }
    it.offset = t["offset"].get<int64_t>();
    const int64_t n = TensorBytes(it.dtype, it.shape);
    if (it.offset + n > b.bytes) {
      return absl::InvalidArgumentError(fmt::format(
          "tensor '{}': bytes [{}, {}) lie outside the {}-byte buffer", it.name, it.offset,
          it.offset + n, b.bytes));
    }
    b.tensors.push_back(std::move(it));
  }
  return b;
}

int64_t IpcExportBuffer::PackedBytes(const std::vector<model::NamedTensor>& tensors,
                                     std::optional<torch::ScalarType> dtype) {
  int64_t offset = 0;
  for (const model::NamedTensor& t : tensors) {
    offset = AlignUp(offset) + TensorBytes(dtype.value_or(t.tensor.scalar_type()), t.tensor.sizes().vec());
  }
  return offset;
}

#ifdef SLIME_WITH_CUDA

bool CudaIpcBuilt() { return true; }

StatusOr<std::string> DeviceUuid(torch::Device device) {
  if (!device.is_cuda()) {
    return absl::InvalidArgumentError(fmt::format("{} is not a CUDA device", device.str()));
  }
  cudaDeviceProp prop;
  SLIME_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, DeviceIndex(device)),
                             "cudaGetDeviceProperties");
  const auto* u = reinterpret_cast<const unsigned char*>(prop.uuid.bytes);
  const std::string h = Hex(u, 16);
  return fmt::format("GPU-{}-{}-{}-{}-{}", h.substr(0, 8), h.substr(8, 4), h.substr(12, 4),
                     h.substr(16, 4), h.substr(20, 12));
}

StatusOr<std::unique_ptr<IpcExportBuffer>> IpcExportBuffer::Create(torch::Device device,
                                                                   int64_t capacity) {
  if (!device.is_cuda()) {
    return absl::InvalidArgumentError(
        fmt::format("CUDA IPC needs a CUDA device, got {}", device.str()));
  }
  if (capacity < 1) return absl::InvalidArgumentError("CUDA IPC buffer of 0 bytes");
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(DeviceIndex(device)));
  std::unique_ptr<IpcExportBuffer> b(new IpcExportBuffer());
  b->device_ = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(DeviceIndex(device)));
  SLIME_CUDA_RETURN_IF_ERROR(cudaMalloc(&b->data_, static_cast<size_t>(capacity)),
                             fmt::format("cudaMalloc of the {}-byte IPC buffer", capacity));
  b->capacity_ = capacity;
  cudaIpcMemHandle_t handle;
  SLIME_CUDA_RETURN_IF_ERROR(cudaIpcGetMemHandle(&handle, b->data_), "cudaIpcGetMemHandle");
  static_assert(sizeof(handle) == kHandleBytes, "cudaIpcMemHandle_t is 64 bytes");
  b->handle_ = Hex(reinterpret_cast<const unsigned char*>(&handle), kHandleBytes);
  SLIME_ASSIGN_OR_RETURN(b->uuid_, DeviceUuid(b->device_));
  return b;
}

IpcExportBuffer::~IpcExportBuffer() {
  if (data_ != nullptr) {
    c10::cuda::CUDAGuard guard(device_.index());
    cudaDeviceSynchronize();
    cudaFree(data_);
  }
}

StatusOr<IpcBucket> IpcExportBuffer::Pack(const std::vector<model::NamedTensor>& tensors,
                                          std::optional<torch::ScalarType> dtype) {
  const int64_t needed = PackedBytes(tensors, dtype);
  if (needed > capacity_) {
    return absl::InvalidArgumentError(fmt::format(
        "{} tensors need {} bytes; the IPC buffer holds {}", tensors.size(), needed, capacity_));
  }
  IpcBucket bucket;
  bucket.handle = handle_;
  bucket.device_uuid = uuid_;
  bucket.bytes = capacity_;
  try {
    c10::cuda::CUDAGuard guard(device_.index());
    torch::NoGradGuard no_grad;
    int64_t offset = 0;
    for (const model::NamedTensor& nt : tensors) {
      torch::Tensor t = nt.tensor.detach();
      if (dtype && t.scalar_type() != *dtype) t = t.to(*dtype);
      offset = AlignUp(offset);
      torch::Tensor dst = torch::from_blob(static_cast<char*>(data_) + offset, t.sizes(),
                                           torch::TensorOptions().dtype(t.scalar_type()).device(device_));
      dst.copy_(t);
      bucket.tensors.push_back({nt.name, t.scalar_type(), t.sizes().vec(), offset});
      offset += t.numel() * static_cast<int64_t>(t.element_size());
    }
    torch::cuda::synchronize(device_.index());
  } catch (const std::exception& e) {
    return absl::InternalError(
        fmt::format("packing the IPC bucket: {}", std::string(e.what()).substr(0, 300)));
  }
  return bucket;
}

StatusOr<std::unique_ptr<IpcImportedBucket>> IpcImportedBucket::Open(const IpcBucket& bucket,
                                                                     torch::Device device) {
  if (!device.is_cuda()) {
    return absl::FailedPreconditionError(fmt::format(
        "a CUDA IPC bucket needs an engine on a CUDA device; this engine runs on {}", device.str()));
  }
  SLIME_ASSIGN_OR_RETURN(std::string uuid, DeviceUuid(device));
  if (uuid != bucket.device_uuid) {
    return absl::FailedPreconditionError(fmt::format(
        "the CUDA IPC bucket comes from GPU {} but this engine runs on GPU {}; the IPC hand-over "
        "is for an engine colocated with the trainer (use the nccl or disk transport)",
        bucket.device_uuid, uuid));
  }
  cudaIpcMemHandle_t handle;
  if (!Unhex(bucket.handle, reinterpret_cast<unsigned char*>(&handle), kHandleBytes)) {
    return absl::InvalidArgumentError("handle is not 128 hex digits");
  }
  const auto index = static_cast<c10::DeviceIndex>(DeviceIndex(device));
  c10::cuda::CUDAGuard guard(index);
  std::unique_ptr<IpcImportedBucket> b(new IpcImportedBucket());
  b->device_ = torch::Device(torch::kCUDA, index);
  SLIME_CUDA_RETURN_IF_ERROR(cudaIpcOpenMemHandle(&b->base_, handle, cudaIpcMemLazyEnablePeerAccess),
                             "cudaIpcOpenMemHandle (is the trainer process still alive?)");
  try {
    for (const IpcTensor& t : bucket.tensors) {
      b->tensors_.push_back(
          {t.name, torch::from_blob(static_cast<char*>(b->base_) + t.offset, t.shape,
                                    torch::TensorOptions().dtype(t.dtype).device(b->device_))});
    }
  } catch (const std::exception& e) {
    return absl::InternalError(
        fmt::format("viewing the IPC bucket: {}", std::string(e.what()).substr(0, 300)));
  }
  return b;
}

IpcImportedBucket::~IpcImportedBucket() {
  tensors_.clear();
  if (base_ != nullptr) {
    c10::cuda::CUDAGuard guard(device_.index());
    cudaDeviceSynchronize();  // every copy out of the mapping is done
    cudaIpcCloseMemHandle(base_);
  }
}

#else  // CPU build

namespace {
Status NoCuda() {
  return absl::UnimplementedError(
      "CUDA IPC weight hand-over: this build has no CUDA (use the nccl/gloo or disk transport)");
}
}  // namespace

bool CudaIpcBuilt() { return false; }
StatusOr<std::string> DeviceUuid(torch::Device) { return NoCuda(); }
StatusOr<std::unique_ptr<IpcExportBuffer>> IpcExportBuffer::Create(torch::Device, int64_t) {
  return NoCuda();
}
IpcExportBuffer::~IpcExportBuffer() = default;
StatusOr<IpcBucket> IpcExportBuffer::Pack(const std::vector<model::NamedTensor>&,
                                          std::optional<torch::ScalarType>) {
  return NoCuda();
}
StatusOr<std::unique_ptr<IpcImportedBucket>> IpcImportedBucket::Open(const IpcBucket&, torch::Device) {
  return NoCuda();
}
IpcImportedBucket::~IpcImportedBucket() = default;

#endif

// ---- SGLang's flattened bucket (the engine side; see SglangImportedBucket in the header)

namespace {

// torch's shared-memory files (RefcountedMapAllocator) start with a 64-byte header holding the
// file's own reference count; the data follows it.
constexpr int64_t kTorchMapHeader = 64;

// "GPU-58a3..." (nvidia-smi, our DeviceUuid) and "58a3..." (str() of torch's device UUID) name
// the same GPU.
[[maybe_unused]] std::string NormalizeUuid(std::string s) {
  if (s.rfind("GPU-", 0) == 0) s = s.substr(4);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

}  // namespace

Status SglangImportedBucket::View(const SglangBucket& b, char* data, torch::Device device) {
  SLIME_ASSIGN_OR_RETURN(torch::ScalarType flat, ParseDtypeName(b.dtype));
  const bool bytes_form = flat == torch::kUInt8;
  try {
    for (const SglangTensorMeta& m : b.tensors) {
      SLIME_ASSIGN_OR_RETURN(torch::ScalarType dtype, ParseDtypeName(m.dtype));
      torch::Tensor t;
      if (bytes_form) {  // SGLang's form: the tensor's bytes at [start, end)
        t = torch::from_blob(data + m.start, m.shape, torch::TensorOptions().dtype(dtype).device(device));
      } else {  // the older one-dtype form, converted as SGLang's reconstruct_tensors does
        t = torch::from_blob(data + m.start * static_cast<int64_t>(c10::elementSize(flat)), m.shape,
                             torch::TensorOptions().dtype(flat).device(device));
        if (dtype != flat) t = t.to(dtype);
      }
      tensors_.push_back({m.name, t});
    }
  } catch (const std::exception& e) {
    return absl::InternalError(
        fmt::format("viewing the flattened bucket: {}", std::string(e.what()).substr(0, 300)));
  }
  return absl::OkStatus();
}

// As torch's consumer does when it drops a received CUDA storage: one decrement of the
// producer's counter slot. Best effort: the producer may be gone.
void SglangImportedBucket::ReleaseRefCounter() {
  if (ref_counter_file_.empty()) return;
  const std::string name = std::exchange(ref_counter_file_, "");
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  struct stat st {};
  if (fd < 0 || fstat(fd, &st) != 0 ||
      st.st_size < kTorchMapHeader + 8 * (ref_counter_offset_ + 1)) {
    spdlog::warn("engine: cannot release the sender's CUDA IPC reference ({}, slot {}): {}", name,
                 ref_counter_offset_, fd < 0 ? std::strerror(errno) : "the file is too small");
    if (fd >= 0) close(fd);
    return;
  }
  void* m = mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (m == MAP_FAILED) {
    spdlog::warn("engine: cannot map the sender's CUDA IPC reference counters {}: {}", name,
                 std::strerror(errno));
    return;
  }
  auto* counter = reinterpret_cast<int64_t*>(static_cast<char*>(m) + kTorchMapHeader) +
                  ref_counter_offset_;
  __atomic_fetch_sub(counter, 1, __ATOMIC_SEQ_CST);
  munmap(m, st.st_size);
}

StatusOr<std::unique_ptr<SglangImportedBucket>> SglangImportedBucket::Open(
    const SglangBucket& b, torch::Device device) {
  std::unique_ptr<SglangImportedBucket> p(new SglangImportedBucket());
  p->device_ = device;
  switch (b.where) {
    case SglangBucket::Where::kEmpty:
      if (!b.tensors.empty()) {
        return absl::InvalidArgumentError("an empty flattened tensor with tensors in its metadata");
      }
      return p;
    case SglangBucket::Where::kSharedMemory: {
      const int fd = shm_open(b.shm.shm_name.c_str(), O_RDONLY, 0);
      if (fd < 0) {
        return absl::NotFoundError(fmt::format(
            "the flattened tensor's shared-memory file {}: {} (the sender must run on this host "
            "and keep the tensor alive until the reply)",
            b.shm.shm_name, std::strerror(errno)));
      }
      struct stat st {};
      const int64_t need = kTorchMapHeader + b.shm.bytes;
      if (fstat(fd, &st) != 0 || st.st_size < need) {
        close(fd);
        return absl::InvalidArgumentError(fmt::format(
            "the shared-memory file {} holds {} bytes; the storage needs {} after torch's header",
            b.shm.shm_name, static_cast<int64_t>(st.st_size), b.shm.bytes));
      }
      void* m = mmap(nullptr, need, PROT_READ, MAP_SHARED, fd, 0);
      close(fd);
      if (m == MAP_FAILED) {
        return absl::InternalError(
            fmt::format("mapping {}: {}", b.shm.shm_name, std::strerror(errno)));
      }
      p->map_ = m;
      p->map_bytes_ = need;
      char* data = static_cast<char*>(m) + kTorchMapHeader + b.storage_offset * DtypeBytes(b.dtype);
      SLIME_RETURN_IF_ERROR(p->View(b, data, torch::kCPU));
      return p;
    }
    case SglangBucket::Where::kCuda:
      break;
  }
#ifdef SLIME_WITH_CUDA
  if (!device.is_cuda()) {
    return absl::FailedPreconditionError(fmt::format(
        "the flattened bucket is a CUDA tensor (CUDA IPC) but this engine runs on {}", device.str()));
  }
  if (!b.cuda.device_uuid.empty()) {
    SLIME_ASSIGN_OR_RETURN(std::string uuid, DeviceUuid(device));
    if (NormalizeUuid(uuid) != NormalizeUuid(b.cuda.device_uuid)) {
      return absl::FailedPreconditionError(fmt::format(
          "the flattened bucket lives on GPU {} but this engine's rank runs on GPU {}; CUDA IPC "
          "needs the sender on the engine's GPU (entry i of serialized_named_tensors is for TP "
          "rank i)",
          b.cuda.device_uuid, uuid));
    }
  }
  // From here on the sender counts on our release of its block (also when this open fails).
  p->ref_counter_file_ = b.cuda.ref_counter_file;
  p->ref_counter_offset_ = b.cuda.ref_counter_offset;
  const auto index = static_cast<c10::DeviceIndex>(DeviceIndex(device));
  c10::cuda::CUDAGuard guard(index);
  p->device_ = torch::Device(torch::kCUDA, index);
  if (b.cuda.event_sync_required) {  // the producer's copies into the block must be done
    cudaIpcEventHandle_t eh;
    std::memcpy(&eh, b.cuda.event_handle.data(), sizeof(eh));
    cudaEvent_t event;
    SLIME_CUDA_RETURN_IF_ERROR(cudaIpcOpenEventHandle(&event, eh), "cudaIpcOpenEventHandle");
    const cudaError_t waited = cudaEventSynchronize(event);
    cudaEventDestroy(event);
    SLIME_CUDA_RETURN_IF_ERROR(waited, "waiting for the sender's CUDA IPC event");
  }
  cudaIpcMemHandle_t handle;
  std::memcpy(&handle, b.cuda.mem_handle.data(), sizeof(handle));
  SLIME_CUDA_RETURN_IF_ERROR(
      cudaIpcOpenMemHandle(&p->cuda_base_, handle, cudaIpcMemLazyEnablePeerAccess),
      "cudaIpcOpenMemHandle of the flattened bucket (is the sender alive, on this GPU?)");
  char* data = static_cast<char*>(p->cuda_base_) + b.cuda.storage_offset_bytes +
               b.storage_offset * DtypeBytes(b.dtype);
  SLIME_RETURN_IF_ERROR(p->View(b, data, p->device_));
  return p;
#else
  return absl::FailedPreconditionError(
      "the flattened bucket is a CUDA tensor (CUDA IPC) but this build has no CUDA");
#endif
}

SglangImportedBucket::~SglangImportedBucket() {
  tensors_.clear();
#ifdef SLIME_WITH_CUDA
  if (cuda_base_ != nullptr) {
    c10::cuda::CUDAGuard guard(device_.index());
    cudaDeviceSynchronize();  // every copy out of the mapping is done
    cudaIpcCloseMemHandle(cuda_base_);
  }
#endif
  if (map_ != nullptr) munmap(map_, map_bytes_);
  ReleaseRefCounter();
}

}  // namespace slime::comm
