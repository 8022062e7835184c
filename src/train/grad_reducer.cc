// The overlapped data-parallel gradient sum (see include/slime/train/grad_reducer.h).
//
// LibTorch 1.13 and 2.x: both have Node::add_post_hook / del_post_hook and the
// FunctionPostHook interface with the same call operator; a parameter's gradient accumulator
// is torch::autograd::impl::grad_accumulator(param) in both. The reducer holds the
// accumulators: a tensor keeps only a weak reference to its own, and a new one (without our
// hook) would be made for the next forward pass if the old one died.
#include "slime/train/grad_reducer.h"

#include <fmt/format.h>
#include <torch/torch.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <exception>
#include <mutex>
#include <string>
#include <utility>

namespace slime::train {

struct GradReducer::State {
  struct Bucket {
    std::vector<size_t> params;    // parameter indices
    std::vector<int64_t> offsets;  // each parameter's first element in the flat buffer
    int64_t numel = 0;
    torch::Tensor buffer;  // [numel]: made when its first parameter is in, dropped by Finish
    size_t ready = 0;      // parameters in
    std::function<Status()> wait;  // set when posted
  };

  std::vector<torch::Tensor> params;
  std::vector<size_t> bucket_of;  // parameter -> bucket
  std::vector<size_t> slot_of;    // parameter -> position in its bucket
  std::vector<bool> in;           // parameter copied into its bucket in this pass
  std::vector<Bucket> buckets;
  AsyncAllReduceSumFn all_reduce;
  std::vector<std::pair<std::shared_ptr<torch::autograd::Node>, uintptr_t>> hooks;

  std::mutex mu;
  bool armed = false;
  size_t next = 0;  // the next bucket to post
  int64_t posted_during_backward = 0;
  int64_t last_posted_during_backward = 0;
  Status error;

  // Parameter i's gradient is final (from its hook, or from Finish for one the pass did not
  // reach): into its bucket, then post what is complete. Under mu.
  void Ready(size_t i, bool from_hook) {
    if (!armed || in[i] || !error.ok()) return;
    try {
      torch::NoGradGuard no_grad;
      Bucket& b = buckets[bucket_of[i]];
      torch::Tensor& p = params[i];
      if (!b.buffer.defined()) b.buffer = torch::empty({b.numel}, p.options());
      torch::Tensor slot =
          b.buffer.narrow(0, b.offsets[slot_of[i]], p.numel()).view(p.sizes());
      const torch::Tensor g = p.grad();
      if (g.defined()) {
        slot.copy_(g);
      } else {
        slot.zero_();
      }
      p.mutable_grad() = slot;
      in[i] = true;
      ++b.ready;
      PostComplete(from_hook);
    } catch (const std::exception& e) {
      error = absl::InternalError(
          fmt::format("overlapped gradient all-reduce: bucketing parameter {}: {}", i, e.what()));
    }
  }

  // Posts the complete buckets from `next` on, in order. Under mu.
  void PostComplete(bool from_hook) {
    while (next < buckets.size() && error.ok()) {
      Bucket& b = buckets[next];
      if (b.ready < b.params.size()) return;
      StatusOr<std::function<Status()>> posted = all_reduce(b.buffer);
      if (!posted.ok()) {
        error = Status(posted.status().code(),
                       fmt::format("overlapped gradient all-reduce: posting bucket {} of {}: {}",
                                   next, buckets.size(), std::string(posted.status().message())));
        return;
      }
      b.wait = std::move(*posted);
      if (from_hook) ++posted_during_backward;
      ++next;
    }
  }

  // Back to the unarmed state; drops the buffers (the gradients that view them keep theirs).
  void Reset() {
    armed = false;
    next = 0;
    posted_during_backward = 0;
    error = absl::OkStatus();
    std::fill(in.begin(), in.end(), false);
    for (Bucket& b : buckets) {
      b.buffer = torch::Tensor();
      b.ready = 0;
      b.wait = nullptr;
    }
  }
};

namespace {

// Tells the reducer that its parameter's gradient accumulator ran (the gradient is final when
// the reducer is armed: the pass is the step's last).
class ReadyHook final : public torch::autograd::FunctionPostHook {
 public:
  ReadyHook(std::weak_ptr<GradReducer::State> state, size_t index)
      : state_(std::move(state)), index_(index) {}
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    if (std::shared_ptr<GradReducer::State> s = state_.lock()) {
      std::lock_guard<std::mutex> lock(s->mu);
      s->Ready(index_, /*from_hook=*/true);
    }
    return outputs;
  }

