// checkpoint.async_save in the trainer (train/checkpoint.h "Background saves",
// checkpoint_writer.h, Trainer::Save's SaveMode) on a tiny random Qwen3 on the CPU in float32:
//   - a background save writes, byte for byte, the files of a synchronous save of the same
//     state, although the weights, the optimizer state and the RNG change in place (and training
//     goes on) while it writes — PPO, so the critic's checkpoint rides the same queue;
//   - resuming from a background-saved checkpoint trains exactly as resuming from a synchronous
//     one;
//   - a failed background write is reported once, naming its iteration directory: by the next
//     Save (which then writes nothing) or by WaitForSave, and the previous checkpoint and the
//     tracker stay as they were;
//   - on a pipeline × tensor-parallel grid and a data-parallel ZeRO-1 grid (threads joined by real
//     Gloo groups) the collective save in the background writes the synchronous save's files,
//     and a failed background write of the writing rank fails the next Save on every rank.
// The test hook $SLIME_TEST_ASYNC_SAVE_DELAY_MS (checkpoint.h) holds each background write
// before each file, so the tests act while a write is certainly in progress.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "multi_rank_harness.h"
#include "slime/comm/process_group.h"
#include "slime/comm/tensor_parallel_group.h"
#include "slime/model/weights.h"
#include "slime/train/checkpoint.h"
#include "slime/train/optimizer.h"
#include "slime/train/trainer.h"
#include "trainer_test_util.h"

