// Device memory offload that keeps every tensor object valid: the device storages behind a set of
// tensors are copied to pinned host memory and their device memory is freed; Onload allocates
// device memory again (at new addresses) and copies the contents back.
//
// The tensor objects, and every view sharing their storage (fused projection views, optimizer
// state exported by reference), stay the same objects throughout, so nobody needs to re-bind
// anything; only raw device pointers taken before Offload (CUDA graphs, IPC handles) go stale and
// must be rebuilt after Onload. Between the two calls the tensors have no device memory: reading
// or writing them is undefined (the owner refuses such work; see ModelRunner, TrainerWorker).
// CPU tensors are left alone, so on a CPU build Offload and Onload move nothing.
//
// Ownership: holds references to the storages and the host copies. Thread-safety: none; the
// caller must not run device work on these tensors concurrently.
#ifndef SLIME_MODEL_OFFLOAD_H_
#define SLIME_MODEL_OFFLOAD_H_

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "slime/common/status.h"

namespace slime::model {

class StorageOffloader {
 public:
  StorageOffloader();
  ~StorageOffloader();
  StorageOffloader(const StorageOffloader&) = delete;
  StorageOffloader& operator=(const StorageOffloader&) = delete;

  // Copies each distinct device storage behind `tensors` (undefined and CPU tensors skipped) to
  // pinned host memory, waits for the copies, then frees the device memory (returned to the
  // caching allocator; call emptyCache to give it to the driver). FailedPrecondition when
  // already offloaded; a LibTorch error (e.g. host memory exhausted) leaves everything on the
  // device.
  Status Offload(const std::vector<torch::Tensor>& tensors);
  // Re-allocates the device memory and copies the contents back. A no-op when not offloaded.
  // ResourceExhausted (nothing changed that was not undone) when the device is full.
  Status Onload();

  bool offloaded() const;
  // Bytes moved by the last Offload.
  int64_t bytes() const;

 private:
  struct Entry;
  std::vector<Entry> entries_;
  bool offloaded_ = false;
  int64_t bytes_ = 0;
};

}  // namespace slime::model

#endif  // SLIME_MODEL_OFFLOAD_H_
