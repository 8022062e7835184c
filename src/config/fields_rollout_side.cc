// Field table, part 1: cluster, model, rollout, data, eval (+ dataset entries), reward.
// Each field is registered exactly once; see field_builder.h for the notation.
#include "field_builder.h"

namespace slime::config::internal {

const std::vector<std::string>& RewardModelTypes() {
  static const std::vector<std::string> kTypes = {"math", "dapo",    "deepscaler", "f1",
                                                  "gpqa", "ifbench", "remote_rm",  "random",
                                                  "exact_match"};
  return kTypes;
}

void AddClusterFields(std::vector<FieldSpec<Config>>* table) {
  SectionBuilder<ClusterConfig> b(table, "cluster", &Config::cluster);
  b.Add("run_dir", &ClusterConfig::run_dir)
      .ReadBy("app", "job", "workers", "workflow")
      .Doc("Directory of this run: per-actor logs, metrics and the resolved config go here.");
  b.Add("device", &ClusterConfig::device)
      .ReadBy("app")
      .Enum({"auto", "cuda", "cpu"})
      .Doc(
          "Device for trainers and engines. `auto` uses CUDA when a GPU is visible, else CPU "
          "slots.");
  b.Add("num_nodes", &ClusterConfig::num_nodes)
      .ReadBy("app", "job")
      .Min(1)
      .Doc("Nodes in the job (the head node plus one `slime_train agent` per other node).");
  b.Add("num_gpus_per_node", &ClusterConfig::num_gpus_per_node)
      .ReadBy("app", "job")
      .Slime("--num-gpus-per-node")
      .Min(1)
      .Doc("GPUs per node used for placement on CUDA. Set it when a node has fewer than 8.");
  b.Add("cpu_slots_per_node", &ClusterConfig::cpu_slots_per_node)
      .ReadBy("app", "job")
      .Min(1)
      .Doc(
          "Device slots per node when running on CPU; each trainer rank or engine GPU takes "
          "one slot.");
  b.Add("placement_strategy", &ClusterConfig::placement_strategy)
      .ReadBy("app")
      .Enum({"pack", "spread"})
      .Doc(
          "How bundles are laid over nodes: `pack` fills a node before the next (slime's "
          "PACK), `spread` round-robins over nodes.");
  b.Add("head_address", &ClusterConfig::head_address)
      .ReadBy("job")
      .Doc(
          "host:port of the runtime head. Empty: this process is the head and listens on a "
          "free port.");
  b.Add("actor_num_nodes", &ClusterConfig::actor_num_nodes)
      .ReadBy("app")
      .Slime("--actor-num-nodes")
      .Min(1)
      .Doc("Nodes used by the training actor (the PPO critic copies the actor's shape).");
  b.Add("actor_num_gpus_per_node", &ClusterConfig::actor_num_gpus_per_node)
      .ReadBy("app")
      .Slime("--actor-num-gpus-per-node")
      .Min(1)
      .Doc("GPUs (or CPU slots) per node for the training actor; one trainer process each.");
  b.Add("rollout_num_gpus", &ClusterConfig::rollout_num_gpus)
      .ReadBy("app", "workers")
      .Slime("--rollout-num-gpus")
      .Min(0)
      .Doc(
          "Total GPUs (or CPU slots) for inference engines. Unset: the actor's GPU count when "
          "colocated, 0 with external engines or debug.train_only; required otherwise. 0 = "
          "no local engines.");
  b.Add("rollout_num_gpus_per_engine", &ClusterConfig::rollout_num_gpus_per_engine)
      .ReadBy("app", "job", "workers")
      .Slime("--rollout-num-gpus-per-engine")
      .Min(1)
      .Doc(
          "GPUs per inference engine (its tensor-parallel size): one engine process splits the "
          "model over them, one thread per device (NCCL between GPUs, Gloo between CPU slots); "
          "it must divide the model's num_attention_heads, num_key_value_heads, "
          "intermediate_size and vocab_size (checked when the engines start). External engines: "
          "each server's GPU count.");
  b.Add("colocate", &ClusterConfig::colocate)
      .ReadBy("app", "job", "workers")
      .Slime("--colocate")
      .Doc(
          "Trainers and engines share the same GPUs and take turns (turns both offloads on "
          "unless set explicitly).");
  b.Add("offload", &ClusterConfig::offload)
      .ReadBy("config")
      .Slime("--offload")
      .Doc("Shorthand for offload_train: true and offload_rollout: true.");
  b.Add("offload_train", &ClusterConfig::offload_train)
      .ReadBy("job")
      .Slime("--offload-train")
      .Doc(
          "Trainers release GPU memory outside their train step. Unset: equals colocate; "
          "always true for ppo (actor and critic share GPUs).");
  b.Add("offload_rollout", &ClusterConfig::offload_rollout)
      .ReadBy("job")
      .Slime("--offload-rollout")
      .Doc(
          "Engines release weights, KV cache and graphs while trainers run. Unset: equals "
          "colocate.");
  b.Add("rollout_external_engine_addrs", &ClusterConfig::rollout_external_engine_addrs)
      .ReadBy("job")
      .Slime("--rollout-external-engine-addrs")
      .Doc(
          "host:port of already running SGLang-compatible servers to use instead of local "
          "engines.");
  b.Add("engine_api_key", &ClusterConfig::engine_api_key)
      .ReadBy("config", "workers")
      .Secret()
      .Doc(
          "SGLang's --api-key for the engines: local engines require it on every route but "
          "/health, and every call the job makes to an engine (local or external) sends it as "
          "`Authorization: Bearer`. The driver's own /metrics requires it too. Write `${NAME}` to take it from an environment variable; "
          "never logged, shown as <redacted> by --dry-run. Empty: engines are open.");
  b.Add("engine_admin_api_key", &ClusterConfig::engine_admin_api_key)
      .ReadBy("config", "workers")
      .Secret()
      .Doc(
          "SGLang's --admin-api-key for the engines: when set, only it opens the routes that "
          "change state (weight updates, memory release/resume, pause/continue, flush, abort); "
          "the job then sends it on every call. Same handling as engine_api_key.");
  b.Add("distributed_timeout_minutes", &ClusterConfig::distributed_timeout_minutes)
      .ReadBy("workers")
      .Slime("--distributed-timeout-minutes")
      .Min(1)
      .Doc("Timeout of collective operations between trainers and engines.");
  b.Add("train_env_vars", &ClusterConfig::train_env_vars)
      .ReadBy("job")
      .Slime("--train-env-vars")
      .Doc(
          "Environment variables (a mapping of name: value) set in every trainer worker "
          "process at its start, over what its node agent inherited; engines do not get them. "
          "CUDA_VISIBLE_DEVICES and the runtime's SLIME_* variables are refused (the runtime "
          "sets them per process).");
}

void AddModelFields(std::vector<FieldSpec<Config>>* table) {
  SectionBuilder<ModelConfig> b(table, "model", &Config::model);
  b.Add("hf_checkpoint", &ModelConfig::hf_checkpoint)
      .ReadBy("job", "workers", "workflow")
      .Slime("--hf-checkpoint")
      .Required()
      .Doc(
          "Hugging Face model directory: architecture, tokenizer, and the initial weights "
          "when no checkpoint is loaded.");
  b.Add("model_name", &ModelConfig::model_name)
      .ReadBy("workers")
      .Slime("--model-name")
      .Doc(
          "Name the engines serve the model under (`model` in OpenAI responses, /v1/models). "
          "Unset: hf_checkpoint. (slime picks its weight converter by it; here the converter "
          "follows `model_type` in the checkpoint's config.json.)");
}

void AddRolloutFields(std::vector<FieldSpec<Config>>* table) {
  SectionBuilder<RolloutConfig> b(table, "rollout", &Config::rollout);
  b.Add("temperature", &RolloutConfig::temperature)
      .ReadBy("job", "rollout")
      .Slime("--rollout-temperature")
      .Above(0)
      .Doc(
          "Sampling temperature. Training log-probs use the same temperature; 0 (greedy) is "
          "not a valid RL policy and is rejected.");
  b.Add("top_p", &RolloutConfig::top_p)
      .ReadBy("rollout")
      .Slime("--rollout-top-p")
      .Above(0)
      .Max(1)
      .Doc(
          "Nucleus sampling mass. Below 1 the trainer replays the engine's nucleus when "
          "computing log-probs.");
  b.Add("top_k", &RolloutConfig::top_k)
      .ReadBy("rollout")
      .Slime("--rollout-top-k")
      .Min(1)
      .AlsoAllow(-1)
      .Doc("Top-k sampling; -1 disables it.");
  b.Add("max_context_len", &RolloutConfig::max_context_len)
      .ReadBy("rollout", "workflow")
      .Slime("--rollout-max-context-len")
      .Min(2)
      .Doc("Cap on prompt + response tokens per request.");
  b.Add("max_prompt_len", &RolloutConfig::max_prompt_len)
      .ReadBy("data")
      .Slime("--rollout-max-prompt-len")
      .Min(1)
      .Doc(
          "Prompts longer than this (in tokens) are dropped when the dataset is loaded. "
          "Unset: max_context_len - 1 when that is set; must be at most max_context_len - 1.");
  b.Add("max_response_len", &RolloutConfig::max_response_len)
      .ReadBy("rollout")
      .Slime("--rollout-max-response-len")
      .Min(1)
      .Doc("Maximum new tokens per sample (`max_new_tokens`). Unset: the engine's default.");
  b.Add("skip_special_tokens", &RolloutConfig::skip_special_tokens)
      .ReadBy("rollout")
      .Slime("--rollout-skip-special-tokens")
      .Doc("Drop special tokens when detokenizing responses.");
  b.Add("return_routed_experts", &RolloutConfig::return_routed_experts)
      .ReadBy("rollout", "workers", "train")
      .Doc(
          "Ask the engines for each token's mixture-of-experts routing (SGLang's "
          "return_routed_experts) without replaying it: the trainer reports "
          "train/routing_agreement, the share of the engine's expert choices its own forward "
          "makes too (docs/algorithms.md, \"Routing replay\"). "
          "algorithm.use_rollout_routing_replay asks for them anyway.");
  b.Add("stop", &RolloutConfig::stop)
      .ReadBy("rollout")
      .Slime("--rollout-stop")
      .Doc("Stop strings.");
  b.Add("stop_token_ids", &RolloutConfig::stop_token_ids)
      .ReadBy("rollout")
      .Slime("--rollout-stop-token-ids")
      .Min(0)
      .Doc("Stop token ids.");
  b.Add("shuffle", &RolloutConfig::shuffle)
      .ReadBy("data")
      .Slime("--rollout-shuffle")
      .Doc("Shuffle prompts at every epoch (seeded by rollout.seed + epoch).");
  b.Add("seed", &RolloutConfig::seed)
      .ReadBy("data", "rollout", "workers")
      .Slime("--rollout-seed")
      .Doc(
          "Seed of the prompt shuffle; in deterministic mode sample j of a group samples with "
          "seed + j.");
  b.Add("over_sampling_batch_size", &RolloutConfig::over_sampling_batch_size)
      .ReadBy("rollout")
      .Slime("--over-sampling-batch-size")
      .Min(1)
      .Doc(
          "Prompt groups submitted per wave while filling a rollout. Unset: "
          "data.rollout_batch_size; must be at least that.");
  b.Add("dynamic_sampling_filter", &RolloutConfig::dynamic_sampling_filter)
      .ReadBy("rollout")
      .Slime("--dynamic-sampling-filter-path")
      .Enum({"check_reward_nonzero_std", "check_reward_nonzero_std_with_fallback"})
      .Doc(
          "Group filter applied as groups finish (DAPO dynamic sampling): keep a group only "
          "if its rewards are not all equal; `_with_fallback` keeps rejected groups when no "
          "more candidates are left. Unset: keep every group.");
  b.Add("partial_rollout", &RolloutConfig::partial_rollout)
      .ReadBy("rollout")
      .Slime("--partial-rollout")
      .Doc("Keep groups aborted at the end of a rollout and continue them in the next one.");
  b.Add("mask_offpolicy_in_partial_rollout", &RolloutConfig::mask_offpolicy_in_partial_rollout)
      .ReadBy("rollout")
      .Slime("--mask-offpolicy-in-partial-rollout")
      .Doc("With partial_rollout, exclude tokens generated in earlier rollouts from the loss.");
  b.Add("trajectory_buffer", &RolloutConfig::trajectory_buffer)
      .ReadBy("job")
      .Doc(
          "Train on trajectories that programs outside the job POST to the driver's "
          "/trajectories (slime's rollout buffer; docs/http-api.md): each rollout takes "
          "data.rollout_batch_size complete groups of n_samples_per_prompt. The job's engines "
          "still serve them and eval. Not with data.prompt_data, custom_generate, "
          "partial_rollout or dynamic_sampling_filter.");
  b.Add("max_staleness", &RolloutConfig::max_staleness)
      .ReadBy("job")
      .Min(0)
      .Doc(
          "With `slime_train --fully-async`: the most weight versions a trained sample's "
          "oldest token may lag the policy it trains (0: on policy). The engines start no "
          "rollout that would exceed it; samples over it (continued from earlier rollouts by "
          "partial_rollout, or posted to the trajectory buffer) are dropped from the loss or "
          "regenerated (stale_samples). Unset: 1. Refused without --fully-async.");
  b.Add("stale_samples", &RolloutConfig::stale_samples)
      .ReadBy("job")
      .Enum({"drop", "regenerate"})
      .Doc(
          "With `slime_train --fully-async`, what becomes of a sample over max_staleness: "
          "`drop` keeps it out of the loss (remove_sample); `regenerate` starts a sample "
          "continued by partial_rollout over from its prompt when its rollout begins, so it "
          "trains with fresh tokens (needs partial_rollout; trajectory-buffer samples can only "
          "be dropped). Unset: drop. Refused without --fully-async.");
  b.Add("engine_concurrency", &RolloutConfig::engine_concurrency)
      .ReadBy("rollout")
      .Slime("--sglang-server-concurrency")
      .Min(1)
      .Doc("Maximum requests in flight per engine.");
  b.Add("request_timeout_s", &RolloutConfig::request_timeout_s)
      .ReadBy("rollout")
      .Above(0)
      .Doc(
          "Time one generation request may take before the rollout fails with a timeout "
          "naming the engine (slime has no limit).");
  b.Add("request_max_attempts", &RolloutConfig::request_max_attempts)
      .ReadBy("rollout")
      .Min(1)
      .Doc(
          "Tries of a generation request while its engine refuses connections, 1 s apart "
          "(slime: 60); then the rollout fails naming the engine.");
  b.Add("mem_fraction_static", &RolloutConfig::mem_fraction_static)
      .ReadBy("workers")
      .Slime("--sglang-mem-fraction-static")
      .Above(0)
      .Max(1)
      .Doc(
          "Fraction of device memory an engine reserves for weights and KV cache. Unset: the "
          "engine decides.");
  b.Add("custom_generate", &RolloutConfig::custom_generate)
      .ReadBy("workflow")
      .Slime("--custom-generate-function-path")
      .Enum({"plugin", "env", "agent"})
      .Doc(
          "Custom generation instead of one /generate call per sample: `plugin` (a shared "
          "library, custom_generate_path), `env` (a tool environment over HTTP at env_url, run "
          "as multi-turn episodes), `agent` (agent_command pointed at an OpenAI endpoint). "
          "Unset: default generation. See docs/operations.md, \"Custom workflows\".");
  b.Add("custom_generate_path", &RolloutConfig::custom_generate_path)
      .ReadBy("workflow")
      .Doc("custom_generate `plugin`: path of the generate plugin (.so).");
  b.Add("custom_generate_config", &RolloutConfig::custom_generate_config)
      .ReadBy("workflow")
      .Doc(
          "custom_generate `plugin`: its configuration, JSON object text handed to the plugin "
          "as is, e.g. `'{\"max_turns\": 4}'`.");
  b.Add("env_url", &RolloutConfig::env_url)
      .ReadBy("workflow")
      .Doc(
          "custom_generate `env`: base URL of the tool environment (`http://host:port`; "
          "/reset, /step, /close as in docs/http-api.md).");
  b.Add("agent_command", &RolloutConfig::agent_command)
      .ReadBy("workflow")
      .Doc("custom_generate `agent`: the agent program and its arguments (a list).");
  b.Add("max_turns", &RolloutConfig::max_turns)
      .ReadBy("workflow")
      .Min(1)
      .Doc("Model turns per episode (env, agent); the episode is truncated after the last.");
  b.Add("max_total_tokens", &RolloutConfig::max_total_tokens)
      .ReadBy("workflow")
      .Min(2)
      .Doc(
          "Prompt + all turns' tokens of one episode; the episode is truncated when no room is "
          "left. Unset: max_context_len (no cap when that is unset).");
  b.Add("episode_timeout_s", &RolloutConfig::episode_timeout_s)
      .ReadBy("workflow")
      .Above(0)
      .Doc(
          "Wall time of one episode; every environment call waits at most what is left of it. "
          "Running out is an environment error (on_env_error).");
  b.Add("on_env_error", &RolloutConfig::on_env_error)
      .ReadBy("workflow")
      .Enum({"fail", "drop", "zero_reward"})
      .Doc(
          "An environment that fails (HTTP error, timeout, malformed answer): `fail` stops the "
          "rollout with an error naming env_url and the sample, `drop` keeps the sample out of "
          "training (status failed, remove_sample), `zero_reward` trains on what was generated "
          "with reward 0. The error is recorded in the sample's metadata.env_error.");
  b.Add("custom_generate_concurrency", &RolloutConfig::custom_generate_concurrency)
      .ReadBy("rollout", "workflow")
      .Min(1)
      .Doc("Samples in custom generation at once (threads of the coordinator).");
}

void AddDataFields(std::vector<FieldSpec<Config>>* table) {
  SectionBuilder<DataConfig> b(table, "data", &Config::data);
  b.Add("prompt_data", &DataConfig::prompt_data)
      .ReadBy("job")
      .Slime("--prompt-data")
      .Doc(
          "Prompt dataset (.jsonl); a row range may follow as `path@[start:end]`. Required "
          "unless debug.load_debug_rollout_data is set.");
  b.Add("input_key", &DataConfig::input_key)
      .ReadBy("data")
      .Slime("--input-key")
      .Doc("Row field holding the prompt (a string or a list of chat messages).");
  b.Add("label_key", &DataConfig::label_key)
      .ReadBy("data")
      .Slime("--label-key")
      .Doc("Row field holding the label given to the reward function.");
  b.Add("metadata_key", &DataConfig::metadata_key)
      .ReadBy("data")
      .Slime("--metadata-key")
      .Doc("Row field copied into the sample's metadata (may carry rm_type, source_name).");
  b.Add("tool_key", &DataConfig::tool_key)
      .ReadBy("data")
      .Slime("--tool-key")
      .Doc("Row field with the tool list passed to the chat template.");
  b.Add("apply_chat_template", &DataConfig::apply_chat_template)
      .ReadBy("data")
      .Slime("--apply-chat-template")
      .Doc("Render prompts with the tokenizer's chat template (adding the generation prompt).");
  b.Add("apply_chat_template_kwargs", &DataConfig::apply_chat_template_kwargs)
      .ReadBy("data")
      .Slime("--apply-chat-template-kwargs")
      .Doc("Extra chat-template variables, e.g. `{enable_thinking: false}`.");
  b.Add("rollout_global_dataset", &DataConfig::rollout_global_dataset)
      .Refused("a rollout function that brings its own prompts is later work")
      .Slime("--disable-rollout-global-dataset (inverted)")
      .Doc(
          "The coordinator owns the dataset (epochs, shuffle, resume state). slime's false: "
          "the rollout function brings its own data.");
  b.Add("num_rollout", &DataConfig::num_rollout)
      .ReadBy("job", "train")
      .Slime("--num-rollout")
      .Min(0)
      .Doc(
          "Number of rollouts (training iterations). Wins over num_epoch; one of the two is "
          "required. 0 with eval.interval set = evaluate once and exit.");
  b.Add("num_epoch", &DataConfig::num_epoch)
      .ReadBy("job")
      .Slime("--num-epoch")
      .Min(1)
      .Doc(
          "Derive num_rollout from the dataset size: len(dataset) / rollout_batch_size × "
          "num_epoch.");
  b.Add("rollout_batch_size", &DataConfig::rollout_batch_size)
      .ReadBy("job", "rollout", "train")
      .Slime("--rollout-batch-size")
      .Required()
      .Min(1)
      .Doc(
          "Prompts per rollout; each rollout yields rollout_batch_size × n_samples_per_prompt "
          "samples.");
  b.Add("n_samples_per_prompt", &DataConfig::n_samples_per_prompt)
      .ReadBy("data", "rollout", "train")
      .Slime("--n-samples-per-prompt")
      .Min(1)
      .Doc("Responses sampled per prompt (the GRPO group size).");
  b.Add("on_bad_line", &DataConfig::on_bad_line)
      .ReadBy("data")
      .Enum({"skip", "fail"})
      .Doc(
          "A prompt-data line that cannot be used (malformed JSON, missing or mistyped field, "
          "chat-template error): `skip` logs it with file:line and goes on (as slime does), "
          "`fail` stops loading with that error.");
}

void AddEvalFields(std::vector<FieldSpec<Config>>* table) {
  SectionBuilder<EvalConfig> b(table, "eval", &Config::eval);
  b.Add("interval", &EvalConfig::interval)
      .ReadBy("job")
      .Slime("--eval-interval")
      .Min(1)
      .Doc(
          "Evaluate every N rollouts (and before training unless skip_eval_before_train). "
          "Requires datasets.");
  b.Add("datasets", &EvalConfig::datasets)
      .ReadBy("job", "workflow")
      .Slime("--eval-prompt-data / --eval-config")
      .Doc(
          "Evaluation datasets: a list of entries `{name, path, ...overrides}` (see the "
          "table below).");
  b.Add("skip_eval_before_train", &EvalConfig::skip_eval_before_train)
      .ReadBy("job")
      .Slime("--skip-eval-before-train")
      .Doc("Do not evaluate at rollout 0 before training.");
  b.Add("n_samples_per_eval_prompt", &EvalConfig::n_samples_per_eval_prompt)
      .ReadBy("rollout")
      .Slime("--n-samples-per-eval-prompt")
      .Min(1)
      .Doc("Default number of samples per evaluation prompt.");
  b.Add("temperature", &EvalConfig::temperature)
      .ReadBy("rollout")
      .Slime("--eval-temperature")
      .Min(0)
      .Doc("Unset: rollout.temperature. 0 = greedy (the eval reward is then deterministic).");
  b.Add("top_p", &EvalConfig::top_p)
      .ReadBy("rollout")
      .Slime("--eval-top-p")
      .Above(0)
      .Max(1)
      .Doc("Unset: rollout.top_p.");
  b.Add("top_k", &EvalConfig::top_k)
      .ReadBy("rollout")
      .Slime("--eval-top-k")
      .Min(1)
      .AlsoAllow(-1)
      .Doc("Unset: rollout.top_k.");
  b.Add("max_response_len", &EvalConfig::max_response_len)
      .ReadBy("rollout")
      .Slime("--eval-max-response-len")
      .Min(1)
      .Doc("Unset: rollout.max_response_len.");
  b.Add("max_context_len", &EvalConfig::max_context_len)
      .ReadBy("rollout")
      .Slime("--eval-max-context-len")
      .Min(2)
      .Doc("Unset: rollout.max_context_len.");
  b.Add("max_prompt_len", &EvalConfig::max_prompt_len)
      .ReadBy("job")
      .Slime("--eval-max-prompt-len")
      .Min(1)
      .Doc(
          "Eval prompts longer than this (in tokens) are dropped when the datasets are loaded. "
          "Unset: max_context_len - 1 when that is set, else rollout.max_prompt_len.");
  b.Add("min_new_tokens", &EvalConfig::min_new_tokens)
      .ReadBy("rollout")
      .Slime("--eval-min-new-tokens")
      .Min(0)
      .Doc("Minimum new tokens per evaluation sample.");
  b.Add("input_key", &EvalConfig::input_key)
      .ReadBy("config")
      .Slime("--eval-input-key")
      .Doc("Unset: data.input_key.");
  b.Add("label_key", &EvalConfig::label_key)
      .ReadBy("config")
      .Slime("--eval-label-key")
      .Doc("Unset: data.label_key.");
  b.Add("tool_key", &EvalConfig::tool_key)
      .ReadBy("config")
      .Slime("--eval-tool-key")
      .Doc("Unset: data.tool_key.");
  b.Add("reward_key", &EvalConfig::reward_key)
      .ReadBy("rollout")
      .Slime("--eval-reward-key")
      .Doc("Unset: reward.reward_key.");
}

void AddEvalDatasetFields(std::vector<FieldSpec<EvalDatasetConfig>>* table) {
  EvalDatasetBuilder b(table);
  b.Add("name", &EvalDatasetConfig::name)
      .ReadBy("job", "rollout")
      .Required()
      .Slime("name")
      .Doc("Dataset name; metrics are reported as eval/<name>. Unique.");
  b.Add("path", &EvalDatasetConfig::path)
      .ReadBy("job")
      .Required()
      .Slime("path")
      .Doc("Dataset file (.jsonl), same format as data.prompt_data.");
  b.Add("n_samples", &EvalDatasetConfig::n_samples)
      .ReadBy("rollout")
      .Slime("n_samples_per_eval_prompt")
      .Min(1)
      .Doc("Samples per prompt. Unset: eval.n_samples_per_eval_prompt.");
  b.Add("temperature", &EvalDatasetConfig::temperature)
      .ReadBy("rollout")
      .Slime("temperature")
      .Min(0)
      .Doc("Unset: eval.temperature. 0 = greedy.");
  b.Add("top_p", &EvalDatasetConfig::top_p)
      .ReadBy("rollout")
      .Slime("top_p")
      .Above(0)
      .Max(1)
      .Doc("Unset: eval.top_p.");
  b.Add("top_k", &EvalDatasetConfig::top_k)
      .ReadBy("rollout")
      .Slime("top_k")
      .Min(1)
      .AlsoAllow(-1)
      .Doc("Unset: eval.top_k.");
  b.Add("max_response_len", &EvalDatasetConfig::max_response_len)
      .ReadBy("rollout")
      .Slime("max_response_len")
      .Min(1)
      .Doc("Unset: eval.max_response_len.");
  b.Add("min_new_tokens", &EvalDatasetConfig::min_new_tokens)
      .ReadBy("rollout")
      .Slime("min_new_tokens")
      .Min(0)
      .Doc("Unset: eval.min_new_tokens.");
  b.Add("stop", &EvalDatasetConfig::stop)
      .ReadBy("rollout")
      .Slime("stop")
      .Doc("Stop strings. Unset: rollout.stop.");
  b.Add("rm_type", &EvalDatasetConfig::rm_type)
      .ReadBy("rollout")
      .Slime("rm_type")
      .Enum(RewardModelTypes())
      .EnumPrefix("boxed_")
      .Doc("Reward type for this dataset. Unset: reward.rm_type.");
  b.Add("custom_rm_path", &EvalDatasetConfig::custom_rm_path)
      .Refused(
          "a reward plugin per eval dataset is later work; evaluation scores with "
          "reward.custom_rm_path")
      .Slime("custom_rm_path")
      .Doc("slime: a reward plugin for this dataset.");
  b.Add("reward_key", &EvalDatasetConfig::reward_key)
      .ReadBy("rollout")
      .Slime("reward_key")
      .Doc("Unset: eval.reward_key.");
  b.Add("input_key", &EvalDatasetConfig::input_key)
      .ReadBy("job")
      .Slime("input_key")
      .Doc("Unset: eval.input_key.");
  b.Add("label_key", &EvalDatasetConfig::label_key)
      .ReadBy("job")
      .Slime("label_key")
      .Doc("Unset: eval.label_key.");
  b.Add("tool_key", &EvalDatasetConfig::tool_key)
      .ReadBy("job")
      .Slime("tool_key")
      .Doc("Unset: eval.tool_key.");
  b.Add("apply_chat_template", &EvalDatasetConfig::apply_chat_template)
      .ReadBy("job")
      .Slime("apply_chat_template")
      .Doc("Unset: data.apply_chat_template.");
  b.Add("custom_generate", &EvalDatasetConfig::custom_generate)
      .ReadBy("workflow")
      .Enum({"none", "plugin", "env", "agent"})
      .Doc(
          "Custom generation for this dataset; `none` = default generation. Unset: "
          "rollout.custom_generate.");
  b.Add("env_url", &EvalDatasetConfig::env_url)
      .ReadBy("workflow")
      .Doc("Tool environment for this dataset. Unset: rollout.env_url.");
}

void AddRewardFields(std::vector<FieldSpec<Config>>* table) {
  SectionBuilder<RewardConfig> b(table, "reward", &Config::reward);
  b.Add("rm_type", &RewardConfig::rm_type)
      .ReadBy("reward")
      .Slime("--rm-type")
      .Enum(RewardModelTypes())
      .EnumPrefix("boxed_")
      .Doc(
          "Built-in reward. A `boxed_` prefix first extracts the last \\boxed{...} of the "
          "response. A sample's metadata.rm_type overrides it.");
  b.Add("rm_url", &RewardConfig::rm_url)
      .ReadBy("reward")
      .Slime("--rm-url")
      .Doc(
          "HTTP endpoint of the remote reward model (required for remote_rm), or, with "
          "algorithm.opd_type sglang, of the distillation teacher: http://host:port (POSTs to "
          "/generate) or the full URL of an SGLang-API /generate endpoint.");
  b.Add("reward_key", &RewardConfig::reward_key)
      .ReadBy("reward")
      .Slime("--reward-key")
      .Doc("When a reward is a mapping, the key of the scalar used for training.");
  b.Add("group_rm", &RewardConfig::group_rm)
      .ReadBy("reward")
      .Slime("--group-rm")
      .Doc("Score a whole group in one call (batched custom reward).");
  b.Add("custom_rm_path", &RewardConfig::custom_rm_path)
      .ReadBy("reward")
      .Slime("--custom-rm-path")
      .Doc(
          "Path of a reward plugin (shared library, C ABI in docs/rewards.md) replacing the "
          "built-in rewards; it runs in worker processes, so a crash fails only the call.");
  b.Add("rm_timeout_s", &RewardConfig::rm_timeout_s)
      .ReadBy("reward")
      .Above(0)
      .Doc("Timeout of one remote_rm (or OPD teacher) request (slime: 120 s).");
  b.Add("rm_max_attempts", &RewardConfig::rm_max_attempts)
      .ReadBy("reward")
      .Min(1)
      .Doc(
          "remote_rm (or OPD teacher) attempts per sample; failures wait min(2^k, 30) s plus "
          "jitter before the next (slime: 10).");
  b.Add("plugin_timeout_s", &RewardConfig::plugin_timeout_s)
      .ReadBy("reward")
      .Above(0)
      .Doc("Time one plugin call may take before its worker process is killed.");
  b.Add("on_error", &RewardConfig::on_error)
      .ReadBy("reward")
      .Enum({"fail", "value"})
      .Doc(
          "A reward that fails (remote RM unreachable, plugin crash or timeout, bad label): "
          "`fail` stops the rollout with the error (slime raises), `value` logs a warning and "
          "gives the sample reward.error_reward.");
  b.Add("error_reward", &RewardConfig::error_reward)
      .ReadBy("reward")
      .Doc("Reward of a failed sample when on_error is `value`.");
  b.Add("num_workers", &RewardConfig::num_workers)
      .ReadBy("reward")
      .Min(1)
      .Doc("Reward calls run at once (threads; also the plugin's worker processes).");
}

}  // namespace slime::config::internal
