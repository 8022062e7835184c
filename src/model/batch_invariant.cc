// Batch-invariant kernels (batch_invariant.h). On CPU: plain loops with one fixed reduction
// order per output element, parallel over output elements only (at::parallel_for), never within
// a sum. On CUDA: the kernels of cuda/invariant_ops.h.
#include "slime/model/batch_invariant.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#ifdef SLIME_MODEL_FUSED_KERNELS
#include "cuda/invariant_ops.h"
#include "fused_inference.h"  // KernelDType, CurrentStream
#endif

namespace slime::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::atomic<bool>& Switch() {
  static std::atomic<bool> on{false};
  return on;
}

void CheckDevice(const torch::Tensor& t, const char* what) {
  TORCH_CHECK(InvariantKernelsServe(t.device()), "batch-invariant ", what,
              ": no kernels for ", t.device().str(), " tensors in this build");
}

#ifdef SLIME_MODEL_FUSED_KERNELS
void CheckCuda(int err, const char* what, const std::string& detail = "") {
  TORCH_CHECK(err == 0, "batch-invariant ", what, " on CUDA failed (error ", err,
              detail.empty() ? "" : ": ", detail, ")");
}

// The attention kernel over q [rows, H, D] (each row's heads packed) and k/v rows of Hkv heads:
// row r sees keys row_meta[r] = (first, last) as cuda/invariant_ops.h says, through key_rows
// when defined.
// With a page table (and seq_lens) instead: the paged form of cuda/invariant_ops.h.
torch::Tensor CudaAttentionRows(const torch::Tensor& q, const torch::Tensor& k,
                                const torch::Tensor& v, const torch::Tensor& key_rows,
                                const torch::Tensor& row_meta,
                                const torch::Tensor& page_table = torch::Tensor(),
                                const torch::Tensor& seq_lens = torch::Tensor(),
                                int64_t page_size = 0, bool rows_are_sequences = false) {
  const torch::Tensor qc = q.stride(2) == 1 && q.stride(1) == q.size(2) ? q : q.contiguous();
  torch::Tensor out = torch::empty(q.sizes(), q.options());
  cuda::InvariantAttentionArgs a;
  a.q = qc.data_ptr();
  a.q_row_stride = qc.stride(0);
  a.k = k.data_ptr();
  a.v = v.data_ptr();
  a.kv_row_stride = k.stride(0);
  a.key_rows = key_rows.defined() ? key_rows.data_ptr<int64_t>() : nullptr;
  if (page_table.defined()) {
    a.page_table = page_table.data_ptr<int32_t>();
    a.seq_lens = seq_lens.data_ptr<int32_t>();
    a.max_pages = page_table.size(1);
    a.page_size = static_cast<int>(page_size);
  } else {
    a.row_meta = row_meta.data_ptr<int64_t>();
  }
  a.rows_are_sequences = rows_are_sequences;
  a.out = out.data_ptr();
  a.rows = q.size(0);
  a.heads = static_cast<int>(q.size(1));
  a.kv_heads = static_cast<int>(k.size(1));
  a.head_dim = static_cast<int>(q.size(2));
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(q.size(2))));
  a.dtype = internal::KernelDType(qc);
  CheckCuda(cuda::LaunchInvariantAttention(a, internal::CurrentStream()), "attention");
  return out;
}

// q [n, H, D] and k/v [L, Hkv, D] on CUDA -> [n, H, D]: row i sees keys 0..L - n + i.
torch::Tensor CudaAttentionForward(const torch::Tensor& q, const torch::Tensor& k,
                                   const torch::Tensor& v) {
  const int64_t n = q.size(0), l = k.size(0);
  const auto long_opts = torch::TensorOptions().dtype(torch::kLong).device(q.device());
  const torch::Tensor meta =
      torch::stack({torch::zeros({n}, long_opts), torch::arange(l - n, l, long_opts)}, 1)
          .contiguous();
  return CudaAttentionRows(q, k.contiguous(), v.contiguous(), torch::Tensor(), meta);
}

