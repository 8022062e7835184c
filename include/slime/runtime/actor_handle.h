// Actor handles: typed, asynchronous calls to actors, from the driver (or any process that
// holds the job token), and group calls over all ranks of an actor group.
//
// A call is (method, payload bytes) with a deadline and a request id. The handle resolves the
// actor's current address through an ActorDirectory (the head) at each attempt, so calls follow
// a restarted actor to its new process. Attempts that fail with UNAVAILABLE (actor starting or
// restarting, connection refused) are retried with a short backoff until the deadline, always
// with the same request id: the worker keeps the replies of recent request ids and answers a
// retry from that cache instead of running the method twice (at-most-once while the worker
// lives). Other errors (the method's own error, DEADLINE_EXCEEDED, a dead actor) end the call.
//
// Futures: CallAsync returns a std::future fulfilled on a gRPC callback thread; no thread is
// created per call, and the futures of a group call complete independently.
//
// Thread-safety: handles are cheap values; every method may be called from any thread. The
// directory must outlive all calls in flight.
#ifndef SLIME_RUNTIME_ACTOR_HANDLE_H_
#define SLIME_RUNTIME_ACTOR_HANDLE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "slime/common/status.h"
#include "slime/v1/runtime.grpc.pb.h"

namespace slime::runtime {

struct ActorEndpoint {
  std::string address;
  int64_t incarnation = 0;
  std::shared_ptr<slime::v1::Worker::Stub> stub;
};

// Where actors are; implemented by the Head.
class ActorDirectory {
 public:
  virtual ~ActorDirectory() = default;
  virtual StatusOr<ActorEndpoint> Resolve(const std::string& actor_id) = 0;
};

struct CallOptions {
  std::chrono::milliseconds timeout{30000};  // the deadline of the whole call, retries included
  bool retry_unavailable = true;             // retry UNAVAILABLE until the deadline
};

using CallFuture = std::future<StatusOr<std::string>>;

class ActorHandle {
 public:
  ActorHandle(ActorDirectory* directory, std::string token, std::string actor_id);

  const std::string& actor_id() const { return actor_id_; }

  // Starts the call; the future holds the reply payload or an error whose message names the
  // actor and the method.
  CallFuture CallAsync(const std::string& method, std::string payload,
                       const CallOptions& options = {}) const;
  StatusOr<std::string> Call(const std::string& method, std::string payload,
                             const CallOptions& options = {}) const {
    return CallAsync(method, std::move(payload), options).get();
  }

  // Protobuf in, protobuf out.
  template <typename Resp, typename Req>
  StatusOr<Resp> CallProto(const std::string& method, const Req& request,
                           const CallOptions& options = {}) const {
    SLIME_ASSIGN_OR_RETURN(std::string bytes, Call(method, request.SerializeAsString(), options));
    Resp reply;
    if (!reply.ParseFromString(bytes)) {
      return absl::InternalError(method + " on " + actor_id_ + ": reply is not a " +
                                 reply.GetTypeName());
    }
    return reply;
  }

  // A new request id: "<handle-process-unique prefix>-<counter>".
  static std::string NewRequestId();

 private:
  ActorDirectory* directory_;
  std::string token_;
  std::string actor_id_;
};

// All ranks of one actor group (e.g. the trainers), in rank order.
class ActorGroup {
 public:
  explicit ActorGroup(std::vector<ActorHandle> handles) : handles_(std::move(handles)) {}

  size_t size() const { return handles_.size(); }
  const ActorHandle& operator[](size_t i) const { return handles_[i]; }

  // The same payload to every rank, or one payload per rank (size() of them).
  std::vector<CallFuture> CallAllAsync(const std::string& method, const std::string& payload,
                                       const CallOptions& options = {}) const;
  std::vector<CallFuture> CallEachAsync(const std::string& method,
                                        const std::vector<std::string>& payloads,
                                        const CallOptions& options = {}) const;
  // Waits for every rank; the replies in rank order, or the first error (by rank).
  StatusOr<std::vector<std::string>> CallAll(const std::string& method,
                                             const std::string& payload,
                                             const CallOptions& options = {}) const;

 private:
  std::vector<ActorHandle> handles_;
};

// Waits for all futures; replies in order, or the first error.
StatusOr<std::vector<std::string>> WaitAll(std::vector<CallFuture>& futures);

}  // namespace slime::runtime

#endif  // SLIME_RUNTIME_ACTOR_HANDLE_H_
