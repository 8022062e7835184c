// The engine loop (see include/slime/engine/engine.h).
#include "slime/engine/engine.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <c10/core/DeviceGuard.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <random>
#include <unordered_map>
#include <unordered_set>

#include "nlohmann/json.hpp"
#include "engine_metrics.h"
#include "slime/comm/cuda_ipc.h"
#include "slime/comm/process_group.h"
#include "slime/comm/weight_sender.h"
#include "slime/engine/model_runner.h"
#include "slime/model/batch_invariant.h"
#include "slime/engine/output_text.h"
#include "slime/engine/page_pool.h"
#include "slime/engine/radix_cache.h"
#include "slime/engine/sampler.h"
#include "slime/engine/scheduler.h"
#include "slime/tokenizer/tokenizer.h"

namespace slime::engine {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// EOS ids: config.json's eos_token_id, generation_config.json's, and the tokenizer's.
std::vector<int32_t> CollectEosIds(const std::string& model_path, const model::ModelConfig& config,
                                   const tokenizer::Tokenizer& tok) {
  std::unordered_set<int32_t> ids;
  for (int64_t id : config.eos_token_ids) ids.insert(static_cast<int32_t>(id));
  std::ifstream in(model_path + "/generation_config.json");
  if (in) {
    try {
      nlohmann::json j = nlohmann::json::parse(in);
      if (j.contains("eos_token_id")) {
        const auto& e = j["eos_token_id"];
        if (e.is_number_integer()) ids.insert(e.get<int32_t>());
        if (e.is_array()) {
          for (const auto& x : e) {
            if (x.is_number_integer()) ids.insert(x.get<int32_t>());
          }
        }
      }
    } catch (const std::exception& e) {
      spdlog::warn("engine: ignoring unreadable {}/generation_config.json: {}", model_path,
                   e.what());
    }
  }
  if (tok.eos_id()) ids.insert(*tok.eos_id());
  std::vector<int32_t> out(ids.begin(), ids.end());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

// One live request, owned by the engine thread.
struct LiveRequest {
  uint64_t id = 0;
  GenerateInput in;
  Engine::Callback callback;
  RequestOutput out;
  std::unique_ptr<OutputText> text;
  std::vector<int32_t> stop_ids;  // EOS (unless ignore_eos) + stop_token_ids
  uint64_t seed = 0;
  Clock::time_point arrival;
  Clock::time_point last_token;
  int64_t max_new = 0;            // resolved max_new_tokens
  int64_t next_input_lp = 0;      // next position q whose logits give the logprob of token q+1
  int64_t next_route = 0;         // next position whose routed experts are to be recorded
  int64_t last_streamed = 0;      // output length at the last stream callback
  bool in_scheduler = false;
};

class Engine::Impl {
 public:
  Impl(Engine* engine, std::unique_ptr<ModelRunner> runner)
      : engine_(engine),
        runner_(std::move(runner)),
        pool_(runner_->num_pages(), runner_->page_size()),
        radix_(&pool_, engine->options_.enable_prefix_cache),
        scheduler_(MakeSchedulerOptions(engine->options_, engine->context_length_), &pool_,
                   &radix_),
        rng_(engine->options_.random_seed) {}

  ModelRunner* runner() const { return runner_.get(); }

  static SchedulerOptions MakeSchedulerOptions(const EngineOptions& o, int64_t context_length) {
    SchedulerOptions s;
    s.max_running_requests = o.max_running_requests;
    s.max_prefill_tokens = o.chunked_prefill_size;
    s.max_batch_tokens = std::max(o.max_batch_tokens, o.chunked_prefill_size);
    s.max_context_tokens = context_length;
    return s;
  }

  bool HasWork() const {
    return !paused_ && !kv_released_ && !runner_->weights_offloaded() &&
           (scheduler_.num_running() > 0 || scheduler_.num_waiting() > 0);
  }
  bool idle() const { return live_.empty(); }

  void Submit(uint64_t id, GenerateInput input, Callback callback) {
    LiveRequest r;
    r.id = id;
    r.arrival = Clock::now();
    r.callback = std::move(callback);
    r.in = std::move(input);
    r.out.rid = r.in.rid;
    r.out.index = r.in.index;
    r.out.prompt_tokens = static_cast<int64_t>(r.in.input_ids.size());
    r.out.weight_version = engine_->weight_version();
    const SamplingParams& sp = r.in.sampling;
    if (!sp.ignore_eos) r.stop_ids = engine_->eos_ids_;
    r.stop_ids.insert(r.stop_ids.end(), sp.stop_token_ids.begin(), sp.stop_token_ids.end());
    r.seed = sp.sampling_seed ? *sp.sampling_seed : rng_();
    const int64_t prompt_len = r.out.prompt_tokens;
    r.max_new = sp.max_new_tokens ? *sp.max_new_tokens : engine_->context_length_ - prompt_len;
    r.max_new = std::max<int64_t>(0, std::min(r.max_new, engine_->context_length_ - prompt_len));
    r.text = std::make_unique<OutputText>(engine_->tokenizer_.get(), sp);
    if (r.in.return_logprob && r.in.logprob_start_len >= 0) {
      r.next_input_lp = std::max<int64_t>(r.in.logprob_start_len, 1) - 1;
      if (r.in.logprob_start_len == 0) {
        r.out.input_logprob_ids.push_back(r.in.input_ids[0]);
        r.out.input_logprobs.push_back(std::nullopt);
        if (r.in.top_logprobs_num > 0) r.out.input_top_logprobs.emplace_back();
      }
    }
    r.next_route = r.in.routed_experts_start_len;
    auto [it, inserted] = live_.emplace(id, std::move(r));
    if (!inserted) return;
    if (metrics_) metrics_->OnRequest();
    if (paused_) {
      held_.push_back(id);
      return;
    }
    Admit(it->second);
  }

  void Admit(LiveRequest& r) {
    if (Status s = CheckRoutedExperts(r.in); !s.ok()) {
      Finish(r.id, FinishReason::Abort(std::string(s.message()), 400));
      return;
    }
    const bool want_input_lp = r.in.return_logprob && r.in.logprob_start_len >= 0;
    int64_t limit =
        want_input_lp ? std::max<int64_t>(r.in.logprob_start_len, 1) - 1 : kNoPrefixMatchLimit;
    // Routed experts are recorded from the forward, not kept with cached K/V pages: the prefix
    // cache serves at most the positions before routed_experts_start_len.
    if (r.in.return_routed_experts) {
      limit = limit == kNoPrefixMatchLimit ? r.in.routed_experts_start_len
                                           : std::min(limit, r.in.routed_experts_start_len);
    }
    Status s = scheduler_.Add(r.id, r.in.input_ids, r.max_new, limit);
    if (!s.ok()) {
      Finish(r.id, FinishReason::Abort(std::string(s.message()), 400));
      return;
    }
    r.in_scheduler = true;
  }

  // return_routed_experts needs --enable-return-routed-experts and a sparse model (the HTTP
  // layer refuses both first; this guards direct Submit calls).
  Status CheckRoutedExperts(const GenerateInput& in) const {
    if (!in.return_routed_experts) return absl::OkStatus();
    if (!engine_->routes_experts()) {
      return absl::InvalidArgumentError(
          "return_routed_experts needs a mixture-of-experts model; this engine's model has no "
          "sparse layer");
    }
    if (!engine_->options_.enable_return_routed_experts) {
      return absl::InvalidArgumentError(
          "return_routed_experts needs the engine started with --enable-return-routed-experts");
    }
    if (in.routed_experts_start_len < 0 ||
        in.routed_experts_start_len >= static_cast<int64_t>(in.input_ids.size())) {
      return absl::InvalidArgumentError(fmt::format(
          "routed_experts_start_len must be in [0, {}) (the prompt length), got {}",
          in.input_ids.size(), in.routed_experts_start_len));
    }
    return absl::OkStatus();
  }

  void Cancel(uint64_t id, const std::string& why) {
    if (live_.count(id)) Finish(id, FinishReason::Abort(why));
  }

  void AbortMatching(const std::string& prefix, bool all, const std::string& why) {
    std::vector<uint64_t> ids;
    for (const auto& [id, r] : live_) {
      if (all || r.in.rid.compare(0, prefix.size(), prefix) == 0) ids.push_back(id);
    }
    std::sort(ids.begin(), ids.end());
    for (uint64_t id : ids) Finish(id, FinishReason::Abort(why));
  }

  void Pause(PauseMode mode) {
    paused_ = true;
    switch (mode) {
      case PauseMode::kAbort:
        AbortMatching("", true, "Abort in pause_generation");
        break;
      case PauseMode::kInPlace:  // nothing moves: no step runs until Continue
        break;
      case PauseMode::kRetract:
        if (const size_t n = scheduler_.RetractAll().size(); n > 0 && metrics_) {
          metrics_->OnRetract(static_cast<int64_t>(n));
        }
        FlushStaleCacheIfIdle();
        break;
    }
  }

  // After a weight update asked to flush the prefix cache: now if no sequence holds cached pages
  // (waiting ones hold none), else once none does (flush_when_idle_).
  void FlushStaleCache() {
    flush_when_idle_ = true;
    FlushStaleCacheIfIdle();
  }
  void FlushStaleCacheIfIdle() {
    if (!flush_when_idle_ || scheduler_.num_running() > 0) return;
    radix_.Reset();  // cached K/V came from the old weights
    flush_when_idle_ = false;
  }

  void Continue() {
    paused_ = false;
    std::vector<uint64_t> held;
    held.swap(held_);
    for (uint64_t id : held) {
      auto it = live_.find(id);
      if (it != live_.end()) Admit(it->second);
    }
  }

  bool FlushCache() {
    if (!live_.empty()) return false;
    radix_.Reset();
    return true;
  }

  Status UpdateWeightsFromDisk(const std::string& path, const std::string& version) {
    SLIME_RETURN_IF_ERROR(runner_->LoadWeightsFromDisk(path));
    FlushStaleCache();
    engine_->set_weight_version(version);
    return absl::OkStatus();
  }

  // One /update_weights_from_distributed bucket (see Engine::UpdateWeightsFromDistributed).
  // `groups[r]` is TP rank r's member of the weight-update group: every rank receives the full
  // tensors on its own device (as SGLang's TP workers do) and keeps its shard.
  Status ReceiveWeights(const DistributedWeightsUpdate& u,
                        const std::vector<std::shared_ptr<comm::ProcessGroup>>& groups) {
    const bool nccl = groups.front()->backend() == "nccl";
    if (nccl && !runner_->device().is_cuda()) {
      return absl::FailedPreconditionError(fmt::format(
          "group '{}' uses nccl but this engine runs on {}", u.group_name, runner_->device().str()));
    }
    std::vector<torch::ScalarType> dtypes;
    for (size_t i = 0; i < u.names.size(); ++i) {
      SLIME_ASSIGN_OR_RETURN(torch::ScalarType dtype, comm::ParseDtypeName(u.dtypes[i]));
      dtypes.push_back(dtype);
    }
    // Each rank receives the bucket before it checks it, so a rejected update still leaves the
    // group in step with the sender; the lowest rank's error is reported.
    SLIME_RETURN_IF_ERROR(runner_->OnEveryRank([&](int rank) -> Status {
      std::vector<torch::Tensor> buffers;
      try {
        for (size_t i = 0; i < u.names.size(); ++i) {
          buffers.push_back(torch::empty(
              u.shapes[i], torch::TensorOptions().dtype(dtypes[i]).device(
                               nccl ? runner_->device(rank) : torch::Device(torch::kCPU))));
        }
      } catch (const std::exception& e) {
        return absl::ResourceExhaustedError(
            fmt::format("allocating receive buffers: {}", std::string(e.what()).substr(0, 300)));
      }
      SLIME_RETURN_IF_ERROR(groups[rank]->Broadcast(buffers, 0, u.names));
      std::vector<model::NamedTensor> named;
      for (size_t i = 0; i < u.names.size(); ++i) named.push_back({u.names[i], buffers[i]});
      return runner_->UpdateRankWeights(rank, named);
    }));
    if (u.flush_cache) FlushStaleCache();
    if (u.weight_version) engine_->set_weight_version(*u.weight_version);
    return absl::OkStatus();
  }

  // One /update_weights_from_tensor bucket (see Engine::UpdateWeightsFromTensor).
  Status ReceiveIpc(const TensorWeightsUpdate& u) {
    if (!u.sglang.empty()) {
      SLIME_RETURN_IF_ERROR(ReceiveSglangBuckets(u.sglang));
    } else {
      SLIME_RETURN_IF_ERROR(ReceiveOwnIpcBucket(*u.bucket));
    }
    if (u.flush_cache) FlushStaleCache();
    if (u.weight_version) engine_->set_weight_version(*u.weight_version);
    return absl::OkStatus();
  }

  // SGLang's flattened buckets, entry r for TP rank r (each on that rank's GPU, or CPU shared
  // memory). With one rank the update is all or nothing; with several, every rank checks the
  // same names, so a bad bucket fails on every rank before any copy.
  Status ReceiveSglangBuckets(const std::vector<std::shared_ptr<const comm::SglangBucket>>& buckets) {
    if (static_cast<int>(buckets.size()) != runner_->tp_size()) {
      return absl::InvalidArgumentError(fmt::format(
          "serialized_named_tensors has {} entries; this engine has tp_size {} (one entry per "
          "TP rank)",
          buckets.size(), runner_->tp_size()));
    }
    if (runner_->tp_size() == 1) {
      SLIME_ASSIGN_OR_RETURN(std::unique_ptr<comm::SglangImportedBucket> mapped,
                             comm::SglangImportedBucket::Open(*buckets[0], runner_->device()));
      SLIME_ASSIGN_OR_RETURN(auto tensors, InEngineDtype(mapped->tensors()));
      return runner_->UpdateWeights(tensors);
    }  // unmapped (and the sender's block released) when `mapped` goes
    return runner_->OnEveryRank([&](int rank) -> Status {
      SLIME_ASSIGN_OR_RETURN(
          std::unique_ptr<comm::SglangImportedBucket> mapped,
          comm::SglangImportedBucket::Open(*buckets[rank], runner_->device(rank)));
      SLIME_ASSIGN_OR_RETURN(auto tensors, InEngineDtype(mapped->tensors()));
      return runner_->UpdateRankWeights(rank, tensors);
    });
  }

  // A flattened bucket may mix dtypes (e.g. float32 norms beside bfloat16 matrices); SGLang's
  // loader converts on copy, so floating-point tensors are converted to the engine's dtype here.
  StatusOr<std::vector<model::NamedTensor>> InEngineDtype(
      const std::vector<model::NamedTensor>& tensors) {
    std::vector<model::NamedTensor> out = tensors;
    try {
      for (model::NamedTensor& nt : out) {
        if (nt.tensor.is_floating_point() && nt.tensor.scalar_type() != runner_->dtype()) {
          nt.tensor = nt.tensor.to(runner_->dtype());
        }
      }
    } catch (const std::exception& e) {
      return absl::ResourceExhaustedError(
          fmt::format("converting the bucket to the engine's dtype: {}",
                      std::string(e.what()).substr(0, 300)));
    }
    return out;
  }

  Status ReceiveOwnIpcBucket(const comm::IpcBucket& bucket) {
    if (runner_->tp_size() > 1) {
      return absl::FailedPreconditionError(fmt::format(
          "/update_weights_from_tensor (CUDA IPC) serves engines of one GPU; this engine has "
          "tp_size {}: use /update_weights_from_distributed or /update_weights_from_disk",
          runner_->tp_size()));
    }
    SLIME_ASSIGN_OR_RETURN(std::unique_ptr<comm::IpcImportedBucket> mapped,
                           comm::IpcImportedBucket::Open(bucket, runner_->device()));
    return runner_->UpdateWeights(mapped->tensors());
  }  // unmapped when `mapped` goes, after the device finished the copies

  Status Release(const std::vector<std::string>& tags) {
    const bool all = tags.empty();
    const bool kv = all || std::count(tags.begin(), tags.end(), "kv_cache");
    const bool weights = all || std::count(tags.begin(), tags.end(), "weights");
    if (!kv && !weights) return absl::InvalidArgumentError("tags must name kv_cache or weights");
    if (!live_.empty()) {
      return absl::FailedPreconditionError(fmt::format(
          "cannot release memory while {} requests are in flight (pause or abort them first)",
          live_.size()));
    }
    if (kv && !kv_released_) {
      radix_.Reset();
      SLIME_RETURN_IF_ERROR(runner_->ReleaseKv());
      kv_released_ = true;
    }
    if (weights) SLIME_RETURN_IF_ERROR(runner_->OffloadWeights());
    engine_->memory_released_ = kv_released_ || runner_->weights_offloaded();
    return absl::OkStatus();
  }

  Status Resume(const std::vector<std::string>& tags) {
    const bool all = tags.empty();
    const bool kv = all || std::count(tags.begin(), tags.end(), "kv_cache") ||
                    std::count(tags.begin(), tags.end(), "cuda_graph");
    const bool weights = all || std::count(tags.begin(), tags.end(), "weights");
    if (!kv && !weights) {
      return absl::InvalidArgumentError("tags must name kv_cache, cuda_graph or weights");
    }
    if (weights) SLIME_RETURN_IF_ERROR(runner_->OnloadWeights());
    if (kv && kv_released_) {
      SLIME_RETURN_IF_ERROR(runner_->ResumeKv());
      kv_released_ = false;
    }
    engine_->memory_released_ = kv_released_ || runner_->weights_offloaded();
    return absl::OkStatus();
  }

  StatusOr<Engine::WeightChecksumList> WeightChecksums() {
    Engine::WeightChecksumList list;
    list.dtype = comm::DtypeName(runner_->dtype());
    SLIME_ASSIGN_OR_RETURN(list.checksums, runner_->WeightChecksums());
    return list;
  }

  StatusOr<Engine::WeightSlice> WeightByName(const std::string& name, int64_t truncate_size) {
    SLIME_ASSIGN_OR_RETURN(torch::Tensor full, runner_->WeightByName(name));
    try {
      torch::Tensor t = full.dim() == 0 ? full.reshape({1}) : full;
      t = t.narrow(0, 0, std::min<int64_t>(std::max<int64_t>(truncate_size, 0), t.size(0)))
              .to(torch::kFloat32)
              .contiguous();
      Engine::WeightSlice slice;
      slice.shape = t.sizes().vec();
      slice.values.assign(t.data_ptr<float>(), t.data_ptr<float>() + t.numel());
      return slice;
    } catch (const std::exception& e) {
      return absl::InternalError(fmt::format("reading weight {}: {}", name, e.what()));
    }
  }

  Status HealthCheck() {
    if (kv_released_ || runner_->weights_offloaded()) return absl::OkStatus();
    if (!live_.empty() && Seconds(Clock::now() - last_step_end_) < 30.0) return absl::OkStatus();
    // One-token forward (every TP rank) without touching the K/V cache.
    return runner_->HealthCheck();
  }

  void AbortAll(const std::string& why) {
    AbortMatching("", true, why);
    held_.clear();
  }

  // One scheduling step: schedule, forward, sample, emit (the stages below). Returns false when
  // nothing ran.
  bool Step();

  EngineLoad Load() const {
    EngineLoad l;
    l.num_running = scheduler_.num_running();
    l.num_waiting = scheduler_.num_waiting() + static_cast<int64_t>(held_.size());
    l.num_total_pages = pool_.num_usable();
    l.num_used_pages = pool_.num_usable() - pool_.num_free();
    l.num_cached_pages = radix_.cached_pages();
    return l;
  }

 private:
  void Finish(uint64_t id, FinishReason reason);
  void Emit(LiveRequest& r);
  // Adds the sampled token; returns true when the request finished.
  bool Accept(LiveRequest& r, int32_t token, float logprob, TopLogprobs top);

  // Step's stages and what passes between them.
  struct SampleRef {
    uint64_t id;
    int64_t row;
  };
  struct ScoreRef {
    uint64_t id;
    int64_t row;
    int64_t position;  // logits at `position` score token position + 1
  };
  // The forward of one batch: its new tokens, per-item page tables, rows to sample and score.
  struct StepInputs {
    std::vector<int32_t> input_ids;  // [T] the batch's new tokens in item order
    std::vector<PagedItem> items;
    std::vector<SampleRef> to_sample;
    std::vector<ScoreRef> to_score;
    std::vector<SampleRef> to_route;  // rows whose routed experts go to their request, in order
    std::vector<uint64_t> prefill_only_done;  // prompt done, no token left to generate
    int64_t prefill_tokens = 0, decode_tokens = 0;
  };
  // A decode-graph step fills sample_logits alone; an eager one, hidden.
  struct ForwardOutput {
    torch::Tensor sample_logits;  // [to_sample.size(), vocab] float32
    StatusOr<HiddenStates> hidden = absl::NotFoundError("not run");
  };
  struct StepTimes {
    Clock::time_point start, built, forward, sampled;
  };
  // Aborts the sequences the scheduler could not fit; counts its retractions.
  void FinishUnscheduled(const Batch& batch);
  StepInputs BuildInputs(const Batch& batch);
  // The step failed before its K/V was kept: rolls the batch back and aborts its requests.
  void FailBatch(const Batch& batch, const Status& s);
  Status RunForward(const StepInputs& in, ForwardOutput* out);
  // The routed experts of the rows in `to_route` (captured by the forward) into their requests'
  // outputs.
  Status RecordRoutedExperts(const std::vector<SampleRef>& to_route);
  // Prompt log-probs of the rows in `to_score` into their requests' outputs.
  Status ScorePrompts(const std::vector<ScoreRef>& to_score, const ForwardOutput& fwd);
  // lps [rows, vocab] log-probs and chosen [rows] of to_score[s, e): each request's entries.
  void AppendInputLogprobs(const std::vector<ScoreRef>& to_score, size_t s, size_t e,
                           const std::vector<int64_t>& targets, const torch::Tensor& lps,
                           const torch::Tensor& chosen);
  // One token per row of `to_sample` (the logits come from the forward when it made none).
  StatusOr<SamplerOutput> SampleTokens(const std::vector<SampleRef>& to_sample,
                                       ForwardOutput* fwd);
  void AcceptAndEmit(const std::vector<SampleRef>& to_sample, SamplerOutput sampled);
  // The step's phase times and metrics.
  void RecordStep(const StepTimes& times, const StepInputs& in);

  Engine* engine_;
  std::unique_ptr<ModelRunner> runner_;
  KvPagePool pool_;
  RadixCache radix_;
  Scheduler scheduler_;
  std::mt19937_64 rng_;
  std::unordered_map<uint64_t, LiveRequest> live_;
  std::vector<uint64_t> held_;  // submitted while paused
  bool paused_ = false;
  bool kv_released_ = false;
  bool flush_when_idle_ = false;  // the prefix cache holds K/V of replaced weights
  std::string step_version_;      // the weight version of the step running
  Clock::time_point last_step_end_ = Clock::now();
  // Where step time goes (logged at shutdown): host work before the forward, enqueueing the
  // forward (async on CUDA), sampling (waits for the device), and accepting/emitting.
  struct PhaseTimes {
    int64_t steps = 0;
    double build = 0, forward = 0, sample = 0, emit = 0;
  } phases_;

 public:
  void LogPhases() const {
    if (phases_.steps == 0) return;
    const double k = 1000.0 / static_cast<double>(phases_.steps);
    spdlog::info(
        "engine: {} steps; per step: schedule+build {:.2f} ms, forward {:.2f} ms, sample "
        "{:.2f} ms, accept+emit {:.2f} ms",
        phases_.steps, phases_.build * k, phases_.forward * k, phases_.sample * k,
        phases_.emit * k);
  }

 private:

 public:
  std::unique_ptr<EngineMetrics> metrics_;
};

void Engine::Impl::Finish(uint64_t id, FinishReason reason) {
  auto it = live_.find(id);
  if (it == live_.end()) return;
  LiveRequest& r = it->second;
  if (r.in_scheduler) {
    if (const Sequence* seq = scheduler_.Find(id)) {
      r.out.cached_tokens = seq->cached_tokens;
      r.out.num_retractions = seq->num_retractions;
    }
    scheduler_.Finish(id);
  }
  held_.erase(std::remove(held_.begin(), held_.end(), id), held_.end());
  if (r.in.return_routed_experts) {
    // A prompt-only request fed its last prompt token too; the answer stops before it, as for
    // every request (rows = prompt + output − 1 − routed_experts_start_len).
    const model::ModelConfig& c = runner_->config();
    const int64_t rows = std::max<int64_t>(
        0, r.out.prompt_tokens + static_cast<int64_t>(r.out.output_ids.size()) - 1 -
               r.in.routed_experts_start_len);
    const size_t keep = static_cast<size_t>(rows * c.num_hidden_layers * c.moe.num_experts_per_tok);
    if (r.out.routed_experts.size() > keep) r.out.routed_experts.resize(keep);
  }
  r.out.finish = std::move(reason);
  r.out.text = r.text->Text(r.out.finish, r.in.sampling.no_stop_trim);
  r.out.e2e_latency = Seconds(Clock::now() - r.arrival);
  if (metrics_) metrics_->OnFinish(r.out);
  Callback cb = std::move(r.callback);
  RequestOutput out = std::move(r.out);
  live_.erase(it);
  FlushStaleCacheIfIdle();
  if (cb) cb(out);
}

void Engine::Impl::Emit(LiveRequest& r) {
  if (!r.in.stream || !r.callback) return;
  const int64_t n = static_cast<int64_t>(r.out.output_ids.size());
  if (n - r.last_streamed < engine_->options_.stream_interval) return;
  r.last_streamed = n;
  if (const Sequence* seq = scheduler_.Find(r.id)) r.out.cached_tokens = seq->cached_tokens;
  r.out.text = r.text->PartialText();
  r.callback(r.out);
}

bool Engine::Impl::Accept(LiveRequest& r, int32_t token, float logprob, TopLogprobs top) {
  r.out.output_ids.push_back(token);
  const int64_t end = static_cast<int64_t>(r.out.output_ids.size());
  std::vector<WeightVersionSpan>& spans = r.out.weight_versions;
  if (spans.empty() || spans.back().version != step_version_) {
    spans.push_back({step_version_, end - 1, end});
    r.out.weight_version = step_version_;
  } else {
    spans.back().end = end;
  }
  if (metrics_) {
    const Clock::time_point now = Clock::now();
    if (r.out.output_ids.size() == 1) metrics_->OnFirstToken(Seconds(now - r.arrival));
    else metrics_->OnNextToken(Seconds(now - r.last_token));
    r.last_token = now;
  }
  if (r.in.return_logprob) {
    r.out.output_logprobs.push_back(logprob);
    if (r.in.top_logprobs_num > 0) r.out.output_top_logprobs.push_back(std::move(top));
  }
  scheduler_.AppendToken(r.id, token);
  std::optional<std::string> stop = r.text->Feed(token);
  const int64_t n = static_cast<int64_t>(r.out.output_ids.size());
  const SamplingParams& sp = r.in.sampling;
  // SGLang's order: length first, then stop tokens, then stop strings.
  if (n >= r.max_new) {
    Finish(r.id, FinishReason::Length(sp.max_new_tokens ? *sp.max_new_tokens : r.max_new));
    return true;
  }
  if (std::find(r.stop_ids.begin(), r.stop_ids.end(), token) != r.stop_ids.end()) {
    Finish(r.id, FinishReason::Stop(token));
    return true;
  }
  if (stop) {
    Finish(r.id, FinishReason::StopString(*stop));
    return true;
  }
  return false;
}

// One step of the engine pipeline (docs/architecture.md, "Inference engine"): the scheduler
// admits, schedules and allocates K/V; then build inputs → forward → score prompts → sample →
// accept and emit. A failed stage aborts the batch's requests; the step still counts as run.
bool Engine::Impl::Step() {
  StepTimes times;
  times.start = Clock::now();
  step_version_ = engine_->weight_version();  // of every token this step samples
  Batch batch = scheduler_.Schedule();
  FinishUnscheduled(batch);
  if (batch.items.empty()) return false;

  const StepInputs in = BuildInputs(batch);
  times.built = Clock::now();
  ForwardOutput fwd;
  if (Status s = RunForward(in, &fwd); !s.ok()) {
    FailBatch(batch, s);
    return true;
  }
  times.forward = Clock::now();
  times.sampled = times.forward;
  if (Status s = RecordRoutedExperts(in.to_route); !s.ok()) {
    FailBatch(batch, s);
    return true;
  }
  if (Status s = ScorePrompts(in.to_score, fwd); !s.ok()) {
    FailBatch(batch, s);
    return true;
  }
  if (!in.to_sample.empty()) {
    StatusOr<SamplerOutput> sampled = SampleTokens(in.to_sample, &fwd);
    if (!sampled.ok()) {
      FailBatch(batch, sampled.status());
      return true;
    }
    times.sampled = Clock::now();
    AcceptAndEmit(in.to_sample, *std::move(sampled));
  }
  for (uint64_t id : in.prefill_only_done) Finish(id, FinishReason::Length(0));
  RecordStep(times, in);
  return true;
}

void Engine::Impl::FinishUnscheduled(const Batch& batch) {
  for (uint64_t id : batch.out_of_memory) {
    Finish(id, FinishReason::Abort(
                   "out of KV cache memory: the sequence no longer fits in the cache "
                   "(raise max_total_tokens / mem_fraction_static or lower max_new_tokens)",
                   503));
  }
  if (metrics_ && !batch.retracted.empty()) {
    metrics_->OnRetract(static_cast<int64_t>(batch.retracted.size()));
  }
}

Engine::Impl::StepInputs Engine::Impl::BuildInputs(const Batch& batch) {
  StepInputs in;
  in.items.reserve(batch.items.size());
  int64_t row = 0;
  for (const BatchItem& item : batch.items) {
    const Sequence* seq = scheduler_.Find(item.seq_id);
    LiveRequest& r = live_.at(item.seq_id);
    in.input_ids.insert(in.input_ids.end(), seq->tokens.begin() + item.start,
                        seq->tokens.begin() + item.start + item.num_tokens);
    in.items.push_back({item.num_tokens, item.start + item.num_tokens, &seq->pages});
    (item.num_tokens == 1 && item.start >= seq->prompt_len ? in.decode_tokens
                                                           : in.prefill_tokens) += item.num_tokens;
    if (r.in.return_logprob && r.in.logprob_start_len >= 0) {
      const int64_t end = std::min(item.start + item.num_tokens, seq->prompt_len - 1);
      for (int64_t q = std::max(r.next_input_lp, item.start); q < end; ++q) {
        in.to_score.push_back({item.seq_id, row + (q - item.start), q});
      }
      r.next_input_lp = std::max(r.next_input_lp, end);
    }
    if (r.in.return_routed_experts) {
      // Every position fed from routed_experts_start_len on, once (a retracted request's
      // recomputed positions are not recorded again).
      const int64_t end = item.start + item.num_tokens;
      for (int64_t q = std::max(r.next_route, item.start); q < end; ++q) {
        in.to_route.push_back({item.seq_id, row + (q - item.start)});
      }
      r.next_route = std::max(r.next_route, end);
    }
    if (item.completes) {
      if (static_cast<int64_t>(r.out.output_ids.size()) < r.max_new) {
        in.to_sample.push_back({item.seq_id, row + item.num_tokens - 1});
      } else {
        in.prefill_only_done.push_back(item.seq_id);
      }
    }
    row += item.num_tokens;
  }
  return in;
}

void Engine::Impl::FailBatch(const Batch& batch, const Status& s) {
  spdlog::error("engine: step failed, aborting its {} requests: {}", batch.items.size(),
                std::string(s.message()));
  scheduler_.Rollback(batch);  // their K/V was never written: keep it out of the cache
  for (const BatchItem& item : batch.items) {
    Finish(item.seq_id, FinishReason::Abort(std::string(s.message()), 500));
  }
}

Status Engine::Impl::RunForward(const StepInputs& in, ForwardOutput* out) {
  // A decode-only step (one new token per sequence, each sampled, no prompt scoring) replays
  // a captured CUDA graph when one fits; everything else runs eagerly.
  bool decode_only = in.to_score.empty() && in.to_route.empty() && in.prefill_tokens == 0 &&
                     in.to_sample.size() == in.items.size() && runner_->has_decode_graphs();
  for (size_t i = 0; decode_only && i < in.to_sample.size(); ++i) {
    decode_only = in.to_sample[i].row == static_cast<int64_t>(i);
  }
  if (decode_only) {
    StatusOr<torch::Tensor> logits = runner_->DecodeLogits(in.input_ids, in.items);
    if (logits.ok()) {
      out->sample_logits = *logits;
    } else if (!absl::IsNotFound(logits.status())) {
      return logits.status();
    }
  }
  if (!out->sample_logits.defined()) {
    // Rank 0's model sees every row (TP splits the experts' weights, not the tokens).
    model::DecoderModel& model = runner_->model(0);
    model.set_capture_routed_experts(!in.to_route.empty());
    out->hidden = runner_->Forward(in.input_ids, in.items);
    model.set_capture_routed_experts(false);
    if (!out->hidden.ok()) return out->hidden.status();
  }
  return absl::OkStatus();
}

Status Engine::Impl::RecordRoutedExperts(const std::vector<SampleRef>& to_route) {
  if (to_route.empty()) return absl::OkStatus();
  const std::vector<torch::Tensor>& captured = runner_->model(0).routed_experts();
  const model::ModelConfig& c = runner_->config();
  const int64_t layers = c.num_hidden_layers, k = c.moe.num_experts_per_tok;
  try {
    std::vector<int64_t> rows;
    for (const SampleRef& ref : to_route) rows.push_back(ref.row);
    const torch::Tensor index = torch::tensor(rows, torch::kLong);
    // [rows, layers, k] int32 on the CPU; a dense layer's slots stay 0.
    torch::Tensor table = torch::zeros({static_cast<int64_t>(rows.size()), layers, k}, torch::kInt);
    for (int64_t l = 0; l < layers && l < static_cast<int64_t>(captured.size()); ++l) {
      if (!captured[l].defined()) continue;
      const torch::Tensor got = captured[l].index_select(0, index.to(captured[l].device()));
      table.select(1, l).copy_(got.to(torch::kCPU, torch::kInt));
    }
    const int32_t* data = table.data_ptr<int32_t>();
    const int64_t width = layers * k;
    for (size_t i = 0; i < to_route.size(); ++i) {
      std::vector<int32_t>& dst = live_.at(to_route[i].id).out.routed_experts;
      const int32_t* row = data + static_cast<int64_t>(i) * width;
      dst.insert(dst.end(), row, row + width);
    }
  } catch (const std::exception& e) {
    return absl::InternalError(fmt::format("recording routed experts: {}", e.what()));
  }
  return absl::OkStatus();
}

Status Engine::Impl::ScorePrompts(const std::vector<ScoreRef>& to_score,
                                  const ForwardOutput& fwd) {
  // Prompt log-probs, in chunks so [rows, vocab] stays bounded.
  constexpr size_t kScoreChunk = 1024;
  for (size_t s = 0; s < to_score.size(); s += kScoreChunk) {
    const size_t e = std::min(to_score.size(), s + kScoreChunk);
    std::vector<int64_t> rows;
    std::vector<int64_t> targets;
    std::vector<float> temps;
    for (size_t i = s; i < e; ++i) {
      const ScoreRef& ref = to_score[i];
      rows.push_back(ref.row);
      const Sequence* seq = scheduler_.Find(ref.id);
      targets.push_back(seq->tokens[ref.position + 1]);
      const SamplingParams& sp = live_.at(ref.id).in.sampling;
      temps.push_back(sp.greedy() ? 1.0f : static_cast<float>(sp.temperature));
    }
    SLIME_ASSIGN_OR_RETURN(torch::Tensor logits, runner_->Logits(*fwd.hidden, rows));
    torch::Tensor scaled = logits / torch::tensor(temps).to(logits.device()).unsqueeze(1);
    torch::Tensor lps = torch::log_softmax(scaled, -1);  // [rows, vocab]
    torch::Tensor tgt = torch::tensor(targets, torch::kLong).to(lps.device()).unsqueeze(1);
    torch::Tensor chosen = lps.gather(1, tgt).squeeze(1).cpu();  // [rows]
    AppendInputLogprobs(to_score, s, e, targets, lps, chosen);
  }
  return absl::OkStatus();
}

void Engine::Impl::AppendInputLogprobs(const std::vector<ScoreRef>& to_score, size_t s, size_t e,
                                       const std::vector<int64_t>& targets,
                                       const torch::Tensor& lps, const torch::Tensor& chosen) {
  int64_t max_top = 0;
  for (size_t i = s; i < e; ++i) {
    max_top = std::max(max_top, live_.at(to_score[i].id).in.top_logprobs_num);
  }
  torch::Tensor top_v, top_i;  // [rows, max_top]
  if (max_top > 0) {
    auto top = lps.topk(std::min<int64_t>(max_top, lps.size(1)), 1);
    top_v = std::get<0>(top).cpu();
    top_i = std::get<1>(top).cpu();
  }
  for (size_t i = s; i < e; ++i) {
    LiveRequest& r = live_.at(to_score[i].id);
    const int64_t k = static_cast<int64_t>(i - s);
    r.out.input_logprob_ids.push_back(static_cast<int32_t>(targets[k]));
    r.out.input_logprobs.push_back(chosen[k].item<float>());
    if (r.in.top_logprobs_num > 0) {
      TopLogprobs t;
      for (int64_t j = 0; j < std::min(r.in.top_logprobs_num, top_v.size(1)); ++j) {
        t.emplace_back(top_v[k][j].item<float>(), static_cast<int32_t>(top_i[k][j].item<int64_t>()));
      }
      r.out.input_top_logprobs.push_back(std::move(t));
    }
  }
}

StatusOr<SamplerOutput> Engine::Impl::SampleTokens(const std::vector<SampleRef>& to_sample,
                                                   ForwardOutput* fwd) {
  std::vector<int64_t> rows;
  std::vector<SamplerRow> srows;
  rows.reserve(to_sample.size());
  srows.reserve(to_sample.size());
  for (const SampleRef& ref : to_sample) {
    rows.push_back(ref.row);
    const LiveRequest& r = live_.at(ref.id);
    const Sequence* seq = scheduler_.Find(ref.id);
    SamplerRow sr;
    sr.params = &r.in.sampling;
    sr.tokens = &seq->tokens;
    sr.prompt_len = seq->prompt_len;
    sr.num_output = static_cast<int64_t>(r.out.output_ids.size());
    sr.seed = r.seed;
    sr.stop_ids = &r.stop_ids;
    sr.top_logprobs_num = r.in.return_logprob ? r.in.top_logprobs_num : 0;
    sr.need_logprob = r.in.return_logprob;
    srows.push_back(sr);
  }
  if (!fwd->sample_logits.defined()) {
    SLIME_ASSIGN_OR_RETURN(fwd->sample_logits, runner_->Logits(*fwd->hidden, rows));
  }
  try {
    return Sample(fwd->sample_logits, srows);
  } catch (const std::exception& e) {
    return absl::InternalError(fmt::format("sampling: {}", e.what()));
  }
}

void Engine::Impl::AcceptAndEmit(const std::vector<SampleRef>& to_sample, SamplerOutput sampled) {
  for (size_t i = 0; i < to_sample.size(); ++i) {
    LiveRequest& r = live_.at(to_sample[i].id);
    if (!Accept(r, sampled.tokens[i], sampled.logprobs[i], std::move(sampled.top[i]))) Emit(r);
  }
}

void Engine::Impl::RecordStep(const StepTimes& times, const StepInputs& in) {
  last_step_end_ = Clock::now();
  ++phases_.steps;
  phases_.build += Seconds(times.built - times.start);
  phases_.forward += Seconds(times.forward - times.built);
  phases_.sample += Seconds(times.sampled - times.forward);
  phases_.emit += Seconds(last_step_end_ - times.sampled);
  if (metrics_) {
    metrics_->OnStep(Seconds(last_step_end_ - times.start), in.prefill_tokens, in.decode_tokens,
                     static_cast<int64_t>(in.to_sample.size()));
  }
}

// ---- Engine: the thread-safe shell around Impl.

StatusOr<std::unique_ptr<Engine>> Engine::Create(EngineOptions options) {
  if (options.tokenizer_path.empty()) options.tokenizer_path = options.model_path;
  if (options.served_model_name.empty()) options.served_model_name = options.model_path;
  if (options.stream_interval < 1) {
    return absl::InvalidArgumentError("stream_interval must be >= 1");
  }
  if (options.deterministic_inference) {
    // Every device this build can run on has the kernels (model/batch_invariant.h): CPU always,
    // CUDA in CUDA builds (a CPU build cannot open a CUDA device at all).
    model::SetBatchInvariant(true);
    spdlog::info("engine: deterministic inference: batch-invariant kernels on");
  }
  std::unique_ptr<Engine> engine(new Engine());
  SLIME_ASSIGN_OR_RETURN(engine->tokenizer_,
                         tokenizer::Tokenizer::FromDirectory(options.tokenizer_path));
  ModelRunnerOptions ro;
  ro.model_path = options.model_path;
  ro.dtype = options.dtype;
  ro.device = options.device;
  ro.page_size = options.page_size;
  ro.max_total_tokens = options.max_total_tokens;
  ro.mem_fraction_static = options.mem_fraction_static;
  ro.fuse_projections = options.fuse_projections;
  ro.tp_size = options.tp_size;
  SLIME_ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> runner, ModelRunner::Create(ro));
  const model::ModelConfig& mc = runner->config();
  engine->context_length_ =
      options.context_length > 0 ? options.context_length : mc.max_position_embeddings;
  if (engine->context_length_ <= 1) {
    return absl::InvalidArgumentError(fmt::format(
        "context length {} is too small (set context_length or max_position_embeddings)",
        engine->context_length_));
  }
  engine->eos_ids_ = CollectEosIds(options.model_path, mc, *engine->tokenizer_);
  const int64_t graph_batch = std::min(options.cuda_graph_max_bs, options.max_running_requests);
  SLIME_RETURN_IF_ERROR(runner->CaptureDecodeGraphs(graph_batch, engine->context_length_));
  engine->weight_version_ = options.weight_version;
  engine->options_ = std::move(options);
  engine->impl_ = std::make_unique<Impl>(engine.get(), std::move(runner));
  if (engine->options_.metrics != nullptr) {
    Engine* e = engine.get();
    engine->impl_->metrics_ =
        std::make_unique<EngineMetrics>(engine->options_.metrics, [e] { return e->load(); });
  }
  {
    std::lock_guard<std::mutex> lock(engine->mu_);
    engine->load_ = engine->impl_->Load();
  }
  engine->thread_ = std::thread([e = engine.get()] { e->ThreadMain(); });
  return engine;
}

Engine::~Engine() { Stop(); }

const model::ModelConfig& Engine::model_config() const {
  return impl_->runner()->config();
}

bool Engine::routes_experts() const {
  const model::ModelConfig& c = model_config();
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (c.moe.IsSparseLayer(l)) return true;
  }
  return false;
}

