#include "slime/model/checkpoint.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <string>

#include "slime/model/config.h"
#include "slime/model/weights.h"
#include "test_util.h"

namespace slime::model {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;
using testing::WriteFile;

std::string Msg(const Status& s) { return std::string(s.message()); }

std::vector<NamedTensor> SomeTensors() {
  torch::manual_seed(3);
  return {
      {"a", torch::randn({4, 6})},
      {"b.bf16", torch::randn({5}).to(torch::kBFloat16)},
      {"c.ids", torch::arange(7, torch::kLong)},
      {"d", torch::randn({8, 2})},
  };
}

TEST(CheckpointTest, SingleFileRoundTripIsZeroCopyAndOutlivesReader) {
  TempDir dir;
  auto tensors = SomeTensors();
  ASSERT_TRUE(WriteCheckpoint(dir.path(), tensors).ok());
  EXPECT_TRUE(fs::exists(dir.Join(kSafetensorsSingleFile)));
  EXPECT_FALSE(fs::exists(dir.Join(kSafetensorsIndexFile)));

  torch::Tensor a;
  {
    auto reader = CheckpointReader::Open(dir.path());
    ASSERT_TRUE(reader.ok()) << reader.status();
    EXPECT_EQ(reader->TensorNames(), (std::vector<std::string>{"a", "b.bf16", "c.ids", "d"}));
    for (const NamedTensor& nt : tensors) {
      auto t = reader->Load(nt.name);
      ASSERT_TRUE(t.ok()) << t.status();
      EXPECT_EQ(t->scalar_type(), nt.tensor.scalar_type());
      EXPECT_TRUE(torch::equal(*t, nt.tensor)) << nt.name;
    }
    // Same dtype on CPU: two loads view the same mapped bytes.
    auto a1 = reader->Load("a");
    auto a2 = reader->Load("a");
    ASSERT_TRUE(a1.ok() && a2.ok());
    EXPECT_EQ(a1->data_ptr(), a2->data_ptr());
    a = *a1;
    // Writes go to a private copy, never to the file.
    a2->add_(1.0);
  }
  // The reader is gone; the tensor keeps the mapping alive.
  EXPECT_TRUE(torch::equal(a, tensors[0].tensor + 1.0));
  auto again = CheckpointReader::Open(dir.path());
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(torch::equal(*again->Load("a"), tensors[0].tensor));
}

TEST(CheckpointTest, ConvertsDtypeOnLoad) {
  TempDir dir;
  auto tensors = SomeTensors();
  ASSERT_TRUE(WriteCheckpoint(dir.path(), tensors).ok());
  auto reader = CheckpointReader::Open(dir.path());
  ASSERT_TRUE(reader.ok());
  LoadTensorOptions to_f32;
  to_f32.dtype = torch::kFloat32;
  auto b = reader->Load("b.bf16", to_f32);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::equal(*b, tensors[1].tensor.to(torch::kFloat32)));
  LoadTensorOptions to_bf16;
  to_bf16.dtype = torch::kBFloat16;
  auto a = reader->Load("a", to_bf16);
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(torch::equal(*a, tensors[0].tensor.to(torch::kBFloat16)));
  // Integer data never silently becomes a float weight.
  auto ids = reader->Load("c.ids", to_f32);
  ASSERT_FALSE(ids.ok());
  EXPECT_NE(Msg(ids.status()).find("'c.ids' has dtype I64"), std::string::npos) << ids.status();
}

TEST(CheckpointTest, LoadsTensorParallelSlices) {
  TempDir dir;
  auto tensors = SomeTensors();
  ASSERT_TRUE(WriteCheckpoint(dir.path(), tensors).ok());
  auto reader = CheckpointReader::Open(dir.path());
  ASSERT_TRUE(reader.ok());
  for (int rank = 0; rank < 2; ++rank) {
    LoadTensorOptions rows;
    rows.slice = TensorSlice{0, rank, 2};
    auto r = reader->Load("a", rows);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(torch::equal(*r, tensors[0].tensor.narrow(0, 2 * rank, 2)));
    LoadTensorOptions cols;
    cols.slice = TensorSlice{1, rank, 2};
    cols.expected_shape = {4, 6};
    auto c = reader->Load("a", cols);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_TRUE(c->is_contiguous());
    EXPECT_TRUE(torch::equal(*c, tensors[0].tensor.narrow(1, 3 * rank, 3)));
  }
  LoadTensorOptions bad;
  bad.slice = TensorSlice{0, 0, 3};
  auto r = reader->Load("a", bad);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(Msg(r.status()).find("cannot be split into 3 parts"), std::string::npos);
}

