// The fused inference path's shared pieces (internal to the model module): where the inference
// kernels apply, and one fused forward's state with the GEMM helpers that the decoder's fused
// forward (fused_inference.cc) and the feed-forward blocks' fused forwards (ffn/) share.
//
// The kernels (cuda/fused_ops.h) exist in CUDA builds only (SLIME_MODEL_FUSED_KERNELS); in other
// builds InferenceKernelsApply is false, DecoderModel never takes the fused path, and the
// helpers below fail if called.
//
// Thread-safety: a FusedForwardState belongs to one forward on one thread.
#ifndef SLIME_SRC_MODEL_FUSED_INFERENCE_H_
#define SLIME_SRC_MODEL_FUSED_INFERENCE_H_

#include <torch/types.h>

#include <cstdint>

#include "slime/model/config.h"
#include "slime/model/cuda/launch.h"
#include "slime/model/tensor_parallel.h"

namespace slime::model::internal {

// True where the inference kernels serve `x`: a build with them, `x` contiguous on CUDA in
// float32, bfloat16 or float16, under InferenceMode (training on CUDA takes fused_train.h's ops).
bool InferenceKernelsApply(const torch::Tensor& x);
// The kernels' storage dtype of `x` (float32, bfloat16 or float16).
cuda::DType KernelDType(const torch::Tensor& x);
// The current CUDA stream (a cudaStream_t), the one LibTorch's ops of the forward run on.
void* CurrentStream();
// Fails (c10::Error) unless a kernel launch returned 0 (cudaSuccess).
void CheckLaunch(int err, const char* what);

// One fused forward's rows, residual stream and the GEMMs of its layers; built by
// DecoderModel::FusedForward and handed to each layer's feed-forward block.
struct FusedForwardState {
  int64_t t = 0;   // rows of the step
  int64_t n = 0;   // hidden size
  double eps = 0;  // the RMSNorms' epsilon
  cuda::DType dt = cuda::DType::kBFloat16;
  TensorParallelGroup* tp = nullptr;
  const ModelConfig* config = nullptr;  // the model's (blocks that run their eager forward)
  int layer = -1;                       // the layer whose block is called
  // Routing of the called layer (a routed block's FeedForwardContext fields): the experts to
  // replay, and where to store the experts used; null when off.
  const torch::Tensor* replay_experts = nullptr;
  torch::Tensor* routed_experts = nullptr;
  // A decode step on one rank: our small-m GEMM streams the weights (cuBLAS otherwise).
  bool small_gemm = false;
  // [T, hidden] the running x of the eager layers: each block's output is added into it in place
  // by the next add + RMSNorm kernel or, in folded decode steps, by the block's last GEMM.
  torch::Tensor residual;

  // y [T, out] = in [T, k] W^T (+ bias): the small-m GEMM where it takes the shapes, else the
  // Megatron layers (column-parallel, or row-parallel with the all-reduce of the partial sums).
  torch::Tensor Linear(const torch::Tensor& in, const torch::Tensor& weight,
                       const torch::Tensor& bias, bool row_parallel) const;
  // residual += delta (undefined: nothing to add), then y [T, hidden] = RmsNorm(residual) by
  // norm_weight [hidden]: one add + RMSNorm kernel.
  torch::Tensor AddNorm(const torch::Tensor& delta, const torch::Tensor& norm_weight) const;
  // y [T, out] = RmsNorm(residual) W^T (+ bias), the norm computed inside the small-m GEMM in the
  // add + RMSNorm kernel's summation order (folded decode steps).
  torch::Tensor NormLinear(const torch::Tensor& norm_weight, const torch::Tensor& weight,
                           const torch::Tensor& bias) const;
  // residual += x W^T (+ bias), the add in the small-m GEMM's epilogue (folded decode steps).
  void LinearIntoResidual(const torch::Tensor& x, const torch::Tensor& weight,
                          const torch::Tensor& bias) const;
};

}  // namespace slime::model::internal

#endif  // SLIME_SRC_MODEL_FUSED_INFERENCE_H_
