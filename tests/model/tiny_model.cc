#include "tiny_model.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "reference_decoder.h"
#include "slime/model/weights.h"
#include "test_util.h"

namespace slime::model::testing {

ModelConfig TinyConfig(const std::string& arch) {
  const std::string json = arch == "qwen2"       ? TinyQwen2ConfigJson()
                           : arch == "qwen3"     ? TinyQwen3ConfigJson()
                           : arch == "qwen3_moe" ? TinyQwen3MoeConfigJson()
                                                 : TinyLlama3ConfigJson();
  auto c = ParseModelConfigJson(json, arch + ".json");
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : ModelConfig{};
}

std::unique_ptr<DecoderModel> MakeTinyModel(const ModelConfig& c, torch::ScalarType dtype,
                                            uint64_t seed, torch::Device device) {
  auto w = RandomWeights(c, seed, WeightOptions{});
  EXPECT_TRUE(w.ok()) << w.status();
  if (!w.ok()) return nullptr;
  PerturbBiasesAndNorms(*w, c, seed + 1);
  if (dtype != torch::kFloat32 || !device.is_cpu()) {
    for (const ParamSpec& spec : ParameterSpecs(c)) {
      ParamSlot(*w, spec) = ParamSlot(*w, spec).to(device, dtype);
    }
    w->lm_head = c.tie_word_embeddings ? w->embed_tokens : w->lm_head.to(device, dtype);
  }
  auto m = DecoderModel::Create(c, *std::move(w));
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *std::move(m) : nullptr;
}

namespace {

std::vector<int64_t> Tokens(int64_t vocab, int s, int64_t len) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < len; ++i) ids.push_back((s * 37 + i * 13 + 5) % vocab);
  return ids;
}

torch::Tensor Ids(const std::vector<int64_t>& ids) { return torch::tensor(ids, torch::kLong); }

torch::Tensor LogitsOf(DecoderModel& m, const StatusOr<torch::Tensor>& hidden) {
  EXPECT_TRUE(hidden.ok()) << hidden.status();
  if (!hidden.ok()) return torch::Tensor();
  auto logits = m.Logits(*hidden);
  EXPECT_TRUE(logits.ok()) << logits.status();
  return logits.ok() ? *logits : torch::Tensor();
}

}  // namespace

void ExpectASequenceIsTheSameBitsPackedAloneAndThroughTheCache(DecoderModel& m, int64_t vocab,
                                                               std::vector<int64_t> lengths) {
  ASSERT_EQ(lengths.size(), 3u);
  ASSERT_GE(lengths[1], 12);
  // The trainer's packed micro-batch: sequence 1 among three.
  std::vector<std::vector<int64_t>> seqs;
  std::vector<int64_t> all, cu{0};
  for (int i = 0; i < 3; ++i) {
    seqs.push_back(Tokens(vocab, i, lengths[i]));
    all.insert(all.end(), seqs.back().begin(), seqs.back().end());
    cu.push_back(cu.back() + lengths[i]);
  }
  const int64_t len = lengths[1];
  const torch::Tensor packed =
      LogitsOf(m, m.ForwardPacked(Ids(all), cu)).narrow(0, lengths[0], len);
  // Alone.
  const torch::Tensor alone = LogitsOf(m, m.ForwardPacked(Ids(seqs[1]), {0, len}));
  EXPECT_TRUE(torch::equal(alone, packed)) << "alone vs packed";
  // The engine's way (under InferenceMode, as the engine runs): two prefill chunks (len - 8 and
  // 3 tokens), then decode steps and a last 2-token chunk, while another sequence shares the
  // forwards.
  c10::InferenceMode inference;
  KvCache cache = m.NewKvCache(len + 2), other = m.NewKvCache(32);
  const std::vector<int64_t>& s = seqs[1];
  std::vector<torch::Tensor> steps;
  const int64_t first = len - 8;
  const std::vector<std::pair<int64_t, int64_t>> chunks = {
      {0, first}, {first, 3}, {first + 3, 1}, {first + 4, 1}, {first + 5, 1}, {first + 6, 2}};
  int64_t other_len = 0;
  for (auto [start, n] : chunks) {
    std::vector<int64_t> ids(s.begin() + start, s.begin() + start + n);
    const int64_t other_n = 1 + start % 3;
    const std::vector<int64_t> extra = Tokens(vocab, 7, other_len + other_n);
    ids.insert(ids.end(), extra.end() - other_n, extra.end());
    other_len += other_n;
    steps.push_back(
        LogitsOf(m, m.ForwardWithCache(Ids(ids), {0, n, n + other_n}, {&cache, &other}))
            .narrow(0, 0, n));
  }
  EXPECT_TRUE(torch::equal(torch::cat(steps), packed)) << "cached steps vs packed";
}

}  // namespace slime::model::testing
