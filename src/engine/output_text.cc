// Incremental output text with stop strings and stop trimming (see output_text.h).
#include "slime/engine/output_text.h"

#include <algorithm>

namespace slime::engine {

OutputText::OutputText(const tokenizer::Tokenizer* tok, const SamplingParams& params)
    : decoder_(tok, params.skip_special_tokens), prev_decoder_(tok, params.skip_special_tokens) {
  for (const std::string& s : params.stop) {
    if (s.empty()) continue;
    if (std::find(stops_.begin(), stops_.end(), s) == stops_.end()) stops_.push_back(s);
  }
}

std::optional<std::string> OutputText::Feed(int32_t token) {
  prev_decoder_ = decoder_;
  prev_text_size_ = text_.size();
  ++num_tokens_;
  const size_t old_size = text_.size();
  text_ += decoder_.Feed(token);
  if (matched_stop_ || stops_.empty() || text_.size() == old_size) return std::nullopt;

  // A new match must end in the new bytes, so it starts at or after old_size - (len - 1): only
  // that tail is searched.
  std::optional<size_t> best_pos;
  size_t best = 0;
  for (size_t k = 0; k < stops_.size(); ++k) {
    const std::string& s = stops_[k];
    const size_t from = old_size > s.size() - 1 ? old_size - (s.size() - 1) : 0;
    const size_t pos = text_.find(s, from);
    if (pos == std::string::npos) continue;
    if (!best_pos || pos < *best_pos || (pos == *best_pos && s.size() > stops_[best].size())) {
      best_pos = pos;
      best = k;
    }
  }
  if (!best_pos) return std::nullopt;
  matched_stop_ = stops_[best];
  matched_pos_ = *best_pos;
  return matched_stop_;
}

std::string OutputText::Text(const FinishReason& finish, bool no_stop_trim) const {
  if (finish.type == FinishType::kStop && finish.matched_string) {
    const std::string& s = *finish.matched_string;
    size_t pos = std::string::npos;
    if (matched_stop_ && *matched_stop_ == s) {
      pos = matched_pos_;
    } else {
      pos = text_.find(s);  // matched elsewhere (the engine's own check): first occurrence
    }
    if (pos != std::string::npos) return text_.substr(0, no_stop_trim ? pos + s.size() : pos);
  } else if (finish.type == FinishType::kStop && finish.matched_token && !no_stop_trim &&
             num_tokens_ > 0) {
    tokenizer::IncrementalDecoder before = prev_decoder_;
    return text_.substr(0, prev_text_size_) + before.Flush();
  }
  tokenizer::IncrementalDecoder rest = decoder_;
  return text_ + rest.Flush();
}

}  // namespace slime::engine
