// ResolveConfig: every derived value and cross-check (docs/config.md, slime's and our own).
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "slime/config/algorithms.h"
#include "slime/config/config.h"
#include "slime/config/fields.h"
#include "test_util.h"

namespace slime::config {
namespace {

using testing::Contains;
using testing::FailsWith;
using testing::LoadMinimal;
using testing::LoadText;
using testing::kMinimalYaml;

// ---- algorithm ---------------------------------------------------------------------------

TEST(ConfigResolveKl, KlLossNeedsRefLoadEvenWithZeroCoefficient) {
  EXPECT_TRUE(FailsWith(
      LoadMinimal({"algorithm.use_kl_loss=true", "algorithm.kl_loss_coef=0"}),
      {"algorithm.use_kl_loss needs a reference model", "checkpoint.ref_load", "--ref-load"}));
  auto ok = LoadMinimal({"algorithm.use_kl_loss=true", "checkpoint.ref_load=/ref"});
  ASSERT_TRUE(ok.ok()) << ok.status();
}

TEST(ConfigResolveKl, KlCoefNeedsRefLoad) {
  EXPECT_TRUE(
      FailsWith(LoadMinimal({"algorithm.advantage_estimator=ppo", "algorithm.kl_coef=0.01"}),
                {"algorithm.kl_coef needs a reference model", "checkpoint.ref_load"}));
}

TEST(ConfigResolveKl, BothKlCoefficientsNonzeroIsAnError) {
  EXPECT_TRUE(FailsWith(
      LoadMinimal({"checkpoint.ref_load=/ref", "algorithm.kl_coef=0.1",
                   "algorithm.use_kl_loss=true", "algorithm.kl_loss_coef=0.01"}),
      {"algorithm.kl_coef (0.1) and algorithm.kl_loss_coef (0.01) cannot both be nonzero"}));
}

TEST(ConfigResolveKl, RewardKlIgnoredByGrpoWarns) {
  std::vector<std::string> warnings;
  auto c = LoadMinimal({"checkpoint.ref_load=/ref", "algorithm.kl_coef=0.1"}, &warnings);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(
      Contains(warnings, "algorithm.kl_coef = 0.1 has no effect with advantage_estimator 'grpo'"));
  warnings.clear();
  ASSERT_TRUE(LoadMinimal({"algorithm.kl_loss_coef=0.1"}, &warnings).ok());
  EXPECT_TRUE(
      Contains(warnings, "kl_loss_coef = 0.1 has no effect while algorithm.use_kl_loss is false"));
}

TEST(ConfigResolveAlgorithm, ReinforcePlusPlusRequiresNormalizedAdvantages) {
  for (const char* estimator : {"reinforce_plus_plus", "reinforce_plus_plus_baseline"}) {
    std::string set = std::string("algorithm.advantage_estimator=") + estimator;
    EXPECT_TRUE(
        FailsWith(LoadMinimal({set}), {std::string("algorithm.advantage_estimator '") + estimator +
                                       "' requires algorithm.normalize_advantages: true"}));
    EXPECT_TRUE(LoadMinimal({set, "algorithm.normalize_advantages=true"}).ok());
  }
}

TEST(ConfigResolveAlgorithm, RolloutLogprobsExcludeTis) {
  EXPECT_TRUE(
      FailsWith(LoadMinimal({"algorithm.use_rollout_logprobs=true", "algorithm.use_tis=true"}),
                {"algorithm.use_rollout_logprobs and algorithm.use_tis cannot both be true"}));
  EXPECT_TRUE(FailsWith(LoadMinimal({"algorithm.tis_clip_low=3"}),
                        {"algorithm.tis_clip_low (3) must not exceed algorithm.tis_clip (2)"}));
}

TEST(ConfigResolveAlgorithm, EpsClipHighDefaultsToEpsClip) {
  auto c = LoadMinimal({"algorithm.eps_clip=0.3"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->algorithm.eps_clip_high, 0.3);
  auto explicit_high = LoadMinimal({"algorithm.eps_clip_high=0.28"});
  ASSERT_TRUE(explicit_high.ok());
  EXPECT_EQ(explicit_high->algorithm.eps_clip_high, 0.28);
  EXPECT_TRUE(FailsWith(LoadMinimal({"algorithm.eps_clip_c=1"}),
                        {"algorithm.eps_clip_c = 1.0 is out of range; allowed: > 1.0"}));
}

TEST(ConfigResolveAlgorithm, CispoWithLowerClipWarns) {
  std::vector<std::string> warnings;
  ASSERT_TRUE(LoadMinimal({"algorithm.advantage_estimator=cispo"}, &warnings).ok());
  EXPECT_TRUE(Contains(warnings, "algorithm.eps_clip = 0.2 keeps the lower clip bound 0.8 active"));
  warnings.clear();
  ASSERT_TRUE(LoadMinimal({"algorithm.advantage_estimator=cispo", "algorithm.eps_clip=1.0",
                           "algorithm.eps_clip_high=4"},
                          &warnings)
                  .ok());
  EXPECT_FALSE(Contains(warnings, "CISPO"));
}

TEST(ConfigResolveAlgorithm, OnPolicyDistillationRules) {
  EXPECT_TRUE(
      FailsWith(LoadMinimal({"algorithm.use_opd=true"}),
                {"algorithm.use_opd requires algorithm.opd_type: one of 'sglang', 'megatron'"}));
  EXPECT_TRUE(FailsWith(LoadMinimal({"algorithm.use_opd=true", "algorithm.opd_type=megatron"}),
                        {"algorithm.opd_type 'megatron' requires algorithm.opd_teacher_load"}));
  EXPECT_TRUE(LoadMinimal({"algorithm.use_opd=true", "algorithm.opd_type=megatron",
                           "algorithm.opd_teacher_load=/teacher"})
                  .ok());
  EXPECT_TRUE(
      FailsWith(LoadMinimal({"algorithm.use_opd=true", "algorithm.opd_type=sglang",
                             "algorithm.opd_teacher_load=/t", "reward.rm_url=http://t:1"}),
                {"algorithm.opd_teacher_load must not be set with algorithm.opd_type 'sglang'"}));
  EXPECT_TRUE(FailsWith(LoadMinimal({"algorithm.use_opd=true", "algorithm.opd_type=sglang"}),
                        {"algorithm.opd_type 'sglang' requires reward.rm_url"}));
  EXPECT_TRUE(FailsWith(LoadMinimal({"algorithm.opd_teacher_load=/t"}),
                        {"algorithm.opd_teacher_load is set but algorithm.use_opd is false"}));
  // sglang: reward.rm_url is the teacher, so it must be an http URL and cannot also be the
  // remote reward model; without a task reward every reward is 0 and a dynamic filter that
  // drops equal-reward groups would drop them all.
  const std::vector<std::string> sglang = {"algorithm.use_opd=true", "algorithm.opd_type=sglang"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), sglang.begin(), sglang.end());
    return LoadMinimal(more);
  };
  EXPECT_TRUE(with({"reward.rm_url=http://teacher:30000"}).ok());
  EXPECT_TRUE(with({"reward.rm_url=http://teacher:30000/generate", "reward.rm_type=math"}).ok());
  EXPECT_TRUE(FailsWith(with({"reward.rm_url=teacher:30000"}),
                        {"reward.rm_url 'teacher:30000' (the OPD teacher of algorithm.opd_type "
                         "'sglang') must be http://host:port"}));
  EXPECT_TRUE(FailsWith(with({"reward.rm_url=http://teacher:30000", "reward.rm_type=remote_rm"}),
                        {"reward.rm_type 'remote_rm' cannot be used with algorithm.opd_type "
                         "'sglang': reward.rm_url is the teacher server"}));
  EXPECT_TRUE(FailsWith(with({"reward.rm_url=http://teacher:30000",
                              "rollout.dynamic_sampling_filter=check_reward_nonzero_std"}),
                        {"rollout.dynamic_sampling_filter 'check_reward_nonzero_std' would drop "
                         "every group"}));
  EXPECT_TRUE(with({"reward.rm_url=http://teacher:30000", "reward.rm_type=math",
                    "rollout.dynamic_sampling_filter=check_reward_nonzero_std"})
                  .ok());
  EXPECT_TRUE(FailsWith(
      LoadText(std::string(kMinimalYaml) +
                   "eval: {datasets: [{name: e, path: /data/e.jsonl, rm_type: remote_rm}]}\n",
               {"algorithm.use_opd=true", "algorithm.opd_type=sglang",
                "reward.rm_url=http://teacher:30000", "reward.rm_type=math"}),
      {"eval.datasets[0].rm_type 'remote_rm' cannot be used with algorithm.opd_type 'sglang'"}));
  EXPECT_TRUE(FailsWith(LoadMinimal({"algorithm.opd_type=vllm"}),
                        {"algorithm.opd_type: 'vllm' is not one of 'sglang', 'megatron'"}));
}

TEST(ConfigResolveAlgorithm, RoutingReplay) {
  // R3 implies use_routing_replay (its training forwards replay too).
  auto r3 = LoadMinimal({"algorithm.use_rollout_routing_replay=true"});
  ASSERT_TRUE(r3.ok()) << r3.status();
  EXPECT_TRUE(r3->algorithm.use_routing_replay);
  auto alone = LoadMinimal({"algorithm.use_routing_replay=true"});
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_FALSE(alone->algorithm.use_rollout_routing_replay);
  // Replaying the old-log-prob forward's routing needs that forward.
  EXPECT_TRUE(FailsWith(
      LoadMinimal({"algorithm.use_routing_replay=true", "algorithm.use_rollout_logprobs=true"}),
      {"algorithm.use_routing_replay replays the routing of the old-log-prob forward, which "
       "algorithm.use_rollout_logprobs skips"}));
  EXPECT_TRUE(LoadMinimal({"algorithm.use_rollout_routing_replay=true",
                           "algorithm.use_rollout_logprobs=true"})
                  .ok());
  // Custom generation assembles samples without the engines' routing.
  for (const std::string key :
       {"algorithm.use_rollout_routing_replay", "rollout.return_routed_experts"}) {
    EXPECT_TRUE(FailsWith(LoadMinimal({key + "=true", "rollout.custom_generate=env",
                                       "rollout.env_url=http://env:8000"}),
                          {key + " cannot be used with rollout.custom_generate"}))
        << key;
  }
}

TEST(ConfigResolveAlgorithm, MtpIsRefused) {
  // Every refused key is tried in guard_test.cc; these are the messages a user sees.
  EXPECT_TRUE(FailsWith(LoadMinimal({"train.enable_mtp_training=true", "train.mtp_num_layers=1"}),
                        {"2 configuration errors",
                         "train.mtp_num_layers = 1: not supported (multi-token prediction is "
                         "later work); remove the key or leave it unset",
                         "train.enable_mtp_training = true: not supported"}));
}

TEST(ConfigResolveAlgorithm, UseCriticForPpoForcesTrainOffload) {
  auto c = LoadMinimal({"algorithm.advantage_estimator=ppo"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(UseCritic(*c));
  EXPECT_EQ(c->cluster.offload_train, true);
  EXPECT_EQ(c->cluster.offload_rollout, false);
  EXPECT_FALSE(UseCritic(*LoadMinimal()));
}

// The allowed values of both keys are the names of algorithms.h, and every one of them loads
// (with the options its row says it needs); anything else is refused naming the key and
// listing them.
TEST(ConfigAlgorithmNames, AllowedValuesComeFromTheTables) {
  EXPECT_EQ(FindConfigField("algorithm", "advantage_estimator")->allowed,
            AdvantageEstimatorNames());
  EXPECT_EQ(FindConfigField("algorithm", "loss_type")->allowed, LossTypeNames());
  for (const AdvantageEstimatorInfo& info : kAdvantageEstimators) {
    const std::string name(info.name);
    std::vector<std::string> sets = {"algorithm.advantage_estimator=" + name};
    if (info.needs_normalize_advantages) sets.push_back("algorithm.normalize_advantages=true");
    auto c = LoadMinimal(sets);
    ASSERT_TRUE(c.ok()) << name << ": " << c.status();
    EXPECT_EQ(UseCritic(*c), info.critic) << name;
  }
  for (const std::string& name : LossTypeNames()) {
    EXPECT_TRUE(LoadMinimal({"algorithm.loss_type=" + name}).ok()) << name;
  }
}

TEST(ConfigAlgorithmNames, UnknownNamesAreRefusedWithTheValidOnes) {
  EXPECT_TRUE(FailsWith(LoadMinimal({"algorithm.loss_type=custom_loss"}),
                        {"algorithm.loss_type: 'custom_loss' is not one of 'policy_loss', "
                         "'sft_loss'"}));
  EXPECT_TRUE(FailsWith(LoadMinimal({"algorithm.advantage_estimator=rloo"}),
                        {"algorithm.advantage_estimator: 'rloo' is not one of 'grpo', 'gspo', "
                         "'cispo', 'reinforce_plus_plus', 'reinforce_plus_plus_baseline', 'ppo'"}));
}

// ---- debug -------------------------------------------------------------------------------

TEST(ConfigResolveDebug, DumpDetailsSetsBothTemplates) {
  auto c = LoadMinimal({"debug.dump_details=/dump"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->debug.save_debug_rollout_data, "/dump/rollout_data/{rollout_id}.json");
  EXPECT_EQ(c->debug.save_debug_train_data, "/dump/train_data/{rollout_id}_{rank}.json");
}

TEST(ConfigResolveDebug, DumpTemplatesMustDifferAndNameTheRollout) {
  EXPECT_TRUE(
      FailsWith(LoadMinimal({"debug.save_debug_rollout_data=/d/{rollout_id}",
                             "debug.save_debug_train_data=/d/{rollout_id}"}),
                {"debug.save_debug_train_data must differ from debug.save_debug_rollout_data"}));
  EXPECT_TRUE(
      FailsWith(LoadMinimal({"debug.save_debug_rollout_data=/d/x.bin"}),
                {"debug.save_debug_rollout_data = '/d/x.bin' must contain '{rollout_id}'"}));
}

TEST(ConfigResolveDebug, TrainDataTemplateNamesTheRankWithSeveralTrainers) {
  // One trainer: {rollout_id} is enough.
  EXPECT_TRUE(LoadMinimal({"debug.save_debug_train_data=/d/{rollout_id}.json"}).ok());
  EXPECT_TRUE(FailsWith(LoadMinimal({"debug.save_debug_train_data=/d/x.json"}),
                        {"debug.save_debug_train_data = '/d/x.json' must contain '{rollout_id}'"}));
  EXPECT_TRUE(FailsWith(LoadMinimal({"debug.save_debug_train_data=/d/{rollout_id}.json",
                                     "cluster.actor_num_gpus_per_node=2"}),
                        {"debug.save_debug_train_data = '/d/{rollout_id}.json' must contain "
                         "'{rank}': 2 trainer processes"}));
  EXPECT_TRUE(LoadMinimal({"debug.save_debug_train_data=/d/{rollout_id}_{rank}.json",
                           "cluster.actor_num_gpus_per_node=2"})
                  .ok());
}

TEST(ConfigResolveDebug, LoadingRolloutDataImpliesTrainOnly) {
  auto c = LoadMinimal({"debug.load_debug_rollout_data=/d/{rollout_id}.bin",
                        "data.prompt_data=", "cluster.rollout_num_gpus=~"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->debug.train_only);
  EXPECT_EQ(c->cluster.rollout_num_gpus, 0);  // no engines needed
  EXPECT_TRUE(FailsWith(
      LoadMinimal({"debug.load_debug_rollout_data=/d/{rollout_id}.bin", "debug.rollout_only=true"}),
      {"debug.rollout_only and debug.train_only cannot both be true",
       "load_debug_rollout_data implies train_only"}));
  // train_only alone would start no engines and have nothing to train on.
  EXPECT_TRUE(FailsWith(LoadMinimal({"debug.train_only=true"}),
                        {"debug.train_only needs debug.load_debug_rollout_data"}));
}

TEST(ConfigResolveDebug, SubsampleNeedsLoadedRollouts) {
  EXPECT_TRUE(FailsWith(LoadMinimal({"debug.load_debug_rollout_data_subsample=0.5"}),
                        {"debug.load_debug_rollout_data_subsample needs "
                         "debug.load_debug_rollout_data"}));
  EXPECT_TRUE(LoadMinimal({"debug.load_debug_rollout_data=/d/{rollout_id}.json",
                           "debug.load_debug_rollout_data_subsample=0.5", "data.prompt_data=",
                           "cluster.rollout_num_gpus=~"})
                  .ok());
}

TEST(ConfigResolveDebug, RolloutOnlyTurnsColocateAndOffloadOff) {
  auto c = LoadMinimal({"debug.rollout_only=true", "cluster.colocate=true",
                        "cluster.rollout_num_gpus=~", "cluster.actor_num_gpus_per_node=2"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->cluster.colocate);
  EXPECT_EQ(c->cluster.offload_train, false);
  EXPECT_EQ(c->cluster.offload_rollout, false);
  EXPECT_EQ(c->cluster.rollout_num_gpus, 2);  // the actor's GPUs go to engines
}

// ---- cluster -----------------------------------------------------------------------------

TEST(ConfigResolveCluster, ColocateDefaultsOffloadsAndRolloutGpus) {
  auto c = LoadMinimal(
      {"cluster.colocate=true", "cluster.rollout_num_gpus=~", "cluster.actor_num_gpus_per_node=4"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->cluster.offload_train, true);
  EXPECT_EQ(c->cluster.offload_rollout, true);
  EXPECT_EQ(c->cluster.rollout_num_gpus, 4);
  EXPECT_EQ(NumRolloutEngines(*c), 4);
  auto keep = LoadMinimal({"cluster.colocate=true", "cluster.offload_rollout=false"});
  ASSERT_TRUE(keep.ok()) << keep.status();
  EXPECT_EQ(keep->cluster.offload_rollout, false);  // an explicit choice wins
  EXPECT_EQ(keep->cluster.offload_train, true);
}

TEST(ConfigResolveCluster, OffloadShorthandSetsBoth) {
  auto c = LoadMinimal({"cluster.offload=true", "cluster.offload_train=false"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->cluster.offload_train, true);
  EXPECT_EQ(c->cluster.offload_rollout, true);
}

TEST(ConfigResolveCluster, DisaggregatedNeedsRolloutGpus) {
  EXPECT_TRUE(FailsWith(LoadMinimal({"cluster.rollout_num_gpus=~"}),
                        {"cluster.rollout_num_gpus is required when cluster.colocate is false"}));
  EXPECT_TRUE(FailsWith(LoadMinimal({"cluster.rollout_num_gpus=0"}),
                        {"cluster.rollout_num_gpus is 0", "no engine could generate"}));
}

TEST(ConfigResolveCluster, ExternalEngines) {
  auto c = LoadMinimal({"cluster.rollout_num_gpus=~",
                        "cluster.rollout_external_engine_addrs=[\"10.0.0.1:30000\", \"h:1\"]"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->cluster.rollout_num_gpus, 0);
  EXPECT_TRUE(FailsWith(
      LoadMinimal({"cluster.rollout_external_engine_addrs=[h:1]"}),
      {"cluster.rollout_num_gpus = 1 together with cluster.rollout_external_engine_addrs"}));
  EXPECT_TRUE(FailsWith(LoadMinimal({"cluster.rollout_num_gpus=~", "cluster.colocate=true",
                                     "cluster.rollout_external_engine_addrs=[h:1]"}),
                        {"cluster.colocate needs local engines"}));
  EXPECT_TRUE(FailsWith(
      LoadMinimal({"cluster.rollout_num_gpus=~", "cluster.rollout_external_engine_addrs=[nohost]"}),
      {"cluster.rollout_external_engine_addrs[0] = 'nohost' is not host:port"}));
  EXPECT_TRUE(FailsWith(LoadMinimal({"cluster.head_address=h:99999"}),
                        {"cluster.head_address = 'h:99999' is not host:port"}));
}

TEST(ConfigResolveCluster, RolloutGpusDivisibleByEngineSize) {
  EXPECT_TRUE(FailsWith(
      LoadMinimal({"cluster.rollout_num_gpus=3", "cluster.rollout_num_gpus_per_engine=2"}),
      {"cluster.rollout_num_gpus (3) must be divisible by cluster.rollout_num_gpus_per_engine "
       "(2)"}));
  auto c = LoadMinimal({"cluster.rollout_num_gpus=4", "cluster.rollout_num_gpus_per_engine=2"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(NumRolloutEngines(*c), 2);
}

TEST(ConfigResolveCluster, ActorGpusDivisibleByModelParallelism) {
  EXPECT_TRUE(FailsWith(
      LoadMinimal({"cluster.actor_num_gpus_per_node=6", "train.tensor_model_parallel_size=4"}),
      {"the actor's GPUs", "= 6", "train.tensor_model_parallel_size", "4 × 1 × 1 = 4"}));
  auto c = LoadMinimal({"cluster.actor_num_nodes=2", "cluster.num_nodes=2",
                        "cluster.actor_num_gpus_per_node=4", "train.tensor_model_parallel_size=2",
                        "train.pipeline_model_parallel_size=2", "data.rollout_batch_size=8"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(ActorNumGpus(*c), 8);
  EXPECT_EQ(DataParallelSize(*c), 2);
  // Pipeline stages count like tensor-parallel ranks: 3 trainers cannot hold pipelines of 2.
  EXPECT_TRUE(FailsWith(LoadMinimal({"cluster.actor_num_gpus_per_node=3",
                                     "train.pipeline_model_parallel_size=2"}),
                        {"the actor's GPUs", "= 3", "train.pipeline_model_parallel_size",
                         "1 × 2 × 1 = 2"}));
  auto pp = LoadMinimal({"cluster.actor_num_gpus_per_node=4",
                         "train.pipeline_model_parallel_size=2", "data.rollout_batch_size=8"});
  ASSERT_TRUE(pp.ok()) << pp.status();
  EXPECT_EQ(DataParallelSize(*pp), 2);
  EXPECT_TRUE(FailsWith(LoadMinimal({"cluster.actor_num_nodes=2"}),
                        {"cluster.actor_num_nodes (2) exceeds cluster.num_nodes (1)"}));
}

// train.expert_model_parallel_size is carved out of the data-parallel ranks (Megatron's
// layout): it must divide DP (with TP and PP), and the settings it does not work with yet are
// refused by name.
TEST(ConfigResolveCluster, ExpertParallelDividesDataParallel) {
  auto c = LoadMinimal({"cluster.actor_num_gpus_per_node=4", "train.tensor_model_parallel_size=2",
                        "train.expert_model_parallel_size=2", "data.rollout_batch_size=8"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(DataParallelSize(*c), 2);
  EXPECT_EQ(c->train.expert_model_parallel_size, 2);
  // With pipeline stages: EP divides the DP ranks of each stage.
  auto pp =
      LoadMinimal({"cluster.actor_num_nodes=2", "cluster.num_nodes=2",
                   "cluster.actor_num_gpus_per_node=4", "train.pipeline_model_parallel_size=2",
                   "train.expert_model_parallel_size=2", "data.rollout_batch_size=8"});
  ASSERT_TRUE(pp.ok()) << pp.status();
  EXPECT_EQ(DataParallelSize(*pp), 4);
  EXPECT_TRUE(FailsWith(
      LoadMinimal({"cluster.actor_num_gpus_per_node=4", "train.tensor_model_parallel_size=2",
                   "train.expert_model_parallel_size=4", "data.rollout_batch_size=8"}),
      {"train.expert_model_parallel_size (4) must divide the data-parallel "
       "size (2"}));
  const std::vector<std::string> ep2 = {"cluster.actor_num_gpus_per_node=4",
                                        "train.expert_model_parallel_size=2",
                                        "data.rollout_batch_size=8"};
  for (const auto& [set, key] : std::vector<std::pair<std::string, std::string>>{
           {"train.use_distributed_optimizer=true", "train.use_distributed_optimizer"},
           {"train.overlap_grad_reduce=true", "train.overlap_grad_reduce"}}) {
    std::vector<std::string> sets = ep2;
    sets.push_back(set);
    EXPECT_TRUE(FailsWith(LoadMinimal(sets), {"train.expert_model_parallel_size (2)", key})) << set;
  }
  EXPECT_TRUE(FailsWith(LoadMinimal({"train.expert_model_parallel_size=0"}),
                        {"train.expert_model_parallel_size"}));
}

TEST(ConfigResolveCluster, CapacityCheckedForExplicitDevices) {
  EXPECT_TRUE(FailsWith(LoadMinimal({"cluster.device=cpu", "cluster.cpu_slots_per_node=1"}),
                        {"the job needs 2 CPU slots (actor 1 + rollout 1)",
                         "cluster.num_nodes × cluster.cpu_slots_per_node = 1 × 1 = 1"}));
  EXPECT_TRUE(
      FailsWith(LoadMinimal({"cluster.device=cuda", "cluster.num_gpus_per_node=2",
                             "cluster.actor_num_gpus_per_node=4"}),
                {"cluster.actor_num_gpus_per_node (4) exceeds cluster.num_gpus_per_node (2)"}));
  // Colocated jobs need the larger of the two, not the sum.
  EXPECT_TRUE(
      LoadMinimal({"cluster.device=cuda", "cluster.num_gpus_per_node=1", "cluster.colocate=true"})
          .ok());
  EXPECT_TRUE(LoadMinimal({"cluster.device=cpu", "cluster.cpu_slots_per_node=2"}).ok());
}

// ---- batching ----------------------------------------------------------------------------

TEST(ConfigResolveCluster, TrainEnvVarsAreNamesTheRuntimeDoesNotOwn) {
  EXPECT_TRUE(LoadMinimal({"cluster.train_env_vars={NCCL_DEBUG: INFO, MY_VAR_2: x}"}).ok());
  EXPECT_TRUE(FailsWith(LoadMinimal({"cluster.train_env_vars={\"A=B\": x}"}),
                        {"cluster.train_env_vars: 'A=B' is not an environment variable name"}));
  EXPECT_TRUE(FailsWith(LoadMinimal({"cluster.train_env_vars={CUDA_VISIBLE_DEVICES: \"0\"}"}),
                        {"cluster.train_env_vars: CUDA_VISIBLE_DEVICES is set by the runtime"}));
}

TEST(ConfigResolveBatching, NumStepsPerRolloutSetsGlobalBatchSize) {
  auto c = LoadMinimal({"data.rollout_batch_size=8", "data.n_samples_per_prompt=4",
                        "train.num_steps_per_rollout=2"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->train.global_batch_size, 16);
  EXPECT_TRUE(
      FailsWith(LoadMinimal({"data.rollout_batch_size=8", "data.n_samples_per_prompt=4",
                             "train.num_steps_per_rollout=2", "train.global_batch_size=8"}),
                {"train.global_batch_size = 8 disagrees with train.num_steps_per_rollout = 2",
                 "8 × n_samples_per_prompt 4 / 2 = 16"}));
  EXPECT_TRUE(LoadMinimal({"data.rollout_batch_size=8", "data.n_samples_per_prompt=4",
                           "train.num_steps_per_rollout=2", "train.global_batch_size=16"})
                  .ok());
  std::vector<std::string> warnings;
  ASSERT_TRUE(LoadMinimal({"data.rollout_batch_size=5", "train.num_steps_per_rollout=2",
                           "train.use_dynamic_batch_size=true", "train.max_tokens_per_gpu=100"},
                          &warnings)
                  .ok());
  EXPECT_TRUE(Contains(warnings, "not divisible by train.num_steps_per_rollout = 2"));
  EXPECT_TRUE(FailsWith(LoadMinimal({"train.num_steps_per_rollout=5"}),
                        {"train.num_steps_per_rollout = 5 exceeds the 4 samples of a rollout"}));
}

TEST(ConfigResolveBatching, GlobalBatchSizeChecks) {
  EXPECT_TRUE(FailsWith(LoadMinimal({"train.global_batch_size=8"}),
                        {"train.global_batch_size (8) exceeds the samples of one rollout", "= 4"}));
  std::vector<std::string> warnings;
  ASSERT_TRUE(LoadMinimal({"data.rollout_batch_size=6", "train.global_batch_size=4",
                           "train.use_dynamic_batch_size=true", "train.max_tokens_per_gpu=64"},
                          &warnings)
                  .ok());
  EXPECT_TRUE(Contains(warnings, "the last 2 samples of every rollout are dropped"));
  EXPECT_TRUE(
      FailsWith(LoadMinimal({"cluster.actor_num_gpus_per_node=4", "data.rollout_batch_size=6"}),
                {"train.global_batch_size (6) must be divisible by train.micro_batch_size × "
                 "data-parallel size = 1 × 4 = 4"}));
  EXPECT_TRUE(
      FailsWith(LoadMinimal({"cluster.actor_num_gpus_per_node=8",
                             "train.use_dynamic_batch_size=true", "train.max_tokens_per_gpu=64"}),
                {"train.global_batch_size (4) is smaller than the data-parallel size (8)"}));
}

TEST(ConfigResolveBatching, DynamicBatchNeedsMaxTokensAndFlopsBalancing) {
  EXPECT_TRUE(FailsWith(LoadMinimal({"train.use_dynamic_batch_size=true"}),
                        {"train.use_dynamic_batch_size requires train.max_tokens_per_gpu"}));
  EXPECT_TRUE(FailsWith(LoadMinimal({"train.balance_by_flops=true"}),
                        {"train.balance_by_flops requires train.use_dynamic_batch_size: true"}));
  auto c = LoadMinimal({"train.balance_by_flops=true", "train.use_dynamic_batch_size=true",
                        "train.max_tokens_per_gpu=1024"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->train.balance_data);
}

// ---- data and lengths --------------------------------------------------------------------

TEST(ConfigResolveData, GrpoStdNormalizationOffForSingleSamples) {
  EXPECT_FALSE(LoadMinimal()->algorithm.grpo_std_normalization);
  EXPECT_TRUE(LoadMinimal({"data.n_samples_per_prompt=2"})->algorithm.grpo_std_normalization);
}

TEST(ConfigResolveData, OverSamplingBatchSize) {
  EXPECT_EQ(LoadMinimal()->rollout.over_sampling_batch_size, 4);
  EXPECT_EQ(LoadMinimal({"rollout.over_sampling_batch_size=12"})->rollout.over_sampling_batch_size,
            12);
  EXPECT_TRUE(
      FailsWith(LoadMinimal({"rollout.over_sampling_batch_size=3"}),
                {"rollout.over_sampling_batch_size (3) must be >= data.rollout_batch_size (4)"}));
}

TEST(ConfigResolveData, LengthOfTrainingAndPromptData) {
  EXPECT_TRUE(
      FailsWith(LoadMinimal({"data.num_rollout=~"}), {"set data.num_rollout or data.num_epoch"}));
  EXPECT_TRUE(LoadMinimal({"data.num_rollout=~", "data.num_epoch=2"}).ok());
  std::vector<std::string> warnings;
  ASSERT_TRUE(LoadMinimal({"data.num_epoch=2"}, &warnings).ok());
  EXPECT_TRUE(Contains(warnings, "num_epoch is ignored"));
  EXPECT_TRUE(FailsWith(LoadMinimal({"data.prompt_data="}),
                        {"data.prompt_data is required (slime --prompt-data)"}));
  EXPECT_TRUE(LoadMinimal({"data.prompt_data=", "debug.load_debug_rollout_data=/d/{rollout_id}",
                           "cluster.rollout_num_gpus=~"})
                  .ok());
  EXPECT_TRUE(FailsWith(LoadMinimal({"rollout.mask_offpolicy_in_partial_rollout=true"}),
                        {"rollout.mask_offpolicy_in_partial_rollout has no effect without "
                         "rollout.partial_rollout"}));
  EXPECT_TRUE(LoadMinimal({"rollout.mask_offpolicy_in_partial_rollout=true",
                           "rollout.partial_rollout=true"})
                  .ok());
}

TEST(ConfigResolveLengths, PromptLengthFromContextLength) {
  auto c = LoadMinimal({"rollout.max_context_len=4096"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rollout.max_prompt_len, 4095);
  EXPECT_EQ(c->eval.max_context_len, 4096);
  EXPECT_EQ(c->eval.max_prompt_len, 4095);
  EXPECT_TRUE(FailsWith(
      LoadMinimal({"rollout.max_context_len=4096", "rollout.max_prompt_len=4096"}),
      {"rollout.max_prompt_len (4096) must be at most rollout.max_context_len - 1 = 4095"}));
  EXPECT_TRUE(
      FailsWith(LoadMinimal({"eval.max_context_len=100", "eval.max_prompt_len=100"}),
                {"eval.max_prompt_len (100) must be at most eval.max_context_len - 1 = 99"}));
  auto prompt_only = LoadMinimal({"rollout.max_prompt_len=512"});
  ASSERT_TRUE(prompt_only.ok());
  EXPECT_FALSE(prompt_only->eval.max_context_len.has_value());
  EXPECT_EQ(prompt_only->eval.max_prompt_len, 512);
}

// ---- eval and reward ---------------------------------------------------------------------

TEST(ConfigResolveEval, IntervalNeedsDatasets) {
  EXPECT_TRUE(FailsWith(LoadMinimal({"eval.interval=5"}),
                        {"eval.interval is set but eval.datasets is empty"}));
}

TEST(ConfigResolveEval, DatasetsInheritUnsetValues) {
  auto c =
      LoadMinimal({"rollout.temperature=0.9", "rollout.max_response_len=128", "rollout.stop=[x]",
                   "reward.rm_type=math", "reward.reward_key=acc", "data.label_key=answer",
                   "eval.n_samples_per_eval_prompt=3", "eval.top_p=0.95",
                   "eval.datasets=[{name: a, path: /a}, {name: b, path: /b, temperature: 0.6, "
                   "n_samples: 8, rm_type: f1}]"});
  ASSERT_TRUE(c.ok()) << c.status();
  const EvalDatasetConfig& a = c->eval.datasets[0];
  EXPECT_EQ(a.n_samples, 3);
  EXPECT_EQ(a.temperature, 0.9);
  EXPECT_EQ(a.top_p, 0.95);
  EXPECT_EQ(a.top_k, -1);
  EXPECT_EQ(a.max_response_len, 128);
  EXPECT_EQ(a.stop, std::vector<std::string>{"x"});
  EXPECT_EQ(a.rm_type, "math");
  EXPECT_EQ(a.reward_key, "acc");
  EXPECT_EQ(a.label_key, "answer");
  EXPECT_EQ(a.input_key, "input");
  EXPECT_EQ(a.apply_chat_template, false);
  EXPECT_FALSE(a.min_new_tokens.has_value());
  const EvalDatasetConfig& b = c->eval.datasets[1];
  EXPECT_EQ(b.temperature, 0.6);
  EXPECT_EQ(b.n_samples, 8);
  EXPECT_EQ(b.rm_type, "f1");
  EXPECT_EQ(c->eval.reward_key, "acc");
}

TEST(ConfigResolveEval, DatasetNamesAreUnique) {
  EXPECT_TRUE(FailsWith(LoadMinimal({"eval.datasets=[{name: a, path: /a}, {name: a, path: /b}]"}),
                        {"eval.datasets[1].name 'a' is used twice"}));
}

TEST(ConfigResolveReward, RemoteRewardNeedsUrl) {
  EXPECT_TRUE(FailsWith(LoadMinimal({"reward.rm_type=remote_rm"}),
                        {"reward.rm_type 'remote_rm' requires reward.rm_url"}));
  EXPECT_TRUE(LoadMinimal({"reward.rm_type=remote_rm", "reward.rm_url=http://rm:8000/score"}).ok());
  EXPECT_TRUE(FailsWith(LoadMinimal({"eval.datasets=[{name: a, path: /a, rm_type: remote_rm}]"}),
                        {"eval.datasets[0].rm_type 'remote_rm' requires reward.rm_url"}));
}

// ---- train -------------------------------------------------------------------------------

TEST(ConfigResolveTrain, SequenceParallelNeedsTensorParallel) {
  std::vector<std::string> warnings;
  auto c = LoadMinimal({"train.sequence_parallel=true"}, &warnings);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->train.sequence_parallel);
  EXPECT_TRUE(
      Contains(warnings, "train.sequence_parallel needs train.tensor_model_parallel_size > 1"));
  auto tp2 = LoadMinimal({"train.sequence_parallel=true", "train.tensor_model_parallel_size=2",
                          "cluster.actor_num_gpus_per_node=2"});
  ASSERT_TRUE(tp2.ok()) << tp2.status();
  EXPECT_TRUE(tp2->train.sequence_parallel);
}

TEST(ConfigResolveTrain, OptimizerAndScheduleChecks) {
  EXPECT_TRUE(FailsWith(LoadMinimal({"train.min_lr=1e-5"}),
                        {"train.min_lr (1e-05) must not exceed train.lr (1e-06)"}));
  // The PPO critic's LR pair defaults to the actor's values and obeys the same rule.
  EXPECT_TRUE(LoadMinimal({"train.critic_lr=1e-7", "train.min_lr=1e-7"}).ok());
  EXPECT_TRUE(FailsWith(LoadMinimal({"train.critic_min_lr=1e-5"}),
                        {"train.critic_min_lr (1e-05) must not exceed train.critic_lr (1e-06)"}));
  EXPECT_TRUE(LoadMinimal({"train.critic_lr=1e-5", "train.critic_min_lr=1e-6"}).ok());
  EXPECT_TRUE(FailsWith(LoadMinimal({"train.critic_lr=-1"}), {"train.critic_lr"}));
  EXPECT_TRUE(
      FailsWith(LoadMinimal({"train.lr_warmup_fraction=0.1", "train.lr_warmup_iters=10"}),
                {"set only one of train.lr_warmup_fraction (0.1) and train.lr_warmup_iters (10)"}));
  EXPECT_TRUE(FailsWith(LoadMinimal({"train.recompute_method=uniform"}),
                        {"apply only to train.recompute_granularity: full"}));
  EXPECT_TRUE(LoadMinimal({"train.recompute_granularity=full", "train.recompute_method=uniform",
                           "train.recompute_num_layers=1"})
                  .ok());
  EXPECT_TRUE(FailsWith(LoadMinimal({"train.recompute_granularity=selective",
                                     "train.recompute_num_layers=2"}),
                        {"apply only to train.recompute_granularity: full"}));
  EXPECT_TRUE(LoadMinimal({"train.recompute_granularity=selective"}).ok());
  for (const std::string& missing :
       {std::string("train.recompute_method=block"), std::string("train.recompute_num_layers=2")}) {
    EXPECT_TRUE(FailsWith(LoadMinimal({"train.recompute_granularity=full", missing}),
                          {"train.recompute_granularity: full needs train.recompute_method "
                           "(uniform or block) and train.recompute_num_layers"}))
        << missing;
  }
  EXPECT_TRUE(FailsWith(LoadMinimal({"train.recompute_granularity=full",
                                     "train.recompute_method=block",
                                     "train.recompute_num_layers=0"}),
                        {"train.recompute_num_layers"}));
  EXPECT_TRUE(FailsWith(LoadMinimal({"train.recompute_granularity=partial"}),
                        {"train.recompute_granularity"}));
  EXPECT_TRUE(FailsWith(
      LoadMinimal({"train.only_train_params_name_list=[experts]",
                   "train.freeze_params_name_list=[embedding]"}),
      {"set only one of train.only_train_params_name_list and train.freeze_params_name_list"}));
  EXPECT_TRUE(FailsWith(LoadMinimal({"train.use_stateless_adam=true"}),
                        {"train.use_stateless_adam requires checkpoint.no_save_optim: true"}));
  EXPECT_TRUE(FailsWith(LoadMinimal({"train.lr_decay_style=exponential"}),
                        {"'exponential' is not one of 'constant', 'linear', 'cosine'"}));
}

// ---- weight sync, checkpoint, metrics ----------------------------------------------------

TEST(ConfigResolveWeightSync, DiskNeedsADirectoryAndDeltaIsRefused) {
  EXPECT_TRUE(FailsWith(LoadMinimal({"weight_sync.transport=disk"}),
                        {"weight_sync.transport 'disk' requires weight_sync.disk_dir"}));
  EXPECT_TRUE(LoadMinimal({"weight_sync.transport=disk", "weight_sync.disk_dir=/shared"}).ok());
  EXPECT_TRUE(FailsWith(LoadMinimal({"weight_sync.mode=delta", "weight_sync.transport=disk",
                                     "weight_sync.disk_dir=/s"}),
                        {"weight_sync.mode = delta: not supported (delta weight sync is later "
                         "work); remove the key or leave it at its default full"}));
  EXPECT_TRUE(LoadMinimal({"weight_sync.mode=full"}).ok());  // the default, written out
}

TEST(ConfigResolveCheckpoint, SaveIntervalNeedsSave) {
  EXPECT_TRUE(FailsWith(LoadMinimal({"checkpoint.save_interval=10"}),
                        {"checkpoint.save_interval requires checkpoint.save"}));
  EXPECT_TRUE(LoadMinimal({"checkpoint.save_interval=10", "checkpoint.save=/ckpt"}).ok());
  std::vector<std::string> warnings;
  ASSERT_TRUE(LoadMinimal({"checkpoint.keep_last=2"}, &warnings).ok());
  EXPECT_TRUE(Contains(warnings, "checkpoint.keep_last has no effect without checkpoint.save"));
}

TEST(ConfigResolveMetrics, JsonlPathFollowsRunDir) {
  EXPECT_EQ(LoadMinimal({"cluster.run_dir=/runs/a"})->metrics.jsonl_path, "/runs/a/metrics.jsonl");
  EXPECT_EQ(LoadMinimal({"metrics.jsonl_path=/m.jsonl"})->metrics.jsonl_path, "/m.jsonl");
}

TEST(ConfigResolveMetrics, TensorboardDirIsADirectoryOrUnset) {
  EXPECT_TRUE(FailsWith(LoadMinimal({"metrics.tensorboard_dir=''"}),
                        {"metrics.tensorboard_dir is empty"}));
  EXPECT_EQ(LoadMinimal({"metrics.tensorboard_dir=/tb"})->metrics.tensorboard_dir, "/tb");
  EXPECT_FALSE(LoadMinimal({})->metrics.tensorboard_dir.has_value());
}

// ---- programmatic use --------------------------------------------------------------------

TEST(ConfigResolve, IsIdempotent) {
  auto c = LoadMinimal({"cluster.colocate=true", "rollout.max_context_len=100",
                        "debug.dump_details=/d", "train.num_steps_per_rollout=2",
                        "data.n_samples_per_prompt=2", "eval.datasets=[{name: a, path: /a}]"});
  ASSERT_TRUE(c.ok()) << c.status();
  Config again = *c;
  std::vector<std::string> warnings;
  ASSERT_TRUE(ResolveConfig(&again, &warnings).ok());
  EXPECT_TRUE(again == *c);
}

TEST(ConfigResolve, ChecksRangesOfConfigsBuiltInCode) {
  Config c = DefaultConfig();
  c.model.hf_checkpoint = "/m";
  c.data.prompt_data = "/d";
  c.data.rollout_batch_size = 2;
  c.data.num_rollout = 1;
  c.cluster.actor_num_gpus_per_node = 1;
  c.cluster.rollout_num_gpus = 1;
  c.rollout.temperature = 0;
  c.cluster.device = "tpu";
  EXPECT_TRUE(FailsWith(
      ResolveConfig(&c, nullptr),
      {"2 configuration errors", "rollout.temperature = 0.0 is out of range; allowed: > 0.0",
       "cluster.device: 'tpu' is not one of"}));
  c.rollout.temperature = 1.0;
  c.cluster.device = "cpu";
  EXPECT_TRUE(ResolveConfig(&c, nullptr).ok());
  EXPECT_EQ(c.train.global_batch_size, 2);
}

}  // namespace
}  // namespace slime::config
