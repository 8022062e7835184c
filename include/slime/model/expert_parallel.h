// Expert parallelism (EP) for the mixture-of-experts layers (ffn/moe.h): the experts of every
// sparse layer are split over the EP group's ranks, and each layer's routed token rows travel by
// all-to-all to the rank that owns their expert and back.
//
// Layout (Megatron's): rank r of an EP group of size N holds the contiguous block of experts
// [r·E/N, (r+1)·E/N) (E = num_experts, divisible by N); the router and every non-expert
// parameter stay whole on every rank. ExpertShard says which block a model's weights hold;
// weights.h's parameter lists leave the other experts out (their HF names stay global).
//
// In the trainer the EP group is carved out of data parallelism: the ranks of one EP group have
// the same pipeline and tensor-parallel rank and consecutive data-parallel ranks, so each brings
// its own tokens; every rank routes its own tokens, sends each routed row to the owner of its
// expert, the owner runs its experts over the rows of all the group's ranks, and the results
// come back in the order they left (MoeBlock::Forward). Under tensor parallelism each expert is
// additionally split over the TP ranks as before (expert TP = TP).
//
// ExpertParallelGroup is a tiny torch-free interface like TensorParallelGroup (the model never
// sees comm); comm::ProcessGroupExpertParallel (comm/tensor_parallel_group.h) runs it on a c10d
// group. A model without one has EP size 1 (every expert local, no collectives).
//
// Thread-safety: as TensorParallelGroup — the thread that owns the model replica and the
// autograd backward it runs; every rank issues the same collectives in the same order. A failed
// collective throws (std::runtime_error); the model's and trainer's entry points turn it into a
// Status.
#ifndef SLIME_MODEL_EXPERT_PARALLEL_H_
#define SLIME_MODEL_EXPERT_PARALLEL_H_

#include <cstdint>
#include <vector>

namespace at {
class Tensor;
}  // namespace at

namespace slime::model {

// The experts a model's weights hold: block `rank` of `size` equal contiguous blocks.
struct ExpertShard {
  int rank = 0;
  int size = 1;

  bool whole() const { return size == 1; }
  // The first expert of the block and the block's length, for `num_experts` experts.
  int64_t first(int64_t num_experts) const { return rank * (num_experts / size); }
  int64_t count(int64_t num_experts) const { return num_experts / size; }
  bool Holds(int64_t expert, int64_t num_experts) const {
    return expert >= first(num_experts) && expert < first(num_experts) + count(num_experts);
  }
  // The rank whose block holds `expert`.
  int OwnerOf(int64_t expert, int64_t num_experts) const {
    return static_cast<int>(expert / (num_experts / size));
  }
};

class ExpertParallelGroup {
 public:
  virtual ~ExpertParallelGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Rows [sum(send_splits[0..r)), +send_splits[r]) of `input` [N, ...] go to rank r; returns
  // [sum(recv_splits), ...]: the rows every rank sent here, in rank order. recv_splits[r] must
  // equal rank r's send_splits[this rank] (comm's ProcessGroup::AllToAll).
  virtual at::Tensor AllToAll(const at::Tensor& input, const std::vector<int64_t>& send_splits,
                              const std::vector<int64_t>& recv_splits) = 0;
};

// AllToAll as a differentiable op: the gradient of the received rows goes back to their
// senders by the reverse all-to-all (send and receive splits swapped). A new autograd node only
// when a graph is recorded.
at::Tensor AllToAllRows(const at::Tensor& input, const std::vector<int64_t>& send_splits,
                        const std::vector<int64_t>& recv_splits, ExpertParallelGroup& group);

}  // namespace slime::model

#endif  // SLIME_MODEL_EXPERT_PARALLEL_H_
