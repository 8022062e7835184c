// The real `slime_train sft` (SLIME_TRAIN_BIN) on a tiny random-weight Qwen3-architecture model
// with the real Qwen3 tokenizer and tests/data/sft/chat.jsonl: the loss falls when the batch is
// overfit, checkpoints resume to the same losses bit for bit, the HF export loads, and bad input
// exits 2 naming what is wrong.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "slime/model/decoder.h"
#include "slime/model/init_random_model.h"
#include "slime_binary.h"

namespace slime {
namespace {

namespace fs = std::filesystem;

using slime::testing::BinaryResult;
using slime::testing::SourceDir;
using Result = BinaryResult;

Result Sft(const std::string& args) { return slime::testing::RunSlimeTrain("sft --device cpu " + args); }

std::vector<nlohmann::json> ReadJsonl(const fs::path& path) {
  std::vector<nlohmann::json> rows;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) rows.push_back(nlohmann::json::parse(line));
  }
  return rows;
}

class SftTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new fs::path(fs::temp_directory_path() / ("slime-sft-" + std::to_string(::getpid())));
    fs::remove_all(*root_);
    fs::create_directories(*root_);
    const std::string tok = SourceDir() + "/.cache/testdata/qwen3";
    if (!fs::exists(tok + "/tokenizer.json")) {
      GTEST_FAIL() << "Qwen3 tokenizer missing at " << tok << ": run scripts/fetch_test_data.sh";
    }
    Status s = model::InitRandomModel(SourceDir() + "/tests/data/model/configs/qwen3-engine-test.json",
                                      tok, (*root_ / "model").string(), 5, "fp32");
    ASSERT_TRUE(s.ok()) << s;
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(*root_, ec);
    delete root_;
  }
  static std::string Common() {
    return "--model " + (*root_ / "model").string() + " --data " + SourceDir() +
           "/tests/data/sft/chat.jsonl --batch-size 4 --lr 3e-3 --lr-decay-style constant "
           "--seed 7";
  }
  static fs::path* root_;
};
fs::path* SftTest::root_ = nullptr;

TEST_F(SftTest, LossFallsAndTheExportLoads) {
  const fs::path jsonl = *root_ / "a.jsonl";
  Result r = Sft(Common() + " --max-steps 12 --save " + (*root_ / "ckpt-a").string() +
                 " --save-hf " + (*root_ / "hf").string() + " --metrics-jsonl " + jsonl.string());
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("sft step 12/12"), std::string::npos) << r.out;
  std::vector<nlohmann::json> rows = ReadJsonl(jsonl);
  ASSERT_EQ(rows.size(), 12u);
  const double first = rows.front()["train/loss"].get<double>();
  const double last = rows.back()["train/loss"].get<double>();
  EXPECT_LT(last, 0.7 * first) << "loss " << first << " -> " << last;
  for (const auto& row : rows) EXPECT_GT(row["train/trained_tokens"].get<int64_t>(), 0);
  auto m = model::DecoderModel::Load((*root_ / "hf").string(), torch::kFloat32, torch::kCPU);
  EXPECT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(fs::exists(*root_ / "hf" / "tokenizer.json"));
}

TEST_F(SftTest, ResumeGivesTheSameLossesBitForBit) {
  const fs::path full = *root_ / "full.jsonl", resumed = *root_ / "resumed.jsonl";
  Result a = Sft(Common() + " --max-steps 6 --save-interval 3 --save " +
                 (*root_ / "ckpt-r").string() + " --metrics-jsonl " + full.string());
  ASSERT_EQ(a.exit_code, 0) << a.err;
  Result b = Sft(Common() + " --max-steps 6 --load " + (*root_ / "ckpt-r" / "iter_0000003").string() +
                 " --metrics-jsonl " + resumed.string());
  ASSERT_EQ(b.exit_code, 0) << b.err;
  std::vector<nlohmann::json> x = ReadJsonl(full), y = ReadJsonl(resumed);
  ASSERT_EQ(x.size(), 6u);
  ASSERT_EQ(y.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(y[i]["step"], x[i + 3]["step"]);
    EXPECT_EQ(y[i]["train/loss"].get<double>(), x[i + 3]["train/loss"].get<double>()) << "step " << i + 4;
    EXPECT_EQ(y[i]["train/grad_norm"].get<double>(), x[i + 3]["train/grad_norm"].get<double>());
  }
}

TEST_F(SftTest, BadInputIsNamed) {
  Result missing = Sft("--model " + (*root_ / "model").string() + " --data /nonexistent/d.jsonl");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.err.find("/nonexistent/d.jsonl"), std::string::npos) << missing.err;

  const fs::path bad = *root_ / "bad.jsonl";
  std::ofstream(bad) << "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, "
                        "{\"role\": \"assistant\", \"content\": \"yo\"}]}\n{not json\n";
  Result line = Sft("--model " + (*root_ / "model").string() + " --data " + bad.string());
  EXPECT_EQ(line.exit_code, 2);
  EXPECT_NE(line.err.find(bad.string() + ":2"), std::string::npos) << line.err;

  Result lr = Sft("--model " + (*root_ / "model").string() + " --data " + SourceDir() +
                  "/tests/data/sft/chat.jsonl --lr 0");
  EXPECT_EQ(lr.exit_code, 2);
  EXPECT_NE(lr.err.find("--lr"), std::string::npos) << lr.err;

  // Refused before any training step (it used to fail after the whole run).
  const fs::path hf = *root_ / "hf-without-save";
  Result no_save = Sft("--model " + (*root_ / "model").string() + " --data " + SourceDir() +
                       "/tests/data/sft/chat.jsonl --save-hf " + hf.string());
  EXPECT_EQ(no_save.exit_code, 2);
  EXPECT_NE(no_save.err.find("--save-hf needs --save"), std::string::npos) << no_save.err;
  EXPECT_EQ(no_save.out.find("sft step"), std::string::npos) << no_save.out;
  EXPECT_FALSE(fs::exists(hf));
}

}  // namespace
}  // namespace slime
