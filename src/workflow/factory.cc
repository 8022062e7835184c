// MakeCustomGenerator and ConfigureCustomGeneration (factory.h).
#include "slime/workflow/factory.h"

#include <fmt/format.h>

#include <map>
#include <utility>

#include "slime/agent/agent_generator.h"
#include "slime/config/config.h"
#include "slime/data/prompt_dataset.h"
#include "slime/plugin/plugin_generator.h"
#include "slime/workflow/env_generator.h"

namespace slime::workflow {

StatusOr<std::shared_ptr<rollout::CustomGenerator>> MakeCustomGenerator(
    const config::Config& config, const tokenizer::Tokenizer* tokenizer, const std::string& kind,
    const std::string& env_url) {
  const config::RolloutConfig& r = config.rollout;
  if (kind == "env") {
    EnvGeneratorOptions o;
    o.env_url = env_url;
    o.max_turns = r.max_turns;
    o.max_total_tokens = r.max_total_tokens ? r.max_total_tokens : r.max_context_len;
    o.episode_timeout =
        std::chrono::milliseconds(static_cast<int64_t>(r.episode_timeout_s * 1000));
    SLIME_ASSIGN_OR_RETURN(o.on_env_error, ParseOnEnvError(r.on_env_error));
    o.chat_template_kwargs = data::PromptDatasetOptionsFromConfig(config).chat_template_kwargs;
    StatusOr<std::unique_ptr<EnvGenerator>> g = EnvGenerator::Create(std::move(o), tokenizer);
    if (!g.ok()) {
      return Status(g.status().code(), fmt::format("rollout.custom_generate env: {}",
                                                   std::string(g.status().message())));
    }
    return std::shared_ptr<rollout::CustomGenerator>(*std::move(g));
  }
  if (kind == "plugin") {
    plugin::PluginOptions o;
    o.path = r.custom_generate_path.value_or("");
    o.config_json = r.custom_generate_config.value_or("");
    StatusOr<std::unique_ptr<rollout::CustomGenerator>> g = plugin::LoadGeneratePlugin(o);
    if (!g.ok()) {
      return Status(g.status().code(), fmt::format("rollout.custom_generate plugin: {}",
                                                   std::string(g.status().message())));
    }
    return std::shared_ptr<rollout::CustomGenerator>(*std::move(g));
  }
  if (kind == "agent") {
    agent::AgentOptions o;
    o.command = agent::ShellJoin(r.agent_command);
    if (tokenizer != nullptr) {
      // Borrowed: the job's tokenizer outlives its rollout coordinator and generators.
      o.tokenizer = std::shared_ptr<const tokenizer::Tokenizer>(
          tokenizer, [](const tokenizer::Tokenizer*) {});
    } else {
      o.tokenizer_dir = config.model.hf_checkpoint;
    }
    o.timeout_s = r.episode_timeout_s;
    o.max_turns = r.max_turns;
    o.log_dir = config.cluster.run_dir + "/agent_logs";
    o.server.chat_template_kwargs =
        data::PromptDatasetOptionsFromConfig(config).chat_template_kwargs;
    StatusOr<std::unique_ptr<rollout::CustomGenerator>> g = agent::MakeAgentGenerator(o);
    if (!g.ok()) {
      return Status(g.status().code(), fmt::format("rollout.custom_generate agent: {}",
                                                   std::string(g.status().message())));
    }
    return std::shared_ptr<rollout::CustomGenerator>(*std::move(g));
  }
  return absl::InvalidArgumentError(fmt::format(
      "rollout.custom_generate '{}' is not known: use plugin, env or agent", kind));
}

Status ConfigureCustomGeneration(const config::Config& config,
                                 const tokenizer::Tokenizer* tokenizer,
                                 rollout::RolloutOptions* options,
                                 std::vector<rollout::EvalDataset>* eval_datasets) {
  // One generator per (kind, env_url).
  std::map<std::pair<std::string, std::string>, std::shared_ptr<rollout::CustomGenerator>> made;
  const auto get = [&](const std::string& kind, const std::string& env_url)
      -> StatusOr<std::shared_ptr<rollout::CustomGenerator>> {
    auto key = std::make_pair(kind, kind == "env" ? env_url : std::string());
    if (auto it = made.find(key); it != made.end()) return it->second;
    SLIME_ASSIGN_OR_RETURN(auto g, MakeCustomGenerator(config, tokenizer, kind, env_url));
    made[key] = g;
    return g;
  };
  const config::RolloutConfig& r = config.rollout;
  if (r.custom_generate) {
    SLIME_ASSIGN_OR_RETURN(options->custom_generator,
                           get(*r.custom_generate, r.env_url.value_or("")));
    options->custom_generate_concurrency = r.custom_generate_concurrency;
  }
  if (eval_datasets == nullptr) return absl::OkStatus();
  options->custom_generate_concurrency = r.custom_generate_concurrency;
  for (rollout::EvalDataset& d : *eval_datasets) {
    const config::EvalDatasetConfig* entry = nullptr;
    for (const auto& e : config.eval.datasets) {
      if (e.name == d.name) entry = &e;
    }
    const std::string kind =
        entry != nullptr && entry->custom_generate ? *entry->custom_generate
                                                   : r.custom_generate.value_or("none");
    const std::string env_url = entry != nullptr && entry->env_url ? *entry->env_url
                                                                   : r.env_url.value_or("");
    if (kind == "none") {
      d.custom_generator = nullptr;
      continue;
    }
    StatusOr<std::shared_ptr<rollout::CustomGenerator>> g = get(kind, env_url);
    if (!g.ok()) {
      return Status(g.status().code(), fmt::format("eval dataset '{}': {}", d.name,
                                                   std::string(g.status().message())));
    }
    d.custom_generator = *std::move(g);
  }
  return absl::OkStatus();
}

}  // namespace slime::workflow
