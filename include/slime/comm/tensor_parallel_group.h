// ProcessGroupTensorParallel: the model's TensorParallelGroup (model/tensor_parallel.h) over a
// c10d ProcessGroup of this module, so the decoder's parallel layers and the vocab-parallel
// log-probs run their collectives on a real Gloo / NCCL group. The model never sees comm; the
// trainer (or a test) builds the ProcessGroup of the TP ranks — one per set of ranks sharing a
// data-parallel index — and hands the model this adapter.
//
// Errors: TensorParallelGroup's collectives cannot return a Status (they run inside the forward
// and the autograd backward), so a failed or timed-out collective throws std::runtime_error
// with the ProcessGroup's message (which names the sequence number and the recent
// collectives); the model's and trainer's public entry points turn it into a Status.
//
// Thread-safety: as ProcessGroup — one thread at a time, every rank in the same order. The
// autograd backward runs on the caller's thread on CPU; on CUDA it runs on the autograd
// engine's device thread, one at a time.
#ifndef SLIME_COMM_TENSOR_PARALLEL_GROUP_H_
#define SLIME_COMM_TENSOR_PARALLEL_GROUP_H_

#include <memory>

#include "slime/comm/process_group.h"
#include "slime/model/tensor_parallel.h"

namespace slime::comm {

class ProcessGroupTensorParallel final : public model::TensorParallelGroup {
 public:
  // `group` must be joined; its ranks are the TP ranks (rank() == tp rank).
  explicit ProcessGroupTensorParallel(std::shared_ptr<ProcessGroup> group)
      : group_(std::move(group)) {}
  int rank() const override { return group_->rank(); }
  int size() const override { return group_->world_size(); }
  void AllReduceSum(at::Tensor& tensor) override;
  at::Tensor AllGather(const at::Tensor& tensor, int64_t dim) override;
  ProcessGroup& process_group() { return *group_; }

 private:
  std::shared_ptr<ProcessGroup> group_;
};

}  // namespace slime::comm

#endif  // SLIME_COMM_TENSOR_PARALLEL_GROUP_H_
