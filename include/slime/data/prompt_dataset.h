// Prompt data for RL: a JSONL file of prompts → PromptDataset (tokenized, filtered rows), and
// PromptDataSource, which hands out groups of Samples epoch after epoch and saves its position
// with each checkpoint so a resumed run continues at the same prompt (slime's
// RolloutDataSource; docs/data.md).
//
// Input (one JSON object per line; blank lines are ignored), keys set by PromptDatasetOptions:
//   {"input": "What is 2+3?" | [{"role": "user", "content": "..."}, ...],
//    "label": "5",                           (label_key; a non-string value is kept as JSON text)
//    "metadata": {"rm_type": "math", ...},   (metadata_key; an object, or a string holding one)
//    "tools": [...]}                         (tool_key; an array, or a string holding one)
// With apply_chat_template a string prompt becomes one user message and the messages are
// rendered with the tokenizer's chat template and add_generation_prompt = true (HF
// apply_chat_template(tokenize=False) semantics, chat_template.h); tools are passed to the
// template and also stored as metadata["tools"]. Without it a string prompt is used verbatim and
// a message list is a bad line (the error says to enable data.apply_chat_template).
// The path may carry slime's row slice, `file.jsonl@[start:end]` (Python slice semantics over
// the non-blank lines, negative bounds allowed, either bound may be omitted).
//
// Filtering: prompts longer than max_prompt_len tokens (the rendered text tokenized without
// special tokens, as slime does) are dropped; the count is logged and kept in stats. A line
// that cannot be used reports "file:line: field: what is wrong" and is skipped (logged,
// counted) or fatal, per PromptDatasetOptions::bad_line (config `data.on_bad_line`).
//
// Order and resume. PromptDataSource draws prompts through an EpochSampler (sft_dataset.h):
// epoch e visits every prompt once, in a permutation drawn from seed + e when shuffling, else
// in file order. GetSamples(k) takes the next k prompts (crossing epochs) and returns k groups
// of n_samples_per_prompt copies, with group_index and index increasing over the whole run.
// Its State (epoch, offset, next group index, next sample index) is written beside a
// checkpoint as JSON (atomically) and restored on resume; the next groups are then identical to
// those of an uninterrupted run. The state also records the prompt count, seed and shuffle flag
// and refuses to restore onto a dataset or order that differs. As in slime, groups handed out
// but not yet trained on (partial rollouts) are not part of the state.
//
// Thread-safety: PromptDataset is immutable after loading (share it freely); a
// PromptDataSource is owned by one thread (the rollout coordinator's loop).
#ifndef SLIME_DATA_PROMPT_DATASET_H_
#define SLIME_DATA_PROMPT_DATASET_H_

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "slime/common/status.h"
#include "slime/data/sample.h"
#include "slime/data/sft_dataset.h"
#include "slime/tokenizer/tokenizer.h"

namespace slime::config {
struct Config;
}

namespace slime::data {

struct PromptDatasetOptions {
  std::string input_key = "input";
  std::string label_key;                 // "" = no label (Sample::label stays "")
  std::string metadata_key = "metadata";  // "" = no metadata
  std::string tool_key = "tools";         // "" = no per-row tools
  bool apply_chat_template = false;
  // Extra template variables (an object), e.g. {"enable_thinking": false}.
  nlohmann::ordered_json chat_template_kwargs = nlohmann::ordered_json::object();
  int64_t max_prompt_len = 0;  // longest prompt in tokens; 0 = no limit
  SftBadLinePolicy bad_line = SftBadLinePolicy::kSkip;
  int max_logged_bad_lines = 10;  // bad lines logged one by one; the rest only counted

  // Errors: empty input_key, negative max_prompt_len, kwargs not an object.
  Status Validate() const;
};

// One usable row of the file.
struct Prompt {
  nlohmann::ordered_json prompt;  // the row's input value (string or messages)
  std::string text;               // the prompt text sent to the engine
  std::vector<int32_t> tokens;    // text tokenized without special tokens
  std::string label;
  nlohmann::ordered_json metadata = nlohmann::ordered_json::object();
  int64_t line = 0;  // 1-based line in the file
};

struct PromptDatasetStats {
  int64_t lines = 0;      // non-blank lines read (inside the row slice)
  int64_t prompts = 0;    // prompts kept
  int64_t bad_lines = 0;  // skipped as bad
  int64_t too_long = 0;   // dropped by max_prompt_len
};

class PromptDataset {
 public:
  // Reads `path_spec` (a path, optionally with `@[start:end]`). Errors: the file cannot be read;
  // a malformed slice; a bad line with SftBadLinePolicy::kFail; apply_chat_template with a
  // tokenizer that has no usable chat template; no prompt left (the message gives the counts);
  // invalid options.
  static StatusOr<PromptDataset> Load(const std::string& path_spec,
                                      const tokenizer::Tokenizer& tok,
                                      const PromptDatasetOptions& options);
  // As Load on JSONL text (no slice); `source` names it in errors.
  static StatusOr<PromptDataset> Parse(std::string_view text, std::string_view source,
                                       const tokenizer::Tokenizer& tok,
                                       const PromptDatasetOptions& options);

