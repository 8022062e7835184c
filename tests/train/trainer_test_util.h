// Shared helpers of the Trainer tests (trainer_test.cc, critic_test.cc, gpu_test.cc and the
// parallel ones): a tiny random model directory (the Qwen3 config, or any edited config JSON),
// the base GRPO config, deterministic batches, and small accessors. Header-only; include from
// tests/train/ only. The multi-rank thread harness is multi_rank_harness.h.
#ifndef SLIME_TESTS_TRAIN_TRAINER_TEST_UTIL_H_
#define SLIME_TESTS_TRAIN_TRAINER_TEST_UTIL_H_

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "slime/config/config.h"
#include "slime/model/checkpoint.h"
#include "slime/model/config.h"
#include "slime/model/decoder.h"
#include "slime/model/weights.h"
#include "slime/train/trainer.h"

#ifndef SLIME_MODEL_TEST_DATA_DIR
#define SLIME_MODEL_TEST_DATA_DIR ""  // test_util.h's data dir is not used here
#endif
#include "../model/test_util.h"

namespace slime::train::test_util {

using model::testing::TempDir;

inline std::string Msg(const Status& s) { return std::string(s.message()); }

// Replaces the first `from` in `json` with `to` (a test failure if there is none): edits a
// tiny config before MakeModelDirFromJson.
inline void Replace(std::string& json, const std::string& from, const std::string& to) {
  const size_t at = json.find(from);
  ASSERT_NE(at, std::string::npos) << from;
  json.replace(at, from.size(), to);
}

// An HF model directory dir/name with the model config `config_json` and random float32
// weights drawn from `seed`.
inline std::string MakeModelDirFromJson(const TempDir& dir, const std::string& name,
                                        const std::string& config_json, uint64_t seed) {
  const std::string path = dir.Join(name);
  auto config = model::ParseModelConfigJson(config_json, "tiny");
  EXPECT_TRUE(config.ok()) << config.status();
  auto weights = model::RandomWeights(*config, seed, {});
  EXPECT_TRUE(weights.ok()) << weights.status();
  model::testing::WriteFile(path + "/config.json", config_json);
  Status saved = model::SaveWeights(path, *weights, *config);
  EXPECT_TRUE(saved.ok()) << saved;
  return path;
}

// An HF model directory with the tiny Qwen3 config and random float32 weights.
inline std::string MakeModelDir(const TempDir& dir, const std::string& name, uint64_t seed) {
  return MakeModelDirFromJson(dir, name, model::testing::TinyQwen3ConfigJson(), seed);
}

// GRPO, one step per rollout of 4 samples, constant LR, no decay.
inline config::Config BaseConfig() {
  config::Config c = config::DefaultConfig();
  c.algorithm.advantage_estimator = "grpo";
  c.train.lr = 1e-3;
  c.train.lr_decay_style = "constant";
  c.train.weight_decay = 0.0;
  c.train.global_batch_size = 4;
  c.train.micro_batch_size = 2;
  c.data.num_rollout = 100;
  c.data.rollout_batch_size = 4;
  c.data.n_samples_per_prompt = 1;
  return c;
}

// The model-parallel tests' config (tensor_parallel_test.cc, pipeline_parallel_test.cc), run
// against one rank: GRPO with a KL loss to the reference, an entropy bonus, advantage whitening
// and clipping by the global gradient norm; a batch of 8 samples is 2 optimizer steps of 4
// micro-batches per rollout.
inline config::Config ModelParallelConfig() {
  config::Config c = BaseConfig();
  c.algorithm.use_kl_loss = true;
  c.algorithm.kl_loss_coef = 0.05;
  c.algorithm.entropy_coef = 0.01;
  c.algorithm.normalize_advantages = true;
  c.train.micro_batch_size = 1;
  c.train.global_batch_size = 4;
  c.train.clip_grad = 0.5;
  return c;
}

inline std::unique_ptr<Trainer> MakeTrainer(const std::string& model_dir,
                                            const config::Config& config) {
  TrainerOptions o;
  o.model_dir = model_dir;
  o.config = config;
  auto trainer = Trainer::Create(o);
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  return trainer.ok() ? std::move(*trainer) : nullptr;
}

// A deterministic batch: prompts of 2–5 tokens, responses of 3–8 with a few masked tokens,
// rewards alternating +1 / −1 (already post-processed).
inline data::RolloutBatch MakeBatch(int num_samples, uint32_t seed, double temperature = 1.0) {
  std::mt19937 rng(seed);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  data::RolloutBatch b;
  b.temperature = temperature;
  for (int i = 0; i < num_samples; ++i) {
    data::TrainSample s;
    s.prompt_length = uniform(2, 5);
    s.response_length = uniform(3, 8);
    for (int64_t t = 0; t < s.prompt_length + s.response_length; ++t) {
      s.tokens.push_back(uniform(0, 100));
    }
    for (int64_t t = 0; t < s.response_length; ++t) {
      s.loss_mask.push_back(t == 1 && i % 2 == 1 ? 0.0f : 1.0f);
    }
    s.reward = i % 2 == 0 ? 1.0 : -1.0;
    s.raw_reward = i % 2 == 0 ? 1.0 : 0.0;
    b.samples.push_back(std::move(s));
  }
  return b;
}

inline std::vector<torch::Tensor> Weights(const Trainer& trainer) {
  std::vector<torch::Tensor> out;
  for (const model::NamedTensor& nt :
       model::NamedParameters(trainer.model().weights(), trainer.model().config())) {
    out.push_back(nt.tensor.detach().clone());
  }
  return out;
}

// got and want have the same shape and differ by less than `tol` anywhere.
inline void ExpectClose(const torch::Tensor& got, const torch::Tensor& want,
                        const std::string& what, double tol = 1e-5) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const torch::Tensor diff =
      got.to(torch::kCPU, torch::kFloat32) - want.to(torch::kCPU, torch::kFloat32);
  EXPECT_LT(diff.abs().max().item<double>(), tol) << what;
}

