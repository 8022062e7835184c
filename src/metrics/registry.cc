#include "slime/metrics/registry.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "fmt/format.h"
#include "fmt/ranges.h"
#include "prometheus/check_names.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"
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

// prometheus-cpp 1.0 writes HELP text as given; the text format wants backslash and newline
// escaped, so the registry hands it escaped text.
std::string EscapeHelp(std::string_view help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string LabelsText(const Labels& labels) {
  if (labels.empty()) return "";
  std::vector<std::string> parts;
  for (const auto& [name, value] : labels) parts.push_back(fmt::format("{}=\"{}\"", name, value));
  return fmt::format("{{{}}}", fmt::join(parts, ","));
}

const char* TypeName(int type) {
  static const char* kNames[] = {"counter", "gauge", "histogram"};
  return kNames[type];
}

bool LabelsLess(const prometheus::ClientMetric& a, const prometheus::ClientMetric& b) {
  return a.label < b.label;
}

}  // namespace

Status ValidateMetricName(std::string_view name) {
  if (prometheus::CheckMetricName(std::string(name))) return absl::OkStatus();
  return absl::InvalidArgumentError(fmt::format(
      "invalid metric name \"{}\": must match [a-zA-Z_:][a-zA-Z0-9_:]* and not start with \"__\"",
      name));
}

Status ValidateLabelName(std::string_view name) {
  if (prometheus::CheckLabelName(std::string(name))) return absl::OkStatus();
  return absl::InvalidArgumentError(fmt::format(
      "invalid label name \"{}\": must match [a-zA-Z_][a-zA-Z0-9_]* and not start with \"__\"",
      name));
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

Registry::Registry() : registry_(std::make_unique<prometheus::Registry>()) {}
Registry::~Registry() = default;

Registry::FamilyEntry& Registry::GetFamily(const std::string& name, const std::string& help,
                                           Type type, const Labels& labels) {
  CheckOk(ValidateMetricName(name));
  for (const auto& [label, value] : labels) {
    CheckOk(ValidateLabelName(label));
    if (type == Type::kHistogram && label == "le") {
      Fatal(fmt::format("histogram {}: label name \"le\" is reserved for bucket bounds", name));
    }
  }
  auto it = families_.find(name);
  if (it == families_.end()) {
    FamilyEntry entry{type, help, {}, {}};
    const std::string escaped = EscapeHelp(help);
    switch (type) {
      case Type::kCounter:
        entry.family = &prometheus::BuildCounter().Name(name).Help(escaped).Register(*registry_);
        break;
      case Type::kGauge:
        entry.family = &prometheus::BuildGauge().Name(name).Help(escaped).Register(*registry_);
        break;
      case Type::kHistogram:
        entry.family = &prometheus::BuildHistogram().Name(name).Help(escaped).Register(*registry_);
        break;
    }
    it = families_.emplace(name, std::move(entry)).first;
  }
  FamilyEntry& family = it->second;
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
  FamilyEntry& family = GetFamily(name, help, Type::kCounter, labels);
  return std::get<prometheus::Family<Counter>*>(family.family)->Add(labels);
}

Gauge& Registry::GetGauge(const std::string& name, const std::string& help, const Labels& labels) {
  std::lock_guard<std::mutex> lock(mu_);
  FamilyEntry& family = GetFamily(name, help, Type::kGauge, labels);
  if (callbacks_.count({name, labels}) != 0) {
    Fatal(fmt::format("gauge {}{} is a callback gauge; it has no settable value", name,
                      LabelsText(labels)));
  }
  return std::get<prometheus::Family<Gauge>*>(family.family)->Add(labels);
}

void Registry::AddCallbackGauge(const std::string& name, const std::string& help,
                                const Labels& labels, std::function<double()> callback) {
  if (!callback) Fatal(fmt::format("callback gauge {} needs a callback", name));
  std::lock_guard<std::mutex> lock(mu_);
  FamilyEntry& entry = GetFamily(name, help, Type::kGauge, labels);
  prometheus::Family<Gauge>* family = std::get<prometheus::Family<Gauge>*>(entry.family);
  if (family->Has(labels)) {
    Fatal(fmt::format("gauge {}{} is already registered", name, LabelsText(labels)));
  }
  callbacks_[{name, labels}] = CallbackGauge{&family->Add(labels), std::move(callback)};
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
  FamilyEntry& family = GetFamily(name, help, Type::kHistogram, labels);
  if (family.bounds.empty()) family.bounds = bounds;
  if (family.bounds != bounds) {
    Fatal(fmt::format("histogram {} registered with two bucket layouts: [{}] and [{}]", name,
                      fmt::join(family.bounds, ", "), fmt::join(bounds, ", ")));
  }
  return std::get<prometheus::Family<Histogram>*>(family.family)->Add(labels, bounds);
}

std::vector<prometheus::MetricFamily> Registry::Collect() const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [key, cb] : callbacks_) cb.gauge->Set(cb.callback());
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  std::sort(families.begin(), families.end(),
            [](const prometheus::MetricFamily& a, const prometheus::MetricFamily& b) {
              return a.name < b.name;
            });
  for (prometheus::MetricFamily& f : families) {
    std::sort(f.metric.begin(), f.metric.end(), LabelsLess);
  }
  return families;
}

std::string Registry::Exposition() const {
  return prometheus::TextSerializer().Serialize(Collect());
}

}  // namespace slime::metrics
