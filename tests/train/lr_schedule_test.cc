// Learning-rate schedule against hand-computed values at the boundaries.
#include "slime/train/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <string>

namespace slime::train {
namespace {

// max 1.0, min 0.1, init 0.0; 10 iterations of 4 samples: decay over 40 samples, warmup 2
// iterations = 8 samples.
LrScheduleConfig BaseConfig(const std::string& style) {
  LrScheduleConfig c;
  c.lr = 1.0;
  c.min_lr = 0.1;
  c.lr_decay_style = style;
  c.lr_warmup_iters = 2;
  c.lr_warmup_init = 0.0;
  c.train_iters = 10;
  c.global_batch_size = 4;
  return c;
}

LrSchedule Make(const LrScheduleConfig& c) {
  auto s = MakeLrSchedule(c);
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

TEST(LrScheduleTest, UnitsAreSamples) {
  LrSchedule s = Make(BaseConfig("linear"));
  EXPECT_EQ(s.decay_steps, 40);
  EXPECT_DOUBLE_EQ(s.warmup_steps, 8.0);
  EXPECT_EQ(s.decay_style, LrDecayStyle::kLinear);
  EXPECT_EQ(TrainIters(100, 32, 8, 64), 400);
  EXPECT_EQ(TrainIters(3, 5, 1, 2), 7);  // 15 / 2 rounds down
}

TEST(LrScheduleTest, LinearWarmupThenDecay) {
  LrSchedule s = Make(BaseConfig("linear"));
  EXPECT_DOUBLE_EQ(LearningRate(s, 0), 0.0);  // step 0: init
  EXPECT_DOUBLE_EQ(LearningRate(s, 4), 0.5);  // half the warmup
  EXPECT_DOUBLE_EQ(LearningRate(s, 8), 1.0);  // end of warmup: max
  // r = (16 - 8) / (40 - 8) = 0.25: 0.1 + 0.9 * 0.75
  EXPECT_NEAR(LearningRate(s, 16), 0.775, 1e-15);
  // r = 0.5: 0.1 + 0.9 * 0.5
  EXPECT_NEAR(LearningRate(s, 24), 0.55, 1e-15);
  EXPECT_NEAR(LearningRate(s, 40), 0.1, 1e-15);  // end of decay
  EXPECT_DOUBLE_EQ(LearningRate(s, 44), 0.1);    // after: min
  EXPECT_DOUBLE_EQ(LearningRate(s, 1000), 0.1);
}

TEST(LrScheduleTest, CosineDecay) {
  LrSchedule s = Make(BaseConfig("cosine"));
  EXPECT_DOUBLE_EQ(LearningRate(s, 8), 1.0);
  // r = 0.25: 0.1 + 0.9 * 0.5 * (cos(pi/4) + 1) = 0.1 + 0.45 * 1.7071067811865475
  EXPECT_NEAR(LearningRate(s, 16), 0.868198051533946, 1e-14);
  EXPECT_NEAR(LearningRate(s, 24), 0.55, 1e-14);  // cos(pi/2) = 0
  EXPECT_NEAR(LearningRate(s, 40), 0.1, 1e-15);
  EXPECT_DOUBLE_EQ(LearningRate(s, 41), 0.1);
}

TEST(LrScheduleTest, ConstantStillWarmsUp) {
  LrSchedule s = Make(BaseConfig("constant"));
  EXPECT_DOUBLE_EQ(LearningRate(s, 0), 0.0);
  EXPECT_DOUBLE_EQ(LearningRate(s, 2), 0.25);
  EXPECT_DOUBLE_EQ(LearningRate(s, 8), 1.0);
  EXPECT_DOUBLE_EQ(LearningRate(s, 9), 1.0);
  EXPECT_DOUBLE_EQ(LearningRate(s, 1000), 1.0);  // no min_lr after decay_steps
}

TEST(LrScheduleTest, NoWarmupStartsAtMax) {
  LrScheduleConfig c = BaseConfig("linear");
  c.lr_warmup_iters = 0;
  LrSchedule s = Make(c);
  EXPECT_DOUBLE_EQ(LearningRate(s, 0), 1.0);
  // r = 10 / 40: 0.1 + 0.9 * 0.75
  EXPECT_NEAR(LearningRate(s, 10), 0.775, 1e-15);
  // Megatron's default (linear, min 0, no warmup): lr decays to 0 over the run.
  LrScheduleConfig d;
  d.lr = 1e-6;
  d.train_iters = 4;
  d.global_batch_size = 8;
  LrSchedule sd = Make(d);
  EXPECT_DOUBLE_EQ(LearningRate(sd, 0), 1e-6);
  EXPECT_NEAR(LearningRate(sd, 16), 0.5e-6, 1e-21);
  EXPECT_DOUBLE_EQ(LearningRate(sd, 32), 0.0);
}

TEST(LrScheduleTest, WarmupFractionAndDecayIters) {
  LrScheduleConfig c = BaseConfig("linear");
  c.lr_warmup_fraction = 0.25;  // of 40 samples: 10
  c.lr_warmup_init = 0.2;
  LrSchedule s = Make(c);
  EXPECT_DOUBLE_EQ(s.warmup_steps, 10.0);
  EXPECT_DOUBLE_EQ(LearningRate(s, 0), 0.2);
  EXPECT_NEAR(LearningRate(s, 5), 0.6, 1e-15);  // 0.2 + 0.8 * 5/10
  EXPECT_DOUBLE_EQ(LearningRate(s, 10), 1.0);
  // A fractional warmup: 0.1 × 45 samples = 4.5.
  c.lr_warmup_fraction = 0.1;
  c.lr_decay_iters = 9;
  c.global_batch_size = 5;
  LrSchedule f = Make(c);
  EXPECT_EQ(f.decay_steps, 45);
  EXPECT_DOUBLE_EQ(f.warmup_steps, 4.5);
  EXPECT_NEAR(LearningRate(f, 4), 0.2 + 0.8 * 4 / 4.5, 1e-15);
  // r = (5 - 4.5) / 40.5
  EXPECT_NEAR(LearningRate(f, 5), 0.1 + 0.9 * (1 - 0.5 / 40.5), 1e-15);
}

TEST(LrScheduleTest, RejectsBadConfigurations) {
  LrScheduleConfig c = BaseConfig("inverse-square-root");
  auto s = MakeLrSchedule(c);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("constant, linear, cosine"), std::string::npos);

  c = BaseConfig("linear");
  c.lr_warmup_iters = 10;  // warmup == decay
  s = MakeLrSchedule(c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("warmup"), std::string::npos) << s.status();

  c = BaseConfig("linear");
  c.min_lr = 2.0;
  EXPECT_FALSE(MakeLrSchedule(c).ok());

  c = BaseConfig("linear");
  c.lr_warmup_init = 1.5;
  EXPECT_FALSE(MakeLrSchedule(c).ok());

  c = BaseConfig("linear");
  c.train_iters = 0;
  EXPECT_FALSE(MakeLrSchedule(c).ok());
}

TEST(LrSchedulerTest, StepsAndRestores) {
  LrScheduler sched(Make(BaseConfig("linear")));
  EXPECT_DOUBLE_EQ(sched.lr(), 0.0);  // the first optimizer step uses init
  sched.Step(4);
  EXPECT_DOUBLE_EQ(sched.lr(), 0.5);
  sched.Step(4);
  EXPECT_DOUBLE_EQ(sched.lr(), 1.0);
  sched.Step(8);
  EXPECT_NEAR(sched.lr(), 0.775, 1e-15);

  LrSchedulerState st = sched.State();
  EXPECT_EQ(st.num_steps, 16);
  EXPECT_EQ(st.decay_style, "linear");
  EXPECT_EQ(st.decay_steps, 40);
  EXPECT_DOUBLE_EQ(st.warmup_steps, 8.0);

  LrScheduler resumed(Make(BaseConfig("linear")));
  ASSERT_TRUE(resumed.LoadState(st).ok());
  EXPECT_EQ(resumed.num_steps(), 16);
  EXPECT_EQ(resumed.lr(), sched.lr());
}

TEST(LrSchedulerTest, MismatchPolicies) {
  LrScheduler sched(Make(BaseConfig("linear")));
  sched.Step(16);
  LrSchedulerState st = sched.State();

  LrScheduleConfig other = BaseConfig("cosine");
  other.lr = 2.0;
  LrScheduler a(Make(other));
  Status s = a.LoadState(st);
  ASSERT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("max_lr"), std::string::npos) << s;
  EXPECT_NE(s.message().find("decay_style"), std::string::npos) << s;
  EXPECT_EQ(a.num_steps(), 0);  // untouched on error

  ASSERT_TRUE(a.LoadState(st, LrStateMismatch::kUseConfigured).ok());
  EXPECT_EQ(a.num_steps(), 16);
  EXPECT_EQ(a.schedule().decay_style, LrDecayStyle::kCosine);

  LrScheduler b(Make(other));
  ASSERT_TRUE(b.LoadState(st, LrStateMismatch::kUseCheckpoint).ok());
  EXPECT_EQ(b.schedule().decay_style, LrDecayStyle::kLinear);
  EXPECT_EQ(b.lr(), sched.lr());

  LrSchedulerState broken = st;
  broken.decay_style = "wsd";
  EXPECT_EQ(b.LoadState(broken).code(), absl::StatusCode::kInvalidArgument);
  broken = st;
  broken.num_steps = -1;
  EXPECT_EQ(b.LoadState(broken).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace slime::train
