// data::RolloutBatch ⇄ TrainBatchProto (include/slime/job/train_batch_codec.h).
#include "slime/job/train_batch_codec.h"

#include "fmt/format.h"
#include "slime/v1/job.pb.h"

namespace slime::job {

std::string EncodeTrainBatch(int64_t rollout_id, const data::RolloutBatch& batch) {
  slime::v1::TrainBatchProto proto;
  proto.set_rollout_id(rollout_id);
  proto.set_temperature(batch.temperature);
  for (const data::TrainSample& s : batch.samples) {
    slime::v1::TrainSampleProto* p = proto.add_samples();
    p->mutable_tokens()->Add(s.tokens.begin(), s.tokens.end());
    p->set_prompt_length(s.prompt_length);
    p->set_response_length(s.response_length);
    p->mutable_loss_mask()->Add(s.loss_mask.begin(), s.loss_mask.end());
    p->set_reward(s.reward);
    p->set_raw_reward(s.raw_reward);
    p->mutable_rollout_log_probs()->Add(s.rollout_log_probs.begin(), s.rollout_log_probs.end());
    p->mutable_teacher_log_probs()->Add(s.teacher_log_probs.begin(), s.teacher_log_probs.end());
    p->set_rollout_id(s.rollout_id);
    p->set_truncated(s.truncated);
    p->mutable_rollout_routed_experts()->Add(s.rollout_routed_experts.begin(),
                                             s.rollout_routed_experts.end());
    p->set_routed_experts_per_token(s.routed_experts_per_token);
  }
  return proto.SerializeAsString();
}

StatusOr<DecodedTrainBatch> DecodeTrainBatch(const std::string& bytes) {
  slime::v1::TrainBatchProto proto;
  if (!proto.ParseFromString(bytes)) {
    return absl::InvalidArgumentError("train batch: payload is not a slime.v1.TrainBatchProto");
  }
  DecodedTrainBatch out;
  out.rollout_id = proto.rollout_id();
  out.batch.temperature = proto.temperature();
  out.batch.samples.reserve(static_cast<size_t>(proto.samples_size()));
  for (int i = 0; i < proto.samples_size(); ++i) {
    const slime::v1::TrainSampleProto& p = proto.samples(i);
    const int64_t r = p.response_length();
    auto bad = [&](const std::string& what) {
      return absl::InvalidArgumentError(fmt::format("train batch: sample {}: {}", i, what));
    };
    if (p.prompt_length() < 0 || r < 0) return bad("negative prompt or response length");
    if (p.tokens_size() != p.prompt_length() + r) {
      return bad(fmt::format("{} tokens, but prompt_length {} + response_length {}",
                             p.tokens_size(), p.prompt_length(), r));
    }
    if (p.loss_mask_size() != r) {
      return bad(fmt::format("loss_mask has {} entries, response_length is {}",
                             p.loss_mask_size(), r));
    }
    if (p.rollout_log_probs_size() != 0 && p.rollout_log_probs_size() != r) {
      return bad(fmt::format("rollout_log_probs has {} entries, response_length is {}",
                             p.rollout_log_probs_size(), r));
    }
    if (p.teacher_log_probs_size() != 0 && p.teacher_log_probs_size() != r) {
      return bad(fmt::format("teacher_log_probs has {} entries, response_length is {}",
                             p.teacher_log_probs_size(), r));
    }
    if (p.rollout_routed_experts_size() != 0) {
      const int64_t width = p.routed_experts_per_token();
      const int64_t size = p.rollout_routed_experts_size();
      if (width <= 0 || size % width != 0 || size / width > p.tokens_size() - 1) {
        return bad(fmt::format("rollout_routed_experts has {} entries for {} tokens of {} per "
                               "token (at most tokens − 1 rows)",
                               size, p.tokens_size(), width));
      }
    }
    data::TrainSample s;
    s.tokens.assign(p.tokens().begin(), p.tokens().end());
    s.prompt_length = p.prompt_length();
    s.response_length = r;
    s.loss_mask.assign(p.loss_mask().begin(), p.loss_mask().end());
    s.reward = p.reward();
    s.raw_reward = p.raw_reward();
    s.rollout_log_probs.assign(p.rollout_log_probs().begin(), p.rollout_log_probs().end());
    s.teacher_log_probs.assign(p.teacher_log_probs().begin(), p.teacher_log_probs().end());
    s.rollout_id = p.rollout_id();
    s.truncated = p.truncated();
    s.rollout_routed_experts.assign(p.rollout_routed_experts().begin(),
                                    p.rollout_routed_experts().end());
    s.routed_experts_per_token =
        s.rollout_routed_experts.empty() ? 0 : p.routed_experts_per_token();
    out.batch.samples.push_back(std::move(s));
  }
  return out;
}

}  // namespace slime::job
