// The Trainer's pipeline-parallel passes (see include/slime/train/trainer.h, "Pipeline
// parallelism"): the 1F1B schedule of one training step, the forward-only pass through the
// stages, and sharing the last stage's results with the other stages.
//
// 1F1B (Megatron's forward_backward_pipelining_without_interleaving), stage s of P, M
// micro-batches, every stage with the same micro-batches in the same order:
//   warm-up     W = min(P - s - 1, M) forwards: receive the activation from s-1, forward, send
//               the output to s+1
//   steady      M - W times: forward micro-batch W+i; send its output to s+1 while receiving
//               the gradient of micro-batch i's output from s+1 (one SendRecv); backward of
//               micro-batch i; send the gradient of its input to s-1 while receiving the next
//               activation from s-1 (one SendRecv; the last round only sends)
//   cool-down   W backwards: receive the output gradient from s+1, backward, send the input
//               gradient to s-1
// so at most P - s micro-batches keep their autograd graph on stage s. The first stage has
// nothing to receive forward or send backward, the last nothing to send forward or receive
// backward (its "output" is the micro-batch's loss). Each exchange posts its send and receive
// before waiting, so two neighbours that both send first do not wait for each other. With P = 1
// this is the plain loop: forward, loss, backward per micro-batch.
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <string>
#include <utility>

#include "slime/model/decoder.h"
#include "slime/model/pipeline_parallel.h"
#include "trainer_internal.h"

