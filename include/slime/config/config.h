// The typed configuration of a slime-cpp job (docs/config.md) and the functions that load it.
//
// One YAML file with thirteen sections (cluster, model, rollout, data, eval, reward, algorithm,
// train, weight_sync, checkpoint, metrics, fault_tolerance, debug) becomes one `Config` value.
// Every key mirrors a flag of THUDM/slime under its snake_case name, with slime's default; the
// full reference (type, default, allowed values, slime flag, meaning) is generated from the
// field table in fields.h into docs/config.md.
//
// Loading = read YAML → follow `base:` includes (deep merge, including file wins) → expand
// `${VAR}` / `${VAR:-default}` → apply `--set section.key=value` overrides → convert every key
// into the typed struct (unknown keys, type, range and enum errors) → ResolveConfig (slime's
// cross-checks and derived values, docs/config.md, "Validation rules and derived values").
// Only a resolved config is handed out by LoadConfig*, so consumers can rely on derived fields
// being set (e.g. `eps_clip_high`, `offload_train`, `global_batch_size`,
// `over_sampling_batch_size`); the comment on each such field says so.
//
// Ownership: plain value types, copy freely. Thread-safety: all functions are pure apart from
// reading files and the environment; concurrent calls are safe.
#ifndef SLIME_CONFIG_CONFIG_H_
#define SLIME_CONFIG_CONFIG_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "slime/common/status.h"

