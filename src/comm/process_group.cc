// c10d process groups for the weight plane (see include/slime/comm/process_group.h).
//
// LibTorch 1.13 vs 2.x: backends derive from c10d::ProcessGroup in 1.13 and from c10d::Backend
// in 2.x; both expose broadcast(std::vector<at::Tensor>&, BroadcastOptions) returning a
// c10d::Work with wait(timeout). Options structs: Gloo's create(timeout) exists in both; NCCL's
// create() takes no timeout, which is a field of the base options in both.
#include "slime/comm/process_group.h"
#include "slime/comm/tensor_parallel_group.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef SLIME_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#endif

namespace slime::comm {

#if TORCH_VERSION_MAJOR >= 2
using BackendPtr = c10::intrusive_ptr<c10d::Backend>;
#else
using BackendPtr = c10::intrusive_ptr<c10d::ProcessGroup>;
#endif

struct ProcessGroup::State {
  c10::intrusive_ptr<c10d::TCPStore> store;
  BackendPtr backend;
  std::string transport;  // Gloo: where this rank's transport listens, for the join log line
};

namespace {

std::chrono::milliseconds Millis(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

std::string FirstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

bool IsLoopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

// Where a Gloo rank listens when the group's store is on a loopback address (every rank on this
// host): its own 127.x address when its node agent bound one (several agents on one host, each
// a node of its own on 127.0.0.N; agents export it to their workers as $SLIME_BIND_HOST,
// runtime::kBindHostEnv), else 127.0.0.1.
std::string LoopbackBindAddress() {
  const char* own = std::getenv("SLIME_BIND_HOST");
  if (own != nullptr && std::string_view(own).starts_with("127.")) return own;
  return "127.0.0.1";
}

// Whether the torch we build against lets the store's server take a socket we bound ourselves
// (TCPStoreOptions::masterListenFd, in both of its servers from 2.8 on): then it listens on
// master_address only. torch 1.13 has no such option; its server listens on every interface.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 8)
#define SLIME_STORE_TAKES_LISTEN_FD 1
constexpr bool kStoreBindsItsAddress = true;
#else
constexpr bool kStoreBindsItsAddress = false;
#endif

// A listening TCP socket on `host` (an address or a name; its first IPv4 address, else IPv6),
// `port` (0: the kernel picks one). Returns the descriptor; throws on failure.
[[maybe_unused]] int ListenOn(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0) {
    throw std::runtime_error(fmt::format("cannot resolve '{}': {}", host, gai_strerror(rc)));
  }
  const addrinfo* pick = found;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      pick = a;
      break;
    }
  }
  int fd = socket(pick->ai_family, pick->ai_socktype | SOCK_CLOEXEC, pick->ai_protocol);
  std::string error;
  if (fd < 0) {
    error = fmt::format("socket(): {}", std::strerror(errno));
  } else {
    const int on = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    if (bind(fd, pick->ai_addr, pick->ai_addrlen) != 0) {
      error = fmt::format("cannot bind {}:{}: {}", host, port, std::strerror(errno));
    } else if (listen(fd, 2048) != 0) {
      error = fmt::format("cannot listen on {}:{}: {}", host, port, std::strerror(errno));
    }
  }
  freeaddrinfo(found);
  if (!error.empty()) {
    if (fd >= 0) close(fd);
    throw std::runtime_error(error);
  }
  return fd;
}

// The port a socket is bound to.
[[maybe_unused]] int BoundPort(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    throw std::runtime_error(fmt::format("getsockname(): {}", std::strerror(errno)));
  }
  return addr.ss_family == AF_INET ? ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port)
                                   : ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
}

// Runs `fn`, turning LibTorch / Gloo / NCCL exceptions into a Status whose message starts with
// `context`; `code` is the error a failure maps to.
template <typename Fn>
Status Guard(const std::string& context, absl::StatusCode code, Fn&& fn) {
  try {
    fn();
    return absl::OkStatus();
  } catch (const c10::Error& e) {
    return Status(code, fmt::format("{}: {}", context, FirstLine(e.what_without_backtrace())));
  } catch (const std::exception& e) {
    return Status(code, fmt::format("{}: {}", context, FirstLine(e.what())));
  }
}

