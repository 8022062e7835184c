// Helpers shared by the config tests: a minimal valid config, loading with --set overrides,
// error-message assertions and temporary directories.
#ifndef SLIME_TESTS_CONFIG_TEST_UTIL_H_
#define SLIME_TESTS_CONFIG_TEST_UTIL_H_

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <vector>

#include "slime/config/config.h"
#include "test_paths.h"

namespace slime::config::testing {

// The smallest config that resolves: disaggregated, 1 trainer + 1 engine, 4 prompts × 1.
inline constexpr const char* kMinimalYaml = R"(
model: {hf_checkpoint: /models/tiny}
data: {prompt_data: /data/train.jsonl, rollout_batch_size: 4, num_rollout: 2}
cluster: {actor_num_gpus_per_node: 1, rollout_num_gpus: 1}
)";

inline StatusOr<Config> LoadMinimal(const std::vector<std::string>& sets = {},
                                    std::vector<std::string>* warnings = nullptr) {
  std::vector<std::string> local;
  return LoadConfigFromString(kMinimalYaml, ".", sets, warnings ? warnings : &local);
}

inline StatusOr<Config> LoadText(const std::string& yaml, const std::vector<std::string>& sets = {},
                                 std::vector<std::string>* warnings = nullptr) {
  std::vector<std::string> local;
  return LoadConfigFromString(yaml, ".", sets, warnings ? warnings : &local);
}

// Passes when `result` failed and its message contains every part.
template <typename T>
::testing::AssertionResult FailsWith(const StatusOr<T>& result,
                                     std::initializer_list<std::string> parts) {
  if (result.ok()) return ::testing::AssertionFailure() << "expected an error, got OK";
  std::string message(result.status().message());
  for (const std::string& part : parts) {
    if (message.find(part) == std::string::npos) {
      return ::testing::AssertionFailure()
             << "message does not contain \"" << part << "\":\n  " << message;
    }
  }
  return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult FailsWith(const Status& status,
                                            std::initializer_list<std::string> parts) {
  if (status.ok()) return ::testing::AssertionFailure() << "expected an error, got OK";
  std::string message(status.message());
  for (const std::string& part : parts) {
    if (message.find(part) == std::string::npos) {
      return ::testing::AssertionFailure()
             << "message does not contain \"" << part << "\":\n  " << message;
    }
  }
  return ::testing::AssertionSuccess();
}

inline bool Contains(const std::vector<std::string>& lines, const std::string& part) {
  for (const auto& line : lines) {
    if (line.find(part) != std::string::npos) return true;
  }
  return false;
}

// A fresh directory under the system temp dir, removed on destruction.
class TempDir {
 public:
  TempDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "slime_config_test_XXXXXX").string();
    path_ = mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }

  std::string Write(const std::string& relative, const std::string& text) const {
    std::filesystem::path file = path_ / relative;
    std::filesystem::create_directories(file.parent_path());
    std::ofstream(file) << text;
    return file.string();
  }

 private:
  std::filesystem::path path_;
};

// The source tree: $SLIME_SOURCE_DIR (set by ctest), else the configure-time path.
inline std::filesystem::path SourceDir() { return slime::testing::SourceDir(); }

}  // namespace slime::config::testing

#endif  // SLIME_TESTS_CONFIG_TEST_UTIL_H_
