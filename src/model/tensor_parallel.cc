// Parallel layers (see include/slime/model/tensor_parallel.h) and the pipeline stage split
// (include/slime/model/pipeline_parallel.h).
#include "slime/model/tensor_parallel.h"

#include <fmt/format.h>
#include <torch/torch.h>

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

at::Tensor ColumnParallelLinear(const at::Tensor& x, const at::Tensor& weight,
                                const at::Tensor& bias, TensorParallelGroup& group,
                                bool gather_output, bool input_in_region) {
  // x [..., in] · W_r^T [in, out/P] -> [..., out/P]
  const at::Tensor in = input_in_region ? x : CopyToTensorParallelRegion(x, group);
  at::Tensor y = torch::linear(in, weight, bias);
  if (gather_output) y = GatherFromTensorParallelRegion(y, group);
  return y;
}

at::Tensor RowParallelLinear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                             TensorParallelGroup& group) {
  // Partial sums [..., out] from this rank's slice of the input features, summed over ranks;
  // the bias is added once, after the sum.
  at::Tensor y = ReduceOwned(torch::linear(x, weight), group);
  if (bias.defined()) y = y + bias;
  return y;
}

at::Tensor VocabParallelEmbedding(const at::Tensor& ids, const at::Tensor& weight,
                                  TensorParallelGroup& group) {
  if (group.size() == 1) return weight.index_select(0, ids);  // [T, hidden]
  const int64_t rows = weight.size(0);
  const int64_t start = rows * group.rank();
  // Ids owned by another rank read row 0 and are zeroed; the all-reduce fills them in. The
  // gradient of the sum is the output's gradient (replicated), masked to this rank's rows.
  at::Tensor local = ids - start;
  at::Tensor mine = (local >= 0) & (local < rows);  // [T]
  at::Tensor out = weight.index_select(0, torch::where(mine, local, torch::zeros_like(local)));
  out = out * mine.unsqueeze(1).to(out.scalar_type());
  return ReduceOwned(out, group);
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
