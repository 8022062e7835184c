// Causal attention, varlen and KV-cache backends (see include/slime/model/attention.h).
#include "slime/model/attention.h"

#include <fmt/format.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <cmath>
#include <limits>
#include <set>

#include "slime/model/batch_invariant.h"

#if TORCH_VERSION_MAJOR >= 2
#define SLIME_HAVE_SDPA 1
#endif
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5)
#define SLIME_HAVE_SDPA_GQA 1
#endif

namespace slime::model {
namespace {

// [B, Hkv, L, D] -> [B, Hkv * groups, L, D], each KV head repeated for its query-head group.
torch::Tensor RepeatKv(const torch::Tensor& x, int64_t groups) {
  if (groups == 1) return x;
  const int64_t b = x.size(0), h = x.size(1), l = x.size(2), d = x.size(3);
  return x.unsqueeze(2).expand({b, h, groups, l, d}).reshape({b, h * groups, l, d});
}

// allowed[i, j] = key j is visible to query i, for the last n of L positions. [n, L] bool.
torch::Tensor PrefixCausalMask(int64_t n, int64_t l, const torch::Device& device) {
  auto opts = torch::TensorOptions().dtype(torch::kLong).device(device);
  torch::Tensor rows = torch::arange(n, opts).unsqueeze(1) + (l - n);  // [n, 1]
  torch::Tensor cols = torch::arange(l, opts).unsqueeze(0);            // [1, L]
  return cols <= rows;
}

// Batched core. q [B, H, n, D], k/v [B, Hkv, L, D] -> [B, H, n, D].
torch::Tensor AttendHeadsFirst(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, AttentionImpl impl) {
  const int64_t n = q.size(2);
  const int64_t l = k.size(2);
  const int64_t groups = q.size(1) / k.size(1);
  TORCH_CHECK(q.size(1) % k.size(1) == 0, "attention: ", q.size(1),
              " query heads are not a multiple of ", k.size(1), " KV heads");
  TORCH_CHECK(l >= n, "attention: ", n, " queries but only ", l, " keys");
  bool use_sdpa = impl == AttentionImpl::kSdpa || (impl == AttentionImpl::kAuto && SdpaAvailable());
  TORCH_CHECK(!use_sdpa || SdpaAvailable(),
              "attention: scaled_dot_product_attention needs LibTorch >= 2, this build has ",
              TORCH_VERSION);
  if (use_sdpa) {
#ifdef SLIME_HAVE_SDPA
    const bool need_mask = n > 1 && n < l;
    const bool causal = n > 1 && n == l;
    if (need_mask) {
      torch::Tensor mask = PrefixCausalMask(n, l, q.device());
      return at::scaled_dot_product_attention(q, RepeatKv(k, groups), RepeatKv(v, groups), mask,
                                              0.0, false);
    }
#ifdef SLIME_HAVE_SDPA_GQA
    return at::scaled_dot_product_attention(q, k, v, {}, 0.0, causal, std::nullopt,
                                            /*enable_gqa=*/groups > 1);
#else
    return at::scaled_dot_product_attention(q, RepeatKv(k, groups), RepeatKv(v, groups), {}, 0.0,
                                            causal);
#endif
#endif
  }
  // Math path, as HF's eager attention: scores in the compute dtype, softmax in float32.
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  torch::Tensor kr = RepeatKv(k, groups);
  torch::Tensor vr = RepeatKv(v, groups);
  torch::Tensor scores = torch::matmul(q, kr.transpose(-2, -1)) * scale;  // [B, H, n, L]
  if (n > 1) {
    torch::Tensor mask = PrefixCausalMask(n, l, q.device());
    scores = scores.masked_fill(mask.logical_not(), -std::numeric_limits<double>::infinity());
  }
  torch::Tensor probs = torch::softmax(scores, -1, torch::kFloat32).to(q.scalar_type());
  return torch::matmul(probs, vr);  // [B, H, n, D]
}

// q [B, n, H, D], k/v [B, L, Hkv, D] -> [B, n, H, D].
torch::Tensor AttendTokensFirst(const torch::Tensor& q, const torch::Tensor& k,
                                const torch::Tensor& v, AttentionImpl impl) {
  if (BatchInvariant() && InvariantKernelsServe(q.device())) {
    // Deterministic mode: each sequence through the batch-invariant kernel on its own.
    std::vector<torch::Tensor> out;
    for (int64_t b = 0; b < q.size(0); ++b) {
      out.push_back(InvariantCausalAttention(q[b], k[b], v[b]));
    }
    return torch::stack(out);
  }
  return AttendHeadsFirst(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), impl)
      .transpose(1, 2);
}

}  // namespace