  int64_t size() const { return static_cast<int64_t>(prompts_.size()); }
  const Prompt& prompt(int64_t i) const { return prompts_[static_cast<size_t>(i)]; }
  const std::vector<Prompt>& prompts() const { return prompts_; }
  const PromptDatasetStats& stats() const { return stats_; }
  const std::string& source() const { return source_; }

 private:
  friend class PromptDatasetBuilder;
  std::vector<Prompt> prompts_;
  PromptDatasetStats stats_;
  std::string source_;
};

// Splits slime's `path@[start:end]`. Returns the path and the slice bounds (nullopt = omitted).
// Errors: a suffix that starts with "@[" but is not `[int?:int?]`.
struct PathSlice {
  std::string path;
  std::optional<int64_t> start;
  std::optional<int64_t> end;
};
StatusOr<PathSlice> ParsePathSlice(const std::string& path_spec);

// n copies of `prompt` as pending samples: group_index, index = first_index + j, prompt,
// prompt_text, tokens (the prompt ids), label and metadata set.
SampleGroup MakeGroup(const Prompt& prompt, int n, int64_t group_index, int64_t first_index);

// ---- PromptDataSource ------------------------------------------------------------------------

struct PromptDataSourceOptions {
  int n_samples_per_prompt = 1;
  uint64_t seed = 42;
  bool shuffle = false;

  // Errors: n_samples_per_prompt < 1.
  Status Validate() const;
};

// Where a PromptDataSource is: the next prompt is order(epoch)[offset]; the next group and
// sample get next_group_index and next_sample_index. num_prompts, seed and shuffle identify the
// order the position refers to.
struct DataSourceState {
  int64_t epoch = 0;
  int64_t offset = 0;
  int64_t next_group_index = 0;
  int64_t next_sample_index = 0;
  int64_t num_prompts = 0;
  uint64_t seed = 0;
  bool shuffle = false;

  // {"format": "slime-cpp data source state", "version": 1, "epoch_id", "sample_offset",
  //  "sample_group_index", "sample_index", "num_prompts", "seed", "shuffle"}
  // (slime's key names where it has them).
  nlohmann::ordered_json ToJson() const;
  // Errors name the missing or mistyped key; `source` prefixes them.
  static StatusOr<DataSourceState> FromJson(const nlohmann::json& j, std::string_view source);
  bool operator==(const DataSourceState&) const = default;
};

// {save_dir}/rollout/data_source_state_{rollout_id}.json (beside slime's
// global_dataset_state_dict_{rollout_id}.pt).
std::string DataSourceStatePath(const std::string& save_dir, int64_t rollout_id);

class PromptDataSource {
 public:
  // Errors: an empty dataset, invalid options.
  static StatusOr<PromptDataSource> Create(std::shared_ptr<const PromptDataset> dataset,
                                           const PromptDataSourceOptions& options);

  // The next `num_groups` prompts (num_groups >= 0), crossing epochs as needed, each as a group
  // of n_samples_per_prompt pending samples.
  std::vector<SampleGroup> GetSamples(int64_t num_groups);

  DataSourceState state() const;
  // Errors: the state's num_prompts, seed or shuffle differ from this source (the message names
  // both values), or its position is out of range. On error the source is unchanged.
  Status Restore(const DataSourceState& state);

  // Writes state() to `path` atomically (temporary file, fsync, rename), creating the parent
  // directory. Errors: the file cannot be written.
  Status Save(const std::string& path) const;
  // Reads a file written by Save and restores it. Errors: missing file (NotFound), malformed
  // JSON, or Restore's errors; each names the file.
  Status Load(const std::string& path);

  int64_t epoch() const { return sampler_.epoch(); }
  int64_t num_prompts() const { return dataset_->size(); }
  const PromptDataset& dataset() const { return *dataset_; }
  const PromptDataSourceOptions& options() const { return options_; }

 private:
  PromptDataSource(std::shared_ptr<const PromptDataset> dataset,
                   const PromptDataSourceOptions& options, EpochSampler sampler)
      : dataset_(std::move(dataset)), options_(options), sampler_(std::move(sampler)) {}

  std::shared_ptr<const PromptDataset> dataset_;
  PromptDataSourceOptions options_;
  EpochSampler sampler_;
  int64_t next_group_index_ = 0;
  int64_t next_sample_index_ = 0;
};

// ---- From the job config ---------------------------------------------------------------------

// data.{input,label,metadata,tool}_key, data.apply_chat_template(_kwargs), data.on_bad_line and
// rollout.max_prompt_len of a resolved config. The kwargs map's values are YAML scalars kept as
// strings by the config; each is read as JSON when it parses ("false" → false, "3" → 3) and kept
// as a string otherwise.
PromptDatasetOptions PromptDatasetOptionsFromConfig(const config::Config& config);
// data.n_samples_per_prompt, rollout.seed, rollout.shuffle.
PromptDataSourceOptions PromptDataSourceOptionsFromConfig(const config::Config& config);

}  // namespace slime::data

#endif  // SLIME_DATA_PROMPT_DATASET_H_
