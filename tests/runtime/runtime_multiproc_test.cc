// Multi-process tests of the runtime: real `slime_train worker` processes started by agents,
// agents as `slime_train agent` processes, the head inside `slime_train runtime-check`, and
// failure injection (kill -9 of workers and of the head, SIGSTOP, SIGTERM). Ports are bound to
// 0, every test has its own temp dir, and every process a test starts is killed at its end.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "../app/slime_binary.h"
#include "slime/metrics/registry.h"
#include "slime/runtime/agent.h"
#include "slime/runtime/head.h"
#include "slime/runtime/rpc.h"

namespace slime::runtime {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

std::string TempDir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() /
             ("slime_mp_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Dead or a zombie.
bool Gone(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return true;
  std::string line;
  std::getline(stat, line);
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'Z';
}

bool WaitUntil(const std::function<bool()>& pred, std::chrono::milliseconds timeout) {
  const auto end = Clock::now() + timeout;
  while (Clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return pred();
}

// `slime_train <args>` in its own process group, output to a file; killed at destruction.
class Child {
 public:
  Child(const std::vector<std::string>& args, const std::string& out_path) : out_(out_path) {
    std::vector<std::string> argv_s = {slime::testing::TrainBin()};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setpgid(0, 0);
      const int fd = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::setpgid(pid_, pid_);
  }
  ~Child() {
    if (!reaped_) {
      ::kill(-pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  int pid() const { return pid_; }
  std::string Output() const { return ReadFile(out_); }
  bool WaitForOutput(const std::string& text, std::chrono::milliseconds timeout) {
    return WaitUntil([&] { return Output().find(text) != std::string::npos || Exited(); },
                     timeout) &&
           Output().find(text) != std::string::npos;
  }
  bool Exited() {
    if (reaped_) return true;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      reaped_ = true;
      status_ = status;
    }
    return reaped_;
  }
  // Exit code, or 128+signal; -1 if it did not end within `timeout`.
  int Wait(std::chrono::milliseconds timeout) {
    if (!WaitUntil([&] { return Exited(); }, timeout)) return -1;
    return WIFEXITED(status_) ? WEXITSTATUS(status_) : 128 + WTERMSIG(status_);
  }

 private:
  int pid_ = -1;
  std::string out_;
  bool reaped_ = false;
  int status_ = 0;
};

// Pids in the status table lines of `actor_prefix`.
std::vector<int> PidsFromStatus(const std::string& text, const std::string& actor_prefix) {
  std::vector<int> pids;
  std::istringstream in(text);
  std::string line;
  std::set<std::string> seen;
  while (std::getline(in, line)) {
    if (line.rfind(actor_prefix, 0) != 0) continue;
    std::istringstream f(line);
    std::string id, role, rank, node, devices, state, pid;
    f >> id >> role >> rank >> node >> devices >> state >> pid;
    if (state == "alive" && seen.insert(id).second) pids.push_back(std::stoi(pid));
  }
  return pids;
}

std::map<std::string, std::string> ParseInfo(const std::string& text) {
  std::map<std::string, std::string> kv;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq != std::string::npos) kv[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return kv;
}

std::string Fnv(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// A head in this process with an in-process agent "n0" whose workers are the real binary.
struct Cluster {
  std::string dir;
  std::unique_ptr<Head> head;
  std::unique_ptr<Agent> agent;

  explicit Cluster(const std::string& name, int gpus, HeadOptions options = {}) {
    dir = TempDir(name);
    options.run_dir = dir;
    options.head_node_name = "n0";
    options.resolved_config = "cluster:\n  run_dir: " + dir + "\n";
    if (options.heartbeat_interval_s == 1.0) options.heartbeat_interval_s = 0.2;
    if (options.heartbeat_timeout_s == 10.0) options.heartbeat_timeout_s = 2.0;
    options.head_lost_timeout_s = 2.0;
    auto h = Head::Start(options);
    EXPECT_TRUE(h.ok()) << h.status();
    head = *std::move(h);
    AgentOptions ao;
    ao.head_address = head->address();
    ao.token = head->token();
    ao.node_name = "n0";
    ao.num_gpus = gpus;
    ao.worker_binary = slime::testing::TrainBin();
    auto a = Agent::Start(ao);
    EXPECT_TRUE(a.ok()) << a.status();
    agent = *std::move(a);
  }
  ~Cluster() {
    head->Shutdown();
    agent.reset();
    std::filesystem::remove_all(dir);
  }

  std::vector<std::string> StartTest(int n, const std::string& role, bool restartable) {
    std::vector<ActorOptions> actors;
    std::vector<std::string> ids;
    for (int i = 0; i < n; ++i) {
      ActorOptions o;
      o.actor_id = role + "-" + std::to_string(i);
      o.actor_type = "test";
      o.role = role;
      o.rank = i;
      o.node_name = "n0";
      o.devices = {i};
      o.restartable = restartable;
      actors.push_back(o);
      ids.push_back(o.actor_id);
    }
    EXPECT_TRUE(head->StartActors(actors).ok());
    Status s = head->WaitForActors(ids, 60s);
    EXPECT_TRUE(s.ok()) << s;
    return ids;
  }

  slime::v1::ActorStatus StatusOf(const std::string& id) {
    const slime::v1::StatusReply status = head->Snapshot();
    for (const auto& a : status.actors()) {
      if (a.actor_id() == id) return a;
    }
    return {};
  }
};

TEST(RuntimeMultiprocTest, PlacesColocatedAndDisaggregatedLayoutsOnTwoAgents) {
  for (const bool colocate : {false, true}) {
    SCOPED_TRACE(colocate ? "colocated" : "disaggregated");
    Cluster c(colocate ? "colo" : "disagg", 4);
    // The second node is a real `slime_train agent` process with 4 fake GPUs.
    Child remote({"agent", "--head", c.head->address(), "--token-file", c.dir + "/head.json",
                  "--node-name", "n1", "--fake-gpus", "4", "--bind", "127.0.0.1"},
                 c.dir + "/agent-n1.out");
    auto nodes = c.head->WaitForNodes(2, 60s);
    ASSERT_TRUE(nodes.ok()) << nodes.status() << remote.Output();
    PlacementRequest req;
    req.colocate = colocate;
    if (colocate) {  // trainer on all 8 GPUs, engines of 2 GPUs on the same GPUs
      req.actor_num_nodes = 2;
      req.actor_num_gpus_per_node = 4;
      req.rollout_num_gpus = 8;
    } else {  // trainer on n0, engines of 2 GPUs on n1
      req.actor_num_gpus_per_node = 4;
      req.rollout_num_gpus = 4;
    }
    req.rollout_num_gpus_per_engine = 2;
    auto plan = PlanPlacement(req, *nodes);
    ASSERT_TRUE(plan.ok()) << plan.status();
    std::vector<ActorOptions> actors =
        ActorsFromPlan(*plan, [](const std::string&) { return std::string("test"); });
    std::vector<std::string> ids;
    for (const auto& a : actors) ids.push_back(a.actor_id);
    ASSERT_TRUE(c.head->StartActors(actors).ok());
    Status s = c.head->WaitForActors(ids, 120s);
    ASSERT_TRUE(s.ok()) << s << "\n" << FormatStatus(c.head->Snapshot());

    auto replies = c.head->Group(ids).CallAll("info", "", {60s});
    ASSERT_TRUE(replies.ok()) << replies.status();
    std::set<std::string> trainer_devices, engine_devices;
    for (size_t i = 0; i < ids.size(); ++i) {
      auto info = ParseInfo((*replies)[i]);
      const ActorOptions& a = actors[i];
      std::string want;
      for (int d : a.devices) want += (want.empty() ? "" : ",") + std::to_string(d);
      EXPECT_EQ(info["actor_id"], a.actor_id);
      EXPECT_EQ(info["node"], a.node_name);
      EXPECT_EQ(info["cuda_visible_devices"], want) << a.actor_id;
      // Every process received the same resolved config.
      EXPECT_EQ(info["config_fnv"], Fnv("cluster:\n  run_dir: " + c.dir + "\n"));
      for (int d : a.devices) {
        (a.role == "engine" ? engine_devices : trainer_devices).insert(a.node_name + ":" + std::to_string(d));
      }
    }
    EXPECT_EQ(trainer_devices.size(), colocate ? 8u : 4u);
    EXPECT_EQ(engine_devices.size(), colocate ? 8u : 4u);
    if (colocate) {
      EXPECT_EQ(trainer_devices, engine_devices);
    } else {
      for (const auto& d : engine_devices) EXPECT_EQ(trainer_devices.count(d), 0u) << d;
      for (const auto& d : engine_devices) EXPECT_EQ(d.substr(0, 3), "n1:");
    }
    // Per-actor log files exist in the run dir.
    EXPECT_TRUE(std::filesystem::exists(c.dir + "/logs/" + ids.back() + ".log"));
    c.head->Shutdown();
    EXPECT_EQ(remote.Wait(15s), 1) << remote.Output();  // the head went away
  }
}

TEST(RuntimeMultiprocTest, CallsEightWorkersWithRequestIdsAndDeadlines) {
  Cluster c("eight", 8);
  std::vector<std::string> ids = c.StartTest(8, "engine", true);
  ActorGroup group = c.head->Group(ids);
  auto echo = group.CallAll("echo", "ping");
  ASSERT_TRUE(echo.ok()) << echo.status();
  for (const auto& r : *echo) EXPECT_EQ(r, "ping");
  std::vector<std::string> payloads;
  for (int i = 0; i < 8; ++i) payloads.push_back("rank" + std::to_string(i));
  auto futures = group.CallEachAsync("echo", payloads);
  auto each = WaitAll(futures);
  ASSERT_TRUE(each.ok());
  EXPECT_EQ(*each, payloads);

  // An actor method's own error comes back with its code and message.
  auto fail = group[0].Call("fail", "bad thing");
  EXPECT_EQ(fail.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(fail.status().message()), HasSubstr("bad thing"));
  auto unknown = group[0].Call("nope", "");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);

  // A call that outlives its deadline fails cleanly and promptly; the actor stays usable.
  const auto start = Clock::now();
  auto slow = group[1].Call("sleep", "3000", {300ms});
  EXPECT_EQ(slow.status().code(), absl::StatusCode::kDeadlineExceeded) << slow.status();
  EXPECT_LT(Clock::now() - start, 2s);
  auto after = group[1].Call("echo", "still here", {20s});
  EXPECT_TRUE(after.ok()) << after.status();

  // The same request id twice runs the method once; a new id runs it again.
  auto endpoint = c.head->Resolve(ids[2]);
  ASSERT_TRUE(endpoint.ok());
  auto raw_call = [&](const std::string& request_id, bool with_token) {
    slime::v1::CallRequest req;
    req.set_method("count");
    req.set_request_id(request_id);
    slime::v1::CallReply reply;
    auto ctx = MakeContext(with_token ? c.head->token() : "wrong", 10s);
    grpc::Status s = endpoint->stub->Call(ctx.get(), req, &reply);
    return std::make_pair(s, reply.payload());
  };
  auto first = raw_call("req-1", true);
  auto retry = raw_call("req-1", true);
  auto next = raw_call("req-2", true);
  ASSERT_TRUE(first.first.ok() && retry.first.ok() && next.first.ok());
  EXPECT_EQ(first.second, "1");
  EXPECT_EQ(retry.second, "1");
  EXPECT_EQ(next.second, "2");
  // Workers reject calls without the job token.
  EXPECT_EQ(raw_call("req-3", false).first.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(raw_call("req-4", true).second, "3");
}

TEST(RuntimeMultiprocTest, KilledEngineIsRestartedOnTheSameBundle) {
  metrics::Registry registry;
  HeadOptions options;
  options.max_restarts = 2;
  options.restart_backoff_s = 0.2;
  options.metrics = &registry;
  Cluster c("restart", 2, options);
  std::vector<std::string> ids = c.StartTest(2, "engine", true);
  const int old_pid = c.StatusOf("engine-1").pid();
  ASSERT_GT(old_pid, 0);
  ASSERT_EQ(::kill(old_pid, SIGKILL), 0);
  ASSERT_TRUE(WaitUntil([&] {
    auto a = c.StatusOf("engine-1");
    return a.state() == "alive" && a.restarts() == 1;
  }, 30s)) << FormatStatus(c.head->Snapshot());
  auto a = c.StatusOf("engine-1");
  EXPECT_NE(a.pid(), old_pid);
  EXPECT_EQ(a.incarnation(), 2);
  EXPECT_THAT(a.last_exit(), HasSubstr("SIGKILL"));
  EXPECT_FALSE(c.head->job_failed());
  auto info = c.head->Handle("engine-1").Call("info", "");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(ParseInfo(*info)["cuda_visible_devices"], "1");  // the same bundle
  EXPECT_EQ(ParseInfo(*info)["incarnation"], "2");
  const std::string metrics = registry.Exposition();
  EXPECT_THAT(metrics, HasSubstr("slime_runtime_actor_restarts_total{actor=\"engine-1\",node=\"n0\",role=\"engine\"} 1"));
  EXPECT_THAT(metrics, HasSubstr("slime_runtime_actor_state{actor=\"engine-1\",node=\"n0\",role=\"engine\"} 2"));
  EXPECT_TRUE(Gone(old_pid));
}

TEST(RuntimeMultiprocTest, EngineCrashingPastTheRestartCapFailsTheJob) {
  HeadOptions options;
  options.max_restarts = 1;
  options.restart_backoff_s = 0.1;
  Cluster c("cap", 1, options);
  c.StartTest(1, "engine", true);
  auto h = c.head->Handle("engine-0");
  // No retry: a retried "crash" would crash the restarted process too (request ids are
  // de-duplicated per process, not across restarts).
  const CallOptions once{2s, /*retry_unavailable=*/false};
  (void)h.Call("crash", "7", once);
  ASSERT_TRUE(WaitUntil([&] { return c.StatusOf("engine-0").state() == "alive" &&
                                     c.StatusOf("engine-0").restarts() == 1; }, 30s));
  (void)h.Call("crash", "7", once);
  ASSERT_TRUE(c.head->WaitForJobFailure(30s));
  EXPECT_THAT(c.head->failure(), HasSubstr("actor engine-0"));
  EXPECT_THAT(c.head->failure(), HasSubstr("exited with code 7"));
  EXPECT_THAT(c.head->failure(), HasSubstr("restarted 1 time(s) already"));
}

TEST(RuntimeMultiprocTest, KilledTrainerFailsTheJobWithAClearMessage) {
  std::string failure_seen;
  std::mutex mu;
  HeadOptions options;
  options.on_failure = [&](const std::string& f) {
    std::lock_guard<std::mutex> lock(mu);
    failure_seen = f;
  };
  Cluster c("trainer", 2, options);
  c.StartTest(2, "trainer", false);
  const int pid = c.StatusOf("trainer-1").pid();
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  ASSERT_TRUE(c.head->WaitForJobFailure(10s));
  const std::string failure = c.head->failure();
  EXPECT_THAT(failure, HasSubstr("actor trainer-1"));
  EXPECT_THAT(failure, HasSubstr("node n0"));
  EXPECT_THAT(failure, HasSubstr("pid " + std::to_string(pid) + " killed by signal 9 (SIGKILL)"));
  EXPECT_THAT(failure, HasSubstr("trainer actors are not restartable"));
  EXPECT_EQ(c.StatusOf("trainer-1").state(), "dead");
  EXPECT_EQ(c.head->Snapshot().job_state(), "failed");
  ASSERT_TRUE(WaitUntil([&] {
    std::lock_guard<std::mutex> lock(mu);
    return !failure_seen.empty();
  }, 5s));
  // Calls to the dead actor fail at once instead of hanging.
  auto r = c.head->Handle("trainer-1").Call("echo", "x", {10s});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("dead"));
}

// A node whose agent goes away (no heartbeats) takes its actors with it; placement is fixed, so
// even a restartable actor there has nowhere to go: the job fails within the heartbeat timeout,
// naming the node, without spending restarts on it.
TEST(RuntimeMultiprocTest, ALostNodeFailsTheJobNamingItWithoutRestarts) {
  HeadOptions options;
  options.max_restarts = 5;
  options.restart_backoff_s = 0.1;
  Cluster c("lostnode", 1, options);
  AgentOptions ao;
  ao.head_address = c.head->address();
  ao.token = c.head->token();
  ao.node_name = "n1";
  ao.num_gpus = 1;
  ao.worker_binary = slime::testing::TrainBin();
  auto n1 = Agent::Start(ao);
  ASSERT_TRUE(n1.ok()) << n1.status();
  ASSERT_TRUE(c.head->WaitForNodes(2, 10s).ok());
  ActorOptions engine;
  engine.actor_id = "engine-0";
  engine.actor_type = "test";
  engine.role = "engine";
  engine.node_name = "n1";
  engine.devices = {0};
  engine.restartable = true;
  ASSERT_TRUE(c.head->StartActors({engine}).ok());
  ASSERT_TRUE(c.head->WaitForActors({"engine-0"}, 60s).ok()) << FormatStatus(c.head->Snapshot());
  const auto lost_at = std::chrono::steady_clock::now();
  n1->reset();  // the agent goes away: its heartbeats stop (heartbeat timeout 2 s)
  ASSERT_TRUE(c.head->WaitForJobFailure(10s)) << FormatStatus(c.head->Snapshot());
  EXPECT_LT(std::chrono::steady_clock::now() - lost_at, 2s + 1500ms);
  const std::string failure = c.head->failure();
  EXPECT_THAT(failure, HasSubstr("actor engine-0"));
  EXPECT_THAT(failure, HasSubstr("its node n1 was lost (no agent heartbeat for "));
  EXPECT_THAT(failure, HasSubstr("its node n1 is lost and no other node has its devices"));
  EXPECT_EQ(c.StatusOf("engine-0").restarts(), 0);
}

TEST(RuntimeMultiprocTest, HungWorkerIsDetectedAndReplaced) {
  HeadOptions options;
  options.heartbeat_interval_s = 0.1;
  options.heartbeat_timeout_s = 1.0;
  options.restart_backoff_s = 0.1;
  Cluster c("hung", 1, options);
  c.StartTest(1, "engine", true);
  const int pid = c.StatusOf("engine-0").pid();
  const auto start = Clock::now();
  ASSERT_EQ(::kill(pid, SIGSTOP), 0);
  ASSERT_TRUE(WaitUntil([&] { return c.StatusOf("engine-0").restarts() == 1; }, 10s));
  EXPECT_LT(Clock::now() - start, 4s);
  EXPECT_THAT(c.StatusOf("engine-0").last_exit(), HasSubstr("no heartbeat"));
  ASSERT_TRUE(WaitUntil([&] { return c.StatusOf("engine-0").state() == "alive"; }, 30s));
  EXPECT_TRUE(WaitUntil([&] { return Gone(pid); }, 5s));  // the hung process was killed
  EXPECT_TRUE(c.head->Handle("engine-0").Call("echo", "x").ok());
}

// Head::KillActor: a caller (the driver's engine health checks) kills a live but unusable
// process; the head restarts it like any lost engine, and a stale incarnation is refused.
TEST(RuntimeMultiprocTest, KillActorRestartsARestartableActorAndRefusesStaleIncarnations) {
  HeadOptions options;
  options.restart_backoff_s = 0.1;
  Cluster c("kill_actor", 1, options);
  c.StartTest(1, "engine", true);
  const auto before = c.StatusOf("engine-0");
  ASSERT_TRUE(c.head->KillActor("engine-0", before.incarnation(), "failed its health check").ok());
  ASSERT_TRUE(WaitUntil([&] {
    auto a = c.StatusOf("engine-0");
    return a.state() == "alive" && a.restarts() == 1;
  }, 30s)) << FormatStatus(c.head->Snapshot());
  EXPECT_THAT(c.StatusOf("engine-0").last_exit(), HasSubstr("failed its health check"));
  EXPECT_TRUE(WaitUntil([&] { return Gone(before.pid()); }, 5s));
  EXPECT_FALSE(c.head->job_failed());
  Status stale = c.head->KillActor("engine-0", before.incarnation(), "again");
  EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition) << stale;
  EXPECT_EQ(c.StatusOf("engine-0").restarts(), 1);
  EXPECT_EQ(c.head->KillActor("engine-9", 1, "x").code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(c.head->Handle("engine-0").Call("echo", "x").ok());
}

TEST(RuntimeMultiprocTest, KilledHeadTakesEveryWorkerDown) {
  const std::string dir = TempDir("killhead");
  Child head({"runtime-check", "--run-dir", dir, "--workers", "6", "--nodes", "2",
              "--fake-gpus", "4", "--hold", "--heartbeat-interval", "0.2",
              "--heartbeat-timeout", "2", "--head-lost-timeout", "2"},
             dir + "/head.out");
  ASSERT_TRUE(WaitUntil([&] { return std::filesystem::exists(dir + "/head.json"); }, 60s))
      << head.Output();
  auto file = ReadHeadFile(dir + "/head.json");
  ASSERT_TRUE(file.ok());
  Child remote({"agent", "--head", file->address, "--token-file", dir + "/head.json",
                "--node-name", "n1", "--fake-gpus", "4", "--bind", "127.0.0.1"},
               dir + "/agent.out");
  ASSERT_TRUE(head.WaitForOutput("holding", 120s)) << head.Output() << remote.Output();
  // The status subcommand shows the same table.
  auto status = slime::testing::RunSlimeTrain("status --run-dir '" + dir + "'");
  EXPECT_EQ(status.exit_code, 0) << status.err;
  EXPECT_THAT(status.out, HasSubstr("job: running"));
  std::vector<int> pids = PidsFromStatus(head.Output(), "engine-");
  ASSERT_EQ(pids.size(), 6u) << head.Output();

  ASSERT_EQ(::kill(head.pid(), SIGKILL), 0);
  EXPECT_EQ(head.Wait(5s), 128 + SIGKILL);
  // Head-node workers die with it (death signal); the remote agent notices the lost head,
  // kills its workers and exits with 1.
  EXPECT_TRUE(WaitUntil([&] {
    for (int p : pids) {
      if (!Gone(p)) return false;
    }
    return true;
  }, 10s));
  EXPECT_EQ(remote.Wait(10s), 1) << remote.Output();
  EXPECT_THAT(remote.Output(), HasSubstr("lost the head"));
  std::filesystem::remove_all(dir);
}

TEST(RuntimeMultiprocTest, SigtermStopsAllActorsAndReportsIt) {
  const std::string dir = TempDir("sigterm");
  Child head({"runtime-check", "--run-dir", dir, "--workers", "3", "--fake-gpus", "3", "--hold"},
             dir + "/head.out");
  ASSERT_TRUE(head.WaitForOutput("holding", 120s)) << head.Output();
  std::vector<int> pids = PidsFromStatus(head.Output(), "engine-");
  ASSERT_EQ(pids.size(), 3u);
  // With a wrong token the status view is refused.
  auto file = ReadHeadFile(dir + "/head.json");
  ASSERT_TRUE(file.ok());
  std::ofstream(dir + "/wrong") << "wrong-token\n";
  auto refused = slime::testing::RunSlimeTrain("status --head " + file->address +
                                               " --token-file '" + dir + "/wrong'");
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_THAT(refused.err, HasSubstr("wrong job token"));
  ASSERT_EQ(::kill(head.pid(), SIGTERM), 0);
  EXPECT_EQ(head.Wait(20s), 128 + SIGTERM) << head.Output();
  for (int p : pids) EXPECT_TRUE(Gone(p)) << p;
  std::filesystem::remove_all(dir);
}

TEST(RuntimeMultiprocTest, RuntimeCheckTrainerCrashFailsWithExitCodeOne) {
  const std::string dir = TempDir("checkfail");
  Child head({"runtime-check", "--run-dir", dir, "--workers", "2", "--role", "trainer",
              "--fake-gpus", "2", "--hold"},
             dir + "/head.out");
  ASSERT_TRUE(head.WaitForOutput("holding", 120s)) << head.Output();
  std::vector<int> pids = PidsFromStatus(head.Output(), "trainer-");
  ASSERT_EQ(pids.size(), 2u);
  ::kill(pids[0], SIGKILL);
  EXPECT_EQ(head.Wait(20s), 1) << head.Output();
  EXPECT_THAT(head.Output(), HasSubstr("job failed: actor trainer-0"));
  EXPECT_TRUE(WaitUntil([&] { return Gone(pids[1]); }, 5s));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace slime::runtime
