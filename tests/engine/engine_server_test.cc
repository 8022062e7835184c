// The real engine behind its real HTTP server, on a tiny random-weight Qwen3 (real Qwen3
// tokenizer) on CPU: SGLang /generate semantics, control endpoints, OpenAI endpoints, bad input,
// concurrency, and the numerics contract (engine log-probs = the model module's forward).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "nlohmann/json.hpp"
#include "promtool.h"
#include "remove_tree.h"
#include "slime/engine/engine.h"
#include "slime/engine/server.h"
#include "slime/http/client.h"
#include "slime/metrics/registry.h"
#include "slime/model/checkpoint.h"
#include "slime/model/decoder.h"
#include "slime/model/init_random_model.h"
#include "slime/tokenizer/tokenizer.h"
#include "test_paths.h"

namespace slime::engine {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

using slime::testing::SourceDir;

// Writes a random-weight model (real Qwen3 tokenizer) once per test binary.
class ModelDir {
 public:
  static const std::string& Get(uint64_t seed = 0) {
    static std::map<uint64_t, std::string> dirs;
    auto it = dirs.find(seed);
    if (it != dirs.end()) return it->second;
    const std::string tok = SourceDir() + "/.cache/testdata/qwen3";
    if (!fs::exists(tok + "/tokenizer.json")) {
      ADD_FAILURE() << "Qwen3 tokenizer missing at " << tok << ": run scripts/fetch_test_data.sh";
    }
    std::string dir = (fs::temp_directory_path() /
                       ("slime-engine-test-" + std::to_string(::getpid()) + "-" +
                        std::to_string(seed)))
                          .string();
    slime::testing::RemoveTree(dir);
    slime::testing::RemoveTreeAtExit(dir);
    Status s = model::InitRandomModel(
        SourceDir() + "/tests/data/model/configs/qwen3-engine-test.json", tok, dir, seed, "fp32");
    EXPECT_TRUE(s.ok()) << s;
    return dirs.emplace(seed, dir).first->second;
  }
};

class EngineServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    registry_ = new metrics::Registry();
    EngineOptions o;
    o.model_path = ModelDir::Get(0);
    o.device = "cpu";
    o.dtype = "float32";
    o.page_size = 4;
    o.max_total_tokens = 16384;
    o.context_length = 512;
    o.max_running_requests = 256;
    o.chunked_prefill_size = 2048;
    o.random_seed = 1;
    o.metrics = registry_;
    auto engine = Engine::Create(o);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = engine->release();
    EngineServerOptions so;
    so.port = 0;
    auto server = EngineServer::Start(engine_, registry_, so);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = server->release();
  }
  static void TearDownTestSuite() {
    delete server_;
    delete engine_;
    delete registry_;
  }
  void SetUp() override {
    // Every test starts from a clean, running engine (the load snapshot lags a request's answer
    // by one engine-loop iteration, so wait for it to settle).
    engine_->Continue();
    WaitForRunning(0);
    client_ = std::make_unique<http::Client>("127.0.0.1", server_->port());
  }

  std::pair<int, json> Post(const std::string& path, const json& body) {
    auto r = client_->Post(path, body.dump());
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return {0, json()};
    json j = r->body.empty() ? json() : json::parse(r->body, nullptr, false);
    return {r->status, j};
  }
  std::pair<int, json> Get(const std::string& path) {
    auto r = client_->Get(path);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return {0, json()};
    json j = json::parse(r->body, nullptr, false);
    return {r->status, j};
  }
  json Generate(const json& body) {
    auto [status, j] = Post("/generate", body);
    EXPECT_EQ(status, 200) << j.dump();
    return j;
  }
  // Waits until the engine reports `running` running requests (or fails after 10 s).
  void WaitForRunning(int64_t running) {
    for (int i = 0; i < 1000; ++i) {
      if (engine_->load().num_running == running) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    FAIL() << "engine never reached " << running << " running requests";
  }
  static std::vector<int32_t> Ids(const json& out) {
    return out["output_ids"].get<std::vector<int32_t>>();
  }

  static metrics::Registry* registry_;
  static Engine* engine_;
  static EngineServer* server_;
  std::unique_ptr<http::Client> client_;
};

metrics::Registry* EngineServerTest::registry_ = nullptr;
Engine* EngineServerTest::engine_ = nullptr;
EngineServer* EngineServerTest::server_ = nullptr;

const std::vector<int> kPrompt = {9707, 11, 1879, 0, 576, 374, 264, 1273, 315, 279, 1849, 13};

