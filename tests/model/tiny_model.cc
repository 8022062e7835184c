#include "tiny_model.h"

#include <gtest/gtest.h>

#include "reference_decoder.h"
#include "slime/model/weights.h"
#include "test_util.h"

namespace slime::model::testing {

ModelConfig TinyConfig(const std::string& arch) {
  const std::string json = arch == "qwen2"   ? TinyQwen2ConfigJson()
                           : arch == "qwen3" ? TinyQwen3ConfigJson()
                                             : TinyLlama3ConfigJson();
  auto c = ParseModelConfigJson(json, arch + ".json");
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : ModelConfig{};
}

std::unique_ptr<DecoderModel> MakeTinyModel(const ModelConfig& c, torch::ScalarType dtype,
                                            uint64_t seed) {
  auto w = RandomWeights(c, seed, WeightOptions{});
  EXPECT_TRUE(w.ok()) << w.status();
  if (!w.ok()) return nullptr;
  PerturbBiasesAndNorms(*w, c, seed + 1);
  if (dtype != torch::kFloat32) {
    for (const ParamSpec& spec : ParameterSpecs(c)) {
      ParamSlot(*w, spec) = ParamSlot(*w, spec).to(dtype);
    }
    w->lm_head = c.tie_word_embeddings ? w->embed_tokens : w->lm_head.to(dtype);
  }
  auto m = DecoderModel::Create(c, *std::move(w));
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *std::move(m) : nullptr;
}

}  // namespace slime::model::testing
