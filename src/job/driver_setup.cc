// The driver's setup (driver_internal.h): the data, the runtime head and this node's agent, the
// placement and start of the worker actors, the trainers' groups and init (with the resume),
// the engines' wiring to the coordinator and the trainers' first weight push.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <thread>

#include "driver_internal.h"
#include "fmt/format.h"
#include "slime/common/atomic_file.h"
#include "slime/http/client.h"
#include "slime/http/metrics_route.h"
#include "slime/job/actors.h"
#include "slime/workflow/factory.h"
#include "spdlog/spdlog.h"

namespace slime::job {
namespace {

std::string Absolute(const std::string& path) {
  if (path.empty()) return path;
  std::error_code ec;
  std::filesystem::path p = std::filesystem::absolute(path, ec);
  return ec ? path : p.lexically_normal().string();
}

void MakeAbsolute(std::optional<std::string>& path) {
  if (path) path = Absolute(*path);
}

// The host Prometheus reaches the driver's /metrics at: 127.0.0.1 when it listens there only;
// else the host of cluster.head_address, or this machine's name.
std::string MetricsHost(const config::Config& config, const std::string& bind_host) {
  if (bind_host != "0.0.0.0") return bind_host;
  if (!config.cluster.head_address.empty()) {
    StatusOr<std::pair<std::string, int>> hp = runtime::SplitHostPort(config.cluster.head_address);
    if (hp.ok() && hp->first != "0.0.0.0") return hp->first;
  }
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) == 0 && name[0] != '\0') return name;
  return "127.0.0.1";
}

}  // namespace

Status Driver::Setup() {
  SLIME_RETURN_IF_ERROR(CheckLoopConfig(config_, options_.loop));
  SLIME_RETURN_IF_ERROR(CheckInputFiles(config_));
  train_only_ = config_.debug.load_debug_rollout_data.has_value();
  SLIME_RETURN_IF_ERROR(MakePathsAbsolute());
  SLIME_RETURN_IF_ERROR(LoadData());
  SLIME_RETURN_IF_ERROR(StartRuntime());
  SLIME_RETURN_IF_ERROR(StartActors());
  SLIME_RETURN_IF_ERROR(InitTrainers());
  if (has_engines_) SLIME_RETURN_IF_ERROR(ConnectEngines());
  if (offload_trainers_) {
    // The engines generate first: the trainer leaves the GPU until the first train step.
    SLIME_RETURN_IF_ERROR(TrainerMemory(/*release=*/true, "", nullptr));
  }
  // Where a trainer group restart goes back to when this job has no checkpoint of its own.
  initial_rollout_side_ = CaptureState();
  initial_start_rollout_id_ = start_rollout_id_;
  setup_done_ = true;
  return absl::OkStatus();
}

Status Driver::MakePathsAbsolute() {
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
  return absl::OkStatus();
}

// ---- Data: bad data fails here, before any process starts.

Status Driver::LoadData() {
  const auto start = Clock::now();
  SLIME_ASSIGN_OR_RETURN(tokenizer_, tokenizer::Tokenizer::FromDirectory(config_.model.hf_checkpoint));
  if (config_.rollout.trajectory_buffer) {
    rollout::TrajectoryBuffer::Options o;
    o.n_samples_per_prompt = config_.data.n_samples_per_prompt;
    o.rollout_batch_size = config_.data.rollout_batch_size;
    SLIME_ASSIGN_OR_RETURN(rollout::RolloutOptions ro, rollout::RolloutOptionsFromConfig(config_, {}));
    o.reward_postprocess = ro.reward_postprocess;
    SLIME_ASSIGN_OR_RETURN(trajectories_, rollout::TrajectoryBuffer::Create(std::move(o)));
  } else if (!train_only_) {
    SLIME_RETURN_IF_ERROR(LoadPrompts(start));
  }
  SLIME_RETURN_IF_ERROR(ResolveNumRollout());
  SLIME_RETURN_IF_ERROR(LoadEvalDatasets());
  if (!train_only_) {
    SLIME_ASSIGN_OR_RETURN(reward_, reward::RewardModel::Create(
                                        reward::RewardOptionsFromConfig(config_.reward)));
  }
  return absl::OkStatus();
}

Status Driver::LoadPrompts(Clock::time_point start) {
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
  return absl::OkStatus();
}

