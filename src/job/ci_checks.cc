// slime's CI assertions on the trainer's metrics (ci_checks.h).
#include "ci_checks.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "fmt/format.h"
#include "slime/common/atomic_file.h"

namespace slime::job {
namespace {

void Replace(std::string& s, const std::string& key, const std::string& value) {
  for (size_t pos = s.find(key); pos != std::string::npos; pos = s.find(key, pos + value.size())) {
    s.replace(pos, key.size(), value);
  }
}

const double* Find(const std::map<std::string, double>& values, const std::string& key) {
  auto it = values.find(key);
  return it == values.end() ? nullptr : &it->second;
}

Status Violated(int64_t rollout_id, const std::string& where, const std::string& what) {
  return absl::FailedPreconditionError(
      fmt::format("debug.ci_test: rollout {}{}: {}", rollout_id, where, what));
}

// The step's assertions (file comment).
Status CheckStep(const config::DebugConfig& debug, int64_t rollout_id, const TrainStepReport& s) {
  const std::string where = fmt::format(", step {} (step {} of the rollout)", s.step,
                                        s.step_in_rollout);
  if (const double* diff = Find(s.values, "train_rollout_logprob_abs_diff")) {
    if (!(*diff <= debug.ci_train_rollout_logprob_abs_diff_threshold)) {
      return Violated(rollout_id, where,
                      fmt::format("train/train_rollout_logprob_abs_diff = {:.6g} exceeds "
                                  "debug.ci_train_rollout_logprob_abs_diff_threshold = {:.6g} "
                                  "(the trainer's log-probs are too far from the engines')",
                                  *diff, debug.ci_train_rollout_logprob_abs_diff_threshold));
    }
  }
  if (debug.ci_disable_kl_checker) return absl::OkStatus();
  const double* ppo_kl = Find(s.values, "ppo_kl");
  if (s.step_in_rollout == 0 && ppo_kl != nullptr && Find(s.values, "pg_clipfrac") != nullptr &&
      !(std::fabs(*ppo_kl) < debug.ci_kl_threshold)) {
    return Violated(rollout_id, where,
                    fmt::format("|train/ppo_kl| = {:.6g} is not below debug.ci_kl_threshold = "
                                "{:.6g} on the rollout's first step (the policy that computed "
                                "the old log-probs should be the one trained; "
                                "debug.ci_disable_kl_checker turns this off)",
                                std::fabs(*ppo_kl), debug.ci_kl_threshold));
  }
  const double* kl_loss = Find(s.values, "kl_loss");
  if (s.step == 0 && kl_loss != nullptr && !(std::fabs(*kl_loss) < debug.ci_kl_threshold)) {
    return Violated(rollout_id, where,
                    fmt::format("|train/kl_loss| = {:.6g} is not below debug.ci_kl_threshold = "
                                "{:.6g} on the run's first step (the reference should equal the "
                                "actor; debug.ci_disable_kl_checker turns this off)",
                                std::fabs(*kl_loss), debug.ci_kl_threshold));
  }
  return absl::OkStatus();
}

StatusOr<double> ReadGradNorm(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        fmt::format("debug.ci_load_grad_norm: cannot open {} (written by a run with "
                    "debug.ci_save_grad_norm)",
                    path));
  }
  std::stringstream text;
  text << in.rdbuf();
  const std::string s = text.str();
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || !std::isfinite(v)) {
    return absl::DataLossError(
        fmt::format("debug.ci_load_grad_norm: {} does not hold a finite number", path));
  }
  return v;
}

// ci_save_grad_norm / ci_load_grad_norm for one step and role.
Status SaveOrCompareGradNorm(const config::DebugConfig& debug, int64_t rollout_id,
                             const TrainStepReport& s, const std::string& role,
                             const std::string& key) {
  const double* value = Find(s.values, key);
  if (value == nullptr) return absl::OkStatus();
  if (debug.ci_save_grad_norm) {
    const std::string path =
        GradNormPath(*debug.ci_save_grad_norm, role, rollout_id, s.step_in_rollout);
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
    SLIME_RETURN_IF_ERROR(WriteFileAtomically(path, fmt::format("{:.17g}\n", *value)));
  }
  if (debug.ci_load_grad_norm) {
    const std::string path =
        GradNormPath(*debug.ci_load_grad_norm, role, rollout_id, s.step_in_rollout);
    SLIME_ASSIGN_OR_RETURN(const double saved, ReadGradNorm(path));
    if (!(std::fabs(*value - saved) <= 0.01 * std::fabs(saved))) {
      return absl::FailedPreconditionError(fmt::format(
          "debug.ci_load_grad_norm: rollout {} step {} ({}): train/{} = {:.9g} differs from the "
          "saved {:.9g} in {} by more than 1%",
          rollout_id, s.step_in_rollout, role, key, *value, saved, path));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string GradNormPath(const std::string& pattern, const std::string& role, int64_t rollout_id,
                         int64_t step_id) {
  std::string out = pattern;
  Replace(out, "{role}", role);
  Replace(out, "{rollout_id}", std::to_string(rollout_id));
  Replace(out, "{step_id}", std::to_string(step_id));
  return out;
}

Status RunCiChecks(const config::DebugConfig& debug, int64_t rollout_id,
                   const std::vector<TrainStepReport>& steps,
                   const std::map<std::string, double>& rollout_values) {
  for (const TrainStepReport& s : steps) {
    if (debug.ci_test) SLIME_RETURN_IF_ERROR(CheckStep(debug, rollout_id, s));
    SLIME_RETURN_IF_ERROR(SaveOrCompareGradNorm(debug, rollout_id, s, "actor", "grad_norm"));
    SLIME_RETURN_IF_ERROR(
        SaveOrCompareGradNorm(debug, rollout_id, s, "critic", "critic_grad_norm"));
  }
  if (!debug.ci_test || debug.ci_disable_kl_checker || rollout_id != 0) return absl::OkStatus();
  const double* log_probs = Find(rollout_values, "log_probs");
  const double* ref = Find(rollout_values, "ref_log_probs");
  if (log_probs != nullptr && ref != nullptr &&
      !(std::fabs(*log_probs - *ref) < debug.ci_kl_threshold)) {
    return Violated(rollout_id, "",
                    fmt::format("rollout/log_probs = {:.9g} and rollout/ref_log_probs = {:.9g} "
                                "differ by {:.6g}, not below debug.ci_kl_threshold = {:.6g} (the "
                                "reference should equal the actor before training)",
                                *log_probs, *ref, std::fabs(*log_probs - *ref),
                                debug.ci_kl_threshold));
  }
  return absl::OkStatus();
}

}  // namespace slime::job
