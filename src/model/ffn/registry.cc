// The feed-forward block table and the pieces every block shares (see
// include/slime/model/ffn/feed_forward.h). A new kind of block is one row of kBlocks, and its
// layers are named in FeedForwardName.
#include <fmt/format.h>
#include <torch/torch.h>

#include <cstdlib>
#include <string>

#include "slime/common/check.h"
#include "slime/model/ffn/dense_mlp.h"
#include "slime/model/ffn/feed_forward.h"
#include "slime/model/ffn/moe.h"

namespace slime::model {
namespace {

// Blocks are stateless: one instance of each, built on first use.
template <typename Block>
const FeedForwardBlock& Instance() {
  static const Block block;
  return block;
}

struct BlockRow {
  std::string_view name;
  const FeedForwardBlock& (*block)();
};

constexpr BlockRow kBlocks[] = {
    {"dense", &Instance<DenseMlp>},
    {"moe", &Instance<MoeBlock>},
};

}  // namespace

std::string_view FeedForwardName(const ModelConfig& config, int layer) {
  return config.moe.IsSparseLayer(layer) ? "moe" : "dense";
}

const FeedForwardBlock& FeedForwardFor(const ModelConfig& config, int layer) {
  const std::string_view name = FeedForwardName(config, layer);
  for (const BlockRow& row : kBlocks) {
    if (row.name == name) return row.block();
  }
  SLIME_CHECK(false, "layer {} names the feed-forward block '{}', which is not in the table", layer,
              std::string(name));
  std::abort();  // not reached
}

ParamSpec FeedForwardParam(int layer, std::string_view suffix, std::vector<int64_t> shape,
                           ShardDim shard, ParamInit init, int slot) {
  ParamSpec s;
  s.hf_name = fmt::format("model.layers.{}.mlp.{}", layer, suffix);
  s.shape = std::move(shape);
  s.shard = shard;
  s.init = init;
  s.layer = layer;
  s.block_slot = slot;
  return s;
}

torch::Tensor FeedForwardContext::RowParallel(const torch::Tensor& x, const torch::Tensor& weight,
                                              const torch::Tensor& bias) const {
  return sequence_parallel ? RowParallelLinearToSequenceShard(x, weight, bias, tp)
                           : RowParallelLinear(x, weight, bias, tp);
}

torch::Tensor FeedForwardContext::ReducePartial(const torch::Tensor& partial) const {
  return sequence_parallel ? ReduceScatterToSequenceParallelRegion(partial, tp)
                           : ReduceFromTensorParallelRegion(partial, tp);
}

}  // namespace slime::model
