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
#include "slime/model/expert_parallel.h"
#include "slime/model/pipeline_parallel.h"
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
  at::Tensor ReduceScatterSum(const at::Tensor& tensor) override;  // one c10d reduce-scatter
  ProcessGroup& process_group() { return *group_; }

 private:
  std::shared_ptr<ProcessGroup> group_;
};

// The model's PipelineParallelGroup (model/pipeline_parallel.h) over a ProcessGroup whose ranks
// are the pipeline stages (rank() == stage), one per set of ranks sharing a data-parallel (and
// tensor-parallel) index. Unlike the TP adapter its calls return the ProcessGroup's Status (the
// trainer's schedule calls them outside autograd). Thread-safety: as ProcessGroup.
class ProcessGroupPipelineParallel final : public model::PipelineParallelGroup {
 public:
  // `group` must be joined.
  explicit ProcessGroupPipelineParallel(std::shared_ptr<ProcessGroup> group)
      : group_(std::move(group)) {}
  int rank() const override { return group_->rank(); }
  int size() const override { return group_->world_size(); }
  Status Send(const at::Tensor& tensor, int dst) override;
  Status Recv(at::Tensor& tensor, int src) override;
  Status SendRecv(const at::Tensor& send, int dst, at::Tensor& recv, int src) override;
  Status Broadcast(at::Tensor& tensor, int root) override;
  Status AllReduceSum(at::Tensor& tensor) override;
  ProcessGroup& process_group() { return *group_; }

 private:
  std::shared_ptr<ProcessGroup> group_;
};

// The model's ExpertParallelGroup (model/expert_parallel.h) over a ProcessGroup whose ranks are
// the expert-parallel ranks (rank() == ep rank): in the trainer the ranks of one pipeline and
// tensor-parallel rank with consecutive data-parallel ranks (Megatron's layout). Errors throw
// like the TP adapter's (they run inside the forward and the autograd backward).
// Thread-safety: as ProcessGroup.
class ProcessGroupExpertParallel final : public model::ExpertParallelGroup {
 public:
  // `group` must be joined.
  explicit ProcessGroupExpertParallel(std::shared_ptr<ProcessGroup> group)
      : group_(std::move(group)) {}
  int rank() const override { return group_->rank(); }
  int size() const override { return group_->world_size(); }
  at::Tensor AllToAll(const at::Tensor& input, const std::vector<int64_t>& send_splits,
                      const std::vector<int64_t>& recv_splits) override;
  ProcessGroup& process_group() { return *group_; }

 private:
  std::shared_ptr<ProcessGroup> group_;
};

}  // namespace slime::comm

#endif  // SLIME_COMM_TENSOR_PARALLEL_GROUP_H_
