// Parsing of HF config.json into ModelConfig (see include/slime/model/config.h).
#include "slime/model/config.h"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "internal.h"

namespace slime::model {
namespace {

using Json = nlohmann::json;

// What differs between architectures, so a new one (qwen3_moe) is a new row plus its extras.
struct ArchInfo {
  const char* model_type;
  ModelArch arch;
  int64_t default_head_dim;       // 0: hidden_size / num_attention_heads
  int64_t default_max_positions;  // transformers' class default
  bool qkv_bias_always;           // Qwen2: q/k/v biases, no o_proj bias, attention_bias ignored
  bool qk_norm;                   // Qwen3
  bool moe;                       // reads the mixture-of-experts fields (ParseMoe)
};

constexpr ArchInfo kArchs[] = {
    {"llama", ModelArch::kLlama, 0, 2048, false, false, false},
    {"qwen2", ModelArch::kQwen2, 0, 32768, true, false, false},
    {"qwen3", ModelArch::kQwen3, 128, 32768, false, true, false},
    // Qwen3MoeConfig has no head_dim default: the modeling falls back to hidden / heads.
    {"qwen3_moe", ModelArch::kQwen3Moe, 0, 32768, false, true, true},
};

std::string SupportedArchList() {
  std::string out;
  for (const ArchInfo& a : kArchs) {
    if (!out.empty()) out += ", ";
    out += a.model_type;
  }
  return out;
}

std::string Excerpt(const Json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

// Typed field access with errors that name the file and the field.
class FieldReader {
 public:
  FieldReader(const Json& root, const std::string& source) : root_(root), source_(source) {}

  Status Error(const std::string& field, const std::string& what) const {
    return absl::InvalidArgumentError(fmt::format("{}: field '{}' {}", source_, field, what));
  }
  Status Unsupported(const std::string& field, const std::string& what) const {
    return absl::UnimplementedError(fmt::format("{}: field '{}' {}", source_, field, what));
  }

  // nullptr when absent or null.
  static const Json* Find(const Json& obj, const std::string& key) {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return nullptr;
    return &*it;
  }

  StatusOr<std::optional<int64_t>> OptInt(const Json& obj, const std::string& key,
                                          const std::string& field) const {
    const Json* v = Find(obj, key);
    if (v == nullptr) return std::optional<int64_t>();
    if (v->is_number_integer()) return std::optional<int64_t>(v->get<int64_t>());
    if (v->is_number_float()) {
      double d = v->get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15) {
        return std::optional<int64_t>(static_cast<int64_t>(d));
      }
    }
    return Error(field, fmt::format("must be an integer, got {}", Excerpt(*v)));
  }

  StatusOr<int64_t> PositiveInt(const Json& obj, const std::string& key, const std::string& field,
                                std::optional<int64_t> fallback) const {
    SLIME_ASSIGN_OR_RETURN(std::optional<int64_t> v, OptInt(obj, key, field));
    if (!v.has_value()) {
      if (fallback.has_value()) return *fallback;
      return Error(field, "is missing (a positive integer is required)");
    }
    if (*v <= 0) return Error(field, fmt::format("must be a positive integer, got {}", *v));
    return *v;
  }

  StatusOr<std::optional<double>> OptDouble(const Json& obj, const std::string& key,
                                            const std::string& field) const {
    const Json* v = Find(obj, key);
    if (v == nullptr) return std::optional<double>();
    if (!v->is_number()) return Error(field, fmt::format("must be a number, got {}", Excerpt(*v)));
    return std::optional<double>(v->get<double>());
  }

  StatusOr<double> PositiveDouble(const Json& obj, const std::string& key, const std::string& field,
                                  std::optional<double> fallback) const {
    SLIME_ASSIGN_OR_RETURN(std::optional<double> v, OptDouble(obj, key, field));
    if (!v.has_value()) {
      if (fallback.has_value()) return *fallback;
      return Error(field, "is missing (a positive number is required)");
    }
    if (!(*v > 0.0) || !std::isfinite(*v)) {
      return Error(field, fmt::format("must be a positive number, got {}", *v));
    }
    return *v;
  }

  StatusOr<bool> Bool(const Json& obj, const std::string& key, const std::string& field,
                      bool fallback) const {
    const Json* v = Find(obj, key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) {
      return Error(field, fmt::format("must be true or false, got {}", Excerpt(*v)));
    }
    return v->get<bool>();
  }

  StatusOr<std::optional<std::string>> OptString(const Json& obj, const std::string& key,
                                                 const std::string& field) const {
    const Json* v = Find(obj, key);
    if (v == nullptr) return std::optional<std::string>();
    if (!v->is_string()) return Error(field, fmt::format("must be a string, got {}", Excerpt(*v)));
    return std::optional<std::string>(v->get<std::string>());
  }

  const Json& root() const { return root_; }

 private:
  const Json& root_;
  const std::string& source_;
};

// RoPE from either `rope_parameters` (transformers 5) or `rope_theta` + `rope_scaling` (4.x).
StatusOr<RopeConfig> ParseRope(const FieldReader& r) {
  const Json& root = r.root();
  RopeConfig rope;
  const Json* params = FieldReader::Find(root, "rope_parameters");
  std::string prefix = "rope_parameters";
  if (params == nullptr) {
    params = FieldReader::Find(root, "rope_scaling");
    prefix = "rope_scaling";
  }
  if (params != nullptr && !params->is_object()) {
    return r.Error(prefix, fmt::format("must be an object or null, got {}", Excerpt(*params)));
  }

  std::optional<double> theta;
  if (params != nullptr && prefix == "rope_parameters") {
    SLIME_ASSIGN_OR_RETURN(theta, r.OptDouble(*params, "rope_theta", prefix + ".rope_theta"));
  }
  if (!theta.has_value()) {
    SLIME_ASSIGN_OR_RETURN(theta, r.OptDouble(root, "rope_theta", "rope_theta"));
  }
  rope.theta = theta.value_or(10000.0);
  if (!(rope.theta > 0.0)) return r.Error("rope_theta", "must be a positive number");

  for (const Json* obj : {&root, params}) {
    if (obj == nullptr) continue;
    std::string field = obj == &root ? "partial_rotary_factor" : prefix + ".partial_rotary_factor";
    SLIME_ASSIGN_OR_RETURN(std::optional<double> prf,
                           r.OptDouble(*obj, "partial_rotary_factor", field));
    if (prf.has_value() && *prf != 1.0) {
      return r.Unsupported(field, fmt::format("= {} is not supported (only 1.0)", *prf));
    }
  }
  if (params == nullptr) return rope;

  SLIME_ASSIGN_OR_RETURN(std::optional<std::string> type,
                         r.OptString(*params, "rope_type", prefix + ".rope_type"));
  if (!type.has_value()) {
    SLIME_ASSIGN_OR_RETURN(type, r.OptString(*params, "type", prefix + ".type"));
  }
  std::string t = type.value_or("default");
  if (t == "default") {
    rope.type = RopeType::kDefault;
  } else if (t == "linear") {
    rope.type = RopeType::kLinear;
    SLIME_ASSIGN_OR_RETURN(rope.factor,
                           r.PositiveDouble(*params, "factor", prefix + ".factor", std::nullopt));
  } else if (t == "llama3") {
    rope.type = RopeType::kLlama3;
    SLIME_ASSIGN_OR_RETURN(rope.factor,
                           r.PositiveDouble(*params, "factor", prefix + ".factor", std::nullopt));
    SLIME_ASSIGN_OR_RETURN(
        rope.low_freq_factor,
        r.PositiveDouble(*params, "low_freq_factor", prefix + ".low_freq_factor", std::nullopt));
    SLIME_ASSIGN_OR_RETURN(
        rope.high_freq_factor,
        r.PositiveDouble(*params, "high_freq_factor", prefix + ".high_freq_factor", std::nullopt));
    SLIME_ASSIGN_OR_RETURN(
        rope.original_max_position_embeddings,
        r.PositiveInt(*params, "original_max_position_embeddings",
                      prefix + ".original_max_position_embeddings", std::nullopt));
    if (!(rope.high_freq_factor > rope.low_freq_factor)) {
      return r.Error(prefix + ".high_freq_factor",
                     fmt::format("({}) must be greater than low_freq_factor ({})",
                                 rope.high_freq_factor, rope.low_freq_factor));
    }
  } else {
    return r.Unsupported(prefix + ".rope_type",
                         fmt::format("= \"{}\" is not supported (supported: default, linear, "
                                     "llama3)",
                                     t));
  }
  return rope;
}

// The mixture-of-experts fields (MoeConfig), with Qwen3MoeConfig's defaults for absent keys.
StatusOr<MoeConfig> ParseMoe(const FieldReader& r, int64_t num_layers) {
  const Json& root = r.root();
  MoeConfig m;
  // transformers 5 maps num_experts to num_local_experts (attribute_map); accept either key.
  const char* experts_key =
      FieldReader::Find(root, "num_experts") == nullptr &&
              FieldReader::Find(root, "num_local_experts") != nullptr
          ? "num_local_experts"
          : "num_experts";
  SLIME_ASSIGN_OR_RETURN(std::optional<int64_t> experts,
                         r.OptInt(root, experts_key, experts_key));
  m.num_experts = experts.value_or(128);
  if (m.num_experts < 0) {
    return r.Error(experts_key,
                   fmt::format("must be >= 0 (0: no sparse layers), got {}", m.num_experts));
  }
  SLIME_ASSIGN_OR_RETURN(std::optional<int64_t> k,
                         r.OptInt(root, "num_experts_per_tok", "num_experts_per_tok"));
  m.num_experts_per_tok = k.value_or(8);
  SLIME_ASSIGN_OR_RETURN(m.moe_intermediate_size,
                         r.PositiveInt(root, "moe_intermediate_size", "moe_intermediate_size",
                                       int64_t{768}));
  SLIME_ASSIGN_OR_RETURN(m.norm_topk_prob,
                         r.Bool(root, "norm_topk_prob", "norm_topk_prob", false));
  SLIME_ASSIGN_OR_RETURN(m.decoder_sparse_step,
                         r.PositiveInt(root, "decoder_sparse_step", "decoder_sparse_step",
                                       int64_t{1}));
  SLIME_ASSIGN_OR_RETURN(std::optional<double> coef,
                         r.OptDouble(root, "router_aux_loss_coef", "router_aux_loss_coef"));
  m.router_aux_loss_coef = coef.value_or(0.001);
  if (!(m.router_aux_loss_coef >= 0.0) || !std::isfinite(m.router_aux_loss_coef)) {
    return r.Error("router_aux_loss_coef",
                   fmt::format("must be a finite number >= 0, got {}", m.router_aux_loss_coef));
  }
  if (const Json* layers = FieldReader::Find(root, "mlp_only_layers"); layers != nullptr) {
    if (!layers->is_array()) {
      return r.Error("mlp_only_layers",
                     fmt::format("must be a list of layer indices, got {}", Excerpt(*layers)));
    }
    for (size_t i = 0; i < layers->size(); ++i) {
      const Json& v = (*layers)[i];
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= num_layers) {
        return r.Error(fmt::format("mlp_only_layers[{}]", i),
                       fmt::format("must be a layer index in [0, {}) (num_hidden_layers), got {}",
                                   num_layers, Excerpt(v)));
      }
      m.mlp_only_layers.push_back(v.get<int64_t>());
    }
  }
  if (m.num_experts > 0 &&
      (m.num_experts_per_tok < 1 || m.num_experts_per_tok > m.num_experts)) {
    return r.Error("num_experts_per_tok",
                   fmt::format("must be in 1..num_experts ({}), got {}", m.num_experts,
                               m.num_experts_per_tok));
  }
  return m;
}

StatusOr<ModelConfig> ParseObject(const Json& root, const std::string& source) {
  FieldReader r(root, source);
  SLIME_ASSIGN_OR_RETURN(std::optional<std::string> model_type,
                         r.OptString(root, "model_type", "model_type"));
  if (!model_type.has_value()) {
    return r.Error("model_type", fmt::format("is missing (supported: {})", SupportedArchList()));
  }
  const ArchInfo* arch = nullptr;
  for (const ArchInfo& a : kArchs) {
    if (*model_type == a.model_type) arch = &a;
  }
  if (arch == nullptr) {
    return r.Unsupported("model_type", fmt::format("= \"{}\" is not supported (supported: {})",
                                                   *model_type, SupportedArchList()));
  }

  ModelConfig c;
  c.model_type = *model_type;
  c.arch = arch->arch;
  SLIME_ASSIGN_OR_RETURN(c.vocab_size,
                         r.PositiveInt(root, "vocab_size", "vocab_size", std::nullopt));
  SLIME_ASSIGN_OR_RETURN(c.hidden_size,
                         r.PositiveInt(root, "hidden_size", "hidden_size", std::nullopt));
  SLIME_ASSIGN_OR_RETURN(c.intermediate_size, r.PositiveInt(root, "intermediate_size",
                                                            "intermediate_size", std::nullopt));
  SLIME_ASSIGN_OR_RETURN(c.num_hidden_layers, r.PositiveInt(root, "num_hidden_layers",
                                                            "num_hidden_layers", std::nullopt));
  SLIME_ASSIGN_OR_RETURN(c.num_attention_heads, r.PositiveInt(root, "num_attention_heads",
                                                              "num_attention_heads", std::nullopt));
  SLIME_ASSIGN_OR_RETURN(
      c.num_key_value_heads,
      r.PositiveInt(root, "num_key_value_heads", "num_key_value_heads", c.num_attention_heads));
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return r.Error("num_key_value_heads",
                   fmt::format("({}) must divide num_attention_heads ({})", c.num_key_value_heads,
                               c.num_attention_heads));
  }
  std::optional<int64_t> head_dim_default;
  if (arch->default_head_dim > 0) {
    head_dim_default = arch->default_head_dim;
  } else if (c.hidden_size % c.num_attention_heads == 0) {
    head_dim_default = c.hidden_size / c.num_attention_heads;
  }
  if (!head_dim_default.has_value() && FieldReader::Find(root, "head_dim") == nullptr) {
    return r.Error("hidden_size",
                   fmt::format("({}) is not divisible by num_attention_heads ({}) and no head_dim "
                               "is given",
                               c.hidden_size, c.num_attention_heads));
  }
  SLIME_ASSIGN_OR_RETURN(c.head_dim, r.PositiveInt(root, "head_dim", "head_dim", head_dim_default));
  if (c.head_dim % 2 != 0) {
    return r.Error("head_dim", fmt::format("({}) must be even for rotary embeddings", c.head_dim));
  }
  SLIME_ASSIGN_OR_RETURN(c.max_position_embeddings,
                         r.PositiveInt(root, "max_position_embeddings", "max_position_embeddings",
                                       arch->default_max_positions));
  SLIME_ASSIGN_OR_RETURN(c.rms_norm_eps,
                         r.PositiveDouble(root, "rms_norm_eps", "rms_norm_eps", 1e-6));
  SLIME_ASSIGN_OR_RETURN(c.initializer_range,
                         r.PositiveDouble(root, "initializer_range", "initializer_range", 0.02));
  SLIME_ASSIGN_OR_RETURN(c.tie_word_embeddings,
                         r.Bool(root, "tie_word_embeddings", "tie_word_embeddings", false));
  SLIME_ASSIGN_OR_RETURN(c.rope, ParseRope(r));

