// Runs the real `slime_train render-chat` (SLIME_TRAIN_BIN, set by ctest): the text and the ids
// of a Qwen3 conversation (the tokenizer fetched by scripts/fetch_test_data.sh; skipped
// without it), and clear errors for bad input, which need no data.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "slime_binary.h"
#include "test_paths.h"

namespace {

using slime::testing::RunSlimeTrain;
using slime::testing::TestDataDir;

// A temporary directory with the given files, removed at the end of the test.
class Files {
 public:
  Files() {
    root_ = std::filesystem::temp_directory_path() /
            ("slime_render_chat_" + std::to_string(::getpid()) + "_" + std::to_string(count_++));
    std::filesystem::create_directories(root_);
  }
  ~Files() {
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }
  std::string Write(const std::string& name, const std::string& text) {
    std::ofstream(root_ / name) << text;
    return (root_ / name).string();
  }

 private:
  static inline int count_ = 0;
  std::filesystem::path root_;
};

constexpr const char* kMessages =
    R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])";

TEST(RenderChatTest, RendersTextAndIdsWithTheQwen3Template) {
  const std::string tok = (TestDataDir() / "qwen3").string();
  if (!std::filesystem::exists(tok + "/tokenizer.json")) {
    GTEST_SKIP() << tok << " missing: run scripts/fetch_test_data.sh";
  }
  Files files;
  const std::string messages = files.Write("messages.json", kMessages);
  auto text = RunSlimeTrain("render-chat --tokenizer '" + tok + "' --messages '" + messages +
                            "' --add-generation-prompt --kwargs '{\"enable_thinking\": false}'");
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_EQ(text.out,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n");

  const std::string tools = files.Write(
      "tools.json", R"([{"type": "function", "function": {"name": "get_time"}}])");
  auto with_tools = RunSlimeTrain("render-chat --tokenizer '" + tok + "' --messages '" +
                                  messages + "' --tools '" + tools + "'");
  ASSERT_EQ(with_tools.exit_code, 0) << with_tools.err;
  EXPECT_NE(with_tools.out.find("<tools>\n{\"type\": \"function\", \"function\": {\"name\": "
                                "\"get_time\"}}\n</tools>"),
            std::string::npos)
      << with_tools.out;

  auto ids = RunSlimeTrain("render-chat --tokenizer '" + tok + "' --messages '" + messages +
                           "' --ids");
  ASSERT_EQ(ids.exit_code, 0) << ids.err;
  const auto parsed = nlohmann::json::parse(ids.out);
  ASSERT_TRUE(parsed.is_array());
  EXPECT_EQ(parsed.front().get<int>(), 151644);  // <|im_start|>
  EXPECT_EQ(parsed.back().get<int>(), 198);      // "\n" after the last <|im_end|>
}

TEST(RenderChatTest, BadInputIsAClearError) {
  Files files;
  const std::string messages = files.Write("messages.json", kMessages);
  const std::string broken = files.Write("broken.json", "[{\"role\": ");
  const std::string tok = (TestDataDir() / "qwen3").string();

  auto missing = RunSlimeTrain("render-chat --tokenizer /nonexistent --messages '" + messages + "'");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.err.find("--tokenizer"), std::string::npos) << missing.err;

  auto bad_json = RunSlimeTrain("render-chat --tokenizer /nonexistent --messages '" + broken + "'");
  EXPECT_EQ(bad_json.exit_code, 2);
  EXPECT_NE(bad_json.err.find("--messages " + broken + ": not valid JSON"), std::string::npos)
      << bad_json.err;

  auto bad_kwargs = RunSlimeTrain("render-chat --tokenizer /nonexistent --messages '" + messages +
                                  "' --kwargs '[1]'");
  EXPECT_EQ(bad_kwargs.exit_code, 2);
  EXPECT_NE(bad_kwargs.err.find("--kwargs: expected a JSON object"), std::string::npos)
      << bad_kwargs.err;

  auto no_messages = RunSlimeTrain("render-chat --tokenizer /nonexistent");
  EXPECT_NE(no_messages.exit_code, 0);
  EXPECT_NE(no_messages.err.find("--messages"), std::string::npos) << no_messages.err;

  if (std::filesystem::exists(tok + "/tokenizer.json")) {  // the template's own error, with its line
    const std::string bad = files.Write("bad.json", R"([{"role": "assistant", "content": null}])");
    auto failed = RunSlimeTrain("render-chat --tokenizer '" + tok + "' --messages '" + bad + "'");
    EXPECT_EQ(failed.exit_code, 2);
    EXPECT_NE(failed.err.find("chat template line "), std::string::npos) << failed.err;
  }
}

}  // namespace
