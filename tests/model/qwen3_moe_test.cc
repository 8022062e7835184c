// Qwen3-MoE (model_type "qwen3_moe", ffn/moe.h):
//   - the config: HF defaults, which layers are sparse, errors that name the key, the 30B-A3B
//     config's parameter count (parsed only, never instantiated);
//   - the block alone: the grouped computation against a naive per-token loop, with
//     norm_topk_prob on and off and k = 1 and k = E; the router logits it exposes;
//   - the whole model, written by init-model (HF names), against an independent PyTorch
//     forward of transformers' Qwen3MoeForCausalLM (tests/model/qwen3_moe_reference.py, run in
//     the first Python that imports torch; skipped without one): logits within 1e-4 in float32
//     and the same top-k experts per sparse layer, for two sequences, with every layer sparse
//     and with a dense layer mixed in (mlp_only_layers).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "slime/model/checkpoint.h"
#include "slime/model/config.h"
#include "slime/model/decoder.h"
#include "slime/model/ffn/feed_forward.h"
#include "slime/model/ffn/moe.h"
#include "slime/model/init_random_model.h"
#include "slime/model/tensor_parallel.h"
#include "slime/model/weights.h"
#include "test_util.h"
#include "torch_python.h"

namespace slime::model {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using testing::TempDir;
using testing::WriteFile;

std::string ConfigFile(const std::string& name) {
  return testing::ModelTestDataDir() + "/configs/" + name;
}

Json TinyMoeJson() { return Json::parse(testing::ReadFile(ConfigFile("qwen3-moe-tiny.json"))); }

StatusOr<ModelConfig> Parse(const Json& j) { return ParseModelConfigJson(j.dump(), "moe.json"); }

// --- config ---------------------------------------------------------------------------------

TEST(Qwen3MoeConfigTest, ParsesTheMoeFieldsAndPicksTheSparseLayers) {
  auto c = LoadModelConfig(ConfigFile("qwen3-moe-tiny.json"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->arch, ModelArch::kQwen3Moe);
  EXPECT_STREQ(ModelArchName(c->arch), "qwen3_moe");
  EXPECT_TRUE(c->qk_norm);
  EXPECT_EQ(c->moe.num_experts, 8);
  EXPECT_EQ(c->moe.num_experts_per_tok, 2);
  EXPECT_EQ(c->moe.moe_intermediate_size, 32);
  EXPECT_TRUE(c->moe.norm_topk_prob);
  EXPECT_DOUBLE_EQ(c->moe.router_aux_loss_coef, 0.001);
  EXPECT_EQ(FeedForwardName(*c, 0), "moe");
  EXPECT_EQ(FeedForwardName(*c, 1), "moe");
  EXPECT_EQ(FeedForwardFor(*c, 0).name(), "moe");

  // HF's defaults where keys are absent; the rule of Qwen3MoeDecoderLayer.
  Json j = TinyMoeJson();
  for (const char* key : {"num_experts", "num_experts_per_tok", "moe_intermediate_size",
                          "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers",
                          "router_aux_loss_coef", "head_dim"}) {
    j.erase(key);
  }
  j["num_hidden_layers"] = 4;
  c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->moe.num_experts, 128);
  EXPECT_EQ(c->moe.num_experts_per_tok, 8);
  EXPECT_EQ(c->moe.moe_intermediate_size, 768);
  EXPECT_FALSE(c->moe.norm_topk_prob);
  EXPECT_EQ(c->moe.decoder_sparse_step, 1);
  EXPECT_TRUE(c->moe.mlp_only_layers.empty());
  EXPECT_DOUBLE_EQ(c->moe.router_aux_loss_coef, 0.001);
  EXPECT_EQ(c->head_dim, 64 / 4);  // no head_dim default: hidden / heads
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {3};
  c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  const std::vector<std::string_view> want = {"dense", "moe", "dense", "dense"};
  for (int l = 0; l < 4; ++l) EXPECT_EQ(FeedForwardName(*c, l), want[l]) << "layer " << l;
  j["num_experts"] = 0;  // no experts: every layer dense
  c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  for (int l = 0; l < 4; ++l) EXPECT_EQ(FeedForwardName(*c, l), "dense");
  // transformers 5's key for the expert count.
  j = TinyMoeJson();
  j.erase("num_experts");
  j["num_local_experts"] = 4;
  c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->moe.num_experts, 4);
  // The other architectures have no experts.
  EXPECT_EQ(testing::TinyQwen3ConfigJson().find("num_experts"), std::string::npos);
}

