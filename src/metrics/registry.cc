#include "slime/metrics/registry.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "fmt/format.h"
#include "spdlog/spdlog.h"

namespace slime::metrics {
namespace {

// A broken invariant in metric registration (see the header): log what and why, then abort.
// stderr directly as well, since the process logger may not be installed (or may be stdout).
[[noreturn]] void Fatal(const std::string& message) {
  std::fprintf(stderr, "FATAL metrics: %s\n", message.c_str());
  spdlog::critical("metrics: {}", message);
  spdlog::shutdown();  // flush file sinks
  std::abort();
}

void CheckOk(const Status& status) {
  if (!status.ok()) Fatal(std::string(status.message()));
}

bool IsAlpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

std::string FormatLabels(const Labels& labels, const char* extra_name = nullptr,
                         const std::string& extra_value = "") {
  if (labels.empty() && extra_name == nullptr) return "";
  std::string out = "{";
  bool first = true;
  for (const auto& [name, value] : labels) {
    if (!first) out += ',';
    first = false;
    out += name;
    out += "=\"";
    out += EscapeLabelValue(value);
    out += '"';
  }
  if (extra_name != nullptr) {
    if (!first) out += ',';
    out += extra_name;
    out += "=\"";
    out += EscapeLabelValue(extra_value);
    out += '"';
  }
  out += '}';
  return out;
}

void AtomicAdd(std::atomic<double>& target, double amount) {
  target.fetch_add(amount, std::memory_order_relaxed);
}

}  // namespace

Status ValidateMetricName(std::string_view name) {
  bool ok = !name.empty();
  for (size_t i = 0; ok && i < name.size(); ++i) {
    char c = name[i];
    ok = IsAlpha(c) || c == '_' || c == ':' || (i > 0 && IsDigit(c));
  }
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      fmt::format("invalid metric name \"{}\": must match [a-zA-Z_:][a-zA-Z0-9_:]*", name));
}

Status ValidateLabelName(std::string_view name) {
  bool ok = !name.empty();
  for (size_t i = 0; ok && i < name.size(); ++i) {
    char c = name[i];
    ok = IsAlpha(c) || c == '_' || (i > 0 && IsDigit(c));
  }
  if (ok && name.size() >= 2 && name[0] == '_' && name[1] == '_') {
    return absl::InvalidArgumentError(
        fmt::format("invalid label name \"{}\": names starting with \"__\" are reserved", name));
  }
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      fmt::format("invalid label name \"{}\": must match [a-zA-Z_][a-zA-Z0-9_]*", name));
}

std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  constexpr double kExact = 9007199254740992.0;  // 2^53
  if (value == std::trunc(value) && std::fabs(value) < kExact) {
    return fmt::format("{}", static_cast<int64_t>(value));
  }
  return fmt::format("{}", value);  // shortest round-trip form
}

std::string EscapeLabelValue(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string EscapeHelp(std::string_view help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// ---- Counter, Gauge, Histogram ----

void Counter::Increment(double amount) {
  if (!(amount >= 0)) Fatal(fmt::format("counter increment must be >= 0, got {}", amount));
  AtomicAdd(value_, amount);
}

void Gauge::Set(double value) {
  if (callback_) Fatal("Set on a callback gauge");
  value_.store(value, std::memory_order_relaxed);
}

void Gauge::Increment(double amount) {
  if (callback_) Fatal("Increment on a callback gauge");
  AtomicAdd(value_, amount);
}

double Gauge::Value() const {
  return callback_ ? callback_() : value_.load(std::memory_order_relaxed);
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)),
      buckets_(std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1)) {}

void Histogram::Observe(double value) {
  // First bound >= value: bucket "le" semantics. NaN lands in +Inf.
  size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  AtomicAdd(sum_, value);
}

Histogram::Snapshot Histogram::Collect() const {
  Snapshot s;
  s.bounds = bounds_;
  s.cumulative.resize(bounds_.size() + 1);
  uint64_t total = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    total += buckets_[i].load(std::memory_order_relaxed);
    s.cumulative[i] = total;
  }
  s.count = total;
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  if (!(start > 0) || !(factor > 1) || count < 1) {
    Fatal(fmt::format("ExponentialBuckets needs start > 0, factor > 1, count >= 1; got {}, {}, {}",
                      start, factor, count));
  }
  std::vector<double> bounds;
  double b = start;
  for (int i = 0; i < count; ++i, b *= factor) bounds.push_back(b);
  return bounds;
}

std::vector<double> LinearBuckets(double start, double width, int count) {
  if (!(width > 0) || count < 1) {
    Fatal(fmt::format("LinearBuckets needs width > 0, count >= 1; got {}, {}", width, count));
  }
  std::vector<double> bounds;
  for (int i = 0; i < count; ++i) bounds.push_back(start + width * i);
  return bounds;
}

// ---- Registry ----

struct Registry::Family {
  std::string name;
  std::string help;
  Type type;
  std::vector<double> bounds;  // histograms only
  // Exactly one of these maps is used, by type. unique_ptr: children never move.
  std::map<Labels, std::unique_ptr<Counter>> counters;
  std::map<Labels, std::unique_ptr<Gauge>> gauges;
  std::map<Labels, std::unique_ptr<Histogram>> histograms;
};

