// Helpers of the tests that meet real PyTorch peers (torch_interop_test.cc on CPU/Gloo,
// torch_interop_gpu_test.cc on two GPUs/NCCL): children (`slime_train serve`, the Python peer
// tests/comm/torch_peer.py) in process groups of their own with bounded waits, small HTTP
// helpers, and the whole Python-trainer-against-serve scenario (RunPythonTrainerAgainstServe).
// Header-only; included by one test file per binary.
#ifndef SLIME_TESTS_COMM_TORCH_INTEROP_UTIL_H_
#define SLIME_TESTS_COMM_TORCH_INTEROP_UTIL_H_

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "child_process.h"
#include "remove_tree.h"
#include "nlohmann/json.hpp"
#include "slime/http/client.h"
#include "test_paths.h"

namespace slime::comm::interop {

using json = nlohmann::json;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using slime::testing::Child;
using slime::testing::ChildOptions;
using slime::testing::ReadFile;
using slime::testing::SourceDir;
using slime::testing::TestDataDir;

inline constexpr int kGroupTimeoutS = 60;

inline std::string PeerScript() { return SourceDir() + "/tests/comm/torch_peer.py"; }

// A fresh directory under the temp dir, removed with its contents at the end of the test.
class TempDir {
 public:
  explicit TempDir(const std::string& name)
      : path_(fs::temp_directory_path() /
              ("slime-torch-interop-" + std::to_string(::getpid()) + "-" + name)) {
    // Not std::filesystem::remove_all: it crashes in CUDA-build executables (remove_tree.h).
    slime::testing::RemoveTree(path_.string());
    fs::create_directories(path_);
  }
  ~TempDir() { slime::testing::RemoveTree(path_.string()); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// Waits until `file` exists and `pred` holds for its text (polling), or the deadline.
template <typename Pred>
bool WaitForFile(const fs::path& file, std::chrono::seconds timeout, Pred pred) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (fs::exists(file) && pred(ReadFile(file))) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

inline std::string Logs(const Child& c, const std::string& who) {
  return "\n--- " + who + " stdout:\n" + c.out() + "\n--- " + who + " stderr:\n" +
         c.err().substr(c.err().size() > 6000 ? c.err().size() - 6000 : 0);
}

// ---- a `slime_train serve` process and its address

struct Serve {
  std::unique_ptr<Child> child;
  std::string host;
  int port = 0;
};

// Starts `serve` on `model` and waits for its "listening on http://HOST:PORT" line.
inline Serve StartServe(const fs::path& model, const fs::path& dir, const std::string& name,
                        const std::vector<std::string>& extra) {
  Serve s;
  ChildOptions o;
  o.name = name;
  std::vector<std::string> args = {"serve", "--model", model.string(), "--port", "0",
                                   "--max-total-tokens", "4096"};
  args.insert(args.end(), extra.begin(), extra.end());
  s.child = std::make_unique<Child>(args, dir, o);
  std::string line;
  WaitForFile(s.child->out_path(), std::chrono::seconds(180), [&](const std::string& text) {
    const size_t at = text.find("listening on http://");
    if (at == std::string::npos) return false;
    const size_t end = text.find('\n', at);
    if (end == std::string::npos) return false;
    line = text.substr(at + std::strlen("listening on http://"), end - at - 20);
    return true;
  });
  const size_t colon = line.rfind(':');
  if (colon != std::string::npos) {
    s.host = line.substr(0, colon);
    s.port = std::atoi(line.c_str() + colon + 1);
  }
  return s;
}

inline json GetJson(http::Client& c, const std::string& path) {
  auto r = c.Get(path);
  if (!r.ok()) return json{{"client_error", std::string(r.status().message())}};
  json j = json::parse(r->body, nullptr, false);
  return j.is_discarded() ? json{{"status", r->status}, {"body", r->body}} : j;
}

inline json PostJson(http::Client& c, const std::string& path, const json& body,
                     int* status = nullptr) {
  auto r = c.Post(path, body.dump());
  if (!r.ok()) return json{{"client_error", std::string(r.status().message())}};
  if (status != nullptr) *status = r->status;
  json j = json::parse(r->body, nullptr, false);
  return j.is_discarded() ? json{{"status", r->status}, {"body", r->body}} : j;
}

inline json GreedyTokens(http::Client& c) {
  json req = {{"input_ids", {11, 22, 33, 44, 55, 66, 77}},
              {"sampling_params",
               {{"max_new_tokens", 12}, {"temperature", 0}, {"ignore_eos", true}}}};
  return PostJson(c, "/generate", req).value("output_ids", json());
}

// What differs between the CPU and the GPU run of the Python-trainer test.
struct TrainerRun {
  std::string python;                       // the interpreter (FindTorchPython)
  std::vector<std::string> serve_args;      // device, dtype, ... of both `serve` processes
  std::string backend = "gloo";             // of the weight-update group
  int engine_ranks = 1;                     // the engine's tp_size: the group has 1 + this ranks
  std::map<std::string, std::string> python_env;  // e.g. CUDA_VISIBLE_DEVICES for the trainer
  // "trainer" (a weight-update group, /update_weights_from_distributed) or "colocated"
  // (SGLang's flattened buckets over /update_weights_from_tensor), and more peer arguments.
  std::string mode = "trainer";
  std::vector<std::string> peer_args;
  // When set: after the update the engine's greedy tokens also equal those HF transformers
  // computes from the checkpoint the peer wrote (tests/comm/hf_greedy.py on this device).
  std::string hf_device;
};

// The Python peer plays slime's trainer (rank 0) against a real `serve` (rank 1); afterwards
// the engine's weights, /get_weights_by_name and greedy tokens equal those of a fresh `serve`
// on the checkpoint the Python side wrote, and /get_weight_version reports the version.
inline void RunPythonTrainerAgainstServe(const TrainerRun& run) {
  const fs::path tokenizer = TestDataDir() / "qwen3";
  if (!fs::exists(tokenizer / "tokenizer.json")) {
    GTEST_SKIP() << tokenizer << " missing: run scripts/fetch_test_data.sh";
  }
  TempDir dir("serve");
  const fs::path model = dir.path() / "model", updated = dir.path() / "updated";
  {
    Child init({"init-model", "--config",
                SourceDir() + "/tests/data/model/configs/qwen3-engine-test.json", "--tokenizer",
                tokenizer.string(), "--out", model.string(), "--dtype", "fp32"},
               dir.path(), ChildOptions{"", "init", {}});
    ASSERT_EQ(init.Wait(std::chrono::seconds(120)), 0) << Logs(init, "init-model");
  }
  Serve engine = StartServe(model, dir.path(), "engine", run.serve_args);
  ASSERT_GT(engine.port, 0) << "serve did not start" << Logs(*engine.child, "serve");
  http::Client client(engine.host, engine.port);
  const json before = GreedyTokens(client);
  const json checksums_before = GetJson(client, "/weights_checksum");
  ASSERT_TRUE(before.is_array()) << before.dump();

  // The Python trainer: rank 0 of a world of 2, the engine rank 1 (rank_offset 1).
  ChildOptions po;
  po.binary = run.python;
  po.name = "trainer";
  po.env = run.python_env;
  std::vector<std::string> peer = {
      PeerScript(), run.mode, "--engine-url",
      "http://" + engine.host + ":" + std::to_string(engine.port), "--checkpoint",
      model.string(), "--out", updated.string(), "--group-name", "torch-interop",
      "--backend", run.backend, "--world-size", std::to_string(1 + run.engine_ranks),
      "--weight-version", "torch-peer-7", "--timeout", std::to_string(kGroupTimeoutS),
      "--deadline", "240"};
  peer.insert(peer.end(), run.peer_args.begin(), run.peer_args.end());
  Child trainer(peer, dir.path(), po);
  const auto code = trainer.Wait(std::chrono::seconds(260));
  ASSERT_EQ(code, 0) << "the Python trainer failed or timed out" << Logs(trainer, "trainer")
                     << Logs(*engine.child, "serve");
  const std::string out = trainer.out();
  const json summary =
      json::parse(out.substr(std::min(out.rfind('{'), out.size())), nullptr, false);
  ASSERT_FALSE(summary.is_discarded()) << out;
  EXPECT_GE(summary.value("buckets", 0), 4) << summary.dump();  // q, k, v and the rest apart

  EXPECT_EQ(GetJson(client, "/get_weight_version").value("weight_version", ""), "torch-peer-7");
  const json after = GreedyTokens(client);
  const json checksums_after = GetJson(client, "/weights_checksum");
  EXPECT_NE(checksums_after["tensors"], checksums_before["tensors"])
      << "the update changed nothing";

  // A fresh engine on the checkpoint the trainer wrote of the weights it sent.
  Serve fresh = StartServe(updated, dir.path(), "fresh", run.serve_args);
  ASSERT_GT(fresh.port, 0) << "serve on the updated checkpoint did not start"
                           << Logs(*fresh.child, "fresh serve");
  http::Client fresh_client(fresh.host, fresh.port);
  EXPECT_EQ(GetJson(fresh_client, "/weights_checksum")["tensors"], checksums_after["tensors"]);
  EXPECT_EQ(GreedyTokens(fresh_client), after) << "before the update: " << before.dump();
  for (const char* name : {"model.layers.1.self_attn.v_proj.weight", "model.norm.weight",
                           "lm_head.weight"}) {
    const json q = {{"name", name}, {"truncate_size", 2}};
    EXPECT_EQ(PostJson(client, "/get_weights_by_name", q),
              PostJson(fresh_client, "/get_weights_by_name", q))
        << name;
  }
  if (!run.hf_device.empty()) {
    // HF transformers on the checkpoint of the sent weights: the reference tokens.
    ChildOptions ho;
    ho.binary = run.python;
    ho.name = "hf";
    ho.env = run.python_env;
    Child hf({SourceDir() + "/tests/comm/hf_greedy.py", "--model", updated.string(), "--device",
              run.hf_device, "--input-ids", "11,22,33,44,55,66,77", "--max-new-tokens", "12"},
             dir.path(), ho);
    ASSERT_EQ(hf.Wait(std::chrono::seconds(300)), 0) << Logs(hf, "hf_greedy.py");
    const std::string hf_out = hf.out();
    const json tokens = json::parse(hf_out.substr(std::min(hf_out.rfind('['), hf_out.size())),
                                    nullptr, false);
    EXPECT_EQ(tokens, after) << "HF transformers' greedy tokens on the sent weights"
                             << Logs(hf, "hf_greedy.py");
  }
}

}  // namespace slime::comm::interop

#endif  // SLIME_TESTS_COMM_TORCH_INTEROP_UTIL_H_
