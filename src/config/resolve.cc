// ResolveConfig: slime's derived values and cross-checks (docs/config.md, mirroring the order
// of slime's argument validation), plus range/placement checks of our own. Every message names
// the keys involved and what would be valid.
#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <set>

#include "slime/common/strings.h"
#include "slime/config/algorithms.h"
#include "slime/config/config.h"
#include "slime/config/fields.h"

namespace slime::config {
namespace {

class Resolver {
 public:
  Resolver(Config* config, std::vector<std::string>* warnings) : c_(*config), warnings_(warnings) {}

  Status Run() {
    CheckFields();
    if (!errors_.empty()) return Result();  // cross-checks assume in-range values
    ResolveAlgorithm();
    ResolveDebug();
    ResolveCluster();
    ResolveBatching();
    ResolveData();
    ResolveLengths();
    ResolveEval();
    ResolveCustomGenerate();
    ResolveReward();
    ResolveTrain();
    ResolveWeightSync();
    ResolveCheckpointAndMetrics();
    return Result();
  }

 private:
  template <typename... Args>
  void Error(fmt::format_string<Args...> format, Args&&... args) {
    errors_.push_back(fmt::format(format, std::forward<Args>(args)...));
  }
  template <typename... Args>
  void Warn(fmt::format_string<Args...> format, Args&&... args) {
    if (warnings_ != nullptr)
      warnings_->push_back(fmt::format(format, std::forward<Args>(args)...));
  }

  Status Result() const {
    if (errors_.empty()) return absl::OkStatus();
    if (errors_.size() == 1) return absl::InvalidArgumentError(errors_[0]);
    std::string message = fmt::format("{} configuration errors:", errors_.size());
    for (const auto& error : errors_) message += "\n  - " + error;
    return absl::InvalidArgumentError(message);
  }

  void CheckFields() {
    for (const auto& field : ConfigFields()) {
      Status status = CheckFieldValue(field, field.get(c_), field.Path());
      if (!status.ok()) errors_.emplace_back(status.message());
    }
  }

  static bool IsHostPort(const std::string& address) {
    size_t colon = address.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) return false;
    std::string port = address.substr(colon + 1);
    if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos) {
      return false;
    }
    return std::stoi(port) <= 65535;
  }

  void ResolveAlgorithm() {
    AlgorithmConfig& a = c_.algorithm;
    const std::string& estimator = a.advantage_estimator;
    // CheckFields refused an unknown name (its allowed values come from algorithms.h).
    // R3 replays the rollout's routing in every forward, the training forwards included.
    if (a.use_rollout_routing_replay) a.use_routing_replay = true;
    if (a.use_routing_replay && !a.use_rollout_routing_replay && a.use_rollout_logprobs) {
      Error(
          "algorithm.use_routing_replay replays the routing of the old-log-prob forward, which "
          "algorithm.use_rollout_logprobs skips: set algorithm.use_rollout_routing_replay "
          "instead (the engines' routing) or turn one off");
    }
    const AdvantageEstimatorInfo* info = FindAdvantageEstimator(estimator);
    if (info == nullptr) return;
    // KL of either kind needs the reference model. slime requires --ref-load whenever
    // --use-kl-loss is on, even with --kl-loss-coef 0 (its Qwen3-4B recipe does exactly that:
    // the reference log-probs are computed and the KL is logged but adds nothing to the loss).
    if ((a.kl_coef != 0 || a.use_kl_loss) && !c_.checkpoint.ref_load.has_value()) {
      Error(
          "algorithm.{} needs a reference model: set checkpoint.ref_load (slime --ref-load), "
          "or turn algorithm.use_kl_loss off and set algorithm.kl_coef to 0",
          a.use_kl_loss ? "use_kl_loss" : "kl_coef");
    }
    if (a.kl_coef != 0 && a.kl_loss_coef != 0) {
      Error(
          "algorithm.kl_coef ({}) and algorithm.kl_loss_coef ({}) cannot both be nonzero: "
          "choose the reward penalty or the loss term",
          a.kl_coef, a.kl_loss_coef);
    }
    if (a.kl_coef != 0 && !info->reward_kl) {
      std::vector<std::string> with_reward_kl;
      for (const AdvantageEstimatorInfo& e : kAdvantageEstimators) {
        if (e.reward_kl) with_reward_kl.emplace_back(e.name);
      }
      Warn(
          "algorithm.kl_coef = {} has no effect with advantage_estimator '{}' (the reward KL "
          "penalty applies to {}); use use_kl_loss + kl_loss_coef",
          a.kl_coef, estimator, JoinNames(with_reward_kl));
    }
    if (a.kl_loss_coef != 0 && !a.use_kl_loss) {
      Warn("algorithm.kl_loss_coef = {} has no effect while algorithm.use_kl_loss is false",
           a.kl_loss_coef);
    }
    if (info->needs_normalize_advantages && !a.normalize_advantages) {
      Error("algorithm.advantage_estimator '{}' requires algorithm.normalize_advantages: true",
            estimator);
    }
    if (a.use_rollout_logprobs && a.use_tis) {
      Error(
          "algorithm.use_rollout_logprobs and algorithm.use_tis cannot both be true (TIS "
          "compares recomputed old log-probs with the rollout's)");
    }
    if (a.tis_clip_low > a.tis_clip) {
      Error("algorithm.tis_clip_low ({}) must not exceed algorithm.tis_clip ({})", a.tis_clip_low,
            a.tis_clip);
    }
    if (!a.eps_clip_high.has_value()) a.eps_clip_high = a.eps_clip;
    if (estimator == "cispo" && a.eps_clip < 1.0) {
      Warn(
          "CISPO is canonically one-sided, but algorithm.eps_clip = {} keeps the lower clip "
          "bound {} active; set eps_clip: 1.0 (and tune eps_clip_high, e.g. 4.0)",
          a.eps_clip, 1.0 - a.eps_clip);
    }
    if (a.use_opd) {
      if (!a.opd_type.has_value()) {
        Error("algorithm.use_opd requires algorithm.opd_type: one of 'sglang', 'megatron'");
      } else if (*a.opd_type == "megatron" && !a.opd_teacher_load.has_value()) {
        Error(
            "algorithm.opd_type 'megatron' requires algorithm.opd_teacher_load (the teacher "
            "checkpoint)");
      } else if (*a.opd_type == "sglang") {
        if (a.opd_teacher_load.has_value()) {
          Error(
              "algorithm.opd_teacher_load must not be set with algorithm.opd_type 'sglang' "
              "(the teacher's log-probs come from the server at reward.rm_url)");
        }
        ResolveSglangTeacher();
      }
    } else if (a.opd_teacher_load.has_value()) {
      Error("algorithm.opd_teacher_load is set but algorithm.use_opd is false");
    }
  }

