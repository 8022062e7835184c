// EnvGenerator: a CustomGenerator (rollout/custom_generate.h) that runs each sample as a
// multi-turn episode against a tool environment spoken to over HTTP (EnvClient; protocol in
// docs/http-api.md, "Tool environments"); rollout.custom_generate: env.
//
// One episode, token-in/token-out (EpisodeRenderer):
//   1. /reset with the sample → episode id, first observation (else the sample's prompt) and
//      tool schemas; the prompt is rendered with the chat template (tools included) and
//      replaces the sample's prompt tokens (prompt_text = that rendering);
//   2. each turn: the model generates on the session's engine (max_new_tokens = what is left
//      of max_total_tokens, capped by max_response_len); its output ids are appended as they
//      are, trainable (loss mask 1) with their log-probs; tool calls are parsed from its text
//      and /step gets {text, tool_calls};
//   3. unless the step is `done` or this was the last turn, the observation is rendered
//      (tool results as tool messages) and appended, not trainable (mask 0, log-prob 0);
//   4. the episode ends on `done` (status completed), after max_turns turns or when
//      max_total_tokens leaves no room for another turn (status truncated). A turn cut by
//      max_new_tokens does not end the episode: the environment sees the text and decides.
//   Reward: the sum of the steps' rewards (rewarded = true: no reward model);
//   metadata.env = {"episode_id", "turns", "done", "info" (the last step's)}. /close is sent
//   at the end (best effort).
//
// Errors of the environment (unreachable, HTTP error, timeout, malformed answer, an
// observation the template cannot render, the episode running past episode_timeout) are
// recorded as metadata.env_error and handled by `on_env_error`:
//   kFail        Generate fails with the error (it names the env URL; the coordinator adds the
//                sample), so the rollout fails;
//   kDrop        the sample is kept out of training: status failed, remove_sample, reward 0;
//   kZeroReward  the sample is trained as far as it got, reward 0, status truncated.
// A kept sample without any response token gets the EOS token (mask 0), so every sample the
// trainer sees has a response. Engine errors are not environment errors: they fail Generate.
// Never a hang: every environment call waits at most what is left of episode_timeout; engine
// calls are bounded by rollout.request_timeout_s; an abort returns at once (status aborted).
//
// Thread-safety: Generate may run concurrently (each call has its own EnvClient).
#ifndef SLIME_WORKFLOW_ENV_GENERATOR_H_
#define SLIME_WORKFLOW_ENV_GENERATOR_H_

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "nlohmann/json.hpp"
#include "slime/common/status.h"
#include "slime/rollout/custom_generate.h"
#include "slime/workflow/env_client.h"
#include "slime/workflow/episode_render.h"

namespace slime::tokenizer {
class Tokenizer;
}

namespace slime::workflow {

enum class OnEnvError { kFail, kDrop, kZeroReward };
// "fail", "drop", "zero_reward"; errors list the valid names.
StatusOr<OnEnvError> ParseOnEnvError(std::string_view name);

struct EnvGeneratorOptions {
  std::string env_url;  // http://host:port[/prefix]
  int max_turns = 8;
  std::optional<int> max_total_tokens;  // prompt + response; unset = no cap of ours
  std::chrono::milliseconds episode_timeout{std::chrono::seconds(300)};
  // /close waits at most this (and never past the episode's deadline plus this).
  std::chrono::milliseconds close_timeout{std::chrono::seconds(5)};
  OnEnvError on_env_error = OnEnvError::kFail;
  nlohmann::ordered_json chat_template_kwargs = nlohmann::ordered_json::object();
};

class EnvGenerator : public rollout::CustomGenerator {
 public:
  // Borrows `tokenizer` (it must outlive the generator). Errors: a bad URL or option, a
  // tokenizer without a supported chat template. Does not contact the environment.
  static StatusOr<std::unique_ptr<EnvGenerator>> Create(EnvGeneratorOptions options,
                                                        const tokenizer::Tokenizer* tokenizer);

  std::string kind() const override { return "env"; }
  StatusOr<rollout::CustomGenerateResult> Generate(const data::Sample& sample,
                                                   rollout::EngineSession* session) override;

  const EnvGeneratorOptions& options() const { return options_; }

 private:
  EnvGenerator(EnvGeneratorOptions options, EnvUrl url, const tokenizer::Tokenizer* tokenizer,
               EpisodeRenderer renderer)
      : options_(std::move(options)),
        url_(std::move(url)),
        tokenizer_(tokenizer),
        renderer_(std::move(renderer)) {}

  EnvGeneratorOptions options_;
  EnvUrl url_;
  const tokenizer::Tokenizer* tokenizer_;
  EpisodeRenderer renderer_;
};

}  // namespace slime::workflow

#endif  // SLIME_WORKFLOW_ENV_GENERATOR_H_