// The store a backend of group `group_name` is built on: the chain of PrefixStores that
// torch.distributed builds in the torch version we are compiled against when a group is made the
// way slime's trainer and SGLang make it (init_custom_process_group: PrefixStore(group_name,
// store) handed to _new_process_group_helper(..., group_name=group_name)), so a Python peer's
// keys and ours meet (docs/operations.md, "Interoperability with PyTorch peers"):
//   1.13: TCPStore -> PrefixStore(G) -> PrefixStore(G)                  (the helper adds G)
//   2.x:  TCPStore -> PrefixStore(G) -> PrefixStore(G + "/") -> PrefixStore("cpu/" | "cuda/")
//         (the helper adds G + "/", then one prefix per device it makes a backend for: a
//         single backend named "gloo" is made once, for "cpu"; "nccl" for "cuda")
c10::intrusive_ptr<c10d::Store> BackendStore(const c10::intrusive_ptr<c10d::Store>& base,
                                             const std::string& group_name,
                                             const std::string& backend) {
  c10::intrusive_ptr<c10d::Store> store =
      c10::make_intrusive<c10d::PrefixStore>(group_name, base);
#if TORCH_VERSION_MAJOR >= 2
  store = c10::make_intrusive<c10d::PrefixStore>(group_name + "/", store);
  store = c10::make_intrusive<c10d::PrefixStore>(backend == "nccl" ? "cuda/" : "cpu/", store);
#else
  (void)backend;
  store = c10::make_intrusive<c10d::PrefixStore>(group_name, store);
#endif
  return store;
}

bool LooksLikeTimeout(const Status& s) {
  const std::string m(s.message());
  return m.find("imed out") != std::string::npos || m.find("imeout") != std::string::npos ||
         m.find("deadline") != std::string::npos;
}

}  // namespace

StatusOr<std::string> ResolveBackend(const std::string& backend) {
  const bool cuda = torch::cuda::is_available();
  std::string b = backend;
  if (b.find(':') != std::string::npos) {  // "cpu:gloo,cuda:nccl"
    const std::string want = cuda ? "cuda:" : "cpu:";
    std::string picked;
    size_t start = 0;
    while (start <= b.size()) {
      const size_t end = std::min(b.find(',', start), b.size());
      const std::string item = b.substr(start, end - start);
      if (item.rfind(want, 0) == 0) picked = item.substr(want.size());
      start = end + 1;
    }
    if (picked.empty()) {
      return absl::InvalidArgumentError(fmt::format(
          "backend '{}' names no backend for this machine's device ({})", backend, want));
    }
    b = picked;
  }
  if (b == "auto") b = cuda ? "nccl" : "gloo";
  if (b == "gloo") return b;
  if (b == "nccl") {
#ifdef SLIME_WITH_NCCL
    if (!cuda) return absl::FailedPreconditionError("backend 'nccl' needs CUDA, which is not available");
    return b;
#else
    return absl::UnimplementedError(
        "backend 'nccl' is not available: this build has no NCCL (use 'gloo' with CPU tensors)");
#endif
  }
  return absl::InvalidArgumentError(
      fmt::format("backend '{}' is not supported (use gloo, nccl, auto or cpu:gloo,cuda:nccl)", backend));
}

ProcessGroup::ProcessGroup(ProcessGroupOptions options)
    : options_(std::move(options)), state_(std::make_unique<State>()) {}

ProcessGroup::~ProcessGroup() {
  // Backend first (it holds the store); c10d destructors may throw on broken transports.
  try {
    state_->backend.reset();
    state_->store.reset();
  } catch (const std::exception& e) {
    spdlog::warn("comm: destroying group '{}': {}", options_.group_name, e.what());
  }
}

std::string ProcessGroup::Describe() const {
  return fmt::format("group '{}' ({}, rank {} of {}, store {}:{})", options_.group_name, backend_,
                     options_.rank, options_.world_size, options_.master_address, port_);
}

torch::Device ProcessGroup::device() const {
  return backend_ == "nccl"
             ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(options_.cuda_device))
             : torch::Device(torch::kCPU);
}

bool ProcessGroup::joined() const { return state_->backend.defined(); }

