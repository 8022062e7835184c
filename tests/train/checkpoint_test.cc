// Trainer checkpoints: bitwise round trips (weights, optimizer, RNG, next step), layout and
// tracker, keep-last rotation, interrupted saves, and corrupt or mismatched checkpoints that must
// fail with the file named and the model untouched.
#include "slime/train/checkpoint.h"

#include <dirent.h>
#include <ftw.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "slime/model/checkpoint.h"
#include "slime/model/config.h"
#include "slime/model/decoder.h"
#include "slime/model/ffn/dense_mlp.h"
#include "slime/model/weights.h"
#include "slime/train/optimizer.h"

#ifndef SLIME_MODEL_TEST_DATA_DIR
#define SLIME_MODEL_TEST_DATA_DIR ""  // test_util.h's data dir is not used here
#endif
#include "../model/test_util.h"

namespace slime::train {
namespace {

using model::testing::ReadFile;
using model::testing::WriteFile;

std::string Msg(const Status& s) { return std::string(s.message()); }

// A scratch directory, removed with nftw: std::filesystem::remove_all (test_util.h's TempDir)
// crashes in GPU-machine builds where std::filesystem binds to the copy libtorch exports.
class ScratchDir {
 public:
  ScratchDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") +
                       "/slime_train_ckpt_test_XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) ADD_FAILURE() << "mkdtemp failed for " << tmpl;
    path_ = tmpl;
  }
  ~ScratchDir() {
    auto remove_one = [](const char* p, const struct stat*, int, struct FTW*) {
      return ::remove(p);
    };
    ::nftw(path_.c_str(), remove_one, 16, FTW_DEPTH | FTW_PHYS);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::string& path() const { return path_; }
  std::string Join(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Sorted entry names of `dir` (without "." and "..").
std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") out.push_back(name);
    }
    ::closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

void Truncate(const std::string& path, int64_t remove_bytes) {
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0) << path;
  ASSERT_EQ(::truncate(path.c_str(), st.st_size - remove_bytes), 0) << path;
}

model::ModelConfig TinyConfig() {
  return *model::ParseModelConfigJson(model::testing::TinyQwen3ConfigJson(), "tiny-qwen3");
}

// A model and its optimizer.
struct Trainee {
  model::ModelConfig config;
  model::ModelWeights weights;
  std::unique_ptr<AdamW> optimizer;
};

Trainee MakeTrainee(uint64_t seed, torch::ScalarType dtype,
                    const model::ModelConfig& config = TinyConfig(),
                    torch::Device device = torch::kCPU) {
  Trainee t;
  t.config = config;
  model::WeightOptions wo;
  wo.dtype = dtype;
  wo.device = device;
  auto weights = model::RandomWeights(config, seed, wo);
  EXPECT_TRUE(weights.ok()) << weights.status();
  t.weights = *weights;
  for (model::NamedTensor& nt : model::NamedParameters(t.weights, config)) {
    nt.tensor.set_requires_grad(true);
  }
  AdamWOptions o;
  o.weight_decay = 0.1;
  auto opt = AdamW::ForModel(t.weights, config, o);
  EXPECT_TRUE(opt.ok()) << opt.status();
  t.optimizer = std::move(*opt);
  return t;
}

// Deterministic gradients (no RNG, so the generator states stay under the test's control).
void FakeStep(Trainee& t, double phase) {
  for (model::NamedTensor& nt : model::NamedParameters(t.weights, t.config)) {
    const torch::Tensor x = torch::arange(nt.tensor.numel(), torch::kFloat32);
    nt.tensor.mutable_grad() = torch::sin(x * 0.37 + phase)
                                   .reshape(nt.tensor.sizes())
                                   .to(nt.tensor.device(), nt.tensor.scalar_type());
  }
  auto r = t.optimizer->Step(1e-2);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_FALSE(r->skipped);
}

std::vector<torch::Tensor> Snapshot(const Trainee& t) {
  std::vector<torch::Tensor> out;
  for (const model::NamedTensor& nt : model::NamedParameters(t.weights, t.config)) {
    out.push_back(nt.tensor.detach().clone());
  }
  for (const model::NamedTensor& nt : t.optimizer->ExportState().tensors) {
    out.push_back(nt.tensor.clone());
  }
  out.push_back(torch::tensor({t.optimizer->step()}));
  return out;
}

void ExpectSame(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].scalar_type(), b[i].scalar_type()) << "tensor " << i;
    EXPECT_TRUE(torch::equal(a[i], b[i])) << "tensor " << i;
  }
}

