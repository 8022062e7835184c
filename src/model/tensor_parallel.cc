// Parallel layers (see include/slime/model/tensor_parallel.h) and the pipeline stage split
// (include/slime/model/pipeline_parallel.h).
#include "slime/model/tensor_parallel.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <vector>

#include "slime/model/batch_invariant.h"
#include "slime/model/pipeline_parallel.h"

namespace slime::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The group travels through the autograd context as an integer (it outlives the backward:
// DecoderModel owns it, and a step's backward runs before the model goes away).
void SaveGroup(AutogradContext* ctx, TensorParallelGroup* group) {
  ctx->saved_data["group"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(group));
}
TensorParallelGroup& LoadGroup(AutogradContext* ctx) {
  return *reinterpret_cast<TensorParallelGroup*>(
      static_cast<intptr_t>(ctx->saved_data["group"].toInt()));
}

// Megatron's copy-to-region: identity forward, all-reduce of the gradient backward.
class CopyToRegion : public torch::autograd::Function<CopyToRegion> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, TensorParallelGroup* group) {
    SaveGroup(ctx, group);
    return x;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    torch::Tensor g = grads[0].contiguous().clone();
    LoadGroup(ctx).AllReduceSum(g);
    return {g, torch::Tensor()};
  }
};

// Megatron's reduce-from-region: all-reduce forward, identity backward.
class ReduceFromRegion : public torch::autograd::Function<ReduceFromRegion> {
 public:
  static torch::Tensor forward(AutogradContext* /*ctx*/, torch::Tensor x,
                               TensorParallelGroup* group) {
    torch::Tensor y = x.contiguous().clone();
    group->AllReduceSum(y);
    return y;
  }
  static variable_list backward(AutogradContext* /*ctx*/, variable_list grads) {
    return {grads[0], torch::Tensor()};
  }
};

// Megatron's gather-from-region along the last dim: all-gather forward, this rank's slice of
// the gradient backward.
class GatherFromRegion : public torch::autograd::Function<GatherFromRegion> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, TensorParallelGroup* group) {
    SaveGroup(ctx, group);
    ctx->saved_data["local"] = x.size(-1);
    return group->AllGather(x.contiguous(), x.dim() - 1);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const int64_t local = ctx->saved_data["local"].toInt();
    const int64_t rank = LoadGroup(ctx).rank();
    const torch::Tensor& g = grads[0];
    return {g.narrow(g.dim() - 1, rank * local, local).contiguous(), torch::Tensor()};
  }
};

// ---- sequence parallelism: padded collectives along dim 0 (T need not divide by P)

// Every rank's shard, padded to the largest, all-gathered and unpadded: [total, ...].
torch::Tensor AllGatherRows(const torch::Tensor& shard, int64_t total, TensorParallelGroup& group) {
  const int p = group.size();
  const int64_t pad = (total + p - 1) / p;
  std::vector<int64_t> shape = shard.sizes().vec();
  shape[0] = pad;
  torch::Tensor padded = torch::zeros(shape, shard.options());
  padded.narrow(0, 0, shard.size(0)).copy_(shard);
  torch::Tensor all = group.AllGather(padded, 0);  // [p * pad, ...]
  std::vector<torch::Tensor> parts;
  for (int r = 0; r < p; ++r) {
    parts.push_back(all.narrow(0, r * pad, SequenceShardOf(total, p, r).rows));
  }
  return torch::cat(parts, 0);
}

// The sum over ranks of full [total, ...] tensors, this rank's rows of it.
torch::Tensor ReduceScatterRows(const torch::Tensor& full, TensorParallelGroup& group) {
  const int p = group.size();
  const int64_t total = full.size(0);
  const int64_t pad = (total + p - 1) / p;
  torch::Tensor send;
  if (pad * p == total) {
    send = full.contiguous();
  } else {
    std::vector<int64_t> shape = full.sizes().vec();
    shape[0] = pad * p;
    send = torch::zeros(shape, full.options());
    for (int r = 0; r < p; ++r) {
      const SequenceShard s = SequenceShardOf(total, p, r);
      send.narrow(0, r * pad, s.rows).copy_(full.narrow(0, s.start, s.rows));
    }
  }
  torch::Tensor mine = group.ReduceScatterSum(send);  // [pad, ...]
  return mine.narrow(0, 0, SequenceShardOf(total, p, group.rank()).rows);
}

torch::Tensor MyRows(const torch::Tensor& full, TensorParallelGroup& group) {
  const SequenceShard s = SequenceShardOf(full.size(0), group.size(), group.rank());
  return full.narrow(0, s.start, s.rows);
}

