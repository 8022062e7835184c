// Fuzz target: YAML config text → LoadConfigFromString (see fuzz_targets.h).
#include <yaml-cpp/yaml.h>

#include <string>
#include <vector>

#include "fuzz_targets.h"
#include "slime/config/config.h"

namespace slime::fuzz {

int FuzzConfig(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  // `base:` names files to include; the fuzzer must not read (or block on) arbitrary paths.
  try {
    YAML::Node root = YAML::Load(text);
    if (root.IsMap() && root["base"]) return 0;
  } catch (...) {
    // Unparseable YAML: LoadConfigFromString must refuse it too.
  }
  std::vector<std::string> warnings;
  auto config = config::LoadConfigFromString(text, "/nonexistent/slime-fuzz", {}, &warnings);
  (void)config;
  return 0;
}

}  // namespace slime::fuzz

SLIME_FUZZ_ENTRY(FuzzConfig)