  void ResolveDebug() {
    DebugConfig& d = c_.debug;
    if (d.dump_details.has_value()) {
      d.save_debug_rollout_data = *d.dump_details + "/rollout_data/{rollout_id}.json";
      d.save_debug_train_data = *d.dump_details + "/train_data/{rollout_id}_{rank}.json";
    }
    if (d.save_debug_train_data.has_value() &&
        d.save_debug_train_data == d.save_debug_rollout_data) {
      Error(
          "debug.save_debug_train_data must differ from debug.save_debug_rollout_data (both "
          "are '{}')",
          *d.save_debug_train_data);
    }
    for (const auto& [key, value] : {std::pair<const char*, const std::optional<std::string>*>{
                                         "save_debug_rollout_data", &d.save_debug_rollout_data},
                                     {"load_debug_rollout_data", &d.load_debug_rollout_data},
                                     {"save_debug_train_data", &d.save_debug_train_data}}) {
      if (value->has_value() && (*value)->find("{rollout_id}") == std::string::npos) {
        Error("debug.{} = '{}' must contain '{{rollout_id}}' (one file per rollout)", key, **value);
      }
    }
    const int trainers = c_.cluster.actor_num_nodes * c_.cluster.actor_num_gpus_per_node;
    if (d.save_debug_train_data.has_value() && trainers > 1 &&
        d.save_debug_train_data->find("{rank}") == std::string::npos) {
      Error("debug.save_debug_train_data = '{}' must contain '{{rank}}': {} trainer processes "
            "each write the data they trained on",
            *d.save_debug_train_data, trainers);
    }
    if (d.load_debug_rollout_data.has_value()) d.train_only = true;
    if (d.train_only && !d.load_debug_rollout_data.has_value()) {
      Error(
          "debug.train_only needs debug.load_debug_rollout_data (the saved rollouts to train on; "
          "it sets train_only itself)");
    }
    if (d.load_debug_rollout_data_subsample.has_value() && !d.load_debug_rollout_data) {
      Error(
          "debug.load_debug_rollout_data_subsample needs debug.load_debug_rollout_data (it "
          "subsamples the loaded rollouts)");
    }
    if (d.rollout_only && d.train_only) {
      Error("debug.rollout_only and debug.train_only cannot both be true{}",
            d.load_debug_rollout_data ? " (debug.load_debug_rollout_data implies train_only)" : "");
    }
  }

