// The model runner (see include/slime/engine/model_runner.h).
#include "slime/engine/model_runner.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <c10/core/DeviceGuard.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#ifdef SLIME_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

#include "slime/comm/process_group.h"
#include "slime/comm/tensor_parallel_group.h"
#include "slime/comm/weight_checksum.h"
#include "slime/model/batch_invariant.h"
#include "slime/model/checkpoint.h"
#include "slime/model/weights.h"

namespace slime::engine {
namespace {

template <typename Fn>
auto Guard(const std::string& context, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const c10::Error& e) {
    std::string what = e.what_without_backtrace();
    return absl::InternalError(fmt::format("{}: {}", context, what.substr(0, what.find('\n'))));
  } catch (const std::exception& e) {
    return absl::InternalError(fmt::format("{}: {}", context, std::string(e.what())));
  }
}

StatusOr<torch::Device> ParseDevice(const std::string& name) {
  if (name == "auto") return torch::cuda::is_available() ? torch::Device("cuda:0") : torch::kCPU;
  try {
    torch::Device d(name);
    if (d.is_cuda() && !torch::cuda::is_available()) {
      return absl::InvalidArgumentError(
          fmt::format("device '{}' requested but CUDA is not available in this build/machine", name));
    }
    return d;
  } catch (const c10::Error&) {
    return absl::InvalidArgumentError(
        fmt::format("device '{}' is not valid (use auto, cpu, cuda or cuda:N)", name));
  }
}

StatusOr<torch::ScalarType> ParseDtype(const std::string& name, const torch::Device& device) {
  if (name == "auto") return device.is_cuda() ? torch::kBFloat16 : torch::kFloat32;
  if (name == "bfloat16" || name == "bf16") return torch::kBFloat16;
  if (name == "float16" || name == "fp16" || name == "half") return torch::kFloat16;
  if (name == "float32" || name == "fp32" || name == "float") return torch::kFloat32;
  return absl::InvalidArgumentError(
      fmt::format("dtype '{}' is not valid (use auto, bfloat16, float16 or float32)", name));
}

}  // namespace

// ---- Rank threads

// Threads for ranks 1..N-1 that run one job at a time on every rank (rank 0 on the caller).
class ModelRunner::RankThreads {
 public:
  explicit RankThreads(std::vector<torch::Device> devices) : devices_(std::move(devices)) {
    for (int r = 1; r < static_cast<int>(devices_.size()); ++r) {
      threads_.emplace_back([this, r] { Loop(r); });
    }
  }
  ~RankThreads() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  Status Run(const std::function<Status(int)>& fn) {
    const int n = static_cast<int>(devices_.size());
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = &fn;
      results_.assign(n, absl::OkStatus());
      pending_ = n - 1;
      ++generation_;
    }
    wake_.notify_all();
    Status first = RunOne(fn, 0);
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
    if (!first.ok()) return first;
    for (int r = 1; r < n; ++r) {
      if (!results_[r].ok()) return results_[r];
    }
    return absl::OkStatus();
  }

 private:
  Status RunOne(const std::function<Status(int)>& fn, int rank) {
    try {
      c10::DeviceGuard guard(devices_[rank]);
      return fn(rank);
    } catch (const c10::Error& e) {
      std::string what = e.what_without_backtrace();
      return absl::InternalError(
          fmt::format("tensor-parallel rank {}: {}", rank, what.substr(0, what.find('\n'))));
    } catch (const std::exception& e) {
      return absl::InternalError(fmt::format("tensor-parallel rank {}: {}", rank, e.what()));
    }
  }

  void Loop(int rank) {
    uint64_t seen = 0;
    while (true) {
      const std::function<Status(int)>* job = nullptr;
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        job = job_;
      }
      Status s = RunOne(*job, rank);
      std::lock_guard<std::mutex> lock(mu_);
      results_[rank] = std::move(s);
      if (--pending_ == 0) done_.notify_all();
    }
  }

  const std::vector<torch::Device> devices_;
  std::mutex mu_;
  std::condition_variable wake_;  // a new job (generation_) or stop_
  std::condition_variable done_;  // pending_ reached 0
  const std::function<Status(int)>* job_ = nullptr;  // guarded by mu_; valid during Run
  uint64_t generation_ = 0;                         // guarded by mu_
  int pending_ = 0;                                 // guarded by mu_: ranks 1.. still running
  std::vector<Status> results_;                     // guarded by mu_
  bool stop_ = false;                               // guarded by mu_
  std::vector<std::thread> threads_;
};

Status ModelRunner::OnEveryRank(const std::function<Status(int rank)>& fn) {
  if (threads_) return threads_->Run(fn);
  return Guard("engine rank 0", [&]() -> Status {
    c10::DeviceGuard guard(devices_.front());
    return fn(0);
  });
}

// ---- Create

