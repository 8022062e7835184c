// TeacherClient (teacher.h): teacher log-probs of sampled responses from an SGLang-API server.
#include "slime/rollout/teacher.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <random>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "nlohmann/json.hpp"
#include "slime/http/client.h"
#include "slime/http/util.h"

namespace slime::rollout {
namespace {

bool Retryable(int http_status) {
  return http_status == 408 || http_status == 429 || http_status >= 500;
}

}  // namespace

struct TeacherClient::Impl {
  TeacherOptions options;
  std::string host;
  int port = 0;
  std::string path;
  std::mutex mu;
  std::vector<std::unique_ptr<http::Client>> idle ABSL_GUARDED_BY(mu);

  std::unique_ptr<http::Client> Acquire() {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!idle.empty()) {
        auto c = std::move(idle.back());
        idle.pop_back();
        return c;
      }
    }
    return std::make_unique<http::Client>(host, port,
                                          http::ClientOptions{.timeout = options.timeout});
  }
  void Release(std::unique_ptr<http::Client> c) {
    std::lock_guard<std::mutex> lock(mu);
    idle.push_back(std::move(c));
  }

  std::chrono::milliseconds Backoff(int k) const {
    thread_local std::mt19937 rng(std::random_device{}());
    const double base = static_cast<double>(options.backoff_initial.count());
    double wait = std::min(base * static_cast<double>(int64_t{1} << std::min(k, 30)),
                           static_cast<double>(options.backoff_max.count()));
    wait += std::uniform_real_distribution<double>(0.0, base)(rng);
    return std::chrono::milliseconds(static_cast<int64_t>(wait));
  }

  // One POST; *retry says whether another attempt may help.
  StatusOr<nlohmann::json> Attempt(const std::string& body, bool* retry) {
    std::unique_ptr<http::Client> client = Acquire();
    StatusOr<http::Response> r = client->Post(path, body);
    if (!r.ok()) {
      *retry = true;  // transport error or timeout
      return r.status();
    }
    if (r->status < 200 || r->status >= 300) {
      *retry = Retryable(r->status);
      const std::string snippet = r->body.substr(0, 300);
      return Status(http::StatusFromHttp(r->status, "POST", snippet).code(),
                    fmt::format("HTTP {}: {}", r->status, snippet));
    }
    Release(std::move(client));
    *retry = false;
    nlohmann::json answer = nlohmann::json::parse(r->body, nullptr, false);
    if (answer.is_discarded()) {
      return absl::InternalError(fmt::format("the answer is not JSON: {}", r->body.substr(0, 200)));
    }
    return answer;
  }
};

TeacherClient::TeacherClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TeacherClient::~TeacherClient() = default;

const std::string& TeacherClient::url() const { return impl_->options.url; }

StatusOr<std::unique_ptr<TeacherClient>> TeacherClient::Create(TeacherOptions options) {
  auto impl = std::make_unique<Impl>();
  const std::string& url = options.url;
  const std::string_view scheme = "http://";
  if (url.rfind(scheme, 0) != 0) {
    return absl::InvalidArgumentError(
        fmt::format("OPD teacher URL \"{}\" (reward.rm_url) must start with http:// (e.g. "
                    "http://host:30000 or http://host:30000/generate)",
                    url));
  }
  const size_t slash = url.find('/', scheme.size());
  const std::string authority = url.substr(0, slash);
  StatusOr<std::pair<std::string, int>> hp = http::ParseHostPort(authority);
  if (!hp.ok()) {
    return absl::InvalidArgumentError(fmt::format("OPD teacher URL \"{}\" (reward.rm_url): {}", url,
                                                  std::string(hp.status().message())));
  }
  impl->host = hp->first;
  impl->port = hp->second;
  impl->path = slash == std::string::npos ? "/" : url.substr(slash);
  if (impl->path == "/") impl->path = "/generate";
  if (options.timeout.count() <= 0 || options.max_attempts < 1 ||
      options.backoff_initial.count() < 0 || options.backoff_max < options.backoff_initial ||
      !(options.temperature >= 0)) {
    return absl::InvalidArgumentError(fmt::format(
        "OPD teacher {}: timeout must be > 0, max_attempts >= 1, 0 <= backoff_initial <= "
        "backoff_max and temperature >= 0 (got {} ms, {}, {} ms, {} ms, {})",
        url, options.timeout.count(), options.max_attempts, options.backoff_initial.count(),
        options.backoff_max.count(), options.temperature));
  }
  impl->options = std::move(options);
  return std::unique_ptr<TeacherClient>(new TeacherClient(std::move(impl)));
}

