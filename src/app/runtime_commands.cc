#include "slime/app/runtime_commands.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <iostream>
#include <mutex>
#include <thread>

#include "CLI/CLI.hpp"
#include "fmt/format.h"
#include "slime/app/cli.h"
#include "slime/comm/accelerator.h"
#include "slime/common/logging.h"
#include "slime/common/signal_watcher.h"
#include "slime/config/config.h"
#include "slime/job/actors.h"
#include "slime/runtime/actor.h"
#include "slime/runtime/agent.h"
#include "slime/runtime/head.h"
#include "slime/runtime/rpc.h"
#include "slime/runtime/worker.h"
#include "spdlog/spdlog.h"

namespace slime::app {

struct RuntimeCommands::Values {
  std::string head, token_file, node_name, bind, actor_id, run_dir, role = "engine", config;
  int fake_gpus = -1, cpu_slots = 4, workers = 4, nodes = 1, max_restarts = 3;
  double heartbeat_interval = 0.5, heartbeat_timeout = 5.0, restart_backoff = 0.5,
         head_lost_timeout = 5.0, wait_timeout = 60.0;
  bool hold = false;
};

namespace {

int Fail(const std::string& command, const std::string& message, int code = kExitFailure) {
  std::cerr << "slime_train " << command << ": error: " << message << "\n";
  return code;
}

StatusOr<std::string> TokenFrom(const std::string& token_file) {
  if (!token_file.empty()) return runtime::ReadTokenFile(token_file);
  const char* env = std::getenv(runtime::kTokenEnv);
  if (env != nullptr && *env != '\0') return std::string(env);
  return absl::InvalidArgumentError(fmt::format(
      "no job token: pass --token-file (the head's <run_dir>/head.json or a file holding the "
      "token) or set {}",
      runtime::kTokenEnv));
}

int RunWorker(const RuntimeCommands::Values& v) {
  SignalWatcher signals;
  if (Status s = InitLogging({.role = v.actor_id}); !s.ok()) {
    return Fail("worker", std::string(s.message()), kExitUsage);
  }
  StatusOr<std::string> token = TokenFrom("");
  if (!token.ok()) return Fail("worker", std::string(token.status().message()), kExitUsage);
  runtime::WorkerOptions options;
  options.head_address = v.head;
  options.actor_id = v.actor_id;
  options.token = *token;
  const char* incarnation = std::getenv(runtime::kIncarnationEnv);
  options.incarnation = incarnation != nullptr ? std::atoll(incarnation) : 1;
  const char* bind = std::getenv(runtime::kBindHostEnv);
  if (bind != nullptr && *bind != '\0') options.bind_host = bind;
  options.registry = &WorkerActorRegistry();
  StatusOr<std::unique_ptr<runtime::Worker>> worker = runtime::Worker::Start(options);
  if (!worker.ok()) return Fail("worker", std::string(worker.status().message()));
  runtime::Worker* w = worker->get();
  signals.SetHandler([w](int sig) {
    if (sig != SIGUSR1) w->RequestStop();
  });
  const int code = w->Run();
  signals.SetHandler(nullptr);
  return code;
}

int RunAgent(const RuntimeCommands::Values& v) {
  SignalWatcher signals;
  if (Status s = InitLogging({.role = "agent"}); !s.ok()) {
    return Fail("agent", std::string(s.message()), kExitUsage);
  }
  StatusOr<std::string> token = TokenFrom(v.token_file);
  if (!token.ok()) return Fail("agent", std::string(token.status().message()), kExitUsage);
  StatusOr<std::pair<std::string, int>> head = runtime::SplitHostPort(v.head);
  if (!head.ok()) return Fail("agent", "--head: " + std::string(head.status().message()), kExitUsage);
  runtime::AgentOptions options;
  options.head_address = v.head;
  options.token = *token;
  options.node_name = v.node_name;
  options.num_cpu_slots = v.cpu_slots;
  if (!v.bind.empty()) {
    options.bind_host = v.bind;
  } else {
    StatusOr<std::string> local = runtime::LocalAddressFor(head->first);
    if (!local.ok()) return Fail("agent", std::string(local.status().message()), kExitUsage);
    options.bind_host = *local;
  }
  int gpus = v.fake_gpus;
  if (const char* env = std::getenv("SLIME_FAKE_GPUS"); gpus < 0 && env != nullptr && *env) {
    gpus = std::atoi(env);
  }
  if (gpus < 0) gpus = comm::QueryAccelerators().cuda_device_count;
  options.num_gpus = gpus;
  StatusOr<std::unique_ptr<runtime::Agent>> agent = runtime::Agent::Start(options);
  if (!agent.ok()) return Fail("agent", std::string(agent.status().message()));
  runtime::Agent* a = agent->get();
  signals.SetHandler([a](int sig) {
    if (sig != SIGUSR1) a->RequestStop();
  });
  const int code = a->Run();
  signals.SetHandler(nullptr);
  return code;
}

int RunStatus(const RuntimeCommands::Values& v) {
  std::string address = v.head, token_file = v.token_file;
  if (!v.run_dir.empty()) {
    StatusOr<runtime::HeadFile> head = runtime::ReadHeadFile(v.run_dir + "/head.json");
    if (!head.ok()) return Fail("status", std::string(head.status().message()), kExitUsage);
    if (address.empty()) address = head->address;
    if (token_file.empty()) token_file = v.run_dir + "/head.json";
  }
  if (address.empty()) return Fail("status", "pass --head HOST:PORT or --run-dir DIR", kExitUsage);
  StatusOr<std::string> token = TokenFrom(token_file);
  if (!token.ok()) return Fail("status", std::string(token.status().message()), kExitUsage);
  if (const StatusOr<runtime::RpcTls>& tls = runtime::ProcessTls(); !tls.ok()) {
    return Fail("status", std::string(tls.status().message()), kExitUsage);
  }
  runtime::RpcOptions rpc{*token};
  auto stub = slime::v1::Head::NewStub(runtime::MakeChannel(address, rpc));
  auto ctx = runtime::MakeContext(*token, std::chrono::seconds(5));
  slime::v1::StatusReply reply;
  grpc::Status s = stub->Status(ctx.get(), slime::v1::StatusRequest(), &reply);
  if (!s.ok()) {
    return Fail("status", std::string(runtime::FromGrpc(s, "head " + address).message()));
  }
  std::cout << runtime::FormatStatus(reply);
  return kExitOk;
}

// Spreads `count` test actors over the nodes' devices, filling node 0 first (PACK).
StatusOr<std::vector<runtime::ActorOptions>> TestActors(
    const std::vector<runtime::NodeResources>& nodes, int count, const std::string& role,
    bool restartable) {
  std::vector<runtime::ActorOptions> out;
  for (const runtime::NodeResources& node : nodes) {
    const bool gpus = node.num_gpus > 0;
    const int devices = gpus ? node.num_gpus : node.num_cpu_slots;
    for (int d = 0; d < devices && static_cast<int>(out.size()) < count; ++d) {
      runtime::ActorOptions o;
      o.rank = static_cast<int>(out.size());
      o.actor_id = fmt::format("{}-{}", role, o.rank);
      o.actor_type = "test";
      o.role = role;
      o.node_name = node.name;
      o.devices = {d};
      o.devices_are_gpus = gpus;
      o.restartable = restartable;
      out.push_back(std::move(o));
    }
  }
  if (static_cast<int>(out.size()) < count) {
    return absl::ResourceExhaustedError(fmt::format(
        "--workers {}: the {} node(s) offer only {} devices", count, nodes.size(), out.size()));
  }
  return out;
}

int RunCheck(const RuntimeCommands::Values& v) {
  SignalWatcher signals;
  if (Status s = InitLogging({.role = "driver", .log_dir = v.run_dir + "/logs"}); !s.ok()) {
    return Fail("runtime-check", std::string(s.message()), kExitUsage);
  }
  if (v.role != "engine" && v.role != "trainer") {
    return Fail("runtime-check", "--role must be engine or trainer", kExitUsage);
  }
  std::string resolved_config = config::ToYaml(config::DefaultConfig());
  if (!v.config.empty()) {
    StatusOr<config::Config> loaded = config::LoadConfig(v.config, {});
    if (!loaded.ok()) return Fail("runtime-check", std::string(loaded.status().message()), kExitUsage);
    resolved_config = config::ToYaml(*loaded);
  }
  runtime::HeadOptions ho;
  ho.bind_host = v.bind.empty() ? "127.0.0.1" : v.bind;
  ho.run_dir = v.run_dir;
  ho.resolved_config = resolved_config;
  ho.head_node_name = v.node_name.empty() ? "head" : v.node_name;
  ho.heartbeat_interval_s = v.heartbeat_interval;
  ho.heartbeat_timeout_s = v.heartbeat_timeout;
  ho.head_lost_timeout_s = v.head_lost_timeout;
  ho.restart_backoff_s = v.restart_backoff;
  ho.max_restarts = v.max_restarts;
  StatusOr<std::unique_ptr<runtime::Head>> head = runtime::Head::Start(ho);
  if (!head.ok()) return Fail("runtime-check", std::string(head.status().message()));
  runtime::Head* h = head->get();
  runtime::AgentOptions ao;
  ao.head_address = h->address();
  ao.token = h->token();
  ao.node_name = ho.head_node_name;
  ao.bind_host = ho.bind_host;
  ao.num_gpus = std::max(0, v.fake_gpus);
  ao.num_cpu_slots = v.cpu_slots;
  StatusOr<std::unique_ptr<runtime::Agent>> agent = runtime::Agent::Start(ao);
  if (!agent.ok()) return Fail("runtime-check", std::string(agent.status().message()));

  std::mutex mu;
  std::condition_variable cv;
  int stop_signal = 0;
  signals.SetHandler([&](int sig) {
    if (sig == SIGUSR1) {
      std::cout << runtime::FormatStatus(h->Snapshot()) << std::flush;
      return;
    }
    std::lock_guard<std::mutex> lock(mu);
    stop_signal = sig;
    cv.notify_all();
  });
  auto finish = [&](int code) {
    signals.SetHandler(nullptr);
    h->Shutdown();
    agent->reset();
    return code;
  };
  const auto wait = std::chrono::milliseconds(static_cast<int64_t>(v.wait_timeout * 1000));
  StatusOr<std::vector<runtime::NodeResources>> nodes = h->WaitForNodes(v.nodes, wait);
  if (!nodes.ok()) return finish(Fail("runtime-check", std::string(nodes.status().message())));
  StatusOr<std::vector<runtime::ActorOptions>> actors =
      TestActors(*nodes, v.workers, v.role, v.role == "engine");
  if (!actors.ok()) return finish(Fail("runtime-check", std::string(actors.status().message()), kExitUsage));
  std::vector<std::string> ids;
  for (const auto& a : *actors) ids.push_back(a.actor_id);
  if (Status s = h->StartActors(*actors); !s.ok()) {
    return finish(Fail("runtime-check", std::string(s.message())));
  }
  if (Status s = h->WaitForActors(ids, wait); !s.ok()) {
    return finish(Fail("runtime-check", std::string(s.message())));
  }
  StatusOr<std::vector<std::string>> replies = h->Group(ids).CallAll("echo", "ping");
  if (!replies.ok()) return finish(Fail("runtime-check", std::string(replies.status().message())));
  std::cout << fmt::format("runtime-check: {} workers alive on {} node(s); echo answered by all\n",
                           ids.size(), nodes->size())
            << runtime::FormatStatus(h->Snapshot()) << std::flush;
  if (!v.hold) return finish(kExitOk);

  std::cout << "runtime-check: holding (Ctrl-C or SIGTERM stops, SIGUSR1 prints the status)\n"
            << std::flush;
  int sig = 0;
  while (true) {
    if (h->WaitForJobFailure(std::chrono::milliseconds(100))) {
      return finish(Fail("runtime-check", "job failed: " + h->failure()));
    }
    std::lock_guard<std::mutex> lock(mu);
    if (stop_signal != 0) {
      sig = stop_signal;
      break;
    }
  }
  spdlog::info("received signal {}; stopping all actors", sig);
  return finish(128 + sig);
}

}  // namespace

const runtime::ActorRegistry& WorkerActorRegistry() {
  static const runtime::ActorRegistry* registry = [] {
    auto* r = new runtime::ActorRegistry();
    Status s = runtime::RegisterTestActor(r);
    if (s.ok()) s = job::RegisterJobActors(r);
    if (!s.ok()) spdlog::error("actor registry: {}", std::string(s.message()));
    return r;
  }();
  return *registry;
}

RuntimeCommands AddRuntimeCommands(CLI::App* cli) {
  static RuntimeCommands::Values values;
  RuntimeCommands c;
  c.values = &values;
  RuntimeCommands::Values& v = values;

  c.agent = cli->add_subcommand("agent", "Run a node agent that joins a job's head");
  c.agent->add_option("--head", v.head, "Head address HOST:PORT")->required();
  c.agent->add_option("--token-file", v.token_file,
                      "The head's <run_dir>/head.json, or a file holding the job token "
                      "(default: $SLIME_JOB_TOKEN)");
  c.agent->add_option("--node-name", v.node_name, "Unique node name (default: host name)");
  c.agent->add_option("--bind", v.bind,
                      "Interface to listen on (default: the one that routes to the head)");
  c.agent->add_option("--fake-gpus", v.fake_gpus,
                      "Offer N GPUs without looking (tests; also $SLIME_FAKE_GPUS)");
  c.agent->add_option("--cpu-slots", v.cpu_slots, "CPU slots offered when there is no GPU");

  c.worker = cli->add_subcommand("worker", "Internal: one actor process (started by an agent)");
  c.worker->add_option("--head", v.head, "Head address HOST:PORT")->required();
  c.worker->add_option("--actor", v.actor_id, "Actor id")->required();

  c.status = cli->add_subcommand("status", "Print a running job's actors, nodes and states");
  c.status->add_option("--head", v.head, "Head address HOST:PORT");
  c.status->add_option("--token-file", v.token_file, "head.json or a token file");
  c.status->add_option("--run-dir", v.run_dir, "The job's run dir (reads its head.json)");

  c.check = cli->add_subcommand("runtime-check",
                                "Internal: start a head with N test actors and call them");
  c.check->group("");  // hidden from --help
  c.check->add_option("--run-dir", v.run_dir, "Run directory")->required();
  c.check->add_option("--workers", v.workers, "Test actors to start");
  c.check->add_option("--role", v.role, "engine (restartable) or trainer");
  c.check->add_option("--nodes", v.nodes, "Nodes to wait for, the head's own included");
  c.check->add_option("--fake-gpus", v.fake_gpus, "GPUs the head node's agent offers");
  c.check->add_option("--cpu-slots", v.cpu_slots, "CPU slots when no GPUs");
  c.check->add_option("--bind", v.bind, "Head interface (default 127.0.0.1)");
  c.check->add_option("--node-name", v.node_name, "The head node's name (default: head)");
  c.check->add_option("--config", v.config, "Job YAML whose resolved form workers receive");
  c.check->add_option("--max-restarts", v.max_restarts, "Restarts per engine actor");
  c.check->add_option("--restart-backoff", v.restart_backoff, "First restart delay (s)");
  c.check->add_option("--heartbeat-interval", v.heartbeat_interval, "Seconds");
  c.check->add_option("--heartbeat-timeout", v.heartbeat_timeout, "Seconds");
  c.check->add_option("--head-lost-timeout", v.head_lost_timeout, "Seconds");
  c.check->add_option("--wait-timeout", v.wait_timeout, "Seconds to wait for nodes and actors");
  c.check->add_flag("--hold", v.hold, "Keep the job up until a signal or a failure");
  return c;
}

int RunRuntimeCommand(const RuntimeCommands& c) {
  if (c.agent->parsed()) return RunAgent(*c.values);
  if (c.worker->parsed()) return RunWorker(*c.values);
  if (c.status->parsed()) return RunStatus(*c.values);
  if (c.check->parsed()) return RunCheck(*c.values);
  return -1;
}

}  // namespace slime::app
