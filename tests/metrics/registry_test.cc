#include "slime/metrics/registry.h"

#include <atomic>
#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "promtool.h"

namespace slime::metrics {
namespace {

TEST(NameValidationTest, PrometheusCharset) {
  EXPECT_TRUE(ValidateMetricName("slime_requests_total").ok());
  EXPECT_TRUE(ValidateMetricName("ns:sub_metric").ok());
  EXPECT_TRUE(ValidateMetricName("_x1").ok());
  EXPECT_FALSE(ValidateMetricName("").ok());
  EXPECT_FALSE(ValidateMetricName("__reserved").ok());
  EXPECT_FALSE(ValidateMetricName("1abc").ok());
  EXPECT_FALSE(ValidateMetricName("a-b").ok());
  Status s = ValidateMetricName("bad name");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("\"bad name\""), std::string::npos) << s;
  EXPECT_NE(std::string(s.message()).find("[a-zA-Z_:]"), std::string::npos) << s;

  EXPECT_TRUE(ValidateLabelName("model").ok());
  EXPECT_TRUE(ValidateLabelName("_a9").ok());
  EXPECT_FALSE(ValidateLabelName("a:b").ok());
  EXPECT_FALSE(ValidateLabelName("9a").ok());
  EXPECT_FALSE(ValidateLabelName("__name__").ok());
}

TEST(RegistryTest, ExpositionGolden) {
  Registry registry;
  registry.GetCounter("slime_requests_total", "Requests served.", {{"route", "/generate"}})
      .Increment(3);
  registry.GetCounter("slime_requests_total", "Requests served.", {{"route", "/health"}})
      .Increment();
  registry.GetGauge("slime_queue_length", "Requests waiting.").Set(7);
  registry.GetGauge("slime_kv_usage", "KV cache use.", {{"engine", "0"}, {"dp", "1"}}).Set(0.5);

  EXPECT_EQ(registry.Exposition(),
            "# HELP slime_kv_usage KV cache use.\n"
            "# TYPE slime_kv_usage gauge\n"
            "slime_kv_usage{dp=\"1\",engine=\"0\"} 0.5\n"
            "# HELP slime_queue_length Requests waiting.\n"
            "# TYPE slime_queue_length gauge\n"
            "slime_queue_length 7\n"
            "# HELP slime_requests_total Requests served.\n"
            "# TYPE slime_requests_total counter\n"
            "slime_requests_total{route=\"/generate\"} 3\n"
            "slime_requests_total{route=\"/health\"} 1\n");
}

TEST(RegistryTest, EmptyRegistryExposesNothing) {
  Registry registry;
  EXPECT_EQ(registry.Exposition(), "");
}

TEST(RegistryTest, GetOrCreateReturnsTheSameChild) {
  Registry registry;
  Counter& a = registry.GetCounter("c_total", "help", {{"k", "v"}});
  Counter& b = registry.GetCounter("c_total", "help", {{"k", "v"}});
  Counter& other = registry.GetCounter("c_total", "help", {{"k", "w"}});
  EXPECT_EQ(&a, &b);
  EXPECT_NE(&a, &other);
  a.Increment(2);
  b.Increment(0.5);
  EXPECT_DOUBLE_EQ(a.Value(), 2.5);
  // References stay valid while many more children are created.
  for (int i = 0; i < 1000; ++i) registry.GetCounter("c_total", "help", {{"k", std::to_string(i)}});
  EXPECT_EQ(&a, &registry.GetCounter("c_total", "help", {{"k", "v"}}));
}

TEST(RegistryTest, EscapesLabelValuesAndHelp) {
  Registry registry;
  registry.GetGauge("g", "line one\nback\\slash \"quoted\"", {{"path", "a\\b \"c\"\nd"}}).Set(1);
  EXPECT_EQ(registry.Exposition(),
            "# HELP g line one\\nback\\\\slash \"quoted\"\n"
            "# TYPE g gauge\n"
            "g{path=\"a\\\\b \\\"c\\\"\\nd\"} 1\n");
}

TEST(RegistryTest, HistogramBucketsAreCumulative) {
  Registry registry;
  Histogram& h =
      registry.GetHistogram("latency_seconds", "Latency.", {0.1, 0.5, 1}, {{"op", "gen"}});
  for (double v : {0.05, 0.1, 0.2, 0.7, 3.0, 0.5}) h.Observe(v);
  // prometheus-cpp's TextSerializer writes _count and _sum before the buckets.
  EXPECT_EQ(registry.Exposition(),
            "# HELP latency_seconds Latency.\n"
            "# TYPE latency_seconds histogram\n"
            "latency_seconds_count{op=\"gen\"} 6\n"
            "latency_seconds_sum{op=\"gen\"} 4.55\n"
            "latency_seconds_bucket{op=\"gen\",le=\"0.1\"} 2\n"
            "latency_seconds_bucket{op=\"gen\",le=\"0.5\"} 4\n"
            "latency_seconds_bucket{op=\"gen\",le=\"1\"} 5\n"
            "latency_seconds_bucket{op=\"gen\",le=\"+Inf\"} 6\n");
  const prometheus::ClientMetric m = h.Collect();
  EXPECT_EQ(m.histogram.sample_count, 6u);
  std::vector<uint64_t> cumulative;
  for (const auto& b : m.histogram.bucket) cumulative.push_back(b.cumulative_count);
  EXPECT_EQ(cumulative, (std::vector<uint64_t>{2, 4, 5, 6}));
}

TEST(RegistryTest, HistogramWithoutLabels) {
  Registry registry;
  registry.GetHistogram("h", "H.", {1}).Observe(2);
  EXPECT_EQ(registry.Exposition(),
            "# HELP h H.\n# TYPE h histogram\n"
            "h_count 1\nh_sum 2\nh_bucket{le=\"1\"} 0\nh_bucket{le=\"+Inf\"} 1\n");
}

// The registry is a prometheus::Collectable: families sorted by name, children by labels,
// each with its prometheus-cpp type.
TEST(RegistryTest, CollectIsSortedAndTyped) {
  Registry registry;
  registry.GetGauge("b_gauge", "B.", {{"k", "z"}}).Set(1);
  registry.GetGauge("b_gauge", "B.", {{"k", "a"}}).Set(2);
  registry.GetCounter("a_total", "A.").Increment(5);
  registry.GetHistogram("c_seconds", "C.", {1}).Observe(0.5);
  const std::vector<prometheus::MetricFamily> families = registry.Collect();
  ASSERT_EQ(families.size(), 3u);
  EXPECT_EQ(families[0].name, "a_total");
  EXPECT_EQ(families[0].type, prometheus::MetricType::Counter);
  EXPECT_EQ(families[0].metric.at(0).counter.value, 5);
  EXPECT_EQ(families[1].name, "b_gauge");
  EXPECT_EQ(families[1].type, prometheus::MetricType::Gauge);
  ASSERT_EQ(families[1].metric.size(), 2u);
  EXPECT_EQ(families[1].metric[0].label.at(0).value, "a");
  EXPECT_EQ(families[1].metric[0].gauge.value, 2);
  EXPECT_EQ(families[2].name, "c_seconds");
  EXPECT_EQ(families[2].type, prometheus::MetricType::Histogram);
}

TEST(RegistryTest, NegativeCounterIncrementsAreIgnored) {
  Registry registry;
  Counter& c = registry.GetCounter("c_total", "C.");
  c.Increment(2);
  c.Increment(-1);
  EXPECT_EQ(c.Value(), 2);
}

TEST(RegistryTest, BucketHelpers) {
  EXPECT_EQ(ExponentialBuckets(1, 2, 4), (std::vector<double>{1, 2, 4, 8}));
  EXPECT_EQ(LinearBuckets(0.5, 0.5, 3), (std::vector<double>{0.5, 1.0, 1.5}));
}

// Every metric kind, labels that need escaping, and special values, through the real promtool.
TEST(RegistryTest, ExpositionPassesPromtool) {
  Registry registry;
  registry.GetCounter("slime_requests_total", "Requests served.", {{"route", "/generate"}})
      .Increment(3);
  registry
      .GetGauge("slime_kv_usage_ratio", "KV cache use \\ with \"quotes\".",
                {{"engine", "a\"b\\c\nd"}})
      .Set(std::numeric_limits<double>::infinity());
  registry.GetGauge("slime_nan_value", "A gauge that is NaN.").Set(std::nan(""));
  registry.GetHistogram("slime_latency_seconds", "Latency.", {0.1, 0.5, 1}, {{"op", "gen"}})
      .Observe(0.2);
  registry.AddCallbackGauge("slime_callback_value", "Callback.", {}, [] { return 1e300; });
  const slime::testing::PromtoolResult r =
      slime::testing::PromtoolCheckMetrics(registry.Exposition());
  ASSERT_TRUE(r.ran) << r.output;
  EXPECT_EQ(r.exit_code, 0) << r.output << "\n" << registry.Exposition();
  // And promtool does catch a broken exposition (the check is live, not a formality).
  const slime::testing::PromtoolResult bad =
      slime::testing::PromtoolCheckMetrics("# TYPE x counter\nx{a=\"1\" 2\n");
  ASSERT_TRUE(bad.ran) << bad.output;
  EXPECT_NE(bad.exit_code, 0) << bad.output;
}

TEST(RegistryTest, CallbackGaugeIsEvaluatedAtScrape) {
  Registry registry;
  std::atomic<int> calls{0};
  double value = 1.5;
  registry.AddCallbackGauge("cb", "Callback.", {{"a", "b"}}, [&] {
    ++calls;
    return value;
  });
  registry.GetGauge("cb", "Callback.", {{"a", "c"}}).Set(2);
  EXPECT_EQ(calls.load(), 0);
  EXPECT_EQ(registry.Exposition(),
            "# HELP cb Callback.\n# TYPE cb gauge\ncb{a=\"b\"} 1.5\ncb{a=\"c\"} 2\n");
  value = 4;
  EXPECT_NE(registry.Exposition().find("cb{a=\"b\"} 4\n"), std::string::npos);
  EXPECT_EQ(calls.load(), 2);
}

TEST(RegistryTest, ConcurrentIncrementsAreNotLost) {
  Registry registry;
  constexpr int kThreads = 8;
  constexpr int kPerThread = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&registry, t] {
      // Half the threads look the child up every time (get-or-create under contention).
      Counter& counter = registry.GetCounter("ops_total", "Ops.");
      Histogram& hist = registry.GetHistogram("sizes", "Sizes.", {1, 10});
      Gauge& gauge = registry.GetGauge("level", "Level.");
      for (int i = 0; i < kPerThread; ++i) {
        if (t % 2 == 0) {
          counter.Increment();
        } else {
          registry.GetCounter("ops_total", "Ops.").Increment();
        }
        hist.Observe(i % 20);
        gauge.Increment();
        gauge.Decrement(0.5);
        if (i % 1000 == 0) registry.Exposition();  // scrapes race with updates
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(registry.GetCounter("ops_total", "Ops.").Value(), kThreads * kPerThread);
  EXPECT_EQ(registry.GetGauge("level", "Level.").Value(), kThreads * kPerThread * 0.5);
  const prometheus::ClientMetric::Histogram s =
      registry.GetHistogram("sizes", "Sizes.", {1, 10}).Collect().histogram;
  EXPECT_EQ(s.sample_count, static_cast<uint64_t>(kThreads * kPerThread));
  // Per thread: values 0..19 repeated; 0,1 <= 1 (2 of 20); 2..10 <= 10 (9 of 20).
  EXPECT_EQ(s.bucket.at(0).cumulative_count, s.sample_count * 2 / 20);
  EXPECT_EQ(s.bucket.at(1).cumulative_count, s.sample_count * 11 / 20);
}

using RegistryDeathTest = ::testing::Test;

TEST(RegistryDeathTest, InvalidNamesAndConflictsAbortWithAClearMessage) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Registry registry;
  EXPECT_DEATH(registry.GetCounter("bad-name", "h"), "invalid metric name \"bad-name\"");
  EXPECT_DEATH(registry.GetCounter("ok", "h", {{"bad label", "v"}}),
               "invalid label name \"bad label\"");
  EXPECT_DEATH(registry.GetHistogram("h", "h", {1}, {{"le", "x"}}), "\"le\" is reserved");
  EXPECT_DEATH(registry.GetHistogram("h", "h", {2, 1}), "strictly increasing");
  registry.GetCounter("x", "h");
  EXPECT_DEATH(registry.GetGauge("x", "h"), "metric x registered as counter and as gauge");
  EXPECT_DEATH(registry.GetCounter("x", "other help"), "two help strings");
  registry.AddCallbackGauge("cbg", "h", {}, [] { return 1.0; });
  EXPECT_DEATH(registry.GetGauge("cbg", "h"), "is a callback gauge");
  EXPECT_DEATH(registry.AddCallbackGauge("cbg", "h", {}, [] { return 2.0; }),
               "gauge cbg is already registered");
  registry.GetHistogram("hb", "h", {1, 2});
  EXPECT_DEATH(registry.GetHistogram("hb", "h", {1, 3}), "two bucket layouts");
}

}  // namespace
}  // namespace slime::metrics