void Engine::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Engine::Post(std::function<void(Impl&)> command) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    commands_.push_back(std::move(command));
  }
  cv_.notify_one();
}

void Engine::ThreadMain() {
  Impl& impl = *impl_;
  // Everything this thread launches (cuBLAS handles, our kernels on the current stream, graph
  // replays) must target the model's device, which need not be device 0.
  c10::DeviceGuard device_guard(impl.runner()->device());
  while (true) {
    std::deque<std::function<void(Impl&)>> commands;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (!stopping_ && commands_.empty() && !impl.HasWork()) {
        cv_.wait(lock, [&] { return stopping_ || !commands_.empty(); });
      }
      if (stopping_) break;
      commands.swap(commands_);
    }
    for (auto& c : commands) c(impl);
    if (!commands.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      load_ = impl.Load();
    }
    if (impl.HasWork()) impl.Step();
    std::lock_guard<std::mutex> lock(mu_);
    load_ = impl.Load();
  }
  // Shutdown: run what was queued (so submitters get answers), then abort everything.
  std::deque<std::function<void(Impl&)>> commands;
  {
    std::lock_guard<std::mutex> lock(mu_);
    commands.swap(commands_);
  }
  for (auto& c : commands) c(impl);
  impl.AbortAll("engine shutting down");
  impl.LogPhases();
}