namespace {

// Rank r's device for a runner whose rank 0 is on `first`.
StatusOr<std::vector<torch::Device>> RankDevices(const torch::Device& first, int tp_size) {
  std::vector<torch::Device> out;
  if (!first.is_cuda()) {
    out.assign(tp_size, first);
    return out;
  }
  const int base = first.has_index() ? first.index() : 0;
  const int count = static_cast<int>(torch::cuda::device_count());
  if (base + tp_size > count) {
    return absl::InvalidArgumentError(fmt::format(
        "tp_size {} needs the CUDA devices cuda:{}..cuda:{}, but this process sees {} (check "
        "CUDA_VISIBLE_DEVICES, --device and --tp)",
        tp_size, base, base + tp_size - 1, count));
  }
  for (int r = 0; r < tp_size; ++r) {
    out.emplace_back(torch::kCUDA, static_cast<c10::DeviceIndex>(base + r));
  }
  return out;
}

// Joins the engine's TP group: one ProcessGroup per rank over a TCPStore on 127.0.0.1 (any free
// port), NCCL between the devices or Gloo on CPU. `run` runs a function on every rank at once.
StatusOr<std::vector<std::shared_ptr<comm::ProcessGroup>>> JoinTensorParallelGroup(
    const std::vector<torch::Device>& devices, double timeout_s,
    const std::function<Status(const std::function<Status(int)>&)>& run) {
  const int n = static_cast<int>(devices.size());
  comm::ProcessGroupOptions o;
  o.master_address = "127.0.0.1";
  o.master_port = 0;
  o.world_size = n;
  o.group_name = "engine-tensor-parallel";
  o.backend = devices.front().is_cuda() ? "nccl" : "gloo";
  o.timeout_s = timeout_s;
  o.cuda_device = devices.front().is_cuda() ? devices.front().index() : 0;
  SLIME_ASSIGN_OR_RETURN(std::unique_ptr<comm::ProcessGroup> root, comm::ProcessGroup::Open(o));
  std::vector<std::shared_ptr<comm::ProcessGroup>> groups(n);
  groups[0] = std::move(root);
  const int port = groups[0]->port();
  SLIME_RETURN_IF_ERROR(run([&](int r) -> Status {
    if (r == 0) return groups[0]->Join();
    comm::ProcessGroupOptions p = o;
    p.rank = r;
    p.master_port = port;
    p.cuda_device = devices[r].is_cuda() ? devices[r].index() : 0;
    SLIME_ASSIGN_OR_RETURN(std::unique_ptr<comm::ProcessGroup> g, comm::ProcessGroup::Create(p));
    groups[r] = std::move(g);
    return absl::OkStatus();
  }));
  return groups;
}

}  // namespace