  void ResolveCluster() {
    ClusterConfig& k = c_.cluster;
    bool external = !k.rollout_external_engine_addrs.empty();
    for (size_t i = 0; i < k.rollout_external_engine_addrs.size(); ++i) {
      if (!IsHostPort(k.rollout_external_engine_addrs[i])) {
        Error("cluster.rollout_external_engine_addrs[{}] = '{}' is not host:port", i,
              k.rollout_external_engine_addrs[i]);
      }
    }
    if (!k.head_address.empty() && !IsHostPort(k.head_address)) {
      Error("cluster.head_address = '{}' is not host:port", k.head_address);
    }
    for (const auto& [name, value] : k.train_env_vars) {
      static const char* const kRuntimeOwned[] = {"CUDA_VISIBLE_DEVICES", "SLIME_JOB_TOKEN",
                                                   "SLIME_ACTOR_INCARNATION", "SLIME_BIND_HOST"};
      bool valid = !name.empty() && !std::isdigit(static_cast<unsigned char>(name[0]));
      for (char ch : name) {
        valid = valid && (std::isalnum(static_cast<unsigned char>(ch)) || ch == '_');
      }
      if (!valid) {
        Error("cluster.train_env_vars: '{}' is not an environment variable name (letters, digits "
              "and '_', not starting with a digit)",
              name);
      }
      for (const char* owned : kRuntimeOwned) {
        if (name == owned) {
          Error("cluster.train_env_vars: {} is set by the runtime for each trainer process (its "
                "devices and job identity) and cannot be overridden",
                name);
        }
      }
    }
    int actor_gpus = k.actor_num_nodes * k.actor_num_gpus_per_node;
    if (k.offload) {
      k.offload_train = true;
      k.offload_rollout = true;
    }
    if (c_.debug.rollout_only) {
      // No trainers: engines get the GPUs, nothing to share or offload.
      if (k.colocate && !k.rollout_num_gpus.has_value()) k.rollout_num_gpus = actor_gpus;
      k.colocate = false;
      k.offload_train = false;
      k.offload_rollout = false;
    }
    if (k.colocate) {
      if (external) {
        Error(
            "cluster.colocate needs local engines but cluster.rollout_external_engine_addrs "
            "is set; use one or the other");
      }
      if (!k.offload_train.has_value()) k.offload_train = true;
      if (!k.offload_rollout.has_value()) k.offload_rollout = true;
      if (!k.rollout_num_gpus.has_value()) k.rollout_num_gpus = actor_gpus;
    }
    if (!k.offload_train.has_value()) k.offload_train = false;
    if (!k.offload_rollout.has_value()) k.offload_rollout = false;
    if (UseCritic(c_)) k.offload_train = true;

    if (external) {
      if (k.rollout_num_gpus.value_or(0) != 0) {
        Error(
            "cluster.rollout_num_gpus = {} together with cluster.rollout_external_engine_addrs: "
            "local and external engines cannot be mixed (leave rollout_num_gpus unset or 0)",
            *k.rollout_num_gpus);
      }
      k.rollout_num_gpus = 0;
    } else if (!k.rollout_num_gpus.has_value()) {
      if (c_.debug.train_only) {
        k.rollout_num_gpus = 0;
      } else {
        Error(
            "cluster.rollout_num_gpus is required when cluster.colocate is false (or give "
            "cluster.rollout_external_engine_addrs)");
        return;
      }
    } else if (*k.rollout_num_gpus == 0 && !c_.debug.train_only) {
      Error(
          "cluster.rollout_num_gpus is 0 and cluster.rollout_external_engine_addrs is empty: "
          "no engine could generate (set rollout_num_gpus >= 1)");
    }
    int rollout_gpus = *k.rollout_num_gpus;
    if (rollout_gpus % k.rollout_num_gpus_per_engine != 0) {
      Error(
          "cluster.rollout_num_gpus ({}) must be divisible by "
          "cluster.rollout_num_gpus_per_engine ({})",
          rollout_gpus, k.rollout_num_gpus_per_engine);
    }

    bool trainers = !c_.debug.rollout_only;
    if (trainers) {
      const TrainConfig& t = c_.train;
      int model_parallel =
          t.tensor_model_parallel_size * t.pipeline_model_parallel_size * t.context_parallel_size;
      if (actor_gpus % model_parallel != 0) {
        Error(
            "the actor's GPUs (cluster.actor_num_nodes × cluster.actor_num_gpus_per_node = "
            "{}) must be divisible by train.tensor_model_parallel_size × "
            "train.pipeline_model_parallel_size × train.context_parallel_size = {} × {} × {} "
            "= {}",
            actor_gpus, t.tensor_model_parallel_size, t.pipeline_model_parallel_size,
            t.context_parallel_size, model_parallel);
      }
      if (k.actor_num_nodes > k.num_nodes) {
        Error("cluster.actor_num_nodes ({}) exceeds cluster.num_nodes ({})", k.actor_num_nodes,
              k.num_nodes);
      }
    }

    // Capacity, when the device kind is known. `auto` is checked at placement time.
    if (k.device != "auto") {
      bool cpu = k.device == "cpu";
      int per_node = cpu ? k.cpu_slots_per_node : k.num_gpus_per_node;
      const char* per_node_key = cpu ? "cluster.cpu_slots_per_node" : "cluster.num_gpus_per_node";
      int needed = 0;
      std::string breakdown;
      if (!trainers) {
        needed = rollout_gpus;
        breakdown = fmt::format("rollout {}", rollout_gpus);
      } else if (c_.debug.train_only || k.colocate) {
        needed = k.colocate ? std::max(actor_gpus, rollout_gpus) : actor_gpus;
        breakdown =
            fmt::format("actor {}{}", actor_gpus,
                        k.colocate ? fmt::format(", shared with rollout {}", rollout_gpus) : "");
      } else {
        needed = actor_gpus + rollout_gpus;
        breakdown = fmt::format("actor {} + rollout {}", actor_gpus, rollout_gpus);
      }
      if (trainers && k.actor_num_gpus_per_node > per_node) {
        Error("cluster.actor_num_gpus_per_node ({}) exceeds {} ({}) on device '{}'",
              k.actor_num_gpus_per_node, per_node_key, per_node, k.device);
      }
      if (needed > k.num_nodes * per_node) {
        Error("the job needs {} {} ({}) but cluster.num_nodes × {} = {} × {} = {}", needed,
              cpu ? "CPU slots" : "GPUs", breakdown, per_node_key, k.num_nodes, per_node,
              k.num_nodes * per_node);
      }
    }
  }

