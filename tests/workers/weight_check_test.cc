// weight_sync.check_weight_update_equal through the real pieces: a TrainerWorker and an
// EngineWorker (its HTTP server on a free port) in this process on the CPU. After a Gloo weight
// sync the engine's GET /weights_checksum equals the trainer's tensors; a tensor corrupted
// through the engine's own API (/update_weights_from_disk of a directory with one tensor
// changed) is reported by name, and only it.
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "remove_tree.h"
#include "slime/comm/weight_checksum.h"
#include "slime/config/config.h"
#include "slime/http/client.h"
#include "slime/model/checkpoint.h"
#include "slime/model/init_random_model.h"
#include "slime/workers/workers.h"
#include "test_paths.h"

namespace slime::workers {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

class WeightCheckTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string tokenizer = slime::testing::SourceDir() + "/.cache/testdata/qwen3";
    if (!fs::exists(tokenizer + "/tokenizer.json")) {
      GTEST_SKIP() << tokenizer << " missing: run scripts/fetch_test_data.sh";
    }
    root_ = (fs::temp_directory_path() / ("slime_weight_check_" + std::to_string(::getpid())))
                .string();
    slime::testing::RemoveTree(root_);
    fs::create_directories(root_);
    model_ = root_ + "/model";
    Status s = model::InitRandomModel(
        slime::testing::SourceDir() + "/tests/data/model/configs/qwen3-tiny.json", tokenizer,
        model_, 5, "fp32");
    ASSERT_TRUE(s.ok()) << s;
  }
  void TearDown() override {
    if (!root_.empty()) slime::testing::RemoveTree(root_);
  }

  WorkerOptions Options() const {
    WorkerOptions o;
    o.config = config::DefaultConfig();
    o.config.model.hf_checkpoint = model_;
    o.config.cluster.run_dir = root_ + "/run";
    o.config.data.num_rollout = 1;
    o.config.data.rollout_batch_size = 1;
    o.config.train.global_batch_size = 1;
    o.config.train.bf16 = false;
    o.config.weight_sync.check_weight_update_equal = true;
    o.device = "cpu";
    o.num_threads = 1;
    return o;
  }

  std::string root_, model_;
};

TEST_F(WeightCheckTest, EqualAfterASyncAndACorruptedTensorIsNamed) {
  StatusOr<std::unique_ptr<EngineWorker>> engine = EngineWorker::Start(Options(), "127.0.0.1");
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::unique_ptr<TrainerWorker> trainer = TrainerWorker::Create(Options());
  ASSERT_TRUE(trainer->Init().ok());
  // Before any connection there is nothing to compare with.
  EXPECT_FALSE(trainer->CheckEngineWeights().ok());
  const Json connect = {{"engines", Json::array({{{"host", (*engine)->host()},
                                                  {"port", (*engine)->port()},
                                                  {"num_gpus", 1}}})},
                        {"master_address", "127.0.0.1"}};
  ASSERT_TRUE(trainer->ConnectEngines(connect).ok());
  StatusOr<Json> synced = trainer->SyncWeights("1");
  ASSERT_TRUE(synced.ok()) << synced.status();

  StatusOr<Json> checked = trainer->CheckEngineWeights();
  ASSERT_TRUE(checked.ok()) << checked.status();
  EXPECT_EQ(checked->at("engines").get<int>(), 1);

  // The route itself: one entry per checkpoint tensor, the checksum of the file's values.
  http::Client client((*engine)->host(), (*engine)->port());
  StatusOr<http::Response> listed = client.Get("/weights_checksum");
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->status, 200) << listed->body;
  const Json sums = Json::parse(listed->body);
  EXPECT_EQ(sums.at("dtype"), "float32");
  EXPECT_EQ(sums.at("weight_version"), "1");
  StatusOr<model::CheckpointReader> reader = model::CheckpointReader::Open(model_);
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_EQ(sums.at("tensors").size(), checked->at("tensors").get<size_t>());
  const std::string corrupted = "model.layers.0.mlp.down_proj.weight";
  bool found = false;
  for (const Json& t : sums.at("tensors")) {
    if (t.at("name") != corrupted) continue;
    found = true;
    StatusOr<torch::Tensor> w = reader->Load(corrupted);
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ(t.at("checksum").get<std::string>(), *comm::TensorChecksum(*w, torch::kFloat32));
  }
  ASSERT_TRUE(found) << sums.dump();

  // Corrupt one tensor through the engine's HTTP API: the model directory again, one element
  // of one tensor changed.
  std::vector<model::NamedTensor> tensors;
  for (const std::string& name : reader->TensorNames()) {
    StatusOr<torch::Tensor> t = reader->Load(name);
    ASSERT_TRUE(t.ok()) << t.status();
    torch::Tensor copy = t->clone();
    if (name == corrupted) copy.view({-1})[3] += 0.25f;
    tensors.push_back({name, copy});
  }
  const std::string bad_dir = root_ + "/corrupted";
  ASSERT_TRUE(model::WriteCheckpoint(bad_dir, tensors).ok());
  fs::copy_file(model_ + "/config.json", bad_dir + "/config.json");
  StatusOr<http::Response> loaded = client.Post(
      "/update_weights_from_disk", Json{{"model_path", bad_dir}, {"weight_version", "1"}}.dump());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->status, 200) << loaded->body;

  StatusOr<Json> mismatch = trainer->CheckEngineWeights();
  ASSERT_FALSE(mismatch.ok());
  const std::string message(mismatch.status().message());
  EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kDataLoss) << message;
  EXPECT_NE(message.find("weight_sync.check_weight_update_equal"), std::string::npos) << message;
  EXPECT_NE(message.find("tensor '" + corrupted + "' differs from the trainer's"),
            std::string::npos)
      << message;
  EXPECT_EQ(message.find("; and "), std::string::npos) << "only one tensor differs: " << message;

  // The next sync repairs it.
  ASSERT_TRUE(trainer->SyncWeights("2").ok());
  EXPECT_TRUE(trainer->CheckEngineWeights().ok());
  ASSERT_TRUE(trainer->DisconnectEngines().ok());
}

}  // namespace
}  // namespace slime::workers
