// The launch switches of the model's kernel library (see include/slime/model/cuda/launch.h).
#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "slime/model/cuda/launch.h"

namespace slime::model::cuda {
namespace {

// -1: not decided yet; 0/1: off/on (the environment and the device decide on first use).
std::atomic<int> g_pdl{-1};

}  // namespace

bool ProgrammaticLaunchEnabled() {
  int v = g_pdl.load(std::memory_order_relaxed);
  if (v < 0) {
    const char* env = std::getenv("SLIME_PDL");
    int device = 0, major = 0;
    const bool sm90 =
        cudaGetDevice(&device) == cudaSuccess &&
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
        major >= 9;
    v = sm90 && !(env != nullptr && std::strcmp(env, "0") == 0) ? 1 : 0;
    g_pdl.store(v, std::memory_order_relaxed);
  }
  return v == 1;
}

bool DecodeFusionEnabled(const char* name) {
  static const std::string off = [] {
    const char* env = std::getenv("SLIME_DECODE_UNFUSE");
    return "," + std::string(env != nullptr ? env : "") + ",";
  }();
  return off.find("," + std::string(name) + ",") == std::string::npos;
}

// true restores the default (device and environment decide), false turns it off.
void SetProgrammaticLaunch(bool enabled) {
  g_pdl.store(enabled ? -1 : 0, std::memory_order_relaxed);
}

}  // namespace slime::model::cuda
