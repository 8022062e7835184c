// The real `slime_train convert` (SLIME_TRAIN_BIN) on a tiny Qwen3 trainer checkpoint: the HF
// directory it writes loads in the engine's model runner with the trainer's weights bitwise and
// the same logits; bad input exits 2 with a message naming the path.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "slime/engine/model_runner.h"
#include "slime/model/decoder.h"
#include "slime/model/weights.h"
#include "slime/train/checkpoint.h"
#include "slime_binary.h"

namespace slime {
namespace {

namespace fs = std::filesystem;

using slime::testing::BinaryResult;
using slime::testing::SourceDir;
using Result = BinaryResult;

Result Convert(const std::string& args) { return slime::testing::RunSlimeTrain("convert " + args); }

class ConvertTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("slime-convert-" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
    auto m = model::DecoderModel::Load(SourceDir() + "/tests/data/model/tiny-qwen3",
                                       torch::kFloat32, torch::kCPU);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(m).value();
    // "Trained" weights: the fixture moved by a seeded perturbation.
    torch::NoGradGuard ng;
    torch::manual_seed(11);
    for (const model::ParamSpec& spec : model::ParameterSpecs(model_->config())) {
      torch::Tensor& t = model::ParamSlot(model_->mutable_weights(), spec);
      t.add_(torch::randn_like(t) * 0.01);
    }
    train::SaveCheckpointOptions so;
    so.save_dir = (root_ / "ckpt").string();
    so.iteration = 3;
    train::TrainerProgress progress;
    progress.rollout_id = 3;
    auto saved = train::SaveTrainerCheckpoint(so, model_->weights(), model_->config(), nullptr,
                                              progress);
    ASSERT_TRUE(saved.ok()) << saved.status();
  }
  void TearDown() override { fs::remove_all(root_); }

  fs::path root_;
  std::unique_ptr<model::DecoderModel> model_;
};

TEST_F(ConvertTest, EngineLoadsTheExportWithTheTrainersWeightsAndLogits) {
  const fs::path out = root_ / "hf";
  Result r = Convert("--from " + (root_ / "ckpt").string() + " --to-hf " + out.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("iter_0000003"), std::string::npos) << r.out;
  ASSERT_TRUE(fs::exists(out / "config.json"));

  auto loaded = model::DecoderModel::Load(out.string(), torch::kFloat32, torch::kCPU);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  for (const model::ParamSpec& spec : model::ParameterSpecs(model_->config())) {
    const torch::Tensor& a = model::ParamSlot(model_->mutable_weights(), spec);
    const torch::Tensor& b = model::ParamSlot((*loaded)->mutable_weights(), spec);
    EXPECT_TRUE(torch::equal(a, b)) << spec.hf_name;
  }

  engine::ModelRunnerOptions ro;
  ro.model_path = out.string();
  ro.device = "cpu";
  ro.dtype = "float32";
  ro.page_size = 4;
  ro.max_total_tokens = 256;
  auto runner = engine::ModelRunner::Create(ro);
  ASSERT_TRUE(runner.ok()) << runner.status();
  const std::vector<int32_t> ids = {3, 17, 42, 8, 99, 5, 61, 23, 7};
  const std::vector<int32_t> pages = {1, 2, 3};
  auto hidden = (*runner)->Forward(ids, {{9, 9, &pages}});
  ASSERT_TRUE(hidden.ok()) << hidden.status();
  std::vector<int64_t> rows(ids.size());
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int64_t>(i);
  auto engine_logits = (*runner)->Logits(*hidden, rows);
  ASSERT_TRUE(engine_logits.ok()) << engine_logits.status();

  torch::NoGradGuard ng;
  std::vector<int64_t> ids64(ids.begin(), ids.end());
  auto h = model_->ForwardPacked(torch::tensor(ids64), {0, static_cast<int64_t>(ids.size())});
  ASSERT_TRUE(h.ok()) << h.status();
  auto trainer_logits = model_->Logits(*h);
  ASSERT_TRUE(trainer_logits.ok());
  const double diff =
      (*engine_logits - trainer_logits->to(torch::kFloat32)).abs().max().item<double>();
  EXPECT_LT(diff, 1e-4) << "engine logits of the export vs the trainer's";
}

TEST_F(ConvertTest, DtypeIsRecordedAndOutputIsNeverOverwritten) {
  const fs::path out = root_ / "hf-bf16";
  Result r = Convert("--from " + (root_ / "ckpt" / "iter_0000003").string() + " --to-hf " +
                     out.string() + " --dtype bf16");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream in(out / "config.json");
  EXPECT_EQ(nlohmann::json::parse(in).value("torch_dtype", ""), "bfloat16");
  auto loaded = model::DecoderModel::Load(out.string(), torch::kBFloat16, torch::kCPU);
  ASSERT_TRUE(loaded.ok()) << loaded.status();

  Result again = Convert("--from " + (root_ / "ckpt").string() + " --to-hf " + out.string());
  EXPECT_EQ(again.exit_code, 2);
  EXPECT_NE(again.err.find("refusing to overwrite"), std::string::npos) << again.err;
}

TEST_F(ConvertTest, BadCheckpointsAreNamed) {
  Result missing = Convert("--from " + (root_ / "nope").string() + " --to-hf " +
                           (root_ / "x").string());
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.err.find((root_ / "nope").string()), std::string::npos) << missing.err;
  EXPECT_FALSE(fs::exists(root_ / "x"));

  Result step = Convert("--from " + (root_ / "ckpt").string() + " --ckpt-step 9 --to-hf " +
                        (root_ / "y").string());
  EXPECT_EQ(step.exit_code, 2) << step.err;
  EXPECT_NE(step.err.find("iter_0000009"), std::string::npos) << step.err;

  // A truncated weights file: the error names it and no output directory appears.
  const fs::path iter = root_ / "ckpt" / "iter_0000003";
  for (const auto& e : fs::directory_iterator(iter)) {
    if (e.path().extension() == ".safetensors" && e.path().filename() != "rng_state.safetensors") {
      fs::resize_file(e.path(), fs::file_size(e.path()) / 2);
    }
  }
  Result bad = Convert("--from " + iter.string() + " --to-hf " + (root_ / "z").string());
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_NE(bad.err.find("model"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find(".safetensors"), std::string::npos) << bad.err;
  EXPECT_FALSE(fs::exists(root_ / "z"));
}

}  // namespace
}  // namespace slime