StatusOr<std::unique_ptr<ProcessGroup>> ProcessGroup::Open(const ProcessGroupOptions& options) {
  if (options.world_size < 1) {
    return absl::InvalidArgumentError(fmt::format("world_size must be >= 1, got {}", options.world_size));
  }
  if (options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(fmt::format("rank {} is outside [0, world_size {})",
                                                  options.rank, options.world_size));
  }
  if (options.master_port < 0 || options.master_port > 65535 ||
      (options.rank != 0 && options.master_port == 0)) {
    return absl::InvalidArgumentError(fmt::format(
        "master_port {} is not valid (1-65535; 0 only on rank 0 to pick a free port)",
        options.master_port));
  }
  if (options.master_address.empty()) return absl::InvalidArgumentError("master_address is empty");
  if (options.group_name.empty()) return absl::InvalidArgumentError("group_name is empty");
  if (!(options.timeout_s > 0)) {
    return absl::InvalidArgumentError(fmt::format("timeout must be > 0 s, got {}", options.timeout_s));
  }
  std::unique_ptr<ProcessGroup> pg(new ProcessGroup(options));
  SLIME_ASSIGN_OR_RETURN(pg->backend_, ResolveBackend(options.backend));
  const std::string what =
      options.rank == 0
          ? fmt::format("starting the c10d store of group '{}' on {}:{}", options.group_name,
                        options.master_address, options.master_port)
          : fmt::format("connecting rank {} of group '{}' to the c10d store at {}:{}", options.rank,
                        options.group_name, options.master_address, options.master_port);
  SLIME_RETURN_IF_ERROR(Guard(what, absl::StatusCode::kUnavailable, [&] {
    c10d::TCPStoreOptions so;
    so.port = static_cast<std::uint16_t>(options.master_port);
    so.isServer = options.rank == 0;
    // torch.distributed's tcp:// rendezvous makes rank 0 a server that waits in its constructor
    // until world_size ranks have counted themselves in (the store's "init/" key), and every
    // client counts itself in. Our clients count themselves in the same way, so a Python rank 0
    // gets past its rendezvous; our server does not wait here (Join() is where peers are
    // awaited, and rank 0 must be able to tell its peers the port first).
    so.numWorkers = static_cast<std::size_t>(options.world_size);
    so.waitWorkers = options.rank != 0;
    so.timeout = Millis(options.timeout_s);
#ifdef SLIME_STORE_TAKES_LISTEN_FD
    // The server listens on master_address only: on a socket we bind, which it takes over.
    if (so.isServer) {
      const int fd = ListenOn(options.master_address, options.master_port);
      so.port = static_cast<std::uint16_t>(BoundPort(fd));
      so.masterListenFd = fd;
    }
#endif
    pg->state_->store = c10::make_intrusive<c10d::TCPStore>(options.master_address, so);
    pg->port_ = pg->state_->store->getPort();
  }));
  if (options.rank == 0) {
    spdlog::info("comm: the c10d store of group '{}' listens on {}:{}{}", options.group_name,
                 kStoreBindsItsAddress ? options.master_address : "every interface", pg->port_,
                 kStoreBindsItsAddress ? ""
                                       : fmt::format(" (torch {} cannot bind one address; clients "
                                                     "dial {})",
                                                     TORCH_VERSION, options.master_address));
  }
  return pg;
}

Status ProcessGroup::Join() {
  if (joined()) return absl::OkStatus();
  const std::string what = fmt::format("joining {} (waited up to {} s for all {} ranks)",
                                       Describe(), options_.timeout_s, options_.world_size);
  Status s = Guard(what, absl::StatusCode::kDeadlineExceeded, [&] {
    const c10::intrusive_ptr<c10d::Store> prefix =
        BackendStore(state_->store, options_.group_name, backend_);
    const auto timeout = Millis(options_.timeout_s);
    if (backend_ == "gloo") {
      auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
      std::string bind = options_.gloo_bind_address;
      if (bind.empty() && IsLoopback(options_.master_address)) bind = LoopbackBindAddress();
      if (!bind.empty()) {
        opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(bind));
        state_->transport = bind;
      } else if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname) {
        opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
        state_->transport = fmt::format("interface {}", ifname);
      } else {
        opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
        state_->transport = "the host name's address";
      }
      state_->backend = c10::make_intrusive<c10d::ProcessGroupGloo>(prefix, options_.rank,
                                                                    options_.world_size, opts);
    } else {
#ifdef SLIME_WITH_NCCL
      auto opts = c10d::ProcessGroupNCCL::Options::create();
      opts->timeout = timeout;
      state_->backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(prefix, options_.rank,
                                                                    options_.world_size, opts);
#else
      throw std::runtime_error("NCCL is not compiled in");
#endif
    }
  });
  if (!s.ok()) return s;
#if TORCH_VERSION_MAJOR >= 2
  // torch's helper calls _set_sequence_number_for_group() on the backend it created; so do we
  // (a no-op in recent versions; older 2.x Gloo shares rank 0's number through the store).
  s = Guard(what, absl::StatusCode::kDeadlineExceeded,
            [&] { state_->backend->setSequenceNumberForGroup(); });
  if (!s.ok()) {
    state_->backend.reset();
    return s;
  }
#endif
  if (state_->transport.empty()) {
    spdlog::info("comm: joined {}", Describe());
  } else {
    spdlog::info("comm: joined {}; gloo transport on {}", Describe(), state_->transport);
  }
  // NCCL creates its communicator lazily, at the first collective. No barrier here: a Python
  // peer (slime's trainer, SGLang) issues no collective when it joins, so one of ours would
  // pair with its first weight broadcast.
  return absl::OkStatus();
}

StatusOr<std::unique_ptr<ProcessGroup>> ProcessGroup::Create(const ProcessGroupOptions& options) {
  SLIME_ASSIGN_OR_RETURN(std::unique_ptr<ProcessGroup> pg, Open(options));
  SLIME_RETURN_IF_ERROR(pg->Join());
  return pg;
}

Status ProcessGroup::CheckUsable() const {
  if (!joined()) return absl::FailedPreconditionError(fmt::format("{} is not joined", Describe()));
  if (broken()) {
    return absl::FailedPreconditionError(fmt::format(
        "{} is broken by an earlier failed collective; destroy it and initialise a new one{}",
        Describe(), Recent()));
  }
  return absl::OkStatus();
}

