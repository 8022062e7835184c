// The driver's lifecycle, its synchronous loop and one rollout's steps
// (include/slime/job/driver.h; the Driver and where its other steps live: driver_internal.h).
#include "slime/job/driver.h"

#include <algorithm>
#include <iostream>

#include "ci_checks.h"
#include "driver_internal.h"
#include "fmt/format.h"
#include "slime/http/client.h"
#include "slime/job/train_batch_codec.h"
#include "spdlog/spdlog.h"

namespace slime::job {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

// Errors of the setup that are the user's (config, data, paths) vs the job's.
int ExitCodeFor(const Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kUnimplemented:
      return kExitUsage;
    default:
      return kExitFailure;
  }
}

// The rollout's kept samples as the trainer's batch (flattened in group order, as the rewards).
data::RolloutBatch ToTrainBatch(const rollout::RolloutResult& result, double temperature) {
  data::RolloutBatch batch;
  batch.temperature = temperature;
  size_t i = 0;
  for (const data::SampleGroup& group : result.groups) {
    for (const data::Sample& s : group) {
      data::TrainSample t;
      t.tokens = s.tokens;
      t.response_length = s.response_length;
      t.prompt_length = s.PromptLength();
      if (s.loss_mask.empty()) {
        t.loss_mask.assign(static_cast<size_t>(s.response_length), 1.0f);
      } else {
        t.loss_mask.assign(s.loss_mask.begin(), s.loss_mask.end());
      }
      if (s.remove_sample) std::fill(t.loss_mask.begin(), t.loss_mask.end(), 0.0f);
      t.reward = i < result.rewards.size() ? result.rewards[i] : s.reward;
      t.raw_reward = i < result.raw_rewards.size() ? result.raw_rewards[i] : s.reward;
      if (static_cast<int64_t>(s.rollout_log_probs.size()) == s.response_length) {
        t.rollout_log_probs = s.rollout_log_probs;
      }
      if (static_cast<int64_t>(s.teacher_log_probs.size()) == s.response_length) {
        t.teacher_log_probs = s.teacher_log_probs;  // OPD with opd_type sglang
      }
      t.truncated = s.status == data::SampleStatus::kTruncated;
      t.rollout_routed_experts = s.rollout_routed_experts;
      t.routed_experts_per_token = s.routed_experts_per_token;
      batch.samples.push_back(std::move(t));
      ++i;
    }
  }
  return batch;
}

}  // namespace

StatusOr<Json> CallJson(const runtime::ActorHandle& actor, const std::string& method,
                        const Json& request, std::chrono::milliseconds timeout) {
  runtime::CallOptions options;
  options.timeout = timeout;
  SLIME_ASSIGN_OR_RETURN(std::string reply, actor.Call(method, request.dump(), options));
  Json j = Json::parse(reply, nullptr, false);
  if (j.is_discarded()) {
    return absl::InternalError(
        fmt::format("{} on {}: the reply is not JSON", method, actor.actor_id()));
  }
  return j;
}

int Driver::RunToEnd() {
  Status s = Setup();
  if (s.ok()) s = Loop();
  const int sig = signals_->last_signal();
  if (sig != 0) {
    if (report_) report_->EndProgress();
    std::cerr << fmt::format("slime_train: stopped by signal {}; actors stopped\n", sig);
    Stop();
    return 128 + sig;
  }
  if (!s.ok()) {
    if (report_) report_->EndProgress();
    std::string message(s.message());
    if (head_ != nullptr && head_->job_failed()) message = head_->failure() + " (" + message + ")";
    spdlog::error("job failed: {}", message);
    std::cerr << "slime_train: error: " << message << "\n";
    const int code = setup_done_ ? kExitFailure : ExitCodeFor(s);
    Stop();
    return code;
  }
  Stop();
  return kExitOk;
}

