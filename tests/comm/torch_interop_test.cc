// The weight plane against real PyTorch peers (CPU, Gloo; docs/operations.md, "Interoperability
// with PyTorch peers"): tests/comm/torch_peer.py creates the weight-update group the way slime's
// trainer and SGLang do (tcp:// rendezvous, PrefixStore(group_name), torch's own
// _new_process_group_helper), in the torch of the Python interpreter found by
// tests/support/torch_python.h; the tests skip when no interpreter imports torch.
//
//   PythonTrainerUpdatesRealServe: the Python peer plays slime's trainer (group rank 0) against
//     a real `slime_train serve` (rank 1): per-tensor broadcasts with HF names, q/k/v in separate
//     /update_weights_from_distributed calls, a weight_version. Afterwards the engine's
//     weights, /get_weights_by_name and greedy tokens equal those of a fresh `serve` started
//     from the checkpoint the Python side wrote of the same weights, and /get_weight_version
//     reports the version.
//   PythonTrainerUpdatesTensorParallelServe: the same against `serve --tp 2` (world 3).
//   PythonColocatedTrainerUpdatesServeWithFlattenedBuckets (and ...TensorParallelServe): the same
//     check after slime's colocated path: /update_weights_from_tensor with SGLang's pickled
//     flattened buckets (CPU tensors in shared memory), one entry per TP rank, a bad bucket
//     refused whole.
//   PythonEngineReceivesOurSenderByteForByte: the Python peer plays an SGLang engine (rank 1)
//     and our comm::WeightSender (rank 0, this process) syncs HF-named tensors of several dtypes
//     in several buckets; every tensor arrives byte for byte, in order, with the version.
//
// Every wait is bounded (group timeouts of 60 s, process deadlines): a peer that never meets
// the other fails the test with both sides' logs instead of hanging. Children run in process
// groups of their own and are killed when a test ends early (tests/support/child_process.h).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "slime/comm/weight_sender.h"
#include "slime/model/checkpoint.h"
#include "torch_interop_util.h"
#include "torch_python.h"

namespace slime::comm {
namespace {

using namespace slime::comm::interop;  // NOLINT: the test helpers
using slime::testing::FindTorchPython;

class TorchInteropTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto& py = FindTorchPython();
    if (py.path.empty()) {
      GTEST_SKIP() << "no Python interpreter imports torch.distributed (tried " << py.tried
                   << "); install python3-torch (scripts/setup.sh) or set SLIME_TORCH_PYTHON";
    }
    python_ = py.path;
    std::cerr << "torch peer: " << py.path << " (torch " << py.version << ")\n";
  }
  std::string python_;
};

TEST_F(TorchInteropTest, PythonTrainerUpdatesRealServe) {
  TrainerRun run;
  run.python = python_;
  run.serve_args = {"--device", "cpu", "--dtype", "float32"};
  RunPythonTrainerAgainstServe(run);
}

// The same with an engine of two tensor-parallel ranks (two Gloo ranks in the serve process):
// a world of 3, the engine's ranks rank_offset + 0 and rank_offset + 1, each receiving every
// broadcast and keeping its shard.
TEST_F(TorchInteropTest, PythonTrainerUpdatesTensorParallelServe) {
  TrainerRun run;
  run.python = python_;
  run.serve_args = {"--device", "cpu", "--dtype", "float32", "--tp", "2"};
  run.engine_ranks = 2;
  RunPythonTrainerAgainstServe(run);
}

// slime's colocated path: SGLang's flattened buckets, pickled by torch, as CPU tensors in shared
// memory (the CPU form of the same payload; CUDA IPC is the gpu-labelled twin).
TEST_F(TorchInteropTest, PythonColocatedTrainerUpdatesServeWithFlattenedBuckets) {
  TrainerRun run;
  run.python = python_;
  run.serve_args = {"--device", "cpu", "--dtype", "float32"};
  run.mode = "colocated";
  run.peer_args = {"--device", "cpu"};
  RunPythonTrainerAgainstServe(run);
}