StatusOr<std::unique_ptr<ModelRunner>> ModelRunner::Create(const ModelRunnerOptions& options) {
  SLIME_ASSIGN_OR_RETURN(torch::Device device, ParseDevice(options.device));
  SLIME_ASSIGN_OR_RETURN(torch::ScalarType dtype, ParseDtype(options.dtype, device));
  if (options.page_size < 1 || options.page_size > 256) {
    return absl::InvalidArgumentError(
        fmt::format("page_size must be in [1, 256], got {}", options.page_size));
  }
  const int tp = options.tp_size;
  if (tp < 1) {
    return absl::InvalidArgumentError(fmt::format("tp_size must be >= 1, got {}", tp));
  }
  if (tp > 1) {
    SLIME_ASSIGN_OR_RETURN(model::ModelConfig mc, model::LoadModelConfig(options.model_path));
    if (Status s = model::ValidateTensorParallel(mc, tp); !s.ok()) {
      return absl::InvalidArgumentError(fmt::format(
          "tp_size {} does not fit {}: {}", tp, options.model_path, std::string(s.message())));
    }
  }
  std::unique_ptr<ModelRunner> runner(new ModelRunner());
  SLIME_ASSIGN_OR_RETURN(runner->devices_, RankDevices(device, tp));
  for (int r = 0; r < tp; ++r) runner->ranks_.push_back(std::make_unique<Rank>());
  if (tp > 1) {
    runner->threads_ = std::make_unique<RankThreads>(runner->devices_);
    SLIME_ASSIGN_OR_RETURN(
        std::vector<std::shared_ptr<comm::ProcessGroup>> groups,
        JoinTensorParallelGroup(runner->devices_, options.tp_timeout_s,
                                [&](const std::function<Status(int)>& fn) {
                                  return runner->OnEveryRank(fn);
                                }));
    for (int r = 0; r < tp; ++r) runner->ranks_[r]->group = std::move(groups[r]);
  }
  runner->fuse_projections_ = options.fuse_projections;
  // Every rank loads its shard on its device and measures what its device has left.
  std::vector<int64_t> budget_tokens(tp, 0);
  SLIME_RETURN_IF_ERROR(runner->OnEveryRank([&](int r) -> Status {
    Rank& rank = *runner->ranks_[r];
    std::shared_ptr<model::TensorParallelGroup> group;
    if (rank.group) group = std::make_shared<comm::ProcessGroupTensorParallel>(rank.group);
    SLIME_ASSIGN_OR_RETURN(rank.model, model::DecoderModel::Load(options.model_path, dtype,
                                                                 runner->devices_[r], group));
    if (options.fuse_projections) rank.model->FuseProjections();  // CUDA only; else a no-op
    int64_t tokens = options.max_total_tokens > 0 ? options.max_total_tokens : 65536;
#ifdef SLIME_WITH_CUDA
    if (options.max_total_tokens <= 0 && runner->devices_[r].is_cuda()) {
      const model::ModelConfig& c = rank.model->config();
      const int64_t per_token = PagedKvCache::BytesPerToken(
          c.num_hidden_layers, rank.model->local_kv_heads(), c.head_dim, dtype);
      size_t free_bytes = 0, total_bytes = 0;
      if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
        return absl::InternalError(fmt::format(
            "cudaMemGetInfo failed on {} while sizing the KV cache", runner->devices_[r].str()));
      }
      // The weights are already resident: budget = fraction of the total minus what is used.
      const double budget = options.mem_fraction_static * static_cast<double>(total_bytes) -
                            static_cast<double>(total_bytes - free_bytes);
      tokens = static_cast<int64_t>(budget / static_cast<double>(per_token));
      if (tokens < 4 * options.page_size) {
        return absl::ResourceExhaustedError(fmt::format(
            "not enough GPU memory for a KV cache on {}: mem_fraction_static {} leaves {:.0f} "
            "MiB ({} bytes per token)",
            runner->devices_[r].str(), options.mem_fraction_static, budget / (1 << 20),
            per_token));
      }
    }
#endif
    budget_tokens[r] = tokens;
    return absl::OkStatus();
  }));
  // One page table serves every rank: the smallest budget sizes every rank's cache.
  const int64_t tokens = *std::min_element(budget_tokens.begin(), budget_tokens.end());
  const int64_t pages = tokens / options.page_size + 1;  // +1: page 0 is the reserved padding page
  const model::ModelConfig& c = runner->config();
  const int64_t local_kv_heads = runner->model().local_kv_heads();
  SLIME_RETURN_IF_ERROR(runner->OnEveryRank([&](int r) -> Status {
    return Guard("allocating the KV cache", [&]() -> Status {
      runner->ranks_[r]->kv = std::make_unique<PagedKvCache>(
          c.num_hidden_layers, pages, options.page_size, local_kv_heads, c.head_dim,
          torch::TensorOptions().dtype(dtype).device(runner->devices_[r]));
      return absl::OkStatus();
    });
  }));
  const int64_t per_token =
      PagedKvCache::BytesPerToken(c.num_hidden_layers, local_kv_heads, c.head_dim, dtype);
  std::vector<std::string> device_names;  // "cuda:0, cuda:1"; CPU ranks share one name
  for (const torch::Device& d : runner->devices_) {
    if (device_names.empty() || d.is_cuda()) device_names.push_back(d.str());
  }
  spdlog::info("engine: model {} ({} layers, {:.1f}M parameters) on {}{} in {}; KV cache {} "
               "pages x {} tokens = {} tokens, {:.1f} MiB{}",
               options.model_path, c.num_hidden_layers, c.NumParameters() / 1e6,
               fmt::join(device_names, ", "),
               tp > 1 ? fmt::format(" (tensor parallel, {} ranks over {})", tp,
                                    runner->ranks_[0]->group->backend())
                      : std::string(),
               std::string(c10::toString(dtype)), pages - 1, options.page_size,
               (pages - 1) * options.page_size,
               static_cast<double>(pages * options.page_size * per_token) / (1 << 20),
               tp > 1 ? " per rank" : "");
  return runner;
}

// ---- Forward

StatusOr<HiddenStates> ModelRunner::Forward(const std::vector<int32_t>& input_ids,
                                            const std::vector<PagedItem>& items) {
  // Refused before any rank starts, so no rank waits in a collective for the others.
  if (kv().released()) return absl::FailedPreconditionError("KV cache is released");
  if (weights_offloaded_) return absl::FailedPreconditionError("weights are offloaded");
  HiddenStates out;
  out.per_rank.resize(ranks_.size());
  SLIME_RETURN_IF_ERROR(OnEveryRank([&](int r) -> Status {
    return Guard("engine forward", [&]() -> Status {
      Rank& rank = *ranks_[r];
      model::DecoderModel& m = *rank.model;
      c10::InferenceMode guard;
      const bool kernel = m.attention_impl() != model::AttentionImpl::kMath &&
                          PagedDecodeKernelAvailable(config().head_dim, m.local_heads(),
                                                     m.local_kv_heads(), devices_[r]);
      PagedLayout layout = PagedLayout::Build(items, rank.kv->page_size(), devices_[r], kernel);
      torch::Tensor ids =
          torch::from_blob(const_cast<int32_t*>(input_ids.data()),
                           {static_cast<int64_t>(input_ids.size())}, torch::kInt)
              .to(devices_[r], torch::kLong);
      PagedAttention attention(rank.kv.get(), &layout, m.attention_impl());
      out.per_rank[r] = m.ForwardUnchecked(ids, layout.positions, attention);
      return absl::OkStatus();
    });
  }));
  return out;
}

