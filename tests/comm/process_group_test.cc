// c10d collectives between threads of this process (Gloo over TCPStore on 127.0.0.1):
// AllGather and ReduceScatterSum against the single-process result, their argument errors and
// the flight recorder on a missed one; point-to-point Send / Recv / SendRecv (any dtype, order,
// the exchange that two blocking sends would deadlock, a missed receive timing out); and the
// model's TP and PP group adapters on c10d. (Broadcast and AllReduceSum are covered in weight_sync_test.cc.)
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "slime/comm/process_group.h"
#include "slime/comm/tensor_parallel_group.h"

namespace slime::comm {
namespace {

// Runs `body(rank, group)` on `world` threads, each with its rank of one fresh Gloo group; returns
// the ranks' statuses.
std::vector<Status> OnRanks(int world, const std::string& name,
                            const std::function<Status(int, ProcessGroup&)>& body,
                            double timeout_s = 30) {
  ProcessGroupOptions o;
  o.world_size = world;
  o.backend = "gloo";
  o.group_name = name;
  o.timeout_s = timeout_s;
  auto root = ProcessGroup::Open(o);
  if (!root.ok()) return std::vector<Status>(world, root.status());
  const int port = (*root)->port();
  std::vector<std::future<Status>> futures;
  for (int r = 0; r < world; ++r) {
    futures.push_back(std::async(std::launch::async, [&, r]() -> Status {
      std::unique_ptr<ProcessGroup> own;
      if (r == 0) {
        SLIME_RETURN_IF_ERROR((*root)->Join());
      } else {
        ProcessGroupOptions p = o;
        p.rank = r;
        p.master_port = port;
        SLIME_ASSIGN_OR_RETURN(own, ProcessGroup::Create(p));
      }
      return body(r, r == 0 ? **root : *own);
    }));
  }
  std::vector<Status> out;
  for (auto& f : futures) out.push_back(f.get());
  return out;
}

void ExpectAllOk(const std::vector<Status>& statuses) {
  for (size_t r = 0; r < statuses.size(); ++r) EXPECT_TRUE(statuses[r].ok()) << r << ": " << statuses[r];
}

// Rank r's input: distinct values per rank and position.
torch::Tensor Input(int rank, std::vector<int64_t> shape, torch::ScalarType dtype) {
  const int64_t n = torch::empty(shape).numel();
  return (torch::arange(n, torch::kFloat32).view(shape) * 0.5 + 100 * rank).to(dtype);
}

// The local addresses (hex, as /proc/net/tcp{,6} write them) of the sockets listening on `port`.
std::set<std::string> ListeningAddresses(int port) {
  std::set<std::string> out;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      fields >> slot >> local >> remote >> state;
      const size_t colon = local.rfind(':');
      if (state != "0A" || colon == std::string::npos) continue;  // 0A: LISTEN
      if (std::stoi(local.substr(colon + 1), nullptr, 16) == port) out.insert(local.substr(0, colon));
    }
  }
  return out;
}

// Rank 0's c10d store listens on the group's master_address only, where the torch we build
// against lets it (2.8+: a socket we bind, handed over as masterListenFd); torch 1.13's server
// listens on every interface (docs/operations.md says so). Either way a rank that dials the
// address joins and the group works.
TEST(StoreTest, TheStoreListensOnTheMasterAddressWhereTorchAllows) {
  ProcessGroupOptions o;
  o.world_size = 2;
  o.backend = "gloo";
  o.group_name = "bind-test";
  o.master_address = "127.0.0.2";
  o.timeout_s = 30;
  auto root = ProcessGroup::Open(o);
  ASSERT_TRUE(root.ok()) << root.status();
  const std::set<std::string> listening = ListeningAddresses((*root)->port());
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 8)
  EXPECT_EQ(listening, std::set<std::string>{"0200007F"}) << "expected 127.0.0.2 only";
#else
  // 1.13: the wildcard address (IPv6 "::" when the host has IPv6, else 0.0.0.0).
  ASSERT_EQ(listening.size(), 1u);
  EXPECT_TRUE(*listening.begin() == "00000000" ||
              *listening.begin() == "00000000000000000000000000000000")
      << *listening.begin();
#endif
  auto peer = std::async(std::launch::async, [&]() -> Status {
    ProcessGroupOptions p = o;
    p.rank = 1;
    p.master_port = (*root)->port();
    SLIME_ASSIGN_OR_RETURN(auto own, ProcessGroup::Create(p));
    torch::Tensor t = torch::ones({4});
    return own->AllReduceSum(t);
  });
  ASSERT_TRUE((*root)->Join().ok());
  torch::Tensor t = torch::ones({4});
  ASSERT_TRUE((*root)->AllReduceSum(t).ok());
  EXPECT_TRUE(torch::equal(t, torch::full({4}, 2.0f)));
  EXPECT_TRUE(peer.get().ok());
}