void Driver::Stop() {
  std::lock_guard<std::mutex> lock(stop_mu_);
  if (health_ != nullptr) health_->Stop();  // no engine is killed while the job stops
  coordinator_.Cancel();
  if (trajectories_) trajectories_->Cancel();
  if (head_ == nullptr) return;
  // checkpoint.async_save: a checkpoint being written in the background is completed before the
  // actors stop (a signal, an error), within kStopSaveWait; otherwise the previous one stays
  // the latest.
  if (save_in_flight_) {
    spdlog::info("stopping: waiting up to {} s for the checkpoint being written in the background",
                 std::chrono::duration_cast<std::chrono::seconds>(kStopSaveWait).count());
    if (Status s = WaitForSaves(kStopSaveWait); !s.ok()) {
      spdlog::error("stopping: {}", std::string(s.message()));
      std::cerr << "slime_train: " << std::string(s.message()) << "\n";
    }
  }
  head_->Shutdown();
}

Status Driver::Loop() {
  const auto loop_start = Clock::now();
  if (trajectories_) {
    trajectories_->Open();  // the checkpoint's buffer is restored
    spdlog::info("rollout.trajectory_buffer: POST trajectories to http://{}/trajectories",
                 metrics_local_);
  }
  const bool eval_only = num_rollout_ == 0 && config_.eval.interval.has_value();
  if (has_engines_ && config_.eval.interval && start_rollout_id_ == 0 &&
      (eval_only || !config_.eval.skip_eval_before_train)) {
    SLIME_RETURN_IF_ERROR(Evaluate(0, nullptr));
  }
  if (options_.loop == TrainLoop::kOneStepOff) {
    SLIME_RETURN_IF_ERROR(RunAsyncLoop(start_rollout_id_, num_rollout_, this));
    return FinishRun(loop_start);
  }
  if (options_.loop == TrainLoop::kFullyAsync) {
    SLIME_RETURN_IF_ERROR(
        RunFullyAsyncLoop(start_rollout_id_, num_rollout_,
                          config_.rollout.max_staleness.value_or(kDefaultMaxStaleness), this));
    return FinishRun(loop_start);
  }
  loop_start_ = loop_start;
  for (int64_t rollout_id = start_rollout_id_; rollout_id < num_rollout_;) {
    if (signals_->last_signal() != 0) return absl::CancelledError("stopped by a signal");
    Status s = RunRollout(rollout_id);
    if (s.ok()) {
      rollout_ends_[rollout_id++] = Clock::now();
      continue;
    }
    // fault_tolerance.max_trainer_restarts: a lost trainer restarts the group from the newest
    // checkpoint and the loop goes on after it (driver_failover.cc); anything else ends the job.
    SLIME_RETURN_IF_ERROR(RecoverTrainers(s, rollout_id));
    rollout_id = start_rollout_id_;
  }
  return FinishRun(loop_start);
}

Status Driver::RunRollout(int64_t rollout_id) {
  const auto step_start = Clock::now();
  MetricValues values;
  // 1. Generate (or load a saved rollout).
  const auto t = Clock::now();
  SLIME_ASSIGN_OR_RETURN(rollout::RolloutResult result, GenerateRollout(rollout_id));
  report_->EndProgress();
  values["perf/rollout_time"] = Since(t);
  SLIME_RETURN_IF_ERROR(HandGpuToTrainers(&values));
  SLIME_RETURN_IF_ERROR(ProcessRollout(rollout_id, result, &values));
  // 2. Train.
  SLIME_RETURN_IF_ERROR(TrainRollout(rollout_id, result, &values));
  // 3. Save.
  SLIME_RETURN_IF_ERROR(Save(rollout_id, CaptureState(), &values));
  // 4. Weight sync.
  SLIME_RETURN_IF_ERROR(SyncAndHandGpuToEngines(rollout_id, &values));
  // 5. Eval.
  if (EvalDue(rollout_id)) SLIME_RETURN_IF_ERROR(Evaluate(rollout_id, &values));
  values["perf/step_time"] = Since(step_start);
  if (TrainerFailover()) {
    values["fault/trainer_restarts"] = trainer_group_restarts_;
    values["fault/trainer_lost_time"] = trainer_lost_seconds_;
  }
  return Report(rollout_id, values);
}

