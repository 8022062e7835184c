// The model runner (see include/slime/engine/model_runner.h).
#include "slime/engine/model_runner.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#ifdef SLIME_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
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
  if (options.page_size < 1 || options.page_size > 256) {
    return absl::InvalidArgumentError(
        fmt::format("page_size must be in [1, 256], got {}", options.page_size));
  }
  std::unique_ptr<ModelRunner> runner(new ModelRunner());
  SLIME_ASSIGN_OR_RETURN(runner->model_, model::DecoderModel::Load(options.model_path, dtype, device));
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
    PagedLayout layout = PagedLayout::Build(items, kv_->page_size(), device());
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
    return absl::OkStatus();
  });
}

namespace {

Status MoveWeights(model::DecoderModel& m, torch::Device to) {
  for (const model::ParamSpec& spec : model::ParameterSpecs(m.config())) {
    torch::Tensor& t = model::ParamSlot(m.mutable_weights(), spec);
    if (t.defined()) t = t.to(to);
  }
  model::ModelWeights& w = m.mutable_weights();
  if (m.config().tie_word_embeddings) w.lm_head = w.embed_tokens;
  return absl::OkStatus();
}

}  // namespace

Status ModelRunner::OffloadWeights() {
  if (weights_offloaded_) return absl::OkStatus();
  return Guard("offloading weights", [&]() -> Status {
    if (device().is_cpu()) {
      weights_offloaded_ = true;  // already in host memory; only the state changes
      return absl::OkStatus();
    }
    SLIME_RETURN_IF_ERROR(MoveWeights(*model_, torch::kCPU));
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
    if (!device().is_cpu()) SLIME_RETURN_IF_ERROR(MoveWeights(*model_, device()));
    weights_offloaded_ = false;
    return absl::OkStatus();
  });
}

Status ModelRunner::LoadWeightsFromDisk(const std::string& model_path) {
  return Guard("updating weights from disk", [&]() -> Status {
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

}  // namespace slime::engine
