// Paged K/V storage and attention (see include/slime/engine/paged_kv.h).
#include "slime/engine/paged_kv.h"

#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "slime/model/batch_invariant.h"

#ifdef SLIME_ENGINE_PAGED_KERNEL
#include <ATen/cuda/CUDAContext.h>

#include "cuda/paged_decode.h"
#endif

namespace slime::engine {

PagedKvCache::PagedKvCache(int64_t num_layers, int64_t num_pages, int64_t page_size,
                           int64_t kv_heads, int64_t head_dim, torch::TensorOptions options)
    : num_layers_(num_layers),
      num_pages_(num_pages),
      page_size_(page_size),
      kv_heads_(kv_heads),
      head_dim_(head_dim),
      options_(options) {
  split_counters_ = torch::zeros({kSplitCounters}, options.dtype(torch::kInt32));
  Resume();
}

int64_t PagedKvCache::BytesPerToken(int64_t num_layers, int64_t kv_heads, int64_t head_dim,
                                    torch::ScalarType dtype) {
  return 2 * num_layers * kv_heads * head_dim * static_cast<int64_t>(c10::elementSize(dtype));
}

void PagedKvCache::Release() {
  k_.clear();
  v_.clear();
}

void PagedKvCache::Resume() {
  if (!k_.empty()) return;
  k_.reserve(num_layers_);
  v_.reserve(num_layers_);
  for (int64_t l = 0; l < num_layers_; ++l) {
    // Zeros, not empty: padded reads of slot 0 must never meet NaN bit patterns.
    k_.push_back(torch::zeros({num_slots(), kv_heads_, head_dim_}, options_));
    v_.push_back(torch::zeros({num_slots(), kv_heads_, head_dim_}, options_));
  }
}

namespace {

void AppendSlots(const std::vector<int32_t>& pages, int64_t page_size, int64_t from, int64_t to,
                 std::vector<int64_t>* out) {
  for (int64_t p = from; p < to; ++p) {
    out->push_back(static_cast<int64_t>(pages[p / page_size]) * page_size + p % page_size);
  }
}

torch::Tensor ToDevice(std::vector<int64_t>& v, torch::Device device) {
  torch::Tensor t = torch::from_blob(v.data(), {static_cast<int64_t>(v.size())}, torch::kLong);
  return device.is_cpu() ? t.clone() : t.to(device, /*non_blocking=*/false);
}

// Turns the layout's prefill items into one padded batch when that wastes at most half the work.
void BuildBatchedPrefill(const std::vector<PagedItem>& items, int64_t page_size,
                         torch::Device device, PagedLayout* layout) {
  struct P {
    int64_t row, n, l;
    const std::vector<int32_t>* pages;
  };
  std::vector<P> ps;
  int64_t row = 0, useful = 0, n_max = 0, l_max = 0;
  for (const PagedItem& item : items) {
    if (item.num_new > 1) {
      ps.push_back({row, item.num_new, item.context_len, item.pages});
      useful += item.num_new * item.context_len;
      n_max = std::max(n_max, item.num_new);
      l_max = std::max(l_max, item.context_len);
    }
    row += item.num_new;
  }
  const int64_t np = static_cast<int64_t>(ps.size());
  const int64_t padded = np * n_max * l_max;
  if (np < 2 || 2 * useful < padded || padded > (int64_t{1} << 26)) return;
  std::vector<int64_t> q_index(np * n_max), slots(np * l_max, 0), out_index, out_rows;
  std::vector<uint8_t> mask(padded, 0);
  for (int64_t p = 0; p < np; ++p) {
    const P& it = ps[p];
    for (int64_t i = 0; i < n_max; ++i) {
      q_index[p * n_max + i] = it.row + std::min(i, it.n - 1);
      uint8_t* m = mask.data() + (p * n_max + i) * l_max;
      if (i < it.n) {
        const int64_t last = it.l - it.n + i;  // query i sees keys 0..last
        std::fill(m, m + last + 1, 1);
        out_index.push_back(p * n_max + i);
        out_rows.push_back(it.row + i);
      } else {
        m[0] = 1;  // padding query: one visible key keeps the softmax finite; discarded
      }
    }
    for (int64_t j = 0; j < it.l; ++j) {
      slots[p * l_max + j] = static_cast<int64_t>((*it.pages)[j / page_size]) * page_size +
                             j % page_size;
    }
  }
  layout->prefill_batched = true;
  layout->prefill_p = np;
  layout->prefill_n_max = n_max;
  layout->prefill_l_max = l_max;
  layout->prefill_q_index = ToDevice(q_index, device);
  layout->prefill_slots = ToDevice(slots, device);
  layout->prefill_out_index = ToDevice(out_index, device);
  layout->prefill_out_rows = ToDevice(out_rows, device);
  torch::Tensor m = torch::from_blob(mask.data(), {np, 1, n_max, l_max}, torch::kUInt8);
  layout->prefill_mask = m.to(device, torch::kBool);
}

}  // namespace

namespace {

// Deterministic mode on CUDA (PagedLayout::invariant_key_rows): positions, write slots, each
// item's context slots back to back, one (first key, last key) pair per new token and, in a
// step that mixes decodes with prefill chunks, the rows of each, in one host buffer and one copy
// to the device.
void BuildInvariantRows(const std::vector<PagedItem>& items, int64_t page_size,
                        torch::Device device, PagedLayout* layout) {
  int64_t tokens = 0, keys = 0, decodes = 0;
  for (const PagedItem& item : items) {
    tokens += item.num_new;
    keys += item.context_len;
    if (item.num_new == 1) ++decodes;
  }
  const bool mixed = decodes > 0 && decodes < tokens;
  // [positions T | write slots T | row meta 2T | key rows K | (mixed) decode rows | chunk rows]
  std::vector<int64_t> host(4 * tokens + keys + (mixed ? tokens : 0));
  if (mixed) {
    int64_t* decode_rows = host.data() + 4 * tokens + keys;
    int64_t* chunk_rows = decode_rows + decodes;
    int64_t row = 0;
    for (const PagedItem& item : items) {
      for (int64_t i = 0; i < item.num_new; ++i, ++row) {
        *(item.num_new == 1 ? decode_rows++ : chunk_rows++) = row;
      }
    }
  }
  int64_t* positions = host.data();
  int64_t* write_slots = positions + tokens;
  int64_t* meta = write_slots + tokens;
  int64_t* key_rows = meta + 2 * tokens;
  int64_t row = 0, first = 0;
  for (const PagedItem& item : items) {
    const int64_t start = item.context_len - item.num_new;
    for (int64_t p = 0; p < item.context_len; ++p) {
      key_rows[first + p] = static_cast<int64_t>((*item.pages)[p / page_size]) * page_size +
                            p % page_size;
    }
    for (int64_t p = start; p < item.context_len; ++p, ++row) {
      positions[row] = p;
      write_slots[row] = key_rows[first + p];
      meta[2 * row] = first;
      meta[2 * row + 1] = p;
    }
    first += item.context_len;
  }
  torch::Tensor all = ToDevice(host, device);
  layout->num_tokens = tokens;
  layout->positions = all.narrow(0, 0, tokens);
  layout->write_slots = all.narrow(0, tokens, tokens);
  layout->invariant_row_meta = all.narrow(0, 2 * tokens, 2 * tokens).view({tokens, 2});
  layout->invariant_key_rows = all.narrow(0, 4 * tokens, keys);
  layout->invariant_all_decode = decodes == tokens;
  if (mixed) {
    layout->invariant_decode_rows = all.narrow(0, 4 * tokens + keys, decodes);
    layout->invariant_chunk_rows = all.narrow(0, 4 * tokens + keys + decodes, tokens - decodes);
  }
}

}  // namespace

bool PagedDecodeKernelAvailable(int64_t head_dim, int64_t heads, int64_t kv_heads,
                                const torch::Device& device) {
#ifdef SLIME_ENGINE_PAGED_KERNEL
  return device.is_cuda() && cuda::PagedDecodeSupported(static_cast<int>(head_dim),
                                                        static_cast<int>(heads),
                                                        static_cast<int>(kv_heads));
#else
  return false;
#endif
}

PagedLayout PagedLayout::Build(const std::vector<PagedItem>& items, int64_t page_size,
                               torch::Device device, bool decode_kernel) {
  PagedLayout layout;
  // Deterministic mode (model/batch_invariant.h): every item, decode or prefill, attends on its
  // own through the batch-invariant kernel; no padded batches, no decode kernel.
  const bool per_item = model::BatchInvariant() && model::InvariantKernelsServe(device);
  layout.decode_kernel = decode_kernel && !per_item;
  if (!per_item) BuildBatchedPrefill(items, page_size, device, &layout);
  if (per_item && device.is_cuda()) {
    BuildInvariantRows(items, page_size, device, &layout);
    return layout;
  }
  std::vector<int64_t> positions, write_slots, decode_rows, decode_ctx;
  int64_t row = 0;
  int64_t max_ctx = 0;
  std::vector<const PagedItem*> decodes;
  for (const PagedItem& item : items) {
    const int64_t start = item.context_len - item.num_new;
    for (int64_t p = start; p < item.context_len; ++p) positions.push_back(p);
    AppendSlots(*item.pages, page_size, start, item.context_len, &write_slots);
    if (item.num_new == 1 && !per_item) {
      decode_rows.push_back(row);
      decode_ctx.push_back(item.context_len);
      decodes.push_back(&item);
      max_ctx = std::max(max_ctx, item.context_len);
    } else if (item.num_new >= 1 && !layout.prefill_batched) {
      std::vector<int64_t> slots;
      slots.reserve(item.context_len);
      AppendSlots(*item.pages, page_size, 0, item.context_len, &slots);
      layout.prefills.push_back({row, item.num_new, ToDevice(slots, device)});
    }
    row += item.num_new;
  }
  layout.num_tokens = row;
  layout.positions = ToDevice(positions, device);
  layout.write_slots = ToDevice(write_slots, device);
  if (!decodes.empty() && layout.decode_kernel) {
    const int64_t bd = static_cast<int64_t>(decodes.size());
    int64_t max_pages = 0;
    for (const PagedItem* item : decodes) {
      max_pages = std::max(max_pages, (item->context_len + page_size - 1) / page_size);
    }
    std::vector<int32_t> table(bd * max_pages + bd, 0);  // page table, then lengths
    for (int64_t b = 0; b < bd; ++b) {
      const PagedItem& item = *decodes[b];
      const int64_t n = (item.context_len + page_size - 1) / page_size;
      std::copy(item.pages->begin(), item.pages->begin() + n, table.begin() + b * max_pages);
      table[bd * max_pages + b] = static_cast<int32_t>(item.context_len);
    }
    torch::Tensor both =
        torch::from_blob(table.data(), {static_cast<int64_t>(table.size())}, torch::kInt)
            .to(device);
    layout.decode_page_table = both.narrow(0, 0, bd * max_pages).view({bd, max_pages});
    layout.decode_seq_lens = both.narrow(0, bd * max_pages, bd);
    layout.decode_rows_are_prefix = decode_rows.back() == bd - 1;
    layout.decode_rows = ToDevice(decode_rows, device);
  } else if (!decodes.empty()) {
    const int64_t bd = static_cast<int64_t>(decodes.size());
    std::vector<int64_t> table(bd * max_ctx, 0);
    for (int64_t b = 0; b < bd; ++b) {
      const PagedItem& item = *decodes[b];
      int64_t* out = table.data() + b * max_ctx;
      for (int64_t p = 0; p < item.context_len; ++p) {
        out[p] = static_cast<int64_t>((*item.pages)[p / page_size]) * page_size + p % page_size;
      }
    }
    layout.decode_slots = ToDevice(table, device).view({bd, max_ctx});
    torch::Tensor ctx = ToDevice(decode_ctx, device);
    layout.decode_mask =
        (torch::arange(max_ctx, torch::TensorOptions().dtype(torch::kLong).device(device))
             .unsqueeze(0) < ctx.unsqueeze(1))
            .view({bd, 1, 1, max_ctx});
    layout.decode_rows_are_prefix = decode_rows.back() == bd - 1;
    layout.decode_rows = ToDevice(decode_rows, device);
  }
  return layout;
}

namespace {

// Masked attention with grouped queries: qg [B, Hkv, M, D] (the g query heads of one KV head
// and their positions share the M dim), kt/vt [B, Hkv, L, D], mask [B, 1, M, L] (true =
// visible) -> [B, Hkv, M, D]. K/V are never repeated per query head.
torch::Tensor GroupedAttention(const torch::Tensor& qg, const torch::Tensor& kt,
                               const torch::Tensor& vt, const torch::Tensor& mask,
                               model::AttentionImpl impl) {
#if TORCH_VERSION_MAJOR >= 2
  if (impl != model::AttentionImpl::kMath) {
    return at::scaled_dot_product_attention(qg, kt, vt, mask, 0.0, false);
  }
#endif
  const double scale = 1.0 / std::sqrt(static_cast<double>(qg.size(3)));
  torch::Tensor scores = torch::matmul(qg, kt.transpose(-2, -1)) * scale;  // [B, Hkv, M, L]
  scores = scores.masked_fill(mask.logical_not(), -std::numeric_limits<double>::infinity());
  torch::Tensor probs = torch::softmax(scores, -1, torch::kFloat32).to(qg.scalar_type());
  return torch::matmul(probs, vt);
}

// Single-query attention of a batch of sequences over padded contexts.
//   q [B, H, D], k/v [B, L, Hkv, D], mask [B, 1, 1, L] -> [B, H, D]
torch::Tensor DecodeAttention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const torch::Tensor& mask,
                              model::AttentionImpl impl) {
  const int64_t b = q.size(0), h = q.size(1), d = q.size(2);
  const int64_t hkv = k.size(2);
  torch::Tensor qg = q.view({b, hkv, h / hkv, d});  // [B, Hkv, g, D]
  return GroupedAttention(qg, k.transpose(1, 2), v.transpose(1, 2), mask, impl)
      .reshape({b, h, d});
}

// Padded prefill batch: q [P * n, H, D] (padded queries), k/v [P, L, Hkv, D],
// mask [P, 1, n, L] -> [P * n, H, D].
torch::Tensor PrefillBatchAttention(const torch::Tensor& q, const torch::Tensor& k,
                                    const torch::Tensor& v, const torch::Tensor& mask,
                                    int64_t p, int64_t n, model::AttentionImpl impl) {
  const int64_t h = q.size(1), d = q.size(2), hkv = k.size(2), g = h / hkv;
  // [P, n, Hkv, g, D] -> [P, Hkv, g, n, D] -> [P, Hkv, g * n, D]
  torch::Tensor qg = q.view({p, n, hkv, g, d}).permute({0, 2, 3, 1, 4}).reshape({p, hkv, g * n, d});
  torch::Tensor mg = g == 1 ? mask : mask.repeat({1, 1, g, 1});  // [P, 1, g * n, L]
  torch::Tensor o = GroupedAttention(qg, k.transpose(1, 2), v.transpose(1, 2), mg, impl);
  // [P, Hkv, g * n, D] -> [P, Hkv, g, n, D] -> [P, n, Hkv, g, D] -> [P * n, H, D]
  return o.view({p, hkv, g, n, d}).permute({0, 3, 1, 2, 4}).reshape({p * n, h, d});
}

}  // namespace