uint64_t ProcessGroup::Record(const std::string& what) {
  const uint64_t seq = ++seq_;
  std::string entry = fmt::format("#{} {}", seq, what);
  if (recent_.size() < kRecent) {
    recent_.push_back(std::move(entry));
  } else {
    recent_[(seq - 1) % kRecent] = std::move(entry);
  }
  return seq;
}

std::string ProcessGroup::Recent() const {
  if (recent_.empty()) return "";
  std::vector<std::string> ordered;
  for (size_t k = 0; k < recent_.size(); ++k) {
    // The ring's oldest entry follows the newest one.
    const size_t i = recent_.size() < kRecent ? k : (seq_ + k) % kRecent;
    ordered.push_back(recent_[i]);
  }
  return fmt::format("; this rank's last collectives: {}", fmt::join(ordered, ", "));
}

Status ProcessGroup::RunCollective(const std::string& op, const std::string& name,
                                   const torch::Tensor& tensor, double timeout_s,
                                   const std::function<void(std::chrono::milliseconds)>& fn) {
  Frame frame;
  SLIME_RETURN_IF_ERROR(BeginCollective(op, name, tensor, timeout_s, frame));
  return FinishCollective(frame, fn);
}

Status ProcessGroup::BeginCollective(const std::string& op, const std::string& name,
                                     const torch::Tensor& tensor, double timeout_s,
                                     Frame& frame) {
  SLIME_RETURN_IF_ERROR(CheckUsable());
  if (!tensor.defined()) return absl::InvalidArgumentError(fmt::format("{} of an undefined tensor", op));
  frame.op = op;
  frame.limit_s = timeout_s > 0 ? timeout_s : options_.timeout_s;
  frame.label = name.empty() ? std::string("tensor") : "'" + name + "'";
  frame.seq = Record(fmt::format("{} {} [{}] {}", op, frame.label,
                                 fmt::join(tensor.sizes().vec(), ","),
                                 c10::toString(tensor.scalar_type())));
  frame.start = std::chrono::steady_clock::now();
  return absl::OkStatus();
}

Status ProcessGroup::FinishCollective(
    const Frame& frame, const std::function<void(std::chrono::milliseconds)>& fn) {
  const auto limit = Millis(frame.limit_s);
  const auto left = std::max(
      limit - std::chrono::duration_cast<std::chrono::milliseconds>(
                  std::chrono::steady_clock::now() - frame.start),
      std::chrono::milliseconds(1));
  Status s = Guard(fmt::format("{} on {}", frame.op, Describe()), absl::StatusCode::kInternal,
                   [&] { fn(left); });
  if (s.ok()) return s;
  broken_ = true;
  const bool timed_out =
      LooksLikeTimeout(s) || std::chrono::steady_clock::now() - frame.start >= limit;
  return Status(timed_out ? absl::StatusCode::kDeadlineExceeded : s.code(),
                fmt::format("{} #{} of {} {} after {:.1f} s: {}{}{}", frame.op, frame.seq,
                            frame.label, timed_out ? "timed out" : "failed", frame.limit_s,
                            std::string(s.message()),
                            timed_out ? " (a peer did not take part: does every rank run the "
                                        "same collectives in the same order?)"
                                      : "",
                            Recent()));
}

namespace {
// Gloo has no bfloat16 / float16 reduction kernels: such tensors are reduced in float32.
bool GlooReducesInFloat(const std::string& backend, const torch::Tensor& t) {
  return backend == "gloo" &&
         (t.scalar_type() == torch::kBFloat16 || t.scalar_type() == torch::kHalf);
}
}  // namespace

Status ProcessGroup::AllReduceSum(torch::Tensor& tensor, const std::string& name,
                                  double timeout_s) {
  const torch::Device dev = device();
  return RunCollective("all-reduce", name, tensor, timeout_s, [&](std::chrono::milliseconds limit) {
    const bool widen = GlooReducesInFloat(backend_, tensor);
    const bool copy = !tensor.is_contiguous() || tensor.device() != dev || widen;
    at::Tensor work =
        copy ? tensor.to(dev, widen ? torch::kFloat32 : tensor.scalar_type()).contiguous() : tensor;
    if (work.dim() == 0) work = work.view({1});  // a 0-dim scalar (e.g. a norm): same storage
    std::vector<at::Tensor> one{work};
    c10d::AllreduceOptions ao;
    ao.timeout = limit;
    state_->backend->allreduce(one, ao)->wait(limit);
    if (copy) tensor.copy_(work.view(tensor.sizes()));
  });
}

