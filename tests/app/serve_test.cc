// Runs the real `slime_train serve` (SLIME_TRAIN_BIN, set by ctest) on a tiny random-weight
// Qwen3 (real Qwen3 tokenizer) on CPU: it must print its address, answer /health, /server_info
// and a /generate with log-probs, stop on SIGTERM with exit code 0 and "stopped", serve at
// --tp 2 (two Gloo ranks in the one process) the same greedy tokens as at --tp 1, and refuse
// bad configurations (a --tp that does not divide the model, a missing model directory, a port
// in use) with exit code 2 and a message naming the problem; with --api-key and
// --admin-api-key it answers 401/403 as SGLang does and keeps the keys out of its log.
//
// Every server runs in its own process group; a ServeProcess kills that group on every path
// out of a test (failed assertions included), so no process is left behind.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "nlohmann/json.hpp"
#include "slime/http/client.h"
#include "tensor_parallel_http.h"
#include "test_paths.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

using slime::testing::SourceDir;
using slime::testing::TestDataDir;
using slime::testing::TrainBin;

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// One `slime_train <args>` child in its own process group, stdout on a pipe, stderr in a file.
class ServeProcess {
 public:
  explicit ServeProcess(std::vector<std::string> args) {
    static int counter = 0;
    err_path_ = fs::temp_directory_path() / ("slime_serve_test_" + std::to_string(::getpid()) +
                                             "_" + std::to_string(counter++) + ".err");
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      ADD_FAILURE() << "pipe: " << std::strerror(errno);
      return;
    }
    args.insert(args.begin(), TrainBin());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    // Everything the child needs is computed before fork (the child only makes system calls).
    const std::string err = err_path_.string();
    const std::string dir = SourceDir();
    pid_ = ::fork();
    if (pid_ == 0) {
      // Child: own process group, stdout -> pipe, stderr -> file, then exec.
      ::setpgid(0, 0);
      ::dup2(fds[1], STDOUT_FILENO);
      int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (e >= 0) ::dup2(e, STDERR_FILENO);
      if (::chdir(dir.c_str()) != 0) ::_exit(126);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    if (pid_ < 0) {
      ADD_FAILURE() << "fork: " << std::strerror(errno);
      ::close(fds[0]);
      return;
    }
    ::setpgid(pid_, pid_);  // also here: no window where a kill of the group misses the child
    out_fd_ = fds[0];
  }

  ~ServeProcess() {
    KillGroup();
    if (out_fd_ >= 0) ::close(out_fd_);
    std::error_code ec;
    fs::remove(err_path_, ec);
  }

  ServeProcess(const ServeProcess&) = delete;
  ServeProcess& operator=(const ServeProcess&) = delete;

  // Reads stdout until a line contains `needle` (returns it) or the child closes stdout / the
  // timeout passes (nullopt).
  std::optional<std::string> WaitForLine(const std::string& needle,
                                         std::chrono::seconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (true) {
      size_t pos;
      while ((pos = pending_.find('\n')) != std::string::npos) {
        std::string line = pending_.substr(0, pos);
        pending_.erase(0, pos + 1);
        if (line.find(needle) != std::string::npos) return line;
      }
      if (!Fill(deadline)) return std::nullopt;
    }
  }

  // Everything left on stdout until EOF (or the timeout).
  std::string ReadRest(std::chrono::seconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (Fill(deadline)) {
    }
    std::string rest = std::move(pending_);
    pending_.clear();
    return rest;
  }

  // Waits for the child to exit; its exit code, -signal if killed, nullopt on timeout.
  std::optional<int> Wait(std::chrono::seconds timeout) {
    if (exit_code_) return exit_code_;
    const auto deadline = Clock::now() + timeout;
    while (pid_ > 0) {
      int status = 0;
      pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        reaped_ = true;
        exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
        return exit_code_;
      }
      if (r < 0 || Clock::now() > deadline) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return std::nullopt;
  }

  void Signal(int sig) {
    if (pid_ > 0 && !reaped_) ::kill(pid_, sig);
  }

  // Whether any process of the child's group is still alive (after the child was reaped).
  bool GroupAlive() const { return pid_ > 0 && ::kill(-pid_, 0) == 0; }

  std::string Stderr() const { return ReadFile(err_path_); }

