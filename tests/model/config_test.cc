#include "slime/model/config.h"

#include <gtest/gtest.h>

#include <string>

#include "test_util.h"

namespace slime::model {
namespace {

using testing::TempDir;
using testing::WriteFile;

std::string Msg(const Status& s) { return std::string(s.message()); }

TEST(ModelConfigTest, ParsesQwen2) {
  auto c = ParseModelConfigJson(testing::TinyQwen2ConfigJson(), "q2.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->arch, ModelArch::kQwen2);
  EXPECT_EQ(c->vocab_size, 97);
  EXPECT_EQ(c->head_dim, 8);  // hidden / heads
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_FALSE(c->o_bias);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->rope.type, RopeType::kDefault);
  EXPECT_DOUBLE_EQ(c->rope.theta, 10000.0);
}

TEST(ModelConfigTest, ParsesQwen3WithExplicitHeadDim) {
  auto c = ParseModelConfigJson(testing::TinyQwen3ConfigJson(), "q3.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->arch, ModelArch::kQwen3);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->q_size(), 64);
  EXPECT_EQ(c->kv_size(), 32);
  EXPECT_TRUE(c->qk_norm);
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_FALSE(c->tie_word_embeddings);
}

TEST(ModelConfigTest, Qwen3HeadDimDefaultsTo128LikeTransformers) {
  auto c = ParseModelConfigJson(R"({"model_type": "qwen3", "vocab_size": 10, "hidden_size": 64,
      "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2})",
                                "x.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->num_key_value_heads, 2);
  EXPECT_EQ(c->max_position_embeddings, 32768);
}

TEST(ModelConfigTest, ParsesLlama3RopeScaling) {
  auto c = ParseModelConfigJson(testing::TinyLlama3ConfigJson(), "l3.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->arch, ModelArch::kLlama);
  EXPECT_EQ(c->rope.type, RopeType::kLlama3);
  EXPECT_DOUBLE_EQ(c->rope.factor, 8.0);
  EXPECT_DOUBLE_EQ(c->rope.high_freq_factor, 4.0);
  EXPECT_EQ(c->rope.original_max_position_embeddings, 64);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->q_size(), 96);
  EXPECT_DOUBLE_EQ(c->rope.theta, 500000.0);
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_TRUE(c->o_bias);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(c->bos_token_id, 0);
}

TEST(ModelConfigTest, AcceptsLegacyTypeKeyAndLinearScaling) {
  auto c = ParseModelConfigJson(R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 8,
      "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
      "rope_scaling": {"type": "linear", "factor": 2.0}})",
                                "x.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope.type, RopeType::kLinear);
  EXPECT_DOUBLE_EQ(c->rope.factor, 2.0);
}

TEST(ModelConfigTest, AcceptsTransformers5RopeParameters) {
  auto c = ParseModelConfigJson(R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 8,
      "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
      "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192},
      "layer_types": ["full_attention"], "dtype": "bfloat16"})",
                                "x.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope.type, RopeType::kLlama3);
  EXPECT_DOUBLE_EQ(c->rope.theta, 500000.0);
  EXPECT_DOUBLE_EQ(c->rope.factor, 32.0);
}

TEST(ModelConfigTest, Qwen3_0_6bShapeExampleParsesWith596MParameters) {
  auto c = LoadModelConfig(testing::ModelTestDataDir() + "/configs/qwen3-0.6b.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->NumParameters(), 596049920);
  auto tiny = LoadModelConfig(testing::ModelTestDataDir() + "/configs/qwen3-tiny.json");
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  EXPECT_EQ(tiny->arch, ModelArch::kQwen3);
}

struct BadConfigCase {
  const char* name;
  const char* json;
  const char* expect_field;  // must appear in the message
  absl::StatusCode code;
};

class BadConfigTest : public ::testing::TestWithParam<BadConfigCase> {};

TEST_P(BadConfigTest, NamesFileAndField) {
  const BadConfigCase& tc = GetParam();
  auto c = ParseModelConfigJson(tc.json, "/models/x/config.json");
  ASSERT_FALSE(c.ok()) << tc.name;
  EXPECT_EQ(c.status().code(), tc.code) << c.status();
  EXPECT_NE(Msg(c.status()).find("/models/x/config.json"), std::string::npos) << c.status();
  EXPECT_NE(Msg(c.status()).find(tc.expect_field), std::string::npos) << c.status();
}

#define BASE_FIELDS                                                                         \
  R"("vocab_size": 10, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1, )" \
  R"("num_attention_heads": 2)"

INSTANTIATE_TEST_SUITE_P(
    Cases, BadConfigTest,
    ::testing::Values(
        BadConfigCase{"invalid_json", R"({"model_type": "qwen3",)", "not valid JSON",
                      absl::StatusCode::kInvalidArgument},
        BadConfigCase{"not_object", R"([1, 2])", "JSON object", absl::StatusCode::kInvalidArgument},
        BadConfigCase{"no_model_type", "{" BASE_FIELDS "}", "model_type",
                      absl::StatusCode::kInvalidArgument},
        BadConfigCase{"unsupported_arch", R"({"model_type": "deepseek_v3", )" BASE_FIELDS "}", "deepseek_v3",
                      absl::StatusCode::kUnimplemented},
        BadConfigCase{"missing_hidden", R"({"model_type": "qwen3", "vocab_size": 10,
            "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2})",
                      "hidden_size", absl::StatusCode::kInvalidArgument},
        BadConfigCase{"string_int", R"({"model_type": "qwen3", "vocab_size": "ten",
            "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1,
            "num_attention_heads": 2})",
                      "vocab_size", absl::StatusCode::kInvalidArgument},
        BadConfigCase{"negative", R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 8,
            "intermediate_size": -8, "num_hidden_layers": 1, "num_attention_heads": 2})",
                      "intermediate_size", absl::StatusCode::kInvalidArgument},
        BadConfigCase{"kv_not_dividing",
                      R"({"model_type": "llama", )" BASE_FIELDS R"(, "num_key_value_heads": 3})",
                      "num_key_value_heads", absl::StatusCode::kInvalidArgument},
        BadConfigCase{"odd_head_dim",
                      R"({"model_type": "llama", )" BASE_FIELDS R"(, "head_dim": 3})", "head_dim",
                      absl::StatusCode::kInvalidArgument},
        BadConfigCase{"yarn",
                      R"({"model_type": "llama", )" BASE_FIELDS
                      R"(, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})",
                      "rope_scaling.rope_type", absl::StatusCode::kUnimplemented},
        BadConfigCase{"llama3_missing_factor",
                      R"({"model_type": "llama", )" BASE_FIELDS
                      R"(, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                        "low_freq_factor": 1.0, "original_max_position_embeddings": 8192}})",
                      "rope_scaling.high_freq_factor", absl::StatusCode::kInvalidArgument},
        BadConfigCase{"sliding",
                      R"({"model_type": "qwen2", )" BASE_FIELDS R"(, "use_sliding_window": true})",
                      "use_sliding_window", absl::StatusCode::kUnimplemented},
        BadConfigCase{"layer_types",
                      R"({"model_type": "qwen3", )" BASE_FIELDS
                      R"(, "layer_types": ["sliding_attention"]})",
                      "layer_types[0]", absl::StatusCode::kUnimplemented},
        BadConfigCase{"gelu",
                      R"({"model_type": "llama", )" BASE_FIELDS R"(, "hidden_act": "gelu"})",
                      "hidden_act", absl::StatusCode::kUnimplemented},
        BadConfigCase{"mlp_bias",
                      R"({"model_type": "llama", )" BASE_FIELDS R"(, "mlp_bias": true})",
                      "mlp_bias", absl::StatusCode::kUnimplemented},
        BadConfigCase{"partial_rotary",
                      R"({"model_type": "llama", )" BASE_FIELDS
                      R"(, "partial_rotary_factor": 0.5})",
                      "partial_rotary_factor", absl::StatusCode::kUnimplemented},
        BadConfigCase{"bias_not_bool",
                      R"({"model_type": "qwen3", )" BASE_FIELDS R"(, "attention_bias": "yes"})",
                      "attention_bias", absl::StatusCode::kInvalidArgument}),
    [](const ::testing::TestParamInfo<BadConfigCase>& info) { return info.param.name; });