Status Driver::ResolveNumRollout() {
  if (!config_.data.num_rollout) {
    if (dataset_ == nullptr) {
      return absl::InvalidArgumentError(
          "data.num_rollout is required with debug.load_debug_rollout_data or "
          "rollout.trajectory_buffer (no prompt dataset to count epochs of)");
    }
    const int64_t per_epoch = dataset_->size() / std::max(1, config_.data.rollout_batch_size);
    config_.data.num_rollout = static_cast<int>(per_epoch * config_.data.num_epoch.value_or(1));
    spdlog::info("data.num_rollout = {} ({} prompts / rollout_batch_size {} × {} epoch(s))",
                 *config_.data.num_rollout, dataset_->size(), config_.data.rollout_batch_size,
                 config_.data.num_epoch.value_or(1));
  }
  num_rollout_ = *config_.data.num_rollout;
  return absl::OkStatus();
}

Status Driver::LoadEvalDatasets() {
  for (const config::EvalDatasetConfig& entry : config_.eval.datasets) {
    data::PromptDatasetOptions o = data::PromptDatasetOptionsFromConfig(config_);
    if (entry.input_key) o.input_key = *entry.input_key;
    if (entry.label_key) o.label_key = *entry.label_key;
    if (entry.tool_key) o.tool_key = *entry.tool_key;
    if (entry.apply_chat_template) o.apply_chat_template = *entry.apply_chat_template;
    o.max_prompt_len = config_.eval.max_prompt_len.value_or(0);
    StatusOr<data::PromptDataset> eval = data::PromptDataset::Load(entry.path, *tokenizer_, o);
    if (!eval.ok()) {
      return absl::InvalidArgumentError(fmt::format("eval dataset '{}': {}", entry.name,
                                                    std::string(eval.status().message())));
    }
    eval_datasets_.push_back(rollout::EvalDatasetFromConfig(config_, entry, *eval));
  }
  return absl::OkStatus();
}

// ---- The runtime: the metrics server, the head and this node's agent.