std::optional<model::AttentionBackend::KvWriteTarget> PagedAttention::DirectKvWrite(int layer) {
  const torch::Tensor& slots = layout_->write_slots;
  if (!slots.defined() || slots.scalar_type() != torch::kLong || !slots.is_contiguous()) {
    return std::nullopt;
  }
  return KvWriteTarget{cache_->keys(layer), cache_->values(layer), slots};
}

#ifdef SLIME_ENGINE_PAGED_KERNEL
// The paged decode kernel over the decode rows `qd` ([Bd, heads, D] with packed heads, any row
// stride; with `raw`, the raw q|k|v rows [Bd, (heads + 2 kv_heads) D]). Returns [Bd, heads, D].
torch::Tensor PagedAttention::DecodeKernel(int layer, const torch::Tensor& qd, const RawQkv* raw) {
  const PagedLayout& lay = *layout_;
  torch::Tensor& kp = cache_->keys(layer);
  torch::Tensor& vp = cache_->values(layer);
  const int64_t head_dim = kp.size(2);
  const int64_t heads = raw != nullptr ? raw->heads : qd.size(1);
  torch::Tensor od = torch::empty({qd.size(0), heads, head_dim}, qd.options());
  cuda::PagedDecodeArgs a;
  a.q = qd.data_ptr();
  a.q_row_stride = qd.stride(0);
  a.k_cache = kp.data_ptr();
  a.v_cache = vp.data_ptr();
  a.out = od.data_ptr();
  a.page_table = lay.decode_page_table.data_ptr<int32_t>();
  a.seq_lens = lay.decode_seq_lens.data_ptr<int32_t>();
  a.batch = static_cast<int>(qd.size(0));
  a.num_heads = static_cast<int>(heads);
  a.num_kv_heads = static_cast<int>(kp.size(1));
  a.head_dim = static_cast<int>(head_dim);
  a.page_size = static_cast<int>(cache_->page_size());
  a.max_pages = static_cast<int>(lay.decode_page_table.size(1));
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  a.num_splits = cuda::PagedDecodeSplits(a.batch, a.num_kv_heads);
  torch::Tensor partials;
  if (a.num_splits > 1) {
    partials = torch::empty({cuda::PagedDecodePartialFloats(a.batch, a.num_heads, a.head_dim,
                                                            a.num_splits)},
                            qd.options().dtype(torch::kFloat32));
    a.partials = partials.data_ptr<float>();
    torch::Tensor& counters = cache_->split_counters();
    if (counters.is_cuda() &&
        static_cast<int64_t>(a.batch) * a.num_kv_heads <= counters.numel()) {
      a.split_counters = counters.data_ptr<int32_t>();
    }
  }
  a.dtype = qd.scalar_type() == torch::kBFloat16 ? cuda::DType::kBFloat16
            : qd.scalar_type() == torch::kHalf   ? cuda::DType::kFloat16
                                                 : cuda::DType::kFloat32;
  if (raw != nullptr) {
    a.raw_qkv = true;
    a.q_norm = raw->q_norm.defined() ? raw->q_norm.data_ptr() : nullptr;
    a.k_norm = raw->k_norm.defined() ? raw->k_norm.data_ptr() : nullptr;
    a.norm_eps = static_cast<float>(raw->eps);
    a.cos = raw->cos.data_ptr();
    a.sin = raw->sin.data_ptr();
    a.write_slots = layout_->write_slots.data_ptr<int64_t>();
  }
  const int err = cuda::LaunchPagedDecode(a, at::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == 0, "paged decode kernel failed with CUDA error ", err);
  return od;
}