Registry::Registry() = default;
Registry::~Registry() = default;

namespace {
const char* TypeName(int type) {
  static const char* kNames[] = {"counter", "gauge", "histogram"};
  return kNames[type];
}
}  // namespace

Registry::Family& Registry::GetFamily(const std::string& name, const std::string& help, Type type,
                                      const Labels& labels) {
  CheckOk(ValidateMetricName(name));
  for (const auto& [label, value] : labels) {
    CheckOk(ValidateLabelName(label));
    if (type == Type::kHistogram && label == "le") {
      Fatal(fmt::format("histogram {}: label name \"le\" is reserved for bucket bounds", name));
    }
  }
  auto it = families_.find(name);
  if (it == families_.end()) {
    auto family = std::make_unique<Family>();
    family->name = name;
    family->help = help;
    family->type = type;
    it = families_.emplace(name, std::move(family)).first;
  }
  Family& family = *it->second;
  if (family.type != type) {
    Fatal(fmt::format("metric {} registered as {} and as {}", name,
                      TypeName(static_cast<int>(family.type)), TypeName(static_cast<int>(type))));
  }
  if (family.help != help) {
    Fatal(fmt::format("metric {} registered with two help strings: \"{}\" and \"{}\"", name,
                      family.help, help));
  }
  return family;
}

Counter& Registry::GetCounter(const std::string& name, const std::string& help,
                              const Labels& labels) {
  std::lock_guard<std::mutex> lock(mu_);
  Family& family = GetFamily(name, help, Type::kCounter, labels);
  auto& child = family.counters[labels];
  if (!child) child = std::make_unique<Counter>();
  return *child;
}

Gauge& Registry::GetGauge(const std::string& name, const std::string& help, const Labels& labels) {
  std::lock_guard<std::mutex> lock(mu_);
  Family& family = GetFamily(name, help, Type::kGauge, labels);
  auto& child = family.gauges[labels];
  if (!child) child = std::make_unique<Gauge>();
  if (child->is_callback()) {
    Fatal(fmt::format("gauge {}{} is a callback gauge; it has no settable value", name,
                      FormatLabels(labels)));
  }
  return *child;
}

void Registry::AddCallbackGauge(const std::string& name, const std::string& help,
                                const Labels& labels, std::function<double()> callback) {
  if (!callback) Fatal(fmt::format("callback gauge {} needs a callback", name));
  std::lock_guard<std::mutex> lock(mu_);
  Family& family = GetFamily(name, help, Type::kGauge, labels);
  auto& child = family.gauges[labels];
  if (child) {
    Fatal(fmt::format("gauge {}{} is already registered", name, FormatLabels(labels)));
  }
  child = std::make_unique<Gauge>(std::move(callback));
}

Histogram& Registry::GetHistogram(const std::string& name, const std::string& help,
                                  const std::vector<double>& bounds, const Labels& labels) {
  if (bounds.empty()) Fatal(fmt::format("histogram {} needs at least one bucket bound", name));
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (!std::isfinite(bounds[i]) || (i > 0 && !(bounds[i] > bounds[i - 1]))) {
      Fatal(
          fmt::format("histogram {}: bucket bounds must be finite and strictly increasing, "
                      "got [{}]",
                      name, fmt::join(bounds, ", ")));
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  Family& family = GetFamily(name, help, Type::kHistogram, labels);
  if (family.histograms.empty()) family.bounds = bounds;
  if (family.bounds != bounds) {
    Fatal(fmt::format("histogram {} registered with two bucket layouts: [{}] and [{}]", name,
                      fmt::join(family.bounds, ", "), fmt::join(bounds, ", ")));
  }
  auto& child = family.histograms[labels];
  if (!child) child = std::make_unique<Histogram>(bounds);
  return *child;
}

std::string Registry::Exposition() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  for (const auto& [name, family] : families_) {
    out += fmt::format("# HELP {} {}\n", name, EscapeHelp(family->help));
    out += fmt::format("# TYPE {} {}\n", name, TypeName(static_cast<int>(family->type)));
    switch (family->type) {
      case Type::kCounter:
        for (const auto& [labels, counter] : family->counters) {
          out +=
              fmt::format("{}{} {}\n", name, FormatLabels(labels), FormatValue(counter->Value()));
        }
        break;
      case Type::kGauge:
        for (const auto& [labels, gauge] : family->gauges) {
          out += fmt::format("{}{} {}\n", name, FormatLabels(labels), FormatValue(gauge->Value()));
        }
        break;
      case Type::kHistogram:
        for (const auto& [labels, histogram] : family->histograms) {
          Histogram::Snapshot s = histogram->Collect();
          for (size_t i = 0; i <= s.bounds.size(); ++i) {
            std::string le = i < s.bounds.size() ? FormatValue(s.bounds[i]) : "+Inf";
            out += fmt::format("{}_bucket{} {}\n", name, FormatLabels(labels, "le", le),
                               s.cumulative[i]);
          }
          out += fmt::format("{}_sum{} {}\n", name, FormatLabels(labels), FormatValue(s.sum));
          out += fmt::format("{}_count{} {}\n", name, FormatLabels(labels), s.count);
        }
        break;
    }
  }
  return out;
}

}  // namespace slime::metrics