 private:
  std::weak_ptr<GradReducer::State> state_;
  size_t index_;
};

}  // namespace

StatusOr<std::unique_ptr<GradReducer>> GradReducer::Create(
    const std::vector<torch::Tensor>& params, int64_t bucket_size,
    AsyncAllReduceSumFn all_reduce) {
  if (bucket_size < 1) {
    return absl::InvalidArgumentError(fmt::format(
        "overlapped gradient all-reduce: bucket size {} is out of range (valid: >= 1 elements)",
        bucket_size));
  }
  if (!all_reduce) {
    return absl::InvalidArgumentError("overlapped gradient all-reduce: no asynchronous all-reduce");
  }
  auto state = std::make_shared<State>();
  state->params = params;
  state->all_reduce = std::move(all_reduce);
  state->bucket_of.resize(params.size());
  state->slot_of.resize(params.size());
  state->in.assign(params.size(), false);
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].defined() || !params[i].requires_grad() || !params[i].is_leaf()) {
      return absl::InvalidArgumentError(fmt::format(
          "overlapped gradient all-reduce: parameter {} is not a leaf that requires grad", i));
    }
  }
  // Reverse order: the order the backward pass finishes the parameters.
  for (size_t r = params.size(); r-- > 0;) {
    const torch::Tensor& p = params[r];
    const bool fits = !state->buckets.empty() && [&] {
      const State::Bucket& b = state->buckets.back();
      const torch::Tensor& first = params[b.params.front()];
      return first.scalar_type() == p.scalar_type() && first.device() == p.device() &&
             b.numel + p.numel() <= bucket_size;
    }();
    if (!fits) state->buckets.emplace_back();
    State::Bucket& b = state->buckets.back();
    state->bucket_of[r] = state->buckets.size() - 1;
    state->slot_of[r] = b.params.size();
    b.params.push_back(r);
    b.offsets.push_back(b.numel);
    b.numel += p.numel();
  }
  for (size_t i = 0; i < params.size(); ++i) {
    std::shared_ptr<torch::autograd::Node> acc = torch::autograd::impl::grad_accumulator(params[i]);
    if (acc == nullptr) {
      return absl::InternalError(
          fmt::format("overlapped gradient all-reduce: parameter {} has no gradient accumulator", i));
    }
    const uintptr_t key = acc->add_post_hook(std::make_unique<ReadyHook>(state, i));
    state->hooks.emplace_back(std::move(acc), key);
  }
  return std::unique_ptr<GradReducer>(new GradReducer(std::move(state)));
}

GradReducer::GradReducer(std::shared_ptr<State> state) : state_(std::move(state)) {}

GradReducer::~GradReducer() {
  for (auto& [node, key] : state_->hooks) node->del_post_hook(key);
}

void GradReducer::Arm() {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->Reset();
  state_->armed = true;
}

void GradReducer::Disarm() {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->Reset();
}

Status GradReducer::Finish() {
  std::lock_guard<std::mutex> lock(state_->mu);
  State& s = *state_;
  if (!s.armed) {
    return absl::FailedPreconditionError("overlapped gradient all-reduce: Finish without Arm");
  }
  // The parameters the pass did not reach, bucket by bucket (so the posts stay in order).
  for (const State::Bucket& b : s.buckets) {
    for (size_t i : b.params) s.Ready(i, /*from_hook=*/false);
  }
  Status result = s.error;
  for (size_t k = 0; k < s.next; ++k) {
    Status waited = s.buckets[k].wait();
    if (result.ok() && !waited.ok()) result = waited;
  }
  s.last_posted_during_backward = s.posted_during_backward;
  s.Reset();
  return result;
}

size_t GradReducer::num_buckets() const { return state_->buckets.size(); }

int64_t GradReducer::posted_during_backward() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->last_posted_during_backward;
}

}  // namespace slime::train
