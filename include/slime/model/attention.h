// Causal self-attention for the decoder, behind one interface with two storage strategies.
//
// The decoder layer computes q, k, v for the tokens of one forward (after QK-norm and RoPE) and
// hands them to an AttentionBackend, which decides where K/V live and which keys each query
// sees:
//   - VarlenAttention: packed training/prefill batch — sequences concatenated along the token
//     dim, described by cu_seqlens; causal within each sequence, no padding, no cache.
//   - KvCacheAttention: incremental (engine) forward — each sequence appends its new tokens' K/V
//     to its own contiguous KvCache and attends over the cached prefix plus itself.
// Both reduce to CausalAttention(q, k, v) over K/V *views* [L, kv_heads, head_dim], so a paged
// cache (engine issue) only has to produce such views (or implement AttentionBackend itself).
//
// CausalAttention uses scaled_dot_product_attention when built against LibTorch >= 2
// (AttentionImpl::kAuto / kSdpa) and an explicit matmul-softmax-matmul otherwise (kMath; softmax
// in float32 as HF's eager attention). Both are differentiable.
//
// Thread-safety: backends and caches belong to the one thread running the forward.
#ifndef SLIME_MODEL_ATTENTION_H_
#define SLIME_MODEL_ATTENTION_H_

#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "slime/common/status.h"

namespace slime::model {

enum class AttentionImpl { kAuto, kSdpa, kMath };

// True when this build has scaled_dot_product_attention (LibTorch >= 2).
bool SdpaAvailable();

// Causal attention of the last n positions of one sequence over all its L >= n positions:
// query i (absolute position L-n+i) sees keys 0..L-n+i. Scale 1/sqrt(head_dim).
//   q [n, heads, head_dim], k/v [L, kv_heads, head_dim] (heads % kv_heads == 0; views allowed)
//   -> [n, heads, head_dim]
// kSdpa without SDPA in this build throws c10::Error.
torch::Tensor CausalAttention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, AttentionImpl impl = AttentionImpl::kAuto);

class AttentionBackend {
 public:
  virtual ~AttentionBackend() = default;
  // q [T, heads, head_dim], k/v [T, kv_heads, head_dim] for the T tokens of this forward, in
  // the packed order of the batch. Returns [T, heads, head_dim].
  virtual torch::Tensor Attend(int layer, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v) = 0;

  // Where a fused inference kernel may store this layer's K/V itself: the cache tensors
  // [slots, kv_heads, head_dim] and the int64 slot of each token of the forward. A caller that
  // stored them then calls Attend with undefined k and v. Backends that keep their own K/V
  // layout return nullopt (the default).
  struct KvWriteTarget {
    torch::Tensor k_cache, v_cache, slots;
  };
  virtual std::optional<KvWriteTarget> DirectKvWrite(int layer) { return std::nullopt; }

  // Decode steps on CUDA: attention straight from the raw rows of the fused q|k|v projection
  // [T, (heads + 2 kv_heads) head_dim], with the per-head RMSNorm (q_norm / k_norm, undefined
  // when the model has none) and RoPE (cos / sin [T, head_dim]) applied inside the attention
  // kernel, which also stores the new token's K/V in the cache — one kernel instead of the
  // q/k norm + RoPE kernel and the attention kernel. Returns [T, heads, head_dim], or nullopt
  // when this backend or this forward cannot (the caller then transforms q/k itself and calls
  // Attend). The qkv rows are left as they were.
  struct RawQkv {
    torch::Tensor qkv, q_norm, k_norm, cos, sin;
    double eps = 1e-6;
    int64_t heads = 0, kv_heads = 0;
  };
  virtual std::optional<torch::Tensor> AttendRawQkv(int layer, const RawQkv& raw) {
    return std::nullopt;
  }
};

// Packed variable-length sequences. cu_seqlens [B+1]: cu[0] = 0, non-decreasing, cu[B] = T.
class VarlenAttention final : public AttentionBackend {
 public:
  VarlenAttention(std::vector<int64_t> cu_seqlens, AttentionImpl impl = AttentionImpl::kAuto)
      : cu_seqlens_(std::move(cu_seqlens)), impl_(impl) {}
  torch::Tensor Attend(int layer, const torch::Tensor& q, const torch::Tensor& k,
                       const torch::Tensor& v) override;

 private:
  std::vector<int64_t> cu_seqlens_;
  AttentionImpl impl_;
};

// A contiguous K/V cache for one sequence: per layer k/v [capacity, kv_heads, head_dim].
// Invariant: positions [0, length()) hold the K/V of the sequence's tokens so far.
class KvCache {
 public:
  KvCache(int64_t num_layers, int64_t capacity, int64_t kv_heads, int64_t head_dim,
          torch::TensorOptions options);

  int64_t length() const { return length_; }
  int64_t capacity() const { return capacity_; }
  int64_t num_layers() const { return static_cast<int64_t>(k_.size()); }
  // Full buffers [capacity, kv_heads, head_dim]; rows >= length() are unspecified.
  const torch::Tensor& keys(int layer) const { return k_[layer]; }
  const torch::Tensor& values(int layer) const { return v_[layer]; }

  // Drops positions >= new_length (new_length <= length()).
  Status Truncate(int64_t new_length);

 private:
  friend class KvCacheAttention;
  std::vector<torch::Tensor> k_;  // per layer [capacity, kv_heads, head_dim]
  std::vector<torch::Tensor> v_;  // per layer [capacity, kv_heads, head_dim]
  int64_t capacity_ = 0;
  int64_t length_ = 0;
};

// Sequence b contributes tokens [cu[b], cu[b+1]) of the batch and owns caches[b]. Attend()
// writes their K/V at positions [length, length + n) of the cache and attends over [0, length +
// n); Commit() then advances every cache by its n (call it once after all layers ran).
class KvCacheAttention final : public AttentionBackend {
 public:
  // Fails when the caches do not match cu_seqlens or lack capacity.
  static StatusOr<KvCacheAttention> Create(std::vector<int64_t> cu_seqlens,
                                           std::vector<KvCache*> caches,
                                           AttentionImpl impl = AttentionImpl::kAuto);
  torch::Tensor Attend(int layer, const torch::Tensor& q, const torch::Tensor& k,
                       const torch::Tensor& v) override;
  void Commit();

  // Absolute positions [T] (int64, CPU) of the new tokens: cache length + offset.
  torch::Tensor Positions() const;

 private:
  KvCacheAttention(std::vector<int64_t> cu, std::vector<KvCache*> caches, AttentionImpl impl)
      : cu_seqlens_(std::move(cu)), caches_(std::move(caches)), impl_(impl) {}
  std::vector<int64_t> cu_seqlens_;
  std::vector<KvCache*> caches_;  // not owned
  AttentionImpl impl_;
};

// Checks cu_seqlens against a packed batch of `num_tokens`; the error says what is wrong.
Status ValidateCuSeqlens(const std::vector<int64_t>& cu_seqlens, int64_t num_tokens);

// Position ids [T] (int64, CPU) that restart at 0 for every sequence of cu_seqlens.
torch::Tensor VarlenPositions(const std::vector<int64_t>& cu_seqlens);

}  // namespace slime::model

#endif  // SLIME_MODEL_ATTENTION_H_
