// Fused training ops (see include/slime/model/fused_train.h).
#include "slime/model/fused_train.h"

#include <torch/torch.h>

#include <atomic>

#include "slime/model/batch_invariant.h"
#include <cstdint>
#include <cstdlib>
#include <cstring>

#ifdef SLIME_MODEL_FUSED_KERNELS
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "cuda/fused_ops.h"
#include "cuda/train_ops.h"
#endif

namespace slime::model {
namespace {

std::atomic<bool>& Switch() {
  static std::atomic<bool> on{[] {
    const char* v = std::getenv("SLIME_FUSED_TRAIN");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }()};
  return on;
}

#ifdef SLIME_MODEL_FUSED_KERNELS
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

cuda::DType KernelType(const torch::Tensor& x) {
  return x.scalar_type() == torch::kBFloat16 ? cuda::DType::kBFloat16
         : x.scalar_type() == torch::kHalf   ? cuda::DType::kFloat16
                                             : cuda::DType::kFloat32;
}
// Kernel launches go to the current stream of the tensor's device, with that device current for
// the launch: one thread may drive several GPUs (tensor-parallel ranks on threads) and its
// current device need not be the tensor's. A temporary `OnDevice(x).stream()` in the launch call
// keeps the guard for the whole call.
class OnDevice {
 public:
  explicit OnDevice(const torch::Tensor& t) : guard_(t.device()) {}
  void* stream() const { return at::cuda::getCurrentCUDAStream().stream(); }

 private:
  c10::cuda::CUDAGuard guard_;
};
void Check(int err, const char* what) {
  TORCH_CHECK(err == 0, "fused ", what, " failed with CUDA error ", err);
}
// The 16-byte-load kernels need 16-byte aligned rows.
bool Aligned16(const torch::Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}
int64_t PerVector(const torch::Tensor& t) { return 16 / static_cast<int64_t>(t.element_size()); }

// The forward kernels alone (the autograd functions' forwards, and the ops without autograd).
torch::Tensor RmsNormForward(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  torch::Tensor y = torch::empty_like(x);
  const int64_t n = x.size(-1);
  const bool vec = Aligned16(x) && Aligned16(w) && n % PerVector(x) == 0;
  Check((vec ? cuda::LaunchRmsNormForward : cuda::LaunchRmsNorm)(
            x.data_ptr(), w.data_ptr(), y.data_ptr(), x.numel() / n, static_cast<int>(n),
            static_cast<float>(eps), KernelType(x), OnDevice(x).stream()),
        "RMSNorm");
  return y;
}

torch::Tensor SiluMulForward(const torch::Tensor& g, const torch::Tensor& u) {
  torch::Tensor y = torch::empty_like(g);
  const bool vec = Aligned16(g) && Aligned16(u) && g.numel() % PerVector(g) == 0;
  Check(
      (vec ? cuda::LaunchSiluMulForward : cuda::LaunchSiluMul)(
          g.data_ptr(), u.data_ptr(), y.data_ptr(), g.numel(), KernelType(g), OnDevice(g).stream()),
      "SiLU*up");
  return y;
}

// True when the op runs without autograd: nothing would record a backward for it.
bool WithoutAutograd(std::initializer_list<const torch::Tensor*> inputs) {
  if (c10::InferenceMode::is_enabled() || !at::GradMode::is_enabled()) return true;
  for (const torch::Tensor* t : inputs) {
    if (t->requires_grad()) return false;
  }
  return true;
}

class RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x_in,
                               const torch::Tensor& w_in, double eps) {
    const torch::Tensor x = x_in.contiguous();
    const torch::Tensor w = w_in.contiguous();
    torch::Tensor y = RmsNormForward(x, w, eps);
    ctx->save_for_backward({x, w});
    ctx->saved_data["eps"] = eps;
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const torch::Tensor& w = saved[1];
    const torch::Tensor dy = grads[0].contiguous();
    const int64_t n = x.size(-1);
    torch::Tensor dx = torch::empty_like(x);
    torch::Tensor dw = torch::zeros({n}, x.options().dtype(torch::kFloat32));
    Check(cuda::LaunchRmsNormBackward(x.data_ptr(), w.data_ptr(), dy.data_ptr(), dx.data_ptr(),
                                      dw.data_ptr<float>(), x.numel() / n, static_cast<int>(n),
                                      static_cast<float>(ctx->saved_data["eps"].toDouble()),
                                      KernelType(x), OnDevice(x).stream()),
          "RMSNorm backward");
    return {dx, dw.to(w.scalar_type()), torch::Tensor()};
  }
};