  void ResolveBatching() {
    DataConfig& d = c_.data;
    TrainConfig& t = c_.train;
    const int samples = d.rollout_batch_size * d.n_samples_per_prompt;
    if (t.num_steps_per_rollout.has_value()) {
      int derived = samples / *t.num_steps_per_rollout;
      if (samples % *t.num_steps_per_rollout != 0) {
        Warn(
            "data.rollout_batch_size × data.n_samples_per_prompt = {} is not divisible by "
            "train.num_steps_per_rollout = {}; global_batch_size rounds down to {}",
            samples, *t.num_steps_per_rollout, derived);
      }
      if (t.global_batch_size.has_value() && *t.global_batch_size != derived) {
        Error(
            "train.global_batch_size = {} disagrees with train.num_steps_per_rollout = {}: "
            "rollout_batch_size {} × n_samples_per_prompt {} / {} = {}",
            *t.global_batch_size, *t.num_steps_per_rollout, d.rollout_batch_size,
            d.n_samples_per_prompt, *t.num_steps_per_rollout, derived);
      }
      if (derived < 1) {
        Error("train.num_steps_per_rollout = {} exceeds the {} samples of a rollout",
              *t.num_steps_per_rollout, samples);
        return;
      }
      t.global_batch_size = derived;
    }
    if (!t.global_batch_size.has_value()) t.global_batch_size = samples;
    const int gbs = *t.global_batch_size;
    if (gbs > samples) {
      Error(
          "train.global_batch_size ({}) exceeds the samples of one rollout "
          "(data.rollout_batch_size × data.n_samples_per_prompt = {}): no optimizer step "
          "would run",
          gbs, samples);
    } else if (samples % gbs != 0) {
      Warn(
          "the {} samples of a rollout are not a multiple of train.global_batch_size = {}; "
          "the last {} samples of every rollout are dropped",
          samples, gbs, samples % gbs);
    }
    if (t.use_dynamic_batch_size && !t.max_tokens_per_gpu.has_value()) {
      Error("train.use_dynamic_batch_size requires train.max_tokens_per_gpu");
    }
    if (t.balance_by_flops) {
      if (!t.use_dynamic_batch_size) {
        Error("train.balance_by_flops requires train.use_dynamic_batch_size: true");
      }
      t.balance_data = true;
    }
    if (c_.debug.rollout_only) return;
    int model_parallel =
        t.tensor_model_parallel_size * t.pipeline_model_parallel_size * t.context_parallel_size;
    int actor_gpus = ActorNumGpus(c_);
    if (actor_gpus % model_parallel != 0) return;  // reported by ResolveCluster
    int dp = actor_gpus / model_parallel;
    ResolveExpertParallel(t, dp);
    if (t.use_dynamic_batch_size) {
      if (gbs < dp) {
        Error(
            "train.global_batch_size ({}) is smaller than the data-parallel size ({}): every "
            "data-parallel rank needs at least one sample per step",
            gbs, dp);
      }
    } else if (gbs % (t.micro_batch_size * dp) != 0) {
      Error(
          "train.global_batch_size ({}) must be divisible by train.micro_batch_size × "
          "data-parallel size = {} × {} = {} (or set train.use_dynamic_batch_size)",
          gbs, t.micro_batch_size, dp, t.micro_batch_size * dp);
    }
  }