TrainerProgress Progress(int64_t step, int64_t rollout_id) {
  TrainerProgress p;
  p.step = step;
  p.rollout_id = rollout_id;
  p.lr_scheduler_json = R"({"num_steps": 40, "style": "cosine"})";
  p.data_source_json = R"({"epoch_id": 2, "sample_offset": 128})";
  return p;
}

StatusOr<std::string> Save(const std::string& save_dir, int64_t iteration, const Trainee& t,
                           int keep_last = 0, bool save_optimizer = true) {
  SaveCheckpointOptions o;
  o.save_dir = save_dir;
  o.iteration = iteration;
  o.keep_last = keep_last;
  o.save_optimizer = save_optimizer;
  return SaveTrainerCheckpoint(o, t.weights, t.config, t.optimizer.get(),
                               Progress(iteration * 2, iteration));
}

StatusOr<LoadedCheckpoint> Load(const std::string& load_dir, Trainee& t,
                                std::optional<int64_t> ckpt_step = std::nullopt,
                                bool load_optimizer = true) {
  LoadCheckpointOptions o;
  o.load_dir = load_dir;
  o.ckpt_step = ckpt_step;
  o.load_optimizer = load_optimizer;
  return LoadTrainerCheckpoint(o, t.weights, t.config, t.optimizer.get());
}

class RoundTripTest : public ::testing::TestWithParam<torch::ScalarType> {};

// Save after two steps; a different model loads it and then matches bit for bit: weights,
// masters, moments, step, progress, the next torch::rand, and the next optimizer step.
TEST_P(RoundTripTest, SaveLoadIsBitwiseAndTheNextStepMatches) {
  ScratchDir dir;
  Trainee a = MakeTrainee(1, GetParam());
  FakeStep(a, 0.0);
  FakeStep(a, 1.0);
  torch::manual_seed(1234);
  (void)torch::rand({3});  // move the generator off its seed state
  auto saved = Save(dir.path(), 7, a);
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(*saved, dir.Join("iter_0000007"));
  const torch::Tensor rand_after_save = torch::rand({16});
  const std::vector<torch::Tensor> a_state = Snapshot(a);

  Trainee b = MakeTrainee(2, GetParam());
  torch::manual_seed(99);
  auto loaded = Load(dir.path(), b);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->dir, dir.Join("iter_0000007"));
  EXPECT_EQ(loaded->iteration, 7);
  EXPECT_EQ(loaded->progress.step, 14);
  EXPECT_EQ(loaded->progress.rollout_id, 7);
  EXPECT_EQ(nlohmann::json::parse(loaded->progress.lr_scheduler_json),
            nlohmann::json::parse(R"({"num_steps": 40, "style": "cosine"})"));
  EXPECT_EQ(nlohmann::json::parse(loaded->progress.data_source_json)["sample_offset"], 128);
  EXPECT_TRUE(loaded->optimizer_loaded);
  EXPECT_TRUE(loaded->rng_loaded);
  EXPECT_TRUE(torch::equal(torch::rand({16}), rand_after_save));
  ExpectSame(Snapshot(b), a_state);
  EXPECT_EQ(b.optimizer->has_master_weights(), GetParam() != torch::kFloat32);

  FakeStep(a, 2.0);
  FakeStep(b, 2.0);
  ExpectSame(Snapshot(b), Snapshot(a));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, RoundTripTest,
                         ::testing::Values(torch::kFloat32, torch::kBFloat16),
                         [](const auto& info) {
                           return std::string(info.param == torch::kFloat32 ? "Float32"
                                                                            : "BFloat16");
                         });

