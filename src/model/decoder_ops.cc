// The decoder's elementwise ops (see decoder_ops.h).
#include "decoder_ops.h"

#include <torch/torch.h>

#include "fused_inference.h"
#include "slime/model/batch_invariant.h"
#include "slime/model/fused_train.h"

#ifdef SLIME_MODEL_FUSED_KERNELS
#include "cuda/fused_ops.h"
#endif

namespace slime::model::internal {
namespace {

// [..., D] -> [-x2, x1] with x1, x2 the halves of the last dim.
torch::Tensor RotateHalf(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

}  // namespace

torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  if (FusedDecoderOpsApply(x) && weight.scalar_type() == x.scalar_type() && weight.dim() == 1 &&
      weight.numel() == x.size(-1) && x.size(-1) <= 12288) {
    return FusedRmsNorm(x, weight, eps);
  }
#ifdef SLIME_MODEL_FUSED_KERNELS
  if (InferenceKernelsApply(x) && weight.is_contiguous() &&
      weight.scalar_type() == x.scalar_type() && weight.numel() == x.size(-1)) {
    torch::Tensor y = torch::empty_like(x);
    const int err = cuda::LaunchRmsNorm(x.data_ptr(), weight.data_ptr(), y.data_ptr(),
                                        x.numel() / x.size(-1), static_cast<int>(x.size(-1)),
                                        static_cast<float>(eps), KernelDType(x), CurrentStream());
    TORCH_CHECK(err == 0, "fused RMSNorm failed with CUDA error ", err);
    return y;
  }
#endif
  torch::Tensor xf = x.to(torch::kFloat32);
  torch::Tensor var;
  if (BatchInvariant() && InvariantKernelsServe(x.device())) {
    var = InvariantMeanSquare(xf);  // a fixed summation order (batch_invariant.h)
  } else {
    var = xf.pow(2).mean(-1, /*keepdim=*/true);
  }
  xf = xf * torch::rsqrt(var + eps);
  return weight * xf.to(x.scalar_type());
}

torch::Tensor ApplyRope(const torch::Tensor& x, const torch::Tensor& cos,
                        const torch::Tensor& sin) {
  if (FusedDecoderOpsApply(x) && x.dim() == 3 && x.size(2) % 2 == 0 &&
      cos.scalar_type() == x.scalar_type() && sin.scalar_type() == x.scalar_type() &&
      cos.numel() == x.size(0) * x.size(2) && sin.numel() == cos.numel()) {
    return FusedRope(x, cos, sin);
  }
#ifdef SLIME_MODEL_FUSED_KERNELS
  if (InferenceKernelsApply(x) && cos.is_contiguous() && sin.is_contiguous() &&
      cos.scalar_type() == x.scalar_type() && cos.numel() == x.size(0) * x.size(2)) {
    torch::Tensor y = torch::empty_like(x);
    const int err = cuda::LaunchRope(x.data_ptr(), cos.data_ptr(), sin.data_ptr(), y.data_ptr(),
                                     x.size(0), static_cast<int>(x.size(1)),
                                     static_cast<int>(x.size(2)), KernelDType(x), CurrentStream());
    TORCH_CHECK(err == 0, "fused RoPE failed with CUDA error ", err);
    return y;
  }
#endif
  return x * cos + RotateHalf(x) * sin;
}

torch::Tensor SiluMul(const torch::Tensor& gate, const torch::Tensor& up) {
  if (FusedDecoderOpsApply(gate) && up.sizes() == gate.sizes() &&
      up.scalar_type() == gate.scalar_type()) {
    return FusedSiluMul(gate, up);
  }
#ifdef SLIME_MODEL_FUSED_KERNELS
  if (InferenceKernelsApply(gate) && up.is_contiguous() && up.sizes() == gate.sizes() &&
      up.scalar_type() == gate.scalar_type()) {
    torch::Tensor y = torch::empty_like(gate);
    const int err = cuda::LaunchSiluMul(gate.data_ptr(), up.data_ptr(), y.data_ptr(), gate.numel(),
                                        KernelDType(gate), CurrentStream());
    TORCH_CHECK(err == 0, "fused SiLU*up failed with CUDA error ", err);
    return y;
  }
#endif
  return torch::silu(gate) * up;
}

}  // namespace slime::model::internal
