#include "slime/runtime/worker.h"

#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <list>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "fmt/format.h"
#include "slime/runtime/rpc.h"
#include "slime/v1/runtime.grpc.pb.h"
#include "spdlog/spdlog.h"

namespace slime::runtime {

using Clock = std::chrono::steady_clock;

class Worker::Impl final : public slime::v1::Worker::CallbackService {
 public:
  explicit Impl(const WorkerOptions& options) : options_(options) {
    rpc_.token = options.token;
    rpc_.max_message_bytes = options.max_message_bytes;
  }

  ~Impl() override {
    RequestStop(0, "");
    if (actor_thread_.joinable()) actor_thread_.join();
    if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
    if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
  }

  Status Start() {
    if (options_.registry == nullptr) return absl::InvalidArgumentError("worker: no actor registry");
    SLIME_ASSIGN_OR_RETURN(server_, StartServer(options_.bind_host, 0, {this}, rpc_, &address_));
    head_ = slime::v1::Head::NewStub(MakeChannel(options_.head_address, rpc_));
    // Register, retrying while the head is unreachable (it may still be starting).
    slime::v1::RegisterWorkerRequest req;
    req.set_actor_id(options_.actor_id);
    req.set_incarnation(options_.incarnation);
    req.set_address(address_);
    req.set_pid(::getpid());
    const auto give_up = Clock::now() + std::chrono::seconds(30);
    slime::v1::RegisterWorkerReply reply;
    grpc::Status s = CallWhileUnavailable(
        [&] {
          auto ctx = MakeContext(rpc_.token, std::chrono::seconds(5));
          return head_->RegisterWorker(ctx.get(), req, &reply);
        },
        give_up, std::chrono::milliseconds(100));
    if (!s.ok()) {
      return FromGrpc(s, fmt::format("worker {}: RegisterWorker at head {}", options_.actor_id,
                                     options_.head_address));
    }
    spec_ = reply.spec();
    config_ = reply.resolved_config();
    const HeartbeatTimings timings =
        HeartbeatTimingsFrom(reply.heartbeat_interval_s(), reply.head_lost_timeout_s());
    heartbeat_interval_ = timings.interval;
    head_lost_timeout_ = timings.head_lost_timeout;
    actor_thread_ = std::thread([this] { ActorLoop(); });
    heartbeat_thread_ = std::thread([this] { HeartbeatLoop(); });
    return absl::OkStatus();
  }