  // Attention variants.
  if (arch->qkv_bias_always) {
    c.qkv_bias = true;
    c.o_bias = false;
  } else {
    SLIME_ASSIGN_OR_RETURN(bool bias, r.Bool(root, "attention_bias", "attention_bias", false));
    c.qkv_bias = bias;
    c.o_bias = bias;
  }
  c.qk_norm = arch->qk_norm;
  if (arch->moe) {
    SLIME_ASSIGN_OR_RETURN(c.moe, ParseMoe(r, c.num_hidden_layers));
  }

  // Fields whose non-default values we do not implement.
  SLIME_ASSIGN_OR_RETURN(std::optional<std::string> act,
                         r.OptString(root, "hidden_act", "hidden_act"));
  if (act.has_value() && *act != "silu" && *act != "swish") {
    return r.Unsupported("hidden_act",
                         fmt::format("= \"{}\" is not supported (only \"silu\")", *act));
  }
  SLIME_ASSIGN_OR_RETURN(bool mlp_bias, r.Bool(root, "mlp_bias", "mlp_bias", false));
  if (mlp_bias) return r.Unsupported("mlp_bias", "= true is not supported");
  SLIME_ASSIGN_OR_RETURN(bool sliding,
                         r.Bool(root, "use_sliding_window", "use_sliding_window", false));
  if (sliding) {
    return r.Unsupported("use_sliding_window",
                         "= true is not supported (sliding window attention is not implemented)");
  }
  if (const Json* lt = FieldReader::Find(root, "layer_types"); lt != nullptr) {
    if (!lt->is_array()) return r.Error("layer_types", "must be a list of strings");
    for (size_t i = 0; i < lt->size(); ++i) {
      const Json& v = (*lt)[i];
      if (!v.is_string() || v.get<std::string>() != "full_attention") {
        return r.Unsupported(
            fmt::format("layer_types[{}]", i),
            fmt::format("= {} is not supported (only \"full_attention\")", Excerpt(v)));
      }
    }
  }

