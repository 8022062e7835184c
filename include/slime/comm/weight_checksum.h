// Per-tensor checksums of model weights, the same on both ends of a weight sync: the engine
// reports its tensors' (POST /weights_checksum, docs/http-api.md) and the trainer compares them
// with its own (weight_sync.check_weight_update_equal).
//
// TensorChecksum(t, dtype) is FNV-1a (64-bit) over the bytes of `t` converted to `dtype`, made
// contiguous and copied to the CPU (row-major, the host's byte order), written as
// "fnv1a64:" + 16 lower-case hex digits. The conversion is what a weight sync does (the engine
// copy_()s what it receives into its own dtype), so a trainer tensor and the engine's copy of it
// have equal checksums exactly when the engine holds the trainer's values. Debug use: it reads
// the whole tensor on the host (about 1 GB/s).
//
// Thread-safety: pure functions.
#ifndef SLIME_COMM_WEIGHT_CHECKSUM_H_
#define SLIME_COMM_WEIGHT_CHECKSUM_H_

#include <torch/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "slime/common/status.h"

namespace slime::comm {

// FNV-1a 64 of `size` bytes continuing from `state` (start: kFnv1a64Offset).
inline constexpr uint64_t kFnv1a64Offset = 14695981039346656037ull;
uint64_t Fnv1a64(const void* data, size_t size, uint64_t state = kFnv1a64Offset);

// The checksum above; Internal (naming the LibTorch error) when the conversion fails.
StatusOr<std::string> TensorChecksum(const torch::Tensor& t, torch::ScalarType dtype);

}  // namespace slime::comm

#endif  // SLIME_COMM_WEIGHT_CHECKSUM_H_