TEST(Qwen3MoeConfigTest, BadMoeFieldsAreErrorsThatNameTheKey) {
  struct Case {
    const char* key;
    Json value;
    const char* names;  // in the message
  };
  const std::vector<Case> cases = {
      {"num_experts_per_tok", 0, "num_experts_per_tok"},
      {"num_experts_per_tok", 9, "num_experts_per_tok"},
      {"num_experts", -1, "num_experts"},
      {"num_experts", "8", "num_experts"},
      {"moe_intermediate_size", 0, "moe_intermediate_size"},
      {"decoder_sparse_step", 0, "decoder_sparse_step"},
      {"mlp_only_layers", 1, "mlp_only_layers"},
      {"mlp_only_layers", Json::array({0, 2}), "mlp_only_layers[1]"},
      {"mlp_only_layers", Json::array({"0"}), "mlp_only_layers[0]"},
      {"norm_topk_prob", "yes", "norm_topk_prob"},
      {"router_aux_loss_coef", -0.5, "router_aux_loss_coef"},
  };
  for (const Case& k : cases) {
    Json j = TinyMoeJson();
    j[k.key] = k.value;
    auto c = Parse(j);
    ASSERT_FALSE(c.ok()) << k.key << " = " << k.value.dump();
    EXPECT_NE(std::string(c.status().message()).find(std::string("'") + k.names + "'"),
              std::string::npos)
        << c.status();
  }
  // num_experts_per_tok's message says what would be valid.
  Json j = TinyMoeJson();
  j["num_experts_per_tok"] = 9;
  EXPECT_NE(std::string(Parse(j).status().message()).find("1..num_experts (8)"),
            std::string::npos);
  // Tensor parallelism splits every expert like the dense MLP.
  j = TinyMoeJson();
  j["moe_intermediate_size"] = 33;
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  Status tp = ValidateTensorParallel(*c, 2);
  EXPECT_FALSE(tp.ok());
  EXPECT_NE(std::string(tp.message()).find("moe_intermediate_size"), std::string::npos) << tp;
}