namespace slime::config {

// Placement: nodes, devices, which GPUs (or CPU slots) trainers and engines use.
// "GPU" counts below mean device slots: GPUs on CUDA, CPU slots when there is no GPU.
struct ClusterConfig {
  std::string run_dir = "runs/slime";
  std::string device = "auto";  // auto | cuda | cpu
  int num_nodes = 1;
  int num_gpus_per_node = 8;
  int cpu_slots_per_node = 4;
  std::string placement_strategy = "pack";  // pack | spread
  std::string head_address;                 // host:port; empty = this process is the head
  int actor_num_nodes = 1;
  int actor_num_gpus_per_node = 8;
  // Resolved: colocate → actor GPU count; external engines or debug.train_only → 0.
  std::optional<int> rollout_num_gpus;
  int rollout_num_gpus_per_engine = 1;
  bool colocate = false;
  bool offload = false;                 // shorthand for both offloads below
  std::optional<bool> offload_train;    // resolved: always set
  std::optional<bool> offload_rollout;  // resolved: always set
  std::vector<std::string> rollout_external_engine_addrs;
  // SGLang's --api-key / --admin-api-key of the engines: local engines start with them and
  // every call to an engine (local or external) carries one (EngineAccessToken). Secrets.
  std::string engine_api_key;
  std::string engine_admin_api_key;
  int distributed_timeout_minutes = 10;
  std::map<std::string, std::string> train_env_vars;
  bool operator==(const ClusterConfig&) const = default;
};

struct ModelConfig {
  std::string hf_checkpoint;  // required
  std::optional<std::string> model_name;
  bool operator==(const ModelConfig&) const = default;
};

struct RolloutConfig {
  double temperature = 1.0;
  double top_p = 1.0;
  int top_k = -1;
  std::optional<int> max_context_len;
  std::optional<int> max_prompt_len;  // resolved: max_context_len − 1 when that is set
  std::optional<int> max_response_len;
  bool skip_special_tokens = false;
  bool return_routed_experts = false;  // engines return each token's MoE routing
  std::vector<std::string> stop;
  std::vector<int> stop_token_ids;
  bool shuffle = false;
  int seed = 42;
  std::optional<int> over_sampling_batch_size;  // resolved: always set (≥ rollout_batch_size)
  std::optional<std::string> dynamic_sampling_filter;
  bool partial_rollout = false;
  bool mask_offpolicy_in_partial_rollout = false;
  // --fully-async only: no trained sample's oldest token is more than this many weight
  // versions behind the trainer (the driver checks it; unset there: 1).
  std::optional<int> max_staleness;
  int engine_concurrency = 512;
  double request_timeout_s = 3600;  // one /generate call of the rollout
  int request_max_attempts = 60;    // tries while an engine refuses connections
  std::optional<double> mem_fraction_static;
  // Custom generation (docs/operations.md, "Custom workflows"; rollout/custom_generate.h).
  std::optional<std::string> custom_generate;  // plugin | env | agent; unset = one /generate
  std::optional<std::string> custom_generate_path;    // plugin: the shared library
  std::optional<std::string> custom_generate_config;  // plugin: JSON text (a YAML map becomes it)
  std::optional<std::string> env_url;                 // env: the environment's base URL
  std::vector<std::string> agent_command;             // agent: argv of the agent program
  int max_turns = 8;                                  // model turns per episode
  std::optional<int> max_total_tokens;  // prompt + response cap; resolved: max_context_len
  double episode_timeout_s = 300;
  std::string on_env_error = "fail";  // fail | drop | zero_reward
  int custom_generate_concurrency = 64;
  bool operator==(const RolloutConfig&) const = default;
};

struct DataConfig {
  std::string prompt_data;
  std::string input_key = "input";
  std::optional<std::string> label_key;
  std::string metadata_key = "metadata";
  std::string tool_key = "tools";
  bool apply_chat_template = false;
  std::map<std::string, std::string> apply_chat_template_kwargs;
  bool rollout_global_dataset = true;
  std::optional<int> num_rollout;
  std::optional<int> num_epoch;
  int rollout_batch_size = 0;  // required
  int n_samples_per_prompt = 1;
  std::string on_bad_line = "skip";  // skip | fail
  bool operator==(const DataConfig&) const = default;
};

// One evaluation dataset. After ResolveConfig every optional field except min_new_tokens,
// label_key, rm_type, custom_rm_path, reward_key and env_url is set (inherited from `eval`,
// `rollout`, `data` or `reward` when the entry does not override it).
struct EvalDatasetConfig {
  std::string name;
  std::string path;
  std::optional<int> n_samples;
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<int> top_k;
  std::optional<int> max_response_len;
  std::optional<int> min_new_tokens;
  std::optional<std::vector<std::string>> stop;
  std::optional<std::string> rm_type;
  std::optional<std::string> custom_rm_path;
  std::optional<std::string> reward_key;
  std::optional<std::string> input_key;
  std::optional<std::string> label_key;
  std::optional<std::string> tool_key;
  std::optional<bool> apply_chat_template;
  std::optional<std::string> custom_generate;  // unset: rollout.custom_generate
  std::optional<std::string> env_url;          // unset: rollout.env_url
  bool operator==(const EvalDatasetConfig&) const = default;
};

struct EvalConfig {
  std::optional<int> interval;
  std::vector<EvalDatasetConfig> datasets;
  bool skip_eval_before_train = false;
  int n_samples_per_eval_prompt = 1;
  // Resolved from the rollout values when unset (slime falls back the same way).
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<int> top_k;
  std::optional<int> max_response_len;
  std::optional<int> max_context_len;
  std::optional<int> max_prompt_len;
  std::optional<int> min_new_tokens;
  // Resolved from the data / reward values when unset.
  std::optional<std::string> input_key;
  std::optional<std::string> label_key;
  std::optional<std::string> tool_key;
  std::optional<std::string> reward_key;
  bool operator==(const EvalConfig&) const = default;
};

struct RewardConfig {
  std::optional<std::string> rm_type;  // math, dapo, ...; optional "boxed_" prefix
  std::optional<std::string> rm_url;
  std::optional<std::string> reward_key;
  bool group_rm = false;
  std::optional<std::string> custom_rm_path;
  double rm_timeout_s = 120;      // per remote_rm attempt
  int rm_max_attempts = 10;       // remote_rm attempts (slime: 10)
  double plugin_timeout_s = 60;   // per plugin call
  std::string on_error = "fail";  // fail | value
  double error_reward = 0;        // the reward of a failed sample with on_error: value
  int num_workers = 8;            // concurrent reward calls (threads, plugin processes)
  bool operator==(const RewardConfig&) const = default;
};

struct AlgorithmConfig {
  std::string advantage_estimator = "grpo";
  std::string loss_type = "policy_loss";
  bool compute_advantages_and_returns = true;
  double eps_clip = 0.2;
  std::optional<double> eps_clip_high;  // resolved: eps_clip when unset
  std::optional<double> eps_clip_c;
  double value_clip = 0.2;
  double kl_coef = 0.0;
  bool use_kl_loss = false;
  double kl_loss_coef = 0.0;
  std::string kl_loss_type = "k1";
  bool use_unbiased_kl = false;
  double entropy_coef = 0.0;
  double gamma = 1.0;
  double lambd = 1.0;
  bool normalize_advantages = false;
  bool rewards_normalization = true;
  bool grpo_std_normalization = true;  // resolved: false when n_samples_per_prompt == 1
  bool use_rollout_entropy = false;
  bool use_rollout_logprobs = false;
  bool use_tis = false;
  std::string tis_type = "tis";
  double tis_clip = 2.0;
  double tis_clip_low = 0.0;
  bool get_mismatch_metrics = false;
  bool use_opsm = false;
  double opsm_delta = 1e-4;
  // Routing replay (src/train/routing_replay.h): replay the old-log-prob forward's MoE routing
  // in the training forwards; the rollout's (R3) in every actor forward.
  bool use_routing_replay = false;  // resolved: true with use_rollout_routing_replay
  bool use_rollout_routing_replay = false;
  int num_critic_only_steps = 0;
  bool keep_old_actor = false;
  std::optional<int> ref_update_interval;
  bool use_opd = false;
  std::optional<std::string> opd_type;
  double opd_kl_coef = 1.0;
  std::optional<std::string> opd_teacher_load;
  std::optional<int> opd_teacher_ckpt_step;
  bool operator==(const AlgorithmConfig&) const = default;
};

struct TrainConfig {
  double lr = 1e-6;
  double min_lr = 0.0;
  std::optional<double> critic_lr;      // ppo critic; unset: lr
  std::optional<double> critic_min_lr;  // ppo critic; unset: min_lr
  std::string lr_decay_style = "linear";
  std::optional<int> lr_decay_iters;
  int lr_warmup_iters = 0;
  std::optional<double> lr_warmup_fraction;
  double lr_warmup_init = 0.0;
  double weight_decay = 0.01;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_eps = 1e-8;
  double clip_grad = 1.0;
  bool override_opt_param_scheduler = false;        // resume: keep the configured LR schedule
  bool use_checkpoint_opt_param_scheduler = false;  // resume: keep the checkpoint's
  bool reset_optimizer_states = false;
  bool use_stateless_adam = false;
  bool use_distributed_optimizer = false;  // ZeRO-1 over the data-parallel ranks
  int64_t ddp_bucket_size = 40'000'000;    // gradient elements per DP collective
  bool overlap_grad_reduce = false;  // DP gradient buckets summed during the last backward pass
  int seed = 1234;
  int micro_batch_size = 1;
  std::optional<int> global_batch_size;  // resolved: always set
  std::optional<int> num_steps_per_rollout;
  bool use_dynamic_batch_size = false;
  std::optional<int> max_tokens_per_gpu;
  bool balance_data = false;  // resolved: true with balance_by_flops
  bool balance_by_flops = false;
  int log_probs_chunk_size = -1;
  int data_pad_size_multiplier = 128;
  int tensor_model_parallel_size = 1;
  int pipeline_model_parallel_size = 1;
  int expert_model_parallel_size = 1;  // carved out of the data-parallel ranks (MoE only)
  int context_parallel_size = 1;
  bool sequence_parallel = false;  // resolved: false when tensor_model_parallel_size == 1
  bool bf16 = true;
  std::optional<std::string> recompute_granularity;
  std::optional<std::string> recompute_method;
  std::optional<int> recompute_num_layers;
  bool recompute_loss_function = true;  // slime: false; ours keeps no [tokens, vocab] buffer
  bool calculate_per_token_loss = false;
  double moe_aux_loss_coeff = 0.0;  // MoE load-balancing loss (train/moe_aux_loss.h); 0 = off
  double moe_z_loss_coeff = 0.0;    // MoE router z-loss; 0 = off
  std::optional<int> mtp_num_layers;
  double mtp_loss_scaling_factor = 0.2;
  bool enable_mtp_training = false;
  std::vector<std::string> only_train_params_name_list;
  std::vector<std::string> freeze_params_name_list;
  bool operator==(const TrainConfig&) const = default;
};

struct WeightSyncConfig {
  std::string mode = "full";       // full | delta
  std::string transport = "nccl";  // nccl | disk
  int64_t buffer_size = 512LL * 1024 * 1024;
  int interval = 1;
  std::optional<std::string> disk_dir;
  bool disk_keep_files = false;
  std::optional<std::string> local_checkpoint_dir;
  std::string delta_encoding = "xor";
  std::string delta_checksum = "xxh3-128";
  bool check_weight_update_equal = false;
  bool operator==(const WeightSyncConfig&) const = default;
};

struct CheckpointConfig {
  std::optional<std::string> load;
  std::optional<std::string> save;
  std::optional<int> save_interval;
  std::optional<int> keep_last;
  bool no_save_optim = false;
  bool no_load_optim = false;
  bool async_save = false;
  std::optional<std::string> save_hf;
  std::optional<std::string> ref_load;
  std::optional<int> ref_ckpt_step;
  std::optional<std::string> critic_load;  // ppo: initial critic weights
  std::optional<int> ckpt_step;
  std::optional<int> start_rollout_id;
  bool operator==(const CheckpointConfig&) const = default;
};

struct MetricsConfig {
  std::optional<std::string> jsonl_path;  // resolved: <run_dir>/metrics.jsonl when unset
  std::optional<int> prometheus_port;
  std::string prometheus_host;  // the interface /metrics binds; "" = all with a port, else loopback
  std::optional<std::string> tensorboard_dir;
  bool log_passrate = false;
  bool log_multi_turn = false;
  bool log_correct_samples = false;
  std::optional<std::string> log_reward_category;
  bool operator==(const MetricsConfig&) const = default;
};

struct FaultToleranceConfig {
  bool use_fault_tolerance = false;
  double health_check_interval = 30.0;
  double health_check_timeout = 30.0;
  double health_check_first_wait = 0.0;
  int max_engine_restarts = 3;
  int max_trainer_restarts = 0;
  double restart_backoff = 5.0;
  bool operator==(const FaultToleranceConfig&) const = default;
};

struct DebugConfig {
  bool rollout_only = false;
  bool train_only = false;  // resolved: true with load_debug_rollout_data
  std::optional<std::string> save_debug_rollout_data;
  std::optional<std::string> load_debug_rollout_data;
  std::optional<double> load_debug_rollout_data_subsample;
  std::optional<std::string> save_debug_train_data;
  std::optional<std::string> dump_details;
  std::string log_level = "info";
  bool deterministic_mode = false;
  bool ci_test = false;
  bool ci_disable_kl_checker = false;
  double ci_kl_threshold = 1e-8;
  double ci_train_rollout_logprob_abs_diff_threshold = 0.1;
  std::optional<std::string> ci_save_grad_norm;
  std::optional<std::string> ci_load_grad_norm;
  bool operator==(const DebugConfig&) const = default;
};

struct Config {
  ClusterConfig cluster;
  ModelConfig model;
  RolloutConfig rollout;
  DataConfig data;
  EvalConfig eval;
  RewardConfig reward;
  AlgorithmConfig algorithm;
  TrainConfig train;
  WeightSyncConfig weight_sync;
  CheckpointConfig checkpoint;
  MetricsConfig metrics;
  FaultToleranceConfig fault_tolerance;
  DebugConfig debug;
  bool operator==(const Config&) const = default;
};

// ---- Loading -------------------------------------------------------------------------------

// Every field at its default (not resolved: required keys are still empty and derived fields
// unset). Use it as the starting point for configs built in code, then call ResolveConfig.
Config DefaultConfig();

// Loads `path` (following `base:` includes relative to each including file), applies the
// `--set section.key=value` overrides in order, and resolves. Non-fatal findings (e.g. the CISPO
// clip warning) go to `*warnings` when given, otherwise they are logged with spdlog::warn.
// Errors are InvalidArgument (bad content) or NotFound (missing file) and name the key, the bad
// value and what would be valid.
StatusOr<Config> LoadConfig(const std::string& path, const std::vector<std::string>& set_overrides,
                            std::vector<std::string>* warnings = nullptr);

// As LoadConfig, for YAML text; `base:` paths are relative to `base_dir`.
StatusOr<Config> LoadConfigFromString(const std::string& yaml_text, const std::string& base_dir,
                                      const std::vector<std::string>& set_overrides,
                                      std::vector<std::string>* warnings = nullptr);

// Applies slime's cross-checks and derived values (docs/config.md) plus range/enum checks of
// every field, in place. Idempotent: resolving a resolved config changes nothing. Warnings are
// appended to `*warnings` (may be null). On error `*config` may be partly resolved.
Status ResolveConfig(Config* config, std::vector<std::string>* warnings);

// ---- Output ----------------------------------------------------------------------------------

// The whole config as YAML, every key present (unset optionals as `~`). Loading the text back
// with LoadConfigFromString yields an equal Config when `config` was resolved.
// `redact_secrets`: the values of secret fields (access keys) are written as "<redacted>"; use it
// for anything a person or a log may read. Workers get the config unredacted (over the job's RPC).
std::string ToYaml(const Config& config, bool redact_secrets = false);

// The bearer token the job's HTTP calls to engines carry: the admin key when one is set (it opens
// every route), else the API key; "" when the engines are open.
std::string EngineAccessToken(const ClusterConfig& cluster);

// The reference of every key as Markdown: the full content of docs/config.md.
std::string ConfigReferenceMarkdown();

// ---- Derived quantities the runtime needs ---------------------------------------------------

// Trainer processes: actor_num_nodes × actor_num_gpus_per_node.
int ActorNumGpus(const Config& config);
// Trainer data-parallel size: ActorNumGpus / (tensor × pipeline × context parallel sizes).
int DataParallelSize(const Config& config);
// Local inference engines: rollout_num_gpus / rollout_num_gpus_per_engine (0 when unset).
int NumRolloutEngines(const Config& config);
// slime's use_critic: the estimator needs a critic (algorithms.h; "ppo"), which copies the
// actor's shape.
bool UseCritic(const Config& config);

}  // namespace slime::config

#endif  // SLIME_CONFIG_CONFIG_H_
