// The decoder's elementwise ops, each on the fastest implementation that applies to its input:
// the fused training kernels (CUDA outside InferenceMode, autograd; fused_train.h — in
// deterministic mode under InferenceMode too, so that the engine and the trainer run the same
// row-wise kernels), the inference kernels (CUDA under InferenceMode; fused_inference.h), eager
// LibTorch elsewhere. All compute the
// eager math with its dtype roundings (cuda/fused_ops.h gives them). Internal to the model module:
// the decoder's layers and the feed-forward blocks (ffn/) share them. Thread-safety: pure.
#ifndef SLIME_SRC_MODEL_DECODER_OPS_H_
#define SLIME_SRC_MODEL_DECODER_OPS_H_

#include <torch/types.h>

namespace slime::model::internal {

// x [..., n] -> weight * (x / rms(x)) with the normalisation in float32 (transformers' RMSNorm).
torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

// x [T, heads, D] rotated by cos/sin [T, 1, D]: x * cos + rotate_half(x) * sin.
torch::Tensor ApplyRope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

// silu(gate) * up, gate and up of one shape.
torch::Tensor SiluMul(const torch::Tensor& gate, const torch::Tensor& up);

}  // namespace slime::model::internal

#endif  // SLIME_SRC_MODEL_DECODER_OPS_H_
