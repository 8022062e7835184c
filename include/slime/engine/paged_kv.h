// Paged K/V storage for the engine and the attention backend that reads and writes it.
//
// PagedKvCache holds, per layer, one flat pool of token slots k/v [num_pages * page_size,
// kv_heads, head_dim] in the model dtype on the model device. Which slots belong to which
// sequence is decided elsewhere (KvPagePool / RadixCache / Scheduler in engine_core): the slot of
// position p of a sequence with page table `pages` is pages[p / page_size] * page_size +
// p % page_size. Page 0 is never handed out and serves as the padding target of batched reads.
//
// PagedAttention is the model::AttentionBackend of one engine forward. For every item of the
// batch (a run of new tokens of one sequence) it writes the new tokens' K/V into their slots and
// attends causally over the sequence's context [0, context_len):
//   - decode items (one new token) are batched: on CUDA our paged decode kernel reads K/V
//     straight from the pages (cuda/paged_decode.cu); elsewhere their context slots are
//     gathered into [B, L_max, kv_heads, D] with a padding mask, one attention call per layer;
//   - prefill items (several new tokens) attend one by one over their gathered context.
// The layout tensors are built on the host once per forward and copied to the device once.
//
// Release()/Resume() drop and re-allocate the pools (SGLang's release/resume memory
// occupation); contents are garbage after Resume, callers flush every cached prefix.
//
// Thread-safety: the engine thread only.
#ifndef SLIME_ENGINE_PAGED_KV_H_
#define SLIME_ENGINE_PAGED_KV_H_

#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "slime/model/attention.h"

namespace slime::engine {

class PagedKvCache {
 public:
  PagedKvCache(int64_t num_layers, int64_t num_pages, int64_t page_size, int64_t kv_heads,
               int64_t head_dim, torch::TensorOptions options);

  // Bytes one token occupies over all layers (K and V).
  static int64_t BytesPerToken(int64_t num_layers, int64_t kv_heads, int64_t head_dim,
                               torch::ScalarType dtype);

  int64_t num_layers() const { return num_layers_; }
  int64_t num_pages() const { return num_pages_; }
  int64_t page_size() const { return page_size_; }
  int64_t num_slots() const { return num_pages_ * page_size_; }
  bool released() const { return k_.empty(); }

  torch::Tensor& keys(int layer) { return k_[layer]; }    // [num_slots, kv_heads, D]
  torch::Tensor& values(int layer) { return v_[layer]; }  // [num_slots, kv_heads, D]

  // [kSplitCounters] int32, zero between kernels: the paged decode kernel's per-(sequence, KV
  // head) arrival counters for merging split-K partials in the last block (it resets them).
  // Small and never released, so CUDA graphs may keep its address.
  static constexpr int64_t kSplitCounters = 256;
  torch::Tensor& split_counters() { return split_counters_; }

  void Release();
  void Resume();

 private:
  int64_t num_layers_, num_pages_, page_size_, kv_heads_, head_dim_;
  torch::Tensor split_counters_;
  torch::TensorOptions options_;
  std::vector<torch::Tensor> k_;
  std::vector<torch::Tensor> v_;
};

// One item of an engine forward, host side.
struct PagedItem {
  int64_t num_new = 0;          // tokens computed this forward (rows [offset, offset+num_new))
  int64_t context_len = 0;      // positions visible after this forward: start + num_new
  const std::vector<int32_t>* pages = nullptr;  // covers [0, context_len)
};

// Device-side layout of one forward over `items` (in batch row order).
struct PagedLayout {
  int64_t num_tokens = 0;
  torch::Tensor positions;    // [T] int64: absolute position of each new token
  torch::Tensor write_slots;  // [T] int64: slot receiving each new token's K/V
  // Decode items (num_new == 1), batched.
  torch::Tensor decode_rows;   // [Bd] int64: their rows in the batch
  torch::Tensor decode_slots;  // [Bd, L_max] int64: context slots, padded with slot 0
  torch::Tensor decode_mask;   // [Bd, 1, 1, L_max] bool: true = visible
  bool decode_rows_are_prefix = false;  // decode rows are exactly 0..Bd-1
  // Prefill items: first row, number of new tokens, context slots [context_len] int64.
  struct Prefill {
    int64_t row = 0;
    int64_t num_new = 0;
    torch::Tensor slots;
  };
  std::vector<Prefill> prefills;
  // Several prefill items of similar shape run as one padded batch (when padding at most doubles
  // the work): queries [P, n_max] gathered from rows, contexts [P, L_max] gathered from slots,
  // a causal-with-offset mask, and the valid queries scattered back.
  bool prefill_batched = false;
  int64_t prefill_p = 0, prefill_n_max = 0, prefill_l_max = 0;
  torch::Tensor prefill_q_index;    // [P * n_max] int64: batch row of each padded query
  torch::Tensor prefill_slots;      // [P * L_max] int64: context slots, padded with slot 0
  torch::Tensor prefill_mask;       // [P, 1, n_max, L_max] bool
  torch::Tensor prefill_out_index;  // [sum n] int64: padded query index of each valid query
  torch::Tensor prefill_out_rows;   // [sum n] int64: its batch row
  // With the CUDA decode kernel (decode_kernel): page tables and lengths instead of gathered
  // slots; decode_slots/decode_mask stay undefined.
  bool decode_kernel = false;
  torch::Tensor decode_page_table;  // [Bd, max_pages] int32
  torch::Tensor decode_seq_lens;    // [Bd] int32

  // Deterministic mode on CUDA: every new token of the step in one batch-invariant attention
  // launch (model::InvariantPagedAttention) instead of `prefills`: each item's context slots
  // back to back, and per token row (first index into them, its position).
  torch::Tensor invariant_key_rows;  // [sum of context_len] int64
  torch::Tensor invariant_row_meta;  // [T, 2] int64
  // Which rows are decode tokens (one new token of their sequence): all of them
  // (invariant_all_decode), or, in a step that mixes them with prefill chunks, the two row sets
  // (int64), each attended with the launch shape that suits it (the bits are the same).
  bool invariant_all_decode = false;
  torch::Tensor invariant_decode_rows;
  torch::Tensor invariant_chunk_rows;

  static PagedLayout Build(const std::vector<PagedItem>& items, int64_t page_size,
                           torch::Device device, bool decode_kernel = false);
};

// True when this build has the CUDA paged decode kernel and it handles the shape on `device`.
bool PagedDecodeKernelAvailable(int64_t head_dim, int64_t heads, int64_t kv_heads,
                                const torch::Device& device);

class PagedAttention final : public model::AttentionBackend {
 public:
  PagedAttention(PagedKvCache* cache, const PagedLayout* layout,
                 model::AttentionImpl impl = model::AttentionImpl::kAuto)
      : cache_(cache), layout_(layout), impl_(impl) {}
  // k/v undefined: the caller already stored them at the layout's write slots (DirectKvWrite).
  torch::Tensor Attend(int layer, const torch::Tensor& q, const torch::Tensor& k,
                       const torch::Tensor& v) override;
  std::optional<torch::Tensor> AttendRawQkv(int layer, const RawQkv& raw) override;
  std::optional<KvWriteTarget> DirectKvWrite(int layer) override;

 private:
  torch::Tensor DecodeKernel(int layer, const torch::Tensor& qd, const RawQkv* raw);
  PagedKvCache* cache_;        // not owned
  const PagedLayout* layout_;  // not owned
  model::AttentionImpl impl_;
};

}  // namespace slime::engine

#endif  // SLIME_ENGINE_PAGED_KV_H_
