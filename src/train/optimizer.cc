// AdamW with float32 masters and moments (see include/slime/train/optimizer.h).
#include "slime/train/optimizer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <cmath>
#include <exception>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <utility>

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
  bool decay = true;  // weight decay applies (not a bias, not 1-D)

  // The float32 tensor the update is applied to.
  const torch::Tensor& Target() const { return master.defined() ? master : param; }
};

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
  SLIME_RETURN_IF_ERROR(
      CompileAll(only_train_params_name_list, "only_train_params_name_list").status());
  SLIME_RETURN_IF_ERROR(CompileAll(freeze_params_name_list, "freeze_params_name_list").status());
  return absl::OkStatus();
}

std::vector<OptimizerParam> ModelParameters(const model::ModelWeights& weights,
                                            const model::ModelConfig& config) {
  std::vector<OptimizerParam> out;
  for (const model::ParamSpec& spec : model::ParameterSpecs(config)) {
    out.push_back(OptimizerParam{spec.hf_name, model::ParamSlot(weights, spec),
                                 spec.shard == model::ShardDim::kReplicated});
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
      s.decay = !(EndsWith(p.name, ".bias") || p.tensor.dim() <= 1);
      if (!only.empty()) {
        s.trainable = AnySearch(only, p.name);
      } else if (!freeze.empty()) {
        s.trainable = !AnySearch(freeze, p.name);
      }
      if (s.trainable) {
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
    return std::unique_ptr<AdamW>(new AdamW(std::move(slots), std::move(options)));
  });
}

StatusOr<OptimizerStepResult> AdamW::Step(double lr) {
  if (!std::isfinite(lr) || lr < 0.0) {
    return absl::InvalidArgumentError(
        fmt::format("optimizer: learning rate {} is not a finite number >= 0", lr));
  }
  return GuardTorch("optimizer: step", [&]() { return StepImpl(lr); });
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
    if (!s.exp_avg.sizes().equals(s.param.sizes())) {
      return absl::FailedPreconditionError(
          fmt::format("optimizer: parameter \"{}\" changed shape from {} to {}", s.name,
                      ShapeString(s.exp_avg.sizes()), ShapeString(s.param.sizes())));
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
      if (s.replicated && options_.tp_rank != 0) continue;
      if (!fused_squared_norm.defined()) {
        fused_squared_norm = torch::zeros({}, g.options().dtype(torch::kFloat32));
      }
      model::FusedAddSquaredNorm(g, fused_squared_norm);
      continue;
    }
    // bf16 gradients become a float32 copy; float32 ones are used (and scaled) in place.
    grads[i] = g.to(torch::kFloat32);
    if (s.replicated && options_.tp_rank != 0) continue;
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
  if (options_.reduce_squared_grad_norm) {
    SLIME_RETURN_IF_ERROR(options_.reduce_squared_grad_norm(squared_norm));
  }
  const double norm = std::sqrt(squared_norm.item<double>());
  result.grad_norm = norm;

  // 3. Non-finite norm: skip without touching any state.
  if (!std::isfinite(norm)) {
    ZeroGrad();
    result.skipped = true;
    result.step = step_;
    return result;
  }

  // 4. Clipping by the global norm (fused slots scale inside their AdamW kernel).
  double clip_coeff = 1.0;
  if (options_.clip_grad > 0.0) {
    const double coeff = options_.clip_grad / (norm + 1e-6);
    if (coeff < 1.0) {
      clip_coeff = coeff;
      for (size_t i = 0; i < grads.size(); ++i) {
        if (grads[i].defined() && !fused[i]) grads[i].mul_(coeff);
      }
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

void AdamW::ZeroGrad() {
  for (Slot& s : slots_) {
    if (s.param.grad().defined()) s.param.mutable_grad() = torch::Tensor();
  }
}

void AdamW::ResetStates() {
  torch::NoGradGuard no_grad;
  for (Slot& s : slots_) {
    if (!s.trainable) continue;
    s.exp_avg.zero_();
    s.exp_avg_sq.zero_();
  }
  step_ = 0;
}

void AdamW::ReloadMastersFromParams() {
  torch::NoGradGuard no_grad;
  for (Slot& s : slots_) {
    if (s.master.defined()) s.master.copy_(s.param);
  }
}

bool AdamW::has_master_weights() const {
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