uint64_t Engine::Submit(GenerateInput input, Callback on_update) {
  const uint64_t id = next_id_++;
  Post([id, in = std::move(input), cb = std::move(on_update)](Impl& impl) mutable {
    impl.Submit(id, std::move(in), std::move(cb));
  });
  return id;
}

void Engine::Cancel(uint64_t id) {
  Post([id](Impl& impl) { impl.Cancel(id, "client disconnected"); });
}

void Engine::Abort(std::string rid_prefix, bool all) {
  Post([p = std::move(rid_prefix), all](Impl& impl) {
    impl.AbortMatching(p, all, "Abort request");
  });
}

void Engine::Pause(PauseMode mode) {
  paused_ = true;
  Post([mode](Impl& impl) { impl.Pause(mode); });
}

void Engine::Continue() {
  paused_ = false;
  Post([](Impl& impl) { impl.Continue(); });
}


std::future<bool> Engine::FlushCache() {
  auto promise = std::make_shared<std::promise<bool>>();
  auto f = promise->get_future();
  Post([promise](Impl& impl) { promise->set_value(impl.FlushCache()); });
  return f;
}

std::future<Status> Engine::UpdateWeightsFromDisk(std::string model_path,
                                                  std::string weight_version) {
  auto promise = std::make_shared<std::promise<Status>>();
  auto f = promise->get_future();
  Post([promise, p = std::move(model_path), v = std::move(weight_version)](Impl& impl) {
    promise->set_value(impl.UpdateWeightsFromDisk(p, v));
  });
  return f;
}

