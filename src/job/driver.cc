// The driver loop (include/slime/job/driver.h).
#include "slime/job/driver.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <thread>

#include "driver_async.h"
#include "driver_report.h"
#include "engine_recovery.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "slime/common/atomic_file.h"
#include "slime/common/signal_watcher.h"
#include "slime/data/prompt_dataset.h"
#include "slime/http/client.h"
#include "slime/http/metrics_route.h"
#include "slime/http/server.h"
#include "slime/job/actors.h"
#include "slime/job/train_batch_codec.h"
#include "slime/metrics/registry.h"
#include "slime/reward/reward.h"
#include "slime/rollout/coordinator.h"
#include "slime/runtime/agent.h"
#include "slime/runtime/head.h"
#include "slime/tokenizer/tokenizer.h"
#include "slime/workflow/factory.h"
#include "spdlog/spdlog.h"

namespace slime::job {
namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

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

double Since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string Absolute(const std::string& path) {
  if (path.empty()) return path;
  std::error_code ec;
  std::filesystem::path p = std::filesystem::absolute(path, ec);
  return ec ? path : p.lexically_normal().string();
}

void MakeAbsolute(std::optional<std::string>& path) {
  if (path) path = Absolute(*path);
}

// slime's should_run_periodic_action: every `interval` rollouts (and at the last one when
// `num_rollout` is given).
bool Periodic(int64_t rollout_id, std::optional<int> interval, std::optional<int64_t> num_rollout) {
  if (!interval) return false;
  if (num_rollout && rollout_id + 1 == *num_rollout) return true;
  return (rollout_id + 1) % *interval == 0;
}

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
      t.truncated = s.status == data::SampleStatus::kTruncated;
      batch.samples.push_back(std::move(t));
      ++i;
    }
  }
  return batch;
}

// debug.save_debug_rollout_data / load_debug_rollout_data: "{rollout_id}" in the path is the
// rollout id. One JSON document: {"rollout_id", "samples": [[sample, ...] per group],
// "raw_rewards", "rewards", "metrics"}.
std::string DebugRolloutPath(const std::string& pattern, int64_t rollout_id) {
  std::string out = pattern;
  const std::string key = "{rollout_id}";
  for (size_t pos = out.find(key); pos != std::string::npos; pos = out.find(key)) {
    out.replace(pos, key.size(), std::to_string(rollout_id));
  }
  return out;
}

Status SaveDebugRollout(const std::string& path, const rollout::RolloutResult& result) {
  Json groups = Json::array();
  for (const data::SampleGroup& g : result.groups) {
    Json group = Json::array();
    for (const data::Sample& s : g) group.push_back(rollout::SampleToJson(s));
    groups.push_back(std::move(group));
  }
  Json doc = {{"format", "slime-cpp rollout data"},
              {"version", 1},
              {"rollout_id", result.rollout_id},
              {"samples", std::move(groups)},
              {"raw_rewards", result.raw_rewards},
              {"rewards", result.rewards},
              {"metrics", result.metrics}};
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  return WriteFileAtomically(path, doc.dump() + "\n");
}

StatusOr<rollout::RolloutResult> LoadDebugRollout(const std::string& path, int64_t rollout_id) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(fmt::format("{}: cannot open the saved rollout data", path));
  std::stringstream text;
  text << in.rdbuf();
  Json doc = Json::parse(text.str(), nullptr, false);
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("samples")) {
    return absl::InvalidArgumentError(
        fmt::format("{}: not rollout data written by debug.save_debug_rollout_data", path));
  }
  rollout::RolloutResult result;
  result.rollout_id = rollout_id;
  try {
    size_t gi = 0;
    for (const Json& group : doc.at("samples")) {
      data::SampleGroup g;
      for (const Json& s : group) {
        StatusOr<data::Sample> sample = rollout::SampleFromJson(s);
        if (!sample.ok()) {
          return absl::InvalidArgumentError(fmt::format("{}: group {}: {}", path, gi,
                                                        std::string(sample.status().message())));
        }
        g.push_back(*std::move(sample));
      }
      result.groups.push_back(std::move(g));
      ++gi;
    }
    result.raw_rewards = doc.at("raw_rewards").get<std::vector<double>>();
    result.rewards = doc.at("rewards").get<std::vector<double>>();
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(fmt::format("{}: {}", path, e.what()));
  }
  return result;
}

class Driver : public RolloutSteps {
 public:
  Driver(DriverOptions options, SignalWatcher* signals)
      : options_(std::move(options)), config_(options_.config), signals_(signals) {}
  ~Driver() { Stop(); }

