// The batch-invariant kernels (model/batch_invariant.h) on CPU: each row's result is the same
// bits whatever else shares the call — the row count, the row's position, the thread count,
// the number of queries of an attention call (full sequence, last-n, one decode step) — and
// the values are the ordinary math (close to LibTorch's ops, gradients included). Then the
// whole decoder in the mode: a sequence packed with others, alone, and through the K/V cache in
// prefill chunks and decode steps gives the same hidden states and logits to the bit, for the
// three architectures and in bfloat16.
#include "slime/model/batch_invariant.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "reference_decoder.h"
#include "slime/model/attention.h"
#include "slime/model/decoder.h"
#include "test_util.h"
#include "tiny_model.h"

namespace slime::model {
namespace {

using testing::MakeTinyModel;
using testing::TinyConfig;

// Turns the mode on for one test and restores it.
class ModeOn {
 public:
  ModeOn() : was_(BatchInvariant()) { SetBatchInvariant(true); }
  ~ModeOn() { SetBatchInvariant(was_); }

 private:
  bool was_;
};

// A single row through the kernel, as a [1, K] call.
torch::Tensor OneRow(const torch::Tensor& x, int64_t r, const torch::Tensor& w,
                     const torch::Tensor& b) {
  return InvariantLinear(x.narrow(0, r, 1), w, b);
}

TEST(BatchInvariantLinearTest, EachRowIsTheSameBitsWhateverShareTheCall) {
  torch::manual_seed(1);
  const int threads = at::get_num_threads();
  // Shapes on which LibTorch's own GEMM gives row 0 different bits for different row counts.
  for (auto [k, n] : std::vector<std::pair<int64_t, int64_t>>{{64, 16}, {128, 64}, {16, 9}}) {
    for (torch::ScalarType dtype : {torch::kFloat32, torch::kFloat64, torch::kBFloat16}) {
      const torch::Tensor x = torch::randn({300, k}).to(dtype);
      const torch::Tensor w = torch::randn({n, k}).to(dtype);
      const torch::Tensor b = torch::randn({n}).to(dtype);
      for (int64_t m : {1, 2, 5, 17, 300}) {
        for (int t : {1, 2}) {
          at::set_num_threads(t);
          const torch::Tensor y = InvariantLinear(x.narrow(0, 0, m), w, b);
          for (int64_t r : {int64_t{0}, m / 2, m - 1}) {
            EXPECT_TRUE(torch::equal(y.narrow(0, r, 1), OneRow(x, r, w, b)))
                << "k " << k << " n " << n << " " << c10::toString(dtype) << " rows " << m
                << " row " << r << " threads " << t;
          }
        }
      }
      at::set_num_threads(threads);
      // The ordinary product, within the output's rounding (bfloat16: half an ulp, 2^-9
      // relative).
      const torch::Tensor want = torch::linear(x.to(torch::kFloat64), w.to(torch::kFloat64),
                                               b.to(torch::kFloat64));
      const double rel = dtype == torch::kBFloat16 ? 1.0 / 256 : 1e-5;
      const torch::Tensor err = (InvariantLinear(x, w, b).to(torch::kFloat64) - want).abs();
      EXPECT_TRUE((err <= want.abs() * rel + 1e-4).all().item<bool>())
          << c10::toString(dtype) << ": max error " << err.max().item<double>();
    }
  }
}

TEST(BatchInvariantLinearTest, LeadingDimensionsAndGradientsAreTheOrdinaryOnes) {
  torch::manual_seed(2);
  torch::Tensor x = torch::randn({2, 3, 8}, torch::kFloat64).requires_grad_(true);
  torch::Tensor w = torch::randn({5, 8}, torch::kFloat64).requires_grad_(true);
  torch::Tensor b = torch::randn({5}, torch::kFloat64).requires_grad_(true);
  const torch::Tensor g = torch::randn({2, 3, 5}, torch::kFloat64);
  torch::Tensor y = InvariantLinear(x, w, b);
  ASSERT_EQ(y.sizes(), torch::IntArrayRef({2, 3, 5}));
  (y * g).sum().backward();
  torch::Tensor x2 = x.detach().clone().requires_grad_(true);
  torch::Tensor w2 = w.detach().clone().requires_grad_(true);
  torch::Tensor b2 = b.detach().clone().requires_grad_(true);
  torch::Tensor y2 = torch::linear(x2, w2, b2);
  (y2 * g).sum().backward();
  EXPECT_TRUE(torch::allclose(y, y2, 1e-12, 1e-12));
  EXPECT_TRUE(torch::allclose(x.grad(), x2.grad(), 1e-12, 1e-12));
  EXPECT_TRUE(torch::allclose(w.grad(), w2.grad(), 1e-12, 1e-12));
  EXPECT_TRUE(torch::allclose(b.grad(), b2.grad(), 1e-12, 1e-12));
}

TEST(BatchInvariantAttentionTest, AQueryIsTheSameBitsAloneInAChunkOrInTheWholeSequence) {
  torch::manual_seed(3);
  const int64_t l = 23, heads = 4, kv_heads = 2, d = 16;
  for (torch::ScalarType dtype : {torch::kFloat32, torch::kBFloat16}) {
    const torch::Tensor q = torch::randn({l, heads, d}).to(dtype);
    const torch::Tensor k = torch::randn({l, kv_heads, d}).to(dtype);
    const torch::Tensor v = torch::randn({l, kv_heads, d}).to(dtype);
    const torch::Tensor full = InvariantCausalAttention(q, k, v);  // the trainer's call
    // Decode steps: query p alone over keys 0..p.
    for (int64_t p = 0; p < l; ++p) {
      const torch::Tensor one = InvariantCausalAttention(q.narrow(0, p, 1), k.narrow(0, 0, p + 1),
                                                         v.narrow(0, 0, p + 1));
      EXPECT_TRUE(torch::equal(one, full.narrow(0, p, 1))) << "position " << p;
    }
    // Chunked prefill: positions [10, 17) over keys 0..16; the last 5 of all 23.
    EXPECT_TRUE(torch::equal(
        InvariantCausalAttention(q.narrow(0, 10, 7), k.narrow(0, 0, 17), v.narrow(0, 0, 17)),
        full.narrow(0, 10, 7)));
    EXPECT_TRUE(torch::equal(InvariantCausalAttention(q.narrow(0, 18, 5), k, v),
                             full.narrow(0, 18, 5)));
    // The ordinary causal attention, within rounding.
    const torch::Tensor want = CausalAttention(q.to(torch::kFloat32), k.to(torch::kFloat32),
                                               v.to(torch::kFloat32), AttentionImpl::kMath);
    EXPECT_LT((full.to(torch::kFloat32) - want).abs().max().item<double>(),
              dtype == torch::kBFloat16 ? 3e-2 : 1e-5)
        << c10::toString(dtype);
  }
}

TEST(BatchInvariantAttentionTest, GradientsAreThoseOfTheMathPath) {
  torch::manual_seed(4);
  torch::Tensor q = torch::randn({6, 4, 8}, torch::kFloat64).requires_grad_(true);
  torch::Tensor k = torch::randn({9, 2, 8}, torch::kFloat64).requires_grad_(true);
  torch::Tensor v = torch::randn({9, 2, 8}, torch::kFloat64).requires_grad_(true);
  const torch::Tensor g = torch::randn({6, 4, 8}, torch::kFloat64);
  (InvariantCausalAttention(q, k, v) * g).sum().backward();
  torch::Tensor q2 = q.detach().clone().requires_grad_(true);
  torch::Tensor k2 = k.detach().clone().requires_grad_(true);
  torch::Tensor v2 = v.detach().clone().requires_grad_(true);
  (CausalAttention(q2, k2, v2, AttentionImpl::kMath) * g).sum().backward();
  EXPECT_TRUE(torch::allclose(q.grad(), q2.grad(), 1e-9, 1e-9));
  EXPECT_TRUE(torch::allclose(k.grad(), k2.grad(), 1e-9, 1e-9));
  EXPECT_TRUE(torch::allclose(v.grad(), v2.grad(), 1e-9, 1e-9));
}

TEST(BatchInvariantSoftmaxTest, RowStatisticsAreRowInvariantAndGiveTheLogSoftmax) {
  torch::manual_seed(5);
  const torch::Tensor z = torch::randn({40, 1000}) * 3;
  const SoftmaxStats all = InvariantSoftmaxStats(z, /*with_entropy=*/true);
  for (int64_t r : {0, 17, 39}) {
    const SoftmaxStats one = InvariantSoftmaxStats(z.narrow(0, r, 1), true);
    EXPECT_TRUE(torch::equal(one.max, all.max.narrow(0, r, 1)));
    EXPECT_TRUE(torch::equal(one.log_sum, all.log_sum.narrow(0, r, 1)));
    EXPECT_TRUE(torch::equal(one.mean_shifted, all.mean_shifted.narrow(0, r, 1)));
  }
  const torch::Tensor targets = torch::randint(0, 1000, {40}, torch::kLong);
  const torch::Tensor want = torch::log_softmax(z.to(torch::kFloat64) / 0.7, -1)
                                 .gather(1, targets.unsqueeze(1))
                                 .squeeze(1);
  const torch::Tensor got = InvariantTokenLogProbs(z, targets, 0.7);
  EXPECT_LT((got.to(torch::kFloat64) - want).abs().max().item<double>(), 1e-4);
  const torch::Tensor p = torch::softmax(z.to(torch::kFloat64), -1);
  const torch::Tensor entropy = -(p * p.log()).sum(-1);
  EXPECT_LT(((all.log_sum - all.mean_shifted).to(torch::kFloat64) - entropy).abs().max()
                .item<double>(),
            1e-4);
}

// ---- The decoder in the mode

class BatchInvariantDecoderTest
    : public ::testing::TestWithParam<std::tuple<std::string, torch::ScalarType>> {};

TEST_P(BatchInvariantDecoderTest, ASequenceIsTheSameBitsPackedAloneAndThroughTheCache) {
  ModeOn mode;
  const auto [arch, dtype] = GetParam();
  const ModelConfig c = TinyConfig(arch);
  auto m = MakeTinyModel(c, dtype, 11);
  ASSERT_NE(m, nullptr);
  testing::ExpectASequenceIsTheSameBitsPackedAloneAndThroughTheCache(*m, c.vocab_size);
}

INSTANTIATE_TEST_SUITE_P(
    Archs, BatchInvariantDecoderTest,
    ::testing::Combine(::testing::Values("qwen2", "qwen3", "llama3"),
                       ::testing::Values(torch::kFloat32, torch::kBFloat16)),
    [](const auto& info) {
      return std::get<0>(info.param) +
             (std::get<1>(info.param) == torch::kFloat32 ? "_fp32" : "_bf16");
    });

}  // namespace
}  // namespace slime::model