TEST(CollectivesTest, AllGatherConcatenatesInRankOrderAlongAnyDim) {
  constexpr int kWorld = 3;
  ExpectAllOk(OnRanks(kWorld, "gather", [](int rank, ProcessGroup& pg) -> Status {
    for (torch::ScalarType dtype : {torch::kFloat32, torch::kBFloat16, torch::kInt64}) {
      for (int64_t dim : {0, 1, -1}) {
        const torch::Tensor mine = Input(rank, {2, 3}, dtype);
        SLIME_ASSIGN_OR_RETURN(torch::Tensor got, pg.AllGather(mine, dim, "x"));
        std::vector<torch::Tensor> all;
        for (int r = 0; r < kWorld; ++r) all.push_back(Input(r, {2, 3}, dtype));
        const torch::Tensor want = torch::cat(all, dim);
        EXPECT_EQ(got.scalar_type(), dtype);
        EXPECT_TRUE(torch::equal(got, want)) << "dtype " << dtype << " dim " << dim;
      }
    }
    // A non-contiguous input is gathered by value.
    const torch::Tensor t = Input(rank, {3, 2}, torch::kFloat32).t();
    SLIME_ASSIGN_OR_RETURN(torch::Tensor got, pg.AllGather(t, 1));
    EXPECT_TRUE(torch::equal(got.narrow(1, 3 * rank, 3), t));
    // Bad dims are refused before anything is sent (so the group stays in step).
    StatusOr<torch::Tensor> bad = pg.AllGather(t, 2, "x");
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
    EXPECT_NE(std::string(bad.status().message()).find("dim 2"), std::string::npos);
    EXPECT_FALSE(pg.broken());
    return absl::OkStatus();
  }));
}

TEST(CollectivesTest, ReduceScatterSumKeepsEachRanksChunkOfTheSum) {
  constexpr int kWorld = 2;
  ExpectAllOk(OnRanks(kWorld, "rs", [](int rank, ProcessGroup& pg) -> Status {
    for (torch::ScalarType dtype : {torch::kFloat32, torch::kFloat64, torch::kBFloat16}) {
      const torch::Tensor mine = Input(rank, {4, 3}, dtype);
      SLIME_ASSIGN_OR_RETURN(torch::Tensor got, pg.ReduceScatterSum(mine, "grads"));
      const torch::Tensor sum =
          Input(0, {4, 3}, torch::kFloat32) + Input(1, {4, 3}, torch::kFloat32);
      EXPECT_EQ(got.scalar_type(), dtype);
      EXPECT_EQ(got.sizes(), (std::vector<int64_t>{2, 3}));
      EXPECT_TRUE(torch::allclose(got.to(torch::kFloat32), sum.narrow(0, 2 * rank, 2)))
          << "dtype " << dtype;
      // The input is not modified.
      EXPECT_TRUE(torch::equal(mine, Input(rank, {4, 3}, dtype)));
    }
    StatusOr<torch::Tensor> bad = pg.ReduceScatterSum(torch::ones({3, 2}), "odd");
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
    EXPECT_NE(std::string(bad.status().message()).find("not divisible"), std::string::npos);
    EXPECT_FALSE(pg.broken());
    return absl::OkStatus();
  }));
}