namespace slime::train::internal {
namespace {

// Adds the stage and step to a failure of the schedule.
Status InStage(const Status& s, const model::PipelineStage& stage, const char* what, size_t k) {
  if (s.ok()) return s;
  return Status(s.code(), fmt::format("pipeline stage {} of {}, {} of micro-batch {}: {}",
                                      stage.rank, stage.size, what, k, std::string(s.message())));
}

}  // namespace

Status RunPipelineSchedule(model::DecoderModel& model, model::PipelineParallelGroup& pp,
                           const data::RolloutBatch& batch,
                           const std::vector<const std::vector<int64_t>*>& micro_batches,
                           int64_t pad_multiple, const StageLossFn& loss,
                           const std::function<void()>& before_last_backward,
                           const MicroBatchHooks& hooks) {
  const model::PipelineStage& stage = model.stage();
  const int s = stage.rank;
  const int p = stage.size;
  const size_t m = micro_batches.size();
  const size_t warmup = std::min<size_t>(static_cast<size_t>(p - s - 1), m);
  const size_t remaining = m - warmup;
  const auto act_options = torch::TensorOptions().dtype(model.dtype()).device(model.device());
  const int64_t hidden_size = model.config().hidden_size;

  // A micro-batch between its forward and its backward: the received activation (a leaf that
  // collects the input gradient; undefined on the first stage) and the stage's output (the
  // loss on the last stage).
  struct InFlight {
    size_t k;
    torch::Tensor input;
    torch::Tensor output;
  };
  std::deque<InFlight> in_flight;

  auto activation = [&](size_t k) {  // an uninitialised [T_k, hidden] buffer
    return torch::empty({PackedTokenCount(batch, *micro_batches[k], pad_multiple), hidden_size},
                        act_options);
  };
  auto recv_forward = [&](size_t k, torch::Tensor& x) -> Status {
    if (stage.is_first()) return absl::OkStatus();
    x = activation(k);
    return InStage(pp.Recv(x, s - 1), stage, "receiving the activation", k);
  };
  auto forward = [&](size_t k, torch::Tensor x) -> StatusOr<torch::Tensor> {
    PackedInputs in = Pack(batch, *micro_batches[k], model.device(), pad_multiple);
    torch::Tensor input = in.ids;
    if (!stage.is_first()) {
      x.requires_grad_(true);  // a leaf: backward leaves the input gradient in x.grad()
      input = x;
    }
    if (hooks.before_pass) hooks.before_pass(k);
    if (hooks.before_forward) {
      SLIME_RETURN_IF_ERROR(InStage(hooks.before_forward(k), stage, "before the forward", k));
    }
    SLIME_ASSIGN_OR_RETURN(torch::Tensor hidden, model.ForwardPacked(input, in.forward_cu_seqlens));
    if (hooks.after_forward) {
      SLIME_RETURN_IF_ERROR(InStage(hooks.after_forward(k), stage, "after the forward", k));
    }
    torch::Tensor out = hidden;
    if (stage.is_last()) {
      SLIME_ASSIGN_OR_RETURN(out, loss(k, hidden, in));
    }
    in_flight.push_back({k, x, out});
    return out;
  };
  // Backward of the oldest micro-batch in flight with the gradient of its output (none on the
  // last stage); returns the gradient of its input (undefined on the first stage).
  size_t backwards = 0;
  auto backward = [&](const torch::Tensor& grad) -> torch::Tensor {
    InFlight f = std::move(in_flight.front());
    in_flight.pop_front();
    if (++backwards == m && before_last_backward) before_last_backward();
    if (hooks.before_pass) hooks.before_pass(f.k);
    if (stage.is_last()) {
      if (f.output.requires_grad()) f.output.backward();
    } else {
      f.output.backward(grad);
    }
    if (stage.is_first()) return {};
    torch::Tensor g = f.input.grad();
    return g.defined() ? g : torch::zeros_like(f.input);
  };

  return GuardTorch("trainer: pipeline schedule", [&]() -> Status {
    for (size_t i = 0; i < warmup; ++i) {
      torch::Tensor x;
      SLIME_RETURN_IF_ERROR(recv_forward(i, x));
      SLIME_ASSIGN_OR_RETURN(torch::Tensor out, forward(i, x));
      SLIME_RETURN_IF_ERROR(
          InStage(pp.Send(out.detach(), s + 1), stage, "sending the activation", i));
    }
    torch::Tensor x;
    if (remaining > 0) SLIME_RETURN_IF_ERROR(recv_forward(warmup, x));
    for (size_t i = 0; i < remaining; ++i) {
      const size_t k = warmup + i;
      SLIME_ASSIGN_OR_RETURN(torch::Tensor out, forward(k, x));
      torch::Tensor grad;
      if (!stage.is_last()) {
        grad = activation(i);
        SLIME_RETURN_IF_ERROR(InStage(pp.SendRecv(out.detach(), s + 1, grad, s + 1), stage,
                                      "sending the activation / receiving the gradient", k));
      }
      torch::Tensor input_grad = backward(grad);
      if (stage.is_first()) continue;
      if (i + 1 == remaining) {
        SLIME_RETURN_IF_ERROR(
            InStage(pp.Send(input_grad, s - 1), stage, "sending the input gradient", i));
      } else {
        x = activation(k + 1);
        SLIME_RETURN_IF_ERROR(InStage(pp.SendRecv(input_grad, s - 1, x, s - 1), stage,
                                      "sending the input gradient / receiving the activation",
                                      i));
      }
    }
    for (size_t i = 0; i < warmup; ++i) {
      const size_t b = remaining + i;
      torch::Tensor grad = activation(b);
      SLIME_RETURN_IF_ERROR(
          InStage(pp.Recv(grad, s + 1), stage, "receiving the output gradient", b));
      torch::Tensor input_grad = backward(grad);
      if (!stage.is_first()) {
        SLIME_RETURN_IF_ERROR(
            InStage(pp.Send(input_grad, s - 1), stage, "sending the input gradient", b));
      }
    }
    return absl::OkStatus();
  });
}

Status ForwardOnlyPipelined(model::DecoderModel& model, model::PipelineParallelGroup& pp,
                            const data::RolloutBatch& batch,
                            const std::vector<const MicroBatch*>& micro_batches, int64_t chunk_size,
                            bool with_entropy, int64_t pad_multiple, SampleLogProbs& out,
                            const ForwardHooks& hooks) {
  const model::PipelineStage& stage = model.stage();
  const int s = stage.rank;
  torch::NoGradGuard no_grad;
  // Every response token of every sample of the pass, in micro-batch order: the last stage's
  // results, then every stage's copy.
  int64_t total = 0;
  for (const MicroBatch* mb : micro_batches) {
    for (int64_t i : mb->samples) total += batch.samples[i].response_length;
  }
  return GuardTorch("trainer: pipeline forward-only pass", [&]() -> Status {
    const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(model.device());
    std::vector<torch::Tensor> lp_parts, ent_parts;
    for (size_t k = 0; k < micro_batches.size(); ++k) {
      const MicroBatch& mb = *micro_batches[k];
      PackedInputs in = Pack(batch, mb.samples, model.device(), pad_multiple);
      torch::Tensor input = in.ids;
      if (!stage.is_first()) {
        input = torch::empty({in.ids.size(0), model.config().hidden_size},
                             torch::TensorOptions().dtype(model.dtype()).device(model.device()));
        SLIME_RETURN_IF_ERROR(InStage(pp.Recv(input, s - 1), stage, "receiving the activation", k));
      }
      const int64_t padded = in.ids.size(0);
      if (hooks.before) SLIME_RETURN_IF_ERROR(hooks.before(mb.samples, padded));
      SLIME_ASSIGN_OR_RETURN(torch::Tensor hidden,
                             model.ForwardPacked(input, in.forward_cu_seqlens));
      if (hooks.after) SLIME_RETURN_IF_ERROR(hooks.after(mb.samples, padded));
      if (!stage.is_last()) {
        SLIME_RETURN_IF_ERROR(InStage(pp.Send(hidden, s + 1), stage, "sending the activation", k));
        continue;
      }
      LogProbOptions o;
      o.temperature = batch.temperature;
      o.chunk_size = chunk_size;
      o.compute_entropy = with_entropy;
      SLIME_ASSIGN_OR_RETURN(ResponseLogProbs r,
                             ComputeResponseLogProbs(hidden, model.weights().lm_head, in.ids,
                                                     in.packed, model.tp_group(), o));
      lp_parts.push_back(r.log_probs.to(torch::kFloat32));
      if (with_entropy) ent_parts.push_back(r.entropy.to(torch::kFloat32));
    }
    // The last stage's results to every stage: one broadcast each for log-probs and entropy.
    torch::Tensor lp = stage.is_last() && !lp_parts.empty() ? torch::cat(lp_parts)
                                                            : torch::zeros({total}, f32);
    torch::Tensor ent;
    if (with_entropy) {
      ent = stage.is_last() && !ent_parts.empty() ? torch::cat(ent_parts)
                                                  : torch::zeros({total}, f32);
    }
    if (lp.size(0) != total) {
      return absl::InternalError(fmt::format(
          "pipeline forward-only pass: {} log-probs for {} response tokens", lp.size(0), total));
    }
    SLIME_RETURN_IF_ERROR(pp.Broadcast(lp, stage.size - 1));
    if (with_entropy) SLIME_RETURN_IF_ERROR(pp.Broadcast(ent, stage.size - 1));
    int64_t offset = 0;
    for (const MicroBatch* mb : micro_batches) {
      for (int64_t i : mb->samples) {
        const int64_t r = batch.samples[i].response_length;
        out.log_probs[i] = lp.narrow(0, offset, r);
        if (with_entropy) out.entropy[i] = ent.narrow(0, offset, r);
        offset += r;
      }
    }
    return absl::OkStatus();
  });
}

Status ShareStepMetrics(model::PipelineParallelGroup& pp, bool last_stage,
                        std::map<std::string, double>& values) {
  if (pp.size() == 1) return absl::OkStatus();
  return GuardTorch("trainer: share the step's metrics over the pipeline", [&]() -> Status {
    const int root = pp.size() - 1;
    std::string names;
    std::vector<double> numbers;
    if (last_stage) {
      for (const auto& [name, v] : values) {
        names += name;
        names += '\n';
        numbers.push_back(v);
      }
    }
    torch::Tensor sizes = torch::tensor(
        {static_cast<int64_t>(names.size()), static_cast<int64_t>(numbers.size())}, torch::kLong);
    SLIME_RETURN_IF_ERROR(pp.Broadcast(sizes, root));
    torch::Tensor bytes = torch::zeros({sizes[0].item<int64_t>()}, torch::kUInt8);
    torch::Tensor nums = torch::zeros({sizes[1].item<int64_t>()}, torch::kFloat64);
    if (last_stage) {
      std::memcpy(bytes.data_ptr(), names.data(), names.size());
      std::copy(numbers.begin(), numbers.end(), nums.data_ptr<double>());
    }
    if (bytes.numel() > 0) SLIME_RETURN_IF_ERROR(pp.Broadcast(bytes, root));
    if (nums.numel() > 0) SLIME_RETURN_IF_ERROR(pp.Broadcast(nums, root));
    if (last_stage) return absl::OkStatus();
    const std::string text(static_cast<const char*>(bytes.data_ptr()), bytes.numel());
    size_t start = 0;
    for (int64_t j = 0; j < nums.numel(); ++j) {
      const size_t end = text.find('\n', start);
      if (end == std::string::npos) return absl::InternalError("malformed metric names");
      values[text.substr(start, end - start)] = nums.data_ptr<double>()[j];
      start = end + 1;
    }
    return absl::OkStatus();
  });
}

}  // namespace slime::train::internal