// One entry per TP rank: `serve --tp 2` takes two.
TEST_F(TorchInteropTest, PythonColocatedTrainerUpdatesTensorParallelServe) {
  TrainerRun run;
  run.python = python_;
  run.serve_args = {"--device", "cpu", "--dtype", "float32", "--tp", "2"};
  run.engine_ranks = 2;
  run.mode = "colocated";
  run.peer_args = {"--device", "cpu"};
  RunPythonTrainerAgainstServe(run);
}

// ---- our WeightSender (rank 0) to a Python SGLang-like engine (rank 1)

TEST_F(TorchInteropTest, PythonEngineReceivesOurSenderByteForByte) {
  TempDir dir("engine");
  const fs::path dump = dir.path() / "dump", port_file = dir.path() / "port";
  ChildOptions po;
  po.binary = python_;
  po.name = "engine";
  Child peer({PeerScript(), "engine", "--dump-dir", dump.string(), "--port-file",
              port_file.string(), "--timeout", std::to_string(kGroupTimeoutS), "--deadline",
              "180"},
             dir.path(), po);
  int port = 0;
  ASSERT_TRUE(WaitForFile(port_file, std::chrono::seconds(60), [&](const std::string& t) {
    port = std::atoi(t.c_str());
    return port > 0;
  })) << "the Python engine did not start" << Logs(peer, "python engine");

  // HF-named tensors in dtypes every torch's Gloo broadcasts (torch 1.13's Gloo has no
  // bfloat16 or bool), q/k/v apart, in buckets of at most 1 KB.
  torch::manual_seed(3);
  std::vector<model::NamedTensor> tensors = {
      {"model.embed_tokens.weight", torch::randn({40, 8})},
      {"model.layers.0.self_attn.q_proj.weight", torch::randn({16, 8})},
      {"model.layers.0.self_attn.k_proj.weight", torch::randn({8, 8})},
      {"model.layers.0.self_attn.v_proj.weight", torch::randn({8, 8})},
      {"model.layers.0.input_layernorm.weight", torch::randn({8}).to(torch::kHalf)},
      {"model.layers.0.mlp.down_proj.weight", torch::randn({8, 32}).to(torch::kDouble)},
      {"extra.int64", torch::arange(-5, 5, torch::kLong)},
      {"extra.int32", torch::arange(0, 300, torch::kInt).reshape({3, 100})},
      {"extra.uint8", torch::randint(0, 255, {17}, torch::kByte)},
  };
  WeightSenderOptions o;
  o.engines = {{"127.0.0.1", port, 1}};
  o.group_name = "torch-interop-sender";
  o.backend = "gloo";
  o.bucket_bytes = 1024;
  o.timeout_s = kGroupTimeoutS;
  {
    auto sender = WeightSender::Connect(o);
    ASSERT_TRUE(sender.ok()) << sender.status() << Logs(peer, "python engine");
    auto stats = (*sender)->Send(tensors, "ours-3");
    ASSERT_TRUE(stats.ok()) << stats.status() << Logs(peer, "python engine");
    EXPECT_GE(stats->buckets, 3);
    ASSERT_TRUE((*sender)->Disconnect().ok()) << Logs(peer, "python engine");
  }
  ASSERT_EQ(peer.Wait(std::chrono::seconds(60)), 0) << Logs(peer, "python engine");

  const json received = json::parse(ReadFile(dump / "received.json"), nullptr, false);
  ASSERT_FALSE(received.is_discarded()) << Logs(peer, "python engine");
  EXPECT_EQ(received.value("weight_version", ""), "ours-3");
  ASSERT_EQ(received["tensors"].size(), tensors.size()) << received.dump();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const json& r = received["tensors"][i];
    const torch::Tensor t = tensors[i].tensor.contiguous();
    EXPECT_EQ(r.value("name", ""), tensors[i].name);
    EXPECT_EQ(r.value("dtype", ""), DtypeName(t.scalar_type())) << tensors[i].name;
    EXPECT_EQ(r["shape"].get<std::vector<int64_t>>(), t.sizes().vec()) << tensors[i].name;
    const std::string got = ReadFile(dump / r.value("file", ""));
    const std::string want(static_cast<const char*>(t.data_ptr()), t.numel() * t.element_size());
    EXPECT_TRUE(got == want) << tensors[i].name << ": " << got.size() << " bytes received, "
                             << want.size() << " sent, contents differ";
  }
}

}  // namespace
}  // namespace slime::comm