StatusOr<torch::Tensor> ModelRunner::Logits(const HiddenStates& hidden,
                                            const std::vector<int64_t>& rows) {
  if (hidden.per_rank.size() != ranks_.size()) {
    return absl::InvalidArgumentError(fmt::format(
        "hidden states of {} ranks for a runner of tp_size {}", hidden.per_rank.size(),
        ranks_.size()));
  }
  torch::Tensor logits;
  SLIME_RETURN_IF_ERROR(OnEveryRank([&](int r) -> Status {
    return Guard("engine logits", [&]() -> Status {
      c10::InferenceMode guard;
      std::vector<int64_t> copy = rows;
      torch::Tensor idx =
          torch::from_blob(copy.data(), {static_cast<int64_t>(copy.size())}, torch::kLong)
              .to(devices_[r]);
      // Vocab-parallel head: every rank computes its vocabulary slice and all-gathers [R, V].
      SLIME_ASSIGN_OR_RETURN(torch::Tensor full,
                             ranks_[r]->model->Logits(hidden.per_rank[r].index_select(0, idx)));
      if (r == 0) logits = full.to(torch::kFloat32);
      return absl::OkStatus();
    });
  }));
  return logits;
}

Status ModelRunner::HealthCheck() {
  return OnEveryRank([&](int r) -> Status {
    model::DecoderModel& m = *ranks_[r]->model;
    torch::Tensor ids = torch::zeros({1}, torch::kLong);
    SLIME_ASSIGN_OR_RETURN(torch::Tensor hidden, m.ForwardPacked(ids, {0, 1}));
    return m.Logits(hidden).status();
  });
}

// ---- Memory occupation

Status ModelRunner::ReleaseKv() {
  return Guard("releasing the KV cache", [&]() -> Status {
    DropGraphs();  // they point into the pools
    for (auto& rank : ranks_) rank->kv->Release();
#ifdef SLIME_WITH_CUDA
    if (device().is_cuda()) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
    return absl::OkStatus();
  });
}

Status ModelRunner::ResumeKv() {
  return Guard("re-allocating the KV cache", [&]() -> Status {
    for (auto& rank : ranks_) rank->kv->Resume();
    if (graph_max_batch_ > 0 && !weights_offloaded_) {
      return CaptureDecodeGraphs(graph_max_batch_, graph_context_);
    }
    return absl::OkStatus();
  });
}

namespace {

// Every weight tensor (fused projections are views into one storage per layer: one copy each).
std::vector<torch::Tensor> WeightTensors(const model::DecoderModel& m) {
  std::vector<torch::Tensor> out;
  for (const model::ParamSpec& spec : model::ParameterSpecs(m.config())) {
    out.push_back(model::ParamSlot(m.weights(), spec));
  }
  return out;
}

}  // namespace

Status ModelRunner::OffloadWeights() {
  if (weights_offloaded_) return absl::OkStatus();
  return Guard("offloading weights", [&]() -> Status {
    if (device().is_cpu()) {
      weights_offloaded_ = true;  // already in host memory; only the state changes
      return absl::OkStatus();
    }
    DropGraphs();  // they point at the device weights
    for (size_t r = 0; r < ranks_.size(); ++r) {
      Status s = ranks_[r]->weight_offloader.Offload(WeightTensors(*ranks_[r]->model));
      if (!s.ok()) {
        // All ranks or none: bring back the ranks already offloaded.
        for (size_t k = 0; k < r; ++k) {
          Status undo = ranks_[k]->weight_offloader.Onload();
          if (!undo.ok()) {
            spdlog::error("engine: rank {} could not onload its weights after rank {} failed to "
                          "offload: {}", k, r, std::string(undo.message()));
          }
        }
        return absl::Status(s.code(), fmt::format("rank {}: {}", r, std::string(s.message())));
      }
    }
#ifdef SLIME_WITH_CUDA
    c10::cuda::CUDACachingAllocator::emptyCache();
#endif
    weights_offloaded_ = true;
    return absl::OkStatus();
  });
}

Status ModelRunner::OnloadWeights() {
  if (!weights_offloaded_) return absl::OkStatus();
  return Guard("onloading weights", [&]() -> Status {
    // A rank already back is a no-op for its offloader, so a failed call can be retried.
    for (size_t r = 0; r < ranks_.size(); ++r) {
      Status s = ranks_[r]->weight_offloader.Onload();
      if (!s.ok()) return absl::Status(s.code(), fmt::format("rank {}: {}", r, std::string(s.message())));
    }
    weights_offloaded_ = false;
    if (graph_max_batch_ > 0 && !kv().released() && !graphs_) {
      return CaptureDecodeGraphs(graph_max_batch_, graph_context_);
    }
    return absl::OkStatus();
  });
}

