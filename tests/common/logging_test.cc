#include "slime/common/logging.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "spdlog/spdlog.h"

namespace slime {
namespace {

TEST(LoggingTest, RejectsUnknownLevelNamingValidOnes) {
  Status s = CheckLogLevel("verbose");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("'verbose'"), std::string::npos);
  EXPECT_NE(s.message().find("'debug'"), std::string::npos);
}

TEST(LoggingTest, WritesPerActorFileWithRoleAndRankPrefix) {
  auto dir = std::filesystem::temp_directory_path() /
             ("slime_logging_test_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(InitLogging({.level = "debug", .role = "trainer", .rank = 3,
                           .log_dir = dir.string()})
                  .ok());
  spdlog::debug("hello {}", 42);
  spdlog::default_logger()->flush();
  std::ifstream in(dir / "trainer-3.log");
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_NE(text.str().find("[trainer:3]"), std::string::npos) << text.str();
  EXPECT_NE(text.str().find("hello 42"), std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace slime