std::future<Status> Engine::InitWeightsUpdateGroup(const comm::ProcessGroupOptions& opts) {
  // TP rank r joins as rank_offset + r on its own device (SGLang's layout: an engine of N GPUs
  // takes N consecutive ranks). The runner's devices are immutable after Create.
  const ModelRunner& runner = *impl_->runner();
  const int tp = runner.tp_size();
  std::vector<comm::ProcessGroupOptions> per_rank;
  for (int r = 0; r < tp; ++r) {
    comm::ProcessGroupOptions o = opts;
    o.rank = opts.rank + r;
    const torch::Device device = runner.device(r);
    if (device.is_cuda()) o.cuda_device = device.has_index() ? device.index() : 0;
    per_rank.push_back(std::move(o));
  }
  if (opts.rank + tp > opts.world_size) {
    std::promise<Status> refused;
    refused.set_value(absl::InvalidArgumentError(fmt::format(
        "rank_offset {} + tp_size {} exceeds world_size {}: this engine takes {} ranks of "
        "weight update group '{}'",
        opts.rank, tp, opts.world_size, tp, opts.group_name)));
    return refused.get_future();
  }
  return std::async(std::launch::async, [this, per_rank]() -> Status {
    const std::string& name = per_rank.front().group_name;
    {
      std::lock_guard<std::mutex> lock(groups_mu_);
      if (weight_groups_.count(name) || joining_groups_.count(name)) {
        return absl::AlreadyExistsError(fmt::format(
            "weight update group '{}' already exists (destroy it first)", name));
      }
      joining_groups_.insert(name);
    }
    // Every rank joins at once (each blocks until the whole group is there).
    std::vector<std::future<StatusOr<std::unique_ptr<comm::ProcessGroup>>>> joins;
    for (const comm::ProcessGroupOptions& o : per_rank) {
      joins.push_back(std::async(std::launch::async, [o] { return comm::ProcessGroup::Create(o); }));
    }
    std::vector<std::shared_ptr<comm::ProcessGroup>> groups;
    Status status = absl::OkStatus();
    for (size_t r = 0; r < joins.size(); ++r) {
      StatusOr<std::unique_ptr<comm::ProcessGroup>> group = joins[r].get();
      if (group.ok()) {
        groups.push_back(std::move(*group));
      } else if (status.ok()) {
        status = per_rank.size() == 1
                     ? group.status()
                     : absl::Status(group.status().code(),
                                    fmt::format("TP rank {}: {}", r,
                                                std::string(group.status().message())));
      }
    }
    std::lock_guard<std::mutex> lock(groups_mu_);
    joining_groups_.erase(name);
    if (!status.ok()) return status;
    weight_groups_[name] = std::move(groups);
    return absl::OkStatus();
  });
}