Status ModelRunner::CheckWeightsResident() const {
  if (!weights_offloaded_ || device().is_cpu()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      "the weights are released (/release_memory_occupation); resume them first "
      "(/resume_memory_occupation with tags [\"weights\"])");
}

// ---- Weight updates

namespace {

using CopyPlan = std::vector<std::pair<torch::Tensor*, torch::Tensor>>;  // (destination, source)

// Where each of `tensors` (full HF tensors) goes in `m`'s shard, checked before anything is
// copied. Sources are the shard's slice of the full tensor (a view, any device).
StatusOr<CopyPlan> PlanWeightUpdate(model::DecoderModel& m,
                                    const std::vector<model::NamedTensor>& tensors) {
  const model::ModelConfig& c = m.config();
  const std::vector<model::ParamSpec> specs = model::ParameterSpecs(c);
  std::map<std::string, const model::ParamSpec*> by_name;
  for (const model::ParamSpec& spec : specs) by_name[spec.hf_name] = &spec;
  const int tp_rank = m.tp_group().rank();
  const int tp_size = m.tp_group().size();
  CopyPlan plan;
  for (const model::NamedTensor& nt : tensors) {
    auto it = by_name.find(nt.name);
    if (it == by_name.end()) {
      if (c.tie_word_embeddings && nt.name == "lm_head.weight") continue;  // = embed_tokens
      return absl::InvalidArgumentError(fmt::format(
          "unknown parameter '{}': not a weight of this {} model (names look like '{}')",
          nt.name, c.model_type, specs.size() > 1 ? specs[1].hf_name : specs[0].hf_name));
    }
    const model::ParamSpec& spec = *it->second;
    if (nt.tensor.sizes().vec() != spec.shape) {
      return absl::InvalidArgumentError(
          fmt::format("parameter '{}': shape [{}] does not match the model's [{}]", nt.name,
                      fmt::join(nt.tensor.sizes().vec(), ", "), fmt::join(spec.shape, ", ")));
    }
    torch::Tensor& dst = model::ParamSlot(m.mutable_weights(), spec);
    if (nt.tensor.scalar_type() != dst.scalar_type()) {
      return absl::InvalidArgumentError(fmt::format(
          "parameter '{}': dtype {} does not match the engine's {} (send {})", nt.name,
          std::string(c10::toString(nt.tensor.scalar_type())),
          std::string(c10::toString(dst.scalar_type())),
          std::string(c10::toString(dst.scalar_type()))));
    }
    torch::Tensor src = nt.tensor;
    if (tp_size > 1 && spec.shard != model::ShardDim::kReplicated) {
      // This rank's rows (column-parallel, vocab-parallel) or columns (row-parallel). With
      // fused projections dst is a view into a stacked buffer (q|k|v, or the feed-forward
      // block's, e.g. the dense gate|up): the copy lands there.
      src = src.chunk(tp_size, static_cast<int64_t>(spec.shard))[tp_rank];
    }
    plan.emplace_back(&dst, std::move(src));
  }
  return plan;
}

void CopyPlanned(const CopyPlan& plan) {
  c10::InferenceMode guard;
  for (const auto& [dst, src] : plan) dst->copy_(src);
}

}  // namespace

Status ModelRunner::LoadWeightsFromDisk(const std::string& model_path) {
  return Guard("updating weights from disk", [&]() -> Status {
    SLIME_RETURN_IF_ERROR(CheckWeightsResident());
    SLIME_ASSIGN_OR_RETURN(model::ModelConfig config, model::LoadModelConfig(model_path));
    const model::ModelConfig& mine = this->config();
    if (config.hidden_size != mine.hidden_size || config.num_hidden_layers != mine.num_hidden_layers ||
        config.vocab_size != mine.vocab_size || config.intermediate_size != mine.intermediate_size ||
        config.num_attention_heads != mine.num_attention_heads ||
        config.num_key_value_heads != mine.num_key_value_heads) {
      return absl::InvalidArgumentError(fmt::format(
          "{} has a different architecture than the served model (hidden {} vs {}, layers {} vs "
          "{}, vocab {} vs {})",
          model_path, config.hidden_size, mine.hidden_size, config.num_hidden_layers,
          mine.num_hidden_layers, config.vocab_size, mine.vocab_size));
    }
    SLIME_ASSIGN_OR_RETURN(model::CheckpointReader reader, model::CheckpointReader::Open(model_path));
    // Every rank's shard is read (host memory) before any is copied: all or nothing.
    std::vector<model::ModelWeights> fresh;
    for (int r = 0; r < tp_size(); ++r) {
      model::WeightOptions wo;
      wo.dtype = dtype();
      wo.device = torch::kCPU;
      wo.tp_rank = r;
      wo.tp_size = tp_size();
      SLIME_ASSIGN_OR_RETURN(model::ModelWeights w, model::LoadWeights(reader, mine, wo));
      fresh.push_back(std::move(w));
    }
    c10::InferenceMode guard;
    for (int r = 0; r < tp_size(); ++r) {
      c10::DeviceGuard device_guard(devices_[r]);
      model::DecoderModel& m = *ranks_[r]->model;
      for (const model::ParamSpec& spec : model::ParameterSpecs(mine)) {
        model::ParamSlot(m.mutable_weights(), spec).copy_(model::ParamSlot(fresh[r], spec));
      }
    }
    return absl::OkStatus();
  });
}

