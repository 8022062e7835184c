// Trainer checkpoints (see include/slime/train/checkpoint.h).
#include "slime/train/checkpoint.h"

#include <ATen/Context.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <ftw.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include "checkpoint_internal.h"
#include "slime/common/atomic_file.h"
#include "slime/model/checkpoint.h"
#include "slime/model/config.h"
#include "slime/model/safetensors.h"
#include "slime/model/weights.h"
#include "slime/train/optimizer.h"
#include "torch_guard.h"

namespace slime::train {

using internal::GuardTorch;

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr char kFormatName[] = "slime-cpp trainer checkpoint";
constexpr char kConfigFile[] = "config.json";
constexpr char kTmpPrefix[] = ".tmp-iter_";
constexpr char kTrashPrefix[] = ".trash-iter_";
constexpr char kCpuRngName[] = "cpu";

// ---------------------------------------------------------------------------------------------
// Small helpers: errors, dtypes, files.

std::string ShapeString(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// HF's name of a dtype in config.json.
StatusOr<std::string> HfDTypeName(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kBFloat16:
      return std::string("bfloat16");
    case torch::kFloat16:
      return std::string("float16");
    case torch::kFloat32:
      return std::string("float32");
    default:
      return absl::InvalidArgumentError(
          fmt::format("checkpoint: model dtype {} is not supported (bfloat16, float16, float32)",
                      std::string(c10::toString(dtype))));
  }
}

bool IsFloating(model::SafetensorsDType d) {
  return d == model::SafetensorsDType::kBF16 || d == model::SafetensorsDType::kF16 ||
         d == model::SafetensorsDType::kF32 || d == model::SafetensorsDType::kF64;
}

StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::error_code ec;
    if (!fs::exists(path, ec)) return absl::NotFoundError(fmt::format("{}: file is missing", path));
    return absl::InternalError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  }
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return absl::InternalError(fmt::format("{}: read error", path));
  return data;
}

// fsync of a file or directory (a directory's fsync makes its entries durable).
Status FsyncPath(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::InternalError(
        fmt::format("{}: cannot open for fsync: {}", path, std::strerror(errno)));
  }
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) {
    return absl::InternalError(fmt::format("{}: fsync failed: {}", path, std::strerror(err)));
  }
  return absl::OkStatus();
}

// Removes a file or a directory tree (like rm -rf; a missing path is fine). POSIX nftw rather
// than std::filesystem's remove_all: with a PyTorch-wheel LibTorch, std::filesystem symbols can
// bind to the copy libtorch exports, whose remove_all crashed on the GPU machine.
Status RemoveTree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::InternalError(fmt::format("{}: cannot stat: {}", path, std::strerror(errno)));
  }
  auto remove_one = [](const char* p, const struct stat*, int, struct FTW*) {
    return ::remove(p) == 0 ? 0 : -1;
  };
  if (::nftw(path.c_str(), remove_one, 16, FTW_DEPTH | FTW_PHYS) != 0) {
    return absl::InternalError(fmt::format("{}: cannot remove: {}", path, std::strerror(errno)));
  }
  return absl::OkStatus();
}

StatusOr<Json> ParseJsonObject(const std::string& text, const std::string& what) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(fmt::format("{}: not valid JSON: {}", what, e.what()));
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError(fmt::format("{}: must be a JSON object", what));
  }
  return j;
}

// ---------------------------------------------------------------------------------------------
// The model config: written as an HF config.json, compared field by field on load.

const char* HfArchitecture(model::ModelArch arch) {
  switch (arch) {
    case model::ModelArch::kLlama:
      return "LlamaForCausalLM";
    case model::ModelArch::kQwen2:
      return "Qwen2ForCausalLM";
    case model::ModelArch::kQwen3:
      return "Qwen3ForCausalLM";
    case model::ModelArch::kQwen3Moe:
      return "Qwen3MoeForCausalLM";
  }
  return "unknown";
}

Json HfConfigJson(const model::ModelConfig& c, const std::string& dtype_name) {
  Json j;
  j["architectures"] = Json::array({HfArchitecture(c.arch)});
  j["model_type"] = c.model_type;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["initializer_range"] = c.initializer_range;
  j["hidden_act"] = "silu";
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  if (c.arch == model::ModelArch::kQwen2) {
    j["use_sliding_window"] = false;
  } else {
    j["attention_bias"] = c.qkv_bias;  // llama/qwen3: one flag for q/k/v/o biases
  }
  j["rope_theta"] = c.rope.theta;
  switch (c.rope.type) {
    case model::RopeType::kDefault:
      j["rope_scaling"] = nullptr;
      break;
    case model::RopeType::kLinear:
      j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", c.rope.factor}};
      break;
    case model::RopeType::kLlama3:
      j["rope_scaling"] = {
          {"rope_type", "llama3"},
          {"factor", c.rope.factor},
          {"low_freq_factor", c.rope.low_freq_factor},
          {"high_freq_factor", c.rope.high_freq_factor},
          {"original_max_position_embeddings", c.rope.original_max_position_embeddings}};
      break;
  }
  if (c.eos_token_ids.size() == 1) {
    j["eos_token_id"] = c.eos_token_ids[0];
  } else if (c.eos_token_ids.size() > 1) {
    j["eos_token_id"] = c.eos_token_ids;
  }
  if (c.bos_token_id >= 0) j["bos_token_id"] = c.bos_token_id;
  if (c.arch == model::ModelArch::kQwen3Moe) {
    j["num_experts"] = c.moe.num_experts;
    j["num_experts_per_tok"] = c.moe.num_experts_per_tok;
    j["moe_intermediate_size"] = c.moe.moe_intermediate_size;
    j["norm_topk_prob"] = c.moe.norm_topk_prob;
    j["decoder_sparse_step"] = c.moe.decoder_sparse_step;
    j["mlp_only_layers"] = c.moe.mlp_only_layers;
    j["router_aux_loss_coef"] = c.moe.router_aux_loss_coef;
  }
  j["torch_dtype"] = dtype_name;
  return j;
}

