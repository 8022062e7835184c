// Fuzz target: a whole .safetensors file → SafetensorsFile::Open (see fuzz_targets.h). Open maps
// a path, so the bytes go through one temp file per process.
#include <unistd.h>

#include <cstdio>
#include <string>

#include "fuzz_targets.h"
#include "slime/model/safetensors.h"

namespace slime::fuzz {

int FuzzSafetensors(const uint8_t* data, size_t size) {
  static const std::string path = [] {
    const char* tmp = std::getenv("TMPDIR");
    return std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/slime_fuzz_" +
           std::to_string(::getpid()) + ".safetensors";
  }();
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return 0;
  if (size > 0 && std::fwrite(data, 1, size, f) != size) {
    std::fclose(f);
    return 0;
  }
  std::fclose(f);
  auto file = model::SafetensorsFile::Open(path);
  if (file.ok()) {
    for (const auto& t : (*file)->tensors()) {
      (void)t.numel();
      (void)(*file)->Find(t.name);
      // Every byte range Open accepted must lie inside the mapping.
      if (t.nbytes() > 0) {
        volatile uint8_t sum = (*file)->Data(t)[0];
        sum = sum + (*file)->Data(t)[t.nbytes() - 1];
        (void)sum;
      }
    }
  }
  std::remove(path.c_str());
  return 0;
}

}  // namespace slime::fuzz

SLIME_FUZZ_ENTRY(FuzzSafetensors)