TEST_F(EngineServerTest, GreedyIsDeterministicAndMatchesTheModelForward) {
  json body = {{"input_ids", kPrompt},
               {"sampling_params", {{"temperature", 0}, {"max_new_tokens", 12}, {"ignore_eos", true}}},
               {"return_logprob", true}};
  json a = Generate(body);
  json b = Generate(body);
  ASSERT_EQ(Ids(a).size(), 12u);
  EXPECT_EQ(Ids(a), Ids(b));
  EXPECT_EQ(a["meta_info"]["finish_reason"]["type"], "length");
  EXPECT_EQ(a["meta_info"]["finish_reason"]["length"], 12);
  EXPECT_EQ(a["meta_info"]["prompt_tokens"], static_cast<int>(kPrompt.size()));
  EXPECT_EQ(a["meta_info"]["completion_tokens"], 12);
  ASSERT_EQ(a["meta_info"]["output_token_logprobs"].size(), 12u);

  // The model module's packed forward over prompt + output gives the same tokens (argmax) and
  // log-probs: one implementation, no train/inference mismatch.
  auto model = model::DecoderModel::Load(ModelDir::Get(0), torch::kFloat32, torch::kCPU);
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<int64_t> all(kPrompt.begin(), kPrompt.end());
  for (int32_t t : Ids(a)) all.push_back(t);
  auto hidden = (*model)->ForwardPacked(torch::tensor(all), {0, static_cast<int64_t>(all.size())});
  ASSERT_TRUE(hidden.ok());
  torch::Tensor lp = torch::log_softmax((*model)->Logits(*hidden).value(), -1);
  for (size_t i = 0; i < 12; ++i) {
    const int64_t pos = static_cast<int64_t>(kPrompt.size() + i) - 1;
    const json& triple = a["meta_info"]["output_token_logprobs"][i];
    EXPECT_EQ(triple[1].get<int64_t>(), all[pos + 1]);
    EXPECT_EQ(lp[pos].argmax().item<int64_t>(), all[pos + 1]) << "position " << pos;
    EXPECT_NEAR(triple[0].get<double>(), lp[pos][all[pos + 1]].item<double>(), 1e-4);
    EXPECT_TRUE(triple[2].is_null());
  }
}

TEST_F(EngineServerTest, PrefillOnlyScoringMatchesTheModelForward) {
  json out = Generate({{"input_ids", kPrompt},
                       {"sampling_params", {{"max_new_tokens", 0}, {"temperature", 0.5}}},
                       {"return_logprob", true},
                       {"logprob_start_len", 0}});
  EXPECT_EQ(out["output_ids"].size(), 0u);
  EXPECT_EQ(out["meta_info"]["finish_reason"]["type"], "length");
  const json& in = out["meta_info"]["input_token_logprobs"];
  ASSERT_EQ(in.size(), kPrompt.size());
  EXPECT_TRUE(in[0][0].is_null());
  auto model = model::DecoderModel::Load(ModelDir::Get(0), torch::kFloat32, torch::kCPU);
  std::vector<int64_t> ids(kPrompt.begin(), kPrompt.end());
  auto hidden = (*model)->ForwardPacked(torch::tensor(ids), {0, static_cast<int64_t>(ids.size())});
  torch::Tensor lp = torch::log_softmax((*model)->Logits(*hidden).value() / 0.5, -1);
  for (size_t p = 1; p < kPrompt.size(); ++p) {
    EXPECT_EQ(in[p][1], kPrompt[p]);
    EXPECT_NEAR(in[p][0].get<double>(), lp[p - 1][kPrompt[p]].item<double>(), 1e-4) << p;
  }
  // logprob_start_len in the middle: positions [5, len).
  out = Generate({{"input_ids", kPrompt},
                  {"sampling_params", {{"max_new_tokens", 2}, {"temperature", 0}}},
                  {"return_logprob", true},
                  {"logprob_start_len", 5}});
  EXPECT_EQ(out["meta_info"]["input_token_logprobs"].size(), kPrompt.size() - 5);
  EXPECT_EQ(out["meta_info"]["input_token_logprobs"][0][1], kPrompt[5]);
}

TEST_F(EngineServerTest, SeededSamplingIsReproducible) {
  auto body = [](int seed) {
    return json{{"input_ids", kPrompt},
                {"sampling_params",
                 {{"temperature", 1.0}, {"max_new_tokens", 16}, {"ignore_eos", true},
                  {"sampling_seed", seed}}}};
  };
  json a = Generate(body(7));
  json b = Generate(body(7));
  json c = Generate(body(8));
  EXPECT_EQ(Ids(a), Ids(b));
  EXPECT_NE(Ids(a), Ids(c));
  // Seeded output does not depend on what else is in the batch.
  json batch = {{"input_ids", {kPrompt, std::vector<int>{1, 2, 3, 4, 5}}},
                {"sampling_params",
                 {{"temperature", 1.0}, {"max_new_tokens", 16}, {"ignore_eos", true},
                  {"sampling_seed", 7}}}};
  json arr = Generate(batch);
  ASSERT_TRUE(arr.is_array());
  EXPECT_EQ(Ids(arr[0]), Ids(a));
}