// The first field that differs in a way that changes the weights or the math; empty when none.
// (max_position_embeddings, initializer_range and special tokens may change on resume.)
std::string ConfigMismatch(const model::ModelConfig& saved, const model::ModelConfig& now) {
  auto diff = [](const char* field, auto a, auto b) -> std::string {
    if (a == b) return "";
    return fmt::format("{} is {} in the checkpoint but {} in the model", field, a, b);
  };
  std::string d;
  auto check = [&](std::string r) {
    if (d.empty()) d = std::move(r);
  };
  check(diff("model_type", saved.model_type, now.model_type));
  check(diff("vocab_size", saved.vocab_size, now.vocab_size));
  check(diff("hidden_size", saved.hidden_size, now.hidden_size));
  check(diff("intermediate_size", saved.intermediate_size, now.intermediate_size));
  check(diff("num_hidden_layers", saved.num_hidden_layers, now.num_hidden_layers));
  check(diff("num_attention_heads", saved.num_attention_heads, now.num_attention_heads));
  check(diff("num_key_value_heads", saved.num_key_value_heads, now.num_key_value_heads));
  check(diff("head_dim", saved.head_dim, now.head_dim));
  check(diff("tie_word_embeddings", saved.tie_word_embeddings, now.tie_word_embeddings));
  check(diff("qkv bias (attention_bias)", saved.qkv_bias, now.qkv_bias));
  check(diff("o_proj bias (attention_bias)", saved.o_bias, now.o_bias));
  check(diff("qk_norm", saved.qk_norm, now.qk_norm));
  check(diff("num_experts", saved.moe.num_experts, now.moe.num_experts));
  check(diff("num_experts_per_tok", saved.moe.num_experts_per_tok, now.moe.num_experts_per_tok));
  check(diff("moe_intermediate_size", saved.moe.moe_intermediate_size,
             now.moe.moe_intermediate_size));
  check(diff("norm_topk_prob", saved.moe.norm_topk_prob, now.moe.norm_topk_prob));
  check(diff("decoder_sparse_step", saved.moe.decoder_sparse_step, now.moe.decoder_sparse_step));
  check(diff("mlp_only_layers", fmt::format("{}", fmt::join(saved.moe.mlp_only_layers, ",")),
             fmt::format("{}", fmt::join(now.moe.mlp_only_layers, ","))));
  check(diff("rms_norm_eps", saved.rms_norm_eps, now.rms_norm_eps));
  check(diff("rope_theta", saved.rope.theta, now.rope.theta));
  check(diff("rope type", static_cast<int>(saved.rope.type), static_cast<int>(now.rope.type)));
  check(diff("rope factor", saved.rope.factor, now.rope.factor));
  check(diff("rope low_freq_factor", saved.rope.low_freq_factor, now.rope.low_freq_factor));
  check(diff("rope high_freq_factor", saved.rope.high_freq_factor, now.rope.high_freq_factor));
  check(diff("rope original_max_position_embeddings", saved.rope.original_max_position_embeddings,
             now.rope.original_max_position_embeddings));
  return d;
}

// ---------------------------------------------------------------------------------------------
// RNG states: the CPU generator and, on CUDA, every visible device's generator.

at::Generator RngGenerator(const std::string& name) {
  if (name == kCpuRngName) return at::globalContext().defaultGenerator(at::Device(at::kCPU));
  const int index = std::stoi(name.substr(std::strlen("cuda:")));
  return at::globalContext().defaultGenerator(
      at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index)));
}

// Names of the generators of this process, "cpu" first.
std::vector<std::string> RngNames() {
  std::vector<std::string> names = {kCpuRngName};
  if (torch::cuda::is_available()) {
    const int64_t n = static_cast<int64_t>(torch::cuda::device_count());
    for (int64_t i = 0; i < n; ++i) names.push_back(fmt::format("cuda:{}", i));
  }
  return names;
}

torch::Tensor GetRngState(const std::string& name) {
  at::Generator gen = RngGenerator(name);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state().contiguous().clone();  // uint8 [n] on CPU
}