// Variable-split all-to-all: rank s sends (s + d) % 3 rows to rank d (zero splits included),
// row values naming sender, receiver and row, in several dtypes and trailing shapes.
TEST(CollectivesTest, AllToAllMovesUnevenSplitsInRankOrder) {
  constexpr int kWorld = 3;
  auto rows = [](int src, int dst) -> int64_t { return (src + dst) % 3; };
  // The rows rank `src` sends to rank `dst`: [rows, 2, 3] valued src*1000 + dst*100 + index.
  auto block = [&](int src, int dst, torch::ScalarType dtype) {
    const int64_t n = rows(src, dst);
    return (torch::arange(n * 6, torch::kFloat32).view({n, 2, 3}) + src * 1000 + dst * 100)
        .to(dtype);
  };
  ExpectAllOk(OnRanks(kWorld, "a2a", [&](int rank, ProcessGroup& pg) -> Status {
    for (torch::ScalarType dtype : {torch::kFloat32, torch::kBFloat16, torch::kInt64}) {
      std::vector<torch::Tensor> out_blocks, want_blocks;
      std::vector<int64_t> send, recv;
      for (int r = 0; r < kWorld; ++r) {
        out_blocks.push_back(block(rank, r, dtype));
        want_blocks.push_back(block(r, rank, dtype));
        send.push_back(rows(rank, r));
        recv.push_back(rows(r, rank));
      }
      SLIME_ASSIGN_OR_RETURN(torch::Tensor got,
                             pg.AllToAll(torch::cat(out_blocks, 0), send, recv, "tokens"));
      EXPECT_EQ(got.scalar_type(), dtype);
      EXPECT_TRUE(torch::equal(got, torch::cat(want_blocks, 0))) << "dtype " << dtype;
    }
    // Nothing to send or receive at all: an empty exchange still completes on every rank.
    SLIME_ASSIGN_OR_RETURN(torch::Tensor none,
                           pg.AllToAll(torch::empty({0, 4}), {0, 0, 0}, {0, 0, 0}, "empty"));
    EXPECT_EQ(none.sizes(), (std::vector<int64_t>{0, 4}));
    // Only rank 0 sends, one row to everyone: the 1-D counts exchange the dispatch uses.
    const torch::Tensor counts =
        rank == 0 ? torch::arange(kWorld, torch::kInt64) : torch::empty({0}, torch::kInt64);
    const std::vector<int64_t> send =
        rank == 0 ? std::vector<int64_t>{1, 1, 1} : std::vector<int64_t>{0, 0, 0};
    SLIME_ASSIGN_OR_RETURN(torch::Tensor one, pg.AllToAll(counts, send, {1, 0, 0}, "counts"));
    EXPECT_EQ(one.numel(), 1);
    if (one.numel() == 1) {
      EXPECT_EQ(one.item<int64_t>(), rank);
    }
    // Bad splits are refused before anything is sent, naming what is wrong.
    StatusOr<torch::Tensor> bad = pg.AllToAll(torch::ones({3, 2}), {1, 1, 0}, {1, 1, 1}, "x");
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
    EXPECT_NE(std::string(bad.status().message()).find("send_splits"), std::string::npos);
    bad = pg.AllToAll(torch::ones({2, 2}), {1, 1}, {1, 1, 1}, "x");
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
    EXPECT_FALSE(pg.broken());
    return absl::OkStatus();
  }));
}

// A rank that skips a collective: the other times out with the sequence number, the collective
// and its recent ones named, and its group is broken afterwards.
TEST(CollectivesTest, AMissedAllGatherTimesOutNamingTheRecentCollectives) {
  std::vector<Status> statuses = OnRanks(2, "missed", [](int rank, ProcessGroup& pg) -> Status {
    torch::Tensor t = torch::ones({2});
    SLIME_RETURN_IF_ERROR(pg.AllReduceSum(t, "warmup"));
    SLIME_RETURN_IF_ERROR(pg.ReduceScatterSum(t, "shards").status());
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::seconds(3));
      return absl::OkStatus();
    }
    StatusOr<torch::Tensor> lone = pg.AllGather(t, 0, "params", 1.0);
    EXPECT_FALSE(lone.ok());
    const std::string m(lone.status().message());
    EXPECT_EQ(lone.status().code(), absl::StatusCode::kDeadlineExceeded) << m;
    EXPECT_NE(m.find("all-gather #3 of 'params'"), std::string::npos) << m;
    EXPECT_NE(m.find("#2 reduce-scatter 'shards' [2] Float"), std::string::npos) << m;
    EXPECT_TRUE(pg.broken());
    EXPECT_EQ(pg.AllGather(t, 0).status().code(), absl::StatusCode::kFailedPrecondition);
    return absl::OkStatus();
  });
  ExpectAllOk(statuses);
}

TEST(CollectivesTest, TensorParallelGroupOverC10d) {
  ExpectAllOk(OnRanks(2, "tp", [](int rank, ProcessGroup& pg) -> Status {
    // The adapter shares the group (the test keeps ownership: no-op deleter).
    ProcessGroupTensorParallel tp(std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {}));
    EXPECT_EQ(tp.rank(), rank);
    EXPECT_EQ(tp.size(), 2);
    torch::Tensor scalar = torch::full({}, 1.5f + rank);  // 0-dim, as the gradient norm
    tp.AllReduceSum(scalar);
    EXPECT_FLOAT_EQ(scalar.item<float>(), 4.0f);
    torch::Tensor g = tp.AllGather(torch::full({2, 1}, static_cast<float>(rank)), 1);
    EXPECT_TRUE(torch::equal(g, torch::tensor({{0.0f, 1.0f}, {0.0f, 1.0f}})));
    // Failures throw with the group's message (the model turns them into a Status).
    if (rank == 0) {
      try {
        tp.AllGather(torch::ones({2}), 3);
        ADD_FAILURE() << "no throw";
      } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find("dim 3"), std::string::npos) << e.what();
      }
    }
    return absl::OkStatus();
  }));
}

