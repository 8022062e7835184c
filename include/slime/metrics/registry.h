// Metrics registry: counters, gauges and histograms with labels, on prometheus-cpp.
//
// The metric objects are prometheus-cpp's own (prometheus::Counter, Gauge, Histogram), kept in a
// prometheus::Registry and rendered by its TextSerializer (Prometheus text format 0.0.4). This
// class adds what slime's code relies on around that library:
//   - get-or-create by (name, help, labels) in one call, returning a reference that stays valid
//     for the registry's lifetime (callers look a child up once and keep it; updating it needs
//     no lock of ours);
//   - registration mistakes are programmer bugs and abort with a message naming the metric (an
//     invalid name, one name with two types, two help strings or two bucket layouts, the
//     reserved histogram label `le`); prometheus-cpp would throw or accept them silently;
//   - callback gauges, evaluated at every scrape;
//   - a stable exposition: families sorted by name, children by label set (prometheus-cpp keeps
//     children in a hash map).
//
// Ownership: the registry owns every family and child. It is neither copyable nor movable.
// Threads: every method of Registry, and of the Counter/Gauge/Histogram it returns, may be
// called from any thread.
//
// Names: Prometheus metric names are [a-zA-Z_:][a-zA-Z0-9_:]* and label names
// [a-zA-Z_][a-zA-Z0-9_]*, neither starting with "__" (reserved); prometheus-cpp's checks decide.
// Code that builds names at runtime (e.g. from metric keys) calls ValidateMetricName /
// ValidateLabelName first and reports the Status. Label *values* may be any string; the
// serializer escapes them.
//
// Semantics inherited from prometheus-cpp: Counter::Increment with a negative amount is ignored;
// a histogram bucket i counts observations v <= bounds[i] (cumulative, as exposed), plus +Inf.
#ifndef SLIME_METRICS_REGISTRY_H_
#define SLIME_METRICS_REGISTRY_H_

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/labels.h"
#include "prometheus/metric_family.h"
#include "slime/common/status.h"

namespace prometheus {
class Registry;
}  // namespace prometheus

namespace slime::metrics {

// Label name -> value (a std::map: one canonical, sorted order).
using Labels = prometheus::Labels;
using Counter = prometheus::Counter;
using Gauge = prometheus::Gauge;
using Histogram = prometheus::Histogram;

Status ValidateMetricName(std::string_view name);
Status ValidateLabelName(std::string_view name);

// `count` bounds start, start*factor, start*factor^2, ...; start > 0, factor > 1, count >= 1.
std::vector<double> ExponentialBuckets(double start, double factor, int count);
// `count` bounds start, start+width, ...; width > 0, count >= 1.
std::vector<double> LinearBuckets(double start, double width, int count);

class Registry : public prometheus::Collectable {
 public:
  Registry();
  ~Registry() override;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Get-or-create. The returned reference stays valid for the registry's lifetime.
  Counter& GetCounter(const std::string& name, const std::string& help, const Labels& labels = {});
  // Aborts when (name, labels) is a callback gauge.
  Gauge& GetGauge(const std::string& name, const std::string& help, const Labels& labels = {});
  // `bounds` must be finite and strictly increasing, and the same for every child of a family.
  Histogram& GetHistogram(const std::string& name, const std::string& help,
                          const std::vector<double>& bounds, const Labels& labels = {});

  // Registers a gauge whose value is `callback()` at scrape time. The callback runs under the
  // registry's mutex on the scraping thread: it must be quick, thread-safe, and must not call
  // back into this registry. Registering the same (name, labels) twice aborts; the name may
  // also hold plain gauges with other label sets.
  void AddCallbackGauge(const std::string& name, const std::string& help, const Labels& labels,
                        std::function<double()> callback);

  // prometheus::Collectable: runs the callback gauges, then collects every family, sorted by
  // name, each family's children sorted by label set.
  std::vector<prometheus::MetricFamily> Collect() const override;

  // Collect() through prometheus-cpp's TextSerializer (text format 0.0.4): for each family
  // `# HELP`, `# TYPE` and its samples; histograms as `_count`, `_sum` and cumulative
  // `_bucket{le=".."}` ending with le="+Inf". Empty when nothing is registered.
  std::string Exposition() const;

 private:
  enum class Type { kCounter, kGauge, kHistogram };
  struct FamilyEntry {
    Type type;
    std::string help;
    std::vector<double> bounds;  // histograms only
    std::variant<prometheus::Family<Counter>*, prometheus::Family<Gauge>*,
                 prometheus::Family<Histogram>*>
        family;
  };
  struct CallbackGauge {
    Gauge* gauge;
    std::function<double()> callback;
  };

  // Finds or creates the family; aborts on an invalid name or a name/type/help conflict.
  FamilyEntry& GetFamily(const std::string& name, const std::string& help, Type type,
                         const Labels& labels) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable std::mutex mu_;
  const std::unique_ptr<prometheus::Registry> registry_;
  std::map<std::string, FamilyEntry> families_ ABSL_GUARDED_BY(mu_);
  std::map<std::tuple<std::string, Labels>, CallbackGauge> callbacks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace slime::metrics

#endif  // SLIME_METRICS_REGISTRY_H_
