// The multi-rank harness of the trainer tests (tensor_parallel_test.cc,
// pipeline_parallel_test.cc, data_parallel_test.cc, trainer_test.cc; its own contract is tested
// in data_parallel_test.cc, MultiRankHarnessTest): ranks are threads of the test process,
// joined by real c10d groups (comm::ProcessGroup; Gloo on CPU, NCCL in the GPU variants) whose
// TCPStore listens on 127.0.0.1 at a free port (master_port 0, one store per group).
//
//   MakeGroups(world, groups, name)    one c10d group per listed set of global ranks; returns
//                                      each global rank's joined groups.
//   RunRanks(world, body)              body(rank) on `world` threads, then joins them all.
//   RunGrid(mp, dp, name, body)        a model-parallel × data-parallel grid: makes both group
//                                      families and runs body(GridRank) on every rank.
//   WireDataParallel(grid_rank, o)     TrainerOptions' DP seams over the grid rank's DP group.
//   ThreadGroup                        an in-process DP group (barriers, no c10d) for tests of
//                                      the DP arithmetic alone.
//
// Failures: gtest assertions may be used in a rank's body; each failure raised on a rank thread
// carries "rank r" (a SCOPED_TRACE, per thread), and an exception escaping a body becomes a test
// failure naming the rank instead of terminating the process. A rank that returns early (a
// failed ASSERT) leaves its peers waiting in their next collective; they fail at the group's
// deadline (RankGroupOptions::timeout_s, the ProcessGroup watchdog) rather than hang.
//
// Threads: MakeGroups / RunRanks / RunGrid are called from the test's thread and return when
// every rank's thread has finished. Header-only; include from tests/train/ only (torch targets
// that link slime::trainer; those that call MakeGroups or RunGrid also link slime::comm).
#ifndef SLIME_TESTS_TRAIN_MULTI_RANK_HARNESS_H_
#define SLIME_TESTS_TRAIN_MULTI_RANK_HARNESS_H_

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <barrier>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "slime/comm/process_group.h"
#include "slime/train/optimizer.h"
#include "slime/train/trainer.h"

namespace slime::train::test_util {

// How MakeGroups / RunGrid build their groups.
struct RankGroupOptions {
  // "gloo" (CPU tensors) or "nccl" (global rank r's tensors on cuda:r).
  std::string backend = "gloo";
  double timeout_s = 120;  // rendezvous and each collective
};

// RankGroups[r] = global rank r's groups, in the order of the `groups` argument (only the
// groups r is a member of).
using RankGroups = std::vector<std::vector<std::shared_ptr<comm::ProcessGroup>>>;

// One c10d group per entry of `groups` (each lists distinct global ranks in [0, world); its
// first member is the group's rank 0 and hosts its store). Group g is named name + g. Every
// member joins on its own thread, so this returns once all groups are complete. On an error
// it records a test failure and returns an empty vector (callers ASSERT the size).
inline RankGroups MakeGroups(int world, const std::vector<std::vector<int>>& groups,
                             const std::string& name, const RankGroupOptions& options = {}) {
  RankGroups out(world);
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::vector<int>& members = groups[g];
    comm::ProcessGroupOptions o;
    o.world_size = static_cast<int>(members.size());
    o.backend = options.backend;
    o.cuda_device = members[0];
    o.group_name = name + std::to_string(g);
    o.timeout_s = options.timeout_s;
    auto root = comm::ProcessGroup::Open(o);
    EXPECT_TRUE(root.ok()) << o.group_name << ": " << root.status();
    if (!root.ok()) return {};
    std::shared_ptr<comm::ProcessGroup> root_pg = std::move(*root);
    std::vector<std::future<std::shared_ptr<comm::ProcessGroup>>> joins;
    for (size_t r = 0; r < members.size(); ++r) {
      joins.push_back(
          std::async(std::launch::async, [&, r]() -> std::shared_ptr<comm::ProcessGroup> {
            if (r == 0) {
              Status s = root_pg->Join();
              EXPECT_TRUE(s.ok()) << o.group_name << ": " << s;
              return s.ok() ? root_pg : nullptr;
            }
            comm::ProcessGroupOptions p = o;
            p.rank = static_cast<int>(r);
            p.master_port = root_pg->port();
            p.cuda_device = members[r];
            auto pg = comm::ProcessGroup::Create(p);
            EXPECT_TRUE(pg.ok()) << o.group_name << " rank " << r << ": " << pg.status();
            return pg.ok() ? std::shared_ptr<comm::ProcessGroup>(std::move(*pg)) : nullptr;
          }));
    }
    bool complete = true;
    for (size_t r = 0; r < members.size(); ++r) {
      std::shared_ptr<comm::ProcessGroup> pg = joins[r].get();
      complete = complete && pg != nullptr;
      out[members[r]].push_back(std::move(pg));
    }
    if (!complete) return {};
  }
  return out;
}

