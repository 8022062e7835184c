#include "slime/model/init_random_model.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "slime/model/checkpoint.h"
#include "slime/model/decoder.h"
#include "test_util.h"

namespace slime::model {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;
using testing::WriteFile;

std::string Msg(const Status& s) { return std::string(s.message()); }

// A config dir and a tokenizer dir for the tiny Qwen3 (vocab 101).
struct Inputs {
  TempDir dir;
  std::string config;
  std::string tokenizer;
  Inputs() {
    config = dir.Join("cfg/config.json");
    WriteFile(config, testing::TinyQwen3ConfigJson());
    tokenizer = dir.Join("tok");
    WriteFile(dir.Join("tok/tokenizer.json"),
              R"({"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}},
                  "added_tokens": [{"id": 100, "content": "<|end|>", "special": true}]})");
    WriteFile(dir.Join("tok/tokenizer_config.json"), R"({"eos_token": "<|end|>"})");
  }
};

TEST(InitRandomModelTest, WritesACompleteLoadableHfDirectory) {
  Inputs in;
  const std::string out = in.dir.Join("out/model");
  ASSERT_TRUE(InitRandomModel(in.config, in.tokenizer, out, 123, "fp32").ok());
  for (const char* f :
       {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}) {
    EXPECT_TRUE(fs::exists(fs::path(out) / f)) << f;
  }
  EXPECT_FALSE(fs::exists(fs::path(out) / "special_tokens_map.json"));
  auto cfg = nlohmann::json::parse(testing::ReadFile(out + "/config.json"));
  EXPECT_EQ(cfg["torch_dtype"], "float32");
  EXPECT_EQ(cfg["head_dim"], 16);  // other keys kept
  EXPECT_EQ(testing::ReadFile(out + "/tokenizer.json"),
            testing::ReadFile(in.tokenizer + "/tokenizer.json"));
  // No temporaries left beside the output.
  for (const auto& e : fs::directory_iterator(in.dir.Join("out"))) {
    EXPECT_EQ(e.path().filename().string(), "model");
  }

  auto model = DecoderModel::Load(out, torch::kFloat32, torch::kCPU);
  ASSERT_TRUE(model.ok()) << model.status();
  auto h = (*model)->ForwardPacked(torch::tensor({1, 2, 100}, torch::kLong), {0, 3});
  ASSERT_TRUE(h.ok()) << h.status();
  // Weights equal RandomWeights with the same seed.
  auto config = LoadModelConfig(out);
  ASSERT_TRUE(config.ok());
  auto w = RandomWeights(*config, 123, {});
  ASSERT_TRUE(w.ok());
  EXPECT_TRUE(torch::equal((*model)->weights().layers[1].q_proj, w->layers[1].q_proj));
}

TEST(InitRandomModelTest, SameSeedSameBytesAndShardedEqualsSingle) {
  Inputs in;
  const std::string a = in.dir.Join("a"), b = in.dir.Join("b"), c = in.dir.Join("c");
  ASSERT_TRUE(InitRandomModel(in.config, in.tokenizer, a, 7, "bf16").ok());
  ASSERT_TRUE(InitRandomModel(in.config, in.tokenizer, b, 7, "bf16").ok());
  EXPECT_EQ(testing::ReadFile(a + "/model.safetensors"),
            testing::ReadFile(b + "/model.safetensors"));
  EXPECT_EQ(nlohmann::json::parse(testing::ReadFile(a + "/config.json"))["torch_dtype"],
            "bfloat16");

  InitRandomModelOptions o;
  o.config_json_path = in.dir.Join("cfg");  // a directory works too
  o.tokenizer_dir = in.tokenizer;
  o.out_dir = c;
  o.seed = 7;
  o.dtype = "bfloat16";
  o.max_shard_bytes = 8 << 10;
  ASSERT_TRUE(InitRandomModel(o).ok());
  EXPECT_TRUE(fs::exists(c + "/" + kSafetensorsIndexFile));
  EXPECT_FALSE(fs::exists(c + "/model.safetensors"));
  auto ra = CheckpointReader::Open(a);
  auto rc = CheckpointReader::Open(c);
  ASSERT_TRUE(ra.ok() && rc.ok()) << rc.status();
  ASSERT_EQ(ra->TensorNames(), rc->TensorNames());
  for (const std::string& name : ra->TensorNames()) {
    EXPECT_TRUE(torch::equal(*ra->Load(name), *rc->Load(name))) << name;
    EXPECT_EQ(ra->Load(name)->scalar_type(), torch::kBFloat16);
  }
}

TEST(InitRandomModelTest, ErrorsNameTheProblemAndLeaveNothingBehind) {
  Inputs in;
  auto expect_error = [&](const Status& s, const std::string& needle) {
    ASSERT_FALSE(s.ok()) << needle;
    EXPECT_NE(Msg(s).find(needle), std::string::npos) << s;
  };
  const std::string out = in.dir.Join("o");
  expect_error(InitRandomModel(in.config, in.tokenizer, out, 1, "fp16"), "fp16");
  expect_error(InitRandomModel(in.dir.Join("nope.json"), in.tokenizer, out, 1, "bf16"),
               "nope.json");
  expect_error(InitRandomModel(in.config, in.dir.Join("no_tok"), out, 1, "bf16"),
               "no_tok/tokenizer.json");

  // A tokenizer id beyond the config's vocabulary.
  WriteFile(in.dir.Join("big/tokenizer.json"),
            R"({"model": {"vocab": {"a": 0}}, "added_tokens": [{"id": 101}]})");
  expect_error(InitRandomModel(in.config, in.dir.Join("big"), out, 1, "bf16"), "vocab_size");

  // A malformed config.
  WriteFile(in.dir.Join("bad/config.json"), R"({"model_type": "gpt2"})");
  expect_error(InitRandomModel(in.dir.Join("bad/config.json"), in.tokenizer, out, 1, "bf16"),
               "gpt2");
  EXPECT_FALSE(fs::exists(out));

  // Never overwrite.
  WriteFile(in.dir.Join("full/keep.txt"), "x");
  Status s = InitRandomModel(in.config, in.tokenizer, in.dir.Join("full"), 1, "bf16");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(testing::ReadFile(in.dir.Join("full/keep.txt")), "x");
  // Nothing else appeared in the parent.
  int entries = 0;
  for (const auto& e : fs::directory_iterator(in.dir.path())) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 5);  // cfg, tok, big, bad, full
}

}  // namespace
}  // namespace slime::model
