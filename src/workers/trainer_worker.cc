// TrainerWorker (include/slime/workers/workers.h).
#include <torch/torch.h>
#ifdef SLIME_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <ftw.h>
#include <sys/stat.h>

#include <fstream>

#include <chrono>
#include <utility>

#include "fmt/format.h"
#include "slime/comm/process_group.h"
#include "slime/comm/weight_sender.h"
#include "slime/http/client.h"
#include "slime/model/decoder.h"
#include "slime/model/offload.h"
#include "slime/model/weights.h"
#include "slime/train/optimizer.h"
#include "slime/train/checkpoint.h"
#include "slime/train/hf_export.h"
#include "slime/train/trainer.h"
#include "slime/workers/workers.h"
#include "spdlog/spdlog.h"

namespace slime::workers {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

nlohmann::json StepToJson(const train::TrainStepMetrics& m) {
  return {{"step", m.step},
          {"step_in_rollout", m.step_in_rollout},
          {"num_samples", m.num_samples},
          {"skipped", m.skipped},
          {"values", m.values}};
}

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace

struct TrainerWorker::Impl {
  WorkerOptions options;
  std::unique_ptr<train::Trainer> trainer;
  std::unique_ptr<comm::WeightSender> sender;       // distributed transport
  std::vector<comm::EngineEndpoint> disk_engines;   // disk transport
  std::string last_disk_dir;
  // The weight_version the trainer's weights are: the last one synced, or rollout_id + 1 after
  // training rollout_id (what the next sync will call them). "" before the first sync.
  std::string weights_version;
  std::string synced_version;

  // Colocated on one GPU with the only engine (one trainer, rollout_num_gpus 1, engines of one
  // GPU): the weights go by CUDA IPC. NCCL refuses a communicator with two ranks on one device.
  bool UseIpc() const {
    const config::Config& c = options.config;
    return c.weight_sync.transport != "disk" && c.cluster.colocate && options.device == "cuda" &&
           options.world_size == 1 && c.cluster.rollout_num_gpus.value_or(0) == 1 &&
           c.cluster.rollout_num_gpus_per_engine == 1;
  }
  // weight_sync.transport, or disk where a colocated layout cannot use IPC for every engine
  // (engines on GPUs of their own next to the shared one).
  bool UseDisk() const {
    const config::Config& c = options.config;
    return c.weight_sync.transport == "disk" ||
           (c.cluster.colocate && options.device == "cuda" && !UseIpc());
  }

  // Data parallelism across trainer processes (world_size > 1): the group the gradients and
  // metric sums are all-reduced in (Gloo on CPU, NCCL on CUDA). Formed after Init by
  // OpenDpGroup (rank 0) and JoinDpGroup (every rank).
  std::unique_ptr<comm::ProcessGroup> dp_group;
  comm::ProcessGroupOptions DpGroupOptions() const {
    comm::ProcessGroupOptions o;
    o.world_size = options.world_size;
    o.rank = options.rank;
    o.group_name = "slime_trainer_dp";
    o.backend = options.device == "cuda" ? "nccl" : "gloo";
    o.timeout_s = 60.0 * options.config.cluster.distributed_timeout_minutes;
    return o;
  }
  Status CheckDp() const {
    if (options.world_size > 1 && (dp_group == nullptr || !dp_group->joined())) {
      return absl::FailedPreconditionError(fmt::format(
          "trainer rank {} of {}: the data-parallel group is not formed (open_dp_group on rank 0, "
          "then join_dp_group on every rank)",
          options.rank, options.world_size));
    }
    return absl::OkStatus();
  }

