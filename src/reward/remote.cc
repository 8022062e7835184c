// remote_rm: a reward model behind HTTP (reward.h, MakeRemoteRewardFn).
#include <algorithm>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "fmt/format.h"
#include "slime/http/client.h"
#include "slime/reward/reward.h"
#include "spdlog/spdlog.h"

namespace slime::reward {
namespace {

struct ParsedUrl {
  std::string host;
  int port = 80;
  std::string path = "/";
};

StatusOr<ParsedUrl> ParseUrl(const std::string& url) {
  const std::string_view scheme = "http://";
  if (url.compare(0, scheme.size(), scheme) != 0) {
    return absl::InvalidArgumentError(fmt::format(
        "remote_rm URL \"{}\" must start with http:// (https is not supported; put a local "
        "proxy in front)",
        url));
  }
  std::string rest = url.substr(scheme.size());
  ParsedUrl out;
  size_t slash = rest.find('/');
  std::string authority = rest.substr(0, slash);
  if (slash != std::string::npos) out.path = rest.substr(slash);
  size_t colon = authority.rfind(':');
  if (colon != std::string::npos && authority.find(']') == std::string::npos) {
    std::string port = authority.substr(colon + 1);
    authority = authority.substr(0, colon);
    bool digits =
        !port.empty() && port.size() <= 5 &&
        std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!digits || std::stoi(port) < 1 || std::stoi(port) > 65535) {
      return absl::InvalidArgumentError(
          fmt::format("remote_rm URL \"{}\": bad port \"{}\" (1-65535)", url, port));
    }
    out.port = std::stoi(port);
  }
  if (authority.empty()) {
    return absl::InvalidArgumentError(fmt::format("remote_rm URL \"{}\" has no host", url));
  }
  out.host = authority;
  return out;
}

// Whether an HTTP answer is worth another attempt.
bool RetryableStatus(int status) { return status == 408 || status == 429 || status >= 500; }

class RemoteRewardFn : public RewardFn {
 public:
  RemoteRewardFn(RemoteOptions options, ParsedUrl url)
      : options_(std::move(options)), url_(std::move(url)) {}

  std::string name() const override { return "remote_rm"; }

  StatusOr<RewardValue> Score(const RewardSample& sample) override {
    nlohmann::json payload = {{"prompt", std::string(sample.prompt)},
                              {"response", std::string(sample.response)},
                              {"label", std::string(sample.label)}};
    const std::string body = payload.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    Status last;
    for (int attempt = 0; attempt < options_.max_attempts; ++attempt) {
      if (attempt > 0) {
        auto wait = Backoff(attempt - 1);
        spdlog::info("remote_rm {}: {}; retrying in {} ms ({}/{})", options_.url,
                     std::string(last.message()), wait.count(), attempt, options_.max_attempts);
        std::this_thread::sleep_for(wait);
      }
      bool retry = true;
      auto value = Attempt(body, &retry);
      if (value.ok()) return value;
      last = value.status();
      if (!retry) break;
    }
    spdlog::warn("remote_rm {} failed: {}", options_.url, std::string(last.message()));
    return Status(last.code(),
                  fmt::format("remote_rm {}: {}", options_.url, std::string(last.message())));
  }

 private:
  StatusOr<RewardValue> Attempt(const std::string& body, bool* retry) {
    auto client = AcquireClient();
    auto response = client->Post(url_.path, body);
    if (!response.ok()) return response.status();  // transport error or timeout: retry
    if (response->status < 200 || response->status >= 300) {
      *retry = RetryableStatus(response->status);
      std::string snippet = response->body.substr(0, 200);
      return Status(http::StatusFromHttp(response->status, "POST", snippet).code(),
                    fmt::format("HTTP {}: {}", response->status, snippet));
    }
    nlohmann::json answer = nlohmann::json::parse(response->body, nullptr, false);
    ReleaseClient(std::move(client));
    if (answer.is_discarded()) {
      return absl::InternalError(
          fmt::format("the answer is not JSON: {}", response->body.substr(0, 200)));
    }
    *retry = false;
    if (answer.is_boolean()) return RewardValue{answer.get<bool>() ? 1.0 : 0.0, nullptr};
    if (answer.is_number()) return RewardValue{answer.get<double>(), nullptr};
    if (answer.is_object()) return RewardValue{std::nullopt, std::move(answer)};
    return absl::InvalidArgumentError(fmt::format("the answer {} is neither a number nor an object",
                                                  answer.dump().substr(0, 200)));
  }

  std::chrono::milliseconds Backoff(int k) {
    thread_local std::mt19937 rng(std::random_device{}());
    double base = static_cast<double>(options_.backoff_initial.count());
    double wait = std::min(base * static_cast<double>(1LL << std::min(k, 30)),
                           static_cast<double>(options_.backoff_max.count()));
    wait += std::uniform_real_distribution<double>(0.0, base)(rng);
    return std::chrono::milliseconds(static_cast<int64_t>(wait));
  }

  // Clients are reused across calls (keep-alive); one that failed is dropped.
  std::unique_ptr<http::Client> AcquireClient() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!idle_.empty()) {
        auto c = std::move(idle_.back());
        idle_.pop_back();
        return c;
      }
    }
    return std::make_unique<http::Client>(url_.host, url_.port,
                                          http::ClientOptions{.timeout = options_.timeout});
  }
  void ReleaseClient(std::unique_ptr<http::Client> c) {
    std::lock_guard<std::mutex> lock(mu_);
    idle_.push_back(std::move(c));
  }

  const RemoteOptions options_;
  const ParsedUrl url_;
  std::mutex mu_;
  std::vector<std::unique_ptr<http::Client>> idle_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

StatusOr<std::unique_ptr<RewardFn>> MakeRemoteRewardFn(const RemoteOptions& options) {
  if (options.url.empty()) {
    return absl::InvalidArgumentError("remote_rm needs a URL (reward.rm_url)");
  }
  SLIME_ASSIGN_OR_RETURN(ParsedUrl url, ParseUrl(options.url));
  if (options.timeout.count() <= 0 || options.max_attempts < 1 ||
      options.backoff_initial.count() < 0 || options.backoff_max < options.backoff_initial) {
    return absl::InvalidArgumentError(fmt::format(
        "remote_rm {}: timeout must be > 0, max_attempts >= 1 and 0 <= backoff_initial <= "
        "backoff_max (got {} ms, {}, {} ms, {} ms)",
        options.url, options.timeout.count(), options.max_attempts, options.backoff_initial.count(),
        options.backoff_max.count()));
  }
  return std::unique_ptr<RewardFn>(new RemoteRewardFn(options, std::move(url)));
}

}  // namespace slime::reward