TEST(ModelConfigTest, LoadFromDirectoryAndMissingFile) {
  TempDir dir;
  WriteFile(dir.Join("config.json"), testing::TinyQwen3ConfigJson());
  auto c = LoadModelConfig(dir.path());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->vocab_size, 101);

  auto missing = LoadModelConfig(dir.Join("nope/config.json"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(Msg(missing.status()).find("nope/config.json"), std::string::npos);
}

TEST(ModelConfigTest, TensorParallelDivisibility) {
  auto c = ParseModelConfigJson(testing::TinyQwen3ConfigJson(), "q3.json");
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(ValidateTensorParallel(*c, 1).ok());
  EXPECT_TRUE(ValidateTensorParallel(*c, 2).ok() == false);  // vocab 101 is odd
  Status s = ValidateTensorParallel(*c, 2);
  EXPECT_NE(Msg(s).find("vocab_size"), std::string::npos) << s;
  EXPECT_FALSE(ValidateTensorParallel(*c, 0).ok());
}

TEST(ModelConfigTest, NumParametersCountsBiasesNormsAndTying) {
  auto q2 = ParseModelConfigJson(testing::TinyQwen2ConfigJson(), "q2.json");
  ASSERT_TRUE(q2.ok());
  // embed 97*32 (tied) + final norm 32 + 2 layers of
  // (2*32 norms + 32*32 q + 2*32*16 kv + 32*32 o + 3*32*48 mlp + 32+16+16 biases).
  const int64_t layer = 64 + 1024 + 1024 + 1024 + 4608 + 64;
  EXPECT_EQ(q2->NumParameters(), 97 * 32 + 32 + 2 * layer);
}

}  // namespace
}  // namespace slime::model
