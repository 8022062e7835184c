// `slime_train sft` (see include/slime/train/sft.h).
#include "slime/train/sft.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>

#include "slime/config/config.h"
#include "slime/data/sft_dataset.h"
#include "slime/metrics/jsonl_writer.h"
#include "slime/tokenizer/tokenizer.h"
#include "slime/train/hf_export.h"
#include "slime/train/trainer.h"

namespace slime::train {
namespace {

StatusOr<torch::Device> ParseDevice(const std::string& name) {
  if (name == "auto") return torch::cuda::is_available() ? torch::Device("cuda:0") : torch::Device("cpu");
  if (name == "cpu") return torch::Device("cpu");
  if (name.rfind("cuda", 0) == 0) {
    if (!torch::cuda::is_available()) {
      return absl::InvalidArgumentError(fmt::format("--device {}: CUDA is not available", name));
    }
    return torch::Device(name == "cuda" ? "cuda:0" : name);
  }
  return absl::InvalidArgumentError(
      fmt::format("--device: '{}' is not one of auto, cpu, cuda, cuda:N", name));
}

Status Validate(const SftOptions& o) {
  auto bad = [](const std::string& what) { return absl::InvalidArgumentError(what); };
  if (o.model_dir.empty()) return bad("--model is required");
  if (o.data_path.empty()) return bad("--data is required");
  if (o.epochs < 1) return bad(fmt::format("--epochs must be >= 1, got {}", o.epochs));
  if (o.max_steps && *o.max_steps < 1) return bad(fmt::format("--max-steps must be >= 1, got {}", *o.max_steps));
  if (o.batch_size < 1) return bad(fmt::format("--batch-size must be >= 1, got {}", o.batch_size));
  if (o.micro_batch_size < 1) {
    return bad(fmt::format("--micro-batch-size must be >= 1, got {}", o.micro_batch_size));
  }
  if (!(o.lr > 0) || !std::isfinite(o.lr)) return bad(fmt::format("--lr must be > 0, got {}", o.lr));
  if (o.save_interval < 0) return bad("--save-interval must be >= 0");
  if (o.save_interval > 0 && o.save_dir.empty()) return bad("--save-interval needs --save");
  if (!o.save_hf.empty() && o.save_dir.empty()) {
    return bad("--save-hf needs --save (the export reads the final checkpoint)");
  }
  if (o.dtype != "auto" && o.dtype != "bf16" && o.dtype != "fp32") {
    return bad(fmt::format("--dtype: '{}' is not one of auto, bf16, fp32", o.dtype));
  }
  return absl::OkStatus();
}

// The SFT sample as the trainer's sample: the response starts at the first trained token.
data::TrainSample ToTrainSample(const data::SftSample& s) {
  data::TrainSample t;
  t.tokens = s.tokens;
  t.prompt_length = s.PromptLength();
  t.response_length = static_cast<int64_t>(s.tokens.size()) - t.prompt_length;
  t.loss_mask.assign(s.loss_mask.begin() + t.prompt_length, s.loss_mask.end());
  return t;
}

}  // namespace

StatusOr<SftResult> RunSft(const SftOptions& o) {
  SLIME_RETURN_IF_ERROR(Validate(o));
  SLIME_ASSIGN_OR_RETURN(torch::Device device, ParseDevice(o.device));
  const std::string tok_dir = o.tokenizer_dir.empty() ? o.model_dir : o.tokenizer_dir;
  SLIME_ASSIGN_OR_RETURN(std::unique_ptr<tokenizer::Tokenizer> tok,
                         tokenizer::Tokenizer::FromDirectory(tok_dir));
  data::SftDatasetOptions dopt;
  dopt.messages_key = o.messages_key;
  dopt.max_length = o.max_length;
  SLIME_ASSIGN_OR_RETURN(data::SftDataset ds, data::LoadSftDataset(o.data_path, *tok, dopt));
  const int64_t n = static_cast<int64_t>(ds.samples.size());
  const int64_t steps_per_epoch = (n + o.batch_size - 1) / o.batch_size;
  const int64_t total_steps = o.max_steps.value_or(o.epochs * steps_per_epoch);
  SLIME_ASSIGN_OR_RETURN(data::EpochSampler sampler, data::EpochSampler::Create(n, o.seed, o.shuffle));

  config::Config c = config::DefaultConfig();
  c.algorithm.loss_type = "sft_loss";
  c.train.lr = o.lr;
  c.train.min_lr = o.min_lr;
  c.train.lr_decay_style = o.lr_decay_style;
  c.train.lr_warmup_iters = static_cast<int>(o.warmup_steps);
  c.train.weight_decay = o.weight_decay;
  c.train.clip_grad = o.clip_grad;
  c.train.seed = static_cast<int>(o.seed);
  c.train.global_batch_size = static_cast<int>(o.batch_size);
  c.train.micro_batch_size = static_cast<int>(o.micro_batch_size);
  c.train.calculate_per_token_loss = o.per_token_loss;
  if (o.max_tokens_per_micro_batch) {
    c.train.use_dynamic_batch_size = true;
    c.train.max_tokens_per_gpu = static_cast<int>(*o.max_tokens_per_micro_batch);
  }
  c.checkpoint.keep_last = o.keep_last > 0 ? std::optional<int>(o.keep_last) : std::nullopt;
  TrainerOptions to;
  to.model_dir = o.model_dir;
  to.device = device;
  if (o.dtype == "bf16") to.dtype = torch::kBFloat16;
  if (o.dtype == "fp32") to.dtype = torch::kFloat32;
  to.config = c;
  to.train_iters = total_steps;
  torch::manual_seed(o.seed);
  SLIME_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer, Trainer::Create(std::move(to)));

