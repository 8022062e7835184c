// SFT dataset: a JSONL file of chat conversations → token ids and a per-token loss mask, plus
// EpochSampler, the seeded shuffle-and-epochs iterator the trainer draws samples with.
//
// Input (one JSON object per line; blank lines are ignored):
//   {"messages": [{"role": "system"|"user"|"assistant"|"tool", "content": "...",
//                  "loss": true|false|0|1 (optional), ...}, ...],
//    "tools": [...] (optional)}
// The messages key and the tools key are options. `content` is a string or null (it may be
// absent only on a message with `tool_calls`); other message keys (tool_calls,
// reasoning_content) go to the chat template unchanged. `loss` overrides which messages are
// trained (default: assistant messages yes, all others no); slime's `step_loss_mask` (0/1) is
// read the same way. `tools` (an array, or a JSON string holding one, as slime accepts) replaces
// SftDatasetOptions::template_options.tools for that line.
//
// Mask convention (what is trained). Each sample covers one rendered conversation (see "Turn
// splitting" below); `loss_mask[t]` is 1 when token t is a target of the SFT loss. The trainer
// predicts token t from the tokens before it, so loss_mask[0] is always 0. For a trained
// assistant message at index i:
//   * 0 for its header: the text the template's generation prompt adds after messages[0..i-1]
//     (Qwen: "<|im_start|>assistant\n"; Qwen3 with enable_thinking=false also the empty
//     "<think>\n\n</think>\n\n" block, which the engine puts in the prompt; Llama-3:
//     "<|start_header_id|>assistant<|end_header_id|>\n\n");
//   * 1 for everything after it up to and including the message's last special token, its
//     end-of-turn token (Qwen: "<|im_end|>", Llama-3: "<|eot_id|>" or "<|eom_id|>"). Any Qwen3
//     "<think>…</think>\n\n" block the template renders into the turn is trained;
//   * 0 for template text after the end-of-turn token (Qwen's "\n"): the engine stops at the
//     end-of-turn token and never samples it.
// A trained non-assistant message (loss: true) is masked the same way, its header being the
// rendered text before its content (found by rendering the message once more with its content
// replaced by a probe character). Untrained messages are 0 throughout.
// Example, Qwen3, [user "Hi", assistant "Yo"]:
//   <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n   → 0
//   <think>\n\n</think>\n\nYo<|im_end|>                         → 1
//   \n                                                           → 0
// Prompt/response view (slime's Sample): PromptLength() = index of the first 1; the response is
// tokens[PromptLength():] and its loss mask loss_mask[PromptLength():] (slime's
// response_length and loss_mask), untrained turns between trained ones included as 0s.
//
// How the mask is computed. For each i the conversation messages[0..i] is rendered (and, for
// trained assistants, messages[0..i-1] with the generation prompt). When every rendering is a
// prefix of the next, the text splits into pieces at message and header boundaries; each piece
// is tokenized separately and the concatenation is checked against the tokenization of the whole
// text. If they differ (a BPE merge across a boundary, e.g. content that starts with "\n" after
// a header ending in "\n"), SftDriftPolicy decides: keep the piecewise ids (what an engine
// rollout of the same turns produces: prompt ids, then generated ids) or reject the line.
//
// Turn splitting. Some templates re-render earlier messages when one is appended, so the
// renderings are not prefixes of each other: Qwen3 drops <think> blocks of turns before the last
// user query and adds the empty think block only to a final assistant turn; consecutive Qwen
// tool messages are merged into one user turn. Then, with SftUnstablePolicy::kSplitTurns (the
// default), the line yields one sample per trained message i: messages[0..i] rendered as the
// conversation at the time of that turn (history re-rendered exactly as the model sees it at
// inference), with only message i trained. Samples carry the index of that message in `turn`.
//
// Errors a user can cause name the file, the 1-based line and the field ("data.jsonl:7:
// messages[2].role: unknown role \"bot\" (expected system, user, assistant or tool)").
// SftBadLinePolicy::kFail returns the first such error; kSkip logs each (the first few) and
// counts them in SftDatasetStats.
//
// Thread-safety: the functions are pure (the Tokenizer is only read); an EpochSampler is a
// value owned by one thread.
#ifndef SLIME_DATA_SFT_DATASET_H_
#define SLIME_DATA_SFT_DATASET_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "slime/common/status.h"
#include "slime/tokenizer/chat_template.h"
#include "slime/tokenizer/tokenizer.h"

