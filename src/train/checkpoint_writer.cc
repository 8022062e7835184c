// Background saves (checkpoint.async_save): the host copies and the queued write of
// SaveTrainerCheckpointAsync (include/slime/train/checkpoint.h), and the writer thread that runs
// them (include/slime/train/checkpoint_writer.h).
#include "slime/train/checkpoint_writer.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <set>
#include <thread>
#include <utility>

#include "checkpoint_internal.h"
#include "slime/train/checkpoint.h"
#include "torch_guard.h"

namespace slime::train {
namespace {

// A host copy of `t` in `dtype`, pinned when `t` lives on a GPU (the copy is queued on the
// current stream: synchronize before reading it).
torch::Tensor HostCopy(const torch::Tensor& t, torch::ScalarType dtype) {
  auto options = torch::TensorOptions().dtype(dtype).device(torch::kCPU);
  if (t.is_cuda()) options = options.pinned_memory(true);
  torch::Tensor out = torch::empty(t.sizes(), options);
  out.copy_(t.detach(), /*non_blocking=*/t.is_cuda());
  return out;
}

// Replaces every tensor of `c` by a host copy of its own, so the caller may change the
// originals as soon as this returns.
Status TakeHostCopies(internal::CheckpointContent& c) {
  std::set<int64_t> devices;  // CUDA devices copied from
  auto copy = [&](const torch::Tensor& t, torch::ScalarType dtype) {
    if (t.is_cuda()) devices.insert(t.device().index());
    return HostCopy(t, dtype);
  };
  model::ModelWeights host;
  host.layers.resize(c.weights.layers.size());
  host.stage = c.weights.stage;
  for (const model::ParamSpec& spec : model::ParameterSpecs(c.config)) {
    const torch::Tensor& t = model::ParamSlot(std::as_const(c.weights), spec);
    model::ParamSlot(host, spec) = copy(t, t.scalar_type());
  }
  if (c.config.tie_word_embeddings) host.lm_head = host.embed_tokens;
  c.weights = std::move(host);
  if (c.optimizer) {
    for (model::NamedTensor& nt : c.optimizer->tensors) {
      nt.tensor = copy(nt.tensor, torch::kFloat32);
    }
  }
  for (model::NamedTensor& nt : c.extra_weights) nt.tensor = copy(nt.tensor, torch::kFloat32);
  for (int64_t d : devices) torch::cuda::synchronize(d);
  return absl::OkStatus();
}

// The test hook (checkpoint.h): sleeps $SLIME_TEST_ASYNC_SAVE_DELAY_MS before each file of a
// background write and before it publishes.
void TestDelay() {
  const char* env = std::getenv(kAsyncSaveTestDelayEnv);
  const int ms = env != nullptr ? std::atoi(env) : 0;
  if (ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

}  // namespace

StatusOr<std::string> SaveTrainerCheckpointAsync(const SaveCheckpointOptions& options,
                                                 const model::ModelWeights& weights,
                                                 const model::ModelConfig& config,
                                                 const AdamW* optimizer,
                                                 const TrainerProgress& progress,
                                                 AsyncCheckpointWriter& writer) {
  SLIME_ASSIGN_OR_RETURN(
      internal::CheckpointContent content,
      internal::CollectCheckpointContent(options, weights, config, optimizer, progress));
  SLIME_RETURN_IF_ERROR(internal::MakeSaveDir(options.save_dir));
  const std::string final_dir =
      (std::filesystem::path(options.save_dir) / IterationDirName(options.iteration)).string();
  SLIME_RETURN_IF_ERROR(internal::GuardTorch("checkpoint save: host copies for " + final_dir,
                                             [&]() { return TakeHostCopies(content); }));
  auto shared = std::make_shared<const internal::CheckpointContent>(std::move(content));
  writer.Enqueue(final_dir, [shared]() -> Status {
    return internal::WriteAndPublish(*shared, TestDelay).status();
  });
  return final_dir;
}

AsyncCheckpointWriter::~AsyncCheckpointWriter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!queue_.empty() || running_) {
      spdlog::info("checkpoint: finishing the background write of {} before stopping",
                   queue_.empty() ? std::string("the last checkpoint") : queue_.back().dir);
    }
    stop_ = true;
  }
  queued_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  if (!failure_.ok()) spdlog::error("{}", std::string(failure_.message()));
}

void AsyncCheckpointWriter::Enqueue(std::string dir, std::function<Status()> write) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(Job{std::move(dir), std::move(write)});
    if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
  }
  queued_.notify_all();
}

bool AsyncCheckpointWriter::busy() {
  std::lock_guard<std::mutex> lock(mu_);
  return running_ || !queue_.empty();
}

Status AsyncCheckpointWriter::Wait(double* write_seconds) {
  std::unique_lock<std::mutex> lock(mu_);
  idle_.wait(lock, [this] { return queue_.empty() && !running_; });
  Status out = std::exchange(failure_, absl::OkStatus());
  if (write_seconds != nullptr) *write_seconds = seconds_;
  seconds_ = 0;
  return out;
}

void AsyncCheckpointWriter::Run() {
  while (true) {
    Job job;
    bool skip = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      queued_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything queued was written
      job = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
      skip = !failure_.ok();
    }
    const auto start = std::chrono::steady_clock::now();
    Status s;
    if (skip) {
      s = absl::AbortedError("not written: an earlier background checkpoint write failed");
      spdlog::warn("checkpoint: {} {}", job.dir, std::string(s.message()));
    } else {
      s = job.write();
    }
    job.write = nullptr;  // frees the snapshot now, not at the next Wait
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!s.ok() && !skip) {
      spdlog::error("checkpoint: the background write of {} failed: {}", job.dir,
                    std::string(s.message()));
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      running_ = false;
      seconds_ += seconds;
      if (!s.ok() && failure_.ok()) {
        failure_ = absl::Status(
            s.code(), fmt::format("checkpoint.async_save: the background write of {} failed: {}",
                                  job.dir, std::string(s.message())));
      }
    }
    idle_.notify_all();
  }
}

}  // namespace slime::train
