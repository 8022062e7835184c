// EnvGenerator (env_generator.h): multi-turn episodes against an HTTP tool environment.
#include "slime/workflow/env_generator.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "slime/rollout/coordinator.h"
#include "slime/tokenizer/tokenizer.h"

namespace slime::workflow {

using ojson = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

StatusOr<OnEnvError> ParseOnEnvError(std::string_view name) {
  if (name == "fail") return OnEnvError::kFail;
  if (name == "drop") return OnEnvError::kDrop;
  if (name == "zero_reward") return OnEnvError::kZeroReward;
  return absl::InvalidArgumentError(fmt::format(
      "on_env_error '{}' is not known: use fail, drop or zero_reward", std::string(name)));
}

StatusOr<std::unique_ptr<EnvGenerator>> EnvGenerator::Create(EnvGeneratorOptions options,
                                                             const tokenizer::Tokenizer* tokenizer) {
  if (tokenizer == nullptr) {
    return absl::InvalidArgumentError("the env generator needs the model's tokenizer");
  }
  SLIME_ASSIGN_OR_RETURN(EnvUrl url, ParseEnvUrl(options.env_url));
  if (options.max_turns < 1) {
    return absl::InvalidArgumentError(
        fmt::format("max_turns = {} must be >= 1", options.max_turns));
  }
  if (options.max_total_tokens && *options.max_total_tokens < 2) {
    return absl::InvalidArgumentError(
        fmt::format("max_total_tokens = {} must be >= 2", *options.max_total_tokens));
  }
  if (options.episode_timeout.count() <= 0) {
    return absl::InvalidArgumentError("episode_timeout must be positive");
  }
  SLIME_ASSIGN_OR_RETURN(EpisodeRenderer renderer,
                         EpisodeRenderer::Create(tokenizer, options.chat_template_kwargs));
  return std::unique_ptr<EnvGenerator>(
      new EnvGenerator(std::move(options), std::move(url), tokenizer, std::move(renderer)));
}

namespace {

// One episode's state (Generate's locals, so the error path can see them).
struct Episode {
  data::Sample out;
  std::string episode_id;
  int turns = 0;
  bool done = false;
  double reward = 0;
  ojson info = ojson::object();
  Clock::time_point deadline;