TEST_F(EngineServerTest, StopTokenAndStopStringFinishAndTrim) {
  json base = Generate({{"input_ids", kPrompt},
                        {"sampling_params",
                         {{"temperature", 0}, {"max_new_tokens", 24}, {"ignore_eos", true},
                          {"skip_special_tokens", false}}}});
  std::vector<int32_t> ids = Ids(base);
  ASSERT_EQ(ids.size(), 24u);
  // Stop token: the 6th output id (first occurrence decides).
  const int32_t stop_id = ids[5];
  const size_t first = std::find(ids.begin(), ids.end(), stop_id) - ids.begin();
  json st = Generate({{"input_ids", kPrompt},
                      {"sampling_params",
                       {{"temperature", 0}, {"max_new_tokens", 24}, {"stop_token_ids", {stop_id}}}}});
  EXPECT_EQ(st["meta_info"]["finish_reason"]["type"], "stop");
  EXPECT_EQ(st["meta_info"]["finish_reason"]["matched"], stop_id);
  EXPECT_EQ(Ids(st).size(), first + 1);  // the stop token is in output_ids

  // Stop string: a piece of the greedy text that spans at least one token boundary.
  const std::string text = base["text"].get<std::string>();
  ASSERT_GT(text.size(), 12u);
  const std::string stop = text.substr(4, 6);
  const size_t at = text.find(stop);
  for (bool keep : {false, true}) {
    json ss = Generate({{"input_ids", kPrompt},
                        {"sampling_params",
                         {{"temperature", 0}, {"max_new_tokens", 24}, {"stop", stop},
                          {"no_stop_trim", keep}, {"skip_special_tokens", false}}}});
    EXPECT_EQ(ss["meta_info"]["finish_reason"]["type"], "stop");
    EXPECT_EQ(ss["meta_info"]["finish_reason"]["matched"], stop);
    EXPECT_EQ(ss["text"], keep ? text.substr(0, at + stop.size()) : text.substr(0, at))
        << "no_stop_trim=" << keep;
  }
}

TEST_F(EngineServerTest, BatchAndNExpansionAnswerInOrder) {
  json arr = Generate({{"input_ids", {kPrompt, std::vector<int>{5, 6, 7}}},
                       {"rid", "batch"},
                       {"sampling_params", {{"temperature", 0}, {"max_new_tokens", 3}}}});
  ASSERT_EQ(arr.size(), 2u);
  EXPECT_EQ(arr[0]["meta_info"]["id"], "batch_0");
  EXPECT_EQ(arr[1]["meta_info"]["prompt_tokens"], 3);
  json n = Generate({{"text", "Hello there"},
                     {"sampling_params",
                      {{"temperature", 1.0}, {"max_new_tokens", 4}, {"n", 3}, {"ignore_eos", true}}}});
  ASSERT_EQ(n.size(), 3u);
}

TEST_F(EngineServerTest, IdenticalPromptsHitThePrefixCache) {
  std::vector<int> prompt;
  for (int i = 0; i < 64; ++i) prompt.push_back(1000 + i);
  json first = Generate({{"input_ids", prompt},
                         {"sampling_params", {{"temperature", 0}, {"max_new_tokens", 2}}}});
  EXPECT_EQ(first["meta_info"]["cached_tokens"], 0);
  json arr = Generate({{"input_ids", std::vector<std::vector<int>>(8, prompt)},
                       {"sampling_params",
                        {{"temperature", 1.0}, {"max_new_tokens", 4}, {"ignore_eos", true}}}});
  ASSERT_EQ(arr.size(), 8u);
  for (const json& o : arr) EXPECT_EQ(o["meta_info"]["cached_tokens"], 60) << o.dump();
}

TEST_F(EngineServerTest, StreamingSendsCumulativeChunksThenDone) {
  std::vector<json> chunks;
  bool done = false;
  Status s = client_->PostStream(
      "/generate",
      json{{"input_ids", kPrompt},
           {"stream", true},
           {"return_logprob", true},
           {"sampling_params", {{"temperature", 0}, {"max_new_tokens", 8}, {"ignore_eos", true}}}}
          .dump(),
      [&](std::string_view line) {
        EXPECT_EQ(line.substr(0, 6), "data: ");
        if (line == "data: [DONE]") {
          done = true;
        } else {
          chunks.push_back(json::parse(line.substr(6)));
        }
        return true;
      });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(done);
  ASSERT_GE(chunks.size(), 2u);
  for (size_t i = 0; i + 1 < chunks.size(); ++i) {
    EXPECT_TRUE(chunks[i]["meta_info"]["finish_reason"].is_null());
    EXPECT_LE(chunks[i]["output_ids"].size(), chunks[i + 1]["output_ids"].size());
    EXPECT_EQ(chunks[i]["meta_info"]["output_token_logprobs"].size(),
              chunks[i]["output_ids"].size());
  }
  EXPECT_EQ(chunks.back()["meta_info"]["finish_reason"]["type"], "length");
  EXPECT_EQ(chunks.back()["output_ids"].size(), 8u);
}

