// Field table, part 2: algorithm, train, weight_sync, checkpoint, metrics, fault_tolerance,
// debug. Each field is registered exactly once; see field_builder.h for the notation.
#include <iterator>

#include "field_builder.h"
#include "slime/common/logging.h"
#include "slime/config/algorithms.h"

namespace slime::config::internal {

void AddAlgorithmFields(std::vector<FieldSpec<Config>>* table) {
  SectionBuilder<AlgorithmConfig> b(table, "algorithm", &Config::algorithm);
  b.Add("advantage_estimator", &AlgorithmConfig::advantage_estimator)
      .ReadBy("rollout", "train")
      .Slime("--advantage-estimator")
      .Enum(AdvantageEstimatorNames())
      .Doc("Advantage estimator and policy-loss family; ppo also trains a critic.");
  b.Add("loss_type", &AlgorithmConfig::loss_type)
      .ReadBy("train")
      .Slime("--loss-type")
      .Enum(LossTypeNames())
      .Doc("policy_loss: the RL objective; sft_loss: token NLL on the loss-masked response.");
  b.Add("compute_advantages_and_returns", &AlgorithmConfig::compute_advantages_and_returns)
      .ReadBy("train")
      .Slime("--disable-compute-advantages-and-returns (inverted)")
      .Doc("Compute reference/old log-probs and advantages before training (off for SFT).");
  b.Add("eps_clip", &AlgorithmConfig::eps_clip)
      .ReadBy("train")
      .Slime("--eps-clip")
      .Min(0)
      .Doc("Lower clip range: the ratio is clipped at 1 - eps_clip.");
  b.Add("eps_clip_high", &AlgorithmConfig::eps_clip_high)
      .ReadBy("train")
      .Slime("--eps-clip-high")
      .Min(0)
      .Doc(
          "Upper clip range (DAPO clip-higher): ratio clipped at 1 + eps_clip_high. Unset: "
          "eps_clip.");
  b.Add("eps_clip_c", &AlgorithmConfig::eps_clip_c)
      .ReadBy("train")
      .Slime("--eps-clip-c")
      .Above(1)
      .Doc("Dual-clip constant c bounding the loss of negative-advantage tokens; unset = off.");
  b.Add("value_clip", &AlgorithmConfig::value_clip)
      .ReadBy("train")
      .Slime("--value-clip")
      .Min(0)
      .Doc("PPO critic value clipping range.");
  b.Add("kl_coef", &AlgorithmConfig::kl_coef)
      .ReadBy("train")
      .Slime("--kl-coef")
      .Min(0)
      .Doc(
          "KL penalty folded into token rewards (ppo and reinforce_plus_plus* only; the "
          "GRPO family ignores it). Needs checkpoint.ref_load when nonzero.");
  b.Add("use_kl_loss", &AlgorithmConfig::use_kl_loss)
      .ReadBy("train")
      .Slime("--use-kl-loss")
      .Doc(
          "Add a KL(policy || reference) term to the loss and compute reference log-probs "
          "(needs checkpoint.ref_load, even with kl_loss_coef 0, which only logs the KL).");
  b.Add("kl_loss_coef", &AlgorithmConfig::kl_loss_coef)
      .ReadBy("train")
      .Slime("--kl-loss-coef")
      .Min(0)
      .Doc("Weight of the KL loss term; cannot be nonzero together with kl_coef.");
  b.Add("kl_loss_type", &AlgorithmConfig::kl_loss_type)
      .ReadBy("train")
      .Slime("--kl-loss-type")
      .Enum({"k1", "k2", "k3", "low_var_kl"})
      .Doc("KL estimator, for the loss term and for the reward penalty.");
  b.Add("use_unbiased_kl", &AlgorithmConfig::use_unbiased_kl)
      .ReadBy("train")
      .Slime("--use-unbiased-kl")
      .Doc("Weight the KL estimate by the policy/old importance ratio.");
  b.Add("entropy_coef", &AlgorithmConfig::entropy_coef)
      .ReadBy("train")
      .Slime("--entropy-coef")
      .Doc("Weight of the entropy bonus (subtracted from the loss).");
  b.Add("gamma", &AlgorithmConfig::gamma)
      .ReadBy("train")
      .Slime("--gamma")
      .Min(0)
      .Max(1)
      .Doc("Discount for GAE and REINFORCE++ returns.");
  b.Add("lambd", &AlgorithmConfig::lambd)
      .ReadBy("train")
      .Slime("--lambd")
      .Min(0)
      .Max(1)
      .Doc("GAE lambda.");
  b.Add("normalize_advantages", &AlgorithmConfig::normalize_advantages)
      .ReadBy("train")
      .Slime("--normalize-advantages")
      .Doc(
          "Whiten advantages over all response tokens of the rollout (required by the "
          "reinforce_plus_plus estimators).");
  b.Add("rewards_normalization", &AlgorithmConfig::rewards_normalization)
      .ReadBy("rollout")
      .Slime("--disable-rewards-normalization (inverted)")
      .Doc(
          "Group-normalize rewards (subtract the group mean) for grpo, gspo, cispo and "
          "reinforce_plus_plus_baseline.");
  b.Add("grpo_std_normalization", &AlgorithmConfig::grpo_std_normalization)
      .ReadBy("rollout")
      .Slime("--disable-grpo-std-normalization (inverted)")
      .Doc(
          "Also divide by the group's standard deviation (grpo, gspo, cispo). false = "
          "Dr.GRPO. Forced false when n_samples_per_prompt is 1.");
  b.Add("use_rollout_entropy", &AlgorithmConfig::use_rollout_entropy)
      .ReadBy("train")
      .Slime("--use-rollout-entropy")
      .Doc("Also compute entropy in the forward-only log-prob pass (for logging).");
  b.Add("use_rollout_logprobs", &AlgorithmConfig::use_rollout_logprobs)
      .ReadBy("train")
      .Slime("--use-rollout-logprobs")
      .Doc("Use the engine's log-probs as the old policy instead of recomputing them.");
  b.Add("use_tis", &AlgorithmConfig::use_tis)
      .ReadBy("train")
      .Slime("--use-tis")
      .Doc(
          "Importance-weight the loss by old/rollout probability ratios (train-inference "
          "mismatch correction).");
  b.Add("tis_type", &AlgorithmConfig::tis_type)
      .ReadBy("train")
      .Slime("--custom-tis-function-path")
      .Enum({"tis", "icepop"})
      .Doc(
          "tis: clamp weights to [tis_clip_low, tis_clip]; icepop: zero tokens whose weight "
          "lies outside that interval.");
  b.Add("tis_clip", &AlgorithmConfig::tis_clip)
      .ReadBy("train")
      .Slime("--tis-clip")
      .Min(0)
      .Doc("Upper bound of the importance weight.");
  b.Add("tis_clip_low", &AlgorithmConfig::tis_clip_low)
      .ReadBy("train")
      .Slime("--tis-clip-low")
      .Min(0)
      .Doc("Lower bound of the importance weight.");
  b.Add("get_mismatch_metrics", &AlgorithmConfig::get_mismatch_metrics)
      .ReadBy("train")
      .Slime("--get-mismatch-metrics")
      .Doc("Report train/rollout mismatch metrics without changing the loss.");
  b.Add("use_opsm", &AlgorithmConfig::use_opsm)
      .ReadBy("train")
      .Slime("--use-opsm")
      .Doc(
          "Off-policy sequence masking: drop negative-advantage tokens of samples whose "
          "mean old-new log-ratio exceeds opsm_delta.");
  b.Add("opsm_delta", &AlgorithmConfig::opsm_delta)
      .ReadBy("train")
      .Slime("--opsm-delta")
      .Min(0)
      .Doc("Threshold of off-policy sequence masking.");
  b.Add("use_routing_replay", &AlgorithmConfig::use_routing_replay)
      .ReadBy("train")
      .Slime("--use-routing-replay")
      .Doc(
          "Routing replay: the old-log-prob forward records each token's mixture-of-experts "
          "routing and the training forwards (and their recomputation) replay it, the "
          "router's weights taken at the replayed experts, so the policy ratio compares one "
          "routing (docs/algorithms.md, \"Routing replay\"). The old-log-prob forward then runs "
          "even with one step per rollout. Needs sparse layers; refused with "
          "use_rollout_logprobs (no old-log-prob forward) and with loss_type sft_loss.");
  b.Add("use_rollout_routing_replay", &AlgorithmConfig::use_rollout_routing_replay)
      .ReadBy("train", "rollout", "workers")
      .Slime("--use-rollout-routing-replay")
      .Doc(
          "Rollout routing replay (R3): the engines return each token's routed experts "
          "(return_routed_experts; our engines are started with --enable-return-routed-experts) "
          "and every actor forward of the trainer (reference, old and training log-probs) "
          "replays them; implies use_routing_replay. Needs sparse layers and samples generated "
          "by the rollout itself (refused with rollout.custom_generate). Costs "
          "4 · layers · top_k bytes per token in the samples.");
  b.Add("num_critic_only_steps", &AlgorithmConfig::num_critic_only_steps)
      .ReadBy("train")
      .Slime("--num-critic-only-steps")
      .Min(0)
      .Doc("ppo: rollouts at the start during which only the critic trains.");
  b.Add("keep_old_actor", &AlgorithmConfig::keep_old_actor)
      .ReadBy("train")
      .Slime("--keep-old-actor")
      .Doc(
          "Keep the weights that generated the data as the old policy (for off-policy "
          "loops).");
  b.Add("ref_update_interval", &AlgorithmConfig::ref_update_interval)
      .ReadBy("train")
      .Slime("--ref-update-interval")
      .Min(1)
      .Doc("Copy the actor into the reference model every N rollouts; unset = never.");
  b.Add("use_opd", &AlgorithmConfig::use_opd)
      .ReadBy("train")
      .Slime("--use-opd")
      .Doc(
          "On-policy distillation: subtract opd_kl_coef × (student − teacher log-prob) of each "
          "sampled token from its advantage (a reverse-KL penalty toward the teacher).");
  b.Add("opd_type", &AlgorithmConfig::opd_type)
      .ReadBy("train")
      .Slime("--opd-type")
      .Enum({"sglang", "megatron"})
      .Doc(
          "Teacher source: `sglang` = any server speaking SGLang's /generate at reward.rm_url "
          "scores each sampled response during rollout (prefill only, at the rollout "
          "temperature; without reward.rm_type or custom_rm_path every reward is 0: pure "
          "distillation); `megatron` = teacher weights (opd_teacher_load) loaded into the "
          "trainer.");
  b.Add("opd_kl_coef", &AlgorithmConfig::opd_kl_coef)
      .ReadBy("train")
      .Slime("--opd-kl-coef")
      .Min(0)
      .Doc("Weight of the distillation penalty.");
  b.Add("opd_teacher_load", &AlgorithmConfig::opd_teacher_load)
      .ReadBy("job", "train")
      .Slime("--opd-teacher-load")
      .Doc("Teacher checkpoint (opd_type megatron only).");
  b.Add("opd_teacher_ckpt_step", &AlgorithmConfig::opd_teacher_ckpt_step)
      .ReadBy("train")
      .Slime("--opd-teacher-ckpt-step")
      .Min(0)
      .Doc("Step of the teacher checkpoint to load.");
}

void AddTrainFields(std::vector<FieldSpec<Config>>* table) {
  SectionBuilder<TrainConfig> b(table, "train", &Config::train);
  b.Add("lr", &TrainConfig::lr).ReadBy("train").Slime("--lr").Min(0).Doc("Peak learning rate.");
  b.Add("min_lr", &TrainConfig::min_lr)
      .ReadBy("train")
      .Slime("--min-lr")
      .Min(0)
      .Doc("Learning rate at the end of the decay; at most lr.");
  b.Add("critic_lr", &TrainConfig::critic_lr)
      .ReadBy("train")
      .Slime("--megatron-config-path (role critic: lr)")
      .Min(0)
      .Doc(
          "ppo: peak learning rate of the critic's own AdamW (same schedule shape as the "
          "actor's). Unset: lr.");
  b.Add("critic_min_lr", &TrainConfig::critic_min_lr)
      .ReadBy("train")
      .Slime("--megatron-config-path (role critic: min_lr)")
      .Min(0)
      .Doc("ppo: the critic's learning rate at the end of the decay; at most critic_lr. Unset: "
           "min_lr.");
  b.Add("lr_decay_style", &TrainConfig::lr_decay_style)
      .ReadBy("train")
      .Slime("--lr-decay-style")
      .Enum({"constant", "linear", "cosine"})
      .Doc("Schedule after warmup (Megatron's default is linear decay to min_lr).");
  b.Add("lr_decay_iters", &TrainConfig::lr_decay_iters)
      .ReadBy("train")
      .Slime("--lr-decay-iters")
      .Min(1)
      .Doc(
          "Optimizer steps over which lr decays. Unset: all steps of the run (num_rollout × "
          "rollout_batch_size × n_samples_per_prompt / global_batch_size).");
  b.Add("lr_warmup_iters", &TrainConfig::lr_warmup_iters)
      .ReadBy("train")
      .Slime("--lr-warmup-iters")
      .Min(0)
      .Doc("Linear warmup steps from lr_warmup_init to lr.");
  b.Add("lr_warmup_fraction", &TrainConfig::lr_warmup_fraction)
      .ReadBy("train")
      .Slime("--lr-warmup-fraction")
      .Min(0)
      .Max(1)
      .Doc("Warmup as a fraction of lr_decay_iters (instead of lr_warmup_iters).");
  b.Add("lr_warmup_init", &TrainConfig::lr_warmup_init)
      .ReadBy("train")
      .Slime("--lr-warmup-init")
      .Min(0)
      .Doc("Learning rate at the start of warmup.");
  b.Add("weight_decay", &TrainConfig::weight_decay)
      .ReadBy("train")
      .Slime("--weight-decay")
      .Min(0)
      .Doc("Decoupled (AdamW) weight decay.");
  b.Add("adam_beta1", &TrainConfig::adam_beta1)
      .ReadBy("train")
      .Slime("--adam-beta1")
      .Min(0)
      .Below(1)
      .Doc("Adam first-moment decay.");
  b.Add("adam_beta2", &TrainConfig::adam_beta2)
      .ReadBy("train")
      .Slime("--adam-beta2")
      .Min(0)
      .Below(1)
      .Doc("Adam second-moment decay.");
  b.Add("adam_eps", &TrainConfig::adam_eps)
      .ReadBy("train")
      .Slime("--adam-eps")
      .Above(0)
      .Doc("Adam denominator epsilon.");
  b.Add("clip_grad", &TrainConfig::clip_grad)
      .ReadBy("train")
      .Slime("--clip-grad")
      .Min(0)
      .Doc("Clip the global gradient norm to this value; 0 = no clipping.");
  b.Add("override_opt_param_scheduler", &TrainConfig::override_opt_param_scheduler)
      .ReadBy("workers")
      .Slime("--override-opt_param-scheduler")
      .Doc(
          "On resume, keep the configured LR schedule even when the checkpoint's differs (e.g. a "
          "run extended with a larger data.num_rollout); default: such a resume is refused.");
  b.Add("use_checkpoint_opt_param_scheduler", &TrainConfig::use_checkpoint_opt_param_scheduler)
      .ReadBy("workers")
      .Slime("--use-checkpoint-opt_param-scheduler")
      .Doc("On resume, continue the checkpoint's LR schedule whatever is configured.");
  b.Add("reset_optimizer_states", &TrainConfig::reset_optimizer_states)
      .ReadBy("train")
      .Slime("--reset-optimizer-states")
      .Doc("Zero the Adam moments and step count before every rollout's training.");
  b.Add("use_stateless_adam", &TrainConfig::use_stateless_adam)
      .ReadBy("train")
      .Slime("--use-stateless-adam")
      .Doc(
          "Adam with moments reset every step (a sign-like update); needs "
          "checkpoint.no_save_optim.");
  b.Add("use_distributed_optimizer", &TrainConfig::use_distributed_optimizer)
      .ReadBy("train", "workers")
      .Slime("--use-distributed-optimizer")
      .Doc(
          "ZeRO-1: each data-parallel rank keeps the float32 master weights and Adam moments of "
          "only its 1/dp contiguous shard of the flattened trainable parameters; a step "
          "reduce-scatters the gradients, updates the shard and all-gathers the parameters. "
          "Checkpoints hold the full per-parameter state, loadable with any dp size and with or "
          "without this. No effect with one data-parallel rank.");
  b.Add("ddp_bucket_size", &TrainConfig::ddp_bucket_size)
      .ReadBy("train")
      .Slime("--ddp-bucket-size")
      .Min(1)
      .Doc(
          "Gradient elements per data-parallel collective: gradients are flattened into "
          "buckets of up to this many elements, one all-reduce (or, with "
          "use_distributed_optimizer, one reduce-scatter and one parameter all-gather) per "
          "bucket; a larger parameter goes alone. Megatron's default of 40M elements is 80 MB "
          "of bf16.");
  b.Add("overlap_grad_reduce", &TrainConfig::overlap_grad_reduce)
      .ReadBy("train")
      .Slime("--overlap-grad-reduce")
      .Doc(
          "Sum the data-parallel gradients while the last micro-batch's backward pass of each "
          "step runs: each bucket (ddp_bucket_size elements, in the order backward finishes "
          "the parameters) is all-reduced as soon as its gradients are final, instead of all "
          "buckets after the pass. Same sums as without it. Applies with the plain optimizer; "
          "with use_distributed_optimizer the reduce-scatter still follows the backward pass "
          "(logged). No effect with one data-parallel rank.");
  b.Add("seed", &TrainConfig::seed).ReadBy("train").Slime("--seed").Doc("Trainer random seed.");
  b.Add("micro_batch_size", &TrainConfig::micro_batch_size)
      .ReadBy("train")
      .Slime("--micro-batch-size")
      .Min(1)
      .Doc("Samples per micro-batch when use_dynamic_batch_size is false.");
  b.Add("global_batch_size", &TrainConfig::global_batch_size)
      .ReadBy("train")
      .Slime("--global-batch-size")
      .Min(1)
      .Doc(
          "Samples (rollouts) per optimizer step. Unset: from num_steps_per_rollout, else "
          "rollout_batch_size × n_samples_per_prompt (one step per rollout).");
  b.Add("num_steps_per_rollout", &TrainConfig::num_steps_per_rollout)
      .ReadBy("train")
      .Slime("--num-steps-per-rollout")
      .Min(1)
      .Doc(
          "Optimizer steps per rollout; sets global_batch_size = rollout_batch_size × "
          "n_samples_per_prompt / num_steps_per_rollout.");
  b.Add("use_dynamic_batch_size", &TrainConfig::use_dynamic_batch_size)
      .ReadBy("train")
      .Slime("--use-dynamic-batch-size")
      .Doc(
          "Pack samples into micro-batches of up to max_tokens_per_gpu × "
          "context_parallel_size tokens.");
  b.Add("max_tokens_per_gpu", &TrainConfig::max_tokens_per_gpu)
      .ReadBy("train")
      .Slime("--max-tokens-per-gpu")
      .Min(1)
      .Doc("Token budget of a packed micro-batch per GPU (required with dynamic batching).");
  b.Add("balance_data", &TrainConfig::balance_data)
      .ReadBy("train")
      .Slime("--balance-data")
      .Doc("Balance micro-batches over data-parallel ranks by estimated FLOPs.");
  b.Add("balance_by_flops", &TrainConfig::balance_by_flops)
      .ReadBy("train")
      .Slime("--balance-by-flops")
      .Doc(
          "Pack micro-batches by estimated FLOPs instead of tokens (needs dynamic batching; "
          "implies balance_data).");
  b.Add("log_probs_chunk_size", &TrainConfig::log_probs_chunk_size)
      .ReadBy("train")
      .Slime("--log-probs-chunk-size")
      .Min(1)
      .AlsoAllow(-1)
      .Doc(
          "Compute log-probs and entropy over chunks of this many tokens to save memory; -1 "
          "= one chunk.");
  b.Add("data_pad_size_multiplier", &TrainConfig::data_pad_size_multiplier)
      .ReadBy("train")
      .Slime("--data-pad-size-multiplier")
      .Min(1)
      .Doc(
          "Packed micro-batches are padded to a multiple of tensor_model_parallel_size × "
          "this.");
  b.Add("tensor_model_parallel_size", &TrainConfig::tensor_model_parallel_size)
      .ReadBy("app", "job", "train", "workers")
      .Slime("--tensor-model-parallel-size")
      .Min(1)
      .Doc(
          "Tensor-parallel size of the trainer (Megatron-style: attention heads, MLP columns "
          "and the vocabulary split over TP ranks). The actor's trainer processes "
          "(actor_num_nodes × actor_num_gpus_per_node) are PP × DP × TP ranks, rank = "
          "pp·DP·TP + dp·TP + tp; "
          "each TP group gathers its shards for checkpoints and for the weight sync (the engines "
          "get full tensors). Works with use_distributed_optimizer (each TP rank's DP group "
          "shards that rank's tensors). Not yet with advantage_estimator ppo.");
  b.Add("pipeline_model_parallel_size", &TrainConfig::pipeline_model_parallel_size)
      .ReadBy("app", "job", "train", "workers")
      .Slime("--pipeline-model-parallel-size")
      .Min(1)
      .Doc("Pipeline-parallel size of the trainer: the decoder layers are split into this many "
           "stages (at most the model's layer count), trained with the 1F1B schedule; trainer "
           "ranks are PP × DP × TP in Megatron's order (data-parallel size = actor GPUs / (TP × "
           "PP × CP)); combines with tensor_model_parallel_size, sequence_parallel and "
           "use_distributed_optimizer. Not yet with advantage_estimator ppo (the trainers' init "
           "fails naming it).");
  b.Add("expert_model_parallel_size", &TrainConfig::expert_model_parallel_size)
      .ReadBy("config", "job", "train", "workers")
      .Slime("--expert-model-parallel-size")
      .Min(1)
      .Doc(
          "Expert-parallel size of the trainer (mixture-of-experts models only): the experts "
          "of every sparse layer are split over this many data-parallel ranks, each holding a "
          "contiguous block of num_experts / EP experts, and each layer's routed tokens go to "
          "their expert's rank and back by all-to-all (Megatron's --expert-model-parallel-size, "
          "expert tensor parallelism = tensor_model_parallel_size). Carved out of data "
          "parallelism: must divide the data-parallel size; DP rank d is EP rank d % EP, and "
          "expert gradients are summed over the DP / EP ranks with the same EP rank. The "
          "router and the other parameters stay replicated. Checkpoints, HF export and the "
          "weight sync hold every expert. Combines with tensor_model_parallel_size and "
          "pipeline_model_parallel_size. Not yet with use_distributed_optimizer, "
          "overlap_grad_reduce or advantage_estimator ppo.");
  b.Add("context_parallel_size", &TrainConfig::context_parallel_size)
      .Refused("context parallelism is later work")
      .Slime("--context-parallel-size")
      .Min(1)
      .Doc("Context-parallel size of the trainer (sequences split across ranks).");
  b.Add("sequence_parallel", &TrainConfig::sequence_parallel)
      .ReadBy("train")
      .Slime("--sequence-parallel")
      .Doc(
          "Shard activations along the sequence inside tensor-parallel groups (no effect "
          "and turned off when tensor_model_parallel_size is 1).");
  b.Add("bf16", &TrainConfig::bf16)
      .ReadBy("workers")
      .Slime("--bf16")
      .Doc("Train in bfloat16 with fp32 master weights; false = fp32.");
  b.Add("recompute_granularity", &TrainConfig::recompute_granularity)
      .ReadBy("train")
      .Slime("--recompute-granularity")
      .Enum({"full", "selective"})
      .Doc(
          "Activation recomputation in the training forward (Megatron's): activations are "
          "dropped in the forward and computed again in the backward; the gradients are "
          "unchanged. full: whole decoder layers (keeps one [tokens, hidden] input per "
          "recomputed group; needs recompute_method and recompute_num_layers). selective: the "
          "core attention of every layer (scores, softmax, probs·V from q, k, v): saves the "
          "score matrices of the math attention path, little with SDPA's fused kernels. Unset: "
          "every activation is kept.");
  b.Add("recompute_method", &TrainConfig::recompute_method)
      .ReadBy("train")
      .Slime("--recompute-method")
      .Enum({"uniform", "block"})
      .Doc(
          "With full recompute: uniform cuts each pipeline stage's layers into groups of "
          "recompute_num_layers (the last may be shorter), each group's input kept and the group "
          "recomputed; block recomputes the first recompute_num_layers layers of each stage one "
          "by one and keeps the activations of the rest.");
  b.Add("recompute_num_layers", &TrainConfig::recompute_num_layers)
      .ReadBy("train")
      .Slime("--recompute-num-layers")
      .Min(1)
      .Doc(
          "With full recompute: layers per recompute group (uniform) or recomputed layers "
          "per pipeline stage (block); at most the layers of a stage (checked when the trainer "
          "loads the model).");
  b.Add("recompute_loss_function", &TrainConfig::recompute_loss_function)
      .ReadBy("train")
      .Slime("--recompute-loss-function")
      .Doc(
          "Compute each log-prob chunk's [chunk, vocab] logits again in the backward instead "
          "of keeping them from the forward. true (our default; slime's is false) keeps "
          "nothing of size [tokens, vocab] between forward and backward (log_probs_chunk_size "
          "bounds the buffers); false keeps every chunk's logits (float32, or bf16 on the fused "
          "GPU path) until the backward and saves one LM-head GEMM per chunk there. Same "
          "results either way.");
  b.Add("calculate_per_token_loss", &TrainConfig::calculate_per_token_loss)
      .ReadBy("train")
      .Slime("--calculate-per-token-loss")
      .Doc("Average the loss over all tokens of the step instead of per-sample token means.");
  b.Add("moe_aux_loss_coeff", &TrainConfig::moe_aux_loss_coeff)
      .ReadBy("train")
      .Slime("--moe-aux-loss-coeff")
      .Min(0)
      .Doc(
          "Weight of the mixture-of-experts load-balancing loss (Megatron's): each sparse "
          "layer adds coeff · E · Σ_e f_e · P_e (f_e: share of the top-k slots routed to expert "
          "e, P_e: mean router probability) over the micro-batch's real tokens; summed over the "
          "layers, token-weighted mean over the step's micro-batches. 0 (Megatron's default) = "
          "off; the model's router_aux_loss_coef is not read (HF's loss pools the layers and "
          "is k times this per-layer term, docs/algorithms.md). Nonzero needs a model with sparse layers (qwen3_moe). Logs train/moe_aux_loss "
          "and train/moe_load_imbalance/layer_{l}.");
  b.Add("moe_z_loss_coeff", &TrainConfig::moe_z_loss_coeff)
      .ReadBy("train")
      .Slime("--moe-z-loss-coeff")
      .Min(0)
      .Doc(
          "Weight of the router z-loss (Megatron's): each sparse layer adds coeff · mean over "
          "tokens of logsumexp(router logits)², reduced like moe_aux_loss_coeff. 0 = off. "
          "Nonzero needs a model with sparse layers. Logs train/moe_z_loss.");
  b.Add("mtp_num_layers", &TrainConfig::mtp_num_layers)
      .Refused("multi-token prediction is later work")
      .Slime("--mtp-num-layers")
      .Min(1)
      .Doc("Multi-token-prediction layers of the model.");
  b.Add("mtp_loss_scaling_factor", &TrainConfig::mtp_loss_scaling_factor)
      .Refused("multi-token prediction is later work")
      .Slime("--mtp-loss-scaling-factor")
      .Min(0)
      .Doc("Weight of the MTP loss.");
  b.Add("enable_mtp_training", &TrainConfig::enable_mtp_training)
      .Refused("multi-token prediction is later work")
      .Slime("--enable-mtp-training")
      .Doc("Also train the MTP layers during RL (needs mtp_num_layers).");
  b.Add("only_train_params_name_list", &TrainConfig::only_train_params_name_list)
      .ReadBy("train")
      .Slime("--only-train-params-name-list")
      .Doc("Regexes: train only parameters whose name matches one; freeze the rest.");
  b.Add("freeze_params_name_list", &TrainConfig::freeze_params_name_list)
      .ReadBy("train")
      .Slime("--freeze-params-name-list")
      .Doc("Regexes: freeze parameters whose name matches one.");
}

void AddWeightSyncFields(std::vector<FieldSpec<Config>>* table) {
  SectionBuilder<WeightSyncConfig> b(table, "weight_sync", &Config::weight_sync);
  b.Add("mode", &WeightSyncConfig::mode)
      .Refused("delta weight sync is later work")
      .Slime("--update-weight-mode")
      .Enum({"full", "delta"})
      .Doc(
          "full: send every parameter. (slime's delta writes only the changed bytes to "
          "disk.)");
  b.Add("transport", &WeightSyncConfig::transport)
      .ReadBy("workers")
      .Slime("--update-weight-transport")
      .Enum({"nccl", "disk"})
      .Doc(
          "nccl: bucketed broadcast from trainers to engines (NCCL on GPU, Gloo on CPU; "
          "colocated engines on the same GPU get IPC handles); disk: write a checkpoint "
          "under disk_dir that engines reload.");
  b.Add("buffer_size", &WeightSyncConfig::buffer_size)
      .ReadBy("workers")
      .Slime("--update-weight-buffer-size")
      .Min(1)
      .Doc("Bytes per broadcast bucket.");
  b.Add("interval", &WeightSyncConfig::interval)
      .ReadBy("job", "train")
      .Slime("--update-weights-interval")
      .Min(1)
      .Doc("Push weights every N rollouts.");
  b.Add("disk_dir", &WeightSyncConfig::disk_dir)
      .ReadBy("workers")
      .Slime("--update-weight-disk-dir")
      .Doc("Directory shared by trainers and engines (required for disk transport).");
  b.Add("disk_keep_files", &WeightSyncConfig::disk_keep_files)
      .ReadBy("workers")
      .Slime("--update-weight-disk-keep-files")
      .Doc("Keep the checkpoints written for disk sync instead of deleting them.");
  b.Add("local_checkpoint_dir", &WeightSyncConfig::local_checkpoint_dir)
      .Refused("delta weight sync is later work")
      .Slime("--update-weight-local-checkpoint-dir")
      .Doc(
          "Engine-host local copy of the weights that deltas are applied to (required for "
          "delta mode).");
  b.Add("delta_encoding", &WeightSyncConfig::delta_encoding)
      .Refused("delta weight sync is later work")
      .Slime("--update-weight-delta-encoding")
      .Enum({"xor", "overwrite"})
      .Doc(
          "xor: new ^ old (apply exactly once); overwrite: changed positions and values "
          "(idempotent).");
  b.Add("delta_checksum", &WeightSyncConfig::delta_checksum)
      .Refused("delta weight sync is later work")
      .Slime("--update-weight-delta-checksum")
      .Enum({"xxh3-128", "blake3", "adler32"})
      .Doc("Per-tensor checksum of delta files.");
  b.Add("check_weight_update_equal", &WeightSyncConfig::check_weight_update_equal)
      .ReadBy("job")
      .Slime("--check-weight-update-equal")
      .Doc(
          "Debug: after every weight sync (the first push included) every engine reports a "
          "checksum per tensor (GET /weights_checksum) and trainer rank 0 compares each with "
          "its own tensor's in the engine's dtype; a difference fails the job naming the "
          "engine and the tensor. Engines must serve that route (slime_train's do).");
}

void AddCheckpointFields(std::vector<FieldSpec<Config>>* table) {
  SectionBuilder<CheckpointConfig> b(table, "checkpoint", &Config::checkpoint);
  b.Add("load", &CheckpointConfig::load)
      .ReadBy("job", "workers")
      .Slime("--load")
      .Doc(
          "Checkpoint to resume from (model, optimizer, RNG, data position). Not a "
          "checkpoint: start from ref_load, else model.hf_checkpoint.");
  b.Add("save", &CheckpointConfig::save)
      .ReadBy("job", "workers")
      .Slime("--save")
      .Doc("Directory checkpoints are written to; to resume, point load at it.");
  b.Add("save_interval", &CheckpointConfig::save_interval)
      .ReadBy("job")
      .Slime("--save-interval")
      .Min(1)
      .Doc("Save every N rollouts and after the last one (requires save).");
  b.Add("keep_last", &CheckpointConfig::keep_last)
      .ReadBy("train")
      .Min(1)
      .Doc("Keep only the newest N checkpoints; unset = keep all.");
  b.Add("no_save_optim", &CheckpointConfig::no_save_optim)
      .ReadBy("train")
      .Slime("--no-save-optim")
      .Doc("Do not save optimizer state (smaller checkpoints; exact resume impossible).");
  b.Add("no_load_optim", &CheckpointConfig::no_load_optim)
      .ReadBy("train")
      .Slime("--no-load-optim")
      .Doc("Do not load optimizer state when resuming.");
  b.Add("async_save", &CheckpointConfig::async_save)
      .ReadBy("job", "train", "workers")
      .Slime("--async-save")
      .Doc(
          "Write checkpoints in the background: the trainer copies its state (weights, "
          "optimizer, RNG, progress) to host memory (pinned on GPU) and goes on while the files "
          "are written, with the same atomic layout (tracker last). The next save, the end of "
          "the job and a stop (signal, error; up to 5 min) wait for a write in flight, and its "
          "failure fails the job there. Costs the checkpoint's size in host memory during the "
          "write.");
  b.Add("save_hf", &CheckpointConfig::save_hf)
      .ReadBy("job")
      .Slime("--save-hf")
      .Doc(
          "Also export a Hugging Face checkpoint at each save; `{rollout_id}` in the path is "
          "replaced.");
  b.Add("ref_load", &CheckpointConfig::ref_load)
      .ReadBy("job", "train")
      .Slime("--ref-load")
      .Doc(
          "Reference model for KL terms (required when use_kl_loss or kl_coef is set); also "
          "the initial actor when load is not a checkpoint.");
  b.Add("ref_ckpt_step", &CheckpointConfig::ref_ckpt_step)
      .ReadBy("train")
      .Slime("--ref-ckpt-step")
      .Min(0)
      .Doc("Step of the reference checkpoint to load.");
  b.Add("critic_load", &CheckpointConfig::critic_load)
      .ReadBy("job", "train")
      .Slime("--megatron-config-path (role critic: load)")
      .Doc(
          "ppo: initial critic weights: a critic checkpoint (a `<save>/critic` directory or one "
          "of its iterations) or an HF directory (new value head). Unset: the actor's initial "
          "weights with a new value head. Resuming from load reads `<load>/critic`.");
  b.Add("ckpt_step", &CheckpointConfig::ckpt_step)
      .ReadBy("workers")
      .Slime("--ckpt-step")
      .Min(0)
      .Doc("Step of the load checkpoint to resume from; unset = the latest.");
  b.Add("start_rollout_id", &CheckpointConfig::start_rollout_id)
      .ReadBy("job")
      .Slime("--start-rollout-id")
      .Min(0)
      .Doc("Override the rollout id to start at (default: loaded step + 1, or 0).");
}

void AddMetricsFields(std::vector<FieldSpec<Config>>* table) {
  SectionBuilder<MetricsConfig> b(table, "metrics", &Config::metrics);
  b.Add("jsonl_path", &MetricsConfig::jsonl_path)
      .ReadBy("job")
      .Doc("One JSON object per logged step. Unset: <cluster.run_dir>/metrics.jsonl.");
  b.Add("prometheus_port", &MetricsConfig::prometheus_port)
      .ReadBy("job")
      .Min(0)
      .Max(65535)
      .Doc(
          "The driver serves Prometheus GET /metrics on this port (0 = any free port) of "
          "prometheus_host; unset = a free port on 127.0.0.1. The address is in "
          "<cluster.run_dir>/driver.json.");
  b.Add("prometheus_host", &MetricsConfig::prometheus_host)
      .ReadBy("job")
      .Doc(
          "The interface (an address of this machine) the driver's /metrics listens on. Empty: "
          "every interface (0.0.0.0) when prometheus_port is set, else 127.0.0.1.");
  b.Add("tensorboard_dir", &MetricsConfig::tensorboard_dir)
      .ReadBy("job")
      .Slime("--use-tensorboard / --tb-project-name")
      .Doc(
          "Also write every metrics record as TensorBoard scalars into a new "
          "events.out.tfevents.* file in this directory (created if missing): each numeric field "
          "of metrics.jsonl is a tag, plotted at the record's step (train steps) or rollout_id, "
          "flushed per record. `tensorboard --logdir` it. Unset = no event files.");
  b.Add("log_passrate", &MetricsConfig::log_passrate)
      .ReadBy("rollout")
      .Slime("--log-passrate")
      .Doc("Log pass@k (k = 1, 2, 4, ... up to the group size).");
  b.Add("log_multi_turn", &MetricsConfig::log_multi_turn)
      .ReadBy("rollout")
      .Slime("--log-multi-turn")
      .Doc(
          "Per rollout, multi_turn/raw_response_length/response_length_{mean,max,min,"
          "clip_ratio} (all response tokens; clipped = reaching rollout.max_response_len), "
          "multi_turn/wo_obs_response_length/response_length_{mean,max,min} (model tokens, "
          "loss mask 1) and multi_turn/multi_turn_metric/round_number_{mean,max,min} "
          "(metadata.round_number, else the runs of model tokens), to the JSONL log and "
          "Prometheus.");
  b.Add("log_correct_samples", &MetricsConfig::log_correct_samples)
      .ReadBy("rollout")
      .Slime("--log-correct-samples")
      .Doc(
          "Per rollout, for the correct samples (reward == 1): rollout/correct_length/"
          "{p25,p50,p75,p100}, the share whose response length falls in each quarter of "
          "rollout.max_response_len, and rollout/trainer/correct_entropy, the mean over them of "
          "the loss-masked mean of −log p under the trainer's pre-update policy (the old-actor "
          "log-prob pass then always runs).");
  b.Add("log_reward_category", &MetricsConfig::log_reward_category)
      .ReadBy("rollout")
      .Slime("--log-reward-category")
      .Doc(
          "Group each rollout's samples by this key — of the reward function's mapping result "
          "(raw_reward), else of the sample's metadata, else 'unknown' — and log "
          "rollout/error_cat/<category> (share of samples) and rollout/reward_cat/<category>/"
          "raw_reward (their mean reward).");
}

void AddFaultToleranceFields(std::vector<FieldSpec<Config>>* table) {
  SectionBuilder<FaultToleranceConfig> b(table, "fault_tolerance", &Config::fault_tolerance);
  b.Add("use_fault_tolerance", &FaultToleranceConfig::use_fault_tolerance)
      .Refused(
          "engine recovery is always on: a lost engine is restarted up to "
          "fault_tolerance.max_engine_restarts times, 0 fails the job instead")
      .Slime("--use-fault-tolerance")
      .Doc("slime's switch for engine health checks and restarts. Here recovery is always on: a "
           "dead engine process is restarted and re-synced (max_engine_restarts), and an engine "
           "that stays unreachable while its process lives fails the job after "
           "health_check_timeout.");
  b.Add("health_check_interval", &FaultToleranceConfig::health_check_interval)
      .ReadBy("job")
      .Slime("--rollout-health-check-interval")
      .Above(0)
      .Doc(
          "While engines generate (rollouts and evals), the driver sends every engine GET "
          "/health_generate (a one-token forward) in rounds this many seconds apart; an engine "
          "of the job that fails one is killed and restarted by the runtime "
          "(max_engine_restarts) and recovered by the rollout. Rounds due while no generation "
          "runs wait for the next one.");
  b.Add("health_check_timeout", &FaultToleranceConfig::health_check_timeout)
      .ReadBy("job")
      .Slime("--rollout-health-check-timeout")
      .Above(0)
      .Doc(
          "Seconds one health check may take before the engine fails it; also how long a lost "
          "engine whose process lives (or an external engine) may stay unreachable before the "
          "job fails.");
  b.Add("health_check_first_wait", &FaultToleranceConfig::health_check_first_wait)
      .ReadBy("job")
      .Slime("--rollout-health-check-first-wait")
      .Min(0)
      .Doc(
          "Seconds from the engines' connection (after the first weight push) before the first "
          "health check round is due (slow-starting engines, e.g. kernel compilation).");
  b.Add("max_engine_restarts", &FaultToleranceConfig::max_engine_restarts)
      .ReadBy("job")
      .Min(0)
      .Doc("Restarts allowed per engine before the job fails.");
  b.Add("max_trainer_restarts", &FaultToleranceConfig::max_trainer_restarts)
      .ReadBy("job")
      .Min(0)
      .Doc("Trainer group restarts allowed (synchronous loop): when a trainer process is lost "
           "(killed, crashed, its node gone) the driver restarts every trainer from the last "
           "checkpoint of this job (checkpoint.save; none yet: the weights the job started "
           "from), re-forms the weight-update group, pushes those weights to the engines and "
           "runs the rollouts after that checkpoint again, with the prompts they had. 0: a lost "
           "trainer fails the job. Not with --async.");
  b.Add("restart_backoff", &FaultToleranceConfig::restart_backoff)
      .ReadBy("job")
      .Min(0)
      .Doc("Seconds to wait before restarting a failed engine or trainer (doubles with each "
           "restart of the same actor).");
}

void AddDebugFields(std::vector<FieldSpec<Config>>* table) {
  SectionBuilder<DebugConfig> b(table, "debug", &Config::debug);
  b.Add("rollout_only", &DebugConfig::rollout_only)
      .ReadBy("job")
      .Slime("--debug-rollout-only")
      .Doc("Run only generation and rewards, no trainers (turns colocate and offload off).");
  b.Add("train_only", &DebugConfig::train_only)
      .ReadBy("config")
      .Slime("--debug-train-only")
      .Doc(
          "Run only trainers, no engines, on the rollouts of load_debug_rollout_data (which "
          "sets it; alone it is an error).");
  b.Add("save_debug_rollout_data", &DebugConfig::save_debug_rollout_data)
      .ReadBy("job")
      .Slime("--save-debug-rollout-data")
      .Doc("Save each rollout's samples to this path template (must contain {rollout_id}).");
  b.Add("load_debug_rollout_data", &DebugConfig::load_debug_rollout_data)
      .ReadBy("job")
      .Slime("--load-debug-rollout-data")
      .Doc(
          "Train on saved rollouts from this path template instead of generating "
          "(implies train_only; must contain {rollout_id}).");
  b.Add("load_debug_rollout_data_subsample", &DebugConfig::load_debug_rollout_data_subsample)
      .ReadBy("job")
      .Slime("--load-debug-rollout-data-subsample")
      .Above(0)
      .Max(1)
      .Doc(
          "Train on this fraction of each loaded rollout's prompt groups: floor(groups × "
          "fraction) of them (at least one), the first half and the last half, whole groups "
          "(slime's head-and-tail cut, on groups). Needs load_debug_rollout_data.");
  b.Add("save_debug_train_data", &DebugConfig::save_debug_train_data)
      .ReadBy("workers")
      .Slime("--save-debug-train-data")
      .Doc("Save each trainer's batch to this path template ({rollout_id}, {rank}).");
  b.Add("dump_details", &DebugConfig::dump_details)
      .ReadBy("config")
      .Slime("--dump-details")
      .Doc(
          "Directory for full dumps: sets save_debug_rollout_data to "
          "<dir>/rollout_data/{rollout_id}.bin and save_debug_train_data to "
          "<dir>/train_data/{rollout_id}.bin.");
  b.Add("log_level", &DebugConfig::log_level)
      .ReadBy("app")
      .Enum(std::vector<std::string>(std::begin(kLogLevels), std::end(kLogLevels)))
      .Doc("Log level of every process.");
  b.Add("deterministic_mode", &DebugConfig::deterministic_mode)
      .ReadBy("rollout", "train", "workers")
      .Slime("--deterministic-mode / --sglang-enable-deterministic-inference")
      .Doc(
          "Per-sample sampling seeds (rollout.seed + index in group), so a rollout's sampling "
          "repeats; and batch-invariant kernels in the engines and trainers (the engines' "
          "--enable-deterministic-inference): a token's log-prob does not depend on its batch, "
          "prefill chunking, prefix-cache hits or the trainer's packing, and the trainer's "
          "log-prob equals the engine's to the bit (train_rollout_logprob_abs_diff = 0). CPU "
          "and CUDA (CUDA builds); on CUDA the fused decode kernels are off. Costs speed "
          "(docs/operations.md, \"Deterministic mode\").");
  b.Add("ci_test", &DebugConfig::ci_test)
      .ReadBy("job")
      .Slime("--ci-test")
      .Doc(
          "Fail the job (naming the metric, value and bound) when a training call breaks "
          "slime's CI invariants: every step's train_rollout_logprob_abs_diff <= "
          "ci_train_rollout_logprob_abs_diff_threshold; unless ci_disable_kl_checker, |ppo_kl| "
          "< ci_kl_threshold on each rollout's first step, |kl_loss| < ci_kl_threshold on the "
          "run's first step and |rollout/log_probs − rollout/ref_log_probs| < ci_kl_threshold "
          "at rollout 0. (slime's log-prob and entropy range checks, which only trained models "
          "meet, are not made.)");
  b.Add("ci_disable_kl_checker", &DebugConfig::ci_disable_kl_checker)
      .ReadBy("job")
      .Slime("--ci-disable-kl-checker")
      .Doc("With ci_test, skip the three KL checks (ppo_kl, kl_loss, log_probs vs ref).");
  b.Add("ci_kl_threshold", &DebugConfig::ci_kl_threshold)
      .ReadBy("job")
      .Min(0)
      .Doc(
          "With ci_test, the strict bound of the KL checks: first-step |ppo_kl|, the run's "
          "first |kl_loss| and rollout 0's |log_probs − ref_log_probs| (slime fixes 1e-8).");
  b.Add("ci_train_rollout_logprob_abs_diff_threshold",
        &DebugConfig::ci_train_rollout_logprob_abs_diff_threshold)
      .ReadBy("job")
      .Slime("--ci-train-rollout-logprob-abs-diff-threshold")
      .Min(0)
      .Doc(
          "With ci_test, every step's train_rollout_logprob_abs_diff (mean |trainer − engine| "
          "log-prob over loss tokens, when the batch has the engines' log-probs) must be <= "
          "this.");
  b.Add("ci_save_grad_norm", &DebugConfig::ci_save_grad_norm)
      .ReadBy("job")
      .Slime("--ci-save-grad-norm")
      .Doc(
          "Write each step's grad norm (role actor: grad_norm, critic: critic_grad_norm) as "
          "text to this template ({role}, {rollout_id}, {step_id} = step within the rollout), "
          "atomically; with or without ci_test.");
  b.Add("ci_load_grad_norm", &DebugConfig::ci_load_grad_norm)
      .ReadBy("job")
      .Slime("--ci-load-grad-norm")
      .Doc(
          "Compare each step's grad norm with the one ci_save_grad_norm wrote at this "
          "template: a missing file or a difference above 1% of the saved value fails the "
          "job.");
}

}  // namespace slime::config::internal
