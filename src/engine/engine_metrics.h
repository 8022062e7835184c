// Prometheus metrics of one engine (private to the engine library).
//
// Counters and histograms are updated by the engine thread; the load gauges are callbacks that
// read Engine::load() at scrape time. Names follow Prometheus conventions with an `slime_engine_`
// prefix; docs/http-api.md lists them.
#ifndef SLIME_SRC_ENGINE_ENGINE_METRICS_H_
#define SLIME_SRC_ENGINE_ENGINE_METRICS_H_

#include <cstdint>
#include <functional>

#include "slime/engine/request.h"
#include "slime/metrics/registry.h"

namespace slime::engine {

struct EngineLoad;

class EngineMetrics {
 public:
  // Registers every metric in `registry` (which must outlive this object); `load` is called at
  // scrape time from an HTTP thread.
  EngineMetrics(metrics::Registry* registry, std::function<EngineLoad()> load);

  void OnRequest() { requests_total_->Increment(); }
  void OnFirstToken(double seconds) { ttft_->Observe(seconds); }
  void OnNextToken(double seconds) { itl_->Observe(seconds); }
  void OnFinish(const RequestOutput& out);
  void OnStep(double seconds, int64_t prefill_tokens, int64_t decode_tokens, int64_t batch_size);
  void OnRetract(int64_t n) { retractions_->Increment(static_cast<double>(n)); }

 private:
  metrics::Counter* requests_total_;
  metrics::Counter* finished_stop_;
  metrics::Counter* finished_length_;
  metrics::Counter* finished_abort_;
  metrics::Counter* prompt_tokens_;
  metrics::Counter* cached_tokens_;
  metrics::Counter* generation_tokens_;
  metrics::Counter* prefill_tokens_;
  metrics::Counter* retractions_;
  metrics::Histogram* ttft_;
  metrics::Histogram* itl_;
  metrics::Histogram* e2e_;
  metrics::Histogram* step_;
  metrics::Histogram* batch_size_;
};

}  // namespace slime::engine

#endif  // SLIME_SRC_ENGINE_ENGINE_METRICS_H_