TEST(CheckpointTest, LayoutIsAnHfModelDirectoryPlusTrainerFiles) {
  ScratchDir dir;
  Trainee a = MakeTrainee(1, torch::kBFloat16);
  FakeStep(a, 0.0);
  auto saved = Save(dir.path(), 10, a);
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(ReadFile(dir.Join(kCheckpointTrackerFile)), "10");
  for (const char* f : {"config.json", "model.safetensors", "optimizer.safetensors",
                        "rng_state.safetensors", "trainer_state.json"}) {
    EXPECT_TRUE(Exists(*saved + "/" + f)) << f;
  }
  EXPECT_EQ(ListDir(dir.path()),
            (std::vector<std::string>{"iter_0000010", kCheckpointTrackerFile}));

  const auto state = nlohmann::json::parse(ReadFile(*saved + "/trainer_state.json"));
  EXPECT_EQ(state["format_version"], kCheckpointFormatVersion);
  EXPECT_EQ(state["iteration"], 10);
  EXPECT_EQ(state["step"], 20);
  EXPECT_EQ(state["rollout_id"], 10);
  EXPECT_EQ(state["lr_scheduler"]["style"], "cosine");
  EXPECT_EQ(state["data_source"]["epoch_id"], 2);
  EXPECT_EQ(state["model_config"]["hidden_size"], 32);
  EXPECT_EQ(state["model_dtype"], "bfloat16");
  EXPECT_EQ(state["has_optimizer_state"], true);

  // The engine's loader reads the directory as an HF model: same config, same weights.
  auto config = model::LoadModelConfig(*saved);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->model_type, "qwen3");
  EXPECT_EQ(config->head_dim, 16);
  EXPECT_TRUE(config->qk_norm);
  auto decoder = model::DecoderModel::Load(*saved, torch::kBFloat16, torch::kCPU);
  ASSERT_TRUE(decoder.ok()) << decoder.status();
  const auto loaded = model::NamedParameters((*decoder)->weights(), (*decoder)->config());
  const auto original = model::NamedParameters(a.weights, a.config);
  ASSERT_EQ(loaded.size(), original.size());
  for (size_t i = 0; i < loaded.size(); ++i) {
    EXPECT_TRUE(torch::equal(loaded[i].tensor, original[i].tensor)) << loaded[i].name;
  }

  // The optimizer file: float32 masters and moments, the step in the metadata.
  auto opt_file = model::SafetensorsFile::Open(*saved + "/optimizer.safetensors");
  ASSERT_TRUE(opt_file.ok()) << opt_file.status();
  EXPECT_EQ((*opt_file)->metadata().at("step"), "1");
  EXPECT_NE((*opt_file)->Find("model.layers.0.self_attn.q_proj.weight.master"), nullptr);
  EXPECT_NE((*opt_file)->Find("model.norm.weight.exp_avg_sq"), nullptr);
}

