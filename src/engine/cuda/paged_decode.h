// Paged single-query attention for decode steps on CUDA (our own kernel; no LibTorch here).
//
// For every sequence b and KV head h: the G = num_heads / num_kv_heads query heads that share h
// attend over positions [0, seq_lens[b]) whose K/V live in the flat slot pools at
// slot(p) = page_table[b][p / page_size] * page_size + p % page_size. One thread block per
// (kv head, sequence); its warps split the positions and merge their online-softmax partials.
// K/V are read once per KV head (not once per query head), in the storage dtype, with float
// accumulation.
//
// Layouts (all contiguous): q, out [B, num_heads, head_dim]; k_cache, v_cache [slots,
// num_kv_heads, head_dim]; page_table [B, max_pages] int32; seq_lens [B] int32 (>= 1).
// Supported: head_dim in {32, 64, 128}, G in {1, 2, 4, 8}, dtypes float32 / float16 / bfloat16.
// Reads its lengths from device memory, so it can be captured in a CUDA graph and replayed
// with new lengths and page tables.
#ifndef SLIME_SRC_ENGINE_CUDA_PAGED_DECODE_H_
#define SLIME_SRC_ENGINE_CUDA_PAGED_DECODE_H_

#include <cstdint>

namespace slime::engine::cuda {

enum class DType { kFloat32, kFloat16, kBFloat16 };

struct PagedDecodeArgs {
  const void* q = nullptr;       // [batch, num_heads, head_dim], rows q_row_stride apart
  int64_t q_row_stride = 0;      // elements between batch rows (0: num_heads * head_dim)
  const void* k_cache = nullptr;
  const void* v_cache = nullptr;
  void* out = nullptr;
  const int32_t* page_table = nullptr;
  const int32_t* seq_lens = nullptr;
  int batch = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int page_size = 0;
  int max_pages = 0;
  float scale = 1.0f;
  DType dtype = DType::kBFloat16;
  // Split-K for small batches (batch * kv_heads blocks would leave most of the GPU idle): each
  // sequence's positions are cut into num_splits shares computed by separate blocks, whose
  // partials (float, PagedDecodePartialFloats) are merged by a second kernel. 1 = no split.
  int num_splits = 1;
  float* partials = nullptr;
  // Optional [batch * num_kv_heads] int32 counters, zero on entry and left zero: with them the
  // last block of each (sequence, KV head) to finish merges the splits' partials itself (one
  // kernel instead of two; off with SLIME_DECODE_UNFUSE=attn_merge). Null: a merge kernel.
  int32_t* split_counters = nullptr;
  // Raw q|k|v rows (model::AttentionBackend::AttendRawQkv): `q` points at the rows of the fused
  // projection (q heads, then the k heads at num_heads * head_dim, then the v heads). The kernel
  // applies the per-head RMSNorm (q_norm / k_norm [head_dim], null: none; eps norm_eps) and RoPE
  // (cos / sin [batch, head_dim]) itself, rounding as the q/k norm + RoPE kernel does, and the
  // block holding each sequence's newest position stores that token's K/V at write_slots[b]
  // before reading it. The qkv rows are not modified.
  bool raw_qkv = false;
  const void* q_norm = nullptr;
  const void* k_norm = nullptr;
  float norm_eps = 1e-6f;
  const void* cos = nullptr;
  const void* sin = nullptr;
  const int64_t* write_slots = nullptr;
};

// The split count the engine uses for a decode batch (fixed per batch size, so CUDA graphs
// captured per size keep it): about 256 blocks in all, at most 16 splits, 1 once
// batch * kv_heads fills the GPU. SLIME_DECODE_SPLIT_TARGET=N aims for N blocks instead (to
// measure other split counts; read once).
int PagedDecodeSplits(int batch, int num_kv_heads);
inline int64_t PagedDecodePartialFloats(int batch, int num_heads, int head_dim, int splits) {
  return static_cast<int64_t>(batch) * num_heads * splits * (head_dim + 2);
}

// Whether AttendRawQkv may use the raw-q|k|v mode for a decode batch of `rows` (off with
// SLIME_DECODE_UNFUSE=attn_qkv). Only small batches: the mode removes a launch, which is what
// batch-1 decode pays for, but each block then normalises and rotates its q heads and the new K
// itself; at 256 rows on the H200 it cost 91 us a layer against 74 us for the q/k norm kernel
// plus the plain decode kernel.
constexpr int64_t kPagedDecodeRawQkvMaxRows = 8;
bool PagedDecodeRawQkvEnabled(int64_t rows);

// True when the kernel handles this shape.
bool PagedDecodeSupported(int head_dim, int num_heads, int num_kv_heads);

// Enqueues the kernel on `stream` (a cudaStream_t). Returns the cudaError_t as an int (0 = ok).
int LaunchPagedDecode(const PagedDecodeArgs& args, void* stream);

}  // namespace slime::engine::cuda

#endif  // SLIME_SRC_ENGINE_CUDA_PAGED_DECODE_H_