class RopeFunction : public torch::autograd::Function<RopeFunction> {
 public:
  static torch::Tensor Apply(const torch::Tensor& x_in, const torch::Tensor& cos,
                             const torch::Tensor& sin) {
    const torch::Tensor x = x_in.contiguous();
    torch::Tensor y = torch::empty_like(x);
    const bool vec = Aligned16(x) && Aligned16(cos) && Aligned16(sin) &&
                     (x.size(2) / 2) % PerVector(x) == 0;
    Check((vec ? cuda::LaunchRopeForward : cuda::LaunchRope)(
              x.data_ptr(), cos.data_ptr(), sin.data_ptr(), y.data_ptr(), x.size(0),
              static_cast<int>(x.size(1)), static_cast<int>(x.size(2)), KernelType(x), OnDevice(x).stream()),
          "RoPE");
    return y;
  }
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& cos, const torch::Tensor& sin) {
    const torch::Tensor c = cos.contiguous(), s = sin.contiguous();
    ctx->save_for_backward({c, s});
    return Apply(x, c, s);
  }
  // The rotation by -θ: y1 = x1 c - x2 s, y2 = x2 c + x1 s has the transpose
  // dx1 = dy1 c + dy2 s, dx2 = dy2 c - dy1 s, i.e. the same kernel with sin negated.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    return {Apply(grads[0], saved[0], saved[1].neg()), torch::Tensor(), torch::Tensor()};
  }
};

class SiluMulFunction : public torch::autograd::Function<SiluMulFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& g_in,
                               const torch::Tensor& u_in) {
    const torch::Tensor g = g_in.contiguous(), u = u_in.contiguous();
    torch::Tensor y = SiluMulForward(g, u);
    ctx->save_for_backward({g, u});
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& g = saved[0];
    const torch::Tensor& u = saved[1];
    const torch::Tensor dy = grads[0].contiguous();
    torch::Tensor dg = torch::empty_like(g), du = torch::empty_like(u);
    Check(cuda::LaunchSiluMulBackward(g.data_ptr(), u.data_ptr(), dy.data_ptr(), dg.data_ptr(),
                                      du.data_ptr(), g.numel(), KernelType(g), OnDevice(g).stream()),
          "SiLU*up backward");
    return {dg, du};
  }
};
#endif

}  // namespace

bool FusedTrainingEnabled() { return Switch().load(); }
void SetFusedTraining(bool enabled) { Switch().store(enabled); }

bool FusedDecoderOpsApply(const torch::Tensor& x) {
#ifdef SLIME_MODEL_FUSED_KERNELS
  return FusedTrainingEnabled() && x.defined() && x.is_cuda() &&
         (BatchInvariant() || !c10::InferenceMode::is_enabled()) &&
         (x.scalar_type() == torch::kBFloat16 || x.scalar_type() == torch::kFloat32 ||
          x.scalar_type() == torch::kHalf);
#else
  (void)x;
  return false;
#endif
}