  int RunToEnd() {
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

  // Stops every actor and the servers. Idempotent; safe from the signal thread.
  void Stop() {
    std::lock_guard<std::mutex> lock(stop_mu_);
    coordinator_.Cancel();
    if (head_ != nullptr) head_->Shutdown();
  }

 private:
  Status Setup();
  Status LoadData();
  Status StartRuntime();
  Status StartActors();
  // Every address answers GET /health 200 before `timeout`, else an error naming it.
  Status WaitForExternalEngines(const std::vector<std::string>& addresses,
                                std::chrono::milliseconds timeout);
  // The trainers' tensor- and data-parallel groups (open_groups, then join_groups).
  Status FormTrainerGroups();
  Status InitTrainers();
  Status Loop();
  Status Evaluate(int64_t rollout_id, MetricValues* perf) override;  // also RolloutSteps
  // `state`: the rollout side to save (the async loop's capture); null: the current one.
  Status SaveCheckpoint(int64_t rollout_id, const RolloutSideState* state = nullptr);
  Status TrainRollout(int64_t rollout_id, const rollout::RolloutResult& result,
                      MetricValues* values);
  Status FinishRun(Clock::time_point loop_start);
  // RolloutSteps, for the --async loop (driver_async.h).
  StatusOr<rollout::RolloutResult> GenerateRollout(int64_t rollout_id) override;
  RolloutSideState CaptureState() override;
  Status ProcessRollout(int64_t rollout_id, const rollout::RolloutResult& result,
                        MetricValues* values) override;
  Status Train(int64_t rollout_id, const rollout::RolloutResult& result,
               MetricValues* values) override {
    return TrainRollout(rollout_id, result, values);
  }
  Status Save(int64_t rollout_id, const RolloutSideState& state, MetricValues* values) override;
  bool SyncDue(int64_t rollout_id) override;
  Status UpdateWeights(int64_t rollout_id, MetricValues* values) override;
  bool EvalDue(int64_t rollout_id) override;
  Status Report(int64_t rollout_id, const MetricValues& values) override;
  void CancelGeneration() override { coordinator_.Cancel(); }
  bool Stopped() override { return signals_->last_signal() != 0; }
  StatusOr<Json> SyncWeights(const std::string& version);
  // Colocated with offload_rollout: the engines give their GPU memory (weights, K/V cache, CUDA
  // graphs) back while the trainer works, take the weights back for the weight sync and the K/V
  // cache after it. `tags`: SGLang's memory tags ([] = all).
  Status EngineMemory(bool release, const std::vector<std::string>& tags);
  // Colocated with offload_train: every trainer moves its weights and optimizer state to host
  // memory while the engines generate.
  Status TrainerMemory(bool release, const char* metric, MetricValues* values);
  bool offload_engines_ = false;
  bool offload_trainers_ = false;
  Status WriteDriverFile();
  std::chrono::milliseconds LongCall() const { return std::chrono::hours(24); }

  DriverOptions options_;
  config::Config& config_;
  SignalWatcher* signals_;
  std::mutex stop_mu_;
  bool setup_done_ = false;

  metrics::Registry registry_;
  std::unique_ptr<http::Server> metrics_server_;
  std::unique_ptr<DriverReport> report_;
  std::unique_ptr<runtime::Head> head_;
  std::unique_ptr<runtime::Agent> agent_;

  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  std::shared_ptr<data::PromptDataset> dataset_;
  std::optional<data::PromptDataSource> source_;
  std::unique_ptr<rollout::PromptGroupSource> group_source_;
  std::vector<rollout::EvalDataset> eval_datasets_;
  std::unique_ptr<reward::RewardModel> reward_;
  std::unique_ptr<EngineRecoveryImpl> engines_;  // outlives coordinator_ (it calls Recover)
  rollout::RolloutCoordinator coordinator_;

  std::vector<std::string> trainer_ids_;
  std::vector<std::string> engine_ids_;
  std::vector<std::string> engine_addresses_;
  int64_t start_rollout_id_ = 0;
  int64_t num_rollout_ = 0;
  bool has_engines_ = false;
  bool train_only_ = false;
  std::map<std::string, double> first_eval_, last_eval_;  // eval/<name> of this run
};

Status Driver::Setup() {
  if (options_.async_train) SLIME_RETURN_IF_ERROR(CheckAsyncConfig(config_));
  config::DebugConfig& debug = config_.debug;
  train_only_ = debug.load_debug_rollout_data.has_value();
  // Workers may run in other directories: every path they read is made absolute.
  config_.model.hf_checkpoint = Absolute(config_.model.hf_checkpoint);
  MakeAbsolute(config_.checkpoint.save);
  MakeAbsolute(config_.checkpoint.load);
  MakeAbsolute(config_.checkpoint.ref_load);
  MakeAbsolute(config_.checkpoint.critic_load);
  MakeAbsolute(config_.checkpoint.save_hf);
  MakeAbsolute(config_.algorithm.opd_teacher_load);
  config_.cluster.run_dir = Absolute(config_.cluster.run_dir);
  std::error_code ec;
  std::filesystem::create_directories(config_.cluster.run_dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        fmt::format("cluster.run_dir {}: cannot create: {}", config_.cluster.run_dir, ec.message()));
  }
  SLIME_RETURN_IF_ERROR(LoadData());
  SLIME_RETURN_IF_ERROR(StartRuntime());
  SLIME_RETURN_IF_ERROR(StartActors());
  SLIME_RETURN_IF_ERROR(InitTrainers());
  setup_done_ = true;
  return absl::OkStatus();
}

