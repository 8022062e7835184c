// The reward registry and RewardModel (reward.h).
#include "slime/reward/reward.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <random>
#include <thread>

#include "fmt/format.h"
#include "slime/common/strings.h"
#include "slime/config/config.h"
#include "slime/reward/rules.h"
#include "spdlog/spdlog.h"

namespace slime::reward {
namespace {

using ScoreFunction = std::function<StatusOr<RewardValue>(const RewardSample&)>;

// A rule reward: a pure function of the sample.
class RuleRewardFn : public RewardFn {
 public:
  RuleRewardFn(std::string name, ScoreFunction fn) : name_(std::move(name)), fn_(std::move(fn)) {}
  std::string name() const override { return name_; }
  StatusOr<RewardValue> Score(const RewardSample& sample) override { return fn_(sample); }

 private:
  const std::string name_;
  const ScoreFunction fn_;
};

RewardValue Scalar(double v) { return RewardValue{v, nullptr}; }

std::string Trimmed(std::string_view s) {
  size_t b = s.find_first_not_of(" \t\n\r");
  if (b == std::string_view::npos) return "";
  size_t e = s.find_last_not_of(" \t\n\r");
  return std::string(s.substr(b, e - b + 1));
}

constexpr std::string_view kBoxedPrefix = "boxed_";

Status UnknownType(std::string_view type) {
  std::string message = fmt::format(
      "unknown reward type \"{}\"; known: {} (each may be "
      "prefixed boxed_)",
      std::string(type), JoinQuoted(RewardTypes()));
  if (auto close = ClosestMatch(std::string(type), RewardTypes())) {
    message += fmt::format("; did you mean \"{}\"?", *close);
  }
  return absl::InvalidArgumentError(message);
}

}  // namespace

StatusOr<std::vector<RewardValue>> RewardFn::ScoreGroup(std::span<const RewardSample> samples) {
  std::vector<RewardValue> out;
  out.reserve(samples.size());
  for (const auto& s : samples) {
    SLIME_ASSIGN_OR_RETURN(RewardValue v, Score(s));
    out.push_back(std::move(v));
  }
  return out;
}

const std::vector<std::string>& RewardTypes() {
  static const std::vector<std::string> kTypes = {
      "math", "dapo", "deepscaler", "f1", "gpqa", "ifbench", "remote_rm", "random", "exact_match"};
  return kTypes;
}

StatusOr<std::unique_ptr<RewardFn>> MakeRewardFn(std::string_view rm_type,
                                                 const RewardOptions& options) {
  const std::string type(rm_type);
  ScoreFunction fn;
  if (type == "math") {
    fn = [](const RewardSample& s) { return Scalar(MathReward(s.response, s.label)); };
  } else if (type == "deepscaler") {
    fn = [](const RewardSample& s) { return Scalar(DeepscalerReward(s.response, s.label)); };
  } else if (type == "dapo") {
    fn = [](const RewardSample& s) -> StatusOr<RewardValue> {
      SLIME_ASSIGN_OR_RETURN(nlohmann::json score, DapoScore(s.response, s.label));
      double reward = score["score"].get<double>();
      return RewardValue{reward, std::move(score)};
    };
  } else if (type == "f1") {
    fn = [](const RewardSample& s) { return Scalar(F1Reward(s.response, s.label)); };
  } else if (type == "gpqa") {
    fn = [](const RewardSample& s) { return Scalar(GpqaReward(s.response, s.label, s.metadata)); };
  } else if (type == "exact_match") {
    fn = [](const RewardSample& s) { return Scalar(ExactMatchReward(s.response, s.label)); };
  } else if (type == "random") {
    fn = [](const RewardSample&) {
      thread_local std::mt19937 rng(std::random_device{}());
      return Scalar(static_cast<double>(rng() & 1u));
    };
  } else if (type == "ifbench") {
    fn = [](const RewardSample&) -> StatusOr<RewardValue> {
      return absl::UnimplementedError(
          "reward type \"ifbench\" is not built into slime-cpp (it needs the official IFBench "
          "instruction checkers); score IFBench with a reward plugin (reward.custom_rm_path)");
    };
  } else if (type == "remote_rm") {
    return MakeRemoteRewardFn(options.remote);
  } else {
    return UnknownType(type);
  }
  return std::unique_ptr<RewardFn>(new RuleRewardFn(type, std::move(fn)));
}

RewardOptions RewardOptionsFromConfig(const config::RewardConfig& c) {
  RewardOptions o;
  o.rm_type = c.rm_type.value_or("");
  o.reward_key = c.reward_key.value_or("");
  o.custom_rm_path = c.custom_rm_path.value_or("");
  o.group_rm = c.group_rm;
  o.remote.url = c.rm_url.value_or("");
  o.remote.timeout = std::chrono::milliseconds(static_cast<int64_t>(c.rm_timeout_s * 1000));
  o.remote.max_attempts = c.rm_max_attempts;
  o.plugin.timeout = std::chrono::milliseconds(static_cast<int64_t>(c.plugin_timeout_s * 1000));
  o.plugin.num_processes = c.num_workers;
  o.on_error = c.on_error == "value" ? OnError::kValue : OnError::kFail;
  o.error_reward = c.error_reward;
  o.num_workers = c.num_workers;
  return o;
}

// ---- RewardModel -----------------------------------------------------------------------------

struct RewardModel::Resolved {
  std::string type;  // as the sample asked, with any boxed_ prefix ("" with a plugin)
  RewardFn* fn = nullptr;
  std::string boxed_response;  // the response after boxed_ extraction
  bool boxed = false;
};

RewardModel::RewardModel(RewardOptions options) : options_(std::move(options)) {}
RewardModel::~RewardModel() = default;

StatusOr<std::unique_ptr<RewardModel>> RewardModel::Create(RewardOptions options) {
  if (options.num_workers < 1) {
    return absl::InvalidArgumentError(
        fmt::format("reward.num_workers must be >= 1 (got {})", options.num_workers));
  }
  if (!std::isfinite(options.error_reward)) {
    return absl::InvalidArgumentError("reward.error_reward must be a finite number");
  }
  std::unique_ptr<RewardModel> model(new RewardModel(options));
  for (const auto& type : RewardTypes()) {
    if (type == "remote_rm" && options.remote.url.empty()) continue;
    SLIME_ASSIGN_OR_RETURN(auto fn, MakeRewardFn(type, options));
    model->builtin_.emplace(type, std::move(fn));
  }
  std::string default_type = options.rm_type;
  if (default_type.starts_with(kBoxedPrefix)) default_type = default_type.substr(6);
  if (!default_type.empty() &&
      std::find(RewardTypes().begin(), RewardTypes().end(), default_type) == RewardTypes().end()) {
    return UnknownType(options.rm_type);
  }
  if (default_type == "remote_rm" && options.remote.url.empty()) {
    return absl::InvalidArgumentError("reward.rm_type \"remote_rm\" requires reward.rm_url");
  }
  if (!options.custom_rm_path.empty()) {
    PluginOptions plugin = options.plugin;
    plugin.path = options.custom_rm_path;
    SLIME_ASSIGN_OR_RETURN(model->plugin_, LoadRewardPlugin(plugin, options.group_rm));
  }
  return model;
}

StatusOr<RewardModel::Resolved> RewardModel::Resolve(const RewardSample& sample) const {
  Resolved r;
  if (sample.metadata != nullptr && sample.metadata->is_object()) {
    auto it = sample.metadata->find("rm_type");
    if (it != sample.metadata->end() && it->is_string()) r.type = Trimmed(it->get<std::string>());
  }
  if (r.type.empty()) r.type = Trimmed(sample.rm_type);
  if (r.type.empty()) r.type = Trimmed(options_.rm_type);
  if (plugin_ != nullptr) {  // slime: custom_rm_path wins over every rm_type
    r.fn = plugin_.get();
    return r;
  }
  if (r.type.empty()) {
    return absl::InvalidArgumentError(
        "no reward type for this sample: set reward.rm_type, the sample's metadata.rm_type, "
        "or reward.custom_rm_path");
  }
  std::string base = r.type;
  if (base.starts_with(kBoxedPrefix)) {
    base = base.substr(kBoxedPrefix.size());
    r.boxed = true;
    r.boxed_response = ExtractBoxedAnswer(sample.response).value_or("");
  }
  auto it = builtin_.find(base);
  if (it == builtin_.end()) {
    if (base == "remote_rm") {
      return absl::FailedPreconditionError(
          "this sample asks for remote_rm but reward.rm_url is not set");
    }
    return UnknownType(r.type);
  }
  r.fn = it->second.get();
  return r;
}

StatusOr<RewardResult> RewardModel::Finish(const std::string& type,
                                           StatusOr<RewardValue> value) const {
  Status error;
  RewardResult result;
  if (!value.ok()) {
    error = value.status();
  } else {
    result.fields = std::move(value->fields);
    const bool has_scalar = value->reward.has_value();
    double reward = has_scalar ? *value->reward : 0.0;
    auto field_names = [&] {
      std::vector<std::string> keys;
      for (auto& [k, v] : result.fields.items()) keys.push_back(k);
      return JoinQuoted(keys);
    };
    if (!options_.reward_key.empty() && result.fields.is_object()) {
      auto it = result.fields.find(options_.reward_key);
      if (it != result.fields.end() && (it->is_number() || it->is_boolean())) {
        reward = it->is_boolean() ? (it->get<bool>() ? 1.0 : 0.0) : it->get<double>();
      } else {
        error = absl::InvalidArgumentError(fmt::format(
            "reward.reward_key \"{}\" is not a numeric field of the reward mapping (fields: {})",
            options_.reward_key, field_names()));
      }
    } else if (!has_scalar) {
      error = absl::InvalidArgumentError(fmt::format(
          "the reward is a mapping; set reward.reward_key to one of its numeric fields ({})",
          field_names()));
    }
    if (error.ok() && !std::isfinite(reward)) {
      error = absl::InvalidArgumentError(fmt::format("the reward is not finite ({})", reward));
    }
    if (error.ok()) result.reward = reward;
  }
  if (error.ok()) return result;
  std::string what = type.empty() ? std::string("unresolved") : type;
  if (options_.on_error == OnError::kFail) {
    return Status(error.code(), fmt::format("reward ({}): {}", what, std::string(error.message())));
  }
  spdlog::warn("reward ({}) failed, using reward.error_reward = {}: {}", what,
               options_.error_reward, std::string(error.message()));
  result.reward = options_.error_reward;
  result.error = std::string(error.message());
  return result;
}

StatusOr<RewardResult> RewardModel::Score(const RewardSample& sample) {
  auto resolved = Resolve(sample);
  if (!resolved.ok()) return Finish("", resolved.status());
  RewardSample view = sample;
  view.rm_type = resolved->type;
  if (resolved->boxed) view.response = resolved->boxed_response;
  return Finish(plugin_ != nullptr ? "plugin" : resolved->type, resolved->fn->Score(view));
}

StatusOr<std::vector<RewardResult>> RewardModel::ScoreBatch(std::span<const RewardSample> samples) {
  std::vector<std::optional<StatusOr<RewardResult>>> results(samples.size());
  size_t threads = std::min<size_t>(static_cast<size_t>(options_.num_workers), samples.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < samples.size(); i = next++) results[i] = Score(samples[i]);
  };
  if (threads <= 1) {
    work();
  } else {
    std::vector<std::thread> pool;
    for (size_t t = 0; t < threads; ++t) pool.emplace_back(work);
    for (auto& t : pool) t.join();
  }
  std::vector<RewardResult> out;
  out.reserve(samples.size());
  for (auto& r : results) {
    if (!r->ok()) return r->status();
    out.push_back(std::move(**r));
  }
  return out;
}

StatusOr<std::vector<RewardResult>> RewardModel::ScoreGroup(std::span<const RewardSample> samples) {
  if (!options_.group_rm || plugin_ == nullptr || samples.empty()) return ScoreBatch(samples);
  std::vector<RewardSample> views(samples.begin(), samples.end());
  std::vector<std::string> types(samples.size());
  for (size_t i = 0; i < views.size(); ++i) {
    auto resolved = Resolve(views[i]);
    if (resolved.ok()) types[i] = resolved->type;
    views[i].rm_type = types[i];
  }
  auto values = plugin_->ScoreGroup(views);
  std::vector<RewardResult> out;
  for (size_t i = 0; i < samples.size(); ++i) {
    StatusOr<RewardValue> value =
        values.ok() ? StatusOr<RewardValue>((*values)[i]) : StatusOr<RewardValue>(values.status());
    SLIME_ASSIGN_OR_RETURN(RewardResult r, Finish("plugin", std::move(value)));
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace slime::reward
