// The engines' health checks (engine_health.h).
#include "engine_health.h"

#include <cmath>

#include "fmt/format.h"
#include "slime/http/client.h"
#include "slime/runtime/rpc.h"
#include "spdlog/spdlog.h"

namespace slime::job {
namespace {

std::chrono::milliseconds Ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(std::llround(seconds * 1000.0)));
}

}  // namespace

EngineHealthMonitor::EngineHealthMonitor(EngineHealthOptions options)
    : options_(std::move(options)) {}

EngineHealthMonitor::~EngineHealthMonitor() {
  Stop();
  if (thread_.joinable()) thread_.join();
}

void EngineHealthMonitor::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (thread_.joinable() || stopping_) return;
  next_due_ = Clock::now() + Ms(options_.first_wait_s);
  thread_ = std::thread([this] { Loop(); });
}

void EngineHealthMonitor::Resume() {
  std::lock_guard<std::mutex> lock(mu_);
  ++active_;
  cv_.notify_all();
}

void EngineHealthMonitor::Pause() {
  std::lock_guard<std::mutex> lock(mu_);
  if (active_ > 0) --active_;
  cv_.notify_all();
}

void EngineHealthMonitor::Stop() {
  std::lock_guard<std::mutex> lock(mu_);
  stopping_ = true;
  cv_.notify_all();
}

int64_t EngineHealthMonitor::rounds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return rounds_;
}

int64_t EngineHealthMonitor::failures() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failures_;
}

std::string EngineHealthMonitor::Check(const EngineHealthTarget& engine) const {
  StatusOr<std::pair<std::string, int>> hp = runtime::SplitHostPort(engine.address);
  if (!hp.ok()) return std::string(hp.status().message());
  http::ClientOptions co;
  co.timeout = Ms(options_.timeout_s);
  co.keep_alive = false;
  co.bearer_token = options_.bearer_token;
  http::Client client(hp->first, hp->second, co);
  StatusOr<http::Response> r = client.Get("/health_generate");
  if (!r.ok()) {
    return fmt::format("GET /health_generate: {} (fault_tolerance.health_check_timeout {} s)",
                       std::string(r.status().message()), options_.timeout_s);
  }
  if (r->status != 200) {
    return fmt::format("GET /health_generate answered HTTP {}: {}", r->status,
                       r->body.substr(0, 300));
  }
  return "";
}

void EngineHealthMonitor::Loop() {
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Wait for the round to be due, then for the monitor to be active.
      while (!stopping_ && (active_ == 0 || Clock::now() < next_due_)) {
        if (active_ == 0) {
          cv_.wait(lock);
        } else {
          cv_.wait_until(lock, next_due_);
        }
      }
      if (stopping_) return;
    }
    const std::vector<EngineHealthTarget> targets =
        options_.targets ? options_.targets() : std::vector<EngineHealthTarget>{};
    int64_t failed = 0;
    for (const EngineHealthTarget& engine : targets) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stopping_) return;
      }
      const std::string why = Check(engine);
      if (why.empty()) continue;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stopping_) return;  // the job is ending: its engines are being stopped anyway
      }
      ++failed;
      spdlog::warn("engine {} at {} failed its health check: {}", engine.name, engine.address,
                   why);
      if (options_.on_unhealthy) options_.on_unhealthy(engine, why);
    }
    std::lock_guard<std::mutex> lock(mu_);
    ++rounds_;
    failures_ += failed;
    next_due_ = Clock::now() + Ms(options_.interval_s);
  }
}

}  // namespace slime::job