StatusOr<std::function<Status()>> ProcessGroup::AllReduceSumAsync(torch::Tensor& tensor,
                                                                   const std::string& name,
                                                                   double timeout_s) {
  // What the wait needs: the posted work, the buffer c10d reduces and the caller's tensor.
  struct Posted {
    c10::intrusive_ptr<c10d::Work> work;
    at::Tensor buffer;
    torch::Tensor target;
    bool copy = false;
  };
  auto posted = std::make_shared<Posted>();
  Frame frame;
  SLIME_RETURN_IF_ERROR(BeginCollective("all-reduce", name, tensor, timeout_s, frame));
  const torch::Device dev = device();
  SLIME_RETURN_IF_ERROR(FinishCollective(frame, [&](std::chrono::milliseconds limit) {
    const bool widen = GlooReducesInFloat(backend_, tensor);
    posted->copy = !tensor.is_contiguous() || tensor.device() != dev || widen;
    posted->target = tensor;
    posted->buffer = posted->copy
                         ? tensor.to(dev, widen ? torch::kFloat32 : tensor.scalar_type()).contiguous()
                         : tensor;
    if (posted->buffer.dim() == 0) posted->buffer = posted->buffer.view({1});
    std::vector<at::Tensor> one{posted->buffer};
    c10d::AllreduceOptions ao;
    ao.timeout = limit;
    posted->work = state_->backend->allreduce(one, ao);
  }));
  return std::function<Status()>([this, frame, posted]() -> Status {
    if (!posted->work) return absl::FailedPreconditionError("all-reduce already waited for");
    Status s = FinishCollective(frame, [&](std::chrono::milliseconds left) {
      posted->work->wait(left);
      if (posted->copy) posted->target.copy_(posted->buffer.view(posted->target.sizes()));
    });
    posted->work.reset();
    posted->buffer = at::Tensor();
    posted->target = torch::Tensor();
    return s;
  });
}

StatusOr<torch::Tensor> ProcessGroup::AllGather(const torch::Tensor& tensor, int64_t dim,
                                                const std::string& name, double timeout_s) {
  if (!tensor.defined()) return absl::InvalidArgumentError("all-gather of an undefined tensor");
  const int64_t rank_dims = std::max<int64_t>(tensor.dim(), 1);
  if (dim < -rank_dims || dim >= rank_dims) {
    return absl::InvalidArgumentError(fmt::format(
        "all-gather of '{}': dim {} is outside a {}-D tensor", name, dim, tensor.dim()));
  }
  if (dim < 0) dim += rank_dims;
  const torch::Device dev = device();
  torch::Tensor result;
  Status s = RunCollective("all-gather", name, tensor, timeout_s,
                           [&](std::chrono::milliseconds limit) {
    // The receive buffers are written in place by the backend, on Gloo from its own worker
    // thread: they must be normal tensors even when the caller runs under InferenceMode (the
    // engine's vocab-parallel LM head), since an inference tensor may not be updated in place
    // outside InferenceMode.
    c10::InferenceMode normal_tensors(false);
    // c10d gathers flat buffers; Gloo moves raw bytes so every dtype works (as Broadcast).
    at::Tensor in = tensor.to(dev).contiguous();
    const bool bytes = backend_ == "gloo" && in.numel() > 0;
    at::Tensor flat = bytes ? in.reshape({-1}).view(torch::kUInt8) : in.reshape({-1});
    std::vector<at::Tensor> inputs{flat};
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (int r = 0; r < options_.world_size; ++r) outputs[0].push_back(torch::empty_like(flat));
    c10d::AllgatherOptions ao;
    ao.timeout = limit;
    state_->backend->allgather(outputs, inputs, ao)->wait(limit);
    std::vector<at::Tensor> parts;
    for (at::Tensor& o : outputs[0]) {
      at::Tensor typed = bytes ? o.view(in.scalar_type()) : o;
      parts.push_back(typed.view(in.sizes()));
    }
    result = in.dim() == 0 ? torch::stack(parts) : torch::cat(parts, dim);
    if (result.device() != tensor.device()) result = result.to(tensor.device());
  });
  if (!s.ok()) return s;
  return result;
}

StatusOr<torch::Tensor> ProcessGroup::ReduceScatterSum(const torch::Tensor& tensor,
                                                       const std::string& name, double timeout_s) {
  if (!tensor.defined() || tensor.dim() < 1) {
    return absl::InvalidArgumentError(fmt::format(
        "reduce-scatter of '{}' needs a tensor of at least one dimension", name));
  }
  const int64_t world = options_.world_size;
  if (tensor.size(0) % world != 0) {
    return absl::InvalidArgumentError(fmt::format(
        "reduce-scatter of '{}': dim 0 has {} rows, not divisible by the group's {} ranks", name,
        tensor.size(0), world));
  }
  const int64_t rows = tensor.size(0) / world;
  const torch::Device dev = device();
  torch::Tensor result;
  Status s = RunCollective("reduce-scatter", name, tensor, timeout_s,
                           [&](std::chrono::milliseconds limit) {
    const bool widen = GlooReducesInFloat(backend_, tensor);
    at::Tensor in = tensor.to(dev, widen ? torch::kFloat32 : tensor.scalar_type()).contiguous();
    if (backend_ == "gloo") {
      // LibTorch 1.13's Gloo backend has no reduce_scatter: all-reduce a copy, keep our rows.
      if (in.data_ptr() == tensor.data_ptr()) in = in.clone();
      std::vector<at::Tensor> one{in};
      c10d::AllreduceOptions ao;
      ao.timeout = limit;
      state_->backend->allreduce(one, ao)->wait(limit);
      result = in.narrow(0, options_.rank * rows, rows).clone();
    } else {
      std::vector<std::vector<at::Tensor>> inputs(1);
      for (int64_t r = 0; r < world; ++r) inputs[0].push_back(in.narrow(0, r * rows, rows));
      std::vector<at::Tensor> outputs{torch::empty_like(inputs[0][0])};
      c10d::ReduceScatterOptions ro;
      ro.timeout = limit;
      state_->backend->reduce_scatter(outputs, inputs, ro)->wait(limit);
      result = outputs[0];
    }
    result = result.to(tensor.device(), tensor.scalar_type());
  });
  if (!s.ok()) return s;
  return result;
}

