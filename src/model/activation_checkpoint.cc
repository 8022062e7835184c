// Activation checkpointing as a custom autograd function (see activation_checkpoint.h).
//
// LibTorch 1.13 and 2.x: torch::autograd::Function with an at::TensorList argument (each tensor
// of the list is one differentiable input, and backward returns one gradient per tensor after
// one undefined entry per non-tensor argument), AutogradContext::save_for_backward /
// get_saved_variables, IValue::make_capsule / toCapsule (the node owns the region through its
// saved_data) and torch::autograd::grad are the same in both.
#include "activation_checkpoint.h"

#include <torch/torch.h>

#include <utility>

namespace slime::model::internal {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What the node keeps besides the saved inputs: the region and which inputs need a gradient.
struct CheckpointRegion : torch::CustomClassHolder {
  CheckpointFn fn;
  std::vector<bool> needs_grad;  // per input: it required grad in the forward
};

class CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, c10::intrusive_ptr<CheckpointRegion> region,
                               at::TensorList inputs) {
    std::vector<torch::Tensor> in(inputs.begin(), inputs.end());
    ctx->save_for_backward(in);
    torch::Tensor out;
    {
      torch::NoGradGuard no_grad;
      out = region->fn(in);
    }
    ctx->saved_data["region"] = c10::IValue::make_capsule(std::move(region));
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const c10::intrusive_ptr<torch::CustomClassHolder> holder =
        ctx->saved_data["region"].toCapsule();
    const CheckpointRegion& region = *static_cast<const CheckpointRegion*>(holder.get());
    const variable_list saved = ctx->get_saved_variables();
    // Fresh leaves sharing the inputs' storage: the recomputed graph ends here.
    std::vector<torch::Tensor> aliases;
    variable_list wrt;
    aliases.reserve(saved.size());
    for (size_t i = 0; i < saved.size(); ++i) {
      torch::Tensor a = saved[i].detach();
      if (region.needs_grad[i]) {
        a.requires_grad_(true);
        wrt.push_back(a);
      }
      aliases.push_back(std::move(a));
    }
    variable_list grads(1 + saved.size());  // [0]: the region argument (no gradient)
    if (wrt.empty()) return grads;
    variable_list found;
    {
      torch::AutoGradMode grad_mode(true);
      const torch::Tensor out = region.fn(aliases);
      found = torch::autograd::grad({out}, wrt, {grad_outputs.at(0)}, /*retain_graph=*/false,
                                    /*create_graph=*/false, /*allow_unused=*/true);
    }
    size_t k = 0;
    for (size_t i = 0; i < saved.size(); ++i) {
      if (region.needs_grad[i]) grads[1 + i] = found[k++];
    }
    return grads;
  }
};

}  // namespace

torch::Tensor Checkpoint(CheckpointFn fn, const std::vector<torch::Tensor>& inputs) {
  bool any = false;
  std::vector<bool> needs_grad;
  needs_grad.reserve(inputs.size());
  for (const torch::Tensor& t : inputs) {
    needs_grad.push_back(t.requires_grad());
    any = any || t.requires_grad();
  }
  if (!torch::GradMode::is_enabled() || !any) return fn(inputs);
  auto region = c10::make_intrusive<CheckpointRegion>();
  region->fn = std::move(fn);
  region->needs_grad = std::move(needs_grad);
  return CheckpointFunction::apply(std::move(region), at::TensorList(inputs))[0];
}

}  // namespace slime::model::internal
