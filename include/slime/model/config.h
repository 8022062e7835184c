// ModelConfig: the architecture of a decoder-only LM, read from a Hugging Face `config.json`.
//
// Supported `model_type`s: "llama" (incl. Llama-3 `rope_scaling` type "llama3"), "qwen2",
// "qwen3", "qwen3_moe" (Qwen3 attention with mixture-of-experts feed-forward layers, MoeConfig).
// Both config layouts written by transformers are accepted: the 4.x one (`rope_theta` +
// `rope_scaling`) and the 5.x one (`rope_parameters`). Fields we do not implement (sliding
// window attention, other activations, MLP bias, partial rotary, other RoPE types) are errors
// that name the file and the field; keys that do not change the math are ignored.
//
// Adding an architecture means: a ModelArch value, a row in the arch table in config.cc
// (defaults and which fields it reads), and its extra fields in a sub-struct here (MoeConfig).
//
// Thread-safety: plain values; the parse functions are pure. Torch-free header.
#ifndef SLIME_MODEL_CONFIG_H_
#define SLIME_MODEL_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "slime/common/status.h"

namespace slime::model {

enum class ModelArch { kLlama, kQwen2, kQwen3, kQwen3Moe };

// The `model_type` string of an architecture ("llama", "qwen2", "qwen3", "qwen3_moe").
const char* ModelArchName(ModelArch arch);

// Rotary embedding variant. kDefault: inv_freq = theta^(-2i/d). kLinear: inv_freq / factor.
// kLlama3: Llama 3.1's wavelength-dependent interpolation.
enum class RopeType { kDefault, kLinear, kLlama3 };

struct RopeConfig {
  RopeType type = RopeType::kDefault;
  double theta = 10000.0;
  double factor = 1.0;                           // kLinear, kLlama3
  double low_freq_factor = 1.0;                  // kLlama3
  double high_freq_factor = 4.0;                 // kLlama3
  int64_t original_max_position_embeddings = 0;  // kLlama3
};

// The mixture-of-experts fields of "qwen3_moe" (HF Qwen3MoeConfig; its defaults where a key is
// absent). num_experts == 0 (the default of the other architectures) means no sparse layer.
// Layer i is sparse (the "moe" feed-forward block, ffn/moe.h) iff i is not in mlp_only_layers,
// num_experts > 0 and (i + 1) % decoder_sparse_step == 0; otherwise it is the dense MLP of
// width intermediate_size.
struct MoeConfig {
  int64_t num_experts = 0;            // E: experts per sparse layer
  int64_t num_experts_per_tok = 0;    // k: 1..E experts per token
  int64_t moe_intermediate_size = 0;  // each expert's SwiGLU width
  bool norm_topk_prob = false;        // renormalise the k routing weights to sum to 1
  int64_t decoder_sparse_step = 1;    // >= 1
  std::vector<int64_t> mlp_only_layers;  // dense layers, each in [0, num_hidden_layers)
  double router_aux_loss_coef = 0.0;  // the load-balancing loss weight (trainer; not the forward)

  // Whether layer `layer` is sparse (the rule above).
  bool IsSparseLayer(int64_t layer) const;
};

struct ModelConfig {
  std::string model_type;  // as written in config.json
  ModelArch arch = ModelArch::kLlama;

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // == num_attention_heads when absent (MHA)
  int64_t head_dim = 0;             // explicit, or hidden_size / num_attention_heads
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double initializer_range = 0.02;  // std of the normal used by random initialisation
  RopeConfig rope;

  bool qkv_bias = false;  // q/k/v projections carry a bias (Qwen2 always; others attention_bias)
  bool o_bias = false;    // o_proj carries a bias (Llama/Qwen3 with attention_bias)
  bool qk_norm = false;   // per-head RMSNorm on q and k before RoPE (Qwen3)
  bool tie_word_embeddings = false;

  MoeConfig moe;  // qwen3_moe only; num_experts == 0 elsewhere

  std::vector<int64_t> eos_token_ids;  // from eos_token_id (int or list); may be empty
  int64_t bos_token_id = -1;           // -1 when absent or null

  // Derived sizes.
  int64_t q_size() const { return num_attention_heads * head_dim; }
  int64_t kv_size() const { return num_key_value_heads * head_dim; }
  // Number of parameters of the full (unsharded) model, lm_head counted once when tied: the
  // sum over ParameterSpecs (weights.h), feed-forward blocks included.
  int64_t NumParameters() const;
};

// Parses the text of a config.json. `source` names the file in error messages.
StatusOr<ModelConfig> ParseModelConfigJson(const std::string& json_text, const std::string& source);

// Reads and parses `path` (a config.json, or a model directory holding one).
StatusOr<ModelConfig> LoadModelConfig(const std::string& path);

// Checks that the config can be split over `tp_size` tensor-parallel ranks (heads, KV heads,
// intermediate size, the experts' moe_intermediate_size and vocabulary divisible by tp_size);
// the error names the field.
Status ValidateTensorParallel(const ModelConfig& config, int tp_size);

}  // namespace slime::model

#endif  // SLIME_MODEL_CONFIG_H_
