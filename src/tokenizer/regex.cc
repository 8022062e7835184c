// PCRE2 wrapper with per-thread match state (see regex.h).
#include "slime/tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <fmt/format.h>

#include "slime/tokenizer/unicode.h"

namespace slime::tokenizer {
namespace {

// Per-thread PCRE2 scratch: match data (one ovector pair suffices: we only need the whole
// match), a match context and a JIT stack large enough for long whitespace runs.
class ThreadMatchState {
 public:
  ThreadMatchState() {
    match_data_ = pcre2_match_data_create(1, nullptr);
    context_ = pcre2_match_context_create(nullptr);
    jit_stack_ = pcre2_jit_stack_create(64 * 1024, 16 * 1024 * 1024, nullptr);
    if (context_ != nullptr && jit_stack_ != nullptr) {
      pcre2_jit_stack_assign(context_, nullptr, jit_stack_);
    }
  }
  ~ThreadMatchState() {
    pcre2_match_data_free(match_data_);
    pcre2_match_context_free(context_);
    pcre2_jit_stack_free(jit_stack_);
  }
  ThreadMatchState(const ThreadMatchState&) = delete;
  ThreadMatchState& operator=(const ThreadMatchState&) = delete;

  pcre2_match_data* match_data() const { return match_data_; }
  pcre2_match_context* context() const { return context_; }

 private:
  pcre2_match_data* match_data_ = nullptr;
  pcre2_match_context* context_ = nullptr;
  pcre2_jit_stack* jit_stack_ = nullptr;
};

ThreadMatchState& State() {
  thread_local ThreadMatchState state;
  return state;
}

std::string PcreErrorMessage(int code) {
  PCRE2_UCHAR buffer[256];
  const int n = pcre2_get_error_message(code, buffer, sizeof(buffer));
  return n < 0 ? fmt::format("PCRE2 error {}", code)
               : std::string(reinterpret_cast<const char*>(buffer), static_cast<size_t>(n));
}

}  // namespace

std::string TranslateWhitespaceClasses(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 32);
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '\\' || i + 1 == pattern.size()) {
      out.push_back(pattern[i]);
      continue;
    }
    const char next = pattern[++i];
    if (next == 's') {
      out += "\\p{White_Space}";
    } else if (next == 'S') {
      out += "\\P{White_Space}";
    } else {
      out.push_back('\\');
      out.push_back(next);
    }
  }
  return out;
}

StatusOr<std::unique_ptr<Regex>> Regex::Compile(std::string_view pattern, bool literal) {
  if (!IsValidUtf8(pattern)) {
    return absl::InvalidArgumentError("regex pattern is not valid UTF-8");
  }
  std::unique_ptr<Regex> re(new Regex());
  re->pattern_ = std::string(pattern);
  const std::string translated = literal ? re->pattern_ : TranslateWhitespaceClasses(pattern);
  // PCRE2_LITERAL does not combine with PCRE2_UCP (which only matters for classes anyway).
  const uint32_t options = literal ? (PCRE2_UTF | PCRE2_LITERAL) : (PCRE2_UTF | PCRE2_UCP);
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(), options,
                    &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    return absl::InvalidArgumentError(fmt::format("cannot compile regex /{}/ at offset {}: {}",
                                                  pattern, error_offset,
                                                  PcreErrorMessage(error_code)));
  }
  re->code_ = code;
  re->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return re;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

int Regex::MatchAt(std::string_view text, size_t offset, size_t* start, size_t* end) const {
  ThreadMatchState& state = State();
  auto* code = static_cast<pcre2_code*>(code_);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  int rc;
  if (jit_) {
    rc = pcre2_jit_match(code, subject, text.size(), offset, 0, state.match_data(),
                         state.context());
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      // Fall back to the interpreter, which keeps its backtracking state on the heap.
      rc = pcre2_match(code, subject, text.size(), offset, PCRE2_NO_UTF_CHECK,
                       state.match_data(), nullptr);
    }
  } else {
    rc = pcre2_match(code, subject, text.size(), offset, PCRE2_NO_UTF_CHECK, state.match_data(),
                     state.context());
  }
  if (rc == PCRE2_ERROR_NOMATCH) return 0;
  if (rc < 0) return rc;
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.match_data());
  *start = ovector[0];
  *end = ovector[1];
  return 1;
}

Status Regex::FindAll(std::string_view text,
                      std::vector<std::pair<size_t, size_t>>* matches) const {
  size_t offset = 0;
  while (offset <= text.size()) {
    size_t start = 0, end = 0;
    const int rc = MatchAt(text, offset, &start, &end);
    if (rc == 0) break;
    if (rc < 0) {
      return absl::ResourceExhaustedError(
          fmt::format("regex /{}/ failed: {}", pattern_, PcreErrorMessage(rc)));
    }
    if (end > start) {
      matches->emplace_back(start, end);
      offset = end;
      continue;
    }
    // Empty match: step over one character.
    if (start >= text.size()) break;
    offset = start + DecodeUtf8(text, start).length;
  }
  return absl::OkStatus();
}

bool Regex::Search(std::string_view text) const {
  size_t start = 0, end = 0;
  return MatchAt(text, 0, &start, &end) == 1;
}

}  // namespace slime::tokenizer