// Per row of z [rows, V] float32 on CUDA: Σ z² (sum_sq) or the softmax statistics.
void CudaRowStats(const torch::Tensor& z, torch::Tensor* sum_sq, SoftmaxStats* stats) {
  cuda::InvariantRowStatsArgs a;
  a.z = z.data_ptr<float>();
  a.rows = z.size(0);
  a.v = z.size(1);
  if (sum_sq != nullptr) {
    a.sum_sq = sum_sq->data_ptr<float>();
  } else {
    a.max = stats->max.data_ptr<float>();
    a.log_sum = stats->log_sum.data_ptr<float>();
    if (stats->mean_shifted.defined()) a.mean_shifted = stats->mean_shifted.data_ptr<float>();
  }
  CheckCuda(cuda::LaunchInvariantRowStats(a, internal::CurrentStream()), "row statistics");
}
#endif

template <typename T>
using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;

// y [M, N] = x [M, K] · w [N, K]ᵀ (+ b), all contiguous. Micro-tiles of 4 rows × 8 outputs over
// a packed panel wt [K, 8] of the weight; every y[r, n] is one chain of K multiply-adds in
// ascending k, whichever tile and thread computes it.
template <typename T>
void LinearKernel(const T* x, const T* w, const T* b, T* y, int64_t m, int64_t k, int64_t n) {
  using A = Acc<T>;
  constexpr int64_t kCols = 8, kRows = 4;
  const int64_t panels = (n + kCols - 1) / kCols;
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    std::vector<A> wt(static_cast<size_t>(k * kCols));
    for (int64_t p = begin; p < end; ++p) {
      const int64_t n0 = p * kCols;
      const int64_t cols = std::min(kCols, n - n0);
      for (int64_t kk = 0; kk < k; ++kk) {
        for (int64_t j = 0; j < kCols; ++j) {
          wt[kk * kCols + j] = j < cols ? static_cast<A>(w[(n0 + j) * k + kk]) : A(0);
        }
      }
      for (int64_t r0 = 0; r0 < m; r0 += kRows) {
        const int64_t rows = std::min(kRows, m - r0);
        A acc[kRows][kCols] = {};
        const T* xr[kRows];
        for (int64_t i = 0; i < kRows; ++i) xr[i] = x + (r0 + std::min(i, rows - 1)) * k;
        for (int64_t kk = 0; kk < k; ++kk) {
          const A* wk = wt.data() + kk * kCols;
          for (int64_t i = 0; i < kRows; ++i) {
            const A xv = static_cast<A>(xr[i][kk]);
            for (int64_t j = 0; j < kCols; ++j) acc[i][j] += xv * wk[j];
          }
        }
        for (int64_t i = 0; i < rows; ++i) {
          for (int64_t j = 0; j < cols; ++j) {
            A v = acc[i][j];
            if (b != nullptr) v += static_cast<A>(b[n0 + j]);
            y[(r0 + i) * n + n0 + j] = static_cast<T>(v);
          }
        }
      }
    }
  });
}

torch::Tensor LinearForward(const torch::Tensor& x2, const torch::Tensor& weight,
                            const torch::Tensor& bias) {
  const torch::Tensor xc = x2.contiguous(), wc = weight.contiguous();
  const torch::Tensor bc = bias.defined() ? bias.contiguous() : torch::Tensor();
  const int64_t m = xc.size(0), k = xc.size(1), n = wc.size(0);
  torch::Tensor y = torch::empty({m, n}, xc.options());
#ifdef SLIME_MODEL_FUSED_KERNELS
  if (xc.is_cuda()) {
    cuda::InvariantGemmArgs a;
    a.x = xc.data_ptr();
    a.ldx = k;
    a.w = wc.data_ptr();
    a.y = y.data_ptr();
    a.m = m;
    a.n = n;
    a.k = k;
    a.dtype = internal::KernelDType(xc);
    a.device = xc.device().index();
    std::string error;
    CheckCuda(cuda::LaunchInvariantGemm(a, internal::CurrentStream(), &error), "linear", error);
    return bc.defined() ? y + bc : y;
  }
#endif
  AT_DISPATCH_FLOATING_TYPES_AND(at::ScalarType::BFloat16, xc.scalar_type(), "invariant_linear",
                                 [&] {
                                   LinearKernel<scalar_t>(
                                       xc.data_ptr<scalar_t>(), wc.data_ptr<scalar_t>(),
                                       bc.defined() ? bc.data_ptr<scalar_t>() : nullptr,
                                       y.data_ptr<scalar_t>(), m, k, n);
                                 });
  return y;
}