  // train.expert_model_parallel_size: carved out of the `dp` data-parallel ranks. Whether the
  // model has experts (and enough of them) is checked where the model is loaded.
  void ResolveExpertParallel(const TrainConfig& t, int dp) {
    const int ep = t.expert_model_parallel_size;
    if (ep == 1) return;
    if (dp % ep != 0) {
      Error(
          "train.expert_model_parallel_size ({}) must divide the data-parallel size ({} = actor "
          "GPUs / (train.tensor_model_parallel_size × train.pipeline_model_parallel_size × "
          "train.context_parallel_size)): expert parallelism is carved out of data parallelism",
          ep, dp);
    }
    if (t.use_distributed_optimizer) {
      Error(
          "train.expert_model_parallel_size ({}) > 1 does not work with "
          "train.use_distributed_optimizer yet; set one of them off",
          ep);
    }
    if (t.overlap_grad_reduce) {
      Error(
          "train.expert_model_parallel_size ({}) > 1 does not work with "
          "train.overlap_grad_reduce yet; set one of them off",
          ep);
    }
  }

  void ResolveData() {
    DataConfig& d = c_.data;
    RolloutConfig& r = c_.rollout;
    if (d.n_samples_per_prompt == 1) c_.algorithm.grpo_std_normalization = false;
    if (!r.over_sampling_batch_size.has_value()) r.over_sampling_batch_size = d.rollout_batch_size;
    if (*r.over_sampling_batch_size < d.rollout_batch_size) {
      Error("rollout.over_sampling_batch_size ({}) must be >= data.rollout_batch_size ({})",
            *r.over_sampling_batch_size, d.rollout_batch_size);
    }
    if (c_.train.override_opt_param_scheduler && c_.train.use_checkpoint_opt_param_scheduler) {
      Error(
          "train.override_opt_param_scheduler and train.use_checkpoint_opt_param_scheduler "
          "contradict each other; set at most one");
    }
    if (!d.num_rollout.has_value() && !d.num_epoch.has_value()) {
      Error("set data.num_rollout or data.num_epoch (how long to train)");
    } else if (d.num_rollout.has_value() && d.num_epoch.has_value()) {
      Warn("data.num_rollout and data.num_epoch are both set; num_epoch is ignored");
    }
    if (r.trajectory_buffer) {
      // The trajectories bring their prompts, answers and rewards.
      if (!d.prompt_data.empty()) {
        Error("data.prompt_data is not read with rollout.trajectory_buffer (the POSTed "
              "trajectories are the data); remove one of them");
      }
      if (r.custom_generate) Error("rollout.custom_generate does not apply to rollout.trajectory_buffer");
      if (r.partial_rollout) Error("rollout.partial_rollout does not apply to rollout.trajectory_buffer");
      if (r.dynamic_sampling_filter) {
        Error("rollout.dynamic_sampling_filter does not apply to rollout.trajectory_buffer");
      }
      if (c_.debug.load_debug_rollout_data) {
        Error("debug.load_debug_rollout_data and rollout.trajectory_buffer are two sources of "
              "rollouts; pick one");
      }
    } else if (d.prompt_data.empty() && !c_.debug.load_debug_rollout_data.has_value()) {
      Error(
          "data.prompt_data is required (slime --prompt-data), unless "
          "debug.load_debug_rollout_data or rollout.trajectory_buffer is set");
    }
    if (r.stale_samples == "regenerate" && !r.partial_rollout) {
      Error(
          "rollout.stale_samples: regenerate starts samples continued by rollout.partial_rollout "
          "over; without partial_rollout no sample outgrows the bound (trajectory-buffer ones "
          "can only be dropped): set partial_rollout: true or stale_samples: drop");
    }
    if (r.mask_offpolicy_in_partial_rollout && !r.partial_rollout) {
      Error(
          "rollout.mask_offpolicy_in_partial_rollout has no effect without "
          "rollout.partial_rollout: set partial_rollout: true or remove the key");
    }
  }