namespace slime::data {

// A line that is not a valid conversation (malformed JSON, missing or mistyped fields, unknown
// role, a template error).
enum class SftBadLinePolicy {
  kFail,  // return the error (file:line: field: what is wrong)
  kSkip,  // log a warning, count it, go on
};

// A sample longer than SftDatasetOptions::max_length.
enum class SftOverlongPolicy {
  kTruncate,  // keep the first max_length tokens (skipped if no trained token is left)
  kDrop,      // drop the sample
};

// Renderings of messages[0..i] that are not prefixes of each other (see "Turn splitting").
enum class SftUnstablePolicy {
  kSplitTurns,  // one sample per trained message
  kFail,        // a bad line (error names the message whose rendering changed)
};

// Piecewise tokenization that differs from the tokenization of the whole text.
enum class SftDriftPolicy {
  kKeepPieces,  // keep the piecewise ids, count the line in SftDatasetStats::drifted
  kFail,        // a bad line (error names the first differing token)
};

struct SftDatasetOptions {
  // Key of the message list in each line.
  std::string messages_key = "messages";
  // Key of an optional per-line tool list; "" to ignore tools in lines.
  std::string tools_key = "tools";
  // Passed to the chat template: tools (used when a line has none) and kwargs such as
  // {"enable_thinking": false}. add_generation_prompt is ignored (set per rendering).
  tokenizer::ChatTemplateOptions template_options;
  // Longest sample in tokens; 0 for no limit.
  int64_t max_length = 0;
  SftOverlongPolicy overlong = SftOverlongPolicy::kTruncate;
  SftBadLinePolicy bad_line = SftBadLinePolicy::kFail;
  SftUnstablePolicy unstable = SftUnstablePolicy::kSplitTurns;
  SftDriftPolicy drift = SftDriftPolicy::kKeepPieces;
  // Bad lines logged one by one with kSkip; the rest only counted.
  int max_logged_bad_lines = 10;

  // Errors: empty messages_key, negative max_length, kwargs not an object, tools neither null
  // nor an array.
  Status Validate() const;
};

struct SftSample {
  std::vector<int32_t> tokens;     // [T] token ids of the rendered conversation
  std::vector<uint8_t> loss_mask;  // [T] 1 = token is a loss target; loss_mask[0] == 0
  int64_t line = 0;                // 1-based line of the file (0 when not read from a file)
  int32_t turn = -1;               // split samples: index of the trained message; else -1
  bool truncated = false;          // cut to max_length

