// Tokenizer: a Hugging Face `tokenizer.json` (byte-level BPE: Qwen2/2.5/3, Llama-3.x, GPT-2
// style) plus the parts of `tokenizer_config.json` that matter at run time (bos/eos/pad/unk
// tokens, clean_up_tokenization_spaces, chat_template).
//
// Encode = added-token split (special tokens in the text are always matched) → normalizer →
// pre-tokenizer (PCRE2 regex splits, ByteLevel) → BPE → post-processor (only with
// add_special_tokens). Decode = per-token bytes (ByteLevel decoder; added tokens by content) →
// lossy UTF-8 → optional transformers-style clean-up of spaces. The goal is ids identical to
// Hugging Face `tokenizers` for every input; see tests/tokenizer/ for the comparison.
//
// Supported post_processor types: null, ByteLevel, TemplateProcessing (single sequence),
// RobertaProcessing/BertProcessing, Sequence. Supported decoders: null (tokens joined by " "),
// ByteLevel. Other pipeline parts: see pre_tokenizer.h and bpe_model.h. Anything unsupported
// fails at load time with an error naming the file and the JSON path.
//
// Input text that is not valid UTF-8 is repaired first (each invalid sequence becomes U+FFFD).
//
// Ownership: owns all tables. Thread-safety: immutable after loading; every const method may
// be called concurrently (the BPE word cache is internally synchronized).
#ifndef SLIME_TOKENIZER_TOKENIZER_H_
#define SLIME_TOKENIZER_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "slime/common/status.h"
#include "slime/tokenizer/added_vocabulary.h"
#include "slime/tokenizer/bpe_model.h"
#include "slime/tokenizer/chat_template.h"
#include "slime/tokenizer/pre_tokenizer.h"

namespace slime::tokenizer {

class Tokenizer {
 public:
  // Loads `dir`/tokenizer.json and, when present, `dir`/tokenizer_config.json (and
  // `dir`/chat_template.jinja when the config has no chat_template).
  static StatusOr<std::unique_ptr<Tokenizer>> FromDirectory(const std::string& dir);
  // `tokenizer_config_json` may be empty (no config).
  static StatusOr<std::unique_ptr<Tokenizer>> FromFiles(const std::string& tokenizer_json,
                                                        const std::string& tokenizer_config_json);
  // From JSON text in memory; `source` names it in errors. `config_text` may be empty.
  static StatusOr<std::unique_ptr<Tokenizer>> FromJsonText(std::string_view tokenizer_text,
                                                           std::string_view config_text,
                                                           std::string_view source);

  // Token ids of `text`. Special and added tokens written in the text are encoded as those
  // tokens. With add_special_tokens, the post-processor adds e.g. BOS.
  std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens = false) const;

  // Text of `ids`; unknown ids are skipped. Like transformers >= 5 (and so SGLang), the
  // 2-argument form never applies clean_up_tokenization_spaces to these BPE tokenizers, whatever
  // the config says (clean_up_tokenization_spaces() reports the config's value); the 3-argument
  // form chooses explicitly.
  std::string Decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;
  std::string Decode(std::span<const int32_t> ids, bool skip_special_tokens,
                     bool clean_up_tokenization_spaces) const;

  // The raw bytes one token contributes to decoded text (may be part of a UTF-8 character);
  // empty for unknown ids. Precomputed at load; valid as long as the Tokenizer.
  std::string_view TokenBytes(int32_t id) const {
    return IsKnown(id) ? std::string_view(token_bytes_[id]) : std::string_view();
  }
  // True for ids of the vocabulary or the added tokens.
  bool IsKnown(int32_t id) const {
    return id >= 0 && id < id_limit_ && (id_flags_[id] & kIdPresent) != 0;
  }
  // Separator the decoder puts between tokens: "" for ByteLevel, " " without a decoder.
  std::string_view token_separator() const { return byte_level_decoder_ ? "" : " "; }

  std::optional<int32_t> TokenToId(std::string_view token) const;
  std::optional<std::string> IdToToken(int32_t id) const;
  bool IsSpecial(int32_t id) const {
    return id >= 0 && id < id_limit_ && (id_flags_[id] & kIdSpecial) != 0;
  }

  // Number of distinct ids, added tokens included (HF get_vocab_size(with_added_tokens=True)).
  size_t vocab_size() const { return vocab_size_; }
  // Largest id + 1 (what an embedding table must at least cover).
  int32_t id_limit() const { return id_limit_; }

  // Special tokens named by tokenizer_config.json; nullopt when absent or null.
  std::optional<int32_t> bos_id() const { return bos_id_; }
  std::optional<int32_t> eos_id() const { return eos_id_; }
  std::optional<int32_t> pad_id() const { return pad_id_; }
  std::optional<int32_t> unk_id() const { return unk_id_; }
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }
  bool clean_up_tokenization_spaces() const { return clean_up_tokenization_spaces_; }

  // Renders a conversation with the template of tokenizer_config.json. Errors: no template, a
  // template of an unsupported family (naming the supported ones), or bad messages.
  StatusOr<std::string> ApplyChatTemplate(const nlohmann::ordered_json& messages,
                                          const ChatTemplateOptions& options) const;
  // The recognised chat template, or the reason there is none.
  const StatusOr<ChatTemplate>& chat_template() const { return chat_template_; }

  const AddedVocabulary& added_vocabulary() const { return added_; }
  const BpeModel& model() const { return *model_; }
  const std::string& source() const { return source_; }

 private:
  struct PostItem {
    bool is_sequence = false;
    std::vector<int32_t> ids;  // special token ids when !is_sequence
  };
  static constexpr uint8_t kIdPresent = 1, kIdSpecial = 2;
  Tokenizer() : chat_template_(absl::NotFoundError("no chat_template")) {}
  void BuildDecodeTables();
  Status LoadTokenizerJson(const nlohmann::json& j);
  Status LoadPostProcessor(const nlohmann::json& j, const std::string& path);
  Status LoadDecoder(const nlohmann::json& j);
  Status LoadConfig(const nlohmann::json& config, std::string_view extra_template);
  StatusOr<std::optional<int32_t>> ConfigTokenId(const nlohmann::json& config, const char* key,
                                                 std::string* token) const;
  // Encodes text that contains no raw-matched added token.
  void EncodeText(std::string_view text, std::vector<int32_t>* ids) const;
  void EncodeWords(std::string_view normalized, std::vector<int32_t>* ids) const;

  std::string source_;         // tokenizer.json path (or the in-memory source name)
  std::string config_source_;  // tokenizer_config.json path, "" when none
  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<BpeModel> model_;
  AddedVocabulary added_;
  std::vector<PostItem> post_template_;  // empty: add_special_tokens adds nothing
  bool byte_level_decoder_ = false;
  std::vector<std::string> token_bytes_;  // [id_limit_] decoded bytes of each id
  std::vector<uint8_t> id_flags_;         // [id_limit_] kIdPresent | kIdSpecial
  size_t vocab_size_ = 0;
  int32_t id_limit_ = 0;

  std::optional<int32_t> bos_id_, eos_id_, pad_id_, unk_id_;
  std::string bos_token_, eos_token_;
  bool clean_up_tokenization_spaces_ = false;
  StatusOr<ChatTemplate> chat_template_;
};

}  // namespace slime::tokenizer

#endif  // SLIME_TOKENIZER_TOKENIZER_H_