namespace {
// Checks all-to-all split sizes: one per rank, none negative, `what` summing to `rows` when
// rows >= 0.
Status CheckSplits(const std::string& name, const char* what, const std::vector<int64_t>& splits,
                   int world, int64_t rows) {
  if (static_cast<int>(splits.size()) != world) {
    return absl::InvalidArgumentError(
        fmt::format("all-to-all of '{}': {} has {} entries for a group of {} ranks", name, what,
                    splits.size(), world));
  }
  int64_t sum = 0;
  for (int64_t s : splits) {
    if (s < 0) {
      return absl::InvalidArgumentError(fmt::format(
          "all-to-all of '{}': {} {} has a negative entry", name, what, fmt::join(splits, ",")));
    }
    sum += s;
  }
  if (rows >= 0 && sum != rows) {
    return absl::InvalidArgumentError(
        fmt::format("all-to-all of '{}': {} [{}] sum to {}, but the input has {} rows", name, what,
                    fmt::join(splits, ","), sum, rows));
  }
  return absl::OkStatus();
}
}  // namespace

StatusOr<torch::Tensor> ProcessGroup::AllToAll(const torch::Tensor& input,
                                               const std::vector<int64_t>& send_splits,
                                               const std::vector<int64_t>& recv_splits,
                                               const std::string& name, double timeout_s) {
  if (!input.defined() || input.dim() < 1) {
    return absl::InvalidArgumentError(
        fmt::format("all-to-all of '{}' needs a tensor of at least one dimension", name));
  }
  const int world = options_.world_size;
  SLIME_RETURN_IF_ERROR(CheckSplits(name, "send_splits", send_splits, world, input.size(0)));
  SLIME_RETURN_IF_ERROR(CheckSplits(name, "recv_splits", recv_splits, world, -1));
  int64_t recv_rows = 0;
  for (int64_t s : recv_splits) recv_rows += s;
  const torch::Device dev = device();
  torch::Tensor result;
  Status s =
      RunCollective("all-to-all", name, input, timeout_s, [&](std::chrono::milliseconds limit) {
        // Written in place by the backend (on Gloo from its own thread): a normal tensor, as in
        // AllGather.
        c10::InferenceMode normal_tensors(false);
        at::Tensor in = input.to(dev).contiguous();
        std::vector<int64_t> out_shape = in.sizes().vec();
        out_shape[0] = recv_rows;
        at::Tensor out = torch::empty(out_shape, in.options());
        // Gloo: each row as raw bytes [rows, row_bytes] (the splits count rows, whatever the
        // dtype).
        int64_t row_elems = 1;
        for (int64_t d = 1; d < in.dim(); ++d) row_elems *= in.size(d);
        const bool bytes = backend_ == "gloo" && row_elems > 0;
        at::Tensor in_wire = bytes ? in.reshape({in.size(0), row_elems}).view(torch::kUInt8) : in;
        at::Tensor out_wire = bytes ? out.view({recv_rows, row_elems}).view(torch::kUInt8) : out;
        std::vector<int64_t> send = send_splits, recv = recv_splits;
        c10d::AllToAllOptions ao;
        ao.timeout = limit;
        state_->backend->alltoall_base(out_wire, in_wire, recv, send, ao)->wait(limit);
        result = out.device() != input.device() ? out.to(input.device()) : out;
      });
  if (!s.ok()) return s;
  return result;
}

