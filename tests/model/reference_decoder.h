// An independent reference forward for the model tests: one sequence at a time, float64,
// explicit per-position / per-head loops and its own RoPE frequency code, written from the
// architecture description rather than sharing code with src/model. Slow; tiny models only.
#ifndef SLIME_TESTS_MODEL_REFERENCE_DECODER_H_
#define SLIME_TESTS_MODEL_REFERENCE_DECODER_H_

#include <torch/torch.h>

#include <vector>

#include "slime/model/config.h"
#include "slime/model/weights.h"

namespace slime::model::testing {

// Logits [L, vocab] (float64, CPU) of one sequence `ids` at positions 0..L-1. `weights` must be
// an unsharded (TP size 1) set, any dtype/device.
torch::Tensor ReferenceLogits(const ModelConfig& config, const ModelWeights& weights,
                              const std::vector<int64_t>& ids);

// Sets every bias and norm weight of `weights` to seeded random values (random init makes them
// 0 and 1, which would hide a missing bias or norm).
void PerturbBiasesAndNorms(ModelWeights& weights, const ModelConfig& config, uint64_t seed);

// Max |a - b| over all elements, after converting both to float64 on CPU.
double MaxAbsDiff(const torch::Tensor& a, const torch::Tensor& b);

}  // namespace slime::model::testing

#endif  // SLIME_TESTS_MODEL_REFERENCE_DECODER_H_
