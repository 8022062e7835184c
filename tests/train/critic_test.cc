// PPO with a critic on a real tiny Qwen3 model on the CPU in float32: the first-step gates, the
// critic's values feeding GAE (checked against an independent critic and the GAE formula), the
// value loss falling on a fixed batch while the actor stays frozen (num_critic_only_steps), the
// critic's checkpoint round trip (bitwise, then an identical next rollout), critic_load, and
// the errors for a missing critic checkpoint.
#include "slime/train/critic.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "slime/model/decoder.h"
#include "slime/train/advantages.h"
#include "slime/train/checkpoint.h"
#include "slime/train/optimizer.h"
#include "slime/train/trainer.h"
#include "trainer_test_util.h"

namespace slime::train {
namespace {

using model::testing::TempDir;
using test_util::BaseConfig;
using test_util::ExpectBitwiseEqual;
using test_util::MakeBatch;
using test_util::MakeModelDir;
using test_util::MakeTrainer;
using test_util::Msg;
using test_util::Train;
using test_util::Value;
using test_util::Weights;

config::Config PpoConfig() {
  config::Config c = BaseConfig();
  c.algorithm.advantage_estimator = "ppo";
  c.algorithm.gamma = 1.0;
  c.algorithm.lambd = 0.95;
  c.algorithm.value_clip = 0.2;
  c.train.critic_lr = 1e-3;
  return c;
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::vector<torch::Tensor> Clone(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> out;
  for (const torch::Tensor& t : tensors) out.push_back(t.detach().clone());
  return out;
}

std::vector<torch::Tensor> OptimizerTensors(const AdamW& optimizer) {
  std::vector<torch::Tensor> out;
  for (const model::NamedTensor& nt : optimizer.ExportState().tensors) {
    out.push_back(nt.tensor.clone());
  }
  return out;
}

TEST(CriticTest, PpoFirstStepGatesAndCriticMetrics) {
  TempDir dir;
  auto trainer = MakeTrainer(MakeModelDir(dir, "m", 1), PpoConfig());
  ASSERT_NE(trainer, nullptr);
  ASSERT_NE(trainer->critic(), nullptr);
  EXPECT_FALSE(trainer->SkipsOldLogProbs(1));  // ppo always recomputes π_old
  const Critic& critic = *trainer->critic();
  EXPECT_EQ(critic.value_head().sizes(),
            (std::vector<int64_t>{1, critic.model().config().hidden_size}));
  // N(0, 0.02²) init: a sample std near 0.02.
  EXPECT_NEAR(critic.value_head().std().item<double>(), 0.02, 0.006);
  // The decoder's LM head is frozen in the critic's optimizer; the value head trains.
  EXPECT_TRUE(critic.optimizer().IsTrainable(kValueHeadName));
  EXPECT_FALSE(critic.optimizer().IsTrainable("lm_head.weight"));

  TrainRolloutResult r = Train(*trainer, 0, MakeBatch(4, 7));
  ASSERT_EQ(r.steps.size(), 1u);
  EXPECT_EQ(Value(r.steps[0], "ppo_kl"), 0.0);
  EXPECT_EQ(Value(r.steps[0], "pg_clipfrac"), 0.0);
  // The first critic step starts at v = v_old: nothing is clipped yet.
  EXPECT_EQ(Value(r.steps[0], "value_clipfrac"), 0.0);
  EXPECT_GT(Value(r.steps[0], "value_loss"), 0.0);
  EXPECT_GT(Value(r.steps[0], "critic_grad_norm"), 0.0);
  EXPECT_DOUBLE_EQ(Value(r.steps[0], "critic_lr"), 1e-3);
  EXPECT_EQ(trainer->step(), 1);
  EXPECT_EQ(critic.step(), 1);
  for (const char* name : {"values", "returns", "advantages", "log_probs"}) {
    EXPECT_EQ(r.rollout_values.count(name), 1u) << name;
  }
}

// The values that drive GAE are the pre-update critic's: an independent critic built from the
// same weights and seed gives the same values, and GAE over them gives the trainer's returns.
TEST(CriticTest, GaeUsesThePreUpdateCriticValues) {
  TempDir dir;
  const std::string model_dir = MakeModelDir(dir, "m", 2);
  const config::Config config = PpoConfig();
  auto trainer = MakeTrainer(model_dir, config);
  ASSERT_NE(trainer, nullptr);
  CriticOptions co;
  co.model_dir = model_dir;
  co.config = config;
  auto twin = Critic::Create(co);
  ASSERT_TRUE(twin.ok()) << twin.status();
  ASSERT_TRUE(torch::equal((*twin)->value_head(), trainer->critic()->value_head()));

  const data::RolloutBatch batch = MakeBatch(4, 9);
  std::vector<MicroBatch> mbs(batch.samples.size());
  std::vector<const MicroBatch*> mb_ptrs;
  for (size_t i = 0; i < mbs.size(); ++i) {
    mbs[i].samples = {static_cast<int64_t>(i)};
    mb_ptrs.push_back(&mbs[i]);
  }
  std::vector<torch::Tensor> values(batch.samples.size());
  ASSERT_TRUE((*twin)->ComputeValues(batch, mb_ptrs, values).ok());
  // Returns by GAE (kl_coef 0: the reward sits on the last token).
  std::vector<torch::Tensor> rewards;
  for (size_t i = 0; i < values.size(); ++i) {
    torch::Tensor rho = torch::zeros_like(values[i]);
    rho[rho.size(0) - 1].fill_(batch.samples[i].reward);
    rewards.push_back(rho);
  }
  auto gae = GaeAdvantagesAndReturns(rewards, values, 1.0, 0.95);
  ASSERT_TRUE(gae.ok());
  auto mean_of_means = [&](const std::vector<torch::Tensor>& per_sample) {
    double sum = 0;
    for (size_t i = 0; i < per_sample.size(); ++i) {
      const torch::Tensor m = torch::tensor(batch.samples[i].loss_mask, torch::kFloat32);
      sum += ((per_sample[i] * m).sum() / m.sum()).item<double>();
    }
    return sum / static_cast<double>(per_sample.size());
  };
  TrainRolloutResult r = Train(*trainer, 0, batch);
  EXPECT_NEAR(r.rollout_values.at("values"), mean_of_means(values), 1e-5);
  EXPECT_NEAR(r.rollout_values.at("returns"), mean_of_means(gae->returns), 1e-5);
  EXPECT_NEAR(r.rollout_values.at("advantages"), mean_of_means(gae->advantages), 1e-5);
  // The critic trained after computing them.
  EXPECT_FALSE(torch::equal((*twin)->value_head(), trainer->critic()->value_head()));
}

// γ = λ = 1 makes the returns independent of V (Σ of the future token rewards), so repeated
// rollouts of one batch are a fixed regression problem for the critic. During
// num_critic_only_steps rollouts the actor must not move.
TEST(CriticTest, ValueLossFallsOnAFixedBatchWhileTheActorIsFrozen) {
  TempDir dir;
  config::Config c = PpoConfig();
  c.algorithm.lambd = 1.0;
  c.algorithm.num_critic_only_steps = 100;
  c.algorithm.value_clip = 10.0;
  c.train.critic_lr = 3e-3;
  auto trainer = MakeTrainer(MakeModelDir(dir, "m", 3), c);
  ASSERT_NE(trainer, nullptr);
  const std::vector<torch::Tensor> actor_before = Weights(*trainer);
  const data::RolloutBatch batch = MakeBatch(4, 5);
  std::vector<double> losses;
  for (int rollout = 0; rollout < 12; ++rollout) {
    TrainRolloutResult r = Train(*trainer, rollout, batch);
    ASSERT_EQ(r.steps.size(), 1u);
    EXPECT_EQ(r.steps[0].values.count("pg_loss"), 0u);  // critic-only: no actor step
    losses.push_back(Value(r.steps[0], "value_loss"));
  }
  EXPECT_LT(losses.back(), 0.5 * losses.front())
      << "value_loss " << losses.front() << " -> " << losses.back();
  EXPECT_EQ(trainer->step(), 0);
  EXPECT_EQ(trainer->critic()->step(), 12);
  ExpectBitwiseEqual(Weights(*trainer), actor_before);
}

// Save → load into a fresh trainer: the critic's weights, value head and optimizer state come
// back bit for bit, and the next rollout is identical to the uninterrupted run.
TEST(CriticTest, CheckpointRoundTripIsBitwise) {
  TempDir dir;
  const std::string model_dir = MakeModelDir(dir, "m", 4);
  const std::string save = dir.Join("save");
  auto a = MakeTrainer(model_dir, PpoConfig());
  ASSERT_NE(a, nullptr);
  Train(*a, 0, MakeBatch(4, 21));
  auto saved = a->Save(save, 0);
  ASSERT_TRUE(saved.ok()) << saved.status();
  const std::vector<torch::Tensor> critic_at_save = Clone(a->critic()->Parameters());
  const std::string critic_iter = save + "/critic/" + IterationDirName(0);
  EXPECT_TRUE(Exists(save + "/critic/" + kCheckpointTrackerFile));
  EXPECT_TRUE(Exists(critic_iter + "/" + kExtraWeightsFile));
  EXPECT_TRUE(Exists(critic_iter + "/" + kOptimizerStateFile));
  EXPECT_FALSE(Exists(critic_iter + "/" + kRngStateFile));

  config::Config other = PpoConfig();
  other.train.seed = 999;  // another value head before the load
  auto b = MakeTrainer(model_dir, other);
  ASSERT_NE(b, nullptr);
  ASSERT_FALSE(torch::equal(a->critic()->value_head(), b->critic()->value_head()));
  auto loaded = b->Load(save);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectBitwiseEqual(b->critic()->Parameters(), a->critic()->Parameters());
  ExpectBitwiseEqual(OptimizerTensors(b->critic()->optimizer()),
                     OptimizerTensors(a->critic()->optimizer()));
  EXPECT_EQ(b->critic()->step(), a->critic()->step());
  EXPECT_EQ(b->critic()->lr_scheduler().num_steps(), a->critic()->lr_scheduler().num_steps());

  const data::RolloutBatch next = MakeBatch(4, 22);
  TrainRolloutResult ra = Train(*a, 1, next);
  TrainRolloutResult rb = Train(*b, 1, next);
  ASSERT_EQ(ra.steps.size(), 1u);
  ASSERT_EQ(rb.steps.size(), 1u);
  EXPECT_EQ(ra.steps[0].values, rb.steps[0].values);
  ExpectBitwiseEqual(b->critic()->Parameters(), a->critic()->Parameters());
  ExpectBitwiseEqual(Weights(*b), Weights(*a));

  // checkpoint.critic_load starts a critic from the saved one (value head included).
  config::Config from_critic = PpoConfig();
  from_critic.checkpoint.critic_load = save + "/critic";
  auto c = MakeTrainer(model_dir, from_critic);
  ASSERT_NE(c, nullptr);
  ExpectBitwiseEqual(c->critic()->Parameters(), critic_at_save);
}

TEST(CriticTest, MissingCriticCheckpointIsReported) {
  TempDir dir;
  const std::string model_dir = MakeModelDir(dir, "m", 6);
  const std::string save = dir.Join("save");
  auto grpo = MakeTrainer(model_dir, BaseConfig());
  ASSERT_NE(grpo, nullptr);
  ASSERT_TRUE(grpo->Save(save, 3).ok());
  auto ppo = MakeTrainer(model_dir, PpoConfig());
  ASSERT_NE(ppo, nullptr);
  const std::vector<torch::Tensor> before = Weights(*ppo);
  Status s = ppo->Load(save).status();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(Msg(s).find("critic"), std::string::npos) << s;
  ExpectBitwiseEqual(Weights(*ppo), before);  // nothing was loaded

  // A critic_load that is no model at all names the critic.
  config::Config bad = PpoConfig();
  bad.checkpoint.critic_load = dir.Join("nowhere");
  TrainerOptions o;
  o.model_dir = model_dir;
  o.config = bad;
  Status created = Trainer::Create(o).status();
  EXPECT_FALSE(created.ok());
  EXPECT_NE(Msg(created).find("nowhere"), std::string::npos) << created;
}

}  // namespace
}  // namespace slime::train
