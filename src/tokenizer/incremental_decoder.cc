// Streaming detokenization (see incremental_decoder.h).
#include "slime/tokenizer/incremental_decoder.h"

#include "slime/tokenizer/unicode.h"

namespace slime::tokenizer {

std::string IncrementalDecoder::Feed(std::span<const int32_t> ids) {
  for (int32_t id : ids) {
    ++num_ids_;
    // Unknown ids are skipped, as in Decode.
    if (!tokenizer_->IsKnown(id) || (skip_special_tokens_ && tokenizer_->IsSpecial(id))) continue;
    if (!first_token_) pending_.append(tokenizer_->token_separator());
    first_token_ = false;
    pending_.append(tokenizer_->TokenBytes(id));
  }
  const size_t n = EmittableUtf8Prefix(pending_);
  if (n == 0) return std::string();
  std::string out = Utf8Lossy(std::string_view(pending_).substr(0, n));
  pending_.erase(0, n);
  return out;
}

std::string IncrementalDecoder::Flush() {
  std::string out = Utf8Lossy(pending_);
  pending_.clear();
  first_token_ = true;
  num_ids_ = 0;
  return out;
}

}  // namespace slime::tokenizer
