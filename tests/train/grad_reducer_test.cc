// GradReducer (train/grad_reducer.h): the data-parallel gradient sum overlapped with the last
// backward pass of a step. Over two real Gloo ranks (threads, multi_rank_harness.h) on a small
// four-layer chain: the last layers' buckets are posted from the backward pass before it
// reaches the first layer and the first layer's after; every gradient equals the synchronous
// all-reduce of the accumulated gradients bit for bit, for a parameter the last pass does not
// reach and one no pass reaches too; the reducer re-arms for the next step. Without a group: a
// failed post is reported by Finish and the next step works; bad arguments are refused.
//
// Built twice: on the CPU (label unit) and with SLIME_GRAD_REDUCER_GPU_TEST on cuda:0 (label
// gpu; skips without CUDA), where the backward pass and so the hooks run on the autograd
// engine's CUDA thread and the Gloo all-reduce copies through host memory.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "multi_rank_harness.h"
#include "slime/train/grad_reducer.h"

namespace slime::train {
namespace {

#ifdef SLIME_GRAD_REDUCER_GPU_TEST
#define SKIP_WITHOUT_DEVICE() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device"
torch::Device TestDevice() { return torch::Device(torch::kCUDA, 0); }
#else
#define SKIP_WITHOUT_DEVICE() (void)0
torch::Device TestDevice() { return torch::kCPU; }
#endif

// Deterministic values without the global generator (ranks are threads).
torch::Tensor Wave(const std::vector<int64_t>& shape, double frequency, double scale) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return (torch::sin(torch::arange(n, torch::kFloat64) * frequency + 0.3) * scale)
      .to(torch::kFloat32)
      .reshape(shape)
      .to(TestDevice());
}

constexpr int kLayers = 4;
constexpr int64_t kWidth = 8;

// u: used by the first micro-batch only; z: used by none; w0..w3: the chain's layers.
std::vector<torch::Tensor> MakeParams() {
  std::vector<torch::Tensor> p;
  p.push_back(Wave({kWidth}, 0.9, 0.5));  // u
  p.push_back(Wave({3}, 1.3, 0.5));       // z
  for (int k = 0; k < kLayers; ++k) p.push_back(Wave({kWidth, kWidth}, 0.5 + 0.1 * k, 0.4));
  for (torch::Tensor& t : p) t.set_requires_grad(true);
  return p;
}

std::vector<torch::Tensor> Clones(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const torch::Tensor& t : params) out.push_back(t.detach().clone().set_requires_grad(true));
  return out;
}

// One micro-batch's forward and backward on `rank` at `step`. `reached_first_layer` (optional)
// runs when the backward pass has gone through layers 3..1 and reaches layer 0.
void ForwardBackward(const std::vector<torch::Tensor>& p, int rank, int step, int micro_batch,
                     const std::function<void()>& reached_first_layer = nullptr) {
  torch::Tensor h = Wave({4, kWidth}, 0.21 + 0.07 * rank + 0.05 * step + 0.03 * micro_batch, 1.0);
  if (micro_batch == 0) h = h + p[0];
  for (int k = 0; k < kLayers; ++k) {
    h = torch::tanh(h.mm(p[2 + k]));
    if (k == 0 && reached_first_layer) {
      h.register_hook([reached_first_layer](const torch::Tensor&) { reached_first_layer(); });
    }
  }
  (h * h).sum().backward();
}

// The reference: both micro-batches, then every gradient (zeros where none) summed over the
// group synchronously.
std::vector<torch::Tensor> SynchronousGrads(const std::vector<torch::Tensor>& params,
                                            comm::ProcessGroup& dp, int rank, int step) {
  std::vector<torch::Tensor> p = Clones(params);
  ForwardBackward(p, rank, step, 0);
  ForwardBackward(p, rank, step, 1);
  std::vector<torch::Tensor> out;
  for (torch::Tensor& t : p) {
    torch::Tensor g = t.grad().defined() ? t.grad().clone() : torch::zeros_like(t);
    Status s = dp.AllReduceSum(g, "reference");
    EXPECT_TRUE(s.ok()) << s;
    out.push_back(g);
  }
  return out;
}