TEST_F(EngineServerTest, AbortMidGenerationReturnsPartialOutput) {
  auto pending = std::async(std::launch::async, [&] {
    http::Client c("127.0.0.1", server_->port());
    return c.Post("/generate",
                  json{{"input_ids", kPrompt},
                       {"rid", "long-request-1"},
                       {"return_logprob", true},
                       {"sampling_params",
                        {{"temperature", 0}, {"max_new_tokens", 400}, {"ignore_eos", true}}}}
                      .dump());
  });
  WaitForRunning(1);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  auto [status, ignored] = Post("/abort_request", {{"rid", "long-request"}});  // prefix
  EXPECT_EQ(status, 200);
  auto r = pending.get();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200);
  json out = json::parse(r->body);
  EXPECT_EQ(out["meta_info"]["finish_reason"]["type"], "abort");
  EXPECT_GT(out["output_ids"].size(), 0u);
  EXPECT_LT(out["output_ids"].size(), 400u);
  EXPECT_EQ(out["meta_info"]["output_token_logprobs"].size(), out["output_ids"].size());
  // /v1/loads drains to 0 (slime polls it after abort_all).
  WaitForRunning(0);
  auto [ls, loads] = Get("/v1/loads?include=core");
  EXPECT_EQ(ls, 200);
  EXPECT_EQ(loads["loads"][0]["num_running_reqs"], 0);
}

TEST_F(EngineServerTest, PauseAbortsInFlightAndHoldsNewRequestsUntilContinue) {
  auto inflight = std::async(std::launch::async, [&] {
    http::Client c("127.0.0.1", server_->port());
    return c.Post("/generate", json{{"input_ids", kPrompt},
                                    {"sampling_params", {{"max_new_tokens", 400}, {"ignore_eos", true}}}}
                                   .dump());
  });
  WaitForRunning(1);
  auto [ps, pj] = Post("/pause_generation", json::object());
  EXPECT_EQ(ps, 200);
  EXPECT_EQ(pj["status"], "ok");
  auto r = inflight.get();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(json::parse(r->body)["meta_info"]["finish_reason"]["type"], "abort");
  auto held = std::async(std::launch::async, [&] {
    http::Client c("127.0.0.1", server_->port());
    return c.Post("/generate", json{{"input_ids", kPrompt},
                                    {"sampling_params", {{"max_new_tokens", 3}, {"temperature", 0}}}}
                                   .dump());
  });
  EXPECT_EQ(held.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout);
  EXPECT_EQ(engine_->load().num_waiting, 1);
  auto [cs, cj] = Post("/continue_generation", json::object());
  EXPECT_EQ(cs, 200);
  auto h = held.get();
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(json::parse(h->body)["meta_info"]["finish_reason"]["type"], "length");
}