  // Offload (cluster.offload_train): the model's weights and gradients and the optimizer's
  // masters and moments go to pinned host memory between train steps (model::StorageOffloader).
  model::StorageOffloader offloader;
  std::vector<torch::Tensor> DeviceTensors() const {
    const model::DecoderModel& m = std::as_const(*trainer).model();
    std::vector<torch::Tensor> out;
    for (const train::OptimizerParam& p : train::ModelParameters(m.weights(), m.config())) {
      out.push_back(p.tensor);
      if (p.tensor.grad().defined()) out.push_back(p.tensor.grad());
    }
    for (const torch::Tensor& t : trainer->optimizer().StateTensors()) out.push_back(t);
    return out;
  }
  // Everything back on the device before work that touches it (a no-op when it is there).
  Status EnsureResident() {
    if (!offloader.offloaded()) return absl::OkStatus();
    const auto start = std::chrono::steady_clock::now();
    SLIME_RETURN_IF_ERROR(offloader.Onload());
    spdlog::info("trainer: {:.2f} GB back on the device in {:.2f} s (onload)",
                 static_cast<double>(offloader.bytes()) / 1e9, SecondsSince(start));
    return absl::OkStatus();
  }
  StatusOr<nlohmann::json> SyncFromDisk(const std::string& version);
  std::string DiskRoot() const {
    const config::Config& c = options.config;
    return c.weight_sync.disk_dir.value_or(c.cluster.run_dir + "/weight_sync");
  }
  // The weights as an HF directory (safetensors + the model's config.json); returns its bytes.
  StatusOr<int64_t> WriteWeightsDir(const std::string& dir);
  // Pause → /update_weights_from_disk → continue on one engine.
  Status LoadOnEngine(const comm::EngineEndpoint& e, const std::string& dir, const std::string& version);

