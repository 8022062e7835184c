// Internal to the train module: routing replay (slime's use_routing_replay and R3,
// use_rollout_routing_replay; docs/algorithms.md, "Routing replay") and the rollout-vs-train
// routing agreement metric.
//
// A sample's routing is a [rows, layers, top_k] int64 CPU tensor (SampleRouting entry): row p
// is the experts position p of its tokens went to in every layer (dense layers: any values,
// never read). rows <= tokens: the engine's routing has tokens − 1 rows (the last token is
// never fed to the engine), a trainer forward's has tokens.
//
// Replaying one packed micro-batch: PackRouting lays the samples' rows out in Pack's token
// order (trainer_internal.h), one [T_pad, top_k] tensor per sparse layer, and the forward's
// DecoderModel::set_routing_replay takes them. The row a sample lacks — its last token's, whose
// logits predict nothing (the log-prob of token i + 1 is read at position i, logprobs.h) — and
// the padding get experts 0..top_k−1: their outputs reach no trained log-prob (causal
// attention; the padding is a sequence of its own).
//
// Thread-safety: pure functions and hooks of the trainer's thread.
#ifndef SLIME_SRC_TRAIN_ROUTING_REPLAY_H_
#define SLIME_SRC_TRAIN_ROUTING_REPLAY_H_

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "slime/common/status.h"
#include "slime/config/config.h"
#include "slime/data/rollout_batch.h"
#include "slime/model/config.h"
#include "slime/model/decoder.h"

namespace slime::train::internal {

// batch sample -> [rows, layers, top_k] int64 (CPU), or undefined (no routing).
using SampleRouting = std::vector<torch::Tensor>;

// Work around the model's forward of one packed micro-batch of `samples` ([padded] ids):
// before() just before it, after() right after it. Either may be unset.
struct ForwardHooks {
  std::function<Status(const std::vector<int64_t>& samples, int64_t padded)> before;
  std::function<Status(const std::vector<int64_t>& samples, int64_t padded)> after;
};

// algorithm.use_routing_replay / use_rollout_routing_replay and rollout.return_routed_experts
// need a model with sparse layers: InvalidArgument naming the key otherwise.
Status CheckRoutingReplayConfig(const config::Config& config, const model::ModelConfig& model);

// Every sample's TrainSample::rollout_routed_experts as SampleRouting (undefined where empty).
// InvalidArgument naming the sample and the sizes when routed_experts_per_token is not the
// model's layers × top_k, the rows pass tokens − 1, or an expert id is outside [0, experts).
StatusOr<SampleRouting> EngineRouting(const data::RolloutBatch& batch,
                                      const model::ModelConfig& model);

// `routing` of `samples` in Pack's order, [padded, layers, top_k] int64 on the CPU (missing
// rows: experts 0..top_k−1), and in *valid ([padded] bool, optional) which rows came from it.
// Without `valid` (replay) a sample without routing, or with fewer than tokens − 1 rows, is a
// FailedPrecondition naming it; with it (measuring) missing rows are simply not valid.
StatusOr<torch::Tensor> PackRouting(const SampleRouting& routing, const data::RolloutBatch& batch,
                                    const std::vector<int64_t>& samples, int64_t padded,
                                    const model::ModelConfig& model,
                                    torch::Tensor* valid = nullptr);

// Hooks that replay `routing` (kept alive by the caller) in each forward and clear it after.
ForwardHooks ReplayHooks(model::DecoderModel& model, const data::RolloutBatch& batch,
                         const SampleRouting& routing);

// Hooks that capture each forward's routing into (*routing)[sample] ([tokens, layers, top_k];
// on a pipeline stage only its own layers are filled). `routing` is sized to the batch.
ForwardHooks RecordHooks(model::DecoderModel& model, const data::RolloutBatch& batch,
                         SampleRouting* routing);

// Hooks that capture each forward's routing and add to sums[kAgreementMatches] the engine's
// (token, sparse layer, slot) choices the trainer's top-k also made, and to
// sums[kAgreementSlots] all of them, over the rows `engine` has (this stage's layers only).
inline constexpr char kAgreementMatches[] = "routing_agreement/matches";
inline constexpr char kAgreementSlots[] = "routing_agreement/slots";
ForwardHooks AgreementHooks(model::DecoderModel& model, const data::RolloutBatch& batch,
                            const SampleRouting& engine,
                            std::map<std::string, torch::Tensor>* sums);

// Turns the capture and the replay of `model` off (after a pass, whatever happened in it).
void ResetRouting(model::DecoderModel& model);

}  // namespace slime::train::internal

#endif  // SLIME_SRC_TRAIN_ROUTING_REPLAY_H_