// Without a bias: LibTorch 1.13's custom functions cannot take an undefined tensor argument.
class LinearFunction : public torch::autograd::Function<LinearFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight) {
    ctx->save_for_backward({x, weight});
    return LinearForward(x, weight, torch::Tensor());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const torch::Tensor& weight = saved[1];
    const torch::Tensor& g = grads[0];
    variable_list out(2);
    if (ctx->needs_input_grad(0)) out[0] = g.mm(weight);
    if (ctx->needs_input_grad(1)) out[1] = g.t().mm(x);
    return out;
  }
};

class BiasedLinearFunction : public torch::autograd::Function<BiasedLinearFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& bias) {
    ctx->save_for_backward({x, weight});
    return LinearForward(x, weight, bias);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list out = LinearFunction::backward(ctx, grads);
    out.push_back(ctx->needs_input_grad(2) ? grads[0].sum(0) : torch::Tensor());
    return out;
  }
};

// out [n, H, D] for q [n, H, D], k/v [L, Hkv, D] (any strides; read through accessors).
template <typename T>
void AttentionKernel(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                     torch::Tensor& out) {
  using A = Acc<T>;
  const int64_t n = q.size(0), heads = q.size(1), d = q.size(2);
  const int64_t l = k.size(0), group = heads / k.size(1);
  const A scale = static_cast<A>(1.0 / std::sqrt(static_cast<double>(d)));
  const auto qa = q.accessor<T, 3>();
  const auto ka = k.accessor<T, 3>();
  const auto va = v.accessor<T, 3>();
  auto oa = out.accessor<T, 3>();
  at::parallel_for(0, n * heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<A> s(static_cast<size_t>(l)), qv(static_cast<size_t>(d)),
        acc(static_cast<size_t>(d));
    for (int64_t item = begin; item < end; ++item) {
      const int64_t i = item / heads, h = item % heads, g = h / group;
      const int64_t last = l - n + i;  // the query's own position: keys 0..last
      for (int64_t c = 0; c < d; ++c) qv[c] = static_cast<A>(qa[i][h][c]);
      A m = -std::numeric_limits<A>::infinity();
      for (int64_t j = 0; j <= last; ++j) {
        A dot = 0;
        for (int64_t c = 0; c < d; ++c) dot += qv[c] * static_cast<A>(ka[j][g][c]);
        s[j] = dot * scale;
        m = std::max(m, s[j]);
      }
      A sum = 0;
      std::fill(acc.begin(), acc.end(), A(0));
      for (int64_t j = 0; j <= last; ++j) {
        const A p = std::exp(s[j] - m);
        sum += p;
        for (int64_t c = 0; c < d; ++c) acc[c] += p * static_cast<A>(va[j][g][c]);
      }
      for (int64_t c = 0; c < d; ++c) oa[i][h][c] = static_cast<T>(acc[c] / sum);
    }
  });
}

torch::Tensor AttentionForward(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v) {
#ifdef SLIME_MODEL_FUSED_KERNELS
  if (q.is_cuda()) return CudaAttentionForward(q, k, v);
#endif
  torch::Tensor out = torch::empty(q.sizes(), q.options());
  AT_DISPATCH_FLOATING_TYPES_AND(at::ScalarType::BFloat16, q.scalar_type(),
                                 "invariant_attention",
                                 [&] { AttentionKernel<scalar_t>(q, k, v, out); });
  return out;
}

// The same function in LibTorch ops (float32 softmax, as the math path), for the backward.
torch::Tensor AttentionReference(const torch::Tensor& q, const torch::Tensor& k,
                                 const torch::Tensor& v) {
  const int64_t n = q.size(0), l = k.size(0), group = q.size(1) / k.size(1);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(2)));
  const torch::Tensor kr = k.repeat_interleave(group, 1).transpose(0, 1);  // [H, L, D]
  const torch::Tensor vr = v.repeat_interleave(group, 1).transpose(0, 1);
  const torch::Tensor qh = q.transpose(0, 1);                                // [H, n, D]
#if TORCH_VERSION_MAJOR >= 2
  if (q.is_cuda() && n == l) {
    // LibTorch's fused attention: its backward needs no [H, L, L] scores in memory.
    return at::scaled_dot_product_attention(qh.unsqueeze(0), kr.unsqueeze(0), vr.unsqueeze(0),
                                            {}, 0.0, /*is_causal=*/true)
        .squeeze(0)
        .transpose(0, 1);
  }
