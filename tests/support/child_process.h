// Test helper: the real `slime_train` (or another binary) as a child process, and the files it
// writes. Used by the end-to-end tests that run whole jobs (tests/job, tests/app).
//
// A Child runs in a process group of its own, from the source tree, with stdout and stderr in
// files under a directory the test owns; it is killed with its group when destroyed while still
// running, so a failed assertion leaves no process behind. Header-only: the tests that use it
// are small translation units without LibTorch.
#ifndef SLIME_TESTS_SUPPORT_CHILD_PROCESS_H_
#define SLIME_TESTS_SUPPORT_CHILD_PROCESS_H_

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "nlohmann/json.hpp"
#include "test_paths.h"

extern char** environ;

namespace slime::testing {

// The whole file as text ("" when it cannot be read).
inline std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// One JSON value per non-empty line (metrics.jsonl and the like).
inline std::vector<nlohmann::json> ReadJsonl(const std::filesystem::path& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  }
  return out;
}

struct ChildOptions {
  std::string binary;  // empty: slime_train (TrainBin())
  std::string name;    // output files <name>.stdout/.stderr; empty: stdout/stderr
  std::map<std::string, std::string> env;  // added to (or replacing in) the test's environment
};

class Child {
 public:
  Child(std::vector<std::string> args, const std::filesystem::path& dir, ChildOptions options = {})
      : out_(dir / (options.name.empty() ? "stdout" : options.name + ".stdout")),
        err_(dir / (options.name.empty() ? "stderr" : options.name + ".stderr")) {
    args.insert(args.begin(), options.binary.empty() ? TrainBin() : options.binary);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env_strings;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string entry = *e;
      if (options.env.count(entry.substr(0, entry.find('='))) == 0) env_strings.push_back(entry);
    }
    for (const auto& [k, v] : options.env) env_strings.push_back(k + "=" + v);
    std::vector<char*> envp;
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    const std::string out = out_.string(), err = err_.string(), src = SourceDir();
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setpgid(0, 0);
      int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (o >= 0) ::dup2(o, STDOUT_FILENO);
      if (e >= 0) ::dup2(e, STDERR_FILENO);
      if (::chdir(src.c_str()) != 0) ::_exit(126);
      ::execve(argv[0], argv.data(), envp.data());
      ::_exit(127);
    }
    ::setpgid(pid_, pid_);
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() {
    if (pid_ > 0 && !exit_code_) {
      ::kill(-pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }

  // The exit code (128+N for a signal), or nullopt after `timeout`.
  std::optional<int> Wait(std::chrono::seconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!exit_code_ && std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return exit_code_;
  }
  // Signals the child itself (not its group: the job's workers run in groups of their own).
  void Signal(int sig) { ::kill(pid_, sig); }
  pid_t pid() const { return pid_; }
  std::string out() const { return ReadFile(out_); }
  std::string err() const { return ReadFile(err_); }
  const std::filesystem::path& out_path() const { return out_; }
  const std::filesystem::path& err_path() const { return err_; }

 private:
  std::filesystem::path out_, err_;
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
};

// The pid of the worker process of `actor_id` of the job whose run directory is `run_dir` (its
// command line names the job's head, from run_dir/head.json, and the actor), or -1.
inline pid_t WorkerPid(const std::filesystem::path& run_dir, const std::string& actor_id) {
  nlohmann::json head = nlohmann::json::parse(ReadFile(run_dir / "head.json"), nullptr, false);
  if (head.is_discarded() || !head.contains("address")) return -1;
  const std::string needle =
      "--head " + head.at("address").get<std::string>() + " --actor " + actor_id;
  FILE* p = ::popen("ps -eo pid=,args=", "r");
  if (p == nullptr) return -1;
  char line[8192];
  pid_t pid = -1;
  while (fgets(line, sizeof line, p) != nullptr) {
    const std::string l(line);
    if (l.find(needle) != std::string::npos && l.find(" worker ") != std::string::npos) {
      pid = static_cast<pid_t>(std::stol(l));
    }
  }
  ::pclose(p);
  return pid;
}

}  // namespace slime::testing

#endif  // SLIME_TESTS_SUPPORT_CHILD_PROCESS_H_