TEST(CheckpointTest, KeepLastRotatesAndCkptStepPicksAnIteration) {
  ScratchDir dir;
  Trainee a = MakeTrainee(1, torch::kFloat32);
  for (int it = 1; it <= 5; ++it) {
    FakeStep(a, it);
    ASSERT_TRUE(Save(dir.path(), it, a, /*keep_last=*/2).ok());
  }
  EXPECT_EQ(ListDir(dir.path()),
            (std::vector<std::string>{"iter_0000004", "iter_0000005", kCheckpointTrackerFile}));
  EXPECT_EQ(ReadFile(dir.Join(kCheckpointTrackerFile)), "5");

  Trainee b = MakeTrainee(2, torch::kFloat32);
  auto four = Load(dir.path(), b, 4);
  ASSERT_TRUE(four.ok()) << four.status();
  EXPECT_EQ(four->iteration, 4);
  auto two = Load(dir.path(), b, 2);
  EXPECT_EQ(two.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(Msg(two.status()).find("iter_0000002"), std::string::npos) << two.status();

  // An iteration directory can be named directly.
  auto direct = Load(dir.Join("iter_0000005"), b);
  ASSERT_TRUE(direct.ok()) << direct.status();
  EXPECT_EQ(direct->iteration, 5);
  EXPECT_EQ(ResolveCheckpointDir(dir.path()).value(), dir.Join("iter_0000005"));

  // Saving an existing iteration again replaces it.
  FakeStep(a, 9.0);
  ASSERT_TRUE(Save(dir.path(), 5, a, 2).ok());
  Trainee c = MakeTrainee(3, torch::kFloat32);
  ASSERT_TRUE(Load(dir.path(), c).ok());
  ExpectSame(Snapshot(c), Snapshot(a));
}

TEST(CheckpointTest, InterruptedSaveIsIgnoredAndCleanedByTheNextSave) {
  ScratchDir dir;
  Trainee a = MakeTrainee(1, torch::kFloat32);
  FakeStep(a, 0.0);
  ASSERT_TRUE(Save(dir.path(), 1, a).ok());
  const std::vector<torch::Tensor> at_one = Snapshot(a);
  // A crash while writing iteration 2: a half-written temporary directory.
  WriteFile(dir.Join(".tmp-iter_0000002/model.safetensors"), "partial");
  WriteFile(dir.Join(".tmp-iter_0000002/config.json"), "{");

  Trainee b = MakeTrainee(2, torch::kFloat32);
  auto loaded = Load(dir.path(), b);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->iteration, 1);
  ExpectSame(Snapshot(b), at_one);

  FakeStep(a, 1.0);
  ASSERT_TRUE(Save(dir.path(), 2, a).ok());
  EXPECT_FALSE(Exists(dir.Join(".tmp-iter_0000002")));
  EXPECT_TRUE(Exists(dir.Join("iter_0000002/trainer_state.json")));
  EXPECT_EQ(ReadFile(dir.Join(kCheckpointTrackerFile)), "2");
}

// Each corruption: the load fails, the message names the file and the problem, and neither the
// model nor the optimizer changed.
class CorruptCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Trainee a = MakeTrainee(1, torch::kBFloat16);
    FakeStep(a, 0.0);
    auto saved = Save(dir_.path(), 3, a);
    ASSERT_TRUE(saved.ok()) << saved.status();
    iter_dir_ = *saved;
    config_ = a.config;
    names_ = model::NamedParameters(a.weights, a.config);
  }

  // Loads into a fresh model and checks the failure.
  void ExpectLoadFails(const std::string& file, const std::string& what,
                       const model::ModelConfig& config = TinyConfig()) {
    Trainee b = MakeTrainee(2, torch::kBFloat16, config);
    FakeStep(b, 5.0);
    const std::vector<torch::Tensor> before = Snapshot(b);
    torch::manual_seed(5);
    const torch::Tensor expected_next = torch::rand({4});
    torch::manual_seed(5);
    auto loaded = Load(dir_.path(), b);
    ASSERT_FALSE(loaded.ok()) << "loaded a broken checkpoint (" << what << ")";
    EXPECT_NE(Msg(loaded.status()).find(file), std::string::npos)
        << "message should name " << file << ": " << loaded.status();
    EXPECT_NE(Msg(loaded.status()).find(what), std::string::npos)
        << "message should say " << what << ": " << loaded.status();
    ExpectSame(Snapshot(b), before);
    EXPECT_TRUE(torch::equal(torch::rand({4}), expected_next)) << "RNG state was changed";
  }

  std::string Path(const std::string& name) const { return iter_dir_ + "/" + name; }

  ScratchDir dir_;
  std::string iter_dir_;
  model::ModelConfig config_;
  std::vector<model::NamedTensor> names_;
};

