#include "slime/metrics/jsonl_writer.h"

#include <filesystem>
#include <fstream>
#include <set>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace slime::metrics {
namespace {

class JsonlWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("jsonl_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::vector<nlohmann::json> ReadLines(const std::filesystem::path& path) {
    std::ifstream in(path);
    std::vector<nlohmann::json> out;
    std::string line;
    while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
    return out;
  }

  std::filesystem::path dir_;
};

TEST_F(JsonlWriterTest, LinesParseBackAndFileIsAppended) {
  std::filesystem::path path = dir_ / "sub" / "metrics.jsonl";  // parent created on open
  {
    auto writer = JsonlWriter::Open(path.string());
    ASSERT_TRUE(writer.ok()) << writer.status();
    ASSERT_TRUE((*writer)->Write({{"step", 1}, {"loss", 0.5}, {"note", "a\nb"}}).ok());
    ASSERT_TRUE((*writer)->Write({{"step", 2}, {"loss", 0.25}}).ok());
    // Flushed per line: visible before the writer closes.
    EXPECT_EQ(ReadLines(path).size(), 2u);
  }
  {
    auto writer = JsonlWriter::Open(path.string());
    ASSERT_TRUE(writer.ok()) << writer.status();
    ASSERT_TRUE((*writer)->Write({{"step", 3}}).ok());
  }
  std::vector<nlohmann::json> lines = ReadLines(path);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0]["step"], 1);
  EXPECT_EQ(lines[0]["loss"], 0.5);
  EXPECT_EQ(lines[0]["note"], "a\nb");
  EXPECT_EQ(lines[1]["loss"], 0.25);
  EXPECT_EQ(lines[2]["step"], 3);
}

TEST_F(JsonlWriterTest, ConcurrentWritersNeverInterleave) {
  std::filesystem::path path = dir_ / "m.jsonl";
  auto writer = JsonlWriter::Open(path.string());
  ASSERT_TRUE(writer.ok()) << writer.status();
  constexpr int kThreads = 4, kLines = 500;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kLines; ++i) {
        ASSERT_TRUE((*writer)->Write({{"t", t}, {"i", i}, {"pad", std::string(200, 'x')}}).ok());
      }
    });
  }
  for (auto& th : threads) th.join();
  std::vector<nlohmann::json> lines = ReadLines(path);  // throws on a torn line
  ASSERT_EQ(lines.size(), static_cast<size_t>(kThreads * kLines));
  std::set<std::pair<int, int>> seen;
  for (const auto& j : lines) seen.insert({j["t"].get<int>(), j["i"].get<int>()});
  EXPECT_EQ(seen.size(), lines.size());
}

TEST_F(JsonlWriterTest, UnopenablePathNamesTheFile) {
  std::filesystem::create_directories(dir_);
  std::filesystem::path path = dir_ / "is_a_dir";
  std::filesystem::create_directories(path);
  auto writer = JsonlWriter::Open(path.string());
  ASSERT_FALSE(writer.ok());
  EXPECT_NE(std::string(writer.status().message()).find(path.string()), std::string::npos)
      << writer.status();
}

}  // namespace
}  // namespace slime::metrics
