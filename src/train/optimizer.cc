// AdamW with float32 masters and moments (see include/slime/train/optimizer.h).
#include "slime/train/optimizer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <utility>

#include "slime/common/check.h"
#include "slime/config/config.h"
#include "slime/model/config.h"
#include "slime/model/fused_train.h"
#include "slime/model/weights.h"
#include "torch_guard.h"

namespace slime::train {

using internal::GuardTorch;

namespace {

constexpr char kMasterSuffix[] = ".master";
constexpr char kExpAvgSuffix[] = ".exp_avg";
constexpr char kExpAvgSqSuffix[] = ".exp_avg_sq";

std::string ShapeString(c10::IntArrayRef shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

StatusOr<std::vector<std::regex>> CompileAll(const std::vector<std::string>& patterns,
                                             const char* list_name) {
  std::vector<std::regex> out;
  for (const std::string& p : patterns) {
    try {
      out.emplace_back(p, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      return absl::InvalidArgumentError(
          fmt::format("{}: \"{}\" is not a valid regular expression: {}", list_name, p, e.what()));
    }
  }
  return out;
}

bool AnySearch(const std::vector<std::regex>& regexes, const std::string& name) {
  for (const std::regex& r : regexes) {
    if (std::regex_search(name, r)) return true;
  }
  return false;
}

// The end of both Step paths' gradient norm: the squared norm (already summed over DP where the
// optimizer is sharded) goes through the TP reduction, its square root is recorded as the
// step's grad_norm, and the clip coefficient (1 without clipping) comes back — nullopt when the
// norm is not finite, which the caller answers by skipping the step without touching state.
StatusOr<std::optional<double>> FinishGradNorm(const AdamWOptions& options,
                                               torch::Tensor& squared_norm,
                                               OptimizerStepResult& result) {
  if (options.reduce_squared_grad_norm) {
    SLIME_RETURN_IF_ERROR(options.reduce_squared_grad_norm(squared_norm));
  }
  const double norm = std::sqrt(squared_norm.item<double>());
  result.grad_norm = norm;
  if (!std::isfinite(norm)) return std::nullopt;
  if (options.clip_grad <= 0.0) return 1.0;
  return std::min(1.0, options.clip_grad / (norm + 1e-6));
}

}  // namespace

// One parameter and its state. `master` is undefined when the parameter is float32 (the
// parameter is its own master); exp_avg / exp_avg_sq are undefined for frozen parameters.
struct AdamW::Slot {
  std::string name;
  torch::Tensor param;       // the model's tensor, any floating dtype
  torch::Tensor master;      // float32 copy of param, same shape/device, or undefined
  torch::Tensor exp_avg;     // float32, param's shape
  torch::Tensor exp_avg_sq;  // float32, param's shape
  bool trainable = true;
  bool replicated = false;
  bool pipeline_copy = false;  // OptimizerParam::pipeline_copy: never counted in the norm
  bool expert = false;         // OptimizerParam::expert: counted on every EP rank
  bool decay = true;  // weight decay applies (not a bias, not 1-D)
  std::vector<int64_t> shape;  // the parameter's shape at Create

  // The float32 tensor the update is applied to.
  const torch::Tensor& Target() const { return master.defined() ? master : param; }
  // Whether this rank adds the gradient's squares to the norm: a replicated parameter on TP rank
  // 0, a non-expert one on EP rank 0, never a pipeline copy (AdamWOptions).
  bool CountedInNorm(const AdamWOptions& o) const {
    return !(replicated && o.tp_rank != 0) && !(!expert && o.ep_rank != 0) && !pipeline_copy;
  }
};

// The distributed optimizer's layout and state (optimizer.h, "Distributed optimizer"). Flat
// index space: the trainable parameters in parameter order, N elements, padded to dp_size * S.
struct AdamW::Shard {
  // The part of one trainable parameter inside a flat range.
  struct Piece {
    size_t slot = 0;           // index into slots_
    int64_t param_offset = 0;  // first element inside the flattened parameter
    int64_t offset = 0;        // first element inside the range
    int64_t length = 0;
  };
  torch::ScalarType dtype = torch::kFloat32;  // communication buffers and updated values
  torch::Device device = torch::kCPU;
  int64_t numel = 0;                  // N
  int64_t size = 0;                   // S = ceil(N / dp_size)
  std::vector<size_t> flat_slots;     // trainable slots in flat order
  std::vector<int64_t> flat_offsets;  // flat offset of each, then N
  std::vector<Piece> own;             // Pieces(dp_rank * S, S)
  bool any_master = false;            // some trainable parameter is not float32
  torch::Tensor master;               // [S] float32: the own range of the parameters
  torch::Tensor exp_avg;              // [S] float32
  torch::Tensor exp_avg_sq;           // [S] float32

  // The parts of parameters inside [begin, begin + length) of the flat space, in order (the
  // padding beyond N has none).
  std::vector<Piece> Pieces(int64_t begin, int64_t length) const {
    std::vector<Piece> out;
    const int64_t end = std::min(begin + length, numel);
    if (begin >= end) return out;
    size_t k =
        static_cast<size_t>(std::upper_bound(flat_offsets.begin(), flat_offsets.end(), begin) -
                            flat_offsets.begin() - 1);
    for (int64_t pos = begin; pos < end && k + 1 < flat_offsets.size(); ++k) {
      const int64_t n = std::min(end, flat_offsets[k + 1]) - pos;
      if (n <= 0) continue;
      out.push_back(Piece{flat_slots[k], pos - flat_offsets[k], pos - begin, n});
      pos += n;
    }
    return out;
  }
};

DpReduceScatterSumFn ReduceScatterThroughAllReduce(DpAllReduceSumFn all_reduce, int dp_size,
                                                   int dp_rank) {
  return [all_reduce = std::move(all_reduce), dp_size, dp_rank](const torch::Tensor& input,
                                                                torch::Tensor& output) -> Status {
    const int64_t n = output.numel();
    if (input.numel() != n * dp_size) {
      return absl::InvalidArgumentError(
          fmt::format("reduce-scatter: input of {} elements for an output of {} over {} ranks",
                      input.numel(), n, dp_size));
    }
    torch::Tensor sum = input.contiguous().clone();
    SLIME_RETURN_IF_ERROR(all_reduce(sum));
    output.copy_(sum.narrow(0, dp_rank * n, n));
    return absl::OkStatus();
  };
}

DpAllGatherFn AllGatherThroughAllReduce(DpAllReduceSumFn all_reduce, int dp_size, int dp_rank) {
  return [all_reduce = std::move(all_reduce), dp_size, dp_rank](const torch::Tensor& input,
                                                                torch::Tensor& output) -> Status {
    const int64_t n = input.numel();
    if (output.numel() != n * dp_size) {
      return absl::InvalidArgumentError(
          fmt::format("all-gather: output of {} elements for an input of {} over {} ranks",
                      output.numel(), n, dp_size));
    }
    torch::Tensor full = torch::zeros({n * dp_size}, input.options());
    full.narrow(0, dp_rank * n, n).copy_(input.reshape({-1}));
    SLIME_RETURN_IF_ERROR(all_reduce(full));
    output.copy_(full);
    return absl::OkStatus();
  };
}

AdamWOptions AdamWOptions::FromTrainConfig(const config::TrainConfig& train) {
  AdamWOptions o;
  o.beta1 = train.adam_beta1;
  o.beta2 = train.adam_beta2;
  o.eps = train.adam_eps;
  o.weight_decay = train.weight_decay;
  o.clip_grad = train.clip_grad;
  o.stateless = train.use_stateless_adam;
  o.only_train_params_name_list = train.only_train_params_name_list;
  o.freeze_params_name_list = train.freeze_params_name_list;
  o.distributed = train.use_distributed_optimizer;
  o.bucket_size = train.ddp_bucket_size;
  return o;
}

Status AdamWOptions::Validate() const {
  auto bad = [](const char* field, double value, const char* valid) {
    return absl::InvalidArgumentError(
        fmt::format("optimizer: {} = {} is out of range (valid: {})", field, value, valid));
  };
  if (!(beta1 >= 0.0 && beta1 < 1.0)) return bad("adam_beta1", beta1, "0 <= beta1 < 1");
  if (!(beta2 >= 0.0 && beta2 < 1.0)) return bad("adam_beta2", beta2, "0 <= beta2 < 1");
  if (!(eps > 0.0) || !std::isfinite(eps)) return bad("adam_eps", eps, "a finite number > 0");
  if (!(weight_decay >= 0.0) || !std::isfinite(weight_decay)) {
    return bad("weight_decay", weight_decay, "a finite number >= 0");
  }
  if (!(clip_grad >= 0.0) || !std::isfinite(clip_grad)) {
    return bad("clip_grad", clip_grad, "a finite number >= 0; 0 turns clipping off");
  }
  if (!only_train_params_name_list.empty() && !freeze_params_name_list.empty()) {
    return absl::InvalidArgumentError(
        "optimizer: only_train_params_name_list and freeze_params_name_list are mutually "
        "exclusive (set at most one)");
  }
  if (tp_rank < 0) {
    return absl::InvalidArgumentError(fmt::format("optimizer: tp_rank = {} < 0", tp_rank));
  }
  if (dp_size < 1 || dp_rank < 0 || dp_rank >= dp_size) {
    return absl::InvalidArgumentError(fmt::format(
        "optimizer: dp_rank = {} and dp_size = {}: need 0 <= dp_rank < dp_size", dp_rank, dp_size));
  }
  if (bucket_size < 1) {
    return absl::InvalidArgumentError(fmt::format(
        "optimizer: ddp_bucket_size = {} is out of range (valid: >= 1 elements)", bucket_size));
  }
  if (distributed && dp_size > 1) {
    std::vector<std::string> missing;
    if (!dp_all_reduce) missing.push_back("dp_all_reduce");
    if (!dp_reduce_scatter) missing.push_back("dp_reduce_scatter");
    if (!dp_all_gather) missing.push_back("dp_all_gather");
    if (!missing.empty()) {
      return absl::InvalidArgumentError(fmt::format(
          "optimizer: the distributed optimizer (train.use_distributed_optimizer) over {} "
          "data-parallel ranks needs the DP collectives; missing: {}",
          dp_size, fmt::join(missing, ", ")));
    }
  }
  SLIME_RETURN_IF_ERROR(
      CompileAll(only_train_params_name_list, "only_train_params_name_list").status());
  SLIME_RETURN_IF_ERROR(CompileAll(freeze_params_name_list, "freeze_params_name_list").status());
  return absl::OkStatus();
}

std::vector<OptimizerParam> ModelParameters(const model::ModelWeights& weights,
                                            const model::ModelConfig& config) {
  std::vector<OptimizerParam> out;
  const bool tied_copy = weights.stage.HoldsTiedCopy(config.tie_word_embeddings);
  for (const model::ParamSpec& spec : model::HeldParameterSpecs(config, weights)) {
    OptimizerParam p{spec.hf_name, model::ParamSlot(weights, spec),
                     spec.shard == model::ShardDim::kReplicated};
    p.pipeline_copy = tied_copy && spec.model_slot == &model::ModelWeights::embed_tokens;
    p.expert = spec.expert >= 0;
    out.push_back(std::move(p));
  }
  return out;
}

AdamW::AdamW(std::vector<Slot> slots, AdamWOptions options)
    : slots_(std::move(slots)), options_(std::move(options)) {}

AdamW::~AdamW() = default;

StatusOr<std::unique_ptr<AdamW>> AdamW::ForModel(const model::ModelWeights& weights,
                                                 const model::ModelConfig& config,
                                                 AdamWOptions options) {
  return Create(ModelParameters(weights, config), std::move(options));
}

StatusOr<std::unique_ptr<AdamW>> AdamW::Create(std::vector<OptimizerParam> params,
                                               AdamWOptions options) {
  SLIME_RETURN_IF_ERROR(options.Validate());
  SLIME_ASSIGN_OR_RETURN(
      std::vector<std::regex> only,
      CompileAll(options.only_train_params_name_list, "only_train_params_name_list"));
  SLIME_ASSIGN_OR_RETURN(std::vector<std::regex> freeze,
                         CompileAll(options.freeze_params_name_list, "freeze_params_name_list"));
  if (params.empty()) return absl::InvalidArgumentError("optimizer: no parameters given");

  std::set<std::string> names;
  for (const OptimizerParam& p : params) {
    if (!names.insert(p.name).second) {
      return absl::InvalidArgumentError(
          fmt::format("optimizer: parameter \"{}\" is given twice", p.name));
    }
    if (!p.tensor.defined()) {
      return absl::InvalidArgumentError(
          fmt::format("optimizer: parameter \"{}\" is undefined", p.name));
    }
    if (!p.tensor.is_floating_point()) {
      return absl::InvalidArgumentError(
          fmt::format("optimizer: parameter \"{}\" has dtype {}, a floating dtype is required",
                      p.name, std::string(c10::toString(p.tensor.scalar_type()))));
    }
  }

  return GuardTorch("optimizer: create", [&]() -> StatusOr<std::unique_ptr<AdamW>> {
    torch::NoGradGuard no_grad;
    std::vector<Slot> slots;
    int trainable = 0;
    for (OptimizerParam& p : params) {
      Slot s;
      s.name = p.name;
      s.param = p.tensor;
      s.replicated = p.replicated;
      s.pipeline_copy = p.pipeline_copy;
      s.expert = p.expert;
      s.decay = !(EndsWith(p.name, ".bias") || p.tensor.dim() <= 1);
      s.shape = p.tensor.sizes().vec();
      if (!only.empty()) {
        s.trainable = AnySearch(only, p.name);
      } else if (!freeze.empty()) {
        s.trainable = !AnySearch(freeze, p.name);
      }
      if (s.trainable && options.distributed) {
        ++trainable;  // state in the shard (BuildShard)
      } else if (s.trainable) {
        ++trainable;
        const auto f32 = p.tensor.options().dtype(torch::kFloat32);
        if (p.tensor.scalar_type() != torch::kFloat32) {
          s.master = p.tensor.detach().to(torch::kFloat32, /*non_blocking=*/false, /*copy=*/true);
        }
        s.exp_avg = torch::zeros(p.tensor.sizes(), f32);
        s.exp_avg_sq = torch::zeros(p.tensor.sizes(), f32);
      } else if (p.tensor.requires_grad()) {
        p.tensor.set_requires_grad(false);
      }
      slots.push_back(std::move(s));
    }
    if (trainable == 0) {
      return absl::InvalidArgumentError(fmt::format(
          "optimizer: no parameter is left trainable (only_train_params_name_list = [{}], "
          "freeze_params_name_list = [{}]; names are HF names such as \"{}\")",
          fmt::join(options.only_train_params_name_list, ", "),
          fmt::join(options.freeze_params_name_list, ", "), slots.front().name));
    }
    std::unique_ptr<AdamW> adam(new AdamW(std::move(slots), std::move(options)));
    if (adam->options_.distributed) SLIME_RETURN_IF_ERROR(adam->BuildShard());
    return adam;
  });
}

Status AdamW::BuildShard() {
  auto sh = std::make_unique<Shard>();
  bool first = true;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (!s.trainable) continue;
    if (!s.param.is_contiguous()) {
      return absl::InvalidArgumentError(fmt::format(
          "optimizer: parameter \"{}\" is not contiguous (the distributed optimizer flattens "
          "the trainable parameters)",
          s.name));
    }
    if (first) {
      sh->device = s.param.device();
      sh->dtype = s.param.scalar_type();
      first = false;
    } else if (s.param.device() != sh->device) {
      return absl::InvalidArgumentError(fmt::format(
          "optimizer: parameter \"{}\" is on {}, the others on {} (the distributed optimizer "
          "needs one device)",
          s.name, s.param.device().str(), sh->device.str()));
    } else if (s.param.scalar_type() != sh->dtype) {
      sh->dtype = torch::kFloat32;  // mixed dtypes: communicate in float32
    }
    if (s.param.scalar_type() != torch::kFloat32) sh->any_master = true;
    sh->flat_slots.push_back(i);
    sh->flat_offsets.push_back(sh->numel);
    sh->numel += s.param.numel();
  }
  sh->flat_offsets.push_back(sh->numel);
  const int64_t dp = options_.dp_size;
  sh->size = (sh->numel + dp - 1) / dp;
  sh->own = sh->Pieces(options_.dp_rank * sh->size, sh->size);
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(sh->device);
  sh->master = torch::zeros({sh->size}, f32);
  sh->exp_avg = torch::zeros({sh->size}, f32);
  sh->exp_avg_sq = torch::zeros({sh->size}, f32);
  shard_ = std::move(sh);
  ReloadMastersFromParams();
  return absl::OkStatus();
}

StatusOr<OptimizerStepResult> AdamW::Step(double lr) {
  if (!std::isfinite(lr) || lr < 0.0) {
    return absl::InvalidArgumentError(
        fmt::format("optimizer: learning rate {} is not a finite number >= 0", lr));
  }
  return GuardTorch("optimizer: step",
                    [&]() { return options_.distributed ? StepSharded(lr) : StepImpl(lr); });
}

StatusOr<OptimizerStepResult> AdamW::StepImpl(double lr) {
  torch::NoGradGuard no_grad;
  OptimizerStepResult result;
  result.lr = lr;

  // 1-2. float32 gradients and the sum of their squares. On CUDA (model/fused_train.h) the
  // gradients stay in the parameters' dtype: one kernel adds their squares, and step 5 runs one
  // AdamW kernel per parameter with the clip coefficient applied inside.
  std::vector<torch::Tensor> grads(slots_.size());
  std::vector<bool> fused(slots_.size(), false);
  torch::Tensor squared_norm;
  torch::Tensor fused_squared_norm;  // float32 scalar on the device
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (!s.trainable) continue;
    if (!s.param.sizes().equals(s.shape)) {
      return absl::FailedPreconditionError(
          fmt::format("optimizer: parameter \"{}\" changed shape from {} to {}", s.name,
                      ShapeString(s.shape), ShapeString(s.param.sizes())));
    }
    const torch::Tensor& g = s.param.grad();
    if (!g.defined()) continue;  // a zero gradient
    if (!g.sizes().equals(s.param.sizes())) {
      return absl::FailedPreconditionError(
          fmt::format("optimizer: gradient of \"{}\" has shape {}, the parameter {}", s.name,
                      ShapeString(g.sizes()), ShapeString(s.param.sizes())));
    }
    if (model::FusedTrainingApplies(s.param) && s.param.is_contiguous() && g.is_contiguous() &&
        g.scalar_type() == s.param.scalar_type() &&
        (s.master.defined() || s.param.scalar_type() == torch::kFloat32)) {
      fused[i] = true;
      grads[i] = g;
      if (!s.CountedInNorm(options_)) continue;
      if (!fused_squared_norm.defined()) {
        fused_squared_norm = torch::zeros({}, g.options().dtype(torch::kFloat32));
      }
      model::FusedAddSquaredNorm(g, fused_squared_norm);
      continue;
    }
    // bf16 gradients become a float32 copy; float32 ones are used (and scaled) in place.
    grads[i] = g.to(torch::kFloat32);
    if (!s.CountedInNorm(options_)) continue;
    torch::Tensor sq = grads[i].square().sum();
    squared_norm = squared_norm.defined() ? squared_norm.add_(sq) : sq;
  }
  if (fused_squared_norm.defined()) {
    squared_norm = squared_norm.defined() ? squared_norm.add_(fused_squared_norm.to(
                                                squared_norm.device()))
                                          : fused_squared_norm;
  }
  if (!squared_norm.defined()) {  // no gradient at all: a zero norm on the parameters' device
    for (const Slot& s : slots_) {
      if (s.trainable) {
        squared_norm = torch::zeros({}, s.exp_avg.options());
        break;
      }
    }
  }
  SLIME_ASSIGN_OR_RETURN(std::optional<double> clip,
                         FinishGradNorm(options_, squared_norm, result));