  int64_t done = 0;
  if (!o.load_dir.empty()) {
    SLIME_ASSIGN_OR_RETURN(LoadedTrainerState st, trainer->Load(o.load_dir));
    const nlohmann::json extra = nlohmann::json::parse(st.extra_state_json, nullptr, false);
    if (!extra.is_object() || !extra.contains("sft")) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: not an SFT checkpoint (trainer_state.json has no data_source.sft)", st.dir));
    }
    const nlohmann::json& s = extra["sft"];
    if (s.value("num_samples", int64_t{-1}) != n || s.value("seed", uint64_t{0}) != o.seed) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: saved for {} samples with seed {}, this run has {} samples with seed {}", st.dir,
          s.value("num_samples", int64_t{-1}), s.value("seed", uint64_t{0}), n, o.seed));
    }
    SLIME_RETURN_IF_ERROR(sampler.Restore({s.value("epoch", int64_t{0}), s.value("offset", int64_t{0})}));
    done = s.value("step", int64_t{0});
    spdlog::info("sft: resumed from {} at step {}", st.dir, done);
  }
  std::unique_ptr<metrics::JsonlWriter> jsonl;
  if (!o.metrics_jsonl.empty()) {
    SLIME_ASSIGN_OR_RETURN(jsonl, metrics::JsonlWriter::Open(o.metrics_jsonl));
  }
  std::cout << fmt::format("sft: {} samples ({} lines), {} steps of {} samples, {} on {}\n", n,
                           ds.stats.lines, total_steps, o.batch_size, o.data_path, device.str())
            << std::flush;

  SftResult result;
  auto save = [&](int64_t step) -> Status {
    const data::EpochSamplerState ss = sampler.state();
    nlohmann::json extra = {{"sft",
                             {{"step", step},
                              {"epoch", ss.epoch},
                              {"offset", ss.offset},
                              {"num_samples", n},
                              {"seed", o.seed}}}};
    SLIME_ASSIGN_OR_RETURN(result.last_checkpoint, trainer->Save(o.save_dir, step, extra.dump()));
    spdlog::info("sft: saved {}", result.last_checkpoint);
    return absl::OkStatus();
  };
  while (done < total_steps) {
    const int64_t epoch = sampler.state().epoch;
    data::RolloutBatch batch;
    int64_t tokens = 0, trained = 0;
    for (int64_t idx : sampler.Next(o.batch_size)) {
      const data::SftSample& s = ds.samples[idx];
      tokens += static_cast<int64_t>(s.tokens.size());
      trained += s.NumTrainedTokens();
      batch.samples.push_back(ToTrainSample(s));
    }
    const auto t0 = std::chrono::steady_clock::now();
    SLIME_ASSIGN_OR_RETURN(TrainStepMetrics m, trainer->SftStep(batch));
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++done;
    SftStepLog log;
    log.step = done;
    log.epoch = epoch;
    log.loss = m.values.count("loss") ? m.values.at("loss") : NAN;
    log.grad_norm = m.values.count("grad_norm") ? m.values.at("grad_norm") : NAN;
    log.lr = m.values.count("lr") ? m.values.at("lr") : NAN;
    log.tokens = tokens;
    log.trained_tokens = trained;
    log.skipped = m.skipped;
    result.steps.push_back(log);
    std::cout << fmt::format("sft step {}/{} epoch {} loss {:.4f} grad_norm {:.3f} lr {:.3g} "
                             "tokens {} ({:.0f} tok/s){}\n",
                             done, total_steps, epoch, log.loss, log.grad_norm, log.lr, tokens,
                             tokens / std::max(secs, 1e-9), m.skipped ? " SKIPPED (non-finite grad)" : "")
              << std::flush;
    if (jsonl) {
      SLIME_RETURN_IF_ERROR(jsonl->Write({{"step", done},
                                          {"epoch", epoch},
                                          {"train/loss", log.loss},
                                          {"train/grad_norm", log.grad_norm},
                                          {"train/lr", log.lr},
                                          {"train/tokens", tokens},
                                          {"train/trained_tokens", trained},
                                          {"train/skipped", m.skipped},
                                          {"perf/step_time", secs}}));
    }
    if (!o.save_dir.empty() && o.save_interval > 0 && done % o.save_interval == 0 &&
        done < total_steps) {
      SLIME_RETURN_IF_ERROR(save(done));
    }
  }
  if (!o.save_dir.empty()) SLIME_RETURN_IF_ERROR(save(done));
  if (!o.save_hf.empty()) {
    if (result.last_checkpoint.empty()) return absl::InternalError("sft: no checkpoint to export");
    HfExportOptions ho;
    ho.from = result.last_checkpoint;
    ho.to_hf = o.save_hf;
    ho.tokenizer = tok_dir;
    SLIME_RETURN_IF_ERROR(ExportCheckpointToHf(ho).status());
    std::cout << "sft: wrote HF model " << o.save_hf << "\n";
  }
  if (!result.steps.empty()) {
    std::cout << fmt::format("sft: done, {} steps, loss {:.4f} -> {:.4f}\n", result.steps.size(),
                             result.steps.front().loss, result.steps.back().loss);
  }
  return result;
}

}  // namespace slime::train
