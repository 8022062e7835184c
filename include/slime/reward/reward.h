// Rewards: scoring a finished sample (prompt, response, label, metadata) with slime's rule
// rewards, a remote reward model over HTTP, or a custom plugin (a shared library, see
// plugin_abi.h). docs/rewards.md describes every reward type and the plugin ABI.
//
// Pieces:
//   RewardSample  a view of one sample (the caller keeps the strings alive during the call);
//   RewardFn      one reward type ("math", "dapo", "remote_rm", a plugin, ...);
//   MakeRewardFn  the registry: a reward type name -> RewardFn;
//   RewardModel   the hub the rollout uses: picks the type per sample (metadata.rm_type >
//                 RewardSample::rm_type > RewardOptions::rm_type, slime's order), applies the
//                 `boxed_` prefix, selects reward_key from a mapping, scores batches on a few
//                 threads, and turns errors into the configured handling (fail, or a fixed
//                 reward plus a logged warning).
//
// Return values follow slime: math/deepscaler/gpqa/exact_match/random give 1 or 0; dapo gives
// +1/-1 with the mapping {score, acc, pred}; f1 gives the token F1 in [0, 1]; remote_rm gives
// whatever the server answers (a number, or a mapping read through reward_key).
//
// Thread-safety: RewardFn::Score and every RewardModel method may be called from many threads
// at once. Nothing here blocks without a bound: remote calls have a timeout and a finite number
// of retries, plugin calls run in child processes that are killed when they overrun.
#ifndef SLIME_REWARD_REWARD_H_
#define SLIME_REWARD_REWARD_H_

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "nlohmann/json.hpp"
#include "slime/common/status.h"

namespace slime::config {
struct RewardConfig;
}