Status ProcessGroup::Broadcast(std::vector<torch::Tensor>& tensors, int root,
                               const std::vector<std::string>& names, double timeout_s) {
  SLIME_RETURN_IF_ERROR(CheckUsable());
  if (root < 0 || root >= options_.world_size) {
    return absl::InvalidArgumentError(fmt::format("broadcast root {} is outside the group", root));
  }
  const torch::Device dev = device();
  auto label = [&](size_t i) {
    return i < names.size() ? fmt::format("'{}'", names[i]) : fmt::format("#{}", i);
  };
  for (size_t i = 0; i < tensors.size(); ++i) {
    const torch::Tensor& t = tensors[i];
    if (!t.defined() || !t.is_contiguous() || t.device().type() != dev.type()) {
      return absl::InvalidArgumentError(fmt::format(
          "broadcast tensor {} must be a defined, contiguous tensor on {} ({})", label(i),
          dev.str(), t.defined() ? t.device().str() : std::string("undefined")));
    }
  }
  const double limit = timeout_s > 0 ? timeout_s : options_.timeout_s;
  const auto deadline = std::chrono::steady_clock::now() + Millis(limit);
  const uint64_t seq = Record(fmt::format(
      "broadcast of {} tensor(s) from rank {}{}", tensors.size(), root,
      tensors.empty() ? std::string() : " starting " + label(0)));
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  works.reserve(tensors.size());
  size_t idx = 0;  // the tensor being posted or awaited
  Status s = Guard(fmt::format("broadcast on {}", Describe()), absl::StatusCode::kInternal, [&] {
    c10d::BroadcastOptions bo;
    bo.rootRank = root;
    bo.rootTensor = 0;
    bo.timeout = Millis(limit);
    for (idx = 0; idx < tensors.size(); ++idx) {
      // Gloo has no bfloat16/bool/float8 kernels, and a broadcast only moves bytes: send every
      // tensor as its raw bytes (a view, so receivers are filled in place).
      const at::Tensor& t = tensors[idx];
      std::vector<at::Tensor> one{backend_ == "gloo" && t.numel() > 0
                                      ? t.reshape({-1}).view(torch::kUInt8)
                                      : t};
      works.push_back(state_->backend->broadcast(one, bo));
    }
    for (idx = 0; idx < works.size(); ++idx) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      works[idx]->wait(std::max(left, std::chrono::milliseconds(1)));
    }
  });
  if (s.ok()) return s;
  broken_ = true;
  const bool timed_out = LooksLikeTimeout(s) || std::chrono::steady_clock::now() >= deadline;
  return Status(timed_out ? absl::StatusCode::kDeadlineExceeded : s.code(),
                fmt::format("{} #{} of tensor {} ({} of {}) from rank {} {} after {:.1f} s: {}{}{}",
                            "broadcast", seq, idx < tensors.size() ? label(idx) : std::string("?"),
                            idx + 1, tensors.size(), root,
                            timed_out ? "timed out" : "failed", limit, std::string(s.message()),
                            timed_out ? " (a peer did not take part: is every rank receiving "
                                        "the same tensors in the same order?)"
                                      : "",
                            Recent()));
}

namespace {
// A peer rank of a point-to-point operation: another member of the group.
Status CheckPeer(const char* op, int peer, int rank, int world) {
  if (peer < 0 || peer >= world || peer == rank) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: peer rank {} is not another rank of the group (rank {} of {})", op, peer, rank,
        world));
  }
  return absl::OkStatus();
}
}  // namespace

// The buffer c10d moves for `t`: on the backend's device and contiguous (else a copy), viewed
// as raw bytes on Gloo (any dtype). `copied` says whether it is a copy.
at::Tensor ProcessGroup::WireBuffer(const torch::Tensor& t, bool& copied) const {
  const torch::Device dev = device();
  copied = !t.is_contiguous() || t.device() != dev;
  at::Tensor work = copied ? t.to(dev).contiguous() : t;
  if (backend_ == "gloo" && work.numel() > 0) work = work.reshape({-1}).view(torch::kUInt8);
  return work;
}

Status ProcessGroup::Send(const torch::Tensor& tensor, int dst, const std::string& name,
                          double timeout_s) {
  SLIME_RETURN_IF_ERROR(CheckPeer("send", dst, options_.rank, options_.world_size));
  return RunCollective(fmt::format("send to rank {}", dst), name, tensor, timeout_s,
                       [&](std::chrono::milliseconds limit) {
    bool copied = false;
    std::vector<at::Tensor> one{WireBuffer(tensor, copied)};
    state_->backend->send(one, dst, 0)->wait(limit);
  });
}

Status ProcessGroup::Recv(torch::Tensor& tensor, int src, const std::string& name,
                          double timeout_s) {
  SLIME_RETURN_IF_ERROR(CheckPeer("recv", src, options_.rank, options_.world_size));
  return RunCollective(fmt::format("recv from rank {}", src), name, tensor, timeout_s,
                       [&](std::chrono::milliseconds limit) {
    bool copied = false;
    at::Tensor work = WireBuffer(tensor, copied);
    std::vector<at::Tensor> one{work};
    state_->backend->recv(one, src, 0)->wait(limit);
    if (copied) {
      at::Tensor typed = backend_ == "gloo" && work.numel() > 0 ? work.view(tensor.scalar_type())
                                                                 : work;
      tensor.copy_(typed.view(tensor.sizes()));
    }
  });
}

