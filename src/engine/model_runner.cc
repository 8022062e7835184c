// The model runner (see include/slime/engine/model_runner.h).
#include "slime/engine/model_runner.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <c10/core/DeviceGuard.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <map>

#ifdef SLIME_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

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

StatusOr<std::unique_ptr<ModelRunner>> ModelRunner::Create(const ModelRunnerOptions& options) {
  SLIME_ASSIGN_OR_RETURN(torch::Device device, ParseDevice(options.device));
  SLIME_ASSIGN_OR_RETURN(torch::ScalarType dtype, ParseDtype(options.dtype, device));
  c10::DeviceGuard device_guard(device);  // loading, the KV cache and graph capture on `device`
  if (options.page_size < 1 || options.page_size > 256) {
    return absl::InvalidArgumentError(
        fmt::format("page_size must be in [1, 256], got {}", options.page_size));
  }
  std::unique_ptr<ModelRunner> runner(new ModelRunner());
  SLIME_ASSIGN_OR_RETURN(runner->model_, model::DecoderModel::Load(options.model_path, dtype, device));
  runner->fuse_projections_ = options.fuse_projections;
  if (options.fuse_projections) runner->model_->FuseProjections();  // CUDA only; else a no-op
  const model::ModelConfig& c = runner->model_->config();
  const int64_t per_token =
      PagedKvCache::BytesPerToken(c.num_hidden_layers, runner->model_->local_kv_heads(),
                                  c.head_dim, dtype);
  int64_t tokens = options.max_total_tokens;
  if (tokens <= 0) {
    tokens = 65536;
#ifdef SLIME_WITH_CUDA
    if (device.is_cuda()) {
      size_t free_bytes = 0, total_bytes = 0;
      if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
        return absl::InternalError("cudaMemGetInfo failed while sizing the KV cache");
      }
      // The weights are already resident: budget = fraction of the total minus what is used.
      const double budget = options.mem_fraction_static * static_cast<double>(total_bytes) -
                            static_cast<double>(total_bytes - free_bytes);
      tokens = static_cast<int64_t>(budget / static_cast<double>(per_token));
      if (tokens < 4 * options.page_size) {
        return absl::ResourceExhaustedError(fmt::format(
            "not enough GPU memory for a KV cache: mem_fraction_static {} leaves {:.0f} MiB "
            "({} bytes per token)",
            options.mem_fraction_static, budget / (1 << 20), per_token));
      }
    }
#endif
  }
  // +1: page 0 is the reserved padding page.
  const int64_t pages = tokens / options.page_size + 1;
  SLIME_RETURN_IF_ERROR(Guard("allocating the KV cache", [&]() -> Status {
    runner->kv_ = std::make_unique<PagedKvCache>(
        c.num_hidden_layers, pages, options.page_size, runner->model_->local_kv_heads(),
        c.head_dim, torch::TensorOptions().dtype(dtype).device(device));
    return absl::OkStatus();
  }));
  spdlog::info("engine: model {} ({} layers, {:.1f}M parameters) on {} in {}; KV cache {} pages x "
               "{} tokens = {} tokens, {:.1f} MiB",
               options.model_path, c.num_hidden_layers, c.NumParameters() / 1e6, device.str(),
               std::string(c10::toString(dtype)), pages - 1, options.page_size,
               (pages - 1) * options.page_size,
               static_cast<double>(pages * options.page_size * per_token) / (1 << 20));
  return runner;
}

StatusOr<torch::Tensor> ModelRunner::Forward(const std::vector<int32_t>& input_ids,
                                             const std::vector<PagedItem>& items) {
  return Guard("engine forward", [&]() -> StatusOr<torch::Tensor> {
    if (kv_->released()) return absl::FailedPreconditionError("KV cache is released");
    if (weights_offloaded_) return absl::FailedPreconditionError("weights are offloaded");
    c10::InferenceMode guard;
    const bool kernel = model_->attention_impl() != model::AttentionImpl::kMath &&
                        PagedDecodeKernelAvailable(config().head_dim, model_->local_heads(),
                                                   model_->local_kv_heads(), device());
    PagedLayout layout = PagedLayout::Build(items, kv_->page_size(), device(), kernel);
    torch::Tensor ids =
        torch::from_blob(const_cast<int32_t*>(input_ids.data()),
                         {static_cast<int64_t>(input_ids.size())}, torch::kInt)
            .to(device(), torch::kLong);
    PagedAttention attention(kv_.get(), &layout, model_->attention_impl());
    return model_->ForwardUnchecked(ids, layout.positions, attention);
  });
}

