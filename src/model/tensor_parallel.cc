// Parallel layers (see include/slime/model/tensor_parallel.h).
#include "slime/model/tensor_parallel.h"

#include <torch/torch.h>

namespace slime::model {

void SingleRankGroup::AllReduceSum(at::Tensor& /*tensor*/) {}

at::Tensor SingleRankGroup::AllGather(const at::Tensor& tensor, int64_t /*dim*/) { return tensor; }

std::shared_ptr<TensorParallelGroup> MakeSingleRankGroup() {
  return std::make_shared<SingleRankGroup>();
}

at::Tensor ColumnParallelLinear(const at::Tensor& x, const at::Tensor& weight,
                                const at::Tensor& bias, TensorParallelGroup& group,
                                bool gather_output) {
  // x [..., in] · W_r^T [in, out/P] -> [..., out/P]
  at::Tensor y = torch::linear(x, weight, bias);
  if (gather_output && group.size() > 1) y = group.AllGather(y, y.dim() - 1);
  return y;
}

at::Tensor RowParallelLinear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                             TensorParallelGroup& group) {
  // Partial sums [..., out] from this rank's slice of the input features.
  at::Tensor y = torch::linear(x, weight);
  if (group.size() > 1) group.AllReduceSum(y);
  if (bias.defined()) y = y + bias;
  return y;
}

at::Tensor VocabParallelEmbedding(const at::Tensor& ids, const at::Tensor& weight,
                                  TensorParallelGroup& group) {
  if (group.size() == 1) return weight.index_select(0, ids);  // [T, hidden]
  const int64_t rows = weight.size(0);
  const int64_t start = rows * group.rank();
  // Ids owned by another rank read row 0 and are zeroed; the all-reduce fills them in.
  at::Tensor local = ids - start;
  at::Tensor mine = (local >= 0) & (local < rows);  // [T]
  at::Tensor out = weight.index_select(0, torch::where(mine, local, torch::zeros_like(local)));
  out = out * mine.unsqueeze(1).to(out.scalar_type());
  group.AllReduceSum(out);
  return out;
}

at::Tensor VocabParallelLmHead(const at::Tensor& hidden, const at::Tensor& weight,
                               TensorParallelGroup& group, bool gather_output) {
  return ColumnParallelLinear(hidden, weight, at::Tensor(), group, gather_output);
}

}  // namespace slime::model