#endif
  torch::Tensor scores = torch::matmul(qh, kr.transpose(1, 2)) * scale;     // [H, n, L]
  const torch::Tensor rows = torch::arange(n, torch::kLong).unsqueeze(1) + (l - n);
  const torch::Tensor cols = torch::arange(l, torch::kLong).unsqueeze(0);
  scores = scores.masked_fill((cols > rows).to(q.device()),
                              -std::numeric_limits<double>::infinity());
  const torch::Tensor probs = torch::softmax(scores, -1, torch::kFloat32).to(q.scalar_type());
  return torch::matmul(probs, vr).transpose(0, 1);  // [n, H, D]
}

class AttentionFunction : public torch::autograd::Function<AttentionFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& q,
                               const torch::Tensor& k, const torch::Tensor& v) {
    ctx->save_for_backward({q, k, v});
    return AttentionForward(q, k, v);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    torch::Tensor q = saved[0].detach().requires_grad_(true);
    torch::Tensor k = saved[1].detach().requires_grad_(true);
    torch::Tensor v = saved[2].detach().requires_grad_(true);
    torch::Tensor out;
    {
      torch::AutoGradMode enable(true);
      out = AttentionReference(q, k, v);
    }
    const variable_list g = torch::autograd::grad({out}, {q, k, v}, {grads[0]});
    return {g[0], g[1], g[2]};
  }
};

template <typename T>
void StatsKernel(const T* z, int64_t rows, int64_t cols, bool with_entropy, T* max_out,
                 T* log_sum_out, T* mean_out) {
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* row = z + r * cols;
      T m = -std::numeric_limits<T>::infinity();
      for (int64_t c = 0; c < cols; ++c) m = std::max(m, row[c]);
      T sum = 0, sum_ez = 0;
      for (int64_t c = 0; c < cols; ++c) {
        const T shifted = row[c] - m;
        const T e = std::exp(shifted);
        sum += e;
        if (with_entropy) sum_ez += e * shifted;
      }
      max_out[r] = m;
      log_sum_out[r] = std::log(sum);
      if (with_entropy) mean_out[r] = sum_ez / sum;
    }
  });
}

// Σ_d x_d² / D per row of x [rows, D] float32: on CPU as x² · 1ᵀ through the linear kernel, on
// CUDA by the row-statistics kernel.
torch::Tensor MeanSquareForward(const torch::Tensor& x2) {
#ifdef SLIME_MODEL_FUSED_KERNELS
  if (x2.is_cuda()) {
    const torch::Tensor xc = x2.contiguous();
    torch::Tensor sum_sq = torch::empty({xc.size(0)}, xc.options());
    CudaRowStats(xc, &sum_sq, nullptr);
    return (sum_sq / static_cast<double>(xc.size(1))).unsqueeze(1);
  }
#endif
  const torch::Tensor ones = torch::ones({1, x2.size(1)}, x2.options());
  return LinearForward(x2.pow(2), ones, torch::Tensor()) / static_cast<double>(x2.size(1));
}

class MeanSquareFunction : public torch::autograd::Function<MeanSquareFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x2) {
    ctx->save_for_backward({x2});
    return MeanSquareForward(x2);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const torch::Tensor x2 = ctx->get_saved_variables()[0];
    return {grads[0] * x2 * (2.0 / static_cast<double>(x2.size(1)))};
  }
};

}  // namespace

bool InvariantKernelsServe(const torch::Device& device) {
#ifdef SLIME_MODEL_FUSED_KERNELS
  if (device.is_cuda()) return true;
#endif
  return device.is_cpu();
}

torch::Tensor InvariantMeanSquare(const torch::Tensor& x) {
  CheckDevice(x, "mean of squares");
  TORCH_CHECK(x.dim() >= 1 && x.scalar_type() == torch::kFloat32,
              "batch-invariant mean of squares: expected float32 [..., D], got ",
              c10::toString(x.scalar_type()), " ", x.sizes());
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  out_shape.back() = 1;
  return MeanSquareFunction::apply(x.reshape({-1, x.size(-1)})).reshape(out_shape);
}