bool SdpaAvailable() {
#ifdef SLIME_HAVE_SDPA
  return true;
#else
  return false;
#endif
}

torch::Tensor CausalAttention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, AttentionImpl impl) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3,
              "attention: expected q [n, heads, head_dim] and k/v [L, kv_heads, head_dim]");
  return AttendTokensFirst(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), impl).squeeze(0);
}

torch::Tensor VarlenAttention::Attend(int /*layer*/, const torch::Tensor& q, const torch::Tensor& k,
                                      const torch::Tensor& v) {
  const size_t b = cu_seqlens_.size() - 1;
  const int64_t len0 = cu_seqlens_[1] - cu_seqlens_[0];
  bool equal = len0 > 0;
  for (size_t i = 1; i < b && equal; ++i) equal = cu_seqlens_[i + 1] - cu_seqlens_[i] == len0;
  if (equal) {
    // All sequences have one length: one batched call on [B, L, heads, D] views.
    const int64_t bs = static_cast<int64_t>(b);
    auto batched = [&](const torch::Tensor& x) {
      return x.reshape({bs, len0, x.size(1), x.size(2)});
    };
    torch::Tensor out = AttendTokensFirst(batched(q), batched(k), batched(v), impl_);
    return out.reshape({bs * len0, q.size(1), q.size(2)});
  }
  std::vector<torch::Tensor> outs;
  outs.reserve(b);
  for (size_t i = 0; i < b; ++i) {
    const int64_t s = cu_seqlens_[i];
    const int64_t n = cu_seqlens_[i + 1] - s;
    if (n == 0) continue;
    outs.push_back(CausalAttention(q.narrow(0, s, n), k.narrow(0, s, n), v.narrow(0, s, n), impl_));
  }
  return outs.size() == 1 ? outs[0] : torch::cat(outs, 0);
}

KvCache::KvCache(int64_t num_layers, int64_t capacity, int64_t kv_heads, int64_t head_dim,
                 torch::TensorOptions options)
    : capacity_(capacity) {
  k_.reserve(num_layers);
  v_.reserve(num_layers);
  for (int64_t l = 0; l < num_layers; ++l) {
    k_.push_back(torch::empty({capacity, kv_heads, head_dim}, options));
    v_.push_back(torch::empty({capacity, kv_heads, head_dim}, options));
  }
}

Status KvCache::Truncate(int64_t new_length) {
  if (new_length < 0 || new_length > length_) {
    return absl::InvalidArgumentError(
        fmt::format("KV cache: cannot truncate to {} (length {})", new_length, length_));
  }
  length_ = new_length;
  return absl::OkStatus();
}

StatusOr<KvCacheAttention> KvCacheAttention::Create(std::vector<int64_t> cu_seqlens,
                                                    std::vector<KvCache*> caches,
                                                    AttentionImpl impl) {
  if (cu_seqlens.size() < 2) {
    return absl::InvalidArgumentError("KV-cache forward: cu_seqlens needs at least 2 entries");
  }
  SLIME_RETURN_IF_ERROR(ValidateCuSeqlens(cu_seqlens, cu_seqlens.back()));
  if (caches.size() != cu_seqlens.size() - 1) {
    return absl::InvalidArgumentError(
        fmt::format("KV-cache forward: {} sequences in cu_seqlens but {} caches",
                    cu_seqlens.size() - 1, caches.size()));
  }
  std::set<KvCache*> seen;
  for (size_t b = 0; b < caches.size(); ++b) {
    KvCache* c = caches[b];
    if (c == nullptr || !seen.insert(c).second) {
      return absl::InvalidArgumentError(
          fmt::format("KV-cache forward: cache {} is null or used twice", b));
    }
    const int64_t n = cu_seqlens[b + 1] - cu_seqlens[b];
    if (c->length() + n > c->capacity()) {
      return absl::ResourceExhaustedError(
          fmt::format("KV cache of sequence {} is full: {} cached + {} new tokens > capacity {}", b,
                      c->length(), n, c->capacity()));
    }
  }
  return KvCacheAttention(std::move(cu_seqlens), std::move(caches), impl);
}

