// CheckInputFiles (driver.h): the files a job reads exist, checked before anything starts. The
// driver's setup runs it first and `slime_train --dry-run` runs the same function, so both
// report a missing file with the same message.
#include <filesystem>
#include <string>
#include <vector>

#include "fmt/format.h"
#include "slime/data/prompt_dataset.h"
#include "slime/job/driver.h"

namespace slime::job {
namespace {

namespace fs = std::filesystem;

class InputFiles {
 public:
  // A directory at `path`; `what` says what it should hold.
  void Directory(const std::string& key, const std::string& path, const std::string& what) {
    std::error_code ec;
    if (!fs::exists(path, ec)) {
      Missing(key, path, what);
    } else if (!fs::is_directory(path, ec)) {
      errors_.push_back(fmt::format("{}: {} is not a directory (expected {})", key, path, what));
    }
  }

  // A regular file (or a link to one) at `path`.
  void File(const std::string& key, const std::string& path, const std::string& what) {
    std::error_code ec;
    if (!fs::exists(path, ec)) {
      Missing(key, path, what);
    } else if (fs::is_directory(path, ec)) {
      errors_.push_back(fmt::format("{}: {} is a directory (expected {})", key, path, what));
    }
  }

  // A file or a directory (checkpoints may be either kind of directory; plugins are files).
  void Exists(const std::string& key, const std::string& path, const std::string& what) {
    std::error_code ec;
    if (!fs::exists(path, ec)) Missing(key, path, what);
  }

  // A prompt dataset: `path` or `path@[start:end]`.
  void Dataset(const std::string& key, const std::string& path_spec) {
    StatusOr<data::PathSlice> slice = data::ParsePathSlice(path_spec);
    if (!slice.ok()) {
      errors_.push_back(fmt::format("{}: {}", key, std::string(slice.status().message())));
      return;
    }
    File(key, slice->path, "a .jsonl prompt dataset");
  }

  Status Result() const {
    if (errors_.empty()) return absl::OkStatus();
    if (errors_.size() == 1) return absl::NotFoundError(errors_[0]);
    std::string message = fmt::format("{} input files are missing:", errors_.size());
    for (const std::string& error : errors_) message += "\n  - " + error;
    return absl::NotFoundError(message);
  }

 private:
  void Missing(const std::string& key, const std::string& path, const std::string& what) {
    errors_.push_back(fmt::format("{}: {} does not exist (expected {})", key, path, what));
  }

  std::vector<std::string> errors_;
};

}  // namespace

Status CheckInputFiles(const config::Config& config) {
  InputFiles files;
  // The model directory holds the architecture and the tokenizer (Tokenizer::FromDirectory).
  const std::string& model = config.model.hf_checkpoint;
  const std::string model_what =
      "a Hugging Face model directory with config.json and tokenizer.json";
  files.Directory("model.hf_checkpoint", model, model_what);
  std::error_code ec;
  if (fs::is_directory(model, ec)) {
    files.File("model.hf_checkpoint", (fs::path(model) / "config.json").string(),
               "the model's config.json");
    files.File("model.hf_checkpoint", (fs::path(model) / "tokenizer.json").string(),
               "the tokenizer, read from the model directory");
  }
  // Replayed rollouts replace the prompts and the reward (the driver loads neither).
  const bool train_only = config.debug.load_debug_rollout_data.has_value();
  if (!train_only && !config.data.prompt_data.empty()) {
    files.Dataset("data.prompt_data", config.data.prompt_data);
  }
  for (size_t i = 0; i < config.eval.datasets.size(); ++i) {
    const config::EvalDatasetConfig& entry = config.eval.datasets[i];
    files.Dataset(fmt::format("eval.datasets[{}].path (dataset '{}')", i, entry.name), entry.path);
  }
  if (!train_only && config.reward.custom_rm_path) {
    files.File("reward.custom_rm_path", *config.reward.custom_rm_path, "a reward plugin (.so)");
  }
  bool plugin = config.rollout.custom_generate == "plugin";
  for (const config::EvalDatasetConfig& entry : config.eval.datasets) {
    plugin |= entry.custom_generate == "plugin";
  }
  if (plugin && config.rollout.custom_generate_path) {
    files.File("rollout.custom_generate_path", *config.rollout.custom_generate_path,
               "a generate plugin (.so)");
  }
  const config::CheckpointConfig& k = config.checkpoint;
  if (k.ref_load) files.Exists("checkpoint.ref_load", *k.ref_load, "a checkpoint or HF directory");
  if (k.critic_load && config::UseCritic(config)) {
    files.Exists("checkpoint.critic_load", *k.critic_load, "a critic checkpoint or HF directory");
  }
  if (config.algorithm.opd_teacher_load) {
    files.Exists("algorithm.opd_teacher_load", *config.algorithm.opd_teacher_load,
                 "the teacher's checkpoint or HF directory");
  }
  return files.Result();
}

}  // namespace slime::job
