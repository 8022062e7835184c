// The engines' health checks (src/job/engine_health.h) against real HTTP servers: the first
// round waits health_check_first_wait, the next ones health_check_interval after the previous
// round; nothing is checked while paused; an engine answering 503, or nothing within
// health_check_timeout, is reported by name while its healthy neighbour is not.
#include "engine_health.h"  // src/job (internal to the job module)

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "slime/http/server.h"

namespace slime::job {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// A stand-in engine: GET /health_generate answers `status` (0: never answers) and records when
// each check arrived.
class HealthServer {
 public:
  explicit HealthServer(int status) : status_(status) {
    http::Router router;
    router.Add("GET", "/health_generate",
               [this](const http::Request&, std::shared_ptr<http::ResponseWriter> w) {
                 std::lock_guard<std::mutex> lock(mu_);
                 times_.push_back(Clock::now());
                 if (status_ == 0) {
                   held_.push_back(std::move(w));  // never answered
                 } else {
                   w->Send(status_, status_ == 200 ? "" : "engine made no progress", "text/plain");
                 }
               });
    StatusOr<std::unique_ptr<http::Server>> s = http::Server::Start({}, std::move(router));
    EXPECT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
  }
  ~HealthServer() { server_->Stop(); }

  std::string address() const { return "127.0.0.1:" + std::to_string(server_->port()); }
  std::vector<Clock::time_point> times() {
    std::lock_guard<std::mutex> lock(mu_);
    return times_;
  }

 private:
  const int status_;
  std::mutex mu_;
  std::vector<Clock::time_point> times_;
  std::vector<std::shared_ptr<http::ResponseWriter>> held_;
  std::unique_ptr<http::Server> server_;
};

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

struct Reported {
  std::mutex mu;
  std::vector<std::pair<std::string, std::string>> failures;  // (name, why)
  std::vector<std::pair<std::string, std::string>> Get() {
    std::lock_guard<std::mutex> lock(mu);
    return failures;
  }
};

EngineHealthOptions OptionsFor(std::vector<EngineHealthTarget> targets, Reported* reported,
                               double first_wait, double interval, double timeout) {
  EngineHealthOptions o;
  o.first_wait_s = first_wait;
  o.interval_s = interval;
  o.timeout_s = timeout;
  o.targets = [targets] { return targets; };
  o.on_unhealthy = [reported](const EngineHealthTarget& e, const std::string& why) {
    std::lock_guard<std::mutex> lock(reported->mu);
    reported->failures.emplace_back(e.name, why);
  };
  return o;
}

TEST(EngineHealth, FirstCheckWaitsFirstWaitThenEveryInterval) {
  HealthServer engine(200);
  Reported reported;
  EngineHealthMonitor monitor(
      OptionsFor({{"engine-0", engine.address(), 1}}, &reported, 0.6, 0.25, 2.0));
  const auto start = Clock::now();
  monitor.Start();
  monitor.Resume();
  std::this_thread::sleep_for(1500ms);
  monitor.Stop();
  const std::vector<Clock::time_point> times = engine.times();
  ASSERT_GE(times.size(), 2u);
  EXPECT_GE(Seconds(times[0] - start), 0.6);
  EXPECT_LT(Seconds(times[0] - start), 1.2);
  for (size_t i = 1; i < times.size(); ++i) {
    EXPECT_GE(Seconds(times[i] - times[i - 1]), 0.25) << "check " << i;
  }
  EXPECT_LE(times.size(), 5u);  // (1.5 − 0.6) / 0.25 + 1
  EXPECT_TRUE(reported.Get().empty());
  EXPECT_EQ(monitor.failures(), 0);
}

TEST(EngineHealth, NothingIsCheckedWhilePausedAndADueRoundRunsOnResume) {
  HealthServer engine(200);
  Reported reported;
  EngineHealthMonitor monitor(
      OptionsFor({{"engine-0", engine.address(), 1}}, &reported, 0.0, 0.1, 2.0));
  monitor.Start();
  std::this_thread::sleep_for(500ms);
  EXPECT_TRUE(engine.times().empty()) << "checked while never resumed";
  const auto resumed = Clock::now();
  {
    EngineHealthMonitor::ActiveScope active(&monitor);
    std::this_thread::sleep_for(600ms);
  }
  const std::vector<Clock::time_point> during = engine.times();
  ASSERT_GE(during.size(), 2u);
  EXPECT_LT(Seconds(during[0] - resumed), 0.4) << "the overdue round waits for nothing";
  std::this_thread::sleep_for(200ms);  // a round in flight at the pause may still finish
  const size_t paused_at = engine.times().size();
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ(engine.times().size(), paused_at) << "checked while paused";
  monitor.Stop();
}

TEST(EngineHealth, AnEngineAnswering503OrNothingIsReportedByName) {
  HealthServer healthy(200), failing(503), silent(0);
  Reported reported;
  EngineHealthMonitor monitor(OptionsFor({{"engine-0", healthy.address(), 1},
                                          {"engine-1", failing.address(), 1},
                                          {"engine-2", silent.address(), 1}},
                                         &reported, 0.0, 10.0, 0.5));
  monitor.Start();
  monitor.Resume();
  const auto start = Clock::now();
  while (monitor.rounds() < 1 && Clock::now() - start < 10s) std::this_thread::sleep_for(20ms);
  monitor.Stop();
  ASSERT_EQ(monitor.rounds(), 1);
  EXPECT_GE(Seconds(Clock::now() - start), 0.5) << "the silent engine is waited for";
  const auto failures = reported.Get();
  ASSERT_EQ(failures.size(), 2u);
  EXPECT_EQ(failures[0].first, "engine-1");
  EXPECT_NE(failures[0].second.find("HTTP 503"), std::string::npos) << failures[0].second;
  EXPECT_NE(failures[0].second.find("engine made no progress"), std::string::npos);
  EXPECT_EQ(failures[1].first, "engine-2");
  EXPECT_NE(failures[1].second.find("health_check_timeout"), std::string::npos)
      << failures[1].second;
  EXPECT_EQ(monitor.failures(), 2);
  EXPECT_EQ(healthy.times().size(), 1u);
}

}  // namespace
}  // namespace slime::job