TEST_F(CorruptCheckpointTest, TruncatedModelSafetensors) {
  struct stat st;
  ASSERT_EQ(::stat(Path("model.safetensors").c_str(), &st), 0);
  Truncate(Path("model.safetensors"), st.st_size / 2);
  ExpectLoadFails(Path("model.safetensors"), "");
}

TEST_F(CorruptCheckpointTest, TruncatedOptimizerSafetensors) {
  Truncate(Path("optimizer.safetensors"), 100);
  ExpectLoadFails(Path("optimizer.safetensors"), "");
}

TEST_F(CorruptCheckpointTest, MissingOptimizerFile) {
  ASSERT_EQ(std::remove(Path("optimizer.safetensors").c_str()), 0);
  ExpectLoadFails(Path("optimizer.safetensors"), "missing");
}

TEST_F(CorruptCheckpointTest, MissingRngFile) {
  ASSERT_EQ(std::remove(Path("rng_state.safetensors").c_str()), 0);
  ExpectLoadFails(Path("rng_state.safetensors"), "missing");
}

TEST_F(CorruptCheckpointTest, MissingConfigJson) {
  ASSERT_EQ(std::remove(Path("config.json").c_str()), 0);
  ExpectLoadFails(Path("config.json"), "missing");
}

TEST_F(CorruptCheckpointTest, MissingTrainerState) {
  ASSERT_EQ(std::remove(Path("trainer_state.json").c_str()), 0);
  ExpectLoadFails("iter_0000003", "trainer_state.json");
}

TEST_F(CorruptCheckpointTest, WrongModelConfig) {
  // The model being loaded has a wider MLP than the checkpoint.
  auto json = nlohmann::json::parse(model::testing::TinyQwen3ConfigJson());
  json["intermediate_size"] = 96;
  auto other = model::ParseModelConfigJson(json.dump(), "other");
  ASSERT_TRUE(other.ok());
  ExpectLoadFails(Path("trainer_state.json"), "intermediate_size is 64 in the checkpoint but 96",
                  *other);
}

TEST_F(CorruptCheckpointTest, ConfigJsonOfAnotherModel) {
  auto json = nlohmann::json::parse(ReadFile(Path("config.json")));
  json["num_hidden_layers"] = 3;
  WriteFile(Path("config.json"), json.dump());
  ExpectLoadFails(Path("config.json"), "num_hidden_layers is 3 in the checkpoint but 2");
}

TEST_F(CorruptCheckpointTest, WrongShapeWeight) {
  std::vector<model::NamedTensor> tensors = names_;
  for (model::NamedTensor& nt : tensors) {
    if (nt.name == "model.layers.1.mlp.down_proj.weight") nt.tensor = torch::zeros({32, 60});
  }
  ASSERT_TRUE(model::WriteCheckpoint(iter_dir_, tensors).ok());
  ExpectLoadFails(Path("model.safetensors"),
                  "\"model.layers.1.mlp.down_proj.weight\" has shape [32, 60]");
}

TEST_F(CorruptCheckpointTest, MissingWeight) {
  std::vector<model::NamedTensor> tensors;
  for (const model::NamedTensor& nt : names_) {
    if (nt.name != "model.norm.weight") tensors.push_back(nt);
  }
  ASSERT_TRUE(model::WriteCheckpoint(iter_dir_, tensors).ok());
  ExpectLoadFails(Path("model.safetensors"), "\"model.norm.weight\" is missing");
}

