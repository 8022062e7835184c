// The tiny models of the model tests: the parsed config of "qwen2", "qwen3", "qwen3_moe" or
// "llama3" (the
// JSON texts of test_util.h) and a DecoderModel of it with seeded random weights whose biases and
// norms are perturbed (reference_decoder.h), on the CPU.
#ifndef SLIME_TESTS_MODEL_TINY_MODEL_H_
#define SLIME_TESTS_MODEL_TINY_MODEL_H_

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "slime/model/config.h"
#include "slime/model/decoder.h"

namespace slime::model::testing {

// A parse failure is a test failure.
ModelConfig TinyConfig(const std::string& arch);

// Weights converted to `dtype` on `device` (a tied LM head stays the embedding). A failure is a
// test failure and returns null.
std::unique_ptr<DecoderModel> MakeTinyModel(const ModelConfig& c, torch::ScalarType dtype,
                                            uint64_t seed = 5,
                                            torch::Device device = torch::kCPU);

// Deterministic mode's promise on `m` (the mode must be on): a sequence's logits are the same
// bits packed among others (the trainer's micro-batch), alone, and through the K/V cache in
// prefill chunks and decode steps that other sequences share (the engine's way). `lengths` are
// the three packed sequences' lengths; the middle one is checked. Failures are test failures.
void ExpectASequenceIsTheSameBitsPackedAloneAndThroughTheCache(DecoderModel& m, int64_t vocab,
                                                               std::vector<int64_t> lengths = {
                                                                   9, 14, 5});

}  // namespace slime::model::testing

#endif  // SLIME_TESTS_MODEL_TINY_MODEL_H_