// The two pauses that keep requests (slime's interruptible rollout): a greedy request paused
// mid-generation, the weights updated while it waits, then continued. It keeps the tokens it
// had — the old weights' greedy tokens — and samples the rest with the new weights;
// meta_info.weight_versions splits its tokens between the two versions. After a retraction its
// K/V is recomputed with the new weights, so the token after the split is what the new weights
// alone give for prompt + the kept tokens. Without an update, an in-place pause changes nothing.
TEST_F(EngineServerTest, PauseInPlaceOrByRetractionKeepsRequestsAcrossAWeightUpdate) {
  constexpr int kNew = 400;
  const json body = {{"input_ids", kPrompt},
                     {"return_logprob", true},
                     {"sampling_params",
                      {{"temperature", 0}, {"max_new_tokens", kNew}, {"ignore_eos", true}}}};
  auto logprobs = [](const json& out) {
    std::vector<double> v;
    for (const json& t : out["meta_info"]["output_token_logprobs"]) v.push_back(t[0].get<double>());
    return v;
  };
  // Every run starts from an empty prefix cache, so each prefills its prompt the same way.
  auto flush = [&] {
    auto r = client_->Get("/flush_cache");
    ASSERT_TRUE(r.ok() && r->status == 200) << (r.ok() ? r->body : r.status().ToString());
  };
  flush();
  const json reference = Generate(body);
  ASSERT_EQ(Ids(reference).size(), static_cast<size_t>(kNew));
  EXPECT_EQ(reference["meta_info"]["weight_versions"],
            json::parse(R"([{"version": "default", "start": 0, "end": 400}])"));

  // Starts `body`, pauses it in `mode` once it runs, calls `while_paused`, continues; its answer.
  auto interrupted = [&](const std::string& mode, const std::function<void()>& while_paused) {
    flush();
    auto pending = std::async(std::launch::async, [&] {
      http::Client c("127.0.0.1", server_->port());
      return c.Post("/generate", body.dump());
    });
    WaitForRunning(1);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    auto [ps, pj] = Post("/pause_generation", {{"mode", mode}});
    EXPECT_EQ(ps, 200) << pj.dump();
    // In place, the request stays running (its K/V held); retracted, it waits.
    for (int i = 0; i < 500 && engine_->load().num_running != (mode == "in_place" ? 1 : 0); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(engine_->load().num_running, mode == "in_place" ? 1 : 0) << mode;
    EXPECT_EQ(engine_->load().num_waiting, mode == "in_place" ? 0 : 1) << mode;
    EXPECT_EQ(pending.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout)
        << mode << ": the paused request answered";
    while_paused();
    auto [cs, cj] = Post("/continue_generation", json::object());
    EXPECT_EQ(cs, 200);
    auto r = pending.get();
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? json::parse(r->body) : json();
  };

  // In place, no update: the same tokens and log-probs, bit for bit.
  const json still = interrupted("in_place", [] {});
  EXPECT_EQ(Ids(still), Ids(reference));
  EXPECT_EQ(logprobs(still), logprobs(reference));
  EXPECT_EQ(still["meta_info"]["weight_versions"], reference["meta_info"]["weight_versions"]);

  // Back to the original weights after each update, whatever fails (the other tests use them).
  auto restore_weights = [this](void*) {
    Post("/update_weights_from_disk",
         {{"model_path", ModelDir::Get(0)}, {"weight_version", "default"}});
  };
  for (const std::string mode : {"in_place", "retract"}) {
    SCOPED_TRACE(mode);
    const std::unique_ptr<void, decltype(restore_weights)> restore(this, restore_weights);
    const json out = interrupted(mode, [&] {
      auto [s, j] = Post("/update_weights_from_disk",
                         {{"model_path", ModelDir::Get(5)}, {"weight_version", "5"}});
      EXPECT_EQ(s, 200) << j.dump();
    });
    ASSERT_EQ(out["meta_info"]["finish_reason"]["type"], "length") << out.dump();
    const std::vector<int32_t> ids = Ids(out);
    ASSERT_EQ(ids.size(), static_cast<size_t>(kNew));
    const json& spans = out["meta_info"]["weight_versions"];
    ASSERT_EQ(spans.size(), 2u) << spans.dump();
    const int64_t split = spans[0]["end"].get<int64_t>();
    EXPECT_GT(split, 0);
    EXPECT_LT(split, kNew);
    EXPECT_EQ(spans, (json{{{"version", "default"}, {"start", 0}, {"end", split}},
                           {{"version", "5"}, {"start", split}, {"end", kNew}}}));
    EXPECT_EQ(out["meta_info"]["weight_version"], "5");
    EXPECT_EQ(out["meta_info"]["num_retractions"], mode == "retract" ? 1 : 0);
    // The tokens before the update are the old weights' own.
    const std::vector<int32_t> want = Ids(reference);
    const std::vector<double> got_lp = logprobs(out), want_lp = logprobs(reference);
    ASSERT_EQ(got_lp.size(), static_cast<size_t>(kNew));
    EXPECT_TRUE(std::equal(ids.begin(), ids.begin() + split, want.begin()));
    EXPECT_TRUE(std::equal(got_lp.begin(), got_lp.begin() + split, want_lp.begin()));
    if (mode == "retract") {
      // Recomputed with the new weights: the next token is theirs for prompt + kept tokens.
      std::vector<int32_t> prefix(kPrompt.begin(), kPrompt.end());
      prefix.insert(prefix.end(), ids.begin(), ids.begin() + split);
      flush();
      const json next = Generate({{"input_ids", prefix},
                                  {"return_logprob", true},
                                  {"sampling_params", {{"temperature", 0},
                                                       {"max_new_tokens", 1},
                                                       {"ignore_eos", true}}}});
      EXPECT_EQ(Ids(next).at(0), ids[split]);
      EXPECT_NEAR(logprobs(next).at(0), got_lp.at(split), 1e-4);
    }
  }
  // Any other mode is refused, naming the three.
  auto [bs, bj] = Post("/pause_generation", {{"mode", "later"}});
  EXPECT_EQ(bs, 400);
  EXPECT_NE(bj.dump().find("in_place"), std::string::npos) << bj.dump();
  EXPECT_FALSE(engine_->paused());
}

TEST_F(EngineServerTest, ClientDisconnectFreesTheRequest) {
  int seen = 0;
  Status s = client_->PostStream(
      "/generate",
      json{{"input_ids", kPrompt},
           {"stream", true},
           {"sampling_params", {{"max_new_tokens", 400}, {"ignore_eos", true}}}}
          .dump(),
      [&](std::string_view) { return ++seen < 2; });  // hang up after two chunks
  EXPECT_TRUE(s.ok()) << s;
  WaitForRunning(0);
  EXPECT_EQ(engine_->load().num_waiting, 0);
}

TEST_F(EngineServerTest, ConcurrentLoadOfAThousandRequests) {
  // 1,000 sequences in flight at once (one batch body), plus 16 clients sending singles.
  std::vector<std::vector<int>> prompts;
  for (int i = 0; i < 1000; ++i) prompts.push_back({100 + i % 50, 7, 8, 9, 10 + i % 10});
  auto big = std::async(std::launch::async, [&] {
    http::Client c("127.0.0.1", server_->port(), {std::chrono::seconds(300), true});
    return c.Post("/generate", json{{"input_ids", prompts},
                                    {"sampling_params",
                                     {{"temperature", 0}, {"max_new_tokens", 4}, {"ignore_eos", true}}}}
                                   .dump());
  });
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 16; ++t) {
    threads.emplace_back([&, t] {
      http::Client c("127.0.0.1", server_->port());
      for (int k = 0; k < 4; ++k) {
        auto r = c.Post("/generate", json{{"input_ids", {t + 1, k + 2, 3}},
                                          {"sampling_params", {{"max_new_tokens", 3}}}}
                                         .dump());
        if (r.ok() && r->status == 200) ++ok;
      }
    });
  }
  for (auto& th : threads) th.join();
  auto r = big.get();
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->status, 200);
  json arr = json::parse(r->body);
  ASSERT_EQ(arr.size(), 1000u);
  for (const json& o : arr) ASSERT_EQ(o["output_ids"].size(), 4u);
  // Same prompt => same greedy output, whatever the batch composition.
  EXPECT_EQ(arr[0]["output_ids"], arr[50]["output_ids"]);
  EXPECT_EQ(arr[7]["output_ids"], arr[957]["output_ids"]);
  EXPECT_EQ(ok.load(), 64);
}

