// ProcessGroup: one torch c10d process group for the weight plane (trainer rank 0 + every engine
// GPU), the way SGLang's /init_weights_update_group builds it: rank 0 hosts a c10d TCPStore at
// master_address:master_port, every rank wraps it in the PrefixStores torch adds for
// group_name (see Compatibility), and the backend is ProcessGroupGloo (CPU tensors) or
// ProcessGroupNCCL (CUDA tensors; NCCL builds only).
//
// Two phases, so rank 0 can tell its peers the port before it blocks:
//   Open()  rank 0 starts the store (master_port 0 picks a free port: read port()); other ranks
//           connect to it, retrying until the timeout. Does not wait for peers.
//   Join()  creates the backend; with Gloo it blocks until every rank has joined or the timeout
//           passes. NCCL forms its communicator at the first collective (as in torch; no
//           barrier, which a Python peer would not match), so there that collective waits.
// Create() does both.
//
// Watchdog: every collective waits for its work with a deadline (the group's timeout unless a
// shorter one is given) and fails with DeadlineExceeded naming the group, the operation and the
// ranks instead of hanging; the rendezvous in Join() is bounded the same way (store timeout).
// Flight recorder: every collective gets a sequence number; an error names it and the last few
// collectives of this rank (operation, tensor, shape), so a rank that skipped or reordered one
// shows in the message. After a failed or timed-out collective the group is `broken()`: later collectives fail fast
// with FailedPrecondition; destroy it and create a new one. On NCCL, the backend's own watchdog
// (timeout = the group's) also aborts the communicator.
//
// Compatibility: compiles against LibTorch 1.13 (c10d ProcessGroup backends) and 2.x (c10d
// Backend); the differences are confined to process_group.cc. Interop with Python peers that
// create the group as slime's trainer and SGLang do (tcp:// rendezvous, PrefixStore(group_name),
// torch's _new_process_group_helper; docs/operations.md, "Interoperability with PyTorch peers"):
// the backend's store is the chain that helper builds in the torch we are compiled against —
// 1.13: TCPStore -> PrefixStore(G) -> PrefixStore(G); 2.x: TCPStore -> PrefixStore(G) ->
// PrefixStore(G + "/") -> PrefixStore("cpu/" for gloo | "cuda/" for nccl), then
// setSequenceNumberForGroup() as the helper does; store clients count themselves in under
// "init/" (numWorkers = world_size) as torch's do, so a Python rank 0 waiting for its workers
// gets past its rendezvous. The Python peer must run the same torch version (the TCPStore wire
// protocol and the key layout are only stable within one). Verified with torch 1.13 on CPU/Gloo
// (tests/comm/torch_interop_test.cc); composite backends ("cpu:gloo,cuda:nccl", where torch 2.x
// makes both backends) do not interoperate.
//
// Model parallelism: comm/tensor_parallel_group.h adapts a ProcessGroup to the model's
// TensorParallelGroup, PipelineParallelGroup and ExpertParallelGroup interfaces (the model does
// not depend on comm).
//
// Thread-safety: collectives on one group must be issued in the same order on every rank, by one
// thread at a time (the engine thread, or the sender). broken()/rank()/... may be read anywhere.
#ifndef SLIME_COMM_PROCESS_GROUP_H_
#define SLIME_COMM_PROCESS_GROUP_H_

#include <torch/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "slime/common/status.h"

namespace slime::comm {

struct ProcessGroupOptions {
  std::string master_address = "127.0.0.1";
  int master_port = 0;  // rank 0: 0 = any free port; other ranks: rank 0's port (required)
  int world_size = 1;
  int rank = 0;
  std::string group_name = "weight_update_group";
  // "gloo" (CPU tensors), "nccl" (CUDA tensors), or "auto" (nccl when CUDA is available).
  // SGLang's composite form "cpu:gloo,cuda:nccl" picks the entry for this machine's device.
  std::string backend = "auto";
  double timeout_s = 1800.0;  // rendezvous and each collective (SGLang's default is 30 min)
  // Gloo: the address this rank's transport binds to. Empty: when master_address is a loopback
  // address, this process's own 127.x address if its node agent bound one ($SLIME_BIND_HOST:
  // several agents on one host) else 127.0.0.1; otherwise GLOO_SOCKET_IFNAME or the host name.
  std::string gloo_bind_address;
  int cuda_device = 0;  // nccl: the device of this rank's tensors
};

// "gloo" or "nccl" for `backend` (see ProcessGroupOptions::backend); InvalidArgument otherwise,
// Unimplemented for nccl in a build without NCCL.
StatusOr<std::string> ResolveBackend(const std::string& backend);

class ProcessGroup {
 public:
  static StatusOr<std::unique_ptr<ProcessGroup>> Open(const ProcessGroupOptions& options);
  static StatusOr<std::unique_ptr<ProcessGroup>> Create(const ProcessGroupOptions& options);
  ~ProcessGroup();

