// runtime_bench: how fast the actor runtime starts workers and answers actor calls.
//
// One head and its in-process node agent (fake GPUs), N real `slime_train worker` processes of
// the built-in `test` actor type. Measures:
//   - start: StartActors -> all N registered (fork + exec + gRPC server + RegisterWorker);
//   - echo round trip to one actor, sequential calls (p50 / p99 / mean);
//   - group call: echo to all N at once, waiting for every reply (p50 / p99);
//   - 64 KiB payload echo round trip (p50 / p99).
// Prints one table. Usage: runtime_bench [--workers 16] [--calls 2000] [--binary PATH]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "fmt/format.h"
#include "slime/runtime/agent.h"
#include "slime/runtime/head.h"

namespace {

using Clock = std::chrono::steady_clock;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

struct Stats {
  double p50 = 0, p99 = 0, mean = 0;
};

Stats Summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  Stats s;
  s.p50 = v[v.size() / 2];
  s.p99 = v[std::min(v.size() - 1, v.size() * 99 / 100)];
  for (double x : v) s.mean += x;
  s.mean /= static_cast<double>(v.size());
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  int workers = 16, calls = 2000;
  std::string binary = SLIME_TRAIN_BIN_DEFAULT;
  CLI::App app{"runtime_bench"};
  app.add_option("--workers", workers, "Worker processes to start");
  app.add_option("--calls", calls, "Sequential calls per latency row");
  app.add_option("--binary", binary, "slime_train binary the agent re-executes");
  CLI11_PARSE(app, argc, argv);

  using namespace slime::runtime;
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("slime_runtime_bench_" + std::to_string(::getpid())))
                              .string();
  HeadOptions ho;
  ho.run_dir = dir;
  ho.head_node_name = "n0";
  auto head = Head::Start(ho);
  if (!head.ok()) {
    fmt::print(stderr, "head: {}\n", std::string(head.status().message()));
    return 1;
  }
  AgentOptions ao;
  ao.head_address = (*head)->address();
  ao.token = (*head)->token();
  ao.node_name = "n0";
  ao.num_gpus = workers;
  ao.worker_binary = binary;
  auto agent = Agent::Start(ao);
  if (!agent.ok()) {
    fmt::print(stderr, "agent: {}\n", std::string(agent.status().message()));
    return 1;
  }
  std::vector<ActorOptions> actors;
  std::vector<std::string> ids;
  for (int i = 0; i < workers; ++i) {
    ActorOptions o;
    o.actor_id = fmt::format("bench-{}", i);
    o.actor_type = "test";
    o.role = "engine";
    o.rank = i;
    o.node_name = "n0";
    o.devices = {i};
    actors.push_back(o);
    ids.push_back(o.actor_id);
  }
  const auto t0 = Clock::now();
  if (auto s = (*head)->StartActors(actors); !s.ok()) return 1;
  if (auto s = (*head)->WaitForActors(ids, std::chrono::seconds(300)); !s.ok()) {
    fmt::print(stderr, "{}\n", std::string(s.message()));
    return 1;
  }
  const double start_ms = Ms(Clock::now() - t0);

  ActorHandle one = (*head)->Handle(ids[0]);
  ActorGroup group = (*head)->Group(ids);
  auto measure = [&](int n, const std::function<bool()>& call) {
    std::vector<double> v;
    for (int i = 0; i < 50; ++i) call();  // warm-up
    for (int i = 0; i < n; ++i) {
      const auto t = Clock::now();
      if (!call()) return Stats{-1, -1, -1};
      v.push_back(Ms(Clock::now() - t));
    }
    return Summarize(v);
  };
  const Stats echo = measure(calls, [&] { return one.Call("echo", "ping").ok(); });
  const std::string big(64 << 10, 'x');
  const Stats echo_big = measure(calls / 4, [&] { return one.Call("echo", big).ok(); });
  const Stats fan = measure(calls / 8, [&] { return group.CallAll("echo", "ping").ok(); });

  fmt::print("| measurement | value |\n|---|---:|\n");
  fmt::print("| start + register {} workers (ms) | {:.0f} |\n", workers, start_ms);
  fmt::print("| echo 4 B, sequential: p50 / p99 / mean (ms) | {:.3f} / {:.3f} / {:.3f} |\n",
             echo.p50, echo.p99, echo.mean);
  fmt::print("| echo 64 KiB, sequential: p50 / p99 (ms) | {:.3f} / {:.3f} |\n", echo_big.p50,
             echo_big.p99);
  fmt::print("| group echo to all {} workers: p50 / p99 (ms) | {:.3f} / {:.3f} |\n", workers,
             fan.p50, fan.p99);
  (*head)->Shutdown();
  agent->reset();
  std::filesystem::remove_all(dir);
  return 0;
}