TEST_F(EngineServerTest, BadInputIsA400NamingTheFieldAndTheServerKeepsServing) {
  struct Case {
    std::string body;
    std::string needle;
  };
  std::vector<Case> cases = {
      {"{not json", "JSON"},
      {R"({"input_ids": [1,2], "sampling_params": {"temperature": "hot"}})", "temperature"},
      {R"({"input_ids": [1,2], "sampling_params": {"temperature": -1}})", "temperature"},
      {R"({"input_ids": [1,2], "sampling_params": {"top_p": 0}})", "top_p"},
      {R"({"input_ids": [1,2], "sampling_params": {"top_p": 1.5}})", "top_p"},
      {R"({"input_ids": []})", "input_ids"},
      {R"({"text": ""})", "text"},
      {R"({"input_ids": [1, 99999999]})", "input_ids"},
      {R"({"input_ids": [1,2], "sampling_params": {"max_new_tokens": 100000000}})", "context length"},
      {R"({"sampling_params": {}})", "text"},
  };
  std::vector<int> too_long(600, 5);
  cases.push_back({json{{"input_ids", too_long}}.dump(), "context"});
  for (const Case& c : cases) {
    auto r = client_->Post("/generate", c.body);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->status, 400) << c.body << " -> " << r->body;
    json j = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(j.contains("error")) << r->body;
    const std::string msg = j["error"]["message"].get<std::string>();
    EXPECT_NE(msg.find(c.needle), std::string::npos) << c.body << " -> " << msg;
  }
  // Unknown fields are ignored.
  json ok = Generate({{"input_ids", kPrompt},
                      {"some_future_field", 3},
                      {"sampling_params", {{"max_new_tokens", 2}, {"new_knob", true}}}});
  EXPECT_EQ(ok["output_ids"].size(), 2u);
}

