// Metrics registry: counters, gauges and histograms with labels, rendered in the Prometheus
// text exposition format 0.0.4.
//
// A metric family is a name, a help string and a type; each distinct label set of a family is
// one child (a Counter, Gauge or Histogram). `Registry::GetCounter(name, help, labels)` returns
// the child for that label set, creating family and child on first use. Children live as long
// as the registry and never move, so callers look a child up once and keep the reference:
// updating it is lock-free (atomics only); only get-or-create and Exposition() take the
// registry's mutex.
//
// Ownership: the registry owns every family and child. It is neither copyable nor movable.
// Threads: every method of Registry, Counter, Gauge and Histogram may be called from any thread.
//
// Names are programmer-chosen constants, so an invalid one is a bug: the Get* functions abort
// the process (after logging the offending name and the valid charset) when a metric or label
// name is invalid, when one name is registered with two types, two help strings or two bucket
// layouts, or when a histogram uses the reserved label `le`. Code that builds names at runtime
// (e.g. from a config file) calls ValidateMetricName / ValidateLabelName first and reports the
// Status. Label *values* may be any string; they are escaped on output.
#ifndef SLIME_METRICS_REGISTRY_H_
#define SLIME_METRICS_REGISTRY_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "slime/common/status.h"

namespace slime::metrics {

// Label name -> value. A std::map, so a label set has one canonical (sorted) order, which is
// also the order labels are printed in.
using Labels = std::map<std::string, std::string>;

// Prometheus metric names: [a-zA-Z_:][a-zA-Z0-9_:]*.
Status ValidateMetricName(std::string_view name);
// Prometheus label names: [a-zA-Z_][a-zA-Z0-9_]*, and not starting with "__" (reserved).
Status ValidateLabelName(std::string_view name);

// A monotonically increasing value (requests served, tokens generated).
class Counter {
 public:
  Counter() = default;
  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;

  // Adds `amount`, which must be >= 0 (a negative amount is a bug and aborts).
  void Increment(double amount = 1.0);
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// A value that goes up and down (queue length, KV-cache use). A gauge created with
// Registry::AddCallbackGauge has no stored value: its callback is evaluated at every scrape
// and Set/Increment are not allowed on it (they abort).
class Gauge {
 public:
  Gauge() = default;
  explicit Gauge(std::function<double()> callback) : callback_(std::move(callback)) {}
  Gauge(const Gauge&) = delete;
  Gauge& operator=(const Gauge&) = delete;

  void Set(double value);
  void Increment(double amount = 1.0);
  void Decrement(double amount = 1.0) { Increment(-amount); }
  // The stored value, or the callback's result for a callback gauge.
  double Value() const;
  bool is_callback() const { return static_cast<bool>(callback_); }

 private:
  std::atomic<double> value_{0.0};
  const std::function<double()> callback_;  // empty for a plain gauge
};

// Observations counted into buckets with fixed upper bounds, plus their sum and count.
// Bucket i counts observations v with bounds[i-1] < v <= bounds[i]; an implicit last bucket
// (+Inf) takes the rest. Exposition prints the cumulative counts Prometheus expects.
class Histogram {
 public:
  // `bounds` must be finite and strictly increasing (checked by the registry).
  explicit Histogram(std::vector<double> bounds);
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  void Observe(double value);

  struct Snapshot {
    std::vector<double> bounds;        // without +Inf
    std::vector<uint64_t> cumulative;  // bounds.size() + 1 entries; the last is the count
    double sum = 0.0;
    uint64_t count = 0;
  };
  // Bucket counts are read one by one while other threads may observe, so a snapshot taken
  // under load can miss an in-flight observation; it is always self-consistent (count equals
  // the +Inf bucket).
  Snapshot Collect() const;
  const std::vector<double>& bounds() const { return bounds_; }

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // bounds_.size() + 1, not cumulative
  std::atomic<double> sum_{0.0};
};

// `count` bounds start, start*factor, start*factor^2, ...; start > 0, factor > 1, count >= 1.
std::vector<double> ExponentialBuckets(double start, double factor, int count);
// `count` bounds start, start+width, ...; width > 0, count >= 1.
std::vector<double> LinearBuckets(double start, double width, int count);

class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Get-or-create. The returned reference stays valid for the registry's lifetime.
  Counter& GetCounter(const std::string& name, const std::string& help, const Labels& labels = {});
  Gauge& GetGauge(const std::string& name, const std::string& help, const Labels& labels = {});
  // Every child of one histogram family must use the same bounds.
  Histogram& GetHistogram(const std::string& name, const std::string& help,
                          const std::vector<double>& bounds, const Labels& labels = {});

  // Registers a gauge whose value is `callback()` at scrape time. The callback runs under the
  // registry's mutex on the scraping thread: it must be quick, thread-safe, and must not call
  // back into this registry. Registering the same (name, labels) twice aborts; the name may
  // also hold plain gauges with other label sets.
  void AddCallbackGauge(const std::string& name, const std::string& help, const Labels& labels,
                        std::function<double()> callback);

  // Prometheus text format 0.0.4: families sorted by name, children by label set; for each
  // family `# HELP`, `# TYPE` and its samples; histograms as `_bucket{le=".."}` (cumulative,
  // ending with le="+Inf"), `_sum` and `_count`. Ends with a newline unless empty.
  std::string Exposition() const;

 private:
  enum class Type { kCounter, kGauge, kHistogram };
  struct Family;

  // Finds or creates the family; aborts on a name/type/help conflict. Holds mu_.
  Family& GetFamily(const std::string& name, const std::string& help, Type type,
                    const Labels& labels) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<Family>> families_ ABSL_GUARDED_BY(mu_);
};

// Formats a sample value the way Prometheus parses it: "+Inf", "-Inf", "NaN"; integral values
// below 2^53 without fraction or exponent ("3", "-12"); others in the shortest form that
// reads back to the same double ("0.25", "1e+300").
std::string FormatValue(double value);

// Escapes a label value: backslash, double quote and newline become \\, \" and \n.
std::string EscapeLabelValue(std::string_view value);
// Escapes HELP text: backslash and newline become \\ and \n.
std::string EscapeHelp(std::string_view help);

}  // namespace slime::metrics

#endif  // SLIME_METRICS_REGISTRY_H_
