// Activation checkpointing in LibTorch C++ (which has no torch.utils.checkpoint): one autograd
// node that keeps a region's inputs instead of its activations and runs the region again in
// the backward. Internal to the model module (the decoder's recompute, slime/model/recompute.h).
//
//   y = Checkpoint(fn, inputs)
//     forward:  y = fn(inputs) under NoGradGuard; the node saves `inputs` (references: the
//               activations inside fn are freed as soon as fn returns).
//     backward: a = detached aliases of `inputs` (fresh leaves sharing their storage, requiring
//               grad where the input did); y' = fn(a) with grad enabled; ∂L/∂a =
//               torch::autograd::grad(y', a, ∂L/∂y); those are the node's input gradients.
//
// `inputs` lists every tensor the region's output is differentiable in: its activations and
// the parameters it uses. fn must reach parameters only through `inputs` (so the recomputed
// graph ends at the aliases, not at the parameters' own gradient accumulators: the parameters
// receive their gradients once, from this node, and hooks on them — the overlapped DP reducer's
// — fire once). fn must compute the same function when run again: no RNG (the decoder has no
// dropout), no state it changes, collectives issued in the same order on every rank. It owns
// what it captures and must stay valid until the backward has run (the node holds it).
//
// Saved inputs are version-checked: modifying one in place between the forward and the backward
// fails the backward, as for any saved tensor. Double backward (create_graph) is not supported.
// Gradients are those of the same ops without the checkpoint, bitwise on deterministic kernels.
// Thread-safety: as LibTorch's autograd; the backward (and so fn) runs on the autograd engine's
// thread for the device (the caller's on CPU).
#ifndef SLIME_SRC_MODEL_ACTIVATION_CHECKPOINT_H_
#define SLIME_SRC_MODEL_ACTIVATION_CHECKPOINT_H_

#include <torch/types.h>

#include <functional>
#include <vector>

namespace slime::model::internal {

// The recomputed region: inputs (the real tensors in the forward, their aliases in the
// backward) -> output.
using CheckpointFn = std::function<torch::Tensor(const std::vector<torch::Tensor>& inputs)>;

// See the file comment. Without a recorded graph (grad mode off, or no input requiring grad)
// this is fn(inputs).
torch::Tensor Checkpoint(CheckpointFn fn, const std::vector<torch::Tensor>& inputs);

}  // namespace slime::model::internal

#endif  // SLIME_SRC_MODEL_ACTIVATION_CHECKPOINT_H_