  Status Join();

  // Broadcasts `tensors` from `root` in list order, one c10d broadcast per tensor (SGLang's
  // protocol), all posted before waiting. Receivers' tensors are overwritten in place; every
  // tensor must be contiguous and on this backend's device (CPU for gloo, CUDA for nccl).
  // `names` (optional, same length) only label errors. timeout_s <= 0: the group's timeout.
  Status Broadcast(std::vector<torch::Tensor>& tensors, int root = 0,
                   const std::vector<std::string>& names = {}, double timeout_s = 0);
  // Sums `tensor` element-wise over every rank, in place (one c10d all-reduce). A tensor that
  // is not contiguous or not on the backend's device goes through a temporary copy; Gloo sums
  // bfloat16 / float16 in float32. `name` labels errors.
  Status AllReduceSum(torch::Tensor& tensor, const std::string& name = "", double timeout_s = 0);
  // AllReduceSum without the wait: posts the all-reduce and returns a function that waits for
  // it (the deadline counts from the post), copies the sum into `tensor` when it went through a
  // temporary, and returns the collective's status (the watchdog and flight recorder as for
  // every collective). Until that function has returned, `tensor` must stay alive and neither
  // be read nor written; the group must outlive the function. The post is the collective's
  // place in the group's order, so every rank posts in the same order; the waits may be made
  // later, from another thread (one at a time, as the thread-safety note below says). For
  // overlapping gradient sums with the backward pass (train/grad_reducer.h). On NCCL the sum
  // runs on the backend's stream after the work queued on this thread's current stream; the
  // wait makes the waiting thread's current stream wait for it.
  StatusOr<std::function<Status()>> AllReduceSumAsync(torch::Tensor& tensor,
                                                      const std::string& name = "",
                                                      double timeout_s = 0);
  // Concatenation of every rank's `tensor` along `dim`, in rank order (one c10d all-gather).
  // Every rank must pass the same shape and dtype; the result has the input's dtype and
  // device, with size(dim) multiplied by world_size. Any dtype: Gloo moves the raw bytes.
  // `dim` may be negative (counted from the end).
  StatusOr<torch::Tensor> AllGather(const torch::Tensor& tensor, int64_t dim,
                                    const std::string& name = "", double timeout_s = 0);
  // Sums `tensor` element-wise over every rank and returns this rank's chunk of the sum along
  // dim 0: rows [rank·N/W, (rank+1)·N/W) of the [N, ...] sum (N must divide by world_size;
  // InvalidArgument otherwise). NCCL: one c10d reduce_scatter. Gloo has no reduce_scatter in
  // LibTorch 1.13, so there it is an all-reduce of a copy and a slice (same result, W times the
  // traffic; fine for the CPU test path). Gloo sums bfloat16 / float16 in float32. The result
  // has the input's dtype and device.
  StatusOr<torch::Tensor> ReduceScatterSum(const torch::Tensor& tensor,
                                           const std::string& name = "", double timeout_s = 0);
  // Exchanges rows with every rank (c10d alltoall_base with split sizes; expert parallelism's
  // token dispatch): rows [sum(send_splits[0..r)), +send_splits[r]) of `input` [N, ...] go to
  // rank r; the result [sum(recv_splits), ...] holds, in rank order, the rows each rank sent
  // here. send_splits and recv_splits have world_size entries, >= 0; send_splits sums to N;
  // recv_splits[r] must equal rank r's send_splits[this rank] (exchange the counts first, e.g.
  // with an AllToAll of one row per rank) — a mismatch fails or hangs until the deadline as a
  // missing peer does. Every rank must pass the same trailing shape and dtype. Zero splits and
  // N = 0 are fine. Any dtype (Gloo moves raw bytes); the result has the input's dtype and
  // device. InvalidArgument (before anything is sent) for wrong split counts or sums.
  StatusOr<torch::Tensor> AllToAll(const torch::Tensor& input,
                                   const std::vector<int64_t>& send_splits,
                                   const std::vector<int64_t>& recv_splits,
                                   const std::string& name = "", double timeout_s = 0);
  // Point-to-point (c10d send / recv, tag 0), for pipeline stages. Send blocks until `tensor`
  // has gone to rank `dst` (its Recv from this rank must be posted: both backends hand the
  // bytes over only then); Recv blocks until rank `src`'s Send of the same shape and dtype
  // arrived and overwrites `tensor` in place. Messages between two ranks arrive in send order.
  // Any dtype (Gloo moves raw bytes); a tensor not contiguous or not on the backend's device
  // goes through a temporary copy. `dst` / `src` must be another rank of the group
  // (InvalidArgument otherwise, before anything is sent). Same watchdog / flight recorder as
  // the collectives: a peer that never posts the match makes it DeadlineExceeded and the
  // group broken. `name` labels errors.
  Status Send(const torch::Tensor& tensor, int dst, const std::string& name = "",
              double timeout_s = 0);
  Status Recv(torch::Tensor& tensor, int src, const std::string& name = "", double timeout_s = 0);
  // Posts a Send of `send` to `dst` and a Recv into `recv` from `src`, then waits for both: the
  // exchange of a pipeline schedule's steady phase (stage s sends its activation forward while
  // receiving a gradient from the same neighbour), which two blocking calls in a row would
  // deadlock when both neighbours send first.
  Status SendRecv(const torch::Tensor& send, int dst, torch::Tensor& recv, int src,
                  const std::string& name = "", double timeout_s = 0);
  // All ranks meet (a one-element broadcast from rank 0).
  Status Barrier(double timeout_s = 0);

