// The feed-forward block seam (slime/model/ffn/): the block table, the dense block's parameter
// specs and slots, block tensors addressed through ParamSlot, the projection fusion as views and
// the eager forward against its formula. The decoder's results through the block are checked
// against the independent reference in decoder_test.cc and against transformers in
// hf_fixture_test.cc.
#include "slime/model/ffn/feed_forward.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "slime/model/ffn/dense_mlp.h"
#include "slime/model/tensor_parallel.h"
#include "slime/model/weights.h"
#include "test_util.h"
#include "tiny_model.h"

namespace slime::model {
namespace {

using testing::TinyConfig;

TEST(FeedForwardTest, EveryLayerOfTheSupportedArchitecturesIsDense) {
  for (const char* arch : {"qwen2", "qwen3", "llama3"}) {
    const ModelConfig c = TinyConfig(arch);
    for (int l = 0; l < c.num_hidden_layers; ++l) {
      EXPECT_EQ(FeedForwardName(c, l), "dense") << arch << " layer " << l;
      EXPECT_EQ(FeedForwardFor(c, l).name(), "dense") << arch << " layer " << l;
      EXPECT_NE(dynamic_cast<const DenseMlp*>(&FeedForwardFor(c, l)), nullptr);
    }
  }
}

// The block's specs sit where HF lists them (after the attention, before the layer norms) and
// name the block's slots; ParamSlot reaches exactly those tensors.
TEST(FeedForwardTest, DenseSpecsAreTheHfMlpTensorsAtTheirSlots) {
  const ModelConfig c = TinyConfig("llama3");
  const std::vector<ParamSpec> specs = ParameterSpecs(c);
  auto w = RandomWeights(c, 3, {});
  ASSERT_TRUE(w.ok()) << w.status();
  struct Want {
    std::string name;
    std::vector<int64_t> shape;
    ShardDim shard;
    int slot;
  };
  const int64_t h = c.hidden_size, inter = c.intermediate_size;
  const std::vector<Want> want = {
      {"model.layers.1.mlp.gate_proj.weight", {inter, h}, ShardDim::kRows, DenseMlp::kGateProj},
      {"model.layers.1.mlp.up_proj.weight", {inter, h}, ShardDim::kRows, DenseMlp::kUpProj},
      {"model.layers.1.mlp.down_proj.weight", {h, inter}, ShardDim::kColumns, DenseMlp::kDownProj},
  };
  size_t at = 0;
  while (at < specs.size() && specs[at].hf_name != want[0].name) ++at;
  ASSERT_LT(at + want.size(), specs.size());
  EXPECT_EQ(specs[at - 1].hf_name, "model.layers.1.self_attn.o_proj.bias");
  EXPECT_EQ(specs[at + want.size()].hf_name, "model.layers.1.input_layernorm.weight");
  for (size_t i = 0; i < want.size(); ++i) {
    const ParamSpec& spec = specs[at + i];
    EXPECT_EQ(spec.hf_name, want[i].name);
    EXPECT_EQ(spec.shape, want[i].shape);
    EXPECT_EQ(spec.shard, want[i].shard);
    EXPECT_EQ(spec.init, ParamInit::kNormal);
    EXPECT_EQ(spec.layer, 1);
    EXPECT_EQ(spec.block_slot, want[i].slot);
    EXPECT_EQ(spec.layer_slot, nullptr);
    EXPECT_EQ(&ParamSlot(*w, spec), &w->layers[1].ffn.params[want[i].slot]) << spec.hf_name;
    EXPECT_EQ(ParamSlot(*w, spec).sizes(), c10::IntArrayRef(want[i].shape));
  }
  EXPECT_EQ(w->layers[1].ffn.params.size(), 3u);
  EXPECT_TRUE(w->layers[1].ffn.fused.empty());
}

// Loading fills the block's tensors in spec order while callers keep pointers to those already
// filled (the trainer's checkpoint load does); an absent slot reads as unset.
TEST(FeedForwardTest, ParamSlotGrowsBlockSlotsWithoutMovingTensors) {
  const ModelConfig c = TinyConfig("qwen3");
  ModelWeights w;
  w.layers.resize(c.num_hidden_layers);
  std::vector<ParamSpec> mlp;
  for (const ParamSpec& spec : ParameterSpecs(c)) {
    if (spec.layer == 0 && spec.block_slot >= 0) mlp.push_back(spec);
  }
  ASSERT_EQ(mlp.size(), 3u);
  const ModelWeights& cw = w;
  EXPECT_FALSE(ParamSlot(cw, mlp[2]).defined()) << "a slot not there yet reads as unset";
  EXPECT_TRUE(cw.layers[0].ffn.params.empty()) << "reading does not grow";
  std::vector<torch::Tensor*> held;
  for (size_t i = 0; i < mlp.size(); ++i) {
    torch::Tensor* slot = &ParamSlot(w, mlp[i]);
    *slot = torch::full({1}, static_cast<float>(i));
    held.push_back(slot);
  }
  for (size_t i = 0; i < held.size(); ++i) {
    EXPECT_EQ(held[i], &w.layers[0].ffn.params[mlp[i].block_slot]);
    EXPECT_EQ(held[i]->item<float>(), static_cast<float>(i));
  }
}

TEST(DenseMlpTest, FuseProjectionsStacksGateOverUpAsViewsAndUnfuseSeparatesThem) {
  const ModelConfig c = TinyConfig("qwen2");
  auto w = RandomWeights(c, 11, {});
  ASSERT_TRUE(w.ok()) << w.status();
  const DenseMlp& block = dynamic_cast<const DenseMlp&>(FeedForwardFor(c, 0));
  FeedForwardWeights& ffn = w->layers[0].ffn;
  const torch::Tensor gate = ffn.params[DenseMlp::kGateProj].clone();
  const torch::Tensor up = ffn.params[DenseMlp::kUpProj].clone();
  const torch::Tensor down = ffn.params[DenseMlp::kDownProj];
  torch::NoGradGuard no_grad;
  block.FuseProjections(ffn);
  ASSERT_EQ(ffn.fused.size(), 1u);
  const torch::Tensor gate_up = ffn.fused[DenseMlp::kGateUpProj];
  EXPECT_EQ(gate_up.sizes(), (c10::IntArrayRef{2 * c.intermediate_size, c.hidden_size}));
  EXPECT_TRUE(torch::equal(gate_up, torch::cat({gate, up}, 0)));
  EXPECT_TRUE(torch::equal(ffn.params[DenseMlp::kGateProj], gate));
  EXPECT_TRUE(torch::equal(ffn.params[DenseMlp::kUpProj], up));
  EXPECT_TRUE(ffn.params[DenseMlp::kDownProj].is_same(down)) << "down is not stacked";
  // In-place updates of a projection reach the stacked weight, and the other way round.
  ffn.params[DenseMlp::kUpProj].fill_(2.0);
  EXPECT_TRUE(torch::equal(gate_up.narrow(0, c.intermediate_size, c.intermediate_size),
                           torch::full_like(up, 2.0)));
  gate_up.narrow(0, 0, 1).fill_(3.0);
  EXPECT_TRUE(torch::equal(ffn.params[DenseMlp::kGateProj][0], torch::full_like(gate[0], 3.0)));

  block.UnfuseProjections(ffn);
  EXPECT_TRUE(ffn.fused.empty());
  EXPECT_NE(ffn.params[DenseMlp::kGateProj].data_ptr(), gate_up.data_ptr());
  EXPECT_TRUE(torch::equal(ffn.params[DenseMlp::kUpProj], torch::full_like(up, 2.0)));
  gate_up.fill_(0.0);  // the old buffer no longer backs the projections
  EXPECT_TRUE(torch::equal(ffn.params[DenseMlp::kUpProj], torch::full_like(up, 2.0)));
  EXPECT_FALSE(torch::equal(ffn.params[DenseMlp::kGateProj], torch::zeros_like(gate)));
}

TEST(DenseMlpTest, ForwardIsDownOfSiluGateTimesUp) {
  const ModelConfig c = TinyConfig("llama3");
  auto w = RandomWeights(c, 4, {});
  ASSERT_TRUE(w.ok()) << w.status();
  const FeedForwardWeights& ffn = w->layers[1].ffn;
  std::shared_ptr<TensorParallelGroup> tp = MakeSingleRankGroup();
  const FeedForwardContext ctx{c, 1, *tp, false};
  const torch::Tensor h = torch::randn({5, c.hidden_size}, torch::kFloat32);
  const torch::Tensor y = FeedForwardFor(c, 1).Forward(ffn, h, ctx);
  const torch::Tensor gate = torch::linear(h, ffn.params[DenseMlp::kGateProj]);
  const torch::Tensor up = torch::linear(h, ffn.params[DenseMlp::kUpProj]);
  const torch::Tensor want = torch::linear(torch::silu(gate) * up, ffn.params[DenseMlp::kDownProj]);
  EXPECT_EQ(y.sizes(), (c10::IntArrayRef{5, c.hidden_size}));
  EXPECT_TRUE(torch::equal(y, want));
}

TEST(FeedForwardTest, NumParametersCountsTheBlockParameters) {
  const ModelConfig c = TinyConfig("qwen3");
  int64_t mlp = 0;
  for (const ParamSpec& spec : ParameterSpecs(c)) {
    if (spec.block_slot >= 0) mlp += spec.shape[0] * spec.shape[1];
  }
  EXPECT_EQ(mlp, c.num_hidden_layers * 3 * c.hidden_size * c.intermediate_size);
  auto w = RandomWeights(c, 1, {});
  ASSERT_TRUE(w.ok()) << w.status();
  int64_t stored = 0;
  for (const NamedTensor& nt : NamedParameters(*w, c)) stored += nt.tensor.numel();
  EXPECT_EQ(c.NumParameters(), stored);
}

}  // namespace
}  // namespace slime::model
