// Randomized simulation of the scheduler: many requests with random prompt and output lengths,
// shared prefixes and repeated prompts, arriving over time and sometimes aborted, pushed
// through a small pool by the fake engine (which checks every context slot it reads).
// Every step checks the scheduler's invariants; every request must finish with the output it
// would have produced alone; after a cache reset every page is back in the pool.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "fake_engine.h"
#include "slime/engine/scheduler.h"

namespace slime::engine {
namespace {

using testing::FakeEngine;
using testing::Generate;

struct SimConfig {
  int64_t page_size;
  int64_t num_pages;
  bool cache;
  SchedulerOptions options;
  uint32_t seed;
};

struct Request {
  std::vector<int32_t> prompt;
  int64_t max_new_tokens;
  int64_t prefix_match_limit;
};

void Simulate(const SimConfig& config) {
  SCOPED_TRACE(::testing::Message() << "page_size " << config.page_size << " pages "
                                    << config.num_pages << " cache " << config.cache << " seed "
                                    << config.seed);
  std::mt19937 rng(config.seed);
  auto uniform = [&rng](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };

  // Requests: a few shared system prompts, random suffixes, some prompts repeated (n > 1).
  // Each fits the pool alone: prompt <= 70, output <= 30, pool >= 100 usable tokens.
  std::vector<std::vector<int32_t>> bases(4);
  for (auto& base : bases) {
    base.resize(uniform(0, 40));
    for (auto& t : base) t = static_cast<int32_t>(uniform(0, 50));
  }
  std::vector<Request> requests;
  while (requests.size() < 150) {
    Request r;
    r.prompt = bases[uniform(0, 3)];
    const int64_t suffix = uniform(1, 30);
    for (int64_t i = 0; i < suffix; ++i) r.prompt.push_back(static_cast<int32_t>(uniform(0, 50)));
    r.max_new_tokens = uniform(0, 30);
    r.prefix_match_limit = uniform(0, 3) == 0 ? uniform(0, 40) : kNoPrefixMatchLimit;
    const int64_t copies = uniform(0, 3) == 0 ? uniform(2, 4) : 1;
    for (int64_t c = 0; c < copies; ++c) requests.push_back(r);
  }

  KvPagePool pool(config.num_pages, config.page_size);
  ASSERT_GE(pool.num_usable() * config.page_size, 100);
  RadixCache radix(&pool, config.cache);
  Scheduler scheduler(config.options, &pool, &radix);
  FakeEngine engine(&scheduler);

  size_t next = 0;
  std::set<uint64_t> aborted;
  int64_t steps = 0, retractions = 0, idle_steps = 0;
  while (next < requests.size() || !scheduler.idle()) {
    for (int64_t k = uniform(0, 3); k > 0 && next < requests.size(); --k, ++next) {
      const Request& r = requests[next];
      ASSERT_TRUE(scheduler.Add(next, r.prompt, r.max_new_tokens, r.prefix_match_limit).ok());
    }
    if (uniform(0, 49) == 0 && !scheduler.idle()) {  // abort a random live request
      std::vector<uint64_t> live = scheduler.RunningIds();
      std::vector<uint64_t> waiting = scheduler.WaitingIds();
      live.insert(live.end(), waiting.begin(), waiting.end());
      const uint64_t id = live[uniform(0, static_cast<int64_t>(live.size()) - 1)];
      ASSERT_TRUE(scheduler.Finish(id));
      aborted.insert(id);
      scheduler.CheckInvariants();
    }
    Batch batch = engine.Step();
    ASSERT_TRUE(batch.out_of_memory.empty()) << "request " << batch.out_of_memory[0];
    ASSERT_LE(batch.num_tokens, config.options.max_batch_tokens);
    ASSERT_LE(scheduler.num_running(), config.options.max_running_requests);
    retractions += static_cast<int64_t>(batch.retracted.size());
    idle_steps = batch.empty() && !scheduler.idle() ? idle_steps + 1 : 0;
    ASSERT_LT(idle_steps, 3) << "no progress with " << scheduler.num_running() << " running and "
                             << scheduler.num_waiting() << " waiting";
    ASSERT_LT(++steps, 20000) << "deadlock";
  }

  // No request dropped; each produced what it would have alone.
  for (uint64_t id = 0; id < requests.size(); ++id) {
    if (aborted.contains(id)) continue;
    ASSERT_TRUE(engine.outputs().contains(id)) << "request " << id << " never finished";
    EXPECT_EQ(engine.outputs().at(id),
              Generate(requests[id].prompt, requests[id].max_new_tokens))
        << "request " << id;
  }
  int64_t hits = 0;
  for (const auto& [id, cached] : engine.cached_tokens()) hits += cached > 0;
  std::printf("  page_size %lld, %lld pages, cache %d: %lld steps, %lld retractions, "
              "%lld/%zu requests with a prefix hit, %zu aborted\n",
              static_cast<long long>(config.page_size), static_cast<long long>(config.num_pages),
              config.cache, static_cast<long long>(steps), static_cast<long long>(retractions),
              static_cast<long long>(hits), engine.cached_tokens().size(), aborted.size());
  if (config.cache) {
    EXPECT_GT(hits, 0);
  }

  scheduler.CheckInvariants();
  radix.Reset();
  EXPECT_EQ(pool.num_free(), pool.num_usable());
}

SchedulerOptions Options(int64_t running, int64_t prefill, int64_t batch) {
  SchedulerOptions options;
  options.max_running_requests = running;
  options.max_prefill_tokens = prefill;
  options.max_batch_tokens = batch;
  options.max_context_tokens = 4096;
  return options;
}

TEST(SchedulerSimulationTest, TinyPoolPageSizeOne) {
  Simulate({1, 121, true, Options(16, 48, 64), 1});
}

TEST(SchedulerSimulationTest, PageSizeFour) {
  for (uint32_t seed = 2; seed < 5; ++seed) Simulate({4, 33, true, Options(8, 32, 40), seed});
}

TEST(SchedulerSimulationTest, LargePagesAndBigBudgets) {
  Simulate({16, 10, true, Options(256, 8192, 16384), 5});
}

TEST(SchedulerSimulationTest, RoomyPool) {
  Simulate({4, 400, true, Options(32, 128, 256), 6});
}

TEST(SchedulerSimulationTest, CacheDisabled) {
  Simulate({4, 33, false, Options(8, 32, 40), 7});
}

}  // namespace
}  // namespace slime::engine
