// slime_config_docs: prints the configuration reference (docs/config.md) to stdout.
//
//   slime_config_docs > docs/config.md
//
// The reference is generated from the field table, so it always matches what LoadConfig
// accepts; a unit test fails when the committed docs/config.md is stale.
#include <cstdio>
#include <string>

#include "slime/config/config.h"

int main() {
  const std::string markdown = slime::config::ConfigReferenceMarkdown();
  std::fwrite(markdown.data(), 1, markdown.size(), stdout);
  return std::fflush(stdout) == 0 ? 0 : 1;
}