TEST(CheckpointTest, ShardedWriteWithIndexAndStaleFileCleanup) {
  TempDir dir;
  auto tensors = SomeTensors();
  ASSERT_TRUE(WriteCheckpoint(dir.path(), tensors).ok());  // single file first
  WriteCheckpointOptions small;
  small.max_shard_bytes = 100;  // a: 96 bytes, b: 10, c: 56, d: 64
  ASSERT_TRUE(WriteCheckpoint(dir.path(), tensors, small).ok());
  EXPECT_FALSE(fs::exists(dir.Join(kSafetensorsSingleFile)));  // stale single file removed
  ASSERT_TRUE(fs::exists(dir.Join(kSafetensorsIndexFile)));
  EXPECT_TRUE(fs::exists(dir.Join("model-00001-of-00003.safetensors")));
  EXPECT_TRUE(fs::exists(dir.Join("model-00003-of-00003.safetensors")));
  const std::string index = testing::ReadFile(dir.Join(kSafetensorsIndexFile));
  EXPECT_NE(index.find("\"total_size\": 226"), std::string::npos) << index;

  auto reader = CheckpointReader::Open(dir.path());
  ASSERT_TRUE(reader.ok()) << reader.status();
  for (const NamedTensor& nt : tensors) {
    auto t = reader->Load(nt.name);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_TRUE(torch::equal(*t, nt.tensor)) << nt.name;
  }
  EXPECT_EQ(*reader->FileOf("d"), dir.Join("model-00003-of-00003.safetensors"));

  // Back to one file: shards and index go away.
  ASSERT_TRUE(WriteCheckpoint(dir.path(), tensors).ok());
  EXPECT_FALSE(fs::exists(dir.Join(kSafetensorsIndexFile)));
  EXPECT_FALSE(fs::exists(dir.Join("model-00001-of-00003.safetensors")));
  EXPECT_TRUE(fs::exists(dir.Join(kSafetensorsSingleFile)));
}

TEST(CheckpointTest, BadDirectoriesAndIndexes) {
  TempDir dir;
  auto none = CheckpointReader::Open(dir.path());
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(Msg(none.status()).find(kSafetensorsIndexFile), std::string::npos);

  WriteFile(dir.Join(kSafetensorsIndexFile), "{\"weight_map\": ");
  auto bad_json = CheckpointReader::Open(dir.path());
  ASSERT_FALSE(bad_json.ok());
  EXPECT_NE(Msg(bad_json.status()).find("not valid JSON"), std::string::npos);

  WriteFile(dir.Join(kSafetensorsIndexFile),
            R"({"weight_map": {"x": "model-00001-of-00001.safetensors"}})");
  auto missing_shard = CheckpointReader::Open(dir.path());
  ASSERT_FALSE(missing_shard.ok());
  EXPECT_NE(Msg(missing_shard.status()).find("model-00001-of-00001.safetensors"),
            std::string::npos);

  WriteFile(dir.Join(kSafetensorsIndexFile), R"({"weight_map": {"x": "../evil.safetensors"}})");
  EXPECT_FALSE(CheckpointReader::Open(dir.path()).ok());

  // Index names a tensor its shard does not hold.
  TempDir shard_dir;
  ASSERT_TRUE(WriteCheckpoint(shard_dir.path(), SomeTensors()).ok());
  fs::rename(shard_dir.Join(kSafetensorsSingleFile), shard_dir.Join("s1.safetensors"));
  WriteFile(shard_dir.Join(kSafetensorsIndexFile),
            R"({"weight_map": {"a": "s1.safetensors", "zz": "s1.safetensors"}})");
  auto lying = CheckpointReader::Open(shard_dir.path());
  ASSERT_FALSE(lying.ok());
  EXPECT_NE(Msg(lying.status()).find("'zz'"), std::string::npos) << lying.status();
}

TEST(CheckpointTest, UnloadableDtypeNamesFileAndTensor) {
  TempDir dir;
  std::string header = R"({"fp8.w": {"dtype": "F8_E4M3", "shape": [4], "data_offsets": [0, 4]}})";
  std::string bytes(8, '\0');
  bytes[0] = static_cast<char>(header.size());
  WriteFile(dir.Join(kSafetensorsSingleFile), bytes + header + std::string(4, '\0'));
  auto reader = CheckpointReader::Open(dir.path());
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto t = reader->Load("fp8.w");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(Msg(t.status()).find("'fp8.w'"), std::string::npos) << t.status();
  EXPECT_NE(Msg(t.status()).find(dir.Join(kSafetensorsSingleFile)), std::string::npos);
  EXPECT_NE(Msg(t.status()).find("F8_E4M3"), std::string::npos);
}

// --- Model weights against a checkpoint ---------------------------------------------------------

ModelConfig TinyQwen3() {
  auto c = ParseModelConfigJson(testing::TinyQwen3ConfigJson(), "q3.json");
  EXPECT_TRUE(c.ok());
  return *c;
}

TEST(WeightsCheckpointTest, SaveAndLoadRoundTrip) {
  TempDir dir;
  ModelConfig c = TinyQwen3();
  auto w = RandomWeights(c, 7, {});
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE(SaveWeights(dir.path(), *w, c).ok());
  auto reader = CheckpointReader::Open(dir.path());
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ(reader->TensorNames().size(), ParameterSpecs(c).size());
  WeightOptions bf16;
  bf16.dtype = torch::kBFloat16;
  auto loaded = LoadWeights(*reader, c, bf16);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  for (const ParamSpec& spec : ParameterSpecs(c)) {
    EXPECT_TRUE(torch::equal(ParamSlot(*loaded, spec), ParamSlot(*w, spec).to(torch::kBFloat16)))
        << spec.hf_name;
  }
}

