// Normalizer and PreTokenizer (see pre_tokenizer.h).
#include "slime/tokenizer/pre_tokenizer.h"

#include <algorithm>

#include <fmt/format.h>

#include "slime/tokenizer/unicode.h"

namespace slime::tokenizer {
namespace {

using Json = nlohmann::json;

// The GPT-2 pattern that ByteLevel uses when "use_regex" is true.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

Status Invalid(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(fmt::format("{}: {}", path, what));
}

StatusOr<std::string> TypeOf(const Json& j, const std::string& path) {
  if (!j.is_object()) return Invalid(path, "expected an object");
  auto it = j.find("type");
  if (it == j.end() || !it->is_string()) return Invalid(path, "missing string field \"type\"");
  return it->get<std::string>();
}

bool BoolField(const Json& j, const char* key, bool fallback) {
  auto it = j.find(key);
  return (it != j.end() && it->is_boolean()) ? it->get<bool>() : fallback;
}

}  // namespace

StatusOr<SplitBehavior> ParseSplitBehavior(std::string_view name) {
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return absl::InvalidArgumentError(fmt::format(
      "unknown split behavior \"{}\" (valid: Removed, Isolated, MergedWithPrevious, "
      "MergedWithNext, Contiguous)",
      name));
}

// ---------------------------------------------------------------------------------------------
// Normalizer

StatusOr<std::unique_ptr<Normalizer>> Normalizer::FromJson(const Json& j) {
  auto normalizer = std::unique_ptr<Normalizer>(new Normalizer());
  if (!j.is_null()) SLIME_RETURN_IF_ERROR(AddSteps(j, "normalizer", &normalizer->steps_));
  return normalizer;
}

Status Normalizer::AddSteps(const Json& j, const std::string& path, std::vector<Step>* steps) {
  SLIME_ASSIGN_OR_RETURN(std::string type, TypeOf(j, path));
  if (type == "NFC") {
    steps->push_back(Step::kNfc);
    return absl::OkStatus();
  }
  if (type == "Sequence") {
    auto it = j.find("normalizers");
    if (it == j.end() || !it->is_array()) {
      return Invalid(path, "Sequence needs an array \"normalizers\"");
    }
    for (size_t i = 0; i < it->size(); ++i) {
      SLIME_RETURN_IF_ERROR(AddSteps((*it)[i], fmt::format("{}.normalizers[{}]", path, i), steps));
    }
    return absl::OkStatus();
  }
  return Invalid(path, fmt::format("unsupported normalizer type \"{}\" (supported: NFC, Sequence)",
                                   type));
}

bool Normalizer::Normalize(std::string_view text, std::string* out) const {
  bool changed = false;
  for (Step step : steps_) {
    switch (step) {
      case Step::kNfc: {
        std::string_view current = changed ? std::string_view(*out) : text;
        if (IsNfcQuick(current)) break;
        std::string normalized = NormalizeNfc(current);
        *out = std::move(normalized);
        changed = true;
        break;
      }
    }
  }
  return changed;
}

// ---------------------------------------------------------------------------------------------
// PreTokenizer

StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizer::FromJson(const Json& j) {
  auto pre = std::unique_ptr<PreTokenizer>(new PreTokenizer());
  if (!j.is_null()) {
    SLIME_RETURN_IF_ERROR(AddSteps(j, "pre_tokenizer", &pre->steps_, &pre->byte_level_));
  }
  return pre;
}

Status PreTokenizer::AddSteps(const Json& j, const std::string& path, std::vector<Step>* steps,
                              bool* byte_level) {
  SLIME_ASSIGN_OR_RETURN(std::string type, TypeOf(j, path));
  if (type == "Sequence") {
    auto it = j.find("pretokenizers");
    if (it == j.end() || !it->is_array()) {
      return Invalid(path, "Sequence needs an array \"pretokenizers\"");
    }
    for (size_t i = 0; i < it->size(); ++i) {
      SLIME_RETURN_IF_ERROR(
          AddSteps((*it)[i], fmt::format("{}.pretokenizers[{}]", path, i), steps, byte_level));
    }
    return absl::OkStatus();
  }
  if (type == "Split") {
    Step step;
    step.kind = Step::Kind::kSplit;
    auto pattern = j.find("pattern");
    if (pattern == j.end() || !pattern->is_object()) {
      return Invalid(path, "Split needs \"pattern\": {\"Regex\": ...} or {\"String\": ...}");
    }
    StatusOr<std::unique_ptr<Regex>> regex;
    if (auto r = pattern->find("Regex"); r != pattern->end() && r->is_string()) {
      regex = Regex::Compile(r->get<std::string>());
    } else if (auto s = pattern->find("String"); s != pattern->end() && s->is_string()) {
      regex = Regex::Compile(s->get<std::string>(), /*literal=*/true);
    } else {
      return Invalid(path, "Split needs \"pattern\": {\"Regex\": ...} or {\"String\": ...}");
    }
    if (!regex.ok()) return Invalid(path + ".pattern", std::string(regex.status().message()));
    step.regex = std::move(regex).value();
    auto behavior = j.find("behavior");
    if (behavior == j.end() || !behavior->is_string()) {
      return Invalid(path, "Split needs a string \"behavior\"");
    }
    StatusOr<SplitBehavior> parsed = ParseSplitBehavior(behavior->get<std::string>());
    if (!parsed.ok()) return Invalid(path + ".behavior", std::string(parsed.status().message()));
    step.behavior = *parsed;
    step.invert = BoolField(j, "invert", false);
    steps->push_back(std::move(step));
    return absl::OkStatus();
  }
  if (type == "ByteLevel") {
    Step step;
    step.kind = Step::Kind::kByteLevel;
    step.add_prefix_space = BoolField(j, "add_prefix_space", true);
    if (BoolField(j, "use_regex", true)) {
      SLIME_ASSIGN_OR_RETURN(step.regex, Regex::Compile(kGpt2Pattern));
    }
    *byte_level = true;
    steps->push_back(std::move(step));
    return absl::OkStatus();
  }
  return Invalid(path, fmt::format("unsupported pre_tokenizer type \"{}\" (supported: Sequence, "
                                   "Split, ByteLevel)",
                                   type));
}

Status PreTokenizer::SplitPiece(const Regex& regex, SplitBehavior behavior, bool invert,
                                std::string_view piece, std::vector<std::string_view>* out) {
  thread_local std::vector<std::pair<size_t, size_t>> matches;
  matches.clear();
  SLIME_RETURN_IF_ERROR(regex.FindAll(piece, &matches));
  if (behavior == SplitBehavior::kIsolated) {  // the common case: every gap and match
    size_t prev = 0;
    for (const auto& [start, end] : matches) {
      if (start > prev) out->push_back(piece.substr(prev, start - prev));
      out->push_back(piece.substr(start, end - start));
      prev = end;
    }
    if (prev < piece.size()) out->push_back(piece.substr(prev));
    return absl::OkStatus();
  }
  // Segments covering `piece`: gaps (false) and matches (true), then inverted if asked.
  struct Segment {
    size_t start, end;
    bool is_match;
  };
  thread_local std::vector<Segment> segments;
  segments.clear();
  size_t prev = 0;
  for (const auto& [start, end] : matches) {
    if (start > prev) segments.push_back({prev, start, invert});
    segments.push_back({start, end, !invert});
    prev = end;
  }
  if (prev < piece.size()) segments.push_back({prev, piece.size(), invert});

  thread_local std::vector<Segment> merged;
  merged.clear();
  switch (behavior) {
    case SplitBehavior::kIsolated:  // returned above
      break;
    case SplitBehavior::kRemoved:
      for (const Segment& s : segments) {
        if (!s.is_match) merged.push_back(s);
      }
      break;
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const Segment& s : segments) {
        if (s.is_match && !previous_match && !merged.empty()) {
          merged.back().end = s.end;
        } else {
          merged.push_back(s);
        }
        previous_match = s.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool previous_match = false;
      for (size_t i = segments.size(); i-- > 0;) {
        const Segment& s = segments[i];
        if (s.is_match && !previous_match && !merged.empty()) {
          merged.back().start = s.start;
        } else {
          merged.push_back(s);
        }
        previous_match = s.is_match;
      }
      std::reverse(merged.begin(), merged.end());
      break;
    }
    case SplitBehavior::kContiguous: {
      bool previous_match = false;
      for (const Segment& s : segments) {
        if (s.is_match == previous_match && !merged.empty()) {
          merged.back().end = s.end;
        } else {
          merged.push_back(s);
        }
        previous_match = s.is_match;
      }
      break;
    }
  }
  for (const Segment& s : merged) {
    if (s.end > s.start) out->push_back(piece.substr(s.start, s.end - s.start));
  }
  return absl::OkStatus();
}

Status PreTokenizer::Split(std::string_view text, std::deque<std::string>* arena,
                           std::vector<std::string_view>* words) const {
  if (text.empty()) return absl::OkStatus();
  if (steps_.empty()) {
    words->push_back(text);
    return absl::OkStatus();
  }
  thread_local std::vector<std::string_view> pieces, next;
  pieces.assign(1, text);
  for (const Step& step : steps_) {
    next.clear();
    for (std::string_view piece : pieces) {
      if (step.kind == Step::Kind::kByteLevel && step.add_prefix_space &&
          piece.front() != ' ') {
        arena->push_back(" " + std::string(piece));
        piece = arena->back();
      }
      if (step.regex == nullptr) {
        next.push_back(piece);
        continue;
      }
      const SplitBehavior behavior =
          step.kind == Step::Kind::kSplit ? step.behavior : SplitBehavior::kIsolated;
      SLIME_RETURN_IF_ERROR(SplitPiece(*step.regex, behavior, step.invert, piece, &next));
    }
    pieces.swap(next);
  }
  words->insert(words->end(), pieces.begin(), pieces.end());
  return absl::OkStatus();
}

}  // namespace slime::tokenizer