  // Special tokens (informational; the engine may use eos).
  if (const Json* eos = FieldReader::Find(root, "eos_token_id"); eos != nullptr) {
    if (eos->is_number_integer()) {
      c.eos_token_ids.push_back(eos->get<int64_t>());
    } else if (eos->is_array()) {
      for (const Json& e : *eos) {
        if (!e.is_number_integer()) {
          return r.Error("eos_token_id", "must be an integer or a list of integers");
        }
        c.eos_token_ids.push_back(e.get<int64_t>());
      }
    } else {
      return r.Error("eos_token_id", fmt::format("must be an integer or a list of integers, got {}",
                                                 Excerpt(*eos)));
    }
  }
  SLIME_ASSIGN_OR_RETURN(std::optional<int64_t> bos,
                         r.OptInt(root, "bos_token_id", "bos_token_id"));
  c.bos_token_id = bos.value_or(-1);
  return c;
}

}  // namespace

bool MoeConfig::IsSparseLayer(int64_t layer) const {
  for (int64_t dense : mlp_only_layers) {
    if (dense == layer) return false;
  }
  return num_experts > 0 && (layer + 1) % decoder_sparse_step == 0;
}

const char* ModelArchName(ModelArch arch) {
  for (const ArchInfo& a : kArchs) {
    if (a.arch == arch) return a.model_type;
  }
  return "unknown";
}