StatusOr<std::vector<float>> TeacherClient::ResponseLogProbs(const data::Sample& sample) {
  const TeacherOptions& o = impl_->options;
  const int64_t r = sample.response_length;
  const int64_t p = sample.PromptLength();
  if (r == 0) return std::vector<float>{};
  auto fail = [&](absl::StatusCode code, const std::string& what) {
    return Status(code, fmt::format("OPD teacher {}: sample {}: {}", o.url, sample.index, what));
  };
  if (r < 0 || p < 1) {
    return fail(absl::StatusCode::kInvalidArgument,
                fmt::format("{} prompt and {} response tokens: the response needs at least one "
                            "prompt token before it",
                            p, r));
  }
  nlohmann::json request = {
      {"input_ids", sample.tokens},
      {"sampling_params",
       {{"temperature", o.temperature}, {"max_new_tokens", 0}, {"skip_special_tokens", false}}},
      {"return_logprob", true},
      {"logprob_start_len", p - 1},
  };
  const std::string body = request.dump();
  Status last;
  StatusOr<nlohmann::json> answer = absl::UnknownError("no attempt");
  int attempt = 0;
  for (; attempt < o.max_attempts; ++attempt) {
    if (attempt > 0) {
      const auto wait = impl_->Backoff(attempt - 1);
      spdlog::info("OPD teacher {}: sample {}: {}; retrying in {} ms ({}/{})", o.url, sample.index,
                   std::string(last.message()), wait.count(), attempt, o.max_attempts);
      std::this_thread::sleep_for(wait);
    }
    bool retry = false;
    answer = impl_->Attempt(body, &retry);
    if (answer.ok()) break;
    last = answer.status();
    if (!retry) {
      ++attempt;
      break;
    }
  }
  if (!answer.ok()) {
    return fail(last.code(), fmt::format("no log-probs after {} attempt{}: {}", attempt,
                                         attempt == 1 ? "" : "s", std::string(last.message())));
  }
  const nlohmann::json* lps = nullptr;
  if (answer->is_object() && answer->contains("meta_info") && (*answer)["meta_info"].is_object()) {
    const nlohmann::json& meta = (*answer)["meta_info"];
    if (meta.contains("input_token_logprobs") && meta["input_token_logprobs"].is_array()) {
      lps = &meta["input_token_logprobs"];
    }
  }
  if (lps == nullptr) {
    return fail(absl::StatusCode::kInternal,
                fmt::format("the answer has no meta_info.input_token_logprobs list: {}",
                            answer->dump().substr(0, 200)));
  }
  const int64_t n = static_cast<int64_t>(lps->size());
  if (n < r) {
    return fail(absl::StatusCode::kInternal,
                fmt::format("expected log-probs for its {} response tokens, the teacher returned "
                            "{} input_token_logprobs (prompt {} tokens, logprob_start_len {})",
                            r, n, p, p - 1));
  }
  std::vector<float> out;
  out.reserve(static_cast<size_t>(r));
  for (int64_t i = 0; i < r; ++i) {
    const nlohmann::json& t = (*lps)[static_cast<size_t>(n - r + i)];
    const int32_t want = sample.tokens[static_cast<size_t>(p + i)];
    if (!t.is_array() || t.size() < 2 || !t[0].is_number() || !t[1].is_number_integer()) {
      return fail(absl::StatusCode::kInternal,
                  fmt::format("response token {} (id {}): expected a [logprob, token_id, text] "
                              "triple with a number, got {}",
                              i, want, t.dump().substr(0, 100)));
    }
    if (t[1].get<int64_t>() != want) {
      return fail(absl::StatusCode::kInternal,
                  fmt::format("response token {}: the teacher scored token id {}, the response "
                              "has {} (the log-probs do not line up with the response)",
                              i, t[1].get<int64_t>(), want));
    }
    const double v = t[0].get<double>();
    if (!std::isfinite(v) || v > 1e-3) {
      return fail(absl::StatusCode::kInternal,
                  fmt::format("response token {} (id {}): log-prob {} is not a finite value <= 0",
                              i, want, v));
    }
    out.push_back(static_cast<float>(std::min(v, 0.0)));
  }
  return out;
}

Status TeacherClient::ScoreGroup(data::SampleGroup* group) {
  for (data::Sample& s : *group) {
    if (s.status != data::SampleStatus::kCompleted && s.status != data::SampleStatus::kTruncated) {
      continue;
    }
    if (static_cast<int64_t>(s.teacher_log_probs.size()) == s.response_length) continue;
    SLIME_ASSIGN_OR_RETURN(s.teacher_log_probs, ResponseLogProbs(s));
  }
  return absl::OkStatus();
}

}  // namespace slime::rollout
