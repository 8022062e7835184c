// TrainerWorker (include/slime/workers/workers.h).
#include <torch/torch.h>
#ifdef SLIME_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <ftw.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <utility>

#include "fmt/ranges.h"

#include "fmt/format.h"
#include "slime/common/atomic_file.h"
#include "slime/comm/process_group.h"
#include "slime/comm/weight_checksum.h"
#include "slime/comm/tensor_parallel_group.h"
#include "slime/comm/weight_sender.h"
#include "slime/http/client.h"
#include "slime/model/checkpoint.h"
#include "slime/model/decoder.h"
#include "slime/model/offload.h"
#include "slime/model/weights.h"
#include "slime/train/checkpoint.h"
#include "slime/train/hf_export.h"
#include "slime/train/optimizer.h"
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

void ReplaceAll(std::string& s, const std::string& key, const std::string& value) {
  for (size_t pos = s.find(key); pos != std::string::npos; pos = s.find(key, pos + value.size())) {
    s.replace(pos, key.size(), value);
  }
}

// debug.save_debug_train_data's document (workers.h, "Train data dumps").
nlohmann::json TrainDataJson(int64_t rollout_id, const WorkerOptions& o, int tp_rank, int dp_rank,
                             int pp_rank, int tp_size, int dp_size, int pp_size,
                             const data::RolloutBatch& batch,
                             const train::TrainRolloutResult& result) {
  nlohmann::json samples = nlohmann::json::array();
  for (const train::TrainedSample& t : result.trained) {
    const data::TrainSample& s = batch.samples[static_cast<size_t>(t.index)];
    nlohmann::json j = {{"index", t.index},
                        {"step_in_rollout", t.step_in_rollout},
                        {"micro_batch", t.micro_batch},
                        {"tokens", s.tokens},
                        {"prompt_length", s.prompt_length},
                        {"response_length", s.response_length},
                        {"loss_mask", s.loss_mask},
                        {"reward", s.reward},
                        {"raw_reward", s.raw_reward},
                        {"rollout_id", s.rollout_id},
                        {"truncated", s.truncated}};
    auto put = [&j](const char* key, const std::vector<float>& v) {
      if (!v.empty()) j[key] = v;
    };
    put("rollout_log_probs", s.rollout_log_probs);
    put("teacher_log_probs", s.teacher_log_probs);
    put("advantages", t.advantages);
    put("returns", t.returns);
    put("values", t.values);
    put("log_probs", t.log_probs);
    put("ref_log_probs", t.ref_log_probs);
    put("opd_reverse_kl", t.opd_reverse_kl);
    samples.push_back(std::move(j));
  }
  nlohmann::json steps = nlohmann::json::array();
  for (const train::TrainStepMetrics& m : result.steps) steps.push_back(StepToJson(m));
  return {{"format", "slime-cpp train data"},
          {"version", 1},
          {"rollout_id", rollout_id},
          {"rank", o.rank},
          {"world_size", o.world_size},
          {"tp_rank", tp_rank},
          {"dp_rank", dp_rank},
          {"pp_rank", pp_rank},
          {"tp_size", tp_size},
          {"dp_size", dp_size},
          {"pp_size", pp_size},
          {"temperature", batch.temperature},
          {"batch_samples", batch.samples.size()},
          {"dropped_samples", result.dropped_samples},
          {"steps", std::move(steps)},
          {"rollout_values", result.rollout_values},
          {"samples", std::move(samples)}};
}

}  // namespace

struct TrainerWorker::Impl {
  WorkerOptions options;
  std::unique_ptr<train::Trainer> trainer;
  std::unique_ptr<comm::WeightSender> sender;       // distributed transport
  std::vector<comm::EngineEndpoint> disk_engines;   // disk transport
  std::vector<comm::EngineEndpoint> engines;        // every connected engine (either transport)
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

  // Megatron's rank layout (workers.h): world_size = pp_size × dp_size × tp_size, tp fastest:
  // rank = pp_rank·(dp_size·tp_size) + dp_rank·tp_size + tp_rank. `layout` is the error when
  // train.tensor_model_parallel_size × train.pipeline_model_parallel_size does not divide
  // world_size, or either is < 1 (returned by every call that needs the layout).
  int tp_size = 1, dp_size = 1, pp_size = 1, tp_rank = 0, dp_rank = 0, pp_rank = 0;
  int ep_size = 1;  // train.expert_model_parallel_size (divides dp_size)
  Status layout;
  void ComputeLayout() {
    const int tp = options.config.train.tensor_model_parallel_size;
    const int pp = options.config.train.pipeline_model_parallel_size;
    if (tp < 1 || pp < 1 || options.world_size < 1 || options.world_size % (tp * pp) != 0 ||
        options.rank < 0 || options.rank >= options.world_size) {
      layout = absl::InvalidArgumentError(fmt::format(
          "trainer rank {} of {}: train.tensor_model_parallel_size ({}) × "
          "train.pipeline_model_parallel_size ({}) must be >= 1 and divide the number of "
          "trainer processes, {} (cluster.actor_num_nodes × cluster.actor_num_gpus_per_node)",
          options.rank, options.world_size, tp, pp, options.world_size));
      return;
    }
    tp_size = tp;
    pp_size = pp;
    dp_size = options.world_size / (tp * pp);
    const int ep = options.config.train.expert_model_parallel_size;
    if (ep < 1 || dp_size % ep != 0) {
      layout = absl::InvalidArgumentError(fmt::format(
          "trainer rank {} of {}: train.expert_model_parallel_size ({}) must be >= 1 and divide "
          "the data-parallel size {}",
          options.rank, options.world_size, ep, dp_size));
      return;
    }
    ep_size = ep;
    tp_rank = options.rank % tp;
    dp_rank = (options.rank / tp) % dp_size;
    pp_rank = options.rank / (tp * dp_size);
  }
  // The weight source: tensor-parallel rank 0 of pipeline stage 0 of data-parallel rank 0
  // (global rank 0) sends the engines full HF tensors. The weight exporters are the ranks of DP
  // rank 0 (tp_size × pp_size of them): each tensor is all-gathered in the TP group and sent by
  // its stage to stage 0 (Trainer::FullParameter) as the source needs it.
  // With expert parallelism the exporters are the ranks of DP ranks 0..EP-1 (the EP group of DP
  // rank 0: each sends its experts to the others, Trainer::FullParameter).
  bool WeightSource() const { return tp_rank == 0 && dp_rank == 0 && pp_rank == 0; }
  bool Exporter() const { return dp_rank < ep_size; }
  int Exporters() const { return tp_size * pp_size * ep_size; }

