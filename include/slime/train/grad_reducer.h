// GradReducer: the data-parallel gradient sum overlapped with the backward pass (Megatron's
// --overlap-grad-reduce, PyTorch DDP's reducer), for train.overlap_grad_reduce.
//
// A step's gradients accumulate over several micro-batch backward passes; only the last pass
// produces final gradients, so only it can overlap. Before that pass the trainer calls Arm().
// A post-hook on every trainable parameter's gradient accumulator (the autograd node that adds
// a backward pass's gradient into param.grad()) then fires when that parameter's gradient is
// final: the reducer copies it into its bucket's flat buffer and makes param.grad() a view of
// that slice (so no second copy of the gradients stays alive). When a bucket's last parameter
// is in and every earlier bucket has been posted, the bucket's all-reduce is posted, while the
// backward pass goes on with the earlier layers. Finish() after the pass posts the buckets the
// pass did not reach (a parameter it gave no gradient gets zeros, as the synchronous path),
// waits for every bucket in order and leaves every gradient summed over the DP group, in place
// (param.grad() is a view of its summed bucket until the optimizer drops it).
//
// Buckets: the parameters in reverse order — the order the backward pass finishes them (the
// LM head and the last layers first; the input embedding, which a tied LM head also uses, last)
// —, consecutive parameters of one dtype and device up to bucket_size elements, a larger one
// alone. Buckets are posted strictly in that order, so every DP rank posts the same
// collectives in the same order whatever order its hooks fire in; a bucket whose parameters are
// all in waits for the earlier buckets. The sum of each element is the same as the synchronous
// bucketed all-reduce's (one sum over the same ranks), so the two paths train alike.
//
// Threads: on CUDA the backward pass, and so the hooks and the posts, run on the autograd
// engine's device thread while the caller waits in backward(); Arm / Finish / Disarm are called
// from the caller's thread between passes. The state is guarded by a mutex.
//
// Errors: a post that fails inside a hook (the group is broken, a peer is gone) is remembered
// and the later hooks do nothing; Finish returns it. Nothing throws out of a hook.
#ifndef SLIME_TRAIN_GRAD_REDUCER_H_
#define SLIME_TRAIN_GRAD_REDUCER_H_

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "slime/common/status.h"

namespace slime::train {

// Posts a sum of the tensor over the DP group (in place) and returns the function that waits
// for it (comm::ProcessGroup::AllReduceSumAsync).
using AsyncAllReduceSumFn = std::function<StatusOr<std::function<Status()>>(torch::Tensor&)>;

class GradReducer {
 public:
  // `params`: the trainable parameters (leaves that require grad), in the model's order.
  // InvalidArgument for bucket_size < 1, a parameter that does not require grad, or no
  // all_reduce.
  static StatusOr<std::unique_ptr<GradReducer>> Create(const std::vector<torch::Tensor>& params,
                                                       int64_t bucket_size,
                                                       AsyncAllReduceSumFn all_reduce);
  ~GradReducer();  // removes the hooks
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // The next backward pass is the step's last: post each bucket once its gradients are final.
  void Arm();
  // After that pass: post the rest, wait for every bucket, leave the sums in param.grad().
  // Disarms. Errors: the first failed post or wait (the gradients are then not all summed).
  Status Finish();
  // Abandons an armed pass (the step failed before Finish): disarms; the buckets already
  // posted are not waited for.
  void Disarm();

  size_t num_buckets() const;
  // Of the last Finish: buckets posted by the hooks during the backward pass (the rest were
  // posted by Finish).
  int64_t posted_during_backward() const;

  struct State;  // grad_reducer.cc

 private:
  explicit GradReducer(std::shared_ptr<State> state);
  std::shared_ptr<State> state_;
};

}  // namespace slime::train

#endif  // SLIME_TRAIN_GRAD_REDUCER_H_
