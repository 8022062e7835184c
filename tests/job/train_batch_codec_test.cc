// data::RolloutBatch ⇄ TrainBatchProto: every field survives the round trip; inconsistent lengths
// are refused with the sample's index.
#include "slime/job/train_batch_codec.h"

#include "gtest/gtest.h"
#include "slime/v1/job.pb.h"

namespace slime::job {
namespace {

data::RolloutBatch TwoSamples() {
  data::RolloutBatch batch;
  batch.temperature = 0.7;
  data::TrainSample a;
  a.tokens = {1, 2, 3, 4, 5};
  a.prompt_length = 3;
  a.response_length = 2;
  a.loss_mask = {1, 0};
  a.reward = -0.5;
  a.raw_reward = 1.0;
  a.rollout_log_probs = {-0.25f, -1.5f};
  a.rollout_id = 7;
  a.truncated = true;
  a.rollout_routed_experts = {0, 3, 1, 2, 4, 5, 6, 7};  // 4 rows (tokens − 1) of 1 layer × top-2
  a.routed_experts_per_token = 2;
  data::TrainSample b;
  b.tokens = {9, 8};
  b.prompt_length = 1;
  b.response_length = 1;
  b.loss_mask = {1};
  b.teacher_log_probs = {-3.0f};
  batch.samples = {a, b};
  return batch;
}

TEST(TrainBatchCodecTest, RoundTripKeepsEveryField) {
  const data::RolloutBatch in = TwoSamples();
  StatusOr<DecodedTrainBatch> out = DecodeTrainBatch(EncodeTrainBatch(42, in));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->rollout_id, 42);
  EXPECT_DOUBLE_EQ(out->batch.temperature, 0.7);
  ASSERT_EQ(out->batch.samples.size(), 2u);
  const data::TrainSample& a = out->batch.samples[0];
  EXPECT_EQ(a.tokens, in.samples[0].tokens);
  EXPECT_EQ(a.prompt_length, 3);
  EXPECT_EQ(a.response_length, 2);
  EXPECT_EQ(a.loss_mask, in.samples[0].loss_mask);
  EXPECT_DOUBLE_EQ(a.reward, -0.5);
  EXPECT_DOUBLE_EQ(a.raw_reward, 1.0);
  EXPECT_EQ(a.rollout_log_probs, in.samples[0].rollout_log_probs);
  EXPECT_TRUE(a.teacher_log_probs.empty());
  EXPECT_EQ(a.rollout_id, 7);
  EXPECT_TRUE(a.truncated);
  EXPECT_EQ(a.rollout_routed_experts, in.samples[0].rollout_routed_experts);
  EXPECT_EQ(a.routed_experts_per_token, 2);
  const data::TrainSample& b = out->batch.samples[1];
  EXPECT_EQ(b.teacher_log_probs, std::vector<float>{-3.0f});
  EXPECT_EQ(b.rollout_id, -1);
  EXPECT_FALSE(b.truncated);
  EXPECT_TRUE(b.rollout_routed_experts.empty());
  EXPECT_EQ(b.routed_experts_per_token, 0);
}

TEST(TrainBatchCodecTest, RefusesGarbageAndInconsistentSamples) {
  StatusOr<DecodedTrainBatch> garbage = DecodeTrainBatch(std::string("\xff\xff\xff", 3));
  ASSERT_FALSE(garbage.ok());
  EXPECT_NE(std::string(garbage.status().message()).find("TrainBatchProto"), std::string::npos);

  slime::v1::TrainBatchProto proto;
  proto.ParseFromString(EncodeTrainBatch(1, TwoSamples()));
  proto.mutable_samples(1)->add_tokens(5);  // 3 tokens, but 1 + 1
  StatusOr<DecodedTrainBatch> bad = DecodeTrainBatch(proto.SerializeAsString());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("sample 1"), std::string::npos) << bad.status();

  proto.ParseFromString(EncodeTrainBatch(1, TwoSamples()));
  proto.mutable_samples(0)->add_rollout_log_probs(0.0f);
  bad = DecodeTrainBatch(proto.SerializeAsString());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("rollout_log_probs"), std::string::npos);

  // Routing rows past tokens − 1, or not whole rows.
  proto.ParseFromString(EncodeTrainBatch(1, TwoSamples()));
  proto.mutable_samples(0)->add_rollout_routed_experts(1);
  proto.mutable_samples(0)->add_rollout_routed_experts(2);
  bad = DecodeTrainBatch(proto.SerializeAsString());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("rollout_routed_experts has 10 entries"),
            std::string::npos)
      << bad.status();
  proto.ParseFromString(EncodeTrainBatch(1, TwoSamples()));
  proto.mutable_samples(0)->set_routed_experts_per_token(3);
  bad = DecodeTrainBatch(proto.SerializeAsString());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("sample 0"), std::string::npos)
      << bad.status();
}

}  // namespace
}  // namespace slime::job