TEST(GradReducerTest, PostsBucketsDuringTheLastBackwardPassAndSumsLikeTheSynchronousPath) {
  SKIP_WITHOUT_DEVICE();
  test_util::RunGrid(1, 2, "overlap", [&](const test_util::GridRank& g) {
    std::vector<torch::Tensor> params = MakeParams();
    std::mutex mu;
    std::vector<std::string> events;  // in order: "post <numel>", "first layer"
    auto note = [&](const std::string& e) {
      std::lock_guard<std::mutex> lock(mu);
      events.push_back(e);
    };
    std::shared_ptr<comm::ProcessGroup> dp = g.dp;
    // Buckets of <= 64 elements in reverse order: w3, w2, w1, w0, {z, u}.
    auto reducer = GradReducer::Create(params, kWidth * kWidth, [&, dp](torch::Tensor& t) {
      note("post " + std::to_string(t.numel()));
      return dp->AllReduceSumAsync(t, "bucket");
    });
    ASSERT_TRUE(reducer.ok()) << reducer.status();
    EXPECT_EQ((*reducer)->num_buckets(), 5u);

    for (int step = 0; step < 2; ++step) {
      const std::vector<torch::Tensor> want = SynchronousGrads(params, *dp, g.rank, step);
      events.clear();
      ForwardBackward(params, g.rank, step, 0);
      EXPECT_TRUE(events.empty()) << "a pass before Arm posted " << events.front();
      (*reducer)->Arm();
      ForwardBackward(params, g.rank, step, 1, [&] { note("first layer"); });
      const std::vector<std::string> during = events;
      Status finished = (*reducer)->Finish();
      ASSERT_TRUE(finished.ok()) << finished;

      // w3 (the first bucket) went before the pass reached layer 0, w0 after it; {z, u} only
      // in Finish.
      ASSERT_EQ(during.size(), 5u) << "step " << step;
      const auto first_layer = std::find(during.begin(), during.end(), "first layer");
      ASSERT_NE(first_layer, during.end());
      EXPECT_EQ(during.front(), "post 64");
      EXPECT_GT(first_layer - during.begin(), 0);
      EXPECT_EQ(during.back(), "post 64") << "w0's bucket, after the pass reached layer 0";
      EXPECT_EQ(events.back(), "post 11") << "{z, u}, posted by Finish";
      EXPECT_EQ((*reducer)->posted_during_backward(), 4);

      for (size_t i = 0; i < params.size(); ++i) {
        ASSERT_TRUE(params[i].grad().defined()) << "parameter " << i;
        EXPECT_TRUE(torch::equal(params[i].grad(), want[i])) << "step " << step << " parameter " << i;
      }
      EXPECT_TRUE(torch::equal(params[1].grad(), torch::zeros_like(params[1])));
      for (torch::Tensor& p : params) p.mutable_grad() = torch::Tensor();  // the optimizer's part
    }
  });
}

TEST(GradReducerTest, AFailedPostIsReportedByFinishAndTheNextStepWorks) {
  SKIP_WITHOUT_DEVICE();
  std::vector<torch::Tensor> params = MakeParams();
  int posts = 0;
  auto reducer = GradReducer::Create(
      params, kWidth * kWidth, [&posts](torch::Tensor&) -> StatusOr<std::function<Status()>> {
        if (++posts == 2) return absl::UnavailableError("peer gone");
        return std::function<Status()>([] { return absl::OkStatus(); });  // one rank: the sum
      });
  ASSERT_TRUE(reducer.ok()) << reducer.status();
  (*reducer)->Arm();
  ForwardBackward(params, 0, 0, 1);
  Status failed = (*reducer)->Finish();
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(failed.message().find("posting bucket 1 of 5: peer gone"), std::string::npos) << failed;
  EXPECT_EQ(posts, 2) << "no post after the failed one";

  for (torch::Tensor& p : params) p.mutable_grad() = torch::Tensor();
  const std::vector<torch::Tensor> p2 = Clones(params);
  ForwardBackward(p2, 0, 1, 1);
  (*reducer)->Arm();
  ForwardBackward(params, 0, 1, 1);
  Status ok = (*reducer)->Finish();
  ASSERT_TRUE(ok.ok()) << ok;
  EXPECT_EQ(posts, 7);
  for (size_t i = 2; i < params.size(); ++i) {
    EXPECT_TRUE(torch::equal(params[i].grad(), p2[i].grad())) << "parameter " << i;
  }
  EXPECT_FALSE((*reducer)->Finish().ok()) << "Finish without Arm";
}

TEST(GradReducerTest, BadArgumentsAreRefused) {
  SKIP_WITHOUT_DEVICE();
  const std::vector<torch::Tensor> params = MakeParams();
  AsyncAllReduceSumFn fn = [](torch::Tensor&) -> StatusOr<std::function<Status()>> {
    return std::function<Status()>([] { return absl::OkStatus(); });
  };
  auto zero = GradReducer::Create(params, 0, fn);
  EXPECT_EQ(zero.status().message(),
            "overlapped gradient all-reduce: bucket size 0 is out of range (valid: >= 1 elements)");
  auto none = GradReducer::Create(params, 64, nullptr);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  std::vector<torch::Tensor> frozen = params;
  frozen[3] = frozen[3].detach();
  auto bad = GradReducer::Create(frozen, 64, fn);
  EXPECT_EQ(bad.status().message(),
            "overlapped gradient all-reduce: parameter 3 is not a leaf that requires grad");
}

}  // namespace
}  // namespace slime::train