torch::Tensor KvCacheAttention::Attend(int layer, const torch::Tensor& q, const torch::Tensor& k,
                                       const torch::Tensor& v) {
  std::vector<torch::Tensor> outs;
  outs.reserve(caches_.size());
  for (size_t b = 0; b < caches_.size(); ++b) {
    const int64_t s = cu_seqlens_[b];
    const int64_t n = cu_seqlens_[b + 1] - s;
    if (n == 0) continue;
    KvCache& cache = *caches_[b];
    const int64_t len = cache.length_;
    TORCH_CHECK(layer >= 0 && layer < cache.num_layers(), "KV cache has ", cache.num_layers(),
                " layers, layer ", layer, " requested");
    torch::Tensor& ck = cache.k_[layer];  // [capacity, kv_heads, D]
    torch::Tensor& cv = cache.v_[layer];
    ck.narrow(0, len, n).copy_(k.narrow(0, s, n));
    cv.narrow(0, len, n).copy_(v.narrow(0, s, n));
    outs.push_back(CausalAttention(q.narrow(0, s, n), ck.narrow(0, 0, len + n),
                                   cv.narrow(0, 0, len + n), impl_));
  }
  return outs.size() == 1 ? outs[0] : torch::cat(outs, 0);
}

void KvCacheAttention::Commit() {
  for (size_t b = 0; b < caches_.size(); ++b) {
    caches_[b]->length_ += cu_seqlens_[b + 1] - cu_seqlens_[b];
  }
}

torch::Tensor KvCacheAttention::Positions() const {
  std::vector<int64_t> pos;
  pos.reserve(cu_seqlens_.back());
  for (size_t b = 0; b < caches_.size(); ++b) {
    const int64_t start = caches_[b]->length();
    for (int64_t i = 0; i < cu_seqlens_[b + 1] - cu_seqlens_[b]; ++i) pos.push_back(start + i);
  }
  return torch::tensor(pos, torch::kLong);
}

Status ValidateCuSeqlens(const std::vector<int64_t>& cu, int64_t num_tokens) {
  if (cu.size() < 2) {
    return absl::InvalidArgumentError(
        fmt::format("cu_seqlens must have at least 2 entries (one sequence), got {}", cu.size()));
  }
  if (cu.front() != 0) {
    return absl::InvalidArgumentError(fmt::format("cu_seqlens[0] must be 0, got {}", cu.front()));
  }
  for (size_t i = 1; i < cu.size(); ++i) {
    if (cu[i] < cu[i - 1]) {
      return absl::InvalidArgumentError(fmt::format(
          "cu_seqlens must be non-decreasing: cu_seqlens[{}] = {} < cu_seqlens[{}] = {}", i, cu[i],
          i - 1, cu[i - 1]));
    }
  }
  if (cu.back() != num_tokens) {
    return absl::InvalidArgumentError(
        fmt::format("cu_seqlens ends at {} but the batch has {} tokens", cu.back(), num_tokens));
  }
  return absl::OkStatus();
}

torch::Tensor VarlenPositions(const std::vector<int64_t>& cu) {
  std::vector<int64_t> pos;
  pos.reserve(cu.empty() ? 0 : cu.back());
  for (size_t b = 0; b + 1 < cu.size(); ++b) {
    for (int64_t i = 0; i < cu[b + 1] - cu[b]; ++i) pos.push_back(i);
  }
  return torch::tensor(pos, torch::kLong);
}

}  // namespace slime::model