TEST_F(CorruptCheckpointTest, OptimizerStateOfOtherShape) {
  auto file = model::SafetensorsFile::Open(Path("optimizer.safetensors"));
  ASSERT_TRUE(file.ok());
  std::vector<float> zeros(7, 0.0f);
  std::vector<model::SafetensorsWriteEntry> entries;
  for (const auto& info : (*file)->tensors()) {
    model::SafetensorsWriteEntry e{info.name, info.dtype, info.shape, (*file)->Data(info),
                                   info.nbytes()};
    if (info.name == "model.norm.weight.exp_avg") {
      e.shape = {7};
      e.data = zeros.data();
      e.nbytes = 7 * sizeof(float);
    }
    entries.push_back(e);
  }
  ASSERT_TRUE(
      model::WriteSafetensors(Path("optimizer.safetensors"), entries, (*file)->metadata()).ok());
  ExpectLoadFails(Path("optimizer.safetensors"), "\"model.norm.weight.exp_avg\" has shape [7]");
}

TEST_F(CorruptCheckpointTest, NewerFormatVersion) {
  auto json = nlohmann::json::parse(ReadFile(Path("trainer_state.json")));
  json["format_version"] = kCheckpointFormatVersion + 1;
  WriteFile(Path("trainer_state.json"), json.dump());
  ExpectLoadFails(Path("trainer_state.json"), "format_version 2 is not supported");
}

TEST_F(CorruptCheckpointTest, BadTracker) {
  WriteFile(dir_.Join(kCheckpointTrackerFile), "three");
  ExpectLoadFails(kCheckpointTrackerFile, "expected a non-negative iteration number");
}

TEST(CheckpointTest, NoSaveOptimAndNoLoadOptim) {
  ScratchDir dir;
  Trainee a = MakeTrainee(1, torch::kBFloat16);
  FakeStep(a, 0.0);
  ASSERT_TRUE(Save(dir.path(), 1, a, 0, /*save_optimizer=*/false).ok());
  EXPECT_FALSE(Exists(dir.Join("iter_0000001/optimizer.safetensors")));

  Trainee b = MakeTrainee(2, torch::kBFloat16);
  auto with_optim = Load(dir.path(), b);
  EXPECT_EQ(with_optim.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(Msg(with_optim.status()).find("no_load_optim"), std::string::npos);

  auto weights_only = Load(dir.path(), b, std::nullopt, /*load_optimizer=*/false);
  ASSERT_TRUE(weights_only.ok()) << weights_only.status();
  EXPECT_FALSE(weights_only->optimizer_loaded);
  const auto got = model::NamedParameters(b.weights, b.config);
  const auto want = model::NamedParameters(a.weights, a.config);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(torch::equal(got[i].tensor, want[i].tensor)) << got[i].name;
  }
  // The masters follow the loaded weights (a step from here starts at the loaded values).
  const OptimizerState s = b.optimizer->ExportState();
  for (const model::NamedTensor& nt : s.tensors) {
    if (nt.name == "model.norm.weight.master") {
      EXPECT_TRUE(torch::equal(nt.tensor, a.weights.final_norm.to(torch::kFloat32)));
    }
  }
}

// A float32 run's checkpoint resumed by a bf16 model: the float32 weights become the masters.
TEST(CheckpointTest, Float32CheckpointIntoBf16ModelKeepsFullPrecisionMasters) {
  ScratchDir dir;
  Trainee a = MakeTrainee(1, torch::kFloat32);
  FakeStep(a, 0.0);
  ASSERT_TRUE(Save(dir.path(), 1, a).ok());
  Trainee b = MakeTrainee(2, torch::kBFloat16);
  auto loaded = Load(dir.path(), b);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  for (const model::NamedTensor& nt : b.optimizer->ExportState().tensors) {
    if (nt.name == "model.layers.0.mlp.up_proj.weight.master") {
      EXPECT_TRUE(
          torch::equal(nt.tensor, a.weights.layers[0].ffn.params[model::DenseMlp::kUpProj]));
    }
  }
  const torch::Tensor& up_b = b.weights.layers[0].ffn.params[model::DenseMlp::kUpProj];
  const torch::Tensor& up_a = a.weights.layers[0].ffn.params[model::DenseMlp::kUpProj];
  EXPECT_TRUE(torch::equal(up_b, up_a.to(torch::kBFloat16)));
}

