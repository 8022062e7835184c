// TrainSample and RolloutBatch: the rollout → trainer data contract, one rollout as the trainer
// consumes it. Plain data, no LibTorch: the driver builds it from the rollout coordinator's
// samples (data::Sample, rewards already post-processed by reward/reward_postprocess.h), ships
// it to the trainer processes (job/train_batch_codec.h) and train::Trainer trains on it. It
// lives in `data` because both sides share it and neither owns the other.
// Thread-safety: plain values.
#ifndef SLIME_DATA_ROLLOUT_BATCH_H_
#define SLIME_DATA_ROLLOUT_BATCH_H_

#include <cstdint>
#include <vector>

namespace slime::data {

// One sample of a rollout as the coordinator ships it (plain data, no LibTorch).
struct TrainSample {
  std::vector<int32_t> tokens;   // [P + R]: the prompt ids, then the response ids
  int64_t prompt_length = 0;     // P; >= 1 when R > 0 (the first response token needs a context)
  int64_t response_length = 0;   // R
  std::vector<float> loss_mask;  // [R], 0 or 1 (tool / environment tokens are 0)
  double reward = 0.0;           // post-processed r̃ (reward::NormalizeGroupRewards), drives the
                                 // advantages
  double raw_reward = 0.0;       // the reward model's value, logged only
  // [R] the engine's log-probs of the response tokens, or empty. Required with use_tis,
  // get_mismatch_metrics and use_rollout_logprobs; reported as
  // train_rollout_logprob_abs_diff whenever given.
  std::vector<float> rollout_log_probs;
  // [R] the teacher's log-probs (use_opd with opd_type "sglang"), else empty.
  std::vector<float> teacher_log_probs;
  // Samples of one trajectory (e.g. the turns of a multi-turn episode stored as separate
  // samples) share an id: they land in one optimizer step and share one loss denominator. -1:
  // the sample is a rollout of its own (the usual case). This is not the prompt group.
  int64_t rollout_id = -1;
  bool truncated = false;  // stopped at max_response_len (logged)
  // The engine's routing (routing replay, docs/algorithms.md): [rows, layers, top_k] int32
  // flattened, the experts of positions 0..rows−1 (rows <= P + R − 1), or empty.
  // routed_experts_per_token = layers × top_k (0 while empty).
  std::vector<int32_t> rollout_routed_experts;
  int64_t routed_experts_per_token = 0;
};

struct RolloutBatch {
  std::vector<TrainSample> samples;
  double temperature = 1.0;  // the rollout temperature; logits are divided by it (> 0)
};

}  // namespace slime::data

#endif  // SLIME_DATA_ROLLOUT_BATCH_H_
