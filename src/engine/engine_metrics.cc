// Engine metrics (see engine_metrics.h).
#include "engine_metrics.h"

#include "slime/engine/engine.h"

namespace slime::engine {

EngineMetrics::EngineMetrics(metrics::Registry* r, std::function<EngineLoad()> load) {
  requests_total_ = &r->GetCounter("slime_engine_requests_total", "Generation requests received.");
  const char* kFinished = "slime_engine_requests_finished_total";
  const char* kFinishedHelp = "Generation requests finished, by finish reason.";
  finished_stop_ = &r->GetCounter(kFinished, kFinishedHelp, {{"reason", "stop"}});
  finished_length_ = &r->GetCounter(kFinished, kFinishedHelp, {{"reason", "length"}});
  finished_abort_ = &r->GetCounter(kFinished, kFinishedHelp, {{"reason", "abort"}});
  prompt_tokens_ = &r->GetCounter("slime_engine_prompt_tokens_total",
                                  "Prompt tokens of finished requests.");
  cached_tokens_ = &r->GetCounter("slime_engine_cached_prompt_tokens_total",
                                  "Prompt tokens served from the radix prefix cache.");
  generation_tokens_ = &r->GetCounter("slime_engine_generation_tokens_total",
                                      "Output tokens of finished requests.");
  prefill_tokens_ = &r->GetCounter("slime_engine_prefill_tokens_total",
                                   "Tokens computed in prefill (prefix-cache hits excluded).");
  retractions_ = &r->GetCounter("slime_engine_retractions_total",
                                "Requests preempted (K/V freed, recomputed later).");
  const auto latency = metrics::ExponentialBuckets(0.001, 2.0, 18);  // 1 ms .. ~131 s
  ttft_ = &r->GetHistogram("slime_engine_time_to_first_token_seconds",
                           "Arrival to first output token.", latency);
  itl_ = &r->GetHistogram("slime_engine_inter_token_latency_seconds",
                          "Time between consecutive output tokens of a request.",
                          metrics::ExponentialBuckets(0.0005, 2.0, 16));
  e2e_ = &r->GetHistogram("slime_engine_e2e_request_latency_seconds",
                          "Arrival to finish.", latency);
  step_ = &r->GetHistogram("slime_engine_step_seconds", "Duration of one engine step.",
                           metrics::ExponentialBuckets(0.0005, 2.0, 16));
  batch_size_ = &r->GetHistogram("slime_engine_decode_batch_size",
                                 "Sequences sampled per step.",
                                 metrics::ExponentialBuckets(1, 2.0, 12));
  r->AddCallbackGauge("slime_engine_num_running_requests", "Requests being computed.", {},
                      [load] { return static_cast<double>(load().num_running); });
  r->AddCallbackGauge("slime_engine_num_waiting_requests",
                      "Requests queued (incl. held while paused).", {},
                      [load] { return static_cast<double>(load().num_waiting); });
  r->AddCallbackGauge("slime_engine_kv_pages_used", "K/V pages in use (requests + prefix cache).",
                      {}, [load] { return static_cast<double>(load().num_used_pages); });
  r->AddCallbackGauge("slime_engine_kv_pages_free", "K/V pages on the free list.", {}, [load] {
    EngineLoad l = load();
    return static_cast<double>(l.num_total_pages - l.num_used_pages);
  });
  r->AddCallbackGauge("slime_engine_kv_pages_cached", "K/V pages held by the prefix cache.", {},
                      [load] { return static_cast<double>(load().num_cached_pages); });
  metrics::Counter* prompt = prompt_tokens_;
  metrics::Counter* cached = cached_tokens_;
  r->AddCallbackGauge("slime_engine_prefix_cache_hit_rate",
                      "Cached prompt tokens / prompt tokens over the engine's life.", {},
                      [prompt, cached] {
                        const double p = prompt->Value();
                        return p > 0 ? cached->Value() / p : 0.0;
                      });
}

void EngineMetrics::OnFinish(const RequestOutput& out) {
  switch (out.finish.type) {
    case FinishType::kStop:
      finished_stop_->Increment();
      break;
    case FinishType::kLength:
      finished_length_->Increment();
      break;
    default:
      finished_abort_->Increment();
      break;
  }
  prompt_tokens_->Increment(static_cast<double>(out.prompt_tokens));
  cached_tokens_->Increment(static_cast<double>(out.cached_tokens));
  generation_tokens_->Increment(static_cast<double>(out.output_ids.size()));
  e2e_->Observe(out.e2e_latency);
}

void EngineMetrics::OnStep(double seconds, int64_t prefill_tokens, int64_t decode_tokens,
                           int64_t batch_size) {
  step_->Observe(seconds);
  prefill_tokens_->Increment(static_cast<double>(prefill_tokens));
  if (batch_size > 0) batch_size_->Observe(static_cast<double>(batch_size));
  (void)decode_tokens;
}

}  // namespace slime::engine