Status ModelRunner::UpdateWeights(const std::vector<model::NamedTensor>& tensors) {
  return Guard("updating weights", [&]() -> Status {
    SLIME_RETURN_IF_ERROR(CheckWeightsResident());
    std::vector<CopyPlan> plans;  // every rank checked before any copies
    for (auto& rank : ranks_) {
      SLIME_ASSIGN_OR_RETURN(CopyPlan plan, PlanWeightUpdate(*rank->model, tensors));
      plans.push_back(std::move(plan));
    }
    for (int r = 0; r < tp_size(); ++r) {
      c10::DeviceGuard device_guard(devices_[r]);
      CopyPlanned(plans[r]);
    }
#ifdef SLIME_WITH_CUDA
    if (tp_size() > 1 && device().is_cuda()) {
      for (const torch::Device& d : devices_) torch::cuda::synchronize(d.index());
    }
#endif
    return absl::OkStatus();
  });
}

// The full tensor of `spec` on the CPU: the ranks' shards joined along their split dimension.
StatusOr<torch::Tensor> ModelRunner::FullWeight(const model::ParamSpec& spec) const {
  std::vector<torch::Tensor> shards;
  for (const auto& rank : ranks_) {
    const torch::Tensor& t = model::ParamSlot(rank->model->weights(), spec);
    if (!t.defined()) {
      return absl::InternalError(fmt::format("weight {} is not loaded", spec.hf_name));
    }
    shards.push_back(t.to(torch::kCPU));
    if (spec.shard == model::ShardDim::kReplicated) break;  // every rank holds it whole
  }
  return shards.size() == 1 ? shards[0] : torch::cat(shards, static_cast<int64_t>(spec.shard));
}

StatusOr<std::vector<std::pair<std::string, std::string>>> ModelRunner::WeightChecksums() {
  if (weights_offloaded_) {
    return absl::FailedPreconditionError(
        "the weights are released (/release_memory_occupation); resume them first");
  }
  std::vector<std::pair<std::string, std::string>> out;
  const std::vector<model::ParamSpec> specs = model::ParameterSpecs(config());
  return Guard("weight checksums", [&]() -> StatusOr<std::vector<std::pair<std::string, std::string>>> {
    for (const model::ParamSpec& spec : specs) {
      SLIME_ASSIGN_OR_RETURN(torch::Tensor full, FullWeight(spec));
      SLIME_ASSIGN_OR_RETURN(std::string checksum, comm::TensorChecksum(full, dtype()));
      out.emplace_back(spec.hf_name, std::move(checksum));
    }
    return out;
  });
}

StatusOr<torch::Tensor> ModelRunner::WeightByName(const std::string& hf_name) {
  if (weights_offloaded_) {
    return absl::FailedPreconditionError(
        "the weights are released (/release_memory_occupation); resume them first");
  }
  const std::vector<model::ParamSpec> specs = model::ParameterSpecs(config());
  std::string name = hf_name;
  if (config().tie_word_embeddings && name == "lm_head.weight") name = "model.embed_tokens.weight";
  for (const model::ParamSpec& spec : specs) {
    if (spec.hf_name != name) continue;
    return Guard("reading weight " + hf_name,
                 [&]() -> StatusOr<torch::Tensor> { return FullWeight(spec); });
  }
  return absl::NotFoundError(fmt::format(
      "parameter '{}' is not a weight of this {} model (names look like '{}')", hf_name,
      config().model_type, specs.size() > 1 ? specs[1].hf_name : specs[0].hf_name));
}

Status ModelRunner::UpdateRankWeights(int rank, const std::vector<model::NamedTensor>& tensors) {
  return Guard(fmt::format("updating the weights of rank {}", rank), [&]() -> Status {
    SLIME_RETURN_IF_ERROR(CheckWeightsResident());
    SLIME_ASSIGN_OR_RETURN(CopyPlan plan, PlanWeightUpdate(*ranks_[rank]->model, tensors));
    c10::DeviceGuard device_guard(devices_[rank]);
    CopyPlanned(plan);
    return absl::OkStatus();
  });
}

// ---- CUDA graphs for decode steps