Status Driver::LoadData() {
  const auto start = Clock::now();
  SLIME_ASSIGN_OR_RETURN(tokenizer_, tokenizer::Tokenizer::FromDirectory(config_.model.hf_checkpoint));
  if (!train_only_) {
    if (config_.data.prompt_data.empty()) {
      return absl::InvalidArgumentError("data.prompt_data is required (a JSONL of prompts)");
    }
    SLIME_ASSIGN_OR_RETURN(data::PromptDataset dataset,
                           data::PromptDataset::Load(config_.data.prompt_data, *tokenizer_,
                                                     data::PromptDatasetOptionsFromConfig(config_)));
    dataset_ = std::make_shared<data::PromptDataset>(std::move(dataset));
    SLIME_ASSIGN_OR_RETURN(data::PromptDataSource source,
                           data::PromptDataSource::Create(
                               dataset_, data::PromptDataSourceOptionsFromConfig(config_)));
    source_.emplace(std::move(source));
    group_source_ = std::make_unique<rollout::PromptGroupSource>(&*source_);
    spdlog::info("data: {} prompts from {} ({:.1f} s)", dataset_->size(), config_.data.prompt_data,
                 Since(start));
  }
  if (!config_.data.num_rollout) {
    if (dataset_ == nullptr) {
      return absl::InvalidArgumentError("data.num_rollout is required with load_debug_rollout_data");
    }
    const int64_t per_epoch = dataset_->size() / std::max(1, config_.data.rollout_batch_size);
    config_.data.num_rollout = static_cast<int>(per_epoch * config_.data.num_epoch.value_or(1));
    spdlog::info("data.num_rollout = {} ({} prompts / rollout_batch_size {} × {} epoch(s))",
                 *config_.data.num_rollout, dataset_->size(), config_.data.rollout_batch_size,
                 config_.data.num_epoch.value_or(1));
  }
  num_rollout_ = *config_.data.num_rollout;
  for (const config::EvalDatasetConfig& entry : config_.eval.datasets) {
    data::PromptDatasetOptions o = data::PromptDatasetOptionsFromConfig(config_);
    if (entry.input_key) o.input_key = *entry.input_key;
    if (entry.label_key) o.label_key = *entry.label_key;
    if (entry.tool_key) o.tool_key = *entry.tool_key;
    if (entry.apply_chat_template) o.apply_chat_template = *entry.apply_chat_template;
    o.max_prompt_len = 0;
    StatusOr<data::PromptDataset> eval = data::PromptDataset::Load(entry.path, *tokenizer_, o);
    if (!eval.ok()) {
      return absl::InvalidArgumentError(fmt::format("eval dataset '{}': {}", entry.name,
                                                    std::string(eval.status().message())));
    }
    eval_datasets_.push_back(rollout::EvalDatasetFromConfig(config_, entry, *eval));
  }
  if (!train_only_) {
    SLIME_ASSIGN_OR_RETURN(reward_, reward::RewardModel::Create(
                                        reward::RewardOptionsFromConfig(config_.reward)));
  }
  return absl::OkStatus();
}

Status Driver::StartRuntime() {
  // Metrics: the registry is served by the driver's own HTTP server.
  http::Router router;
  http::AddMetricsRoute(router, registry_);
  http::ServerOptions so;
  so.host = config_.metrics.prometheus_port ? "0.0.0.0" : "127.0.0.1";
  so.port = config_.metrics.prometheus_port.value_or(0);
  so.num_threads = 1;
  SLIME_ASSIGN_OR_RETURN(metrics_server_, http::Server::Start(so, std::move(router)));
  SLIME_ASSIGN_OR_RETURN(report_, DriverReport::Create(config_.metrics.jsonl_path.value_or(""),
                                                       &registry_, num_rollout_));

  runtime::HeadOptions ho;
  ho.bind_host = "127.0.0.1";
  if (!config_.cluster.head_address.empty()) {
    SLIME_ASSIGN_OR_RETURN(auto host_port, runtime::SplitHostPort(config_.cluster.head_address));
    ho.bind_host = host_port.first;
    ho.port = host_port.second;
  } else if (config_.cluster.num_nodes > 1) {
    ho.bind_host = "0.0.0.0";
  }
  ho.run_dir = config_.cluster.run_dir;
  ho.resolved_config = config::ToYaml(config_);
  ho.head_node_name = options_.head_node_name;
  ho.metrics = &registry_;
  ho.max_restarts = config_.fault_tolerance.max_engine_restarts;  // engines only restart
  ho.max_restarts_name = "fault_tolerance.max_engine_restarts";
  ho.restart_backoff_s = config_.fault_tolerance.restart_backoff;
  SLIME_ASSIGN_OR_RETURN(head_, runtime::Head::Start(ho));
  runtime::AgentOptions ao;
  ao.head_address = head_->address();
  ao.token = head_->token();
  ao.node_name = options_.head_node_name;
  ao.bind_host = ho.bind_host == "0.0.0.0" ? "127.0.0.1" : ho.bind_host;
  const bool gpus = options_.placement.device_kind == runtime::DeviceKind::kGpu;
  ao.num_gpus = gpus ? config_.cluster.num_gpus_per_node : 0;
  ao.num_cpu_slots = config_.cluster.cpu_slots_per_node;
  SLIME_ASSIGN_OR_RETURN(agent_, runtime::Agent::Start(ao));
  SLIME_RETURN_IF_ERROR(WriteDriverFile());
  spdlog::info("driver: head {} ; metrics http://{}:{}/metrics", head_->address(), so.host,
               metrics_server_->port());
  return absl::OkStatus();
}