bool FusedTrainingApplies(const torch::Tensor& x) {
#ifdef SLIME_MODEL_FUSED_KERNELS
  // Deterministic mode takes the eager ops and batch-invariant kernels instead.
  return FusedTrainingEnabled() && !BatchInvariant() && x.defined() && x.is_cuda() &&
         !c10::InferenceMode::is_enabled() &&
         (x.scalar_type() == torch::kBFloat16 || x.scalar_type() == torch::kFloat32 ||
          x.scalar_type() == torch::kHalf);
#else
  (void)x;
  return false;
#endif
}

#ifdef SLIME_MODEL_FUSED_KERNELS
torch::Tensor FusedRmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  if (WithoutAutograd({&x, &weight}))
    return RmsNormForward(x.contiguous(), weight.contiguous(), eps);
  return RmsNormFunction::apply(x, weight, eps);
}
torch::Tensor FusedRope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  if (WithoutAutograd({&x})) return RopeFunction::Apply(x, cos.contiguous(), sin.contiguous());
  return RopeFunction::apply(x, cos, sin);
}
torch::Tensor FusedSiluMul(const torch::Tensor& gate, const torch::Tensor& up) {
  if (WithoutAutograd({&gate, &up})) return SiluMulForward(gate.contiguous(), up.contiguous());
  return SiluMulFunction::apply(gate, up);
}

LogSoftmaxRows FusedLogSoftmaxRows(const torch::Tensor& logits, const torch::Tensor& targets,
                                   double temperature, bool with_entropy) {
  TORCH_CHECK(logits.dim() == 2 && logits.is_contiguous(), "fused log-softmax: logits [C, V]");
  const int64_t c = logits.size(0);
  const auto f32 = logits.options().dtype(torch::kFloat32);
  LogSoftmaxRows r;
  r.log_probs = torch::empty({c}, f32);
  if (with_entropy) r.entropy = torch::empty({c}, f32);
  r.row_max = torch::empty({c}, f32);
  r.log_sum = torch::empty({c}, f32);
  r.mean_shifted = torch::empty({c}, f32);
  const torch::Tensor t = targets.to(torch::kLong).contiguous();
  cuda::LogSoftmaxStatsArgs a;
  a.logits = logits.data_ptr();
  a.targets = t.data_ptr<int64_t>();
  a.rows = c;
  a.v = logits.size(1);
  a.inv_temperature = static_cast<float>(1.0 / temperature);
  a.log_probs = r.log_probs.data_ptr<float>();
  a.entropy = with_entropy ? r.entropy.data_ptr<float>() : nullptr;
  a.row_max = r.row_max.data_ptr<float>();
  a.log_sum = r.log_sum.data_ptr<float>();
  a.mean_shifted = r.mean_shifted.data_ptr<float>();
  a.dtype = KernelType(logits);
  Check(cuda::LaunchLogSoftmaxStats(a, OnDevice(logits).stream()), "log-softmax");
  return r;
}

void FusedLogSoftmaxBackwardInPlace(torch::Tensor& logits, const torch::Tensor& targets,
                                    const LogSoftmaxRows& rows, const torch::Tensor& g_lp,
                                    const torch::Tensor& g_ent, double temperature) {
  TORCH_CHECK(logits.dim() == 2 && logits.is_contiguous(), "fused log-softmax: logits [C, V]");
  const torch::Tensor t = targets.to(torch::kLong).contiguous();
  const torch::Tensor lp = g_lp.defined() ? g_lp.to(torch::kFloat32).contiguous() : g_lp;
  const torch::Tensor ent = g_ent.defined() ? g_ent.to(torch::kFloat32).contiguous() : g_ent;
  cuda::LogSoftmaxGradArgs a;
  a.logits = logits.data_ptr();
  a.targets = t.data_ptr<int64_t>();
  a.rows = logits.size(0);
  a.v = logits.size(1);
  a.inv_temperature = static_cast<float>(1.0 / temperature);
  a.row_max = rows.row_max.data_ptr<float>();
  a.log_sum = rows.log_sum.data_ptr<float>();
  a.mean_shifted = rows.mean_shifted.data_ptr<float>();
  a.g_lp = lp.defined() ? lp.data_ptr<float>() : nullptr;
  a.g_ent = ent.defined() ? ent.data_ptr<float>() : nullptr;
  a.dtype = KernelType(logits);
  Check(cuda::LaunchLogSoftmaxGrad(a, OnDevice(logits).stream()), "log-softmax backward");
}

