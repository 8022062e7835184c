// The mixture-of-experts router losses and metrics (see include/slime/train/moe_aux_loss.h).
#include "slime/train/moe_aux_loss.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <utility>

#include "slime/model/decoder.h"

namespace slime::train {
namespace {

// y = x; dL/dx = dL/dy and dL/dloss = 1 (Megatron's MoEAuxLossAutoScaler with scale 1).
struct AttachLossFunction : torch::autograd::Function<AttachLossFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& loss) {
    ctx->save_for_backward({loss});
    return x;  // an input returned as is: autograd makes it a view with this node's edge
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const torch::Tensor loss = ctx->get_saved_variables()[0];
    return {grads[0], torch::ones_like(loss)};
  }
};

constexpr const char* kAuxMetric = "moe_aux_loss";
constexpr const char* kZMetric = "moe_z_loss";

std::string ImbalanceMetric(int64_t layer) {
  return fmt::format("moe_load_imbalance/layer_{}", layer);
}

}  // namespace

RouterBalance RouterLoadBalance(const torch::Tensor& logits, int64_t top_k) {
  const int64_t t = logits.size(0), e = logits.size(1);
  const torch::Tensor x = logits.to(torch::kFloat32);                 // [T, E]
  const torch::Tensor p = torch::softmax(x, -1);                      // [T, E]
  const torch::Tensor sel = std::get<1>(torch::topk(p.detach(), top_k, -1));  // [T, k]
  RouterBalance b;
  const torch::Tensor counts = torch::zeros({e}, x.options().requires_grad(false))
                                   .index_add_(0, sel.reshape({-1}),
                                               torch::ones({t * top_k}, x.options()));  // [E]
  b.fraction = counts / static_cast<double>(std::max<int64_t>(t * top_k, 1));
  const torch::Tensor mean_p = p.sum(0) / static_cast<double>(std::max<int64_t>(t, 1));  // [E]
  b.aux = static_cast<double>(e) * (b.fraction * mean_p).sum();
  b.z = torch::logsumexp(x, -1).pow(2).sum() / static_cast<double>(std::max<int64_t>(t, 1));
  return b;
}

torch::Tensor AttachLoss(const torch::Tensor& x, const torch::Tensor& loss) {
  return AttachLossFunction::apply(x, loss);
}

Status CheckMoeLossConfig(const config::TrainConfig& train, const model::ModelConfig& model) {
  bool sparse = false;
  for (int64_t l = 0; l < model.num_hidden_layers; ++l) sparse = sparse || model.moe.IsSparseLayer(l);
  if (sparse) return absl::OkStatus();
  for (const auto& [key, value] : {std::pair<const char*, double>{"moe_aux_loss_coeff",
                                                                  train.moe_aux_loss_coeff},
                                   {"moe_z_loss_coeff", train.moe_z_loss_coeff}}) {
    if (value != 0) {
      return absl::InvalidArgumentError(fmt::format(
          "train.{} = {} needs a mixture-of-experts model, but the model (model_type \"{}\") has "
          "no sparse layer: set it to 0",
          key, value, model.model_type));
    }
  }
  return absl::OkStatus();
}

std::unique_ptr<MoeRouterLoss> MoeRouterLoss::Create(const config::TrainConfig& train,
                                                     const model::ModelConfig& model,
                                                     const model::PipelineStage& stage,
                                                     int tp_size) {
  if (train.moe_aux_loss_coeff == 0 && train.moe_z_loss_coeff == 0) return nullptr;
  std::unique_ptr<MoeRouterLoss> m(new MoeRouterLoss());
  m->aux_coeff_ = train.moe_aux_loss_coeff;
  m->z_coeff_ = train.moe_z_loss_coeff;
  m->top_k_ = model.moe.num_experts_per_tok;
  m->num_experts_ = model.moe.num_experts;
  m->tp_size_ = std::max(tp_size, 1);
  const int64_t end = stage.end_layer < 0 ? model.num_hidden_layers : stage.end_layer;
  for (int64_t l = 0; l < model.num_hidden_layers; ++l) {
    if (!model.moe.IsSparseLayer(l)) continue;
    m->sparse_layers_.push_back(l);
    if (l >= stage.first_layer && l < end) m->stage_layers_.push_back(l);
  }
  if (m->sparse_layers_.empty()) return nullptr;
  m->names_.push_back(kAuxMetric);
  if (m->z_coeff_ != 0) m->names_.push_back(kZMetric);
  for (int64_t l : m->sparse_layers_) m->names_.push_back(ImbalanceMetric(l));
  return m;
}

