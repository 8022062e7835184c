#include "slime/model/offload.h"

#include <c10/core/DeviceGuard.h>
#include <c10/core/StorageImpl.h>
#include <fmt/format.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <set>
#include <string>

namespace slime::model {

struct StorageOffloader::Entry {
  c10::intrusive_ptr<c10::StorageImpl> storage;
  torch::Device device = torch::kCPU;
  int64_t nbytes = 0;
  torch::Tensor host;  // [nbytes] uint8, pinned
};

namespace {

torch::Tensor ByteView(void* data, int64_t nbytes, torch::Device device) {
  return torch::from_blob(data, {nbytes}, torch::TensorOptions().dtype(torch::kUInt8).device(device));
}

std::string Short(const std::exception& e) { return std::string(e.what()).substr(0, 300); }

// Waits for the copies queued on every device the entries live on.
template <typename Entries>
void SynchronizeDevices(const Entries& entries) {
  std::set<int64_t> done;
  for (const auto& e : entries) {
    if (done.insert(e.device.index()).second) torch::cuda::synchronize(e.device.index());
  }
}

}  // namespace

StorageOffloader::StorageOffloader() = default;
StorageOffloader::~StorageOffloader() = default;

bool StorageOffloader::offloaded() const { return offloaded_; }
int64_t StorageOffloader::bytes() const { return bytes_; }

Status StorageOffloader::Offload(const std::vector<torch::Tensor>& tensors) {
  if (offloaded_) return absl::FailedPreconditionError("offload: already offloaded");
  std::vector<Entry> entries;
  std::set<const c10::StorageImpl*> seen;
  int64_t total = 0;
  try {
    for (const torch::Tensor& t : tensors) {
      if (!t.defined() || t.device().is_cpu() || !t.has_storage()) continue;
      c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
      if (!seen.insert(s).second || s->nbytes() == 0 || s->data_ptr().get() == nullptr) continue;
      Entry e;
      e.storage = c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(s);
      e.device = t.device();
      e.nbytes = static_cast<int64_t>(s->nbytes());
      e.host = torch::empty({e.nbytes},
                            torch::TensorOptions().dtype(torch::kUInt8).pinned_memory(true));
      e.host.copy_(ByteView(s->data_ptr().get(), e.nbytes, e.device), /*non_blocking=*/true);
      total += e.nbytes;
      entries.push_back(std::move(e));
    }
    SynchronizeDevices(entries);
  } catch (const std::exception& e) {
    return absl::ResourceExhaustedError(fmt::format(
        "offload: copying {} bytes to host memory failed (nothing was freed): {}", total, Short(e)));
  }
  // Only now that every copy is complete: free the device memory.
  for (Entry& e : entries) e.storage->set_data_ptr_noswap(at::DataPtr(nullptr, e.device));
  entries_ = std::move(entries);
  bytes_ = total;
  offloaded_ = true;
  return absl::OkStatus();
}

Status StorageOffloader::Onload() {
  if (!offloaded_) return absl::OkStatus();
  int64_t done = 0;
  try {
    // A retried Onload copies everything again from the host copies (still complete).
    for (Entry& e : entries_) {
      c10::DeviceGuard guard(e.device);
      // A fresh block from the device's caching allocator, moved into the old storage.
      torch::Tensor fresh =
          torch::empty({e.nbytes}, torch::TensorOptions().dtype(torch::kUInt8).device(e.device));
      at::DataPtr block =
          fresh.storage().unsafeGetStorageImpl()->set_data_ptr(at::DataPtr(nullptr, e.device));
      ByteView(block.get(), e.nbytes, e.device).copy_(e.host, /*non_blocking=*/true);
      e.storage->set_data_ptr_noswap(std::move(block));
      done += e.nbytes;
    }
    SynchronizeDevices(entries_);
  } catch (const std::exception& ex) {
    return absl::ResourceExhaustedError(fmt::format(
        "onload: {} of {} bytes are back on the device; the rest failed (retry once memory is "
        "free): {}",
        done, bytes_, Short(ex)));
  }
  // The copies are complete: the host buffers can go.
  entries_.clear();
  offloaded_ = false;
  return absl::OkStatus();
}

}  // namespace slime::model