Status Driver::StartRuntime() {
  // Metrics: the registry is served by the driver's own HTTP server.
  http::Router router;
  http::AddMetricsRoute(router, registry_);
  if (trajectories_) AddTrajectoryRoutes(&router);
  // The job's one read key guards the driver's /metrics as it guards the engines' (one scrape
  // credential for both); a request without it gets 401.
  http::AccessKeys keys;
  keys.api_key = config_.cluster.engine_api_key;
  router.SetAccessKeys(std::move(keys));
  http::ServerOptions so;
  so.host = !config_.metrics.prometheus_host.empty() ? config_.metrics.prometheus_host
            : config_.metrics.prometheus_port         ? "0.0.0.0"
                                                      : "127.0.0.1";
  so.port = config_.metrics.prometheus_port.value_or(0);
  so.num_threads = 1;
  SLIME_ASSIGN_OR_RETURN(metrics_server_, http::Server::Start(so, std::move(router)));
  metrics_target_ = fmt::format("{}:{}", MetricsHost(config_, so.host), metrics_server_->port());
  metrics_local_ = fmt::format("{}:{}", so.host == "0.0.0.0" ? "127.0.0.1" : so.host,
                               metrics_server_->port());
  SLIME_ASSIGN_OR_RETURN(report_, DriverReport::Create(config_.metrics.jsonl_path.value_or(""),
                                                       config_.metrics.tensorboard_dir.value_or(""),
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
  ho.max_restarts = config_.fault_tolerance.max_engine_restarts;  // trainers: their own limit
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
  SLIME_RETURN_IF_ERROR(UpdatePrometheusTargets());
  spdlog::info("driver: head {} ; metrics http://{}:{}/metrics", head_->address(), so.host,
               metrics_server_->port());
  return absl::OkStatus();
}

Status Driver::WriteDriverFile() {
  Json j = {{"pid", static_cast<int64_t>(getpid())},
            {"head_address", head_->address()},
            {"metrics_url", fmt::format("http://{}/metrics", metrics_local_)},
            {"metrics_port", metrics_server_->port()},
            {"prometheus_targets", config_.cluster.run_dir + "/prometheus_targets.json"},
            {"jsonl_path", config_.metrics.jsonl_path.value_or("")}};
  return WriteFileAtomically(config_.cluster.run_dir + "/driver.json", j.dump(2) + "\n");
}

Status Driver::UpdatePrometheusTargets() {
  std::lock_guard<std::mutex> lock(targets_mu_);
  std::vector<PrometheusTarget> targets = {{metrics_target_, "driver", ""}};
  const std::vector<std::string> addresses = engines_ ? engines_->Addresses() : engine_addresses_;
  for (size_t i = 0; i < engine_ids_.size() && i < addresses.size(); ++i) {
    // External engines (no actor id) are not ours: their /metrics may not exist.
    if (!engine_ids_[i].empty()) targets.push_back({addresses[i], "engine", engine_ids_[i]});
  }
  return WritePrometheusTargets(config_.cluster.run_dir + "/prometheus_targets.json", targets);
}

// ---- The worker actors: placed, started, their engines' addresses resolved.

Status Driver::StartActors() {
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(options_.start_timeout_s * 1000));
  SLIME_ASSIGN_OR_RETURN(std::vector<runtime::NodeResources> nodes,
                         head_->WaitForNodes(config_.cluster.num_nodes, timeout));
  bool gpus = false;
  SLIME_ASSIGN_OR_RETURN(std::vector<runtime::ActorOptions> actors, PlanActors(nodes, &gpus));
  if (trainer_ids_.empty()) return absl::InvalidArgumentError("placement: no trainer actor");
  SLIME_RETURN_IF_ERROR(DecideEngines(gpus));
  spdlog::info("starting {} trainer(s) and {} engine(s) on {} node(s)", trainer_ids_.size(),
               engine_ids_.size(), nodes.size());
  const auto start = Clock::now();
  SLIME_RETURN_IF_ERROR(head_->StartActors(actors));
  std::vector<std::string> ids = trainer_ids_;
  ids.insert(ids.end(), engine_ids_.begin(), engine_ids_.end());
  SLIME_RETURN_IF_ERROR(head_->WaitForActors(ids, timeout));
  SLIME_RETURN_IF_ERROR(ResolveEngineAddresses(timeout));
  SLIME_RETURN_IF_ERROR(UpdatePrometheusTargets());
  spdlog::info("actors up in {:.1f} s; engines: {}", Since(start),
               fmt::join(engine_addresses_, ", "));
  return absl::OkStatus();
}

StatusOr<std::vector<runtime::ActorOptions>> Driver::PlanActors(
    const std::vector<runtime::NodeResources>& nodes, bool* gpus) {
  runtime::PlacementRequest request = options_.placement;
  if (train_only_) request.rollout_num_gpus = 0;
  SLIME_ASSIGN_OR_RETURN(runtime::PlacementPlan plan, runtime::PlanPlacement(request, nodes));
  std::vector<runtime::ActorOptions> actors = runtime::ActorsFromPlan(
      plan, [](const std::string& role) { return role == "engine" ? kEngineActorType : kTrainerActorType; });
  // The coordinator runs in this process; the PPO critic lives inside the trainer processes.
  std::erase_if(actors, [](const runtime::ActorOptions& a) {
    return a.role == "rollout" || a.role == "critic";
  });
  *gpus = plan.device_kind == runtime::DeviceKind::kGpu;
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
    Json init = {{"device", *gpus ? "cuda" : "cpu"}};
    if (a.role == "engine") {
      engine_ids_.push_back(a.actor_id);
      if (!*gpus) init["num_threads"] = std::max(1, cores / std::max(1, engines_on_node[a.node_name]));
    } else {
      // In rank order (the plan lists trainers by rank): trainer_ids_[r] is rank r.
      trainer_ids_.push_back(a.actor_id);
      // cluster.train_env_vars: set in the trainer process's environment by its node agent
      // (over what the agent inherited; the runtime's own variables still win).
      for (const auto& [name, value] : config_.cluster.train_env_vars) a.env[name] = value;
      init["world_size"] = num_trainers;
      // fault_tolerance.max_trainer_restarts: the runtime restarts a lost trainer process and
      // the driver restarts the whole group from the last checkpoint (RecoverTrainers); each
      // group restart counts once against every trainer's limit.
      if (config_.fault_tolerance.max_trainer_restarts > 0) {
        a.restartable = true;
        a.max_restarts = config_.fault_tolerance.max_trainer_restarts;
        a.max_restarts_name = "fault_tolerance.max_trainer_restarts";
      }
      // CPU trainers of one node share its cores (ranks wait on each other in collectives).
      if (!*gpus)
        init["num_threads"] = std::max(1, cores / std::max(1, trainers_on_node[a.node_name]));
    }
    a.init_payload = init.dump();
  }
  return actors;
}

Status Driver::DecideEngines(bool gpus) {
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
  return absl::OkStatus();
}