// On the GPU machine: a bf16 model on CUDA round-trips bit for bit, the CUDA generator
// included, and its checkpoint also resumes a float32 model on the CPU (masters become the
// parameters).
TEST(CheckpointTest, CudaRoundTripRestoresTheCudaGenerator) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const torch::Device cuda(torch::kCUDA, 0);
  ScratchDir dir;
  Trainee a = MakeTrainee(1, torch::kBFloat16, TinyConfig(), cuda);
  FakeStep(a, 0.0);
  FakeStep(a, 1.0);
  torch::manual_seed(77);  // seeds the CUDA generators too
  (void)torch::rand({5}, torch::TensorOptions().device(cuda));
  ASSERT_TRUE(Save(dir.path(), 2, a).ok());
  const torch::Tensor next_cuda = torch::rand({16}, torch::TensorOptions().device(cuda));
  const torch::Tensor next_cpu = torch::rand({16});
  const std::vector<torch::Tensor> a_state = Snapshot(a);
  torch::Tensor o_proj_master;
  for (const model::NamedTensor& nt : a.optimizer->ExportState().tensors) {
    if (nt.name == "model.layers.1.self_attn.o_proj.weight.master") o_proj_master = nt.tensor.cpu();
  }
  ASSERT_TRUE(o_proj_master.defined());

  Trainee b = MakeTrainee(2, torch::kBFloat16, TinyConfig(), cuda);
  torch::manual_seed(3);
  auto loaded = Load(dir.path(), b);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(torch::equal(torch::rand({16}, torch::TensorOptions().device(cuda)), next_cuda));
  EXPECT_TRUE(torch::equal(torch::rand({16}), next_cpu));
  ExpectSame(Snapshot(b), a_state);
  EXPECT_TRUE(b.weights.embed_tokens.is_cuda());
  for (const model::NamedTensor& nt : b.optimizer->ExportState().tensors) {
    EXPECT_TRUE(nt.tensor.is_cuda()) << nt.name;
  }
  FakeStep(a, 2.0);
  FakeStep(b, 2.0);
  ExpectSame(Snapshot(b), Snapshot(a));

  Trainee c = MakeTrainee(3, torch::kFloat32);
  ASSERT_TRUE(Load(dir.path(), c).ok());
  EXPECT_TRUE(torch::equal(c.weights.layers[1].o_proj, o_proj_master));
}

TEST(CheckpointTest, BadSaveArguments) {
  ScratchDir dir;
  Trainee a = MakeTrainee(1, torch::kFloat32);
  SaveCheckpointOptions o;
  o.save_dir = dir.path();
  o.iteration = 1;
  TrainerProgress p;
  p.lr_scheduler_json = "[1, 2]";
  auto r = SaveTrainerCheckpoint(o, a.weights, a.config, a.optimizer.get(), p);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(Msg(r.status()).find("lr_scheduler"), std::string::npos);
  p.lr_scheduler_json = "{}";
  o.iteration = -1;
  EXPECT_EQ(SaveTrainerCheckpoint(o, a.weights, a.config, nullptr, p).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.iteration = 1;
  o.save_dir = "";
  EXPECT_EQ(SaveTrainerCheckpoint(o, a.weights, a.config, nullptr, p).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Nothing was written by the failed saves.
  EXPECT_TRUE(ListDir(dir.path()).empty());

  auto not_ckpt = ResolveCheckpointDir(dir.path());
  EXPECT_EQ(not_ckpt.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(Msg(not_ckpt.status()).find("not a trainer checkpoint"), std::string::npos);
}

}  // namespace
}  // namespace slime::train