 private:
  bool Fill(Clock::time_point deadline) {
    if (out_fd_ < 0) return false;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{out_fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) return false;
    char buf[4096];
    ssize_t n = ::read(out_fd_, buf, sizeof buf);
    if (n <= 0) return false;
    pending_.append(buf, static_cast<size_t>(n));
    return true;
  }

  void KillGroup() {
    if (pid_ <= 0) return;
    ::kill(-pid_, SIGKILL);  // the whole group: the child and anything it started
    if (!reaped_) {
      int status = 0;
      ::waitpid(pid_, &status, 0);
      reaped_ = true;
    }
  }

  pid_t pid_ = -1;
  bool reaped_ = false;
  std::optional<int> exit_code_;
  int out_fd_ = -1;
  std::string pending_;
  fs::path err_path_;
};

// Runs a short-lived `slime_train <args>` to completion (with a deadline).
struct RunResult {
  std::optional<int> exit_code;
  std::string out;
  std::string err;
};

RunResult RunToExit(std::vector<std::string> args, std::chrono::seconds timeout) {
  ServeProcess p(std::move(args));
  RunResult r;
  r.out = p.ReadRest(timeout);
  r.exit_code = p.Wait(timeout);
  r.err = p.Stderr();
  return r;
}

class ServeTest : public ::testing::Test {
 protected:
  // One tiny model per test binary, written by `slime_train init-model`.
  static void SetUpTestSuite() {
    const fs::path tokenizer = TestDataDir() / "qwen3";
    if (!fs::exists(tokenizer / "tokenizer.json")) {
      skip_reason_ = tokenizer.string() + " missing: run scripts/fetch_test_data.sh";
      return;
    }
    model_dir_ = new std::string(
        (fs::temp_directory_path() / ("slime_serve_test_model_" + std::to_string(::getpid())))
            .string());
    fs::remove_all(*model_dir_);
    RunResult r = RunToExit({"init-model", "--config",
                             SourceDir() + "/tests/data/model/configs/qwen3-engine-test.json",
                             "--tokenizer", tokenizer.string(), "--out", *model_dir_, "--dtype",
                             "fp32"},
                            std::chrono::seconds(120));
    if (r.exit_code != 0) {
      skip_reason_ = "init-model failed: " + r.err;
    }
  }

  static void TearDownTestSuite() {
    if (model_dir_ != nullptr) {
      std::error_code ec;
      fs::remove_all(*model_dir_, ec);
      delete model_dir_;
      model_dir_ = nullptr;
    }
  }

  void SetUp() override {
    if (!skip_reason_.empty()) {
      if (skip_reason_.find("init-model failed") != std::string::npos) FAIL() << skip_reason_;
      GTEST_SKIP() << skip_reason_;
    }
  }