inline void ExpectBitwiseEqual(const std::vector<torch::Tensor>& a,
                               const std::vector<torch::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "tensor " << i;
}

inline void ExpectBitwiseEqual(const SampleLogProbs& a, const SampleLogProbs& b) {
  ExpectBitwiseEqual(a.log_probs, b.log_probs);
}

inline SampleLogProbs LogProbs(Trainer& trainer, const data::RolloutBatch& batch,
                               PolicyWeights which = PolicyWeights::kActor) {
  auto r = trainer.ComputeLogProbs(batch, which);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : SampleLogProbs{};
}

inline TrainRolloutResult Train(Trainer& trainer, int64_t rollout_id,
                                const data::RolloutBatch& batch) {
  auto r = trainer.TrainRollout(rollout_id, batch);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : TrainRolloutResult{};
}

// Σ_i r̃_i · (loss-masked mean log-prob of sample i): what GRPO increases.
inline double Objective(const SampleLogProbs& lp, const data::RolloutBatch& batch) {
  double j = 0;
  for (size_t i = 0; i < batch.samples.size(); ++i) {
    const torch::Tensor m = torch::tensor(batch.samples[i].loss_mask, torch::kFloat32);
    j += batch.samples[i].reward * ((lp.log_probs[i] * m).sum() / m.sum()).item<double>();
  }
  return j;
}

inline double Value(const TrainStepMetrics& step, const std::string& name) {
  auto it = step.values.find(name);
  EXPECT_NE(it, step.values.end()) << "no metric " << name;
  return it == step.values.end() ? NAN : it->second;
}

}  // namespace slime::train::test_util

#endif  // SLIME_TESTS_TRAIN_TRAINER_TEST_UTIL_H_