Status Driver::FinishRun(Clock::time_point loop_start) {
  // checkpoint.async_save: the last checkpoint is complete before the job reports done (and
  // before export_hf converts it); a failed background write fails the job here.
  SLIME_RETURN_IF_ERROR(WaitForSaves(LongCall()));
  std::string done = fmt::format("done: rollouts {}..{} in {:.0f} s", initial_start_rollout_id_,
                                 num_rollout_ - 1, Since(loop_start));
  for (const auto& [key, last] : last_eval_) {
    done += fmt::format("; {} {:.3f} -> {:.3f}", key, first_eval_.at(key), last);
  }
  std::cout << done << std::endl;
  if (config_.checkpoint.save_hf && !config_.debug.rollout_only) {
    SLIME_ASSIGN_OR_RETURN(Json exported, CallJson(head_->Handle(trainer_ids_.front()), "export_hf",
                                                   {{"dir", *config_.checkpoint.save_hf}}, LongCall()));
    std::cout << "exported the final weights to " << exported.value("dir", std::string()) << "\n";
  }
  return absl::OkStatus();
}

// ---- One rollout's steps (RolloutSteps: the synchronous loop above and the --async one).

Status Driver::TrainRollout(int64_t rollout_id, const rollout::RolloutResult& result,
                            MetricValues* values) {
  if (config_.debug.rollout_only) return absl::OkStatus();
  const auto t = Clock::now();
  const std::string payload =
      EncodeTrainBatch(rollout_id, ToTrainBatch(result, config_.rollout.temperature));
  SLIME_ASSIGN_OR_RETURN(std::vector<std::string> replies, CallTrainers("train", payload));
  Json reply = Json::parse(replies.front(), nullptr, false);
  if (reply.is_discarded()) return absl::InternalError("train on trainer-0: reply is not JSON");
  std::vector<TrainStepReport> reports;  // for the CI checks
  for (const Json& step : reply.at("steps")) {
    TrainStepReport report;
    report.step = step.at("step").get<int64_t>();
    report.step_in_rollout = step.value("step_in_rollout", int64_t{0});
    MetricValues step_values;
    for (const auto& [k, v] : step.at("values").items()) {
      step_values["train/" + k] = v.get<double>();
      report.values[k] = v.get<double>();
    }
    if (step.value("skipped", false)) step_values["train/skipped"] = 1.0;
    SLIME_RETURN_IF_ERROR(report_->Record(rollout_id, report.step, step_values));
    for (const auto& [k, v] : step_values) (*values)[k] = v;  // the summary shows the last step
    reports.push_back(std::move(report));
  }
  std::map<std::string, double> rollout_values;
  for (const auto& [k, v] : reply.at("rollout_values").items()) {
    rollout_values[k] = v.get<double>();
    (*values)["rollout/trainer/" + k] = v.get<double>();
  }
  (*values)["perf/train_time"] = Since(t);
  // debug.ci_test and the grad-norm records (ci_checks.h); the step metrics are logged first.
  return RunCiChecks(config_.debug, rollout_id, reports, rollout_values);
}

bool Driver::SyncDue(int64_t rollout_id) {
  return !config_.debug.rollout_only && has_engines_ &&
         (rollout_id + 1) % config_.weight_sync.interval == 0;
}

Status Driver::UpdateWeights(int64_t rollout_id, EngineRequests requests, MetricValues* values) {
  const auto t = Clock::now();
  SLIME_ASSIGN_OR_RETURN(Json sync, SyncWeights(std::to_string(rollout_id + 1), requests));
  (*values)["perf/update_weights_time"] = Since(t);
  (*values)["perf/update_weights_gb_per_s"] = sync.value("gb_per_s", 0.0);
  return absl::OkStatus();
}

StatusOr<Json> Driver::SyncWeights(const std::string& version, EngineRequests requests) {
  // An engine restarted since the last sync: the group is re-formed with its new address.
  if (engines_ != nullptr) SLIME_RETURN_IF_ERROR(engines_->ReconnectIfChanged());
  // Every rank: rank 0 sends, its TP peers take part in the gathers and the later pipeline
  // stages send their parameters to it, and each rank advances its own keep_old_actor queue.
  // Rank 0's reply has the transfer's numbers.
  const Json request = {{"weight_version", version},
                       {"keep_requests", requests == EngineRequests::kKeep}};
  SLIME_ASSIGN_OR_RETURN(std::vector<std::string> replies,
                         CallTrainers("sync_weights", request.dump()));
  Json reply = Json::parse(replies.front(), nullptr, false);
  if (!reply.is_object())
    return absl::InternalError("sync_weights on trainer-0: reply is not JSON");
  weight_version_ = std::stoll(version);
  if (config_.weight_sync.check_weight_update_equal) {
    // Every engine's tensors against the trainer's (workers.h, CheckEngineWeights): a
    // difference fails the job naming the engine and the tensor.
    SLIME_RETURN_IF_ERROR(CallTrainers("check_engine_weights", "{}").status());
  }
  return reply;
}