void SetRngState(const std::string& name, const torch::Tensor& state) {
  at::Generator gen = RngGenerator(name);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// ---------------------------------------------------------------------------------------------
// Safetensors files of the optimizer and RNG states.

struct CpuTensors {
  std::vector<torch::Tensor> keep;  // contiguous CPU copies the entries point into
  std::vector<model::SafetensorsWriteEntry> entries;
};

Status AddEntry(CpuTensors& out, const std::string& name, const torch::Tensor& t,
                model::SafetensorsDType dtype) {
  torch::Tensor cpu = t.detach().to(torch::kCPU).contiguous();
  model::SafetensorsWriteEntry e;
  e.name = name;
  e.dtype = dtype;
  e.shape.assign(cpu.sizes().begin(), cpu.sizes().end());
  e.data = cpu.data_ptr();
  e.nbytes = static_cast<size_t>(cpu.numel()) * cpu.element_size();
  out.keep.push_back(std::move(cpu));
  out.entries.push_back(std::move(e));
  return absl::OkStatus();
}

// A zero-copy tensor over one tensor of an open file (keeps the file mapped).
torch::Tensor FileTensor(const std::shared_ptr<const model::SafetensorsFile>& file,
                         const model::SafetensorsTensorInfo& info, torch::ScalarType dtype) {
  if (info.numel() == 0) return torch::empty(info.shape, torch::TensorOptions().dtype(dtype));
  auto holder = std::make_shared<std::shared_ptr<const model::SafetensorsFile>>(file);
  return torch::from_blob(
      const_cast<uint8_t*>(file->Data(info)), info.shape,
      [holder](void*) mutable { holder.reset(); }, torch::TensorOptions().dtype(dtype));
}

// NotFound naming `path` and why it should be there.
Status RequireFile(const std::string& path, const char* why) {
  std::error_code ec;
  if (fs::exists(path, ec)) return absl::OkStatus();
  return absl::NotFoundError(fmt::format("{}: file is missing ({})", path, why));
}

StatusOr<OptimizerState> ReadOptimizerState(const std::string& path) {
  SLIME_RETURN_IF_ERROR(
      RequireFile(path, "trainer_state.json says the checkpoint has optimizer state"));
  SLIME_ASSIGN_OR_RETURN(std::shared_ptr<const model::SafetensorsFile> file,
                         model::SafetensorsFile::Open(path));
  OptimizerState state;
  auto step = file->metadata().find("step");
  if (step == file->metadata().end()) {
    return absl::DataLossError(fmt::format("{}: metadata has no \"step\"", path));
  }
  try {
    size_t used = 0;
    state.step = std::stoll(step->second, &used);
    if (used != step->second.size()) throw std::invalid_argument("trailing characters");
  } catch (const std::exception&) {
    return absl::DataLossError(
        fmt::format("{}: metadata \"step\" = \"{}\" is not an integer", path, step->second));
  }
  for (const model::SafetensorsTensorInfo& info : file->tensors()) {
    if (info.dtype != model::SafetensorsDType::kF32) {
      return absl::DataLossError(fmt::format("{}: tensor \"{}\" has dtype {}, F32 is required",
                                             path, info.name,
                                             model::SafetensorsDTypeName(info.dtype)));
    }
    state.tensors.push_back({info.name, FileTensor(file, info, torch::kFloat32)});
  }
  return state;
}

// name -> uint8 state.
StatusOr<std::map<std::string, torch::Tensor>> ReadRngStates(const std::string& path) {
  SLIME_RETURN_IF_ERROR(RequireFile(path, "trainer_state.json says the checkpoint has RNG state"));
  SLIME_ASSIGN_OR_RETURN(std::shared_ptr<const model::SafetensorsFile> file,
                         model::SafetensorsFile::Open(path));
  std::map<std::string, torch::Tensor> out;
  for (const model::SafetensorsTensorInfo& info : file->tensors()) {
    if (info.dtype != model::SafetensorsDType::kU8 || info.shape.size() != 1) {
      return absl::DataLossError(
          fmt::format("{}: tensor \"{}\" must be a 1-D U8 byte string", path, info.name));
    }
    out[info.name] = FileTensor(file, info, torch::kUInt8).clone();
  }
  if (out.count(kCpuRngName) == 0) {
    return absl::DataLossError(fmt::format("{}: the \"cpu\" generator state is missing", path));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Directory bookkeeping.

// Iteration of a directory named iter_<digits>, or -1.
int64_t ParseIterationDirName(const std::string& name) {
  constexpr std::string_view kPrefix = "iter_";
  if (name.size() <= kPrefix.size() || name.compare(0, kPrefix.size(), kPrefix) != 0) return -1;
  int64_t v = 0;
  for (size_t i = kPrefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || v > (int64_t{1} << 56)) return -1;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

bool StartsWith(const std::string& s, const char* prefix) {
  return s.compare(0, std::strlen(prefix), prefix) == 0;
}

// Removes what an interrupted save left behind.
void RemoveStaleEntries(const fs::path& save_dir) {
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(save_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (StartsWith(name, kTmpPrefix) || StartsWith(name, kTrashPrefix)) {
      spdlog::warn("checkpoint: removing {} (left by an interrupted save)", e.path().string());
      Status rm = RemoveTree(e.path().string());
      if (!rm.ok()) spdlog::warn("checkpoint: {}", std::string(rm.message()));
    }
  }
}

void RotateCheckpoints(const fs::path& save_dir, int64_t just_saved, int keep_last) {
  if (keep_last <= 0) return;
  std::vector<int64_t> others;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(save_dir, ec)) {
    const int64_t it = ParseIterationDirName(e.path().filename().string());
    if (it >= 0 && it != just_saved && e.is_directory(ec)) others.push_back(it);
  }
  std::sort(others.begin(), others.end());
  const size_t keep_others = static_cast<size_t>(keep_last - 1);
  for (size_t i = 0; i + keep_others < others.size(); ++i) {
    const fs::path dir = save_dir / IterationDirName(others[i]);
    Status rm = RemoveTree(dir.string());
    if (!rm.ok()) {
      spdlog::warn("checkpoint: old checkpoint not removed: {}", std::string(rm.message()));
    } else {
      spdlog::info("checkpoint: removed {} (keep_last = {})", dir.string(), keep_last);
    }
  }
}

StatusOr<int64_t> ReadTracker(const fs::path& tracker) {
  SLIME_ASSIGN_OR_RETURN(std::string text, ReadFile(tracker.string()));
  const auto begin = text.find_first_not_of(" \t\r\n");
  const auto end = text.find_last_not_of(" \t\r\n");
  std::string s = begin == std::string::npos ? "" : text.substr(begin, end - begin + 1);
  if (s == "release") {
    return absl::UnimplementedError(
        fmt::format("{}: \"release\" checkpoints are not supported (expected an iteration number)",
                    tracker.string()));
  }
  bool digits = !s.empty() && s.size() <= 15 &&
                std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits) {
    return absl::DataLossError(fmt::format(
        "{}: expected a non-negative iteration number, found \"{}\"", tracker.string(), s));
  }
  return std::stoll(s);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Save (checkpoint_internal.h): what a checkpoint holds is collected first, then written into a
// temporary directory and published — on the caller's thread, or on the background writer's
// from host copies (checkpoint_writer.cc).

namespace internal {

StatusOr<CheckpointContent> CollectCheckpointContent(const SaveCheckpointOptions& options,
                                                     const model::ModelWeights& weights,
                                                     const model::ModelConfig& config,
                                                     const AdamW* optimizer,
                                                     const TrainerProgress& progress) {
  if (options.save_dir.empty()) {
    return absl::InvalidArgumentError("checkpoint save: save_dir is empty");
  }
  if (options.iteration < 0) {
    return absl::InvalidArgumentError(
        fmt::format("checkpoint save: iteration {} is negative", options.iteration));
  }
  if (options.keep_last < 0) {
    return absl::InvalidArgumentError(
        fmt::format("checkpoint save: keep_last {} is negative (0 keeps all)", options.keep_last));
  }
  if (options.save_optimizer && options.optimizer_state == nullptr && optimizer != nullptr &&
      optimizer->distributed()) {
    return absl::InvalidArgumentError(
        "checkpoint save: the optimizer is distributed (train.use_distributed_optimizer); pass "
        "its GatherState() as SaveCheckpointOptions::optimizer_state");
  }
  SLIME_RETURN_IF_ERROR(model::ValidateWeights(weights, config, 0, 1));
  SLIME_ASSIGN_OR_RETURN(
      Json lr_json, ParseJsonObject(progress.lr_scheduler_json, "checkpoint save: lr_scheduler"));
  SLIME_ASSIGN_OR_RETURN(
      Json data_json, ParseJsonObject(progress.data_source_json, "checkpoint save: data_source"));
  SLIME_ASSIGN_OR_RETURN(std::string dtype_name, HfDTypeName(weights.embed_tokens.scalar_type()));

  CheckpointContent c;
  c.save_dir = options.save_dir;
  c.iteration = options.iteration;
  c.keep_last = options.keep_last;
  c.max_shard_bytes = options.max_shard_bytes;
  c.weights = weights;
  c.config = config;
  const bool with_optimizer =
      options.save_optimizer && (optimizer != nullptr || options.optimizer_state != nullptr);
  if (with_optimizer) {
    c.optimizer =
        options.optimizer_state != nullptr ? *options.optimizer_state : optimizer->ExportState();
  }
  c.extra_weights = options.extra_weights;
  c.save_rng = options.save_rng;
  if (options.save_rng) {
    for (const std::string& name : RngNames()) c.rng.push_back({name, GetRngState(name)});
  }
  c.hf_config = HfConfigJson(config, dtype_name);
  Json& state = c.trainer_state;
  state["step"] = progress.step;
  state["rollout_id"] = progress.rollout_id;
  state["lr_scheduler"] = std::move(lr_json);
  state["data_source"] = std::move(data_json);
  state["format"] = kFormatName;
  state["format_version"] = kCheckpointFormatVersion;
  state["iteration"] = options.iteration;
  state["model_config"] = c.hf_config;
  state["model_dtype"] = dtype_name;
  state["has_optimizer_state"] = with_optimizer;
  state["has_rng_state"] = options.save_rng;
  Json extra = Json::array();
  for (const model::NamedTensor& nt : options.extra_weights) extra.push_back(nt.name);
  state["extra_weights"] = std::move(extra);
  return c;
}

}  // namespace internal

namespace {

// Writes the files of `c` into `dir`; `pause` (may be null) runs before each file.
Status WriteCheckpointFiles(const fs::path& dir, const internal::CheckpointContent& c,
                            const std::function<void()>& pause) {
  auto before_file = [&] {
    if (pause) pause();
  };
  before_file();
  SLIME_RETURN_IF_ERROR(
      WriteFileAtomically((dir / kConfigFile).string(), c.hf_config.dump(2) + "\n"));

  before_file();
  model::WriteCheckpointOptions wo;
  wo.max_shard_bytes = c.max_shard_bytes;
  SLIME_RETURN_IF_ERROR(model::SaveWeights(dir.string(), c.weights, c.config, wo));

  if (c.optimizer) {
    before_file();
    // Streamed: one tensor on the host at a time (the float32 masters and moments are 12 bytes a
    // parameter, 48 GB for a 4B model — beside a colocated run's pinned offload buffers, a
    // host copy of all of them ran a 128 GiB host out of memory). A background save's tensors
    // are host copies already; staging them is then a no-op.
    torch::Tensor staged;  // the tensor being written
    std::vector<model::SafetensorsStreamEntry> entries;
    for (const model::NamedTensor& nt : c.optimizer->tensors) {
      const torch::Tensor t = nt.tensor.detach();
      model::SafetensorsStreamEntry e;
      e.name = nt.name;
      e.dtype = model::SafetensorsDType::kF32;
      e.shape.assign(t.sizes().begin(), t.sizes().end());
      e.nbytes = static_cast<size_t>(t.numel()) * sizeof(float);
      e.fill = [&staged, t]() -> StatusOr<const void*> {
        return GuardTorch("copying to the host", [&]() -> StatusOr<const void*> {
          staged = torch::Tensor();  // the previous one goes first
          staged = t.to(torch::kCPU, torch::kFloat32).contiguous();
          return static_cast<const void*>(staged.data_ptr());
        });
      };
      entries.push_back(std::move(e));
    }
    SLIME_RETURN_IF_ERROR(model::WriteSafetensorsStreamed(
        (dir / kOptimizerStateFile).string(), entries,
        {{"format", "slime-cpp adamw"}, {"step", std::to_string(c.optimizer->step)}}));
  }
  if (!c.extra_weights.empty()) {
    before_file();
    CpuTensors cpu;
    for (const model::NamedTensor& nt : c.extra_weights) {
      SLIME_RETURN_IF_ERROR(AddEntry(cpu, nt.name, nt.tensor.detach().to(torch::kFloat32),
                                     model::SafetensorsDType::kF32));
    }
    SLIME_RETURN_IF_ERROR(model::WriteSafetensors((dir / kExtraWeightsFile).string(), cpu.entries,
                                                  {{"format", "slime-cpp extra weights"}}));
  }
  if (c.save_rng) {
    before_file();
    CpuTensors cpu;
    for (const model::NamedTensor& nt : c.rng) {
      SLIME_RETURN_IF_ERROR(AddEntry(cpu, nt.name, nt.tensor, model::SafetensorsDType::kU8));
    }
    SLIME_RETURN_IF_ERROR(model::WriteSafetensors((dir / kRngStateFile).string(), cpu.entries,
                                                  {{"format", "slime-cpp rng"}}));
  }
  before_file();
  SLIME_RETURN_IF_ERROR(
      WriteFileAtomically((dir / kTrainerStateFile).string(), c.trainer_state.dump(2) + "\n"));
  return FsyncPath(dir.string());
}

}  // namespace

namespace internal {

Status MakeSaveDir(const std::string& dir) {
  const fs::path save_dir(dir);
  std::error_code ec;
  fs::create_directories(save_dir, ec);
  if (ec) {
    return absl::InternalError(
        fmt::format("{}: cannot create directory: {}", save_dir.string(), ec.message()));
  }
  return absl::OkStatus();
}

StatusOr<std::string> WriteAndPublish(const CheckpointContent& c,
                                      const std::function<void()>& pause) {
  const fs::path save_dir(c.save_dir);
  SLIME_RETURN_IF_ERROR(MakeSaveDir(c.save_dir));
  RemoveStaleEntries(save_dir);

  const std::string name = IterationDirName(c.iteration);
  const fs::path tmp = save_dir / (std::string(kTmpPrefix) + name.substr(5));
  const fs::path final_dir = save_dir / name;
  std::error_code ec;
  fs::create_directories(tmp, ec);
  if (ec) {
    return absl::InternalError(
        fmt::format("{}: cannot create directory: {}", tmp.string(), ec.message()));
  }
  Status st = GuardTorch("checkpoint save " + tmp.string(),
                         [&]() { return WriteCheckpointFiles(tmp, c, pause); });
  if (!st.ok()) {
    (void)RemoveTree(tmp.string());
    return st;
  }
  if (pause) pause();

  // Publish: move an older copy of this iteration aside, rename, make the rename durable.
  const fs::path trash = save_dir / (std::string(kTrashPrefix) + name.substr(5));
  const bool replace = fs::exists(final_dir, ec);
  if (replace) {
    fs::rename(final_dir, trash, ec);
    if (ec) {
      (void)RemoveTree(tmp.string());
      return absl::InternalError(
          fmt::format("cannot move {} aside to replace it: {}", final_dir.string(), ec.message()));
    }
  }
  fs::rename(tmp, final_dir, ec);
  if (ec) {
    const std::string msg = ec.message();
    if (replace) fs::rename(trash, final_dir, ec);
    (void)RemoveTree(tmp.string());
    return absl::InternalError(
        fmt::format("cannot rename {} to {}: {}", tmp.string(), final_dir.string(), msg));
  }
  SLIME_RETURN_IF_ERROR(FsyncPath(save_dir.string()));
  if (replace) (void)RemoveTree(trash.string());

  SLIME_RETURN_IF_ERROR(WriteFileAtomically((save_dir / kCheckpointTrackerFile).string(),
                                            std::to_string(c.iteration)));
  SLIME_RETURN_IF_ERROR(FsyncPath(save_dir.string()));
  RotateCheckpoints(save_dir, c.iteration, c.keep_last);
  spdlog::info("checkpoint: saved {}", final_dir.string());
  return final_dir.string();
}

}  // namespace internal

namespace {

// ---------------------------------------------------------------------------------------------
// Load: everything read and checked into this before anything is changed.

struct PendingLoad {
  std::vector<torch::Tensor*> params;  // the model's tensors, in ParameterSpecs order
  std::vector<torch::Tensor> values;   // checkpoint values (CPU, stored dtype), same order
  std::optional<OptimizerState> optimizer_state;
  std::map<std::string, torch::Tensor> rng;
  std::vector<torch::Tensor> extra_targets;  // LoadCheckpointOptions::extra_weights' tensors
  std::vector<torch::Tensor> extra_values;   // float32 file tensors, same order
};

StatusOr<Json> ReadTrainerState(const fs::path& dir) {
  const std::string path = (dir / kTrainerStateFile).string();
  SLIME_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::exception& e) {
    return absl::DataLossError(fmt::format("{}: not valid JSON: {}", path, e.what()));
  }
  if (!j.is_object()) return absl::DataLossError(fmt::format("{}: not a JSON object", path));
  auto version = j.find("format_version");
  if (version == j.end() || !version->is_number_integer()) {
    return absl::DataLossError(fmt::format("{}: \"format_version\" is missing", path));
  }
  if (version->get<int>() != kCheckpointFormatVersion) {
    return absl::FailedPreconditionError(
        fmt::format("{}: format_version {} is not supported (this build reads version {})", path,
                    version->get<int>(), kCheckpointFormatVersion));
  }
  for (const char* key : {"iteration", "step", "rollout_id"}) {
    if (!j.contains(key) || !j[key].is_number_integer()) {
      return absl::DataLossError(fmt::format("{}: \"{}\" is missing or not an integer", path, key));
    }
  }
  for (const char* key : {"lr_scheduler", "data_source", "model_config"}) {
    if (!j.contains(key) || !j[key].is_object()) {
      return absl::DataLossError(fmt::format("{}: \"{}\" is missing or not an object", path, key));
    }
  }
  for (const char* key : {"has_optimizer_state", "has_rng_state"}) {
    if (!j.contains(key) || !j[key].is_boolean()) {
      return absl::DataLossError(fmt::format("{}: \"{}\" is missing or not a boolean", path, key));
    }
  }
  return j;
}

Status CheckConfig(const std::string& config_text, const std::string& source,
                   const model::ModelConfig& config) {
  SLIME_ASSIGN_OR_RETURN(model::ModelConfig saved,
                         model::ParseModelConfigJson(config_text, source));
  std::string mismatch = ConfigMismatch(saved, config);
  if (!mismatch.empty()) {
    return absl::FailedPreconditionError(
        fmt::format("{}: the checkpoint is of another model: {}", source, mismatch));
  }
  return absl::OkStatus();
}

Status ReadWeights(const fs::path& dir, model::ModelWeights& weights,
                   const model::ModelConfig& config, PendingLoad& out) {
  SLIME_ASSIGN_OR_RETURN(model::CheckpointReader reader,
                         model::CheckpointReader::Open(dir.string()));
  for (const model::ParamSpec& spec : model::ParameterSpecs(config)) {
    auto info = reader.Info(spec.hf_name);
    if (!info.ok()) {
      // The reader prefers the single file, as transformers does.
      std::error_code ec;
      const fs::path single = dir / model::kSafetensorsSingleFile;
      const fs::path where = fs::exists(single, ec) ? single : dir / model::kSafetensorsIndexFile;
      return absl::DataLossError(
          fmt::format("{}: weight \"{}\" is missing", where.string(), spec.hf_name));
    }
    SLIME_ASSIGN_OR_RETURN(std::string file, reader.FileOf(spec.hf_name));
    if ((*info)->shape != spec.shape) {
      return absl::DataLossError(fmt::format("{}: weight \"{}\" has shape {}, the model needs {}",
                                             file, spec.hf_name, ShapeString((*info)->shape),
                                             ShapeString(spec.shape)));
    }
    if (!IsFloating((*info)->dtype)) {
      return absl::DataLossError(fmt::format("{}: weight \"{}\" has dtype {}, not a float dtype",
                                             file, spec.hf_name,
                                             model::SafetensorsDTypeName((*info)->dtype)));
    }
    model::LoadTensorOptions lo;
    lo.expected_shape = spec.shape;
    SLIME_ASSIGN_OR_RETURN(torch::Tensor value, reader.Load(spec.hf_name, lo));
    out.params.push_back(&model::ParamSlot(weights, spec));
    out.values.push_back(std::move(value));
  }
  return absl::OkStatus();
}

Status ReadExtraWeights(const fs::path& dir, const std::vector<model::NamedTensor>& wanted,
                        PendingLoad& out) {
  const std::string path = (dir / kExtraWeightsFile).string();
  SLIME_RETURN_IF_ERROR(RequireFile(
      path, fmt::format("the loader needs \"{}\"; was the checkpoint saved by another kind of "
                        "model?",
                        wanted.front().name)
                .c_str()));
  SLIME_ASSIGN_OR_RETURN(std::shared_ptr<const model::SafetensorsFile> file,
                         model::SafetensorsFile::Open(path));
  for (const model::NamedTensor& nt : wanted) {
    const model::SafetensorsTensorInfo* info = file->Find(nt.name);
    if (info == nullptr) {
      return absl::DataLossError(fmt::format("{}: tensor \"{}\" is missing", path, nt.name));
    }
    const std::vector<int64_t> shape(nt.tensor.sizes().begin(), nt.tensor.sizes().end());
    if (info->shape != shape) {
      return absl::DataLossError(fmt::format("{}: tensor \"{}\" has shape {}, the model needs {}",
                                             path, nt.name, ShapeString(info->shape),
                                             ShapeString(shape)));
    }
    if (info->dtype != model::SafetensorsDType::kF32) {
      return absl::DataLossError(fmt::format("{}: tensor \"{}\" has dtype {}, F32 is required",
                                             path, nt.name,
                                             model::SafetensorsDTypeName(info->dtype)));
    }
    out.extra_targets.push_back(nt.tensor);
    out.extra_values.push_back(FileTensor(file, *info, torch::kFloat32));
  }
  return absl::OkStatus();
}

Status ReadOptimizer(const fs::path& dir, const model::ModelConfig& config,
                     const model::ModelWeights& weights, const AdamW& optimizer,
                     const PendingLoad& pending, OptimizerState& state) {
  const std::string path = (dir / kOptimizerStateFile).string();
  SLIME_ASSIGN_OR_RETURN(state, ReadOptimizerState(path));
  // Saved without separate masters (float32 run) into a model that keeps them: the float32
  // weights are the masters.
  std::set<std::string> names;
  for (const model::NamedTensor& nt : state.tensors) names.insert(nt.name);
  const std::vector<model::ParamSpec> specs = model::ParameterSpecs(config);
  for (size_t i = 0; i < specs.size(); ++i) {
    const std::string& name = specs[i].hf_name;
    const std::string master = name + ".master";
    if (!optimizer.IsTrainable(name) || names.count(master) > 0) continue;
    if (pending.values[i].scalar_type() == torch::kFloat32 &&
        model::ParamSlot(weights, specs[i]).scalar_type() != torch::kFloat32) {
      state.tensors.push_back({master, pending.values[i]});
    }
  }
  Status st = optimizer.ValidateState(state);
  if (!st.ok()) {
    return absl::Status(st.code(), fmt::format("{}: {} (load with no_load_optim to skip the "
                                               "optimizer state)",
                                               path, std::string(st.message())));
  }
  return absl::OkStatus();
}

Status ReadRng(const fs::path& dir, std::map<std::string, torch::Tensor>& out) {
  const std::string path = (dir / kRngStateFile).string();
  SLIME_ASSIGN_OR_RETURN(out, ReadRngStates(path));
  for (const std::string& name : RngNames()) {
    auto it = out.find(name);
    if (it == out.end()) {
      spdlog::warn("checkpoint: {} has no state for generator {}; it keeps its current state", path,
                   name);
      continue;
    }
    const int64_t expected = GetRngState(name).numel();
    if (it->second.numel() != expected) {
      return absl::DataLossError(
          fmt::format("{}: generator \"{}\" state has {} bytes, this build's generator uses {}",
                      path, name, it->second.numel(), expected));
    }
  }
  const std::vector<std::string> here = RngNames();
  for (auto it = out.begin(); it != out.end();) {
    if (std::find(here.begin(), here.end(), it->first) == here.end()) {
      spdlog::warn("checkpoint: {} holds a state for generator {}, which this process lacks", path,
                   it->first);
      it = out.erase(it);
    } else {
      ++it;
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string IterationDirName(int64_t iteration) { return fmt::format("iter_{:07d}", iteration); }

StatusOr<std::string> SaveTrainerCheckpoint(const SaveCheckpointOptions& options,
                                            const model::ModelWeights& weights,
                                            const model::ModelConfig& config,
                                            const AdamW* optimizer,
                                            const TrainerProgress& progress) {
  SLIME_ASSIGN_OR_RETURN(
      internal::CheckpointContent content,
      internal::CollectCheckpointContent(options, weights, config, optimizer, progress));
  return internal::WriteAndPublish(content, nullptr);
}

StatusOr<std::string> ResolveCheckpointDir(const std::string& load_dir,
                                           std::optional<int64_t> ckpt_step) {
  if (load_dir.empty()) return absl::InvalidArgumentError("checkpoint load: load_dir is empty");
  std::error_code ec;
  const fs::path dir(load_dir);
  if (fs::exists(dir / kTrainerStateFile, ec)) return dir.string();  // an iteration directory
  const fs::path tracker = dir / kCheckpointTrackerFile;
  int64_t iteration = 0;
  if (ckpt_step.has_value()) {
    if (*ckpt_step < 0) {
      return absl::InvalidArgumentError(
          fmt::format("checkpoint load: ckpt_step {} is negative", *ckpt_step));
    }
    iteration = *ckpt_step;
  } else if (fs::exists(tracker, ec)) {
    SLIME_ASSIGN_OR_RETURN(iteration, ReadTracker(tracker));
  } else {
    return absl::NotFoundError(
        fmt::format("{}: not a trainer checkpoint (neither {} nor {} is there)", load_dir,
                    kCheckpointTrackerFile, kTrainerStateFile));
  }
  const fs::path iter_dir = dir / IterationDirName(iteration);
  if (!fs::exists(iter_dir / kTrainerStateFile, ec)) {
    return absl::NotFoundError(
        fmt::format("{}: checkpoint of iteration {} is missing or incomplete (no {}){}",
                    iter_dir.string(), iteration, kTrainerStateFile,
                    ckpt_step.has_value() ? " (asked for by ckpt_step)"
                                          : fmt::format(" ({} names it)", tracker.string())));
  }
  return iter_dir.string();
}

StatusOr<LoadedCheckpoint> LoadTrainerCheckpoint(const LoadCheckpointOptions& options,
                                                 model::ModelWeights& weights,
                                                 const model::ModelConfig& config,
                                                 AdamW* optimizer) {
  SLIME_ASSIGN_OR_RETURN(std::string dir_string,
                         ResolveCheckpointDir(options.load_dir, options.ckpt_step));
  const fs::path dir(dir_string);
  const std::string state_path = (dir / kTrainerStateFile).string();
  SLIME_RETURN_IF_ERROR(model::ValidateWeights(weights, config, 0, 1));

  // 1. trainer_state.json and the model config (both copies).
  SLIME_ASSIGN_OR_RETURN(Json state, ReadTrainerState(dir));
  LoadedCheckpoint loaded;
  loaded.dir = dir.string();
  loaded.iteration = state["iteration"].get<int64_t>();
  if (options.ckpt_step.has_value() && loaded.iteration != *options.ckpt_step) {
    return absl::FailedPreconditionError(
        fmt::format("{}: holds iteration {}, but ckpt_step asks for {}", state_path,
                    loaded.iteration, *options.ckpt_step));
  }
  loaded.progress.step = state["step"].get<int64_t>();
  loaded.progress.rollout_id = state["rollout_id"].get<int64_t>();
  loaded.progress.lr_scheduler_json = state["lr_scheduler"].dump();
  loaded.progress.data_source_json = state["data_source"].dump();
  SLIME_RETURN_IF_ERROR(
      CheckConfig(state["model_config"].dump(), state_path + " (model_config)", config));
  const std::string config_path = (dir / kConfigFile).string();
  SLIME_ASSIGN_OR_RETURN(std::string config_text, ReadFile(config_path));
  SLIME_RETURN_IF_ERROR(CheckConfig(config_text, config_path, config));

  const bool want_optimizer = options.load_optimizer && optimizer != nullptr;
  if (want_optimizer && !state["has_optimizer_state"].get<bool>()) {
    return absl::FailedPreconditionError(
        fmt::format("{}: the checkpoint was saved without optimizer state (no_save_optim); set "
                    "checkpoint.no_load_optim to load the weights only",
                    dir.string()));
  }
  if (options.load_rng && !state["has_rng_state"].get<bool>()) {
    return absl::FailedPreconditionError(
        fmt::format("{}: the checkpoint was saved without RNG state; load it with load_rng = false",
                    dir.string()));
  }

  // 2. Everything into temporaries, checked.
  PendingLoad pending;
  SLIME_RETURN_IF_ERROR(GuardTorch("checkpoint load " + dir.string(), [&]() -> Status {
    SLIME_RETURN_IF_ERROR(ReadWeights(dir, weights, config, pending));
    if (!options.extra_weights.empty()) {
      SLIME_RETURN_IF_ERROR(ReadExtraWeights(dir, options.extra_weights, pending));
    }
    if (want_optimizer) {
      pending.optimizer_state.emplace();
      SLIME_RETURN_IF_ERROR(
          ReadOptimizer(dir, config, weights, *optimizer, pending, *pending.optimizer_state));
    }
    if (options.load_rng) SLIME_RETURN_IF_ERROR(ReadRng(dir, pending.rng));
    return absl::OkStatus();
  }));

  // 3. Apply. Only device copies remain, which fail only on a broken device.
  SLIME_RETURN_IF_ERROR(GuardTorch("checkpoint load (applying) " + dir.string(), [&]() -> Status {
    {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < pending.params.size(); ++i)
        pending.params[i]->copy_(pending.values[i]);
      for (size_t i = 0; i < pending.extra_targets.size(); ++i) {
        pending.extra_targets[i].copy_(pending.extra_values[i]);
      }
    }
    if (want_optimizer) {
      SLIME_RETURN_IF_ERROR(optimizer->ImportState(*pending.optimizer_state));
      loaded.optimizer_loaded = true;
    } else if (optimizer != nullptr) {
      optimizer->ReloadMastersFromParams();
    }
    for (const auto& [name, rng_state] : pending.rng) SetRngState(name, rng_state);
    loaded.rng_loaded = options.load_rng;
    return absl::OkStatus();
  }));
  spdlog::info("checkpoint: loaded {} (iteration {}, step {}{}{})", dir.string(), loaded.iteration,
               loaded.progress.step, loaded.optimizer_loaded ? ", optimizer" : "",
               loaded.rng_loaded ? ", rng" : "");
  return loaded;
}

}  // namespace slime::train