  void ResolveLengths() {
    RolloutConfig& r = c_.rollout;
    EvalConfig& e = c_.eval;
    if (!e.max_context_len.has_value()) e.max_context_len = r.max_context_len;
    if (r.max_context_len.has_value()) {
      if (!r.max_prompt_len.has_value()) r.max_prompt_len = *r.max_context_len - 1;
      if (*r.max_prompt_len > *r.max_context_len - 1) {
        Error(
            "rollout.max_prompt_len ({}) must be at most rollout.max_context_len - 1 = {} so "
            "that at least one token is generated",
            *r.max_prompt_len, *r.max_context_len - 1);
      }
    }
    if (!e.max_prompt_len.has_value()) {
      e.max_prompt_len =
          e.max_context_len ? std::optional<int>(*e.max_context_len - 1) : r.max_prompt_len;
    }
    if (e.max_context_len.has_value() && e.max_prompt_len.has_value() &&
        *e.max_prompt_len > *e.max_context_len - 1) {
      Error("eval.max_prompt_len ({}) must be at most eval.max_context_len - 1 = {}",
            *e.max_prompt_len, *e.max_context_len - 1);
    }
  }

  void ResolveEval() {
    EvalConfig& e = c_.eval;
    const RolloutConfig& r = c_.rollout;
    const DataConfig& d = c_.data;
    if (e.interval.has_value() && e.datasets.empty()) {
      Error(
          "eval.interval is set but eval.datasets is empty: add datasets ({{name, path}}) or "
          "unset eval.interval");
    }
    if (!e.temperature) e.temperature = r.temperature;
    if (!e.top_p) e.top_p = r.top_p;
    if (!e.top_k) e.top_k = r.top_k;
    if (!e.max_response_len) e.max_response_len = r.max_response_len;
    if (!e.input_key) e.input_key = d.input_key;
    if (!e.label_key) e.label_key = d.label_key;
    if (!e.tool_key) e.tool_key = d.tool_key;
    if (!e.reward_key) e.reward_key = c_.reward.reward_key;
    std::set<std::string> names;
    for (size_t i = 0; i < e.datasets.size(); ++i) {
      EvalDatasetConfig& ds = e.datasets[i];
      if (!names.insert(ds.name).second) {
        Error("eval.datasets[{}].name '{}' is used twice; dataset names must be unique", i,
              ds.name);
      }
      if (!ds.n_samples) ds.n_samples = e.n_samples_per_eval_prompt;
      if (!ds.temperature) ds.temperature = e.temperature;
      if (!ds.top_p) ds.top_p = e.top_p;
      if (!ds.top_k) ds.top_k = e.top_k;
      if (!ds.max_response_len) ds.max_response_len = e.max_response_len;
      if (!ds.min_new_tokens) ds.min_new_tokens = e.min_new_tokens;
      if (!ds.stop) ds.stop = r.stop;
      if (!ds.rm_type) ds.rm_type = c_.reward.rm_type;
      if (!ds.reward_key) ds.reward_key = e.reward_key;
      if (!ds.input_key) ds.input_key = e.input_key;
      if (!ds.label_key) ds.label_key = e.label_key;
      if (!ds.tool_key) ds.tool_key = e.tool_key;
      if (!ds.apply_chat_template) ds.apply_chat_template = d.apply_chat_template;
      if (ds.rm_type == "remote_rm" && !c_.reward.rm_url) {
        Error("eval.datasets[{}].rm_type 'remote_rm' requires reward.rm_url", i);
      }
    }
  }