  int Run() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return stop_; });
    if (!stop_reason_.empty()) spdlog::error("worker {}: {}", options_.actor_id, stop_reason_);
    return exit_code_;
  }

  void RequestStop(int exit_code, const std::string& reason) {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    stop_ = true;
    exit_code_ = exit_code;
    stop_reason_ = reason;
    cv_.notify_all();
  }

  // ---- Worker service ----
  grpc::ServerUnaryReactor* Call(grpc::CallbackServerContext* context,
                                 const slime::v1::CallRequest* request,
                                 slime::v1::CallReply* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    if (grpc::Status s = Authorize(context, rpc_.token); !s.ok()) {
      reactor->Finish(s);
      return reactor;
    }
    if (request->request_id().empty()) {
      reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "empty request_id"));
      return reactor;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) {
      reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "worker is stopping"));
      return reactor;
    }
    auto it = entries_.find(request->request_id());
    if (it != entries_.end()) {
      Entry& e = it->second;
      if (e.done) {
        FinishOne(reactor, response, e.status, e.payload);
      } else {
        e.waiters.push_back({reactor, response});
      }
      return reactor;
    }
    Entry& e = entries_[request->request_id()];
    e.waiters.push_back({reactor, response});
    order_.push_back(request->request_id());
    queue_.push_back(Task{request->request_id(), request->method(), request->payload()});
    EvictLocked();
    cv_.notify_all();
    return reactor;
  }

  grpc::ServerUnaryReactor* Shutdown(grpc::CallbackServerContext* context,
                                     const slime::v1::ShutdownRequest*,
                                     slime::v1::ShutdownReply*) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    grpc::Status s = Authorize(context, rpc_.token);
    reactor->Finish(s);
    if (s.ok()) RequestStop(0, "");
    return reactor;
  }

  WorkerOptions options_;
  RpcOptions rpc_;
  std::string address_;
  slime::v1::ActorSpec spec_;
  std::string config_;

 private:
  struct Waiter {
    grpc::ServerUnaryReactor* reactor;
    slime::v1::CallReply* response;
  };
  struct Entry {
    bool done = false;
    Status status = absl::OkStatus();
    std::string payload;
    std::vector<Waiter> waiters;
  };
  struct Task {
    std::string request_id, method, payload;
  };

  static void FinishOne(grpc::ServerUnaryReactor* reactor, slime::v1::CallReply* response,
                        const Status& status, const std::string& payload) {
    if (status.ok()) {
      response->set_payload(payload);
      reactor->Finish(grpc::Status::OK);
    } else {
      reactor->Finish(ToGrpc(status));
    }
  }

  // Forget the oldest finished request ids beyond the capacity.
  void EvictLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    size_t scanned = 0;
    while (order_.size() > options_.dedup_capacity && scanned < order_.size()) {
      auto it = entries_.find(order_.front());
      if (it != entries_.end() && !it->second.done) {
        // Still running: keep it, look at the next one.
        order_.push_back(order_.front());
        order_.pop_front();
        ++scanned;
        continue;
      }
      if (it != entries_.end()) entries_.erase(it);
      order_.pop_front();
    }
  }

  void ActorLoop() {
    ActorContext ctx{spec_, config_, options_.head_address};
    StatusOr<std::unique_ptr<Actor>> actor = options_.registry->Create(spec_.actor_type(), ctx);
    if (!actor.ok()) {
      RequestStop(1, fmt::format("cannot create actor of type '{}': {}", spec_.actor_type(),
                                 std::string(actor.status().message())));
    } else {
      spdlog::info("actor {} ({}) ready on {}", spec_.actor_id(), spec_.actor_type(), address_);
    }
    while (true) {
      Task task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
        if (stop_) {
          // Answer what is queued so clients do not wait for their deadline.
          for (Task& t : queue_) {
            auto it = entries_.find(t.request_id);
            if (it == entries_.end()) continue;
            for (Waiter& w : it->second.waiters) {
              w.reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "worker stopped"));
            }
            entries_.erase(it);
          }
          queue_.clear();
          return;
        }
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      StatusOr<std::string> result = (*actor)->Invoke(task.method, task.payload);
      std::lock_guard<std::mutex> lock(mu_);
      auto it = entries_.find(task.request_id);
      if (it == entries_.end()) continue;
      Entry& e = it->second;
      e.done = true;
      e.status = result.status();
      if (result.ok()) e.payload = *std::move(result);
      for (Waiter& w : e.waiters) FinishOne(w.reactor, w.response, e.status, e.payload);
      e.waiters.clear();
      EvictLocked();
    }
  }

  void HeartbeatLoop() {
    auto last_ok = Clock::now();
    while (true) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (cv_.wait_for(lock, heartbeat_interval_, [this] { return stop_; })) return;
      }
      slime::v1::HeartbeatRequest req;
      req.set_actor_id(options_.actor_id);
      req.set_incarnation(options_.incarnation);
      slime::v1::HeartbeatReply reply;
      auto ctx = MakeContext(rpc_.token, std::max(heartbeat_interval_ * 2,
                                                  std::chrono::milliseconds(500)));
      grpc::Status s = head_->Heartbeat(ctx.get(), req, &reply);
      if (s.ok()) {
        last_ok = Clock::now();
        if (!reply.known()) {
          RequestStop(1, fmt::format("the head no longer knows incarnation {} of {}; exiting",
                                     options_.incarnation, options_.actor_id));
          return;
        }
      } else if (Clock::now() - last_ok > head_lost_timeout_) {
        RequestStop(1, fmt::format("lost the head at {} (no heartbeat answered for {} ms: {}); "
                                   "exiting",
                                   options_.head_address, head_lost_timeout_.count(),
                                   s.error_message()));
        return;
      }
    }
  }

  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<slime::v1::Head::Stub> head_;
  std::chrono::milliseconds heartbeat_interval_{1000};
  std::chrono::milliseconds head_lost_timeout_{10000};
  std::thread actor_thread_;
  std::thread heartbeat_thread_;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int exit_code_ ABSL_GUARDED_BY(mu_) = 0;
  std::string stop_reason_ ABSL_GUARDED_BY(mu_);
  std::deque<Task> queue_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> order_ ABSL_GUARDED_BY(mu_);  // request ids, oldest first
};

Worker::Worker(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Worker::~Worker() = default;

StatusOr<std::unique_ptr<Worker>> Worker::Start(const WorkerOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  SLIME_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<Worker>(new Worker(std::move(impl)));
}

int Worker::Run() { return impl_->Run(); }
void Worker::RequestStop() { impl_->RequestStop(0, ""); }
const std::string& Worker::address() const { return impl_->address_; }
const slime::v1::ActorSpec& Worker::spec() const { return impl_->spec_; }
const std::string& Worker::resolved_config() const { return impl_->config_; }

}  // namespace slime::runtime