void SetBatchInvariant(bool on) { Switch().store(on); }
bool BatchInvariant() { return Switch().load(); }

torch::Tensor Linear(const torch::Tensor& x, const torch::Tensor& weight,
                     const torch::Tensor& bias) {
  if (BatchInvariant() && InvariantKernelsServe(x.device())) {
    return InvariantLinear(x, weight, bias);
  }
  return torch::linear(x, weight, bias);
}

torch::Tensor InvariantLinear(const torch::Tensor& x, const torch::Tensor& weight,
                              const torch::Tensor& bias) {
  CheckDevice(x, "linear");
  TORCH_CHECK(x.dim() >= 1 && weight.dim() == 2 && x.size(-1) == weight.size(1),
              "batch-invariant linear: x [..., ", weight.dim() == 2 ? weight.size(1) : -1,
              "] expected for a weight of shape ", weight.sizes());
  TORCH_CHECK(x.scalar_type() == weight.scalar_type() &&
                  (!bias.defined() || bias.scalar_type() == x.scalar_type()),
              "batch-invariant linear: x, weight and bias must share a dtype");
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  out_shape.back() = weight.size(0);
  const torch::Tensor x2 = x.reshape({-1, x.size(-1)});
  torch::Tensor y = bias.defined() ? BiasedLinearFunction::apply(x2, weight, bias)
                                   : LinearFunction::apply(x2, weight);
  return y.reshape(out_shape);
}

torch::Tensor InvariantCausalAttention(const torch::Tensor& q, const torch::Tensor& k,
                                       const torch::Tensor& v) {
  CheckDevice(q, "attention");
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3 && k.sizes() == v.sizes() &&
                  q.size(2) == k.size(2) && k.size(1) > 0 && q.size(1) % k.size(1) == 0 &&
                  k.size(0) >= q.size(0),
              "batch-invariant attention: expected q [n, heads, D] and k/v [L >= n, kv_heads, D] "
              "with heads a multiple of kv_heads; got q ",
              q.sizes(), ", k ", k.sizes(), ", v ", v.sizes());
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && k.scalar_type() == v.scalar_type(),
              "batch-invariant attention: q, k and v must share a dtype");
  return AttentionFunction::apply(q, k, v);
}

torch::Tensor InvariantPagedAttention(const torch::Tensor& q, const torch::Tensor& k_cache,
                                      const torch::Tensor& v_cache, const torch::Tensor& key_rows,
                                      const torch::Tensor& row_meta, bool rows_are_sequences) {
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 3 && k_cache.sizes() == v_cache.sizes() &&
                  k_cache.strides() == v_cache.strides() && k_cache.stride(2) == 1 &&
                  k_cache.stride(1) == k_cache.size(2) && q.size(2) == k_cache.size(2) &&
                  q.size(1) % k_cache.size(1) == 0,
              "batch-invariant paged attention: expected q [T, heads, D] and k/v caches "
              "[slots, kv_heads, D] with packed rows; got q ",
              q.sizes(), ", k ", k_cache.sizes(), ", v ", v_cache.sizes());
  TORCH_CHECK(q.scalar_type() == k_cache.scalar_type() &&
                  k_cache.scalar_type() == v_cache.scalar_type(),
              "batch-invariant paged attention: q and the caches must share a dtype");
  TORCH_CHECK(key_rows.dim() == 1 && key_rows.scalar_type() == torch::kLong &&
                  key_rows.is_contiguous() && row_meta.dim() == 2 && row_meta.size(1) == 2 &&
                  row_meta.size(0) == q.size(0) && row_meta.scalar_type() == torch::kLong &&
                  row_meta.is_contiguous(),
              "batch-invariant paged attention: expected key_rows [K] and row_meta [T, 2] int64");
  static_cast<void>(rows_are_sequences);  // a launch shape: only CUDA builds have launches
#ifdef SLIME_MODEL_FUSED_KERNELS
  if (q.is_cuda() && k_cache.is_cuda() && key_rows.is_cuda() && row_meta.is_cuda()) {
    torch::NoGradGuard no_grad;
    return CudaAttentionRows(q, k_cache, v_cache, key_rows, row_meta, torch::Tensor(),
                             torch::Tensor(), 0, rows_are_sequences);
  }
#endif
  TORCH_CHECK(false, "batch-invariant paged attention: CUDA tensors of a CUDA build expected, got ",
              q.device().str());
}