  // 3. Non-finite norm: skip without touching any state.
  if (!clip) {
    ZeroGrad();
    result.skipped = true;
    result.step = step_;
    return result;
  }

  // 4. Clipping by the global norm (fused slots scale inside their AdamW kernel).
  const double clip_coeff = *clip;
  if (clip_coeff < 1.0) {
    for (size_t i = 0; i < grads.size(); ++i) {
      if (grads[i].defined() && !fused[i]) grads[i].mul_(clip_coeff);
    }
  }

  // 5. The AdamW update.
  if (options_.stateless) ResetStates();
  ++step_;
  const double beta1 = options_.beta1;
  const double beta2 = options_.beta2;
  const double bias_correction1 = 1.0 - std::pow(beta1, static_cast<double>(step_));
  const double bias_correction2 = 1.0 - std::pow(beta2, static_cast<double>(step_));
  const double step_size = lr / bias_correction1;
  const double bias_correction2_sqrt = std::sqrt(bias_correction2);
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (!s.trainable) continue;
    if (fused[i] || (!grads[i].defined() && model::FusedTrainingApplies(s.param) &&
                     s.param.is_contiguous() &&
                     (s.master.defined() || s.param.scalar_type() == torch::kFloat32))) {
      model::FusedAdamWStep f;
      f.grad_scale = clip_coeff;
      f.decay_factor =
          s.decay && options_.weight_decay != 0.0 ? 1.0 - lr * options_.weight_decay : 1.0;
      f.beta1 = beta1;
      f.beta2 = beta2;
      f.step_size = step_size;
      f.bias_correction2_sqrt = bias_correction2_sqrt;
      f.eps = options_.eps;
      model::FusedAdamW(s.param, grads[i], s.master, s.exp_avg, s.exp_avg_sq, f);
      continue;
    }
    torch::Tensor target = s.Target();
    if (s.decay && options_.weight_decay != 0.0) target.mul_(1.0 - lr * options_.weight_decay);
    s.exp_avg.mul_(beta1);
    s.exp_avg_sq.mul_(beta2);
    if (grads[i].defined()) {
      s.exp_avg.add_(grads[i], 1.0 - beta1);
      s.exp_avg_sq.addcmul_(grads[i], grads[i], 1.0 - beta2);
    }
    torch::Tensor denom = (s.exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(options_.eps);
    target.addcdiv_(s.exp_avg, denom, -step_size);
    if (s.master.defined()) s.param.copy_(s.master);
  }

