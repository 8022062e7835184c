#include "slime/agent/agent_generator.h"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "fmt/format.h"
#include "spdlog/spdlog.h"
#include "subprocess.h"

extern char** environ;

namespace slime::agent {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// How often the owner loop checks the process, the deadline and the abort flag while no call
// arrives (calls themselves wake it at once).
constexpr std::chrono::milliseconds kPollInterval(20);

std::string ReadTail(const std::string& path, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  const std::streamoff start = size > static_cast<std::streamoff>(max_bytes)
                                   ? size - static_cast<std::streamoff>(max_bytes)
                                   : 0;
  in.seekg(start);
  std::string tail((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (start > 0) tail = "..." + tail;
  return tail;
}

// The sample returned when there is no trajectory to train on (no call made, or cut short).
data::Sample Outcome(const data::Sample& input, data::SampleStatus status,
                     const std::string& error) {
  data::Sample s = input;
  s.status = status;
  if (!error.empty()) s.metadata["agent_error"] = error;
  return s;
}

class AgentGenerator : public rollout::CustomGenerator {
 public:
  AgentGenerator(AgentOptions options, std::unique_ptr<AgentSessionServer> server)
      : options_(std::move(options)), server_(std::move(server)) {
    std::random_device rd;
    salt_ = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }

  std::string kind() const override { return "agent"; }

  StatusOr<rollout::CustomGenerateResult> Generate(const data::Sample& sample,
                                                   rollout::EngineSession* engine) override {
    const uint64_t n = counter_.fetch_add(1);
    const std::string id =
        fmt::format("{}-{}-{:06x}", sample.index, n, (salt_ ^ (n * 0x9e3779b97f4a7c15ULL)) & 0xffffff);
    SLIME_ASSIGN_OR_RETURN(std::shared_ptr<AgentSession> session,
                           server_->Open(id, engine, options_.max_turns));
    StatusOr<rollout::CustomGenerateResult> result = RunAgent(sample, engine, session);
    server_->Close(id);
    return result;
  }

  const AgentSessionServer& server() const { return *server_; }

 private:
  StatusOr<rollout::CustomGenerateResult> RunAgent(const data::Sample& sample,
                                                   rollout::EngineSession* engine,
                                                   const std::shared_ptr<AgentSession>& session) {
    internal::ChildSpec spec;
    spec.command = options_.command;
    spec.working_dir = options_.working_dir;
    std::map<std::string, std::string> env;
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
      std::string kv(*e);
      size_t eq = kv.find('=');
      if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    for (const auto& [k, v] : options_.env) env[k] = v;
    env["OPENAI_BASE_URL"] = session->base_url();
    env["OPENAI_API_KEY"] = "slime";
    env["SLIME_SESSION_ID"] = session->id();
    env["SLIME_PROMPT"] = sample.prompt.dump();
    env["SLIME_LABEL"] = sample.label;
    env["SLIME_METADATA"] = sample.metadata.dump();
    for (const auto& [k, v] : env) spec.env.push_back(k + "=" + v);

    // stderr: kept in the log dir, or a private temporary file removed afterwards.
    std::string stderr_path;
    bool remove_stderr = false;
    if (!options_.log_dir.empty()) {
      std::error_code ec;
      fs::create_directories(options_.log_dir, ec);
      spec.stdout_path = (fs::path(options_.log_dir) / ("agent-" + session->id() + ".log")).string();
      stderr_path =
          (fs::path(options_.log_dir) / ("agent-" + session->id() + ".stderr.log")).string();
    } else {
      stderr_path = (fs::temp_directory_path() /
                     fmt::format("slime-agent-{}-{}.stderr", ::getpid(), session->id()))
                        .string();
      remove_stderr = true;
    }
    spec.stderr_path = stderr_path;
    struct Cleanup {
      std::string path;
      ~Cleanup() {
        if (!path.empty()) {
          std::error_code ec;
          fs::remove(path, ec);
        }
      }
    } cleanup{remove_stderr ? stderr_path : ""};

    SLIME_ASSIGN_OR_RETURN(std::unique_ptr<internal::ChildProcess> child,
                           internal::ChildProcess::Spawn(spec));
    const auto start = Clock::now();
    const auto deadline =
        start + std::chrono::duration_cast<Clock::duration>(
                    std::chrono::duration<double>(options_.timeout_s));
    enum class End { kExited, kTimeout, kAborted, kTurnLimit } end = End::kExited;
    int wait_status = 0;
    while (true) {
      session->Serve(kPollInterval);
      if (session->turn_limit_hit()) {  // before Poll: the refused agent may exit 1 at once
        child->Kill();
        end = End::kTurnLimit;
        break;
      }
      if (child->Poll(&wait_status)) break;
      if (engine->aborting()) {
        child->Kill();
        end = End::kAborted;
        break;
      }
      if (Clock::now() >= deadline) {
        child->Kill();
        end = End::kTimeout;
        break;
      }
    }
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    const std::vector<AgentTurn> turns = session->turns();
    SLIME_RETURN_IF_ERROR(session->engine_error());

    const tokenizer::Tokenizer& tok = server_->tokenizer();
    DecodeFn decode = [&tok](std::span<const int32_t> ids) { return tok.Decode(ids, false); };
    SLIME_ASSIGN_OR_RETURN(std::vector<data::Sample> segments,
                           BuildSegments(sample, turns, decode));
    rollout::CustomGenerateResult result;
    auto finish_all = [&](data::SampleStatus status, const std::string& error) {
      if (segments.empty()) segments.push_back(Outcome(sample, status, error));
      for (auto& s : segments) {
        s.status = status;
        if (!error.empty()) s.metadata["agent_error"] = error;
      }
    };
    if (end == End::kAborted) {
      finish_all(data::SampleStatus::kAborted, "");
    } else if (end == End::kTurnLimit) {
      segments.back().status = data::SampleStatus::kTruncated;  // max_turns >= 1: not empty
    } else if (end == End::kTimeout) {
      std::string error = fmt::format(
          "agent command `{}` did not finish within {} s (session {}, {} model calls); its "
          "process group was killed",
          options_.command, options_.timeout_s, session->id(), turns.size());
      spdlog::warn("agent: sample {}: {}", sample.index, error);
      finish_all(data::SampleStatus::kFailed, error);
    } else if (!WIFEXITED(wait_status) || WEXITSTATUS(wait_status) != 0) {
      std::string tail = ReadTail(stderr_path, options_.stderr_tail_bytes);
      return absl::InternalError(fmt::format(
          "agent command `{}` failed with {} after {:.1f} s (session {}, {} model calls); "
          "stderr tail:\n{}",
          options_.command, internal::DescribeWaitStatus(wait_status), elapsed, session->id(),
          turns.size(), tail.empty() ? "(empty)" : tail));
    } else if (segments.empty()) {
      finish_all(data::SampleStatus::kFailed,
                 fmt::format("agent command `{}` exited without calling the model (session {})",
                             options_.command, session->id()));
    }
    for (auto& s : segments) s.metadata["agent_session"] = session->id();
    result.segments = std::move(segments);
    return result;
  }

  const AgentOptions options_;
  const std::unique_ptr<AgentSessionServer> server_;
  uint64_t salt_ = 0;
  std::atomic<uint64_t> counter_{0};
};

}  // namespace

StatusOr<std::unique_ptr<rollout::CustomGenerator>> MakeAgentGenerator(
    const AgentOptions& options) {
  if (options.command.empty()) {
    return absl::InvalidArgumentError(
        "agent generator: no command (rollout.agent_command: the agent program to run per "
        "sample)");
  }
  if (options.max_turns < 0) {
    return absl::InvalidArgumentError(fmt::format(
        "agent generator: max_turns must be >= 0 (0 = no limit), got {}", options.max_turns));
  }
  if (!(options.timeout_s > 0)) {
    return absl::InvalidArgumentError(fmt::format(
        "agent generator: timeout_s must be > 0 seconds, got {}", options.timeout_s));
  }
  std::shared_ptr<const tokenizer::Tokenizer> tok = options.tokenizer;
  if (tok == nullptr) {
    if (options.tokenizer_dir.empty()) {
      return absl::InvalidArgumentError(
          "agent generator: no tokenizer (give a tokenizer or tokenizer_dir: the served model's "
          "tokenizer, whose chat template renders the agent's messages)");
    }
    SLIME_ASSIGN_OR_RETURN(std::unique_ptr<tokenizer::Tokenizer> loaded,
                           tokenizer::Tokenizer::FromDirectory(options.tokenizer_dir));
    tok = std::move(loaded);
  }
  SLIME_ASSIGN_OR_RETURN(std::unique_ptr<AgentSessionServer> server,
                         AgentSessionServer::Start(options.server, tok));
  spdlog::info("agent: sessions served on http://{}/sessions/<id>/v1 for `{}`", server->address(),
               options.command);
  return std::unique_ptr<rollout::CustomGenerator>(
      new AgentGenerator(options, std::move(server)));
}

std::string ShellJoin(const std::vector<std::string>& argv) {
  std::string out;
  for (const std::string& arg : argv) {
    if (!out.empty()) out += ' ';
    const bool plain = !arg.empty() && arg.find_first_not_of(
                                           "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                           "0123456789-_./=:,+@%") == std::string::npos;
    if (plain) {
      out += arg;
      continue;
    }
    out += '\'';
    for (char c : arg) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    out += '\'';
  }
  return out;
}

std::string AgentServerAddress(const rollout::CustomGenerator& generator) {
  const auto* agent = dynamic_cast<const AgentGenerator*>(&generator);
  return agent == nullptr ? "" : agent->server().address();
}

}  // namespace slime::agent