  // Index of the first trained token (tokens.size() when there is none).
  int64_t PromptLength() const;
  // tokens.size() - PromptLength(): slime's response_length.
  int64_t ResponseLength() const;
  int64_t NumTrainedTokens() const;
};

// One conversation rendered and tokenized, before truncation.
struct SftConversation {
  std::vector<SftSample> samples;  // 1, or one per trained message when split
  bool split = false;              // renderings were not prefixes (SftUnstablePolicy)
  bool drifted = false;            // piecewise ids kept although they differ from the whole
};

struct SftDatasetStats {
  int64_t lines = 0;             // non-blank lines read
  int64_t samples = 0;           // samples returned
  int64_t bad_lines = 0;         // lines skipped as bad (SftBadLinePolicy::kSkip)
  int64_t no_trained_token = 0;  // samples skipped with no trained token (after truncation)
  int64_t overlong_dropped = 0;  // samples dropped by SftOverlongPolicy::kDrop
  int64_t truncated = 0;         // samples truncated to max_length and kept
  int64_t split_lines = 0;       // lines split into turns
  int64_t drifted = 0;           // lines whose piecewise ids were kept (SftDriftPolicy)
};

struct SftDataset {
  std::vector<SftSample> samples;  // in file order (split samples in message order)
  SftDatasetStats stats;
};

// Reads the JSONL file at `path`. Errors: the file cannot be read; a bad line with
// SftBadLinePolicy::kFail; the tokenizer has no usable chat template; no sample survives (the
// message gives the counts); invalid options. Logs one summary warning when anything was
// skipped, dropped, truncated, split or drifted.
StatusOr<SftDataset> LoadSftDataset(const std::string& path, const tokenizer::Tokenizer& tok,
                                    const SftDatasetOptions& options);

// As LoadSftDataset on JSONL text; `source` names it in errors (in place of the file path).
StatusOr<SftDataset> ParseSftJsonl(std::string_view text, std::string_view source,
                                   const tokenizer::Tokenizer& tok,
                                   const SftDatasetOptions& options);

// One conversation (`messages` as in a line; `tools` null or an array). No truncation, no
// skipping: a conversation without a trained message gives one sample with an all-zero mask.
// Errors name the field ("messages[1].content: expected a string or null") without file:line.
StatusOr<SftConversation> TokenizeConversation(const nlohmann::ordered_json& messages,
                                               const nlohmann::ordered_json& tools,
                                               const tokenizer::Tokenizer& tok,
                                               const SftDatasetOptions& options);

// ---- EpochSampler -------------------------------------------------------------------------

// Position of an EpochSampler: the next index is order(epoch)[offset]. Two integers, saved in a
// checkpoint to resume exactly. Invariant: 0 <= offset < num_samples, epoch >= 0.
struct EpochSamplerState {
  int64_t epoch = 0;
  int64_t offset = 0;
};

// Iterates over sample indices [0, num_samples) epoch after epoch; with shuffling each epoch is
// a permutation drawn from seed + epoch (as slime reseeds per epoch), so the sequence depends
// only on (num_samples, seed, shuffle) and is identical on every platform: std::mt19937_64
// (whose output the standard fixes) with our own Fisher–Yates and unbiased bounded draws
// (std::shuffle and std::uniform_int_distribution differ between standard libraries).
// Resuming requires the same num_samples, seed and shuffle; the state does not record them.
class EpochSampler {
 public:
  // Errors: num_samples < 1.
  static StatusOr<EpochSampler> Create(int64_t num_samples, uint64_t seed, bool shuffle = true);

  // The next sample index; moves to the next epoch after the last index of one.
  int64_t Next();
  // The next `count` indices (count >= 0), crossing epochs as needed.
  std::vector<int64_t> Next(int64_t count);

  EpochSamplerState state() const { return {epoch_, offset_}; }
  // Errors: epoch < 0, or offset outside [0, num_samples) (the message names both ranges).
  Status Restore(const EpochSamplerState& state);

  // The order of `epoch` (a permutation of [0, num_samples), or the identity without shuffle).
  static std::vector<int64_t> EpochOrder(int64_t num_samples, uint64_t seed, int64_t epoch,
                                         bool shuffle = true);

  int64_t num_samples() const { return num_samples_; }
  int64_t epoch() const { return epoch_; }

 private:
  EpochSampler(int64_t num_samples, uint64_t seed, bool shuffle)
      : num_samples_(num_samples), seed_(seed), shuffle_(shuffle) {}
  void BuildOrder();

  int64_t num_samples_;
  uint64_t seed_;
  bool shuffle_;
  int64_t epoch_ = 0;
  int64_t offset_ = 0;
  std::vector<int64_t> order_;  // [num_samples] order of epoch_ (empty until first needed)
  int64_t order_epoch_ = -1;    // the epoch order_ was built for
};

}  // namespace slime::data

#endif  // SLIME_DATA_SFT_DATASET_H_