  std::chrono::milliseconds Left() const {
    return std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  }
  void RecordEnv() {
    out.metadata["env"] = {
        {"episode_id", episode_id}, {"turns", turns}, {"done", done}, {"info", info}};
  }
};

}  // namespace

StatusOr<rollout::CustomGenerateResult> EnvGenerator::Generate(const data::Sample& sample,
                                                               rollout::EngineSession* session) {
  Episode ep;
  ep.out = sample;
  ep.deadline = Clock::now() + options_.episode_timeout;
  EnvClient client(url_);

  const auto finish = [&](data::SampleStatus status) {
    ep.out.status = status;
    ep.out.reward = ep.reward;
    ep.out.raw_reward = ep.reward;
    ep.RecordEnv();
    if (!ep.episode_id.empty()) {
      const auto wait = std::min(options_.close_timeout,
                                 std::max(ep.Left(), std::chrono::milliseconds(100)));
      if (Status s = client.Close(ep.episode_id, wait); !s.ok()) {
        spdlog::debug("sample {}: {}", sample.index, s.ToString());
      }
    }
    rollout::CustomGenerateResult r;
    r.segments.push_back(std::move(ep.out));
    r.rewarded = true;
    return r;
  };
  // An environment error, handled per on_env_error.
  const auto env_error = [&](const Status& error) -> StatusOr<rollout::CustomGenerateResult> {
    const std::string message = std::string(error.message());
    if (options_.on_env_error == OnEnvError::kFail) {
      return Status(error.code(), fmt::format("{} (rollout.on_env_error: fail)", message));
    }
    spdlog::warn("sample {}: {} (rollout.on_env_error: {})", sample.index, message,
                 options_.on_env_error == OnEnvError::kDrop ? "drop" : "zero_reward");
    ep.out.metadata["env_error"] = message;
    if (ep.out.response_length == 0 && tokenizer_->eos_id()) {
      const int32_t eos = *tokenizer_->eos_id();
      SLIME_RETURN_IF_ERROR(ep.out.AppendResponse(std::span<const int32_t>(&eos, 1), {},
                                                  /*trainable=*/false));
    }
    ep.reward = 0;
    if (options_.on_env_error == OnEnvError::kDrop) {
      ep.out.remove_sample = true;
      return finish(data::SampleStatus::kFailed);
    }
    return finish(data::SampleStatus::kTruncated);
  };
  const auto timed_out = [&]() {
    return absl::DeadlineExceededError(
        fmt::format("environment {}: the episode ran past rollout.episode_timeout_s = {:.0f} s "
                    "after {} turns",
                    url_.ToString(),
                    std::chrono::duration<double>(options_.episode_timeout).count(), ep.turns));
  };

  if (session->aborting()) return finish(data::SampleStatus::kAborted);
  StatusOr<EnvReset> reset = client.Reset(sample, ep.Left());
  if (!reset.ok()) return env_error(reset.status());
  ep.episode_id = reset->episode_id;
  const ojson messages = EpisodeRenderer::InitialMessages(
      reset->observation.is_null() ? sample.prompt : reset->observation);
  std::string prompt_text;
  StatusOr<std::vector<int32_t>> prompt = renderer_.Prompt(messages, reset->tools, &prompt_text);
  if (!prompt.ok()) {
    return env_error(Status(prompt.status().code(),
                            fmt::format("environment {}/reset: the first observation: {}",
                                        url_.ToString(), std::string(prompt.status().message()))));
  }
  ep.out.tokens = *std::move(prompt);
  ep.out.prompt_text = std::move(prompt_text);
  ep.out.response_length = 0;
  ep.out.response.clear();
  ep.out.loss_mask.clear();
  ep.out.rollout_log_probs.clear();
  ep.out.weight_versions.clear();
  if (reset->tools.is_array()) ep.out.metadata["tools"] = reset->tools;

  const rollout::SamplingOptions& sampling = session->sampling();
  while (ep.turns < options_.max_turns) {
    if (session->aborting()) return finish(data::SampleStatus::kAborted);
    if (ep.Left().count() <= 0) return env_error(timed_out());
    nlohmann::json overrides = nlohmann::json::object();
    if (options_.max_total_tokens) {
      int64_t room = *options_.max_total_tokens - static_cast<int64_t>(ep.out.tokens.size());
      if (room <= 0) return finish(data::SampleStatus::kTruncated);
      if (sampling.max_response_len) room = std::min<int64_t>(room, *sampling.max_response_len);
      overrides["max_new_tokens"] = room;
    }
    SLIME_ASSIGN_OR_RETURN(rollout::GenerateTurn turn, session->Generate(ep.out.tokens, overrides));
    if (turn.finish_reason == "abort") {
      if (!turn.output_ids.empty()) {
        SLIME_RETURN_IF_ERROR(ep.out.AppendResponse(turn.output_ids, turn.log_probs, true,
                                                    turn.text, turn.weight_version));
      }
      return finish(data::SampleStatus::kAborted);
    }
    ++ep.turns;
    if (turn.output_ids.empty() && turn.finish_reason == "length") {
      return finish(data::SampleStatus::kTruncated);  // no room left in the context
    }
    SLIME_RETURN_IF_ERROR(ep.out.AppendResponse(turn.output_ids, turn.log_probs,
                                                /*trainable=*/true, turn.text,
                                                turn.weight_version));
    const ojson calls = ParseToolCalls(turn.text, renderer_.tool_call_format(), ep.turns);
    const ojson action = {{"text", turn.text}, {"tool_calls", calls}};
    StatusOr<EnvStep> step = client.Step(ep.episode_id, action, ep.Left());
    if (!step.ok()) return env_error(step.status());
    ep.reward += step->reward;
    ep.info = step->info;
    if (step->done) {
      ep.done = true;
      return finish(data::SampleStatus::kCompleted);
    }
    if (ep.turns == options_.max_turns) break;
    StatusOr<std::vector<int32_t>> obs =
        renderer_.Observation(renderer_.ObservationMessages(step->observation, !calls.empty()),
                              turn.output_ids);
    if (!obs.ok()) {
      return env_error(Status(obs.status().code(),
                              fmt::format("environment {}/step: {}", url_.ToString(),
                                          std::string(obs.status().message()))));
    }
    if (options_.max_total_tokens &&
        static_cast<int64_t>(ep.out.tokens.size() + obs->size()) >= *options_.max_total_tokens) {
      break;  // no room for another turn after this observation
    }
    const std::string obs_text = tokenizer_->Decode(*obs, /*skip_special_tokens=*/false);
    SLIME_RETURN_IF_ERROR(ep.out.AppendResponse(*obs, {}, /*trainable=*/false, obs_text));
  }
  return finish(data::SampleStatus::kTruncated);
}

}  // namespace slime::workflow