torch::Tensor InvariantPagedDecodeAttention(const torch::Tensor& q, const torch::Tensor& k_cache,
                                            const torch::Tensor& v_cache,
                                            const torch::Tensor& page_table,
                                            const torch::Tensor& seq_lens, int64_t page_size) {
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 3 && k_cache.sizes() == v_cache.sizes() &&
                  k_cache.strides() == v_cache.strides() && k_cache.stride(2) == 1 &&
                  k_cache.stride(1) == k_cache.size(2) && q.size(2) == k_cache.size(2) &&
                  q.size(1) % k_cache.size(1) == 0 && q.scalar_type() == k_cache.scalar_type() &&
                  k_cache.scalar_type() == v_cache.scalar_type(),
              "batch-invariant paged decode attention: expected q [B, heads, D] and k/v caches "
              "[slots, kv_heads, D] of one dtype; got q ",
              q.sizes(), ", k ", k_cache.sizes());
  TORCH_CHECK(page_table.dim() == 2 && page_table.size(0) == q.size(0) &&
                  page_table.scalar_type() == torch::kInt && page_table.stride(1) == 1 &&
                  page_table.stride(0) == page_table.size(1) && seq_lens.dim() == 1 &&
                  seq_lens.size(0) == q.size(0) && seq_lens.scalar_type() == torch::kInt &&
                  seq_lens.is_contiguous() && page_size > 0,
              "batch-invariant paged decode attention: expected page_table [B, pages] and "
              "seq_lens [B] int32");
#ifdef SLIME_MODEL_FUSED_KERNELS
  if (q.is_cuda()) {
    torch::NoGradGuard no_grad;
    return CudaAttentionRows(q, k_cache, v_cache, torch::Tensor(), torch::Tensor(), page_table,
                             seq_lens, page_size);
  }
#endif
  TORCH_CHECK(false, "batch-invariant paged decode attention: CUDA tensors of a CUDA build "
              "expected, got ", q.device().str());
}

SoftmaxStats InvariantSoftmaxStats(const torch::Tensor& z, bool with_entropy) {
  CheckDevice(z, "softmax statistics");
  TORCH_CHECK(z.dim() == 2 && (z.scalar_type() == torch::kFloat32 ||
                               (z.scalar_type() == torch::kFloat64 && z.device().is_cpu())),
              "batch-invariant softmax statistics: expected float32 [C, V] (or float64 on CPU), got ",
              z.sizes(), " ", c10::toString(z.scalar_type()));
  const torch::Tensor zc = z.detach().contiguous();
  const int64_t rows = zc.size(0), cols = zc.size(1);
  SoftmaxStats out;
  out.max = torch::empty({rows}, zc.options());
  out.log_sum = torch::empty({rows}, zc.options());
  if (with_entropy) out.mean_shifted = torch::empty({rows}, zc.options());
#ifdef SLIME_MODEL_FUSED_KERNELS
  if (zc.is_cuda()) {
    CudaRowStats(zc, nullptr, &out);
    return out;
  }
#endif
  AT_DISPATCH_FLOATING_TYPES(zc.scalar_type(), "invariant_softmax_stats", [&] {
    StatsKernel<scalar_t>(zc.data_ptr<scalar_t>(), rows, cols, with_entropy,
                          out.max.data_ptr<scalar_t>(), out.log_sum.data_ptr<scalar_t>(),
                          with_entropy ? out.mean_shifted.data_ptr<scalar_t>() : nullptr);
  });
  return out;
}

torch::Tensor InvariantTokenLogProbs(const torch::Tensor& logits, const torch::Tensor& targets,
                                     double temperature) {
  torch::NoGradGuard no_grad;
  torch::Tensor z = logits.to(logits.scalar_type() == torch::kFloat64 ? torch::kFloat64
                                                                        : torch::kFloat32);
  if (temperature >= 1e-6 && temperature != 1.0) z = z / temperature;
  const SoftmaxStats stats = InvariantSoftmaxStats(z, /*with_entropy=*/false);
  const torch::Tensor target_z =
      z.gather(1, targets.to(z.device(), torch::kLong).unsqueeze(1)).squeeze(1) - stats.max;
  return target_z - stats.log_sum;
}

}  // namespace slime::model