bool Driver::EvalDue(int64_t rollout_id) {
  return Periodic(rollout_id, config_.eval.interval, std::nullopt);
}

Status Driver::Evaluate(int64_t rollout_id, MetricValues* perf) {
  if (eval_datasets_.empty() || !has_engines_) return absl::OkStatus();
  const auto start = Clock::now();
  StatusOr<rollout::EvalResult> evaluated = [&] {
    EngineHealthMonitor::ActiveScope checks(health_.get());
    return coordinator_.Eval(rollout_id);
  }();
  SLIME_ASSIGN_OR_RETURN(rollout::EvalResult eval, std::move(evaluated));
  const double seconds = Since(start);
  MetricValues values(eval.metrics.begin(), eval.metrics.end());
  for (const auto& [key, value] : values) {
    if (key.rfind("eval/", 0) != 0 || key.find('/', 5) != std::string::npos ||
        key.find('-') != std::string::npos) {
      continue;  // only eval/<name>, the dataset's mean reward
    }
    first_eval_.emplace(key, value);
    last_eval_[key] = value;
  }
  values["perf/eval_time"] = seconds;
  if (perf != nullptr) (*perf)["perf/eval_time"] = seconds;
  report_->EvalSummary(rollout_id, values);
  return report_->Record(rollout_id, std::nullopt, values);
}

Status Driver::Report(int64_t rollout_id, const MetricValues& values) {
  report_->Summary(rollout_id, values);
  return report_->Record(rollout_id, std::nullopt, values);
}

// ---- Colocated offload: the GPUs change hands between the engines and the trainers.

Status Driver::HandGpuToTrainers(MetricValues* values) {
  if (offload_engines_ && !config_.debug.rollout_only) {
    const auto t = Clock::now();
    SLIME_RETURN_IF_ERROR(EngineMemory(/*release=*/true, {}));
    (*values)["perf/offload_rollout_time"] = Since(t);
  }
  if (offload_trainers_) {
    SLIME_RETURN_IF_ERROR(TrainerMemory(/*release=*/false, "perf/onload_train_time", values));
  }
  return absl::OkStatus();
}

Status Driver::SyncAndHandGpuToEngines(int64_t rollout_id, MetricValues* values) {
  const bool offload_engines = offload_engines_ && !config_.debug.rollout_only;
  if (offload_engines) {
    const auto t = Clock::now();
    SLIME_RETURN_IF_ERROR(EngineMemory(/*release=*/false, {"weights"}));
    (*values)["perf/onload_rollout_time"] = Since(t);
  }
  if (SyncDue(rollout_id)) {
    SLIME_RETURN_IF_ERROR(UpdateWeights(rollout_id, EngineRequests::kAbort, values));
  }
  if (offload_trainers_) {
    SLIME_RETURN_IF_ERROR(TrainerMemory(/*release=*/true, "perf/offload_train_time", values));
  }
  if (offload_engines) {
    const auto t = Clock::now();
    SLIME_RETURN_IF_ERROR(EngineMemory(/*release=*/false, {"kv_cache", "cuda_graph"}));
    (*values)["perf/onload_rollout_time"] += Since(t);
  }
  return absl::OkStatus();
}

StatusOr<http::Response> Driver::PostToEngine(const std::string& address, const std::string& path,
                                              const std::string& body,
                                              std::chrono::milliseconds timeout) const {
  SLIME_ASSIGN_OR_RETURN(auto hp, runtime::SplitHostPort(address));
  http::ClientOptions co;
  co.timeout = timeout;
  co.bearer_token = config::EngineAccessToken(config_.cluster);
  return http::Client(hp.first, hp.second, co).Post(path, body);
}

