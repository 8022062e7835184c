// Activation recomputation (slime/model/recompute.h) on the CPU in float32:
//   - the plan: which layers each setting recomputes, and the per-stage bound of num_layers;
//   - the decoder's training forward under every setting against no recomputation: the same
//     hidden states and, bitwise, the same gradients of every parameter (and of a pipeline
//     stage's input), with one checkpoint node per recomputed unit in the graph, parameter
//     hooks called once per backward, and nothing recomputed without a graph.
// The trainer under recomputation (TP, PP, the critic) is tests/train/recompute_test.cc.
#include "slime/model/recompute.h"

#include <gtest/gtest.h>
#include <torch/csrc/autograd/function.h>
#include <torch/torch.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "reference_decoder.h"
#include "slime/model/decoder.h"
#include "slime/model/weights.h"
#include "test_util.h"

namespace slime::model {
namespace {

RecomputeOptions Full(RecomputeMethod method, int64_t n) {
  RecomputeOptions o;
  o.granularity = RecomputeGranularity::kFull;
  o.method = method;
  o.num_layers = n;
  return o;
}

RecomputeOptions Selective() {
  RecomputeOptions o;
  o.granularity = RecomputeGranularity::kSelective;
  return o;
}

using Runs = std::vector<LayerRun>;

TEST(RecomputePlanTest, UniformGroupsBlockPrefixesAndTheRest) {
  constexpr auto kUniform = RecomputeMethod::kUniform;
  constexpr auto kBlock = RecomputeMethod::kBlock;
  EXPECT_EQ(RecomputePlan(RecomputeOptions{}, 0, 5), (Runs{{0, 5, false}}));
  EXPECT_EQ(RecomputePlan(Selective(), 2, 5), (Runs{{2, 5, false}}));
  EXPECT_EQ(RecomputePlan(Full(kUniform, 1), 0, 3), (Runs{{0, 1, true}, {1, 2, true}, {2, 3, true}}));
  EXPECT_EQ(RecomputePlan(Full(kUniform, 2), 0, 5), (Runs{{0, 2, true}, {2, 4, true}, {4, 5, true}}));
  EXPECT_EQ(RecomputePlan(Full(kUniform, 3), 4, 7), (Runs{{4, 7, true}}));
  EXPECT_EQ(RecomputePlan(Full(kBlock, 2), 4, 8), (Runs{{4, 5, true}, {5, 6, true}, {6, 8, false}}));
  EXPECT_EQ(RecomputePlan(Full(kBlock, 2), 0, 2), (Runs{{0, 1, true}, {1, 2, true}}));
  EXPECT_TRUE(RecomputePlan(Full(kBlock, 2), 3, 3).empty());
  EXPECT_EQ(RecomputeDescription(Full(kBlock, 2)), "full block 2");
  EXPECT_EQ(RecomputeDescription(Full(kUniform, 1)), "full uniform 1");
  EXPECT_EQ(RecomputeDescription(Selective()), "selective");
  EXPECT_EQ(RecomputeDescription(RecomputeOptions{}), "none");
}

TEST(RecomputePlanTest, NumLayersMustFitTheStage) {
  auto stage = MakePipelineStage(7, 1, 2);  // layers [3, 7)
  ASSERT_TRUE(stage.ok()) << stage.status();
  EXPECT_TRUE(ValidateRecompute(Full(RecomputeMethod::kBlock, 4), *stage, 7).ok());
  EXPECT_TRUE(ValidateRecompute(Full(RecomputeMethod::kUniform, 1), *stage, 7).ok());
  const Status too_many = ValidateRecompute(Full(RecomputeMethod::kUniform, 5), *stage, 7);
  EXPECT_TRUE(absl::IsInvalidArgument(too_many));
  EXPECT_EQ(std::string(too_many.message()),
            "recompute_num_layers = 5 is not within 1..4, the layers of pipeline stage 1 of 2 "
            "(layers [3, 7))");
  EXPECT_FALSE(ValidateRecompute(Full(RecomputeMethod::kBlock, 0), *stage, 7).ok());
  // A whole model (end_layer -1) has all its layers; selective and none take no count.
  EXPECT_TRUE(ValidateRecompute(Full(RecomputeMethod::kBlock, 7), PipelineStage{}, 7).ok());
  EXPECT_FALSE(ValidateRecompute(Full(RecomputeMethod::kBlock, 8), PipelineStage{}, 7).ok());
  RecomputeOptions selective = Selective();
  selective.num_layers = 99;
  EXPECT_TRUE(ValidateRecompute(selective, *stage, 7).ok());
}

// ---- The decoder under recomputation

ModelConfig TinyConfig(const std::string& arch, int64_t layers) {
  const std::string json =
      arch == "qwen2" ? testing::TinyQwen2ConfigJson() : testing::TinyQwen3ConfigJson();
  auto c = ParseModelConfigJson(json, arch + ".json");
  EXPECT_TRUE(c.ok()) << c.status();
  c->num_hidden_layers = layers;
  return *c;
}

// Random weights of `stage` with perturbed norms and biases (so their gradients are not
// special), every parameter requiring grad.
std::unique_ptr<DecoderModel> MakeModel(const ModelConfig& c, const PipelineStage& stage = {}) {
  WeightOptions o;
  o.stage = stage;
  auto w = RandomWeights(c, 9, o);
  EXPECT_TRUE(w.ok()) << w.status();
  if (stage.whole()) testing::PerturbBiasesAndNorms(*w, c, 10);
  auto m = DecoderModel::Create(c, *std::move(w));
  EXPECT_TRUE(m.ok()) << m.status();
  for (NamedTensor& nt : NamedParameters((*m)->weights(), c)) nt.tensor.set_requires_grad(true);
  return *std::move(m);
}

// Autograd nodes reachable from `root` whose name mentions the checkpoint function.
int CountCheckpointNodes(const std::shared_ptr<torch::autograd::Node>& root) {
  std::set<const torch::autograd::Node*> seen;
  std::vector<std::shared_ptr<torch::autograd::Node>> stack{root};
  int count = 0;
  while (!stack.empty()) {
    std::shared_ptr<torch::autograd::Node> n = stack.back();
    stack.pop_back();
    if (n == nullptr || !seen.insert(n.get()).second) continue;
    if (n->name().find("CheckpointFunction") != std::string::npos) ++count;
    for (const torch::autograd::Edge& e : n->next_edges()) stack.push_back(e.function);
  }
  return count;
}

struct Result {
  torch::Tensor hidden;
  std::vector<torch::Tensor> grads;  // NamedParameters order
  torch::Tensor input_grad;          // a later stage's input
  int checkpoint_nodes = 0;
  int hook_calls = 0;  // on the stage's first layer's q_proj
};

// Sequences of 7, 1, 12 and 4 tokens (two attention paths of VarlenAttention: unequal lengths
// here, equal ones in the stage test).
const std::vector<int64_t> kCu = {0, 7, 8, 20, 24};

torch::Tensor Ids(int64_t vocab) {
  return torch::arange(kCu.back(), torch::kLong).mul(17).add(3).remainder(vocab);
}

// A fixed weighting of the output so that every row and column gets its own gradient.
torch::Tensor LossWeights(const torch::Tensor& like) {
  return torch::sin(torch::arange(like.numel(), torch::kFloat32) * 0.37).view(like.sizes());
}

Result ForwardBackward(const ModelConfig& c, const RecomputeOptions& options,
                       const PipelineStage& stage = {}) {
  Result r;
  auto m = MakeModel(c, stage);
  Status set = m->SetRecompute(options);
  EXPECT_TRUE(set.ok()) << set;
  torch::Tensor input = Ids(c.vocab_size);
  if (!stage.is_first()) {
    input = torch::cos(torch::arange(kCu.back() * c.hidden_size, torch::kFloat32) * 0.11)
                .view({kCu.back(), c.hidden_size})
                .requires_grad_(true);
  }
  const torch::Tensor& q0 = m->weights().layers[stage.first_layer].q_proj;
  int* calls = &r.hook_calls;
  q0.register_hook([calls](const torch::Tensor&) { ++*calls; });
  auto h = m->ForwardPacked(input, kCu);
  EXPECT_TRUE(h.ok()) << h.status();
  if (!h.ok()) return r;
  torch::Tensor out = *h;
  if (stage.is_last()) {
    auto logits = m->Logits(*h);
    EXPECT_TRUE(logits.ok()) << logits.status();
    out = torch::log_softmax(*logits, -1);
  }
  r.hidden = h->detach().clone();
  r.checkpoint_nodes = CountCheckpointNodes(h->grad_fn());
  (out * LossWeights(out)).sum().backward();
  for (const NamedTensor& nt : NamedParameters(m->weights(), c)) {
    EXPECT_TRUE(nt.tensor.grad().defined()) << nt.name << " got no gradient";
    r.grads.push_back(nt.tensor.grad().defined() ? nt.tensor.grad().clone() : torch::Tensor());
  }
  if (!stage.is_first()) r.input_grad = input.grad().clone();
  return r;
}

void ExpectSameGradients(const Result& got, const Result& want, const std::string& what) {
  EXPECT_TRUE(torch::equal(got.hidden, want.hidden)) << what << ": hidden states";
  ASSERT_EQ(got.grads.size(), want.grads.size()) << what;
  for (size_t i = 0; i < want.grads.size(); ++i) {
    ASSERT_TRUE(got.grads[i].defined() && want.grads[i].defined()) << what << " param " << i;
    EXPECT_TRUE(torch::equal(got.grads[i], want.grads[i]))
        << what << ": gradient of parameter " << i << " differs by "
        << (got.grads[i] - want.grads[i]).abs().max().item<double>();
    EXPECT_GT(want.grads[i].abs().max().item<double>(), 0.0) << what << " param " << i;
  }
  if (want.input_grad.defined()) {
    ASSERT_TRUE(got.input_grad.defined()) << what;
    EXPECT_TRUE(torch::equal(got.input_grad, want.input_grad)) << what << ": input gradient";
  }
  EXPECT_EQ(got.hook_calls, 1) << what << ": a parameter hook ran more or less than once";
}

struct Case {
  RecomputeOptions options;
  int checkpoint_nodes;  // over 5 layers
};

TEST(DecoderRecomputeTest, EverySettingGivesBitwiseTheSameGradients) {
  const std::vector<Case> cases = {
      {Full(RecomputeMethod::kUniform, 1), 5}, {Full(RecomputeMethod::kUniform, 2), 3},
      {Full(RecomputeMethod::kUniform, 5), 1}, {Full(RecomputeMethod::kBlock, 2), 2},
      {Full(RecomputeMethod::kBlock, 5), 5},   {Selective(), 5},
  };
  for (const std::string arch : {"qwen3", "qwen2"}) {  // q/k norms; q/k/v biases
    const ModelConfig c = TinyConfig(arch, 5);
    const Result plain = ForwardBackward(c, RecomputeOptions{});
    EXPECT_EQ(plain.checkpoint_nodes, 0);
    EXPECT_EQ(plain.hook_calls, 1);
    for (const Case& k : cases) {
      const std::string what = arch + ", " + RecomputeDescription(k.options);
      const Result got = ForwardBackward(c, k.options);
      EXPECT_EQ(got.checkpoint_nodes, k.checkpoint_nodes) << what;
      ExpectSameGradients(got, plain, what);
    }
  }
}

TEST(DecoderRecomputeTest, ALaterPipelineStageGetsTheSameInputGradient) {
  const ModelConfig c = TinyConfig("qwen3", 5);
  auto stage = MakePipelineStage(5, 1, 2);  // layers [2, 5), the last stage
  ASSERT_TRUE(stage.ok()) << stage.status();
  const Result plain = ForwardBackward(c, RecomputeOptions{}, *stage);
  for (const RecomputeOptions& o :
       {Full(RecomputeMethod::kUniform, 2), Full(RecomputeMethod::kBlock, 1), Selective()}) {
    const Result got = ForwardBackward(c, o, *stage);
    EXPECT_GT(got.checkpoint_nodes, 0) << RecomputeDescription(o);
    ExpectSameGradients(got, plain, "stage 1, " + RecomputeDescription(o));
  }
  // The stage has 3 layers: 4 is refused, naming the stage, and the model keeps its setting.
  auto m = MakeModel(c, *stage);
  ASSERT_TRUE(m->SetRecompute(Full(RecomputeMethod::kBlock, 3)).ok());
  const Status refused = m->SetRecompute(Full(RecomputeMethod::kBlock, 4));
  EXPECT_TRUE(absl::IsInvalidArgument(refused));
  EXPECT_NE(std::string(refused.message()).find("not within 1..3"), std::string::npos)
      << refused;
  EXPECT_EQ(m->recompute().num_layers, 3);
}

TEST(DecoderRecomputeTest, NothingIsRecomputedWithoutAGraph) {
  const ModelConfig c = TinyConfig("qwen3", 3);
  auto m = MakeModel(c);
  torch::Tensor want;
  {
    torch::NoGradGuard no_grad;
    want = *m->ForwardPacked(Ids(c.vocab_size), kCu);
  }
  ASSERT_TRUE(m->SetRecompute(Full(RecomputeMethod::kUniform, 1)).ok());
  torch::NoGradGuard no_grad;
  auto got = m->ForwardPacked(Ids(c.vocab_size), kCu);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FALSE(got->requires_grad());
  EXPECT_TRUE(torch::equal(*got, want));
}

// The recomputed region's saved input is version-checked like any saved tensor: changing it in
// place between forward and backward fails the backward instead of giving wrong gradients.
TEST(DecoderRecomputeTest, AnInputChangedBeforeTheBackwardFailsIt) {
  const ModelConfig c = TinyConfig("qwen3", 2);
  auto stage = MakePipelineStage(2, 1, 2);
  ASSERT_TRUE(stage.ok());
  auto m = MakeModel(c, *stage);
  ASSERT_TRUE(m->SetRecompute(Full(RecomputeMethod::kUniform, 1)).ok());
  torch::Tensor x = torch::ones({4, c.hidden_size}).requires_grad_(true);
  torch::Tensor input = x * 2;  // not a leaf: may be changed in place
  auto h = m->ForwardPacked(input, {0, 4});
  ASSERT_TRUE(h.ok()) << h.status();
  {
    torch::NoGradGuard no_grad;
    input.add_(1);
  }
  EXPECT_THROW(h->sum().backward(), c10::Error);
}

}  // namespace
}  // namespace slime::model