  // The trainer's process groups, formed before Init by OpenGroups (group leaders) and
  // JoinGroups (every rank), each kind only where it has more than one rank: the TP group (the
  // tp_size ranks of this stage and dp_rank), in which the model's parallel layers run; the DP
  // group (the dp_size ranks of this stage and tp_rank), in which gradients and metric sums are
  // all-reduced; the PP group (the pp_size stages of this dp_rank and tp_rank), which carries
  // the pipeline schedule's sends and receives, the stages' sums and broadcasts, the pipelined
  // save and the weight export to stage 0; with expert parallelism (EP =
  // train.expert_model_parallel_size, carved out of DP: ep_rank = dp_rank % EP, edp_rank =
  // dp_rank / EP) the EP group (the EP ranks of this stage and tp_rank with dp ranks
  // b·EP .. b·EP + EP - 1), in which the MoE layers' all-to-alls run, and the expert-DP group
  // (the DP / EP ranks with this ep_rank), in which the experts' gradients are summed. Gloo on
  // CPU, NCCL on CUDA. A group's index among those of its kind (GroupIndex) is its place in
  // join_groups' request and its name's suffix: slime_trainer_tp<pp·DP + dp>,
  // slime_trainer_dp<pp·TP + tp>, slime_trainer_pp<dp·TP + tp>, slime_trainer_ep<(pp·DP/EP +
  // dp/EP)·TP + tp>, slime_trainer_edp<(pp·EP + ep)·TP + tp> — in each kind the leaders' global
  // ranks ascend with the index (at PP = 1 the names and indices are those of the TP × DP
  // layout).
  enum class Kind { kTp, kDp, kPp, kEp, kEdp };
  static constexpr Kind kKinds[5] = {Kind::kTp, Kind::kDp, Kind::kPp, Kind::kEp, Kind::kEdp};
  static const char* Key(Kind k) {
    switch (k) {
      case Kind::kTp:
        return "tp";
      case Kind::kDp:
        return "dp";
      case Kind::kPp:
        return "pp";
      case Kind::kEp:
        return "ep";
      case Kind::kEdp:
        return "edp";
    }
    return "?";
  }
  static const char* KindName(Kind k) {
    switch (k) {
      case Kind::kTp:
        return "tensor-parallel";
      case Kind::kDp:
        return "data-parallel";
      case Kind::kPp:
        return "pipeline-parallel";
      case Kind::kEp:
        return "expert-parallel";
      case Kind::kEdp:
        return "expert-data-parallel";
    }
    return "?";
  }
  std::shared_ptr<comm::ProcessGroup> tp_group;
  std::shared_ptr<comm::ProcessGroup> dp_group;
  std::shared_ptr<comm::ProcessGroup> pp_group;
  std::shared_ptr<comm::ProcessGroup> ep_group;
  std::shared_ptr<comm::ProcessGroup> edp_group;
  std::shared_ptr<comm::ProcessGroup>& Group(Kind k) {
    switch (k) {
      case Kind::kTp:
        return tp_group;
      case Kind::kDp:
        return dp_group;
      case Kind::kPp:
        return pp_group;
      case Kind::kEp:
        return ep_group;
      case Kind::kEdp:
        return edp_group;
    }
    return tp_group;
  }
  const std::shared_ptr<comm::ProcessGroup>& Group(Kind k) const {
    return const_cast<Impl*>(this)->Group(k);
  }
  int GroupSize(Kind k) const {
    switch (k) {
      case Kind::kTp:
        return tp_size;
      case Kind::kDp:
        return dp_size;
      case Kind::kPp:
        return pp_size;
      case Kind::kEp:
        return ep_size;
      case Kind::kEdp:
        return ep_size > 1 ? dp_size / ep_size : 1;  // no EP: the DP group
    }
    return 1;
  }
  int GroupRank(Kind k) const {
    switch (k) {
      case Kind::kTp:
        return tp_rank;
      case Kind::kDp:
        return dp_rank;
      case Kind::kPp:
        return pp_rank;
      case Kind::kEp:
        return dp_rank % ep_size;
      case Kind::kEdp:
        return ep_size > 1 ? dp_rank / ep_size : 0;
    }
    return 0;
  }
  int GroupIndex(Kind k) const {
    switch (k) {
      case Kind::kTp:
        return pp_rank * dp_size + dp_rank;
      case Kind::kDp:
        return pp_rank * tp_size + tp_rank;
      case Kind::kPp:
        return dp_rank * tp_size + tp_rank;
      case Kind::kEp:
        return (pp_rank * (dp_size / ep_size) + dp_rank / ep_size) * tp_size + tp_rank;
      case Kind::kEdp:
        return (pp_rank * ep_size + dp_rank % ep_size) * tp_size + tp_rank;
    }
    return 0;
  }
  comm::ProcessGroupOptions GroupOptions(Kind k) const {
    comm::ProcessGroupOptions o;
    o.world_size = GroupSize(k);
    o.rank = GroupRank(k);
    o.group_name = fmt::format("slime_trainer_{}{}", Key(k), GroupIndex(k));
    o.backend = options.device == "cuda" ? "nccl" : "gloo";
    o.timeout_s = 60.0 * options.config.cluster.distributed_timeout_minutes;
    return o;
  }
  std::string LayoutName() const {
    return fmt::format("tensor-parallel {} × data-parallel {} × pipeline-parallel {}{}", tp_size,
                       dp_size, pp_size,
                       ep_size > 1 ? fmt::format(" (expert-parallel {})", ep_size) : "");
  }
  Status CheckGroups() const {
    for (const Kind k : kKinds) {
      const std::shared_ptr<comm::ProcessGroup>& g = Group(k);
      if (GroupSize(k) == 1 || (g != nullptr && g->joined())) continue;
      return absl::FailedPreconditionError(fmt::format(
          "trainer rank {} of {} ({}): the {} group is not formed (open_groups on every rank, "
          "then join_groups on every rank, before init)",
          options.rank, options.world_size, LayoutName(), KindName(k)));
    }
    return absl::OkStatus();
  }

