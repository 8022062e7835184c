// Helpers shared by the model tests: temporary directories, raw files, tiny config.json texts.
// Torch-free. Thread-safety: single test thread.
#ifndef SLIME_TESTS_MODEL_TEST_UTIL_H_
#define SLIME_TESTS_MODEL_TEST_UTIL_H_

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "remove_tree.h"

namespace slime::model::testing {

// A fresh directory under the system temp dir, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ =
        std::filesystem::temp_directory_path() / ("slime_model_test_" + std::to_string(::getpid()) +
                                                  "_" + std::to_string(counter.fetch_add(1)));
    slime::testing::RemoveTree(path_.string());
    std::filesystem::create_directories(path_);
  }
  // nftw, not std::filesystem::remove_all: that one crashes in CUDA-build executables.
  ~TempDir() { slime::testing::RemoveTree(path_.string()); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string path() const { return path_.string(); }
  std::string Join(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

inline void WriteFile(const std::string& path, const std::string& bytes) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Directory with the committed model test data (tests/data/model).
inline std::string ModelTestDataDir() {
  if (const char* src = std::getenv("SLIME_SOURCE_DIR"); src != nullptr && *src != '\0') {
    return std::string(src) + "/tests/data/model";
  }
  return SLIME_MODEL_TEST_DATA_DIR;
}

// Tiny configs of each architecture (2 layers, GQA 4:2, head_dim 8 or 16).
inline std::string TinyQwen2ConfigJson() {
  return R"({
  "model_type": "qwen2", "vocab_size": 97, "hidden_size": 32, "intermediate_size": 48,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
  "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
  "tie_word_embeddings": true, "hidden_act": "silu", "use_sliding_window": false,
  "sliding_window": null, "torch_dtype": "float32"
})";
}

inline std::string TinyQwen3ConfigJson() {
  return R"({
  "model_type": "qwen3", "vocab_size": 101, "hidden_size": 32, "intermediate_size": 64,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
  "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
  "rope_scaling": null, "tie_word_embeddings": false, "attention_bias": false,
  "hidden_act": "silu", "torch_dtype": "bfloat16"
})";
}

// Qwen3-MoE: 4 experts, 2 per token, layer 1 dense (mlp_only_layers), renormalised weights.
inline std::string TinyQwen3MoeConfigJson() {
  return R"({
  "model_type": "qwen3_moe", "vocab_size": 101, "hidden_size": 32, "intermediate_size": 48,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
  "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
  "tie_word_embeddings": false, "hidden_act": "silu", "num_experts": 4,
  "num_experts_per_tok": 2, "moe_intermediate_size": 16, "norm_topk_prob": true,
  "decoder_sparse_step": 1, "mlp_only_layers": [1], "router_aux_loss_coef": 0.01
})";
}

// Llama 3 with llama3 rope scaling and attention_bias, untied, head_dim 16 != hidden / heads.
// Original context 64: wavelengths 6.3 (kept), 32 (smoothed) and >= 167 (scaled) cover every
// regime of the llama3 rule.
inline std::string TinyLlama3ConfigJson() {
  return R"({
  "model_type": "llama", "vocab_size": 89, "hidden_size": 48, "intermediate_size": 40,
  "num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 16,
  "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
  "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
  "attention_bias": true, "mlp_bias": false, "tie_word_embeddings": false, "hidden_act": "silu",
  "eos_token_id": [1, 2], "bos_token_id": 0
})";
}

}  // namespace slime::model::testing

#endif  // SLIME_TESTS_MODEL_TEST_UTIL_H_