StatusOr<torch::Tensor> ModelRunner::Logits(const torch::Tensor& hidden,
                                            const std::vector<int64_t>& rows) {
  return Guard("engine logits", [&]() -> StatusOr<torch::Tensor> {
    c10::InferenceMode guard;
    std::vector<int64_t> r = rows;
    torch::Tensor idx = torch::from_blob(r.data(), {static_cast<int64_t>(r.size())}, torch::kLong)
                            .to(device());
    SLIME_ASSIGN_OR_RETURN(torch::Tensor logits, model_->Logits(hidden.index_select(0, idx)));
    return logits.to(torch::kFloat32);
  });
}

Status ModelRunner::ReleaseKv() {
  return Guard("releasing the KV cache", [&]() -> Status {
    DropGraphs();  // they point into the pools
    kv_->Release();
#ifdef SLIME_WITH_CUDA
    if (device().is_cuda()) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
    return absl::OkStatus();
  });
}

Status ModelRunner::ResumeKv() {
  return Guard("re-allocating the KV cache", [&]() -> Status {
    kv_->Resume();
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
    SLIME_RETURN_IF_ERROR(weight_offloader_.Offload(WeightTensors(*model_)));
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
    SLIME_RETURN_IF_ERROR(weight_offloader_.Onload());
    weights_offloaded_ = false;
    if (graph_max_batch_ > 0 && !kv_->released() && !graphs_) {
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

Status ModelRunner::LoadWeightsFromDisk(const std::string& model_path) {
  return Guard("updating weights from disk", [&]() -> Status {
    SLIME_RETURN_IF_ERROR(CheckWeightsResident());
    SLIME_ASSIGN_OR_RETURN(model::ModelConfig config, model::LoadModelConfig(model_path));
    const model::ModelConfig& mine = model_->config();
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
    model::WeightOptions wo;
    wo.dtype = dtype();
    wo.device = torch::kCPU;
    SLIME_ASSIGN_OR_RETURN(model::ModelWeights fresh, model::LoadWeights(reader, mine, wo));
    c10::InferenceMode guard;
    for (const model::ParamSpec& spec : model::ParameterSpecs(mine)) {
      torch::Tensor& dst = model::ParamSlot(model_->mutable_weights(), spec);
      const torch::Tensor& src = model::ParamSlot(fresh, spec);
      dst.copy_(src);
    }
    return absl::OkStatus();
  });
}

Status ModelRunner::UpdateWeights(const std::vector<model::NamedTensor>& tensors) {
  return Guard("updating weights", [&]() -> Status {
    SLIME_RETURN_IF_ERROR(CheckWeightsResident());
    const model::ModelConfig& c = model_->config();
    const std::vector<model::ParamSpec> specs = model::ParameterSpecs(c);
    std::map<std::string, const model::ParamSpec*> by_name;
    for (const model::ParamSpec& spec : specs) by_name[spec.hf_name] = &spec;
    const int tp_rank = model_->tp_group().rank();
    const int tp_size = model_->tp_group().size();
    std::vector<std::pair<torch::Tensor*, torch::Tensor>> plan;  // (destination, source)
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
      torch::Tensor& dst = model::ParamSlot(model_->mutable_weights(), spec);
      if (nt.tensor.scalar_type() != dst.scalar_type()) {
        return absl::InvalidArgumentError(fmt::format(
            "parameter '{}': dtype {} does not match the engine's {} (send {})", nt.name,
            std::string(c10::toString(nt.tensor.scalar_type())),
            std::string(c10::toString(dst.scalar_type())),
            std::string(c10::toString(dst.scalar_type()))));
      }
      torch::Tensor src = nt.tensor;
      if (tp_size > 1 && spec.shard != model::ShardDim::kReplicated) {
        src = src.chunk(tp_size, static_cast<int64_t>(spec.shard))[tp_rank];
      }
      plan.emplace_back(&dst, std::move(src));
    }
    c10::InferenceMode guard;
    for (auto& [dst, src] : plan) dst->copy_(src);
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
  torch::Tensor ids, positions, slots;  // [max_B] int64 on the device
  torch::Tensor page_table;             // [max_B, max_pages] int32
  torch::Tensor seq_lens;               // [max_B] int32
  torch::Tensor decode_rows;            // [max_B] int64 = 0..max_B-1
  torch::Tensor host_long;              // pinned [3, max_B] int64: ids, positions, slots
  torch::Tensor host_int;               // pinned [max_B * max_pages + max_B] int32
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
  graph_max_batch_ = max_batch;
  graph_context_ = context_length;
  DropGraphs();
#ifdef SLIME_WITH_CUDA
  if (max_batch <= 0 || !device().is_cuda() ||
      model_->attention_impl() == model::AttentionImpl::kMath ||
      !PagedDecodeKernelAvailable(config().head_dim, model_->local_heads(),
                                  model_->local_kv_heads(), device())) {
    return absl::OkStatus();
  }
  if (kv_->released() || weights_offloaded_) return absl::OkStatus();  // captured on resume
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
    const int64_t page = kv_->page_size();
    g->max_pages = (context_length + page - 1) / page;
    auto lopts = torch::TensorOptions().dtype(torch::kLong).device(device());
    auto iopts = torch::TensorOptions().dtype(torch::kInt).device(device());
    g->ids = torch::zeros({n}, lopts);
    g->positions = torch::zeros({n}, lopts);
    g->slots = torch::zeros({n}, lopts);
    g->page_table = torch::zeros({n, g->max_pages}, iopts);
    g->seq_lens = torch::ones({n}, iopts);
    g->decode_rows = torch::arange(n, lopts);
    g->host_long = torch::zeros({3, n}, torch::TensorOptions().dtype(torch::kLong).pinned_memory(true));
    g->host_int = torch::zeros({n * g->max_pages + n},
                               torch::TensorOptions().dtype(torch::kInt).pinned_memory(true));

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
      PagedAttention attention(kv_.get(), &lay, model_->attention_impl());
      torch::Tensor hidden =
          model_->ForwardUnchecked(gp->ids.narrow(0, 0, b), lay.positions, attention);
      return model_->Logits(hidden).value().to(torch::kFloat32);
    };
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
  const int64_t page = kv_->page_size();
  for (const PagedItem& item : items) {
    if (item.num_new != 1 || (item.context_len + page - 1) / page > g.max_pages) {
      return absl::NotFoundError("not a decode step the graphs cover");
    }
  }
  return Guard("engine graph decode", [&]() -> StatusOr<torch::Tensor> {
    const int64_t n = g.ids.size(0);
    int64_t* hl = g.host_long.data_ptr<int64_t>();
    int32_t* hi = g.host_int.data_ptr<int32_t>();
    int32_t* lens = hi + n * g.max_pages;
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
    g.ids.narrow(0, 0, bg).copy_(g.host_long[0].narrow(0, 0, bg), /*non_blocking=*/true);
    g.positions.narrow(0, 0, bg).copy_(g.host_long[1].narrow(0, 0, bg), true);
    g.slots.narrow(0, 0, bg).copy_(g.host_long[2].narrow(0, 0, bg), true);
    g.page_table.view({-1}).narrow(0, 0, bg * g.max_pages)
        .copy_(g.host_int.narrow(0, 0, bg * g.max_pages), true);
    g.seq_lens.narrow(0, 0, bg).copy_(g.host_int.narrow(0, n * g.max_pages, bg), true);
    g.graphs.at(bg)->replay();
    return g.logits.at(bg).narrow(0, 0, b);
  });
#else
  return absl::NotFoundError("built without CUDA");
#endif
}

}  // namespace slime::engine