Status Driver::EngineMemory(bool release, const std::vector<std::string>& tags) {
  const std::string path = release ? "/release_memory_occupation" : "/resume_memory_occupation";
  const std::string body = Json{{"tags", tags.empty() ? Json(nullptr) : Json(tags)}}.dump();
  for (const std::string& address : engines_->Addresses()) {
    SLIME_ASSIGN_OR_RETURN(http::Response r,
                           PostToEngine(address, path, body, std::chrono::minutes(10)));
    if (r.status != 200) return http::StatusFromHttp(r.status, "engine " + address + " " + path, r.body);
  }
  // Released: everything at once; back: the K/V cache comes back last.
  if (release) engines_released_ = true;
  if (!release && std::find(tags.begin(), tags.end(), "kv_cache") != tags.end()) {
    engines_released_ = false;
  }
  return absl::OkStatus();
}

Status Driver::TrainerMemory(bool release, const char* metric, MetricValues* values) {
  const auto t = Clock::now();
  SLIME_RETURN_IF_ERROR(CallTrainers(release ? "release_memory" : "resume_memory", "{}").status());
  if (values != nullptr) (*values)[metric] = Since(t);
  return absl::OkStatus();
}

Status CheckLoopConfig(const config::Config& config, TrainLoop loop) {
  if (loop == TrainLoop::kSync || loop == TrainLoop::kOneStepOff) {
    const char* key = config.rollout.max_staleness.has_value()   ? "max_staleness"
                      : config.rollout.stale_samples.has_value() ? "stale_samples"
                                                                 : nullptr;
    if (key != nullptr) {
      return absl::InvalidArgumentError(fmt::format(
          "rollout.{} is for the fully asynchronous loop only; run with --fully-async or "
          "remove the key",
          key));
    }
  }
  if (loop == TrainLoop::kSync) return absl::OkStatus();
  const char* flag = loop == TrainLoop::kOneStepOff ? "--async" : "--fully-async";
  // Colocated with offload, engines and trainers take turns on the GPUs; without it they share
  // each device at once (each its memory share), which an overlapping loop can use.
  if (config.cluster.colocate &&
      (config.cluster.offload_train.value_or(false) ||
       config.cluster.offload_rollout.value_or(false))) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: cluster.colocate is true with offload (cluster.offload_train / offload_rollout), "
        "so engines and trainers take turns on the devices, but this loop generates while the "
        "trainers train (slime's train_async.py asserts the same); set cluster.offload_train and "
        "cluster.offload_rollout to false to share each device at once (each its memory share: "
        "rollout.mem_fraction_static), cluster.colocate: false, or run without {}",
        flag, flag));
  }
  if (config.fault_tolerance.max_trainer_restarts > 0) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: fault_tolerance.max_trainer_restarts is for the synchronous loop (a trainer group "
        "restart rewinds it to the last checkpoint); set it to 0 or run without {}",
        flag, flag));
  }
  if (loop != TrainLoop::kFullyAsync) return absl::OkStatus();
  if (config.debug.rollout_only || config.debug.load_debug_rollout_data) {
    return absl::InvalidArgumentError(fmt::format(
        "--fully-async overlaps generation with training, but {} leaves only one of them; run "
        "without --fully-async",
        config.debug.rollout_only ? "debug.rollout_only" : "debug.load_debug_rollout_data"));
  }
  // Rollout k needs the weights of at least k − max_staleness, and the weights advance only
  // every weight_sync.interval rollouts.
  const int64_t staleness = config.rollout.max_staleness.value_or(kDefaultMaxStaleness);
  if (config.weight_sync.interval - 1 > staleness) {
    return absl::InvalidArgumentError(fmt::format(
        "--fully-async: weight_sync.interval {} lets the engines' weights fall {} versions "
        "behind, more than rollout.max_staleness {} allows; raise rollout.max_staleness to at "
        "least {} or lower weight_sync.interval",
        config.weight_sync.interval, config.weight_sync.interval - 1, staleness,
        config.weight_sync.interval - 1));
  }
  return absl::OkStatus();
}

int RunDriver(DriverOptions options, SignalWatcher* signals) {
  Driver driver(std::move(options), signals);
  signals->SetHandler([&driver](int sig) {
    if (sig == SIGUSR1) return;
    spdlog::warn("signal {} received: stopping every actor", sig);
    driver.Stop();
  });
  const int code = driver.RunToEnd();
  signals->SetHandler(nullptr);
  return code;
}

}  // namespace slime::job