  // rollout.custom_generate and its keys; eval datasets inherit custom_generate and env_url.
  void ResolveCustomGenerate() {
    RolloutConfig& r = c_.rollout;
    if (!r.max_total_tokens) r.max_total_tokens = r.max_context_len;
    if (r.max_total_tokens && r.max_context_len && *r.max_total_tokens > *r.max_context_len) {
      Error("rollout.max_total_tokens ({}) must be at most rollout.max_context_len ({})",
            *r.max_total_tokens, *r.max_context_len);
    }
    const auto check = [this](const std::string& where, const std::optional<std::string>& kind,
                              const std::optional<std::string>& env_url) {
      if (!kind || *kind == "none") return;
      if (*kind == "plugin" && !c_.rollout.custom_generate_path) {
        Error("{} 'plugin' requires rollout.custom_generate_path (the plugin's .so)", where);
      }
      if (*kind == "env") {
        if (!env_url || env_url->empty()) {
          Error("{} 'env' requires an env_url (rollout.env_url, or the dataset's env_url): "
                "the tool environment's http://host:port",
                where);
        } else if (!IsHttpUrl(*env_url)) {
          Error("{}: env_url '{}' is not an http://host:port[/path] URL", where, *env_url);
        }
      }
      if (*kind == "agent" && c_.rollout.agent_command.empty()) {
        Error("{} 'agent' requires rollout.agent_command (the agent program and its arguments)",
              where);
      }
    };
    if (r.custom_generate == "none") {
      Error("rollout.custom_generate 'none' is not valid (leave it unset for default generation)");
    }
    check("rollout.custom_generate", r.custom_generate, r.env_url);
    if (r.custom_generate && (c_.algorithm.use_rollout_routing_replay || r.return_routed_experts)) {
      Error(
          "{} cannot be used with rollout.custom_generate (custom samples are assembled by the "
          "generator and carry no engine routing)",
          c_.algorithm.use_rollout_routing_replay ? "algorithm.use_rollout_routing_replay"
                                                  : "rollout.return_routed_experts");
    }
    if (r.custom_generate && r.partial_rollout) {
      Error(
          "rollout.partial_rollout cannot be used with rollout.custom_generate (custom samples "
          "keep their multi-turn state in the generator and are never continued)");
    }
    if (r.custom_generate_config) {
      bool map = false;
      try {
        map = YAML::Load(*r.custom_generate_config).IsMap();
      } catch (const YAML::Exception&) {
      }
      if (!map) {
        Error("rollout.custom_generate_config must be JSON object text, e.g. '{{\"key\": 1}}'; "
              "got '{}'",
              *r.custom_generate_config);
      }
    }
    if (r.custom_generate_path && r.custom_generate != "plugin") {
      Warn("rollout.custom_generate_path is set but rollout.custom_generate is not 'plugin'");
    }
    for (size_t i = 0; i < c_.eval.datasets.size(); ++i) {
      EvalDatasetConfig& ds = c_.eval.datasets[i];
      if (!ds.custom_generate) ds.custom_generate = r.custom_generate.value_or("none");
      if (!ds.env_url) ds.env_url = r.env_url;
      check(fmt::format("eval.datasets[{}].custom_generate", i), ds.custom_generate, ds.env_url);
    }
  }

  // use_opd with opd_type sglang: reward.rm_url is the teacher (rollout/teacher.h).
  void ResolveSglangTeacher() {
    const RewardConfig& rw = c_.reward;
    if (!rw.rm_url.has_value()) {
      Error("algorithm.opd_type 'sglang' requires reward.rm_url (the teacher server)");
      return;
    }
    if (!IsHttpUrl(*rw.rm_url)) {
      Error(
          "reward.rm_url '{}' (the OPD teacher of algorithm.opd_type 'sglang') must be "
          "http://host:port or http://host:port/path",
          *rw.rm_url);
    }
    auto remote = [](const std::optional<std::string>& t) {
      return t == "remote_rm" || t == "boxed_remote_rm";
    };
    if (remote(rw.rm_type)) {
      Error(
          "reward.rm_type '{}' cannot be used with algorithm.opd_type 'sglang': reward.rm_url "
          "is the teacher server; score with a rule reward or reward.custom_rm_path",
          *rw.rm_type);
    }
    for (size_t i = 0; i < c_.eval.datasets.size(); ++i) {
      if (remote(c_.eval.datasets[i].rm_type)) {
        Error(
            "eval.datasets[{}].rm_type '{}' cannot be used with algorithm.opd_type 'sglang': "
            "reward.rm_url is the teacher server",
            i, *c_.eval.datasets[i].rm_type);
      }
    }
    if (!rw.rm_type.has_value() && !rw.custom_rm_path.has_value() &&
        c_.rollout.dynamic_sampling_filter.has_value()) {
      Error(
          "rollout.dynamic_sampling_filter '{}' would drop every group: with algorithm.opd_type "
          "'sglang' and no reward.rm_type or reward.custom_rm_path every reward is 0 (pure "
          "distillation)",
          *c_.rollout.dynamic_sampling_filter);
    }
  }

  static bool IsHttpUrl(const std::string& url) {
    const std::string prefix = "http://";
    if (url.rfind(prefix, 0) != 0) return false;
    std::string rest = url.substr(prefix.size());
    rest = rest.substr(0, rest.find('/'));
    return IsHostPort(rest);
  }

  void ResolveReward() {
    if (c_.reward.rm_type == "remote_rm" && !c_.reward.rm_url.has_value()) {
      Error("reward.rm_type 'remote_rm' requires reward.rm_url");
    }
  }