std::optional<torch::Tensor> PagedAttention::AttendRawQkv(int layer, const RawQkv& raw) {
  const PagedLayout& lay = *layout_;
  const torch::Tensor& qkv = raw.qkv;
  const torch::Tensor& kp = cache_->keys(layer);
  const int64_t d = kp.size(2);
  const bool only_decodes = lay.prefills.empty() && !lay.prefill_batched &&
                            lay.decode_rows.defined() && lay.decode_rows_are_prefix &&
                            lay.decode_rows.size(0) == lay.num_tokens;
  auto packed = [&](const torch::Tensor& t, int64_t rows) {
    return t.defined() && t.is_cuda() && t.is_contiguous() && t.scalar_type() == kp.scalar_type() &&
           t.numel() == rows * d;  // [rows, D] or [rows, 1, D]
  };
  auto norm_ok = [&](const torch::Tensor& w) {
    return !w.defined() || (w.is_contiguous() && w.scalar_type() == kp.scalar_type() &&
                            w.numel() == d);
  };
  const torch::Tensor& slots = lay.write_slots;
  if (!cuda::PagedDecodeRawQkvEnabled(lay.num_tokens) || !lay.decode_kernel || !only_decodes ||
      !qkv.is_cuda() || qkv.dim() != 2 || qkv.stride(1) != 1 ||
      qkv.scalar_type() != kp.scalar_type() || raw.kv_heads != kp.size(1) ||
      qkv.size(1) < (raw.heads + 2 * raw.kv_heads) * d ||
      !cuda::PagedDecodeSupported(static_cast<int>(d), static_cast<int>(raw.heads),
                                  static_cast<int>(raw.kv_heads)) ||
      !packed(raw.cos, qkv.size(0)) || !packed(raw.sin, qkv.size(0)) || !norm_ok(raw.q_norm) ||
      !norm_ok(raw.k_norm) || !slots.defined() || slots.scalar_type() != torch::kLong ||
      !slots.is_contiguous() || slots.size(0) != qkv.size(0)) {
    return std::nullopt;
  }
  return DecodeKernel(layer, qkv, &raw);
}
#else
std::optional<torch::Tensor> PagedAttention::AttendRawQkv(int /*layer*/, const RawQkv& /*raw*/) {
  return std::nullopt;
}
#endif