  Status CheckInit() const {
    if (trainer == nullptr) return absl::FailedPreconditionError("trainer: init has not run");
    return absl::OkStatus();
  }
};

TrainerWorker::TrainerWorker(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TrainerWorker::~TrainerWorker() = default;

std::unique_ptr<TrainerWorker> TrainerWorker::Create(WorkerOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  return std::unique_ptr<TrainerWorker>(new TrainerWorker(std::move(impl)));
}

StatusOr<nlohmann::json> TrainerWorker::Init() {
  if (impl_->trainer != nullptr) return absl::FailedPreconditionError("trainer: init ran twice");
  const WorkerOptions& o = impl_->options;
  const config::Config& config = o.config;
  if (o.num_threads > 0) at::set_num_threads(o.num_threads);
  train::TrainerOptions to;
  to.model_dir = config.model.hf_checkpoint;
  const bool cuda = o.device == "cuda";
  if (cuda && !torch::cuda::is_available()) {
    return absl::FailedPreconditionError("trainer: device cuda requested but CUDA is not available");
  }
  to.device = cuda ? torch::Device("cuda:0") : torch::Device(torch::kCPU);
  to.dtype = config.train.bf16 ? torch::kBFloat16 : torch::kFloat32;
  to.config = config;
  if (config.train.override_opt_param_scheduler) {
    to.lr_state_mismatch = train::LrStateMismatch::kUseConfigured;
  } else if (config.train.use_checkpoint_opt_param_scheduler) {
    to.lr_state_mismatch = train::LrStateMismatch::kUseCheckpoint;
  }
  if (config.train.tensor_model_parallel_size > 1) {
    // The Trainer supports TP (TrainerOptions::tp_group), but the workers do not form TP groups
    // yet: every worker trains a full replica as a data-parallel rank.
    spdlog::warn(
        "trainer rank {}: train.tensor_model_parallel_size = {} is not wired into the trainer "
        "workers yet; this worker trains a full replica as data-parallel rank {} of {}",
        o.rank, config.train.tensor_model_parallel_size, o.rank, o.world_size);
  }
  to.dp_size = o.world_size;
  to.dp_rank = o.rank;
  if (o.world_size > 1) {
    Impl* impl = impl_.get();
    to.dp_all_reduce = [impl](torch::Tensor& t) -> Status {
      SLIME_RETURN_IF_ERROR(impl->CheckDp());
      return impl->dp_group->AllReduceSum(t, "trainer data-parallel sum");
    };
    // ZeRO-1 (train.use_distributed_optimizer): the group's reduce-scatter and all-gather (NCCL's
    // own; on Gloo the reduce-scatter is an all-reduce and a slice, process_group.h).
    if (config.train.use_distributed_optimizer) {
      to.dp_reduce_scatter = [impl](const torch::Tensor& in, torch::Tensor& out) -> Status {
        SLIME_RETURN_IF_ERROR(impl->CheckDp());
        SLIME_ASSIGN_OR_RETURN(torch::Tensor part, impl->dp_group->ReduceScatterSum(
                                                       in, "trainer ZeRO-1 gradient reduce-scatter"));
        out.copy_(part);
        return absl::OkStatus();
      };
      to.dp_all_gather = [impl](const torch::Tensor& in, torch::Tensor& out) -> Status {
        SLIME_RETURN_IF_ERROR(impl->CheckDp());
        SLIME_ASSIGN_OR_RETURN(torch::Tensor all,
                               impl->dp_group->AllGather(in, 0, "trainer ZeRO-1 parameter all-gather"));
        out.copy_(all);
        return absl::OkStatus();
      };
    }
  }
  const auto start = std::chrono::steady_clock::now();
  SLIME_ASSIGN_OR_RETURN(impl_->trainer, train::Trainer::Create(std::move(to)));
  nlohmann::json reply = {{"loaded", false},
                          {"rollout_id", -1},
                          {"step", 0},
                          {"extra_state", nlohmann::json::object()},
                          {"device", o.device}};
  int64_t num_parameters = 0;
  for (const model::NamedTensor& t :
       model::NamedParameters(std::as_const(*impl_->trainer).model().weights(),
                              std::as_const(*impl_->trainer).model().config())) {
    num_parameters += t.tensor.numel();
  }
  reply["num_parameters"] = num_parameters;
  const std::optional<std::string>& load = config.checkpoint.load;
  std::optional<int64_t> ckpt_step;
  if (config.checkpoint.ckpt_step) ckpt_step = *config.checkpoint.ckpt_step;
  // checkpoint.load: a trainer checkpoint (a <save> dir with a tracker, or an iteration dir);
  // a missing or still empty directory is a fresh start, anything else unreadable an error.
  const bool resume = load && (ckpt_step || FileExists(*load + "/" + train::kCheckpointTrackerFile) ||
                                FileExists(*load + "/" + train::kTrainerStateFile));
  if (resume) {
    SLIME_ASSIGN_OR_RETURN(train::LoadedTrainerState loaded,
                           impl_->trainer->Load(*load, ckpt_step));
    reply["loaded"] = true;
    reply["dir"] = loaded.dir;
    reply["rollout_id"] = loaded.rollout_id;
    reply["step"] = loaded.step;
    nlohmann::json extra = nlohmann::json::parse(loaded.extra_state_json, nullptr, false);
    if (extra.is_discarded()) {
      return absl::DataLossError(
          fmt::format("trainer: checkpoint {}: extra state is not valid JSON", loaded.dir));
    }
    reply["extra_state"] = std::move(extra);
    spdlog::info("trainer: resumed from {} (rollout {}, step {})", loaded.dir, loaded.rollout_id,
                 loaded.step);
  } else if (load) {
    spdlog::info("trainer: no checkpoint in {} yet; starting from {}", *load,
                 config.model.hf_checkpoint);
  }
  reply["seconds"] = SecondsSince(start);
  return reply;
}

StatusOr<nlohmann::json> TrainerWorker::OpenDpGroup(const nlohmann::json& request) {
  SLIME_RETURN_IF_ERROR(impl_->CheckInit());
  const WorkerOptions& o = impl_->options;
  if (o.world_size < 2) {
    return absl::FailedPreconditionError("open_dp_group: this trainer is the only one (world_size 1)");
  }
  if (o.rank != 0) {
    return absl::FailedPreconditionError(
        fmt::format("open_dp_group: trainer rank {} asked; rank 0 opens the group", o.rank));
  }
  if (impl_->dp_group != nullptr) return absl::AlreadyExistsError("open_dp_group: already open");
  comm::ProcessGroupOptions po = impl_->DpGroupOptions();
  po.master_address = request.value("master_address", std::string("127.0.0.1"));
  SLIME_ASSIGN_OR_RETURN(impl_->dp_group, comm::ProcessGroup::Open(po));
  return nlohmann::json{{"master_address", po.master_address},
                        {"master_port", impl_->dp_group->port()}};
}

StatusOr<nlohmann::json> TrainerWorker::JoinDpGroup(const nlohmann::json& request) {
  SLIME_RETURN_IF_ERROR(impl_->CheckInit());
  const WorkerOptions& o = impl_->options;
  const auto start = std::chrono::steady_clock::now();
  if (o.rank != 0) {
    if (impl_->dp_group != nullptr) return absl::AlreadyExistsError("join_dp_group: already joined");
    comm::ProcessGroupOptions po = impl_->DpGroupOptions();
    try {
      po.master_address = request.at("master_address").get<std::string>();
      po.master_port = request.at("master_port").get<int>();
    } catch (const nlohmann::json::exception& e) {
      return absl::InvalidArgumentError(fmt::format("join_dp_group: bad request: {}", e.what()));
    }
    SLIME_ASSIGN_OR_RETURN(impl_->dp_group, comm::ProcessGroup::Open(po));
  } else if (impl_->dp_group == nullptr) {
    return absl::FailedPreconditionError("join_dp_group: rank 0 must run open_dp_group first");
  }
  SLIME_RETURN_IF_ERROR(impl_->dp_group->Join());
  return nlohmann::json{{"rank", o.rank}, {"world_size", o.world_size},
                        {"backend", impl_->dp_group->backend()}, {"seconds", SecondsSince(start)}};
}

StatusOr<nlohmann::json> TrainerWorker::Train(int64_t rollout_id, const train::RolloutBatch& batch) {
  SLIME_RETURN_IF_ERROR(impl_->CheckInit());
  SLIME_RETURN_IF_ERROR(impl_->CheckDp());
  SLIME_RETURN_IF_ERROR(impl_->EnsureResident());
  const auto start = std::chrono::steady_clock::now();
  SLIME_ASSIGN_OR_RETURN(train::TrainRolloutResult result,
                         impl_->trainer->TrainRollout(rollout_id, batch));
#ifdef SLIME_WITH_CUDA
  // Colocated: the engine on this GPU needs its K/V cache back; return the allocator's cached
  // blocks (slime's clear_memory after training).
  if (impl_->options.device == "cuda" && impl_->options.config.cluster.colocate) {
    c10::cuda::CUDACachingAllocator::emptyCache();
  }
#endif
  impl_->weights_version = std::to_string(rollout_id + 1);
  nlohmann::json steps = nlohmann::json::array();
  for (const train::TrainStepMetrics& m : result.steps) steps.push_back(StepToJson(m));
  return nlohmann::json{{"steps", std::move(steps)},
                        {"rollout_values", result.rollout_values},
                        {"dropped_samples", result.dropped_samples.size()},
                        {"seconds", SecondsSince(start)}};
}

StatusOr<nlohmann::json> TrainerWorker::Save(int64_t rollout_id, const nlohmann::json& extra_state) {
  SLIME_RETURN_IF_ERROR(impl_->CheckInit());
  const std::optional<std::string>& save = impl_->options.config.checkpoint.save;
  if (!save) return absl::FailedPreconditionError("trainer: save called without checkpoint.save");
  // Data parallel without sharded state: every rank holds the same weights and optimizer
  // state, so rank 0 writes the checkpoint alone. With the distributed optimizer (ZeRO-1) the
  // save is collective: every rank gathers the shards, rank 0 writes (Trainer::Save).
  const bool sharded = std::as_const(*impl_->trainer).optimizer().distributed();
  if (impl_->options.rank != 0 && !sharded) {
    return nlohmann::json{{"dir", ""}, {"seconds", 0.0}, {"written", false}};
  }
  SLIME_RETURN_IF_ERROR(impl_->EnsureResident());
  const auto start = std::chrono::steady_clock::now();
  SLIME_ASSIGN_OR_RETURN(std::string dir,
                         impl_->trainer->Save(*save, rollout_id, extra_state.dump()));
  if (dir.empty()) {  // a ZeRO-1 rank other than 0: it took part, rank 0 wrote
    return nlohmann::json{{"dir", ""}, {"seconds", SecondsSince(start)}, {"written", false}};
  }
  return nlohmann::json{{"dir", dir}, {"seconds", SecondsSince(start)}};
}

Status TrainerWorker::ConnectEngines(const nlohmann::json& request) {
  SLIME_RETURN_IF_ERROR(impl_->CheckInit());
  if (impl_->sender != nullptr) {
    // A re-formed group (an engine was restarted): the old one may name a dead engine.
    if (Status s = DisconnectEngines(); !s.ok()) {
      spdlog::warn("weight sync: leaving the old weight-update group: {}", std::string(s.message()));
    }
  }
  const config::Config& config = impl_->options.config;
  comm::WeightSenderOptions so;
  try {
    for (const nlohmann::json& e : request.at("engines")) {
      comm::EngineEndpoint endpoint;
      endpoint.host = e.at("host").get<std::string>();
      endpoint.port = e.at("port").get<int>();
      endpoint.num_gpus = e.value("num_gpus", 1);
      so.engines.push_back(endpoint);
    }
    so.master_address = request.value("master_address", std::string("127.0.0.1"));
    so.group_name = request.value("group_name", so.group_name);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(fmt::format("connect_engines: bad request: {}", e.what()));
  }
  if (so.engines.empty()) return absl::InvalidArgumentError("connect_engines: no engines");
  if (impl_->UseDisk()) {
    impl_->disk_engines = so.engines;
    spdlog::info("weight sync: disk transport ({} engine(s){})", so.engines.size(),
                 config.weight_sync.transport == "disk" ? "" : "; colocated on one GPU");
    return absl::OkStatus();
  }
  so.backend = impl_->UseIpc() ? "cuda_ipc" : impl_->options.device == "cuda" ? "nccl" : "gloo";
  so.device = impl_->options.device == "cuda" ? torch::Device("cuda:0") : torch::Device(torch::kCPU);
  so.bucket_bytes = config.weight_sync.buffer_size;
  so.timeout_s = 60.0 * config.cluster.distributed_timeout_minutes;
  SLIME_ASSIGN_OR_RETURN(impl_->sender, comm::WeightSender::Connect(std::move(so)));
  return absl::OkStatus();
}

StatusOr<nlohmann::json> TrainerWorker::SyncWeights(const std::string& weight_version) {
  SLIME_RETURN_IF_ERROR(impl_->CheckInit());
  SLIME_RETURN_IF_ERROR(impl_->EnsureResident());
  if (!impl_->disk_engines.empty()) return impl_->SyncFromDisk(weight_version);
  if (impl_->sender == nullptr) {
    return absl::FailedPreconditionError("sync_weights: connect_engines has not run");
  }
  comm::WeightSender& sender = *impl_->sender;
  const auto start = std::chrono::steady_clock::now();
  SLIME_RETURN_IF_ERROR(sender.PauseEngines());
  const model::DecoderModel& model = std::as_const(*impl_->trainer).model();
  StatusOr<comm::SyncStats> stats =
      sender.Send(model::NamedParameters(model.weights(), model.config()), weight_version);
  // Engines continue even after a failed bucket, so they never stay paused.
  Status resumed = sender.ContinueEngines();
  if (!stats.ok()) return stats.status();
  SLIME_RETURN_IF_ERROR(resumed);
  impl_->weights_version = impl_->synced_version = weight_version;
  SLIME_RETURN_IF_ERROR(impl_->trainer->OnWeightsSynced());
  return nlohmann::json{{"bytes", stats->bytes},
                        {"tensors", stats->tensors},
                        {"buckets", stats->buckets},
                        {"send_seconds", stats->seconds},
                        {"seconds", SecondsSince(start)},
                        {"gb_per_s", stats->gb_per_s()}};
}

// Disk transport: the weights as an HF directory (safetensors + the model's config.json) under
// weight_sync.disk_dir (default <run_dir>/weight_sync), then on every engine: pause, POST
// /update_weights_from_disk (the engine reloads and flushes its prefix cache), continue. The
// previous version's directory is removed unless weight_sync.disk_keep_files.
StatusOr<int64_t> TrainerWorker::Impl::WriteWeightsDir(const std::string& dir) {
  const config::Config& c = options.config;
  const model::DecoderModel& model = std::as_const(*trainer).model();
  SLIME_RETURN_IF_ERROR(model::SaveWeights(dir, model.weights(), model.config()));
  {
    std::ifstream in(c.model.hf_checkpoint + "/config.json", std::ios::binary);
    std::ofstream out(dir + "/config.json", std::ios::binary);
    out << in.rdbuf();
    if (!in || !out) {
      return absl::InternalError(fmt::format("weight sync: cannot copy {}/config.json to {}",
                                             c.model.hf_checkpoint, dir));
    }
  }
  int64_t bytes = 0;
  for (const model::NamedTensor& t : model::NamedParameters(model.weights(), model.config())) {
    bytes += t.tensor.numel() * t.tensor.element_size();
  }
  return bytes;
}

Status TrainerWorker::Impl::LoadOnEngine(const comm::EngineEndpoint& e, const std::string& dir,
                                         const std::string& version) {
  http::ClientOptions co;
  co.timeout = std::chrono::seconds(60 * options.config.cluster.distributed_timeout_minutes);
  http::Client client(e.host, e.port, co);
  const std::string where = fmt::format("engine {}:{}", e.host, e.port);
  auto post = [&](const std::string& path, const nlohmann::json& body) -> Status {
    SLIME_ASSIGN_OR_RETURN(http::Response r, client.Post(path, body.dump()));
    if (r.status != 200) return http::StatusFromHttp(r.status, where + " " + path, r.body);
    return absl::OkStatus();
  };
  SLIME_RETURN_IF_ERROR(post("/pause_generation", nlohmann::json::object()));
  Status updated = post("/update_weights_from_disk", {{"model_path", dir}, {"weight_version", version}});
  Status resumed = post("/continue_generation", nlohmann::json::object());
  SLIME_RETURN_IF_ERROR(updated);
  return resumed;
}

namespace {

void RemoveDir(const std::string& dir) {
  if (::nftw(dir.c_str(),
             [](const char* path, const struct stat*, int, struct FTW*) { return ::remove(path); },
             16, FTW_DEPTH | FTW_PHYS) != 0) {
    spdlog::warn("weight sync: could not remove {}", dir);
  }
}

}  // namespace

StatusOr<nlohmann::json> TrainerWorker::Impl::SyncFromDisk(const std::string& version) {
  const config::Config& c = options.config;
  const auto start = std::chrono::steady_clock::now();
  const std::string dir = fmt::format("{}/v{}", DiskRoot(), version);
  SLIME_ASSIGN_OR_RETURN(int64_t bytes, WriteWeightsDir(dir));
  const double write_s = SecondsSince(start);
  for (const comm::EngineEndpoint& e : disk_engines) {
    SLIME_RETURN_IF_ERROR(LoadOnEngine(e, dir, version));
  }
  if (!last_disk_dir.empty() && last_disk_dir != dir && !c.weight_sync.disk_keep_files) {
    RemoveDir(last_disk_dir);
  }
  last_disk_dir = dir;
  weights_version = synced_version = version;
  SLIME_RETURN_IF_ERROR(trainer->OnWeightsSynced());
  const double seconds = SecondsSince(start);
  return nlohmann::json{{"bytes", bytes},
                        {"tensors", 0},
                        {"buckets", 0},
                        {"transport", "disk"},
                        {"write_seconds", write_s},
                        {"seconds", seconds},
                        {"gb_per_s", seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0}};
}

StatusOr<nlohmann::json> TrainerWorker::ResyncEngine(const nlohmann::json& request) {
  SLIME_RETURN_IF_ERROR(impl_->CheckInit());
  if (impl_->weights_version.empty()) {
    return absl::FailedPreconditionError(
        "resync_engine: the engines were never given weights (sync_weights has not run)");
  }
  comm::EngineEndpoint e;
  try {
    e.host = request.at("host").get<std::string>();
    e.port = request.at("port").get<int>();
  } catch (const nlohmann::json::exception& ex) {
    return absl::InvalidArgumentError(fmt::format("resync_engine: bad request: {}", ex.what()));
  }
  const auto start = std::chrono::steady_clock::now();
  const std::string version = impl_->weights_version;
  // The disk transport's directory of this version is still there: load it as it is.
  const bool reuse = !impl_->last_disk_dir.empty() && version == impl_->synced_version;
  const std::string dir =
      reuse ? impl_->last_disk_dir : fmt::format("{}/resync-v{}", impl_->DiskRoot(), version);
  int64_t bytes = 0;
  if (!reuse) {
    // An offloaded trainer (colocated, mid-rollout) comes back for the write and leaves again.
    const bool was_offloaded = impl_->offloader.offloaded();
    SLIME_RETURN_IF_ERROR(impl_->EnsureResident());
    StatusOr<int64_t> written = impl_->WriteWeightsDir(dir);
    if (was_offloaded) SLIME_RETURN_IF_ERROR(ReleaseMemory().status());
    SLIME_ASSIGN_OR_RETURN(bytes, std::move(written));
  }
  Status loaded = impl_->LoadOnEngine(e, dir, version);
  if (!reuse) RemoveDir(dir);
  SLIME_RETURN_IF_ERROR(loaded);
  spdlog::info("weight sync: engine {}:{} resynced to weight_version {} from {} in {:.2f} s",
               e.host, e.port, version, dir, SecondsSince(start));
  return nlohmann::json{{"weight_version", version},
                        {"dir", dir},
                        {"bytes", bytes},
                        {"seconds", SecondsSince(start)}};
}

StatusOr<nlohmann::json> TrainerWorker::ReleaseMemory() {
  SLIME_RETURN_IF_ERROR(impl_->CheckInit());
  const auto start = std::chrono::steady_clock::now();
  if (!impl_->offloader.offloaded()) {
    SLIME_RETURN_IF_ERROR(impl_->offloader.Offload(impl_->DeviceTensors()));
#ifdef SLIME_WITH_CUDA
    if (impl_->options.device == "cuda") c10::cuda::CUDACachingAllocator::emptyCache();
#endif
  }
  return nlohmann::json{{"bytes", impl_->offloader.bytes()}, {"seconds", SecondsSince(start)}};
}

StatusOr<nlohmann::json> TrainerWorker::ResumeMemory() {
  SLIME_RETURN_IF_ERROR(impl_->CheckInit());
  const auto start = std::chrono::steady_clock::now();
  const int64_t bytes = impl_->offloader.offloaded() ? impl_->offloader.bytes() : 0;
  SLIME_RETURN_IF_ERROR(impl_->offloader.Onload());
  return nlohmann::json{{"bytes", bytes}, {"seconds", SecondsSince(start)}};
}

Status TrainerWorker::DisconnectEngines() {
  impl_->disk_engines.clear();
  if (impl_->sender == nullptr) return absl::OkStatus();
  Status s = impl_->sender->Disconnect();
  impl_->sender.reset();
  return s;
}

StatusOr<nlohmann::json> TrainerWorker::ExportHf(const std::string& dir) {
  SLIME_RETURN_IF_ERROR(impl_->CheckInit());
  const config::Config& config = impl_->options.config;
  if (!config.checkpoint.save) {
    return absl::FailedPreconditionError("export_hf: needs checkpoint.save (it converts the newest checkpoint)");
  }
  train::HfExportOptions eo;
  eo.from = *config.checkpoint.save;
  eo.to_hf = dir;
  eo.tokenizer = config.model.hf_checkpoint;
  SLIME_ASSIGN_OR_RETURN(std::string from, train::ExportCheckpointToHf(eo));
  return nlohmann::json{{"dir", dir}, {"from", from}};
}

}  // namespace slime::workers