TEST_F(EngineServerTest, InfoHealthLoadsWeightVersionAndMetrics) {
  auto [hs, hj] = Get("/health");
  EXPECT_EQ(hs, 200);
  auto hg = client_->Get("/health_generate");
  ASSERT_TRUE(hg.ok());
  EXPECT_EQ(hg->status, 200);
  for (const char* path : {"/server_info", "/get_server_info"}) {
    auto [s, j] = Get(path);
    EXPECT_EQ(s, 200);
    for (const char* key : {"tp_size", "dp_size", "pp_size", "ep_size", "enable_memory_saver",
                            "disaggregation_mode", "model_path", "served_model_name", "version"}) {
      EXPECT_TRUE(j.contains(key)) << path << " lacks " << key;
    }
    EXPECT_EQ(j["enable_memory_saver"], false);
  }
  for (const char* path : {"/model_info", "/get_model_info"}) {
    auto [s, j] = Get(path);
    EXPECT_EQ(s, 200);
    EXPECT_EQ(j["model_type"], "qwen3");
  }
  auto [ws, wj] = Get("/get_weight_version");
  EXPECT_EQ(wj["weight_version"], "default");
  auto [ls, lj] = Get("/v1/loads?include=core");
  EXPECT_EQ(lj["loads"][0]["num_waiting_reqs"], 0);
  auto [ms, mj] = Get("/v1/models");
  EXPECT_EQ(mj["object"], "list");
  Generate({{"input_ids", kPrompt}, {"sampling_params", {{"max_new_tokens", 2}}}});
  auto m = client_->Get("/metrics");
  ASSERT_TRUE(m.ok());
  for (const char* name :
       {"slime_engine_num_running_requests", "slime_engine_kv_pages_used",
        "slime_engine_prefix_cache_hit_rate", "slime_engine_generation_tokens_total",
        "slime_engine_time_to_first_token_seconds_bucket", "slime_engine_step_seconds_count"}) {
    EXPECT_NE(m->body.find(name), std::string::npos) << name;
  }
  const slime::testing::PromtoolResult check = slime::testing::PromtoolCheckMetrics(m->body);
  ASSERT_TRUE(check.ran) << check.output;
  EXPECT_EQ(check.exit_code, 0) << "promtool check metrics:\n" << check.output;
}

TEST_F(EngineServerTest, FlushCacheIsRefusedWhileBusy) {
  auto busy = std::async(std::launch::async, [&] {
    http::Client c("127.0.0.1", server_->port());
    return c.Post("/generate", json{{"input_ids", kPrompt},
                                    {"rid", "flush-blocker"},
                                    {"sampling_params", {{"max_new_tokens", 400}, {"ignore_eos", true}}}}
                                   .dump());
  });
  WaitForRunning(1);
  auto r = client_->Get("/flush_cache");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 400);
  Post("/abort_request", {{"abort_all", true}});
  busy.get();
  r = client_->Get("/flush_cache");
  EXPECT_EQ(r->status, 200);
  r = client_->Post("/flush_cache", "");
  EXPECT_EQ(r->status, 200);
}

TEST_F(EngineServerTest, UpdateWeightsFromDiskChangesOutputAndVersion) {
  json body = {{"input_ids", kPrompt},
               {"return_logprob", true},
               {"sampling_params", {{"temperature", 0}, {"max_new_tokens", 8}, {"ignore_eos", true}}}};
  auto logprobs = [](const json& out) {
    std::vector<double> v;
    for (const json& t : out["meta_info"]["output_token_logprobs"]) v.push_back(t[0].get<double>());
    return v;
  };
  json before = Generate(body);
  auto [s, j] = Post("/update_weights_from_disk",
                     {{"model_path", ModelDir::Get(5)}, {"weight_version", "5"}});
  EXPECT_EQ(s, 200) << j.dump();
  EXPECT_EQ(j["success"], true);
  json after = Generate(body);
  EXPECT_NE(logprobs(before), logprobs(after));
  EXPECT_EQ(after["meta_info"]["weight_version"], "5");
  // A bad path is a 400 that names it; the old weights keep serving.
  auto [bs, bj] = Post("/update_weights_from_disk", {{"model_path", "/nonexistent/ckpt"}});
  EXPECT_EQ(bs, 400);
  EXPECT_NE(bj["message"].get<std::string>().find("/nonexistent/ckpt"), std::string::npos);
  // Back to the original weights for the other tests.
  Post("/update_weights_from_disk", {{"model_path", ModelDir::Get(0)}, {"weight_version", "default"}});
  json again = Generate(body);
  EXPECT_EQ(Ids(again), Ids(before));
  EXPECT_EQ(logprobs(again), logprobs(before));
}

