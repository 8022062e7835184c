// RolloutOptions from a resolved config (coordinator.h).
#include <fmt/format.h>

#include "slime/config/config.h"
#include "slime/rollout/coordinator.h"

namespace slime::rollout {

StatusOr<RolloutOptions> RolloutOptionsFromConfig(const config::Config& config,
                                                  std::vector<std::string> engine_addresses) {
  RolloutOptions o;
  o.engines.addresses = std::move(engine_addresses);
  o.engines.concurrency_per_engine = config.rollout.engine_concurrency;
  o.engines.bearer_token = config::EngineAccessToken(config.cluster);
  o.engines.request_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(config.rollout.request_timeout_s * 1000));
  o.engines.max_attempts = config.rollout.request_max_attempts;
  o.rollout_batch_size = config.data.rollout_batch_size;
  o.n_samples_per_prompt = config.data.n_samples_per_prompt;
  o.over_sampling_batch_size = config.rollout.over_sampling_batch_size.value_or(0);
  SamplingOptions& s = o.sampling;
  s.temperature = config.rollout.temperature;
  s.top_p = config.rollout.top_p;
  s.top_k = config.rollout.top_k;
  s.max_response_len = config.rollout.max_response_len;
  s.max_context_len = config.rollout.max_context_len;
  s.stop = config.rollout.stop;
  s.stop_token_ids = config.rollout.stop_token_ids;
  s.skip_special_tokens = config.rollout.skip_special_tokens;
  s.return_routed_experts =
      config.rollout.return_routed_experts || config.algorithm.use_rollout_routing_replay;
  const std::string filter = config.rollout.dynamic_sampling_filter.value_or("");
  if (filter.empty()) {
    o.dynamic_filter = DynamicFilter::kNone;
  } else if (filter == "check_reward_nonzero_std") {
    o.dynamic_filter = DynamicFilter::kNonzeroStd;
  } else if (filter == "check_reward_nonzero_std_with_fallback") {
    o.dynamic_filter = DynamicFilter::kNonzeroStdWithFallback;
  } else {
    return absl::InvalidArgumentError(fmt::format(
        "rollout.dynamic_sampling_filter '{}' is not known: use check_reward_nonzero_std or "
        "check_reward_nonzero_std_with_fallback",
        filter));
  }
  o.partial_rollout = config.rollout.partial_rollout;
  o.mask_offpolicy_in_partial_rollout = config.rollout.mask_offpolicy_in_partial_rollout;
  o.deterministic = config.debug.deterministic_mode;
  o.seed = config.rollout.seed;
  o.reward_postprocess.advantage_estimator = config.algorithm.advantage_estimator;
  o.reward_postprocess.rewards_normalization = config.algorithm.rewards_normalization;
  o.reward_postprocess.grpo_std_normalization = config.algorithm.grpo_std_normalization;
  o.reward_postprocess.n_samples_per_prompt = o.n_samples_per_prompt;
  o.reward_postprocess.rollout_batch_size = o.rollout_batch_size;
  o.log_passrate = config.metrics.log_passrate;
  o.logged_metrics.multi_turn = config.metrics.log_multi_turn;
  o.logged_metrics.correct_samples = config.metrics.log_correct_samples;
  o.logged_metrics.reward_category = config.metrics.log_reward_category.value_or("");
  o.logged_metrics.max_response_len = config.rollout.max_response_len.value_or(0);
  o.custom_generate_concurrency = config.rollout.custom_generate_concurrency;
  const config::AlgorithmConfig& a = config.algorithm;
  if (a.use_opd && a.opd_type == "sglang") {
    if (!config.reward.rm_url.has_value()) {
      return absl::InvalidArgumentError(
          "algorithm.opd_type 'sglang' requires reward.rm_url (the teacher server)");
    }
    TeacherOptions t;
    t.url = *config.reward.rm_url;
    t.temperature = config.rollout.temperature;
    t.timeout = std::chrono::milliseconds(static_cast<int64_t>(config.reward.rm_timeout_s * 1000));
    t.max_attempts = config.reward.rm_max_attempts;
    o.teacher = std::move(t);
    // Without a task reward the teacher alone drives training (slime's OPD reward is 0).
    o.score_rewards = config.reward.rm_type.has_value() || config.reward.custom_rm_path.has_value();
  }
  return o;
}

}  // namespace slime::rollout

namespace slime::rollout {

EvalDataset EvalDatasetFromConfig(const config::Config& config,
                                  const config::EvalDatasetConfig& entry,
                                  const data::PromptDataset& dataset) {
  const config::EvalConfig& e = config.eval;
  const config::RolloutConfig& r = config.rollout;
  EvalDataset d;
  d.name = entry.name;
  d.n_samples = entry.n_samples.value_or(e.n_samples_per_eval_prompt);
  SamplingOptions& s = d.sampling;
  s.temperature = entry.temperature.value_or(e.temperature.value_or(r.temperature));
  s.top_p = entry.top_p.value_or(e.top_p.value_or(r.top_p));
  s.top_k = entry.top_k.value_or(e.top_k.value_or(r.top_k));
  s.max_response_len = entry.max_response_len ? entry.max_response_len
                       : e.max_response_len   ? e.max_response_len
                                              : r.max_response_len;
  s.max_context_len = e.max_context_len ? e.max_context_len : r.max_context_len;
  s.min_new_tokens = entry.min_new_tokens ? entry.min_new_tokens : e.min_new_tokens;
  s.stop = entry.stop.value_or(r.stop);
  s.stop_token_ids = r.stop_token_ids;
  s.skip_special_tokens = r.skip_special_tokens;
  d.rm_type = entry.rm_type.value_or("");
  d.reward_key = entry.reward_key.value_or(e.reward_key.value_or(""));
  for (int64_t i = 0; i < dataset.size(); ++i) {
    data::SampleGroup g = data::MakeGroup(dataset.prompt(i), 1, i, i);
    d.prompts.push_back(std::move(g.front()));
  }
  return d;
}

}  // namespace slime::rollout
