// Activation recomputation (Megatron's "activation checkpointing") for the training forward:
// which parts of a pipeline stage's decoder layers keep no activations between the forward and
// the backward, and are run again in the backward instead.
//
//   kNone       every activation is kept (the default).
//   kFull       whole layers. The stage's layers [first, end) are cut into runs; a recomputed
//               run keeps only its input [T, hidden] (this rank's sequence shard under sequence
//               parallelism) and is run forward again, with grad, when the backward reaches it.
//                 kUniform: runs of num_layers consecutive layers from the stage's first layer
//                           (the last run may be shorter), every run recomputed;
//                 kBlock:   the first num_layers layers of the stage recomputed one by one,
//                           the rest keep their activations.
//   kSelective  the core attention of every layer: the part between q/k/v (after q/k norm and
//               RoPE) and the attention output [T, heads, head_dim] — scores, mask, softmax and
//               probs·V (AttentionBackend::Attend). It keeps q, k, v and drops the rest. On the
//               math attention path that is the [heads, n, L] score and probability tensors of
//               every sequence; with a fused SDPA kernel (flash / memory-efficient, which keep
//               no score matrix) it saves only the kernel's small softmax statistics, at the
//               cost of running the attention forward twice.
//
// The function and its gradients do not change: a recomputed region runs the same ops on the
// same inputs in the backward (the decoder has no dropout, so there is no RNG state to replay),
// and tensor-parallel collectives inside it are issued again in the same order on every rank.
// On deterministic kernels (CPU) the gradients are bitwise those of a run without
// recomputation; tests/model/recompute_test.cc and tests/train/recompute_test.cc check it.
// Where it applies: DecoderModel::ForwardPacked with a recorded graph (grad mode on); forward-
// only passes (log-probs under NoGradGuard, the engine) are unaffected.
//
// This header is torch-free; the autograd function lives in src/model/activation_checkpoint.h.
// Thread-safety: plain values and pure functions.
#ifndef SLIME_MODEL_RECOMPUTE_H_
#define SLIME_MODEL_RECOMPUTE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "slime/common/status.h"
#include "slime/model/pipeline_parallel.h"

namespace slime::model {

enum class RecomputeGranularity { kNone, kFull, kSelective };
enum class RecomputeMethod { kUniform, kBlock };

struct RecomputeOptions {
  RecomputeGranularity granularity = RecomputeGranularity::kNone;
  RecomputeMethod method = RecomputeMethod::kUniform;  // kFull only
  int64_t num_layers = 1;                              // kFull only: see the file comment

  bool full() const { return granularity == RecomputeGranularity::kFull; }
  bool selective() const { return granularity == RecomputeGranularity::kSelective; }
};

// "none", "full uniform 2", "full block 1", "selective": for logs and test names.
std::string RecomputeDescription(const RecomputeOptions& options);

// Layers [first, end) of a stage, recomputed as one unit or not.
struct LayerRun {
  int64_t first = 0;
  int64_t end = 0;
  bool recompute = false;

  bool operator==(const LayerRun& o) const {
    return first == o.first && end == o.end && recompute == o.recompute;
  }
};

// InvalidArgument unless, with kFull, 1 <= num_layers <= the stage's layer count (the message
// names recompute_num_layers, the value, the stage and its layers). `num_model_layers` resolves
// a whole model's end_layer of -1.
Status ValidateRecompute(const RecomputeOptions& options, const PipelineStage& stage,
                         int64_t num_model_layers);

// The stage's layers [first, end) in order as runs (file comment); kNone and kSelective give
// one run of every layer, not recomputed (selective recomputation is inside each layer).
// Options must be valid for the stage.
std::vector<LayerRun> RecomputePlan(const RecomputeOptions& options, int64_t first, int64_t end);

}  // namespace slime::model

#endif  // SLIME_MODEL_RECOMPUTE_H_
