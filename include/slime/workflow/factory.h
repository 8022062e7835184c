// The custom generators of a job, from its config (rollout.custom_generate and its keys,
// docs/config.md; the per-dataset eval.datasets[].custom_generate / env_url).
//
//   env     EnvGenerator over rollout.env_url (or the dataset's), with max_turns,
//           max_total_tokens, episode_timeout_s, on_env_error and the data's chat-template
//           kwargs;
//   plugin  a generate plugin (rollout.custom_generate_path, custom_generate_config);
//   agent   the OpenAI agent adapter (rollout.agent_command).
//
// Ownership: the generators borrow `tokenizer` (it must outlive them). Thread-safety: pure
// construction; call from one thread.
#ifndef SLIME_WORKFLOW_FACTORY_H_
#define SLIME_WORKFLOW_FACTORY_H_

#include <memory>
#include <string>
#include <vector>

#include "slime/common/status.h"
#include "slime/rollout/coordinator.h"
#include "slime/rollout/custom_generate.h"

namespace slime::config {
struct Config;
}
namespace slime::tokenizer {
class Tokenizer;
}

namespace slime::workflow {

// The generator of `kind` ("env", "plugin", "agent") with the config's rollout.* settings;
// `env_url` for "env". Errors: an unknown kind (listing the valid ones), bad settings, and
// for now Unimplemented for plugin and agent (naming the key).
StatusOr<std::shared_ptr<rollout::CustomGenerator>> MakeCustomGenerator(
    const config::Config& config, const tokenizer::Tokenizer* tokenizer, const std::string& kind,
    const std::string& env_url);

// Sets options->custom_generator from rollout.custom_generate (null when unset) and each eval
// dataset's from its config entry (matched by name; "none" = default generation). Datasets
// with the training settings share the training generator.
Status ConfigureCustomGeneration(const config::Config& config,
                                 const tokenizer::Tokenizer* tokenizer,
                                 rollout::RolloutOptions* options,
                                 std::vector<rollout::EvalDataset>* eval_datasets);

}  // namespace slime::workflow

#endif  // SLIME_WORKFLOW_FACTORY_H_
