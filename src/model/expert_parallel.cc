// The differentiable all-to-all of expert parallelism (see include/slime/model/expert_parallel.h).
#include "slime/model/expert_parallel.h"

#include <torch/torch.h>

#include <vector>

namespace slime::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Forward: rows to their owners. Backward: the gradient of the received rows back to where they
// came from, i.e. the same exchange with the splits swapped. The group travels as an integer
// (it outlives the backward: the DecoderModel owns it), the splits as int lists.
class AllToAllFunction : public torch::autograd::Function<AllToAllFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x,
                               std::vector<int64_t> send_splits, std::vector<int64_t> recv_splits,
                               ExpertParallelGroup* group) {
    ctx->saved_data["group"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(group));
    ctx->saved_data["send"] = c10::IValue(send_splits);
    ctx->saved_data["recv"] = c10::IValue(recv_splits);
    torch::Tensor y = group->AllToAll(x.contiguous(), send_splits, recv_splits);
    ctx->saved_data["shape"] = c10::IValue(y.sizes().vec());
    ctx->saved_data["options"] = torch::empty({0}, y.options());  // dtype and device
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* group = reinterpret_cast<ExpertParallelGroup*>(
        static_cast<intptr_t>(ctx->saved_data["group"].toInt()));
    const std::vector<int64_t> send = ctx->saved_data["send"].toIntVector();
    const std::vector<int64_t> recv = ctx->saved_data["recv"].toIntVector();
    // Every rank of the group must take part, even where no gradient reached the rows.
    const torch::Tensor dy = grads[0].defined()
                                 ? grads[0].contiguous()
                                 : torch::zeros(ctx->saved_data["shape"].toIntVector(),
                                                ctx->saved_data["options"].toTensor().options());
    torch::Tensor g = group->AllToAll(dy, recv, send);
    return {g, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

at::Tensor AllToAllRows(const at::Tensor& input, const std::vector<int64_t>& send_splits,
                        const std::vector<int64_t>& recv_splits, ExpertParallelGroup& group) {
  if (torch::GradMode::is_enabled() && input.requires_grad()) {
    return AllToAllFunction::apply(input, send_splits, recv_splits, &group);
  }
  return group.AllToAll(input.contiguous(), send_splits, recv_splits);
}

}  // namespace slime::model
