// The Trainer on a real tiny Qwen3 model on the CPU in float32: slime's first-step CI gates
// (ppo_kl == 0, pg_clipfrac == 0, kl_loss == 0, actor == ref log-probs), GRPO improving its
// objective on an overfit batch, micro-batch split invariance, the reference/teacher/old-actor
// weight swaps restoring the actor bit for bit, save → load → next rollout bitwise equal to an
// uninterrupted run, SFT steps, the micro-batch padding (train.data_pad_size_multiplier)
// changing no loss or gradient, keeping the loss's logits (train.recompute_loss_function false)
// changing nothing, the debug outputs (correct_entropy, the trained samples), and
// bad input reported with the field named.
#include "slime/train/trainer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <vector>

#include "multi_rank_harness.h"
#include "slime/train/optimizer.h"
#include "trainer_internal.h"  // src/train: Pack (the padding)
#include "trainer_test_util.h"

namespace slime::train {
namespace {

using model::testing::TempDir;
using test_util::BaseConfig;
using test_util::ExpectBitwiseEqual;
using test_util::LogProbs;
using test_util::MakeBatch;
using test_util::MakeModelDir;
using test_util::MakeTrainer;
using test_util::Msg;
using test_util::Objective;
using test_util::RunRanks;
using test_util::ThreadGroup;
using test_util::Train;
using test_util::Value;
using test_util::Weights;

// Trains `a` and `b` on `batch` for two rollouts of two optimizer steps each and expects the
// same step metrics (b's keys looked up in a, or with `same_keys` both ways), rollout metrics and
// final weights, within `tol` relative to each value.
void ExpectTheSameTraining(Trainer& a, Trainer& b, const data::RolloutBatch& batch, double tol,
                           bool same_keys) {
  for (int rollout = 0; rollout < 2; ++rollout) {
    TrainRolloutResult ra = Train(a, rollout, batch);
    TrainRolloutResult rb = Train(b, rollout, batch);
    ASSERT_EQ(ra.steps.size(), 2u);
    ASSERT_EQ(rb.steps.size(), 2u);
    for (size_t s = 0; s < 2; ++s) {
      if (same_keys) ASSERT_EQ(ra.steps[s].values.size(), rb.steps[s].values.size());
      for (const auto& [name, value] : rb.steps[s].values) {
        EXPECT_NEAR(Value(ra.steps[s], name), value, tol * (1.0 + std::abs(value)))
            << name << " at rollout " << rollout << " step " << s;
      }
    }
    if (!same_keys) continue;
    for (const auto& [name, value] : ra.rollout_values) {
      EXPECT_NEAR(rb.rollout_values.at(name), value, tol * (1.0 + std::abs(value))) << name;
    }
  }
  const std::vector<torch::Tensor> wa = Weights(a), wb = Weights(b);
  for (size_t i = 0; i < wa.size(); ++i) {
    EXPECT_LT((wa[i] - wb[i]).abs().max().item<double>(), tol) << "tensor " << i;
  }
}

// ---- slime's CI gates --------------------------------------------------------------------------

// One step per rollout: slime skips the old-actor pass, π_old is the detached current policy.
TEST(TrainerTest, FirstStepGatesWhenTheOldPassIsSkipped) {
  TempDir dir;
  auto trainer = MakeTrainer(MakeModelDir(dir, "m", 1), BaseConfig());
  ASSERT_NE(trainer, nullptr);
  EXPECT_TRUE(trainer->SkipsOldLogProbs(1));
  EXPECT_FALSE(trainer->has_weights(PolicyWeights::kRef));
  TrainRolloutResult r = Train(*trainer, 0, MakeBatch(4, 7));
  ASSERT_EQ(r.steps.size(), 1u);
  EXPECT_EQ(Value(r.steps[0], "ppo_kl"), 0.0);
  EXPECT_EQ(Value(r.steps[0], "pg_clipfrac"), 0.0);
  EXPECT_EQ(r.steps[0].values.count("kl_loss"), 0u);
  for (const char* name : {"loss", "pg_loss", "entropy_loss", "grad_norm", "lr"}) {
    EXPECT_TRUE(std::isfinite(Value(r.steps[0], name))) << name;
  }
  EXPECT_GT(Value(r.steps[0], "grad_norm"), 0.0);
  EXPECT_EQ(Value(r.steps[0], "lr"), 1e-3);
  EXPECT_EQ(trainer->step(), 1);
  EXPECT_EQ(trainer->optimizer().step(), 1);
  EXPECT_DOUBLE_EQ(r.rollout_values.at("reward"), 0.0);
  EXPECT_DOUBLE_EQ(r.rollout_values.at("raw_reward"), 0.5);
}

// Two steps per rollout with a KL loss: the reference and old-actor passes run, and on the first
// step they equal the training forward bit for bit.
TEST(TrainerTest, FirstStepGatesWithReferenceAndOldActorPasses) {
  TempDir dir;
  config::Config c = BaseConfig();
  c.algorithm.use_kl_loss = true;
  c.algorithm.kl_loss_coef = 0.1;
  c.algorithm.kl_loss_type = "low_var_kl";
  c.train.global_batch_size = 2;
  auto trainer = MakeTrainer(MakeModelDir(dir, "m", 1), c);
  ASSERT_NE(trainer, nullptr);
  EXPECT_FALSE(trainer->SkipsOldLogProbs(2));
  ASSERT_TRUE(trainer->has_weights(PolicyWeights::kRef));

  data::RolloutBatch batch = MakeBatch(4, 11, /*temperature=*/0.8);
  const SampleLogProbs actor = LogProbs(*trainer, batch);
  ExpectBitwiseEqual(LogProbs(*trainer, batch, PolicyWeights::kRef), actor);
  // The engine's log-probs, as if it computed exactly what the trainer does.
  for (size_t i = 0; i < batch.samples.size(); ++i) {
    const torch::Tensor lp = actor.log_probs[i].contiguous();
    batch.samples[i].rollout_log_probs.assign(lp.data_ptr<float>(),
                                              lp.data_ptr<float>() + lp.numel());
  }

  TrainRolloutResult r = Train(*trainer, 0, batch);
  ASSERT_EQ(r.steps.size(), 2u);
  EXPECT_EQ(Value(r.steps[0], "ppo_kl"), 0.0);
  EXPECT_EQ(Value(r.steps[0], "pg_clipfrac"), 0.0);
  EXPECT_EQ(Value(r.steps[0], "kl_loss"), 0.0);
  EXPECT_EQ(Value(r.steps[0], "train_rollout_logprob_abs_diff"), 0.0);
  // The second step trains a policy that moved: π_old and π_ref now differ from it.
  EXPECT_NE(Value(r.steps[1], "ppo_kl"), 0.0);
  EXPECT_GT(Value(r.steps[1], "kl_loss"), 0.0);
  EXPECT_EQ(r.steps[1].step, 1);
  EXPECT_EQ(r.steps[0].num_samples, 2);
  EXPECT_NEAR(r.rollout_values.at("log_probs"), r.rollout_values.at("ref_log_probs"), 0.0);
}

// ---- Learning ----------------------------------------------------------------------------------

TEST(TrainerTest, GrpoRaisesTheLogProbsOfRewardedResponsesOnAnOverfitBatch) {
  TempDir dir;
  auto trainer = MakeTrainer(MakeModelDir(dir, "m", 3), BaseConfig());
  ASSERT_NE(trainer, nullptr);
  const data::RolloutBatch batch = MakeBatch(4, 5);
  const SampleLogProbs before = LogProbs(*trainer, batch);
  std::vector<double> losses;
  for (int rollout = 0; rollout < 10; ++rollout) {
    TrainRolloutResult r = Train(*trainer, rollout, batch);
    ASSERT_EQ(r.steps.size(), 1u);
    losses.push_back(Value(r.steps[0], "pg_loss"));
  }
  const SampleLogProbs after = LogProbs(*trainer, batch);
  EXPECT_GT(Objective(after, batch), Objective(before, batch) + 1.0);
  for (size_t i = 0; i < batch.samples.size(); ++i) {
    const double b = before.log_probs[i].mean().item<double>();
    const double a = after.log_probs[i].mean().item<double>();
    if (batch.samples[i].reward > 0) {
      EXPECT_GT(a, b) << "sample " << i;
    } else {
      EXPECT_LT(a, b) << "sample " << i;
    }
  }
  // On-policy with ratio ≡ 1, pg_loss = −Σ_i r̃_i / G stays constant; the objective moved.
  EXPECT_NEAR(losses.front(), losses.back(), 1e-6);
}

TEST(TrainerTest, SftStepsLowerTheLoss) {
  TempDir dir;
  config::Config c = BaseConfig();
  c.algorithm.loss_type = "sft_loss";
  c.algorithm.compute_advantages_and_returns = false;
  c.train.calculate_per_token_loss = true;
  c.train.global_batch_size = 3;
  auto trainer = MakeTrainer(MakeModelDir(dir, "m", 4), c);
  ASSERT_NE(trainer, nullptr);
  const data::RolloutBatch batch = MakeBatch(3, 9);
  std::vector<double> losses;
  for (int step = 0; step < 8; ++step) {
    auto r = trainer->SftStep(batch);
    ASSERT_TRUE(r.ok()) << r.status();
    losses.push_back(Value(*r, "loss"));
    EXPECT_EQ(r->values.count("pg_loss"), 0u);
  }
  EXPECT_NEAR(losses.front(), std::log(101.0), 0.1);  // a random model: about log(vocab)
  EXPECT_LT(losses.back(), losses.front() - 0.2);
  // TrainRollout with loss_type sft_loss trains the same loss.
  TrainRolloutResult r = Train(*trainer, 0, batch);
  ASSERT_EQ(r.steps.size(), 1u);
  EXPECT_LT(Value(r.steps[0], "loss"), losses.back());
}

// ---- Micro-batching ----------------------------------------------------------------------------

TEST(TrainerTest, StepResultDoesNotDependOnTheMicroBatchSplit) {
  TempDir dir;
  const std::string model_dir = MakeModelDir(dir, "m", 6);
  config::Config c = BaseConfig();
  c.algorithm.use_kl_loss = true;
  c.algorithm.kl_loss_coef = 0.05;
  c.algorithm.entropy_coef = 0.01;
  c.train.global_batch_size = 3;
  c.train.use_dynamic_batch_size = true;
  config::Config small = c, large = c;
  small.train.max_tokens_per_gpu = 12;  // about one sample per micro-batch
  large.train.max_tokens_per_gpu = 4096;
  auto a = MakeTrainer(model_dir, small);
  auto b = MakeTrainer(model_dir, large);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ExpectTheSameTraining(*a, *b, MakeBatch(6, 13), 1e-5, /*same_keys=*/false);
}

// train.recompute_loss_function false keeps the log-prob chunks' logits for the backward instead
// of computing them again: the same training, bit for bit (chunks of 5 rows, entropy bonus).
TEST(TrainerTest, KeepingTheLossLogitsTrainsExactlyAsRecomputingThem) {
  TempDir dir;
  const std::string model_dir = MakeModelDir(dir, "m", 8);
  config::Config c = BaseConfig();
  c.algorithm.entropy_coef = 0.01;
  c.train.log_probs_chunk_size = 5;
  c.train.global_batch_size = 2;  // two optimizer steps a rollout
  config::Config kept = c, recomputed = c;
  kept.train.recompute_loss_function = false;
  recomputed.train.recompute_loss_function = true;
  auto a = MakeTrainer(model_dir, recomputed);
  auto b = MakeTrainer(model_dir, kept);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ExpectTheSameTraining(*a, *b, MakeBatch(4, 21), 1e-12, /*same_keys=*/true);
  ExpectBitwiseEqual(Weights(*a), Weights(*b));
}

// Two DP ranks in two threads, summing through a shared-memory all-reduce (ThreadGroup), train
// the same weights as one rank with the whole batch.
TEST(TrainerTest, TwoDataParallelRanksMatchOneRank) {
  TempDir dir;
  const std::string model_dir = MakeModelDir(dir, "m", 14);
  config::Config c = BaseConfig();
  c.algorithm.use_kl_loss = true;
  c.algorithm.kl_loss_coef = 0.05;
  c.algorithm.normalize_advantages = true;
  c.train.micro_batch_size = 1;
  c.train.global_batch_size = 4;
  const data::RolloutBatch batch = MakeBatch(8, 15);

  auto single = MakeTrainer(model_dir, c);
  ASSERT_NE(single, nullptr);
  std::vector<TrainRolloutResult> single_results;
  for (int rollout = 0; rollout < 2; ++rollout)
    single_results.push_back(Train(*single, rollout, batch));

  ThreadGroup group(2);
  std::vector<std::unique_ptr<Trainer>> ranks(2);
  std::vector<std::vector<TrainRolloutResult>> results(2);
  RunRanks(2, [&](int rank) {
    TrainerOptions o;
    o.model_dir = model_dir;
    o.config = c;
    group.Wire(rank, o);
    auto trainer = Trainer::Create(o);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    ranks[rank] = std::move(*trainer);
    for (int rollout = 0; rollout < 2; ++rollout) {
      auto r = ranks[rank]->TrainRollout(rollout, batch);
      ASSERT_TRUE(r.ok()) << r.status();
      results[rank].push_back(*r);
    }
  });
  ASSERT_NE(ranks[0], nullptr);
  ASSERT_NE(ranks[1], nullptr);
  ExpectBitwiseEqual(Weights(*ranks[0]), Weights(*ranks[1]));
  const std::vector<torch::Tensor> w1 = Weights(*single), w2 = Weights(*ranks[0]);
  for (size_t i = 0; i < w1.size(); ++i) {
    EXPECT_LT((w1[i] - w2[i]).abs().max().item<double>(), 1e-5) << "tensor " << i;
  }
  for (int rollout = 0; rollout < 2; ++rollout) {
    ASSERT_EQ(results[0][rollout].steps.size(), 2u);
    for (size_t s = 0; s < 2; ++s) {
      EXPECT_EQ(results[0][rollout].steps[s].values, results[1][rollout].steps[s].values);
      for (const auto& [name, value] : single_results[rollout].steps[s].values) {
        EXPECT_NEAR(Value(results[0][rollout].steps[s], name), value,
                    1e-5 * (1.0 + std::abs(value)))
            << name << " at rollout " << rollout << " step " << s;
      }
    }
  }
}

// ---- Weight swaps ------------------------------------------------------------------------------

TEST(TrainerTest, ReferenceSwapRestoresTheActorBitwise) {
  TempDir dir;
  const std::string model_dir = MakeModelDir(dir, "m", 8);
  config::Config c = BaseConfig();
  c.algorithm.use_kl_loss = true;
  c.algorithm.kl_loss_coef = 0.1;
  auto trainer = MakeTrainer(model_dir, c);
  auto fresh = MakeTrainer(model_dir, c);
  ASSERT_NE(trainer, nullptr);
  ASSERT_NE(fresh, nullptr);
  const data::RolloutBatch batch = MakeBatch(4, 21);
  Train(*trainer, 0, batch);
  Train(*trainer, 1, batch);

  const std::vector<torch::Tensor> actor = Weights(*trainer);
  const SampleLogProbs actor_lp = LogProbs(*trainer, batch);
  const SampleLogProbs ref_lp = LogProbs(*trainer, batch, PolicyWeights::kRef);
  ExpectBitwiseEqual(Weights(*trainer), actor);
  // The reference is the initial model; the actor has moved away from it.
  ExpectBitwiseEqual(ref_lp, LogProbs(*fresh, batch));
  EXPECT_FALSE(torch::equal(actor_lp.log_probs[0], ref_lp.log_probs[0]));
  ExpectBitwiseEqual(LogProbs(*trainer, batch), actor_lp);

  // A rejected batch changes nothing either.
  data::RolloutBatch bad = batch;
  bad.samples[2].tokens.back() = 101;
  EXPECT_FALSE(trainer->ComputeLogProbs(bad, PolicyWeights::kRef).ok());
  ExpectBitwiseEqual(Weights(*trainer), actor);

  auto teacher = trainer->ComputeLogProbs(batch, PolicyWeights::kTeacher);
  EXPECT_EQ(teacher.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(TrainerTest, RefUpdateIntervalCopiesTheActorIntoTheReference) {
  TempDir dir;
  config::Config c = BaseConfig();
  c.algorithm.use_kl_loss = true;
  c.algorithm.kl_loss_coef = 0.1;
  c.algorithm.ref_update_interval = 2;
  auto trainer = MakeTrainer(MakeModelDir(dir, "m", 8), c);
  ASSERT_NE(trainer, nullptr);
  const data::RolloutBatch batch = MakeBatch(4, 22);
  Train(*trainer, 0, batch);
  EXPECT_FALSE(torch::equal(LogProbs(*trainer, batch, PolicyWeights::kRef).log_probs[0],
                            LogProbs(*trainer, batch).log_probs[0]));
  Train(*trainer, 1, batch);  // (1 + 1) % 2 == 0
  ExpectBitwiseEqual(LogProbs(*trainer, batch, PolicyWeights::kRef), LogProbs(*trainer, batch));
}

TEST(TrainerTest, MegatronOpdSwapsTheTeacherIn) {
  TempDir dir;
  const std::string student_dir = MakeModelDir(dir, "student", 1);
  const std::string teacher_dir = MakeModelDir(dir, "teacher", 2);
  config::Config c = BaseConfig();
  c.algorithm.use_opd = true;
  c.algorithm.opd_type = "megatron";
  c.algorithm.opd_teacher_load = teacher_dir;
  c.algorithm.opd_kl_coef = 0.5;
  auto trainer = MakeTrainer(student_dir, c);
  auto teacher = MakeTrainer(teacher_dir, BaseConfig());
  ASSERT_NE(trainer, nullptr);
  ASSERT_NE(teacher, nullptr);
  const data::RolloutBatch batch = MakeBatch(4, 23);
  ExpectBitwiseEqual(LogProbs(*trainer, batch, PolicyWeights::kTeacher), LogProbs(*teacher, batch));
  EXPECT_FALSE(trainer->SkipsOldLogProbs(1));  // use_opd needs π_old for the penalty
  TrainRolloutResult r = Train(*trainer, 0, batch);
  ASSERT_EQ(r.steps.size(), 1u);
  EXPECT_NE(Value(r.steps[0], "opd_reverse_kl"), 0.0);
  EXPECT_EQ(Value(r.steps[0], "ppo_kl"), 0.0);
  EXPECT_TRUE(r.rollout_values.count("teacher_log_probs"));
}

TEST(TrainerTest, KeepOldActorFollowsTheWeightSyncQueue) {
  TempDir dir;
  config::Config c = BaseConfig();
  c.algorithm.keep_old_actor = true;
  c.weight_sync.interval = 1;
  auto trainer = MakeTrainer(MakeModelDir(dir, "m", 9), c);
  ASSERT_NE(trainer, nullptr);
  const data::RolloutBatch batch = MakeBatch(4, 24);
  const SampleLogProbs initial = LogProbs(*trainer, batch);
  Train(*trainer, 0, batch);
  const SampleLogProbs after_r0 = LogProbs(*trainer, batch);
  ExpectBitwiseEqual(LogProbs(*trainer, batch, PolicyWeights::kOldActor), initial);
  ASSERT_TRUE(trainer->OnWeightsSynced().ok());  // old ← rollout (initial), rollout ← actor
  ExpectBitwiseEqual(LogProbs(*trainer, batch, PolicyWeights::kOldActor), initial);
  ASSERT_TRUE(trainer->OnWeightsSynced().ok());  // old ← rollout (after rollout 0)
  ExpectBitwiseEqual(LogProbs(*trainer, batch, PolicyWeights::kOldActor), after_r0);
}

// ---- Checkpoints -------------------------------------------------------------------------------

TEST(TrainerTest, SaveLoadThenTheNextRolloutIsBitwiseIdentical) {
  TempDir dir;
  const std::string model_dir = MakeModelDir(dir, "m", 10);
  config::Config c = BaseConfig();
  c.algorithm.use_kl_loss = true;
  c.algorithm.kl_loss_coef = 0.1;
  c.train.global_batch_size = 2;
  c.train.lr_decay_style = "cosine";
  c.train.lr_warmup_iters = 2;
  c.train.min_lr = 1e-5;
  c.train.weight_decay = 0.1;
  c.data.num_rollout = 4;
  const data::RolloutBatch r0 = MakeBatch(4, 30), r1 = MakeBatch(4, 31);

  auto a = MakeTrainer(model_dir, c);
  ASSERT_NE(a, nullptr);
  Train(*a, 0, r0);
  auto saved = a->Save(dir.Join("ckpt"), 0, R"({"epoch_id": 1})");
  ASSERT_TRUE(saved.ok()) << saved.status();
  TrainRolloutResult ra = Train(*a, 1, r1);

  auto b = MakeTrainer(model_dir, c);
  ASSERT_NE(b, nullptr);
  auto loaded = b->Load(dir.Join("ckpt"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->rollout_id, 0);
  EXPECT_EQ(loaded->step, 2);
  EXPECT_EQ(b->step(), 2);
  EXPECT_TRUE(loaded->optimizer_loaded);
  EXPECT_NE(loaded->extra_state_json.find("epoch_id"), std::string::npos);
  EXPECT_EQ(b->lr_scheduler().num_steps(), 4);  // 2 steps × 2 samples
  TrainRolloutResult rb = Train(*b, 1, r1);

  ASSERT_EQ(ra.steps.size(), rb.steps.size());
  for (size_t s = 0; s < ra.steps.size(); ++s) {
    EXPECT_EQ(ra.steps[s].values, rb.steps[s].values) << "step " << s;
    EXPECT_EQ(ra.steps[s].step, rb.steps[s].step);
  }
  EXPECT_NE(Value(ra.steps[0], "lr"), Value(ra.steps[1], "lr"));  // the schedule moves
  ExpectBitwiseEqual(Weights(*b), Weights(*a));
  std::vector<torch::Tensor> sa, sb;
  for (const auto& nt : a->optimizer().ExportState().tensors) sa.push_back(nt.tensor.clone());
  for (const auto& nt : b->optimizer().ExportState().tensors) sb.push_back(nt.tensor.clone());
  ExpectBitwiseEqual(sa, sb);
}

TEST(TrainerTest, ResetOptimizerStatesEveryRollout) {
  TempDir dir;
  config::Config c = BaseConfig();
  c.train.reset_optimizer_states = true;
  auto trainer = MakeTrainer(MakeModelDir(dir, "m", 11), c);
  ASSERT_NE(trainer, nullptr);
  const data::RolloutBatch batch = MakeBatch(4, 32);
  Train(*trainer, 0, batch);
  Train(*trainer, 1, batch);
  EXPECT_EQ(trainer->optimizer().step(), 1);  // reset before rollout 1's step
  EXPECT_EQ(trainer->step(), 2);
}

// ---- train.data_pad_size_multiplier -----------------------------------------------------------

// Pack pads the ids with token 0 to the multiple, as a sequence of its own for the forward, and
// keeps the real layout for the log-probs.
TEST(TrainerTest, PackPadsTheMicroBatchToTheMultipleAsItsOwnSequence) {
  const data::RolloutBatch batch = MakeBatch(3, 21);
  const int64_t real = static_cast<int64_t>(batch.samples[0].tokens.size() +
                                            batch.samples[2].tokens.size());
  internal::PackedInputs in = internal::Pack(batch, {0, 2}, torch::kCPU, 16);
  EXPECT_EQ(in.ids.size(0), 16 * ((real + 15) / 16));
  ASSERT_EQ(in.packed.cu_seqlens.size(), 3u);
  EXPECT_EQ(in.packed.cu_seqlens.back(), real);
  ASSERT_EQ(in.forward_cu_seqlens.size(), 4u);
  EXPECT_EQ(in.forward_cu_seqlens[2], real);
  EXPECT_EQ(in.forward_cu_seqlens.back(), in.ids.size(0));
  EXPECT_EQ(in.ids.slice(0, real).abs().sum().item<int64_t>(), 0);  // token 0
  EXPECT_EQ(internal::PackedTokenCount(batch, {0, 2}, 16), in.ids.size(0));
  // Multiple 1 (or an exact fit): no padding sequence.
  internal::PackedInputs unpadded = internal::Pack(batch, {0, 2}, torch::kCPU, 1);
  EXPECT_EQ(unpadded.ids.size(0), real);
  EXPECT_EQ(unpadded.forward_cu_seqlens, unpadded.packed.cu_seqlens);
}

// The padding changes no loss, metric or gradient: two trainers, unpadded and padded to 64
// tokens, train the same batch (KL loss, entropy bonus, two steps with the old-actor and
// reference passes) to the same values and weights, in float32 on the CPU.
TEST(TrainerTest, PaddingChangesNoLossOrGradient) {
  TempDir dir;
  const std::string model_dir = MakeModelDir(dir, "m", 15);
  config::Config c = BaseConfig();
  c.algorithm.use_kl_loss = true;
  c.algorithm.kl_loss_coef = 0.05;
  c.algorithm.entropy_coef = 0.01;
  c.train.global_batch_size = 2;
  config::Config unpadded = c, padded = c;
  unpadded.train.data_pad_size_multiplier = 1;
  padded.train.data_pad_size_multiplier = 64;
  auto a = MakeTrainer(model_dir, unpadded);
  auto b = MakeTrainer(model_dir, padded);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ExpectTheSameTraining(*a, *b, MakeBatch(4, 17), 1e-6, /*same_keys=*/true);
}

// ---- Debug outputs: metrics.log_correct_samples, debug.save_debug_train_data --------------------

// correct_entropy = the mean over samples with raw reward 1 of −(loss-masked mean log-prob) under
// the pre-update policy; log_correct_samples makes the old-actor pass run.
TEST(TrainerTest, CorrectEntropyOfTheCorrectSamples) {
  TempDir dir;
  config::Config c = BaseConfig();
  c.metrics.log_correct_samples = true;
  auto trainer = MakeTrainer(MakeModelDir(dir, "m", 16), c);
  ASSERT_NE(trainer, nullptr);
  EXPECT_FALSE(trainer->SkipsOldLogProbs(1));
  const data::RolloutBatch batch = MakeBatch(4, 19);  // raw_reward 1 for samples 0 and 2
  const SampleLogProbs before = LogProbs(*trainer, batch);
  double want = 0;
  for (int i : {0, 2}) {
    const torch::Tensor m = torch::tensor(batch.samples[i].loss_mask, torch::kFloat32);
    want += -((before.log_probs[i] * m).sum() / m.sum()).item<double>() / 2;
  }
  TrainRolloutResult r = Train(*trainer, 0, batch);
  ASSERT_EQ(r.steps.size(), 1u);
  EXPECT_NEAR(r.rollout_values.at("correct_entropy"), want, 1e-6);
  EXPECT_GT(want, 0.0);
  EXPECT_EQ(Value(r.steps[0], "ppo_kl"), 0.0);  // π_old from the pass equals the training forward
}

// With debug.save_debug_train_data the result lists this rank's samples, where they trained and
// the per-token tensors computed for them.
TEST(TrainerTest, RecordsTheTrainedSamplesForTheDebugDump) {
  TempDir dir;
  config::Config c = BaseConfig();
  c.algorithm.use_kl_loss = true;
  c.algorithm.kl_loss_coef = 0.05;
  c.train.global_batch_size = 2;
  c.train.micro_batch_size = 1;
  auto trainer = MakeTrainer(MakeModelDir(dir, "m", 17), c);
  ASSERT_NE(trainer, nullptr);
  const data::RolloutBatch batch = MakeBatch(4, 23);
  EXPECT_TRUE(Train(*trainer, 0, batch).trained.empty());  // off by default

  c.debug.save_debug_train_data = "unused/{rollout_id}.json";
  auto recording = MakeTrainer(MakeModelDir(dir, "m2", 17), c);
  ASSERT_NE(recording, nullptr);
  TrainRolloutResult r = Train(*recording, 0, batch);
  ASSERT_EQ(r.trained.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    const TrainedSample& t = r.trained[i];
    const size_t response = static_cast<size_t>(batch.samples[i].response_length);
    EXPECT_EQ(t.index, static_cast<int64_t>(i));
    EXPECT_EQ(t.step_in_rollout, static_cast<int64_t>(i / 2));  // 2 samples per step
    EXPECT_EQ(t.micro_batch, static_cast<int64_t>(i % 2));      // 1 sample per micro-batch
    EXPECT_EQ(t.advantages.size(), response);
    EXPECT_EQ(t.log_probs.size(), response);      // two steps: the old-actor pass ran
    EXPECT_EQ(t.ref_log_probs.size(), response);  // the KL loss's reference
    EXPECT_TRUE(t.returns.empty());               // no critic
    // GRPO: every token of a sample carries its (group-normalized) reward as advantage.
    EXPECT_FLOAT_EQ(t.advantages.front(), static_cast<float>(batch.samples[i].reward));
    EXPECT_EQ(t.log_probs, t.ref_log_probs);  // before training, reference = actor
  }
}

// ---- Errors ------------------------------------------------------------------------------------

TEST(TrainerTest, BadBatchesNameTheField) {
  TempDir dir;
  config::Config c = BaseConfig();
  c.algorithm.use_tis = true;
  auto trainer = MakeTrainer(MakeModelDir(dir, "m", 12), c);
  ASSERT_NE(trainer, nullptr);
  data::RolloutBatch good = MakeBatch(4, 40);
  for (data::TrainSample& s : good.samples) s.rollout_log_probs.assign(s.response_length, -4.0f);
  ASSERT_TRUE(trainer->CheckBatch(good).ok());

  auto expect_error = [&](data::RolloutBatch batch, const std::string& needle) {
    auto r = trainer->TrainRollout(0, batch);
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_NE(Msg(r.status()).find(needle), std::string::npos) << r.status();
  };
  data::RolloutBatch b = good;
  b.samples[1].tokens.pop_back();
  expect_error(b, "samples[1].tokens");
  b = good;
  b.samples[2].loss_mask.push_back(1.0f);
  expect_error(b, "samples[2].loss_mask");
  b = good;
  b.samples[0].loss_mask[0] = 0.5f;
  expect_error(b, "samples[0].loss_mask[0]");
  b = good;
  b.temperature = 0.0;
  expect_error(b, "temperature");
  b = good;
  b.temperature = NAN;
  expect_error(b, "temperature");
  b = good;
  b.samples[3].tokens[0] = 101;
  expect_error(b, "samples[3].tokens[0] = 101");
  b = good;
  b.samples[1].rollout_log_probs.clear();
  expect_error(b, "samples[1].rollout_log_probs");
  b = good;
  b.samples[0].rollout_log_probs.pop_back();
  expect_error(b, "samples[0].rollout_log_probs");
  b = good;
  b.samples[2].prompt_length = 0;
  b.samples[2].response_length = static_cast<int64_t>(b.samples[2].tokens.size());
  b.samples[2].loss_mask.assign(b.samples[2].tokens.size(), 1.0f);
  b.samples[2].rollout_log_probs.assign(b.samples[2].tokens.size(), -4.0f);
  expect_error(b, "samples[2].prompt_length");
  b = good;
  b.samples[0].reward = INFINITY;
  expect_error(b, "samples[0].reward");
  b = good;
  b.samples.clear();
  expect_error(b, "samples is empty");
  // Nothing was trained by the failures.
  EXPECT_EQ(trainer->step(), 0);
}

TEST(TrainerTest, UnsupportedOrInvalidOptionsAreRejectedAtCreate) {
  TempDir dir;
  const std::string model_dir = MakeModelDir(dir, "m", 13);
  auto create = [&](const config::Config& c, int dp_size = 1) {
    TrainerOptions o;
    o.model_dir = model_dir;
    o.config = c;
    o.dp_size = dp_size;
    return Trainer::Create(o).status();
  };
  config::Config c = BaseConfig();
  c.algorithm.loss_type = "custom_loss";
  Status s = create(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_NE(Msg(s).find("custom_loss"), std::string::npos) << s;

  c = BaseConfig();
  c.algorithm.advantage_estimator = "grpo_typo";
  EXPECT_NE(Msg(create(c)).find("grpo_typo"), std::string::npos);

  c = BaseConfig();
  c.algorithm.use_opd = true;
  c.algorithm.opd_type = "megatron";
  EXPECT_NE(Msg(create(c)).find("opd_teacher_load"), std::string::npos);

  c = BaseConfig();
  c.algorithm.use_kl_loss = true;
  c.algorithm.kl_loss_coef = 0.1;
  c.checkpoint.ref_load = dir.Join("missing");
  s = create(c);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(Msg(s).find("reference"), std::string::npos) << s;

  EXPECT_NE(Msg(create(BaseConfig(), 2)).find("dp_all_reduce"), std::string::npos);

  c = BaseConfig();
  c.data.num_rollout.reset();
  EXPECT_NE(Msg(create(c)).find("data.num_rollout"), std::string::npos);

  TrainerOptions o;
  o.config = BaseConfig();
  EXPECT_NE(Msg(Trainer::Create(o).status()).find("model_dir"), std::string::npos);
}

}  // namespace
}  // namespace slime::train