namespace slime::reward {

// One sample to score. All members are views: the caller keeps them alive during the call.
struct RewardSample {
  std::string_view prompt{};    // the prompt text (rendered, or the raw string)
  std::string_view response{};  // the generated text
  std::string_view label{};     // the dataset label ("" when none)
  // The sample's metadata object (may be null). metadata["rm_type"] picks the reward type for
  // this sample; gpqa reads choices / valid_letters / correct_letter / correct_answer from it.
  const nlohmann::json* metadata = nullptr;
  // A per-sample default type (e.g. an eval dataset's rm_type); metadata["rm_type"] wins over
  // it, and it wins over RewardOptions::rm_type. Empty: not set.
  std::string_view rm_type{};
};

// What one reward function returns.
struct RewardValue {
  // The scalar reward, when the function has one (a mapping-only answer of a remote RM has
  // none: then RewardOptions::reward_key must name a numeric field of `fields`).
  std::optional<double> reward{};
  // A mapping the function returned besides (dapo: {"score", "acc", "pred"}; remote_rm: the
  // server's JSON object), else null.
  nlohmann::json fields{};
};

// One reward type. Implementations are thread-safe.
class RewardFn {
 public:
  virtual ~RewardFn() = default;
  virtual std::string name() const = 0;
  virtual StatusOr<RewardValue> Score(const RewardSample& sample) = 0;
  // Scores a whole group in one call (reward.group_rm). Default: Score each in turn.
  virtual StatusOr<std::vector<RewardValue>> ScoreGroup(std::span<const RewardSample> samples);
};

enum class OnError {
  kFail,   // the call returns the error
  kValue,  // the sample gets RewardOptions::error_reward and a logged warning
};

struct RemoteOptions {
  std::string url{};  // "http://host:port/path" (https is not supported)
  std::chrono::milliseconds timeout{std::chrono::seconds(120)};  // per attempt
  int max_attempts = 10;                                         // slime: 10
  // Wait before attempt k+1: min(backoff_initial * 2^k, backoff_max) + up to backoff_initial
  // of random jitter (slime: min(2^k, 30) s + rand() s).
  std::chrono::milliseconds backoff_initial{std::chrono::seconds(1)};
  std::chrono::milliseconds backoff_max{std::chrono::seconds(30)};
};

struct PluginOptions {
  std::string path{};  // the shared library (.so)
  // One call (one sample, or one group with group_rm) must answer within this, else the
  // child process running the plugin is killed and the call fails with DeadlineExceeded.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  int num_processes = 4;  // child processes serving calls in parallel (started on demand)
};

struct RewardOptions {
  std::string rm_type{};         // default reward type; may be empty if every sample names one
  std::string reward_key{};      // when a reward is a mapping: the field used as the reward
  std::string custom_rm_path{};  // a plugin replacing the rule rewards (plugin_abi.h)
  bool group_rm = false;         // ScoreGroup makes one call per group (plugin batch entry)
  RemoteOptions remote{};        // remote.url set: remote_rm is available
  PluginOptions plugin{};        // plugin.path is taken from custom_rm_path
  OnError on_error = OnError::kFail;
  double error_reward = 0.0;
  int num_workers = 8;  // threads ScoreBatch uses (>= 1)
};

// Options from the config's `reward` section (docs/config.md).
RewardOptions RewardOptionsFromConfig(const config::RewardConfig& config);

// The reward types MakeRewardFn knows (without the `boxed_` prefix).
const std::vector<std::string>& RewardTypes();

// A reward function by type name (no `boxed_` prefix: RewardModel applies it). remote_rm needs
// options.remote.url. "ifbench" is recognised but not built (Unimplemented: it needs the
// official IFBench checker; use a plugin). An unknown name is InvalidArgument listing the
// known ones.
StatusOr<std::unique_ptr<RewardFn>> MakeRewardFn(std::string_view rm_type,
                                                 const RewardOptions& options);

// remote_rm (remote.cc): POSTs {"prompt", "response", "label"} as JSON to options.url and
// reads the answer: a number (or bool) is the reward, an object is returned as `fields`.
// Transport errors, timeouts, 408/429/5xx and unparsable bodies are retried up to
// max_attempts times with the backoff above; other 4xx answers fail at once. The error names
// the URL, the attempts made and the last failure (code of the last failure).
StatusOr<std::unique_ptr<RewardFn>> MakeRemoteRewardFn(const RemoteOptions& options);

// A custom plugin (plugin.cc, ABI in plugin_abi.h). Starts one worker process now and checks
// that the library loads, exports the required symbols with a matching ABI version and that
// slime_reward_init succeeds (and, with `need_batch`, exports slime_reward_batch_v1); errors
// name the path and what is wrong. Calls run in worker processes: a crash is an Internal
// error naming the signal, an overrun a DeadlineExceeded error; the worker is replaced.
StatusOr<std::unique_ptr<RewardFn>> LoadRewardPlugin(const PluginOptions& options, bool need_batch);

// A reward after the policy: `error` is empty unless on_error = value replaced a failed reward.
struct RewardResult {
  double reward = 0.0;
  nlohmann::json fields{};  // as RewardValue::fields
  std::string error{};
};

class RewardModel {
 public:
  // Checks the options (known default type, URL, plugin loads and answers its handshake).
  static StatusOr<std::unique_ptr<RewardModel>> Create(RewardOptions options);
  ~RewardModel();
  RewardModel(const RewardModel&) = delete;
  RewardModel& operator=(const RewardModel&) = delete;

  // One sample. With on_error = fail an error names the reward type and what went wrong.
  StatusOr<RewardResult> Score(const RewardSample& sample);
  // Many independent samples on up to num_workers threads; results in input order. With
  // on_error = fail, the first error (in input order) is returned.
  StatusOr<std::vector<RewardResult>> ScoreBatch(std::span<const RewardSample> samples);
  // One group: with group_rm and a plugin, one plugin call for the group; otherwise ScoreBatch.
  StatusOr<std::vector<RewardResult>> ScoreGroup(std::span<const RewardSample> samples);

  const RewardOptions& options() const { return options_; }

 private:
  explicit RewardModel(RewardOptions options);
  struct Resolved;
  StatusOr<Resolved> Resolve(const RewardSample& sample) const;
  StatusOr<RewardResult> Finish(const std::string& type, StatusOr<RewardValue> value) const;

  RewardOptions options_;
  std::unique_ptr<RewardFn> plugin_;  // set when custom_rm_path is
  // Built-in types by name; remote_rm only when remote.url is set. Immutable after Create.
  std::map<std::string, std::unique_ptr<RewardFn>, std::less<>> builtin_;
};

}  // namespace slime::reward

#endif  // SLIME_REWARD_REWARD_H_
