// `slime_train --version`: version, git hash, LibTorch version, CUDA and NCCL availability.
#ifndef SLIME_APP_VERSION_H_
#define SLIME_APP_VERSION_H_

#include <string>

namespace slime::app {

// Multi-line human-readable build and accelerator report.
std::string VersionReport();

}  // namespace slime::app

#endif  // SLIME_APP_VERSION_H_
