#include "slime/runtime/actor_handle.h"

#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <random>

#include "fmt/format.h"
#include "grpcpp/alarm.h"
#include "slime/runtime/rpc.h"

namespace slime::runtime {
namespace {

using Clock = std::chrono::steady_clock;

// One logical call across its attempts. Owned by itself (shared_ptr captured by the gRPC
// callback or the retry alarm) until the promise is fulfilled.
struct CallState : std::enable_shared_from_this<CallState> {
  ActorDirectory* directory;
  std::string token;
  std::string actor_id;
  slime::v1::CallRequest request;
  CallOptions options;
  Clock::time_point deadline;
  std::promise<StatusOr<std::string>> promise;
  int attempts = 0;
  // Per attempt.
  std::unique_ptr<grpc::ClientContext> context;
  slime::v1::CallReply reply;
  // Retry timers; kept until the call ends (an alarm is not destroyed from its own callback).
  std::vector<std::unique_ptr<grpc::Alarm>> alarms;
  Status last_error = absl::OkStatus();

  std::string What() const {
    return fmt::format("{} on actor {} (request {})", request.method(), actor_id,
                       request.request_id());
  }

  void Finish(StatusOr<std::string> result) { promise.set_value(std::move(result)); }

  void Attempt() {
    ++attempts;
    const auto now = Clock::now();
    if (now >= deadline) {
      Finish(absl::DeadlineExceededError(fmt::format(
          "{}: deadline of {} ms exceeded after {} attempt(s){}", What(),
          options.timeout.count(), attempts - 1,
          last_error.ok() ? "" : fmt::format(" (last error: {})", std::string(last_error.message())))));
      return;
    }
    StatusOr<ActorEndpoint> endpoint = directory->Resolve(actor_id);
    if (!endpoint.ok()) {
      if (endpoint.status().code() == absl::StatusCode::kUnavailable &&
          options.retry_unavailable) {
        last_error = endpoint.status();
        RetryLater();
        return;
      }
      Finish(Status(endpoint.status().code(),
                    fmt::format("{}: {}", What(), std::string(endpoint.status().message()))));
      return;
    }
    context = MakeContext(token, std::chrono::duration_cast<std::chrono::milliseconds>(
                                     deadline - now));
    reply.Clear();
    auto self = shared_from_this();
    std::shared_ptr<slime::v1::Worker::Stub> stub = endpoint->stub;
    stub->async()->Call(context.get(), &request, &reply, [self, stub](grpc::Status s) {
      self->OnDone(s);
    });
  }

  void OnDone(const grpc::Status& s) {
    if (s.ok()) {
      Finish(std::move(*reply.mutable_payload()));
      return;
    }
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE && options.retry_unavailable) {
      last_error = FromGrpc(s, "worker");
      RetryLater();
      return;
    }
    if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      Finish(absl::DeadlineExceededError(
          fmt::format("{}: no reply within the deadline of {} ms", What(),
                      options.timeout.count())));
      return;
    }
    Finish(FromGrpc(s, What()));
  }

  void RetryLater() {
    const auto delay = std::chrono::milliseconds(std::min(20 * (1 << std::min(attempts, 5)), 500));
    const auto at = std::min(deadline, Clock::now() + delay);
    alarms.push_back(std::make_unique<grpc::Alarm>());
    auto self = shared_from_this();
    alarms.back()->Set(std::chrono::system_clock::now() +
                   std::chrono::duration_cast<std::chrono::system_clock::duration>(
                       at - Clock::now()),
               [self](bool) { self->Attempt(); });
  }
};

}  // namespace

ActorHandle::ActorHandle(ActorDirectory* directory, std::string token, std::string actor_id)
    : directory_(directory), token_(std::move(token)), actor_id_(std::move(actor_id)) {}

std::string ActorHandle::NewRequestId() {
  static const std::string prefix = fmt::format("{}-{:08x}", ::getpid(),
                                                static_cast<uint32_t>(std::random_device{}()));
  static std::atomic<uint64_t> counter{0};
  return fmt::format("{}-{}", prefix, counter.fetch_add(1, std::memory_order_relaxed));
}

CallFuture ActorHandle::CallAsync(const std::string& method, std::string payload,
                                  const CallOptions& options) const {
  auto state = std::make_shared<CallState>();
  state->directory = directory_;
  state->token = token_;
  state->actor_id = actor_id_;
  state->request.set_method(method);
  state->request.set_request_id(NewRequestId());
  state->request.set_payload(std::move(payload));
  state->options = options;
  state->deadline = Clock::now() + options.timeout;
  CallFuture future = state->promise.get_future();
  state->Attempt();
  return future;
}

std::vector<CallFuture> ActorGroup::CallAllAsync(const std::string& method,
                                                 const std::string& payload,
                                                 const CallOptions& options) const {
  std::vector<CallFuture> futures;
  futures.reserve(handles_.size());
  for (const ActorHandle& h : handles_) futures.push_back(h.CallAsync(method, payload, options));
  return futures;
}

std::vector<CallFuture> ActorGroup::CallEachAsync(const std::string& method,
                                                  const std::vector<std::string>& payloads,
                                                  const CallOptions& options) const {
  std::vector<CallFuture> futures;
  futures.reserve(handles_.size());
  for (size_t i = 0; i < handles_.size(); ++i) {
    if (i < payloads.size()) {
      futures.push_back(handles_[i].CallAsync(method, payloads[i], options));
    } else {
      std::promise<StatusOr<std::string>> p;
      p.set_value(absl::InvalidArgumentError(
          fmt::format("{} on group: {} payloads for {} ranks", method, payloads.size(),
                      handles_.size())));
      futures.push_back(p.get_future());
    }
  }
  return futures;
}

StatusOr<std::vector<std::string>> ActorGroup::CallAll(const std::string& method,
                                                       const std::string& payload,
                                                       const CallOptions& options) const {
  std::vector<CallFuture> futures = CallAllAsync(method, payload, options);
  return WaitAll(futures);
}

StatusOr<std::vector<std::string>> WaitAll(std::vector<CallFuture>& futures) {
  std::vector<std::string> replies;
  Status first = absl::OkStatus();
  for (CallFuture& f : futures) {
    StatusOr<std::string> r = f.get();  // wait for every call, even after an error
    if (r.ok()) {
      replies.push_back(*std::move(r));
    } else if (first.ok()) {
      first = r.status();
    }
  }
  if (!first.ok()) return first;
  return replies;
}

}  // namespace slime::runtime