#ifdef SLIME_WITH_CUDA
struct ModelRunner::DecodeGraphs {
  std::vector<int64_t> sizes;  // captured batch sizes, ascending
  std::map<int64_t, std::unique_ptr<at::cuda::CUDAGraph>> graphs;
  std::map<int64_t, torch::Tensor> logits;  // per size: [B, vocab] float32, graph-owned
  int64_t max_pages = 0;
  // The step's inputs live in one device buffer, filled by one copy from one pinned host buffer
  // of the same layout (one H2D copy per step instead of five): int64 ids, positions, slots
  // ([max_B] each), then int32 seq_lens [max_B] and page_table [max_B, max_pages]. A step of
  // B rows copies the prefix up to the end of page_table's first B rows.
  torch::Tensor device_inputs;          // [input_longs] int64 (the int32 part viewed as int32)
  torch::Tensor host_inputs;            // pinned, the same size
  torch::Tensor ids, positions, slots;  // views of device_inputs
  torch::Tensor seq_lens;               // [max_B] int32, view
  torch::Tensor page_table;             // [max_B, max_pages] int32, view
  torch::Tensor decode_rows;            // [max_B] int64 = 0..max_B-1
};
#else
struct ModelRunner::DecodeGraphs {};
#endif

ModelRunner::~ModelRunner() { DropGraphs(); }

void ModelRunner::DropGraphs() {
  graphs_.reset();
}

bool ModelRunner::has_decode_graphs() const { return graphs_ != nullptr; }