torch::Tensor PagedAttention::Attend(int layer, const torch::Tensor& q, const torch::Tensor& k,
                                     const torch::Tensor& v) {
  torch::Tensor& kp = cache_->keys(layer);
  torch::Tensor& vp = cache_->values(layer);
  if (k.defined()) {
    kp.index_copy_(0, layout_->write_slots, k);
    vp.index_copy_(0, layout_->write_slots, v);
  }

  const PagedLayout& lay = *layout_;
  if (lay.invariant_row_meta.defined()) {
    if (!lay.invariant_decode_rows.defined()) {
      return model::InvariantPagedAttention(q, kp, vp, lay.invariant_key_rows,
                                            lay.invariant_row_meta, lay.invariant_all_decode);
    }
    // Decodes and prefill chunks apart, each in the launch shape that suits it.
    torch::Tensor out = torch::empty(q.sizes(), q.options());
    for (const bool decodes : {true, false}) {
      const torch::Tensor& rows = decodes ? lay.invariant_decode_rows : lay.invariant_chunk_rows;
      out.index_copy_(
          0, rows,
          model::InvariantPagedAttention(q.index_select(0, rows), kp, vp, lay.invariant_key_rows,
                                         lay.invariant_row_meta.index_select(0, rows), decodes));
    }
    return out;
  }
  if (lay.decode_kernel && model::BatchInvariant() && lay.decode_rows_are_prefix &&
      lay.decode_page_table.defined() && lay.num_tokens == lay.decode_page_table.size(0)) {
    // Deterministic mode inside a decode CUDA graph (ModelRunner::CaptureDecodeGraphs).
    return model::InvariantPagedDecodeAttention(q, kp, vp, lay.decode_page_table,
                                                lay.decode_seq_lens, cache_->page_size());
  }
  const bool only_decodes = lay.prefills.empty() && !lay.prefill_batched &&
                            lay.decode_rows.defined() &&
                            lay.decode_rows_are_prefix &&
                            lay.decode_rows.size(0) == lay.num_tokens;
  torch::Tensor out;
#ifdef SLIME_ENGINE_PAGED_KERNEL
  if (lay.decode_rows.defined() && lay.decode_kernel) {
    // The kernel takes q rows with any stride (the fused projection's q|k|v rows) as long as
    // each row's heads are packed.
    torch::Tensor qd = only_decodes ? q : q.index_select(0, lay.decode_rows);
    if (qd.stride(2) != 1 || qd.stride(1) != qd.size(2)) qd = qd.contiguous();
    torch::Tensor od = DecodeKernel(layer, qd, nullptr);
    if (only_decodes) return od;
    out = torch::empty_like(q);
    out.index_copy_(0, lay.decode_rows, od);
  } else
#endif
  if (lay.decode_rows.defined()) {
    const int64_t bd = lay.decode_slots.size(0), lmax = lay.decode_slots.size(1);
    torch::Tensor flat = lay.decode_slots.view({-1});
    torch::Tensor kg = kp.index_select(0, flat).view({bd, lmax, kp.size(1), kp.size(2)});
    torch::Tensor vg = vp.index_select(0, flat).view({bd, lmax, vp.size(1), vp.size(2)});
    torch::Tensor qd = only_decodes ? q : q.index_select(0, lay.decode_rows);
    torch::Tensor od = DecodeAttention(qd, kg, vg, lay.decode_mask, impl_);
    if (only_decodes) return od;
    out = torch::empty_like(q);
    out.index_copy_(0, lay.decode_rows, od);
  }
  if (!out.defined()) out = torch::empty_like(q);
  if (lay.prefill_batched) {
    const int64_t p = lay.prefill_p, n = lay.prefill_n_max, l = lay.prefill_l_max;
    torch::Tensor qb = q.index_select(0, lay.prefill_q_index);  // [P * n, H, D]
    torch::Tensor kb = kp.index_select(0, lay.prefill_slots).view({p, l, kp.size(1), kp.size(2)});
    torch::Tensor vb = vp.index_select(0, lay.prefill_slots).view({p, l, vp.size(1), vp.size(2)});
    torch::Tensor ob = PrefillBatchAttention(qb, kb, vb, lay.prefill_mask, p, n, impl_);
    out.index_copy_(0, lay.prefill_out_rows, ob.index_select(0, lay.prefill_out_index));
    return out;
  }
  for (const PagedLayout::Prefill& p : lay.prefills) {
    torch::Tensor kc = kp.index_select(0, p.slots);  // [L, Hkv, D]
    torch::Tensor vc = vp.index_select(0, p.slots);
    out.narrow(0, p.row, p.num_new)
        .copy_(model::CausalAttention(q.narrow(0, p.row, p.num_new), kc, vc, impl_));
  }
  return out;
}

}  // namespace slime::engine