class GatherFromSequence : public torch::autograd::Function<GatherFromSequence> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, TensorParallelGroup* group,
                               int64_t total, bool reduce_grad) {
    SaveGroup(ctx, group);
    ctx->saved_data["reduce"] = reduce_grad;
    return AllGatherRows(x, total, *group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    TensorParallelGroup& group = LoadGroup(ctx);
    torch::Tensor g = ctx->saved_data["reduce"].toBool() ? ReduceScatterRows(grads[0], group)
                                                         : MyRows(grads[0], group).contiguous();
    return {g, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

class ReduceScatterToSequence : public torch::autograd::Function<ReduceScatterToSequence> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, TensorParallelGroup* group) {
    SaveGroup(ctx, group);
    ctx->saved_data["total"] = x.size(0);
    return ReduceScatterRows(x, *group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {AllGatherRows(grads[0].contiguous(), ctx->saved_data["total"].toInt(), LoadGroup(ctx)),
            torch::Tensor()};
  }
};

class ScatterToSequence : public torch::autograd::Function<ScatterToSequence> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, TensorParallelGroup* group) {
    SaveGroup(ctx, group);
    ctx->saved_data["total"] = x.size(0);
    return MyRows(x, *group).clone();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {AllGatherRows(grads[0].contiguous(), ctx->saved_data["total"].toInt(), LoadGroup(ctx)),
            torch::Tensor()};
  }
};

// Whether the op must be recorded for autograd (else the plain collective suffices).
bool Differentiable(const at::Tensor& x) {
  return x.requires_grad() && torch::GradMode::is_enabled();
}

// ReduceFromRegion of a tensor the caller owns (a fresh op output): in place when no graph is
// recorded (the inference path pays no copy).
at::Tensor ReduceOwned(at::Tensor fresh, TensorParallelGroup& group) {
  if (group.size() == 1) return fresh;
  if (Differentiable(fresh)) return ReduceFromRegion::apply(fresh, &group);
  if (!fresh.is_contiguous()) fresh = fresh.contiguous();
  group.AllReduceSum(fresh);
  return fresh;
}

}  // namespace

at::Tensor TensorParallelGroup::ReduceScatterSum(const at::Tensor& tensor) {
  at::Tensor sum = tensor.contiguous().clone();
  AllReduceSum(sum);
  const int64_t chunk = sum.size(0) / size();
  return sum.narrow(0, chunk * rank(), chunk).clone();
}

SequenceShard SequenceShardOf(int64_t total, int size, int rank) {
  const int64_t base = total / size, extra = total % size;
  SequenceShard s;
  s.rows = base + (rank < extra ? 1 : 0);
  s.start = rank * base + std::min<int64_t>(rank, extra);
  return s;
}

void SingleRankGroup::AllReduceSum(at::Tensor& /*tensor*/) {}

at::Tensor SingleRankGroup::AllGather(const at::Tensor& tensor, int64_t /*dim*/) { return tensor; }

std::shared_ptr<TensorParallelGroup> MakeSingleRankGroup() {
  return std::make_shared<SingleRankGroup>();
}

at::Tensor CopyToTensorParallelRegion(const at::Tensor& x, TensorParallelGroup& group) {
  if (group.size() == 1 || !Differentiable(x)) return x;
  return CopyToRegion::apply(x, &group);
}

at::Tensor ReduceFromTensorParallelRegion(const at::Tensor& x, TensorParallelGroup& group) {
  if (group.size() == 1) return x;
  if (!Differentiable(x)) {
    at::Tensor y = x.contiguous();
    if (y.data_ptr() == x.data_ptr()) y = y.clone();
    group.AllReduceSum(y);
    return y;
  }
  return ReduceFromRegion::apply(x, &group);
}

at::Tensor GatherFromTensorParallelRegion(const at::Tensor& x, TensorParallelGroup& group) {
  if (group.size() == 1) return x;
  if (!Differentiable(x)) return group.AllGather(x.contiguous(), x.dim() - 1);
  return GatherFromRegion::apply(x, &group);
}

at::Tensor GatherFromSequenceParallelRegion(const at::Tensor& x, TensorParallelGroup& group,
                                            int64_t total_rows, bool reduce_grad) {
  if (group.size() == 1) return x;
  if (!Differentiable(x)) return AllGatherRows(x.contiguous(), total_rows, group);
  return GatherFromSequence::apply(x, &group, total_rows, reduce_grad);
}

at::Tensor ReduceScatterToSequenceParallelRegion(const at::Tensor& x, TensorParallelGroup& group) {
  if (group.size() == 1) return x;
  if (!Differentiable(x)) return ReduceScatterRows(x, group);
  return ReduceScatterToSequence::apply(x, &group);
}

at::Tensor ScatterToSequenceParallelRegion(const at::Tensor& x, TensorParallelGroup& group) {
  if (group.size() == 1) return x;
  if (!Differentiable(x)) return MyRows(x, group);
  return ScatterToSequence::apply(x, &group);
}