StatusOr<ModelConfig> ParseModelConfigJson(const std::string& json_text,
                                           const std::string& source) {
  Json root;
  try {
    root = Json::parse(json_text);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(
        fmt::format("{}: not valid JSON: {}", source, std::string(e.what())));
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        fmt::format("{}: expected a JSON object at the top level, got {}", source, Excerpt(root)));
  }
  return ParseObject(root, source);
}

StatusOr<ModelConfig> LoadModelConfig(const std::string& path) {
  std::string file = path;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    file = (std::filesystem::path(path) / "config.json").string();
  }
  SLIME_ASSIGN_OR_RETURN(std::string text, internal::ReadFileToString(file));
  return ParseModelConfigJson(text, file);
}

Status ValidateTensorParallel(const ModelConfig& c, int tp_size) {
  if (tp_size < 1) {
    return absl::InvalidArgumentError(
        fmt::format("tensor-parallel size must be >= 1, got {}", tp_size));
  }
  struct Check {
    const char* field;
    int64_t value;
  };
  const Check checks[] = {{"num_attention_heads", c.num_attention_heads},
                          {"num_key_value_heads", c.num_key_value_heads},
                          {"intermediate_size", c.intermediate_size},
                          // each expert is split like the dense MLP (ffn/moe.h)
                          {"moe_intermediate_size", c.moe.num_experts > 0
                                                        ? c.moe.moe_intermediate_size
                                                        : int64_t{0}},
                          {"vocab_size", c.vocab_size}};
  for (const Check& check : checks) {
    if (check.value % tp_size != 0) {
      return absl::InvalidArgumentError(
          fmt::format("model config ({}): {} = {} is not divisible by the tensor-parallel size {}",
                      c.model_type, check.field, check.value, tp_size));
    }
  }
  return absl::OkStatus();
}

}  // namespace slime::model