TEST(PointToPointTest, SendAndRecvMoveAnyDtypeInOrder) {
  ExpectAllOk(OnRanks(2, "p2p", [](int rank, ProcessGroup& pg) -> Status {
    const std::vector<torch::ScalarType> dtypes = {torch::kFloat32, torch::kBFloat16,
                                                   torch::kInt64, torch::kFloat64};
    if (rank == 0) {
      for (torch::ScalarType dtype : dtypes) {
        SLIME_RETURN_IF_ERROR(pg.Send(Input(7, {3, 4}, dtype), 1, "act"));
      }
      // A non-contiguous source is sent by value.
      SLIME_RETURN_IF_ERROR(pg.Send(Input(3, {4, 3}, torch::kFloat32).t(), 1, "t"));
    } else {
      for (torch::ScalarType dtype : dtypes) {
        torch::Tensor got = torch::zeros({3, 4}, dtype);
        SLIME_RETURN_IF_ERROR(pg.Recv(got, 0, "act"));
        EXPECT_TRUE(torch::equal(got, Input(7, {3, 4}, dtype))) << "dtype " << dtype;
      }
      // Into a non-contiguous destination: filled in place.
      torch::Tensor base = torch::zeros({4, 3});
      torch::Tensor view = base.t();
      SLIME_RETURN_IF_ERROR(pg.Recv(view, 0, "t"));
      EXPECT_TRUE(torch::equal(base, Input(3, {4, 3}, torch::kFloat32)));
    }
    // Bad peers are refused before anything is sent (the group stays usable).
    Status self = pg.Send(torch::ones({1}), rank, "self");
    EXPECT_EQ(self.code(), absl::StatusCode::kInvalidArgument) << self;
    EXPECT_NE(std::string(self.message()).find("peer rank"), std::string::npos) << self;
    torch::Tensor t = torch::ones({1});
    EXPECT_EQ(pg.Recv(t, 5).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_FALSE(pg.broken());
    return absl::OkStatus();
  }));
}

// Both neighbours send first: SendRecv posts both sides before waiting, so it completes where a
// blocking Send followed by Recv on both ranks would wait for each other.
TEST(PointToPointTest, SendRecvExchangesBetweenNeighbours) {
  ExpectAllOk(OnRanks(2, "exchange", [](int rank, ProcessGroup& pg) -> Status {
    const int peer = 1 - rank;
    for (int round = 0; round < 3; ++round) {
      torch::Tensor got = torch::zeros({5, 2}, torch::kBFloat16);
      SLIME_RETURN_IF_ERROR(
          pg.SendRecv(Input(rank + round, {5, 2}, torch::kBFloat16), peer, got, peer, "x"));
      EXPECT_TRUE(torch::equal(got, Input(peer + round, {5, 2}, torch::kBFloat16)));
    }
    return absl::OkStatus();
  }));
}

TEST(PointToPointTest, AnUnmatchedSendTimesOutNamingThePeer) {
  ExpectAllOk(OnRanks(2, "lonely", [](int rank, ProcessGroup& pg) -> Status {
    torch::Tensor t = torch::ones({4});
    SLIME_RETURN_IF_ERROR(pg.AllReduceSum(t, "warmup"));
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::seconds(3));
      return absl::OkStatus();
    }
    Status s = pg.Send(t, 1, "activation", 1.0);
    const std::string m(s.message());
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << m;
    EXPECT_NE(m.find("send to rank 1 #2 of 'activation'"), std::string::npos) << m;
    EXPECT_NE(m.find("#1 all-reduce 'warmup'"), std::string::npos) << m;
    EXPECT_TRUE(pg.broken());
    return absl::OkStatus();
  }));
}

TEST(CollectivesTest, PipelineParallelGroupOverC10d) {
  ExpectAllOk(OnRanks(3, "pp", [](int rank, ProcessGroup& pg) -> Status {
    ProcessGroupPipelineParallel pp(std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {}));
    EXPECT_EQ(pp.rank(), rank);
    EXPECT_EQ(pp.size(), 3);
    // A chain 0 -> 1 -> 2, as a pipeline's forward.
    torch::Tensor x = torch::full({2}, 1.0f);
    if (rank > 0) SLIME_RETURN_IF_ERROR(pp.Recv(x, rank - 1));
    x = x * 2;
    if (rank < 2) SLIME_RETURN_IF_ERROR(pp.Send(x, rank + 1));
    EXPECT_FLOAT_EQ(x[0].item<float>(), 2.0f * static_cast<float>(1 << rank));
    torch::Tensor b = torch::full({3}, static_cast<double>(rank), torch::kFloat64);
    SLIME_RETURN_IF_ERROR(pp.Broadcast(b, 2));
    EXPECT_TRUE(torch::equal(b, torch::full({3}, 2.0, torch::kFloat64)));
    torch::Tensor sum = torch::full({}, 1.0f + rank);
    SLIME_RETURN_IF_ERROR(pp.AllReduceSum(sum));
    EXPECT_FLOAT_EQ(sum.item<float>(), 6.0f);
    return absl::OkStatus();
  }));
}

}  // namespace
}  // namespace slime::comm