void MoeRouterLoss::BeginStep(int64_t step_tokens, std::vector<int64_t> micro_batch_tokens) {
  step_tokens_ = std::max<int64_t>(step_tokens, 1);
  micro_batch_tokens_ = std::move(micro_batch_tokens);
  current_ = 0;
}

void MoeRouterLoss::Install(model::DecoderModel& model) {
  model.set_capture_router_logits(true);
  model.set_router_loss_hook(
      [this](int layer, const torch::Tensor& logits, const torch::Tensor& out) {
        return Attach(layer, logits, out);
      });
}

void MoeRouterLoss::Uninstall(model::DecoderModel& model) {
  model.set_router_loss_hook(nullptr);
  model.set_capture_router_logits(false);
}

torch::Tensor MoeRouterLoss::RealRows(const torch::Tensor& logits) const {
  const int64_t real = current_ < micro_batch_tokens_.size() ? micro_batch_tokens_[current_]
                                                             : logits.size(0);
  return logits.narrow(0, 0, std::min(real, logits.size(0)));
}

torch::Tensor MoeRouterLoss::Attach(int /*layer*/, const torch::Tensor& logits,
                                    const torch::Tensor& out) const {
  // Only a forward that records a graph: the training forward of a kept layer, or the
  // backward's rerun of a recomputed one (its no-graph forward attaches nothing).
  if (!torch::GradMode::is_enabled() || !logits.requires_grad()) return out;
  const torch::Tensor real = RealRows(logits);
  const RouterBalance b = RouterLoadBalance(real, top_k_);
  torch::Tensor term = aux_coeff_ * b.aux;
  if (z_coeff_ != 0) term = term + z_coeff_ * b.z;
  const double weight = static_cast<double>(real.size(0)) / static_cast<double>(step_tokens_) /
                        static_cast<double>(tp_size_);
  return AttachLoss(out, term * weight);
}

void MoeRouterLoss::AccumulateMetrics(const model::DecoderModel& model,
                                      std::map<std::string, torch::Tensor>& sums) const {
  torch::NoGradGuard no_grad;
  // On the model's device, like the loss metrics (no host sync per layer).
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64).device(model.device());
  auto add = [&](const std::string& name, const torch::Tensor& value) {
    torch::Tensor v = value.detach().to(torch::kFloat64);
    auto it = sums.find(name);
    if (it == sums.end()) {
      sums.emplace(name, v.clone());
    } else {
      it->second.add_(v);
    }
  };
  // Every name of this stage, so that DP ranks all-reduce the same list.
  const torch::Tensor zero = torch::zeros({}, f64);
  add(kAuxMetric, zero);
  if (z_coeff_ != 0) add(kZMetric, zero);
  for (int64_t l : stage_layers_) add(ImbalanceMetric(l), zero);

  const std::vector<torch::Tensor>& logits = model.router_logits();
  const double layers = static_cast<double>(sparse_layers_.size());
  for (int64_t l : stage_layers_) {
    if (static_cast<size_t>(l) >= logits.size() || !logits[l].defined()) continue;
    const torch::Tensor real = RealRows(logits[l]);
    const double weight = static_cast<double>(real.size(0)) / static_cast<double>(step_tokens_);
    const RouterBalance b = RouterLoadBalance(real, top_k_);
    add(kAuxMetric, b.aux * (weight / layers));
    if (z_coeff_ != 0) add(kZMetric, b.z * (weight / layers));
    add(ImbalanceMetric(l),
        b.fraction.max() * (weight * static_cast<double>(num_experts_)));
  }
}

std::vector<double> MoeRouterLoss::TakeStageMetrics(
    std::map<std::string, torch::Tensor>& sums) const {
  std::vector<double> values(names_.size(), 0.0);
  for (size_t i = 0; i < names_.size(); ++i) {
    auto it = sums.find(names_[i]);
    if (it == sums.end()) continue;
    values[i] = it->second.item<double>();
    sums.erase(it);
  }
  return values;
}

}  // namespace slime::train