void FusedAddSquaredNorm(const torch::Tensor& grad, torch::Tensor& accum) {
  TORCH_CHECK(grad.is_contiguous() && accum.scalar_type() == torch::kFloat32,
              "fused squared norm: contiguous grad, float32 accumulator");
  Check(cuda::LaunchAddSquaredNorm(grad.data_ptr(), grad.numel(), accum.data_ptr<float>(),
                                   KernelType(grad), OnDevice(grad).stream()),
        "squared norm");
}

void FusedAdamW(torch::Tensor& param, const torch::Tensor& grad, torch::Tensor& master,
                torch::Tensor& exp_avg, torch::Tensor& exp_avg_sq, const FusedAdamWStep& step) {
  TORCH_CHECK(param.is_contiguous() && exp_avg.is_contiguous() && exp_avg_sq.is_contiguous() &&
                  (!grad.defined() || (grad.is_contiguous() &&
                                       grad.scalar_type() == param.scalar_type())) &&
                  (!master.defined() || master.is_contiguous()),
              "fused AdamW: contiguous tensors, the gradient in the parameter's dtype");
  cuda::AdamWArgs a;
  a.param = param.data_ptr();
  a.grad = grad.defined() ? grad.data_ptr() : nullptr;
  a.master = master.defined() ? master.data_ptr<float>() : nullptr;
  a.exp_avg = exp_avg.data_ptr<float>();
  a.exp_avg_sq = exp_avg_sq.data_ptr<float>();
  a.n = param.numel();
  a.grad_scale = static_cast<float>(step.grad_scale);
  a.decay_factor = static_cast<float>(step.decay_factor);
  a.beta1 = static_cast<float>(step.beta1);
  a.beta2 = static_cast<float>(step.beta2);
  a.one_minus_beta1 = static_cast<float>(1.0 - step.beta1);
  a.one_minus_beta2 = static_cast<float>(1.0 - step.beta2);
  a.step_size = static_cast<float>(step.step_size);
  a.bc2_sqrt = static_cast<float>(step.bias_correction2_sqrt);
  a.eps = static_cast<float>(step.eps);
  a.dtype = KernelType(param);
  Check(cuda::LaunchAdamW(a, OnDevice(param).stream()), "AdamW");
}
#else
namespace {
[[noreturn]] void NotBuilt() {
  TORCH_CHECK(false, "the fused training kernels are not built (a CPU build)");
  std::abort();
}
}  // namespace
torch::Tensor FusedRmsNorm(const torch::Tensor&, const torch::Tensor&, double) { NotBuilt(); }
torch::Tensor FusedRope(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&) {
  NotBuilt();
}
torch::Tensor FusedSiluMul(const torch::Tensor&, const torch::Tensor&) { NotBuilt(); }
LogSoftmaxRows FusedLogSoftmaxRows(const torch::Tensor&, const torch::Tensor&, double, bool) {
  NotBuilt();
}
void FusedLogSoftmaxBackwardInPlace(torch::Tensor&, const torch::Tensor&, const LogSoftmaxRows&,
                                    const torch::Tensor&, const torch::Tensor&, double) {
  NotBuilt();
}
void FusedAddSquaredNorm(const torch::Tensor&, torch::Tensor&) { NotBuilt(); }
void FusedAdamW(torch::Tensor&, const torch::Tensor&, torch::Tensor&, torch::Tensor&,
                torch::Tensor&, const FusedAdamWStep&) {
  NotBuilt();
}
#endif

}  // namespace slime::model
