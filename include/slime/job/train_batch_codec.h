// data::RolloutBatch ⇄ bytes of a slime.v1.TrainBatchProto (proto/slime/v1/job.proto): the
// driver → trainer data plane. Decode checks what the proto cannot say (lengths that agree with
// the sample's response length); the trainer's CheckBatch checks the rest.
#ifndef SLIME_JOB_TRAIN_BATCH_CODEC_H_
#define SLIME_JOB_TRAIN_BATCH_CODEC_H_

#include <cstdint>
#include <string>

#include "slime/common/status.h"
#include "slime/data/rollout_batch.h"

namespace slime::job {

std::string EncodeTrainBatch(int64_t rollout_id, const data::RolloutBatch& batch);

struct DecodedTrainBatch {
  int64_t rollout_id = 0;
  data::RolloutBatch batch;
};
// InvalidArgument: not a TrainBatchProto, or a sample whose token count is not
// prompt_length + response_length, or whose loss mask / log-prob arrays have another length
// than response_length (the message names the sample index).
StatusOr<DecodedTrainBatch> DecodeTrainBatch(const std::string& bytes);

}  // namespace slime::job

#endif  // SLIME_JOB_TRAIN_BATCH_CODEC_H_