  int rank() const { return options_.rank; }
  int world_size() const { return options_.world_size; }
  int port() const { return port_; }
  const std::string& group_name() const { return options_.group_name; }
  const std::string& backend() const { return backend_; }  // "gloo" | "nccl"
  torch::Device device() const;  // where tensors must live (cpu, or cuda:cuda_device)
  bool joined() const;
  bool broken() const { return broken_.load(); }

  struct State;  // c10d objects (process_group.cc)

 private:
  explicit ProcessGroup(ProcessGroupOptions options);
  std::string Describe() const;
  Status CheckUsable() const;
  // The watchdog / flight-recorder frame of a single-tensor collective: CheckUsable, Record
  // ("<op> <label> [shape] dtype"), runs `fn(limit)` guarded, and on failure marks the group
  // broken and returns "<op> #seq of <label> timed out|failed after ... s: ...<Recent()>".
  Status RunCollective(const std::string& op, const std::string& name, const torch::Tensor& tensor,
                       double timeout_s,
                       const std::function<void(std::chrono::milliseconds limit)>& fn);
  // RunCollective in two parts, for collectives waited on later: BeginCollective checks and
  // records (`frame` describes the collective), FinishCollective runs `fn` guarded and turns a
  // failure into the error above. RunCollective is the two in a row.
  struct Frame {
    std::string op, label;
    uint64_t seq = 0;
    double limit_s = 0;
    std::chrono::steady_clock::time_point start;
  };
  Status BeginCollective(const std::string& op, const std::string& name,
                         const torch::Tensor& tensor, double timeout_s, Frame& frame);
  Status FinishCollective(const Frame& frame,
                          const std::function<void(std::chrono::milliseconds left)>& fn);
  // The buffer c10d moves for `t` (see Send); `copied` is set when it is a copy.
  at::Tensor WireBuffer(const torch::Tensor& t, bool& copied) const;
  // Numbers a collective and remembers it; Recent() lists the last kRecent.
  uint64_t Record(const std::string& what);
  std::string Recent() const;
  static constexpr size_t kRecent = 8;
  uint64_t seq_ = 0;                  // collectives issued (one thread at a time)
  std::vector<std::string> recent_;   // ring of the last kRecent, "#seq op ..."

  ProcessGroupOptions options_;
  std::string backend_;
  int port_ = 0;
  std::atomic<bool> broken_{false};
  std::unique_ptr<State> state_;
};

}  // namespace slime::comm

#endif  // SLIME_COMM_PROCESS_GROUP_H_
