// Pipeline parallelism for the decoder: which layers a stage holds, and the group handle the
// trainer's pipeline schedule talks to.
//
// PipelineStage: stage `rank` of `size` holds decoder layers [first_layer, end_layer) of an even
// split (MakePipelineStage: stage s gets layers [s·L/P, (s+1)·L/P), integer division, so every
// stage has at least one layer and the sizes differ by at most one). The first stage also owns
// the token embedding, the last stage the final norm and the LM head. With tied embeddings the
// last stage keeps its own copy of the embedding table as its LM head (Megatron's choice): both
// copies load the same HF tensor "model.embed_tokens.weight", the trainer sums their gradients
// between the first and the last stage after every backward, so the two copies receive the same
// update and stay equal; the gradient norm counts the table once (on the first stage). A stage
// of size 1 is the whole model.
//
// PipelineParallelGroup is a tiny torch-free interface (rank, size, point-to-point Send / Recv /
// SendRecv, and Broadcast / AllReduceSum over the stages); the model never calls it, the trainer
// does. comm::ProcessGroupPipelineParallel (comm/tensor_parallel_group.h) runs it on a c10d
// Gloo / NCCL group; SinglePipelineStage is the group of one stage (every call that would need a
// peer is an error, the collectives are identities).
//
// Thread-safety: a group belongs to the one thread that drives the stage's schedule; every
// stage must issue the matching calls in a compatible order (see ProcessGroup::Send).
#ifndef SLIME_MODEL_PIPELINE_PARALLEL_H_
#define SLIME_MODEL_PIPELINE_PARALLEL_H_

#include <cstdint>
#include <memory>

#include "slime/common/status.h"

namespace at {
class Tensor;
}  // namespace at

namespace slime::model {

struct PipelineStage {
  int rank = 0;             // this stage, 0-based
  int size = 1;             // stages in the pipeline
  int64_t first_layer = 0;  // the first decoder layer this stage holds
  int64_t end_layer = -1;   // one past its last layer; -1: every layer (a whole model)

  bool is_first() const { return rank == 0; }
  bool is_last() const { return rank == size - 1; }
  bool whole() const { return size == 1; }
  bool HasLayer(int64_t layer) const {
    return layer >= first_layer && (end_layer < 0 || layer < end_layer);
  }
  // With tied embeddings, whether this stage holds a copy of the embedding table that the first
  // stage owns (a last stage that is not also the first).
  bool HoldsTiedCopy(bool tie_word_embeddings) const {
    return tie_word_embeddings && is_last() && !is_first();
  }
};

// Stage `rank` of `size` over `num_layers` decoder layers (see the header comment).
// InvalidArgument naming the values when size < 1, rank outside [0, size), or fewer layers than
// stages.
StatusOr<PipelineStage> MakePipelineStage(int64_t num_layers, int rank, int size);

class PipelineParallelGroup {
 public:
  virtual ~PipelineParallelGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Point-to-point with another stage; semantics of comm::ProcessGroup::Send / Recv / SendRecv
  // (blocking; Recv fills `tensor` in place, its shape and dtype must match the sender's).
  virtual Status Send(const at::Tensor& tensor, int dst) = 0;
  virtual Status Recv(at::Tensor& tensor, int src) = 0;
  virtual Status SendRecv(const at::Tensor& send, int dst, at::Tensor& recv, int src) = 0;
  // Every stage gets `root`'s tensor, in place (same shape and dtype on every stage).
  virtual Status Broadcast(at::Tensor& tensor, int root) = 0;
  // Sums `tensor` element-wise over the stages, in place.
  virtual Status AllReduceSum(at::Tensor& tensor) = 0;
};

// The group of one stage: Broadcast and AllReduceSum are identities, point-to-point calls fail
// (there is no peer).
class SinglePipelineStage final : public PipelineParallelGroup {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  Status Send(const at::Tensor& tensor, int dst) override;
  Status Recv(at::Tensor& tensor, int src) override;
  Status SendRecv(const at::Tensor& send, int dst, at::Tensor& recv, int src) override;
  Status Broadcast(at::Tensor& tensor, int root) override;
  Status AllReduceSum(at::Tensor& tensor) override;
};

std::shared_ptr<PipelineParallelGroup> MakeSinglePipelineStage();

}  // namespace slime::model

#endif  // SLIME_MODEL_PIPELINE_PARALLEL_H_