Status ModelRunner::CaptureDecodeGraphs(int64_t max_batch, int64_t context_length) {
  DropGraphs();
  if (tp_size() > 1) {
    // The TP all-reduces / all-gathers go through comm::ProcessGroup, whose watchdog waits for
    // each collective on the host with a deadline: not something a CUDA graph can capture.
    if (max_batch > 0 && device().is_cuda()) {
      spdlog::info("engine: decode CUDA graphs are off at tp_size {} (the TP collectives wait on "
                   "the host); every step runs eagerly",
                   tp_size());
    }
    graph_max_batch_ = 0;
    return absl::OkStatus();
  }
  graph_max_batch_ = max_batch;
  graph_context_ = context_length;
#ifdef SLIME_WITH_CUDA
  model::DecoderModel* const m = ranks_.front()->model.get();
  PagedKvCache* const cache = ranks_.front()->kv.get();
  // Deterministic mode captures too: its attention reads the graphs' page table
  // (model::InvariantPagedDecodeAttention) and its other kernels are batch-invariant, so a
  // padded graph batch gives every sequence the bits of an eager step.
  if (max_batch <= 0 || !device().is_cuda() ||
      m->attention_impl() == model::AttentionImpl::kMath ||
      !PagedDecodeKernelAvailable(config().head_dim, m->local_heads(),
                                  m->local_kv_heads(), device())) {
    return absl::OkStatus();
  }
  if (m->ForwardWaitsOnHost()) {
    spdlog::info("engine: decode CUDA graphs are off: the MoE layers' per-expert GEMMs read their "
                 "group sizes on the host (the grouped-GEMM path needs bf16 on Hopper and is off "
                 "in deterministic mode); every step runs eagerly");
    return absl::OkStatus();
  }
  if (cache->released() || weights_offloaded_) return absl::OkStatus();  // captured on resume
  return Guard("capturing decode CUDA graphs", [&]() -> Status {
    c10::DeviceGuard device_guard(device());
    const auto t0 = std::chrono::steady_clock::now();
    auto g = std::make_unique<DecodeGraphs>();
    for (int64_t b : {1, 2, 4, 8, 12, 16, 24, 32}) {
      if (b <= max_batch) g->sizes.push_back(b);
    }
    for (int64_t b = 48; b <= std::min<int64_t>(max_batch, 256); b += 16) g->sizes.push_back(b);
    for (int64_t b = 320; b <= max_batch; b += 64) g->sizes.push_back(b);
    if (g->sizes.empty() || g->sizes.back() != max_batch) g->sizes.push_back(max_batch);
    const int64_t n = g->sizes.back();
    const int64_t page = cache->page_size();
    g->max_pages = (context_length + page - 1) / page;
    auto lopts = torch::TensorOptions().dtype(torch::kLong).device(device());
    const int64_t ints = n + n * g->max_pages;
    const int64_t longs = 3 * n + (ints + 1) / 2;
    g->device_inputs = torch::zeros({longs}, lopts);
    g->host_inputs = torch::zeros({longs}, torch::TensorOptions().dtype(torch::kLong).pinned_memory(true));
    g->ids = g->device_inputs.narrow(0, 0, n);
    g->positions = g->device_inputs.narrow(0, n, n);
    g->slots = g->device_inputs.narrow(0, 2 * n, n);
    torch::Tensor int_part = g->device_inputs.narrow(0, 3 * n, longs - 3 * n).view(torch::kInt);
    g->seq_lens = int_part.narrow(0, 0, n);
    g->seq_lens.fill_(1);
    g->page_table = int_part.narrow(0, n, n * g->max_pages).view({n, g->max_pages});
    g->decode_rows = torch::arange(n, lopts);

    c10::InferenceMode inference;
    DecodeGraphs* gp = g.get();
    auto run = [&](int64_t b) -> torch::Tensor {
      PagedLayout lay;
      lay.num_tokens = b;
      lay.positions = gp->positions.narrow(0, 0, b);
      lay.write_slots = gp->slots.narrow(0, 0, b);
      lay.decode_rows = gp->decode_rows.narrow(0, 0, b);
      lay.decode_rows_are_prefix = true;
      lay.decode_kernel = true;
      lay.decode_page_table = gp->page_table.narrow(0, 0, b);
      lay.decode_seq_lens = gp->seq_lens.narrow(0, 0, b);
      PagedAttention attention(cache, &lay, m->attention_impl());
      torch::Tensor hidden =
          m->ForwardUnchecked(gp->ids.narrow(0, 0, b), lay.positions, attention);
      return m->Logits(hidden).value().to(torch::kFloat32);
    };
    // The input buffers were zeroed on the current stream; the warm-up and capture run on a
    // side stream that does not wait for it. Without this wait a warm-up forward after a
    // release/resume cycle read the reused memory's old contents as token ids (an
    // out-of-range embedding gather).
    c10::cuda::getCurrentCUDAStream().synchronize();
    c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool();
    {
      c10::cuda::CUDAStreamGuard guard(stream);
      at::cuda::MempoolId_t pool{0, 0};
      for (auto it = g->sizes.rbegin(); it != g->sizes.rend(); ++it) {
        const int64_t b = *it;
        run(b);  // warm-up outside the graph (cuBLAS workspaces, lazy initialisation)
        stream.synchronize();
        auto graph = std::make_unique<at::cuda::CUDAGraph>();
        graph->capture_begin(pool);
        torch::Tensor logits = run(b);
        graph->capture_end();
        pool = graph->pool();
        g->logits[b] = logits;
        g->graphs[b] = std::move(graph);
      }
      stream.synchronize();
    }
    graphs_ = std::move(g);
    spdlog::info("engine: captured {} decode CUDA graphs (batch 1..{}) in {:.1f}s",
                 graphs_->sizes.size(), n,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return absl::OkStatus();
  });
#else
  return absl::OkStatus();
#endif
}

StatusOr<torch::Tensor> ModelRunner::DecodeLogits(const std::vector<int32_t>& input_ids,
                                                  const std::vector<PagedItem>& items) {
#ifdef SLIME_WITH_CUDA
  if (!graphs_) return absl::NotFoundError("no decode graphs");
  const int64_t b = static_cast<int64_t>(items.size());
  auto size_it = std::lower_bound(graphs_->sizes.begin(), graphs_->sizes.end(), b);
  if (size_it == graphs_->sizes.end()) return absl::NotFoundError("batch larger than captured");
  const int64_t bg = *size_it;
  DecodeGraphs& g = *graphs_;
  const int64_t page = kv().page_size();
  for (const PagedItem& item : items) {
    if (item.num_new != 1 || (item.context_len + page - 1) / page > g.max_pages) {
      return absl::NotFoundError("not a decode step the graphs cover");
    }
  }
  return Guard("engine graph decode", [&]() -> StatusOr<torch::Tensor> {
    const int64_t n = g.ids.size(0);
    int64_t* hl = g.host_inputs.data_ptr<int64_t>();
    int32_t* lens = reinterpret_cast<int32_t*>(hl + 3 * n);
    int32_t* hi = lens + n;  // page table rows
    for (int64_t i = 0; i < bg; ++i) {
      if (i < b) {
        const PagedItem& item = items[i];
        const int64_t pos = item.context_len - 1;
        const std::vector<int32_t>& pages = *item.pages;
        const int64_t np = (item.context_len + page - 1) / page;
        hl[i] = input_ids[i];
        hl[n + i] = pos;
        hl[2 * n + i] = static_cast<int64_t>(pages[pos / page]) * page + pos % page;
        std::copy(pages.begin(), pages.begin() + np, hi + i * g.max_pages);
        lens[i] = static_cast<int32_t>(item.context_len);
      } else {  // padding: token 0 at position 0, written to the reserved slot 0
        hl[i] = 0;
        hl[n + i] = 0;
        hl[2 * n + i] = 0;
        hi[i * g.max_pages] = 0;
        lens[i] = 1;
      }
    }
    c10::InferenceMode inference;
    const int64_t used = 3 * n + (n + bg * g.max_pages + 1) / 2;  // int64 words up to row bg
    g.device_inputs.narrow(0, 0, used)
        .copy_(g.host_inputs.narrow(0, 0, used), /*non_blocking=*/true);
    g.graphs.at(bg)->replay();
    return g.logits.at(bg).narrow(0, 0, b);
  });
#else
  return absl::NotFoundError("built without CUDA");
#endif
}

}  // namespace slime::engine