// Parsed only: 48 sparse layers of 128 experts, about 30.5 B parameters (3.3 B active).
TEST(Qwen3MoeConfigTest, Qwen3_30B_A3B_ConfigParses) {
  auto c = LoadModelConfig(ConfigFile("qwen3-30b-a3b.json"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_hidden_layers, 48);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->moe.num_experts, 128);
  EXPECT_EQ(c->moe.num_experts_per_tok, 8);
  for (int l = 0; l < 48; ++l) EXPECT_EQ(FeedForwardName(*c, l), "moe");
  const int64_t n = c->NumParameters();
  EXPECT_GT(n, int64_t{30'400'000'000});
  EXPECT_LT(n, int64_t{30'600'000'000});
  EXPECT_TRUE(ValidateTensorParallel(*c, 4).ok());
}

// --- the block alone ------------------------------------------------------------------------

ModelConfig BlockConfig(int64_t experts, int64_t k, bool norm) {
  Json j = TinyMoeJson();
  j["num_experts"] = experts;
  j["num_experts_per_tok"] = k;
  j["norm_topk_prob"] = norm;
  j["hidden_size"] = 24;
  j["moe_intermediate_size"] = 20;
  auto c = Parse(j);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : ModelConfig{};
}

FeedForwardWeights BlockWeights(const ModelConfig& c, uint64_t seed) {
  torch::manual_seed(seed);
  FeedForwardWeights w;
  std::vector<ParamSpec> specs;
  MoeBlock().AppendParameterSpecs(c, 0, specs);
  EXPECT_EQ(specs.size(), static_cast<size_t>(1 + 3 * c.moe.num_experts));
  w.params.resize(specs.size());
  for (const ParamSpec& s : specs) w.params[s.block_slot] = torch::randn(s.shape) * 0.3;
  return w;
}

// The formula, token by token.
torch::Tensor NaiveMoe(const FeedForwardWeights& w, const torch::Tensor& h, const MoeConfig& m) {
  torch::Tensor out = torch::zeros_like(h);
  for (int64_t t = 0; t < h.size(0); ++t) {
    const torch::Tensor x = h[t];
    const torch::Tensor p = torch::softmax(torch::mv(w.params[MoeBlock::kRouter], x), 0);
    auto [weights, experts] = torch::topk(p, m.num_experts_per_tok);
    if (m.norm_topk_prob) weights = weights / weights.sum();
    for (int64_t j = 0; j < m.num_experts_per_tok; ++j) {
      const int64_t e = experts[j].item<int64_t>();
      const torch::Tensor g = torch::mv(w.params[MoeBlock::ExpertSlot(e, MoeBlock::kExpertGateProj)], x);
      const torch::Tensor u = torch::mv(w.params[MoeBlock::ExpertSlot(e, MoeBlock::kExpertUpProj)], x);
      const torch::Tensor y = torch::mv(w.params[MoeBlock::ExpertSlot(e, MoeBlock::kExpertDownProj)],
                                        torch::silu(g) * u);
      out[t] += weights[j] * y;
    }
  }
  return out;
}

TEST(MoeBlockTest, GroupedExpertsEqualTheNaivePerTokenFormula) {
  struct Case {
    int64_t experts, k;
    bool norm;
  };
  for (const Case& k : std::vector<Case>{{6, 2, true}, {6, 2, false}, {6, 1, true},
                                         {6, 1, false}, {5, 5, true}, {5, 5, false}}) {
    const ModelConfig c = BlockConfig(k.experts, k.k, k.norm);
    const FeedForwardWeights w = BlockWeights(c, 11 + k.experts + k.k);
    const torch::Tensor h = torch::randn({13, c.hidden_size});
    auto tp = MakeSingleRankGroup();
    torch::Tensor logits;
    FeedForwardContext ctx{c, 0, *tp};
    ctx.router_logits = &logits;
    const torch::Tensor got = MoeBlock().Forward(w, h, ctx);
    const torch::Tensor want = NaiveMoe(w, h, c.moe);
    const std::string what = "E=" + std::to_string(k.experts) + " k=" + std::to_string(k.k) +
                             (k.norm ? " normalised" : "");
    ASSERT_EQ(got.sizes(), h.sizes()) << what;
    EXPECT_TRUE(torch::allclose(got, want, 1e-5, 1e-5))
        << what << ": max diff " << (got - want).abs().max().item<float>();
    ASSERT_TRUE(logits.defined()) << what;
    EXPECT_TRUE(torch::allclose(logits, torch::mm(h, w.params[MoeBlock::kRouter].t()), 1e-6, 1e-6));
    // k = E with renormalisation is the softmax-weighted sum of every expert.
    const MoeBlock::Routing r = MoeBlock::Route(logits, k.k, k.norm, torch::kFloat32);
    EXPECT_EQ(r.weights.sizes(), (std::vector<int64_t>{13, k.k}));
    if (k.norm) {
      EXPECT_TRUE(torch::allclose(r.weights.sum(-1), torch::ones({13}), 1e-6, 1e-6)) << what;
    }
  }
}

// Every token on one expert, and a gradient through the grouped path to h, the router and the
// experts that were chosen (the others get none).
TEST(MoeBlockTest, SkewedRoutingAndGradientsMatchTheNaiveFormula) {
  const ModelConfig c = BlockConfig(4, 1, false);
  FeedForwardWeights w = BlockWeights(c, 3);
  w.params[MoeBlock::kRouter].zero_();
  w.params[MoeBlock::kRouter][2].fill_(1.0);  // expert 2 wins for positive-sum rows
  const torch::Tensor h = (torch::rand({7, c.hidden_size}) + 0.1).requires_grad_(true);
  for (auto& p : w.params) p.requires_grad_(true);
  auto tp = MakeSingleRankGroup();
  const torch::Tensor got = MoeBlock().Forward(w, h, FeedForwardContext{c, 0, *tp});
  got.square().sum().backward();
  const torch::Tensor gh = h.grad().clone();
  const torch::Tensor gr = w.params[MoeBlock::kRouter].grad().clone();
  EXPECT_FALSE(w.params[MoeBlock::ExpertSlot(0, MoeBlock::kExpertGateProj)].grad().defined());
  const torch::Tensor g2 = w.params[MoeBlock::ExpertSlot(2, MoeBlock::kExpertUpProj)].grad().clone();
  h.mutable_grad().reset();
  for (auto& p : w.params) p.mutable_grad().reset();
  const torch::Tensor want = NaiveMoe(w, h, c.moe);
  want.square().sum().backward();
  EXPECT_TRUE(torch::allclose(got, want, 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(gh, h.grad(), 1e-4, 1e-5));
  EXPECT_TRUE(torch::allclose(gr, w.params[MoeBlock::kRouter].grad(), 1e-4, 1e-5));
  EXPECT_TRUE(torch::allclose(
      g2, w.params[MoeBlock::ExpertSlot(2, MoeBlock::kExpertUpProj)].grad(), 1e-4, 1e-5));
}

TEST(MoeBlockTest, SpecsAreTheHfNamesAtTheirSlots) {
  auto c = LoadModelConfig(ConfigFile("qwen3-moe-tiny.json"));
  ASSERT_TRUE(c.ok()) << c.status();
  std::vector<std::string> names;
  for (const ParamSpec& s : ParameterSpecs(*c)) {
    if (s.layer != 1 || s.block_slot < 0) continue;
    names.push_back(s.hf_name);
    if (s.block_slot == MoeBlock::kRouter) {
      EXPECT_EQ(s.shape, (std::vector<int64_t>{8, 64}));
      EXPECT_EQ(s.shard, ShardDim::kReplicated);
    }
    if (s.block_slot == MoeBlock::ExpertSlot(7, MoeBlock::kExpertDownProj)) {
      EXPECT_EQ(s.hf_name, "model.layers.1.mlp.experts.7.down_proj.weight");
      EXPECT_EQ(s.shape, (std::vector<int64_t>{64, 32}));
      EXPECT_EQ(s.shard, ShardDim::kColumns);
    }
  }
  ASSERT_EQ(names.size(), 1u + 3 * 8);
  EXPECT_EQ(names[0], "model.layers.1.mlp.gate.weight");
  EXPECT_EQ(names[1], "model.layers.1.mlp.experts.0.gate_proj.weight");
  EXPECT_EQ(names[2], "model.layers.1.mlp.experts.0.up_proj.weight");
  EXPECT_EQ(names[3], "model.layers.1.mlp.experts.0.down_proj.weight");
}

// --- routing replay ------------------------------------------------------------------------

TEST(MoeRoutingReplayTest, ReplayingTheRoutersOwnChoiceIsRouteBitForBit) {
  torch::manual_seed(5);
  for (bool norm : {true, false}) {
    const torch::Tensor logits = torch::randn({17, 8}) * 3.0;
    const MoeBlock::Routing r = MoeBlock::Route(logits, 3, norm, torch::kFloat32);
    // Each row ascending.
    EXPECT_TRUE(torch::equal(r.experts, std::get<0>(r.experts.sort(1))));
    // Given in another order, the same experts route alike.
    const MoeBlock::Routing again =
        MoeBlock::Replay(logits, r.experts.flip({1}), norm, torch::kFloat32);
    EXPECT_TRUE(torch::equal(again.experts, r.experts));
    EXPECT_TRUE(torch::equal(again.weights, r.weights));
  }
  const torch::Tensor logits = torch::randn({4, 8});
  EXPECT_THROW(MoeBlock::Replay(logits, torch::full({4, 2}, 8, torch::kLong), true, torch::kFloat32),
               c10::Error);
  EXPECT_THROW(MoeBlock::Replay(logits, torch::zeros({3, 2}, torch::kLong), true, torch::kFloat32),
               c10::Error);
}

// The whole tiny model: capture the routing of a forward, replay it (same logits, bit for bit),
// replay another routing (the layers use it, the logits change, the router still gets a
// gradient), and refuse a replay of the wrong length.
TEST(MoeRoutingReplayTest, TheModelReplaysAGivenRouting) {
  TempDir dir;
  WriteFile(dir.Join("cfg/config.json"), TinyMoeJson().dump(2));
  WriteFile(dir.Join("tok/tokenizer.json"),
            R"({"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0, "b": 1}}})");
  Status s = InitRandomModel(dir.Join("cfg/config.json"), dir.Join("tok"), dir.Join("model"), 3,
                             "fp32");
  ASSERT_TRUE(s.ok()) << s;
  auto loaded = DecoderModel::Load(dir.Join("model"), torch::kFloat32, torch::kCPU);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  DecoderModel& m = **loaded;
  const int64_t layers = m.config().num_hidden_layers, e = m.config().moe.num_experts;
  const torch::Tensor ids = torch::tensor({5, 900, 17, 3, 42, 7, 1000, 12, 9}, torch::kLong);
  auto forward = [&] {
    auto hidden = m.ForwardPacked(ids, {0, 4, 9});
    EXPECT_TRUE(hidden.ok()) << hidden.status();
    auto logits = m.Logits(*hidden);
    EXPECT_TRUE(logits.ok()) << logits.status();
    return *logits;
  };

  m.set_capture_routed_experts(true);
  const torch::Tensor routed_logits = forward();
  const std::vector<torch::Tensor> routed = m.routed_experts();
  ASSERT_EQ(static_cast<int64_t>(routed.size()), layers);
  for (const torch::Tensor& r : routed) {
    ASSERT_TRUE(r.defined());
    EXPECT_EQ(r.sizes(), (std::vector<int64_t>{9, m.config().moe.num_experts_per_tok}));
  }

  ASSERT_TRUE(m.set_routing_replay(routed).ok());
  EXPECT_TRUE(torch::equal(forward(), routed_logits));
  for (int64_t l = 0; l < layers; ++l) EXPECT_TRUE(torch::equal(m.routed_experts()[l], routed[l]));

  // Another routing: every expert id moved by one (still distinct in each row).
  std::vector<torch::Tensor> moved;
  for (const torch::Tensor& r : routed) moved.push_back((r + 1).remainder(e));
  ASSERT_TRUE(m.set_routing_replay(moved).ok());
  for (auto& p : m.mutable_weights().layers[0].ffn.params) p.requires_grad_(true);
  const torch::Tensor moved_logits = forward();
  EXPECT_GT((moved_logits - routed_logits).abs().max().item<double>(), 1e-7);
  for (int64_t l = 0; l < layers; ++l) {
    EXPECT_TRUE(torch::equal(m.routed_experts()[l], std::get<0>(moved[l].sort(1)))) << l;
  }
  moved_logits.square().sum().backward();
  const torch::Tensor router_grad = m.weights().layers[0].ffn.params[MoeBlock::kRouter].grad();
  ASSERT_TRUE(router_grad.defined());
  EXPECT_GT(router_grad.abs().sum().item<double>(), 0.0);

  EXPECT_EQ(m.set_routing_replay({routed[0]}).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(m.set_routing_replay({}).ok());  // off: the router routes again
  for (auto& p : m.mutable_weights().layers[0].ffn.params) p.requires_grad_(false);
  EXPECT_TRUE(torch::equal(forward(), routed_logits));
}

// --- the whole model against the PyTorch reference ------------------------------------------

class Qwen3MoeReferenceTest : public ::testing::TestWithParam<bool> {};

TEST_P(Qwen3MoeReferenceTest, LogitsAndExpertChoicesMatchThePyTorchReference) {
  const auto& py = slime::testing::FindTorchPython();
  if (py.path.empty()) GTEST_SKIP() << "no Python that imports torch (tried " << py.tried << ")";
  const bool dense_layer = GetParam();
  TempDir dir;
  Json cfg = TinyMoeJson();
  if (dense_layer) {
    cfg["mlp_only_layers"] = {0};
    cfg["norm_topk_prob"] = false;
  }
  WriteFile(dir.Join("cfg/config.json"), cfg.dump(2));
  WriteFile(dir.Join("tok/tokenizer.json"),
            R"({"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0, "b": 1}}})");
  const std::string model_dir = dir.Join("model");
  // init-model's output: config.json + safetensors with HF names.
  Status s = InitRandomModel(dir.Join("cfg/config.json"), dir.Join("tok"), model_dir, 7, "fp32");
  ASSERT_TRUE(s.ok()) << s;

  const std::vector<std::vector<int64_t>> seqs = {{151643, 9, 1234, 88, 151000, 5, 42, 7},
                                                  {3, 77, 100000, 2, 64}};
  const std::string script =
      (fs::path(testing::ModelTestDataDir()) / ".." / ".." / "model" / "qwen3_moe_reference.py")
          .lexically_normal()
          .string();
  std::string cmd = "'" + py.path + "' '" + script + "' --model '" + model_dir + "' --out '" +
                    dir.Join("ref/model.safetensors") + "'";
  for (const auto& seq : seqs) {
    std::string ids;
    for (int64_t id : seq) ids += (ids.empty() ? "" : ",") + std::to_string(id);
    cmd += " --ids " + ids;
  }
  fs::create_directories(dir.Join("ref"));
  const int rc = std::system((cmd + " 2>'" + dir.Join("py.err") + "'").c_str());
  ASSERT_EQ(rc, 0) << cmd << "\n" << testing::ReadFile(dir.Join("py.err"));
  auto ref = CheckpointReader::Open(dir.Join("ref"));
  ASSERT_TRUE(ref.ok()) << ref.status();

  auto model = DecoderModel::Load(model_dir, torch::kFloat32, torch::kCPU);
  ASSERT_TRUE(model.ok()) << model.status();
  DecoderModel& m = **model;
  m.set_capture_router_logits(true);
  const int64_t k = m.config().moe.num_experts_per_tok;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const int64_t len = static_cast<int64_t>(seqs[i].size());
    auto hidden = m.ForwardPacked(torch::tensor(seqs[i], torch::kLong), {0, len});
    ASSERT_TRUE(hidden.ok()) << hidden.status();
    auto logits = m.Logits(*hidden);
    ASSERT_TRUE(logits.ok()) << logits.status();
    auto want = ref->Load("logits." + std::to_string(i));
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_EQ(logits->sizes(), want->sizes());
    const float diff = (*logits - *want).abs().max().item<float>();
    EXPECT_LE(diff, 1e-4) << "sequence " << i;
    EXPECT_GT(want->abs().max().item<float>(), 1e-3);  // not trivially zero
    ASSERT_EQ(m.router_logits().size(), 2u);
    for (int l = 0; l < 2; ++l) {
      const bool sparse = !(dense_layer && l == 0);
      EXPECT_EQ(m.router_logits()[l].defined(), sparse) << "layer " << l;
      EXPECT_EQ(ref->Contains("experts." + std::to_string(i) + "." + std::to_string(l)), sparse);
      if (!sparse) continue;
      auto experts = ref->Load("experts." + std::to_string(i) + "." + std::to_string(l));
      ASSERT_TRUE(experts.ok()) << experts.status();
      const MoeBlock::Routing r =
          MoeBlock::Route(m.router_logits()[l], k, m.config().moe.norm_topk_prob, torch::kFloat32);
      // The reference keeps top-k's order; Route gives each row ascending.
      EXPECT_TRUE(torch::equal(r.experts, std::get<0>(experts->sort(1))))
          << "sequence " << i << " layer " << l << ":\n" << r.experts << "\nvs\n" << *experts;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layers, Qwen3MoeReferenceTest, ::testing::Values(false, true),
                         [](const auto& info) {
                           return std::string(info.param ? "DenseLayer0" : "AllSparse");
                         });

}  // namespace
}  // namespace slime::model