  void ResolveTrain() {
    TrainConfig& t = c_.train;
    if (t.tensor_model_parallel_size == 1 && t.sequence_parallel) {
      Warn("train.sequence_parallel needs train.tensor_model_parallel_size > 1; turned off");
      t.sequence_parallel = false;
    }
    if (t.min_lr > t.lr) {
      Error("train.min_lr ({}) must not exceed train.lr ({})", t.min_lr, t.lr);
    }
    if (t.critic_lr.has_value() || t.critic_min_lr.has_value()) {
      const double critic_lr = t.critic_lr.value_or(t.lr);
      const double critic_min_lr = t.critic_min_lr.value_or(t.min_lr);
      if (critic_min_lr > critic_lr) {
        Error(
            "train.critic_min_lr ({}) must not exceed train.critic_lr ({}) (unset, they are "
            "min_lr and lr)",
            critic_min_lr, critic_lr);
      }
    }
    if (t.lr_warmup_fraction.has_value() && t.lr_warmup_iters > 0) {
      Error("set only one of train.lr_warmup_fraction ({}) and train.lr_warmup_iters ({})",
            *t.lr_warmup_fraction, t.lr_warmup_iters);
    }
    if ((t.recompute_method.has_value() || t.recompute_num_layers.has_value()) &&
        t.recompute_granularity != "full") {
      Error(
          "train.recompute_method and train.recompute_num_layers apply only to "
          "train.recompute_granularity: full");
    }
    if (t.recompute_granularity == "full" &&
        (!t.recompute_method.has_value() || !t.recompute_num_layers.has_value())) {
      // Megatron's rule: full recomputation says how (its upper bound, the layers of a pipeline
      // stage, is checked where the model is known: the trainer's init).
      Error(
          "train.recompute_granularity: full needs train.recompute_method (uniform or block) "
          "and train.recompute_num_layers (1 to the layers of a pipeline stage)");
    }
    if (!t.only_train_params_name_list.empty() && !t.freeze_params_name_list.empty()) {
      Error(
          "set only one of train.only_train_params_name_list and "
          "train.freeze_params_name_list");
    }
    if (t.use_stateless_adam && !c_.checkpoint.no_save_optim) {
      Error(
          "train.use_stateless_adam requires checkpoint.no_save_optim: true (there is no "
          "optimizer state to save)");
    }
  }

  void ResolveWeightSync() {
    const WeightSyncConfig& w = c_.weight_sync;
    if (w.transport == "disk" && !w.disk_dir.has_value()) {
      Error(
          "weight_sync.transport 'disk' requires weight_sync.disk_dir (a directory shared by "
          "trainers and engines)");
    }
  }

  void ResolveCheckpointAndMetrics() {
    const CheckpointConfig& k = c_.checkpoint;
    if (k.save_interval.has_value() && !k.save.has_value()) {
      Error("checkpoint.save_interval requires checkpoint.save (where to write)");
    }
    if (k.keep_last.has_value() && !k.save.has_value()) {
      Warn("checkpoint.keep_last has no effect without checkpoint.save");
    }
    if (!c_.metrics.jsonl_path.has_value()) {
      c_.metrics.jsonl_path = c_.cluster.run_dir + "/metrics.jsonl";
    }
    if (c_.metrics.tensorboard_dir.has_value() && c_.metrics.tensorboard_dir->empty()) {
      Error("metrics.tensorboard_dir is empty: give a directory, or leave the key out for no "
            "TensorBoard event files");
    }
  }

  Config& c_;
  std::vector<std::string>* warnings_;
  std::vector<std::string> errors_;
};

}  // namespace

Status ResolveConfig(Config* config, std::vector<std::string>* warnings) {
  return Resolver(config, warnings).Run();
}

int ActorNumGpus(const Config& config) {
  return config.cluster.actor_num_nodes * config.cluster.actor_num_gpus_per_node;
}

int DataParallelSize(const Config& config) {
  const TrainConfig& t = config.train;
  int model_parallel =
      t.tensor_model_parallel_size * t.pipeline_model_parallel_size * t.context_parallel_size;
  return model_parallel > 0 ? ActorNumGpus(config) / model_parallel : 0;
}

int NumRolloutEngines(const Config& config) {
  const ClusterConfig& k = config.cluster;
  if (!k.rollout_num_gpus.has_value() || k.rollout_num_gpus_per_engine <= 0) return 0;
  return *k.rollout_num_gpus / k.rollout_num_gpus_per_engine;
}

std::string EngineAccessToken(const ClusterConfig& cluster) {
  return cluster.engine_admin_api_key.empty() ? cluster.engine_api_key : cluster.engine_admin_api_key;
}

bool UseCritic(const Config& config) {
  const AdvantageEstimatorInfo* info = FindAdvantageEstimator(config.algorithm.advantage_estimator);
  return info != nullptr && info->critic;
}

}  // namespace slime::config
