// HF safetensors checkpoints as LibTorch tensors: a reader for a model directory (single file or
// sharded with model.safetensors.index.json) that loads whole tensors or the slice one
// tensor-parallel rank needs, and an atomic, size-sharded writer.
//
// Reader: Open() maps every file and checks the index against the shards, so later loads fail
// only on per-tensor problems (missing, shape, dtype), each error naming the file and tensor.
// Loads are zero-copy (a from_blob view of the private mapping, which the view keeps alive)
// when the stored dtype and layout are what was asked for on CPU; otherwise one copy converts.
// Thread-safety: the reader is immutable after Open(); Load() may be called from any thread.
//
// Writer: tensors are written in the given order, a new shard starting when the next tensor
// would push the current one past max_shard_bytes. One shard → model.safetensors; several →
// model-0000i-of-0000N.safetensors plus model.safetensors.index.json (written last). Every
// file is written to a temporary and renamed; stale model files of the other layout are removed.
#ifndef SLIME_MODEL_CHECKPOINT_H_
#define SLIME_MODEL_CHECKPOINT_H_

#include <torch/types.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "slime/common/status.h"
#include "slime/model/safetensors.h"

namespace slime::model {

inline constexpr char kSafetensorsSingleFile[] = "model.safetensors";
inline constexpr char kSafetensorsIndexFile[] = "model.safetensors.index.json";

// Part `rank` of `parts` equal parts along `dim`; dim < 0 means the whole tensor.
struct TensorSlice {
  int64_t dim = -1;
  int rank = 0;
  int parts = 1;
};

struct LoadTensorOptions {
  // When not empty, the stored (full) shape must equal this.
  std::vector<int64_t> expected_shape;
  TensorSlice slice;
  // Convert to this dtype (a floating dtype also requires a floating stored dtype).
  std::optional<torch::ScalarType> dtype;
  torch::Device device = torch::kCPU;
};

class CheckpointReader {
 public:
  // `dir` holds model.safetensors or model.safetensors.index.json (the single file wins, as in
  // transformers).
  static StatusOr<CheckpointReader> Open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  // Sorted tensor names.
  std::vector<std::string> TensorNames() const;
  bool Contains(const std::string& name) const { return where_.count(name) > 0; }
  // Metadata of `name` and the file holding it; NotFound names the directory.
  StatusOr<const SafetensorsTensorInfo*> Info(const std::string& name) const;
  StatusOr<std::string> FileOf(const std::string& name) const;

  StatusOr<torch::Tensor> Load(const std::string& name,
                               const LoadTensorOptions& options = {}) const;

 private:
  struct Location {
    std::shared_ptr<const SafetensorsFile> file;
    const SafetensorsTensorInfo* info = nullptr;
  };
  std::string dir_;
  std::map<std::string, Location> where_;
};

struct NamedTensor {
  std::string name;
  torch::Tensor tensor;  // any device; written as its dtype, contiguous
};

struct WriteCheckpointOptions {
  int64_t max_shard_bytes = int64_t{4} << 30;
  std::map<std::string, std::string> metadata = {{"format", "pt"}};
};

// Writes `tensors` into `dir` (created if missing).
Status WriteCheckpoint(const std::string& dir, const std::vector<NamedTensor>& tensors,
                       const WriteCheckpointOptions& options = {});

}  // namespace slime::model

#endif  // SLIME_MODEL_CHECKPOINT_H_