at::Tensor ColumnParallelLinear(const at::Tensor& x, const at::Tensor& weight,
                                const at::Tensor& bias, TensorParallelGroup& group,
                                bool gather_output, bool input_in_region) {
  // x [..., in] · W_r^T [in, out/P] -> [..., out/P]
  const at::Tensor in = input_in_region ? x : CopyToTensorParallelRegion(x, group);
  at::Tensor y = Linear(in, weight, bias);
  if (gather_output) y = GatherFromTensorParallelRegion(y, group);
  return y;
}

at::Tensor RowParallelLinear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                             TensorParallelGroup& group) {
  // Partial sums [..., out] from this rank's slice of the input features, summed over ranks;
  // the bias is added once, after the sum.
  at::Tensor y = ReduceOwned(Linear(x, weight), group);
  if (bias.defined()) y = y + bias;
  return y;
}

at::Tensor RowParallelLinearToSequenceShard(const at::Tensor& x, const at::Tensor& weight,
                                            const at::Tensor& bias, TensorParallelGroup& group) {
  at::Tensor y = ReduceScatterToSequenceParallelRegion(Linear(x, weight), group);
  if (bias.defined()) y = y + CopyToTensorParallelRegion(bias, group);
  return y;
}

namespace {
// This rank's vocabulary rows of the embedding for every id, zero where another rank owns it.
at::Tensor PartialEmbedding(const at::Tensor& ids, const at::Tensor& weight,
                            TensorParallelGroup& group) {
  const int64_t rows = weight.size(0);
  const int64_t start = rows * group.rank();
  at::Tensor local = ids - start;
  at::Tensor mine = (local >= 0) & (local < rows);  // [T]
  at::Tensor out = weight.index_select(0, torch::where(mine, local, torch::zeros_like(local)));
  return out * mine.unsqueeze(1).to(out.scalar_type());
}
}  // namespace

at::Tensor VocabParallelEmbeddingToSequenceShard(const at::Tensor& ids, const at::Tensor& weight,
                                                 TensorParallelGroup& group) {
  if (group.size() == 1) return weight.index_select(0, ids);
  return ReduceScatterToSequenceParallelRegion(PartialEmbedding(ids, weight, group), group);
}

at::Tensor VocabParallelEmbedding(const at::Tensor& ids, const at::Tensor& weight,
                                  TensorParallelGroup& group) {
  if (group.size() == 1) return weight.index_select(0, ids);  // [T, hidden]
  // Ids owned by another rank read row 0 and are zeroed; the all-reduce fills them in. The
  // gradient of the sum is the output's gradient (replicated), masked to this rank's rows.
  return ReduceOwned(PartialEmbedding(ids, weight, group), group);
}

at::Tensor VocabParallelLmHead(const at::Tensor& hidden, const at::Tensor& weight,
                               TensorParallelGroup& group, bool gather_output) {
  return ColumnParallelLinear(hidden, weight, at::Tensor(), group, gather_output);
}

// ---- Pipeline stages

StatusOr<PipelineStage> MakePipelineStage(int64_t num_layers, int rank, int size) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(fmt::format(
        "pipeline stage {} of {}: need at least one stage and 0 <= stage < stages", rank, size));
  }
  if (num_layers < size) {
    return absl::InvalidArgumentError(fmt::format(
        "pipeline_model_parallel_size = {} is larger than the model's {} decoder layers "
        "(num_hidden_layers): every stage needs at least one layer",
        size, num_layers));
  }
  PipelineStage s;
  s.rank = rank;
  s.size = size;
  s.first_layer = num_layers * rank / size;
  s.end_layer = size == 1 ? -1 : num_layers * (rank + 1) / size;
  return s;
}

namespace {
Status NoPeer(const char* op, int peer) {
  return absl::FailedPreconditionError(fmt::format(
      "pipeline {} with stage {}: this pipeline has one stage, there is no peer", op, peer));
}
}  // namespace

Status SinglePipelineStage::Send(const at::Tensor& /*tensor*/, int dst) { return NoPeer("send", dst); }
Status SinglePipelineStage::Recv(at::Tensor& /*tensor*/, int src) { return NoPeer("recv", src); }
Status SinglePipelineStage::SendRecv(const at::Tensor& /*send*/, int dst, at::Tensor& /*recv*/,
                                     int /*src*/) {
  return NoPeer("send-recv", dst);
}
Status SinglePipelineStage::Broadcast(at::Tensor& /*tensor*/, int /*root*/) {
  return absl::OkStatus();
}
Status SinglePipelineStage::AllReduceSum(at::Tensor& /*tensor*/) { return absl::OkStatus(); }

std::shared_ptr<PipelineParallelGroup> MakeSinglePipelineStage() {
  return std::make_shared<SinglePipelineStage>();
}

}  // namespace slime::model