Status Driver::ResolveEngineAddresses(std::chrono::milliseconds timeout) {
  for (const std::string& id : engine_ids_) {
    SLIME_ASSIGN_OR_RETURN(Json address, CallJson(head_->Handle(id), "address", Json::object(), timeout));
    engine_addresses_.push_back(
        fmt::format("{}:{}", address.at("host").get<std::string>(), address.at("port").get<int>()));
  }
  if (engine_ids_.empty() && has_engines_) {
    const std::vector<std::string>& external = config_.cluster.rollout_external_engine_addrs;
    SLIME_RETURN_IF_ERROR(WaitForExternalEngines(external, timeout));
    engine_addresses_ = external;
    engine_ids_.assign(external.size(), "");  // no actors: EngineRecovery's external case
  }
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

// ---- The trainers: their groups, init and resume.

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
  // With expert parallelism also ep[(p·DP/EP + d/EP)·TP + t] and edp[(p·EP + d%EP)·TP + t]
  // (workers/trainer_worker.cc), whose leaders ascend likewise.
  Json join = {{"tp", Json::array()},
               {"dp", Json::array()},
               {"pp", Json::array()},
               {"ep", Json::array()},
               {"edp", Json::array()}};
  for (int rank = 0; rank < world; ++rank) {
    Json reply = Json::parse(opened[rank], nullptr, false);
    if (!reply.is_object()) {
      return absl::InternalError(
          fmt::format("open_groups on {}: reply is not JSON", trainer_ids_[rank]));
    }
    for (const char* key : {"tp", "dp", "pp", "ep", "edp"}) {
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
  RecordTrainerIncarnations();  // with failover, a loss from here on fails the init at once
  SLIME_ASSIGN_OR_RETURN(Json init, InitTrainerRanks(""));
  spdlog::info("trainers ready in {:.1f} s ({} parameters on {})", Since(start),
               init.value("num_parameters", int64_t{0}), init.value("device", std::string("?")));
  SLIME_RETURN_IF_ERROR(Resume(init, config_.checkpoint.load.value_or("")));
  if (config_.checkpoint.start_rollout_id) start_rollout_id_ = *config_.checkpoint.start_rollout_id;
  return absl::OkStatus();
}

StatusOr<Json> Driver::InitTrainerRanks(const std::string& load) {
  // The groups first: a tensor-parallel trainer loads its shard and runs collectives in init.
  if (trainer_ids_.size() > 1) SLIME_RETURN_IF_ERROR(FormTrainerGroups());
  const Json request = load.empty() ? Json::object() : Json{{"load", load}};
  SLIME_ASSIGN_OR_RETURN(std::vector<std::string> replies, CallTrainers("init", request.dump()));
  Json init = Json::parse(replies.front(), nullptr, false);
  if (!init.is_object()) return absl::InternalError("init on trainer-0: reply is not JSON");
  return init;
}

// ---- The engines: tracked for recovery, wired to the coordinator, given the trainer's weights.

Status Driver::ConnectEngines() {
  // The engines as tracked from now on: a lost one is restarted by the head, then recovered
  // (new address, the trainer's weights) by the coordinator through engines_.
  SLIME_ASSIGN_OR_RETURN(engines_, EngineRecoveryImpl::Create(EngineTrackingOptions()));
  coordinator_.SetEngineRecovery(engines_.get());
  StartHealthChecks();
  SLIME_RETURN_IF_ERROR(ConfigureCoordinator());
  // Trainer rank 0 joins the engines' weight-update group and pushes its weights.
  SLIME_RETURN_IF_ERROR(engines_->ConnectTrainer());
  SLIME_ASSIGN_OR_RETURN(Json sync, SyncWeights(std::to_string(start_rollout_id_)));
  spdlog::info("initial weight push: {} bytes in {:.2f} s", sync.value("bytes", int64_t{0}),
               sync.value("seconds", 0.0));
  return absl::OkStatus();
}

EngineRecoveryOptions Driver::EngineTrackingOptions() {
  EngineRecoveryOptions eo;
  eo.head = head_.get();
  eo.engine_ids = engine_ids_;
  eo.addresses = engine_addresses_;
  // The weight exporters: every rank of DP rank 0 — the TP ranks of each pipeline stage (ranks
  // p·DP·TP + t, workers.h) — and with expert parallelism those of DP ranks 1..EP-1 too (each
  // sends its experts to the others; ranks p·DP·TP + d·TP + t), rank 0 first, the source.
  const int tp = std::max(1, config_.train.tensor_model_parallel_size);
  const int pp = std::max(1, config_.train.pipeline_model_parallel_size);
  const int ep = std::max(1, config_.train.expert_model_parallel_size);
  const int world = static_cast<int>(trainer_ids_.size());
  const int dp = std::max(1, world / (tp * pp));
  for (int p = 0; p < pp; ++p) {
    for (int d = 0; d < ep; ++d) {
      for (int t = 0; t < tp; ++t) {
        const int rank = (p * dp + d) * tp + t;
        if (rank < world) eo.trainer_ids.push_back(trainer_ids_[rank]);
      }
    }
  }
  eo.num_gpus_per_engine = config_.cluster.rollout_num_gpus_per_engine;
  eo.max_restarts = config_.fault_tolerance.max_engine_restarts;
  eo.restart_backoff_s = config_.fault_tolerance.restart_backoff;
  eo.health_check_timeout_s = config_.fault_tolerance.health_check_timeout;
  eo.metrics = &registry_;
  eo.on_address_change = [this] {
    Status s = UpdatePrometheusTargets();
    if (!s.ok()) spdlog::warn("prometheus targets: {}", std::string(s.message()));
  };
  return eo;
}

void Driver::StartHealthChecks() {
  const config::FaultToleranceConfig& ft = config_.fault_tolerance;
  EngineHealthOptions ho;
  ho.first_wait_s = ft.health_check_first_wait;
  ho.interval_s = ft.health_check_interval;
  ho.timeout_s = ft.health_check_timeout;
  ho.bearer_token = config::EngineAccessToken(config_.cluster);
  EngineRecoveryImpl* engines = engines_.get();
  runtime::Head* head = head_.get();
  ho.targets = [engines] { return engines->HealthTargets(); };
  ho.on_unhealthy = [head](const EngineHealthTarget& engine, const std::string& why) {
    if (engine.incarnation == 0) {  // external: not ours to restart
      spdlog::warn("external engine {} failed its health check; slime_train does not restart "
                   "external engines (a generation that cannot reach it waits "
                   "fault_tolerance.health_check_timeout for it)",
                   engine.address);
      return;
    }
    Status killed = head->KillActor(engine.name, engine.incarnation,
                                    "it failed its health check (" + why + ")");
    if (killed.ok()) {
      spdlog::warn("engine {} at {} killed after a failed health check; the runtime restarts it "
                   "(fault_tolerance.max_engine_restarts) and the rollout recovers it",
                   engine.name, engine.address);
    } else {
      spdlog::info("engine {}: not killed after its failed health check: {}", engine.name,
                   std::string(killed.message()));
    }
  };
  {
    std::lock_guard<std::mutex> lock(stop_mu_);  // Stop() reads health_ on the signal thread
    health_ = std::make_unique<EngineHealthMonitor>(std::move(ho));
    health_->Start();
  }
  spdlog::info(
      "engine health checks: GET /health_generate every {} s while generating, the first after "
      "{} s, {} s timeout (fault_tolerance.health_check_interval / first_wait / timeout)",
      ft.health_check_interval, ft.health_check_first_wait, ft.health_check_timeout);
}

// rollout.trajectory_buffer: POST /trajectories adds (400 naming the bad entry and field, nothing
// added), GET /trajectories reports the buffer and the engines' weight version.
void Driver::AddTrajectoryRoutes(http::Router* router) {
  rollout::TrajectoryBuffer* buffer = trajectories_.get();
  router->Add("POST", "/trajectories",
              [buffer](const http::Request& request, std::shared_ptr<http::ResponseWriter> w) {
                StatusOr<int64_t> added = buffer->Add(request.body);
                if (!added.ok()) {
                  const int status = absl::IsInvalidArgument(added.status()) ? 400 : 503;
                  w->SendJson(status, Json{{"error", {{"message", std::string(added.status().message())}}}});
                  return;
                }
                Json reply = buffer->Stats();
                reply["added_now"] = *added;
                w->SendJson(200, reply);
              });
  router->Add("GET", "/trajectories",
              [this, buffer](const http::Request&, std::shared_ptr<http::ResponseWriter> w) {
                Json reply = buffer->Stats();
                reply["weight_version"] = std::to_string(weight_version_.load());
                w->SendJson(200, reply);
              });
}

Status Driver::ConfigureCoordinator() {
  SLIME_ASSIGN_OR_RETURN(rollout::RolloutOptions ro,
                         rollout::RolloutOptionsFromConfig(config_, engine_addresses_));
  if (options_.loop == TrainLoop::kFullyAsync && config_.rollout.stale_samples == "regenerate") {
    ro.regenerate_older_than = config_.rollout.max_staleness.value_or(kDefaultMaxStaleness);
  }
  // rollout.custom_generate (and eval datasets' overrides): multi-turn episodes, plugins.
  SLIME_RETURN_IF_ERROR(workflow::ConfigureCustomGeneration(config_, tokenizer_.get(), &ro,
                                                            &eval_datasets_));
  SLIME_RETURN_IF_ERROR(coordinator_.Configure(std::move(ro), group_source_.get(), reward_.get(),
                                               eval_datasets_));
  coordinator_.SetProgressCallback(
      [this](const rollout::RolloutProgress& p) { report_->Progress(p); });
  return absl::OkStatus();
}

}  // namespace slime::job