std::future<Status> Engine::UpdateWeightsFromTensor(TensorWeightsUpdate update) {
  auto promise = std::make_shared<std::promise<Status>>();
  auto f = promise->get_future();
  Post([promise, u = std::move(update)](Impl& impl) { promise->set_value(impl.ReceiveIpc(u)); });
  return f;
}

std::future<Status> Engine::UpdateWeightsFromDistributed(DistributedWeightsUpdate update) {
  auto promise = std::make_shared<std::promise<Status>>();
  auto f = promise->get_future();
  std::vector<std::shared_ptr<comm::ProcessGroup>> groups;  // one per TP rank
  {
    std::lock_guard<std::mutex> lock(groups_mu_);
    auto it = weight_groups_.find(update.group_name);
    if (it != weight_groups_.end()) groups = it->second;
  }
  if (groups.empty()) {
    promise->set_value(absl::FailedPreconditionError(fmt::format(
        "weight update group '{}' does not exist (call /init_weights_update_group first)",
        update.group_name)));
    return f;
  }
  Post([promise, groups = std::move(groups), u = std::move(update)](Impl& impl) {
    promise->set_value(impl.ReceiveWeights(u, groups));
  });
  return f;
}

Status Engine::DestroyWeightsUpdateGroup(const std::string& group_name) {
  std::vector<std::shared_ptr<comm::ProcessGroup>> groups;
  {
    std::lock_guard<std::mutex> lock(groups_mu_);
    auto it = weight_groups_.find(group_name);
    if (it == weight_groups_.end()) {
      return absl::NotFoundError("The group to be destroyed does not exist.");
    }
    groups = std::move(it->second);
    weight_groups_.erase(it);
  }
  groups.clear();  // outside the lock: a c10d backend may take a while to shut down
  return absl::OkStatus();
}