Status Driver::WriteDriverFile() {
  Json j = {{"pid", static_cast<int64_t>(getpid())},
            {"head_address", head_->address()},
            {"metrics_url", fmt::format("http://127.0.0.1:{}/metrics", metrics_server_->port())},
            {"metrics_port", metrics_server_->port()},
            {"jsonl_path", config_.metrics.jsonl_path.value_or("")}};
  return WriteFileAtomically(config_.cluster.run_dir + "/driver.json", j.dump(2) + "\n");
}

Status Driver::StartActors() {
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(options_.start_timeout_s * 1000));
  SLIME_ASSIGN_OR_RETURN(std::vector<runtime::NodeResources> nodes,
                         head_->WaitForNodes(config_.cluster.num_nodes, timeout));
  runtime::PlacementRequest request = options_.placement;
  if (train_only_) request.rollout_num_gpus = 0;
  SLIME_ASSIGN_OR_RETURN(runtime::PlacementPlan plan, runtime::PlanPlacement(request, nodes));
  std::vector<runtime::ActorOptions> actors = runtime::ActorsFromPlan(
      plan, [](const std::string& role) { return role == "engine" ? kEngineActorType : kTrainerActorType; });
  // The coordinator runs in this process; the PPO critic lives inside the trainer processes.
  std::erase_if(actors, [](const runtime::ActorOptions& a) {
    return a.role == "rollout" || a.role == "critic";
  });
  const bool gpus = plan.device_kind == runtime::DeviceKind::kGpu;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::map<std::string, int> engines_on_node;
  for (const runtime::ActorOptions& a : actors) {
    if (a.role == "engine") ++engines_on_node[a.node_name];
  }
  int num_trainers = 0;
  std::map<std::string, int> trainers_on_node;
  for (const runtime::ActorOptions& a : actors) {
    num_trainers += a.role == "trainer";
    if (a.role == "trainer") ++trainers_on_node[a.node_name];
  }
  for (runtime::ActorOptions& a : actors) {
    Json init = {{"device", gpus ? "cuda" : "cpu"}};
    if (a.role == "engine") {
      engine_ids_.push_back(a.actor_id);
      if (!gpus) init["num_threads"] = std::max(1, cores / std::max(1, engines_on_node[a.node_name]));
    } else {
      // In rank order (the plan lists trainers by rank): trainer_ids_[r] is rank r.
      trainer_ids_.push_back(a.actor_id);
      init["world_size"] = num_trainers;
      // CPU trainers of one node share its cores (ranks wait on each other in collectives).
      if (!gpus)
        init["num_threads"] = std::max(1, cores / std::max(1, trainers_on_node[a.node_name]));
    }
    a.init_payload = init.dump();
  }
  if (trainer_ids_.empty()) return absl::InvalidArgumentError("placement: no trainer actor");
  const std::vector<std::string>& external = config_.cluster.rollout_external_engine_addrs;
  has_engines_ = !engine_ids_.empty() || (!external.empty() && !train_only_);
  offload_engines_ = !engine_ids_.empty() && gpus && config_.cluster.colocate &&
                     config_.cluster.offload_rollout.value_or(false);
  offload_trainers_ = !engine_ids_.empty() && !trainer_ids_.empty() && gpus &&
                      config_.cluster.colocate && config_.cluster.offload_train.value_or(false) &&
                      !config_.debug.rollout_only;
  if (!has_engines_ && !train_only_) {
    return absl::InvalidArgumentError(
        "placement: no engines (cluster.rollout_num_gpus is 0 and "
        "cluster.rollout_external_engine_addrs is empty)");
  }
  spdlog::info("starting {} trainer(s) and {} engine(s) on {} node(s)", trainer_ids_.size(),
               engine_ids_.size(), nodes.size());
  const auto start = Clock::now();
  SLIME_RETURN_IF_ERROR(head_->StartActors(actors));
  std::vector<std::string> ids = trainer_ids_;
  ids.insert(ids.end(), engine_ids_.begin(), engine_ids_.end());
  SLIME_RETURN_IF_ERROR(head_->WaitForActors(ids, timeout));
  for (const std::string& id : engine_ids_) {
    SLIME_ASSIGN_OR_RETURN(Json address, CallJson(head_->Handle(id), "address", Json::object(), timeout));
    engine_addresses_.push_back(
        fmt::format("{}:{}", address.at("host").get<std::string>(), address.at("port").get<int>()));
  }
  if (engine_ids_.empty() && has_engines_) {
    SLIME_RETURN_IF_ERROR(WaitForExternalEngines(external, timeout));
    engine_addresses_ = external;
    engine_ids_.assign(external.size(), "");  // no actors: EngineRecovery's external case
  }
  spdlog::info("actors up in {:.1f} s; engines: {}", Since(start),
               fmt::join(engine_addresses_, ", "));
  return absl::OkStatus();
}