namespace slime::train {
namespace {

namespace fs = std::filesystem;
using model::testing::TempDir;
using test_util::BaseConfig;
using test_util::ExpectBitwiseEqual;
using test_util::MakeBatch;
using test_util::MakeModelDir;
using test_util::MakeTrainer;
using test_util::Msg;
using test_util::Replace;
using test_util::Train;
using test_util::Weights;
using SaveMode = Trainer::SaveMode;

// Every regular file under `dir`: relative path -> bytes.
std::map<std::string, std::string> Files(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const fs::directory_entry& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    std::ifstream in(e.path(), std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    out[fs::relative(e.path(), dir).string()] = s.str();
  }
  return out;
}

// `got` holds exactly the files of `want`, byte for byte.
void ExpectSameFiles(const fs::path& want, const fs::path& got) {
  const std::map<std::string, std::string> a = Files(want), b = Files(got);
  std::vector<std::string> names_a, names_b;
  for (const auto& [name, bytes] : a) names_a.push_back(name);
  for (const auto& [name, bytes] : b) names_b.push_back(name);
  ASSERT_EQ(names_b, names_a) << got << " vs " << want;
  for (const auto& [name, bytes] : a) {
    EXPECT_TRUE(b.at(name) == bytes)
        << name << " differs (" << b.at(name).size() << " vs " << bytes.size() << " bytes)";
  }
}

std::string ReadText(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Sets $SLIME_TEST_ASYNC_SAVE_DELAY_MS for its scope.
class ScopedWriteDelay {
 public:
  explicit ScopedWriteDelay(int ms) {
    ::setenv(kAsyncSaveTestDelayEnv, std::to_string(ms).c_str(), 1);
  }
  ~ScopedWriteDelay() { ::unsetenv(kAsyncSaveTestDelayEnv); }
};

// Waits (up to 60 s) until `path` exists; false if it never did.
bool WaitForPath(const fs::path& path) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!fs::exists(path)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

// Adds 1 to every parameter of `t` in place (this rank's shards), and to its optimizer state
// unless it is sharded: what the next optimizer step would do to the tensors a background
// write must not read any more.
void ChangeInPlace(Trainer& t) {
  torch::NoGradGuard no_grad;
  for (const model::NamedTensor& nt :
       model::NamedParameters(t.model().weights(), t.model().config())) {
    nt.tensor.add_(1.0);
  }
  if (!t.optimizer().distributed()) {
    for (const model::NamedTensor& nt : t.optimizer().ExportState().tensors) nt.tensor.add_(1.0);
  }
}

config::Config PpoConfig() {
  config::Config c = BaseConfig();
  c.algorithm.advantage_estimator = "ppo";
  c.algorithm.gamma = 1.0;
  c.algorithm.lambd = 0.95;
  c.train.critic_lr = 1e-3;
  return c;
}

// PPO: the critic's checkpoint is queued before the actor's. The weights, the optimizer state
// and the CPU generator change right after Save returns (the write is held before its first
// file), then a rollout trains while the files are written: the files are still the synchronous
// save's of the state at Save.
TEST(AsyncCheckpointTest, WritesTheFilesOfTheSynchronousSaveWhileTheStateChanges) {
  TempDir dir;
  const std::string model_dir = MakeModelDir(dir, "m", 5);
  auto a = MakeTrainer(model_dir, PpoConfig());
  ASSERT_NE(a, nullptr);
  Train(*a, 0, MakeBatch(4, 31));
  const std::string extra = R"({"epoch_id": 2})";
  auto sync = a->Save(dir.Join("sync"), 0, extra, SaveMode::kSynchronous);
  ASSERT_TRUE(sync.ok()) << sync.status();
  {
    ScopedWriteDelay delay(100);
    auto background = a->Save(dir.Join("async"), 0, extra, SaveMode::kBackground);
    ASSERT_TRUE(background.ok()) << background.status();
    EXPECT_EQ(*background, dir.Join("async") + "/" + IterationDirName(0));
    ChangeInPlace(*a);
    (void)torch::rand({16});  // advances the CPU generator
    EXPECT_FALSE(fs::exists(dir.Join("async") + "/" + kCheckpointTrackerFile))
        << "published before the held write could have finished";
    Train(*a, 1, MakeBatch(4, 32));
    Status waited = a->WaitForSave();
    ASSERT_TRUE(waited.ok()) << waited;
  }
  // Critic and actor: at least 2 × 5 held steps of 100 ms.
  EXPECT_GT(a->last_background_save().write_seconds, 1.0);
  EXPECT_TRUE(
      fs::exists(dir.Join("async") + "/critic/" + IterationDirName(0) + "/" + kExtraWeightsFile));
  ExpectSameFiles(dir.Join("sync"), dir.Join("async"));
  // Nothing else to wait for.
  EXPECT_TRUE(a->WaitForSave().ok());
  EXPECT_EQ(a->last_background_save().write_seconds, 0.0);
}

// checkpoint.async_save (SaveMode::kAsConfigured): resuming from the background-saved checkpoint
// and from a synchronous one of the same state gives the same next rollout, bit for bit.
TEST(AsyncCheckpointTest, ResumingFromABackgroundSaveEqualsResumingFromASynchronousOne) {
  TempDir dir;
  const std::string model_dir = MakeModelDir(dir, "m", 6);
  config::Config c = BaseConfig();
  c.checkpoint.async_save = true;
  auto a = MakeTrainer(model_dir, c);
  ASSERT_NE(a, nullptr);
  Train(*a, 0, MakeBatch(4, 41));
  Train(*a, 1, MakeBatch(4, 42));
  ASSERT_TRUE(a->Save(dir.Join("sync"), 1, "{}", SaveMode::kSynchronous).ok());
  auto saved = a->Save(dir.Join("async"), 1);
  ASSERT_TRUE(saved.ok()) << saved.status();
  ChangeInPlace(*a);
  ASSERT_TRUE(a->WaitForSave().ok());
  EXPECT_TRUE(fs::exists(*saved + "/" + kTrainerStateFile));

  const data::RolloutBatch next = MakeBatch(4, 43);
  std::vector<std::vector<torch::Tensor>> after;
  std::vector<std::map<std::string, double>> values;
  for (const char* from : {"sync", "async"}) {
    auto b = MakeTrainer(model_dir, BaseConfig());
    ASSERT_NE(b, nullptr);
    auto loaded = b->Load(dir.Join(from));
    ASSERT_TRUE(loaded.ok()) << from << ": " << loaded.status();
    EXPECT_EQ(loaded->rollout_id, 1);
    EXPECT_EQ(loaded->step, 2);
    TrainRolloutResult r = Train(*b, 2, next);
    ASSERT_EQ(r.steps.size(), 1u) << from;
    values.push_back(r.steps[0].values);
    after.push_back(Weights(*b));
  }
  EXPECT_EQ(values[1], values[0]);
  ExpectBitwiseEqual(after[1], after[0]);
}

// A write that fails in the background (its temporary directory removed while it is held) is
// reported once, naming its iteration directory — by the next Save, which writes nothing, or by
// WaitForSave; the previous checkpoint and the tracker are untouched, and saving works again
// afterwards.
TEST(AsyncCheckpointTest, AFailedBackgroundWriteIsReportedOnceAndKeepsThePreviousCheckpoint) {
  TempDir dir;
  const std::string model_dir = MakeModelDir(dir, "m", 7);
  const fs::path save = dir.Join("save");
  auto a = MakeTrainer(model_dir, BaseConfig());
  ASSERT_NE(a, nullptr);
  Train(*a, 0, MakeBatch(4, 51));
  ASSERT_TRUE(a->Save(save.string(), 0, "{}", SaveMode::kBackground).ok());
  ASSERT_TRUE(a->WaitForSave().ok());
  ASSERT_EQ(ReadText(save / kCheckpointTrackerFile), "0");
  const auto files_of_0 = Files(save / IterationDirName(0));

  auto break_write = [&](int64_t iteration) {
    ScopedWriteDelay delay(500);
    ASSERT_TRUE(a->Save(save.string(), iteration, "{}", SaveMode::kBackground).ok());
    const fs::path tmp = save / (".tmp-" + IterationDirName(iteration));
    ASSERT_TRUE(WaitForPath(tmp));
    fs::remove_all(tmp);  // the write is held before its first file
  };
  // Reported by the next Save, which writes nothing.
  break_write(1);
  auto next = a->Save(save.string(), 2, "{}", SaveMode::kBackground);
  ASSERT_FALSE(next.ok());
  EXPECT_NE(Msg(next.status()).find((save / IterationDirName(1)).string()), std::string::npos)
      << next.status();
  EXPECT_NE(Msg(next.status()).find("background"), std::string::npos) << next.status();
  EXPECT_TRUE(a->WaitForSave().ok()) << "reported once";
  // Reported by WaitForSave.
  break_write(3);
  Status waited = a->WaitForSave();
  ASSERT_FALSE(waited.ok());
  EXPECT_NE(Msg(waited).find((save / IterationDirName(3)).string()), std::string::npos) << waited;
  EXPECT_TRUE(a->WaitForSave().ok()) << "reported once";

  EXPECT_EQ(ReadText(save / kCheckpointTrackerFile), "0");
  std::vector<std::string> entries;
  for (const fs::directory_entry& e : fs::directory_iterator(save)) {
    entries.push_back(e.path().filename().string());
  }
  std::sort(entries.begin(), entries.end());
  EXPECT_EQ(entries, (std::vector<std::string>{IterationDirName(0), kCheckpointTrackerFile}));
  EXPECT_TRUE(Files(save / IterationDirName(0)) == files_of_0);

  ASSERT_TRUE(a->Save(save.string(), 4, "{}", SaveMode::kBackground).ok());
  ASSERT_TRUE(a->WaitForSave().ok());
  EXPECT_EQ(ReadText(save / kCheckpointTrackerFile), "4");
  auto b = MakeTrainer(model_dir, BaseConfig());
  ASSERT_NE(b, nullptr);
  auto loaded = b->Load(save.string());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->rollout_id, 4);
  ExpectBitwiseEqual(Weights(*b), Weights(*a));
}

// ---- several ranks

// A PP × DP × TP grid of trainer threads over Gloo (global rank = (dp · TP + tp) · PP + stage,
// as tests/train/pipeline_parallel_test.cc lays it out); body(rank, options) on each.
struct Grid {
  int pp = 1, dp = 1, tp = 1;
  int world() const { return pp * dp * tp; }
  int rank(int d, int t, int s) const { return (d * tp + t) * pp + s; }
  int dp_rank(int rank) const { return rank / (pp * tp); }
};

void OnGrid(const Grid& g, const std::string& model_dir, const config::Config& c,
            const std::function<void(int, TrainerOptions)>& body) {
  const int world = g.world();
  std::vector<std::vector<int>> pp_groups, dp_groups, tp_groups;
  for (int d = 0; d < g.dp; ++d) {
    for (int t = 0; t < g.tp; ++t) {
      pp_groups.emplace_back();
      for (int s = 0; s < g.pp; ++s) pp_groups.back().push_back(g.rank(d, t, s));
    }
  }
  for (int t = 0; t < g.tp; ++t) {
    for (int s = 0; s < g.pp; ++s) {
      dp_groups.emplace_back();
      for (int d = 0; d < g.dp; ++d) dp_groups.back().push_back(g.rank(d, t, s));
    }
  }
  for (int d = 0; d < g.dp; ++d) {
    for (int s = 0; s < g.pp; ++s) {
      tp_groups.emplace_back();
      for (int t = 0; t < g.tp; ++t) tp_groups.back().push_back(g.rank(d, t, s));
    }
  }
  using test_util::RankGroups;
  const RankGroups pp_pgs =
      g.pp > 1 ? test_util::MakeGroups(world, pp_groups, "async-pp") : RankGroups(world);
  const RankGroups dp_pgs =
      g.dp > 1 ? test_util::MakeGroups(world, dp_groups, "async-dp") : RankGroups(world);
  const RankGroups tp_pgs =
      g.tp > 1 ? test_util::MakeGroups(world, tp_groups, "async-tp") : RankGroups(world);
  ASSERT_EQ(pp_pgs.size(), static_cast<size_t>(world));
  ASSERT_EQ(dp_pgs.size(), static_cast<size_t>(world));
  ASSERT_EQ(tp_pgs.size(), static_cast<size_t>(world));
  test_util::RunRanks(world, [&](int rank) {
    TrainerOptions o;
    o.model_dir = model_dir;
    o.config = c;
    if (g.pp > 1) {
      o.pp_group = std::make_shared<comm::ProcessGroupPipelineParallel>(pp_pgs[rank].at(0));
    }
    if (g.tp > 1) {
      o.tp_group = std::make_shared<comm::ProcessGroupTensorParallel>(tp_pgs[rank].at(0));
    }
    test_util::GridRank dp;
    dp.rank = rank;
    dp.dp_rank = g.dp_rank(rank);
    dp.dp_size = g.dp;
    if (g.dp > 1) dp.dp = dp_pgs[rank].at(0);
    test_util::WireDataParallel(dp, o);
    body(rank, std::move(o));
  });
}

// The tiny Qwen3 with 4 layers (2 stages) and a vocabulary that splits over 2 TP ranks.
std::string MakeGridModelDir(const TempDir& dir, uint64_t seed) {
  std::string json = model::testing::TinyQwen3ConfigJson();
  Replace(json, "\"num_hidden_layers\": 2", "\"num_hidden_layers\": 4");
  Replace(json, "\"vocab_size\": 101", "\"vocab_size\": 104");
  return test_util::MakeModelDirFromJson(dir, "m", json, seed);
}

// Every rank saves synchronously, then in the background (the same collectives: the DP shards,
// the TP shards and the stages are gathered to the writing rank), changes its weights at once
// and trains the next rollout while the writer's files are written: the files equal the
// synchronous save's, and every rank got the same outcome.
void ExpectBackgroundSaveOfGridMatchesSynchronous(const Grid& g, bool zero) {
  TempDir dir;
  const std::string model_dir = MakeGridModelDir(dir, 61);
  config::Config c = test_util::ModelParallelConfig();
  c.train.use_distributed_optimizer = zero;
  const data::RolloutBatch batch = MakeBatch(8, 62);
  const std::string sync_dir = dir.Join("sync"), async_dir = dir.Join("async");
  std::vector<std::string> sync_out(g.world()), async_out(g.world());
  ScopedWriteDelay delay(50);
  OnGrid(g, model_dir, c, [&](int rank, TrainerOptions o) {
    auto t = Trainer::Create(std::move(o));
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_EQ((*t)->optimizer().distributed(), zero);
    auto r = (*t)->TrainRollout(0, batch);
    ASSERT_TRUE(r.ok()) << r.status();
    auto s = (*t)->Save(sync_dir, 0, "{}", SaveMode::kSynchronous);
    ASSERT_TRUE(s.ok()) << s.status();
    auto a = (*t)->Save(async_dir, 0, "{}", SaveMode::kBackground);
    ASSERT_TRUE(a.ok()) << a.status();
    sync_out[rank] = *s;
    async_out[rank] = *a;
    ChangeInPlace(**t);
    r = (*t)->TrainRollout(1, batch);
    ASSERT_TRUE(r.ok()) << r.status();
    Status waited = (*t)->WaitForSave();
    ASSERT_TRUE(waited.ok()) << waited;
  });
  for (int rank = 0; rank < g.world(); ++rank) {
    const std::string want = sync_out[rank].empty() ? "" : async_dir + "/" + IterationDirName(0);
    EXPECT_EQ(async_out[rank], want) << "rank " << rank;
  }
  ExpectSameFiles(sync_dir, async_dir);
}

TEST(AsyncCheckpointGridTest, PipelineTimesTensorParallelWritesTheSynchronousFiles) {
  ExpectBackgroundSaveOfGridMatchesSynchronous(Grid{2, 1, 2}, /*zero=*/false);
}

TEST(AsyncCheckpointGridTest, DataParallelZeroOneWritesTheSynchronousFiles) {
  ExpectBackgroundSaveOfGridMatchesSynchronous(Grid{1, 2, 1}, /*zero=*/true);
}

// The writing rank's background write fails (its temporary directory removed while it is held):
// the next Save fails on all four ranks of a PP=2 × TP=2 grid — the writer naming the failed
// iteration, the others naming the rank that writes — and nobody hangs; no checkpoint appears.
TEST(AsyncCheckpointGridTest, AFailedBackgroundWriteFailsTheNextSaveOnEveryRank) {
  TempDir dir;
  const std::string model_dir = MakeGridModelDir(dir, 63);
  const fs::path save = dir.Join("save");
  const Grid g{2, 1, 2};
  const int writer = g.rank(0, 0, 0);
  std::vector<std::string> errors(g.world());
  ScopedWriteDelay delay(500);
  OnGrid(g, model_dir, test_util::ModelParallelConfig(), [&](int rank, TrainerOptions o) {
    auto t = Trainer::Create(std::move(o));
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_TRUE((*t)->Save(save.string(), 0, "{}", SaveMode::kBackground).ok());
    if (rank == writer) {
      const fs::path tmp = save / (".tmp-" + IterationDirName(0));
      ASSERT_TRUE(WaitForPath(tmp));
      fs::remove_all(tmp);
    }
    auto next = (*t)->Save(save.string(), 1, "{}", SaveMode::kBackground);
    ASSERT_FALSE(next.ok()) << "rank " << rank << " returned " << *next;
    errors[rank] = Msg(next.status());
    EXPECT_TRUE((*t)->WaitForSave().ok());
  });
  EXPECT_NE(errors[writer].find((save / IterationDirName(0)).string()), std::string::npos)
      << errors[writer];
  EXPECT_NE(errors[g.rank(0, 0, 1)].find("pipeline stage 0 failed"), std::string::npos)
      << errors[g.rank(0, 0, 1)];
  for (int s = 0; s < 2; ++s) {
    const std::string& e = errors[g.rank(0, 1, s)];
    EXPECT_NE(e.find("tensor-parallel rank 0 failed"), std::string::npos) << e;
  }
  EXPECT_FALSE(fs::exists(save / kCheckpointTrackerFile));
  EXPECT_FALSE(fs::exists(save / IterationDirName(1)));
}

}  // namespace
}  // namespace slime::train