TEST(WeightsCheckpointTest, TensorParallelLoadMatchesShardedRandomInit) {
  TempDir dir;
  auto c0 = ParseModelConfigJson(testing::TinyQwen2ConfigJson(), "q2.json");
  ASSERT_TRUE(c0.ok());
  ModelConfig c = *c0;
  c.vocab_size = 96;  // divisible by 2
  auto full = RandomWeights(c, 11, {});
  ASSERT_TRUE(full.ok());
  ASSERT_TRUE(SaveWeights(dir.path(), *full, c).ok());
  auto reader = CheckpointReader::Open(dir.path());
  ASSERT_TRUE(reader.ok());
  for (int rank = 0; rank < 2; ++rank) {
    WeightOptions o;
    o.tp_rank = rank;
    o.tp_size = 2;
    auto loaded = LoadWeights(*reader, c, o);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    auto random = RandomWeights(c, 11, o);
    ASSERT_TRUE(random.ok());
    EXPECT_TRUE(ValidateWeights(*loaded, c, rank, 2).ok());
    for (const ParamSpec& spec : ParameterSpecs(c)) {
      EXPECT_TRUE(torch::equal(ParamSlot(*loaded, spec), ParamSlot(*random, spec)))
          << spec.hf_name << " rank " << rank;
    }
    EXPECT_EQ(loaded->layers[0].q_proj.size(0), c.q_size() / 2);
    EXPECT_EQ(loaded->layers[0].o_proj.size(1), c.q_size() / 2);
  }
}

TEST(WeightsCheckpointTest, MissingTensorShapeMismatchAndWrongDtypeAreNamed) {
  ModelConfig c = TinyQwen3();
  auto w = RandomWeights(c, 1, {});
  ASSERT_TRUE(w.ok());
  std::vector<NamedTensor> named = NamedParameters(*w, c);

  {  // Missing tensor.
    TempDir dir;
    std::vector<NamedTensor> fewer;
    for (const auto& nt : named) {
      if (nt.name != "model.layers.1.mlp.up_proj.weight") fewer.push_back(nt);
    }
    ASSERT_TRUE(WriteCheckpoint(dir.path(), fewer).ok());
    auto loaded = LoadWeights(*CheckpointReader::Open(dir.path()), c, {});
    ASSERT_FALSE(loaded.ok());
    EXPECT_EQ(loaded.status().code(), absl::StatusCode::kNotFound);
    EXPECT_NE(Msg(loaded.status()).find("model.layers.1.mlp.up_proj.weight"), std::string::npos);
    EXPECT_NE(Msg(loaded.status()).find(dir.path()), std::string::npos);
  }
  {  // Shape does not match the config.
    TempDir dir;
    ASSERT_TRUE(WriteCheckpoint(dir.path(), named).ok());
    ModelConfig bigger = c;
    bigger.intermediate_size = 80;
    auto loaded = LoadWeights(*CheckpointReader::Open(dir.path()), bigger, {});
    ASSERT_FALSE(loaded.ok());
    EXPECT_NE(Msg(loaded.status()).find("model.layers.0.mlp.gate_proj.weight"), std::string::npos)
        << loaded.status();
    EXPECT_NE(Msg(loaded.status()).find("[64, 32]"), std::string::npos);
    EXPECT_NE(Msg(loaded.status()).find("[80, 32]"), std::string::npos);
    EXPECT_NE(Msg(loaded.status()).find(dir.Join(kSafetensorsSingleFile)), std::string::npos);
  }
  {  // Integer dtype for a weight.
    TempDir dir;
    std::vector<NamedTensor> wrong = named;
    for (auto& nt : wrong) {
      if (nt.name == "model.norm.weight") nt.tensor = nt.tensor.to(torch::kInt);
    }
    ASSERT_TRUE(WriteCheckpoint(dir.path(), wrong).ok());
    auto loaded = LoadWeights(*CheckpointReader::Open(dir.path()), c, {});
    ASSERT_FALSE(loaded.ok());
    EXPECT_NE(Msg(loaded.status()).find("'model.norm.weight' has dtype I32"), std::string::npos)
        << loaded.status();
  }
  {  // Truncated file.
    TempDir dir;
    ASSERT_TRUE(WriteCheckpoint(dir.path(), named).ok());
    std::string bytes = testing::ReadFile(dir.Join(kSafetensorsSingleFile));
    WriteFile(dir.Join(kSafetensorsSingleFile), bytes.substr(0, bytes.size() / 2));
    auto reader = CheckpointReader::Open(dir.path());
    ASSERT_FALSE(reader.ok());
    EXPECT_EQ(reader.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(Msg(reader.status()).find("truncated"), std::string::npos) << reader.status();
  }
}

}  // namespace
}  // namespace slime::model