Status Driver::WaitForExternalEngines(const std::vector<std::string>& addresses,
                                      std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (size_t i = 0; i < addresses.size(); ++i) {
    SLIME_ASSIGN_OR_RETURN(auto hp, runtime::SplitHostPort(addresses[i]));
    http::ClientOptions co;
    co.timeout = std::chrono::seconds(5);
    http::Client client(hp.first, hp.second, co);
    std::string last = "no answer";
    while (true) {
      StatusOr<http::Response> r = client.Get("/health");
      if (r.ok() && r->status == 200) break;
      last = r.ok() ? fmt::format("HTTP {}", r->status) : std::string(r.status().message());
      if (Clock::now() > deadline) {
        return absl::UnavailableError(fmt::format(
            "external engine {} (cluster.rollout_external_engine_addrs[{}]) does not answer "
            "GET /health: {}", addresses[i], i, last));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
  }
  spdlog::info("external engines up: {}", fmt::join(addresses, ", "));
  return absl::OkStatus();
}

Status Driver::FormTrainerGroups() {
  // Megatron's layout over the trainer ranks (workers/workers.h): every group leader opens its
  // group's store and answers its port; every rank then joins its TP and DP groups at once.
  const auto t = Clock::now();
  runtime::ActorGroup trainers = head_->Group(trainer_ids_);
  runtime::CallOptions co;
  co.timeout = LongCall();
  std::vector<std::string> requests;
  for (const std::string& id : trainer_ids_) {
    SLIME_ASSIGN_OR_RETURN(runtime::ActorEndpoint endpoint, head_->Resolve(id));
    SLIME_ASSIGN_OR_RETURN(auto host, runtime::SplitHostPort(endpoint.address));
    requests.push_back(Json{{"master_address", host.first}}.dump());
  }
  std::vector<runtime::CallFuture> opening = trainers.CallEachAsync("open_groups", requests, co);
  SLIME_ASSIGN_OR_RETURN(std::vector<std::string> opened, runtime::WaitAll(opening));
  const int world = static_cast<int>(trainer_ids_.size());
  const int tp = std::max(1, config_.train.tensor_model_parallel_size);
  const int pp = std::max(1, config_.train.pipeline_model_parallel_size);
  // join_groups' request (rank = p·DP·TP + d·TP + t): tp[p·DP + d] = the TP group of stage p
  // and DP index d (led by rank p·DP·TP + d·TP), dp[p·TP + t] = the DP group of stage p and TP
  // index t (led by rank p·DP·TP + t), pp[d·TP + t] = the pipeline of DP index d and TP index t
  // (led by rank d·TP + t). Each kind's leaders come in rank order in that index order, so the
  // replies are appended as they come.
  Json join = {{"tp", Json::array()}, {"dp", Json::array()}, {"pp", Json::array()}};
  for (int rank = 0; rank < world; ++rank) {
    Json reply = Json::parse(opened[rank], nullptr, false);
    if (!reply.is_object()) {
      return absl::InternalError(
          fmt::format("open_groups on {}: reply is not JSON", trainer_ids_[rank]));
    }
    for (const char* key : {"tp", "dp", "pp"}) {
      if (reply.contains(key)) join[key].push_back(reply[key]);
    }
  }
  SLIME_ASSIGN_OR_RETURN(std::vector<std::string> joined,
                         trainers.CallAll("join_groups", join.dump(), co));
  Json first = Json::parse(joined.front(), nullptr, false);
  spdlog::info(
      "trainers: tensor-parallel size {} × data-parallel size {} × pipeline-parallel size {} ({} "
      "ranks): groups formed in {:.1f} s ({})",
      tp, world / (tp * pp), pp, world, Since(t),
      first.is_object() ? first.value("backend", std::string("?")) : "?");
  return absl::OkStatus();
}

Status Driver::InitTrainers() {
  const auto start = Clock::now();
  // The groups first: a tensor-parallel trainer loads its shard and runs collectives in init.
  if (trainer_ids_.size() > 1) SLIME_RETURN_IF_ERROR(FormTrainerGroups());
  runtime::ActorGroup trainers = head_->Group(trainer_ids_);
  runtime::CallOptions co;
  co.timeout = LongCall();
  SLIME_ASSIGN_OR_RETURN(std::vector<std::string> replies, trainers.CallAll("init", "{}", co));
  Json init = Json::parse(replies.front(), nullptr, false);
  if (init.is_discarded()) return absl::InternalError("init on trainer-0: reply is not JSON");
  spdlog::info("trainers ready in {:.1f} s ({} parameters on {})", Since(start),
               init.value("num_parameters", int64_t{0}), init.value("device", std::string("?")));
  start_rollout_id_ = 0;
  if (init.value("loaded", false)) {
    const int64_t loaded = init.at("rollout_id").get<int64_t>();
    start_rollout_id_ = loaded + 1;
    if (source_) {
      const std::string path = data::DataSourceStatePath(*config_.checkpoint.load, loaded);
      if (Status s = source_->Load(path); !s.ok()) {
        if (s.code() != absl::StatusCode::kNotFound) return s;
        spdlog::warn("resume: {}; the prompt order starts from the beginning", std::string(s.message()));
      }
    }
    const std::string coord = fmt::format("{}/rollout/coordinator_state_{}.json",
                                          *config_.checkpoint.load, loaded);
    std::ifstream in(coord);
    if (in) {
      std::stringstream text;
      text << in.rdbuf();
      Json state = Json::parse(text.str(), nullptr, false);
      if (state.is_discarded()) return absl::DataLossError(fmt::format("{}: not JSON", coord));
      SLIME_RETURN_IF_ERROR(coordinator_.RestoreState(state));
    }
    std::cout << fmt::format("resumed from {} at rollout {}\n", init.value("dir", std::string()),
                             start_rollout_id_);
  }
  if (config_.checkpoint.start_rollout_id) start_rollout_id_ = *config_.checkpoint.start_rollout_id;

  if (has_engines_) {
    // The engines as tracked from now on: a lost one is restarted by the head, then recovered
    // (new address, the trainer's weights) by the coordinator through engines_.
    EngineRecoveryOptions eo;
    eo.head = head_.get();
    eo.engine_ids = engine_ids_;
    eo.addresses = engine_addresses_;
    // The weight exporters: every rank of DP rank 0 — the TP ranks of each pipeline stage (ranks
    // p·DP·TP + t, workers.h) — rank 0 first, the source.
    {
      const int tp = std::max(1, config_.train.tensor_model_parallel_size);
      const int pp = std::max(1, config_.train.pipeline_model_parallel_size);
      const int world = static_cast<int>(trainer_ids_.size());
      const int dp = std::max(1, world / (tp * pp));
      for (int p = 0; p < pp; ++p) {
        for (int t = 0; t < tp; ++t) {
          const int rank = p * dp * tp + t;
          if (rank < world) eo.trainer_ids.push_back(trainer_ids_[rank]);
        }
      }
    }
    eo.num_gpus_per_engine = config_.cluster.rollout_num_gpus_per_engine;
    eo.max_restarts = config_.fault_tolerance.max_engine_restarts;
    eo.restart_backoff_s = config_.fault_tolerance.restart_backoff;
    eo.health_check_timeout_s = config_.fault_tolerance.health_check_timeout;
    eo.metrics = &registry_;
    SLIME_ASSIGN_OR_RETURN(engines_, EngineRecoveryImpl::Create(std::move(eo)));
    coordinator_.SetEngineRecovery(engines_.get());
    SLIME_ASSIGN_OR_RETURN(rollout::RolloutOptions ro,
                           rollout::RolloutOptionsFromConfig(config_, engine_addresses_));
    // rollout.custom_generate (and eval datasets' overrides): multi-turn episodes, plugins.
    SLIME_RETURN_IF_ERROR(workflow::ConfigureCustomGeneration(config_, tokenizer_.get(), &ro,
                                                              &eval_datasets_));
    SLIME_RETURN_IF_ERROR(coordinator_.Configure(std::move(ro), group_source_.get(), reward_.get(),
                                                 eval_datasets_));
    coordinator_.SetProgressCallback(
        [this](const rollout::RolloutProgress& p) { report_->Progress(p); });
    // Trainer rank 0 joins the engines' weight-update group and pushes its weights.
    SLIME_RETURN_IF_ERROR(engines_->ConnectTrainer());
    SLIME_ASSIGN_OR_RETURN(Json sync, SyncWeights(std::to_string(start_rollout_id_)));
    spdlog::info("initial weight push: {} bytes in {:.2f} s", sync.value("bytes", int64_t{0}),
                 sync.value("seconds", 0.0));
  }
  if (offload_trainers_) {
    // The engines generate first: the trainer leaves the GPU until the first train step.
    SLIME_RETURN_IF_ERROR(TrainerMemory(/*release=*/true, "", nullptr));
  }
  return absl::OkStatus();
}

Status Driver::EngineMemory(bool release, const std::vector<std::string>& tags) {
  const std::string path = release ? "/release_memory_occupation" : "/resume_memory_occupation";
  const std::string body = Json{{"tags", tags.empty() ? Json(nullptr) : Json(tags)}}.dump();
  for (const std::string& address : engines_->Addresses()) {
    SLIME_ASSIGN_OR_RETURN(auto hp, runtime::SplitHostPort(address));
    http::ClientOptions co;
    co.timeout = std::chrono::minutes(10);
    http::Client client(hp.first, hp.second, co);
    SLIME_ASSIGN_OR_RETURN(http::Response r, client.Post(path, body));
    if (r.status != 200) return http::StatusFromHttp(r.status, "engine " + address + " " + path, r.body);
  }
  return absl::OkStatus();
}

Status Driver::TrainerMemory(bool release, const char* metric, MetricValues* values) {
  const auto t = Clock::now();
  runtime::CallOptions co;
  co.timeout = LongCall();
  SLIME_RETURN_IF_ERROR(head_->Group(trainer_ids_)
                            .CallAll(release ? "release_memory" : "resume_memory", "{}", co)
                            .status());
  if (values != nullptr) (*values)[metric] = Since(t);
  return absl::OkStatus();
}

StatusOr<Json> Driver::SyncWeights(const std::string& version) {
  // An engine restarted since the last sync: the group is re-formed with its new address.
  if (engines_ != nullptr) SLIME_RETURN_IF_ERROR(engines_->ReconnectIfChanged());
  // Every rank: rank 0 sends, its TP peers take part in the gathers and the later pipeline
  // stages send their parameters to it, and each rank advances its own keep_old_actor queue.
  // Rank 0's reply has the transfer's numbers.
  runtime::CallOptions co;
  co.timeout = LongCall();
  SLIME_ASSIGN_OR_RETURN(
      std::vector<std::string> replies,
      head_->Group(trainer_ids_)
          .CallAll("sync_weights", Json{{"weight_version", version}}.dump(), co));
  Json reply = Json::parse(replies.front(), nullptr, false);
  if (!reply.is_object())
    return absl::InternalError("sync_weights on trainer-0: reply is not JSON");
  return reply;
}

Status Driver::Evaluate(int64_t rollout_id, MetricValues* perf) {
  if (eval_datasets_.empty() || !has_engines_) return absl::OkStatus();
  const auto start = Clock::now();
  SLIME_ASSIGN_OR_RETURN(rollout::EvalResult eval, coordinator_.Eval(rollout_id));
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

Status Driver::SaveCheckpoint(int64_t rollout_id, const RolloutSideState* state) {
  const std::string& save = *config_.checkpoint.save;
  // The data source and coordinator state first: the trainer writes the tracker last, so a
  // tracker never names an iteration whose rollout state is missing.
  if (source_) {
    data::PromptDataSource at_rollout = *source_;
    if (state != nullptr && state->data_source) {
      SLIME_RETURN_IF_ERROR(at_rollout.Restore(*state->data_source));
    }
    SLIME_RETURN_IF_ERROR(at_rollout.Save(data::DataSourceStatePath(save, rollout_id)));
  }
  const Json coordinator = state != nullptr ? state->coordinator : coordinator_.State();
  // <save>/rollout/ may not exist yet (train-only runs have no data source to create it).
  std::error_code ec;
  std::filesystem::create_directories(save + "/rollout", ec);
  if (ec) {
    return absl::InternalError(
        fmt::format("checkpoint.save: cannot create {}/rollout: {}", save, ec.message()));
  }
  SLIME_RETURN_IF_ERROR(WriteFileAtomically(
      fmt::format("{}/rollout/coordinator_state_{}.json", save, rollout_id),
      coordinator.dump() + "\n"));
  Json request = {{"rollout_id", rollout_id},
                  {"extra_state", {{"num_rollout", num_rollout_}}}};
  runtime::CallOptions co;
  co.timeout = LongCall();
  return head_->Group(trainer_ids_).CallAll("save", request.dump(), co).status();
}

StatusOr<rollout::RolloutResult> Driver::GenerateRollout(int64_t rollout_id) {
  if (train_only_) {
    return LoadDebugRollout(DebugRolloutPath(*config_.debug.load_debug_rollout_data, rollout_id),
                            rollout_id);
  }
  return coordinator_.Generate(rollout_id);
}

RolloutSideState Driver::CaptureState() {
  RolloutSideState state;
  if (source_) state.data_source = source_->state();
  state.coordinator = coordinator_.State();
  return state;
}

Status Driver::ProcessRollout(int64_t rollout_id, const rollout::RolloutResult& result,
                              MetricValues* values) {
  values->insert(result.metrics.begin(), result.metrics.end());
  if (config_.debug.save_debug_rollout_data) {
    SLIME_RETURN_IF_ERROR(SaveDebugRollout(
        DebugRolloutPath(*config_.debug.save_debug_rollout_data, rollout_id), result));
  }
  return absl::OkStatus();
}

Status Driver::TrainRollout(int64_t rollout_id, const rollout::RolloutResult& result,
                            MetricValues* values) {
  if (config_.debug.rollout_only) return absl::OkStatus();
  const auto t = Clock::now();
  runtime::CallOptions long_call;
  long_call.timeout = LongCall();
  const std::string payload =
      EncodeTrainBatch(rollout_id, ToTrainBatch(result, config_.rollout.temperature));
  SLIME_ASSIGN_OR_RETURN(std::vector<std::string> replies,
                         head_->Group(trainer_ids_).CallAll("train", payload, long_call));
  Json reply = Json::parse(replies.front(), nullptr, false);
  if (reply.is_discarded()) return absl::InternalError("train on trainer-0: reply is not JSON");
  for (const Json& step : reply.at("steps")) {
    MetricValues step_values;
    for (const auto& [k, v] : step.at("values").items()) {
      step_values["train/" + k] = v.get<double>();
    }
    if (step.value("skipped", false)) step_values["train/skipped"] = 1.0;
    SLIME_RETURN_IF_ERROR(
        report_->Record(rollout_id, step.at("step").get<int64_t>(), step_values));
    for (const auto& [k, v] : step_values) (*values)[k] = v;  // the summary shows the last step
  }
  for (const auto& [k, v] : reply.at("rollout_values").items()) {
    (*values)["rollout/trainer/" + k] = v.get<double>();
  }
  (*values)["perf/train_time"] = Since(t);
  return absl::OkStatus();
}

Status Driver::Save(int64_t rollout_id, const RolloutSideState& state, MetricValues* values) {
  if (config_.debug.rollout_only || !config_.checkpoint.save ||
      !Periodic(rollout_id, config_.checkpoint.save_interval, num_rollout_)) {
    return absl::OkStatus();
  }
  const auto t = Clock::now();
  SLIME_RETURN_IF_ERROR(SaveCheckpoint(rollout_id, &state));
  (*values)["perf/save_time"] = Since(t);
  return absl::OkStatus();
}

bool Driver::SyncDue(int64_t rollout_id) {
  return !config_.debug.rollout_only && has_engines_ &&
         (rollout_id + 1) % config_.weight_sync.interval == 0;
}

Status Driver::UpdateWeights(int64_t rollout_id, MetricValues* values) {
  const auto t = Clock::now();
  SLIME_ASSIGN_OR_RETURN(Json sync, SyncWeights(std::to_string(rollout_id + 1)));
  (*values)["perf/update_weights_time"] = Since(t);
  (*values)["perf/update_weights_gb_per_s"] = sync.value("gb_per_s", 0.0);
  return absl::OkStatus();
}

bool Driver::EvalDue(int64_t rollout_id) {
  return Periodic(rollout_id, config_.eval.interval, std::nullopt);
}

Status Driver::Report(int64_t rollout_id, const MetricValues& values) {
  report_->Summary(rollout_id, values);
  return report_->Record(rollout_id, std::nullopt, values);
}

Status Driver::Loop() {
  const config::DebugConfig& debug = config_.debug;
  const auto loop_start = Clock::now();
  const bool eval_only = num_rollout_ == 0 && config_.eval.interval.has_value();
  if (has_engines_ && config_.eval.interval && start_rollout_id_ == 0 &&
      (eval_only || !config_.eval.skip_eval_before_train)) {
    SLIME_RETURN_IF_ERROR(Evaluate(0, nullptr));
  }
  if (options_.async_train) {
    SLIME_RETURN_IF_ERROR(RunAsyncLoop(start_rollout_id_, num_rollout_, this));
    return FinishRun(loop_start);
  }
  for (int64_t rollout_id = start_rollout_id_; rollout_id < num_rollout_; ++rollout_id) {
    if (signals_->last_signal() != 0) return absl::CancelledError("stopped by a signal");
    const auto step_start = Clock::now();
    MetricValues values;
    // 1. Generate (or load a saved rollout).
    auto t = Clock::now();
    SLIME_ASSIGN_OR_RETURN(rollout::RolloutResult result, GenerateRollout(rollout_id));
    report_->EndProgress();
    values["perf/rollout_time"] = Since(t);
    if (offload_engines_ && !debug.rollout_only) {
      t = Clock::now();
      SLIME_RETURN_IF_ERROR(EngineMemory(/*release=*/true, {}));
      values["perf/offload_rollout_time"] = Since(t);
    }
    if (offload_trainers_) {
      SLIME_RETURN_IF_ERROR(TrainerMemory(/*release=*/false, "perf/onload_train_time", &values));
    }
    SLIME_RETURN_IF_ERROR(ProcessRollout(rollout_id, result, &values));
    // 2. Train.
    SLIME_RETURN_IF_ERROR(TrainRollout(rollout_id, result, &values));
    // 3. Save.
    SLIME_RETURN_IF_ERROR(Save(rollout_id, CaptureState(), &values));
    // 4. Weight sync: the engines take their weights' memory back first; then the trainer
    // leaves the GPU and the engines take their K/V cache (and CUDA graphs) back (slime's order).
    if (offload_engines_ && !debug.rollout_only) {
      t = Clock::now();
      SLIME_RETURN_IF_ERROR(EngineMemory(/*release=*/false, {"weights"}));
      values["perf/onload_rollout_time"] = Since(t);
    }
    if (SyncDue(rollout_id)) SLIME_RETURN_IF_ERROR(UpdateWeights(rollout_id, &values));
    if (offload_trainers_) {
      SLIME_RETURN_IF_ERROR(TrainerMemory(/*release=*/true, "perf/offload_train_time", &values));
    }
    if (offload_engines_ && !debug.rollout_only) {
      t = Clock::now();
      SLIME_RETURN_IF_ERROR(EngineMemory(/*release=*/false, {"kv_cache", "cuda_graph"}));
      values["perf/onload_rollout_time"] += Since(t);
    }
    // 5. Eval.
    if (EvalDue(rollout_id)) SLIME_RETURN_IF_ERROR(Evaluate(rollout_id, &values));
    values["perf/step_time"] = Since(step_start);
    SLIME_RETURN_IF_ERROR(Report(rollout_id, values));
  }
  return FinishRun(loop_start);
}

Status Driver::FinishRun(Clock::time_point loop_start) {
  std::string done = fmt::format("done: rollouts {}..{} in {:.0f} s", start_rollout_id_,
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

}  // namespace

Status CheckAsyncConfig(const config::Config& config) {
  if (config.cluster.colocate) {
    return absl::InvalidArgumentError(
        "--async: cluster.colocate is true, but the one-step-off-policy loop generates on the "
        "engines while the trainers train, so they need devices of their own (slime's "
        "train_async.py asserts the same); set cluster.colocate: false or run without --async");
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