  static std::vector<std::string> ServeArgs(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"serve",   "--model",  *model_dir_,    "--port",
                                     "0",       "--device", "cpu",          "--dtype",
                                     "float32", "--max-total-tokens", "4096"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

  static inline std::string* model_dir_ = nullptr;
  static inline std::string skip_reason_;
};

// Parses "slime_train serve: listening on http://HOST:PORT".
bool ParseAddress(const std::string& line, std::string* host, int* port) {
  const std::string prefix = "http://";
  size_t p = line.find(prefix);
  if (p == std::string::npos) return false;
  std::string hostport = line.substr(p + prefix.size());
  while (!hostport.empty() && (hostport.back() == '\r' || hostport.back() == ' ')) {
    hostport.pop_back();
  }
  size_t colon = hostport.rfind(':');
  if (colon == std::string::npos) return false;
  *host = hostport.substr(0, colon);
  *port = std::atoi(hostport.c_str() + colon + 1);
  return *port > 0;
}

TEST_F(ServeTest, ServesHealthInfoAndGenerateThenStopsOnSigterm) {
  ServeProcess server(ServeArgs());
  auto line = server.WaitForLine("listening on", std::chrono::seconds(120));
  ASSERT_TRUE(line.has_value()) << "no 'listening on' line; stderr:\n" << server.Stderr();
  EXPECT_NE(line->find("slime_train serve: listening on http://127.0.0.1:"), std::string::npos)
      << *line;
  std::string host;
  int port = 0;
  ASSERT_TRUE(ParseAddress(*line, &host, &port)) << *line;

  slime::http::Client client(host, port);
  auto health = client.Get("/health");
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(health->status, 200);

  auto info = client.Get("/server_info");
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_EQ(info->status, 200) << info->body;
  json j = info->Json();
  EXPECT_EQ(j.value("model_path", ""), *model_dir_) << j.dump();
  EXPECT_EQ(j.value("tp_size", 0), 1);

  json req = {{"input_ids", {1, 2, 3, 4, 5, 6, 7}},
              {"sampling_params", {{"max_new_tokens", 5}, {"temperature", 0}, {"ignore_eos", true}}},
              {"return_logprob", true}};
  auto gen = client.Post("/generate", req.dump());
  ASSERT_TRUE(gen.ok()) << gen.status();
  ASSERT_EQ(gen->status, 200) << gen->body;
  json g = gen->Json();
  ASSERT_TRUE(g.contains("output_ids")) << g.dump();
  EXPECT_EQ(g["output_ids"].size(), 5u) << g.dump();
  const json& meta = g["meta_info"];
  EXPECT_EQ(meta.value("prompt_tokens", 0), 7) << meta.dump();
  EXPECT_EQ(meta.value("completion_tokens", 0), 5) << meta.dump();
  EXPECT_EQ(meta["finish_reason"].value("type", ""), "length") << meta.dump();
  ASSERT_TRUE(meta.contains("output_token_logprobs")) << meta.dump();
  ASSERT_EQ(meta["output_token_logprobs"].size(), 5u) << meta.dump();
  for (size_t i = 0; i < 5; ++i) {
    const json& t = meta["output_token_logprobs"][i];  // [logprob, token id, text]
    ASSERT_TRUE(t.is_array() && t.size() >= 2) << t.dump();
    EXPECT_LE(t[0].get<double>(), 0.0) << t.dump();
    EXPECT_EQ(t[1].get<int64_t>(), g["output_ids"][i].get<int64_t>()) << t.dump();
  }
  client.Close();

  server.Signal(SIGTERM);
  auto code = server.Wait(std::chrono::seconds(60));
  ASSERT_TRUE(code.has_value()) << "serve did not exit within 60 s of SIGTERM";
  EXPECT_EQ(*code, 0) << server.Stderr();
  const std::string rest = server.ReadRest(std::chrono::seconds(5));
  EXPECT_NE(rest.find("slime_train serve: stopped"), std::string::npos) << rest;
  EXPECT_FALSE(server.GroupAlive()) << "a process of the server's group is still running";
}

// A started server's client (or a failed assertion naming what the server printed).
struct Started {
  std::string host;
  int port = 0;
};

std::optional<Started> WaitListening(ServeProcess& server) {
  auto line = server.WaitForLine("listening on", std::chrono::seconds(180));
  EXPECT_TRUE(line.has_value()) << "no 'listening on' line; stderr:\n" << server.Stderr();
  if (!line) return std::nullopt;
  Started s;
  EXPECT_TRUE(ParseAddress(*line, &s.host, &s.port)) << *line;
  return s;
}

// SGLang's --api-key / --admin-api-key: /health stays open; every other route wants the user
// (or admin) key, the routes that change state the admin key alone (403 for the user key);
// refused requests change nothing, and neither key appears in the log or /metrics.
TEST_F(ServeTest, ApiKeysGuardEveryRouteButHealthAndAdminKeyTheStateChangingOnes) {
  const std::string user = "user-key-5f2c", admin = "admin-key-9a7e";
  ServeProcess server(ServeArgs({"--api-key", user, "--admin-api-key", admin,
                                 "--weight-version", "v0"}));
  auto s = WaitListening(server);
  ASSERT_TRUE(s.has_value());
  slime::http::Client client(s->host, s->port);
  const slime::http::Headers as_user = {{"Authorization", "Bearer " + user}};
  const slime::http::Headers as_admin = {{"Authorization", "Bearer " + admin}};
  const slime::http::Headers wrong = {{"Authorization", "Bearer " + user + "x"}};
  auto status = [](const auto& r) { return r.ok() ? r->status : -1; };

  EXPECT_EQ(status(client.Get("/health")), 200);
  auto no_key = client.Get("/server_info");
  ASSERT_TRUE(no_key.ok()) << no_key.status();
  EXPECT_EQ(no_key->status, 401) << no_key->body;
  EXPECT_NE(no_key->body.find("API key"), std::string::npos) << no_key->body;
  EXPECT_EQ(no_key->headers.count("www-authenticate"), 1u);
  EXPECT_EQ(status(client.Get("/server_info", wrong)), 401);
  EXPECT_EQ(status(client.Get("/server_info", as_user)), 200);
  EXPECT_EQ(status(client.Get("/server_info", as_admin)), 200) << "the admin key opens user routes";

  const json req = {{"input_ids", {1, 2, 3}},
                    {"sampling_params", {{"max_new_tokens", 2}, {"temperature", 0}}}};
  EXPECT_EQ(status(client.Post("/generate", req.dump())), 401);
  EXPECT_EQ(status(client.Post("/generate", req.dump(), "application/json", as_user)), 200);

  // A state-changing route: the user key is not enough, and nothing changes.
  const json version = {{"new_version", "v1"}};
  EXPECT_EQ(status(client.Post("/update_weight_version", version.dump())), 401);
  auto forbidden = client.Post("/update_weight_version", version.dump(), "application/json", as_user);
  ASSERT_TRUE(forbidden.ok()) << forbidden.status();
  EXPECT_EQ(forbidden->status, 403) << forbidden->body;
  auto v = client.Get("/get_weight_version", as_user);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->Json().value("weight_version", ""), "v0") << v->body;
  EXPECT_EQ(status(client.Post("/update_weight_version", version.dump(), "application/json",
                               as_admin)),
            200);
  v = client.Get("/get_weight_version", as_user);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->Json().value("weight_version", ""), "v1") << v->body;
  EXPECT_EQ(status(client.Post("/flush_cache", "", "application/json", as_user)), 403);

  auto metrics = client.Get("/metrics", as_user);
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_EQ(metrics->status, 200);
  client.Close();
  server.Signal(SIGTERM);
  ASSERT_TRUE(server.Wait(std::chrono::seconds(60)).has_value());
  const std::string log = server.Stderr() + server.ReadRest(std::chrono::seconds(5));
  for (const std::string& key : {user, admin}) {
    EXPECT_EQ(log.find(key), std::string::npos) << "a key in the log:\n" << log;
    EXPECT_EQ(metrics->body.find(key), std::string::npos) << "a key in /metrics";
  }
}