// SGLang's /get_weights_by_name: the first truncate_size rows of the full parameter in float32
// as a bare (nested) JSON list, by POST body, GET body or GET query; lm_head.weight of a tied
// model is embed_tokens.weight; an unknown or missing name is a 400 that says so.
TEST_F(EngineServerTest, GetWeightsByNameReturnsTheParameterTruncated) {
  auto reader = model::CheckpointReader::Open(ModelDir::Get(0));
  ASSERT_TRUE(reader.ok()) << reader.status();
  const std::string q = "model.layers.0.self_attn.q_proj.weight";
  auto loaded = reader->Load(q);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const torch::Tensor want = loaded->to(torch::kFloat32).narrow(0, 0, 3).contiguous();
  auto [s, j] = Post("/get_weights_by_name", {{"name", q}, {"truncate_size", 3}});
  ASSERT_EQ(s, 200) << j.dump();
  ASSERT_TRUE(j.is_array()) << j.dump().substr(0, 300);
  ASSERT_EQ(j.size(), 3u);
  ASSERT_EQ(j[0].size(), static_cast<size_t>(want.size(1)));
  for (int64_t r = 0; r < 3; ++r) {
    for (int64_t c = 0; c < want.size(1); ++c) {
      ASSERT_EQ(j[r][c].get<float>(), want[r][c].item<float>()) << r << "," << c;
    }
  }
  // GET with the same JSON body, and with query parameters.
  auto body = client_->Request("GET", "/get_weights_by_name",
                               json{{"name", q}, {"truncate_size", 3}}.dump());
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_EQ(json::parse(body->body), j);
  auto [gs, gj] = Get("/get_weights_by_name?name=" + q + "&truncate_size=3");
  EXPECT_EQ(gs, 200);
  EXPECT_EQ(gj, j);
  // A 1-D parameter is a flat list; the default truncate_size is 100 (more than its 64 values).
  auto [ns, nj] = Post("/get_weights_by_name", {{"name", "model.norm.weight"}});
  ASSERT_EQ(ns, 200) << nj.dump();
  EXPECT_EQ(nj.size(), 64u);
  EXPECT_TRUE(nj[0].is_number()) << nj.dump().substr(0, 200);
  // Tied embeddings: lm_head.weight reads embed_tokens.weight.
  auto [ts, tj] = Post("/get_weights_by_name", {{"name", "lm_head.weight"}, {"truncate_size", 2}});
  auto [es, ej] = Post("/get_weights_by_name",
                       {{"name", "model.embed_tokens.weight"}, {"truncate_size", 2}});
  EXPECT_EQ(ts, 200);
  EXPECT_EQ(tj, ej);
  // Unknown and missing names.
  auto [us, uj] = Post("/get_weights_by_name", {{"name", "model.nope.weight"}});
  EXPECT_EQ(us, 400);
  EXPECT_NE(uj["error"]["message"].get<std::string>().find("model.nope.weight"), std::string::npos)
      << uj.dump();
  auto [ms, mj] = Post("/get_weights_by_name", json::object());
  EXPECT_EQ(ms, 400);
  EXPECT_NE(mj["error"]["message"].get<std::string>().find("name"), std::string::npos) << mj.dump();
}

TEST_F(EngineServerTest, ReleaseAndResumeMemoryOccupation) {
  json body = {{"input_ids", kPrompt},
               {"sampling_params", {{"temperature", 0}, {"max_new_tokens", 4}}}};
  json before = Generate(body);
  auto [rs, rj] = Post("/release_memory_occupation", json::object());
  EXPECT_EQ(rs, 200);
  EXPECT_TRUE(rj.is_null());
  auto [bad, bj] = Post("/resume_memory_occupation", {{"tags", {"gpu_magic"}}});
  EXPECT_EQ(bad, 400);
  auto [ws, wj] = Post("/resume_memory_occupation", {{"tags", {"weights"}}});
  EXPECT_EQ(ws, 200);
  auto [ks, kj] = Post("/resume_memory_occupation", {{"tags", {"kv_cache", "cuda_graph"}}});
  EXPECT_EQ(ks, 200);
  json again = Generate(body);
  EXPECT_EQ(Ids(again), Ids(before));
}

TEST_F(EngineServerTest, OpenAiCompletionsAndChat) {
  auto [cs, cj] = Post("/v1/completions", {{"prompt", "The capital of France is"},
                                           {"max_tokens", 5},
                                           {"temperature", 0},
                                           {"logprobs", 2}});
  EXPECT_EQ(cs, 200) << cj.dump();
  EXPECT_EQ(cj["object"], "text_completion");
  EXPECT_EQ(cj["usage"]["completion_tokens"], 5);
  auto [hs, hj] = Post("/v1/chat/completions",
                       {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                        {"max_tokens", 4},
                        {"temperature", 0}});
  EXPECT_EQ(hs, 200) << hj.dump();
  EXPECT_EQ(hj["choices"][0]["message"]["role"], "assistant");
  int chunks = 0;
  bool done = false;
  Status s = client_->PostStream(
      "/v1/chat/completions",
      json{{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
           {"max_tokens", 4},
           {"stream", true}}
          .dump(),
      [&](std::string_view line) {
        if (line == "data: [DONE]") done = true;
        else ++chunks;
        return true;
      });
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_TRUE(done);
  EXPECT_GE(chunks, 2);
}

}  // namespace
}  // namespace slime::engine