// Runs body(rank) for rank 0..world-1, each on its own thread, and joins them all (see the file
// comment for how a rank's failures are reported).
inline void RunRanks(int world, const std::function<void(int rank)>& body) {
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&body, rank] {
      SCOPED_TRACE("rank " + std::to_string(rank));
      try {
        body(rank);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << rank << " threw: " << e.what();
      } catch (...) {
        ADD_FAILURE() << "rank " << rank << " threw a non-standard exception";
      }
    });
  }
  for (std::thread& t : threads) t.join();
}

// An in-process stand-in for a DP group of `size` ranks on RunRanks' threads, with the
// collectives' exact semantics and no c10d: every collective publishes the calling rank's
// tensor, waits for all ranks, computes (sums in rank order, the same on every rank), and waits
// again before anyone may publish the next one. Every rank must call the same collectives in
// the same order (else it deadlocks: there is no deadline). Wire() sets an AdamWOptions' or a
// TrainerOptions' DP seams to it.
class ThreadGroup {
 public:
  explicit ThreadGroup(int size) : size_(size), barrier_(size), slots_(size) {}
  int size() const { return size_; }

  Status AllReduceSum(int rank, torch::Tensor& t) {
    slots_[rank] = t.clone();
    barrier_.arrive_and_wait();
    torch::Tensor sum = torch::zeros_like(t);
    for (const torch::Tensor& s : slots_) sum += s;  // same order on every rank
    barrier_.arrive_and_wait();
    t.copy_(sum);
    return absl::OkStatus();
  }
  Status ReduceScatterSum(int rank, const torch::Tensor& in, torch::Tensor& out) {
    const int64_t n = out.numel();
    EXPECT_EQ(in.numel(), n * size_);
    slots_[rank] = in.clone();
    barrier_.arrive_and_wait();
    torch::Tensor sum = torch::zeros_like(out);
    for (const torch::Tensor& s : slots_) sum += s.narrow(0, rank * n, n);
    barrier_.arrive_and_wait();
    out.copy_(sum);
    return absl::OkStatus();
  }
  Status AllGather(int rank, const torch::Tensor& in, torch::Tensor& out) {
    const int64_t n = in.numel();
    EXPECT_EQ(out.numel(), n * size_);
    slots_[rank] = in.clone();
    barrier_.arrive_and_wait();
    for (int r = 0; r < size_; ++r) out.narrow(0, r * n, n).copy_(slots_[r]);
    barrier_.arrive_and_wait();
    return absl::OkStatus();
  }

  // Sets the DP seams of `o` — an AdamWOptions or a TrainerOptions: dp_size, dp_rank,
  // dp_all_reduce, dp_reduce_scatter, dp_all_gather — to this group, as `rank`.
  template <typename Options>
  void Wire(int rank, Options& o) {
    o.dp_size = size_;
    o.dp_rank = rank;
    o.dp_all_reduce = [this, rank](torch::Tensor& t) { return AllReduceSum(rank, t); };
    o.dp_reduce_scatter = [this, rank](const torch::Tensor& in, torch::Tensor& out) {
      return ReduceScatterSum(rank, in, out);
    };
    o.dp_all_gather = [this, rank](const torch::Tensor& in, torch::Tensor& out) {
      return AllGather(rank, in, out);
    };
  }

