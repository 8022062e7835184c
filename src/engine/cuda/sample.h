// Fused sampling kernel for rows without top-k/top-p/min-p truncation (CUDA builds only; raw
// pointers, no LibTorch headers). Two kernels (chunk statistics, then the pick; see sample.cu)
// compute per row:
//   greedy row (temperature 0): token = argmax(logits) (lowest index on ties),
//                               logprob = log_softmax(logits)[token];
//   sampled row:                p = softmax(logits / T); token = the first index whose running
//                               sum of p exceeds u * sum(p) (the engine's inverse-CDF rule with
//                               the row's uniform u); logprob = log_softmax(logits / T)[token].
// The same quantities as the LibTorch sampler in sampler.cc; float summation order differs, so a
// sampled token can differ where u falls within rounding of a CDF step. Results depend only on
// the row (never on the batch), so a seeded request samples the same tokens in any batch.
#ifndef SLIME_SRC_ENGINE_CUDA_SAMPLE_H_
#define SLIME_SRC_ENGINE_CUDA_SAMPLE_H_

#include <cstdint>

namespace slime::engine::cuda {

struct FusedSampleArgs {
  const float* logits = nullptr;  // [batch, vocab] float32, rows row_stride apart
  int64_t row_stride = 0;
  int batch = 0;
  int vocab = 0;
  const float* params = nullptr;  // [batch, 2] on the device: temperature (0 = greedy), u in (0,1)
  double* out = nullptr;          // [2, batch] on the device: token id, log-prob
  void* scratch = nullptr;        // FusedSampleScratchBytes(batch) bytes on the device
};

int FusedSampleScratchBytes(int batch);

// Enqueues the kernel on `stream` (a cudaStream_t). Returns the cudaError_t as an int (0 = ok).
int LaunchFusedSample(const FusedSampleArgs& args, void* stream);

}  // namespace slime::engine::cuda

#endif  // SLIME_SRC_ENGINE_CUDA_SAMPLE_H_
