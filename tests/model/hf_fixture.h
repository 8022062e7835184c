// HF reference fixtures made by scripts/device/make_model_fixtures.py: tiny random models saved
// by transformers under tests/data/model/<name>/ (config.json, model.safetensors) with
// reference.safetensors holding, for sequence i, "input_ids.i" (I64 [L]) and "logits.i"
// (F32 [L, vocab]) computed by transformers in float32 with eager attention.
#ifndef SLIME_TESTS_MODEL_HF_FIXTURE_H_
#define SLIME_TESTS_MODEL_HF_FIXTURE_H_

#include <torch/torch.h>

#include <string>
#include <vector>

#include "slime/common/status.h"

namespace slime::model::testing {

inline constexpr const char* kHfFixtureNames[] = {"tiny-qwen2", "tiny-qwen3", "tiny-llama3"};

struct HfFixture {
  std::string dir;                           // the model directory
  std::vector<std::vector<int64_t>> inputs;  // token ids per sequence
  std::vector<torch::Tensor> logits;         // [L, vocab] float32 per sequence
};

// Loads tests/data/model/<name>; the error says how to create missing fixtures.
StatusOr<HfFixture> LoadHfFixture(const std::string& name);

}  // namespace slime::model::testing

#endif  // SLIME_TESTS_MODEL_HF_FIXTURE_H_