 private:
  int size_;
  std::barrier<> barrier_;
  std::vector<torch::Tensor> slots_;
};

// One rank of a model-parallel × data-parallel grid: global rank = dp_rank * mp_size + mp_rank.
// Its MP group (tensor- or pipeline-parallel) is the ranks with its dp_rank, in mp_rank order;
// its DP group the ranks with its mp_rank, in dp_rank order.
struct GridRank {
  int rank = 0;
  int mp_rank = 0, mp_size = 1;
  int dp_rank = 0, dp_size = 1;
  std::shared_ptr<comm::ProcessGroup> mp;  // null when mp_size is 1
  std::shared_ptr<comm::ProcessGroup> dp;  // null when dp_size is 1
};

// Makes the grid's groups (MP groups named name + d, DP groups name + "-dp" + m) and runs
// body on every rank's thread, as RunRanks does. If a group cannot be made it records the
// failure and runs nothing.
inline void RunGrid(int mp, int dp, const std::string& name,
                    const std::function<void(const GridRank&)>& body,
                    const RankGroupOptions& options = {}) {
  const int world = mp * dp;
  std::vector<std::vector<int>> mp_groups(dp), dp_groups(mp);
  for (int d = 0; d < dp; ++d) {
    for (int m = 0; m < mp; ++m) {
      mp_groups[d].push_back(d * mp + m);
      dp_groups[m].push_back(d * mp + m);
    }
  }
  const RankGroups mp_pgs =
      mp > 1 ? MakeGroups(world, mp_groups, name, options) : RankGroups(world);
  const RankGroups dp_pgs =
      dp > 1 ? MakeGroups(world, dp_groups, name + "-dp", options) : RankGroups(world);
  ASSERT_EQ(mp_pgs.size(), static_cast<size_t>(world)) << "the model-parallel groups of " << name;
  ASSERT_EQ(dp_pgs.size(), static_cast<size_t>(world)) << "the data-parallel groups of " << name;
  RunRanks(world, [&](int rank) {
    GridRank g;
    g.rank = rank;
    g.mp_rank = rank % mp;
    g.mp_size = mp;
    g.dp_rank = rank / mp;
    g.dp_size = dp;
    if (mp > 1) g.mp = mp_pgs[rank].at(0);
    if (dp > 1) g.dp = dp_pgs[rank].at(0);
    body(g);
  });
}

// Sets o's data-parallel seams for grid rank g: with dp_size > 1, dp_size, dp_rank,
// dp_all_reduce and dp_all_reduce_async over g.dp, and dp_reduce_scatter / dp_all_gather made
// of that all-reduce (optimizer.h), as the trainer worker wires them. With dp_size 1 it leaves o unchanged.
inline void WireDataParallel(const GridRank& g, TrainerOptions& o) {
  if (g.dp_size <= 1) return;
  std::shared_ptr<comm::ProcessGroup> dp = g.dp;
  o.dp_size = g.dp_size;
  o.dp_rank = g.dp_rank;
  o.dp_all_reduce = [dp](torch::Tensor& t) { return dp->AllReduceSum(t, "dp"); };
  o.dp_all_reduce_async = [dp](torch::Tensor& t) { return dp->AllReduceSumAsync(t, "dp"); };
  o.dp_reduce_scatter = ReduceScatterThroughAllReduce(o.dp_all_reduce, g.dp_size, g.dp_rank);
  o.dp_all_gather = AllGatherThroughAllReduce(o.dp_all_reduce, g.dp_size, g.dp_rank);
}

}  // namespace slime::train::test_util

#endif  // SLIME_TESTS_TRAIN_MULTI_RANK_HARNESS_H_
