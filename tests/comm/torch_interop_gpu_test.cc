// The PyTorch-peer scenarios of torch_interop_test.cc on CUDA (gpu label), in the torch of the
// GPU machine's Python (tests/support/torch_python.h):
//   PythonTrainerUpdatesServeOnOneGpu: the Python trainer (Gloo) updates a `serve` on cuda:0
//     in float32; afterwards its greedy tokens equal a fresh `serve` on the written checkpoint
//     and HF transformers' greedy tokens on it (tests/comm/hf_greedy.py; skipped with a message
//     when the Python has no transformers).
//   PythonColocatedTrainerUpdatesServeOverCudaIpc: slime's colocated path for real: SGLang's
//     flattened buckets as CUDA tensors pickled by torch (CUDA IPC handles, the device as its
//     UUID) into a bfloat16 `serve` on the same GPU; the peer checks that the engine releases
//     every block (torch's reference count 1 -> 0).
//   PythonTrainerUpdatesRealServeOverNccl: the trainer on the second GPU
//     (CUDA_VISIBLE_DEVICES=1) broadcasts bfloat16 weights over NCCL to `serve` on the first
//     (deterministic inference so two engines on equal weights give equal tokens); skips
//     without two CUDA devices.
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

// The Python interpreter with a CUDA torch, or a skip reason.
std::string CudaTorchPython(std::string* skip) {
  if (!torch::cuda::is_available()) {
    *skip = "needs a CUDA device";
    return "";
  }
  const auto& py = FindTorchPython();
  if (py.path.empty()) {
    *skip = "no Python interpreter imports torch.distributed (tried " + py.tried +
            "); set SLIME_TORCH_PYTHON to one with CUDA torch";
    return "";
  }
  std::string cuda;
  if (!slime::testing::internal::RunForOutput(
          "'" + py.path + "' -c 'import torch; assert torch.cuda.is_available(); "
          "print(torch.version.cuda)'",
          &cuda)) {
    *skip = py.path + " (torch " + py.version + ") has no CUDA";
    return "";
  }
  std::cerr << "torch peer: " << py.path << " (torch " << py.version << ", CUDA " << cuda << ")\n";
  return py.path;
}

TEST(TorchInteropGpuTest, PythonTrainerUpdatesServeOnOneGpu) {
  std::string skip;
  const std::string python = CudaTorchPython(&skip);
  if (python.empty()) GTEST_SKIP() << skip;
  std::string ignored;
  const bool hf = slime::testing::internal::RunForOutput(
      "'" + python + "' -c 'import transformers; print(transformers.__version__)'", &ignored);
  if (!hf) std::cerr << "HF reference skipped: " << python << " has no transformers\n";
  TrainerRun run;
  run.python = python;
  run.serve_args = {"--device", "cuda:0", "--dtype", "float32"};
  run.hf_device = hf ? "cuda" : "";
  RunPythonTrainerAgainstServe(run);
}

TEST(TorchInteropGpuTest, PythonColocatedTrainerUpdatesServeOverCudaIpc) {
  std::string skip;
  const std::string python = CudaTorchPython(&skip);
  if (python.empty()) GTEST_SKIP() << skip;
  TrainerRun run;
  run.python = python;
  run.serve_args = {"--device", "cuda:0", "--dtype", "bfloat16", "--enable-deterministic-inference"};
  run.mode = "colocated";
  run.peer_args = {"--device", "cuda"};
  RunPythonTrainerAgainstServe(run);
}

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
  TrainerRun run;
  run.python = py.path;
  run.serve_args = {"--device", "cuda:0", "--dtype", "bfloat16", "--enable-deterministic-inference"};
  run.backend = "nccl";
  run.python_env = {{"CUDA_VISIBLE_DEVICES", "1"}};
  RunPythonTrainerAgainstServe(run);
}

}  // namespace
}  // namespace slime::comm