TEST_F(ServeTest, TensorParallelTwoServesWhatOneServes) {
  ServeProcess one(ServeArgs());
  ServeProcess two(ServeArgs({"--tp", "2"}));
  auto a = WaitListening(one);
  auto b = WaitListening(two);
  ASSERT_TRUE(a && b);
  slime::http::Client ca(a->host, a->port), cb(b->host, b->port);
  slime::testing::ExpectTpTwoServesWhatOneServes(ca, cb);
  ca.Close();
  cb.Close();
  two.Signal(SIGTERM);
  auto code = two.Wait(std::chrono::seconds(60));
  ASSERT_TRUE(code.has_value()) << "serve --tp 2 did not exit within 60 s of SIGTERM";
  EXPECT_EQ(*code, 0) << two.Stderr();
  EXPECT_FALSE(two.GroupAlive()) << "a process of the --tp 2 server's group is still running";
}

TEST_F(ServeTest, TensorParallelSizeThatDoesNotDivideTheModelIsAUsageError) {
  RunResult r = RunToExit(ServeArgs({"--tp", "3"}), std::chrono::seconds(60));
  ASSERT_TRUE(r.exit_code.has_value());
  EXPECT_EQ(*r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("tp_size 3"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("num_attention_heads = 4 is not divisible"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("listening on"), std::string::npos) << r.out;
}

TEST_F(ServeTest, MissingModelDirectoryIsNamed) {
  const std::string missing =
      (fs::temp_directory_path() / ("slime_serve_test_no_model_" + std::to_string(::getpid())))
          .string();
  RunResult r = RunToExit({"serve", "--model", missing, "--port", "0", "--device", "cpu"},
                          std::chrono::seconds(60));
  ASSERT_TRUE(r.exit_code.has_value());
  EXPECT_EQ(*r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find(missing), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("terminate"), std::string::npos) << r.err;
}

TEST_F(ServeTest, PortInUseIsNamed) {
  // Hold a listening socket on 127.0.0.1 (any free port) for the duration of the test.
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);

  std::vector<std::string> args = ServeArgs();
  args[4] = std::to_string(port);  // "--port" "0" -> the taken port
  RunResult r = RunToExit(args, std::chrono::seconds(120));
  ::close(fd);
  ASSERT_TRUE(r.exit_code.has_value());
  EXPECT_EQ(*r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("listening on"), std::string::npos) << r.out;
}

}  // namespace