  // Weight export at TP > 1 or PP > 1: parameter i's full tensor is an all-gather in the TP
  // group and, at PP > 1, a send from its stage to stage 0 (Trainer::FullParameter), so every
  // exporter (every rank of DP rank 0) fetches every parameter in order. The source fetches
  // inside the transfer (through `fetch`); when a transfer stops early the source finishes the
  // sequence (FinishGathers) so its peers are not left waiting in a collective. The peers run
  // FinishGathers(0) and drop the tensors.
  Status FinishGathers(size_t from) {
    if (Exporters() == 1) return absl::OkStatus();
    const size_t n = std::as_const(*trainer).FullParameterShapes().size();
    for (size_t i = from; i < n; ++i) SLIME_RETURN_IF_ERROR(trainer->FullParameter(i).status());
    return absl::OkStatus();
  }
  // `value` of the source, told to the other exporters (every exporter calls it): at PP > 1 a
  // sum over the PP group of stage 0's value (so each stage has its stage-0 peer's), then at
  // TP > 1 a sum over the TP group of TP rank 0's. One exporter: `value`.
  StatusOr<bool> FromSource(bool value) {
    double v = value ? 1.0 : 0.0;
    for (const Kind k : {Kind::kPp, Kind::kTp, Kind::kEp}) {
      if (GroupSize(k) == 1) continue;
      torch::Tensor flag = torch::full({1}, GroupRank(k) == 0 ? v : 0.0, torch::kFloat64);
      SLIME_RETURN_IF_ERROR(Group(k)->AllReduceSum(flag, "weight sync: the source's decision"));
      v = flag.item<double>();
    }
    return v > 0.5;
  }
  // After the engines took the weights (every rank): the version they are, and the trainer's
  // keep_old_actor queue, which every rank keeps for its own shard and micro-batches.
  Status WeightsSynced(const std::string& version) {
    weights_version = synced_version = version;
    return trainer->OnWeightsSynced();
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
  StatusOr<nlohmann::json> SyncFromDisk(const std::string& version,
                                        const comm::TensorFetchFn& fetch, comm::InFlight in_flight);
  // The source's side of SyncWeights (disk or the weight-update group).
  StatusOr<nlohmann::json> SendFromSource(const std::string& version,
                                          const comm::TensorFetchFn& fetch,
                                          comm::InFlight in_flight);
  std::string DiskRoot() const {
    const config::Config& c = options.config;
    return c.weight_sync.disk_dir.value_or(c.cluster.run_dir + "/weight_sync");
  }
  // The weights as an HF directory (safetensors + the model's config.json), the full tensors
  // from `fetch` (Trainer::FullParameter; at TP > 1 each comes to the CPU as it is gathered, so
  // the device holds one gathered tensor at a time); returns its bytes.
  StatusOr<int64_t> WriteWeightsDir(const std::string& dir, const comm::TensorFetchFn& fetch);
  // Pause (as `in_flight` says) → /update_weights_from_disk → continue on one engine.
  Status LoadOnEngine(const comm::EngineEndpoint& e, const std::string& dir,
                      const std::string& version, comm::InFlight in_flight);

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
  impl->ComputeLayout();
  return std::unique_ptr<TrainerWorker>(new TrainerWorker(std::move(impl)));
}

StatusOr<nlohmann::json> TrainerWorker::Init(const nlohmann::json& request) {
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
  SLIME_RETURN_IF_ERROR(impl_->layout);
  SLIME_RETURN_IF_ERROR(impl_->CheckGroups());
  if (impl_->tp_size > 1) {
    to.tp_group = std::make_shared<comm::ProcessGroupTensorParallel>(impl_->tp_group);
  }
  if (impl_->pp_size > 1) {
    to.pp_group = std::make_shared<comm::ProcessGroupPipelineParallel>(impl_->pp_group);
  }
  if (impl_->ep_size > 1) {  // expert parallelism: the MoE all-to-alls and the experts' sums
    std::shared_ptr<comm::ProcessGroup> ep = impl_->ep_group;
    to.ep_group = std::make_shared<comm::ProcessGroupExpertParallel>(ep);
    to.ep_all_reduce = [ep](torch::Tensor& t) -> Status {
      return ep->AllReduceSum(t, "trainer expert-parallel sum");
    };
    to.edp_size = impl_->dp_size / impl_->ep_size;
    if (to.edp_size > 1) {
      std::shared_ptr<comm::ProcessGroup> edp = impl_->edp_group;
      to.edp_all_reduce = [edp](torch::Tensor& t) -> Status {
        return edp->AllReduceSum(t, "trainer expert gradient sum");
      };
    }
  }
  to.dp_size = impl_->dp_size;
  to.dp_rank = impl_->dp_rank;
  if (impl_->dp_size > 1) {
    std::shared_ptr<comm::ProcessGroup> dp = impl_->dp_group;
    to.dp_all_reduce = [dp](torch::Tensor& t) -> Status {
      return dp->AllReduceSum(t, "trainer data-parallel sum");
    };
    // train.overlap_grad_reduce: gradient buckets posted from the backward pass's hooks.
    to.dp_all_reduce_async = [dp](torch::Tensor& t) {
      return dp->AllReduceSumAsync(t, "trainer data-parallel gradient bucket");
    };
    // ZeRO-1 (train.use_distributed_optimizer): the group's reduce-scatter and all-gather (NCCL's
    // own; on Gloo the reduce-scatter is an all-reduce and a slice, process_group.h).
    if (config.train.use_distributed_optimizer) {
      to.dp_reduce_scatter = [dp](const torch::Tensor& in, torch::Tensor& out) -> Status {
        SLIME_ASSIGN_OR_RETURN(torch::Tensor part,
                               dp->ReduceScatterSum(in, "trainer ZeRO-1 gradient reduce-scatter"));
        out.copy_(part);
        return absl::OkStatus();
      };
      to.dp_all_gather = [dp](const torch::Tensor& in, torch::Tensor& out) -> Status {
        SLIME_ASSIGN_OR_RETURN(torch::Tensor all,
                               dp->AllGather(in, 0, "trainer ZeRO-1 parameter all-gather"));
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
  int64_t num_parameters = 0;  // the full model's, also at TP > 1
  for (const model::NamedTensor& t : std::as_const(*impl_->trainer).FullParameterShapes()) {
    num_parameters += t.tensor.numel();
  }
  reply["num_parameters"] = num_parameters;
  reply["tp_size"] = impl_->tp_size;
  reply["dp_size"] = impl_->dp_size;
  reply["pp_size"] = impl_->pp_size;
  std::optional<std::string> load = config.checkpoint.load;
  std::optional<int64_t> ckpt_step;
  if (config.checkpoint.ckpt_step) ckpt_step = *config.checkpoint.ckpt_step;
  if (request.contains("load")) {
    if (!request["load"].is_string()) {
      return absl::InvalidArgumentError("init: \"load\" must be a directory name");
    }
    load = request["load"].get<std::string>();  // the newest checkpoint, not a chosen step
    ckpt_step.reset();
  }
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

StatusOr<nlohmann::json> TrainerWorker::OpenGroups(const nlohmann::json& request) {
  Impl& impl = *impl_;
  SLIME_RETURN_IF_ERROR(impl.layout);
  const WorkerOptions& o = impl.options;
  if (impl.trainer != nullptr) {
    return absl::FailedPreconditionError("open_groups: init already ran (the groups come first)");
  }
  if (o.world_size < 2) {
    return absl::FailedPreconditionError(
        "open_groups: this trainer is the only one (world_size 1)");
  }
  nlohmann::json reply = nlohmann::json::object();
  const std::string address = request.value("master_address", std::string("127.0.0.1"));
  for (const Impl::Kind k : Impl::kKinds) {
    const bool leader = impl.GroupSize(k) > 1 && impl.GroupRank(k) == 0;
    if (!leader) continue;
    std::shared_ptr<comm::ProcessGroup>& group = impl.Group(k);
    if (group != nullptr) return absl::AlreadyExistsError("open_groups: already open");
    comm::ProcessGroupOptions po = impl.GroupOptions(k);
    po.master_address = address;
    SLIME_ASSIGN_OR_RETURN(group, comm::ProcessGroup::Open(po));
    reply[Impl::Key(k)] = {{"master_address", address}, {"master_port", group->port()}};
  }
  return reply;
}

StatusOr<nlohmann::json> TrainerWorker::JoinGroups(const nlohmann::json& request) {
  Impl& impl = *impl_;
  SLIME_RETURN_IF_ERROR(impl.layout);
  const WorkerOptions& o = impl.options;
  const auto start = std::chrono::steady_clock::now();
  std::string backend = "none";
  // The TP group first, then the DP group, then the PP group, on every rank: each Join waits for
  // its group's ranks only, and every rank takes them in the same order, so no rank waits on a
  // peer that waits on it.
  for (const Impl::Kind k : Impl::kKinds) {
    if (impl.GroupSize(k) == 1) continue;
    const bool leader = impl.GroupRank(k) == 0;
    const int index = impl.GroupIndex(k);  // which group of its kind
    const char* key = Impl::Key(k);
    std::shared_ptr<comm::ProcessGroup>& group = impl.Group(k);
    if (!leader) {
      if (group != nullptr) return absl::AlreadyExistsError("join_groups: already joined");
      comm::ProcessGroupOptions po = impl.GroupOptions(k);
      try {
        const nlohmann::json& e = request.at(key).at(index);
        po.master_address = e.at("master_address").get<std::string>();
        po.master_port = e.at("master_port").get<int>();
      } catch (const nlohmann::json::exception& e) {
        return absl::InvalidArgumentError(
            fmt::format("join_groups: bad request for trainer rank {} ({}[{}]; {}): {}", o.rank,
                        key, index, impl.LayoutName(), e.what()));
      }
      SLIME_ASSIGN_OR_RETURN(group, comm::ProcessGroup::Open(po));
    } else if (group == nullptr) {
      return absl::FailedPreconditionError(fmt::format(
          "join_groups: trainer rank {} leads {} group {} and must run open_groups first", o.rank,
          Impl::KindName(k), index));
    }
    if (group->world_size() != impl.GroupSize(k)) {  // CHECK-worthy, but a Status is cheap
      return absl::InternalError(fmt::format("join_groups: trainer rank {}: the {} group has {} "
                                             "ranks, the layout ({}) says {}",
                                             o.rank, Impl::KindName(k), group->world_size(),
                                             impl.LayoutName(), impl.GroupSize(k)));
    }
    SLIME_RETURN_IF_ERROR(group->Join());
    backend = group->backend();
  }
  return nlohmann::json{{"rank", o.rank},          {"world_size", o.world_size},
                        {"tp_size", impl.tp_size}, {"dp_size", impl.dp_size},
                        {"pp_size", impl.pp_size}, {"tp_rank", impl.tp_rank},
                        {"dp_rank", impl.dp_rank}, {"pp_rank", impl.pp_rank},
                        {"backend", backend},      {"seconds", SecondsSince(start)}};
}

StatusOr<nlohmann::json> TrainerWorker::Train(int64_t rollout_id, const data::RolloutBatch& batch) {
  SLIME_RETURN_IF_ERROR(impl_->CheckInit());
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
  if (const std::optional<std::string>& dump = impl_->options.config.debug.save_debug_train_data) {
    const Impl& i = *impl_;
    std::string path = *dump;
    ReplaceAll(path, "{rollout_id}", std::to_string(rollout_id));
    ReplaceAll(path, "{rank}", std::to_string(i.options.rank));
    const nlohmann::json doc = TrainDataJson(rollout_id, i.options, i.tp_rank, i.dp_rank,
                                             i.pp_rank, i.tp_size, i.dp_size, i.pp_size, batch,
                                             result);
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
    Status written = WriteFileAtomically(path, doc.dump() + "\n");
    if (!written.ok()) {
      return Status(written.code(), fmt::format("debug.save_debug_train_data: {}",
                                                std::string(written.message())));
    }
  }
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
  // Data parallel without sharded state: every DP rank holds the same weights and optimizer
  // state, so DP rank 0 writes the checkpoint alone. With the distributed optimizer (ZeRO-1) the
  // save is collective: every rank gathers the shards, rank 0 writes (Trainer::Save). At TP > 1
  // the TP ranks of DP rank 0 all take part (the shards are gathered), TP rank 0 writes; at
  // PP > 1 the stages of DP rank 0 all take part (each sends its parameters to stage 0), stage 0
  // writes. Global rank 0 answers with the directory.
  const bool sharded = std::as_const(*impl_->trainer).optimizer().distributed();
  // With expert parallelism the EP ranks of DP rank 0's group take part (each brings its experts).
  if (!impl_->Exporter() && !sharded) {
    return nlohmann::json{{"dir", ""}, {"seconds", 0.0}, {"written", false}};
  }
  SLIME_RETURN_IF_ERROR(impl_->EnsureResident());
  const auto start = std::chrono::steady_clock::now();
  SLIME_ASSIGN_OR_RETURN(std::string dir,
                         impl_->trainer->Save(*save, rollout_id, extra_state.dump()));
  const train::Trainer::BackgroundSaveTimes previous = impl_->trainer->last_background_save();
  nlohmann::json reply = {{"dir", dir},
                          {"seconds", SecondsSince(start)},
                          {"background", impl_->options.config.checkpoint.async_save},
                          {"wait_seconds", previous.wait_seconds},
                          {"write_seconds", previous.write_seconds}};
  if (dir.empty() || impl_->tp_rank != 0 || impl_->pp_rank != 0 ||
      impl_->dp_rank != 0) {  // it took part; rank 0 wrote
    reply["dir"] = "";
    reply["written"] = false;
  }
  return reply;
}

StatusOr<nlohmann::json> TrainerWorker::WaitForSave() {
  if (impl_->trainer == nullptr) return nlohmann::json{{"seconds", 0.0}, {"wait_seconds", 0.0}};
  SLIME_RETURN_IF_ERROR(impl_->trainer->WaitForSave());
  const train::Trainer::BackgroundSaveTimes t = impl_->trainer->last_background_save();
  return nlohmann::json{{"seconds", t.write_seconds}, {"wait_seconds", t.wait_seconds}};
}

Status TrainerWorker::ConnectEngines(const nlohmann::json& request) {
  SLIME_RETURN_IF_ERROR(impl_->CheckInit());
  if (!impl_->WeightSource()) {
    return absl::FailedPreconditionError(fmt::format(
        "connect_engines: trainer rank {} asked; rank 0 (tensor-parallel rank 0 of pipeline "
        "stage 0 of data-parallel rank 0) sends the weights",
        impl_->options.rank));
  }
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
  impl_->engines = so.engines;
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
  so.bearer_token = config::EngineAccessToken(config.cluster);
  SLIME_ASSIGN_OR_RETURN(impl_->sender, comm::WeightSender::Connect(std::move(so)));
  return absl::OkStatus();
}

StatusOr<nlohmann::json> TrainerWorker::SyncWeights(const std::string& weight_version,
                                                    comm::InFlight in_flight) {
  SLIME_RETURN_IF_ERROR(impl_->CheckInit());
  SLIME_RETURN_IF_ERROR(impl_->EnsureResident());
  Impl& impl = *impl_;
  const auto start = std::chrono::steady_clock::now();
  if (!impl.Exporter()) {
    // Its weights equal DP rank 0's: nothing to send, only its own keep_old_actor queue.
    SLIME_RETURN_IF_ERROR(impl.WeightsSynced(weight_version));
    return nlohmann::json{{"source", false}, {"seconds", SecondsSince(start)}};
  }
  if (!impl.WeightSource()) {
    // A TP peer or a later stage of the source: every parameter's gather / send, in the
    // source's order.
    SLIME_RETURN_IF_ERROR(impl.FinishGathers(0));
    SLIME_RETURN_IF_ERROR(impl.WeightsSynced(weight_version));
    return nlohmann::json{{"source", false}, {"seconds", SecondsSince(start)}};
  }
  size_t next = 0;  // parameters gathered so far
  train::Trainer* trainer = impl.trainer.get();
  comm::TensorFetchFn fetch = [trainer, &next](size_t i) -> StatusOr<torch::Tensor> {
    next = i + 1;
    return trainer->FullParameter(i);
  };
  StatusOr<nlohmann::json> sent = impl.SendFromSource(weight_version, fetch, in_flight);
  Status finished = impl.FinishGathers(next);  // the TP peers wait in the remaining gathers
  if (!sent.ok()) return sent.status();
  SLIME_RETURN_IF_ERROR(finished);
  SLIME_RETURN_IF_ERROR(impl.WeightsSynced(weight_version));
  (*sent)["seconds"] = SecondsSince(start);
  return sent;
}

StatusOr<nlohmann::json> TrainerWorker::Impl::SendFromSource(const std::string& version,
                                                             const comm::TensorFetchFn& fetch,
                                                             comm::InFlight in_flight) {
  if (!disk_engines.empty()) return SyncFromDisk(version, fetch, in_flight);
  if (sender == nullptr) {
    return absl::FailedPreconditionError("sync_weights: connect_engines has not run");
  }
  SLIME_RETURN_IF_ERROR(sender->PauseEngines(in_flight));
  StatusOr<comm::SyncStats> stats =
      sender->Send(std::as_const(*trainer).FullParameterShapes(), fetch, version);
  // Engines continue even after a failed bucket, so they never stay paused.
  Status resumed = sender->ContinueEngines();
  if (!stats.ok()) return stats.status();
  SLIME_RETURN_IF_ERROR(resumed);
  return nlohmann::json{{"source", true},
                        {"bytes", stats->bytes},
                        {"tensors", stats->tensors},
                        {"buckets", stats->buckets},
                        {"send_seconds", stats->seconds},
                        {"gb_per_s", stats->gb_per_s()}};
}

// Disk transport: the weights as an HF directory (safetensors + the model's config.json) under
// weight_sync.disk_dir (default <run_dir>/weight_sync), then on every engine: pause, POST
// /update_weights_from_disk (the engine reloads and flushes its prefix cache), continue. The
// previous version's directory is removed unless weight_sync.disk_keep_files.
StatusOr<int64_t> TrainerWorker::Impl::WriteWeightsDir(const std::string& dir,
                                                       const comm::TensorFetchFn& fetch) {
  const config::Config& c = options.config;
  std::vector<model::NamedTensor> tensors = std::as_const(*trainer).FullParameterShapes();
  int64_t bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    SLIME_ASSIGN_OR_RETURN(torch::Tensor full, fetch(i));
    // At TP = 1 and PP = 1 the parameter itself (WriteCheckpoint copies what it writes);
    // otherwise the gathered or received tensor goes to the CPU now, so the device holds one at
    // a time.
    tensors[i].tensor = Exporters() > 1 ? full.to(torch::kCPU) : full;
    bytes += full.numel() * full.element_size();
  }
  SLIME_RETURN_IF_ERROR(model::WriteCheckpoint(dir, tensors));
  {
    std::ifstream in(c.model.hf_checkpoint + "/config.json", std::ios::binary);
    std::ofstream out(dir + "/config.json", std::ios::binary);
    out << in.rdbuf();
    if (!in || !out) {
      return absl::InternalError(fmt::format("weight sync: cannot copy {}/config.json to {}",
                                             c.model.hf_checkpoint, dir));
    }
  }
  return bytes;
}

Status TrainerWorker::Impl::LoadOnEngine(const comm::EngineEndpoint& e, const std::string& dir,
                                         const std::string& version, comm::InFlight in_flight) {
  http::ClientOptions co;
  co.timeout = std::chrono::seconds(60 * options.config.cluster.distributed_timeout_minutes);
  co.bearer_token = config::EngineAccessToken(options.config.cluster);
  http::Client client(e.host, e.port, co);
  const std::string where = fmt::format("engine {}:{}", e.host, e.port);
  auto post = [&](const std::string& path, const nlohmann::json& body) -> Status {
    SLIME_ASSIGN_OR_RETURN(http::Response r, client.Post(path, body.dump()));
    if (r.status != 200) return http::StatusFromHttp(r.status, where + " " + path, r.body);
    return absl::OkStatus();
  };
  const nlohmann::json pause = in_flight == comm::InFlight::kKeep
                                  ? nlohmann::json{{"mode", "retract"}}
                                  : nlohmann::json::object();
  SLIME_RETURN_IF_ERROR(post("/pause_generation", pause));
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

StatusOr<nlohmann::json> TrainerWorker::Impl::SyncFromDisk(const std::string& version,
                                                           const comm::TensorFetchFn& fetch,
                                                           comm::InFlight in_flight) {
  const config::Config& c = options.config;
  const auto start = std::chrono::steady_clock::now();
  const std::string dir = fmt::format("{}/v{}", DiskRoot(), version);
  SLIME_ASSIGN_OR_RETURN(int64_t bytes, WriteWeightsDir(dir, fetch));
  const double write_s = SecondsSince(start);
  for (const comm::EngineEndpoint& e : disk_engines) {
    SLIME_RETURN_IF_ERROR(LoadOnEngine(e, dir, version, in_flight));
  }
  if (!last_disk_dir.empty() && last_disk_dir != dir && !c.weight_sync.disk_keep_files) {
    RemoveDir(last_disk_dir);
  }
  last_disk_dir = dir;
  const double seconds = SecondsSince(start);
  return nlohmann::json{{"source", true},
                        {"bytes", bytes},
                        {"tensors", 0},
                        {"buckets", 0},
                        {"transport", "disk"},
                        {"write_seconds", write_s},
                        {"seconds", seconds},
                        {"gb_per_s", seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0}};
}

StatusOr<nlohmann::json> TrainerWorker::ResyncEngine(const nlohmann::json& request) {
  SLIME_RETURN_IF_ERROR(impl_->CheckInit());
  Impl& impl = *impl_;
  if (!impl.Exporter()) {
    return absl::FailedPreconditionError(fmt::format(
        "resync_engine: trainer rank {} is data-parallel rank {}; the ranks of data-parallel "
        "rank 0 (every tensor-parallel rank of every pipeline stage; with expert parallelism "
        "data-parallel ranks 0..EP-1) export the weights",
        impl.options.rank, impl.dp_rank));
  }
  if (impl.weights_version.empty()) {
    return absl::FailedPreconditionError(
        "resync_engine: the engines were never given weights (sync_weights has not run)");
  }
  // A bad request is reported after the collectives below, so the other exporters are not left
  // waiting in them.
  comm::EngineEndpoint e;
  Status request_ok = absl::OkStatus();
  if (impl.WeightSource()) {
    try {
      e.host = request.at("host").get<std::string>();
      e.port = request.at("port").get<int>();
    } catch (const nlohmann::json::exception& ex) {
      request_ok =
          absl::InvalidArgumentError(fmt::format("resync_engine: bad request: {}", ex.what()));
    }
  }
  if (!request_ok.ok() && impl.Exporters() == 1) return request_ok;
  const auto start = std::chrono::steady_clock::now();
  const std::string version = impl.weights_version;
  // The disk transport's directory of this version is still there: load it as it is. With
  // several exporters the source decides and its peers learn whether to take part in a gather.
  SLIME_ASSIGN_OR_RETURN(const bool reuse,
                         impl.FromSource(request_ok.ok() && !impl.last_disk_dir.empty() &&
                                         version == impl.synced_version));
  const std::string dir =
      reuse ? impl.last_disk_dir : fmt::format("{}/resync-v{}", impl.DiskRoot(), version);
  int64_t bytes = 0;
  if (!reuse) {
    // An offloaded trainer (colocated, mid-rollout) comes back for the write and leaves again.
    const bool was_offloaded = impl.offloader.offloaded();
    SLIME_RETURN_IF_ERROR(impl.EnsureResident());
    StatusOr<int64_t> written = int64_t{0};
    if (impl.WeightSource()) {
      size_t next = 0;
      train::Trainer* trainer = impl.trainer.get();
      written = impl.WriteWeightsDir(dir, [trainer, &next](size_t i) -> StatusOr<torch::Tensor> {
        next = i + 1;
        return trainer->FullParameter(i);
      });
      Status finished = impl.FinishGathers(next);
      if (written.ok() && !finished.ok()) written = finished;
    } else {
      Status gathered = impl.FinishGathers(0);  // the source's gathers, tensors dropped
      if (!gathered.ok()) written = gathered;
    }
    if (was_offloaded) SLIME_RETURN_IF_ERROR(ReleaseMemory().status());
    SLIME_ASSIGN_OR_RETURN(bytes, std::move(written));
  }
  if (!impl.WeightSource()) {
    return nlohmann::json{{"source", false}, {"seconds", SecondsSince(start)}};
  }
  if (!request_ok.ok()) {
    if (!reuse) RemoveDir(dir);
    return request_ok;
  }
  Status loaded = impl.LoadOnEngine(e, dir, version, comm::InFlight::kAbort);
  if (!reuse) RemoveDir(dir);
  SLIME_RETURN_IF_ERROR(loaded);
  spdlog::info("weight sync: engine {}:{} resynced to weight_version {} from {} in {:.2f} s",
               e.host, e.port, version, dir, SecondsSince(start));
  return nlohmann::json{{"weight_version", version},
                        {"dir", dir},
                        {"bytes", bytes},
                        {"seconds", SecondsSince(start)}};
}

namespace {

// One engine's GET /weights_checksum: its dtype and name → checksum.
struct EngineChecksums {
  torch::ScalarType dtype = torch::kFloat32;
  std::map<std::string, std::string> by_name;
};

StatusOr<EngineChecksums> FetchEngineChecksums(const comm::EngineEndpoint& e, int timeout_s) {
  http::ClientOptions co;
  co.timeout = std::chrono::seconds(timeout_s);
  http::Client client(e.host, e.port, co);
  const std::string where = fmt::format("engine {}:{} GET /weights_checksum", e.host, e.port);
  SLIME_ASSIGN_OR_RETURN(http::Response r, client.Get("/weights_checksum"));
  if (r.status != 200) return http::StatusFromHttp(r.status, where, r.body);
  nlohmann::json j = nlohmann::json::parse(r.body, nullptr, false);
  EngineChecksums out;
  try {
    SLIME_ASSIGN_OR_RETURN(out.dtype, comm::ParseDtypeName(j.at("dtype").get<std::string>()));
    for (const nlohmann::json& t : j.at("tensors")) {
      out.by_name[t.at("name").get<std::string>()] = t.at("checksum").get<std::string>();
    }
  } catch (const nlohmann::json::exception& ex) {
    return absl::InternalError(fmt::format("{}: bad reply: {}", where, ex.what()));
  }
  return out;
}

}  // namespace

StatusOr<nlohmann::json> TrainerWorker::CheckEngineWeights() {
  SLIME_RETURN_IF_ERROR(impl_->CheckInit());
  Impl& impl = *impl_;
  const auto start = std::chrono::steady_clock::now();
  if (!impl.Exporter()) return nlohmann::json{{"source", false}, {"seconds", 0.0}};
  if (!impl.WeightSource()) {
    // A TP peer or a later stage of the source: the source's gathers, tensors dropped.
    SLIME_RETURN_IF_ERROR(impl.EnsureResident());
    SLIME_RETURN_IF_ERROR(impl.FinishGathers(0));
    return nlohmann::json{{"source", false}, {"seconds", SecondsSince(start)}};
  }
  // The engines' checksums first; an unreachable engine is reported after the gathers, so the
  // peers are not left waiting in them.
  const int timeout_s = 60 * impl.options.config.cluster.distributed_timeout_minutes;
  std::vector<EngineChecksums> engine_sums;
  Status fetched = impl.engines.empty()
                       ? absl::FailedPreconditionError(
                             "check_engine_weights: connect_engines has not run")
                       : absl::OkStatus();
  for (const comm::EngineEndpoint& e : impl.engines) {
    if (!fetched.ok()) break;
    StatusOr<EngineChecksums> sums = FetchEngineChecksums(e, timeout_s);
    if (sums.ok()) {
      engine_sums.push_back(*std::move(sums));
    } else {
      fetched = sums.status();
    }
  }
  Status resident = impl.EnsureResident();
  if (!resident.ok() || !fetched.ok()) {
    if (resident.ok()) SLIME_RETURN_IF_ERROR(impl.FinishGathers(0));
    return resident.ok() ? fetched : resident;
  }
  const std::vector<model::NamedTensor> shapes = std::as_const(*impl.trainer).FullParameterShapes();
  std::vector<std::string> mismatches;  // the first few, for the message
  int64_t num_mismatches = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    StatusOr<torch::Tensor> full = impl.trainer->FullParameter(i);
    if (!full.ok()) {
      SLIME_RETURN_IF_ERROR(impl.FinishGathers(i + 1));
      return full.status();
    }
    const std::string& name = shapes[i].name;
    std::map<torch::ScalarType, std::string> ours;  // by engine dtype
    for (size_t k = 0; k < engine_sums.size(); ++k) {
      const comm::EngineEndpoint& e = impl.engines[k];
      auto it = engine_sums[k].by_name.find(name);
      std::string theirs = it == engine_sums[k].by_name.end() ? "" : it->second;
      auto& mine = ours[engine_sums[k].dtype];
      if (mine.empty()) {
        StatusOr<std::string> sum = comm::TensorChecksum(*full, engine_sums[k].dtype);
        if (!sum.ok()) {
          SLIME_RETURN_IF_ERROR(impl.FinishGathers(i + 1));
          return sum.status();
        }
        mine = *sum;
      }
      if (theirs == mine) continue;
      ++num_mismatches;
      if (mismatches.size() < 5) {
        mismatches.push_back(
            theirs.empty()
                ? fmt::format("engine {}:{} has no tensor '{}'", e.host, e.port, name)
                : fmt::format("engine {}:{} tensor '{}' differs from the trainer's (engine {}, "
                              "trainer {})",
                              e.host, e.port, name, theirs, mine));
      }
    }
  }
  if (num_mismatches > 0) {
    return absl::DataLossError(fmt::format(
        "weight_sync.check_weight_update_equal: after the sync of weight_version {}, {}{}",
        impl.synced_version, fmt::join(mismatches, "; "),
        num_mismatches > static_cast<int64_t>(mismatches.size())
            ? fmt::format("; and {} more", num_mismatches - static_cast<int64_t>(mismatches.size()))
            : ""));
  }
  spdlog::info("weight sync: the {} engine(s) hold the trainer's {} tensors (checksums equal, "
               "weight_version {}, {:.2f} s)",
               impl.engines.size(), shapes.size(), impl.synced_version, SecondsSince(start));
  return nlohmann::json{{"source", true},
                        {"engines", impl.engines.size()},
                        {"tensors", shapes.size()},
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
  impl_->engines.clear();
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
  // It converts the newest checkpoint: a background write of it finishes first.
  SLIME_RETURN_IF_ERROR(impl_->trainer->WaitForSave());
  train::HfExportOptions eo;
  eo.from = *config.checkpoint.save;
  eo.to_hf = dir;
  eo.tokenizer = config.model.hf_checkpoint;
  SLIME_ASSIGN_OR_RETURN(std::string from, train::ExportCheckpointToHf(eo));
  return nlohmann::json{{"dir", dir}, {"from", from}};
}

}  // namespace slime::workers