std::future<Status> Engine::ReleaseMemory(std::vector<std::string> tags) {
  auto promise = std::make_shared<std::promise<Status>>();
  auto f = promise->get_future();
  Post([promise, t = std::move(tags)](Impl& impl) { promise->set_value(impl.Release(t)); });
  return f;
}

std::future<Status> Engine::ResumeMemory(std::vector<std::string> tags) {
  auto promise = std::make_shared<std::promise<Status>>();
  auto f = promise->get_future();
  Post([promise, t = std::move(tags)](Impl& impl) { promise->set_value(impl.Resume(t)); });
  return f;
}

std::future<StatusOr<Engine::WeightChecksumList>> Engine::WeightChecksums() {
  auto promise = std::make_shared<std::promise<StatusOr<WeightChecksumList>>>();
  auto f = promise->get_future();
  Post([promise](Impl& impl) { promise->set_value(impl.WeightChecksums()); });
  return f;
}

std::future<StatusOr<Engine::WeightSlice>> Engine::WeightByName(std::string hf_name,
                                                                int64_t truncate_size) {
  auto promise = std::make_shared<std::promise<StatusOr<WeightSlice>>>();
  auto f = promise->get_future();
  Post([promise, name = std::move(hf_name), truncate_size](Impl& impl) {
    promise->set_value(impl.WeightByName(name, truncate_size));
  });
  return f;
}

std::future<Status> Engine::HealthCheck() {
  auto promise = std::make_shared<std::promise<Status>>();
  auto f = promise->get_future();
  Post([promise](Impl& impl) { promise->set_value(impl.HealthCheck()); });
  return f;
}

std::string Engine::weight_version() const {
  std::lock_guard<std::mutex> lock(mu_);
  return weight_version_;
}

void Engine::set_weight_version(std::string v) {
  std::lock_guard<std::mutex> lock(mu_);
  weight_version_ = std::move(v);
}

EngineLoad Engine::load() const {
  std::lock_guard<std::mutex> lock(mu_);
  return load_;
}

}  // namespace slime::engine