Status ProcessGroup::SendRecv(const torch::Tensor& send, int dst, torch::Tensor& recv, int src,
                              const std::string& name, double timeout_s) {
  SLIME_RETURN_IF_ERROR(CheckPeer("send-recv", dst, options_.rank, options_.world_size));
  SLIME_RETURN_IF_ERROR(CheckPeer("send-recv", src, options_.rank, options_.world_size));
  if (!recv.defined()) return absl::InvalidArgumentError("send-recv into an undefined tensor");
  return RunCollective(fmt::format("send-recv to rank {} from rank {}", dst, src), name, send,
                       timeout_s, [&](std::chrono::milliseconds limit) {
    bool send_copied = false, recv_copied = false;
    std::vector<at::Tensor> out{WireBuffer(send, send_copied)};
    at::Tensor work = WireBuffer(recv, recv_copied);
    std::vector<at::Tensor> in{work};
    const auto deadline = std::chrono::steady_clock::now() + limit;
    // Both posted before either is awaited (c10d works are asynchronous).
    c10::intrusive_ptr<c10d::Work> sent = state_->backend->send(out, dst, 0);
    c10::intrusive_ptr<c10d::Work> received = state_->backend->recv(in, src, 0);
    sent->wait(limit);
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    received->wait(std::max(left, std::chrono::milliseconds(1)));
    if (recv_copied) {
      at::Tensor typed = backend_ == "gloo" && work.numel() > 0 ? work.view(recv.scalar_type())
                                                                 : work;
      recv.copy_(typed.view(recv.sizes()));
    }
  });
}

Status ProcessGroup::Barrier(double timeout_s) {
  std::vector<torch::Tensor> one{torch::zeros({1}, torch::TensorOptions().device(device()))};
  return Broadcast(one, 0, {"barrier"}, timeout_s);
}

}  // namespace slime::comm

// ---- ProcessGroupTensorParallel (include/slime/comm/tensor_parallel_group.h)

namespace slime::comm {

void ProcessGroupTensorParallel::AllReduceSum(at::Tensor& tensor) {
  Status s = group_->AllReduceSum(tensor, "tensor-parallel");
  if (!s.ok()) throw std::runtime_error(std::string(s.message()));
}

at::Tensor ProcessGroupTensorParallel::AllGather(const at::Tensor& tensor, int64_t dim) {
  StatusOr<torch::Tensor> out = group_->AllGather(tensor, dim, "tensor-parallel");
  if (!out.ok()) throw std::runtime_error(std::string(out.status().message()));
  return *std::move(out);
}

at::Tensor ProcessGroupTensorParallel::ReduceScatterSum(const at::Tensor& tensor) {
  StatusOr<torch::Tensor> out = group_->ReduceScatterSum(tensor, "tensor-parallel");
  if (!out.ok()) throw std::runtime_error(std::string(out.status().message()));
  return *std::move(out);
}

}  // namespace slime::comm

// ---- ProcessGroupExpertParallel (include/slime/comm/tensor_parallel_group.h)

namespace slime::comm {

at::Tensor ProcessGroupExpertParallel::AllToAll(const at::Tensor& input,
                                                const std::vector<int64_t>& send_splits,
                                                const std::vector<int64_t>& recv_splits) {
  StatusOr<torch::Tensor> out =
      group_->AllToAll(input, send_splits, recv_splits, "expert-parallel");
  if (!out.ok()) throw std::runtime_error(std::string(out.status().message()));
  return *std::move(out);
}

}  // namespace slime::comm

// ---- ProcessGroupPipelineParallel (include/slime/comm/tensor_parallel_group.h)

namespace slime::comm {

Status ProcessGroupPipelineParallel::Send(const at::Tensor& tensor, int dst) {
  return group_->Send(tensor, dst, "pipeline");
}

Status ProcessGroupPipelineParallel::Recv(at::Tensor& tensor, int src) {
  return group_->Recv(tensor, src, "pipeline");
}

Status ProcessGroupPipelineParallel::SendRecv(const at::Tensor& send, int dst, at::Tensor& recv,
                                              int src) {
  return group_->SendRecv(send, dst, recv, src, "pipeline");
}

Status ProcessGroupPipelineParallel::Broadcast(at::Tensor& tensor, int root) {
  // ProcessGroup::Broadcast wants contiguous tensors on its device: go through a copy otherwise.
  const bool copy = !tensor.is_contiguous() || tensor.device().type() != group_->device().type();
  std::vector<torch::Tensor> one{copy ? tensor.to(group_->device()).contiguous() : tensor};
  SLIME_RETURN_IF_ERROR(group_->Broadcast(one, root, {"pipeline"}));
  if (copy) tensor.copy_(one[0]);
  return absl::OkStatus();
}

Status ProcessGroupPipelineParallel::AllReduceSum(at::Tensor& tensor) {
  return group_->AllReduceSum(tensor, "pipeline");
}

}  // namespace slime::comm