  // 6. Gradients are consumed.
  ZeroGrad();
  result.step = step_;
  return result;
}

// The distributed step (optimizer.h, "Distributed optimizer"): reduce-scatter, norm, the update
// of the own range, all-gather.
StatusOr<OptimizerStepResult> AdamW::StepSharded(double lr) {
  torch::NoGradGuard no_grad;
  OptimizerStepResult result;
  result.lr = lr;
  Shard& sh = *shard_;
  const int64_t dp = options_.dp_size;
  const int64_t size = sh.size;
  const int64_t per_rank = std::max<int64_t>(1, options_.bucket_size / dp);  // slice per bucket
  for (size_t i : sh.flat_slots) {
    const Slot& s = slots_[i];
    if (!s.param.sizes().equals(s.shape)) {
      return absl::FailedPreconditionError(
          fmt::format("optimizer: parameter \"{}\" changed shape from {} to {}", s.name,
                      ShapeString(s.shape), ShapeString(s.param.sizes())));
    }
    const torch::Tensor& g = s.param.grad();
    if (g.defined() && !g.sizes().equals(s.param.sizes())) {
      return absl::FailedPreconditionError(
          fmt::format("optimizer: gradient of \"{}\" has shape {}, the parameter {}", s.name,
                      ShapeString(g.sizes()), ShapeString(s.param.sizes())));
    }
  }
  // Flat gradient elements [begin, begin + dst.numel()) into dst (zeros where there is none).
  auto gather_grads = [&](int64_t begin, torch::Tensor dst) {
    const std::vector<Shard::Piece> pieces = sh.Pieces(begin, dst.numel());
    int64_t covered = 0;
    for (const Shard::Piece& p : pieces) {
      if (slots_[p.slot].param.grad().defined()) covered += p.length;
    }
    if (covered < dst.numel()) dst.zero_();
    for (const Shard::Piece& p : pieces) {
      const torch::Tensor& g = slots_[p.slot].param.grad();
      if (!g.defined()) continue;
      dst.narrow(0, p.offset, p.length).copy_(g.reshape({-1}).narrow(0, p.param_offset, p.length));
    }
  };
  // src = flat parameter elements [begin, begin + src.numel()): copied into the parameters.
  auto scatter_params = [&](int64_t begin, const torch::Tensor& src) {
    for (const Shard::Piece& p : sh.Pieces(begin, src.numel())) {
      slots_[p.slot]
          .param.view({-1})
          .narrow(0, p.param_offset, p.length)
          .copy_(src.narrow(0, p.offset, p.length));
    }
  };
  const auto buffer = torch::TensorOptions().dtype(sh.dtype).device(sh.device);

  // 1. Reduce-scatter of the gradients, bucket by bucket: grad = the own range's DP sum.
  torch::Tensor grad = torch::empty({size}, buffer);  // [S]
  for (int64_t k = 0; k < size; k += per_rank) {
    const int64_t w = std::min(per_rank, size - k);
    torch::Tensor out = grad.narrow(0, k, w);
    if (dp == 1) {
      gather_grads(k, out);
      continue;
    }
    torch::Tensor in = torch::empty({dp * w}, buffer);  // [dp * w], rank-major
    for (int64_t r = 0; r < dp; ++r) gather_grads(r * size + k, in.narrow(0, r * w, w));
    SLIME_RETURN_IF_ERROR(options_.dp_reduce_scatter(in, out));
  }

  // 2. The global norm: the own range's squares, summed over DP, then over TP.
  torch::Tensor squared_norm = torch::zeros({}, buffer.dtype(torch::kFloat32));
  for (const Shard::Piece& p : sh.own) {
    if (!slots_[p.slot].CountedInNorm(options_)) {
      continue;
    }
    const torch::Tensor g = grad.narrow(0, p.offset, p.length);
    if (model::FusedTrainingApplies(g)) {
      model::FusedAddSquaredNorm(g, squared_norm);
    } else {
      squared_norm.add_(g.to(torch::kFloat32).square().sum());
    }
  }
  if (dp > 1) SLIME_RETURN_IF_ERROR(options_.dp_all_reduce(squared_norm));
  SLIME_ASSIGN_OR_RETURN(std::optional<double> clip,
                         FinishGradNorm(options_, squared_norm, result));

  // 3. Non-finite norm (the same on every rank): skip.
  if (!clip) {
    ZeroGrad();
    result.skipped = true;
    result.step = step_;
    return result;
  }
  // 4. Clipping (inside the AdamW update below).
  const double clip_coeff = *clip;

  // 5. AdamW on the own range, piece by piece; `values` gets the updated parameters in the
  // buffers' dtype (the master itself when that is float32).
  if (options_.stateless) ResetStates();
  ++step_;
  const double beta1 = options_.beta1;
  const double beta2 = options_.beta2;
  const double step_size = lr / (1.0 - std::pow(beta1, static_cast<double>(step_)));
  const double bias_correction2_sqrt = std::sqrt(1.0 - std::pow(beta2, static_cast<double>(step_)));
  const bool float32 = sh.dtype == torch::kFloat32;
  torch::Tensor values = float32 ? sh.master : torch::empty({size}, buffer);  // [S]
  for (const Shard::Piece& p : sh.own) {
    const Slot& s = slots_[p.slot];
    torch::Tensor master = sh.master.narrow(0, p.offset, p.length);
    torch::Tensor m = sh.exp_avg.narrow(0, p.offset, p.length);
    torch::Tensor v = sh.exp_avg_sq.narrow(0, p.offset, p.length);
    torch::Tensor g = grad.narrow(0, p.offset, p.length);
    const double decay =
        s.decay && options_.weight_decay != 0.0 ? 1.0 - lr * options_.weight_decay : 1.0;
    if (model::FusedTrainingApplies(g)) {
      model::FusedAdamWStep f;
      f.grad_scale = clip_coeff;
      f.decay_factor = decay;
      f.beta1 = beta1;
      f.beta2 = beta2;
      f.step_size = step_size;
      f.bias_correction2_sqrt = bias_correction2_sqrt;
      f.eps = options_.eps;
      if (float32) {
        torch::Tensor none;  // the float32 master is the parameter
        model::FusedAdamW(master, g, none, m, v, f);
      } else {
        torch::Tensor out = values.narrow(0, p.offset, p.length);
        model::FusedAdamW(out, g, master, m, v, f);
      }
      continue;
    }
    torch::Tensor g32 = g.to(torch::kFloat32);  // `g` itself when float32 (the buffer is ours)
    if (clip_coeff < 1.0) g32.mul_(clip_coeff);
    if (decay != 1.0) master.mul_(decay);
    m.mul_(beta1).add_(g32, 1.0 - beta1);
    v.mul_(beta2).addcmul_(g32, g32, 1.0 - beta2);
    torch::Tensor denom = (v.sqrt() / bias_correction2_sqrt).add_(options_.eps);
    master.addcdiv_(m, denom, -step_size);
    if (!float32) values.narrow(0, p.offset, p.length).copy_(master);
  }

  // 6. All-gather of the updated values into every rank's parameters, in the same buckets.
  for (int64_t k = 0; k < size; k += per_rank) {
    const int64_t w = std::min(per_rank, size - k);
    const torch::Tensor in = values.narrow(0, k, w);
    if (dp == 1) {
      scatter_params(k, in);
      continue;
    }
    torch::Tensor out = torch::empty({dp * w}, buffer);  // [dp * w], rank-major
    SLIME_RETURN_IF_ERROR(options_.dp_all_gather(in, out));
    for (int64_t r = 0; r < dp; ++r) scatter_params(r * size + k, out.narrow(0, r * w, w));
  }
  ZeroGrad();
  result.step = step_;
  return result;
}

void AdamW::ZeroGrad() {
  for (Slot& s : slots_) {
    if (s.param.grad().defined()) s.param.mutable_grad() = torch::Tensor();
  }
}

void AdamW::ResetStates() {
  torch::NoGradGuard no_grad;
  if (shard_ != nullptr) {
    shard_->exp_avg.zero_();
    shard_->exp_avg_sq.zero_();
  }
  for (Slot& s : slots_) {
    if (!s.trainable || !s.exp_avg.defined()) continue;  // distributed: in the shard
    s.exp_avg.zero_();
    s.exp_avg_sq.zero_();
  }
  step_ = 0;
}

void AdamW::ReloadMastersFromParams() {
  torch::NoGradGuard no_grad;
  if (shard_ != nullptr) {
    for (const Shard::Piece& p : shard_->own) {
      shard_->master.narrow(0, p.offset, p.length)
          .copy_(slots_[p.slot].param.reshape({-1}).narrow(0, p.param_offset, p.length));
    }
  }
  for (Slot& s : slots_) {
    if (s.master.defined()) s.master.copy_(s.param);
  }
}

bool AdamW::has_master_weights() const {
  if (shard_ != nullptr) return shard_->any_master;
  for (const Slot& s : slots_) {
    if (s.master.defined()) return true;
  }
  return false;
}

std::vector<std::string> AdamW::TrainableNames() const {
  std::vector<std::string> out;
  for (const Slot& s : slots_) {
    if (s.trainable) out.push_back(s.name);
  }
  return out;
}

bool AdamW::IsTrainable(const std::string& name) const {
  const Slot* s = FindSlot(name);
  return s != nullptr && s->trainable;
}

const AdamW::Slot* AdamW::FindSlot(const std::string& name) const {
  for (const Slot& s : slots_) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

OptimizerState AdamW::ExportState() const {
  SLIME_CHECK(shard_ == nullptr,
              "AdamW::ExportState on a distributed optimizer; use GatherState (collective)");
  OptimizerState state;
  state.step = step_;
  for (const Slot& s : slots_) {
    if (!s.trainable) continue;
    if (s.master.defined()) state.tensors.push_back({s.name + kMasterSuffix, s.master});
    state.tensors.push_back({s.name + kExpAvgSuffix, s.exp_avg});
    state.tensors.push_back({s.name + kExpAvgSqSuffix, s.exp_avg_sq});
  }
  return state;
}

StatusOr<OptimizerState> AdamW::GatherState(bool keep) const {
  if (shard_ == nullptr) return ExportState();
  return GuardTorch("optimizer: gather the state", [&]() -> StatusOr<OptimizerState> {
    torch::NoGradGuard no_grad;
    const Shard& sh = *shard_;
    const int64_t dp = options_.dp_size;
    const int64_t size = sh.size;
    const int64_t per_rank = std::max<int64_t>(1, options_.bucket_size / dp);
    const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
    // A shard tensor [S] gathered into a CPU tensor [dp * S] of the whole flat space.
    auto gather = [&](const torch::Tensor& shard) -> StatusOr<torch::Tensor> {
      torch::Tensor full = keep ? torch::empty({dp * size}, f32) : torch::Tensor();
      for (int64_t k = 0; k < size; k += per_rank) {
        const int64_t w = std::min(per_rank, size - k);
        const torch::Tensor in = shard.narrow(0, k, w);
        torch::Tensor out = in;
        if (dp > 1) {
          out = torch::empty({dp * w}, f32.device(sh.device));
          SLIME_RETURN_IF_ERROR(options_.dp_all_gather(in, out));
        }
        if (!keep) continue;
        for (int64_t r = 0; r < dp; ++r) {
          full.narrow(0, r * size + k, w).copy_(out.narrow(0, r * w, w));
        }
      }
      return full;
    };
    torch::Tensor master;
    if (sh.any_master) {
      SLIME_ASSIGN_OR_RETURN(master, gather(sh.master));
    }
    SLIME_ASSIGN_OR_RETURN(torch::Tensor exp_avg, gather(sh.exp_avg));
    SLIME_ASSIGN_OR_RETURN(torch::Tensor exp_avg_sq, gather(sh.exp_avg_sq));
    OptimizerState state;
    state.step = step_;
    if (!keep) return state;
    for (size_t k = 0; k < sh.flat_slots.size(); ++k) {
      const Slot& s = slots_[sh.flat_slots[k]];
      const int64_t offset = sh.flat_offsets[k];
      const int64_t n = sh.flat_offsets[k + 1] - offset;
      auto part = [&](const torch::Tensor& full) {
        return full.narrow(0, offset, n).view(s.shape);
      };
      if (s.param.scalar_type() != torch::kFloat32) {
        state.tensors.push_back({s.name + kMasterSuffix, part(master)});
      }
      state.tensors.push_back({s.name + kExpAvgSuffix, part(exp_avg)});
      state.tensors.push_back({s.name + kExpAvgSqSuffix, part(exp_avg_sq)});
    }
    return state;
  });
}

std::vector<torch::Tensor> AdamW::StateTensors() const {
  if (shard_ != nullptr) return {shard_->master, shard_->exp_avg, shard_->exp_avg_sq};
  std::vector<torch::Tensor> out;
  for (const Slot& s : slots_) {
    for (const torch::Tensor* t : {&s.master, &s.exp_avg, &s.exp_avg_sq}) {
      if (t->defined()) out.push_back(*t);
    }
  }
  return out;
}

Status AdamW::ValidateState(const OptimizerState& state) const {
  if (state.step < 0) {
    return absl::InvalidArgumentError(
        fmt::format("optimizer state: step = {} is negative", state.step));
  }
  // name -> (slot, kind); kinds: 0 master, 1 exp_avg, 2 exp_avg_sq.
  std::set<std::string> seen;
  for (const model::NamedTensor& nt : state.tensors) {
    if (!seen.insert(nt.name).second) {
      return absl::InvalidArgumentError(
          fmt::format("optimizer state: tensor \"{}\" appears twice", nt.name));
    }
    const Slot* slot = nullptr;
    for (const char* suffix : {kMasterSuffix, kExpAvgSuffix, kExpAvgSqSuffix}) {
      if (EndsWith(nt.name, suffix)) {
        slot = FindSlot(nt.name.substr(0, nt.name.size() - std::string(suffix).size()));
        if (slot != nullptr) break;
      }
    }
    if (slot == nullptr) {
      return absl::InvalidArgumentError(fmt::format(
          "optimizer state: tensor \"{}\" belongs to no parameter of this model (expected "
          "\"<parameter>.master\", \".exp_avg\" or \".exp_avg_sq\")",
          nt.name));
    }
    if (!slot->trainable) {
      return absl::InvalidArgumentError(fmt::format(
          "optimizer state: tensor \"{}\" is for parameter \"{}\", which is frozen here (the "
          "trainable set differs from the saved one; load without the optimizer state to change "
          "it)",
          nt.name, slot->name));
    }
    if (!nt.tensor.defined() || nt.tensor.scalar_type() != torch::kFloat32) {
      return absl::InvalidArgumentError(
          fmt::format("optimizer state: tensor \"{}\" has dtype {}, float32 is required", nt.name,
                      nt.tensor.defined() ? std::string(c10::toString(nt.tensor.scalar_type()))
                                          : std::string("undefined")));
    }
    if (!nt.tensor.sizes().equals(slot->param.sizes())) {
      return absl::InvalidArgumentError(
          fmt::format("optimizer state: tensor \"{}\" has shape {}, the parameter has {}", nt.name,
                      ShapeString(nt.tensor.sizes()), ShapeString(slot->param.sizes())));
    }
  }
  for (const Slot& s : slots_) {
    if (!s.trainable) continue;
    for (const char* suffix : {kExpAvgSuffix, kExpAvgSqSuffix}) {
      if (seen.count(s.name + suffix) == 0) {
        return absl::InvalidArgumentError(
            fmt::format("optimizer state: tensor \"{}{}\" is missing", s.name, suffix));
      }
    }
  }
  return absl::OkStatus();
}

Status AdamW::ImportState(const OptimizerState& state) {
  SLIME_RETURN_IF_ERROR(ValidateState(state));
  return GuardTorch("optimizer: import state", [&]() -> Status {
    torch::NoGradGuard no_grad;
    std::map<std::string, const torch::Tensor*> by_name;
    for (const model::NamedTensor& nt : state.tensors) by_name[nt.name] = &nt.tensor;
    if (shard_ != nullptr) {
      // Full parameters from the masters; the own range of the rest.
      for (Slot& s : slots_) {
        auto master = by_name.find(s.name + kMasterSuffix);
        if (s.trainable && master != by_name.end()) s.param.copy_(*master->second);
      }
      Shard& sh = *shard_;
      for (const Shard::Piece& p : sh.own) {
        const Slot& s = slots_[p.slot];
        auto range = [&](const torch::Tensor& full) {
          return full.reshape({-1}).narrow(0, p.param_offset, p.length);
        };
        sh.exp_avg.narrow(0, p.offset, p.length).copy_(range(*by_name.at(s.name + kExpAvgSuffix)));
        sh.exp_avg_sq.narrow(0, p.offset, p.length)
            .copy_(range(*by_name.at(s.name + kExpAvgSqSuffix)));
        auto master = by_name.find(s.name + kMasterSuffix);
        sh.master.narrow(0, p.offset, p.length)
            .copy_(range(master != by_name.end() ? *master->second : s.param));
      }
      step_ = state.step;
      return absl::OkStatus();
    }
    for (Slot& s : slots_) {
      if (!s.trainable) continue;
      s.exp_avg.copy_(*by_name.at(s.name + kExpAvgSuffix));
      s.exp_avg_sq.copy_(*by_name.at(s.name + kExpAvgSqSuffix));
      auto master = by_name.find(s.name + kMasterSuffix);
      if (master != by_name.end()) {
        if (s.master.defined()) s.master.copy_(*master->second);
        s.param.copy_(*master->second);
      } else if (s.master.defined()) {
        s.master.copy_(s.param);
      }
    }
    step_ = state.step;
    return absl::OkStatus();
  });
}

}  // namespace slime::train
