// Our decoder against logits computed by HF transformers on the same weights (fixtures from
// scripts/device/make_model_fixtures.py). Registered with ctest only once the fixtures exist;
// run by hand without them, every case fails and says how to make them.
#include "hf_fixture.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>

#include "reference_decoder.h"
#include "slime/model/decoder.h"

namespace slime::model {
namespace {

constexpr double kTol = 1e-4;

class HfFixtureTest : public ::testing::TestWithParam<const char*> {};

TEST_P(HfFixtureTest, PackedAndIncrementalForwardMatchTransformers) {
  auto fx = testing::LoadHfFixture(GetParam());
  ASSERT_TRUE(fx.ok()) << fx.status();
  auto model = DecoderModel::Load(fx->dir, torch::kFloat32, torch::kCPU);
  ASSERT_TRUE(model.ok()) << model.status();
  DecoderModel& m = **model;

  // All sequences in one packed batch.
  std::vector<int64_t> all;
  std::vector<int64_t> cu = {0};
  for (const auto& ids : fx->inputs) {
    all.insert(all.end(), ids.begin(), ids.end());
    cu.push_back(cu.back() + static_cast<int64_t>(ids.size()));
  }
  auto h = m.ForwardPacked(torch::tensor(all, torch::kLong), cu);
  ASSERT_TRUE(h.ok()) << h.status();
  torch::Tensor logits = *m.Logits(*h);
  for (size_t s = 0; s < fx->inputs.size(); ++s) {
    torch::Tensor got = logits.narrow(0, cu[s], cu[s + 1] - cu[s]);
    const double err = testing::MaxAbsDiff(got, fx->logits[s]);
    EXPECT_LE(err, kTol) << GetParam() << " sequence " << s;
    // The independent reference agrees with transformers too.
    torch::Tensor ref = testing::ReferenceLogits(m.config(), m.weights(), fx->inputs[s]);
    const double ref_err = testing::MaxAbsDiff(ref, fx->logits[s]);
    EXPECT_LE(ref_err, kTol) << GetParam() << " sequence " << s;
    std::printf(
        "%s seq %zu (%zu tokens): max|logit| %.3f, max abs err packed %.2e, "
        "reference %.2e\n",
        GetParam(), s, fx->inputs[s].size(), fx->logits[s].abs().max().item<double>(), err,
        ref_err);
  }

  // Incremental: prefill half of each sequence, then decode the rest token by token.
  for (size_t s = 0; s < fx->inputs.size(); ++s) {
    const auto& ids = fx->inputs[s];
    const int64_t n = static_cast<int64_t>(ids.size());
    const int64_t prefill = std::max<int64_t>(1, n / 2);
    KvCache cache = m.NewKvCache(n);
    std::vector<torch::Tensor> parts;
    auto h0 = m.ForwardWithCache(
        torch::tensor(std::vector<int64_t>(ids.begin(), ids.begin() + prefill), torch::kLong),
        cache);
    ASSERT_TRUE(h0.ok()) << h0.status();
    parts.push_back(*m.Logits(*h0));
    for (int64_t i = prefill; i < n; ++i) {
      auto hi = m.ForwardWithCache(torch::tensor({ids[i]}, torch::kLong), cache);
      ASSERT_TRUE(hi.ok()) << hi.status();
      parts.push_back(*m.Logits(*hi));
    }
    const double err = testing::MaxAbsDiff(torch::cat(parts, 0), fx->logits[s]);
    EXPECT_LE(err, kTol) << GetParam() << " sequence " << s;
    std::printf("%s seq %zu: max abs err incremental (prefill %ld + decode) %.2e\n", GetParam(), s,
                static_cast<long>(prefill), err);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfFixtureTest, ::testing::ValuesIn(testing::kHfFixtureNames));

}  // namespace
}  // namespace slime::model
