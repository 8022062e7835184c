// Reading the weight buckets SGLang's /update_weights_from_tensor carries (load_format
// "flattened_bucket"), as slime's colocated trainer sends them: each `serialized_named_tensors`
// entry is base64 of a Python pickle (multiprocessing's ForkingPickler with torch's tensor
// reductions) of {"flattened_tensor": <tensor>, "metadata": [FlattenedTensorMetadata, ...]}.
//
// Two layers, neither of which executes anything:
// - ParsePickle: a restricted pickle reader (protocols 0-5, no persistent ids, extensions or
//   out-of-band buffers) that turns the opcode stream into a value tree. A global reference
//   (`module.name`) stays a name; a call (REDUCE, NEWOBJ) stays a node holding its callee and
//   arguments; BUILD attaches the state to the object it builds.
// - DecodeSglangBucket: recognises the bucket in that tree, accepting only the callables torch
//   and SGLang use for it, and checks every field (docs/http-api.md, "flattened_bucket"):
//     * a CUDA tensor: torch's rebuild_cuda_tensor(tensor class, size, stride, offset, storage
//       class, dtype, device, cudaIpcMemHandle_t, storage bytes, storage byte offset,
//       requires_grad, ref-counter file, ref-counter offset, cudaIpcEventHandle_t, event sync
//       required), the device an index or (SGLang's monkey patch, _rebuild_cuda_tensor_modified)
//       the GPU's UUID;
//     * a CPU tensor in shared memory (torch's "file_system" sharing strategy): rebuild_tensor
//       over rebuild_typed_storage / rebuild_storage_filename (the /dev/shm name), or an empty
//       storage (a rank with nothing to send);
//     * metadata: FlattenedTensorMetadata(name, shape, dtype, start_idx, end_idx, numel), with
//       [start_idx, end_idx) counted in elements of the flattened tensor: bytes in SGLang's
//       uint8 form (any dtypes mixed), elements of the one dtype in the older form.
//   File-descriptor-shared CPU tensors (torch's default strategy) cannot cross HTTP and are
//   refused with a message naming the strategy to use.
// Thread-safety: free functions without state. No torch headers (unit-tested and fuzzed alone).
#ifndef SLIME_COMM_TORCH_PICKLE_H_
#define SLIME_COMM_TORCH_PICKLE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "slime/common/status.h"

namespace slime::comm {

struct PickleValue;
using PickleRef = std::shared_ptr<PickleValue>;

struct PickleValue {
  enum class Kind { kNone, kBool, kInt, kFloat, kString, kBytes, kList, kTuple, kDict, kSet,
                    kGlobal, kCall };
  Kind kind = Kind::kNone;
  bool boolean = false;
  int64_t integer = 0;
  double real = 0;
  std::string text;                                  // string, bytes, or "module.name" (global)
  std::vector<PickleRef> items;                      // list, tuple, set; call: its arguments
  std::vector<std::pair<PickleRef, PickleRef>> entries;  // dict
  PickleRef callee;                                  // call: the global called (or the class)
  PickleRef state;                                   // call: what BUILD set (null when none)
};

// Limits bound memory and work on hostile input: the container and memo sizes are bounded by
// the input size; nesting is bounded by kMaxPickleDepth when the tree is walked.
inline constexpr int kMaxPickleDepth = 64;

// InvalidArgument naming the opcode and its byte offset on malformed or unsupported input.
StatusOr<PickleRef> ParsePickle(std::string_view bytes);

// A short rendering for error messages (`module.name(...)`, `{'k': ...}`), at most ~200 chars.
std::string PickleSummary(const PickleValue& v);

struct SglangTensorMeta {
  std::string name;
  std::vector<int64_t> shape;
  std::string dtype;  // torch's name without "torch.", e.g. "bfloat16"
  int64_t start = 0;  // [start, end) in elements of the flattened tensor
  int64_t end = 0;
};

// Where the flattened tensor's storage lives.
struct SglangCudaStorage {
  std::string device_uuid;     // as sent (SGLang's patch); empty when only an index came
  int64_t device_index = -1;   // as sent by unpatched torch; -1 with a UUID
  std::string mem_handle;      // cudaIpcMemHandle_t, 64 bytes
  int64_t storage_bytes = 0;
  int64_t storage_offset_bytes = 0;
  std::string ref_counter_file;  // shared-memory name of the producer's ref counters
  int64_t ref_counter_offset = 0;  // in int64 slots
  std::string event_handle;      // cudaIpcEventHandle_t, 64 bytes (when event_sync_required)
  bool event_sync_required = false;
};
struct SglangShmStorage {
  std::string shm_name;  // e.g. "/torch_1234_567_0", opened with shm_open
  int64_t bytes = 0;     // storage bytes (the data follows torch's 64-byte map header)
};

struct SglangBucket {
  enum class Where { kEmpty, kCuda, kSharedMemory };
  Where where = Where::kEmpty;
  SglangCudaStorage cuda;
  SglangShmStorage shm;
  std::string dtype;             // the flattened tensor's dtype ("uint8" in SGLang's form)
  int64_t numel = 0;             // elements of the flattened tensor (1-D, contiguous)
  int64_t storage_offset = 0;    // in elements, into the storage
  std::vector<SglangTensorMeta> tensors;
};

// Element size of a torch dtype name ("bfloat16" -> 2); 0 when unknown.
int64_t DtypeBytes(std::string_view dtype);

// `entry` is one serialized_named_tensors string: base64 of the pickle (raw pickle bytes
// starting with the PROTO opcode are taken as they are). InvalidArgument names what is wrong
// ("metadata[3].end_idx ...", "flattened_tensor: ...").
StatusOr<SglangBucket> DecodeSglangBucket(std::string_view entry);

}  // namespace slime::comm

#endif  // SLIME_COMM_TORCH_PICKLE_H_
