// The Python-trainer scenario of torch_interop_test.cc over NCCL on two GPUs (gpu label): the
// Python peer (tests/comm/torch_peer.py, slime's trainer, rank 0) on the second GPU
// (CUDA_VISIBLE_DEVICES=1) broadcasts bfloat16 weights to a real `slime_train serve` on the
// first (rank 1, --device cuda:0, deterministic inference so two engines on equal weights give
// equal tokens). Afterwards the engine's weights, /get_weights_by_name and greedy tokens equal a
// fresh `serve` on the checkpoint the Python side wrote, and /get_weight_version reports the
// version. Skips without two CUDA devices or a Python whose torch sees CUDA.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <iostream>
#include <string>

#include "torch_interop_util.h"
#include "torch_python.h"

namespace slime::comm {
namespace {

using namespace slime::comm::interop;  // NOLINT: the test helpers
using slime::testing::FindTorchPython;

TEST(TorchInteropGpuTest, PythonTrainerUpdatesRealServeOverNccl) {
  if (!torch::cuda::is_available() || torch::cuda::device_count() < 2) {
    GTEST_SKIP() << "needs two CUDA devices (found "
                 << (torch::cuda::is_available() ? torch::cuda::device_count() : 0) << ")";
  }
  const auto& py = FindTorchPython();
  if (py.path.empty()) {
    GTEST_SKIP() << "no Python interpreter imports torch.distributed (tried " << py.tried
                 << "); set SLIME_TORCH_PYTHON to one with CUDA torch";
  }
  std::string cuda;
  if (!slime::testing::internal::RunForOutput(
          "CUDA_VISIBLE_DEVICES=1 '" + py.path +
              "' -c 'import torch, torch.distributed as d; assert torch.cuda.is_available() and "
              "d.is_nccl_available(); print(torch.version.cuda)'",
          &cuda)) {
    GTEST_SKIP() << py.path << " (torch " << py.version << ") has no CUDA or NCCL";
  }
  std::cerr << "torch peer: " << py.path << " (torch " << py.version << ", CUDA " << cuda << ")\n";
  RunPythonTrainerAgainstServe({py.path,
                                {"--device", "cuda:0", "--dtype", "bfloat16",
                                 "--enable-deterministic-inference"},
                                "nccl",
                                1,
                                {{"CUDA_VISIBLE_DEVICES", "1"}}});
}

}  // namespace
}  // namespace slime::comm
