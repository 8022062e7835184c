// Prompt dataset and data source (see prompt_dataset.h).
//
// Load: read the non-blank lines → apply the row slice → per line: parse → prompt text
// (verbatim or chat template) → tokenize → length filter → label, metadata. Then
// PromptDataSource walks the prompts with an EpochSampler and stamps group and sample indices.
#include "slime/data/prompt_dataset.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "slime/common/atomic_file.h"
#include "slime/config/config.h"

namespace slime::data {

using OJson = nlohmann::ordered_json;

namespace {

Status Invalid(const std::string& what) { return absl::InvalidArgumentError(what); }

// A value that may be given as JSON text inside a string (parquet-era datasets do this).
StatusOr<OJson> MaybeParseString(const OJson& v, const std::string& key) {
  if (!v.is_string()) return v;
  try {
    return OJson::parse(v.get<std::string>());
  } catch (const nlohmann::json::exception& e) {
    return Invalid(fmt::format("\"{}\": a string that is not JSON: {}", key, e.what()));
  }
}

struct Line {
  std::string text;
  int64_t number = 0;  // 1-based
};

// Python slice [start:end] of `n` items → [lo, hi).
std::pair<int64_t, int64_t> SliceBounds(int64_t n, std::optional<int64_t> start,
                                        std::optional<int64_t> end) {
  auto clamp = [n](int64_t i) {
    if (i < 0) i += n;
    return std::clamp<int64_t>(i, 0, n);
  };
  const int64_t lo = start ? clamp(*start) : 0;
  const int64_t hi = end ? clamp(*end) : n;
  return {lo, std::max(lo, hi)};
}

}  // namespace

// Turns lines into prompts and keeps the counts.
class PromptDatasetBuilder {
 public:
  PromptDatasetBuilder(std::string source, const tokenizer::Tokenizer& tok,
                       const PromptDatasetOptions& options)
      : tok_(tok), options_(options) {
    data_.source_ = std::move(source);
  }

  Status Add(std::string_view line, int64_t line_no) {
    ++data_.stats_.lines;
    StatusOr<Prompt> prompt = Convert(line);
    if (!prompt.ok()) {
      const std::string error = fmt::format("{}:{}: {}", data_.source_, line_no,
                                            std::string(prompt.status().message()));
      if (options_.bad_line == SftBadLinePolicy::kFail) return Invalid(error);
      ++data_.stats_.bad_lines;
      if (data_.stats_.bad_lines <= options_.max_logged_bad_lines) {
        spdlog::warn("prompt dataset: skipping bad line: {}", error);
      }
      return absl::OkStatus();
    }
    const int64_t max = options_.max_prompt_len;
    if (max > 0 && static_cast<int64_t>(prompt->tokens.size()) > max) {
      ++data_.stats_.too_long;
      return absl::OkStatus();
    }
    prompt->line = line_no;
    data_.prompts_.push_back(*std::move(prompt));
    return absl::OkStatus();
  }

  StatusOr<PromptDataset> Finish() {
    PromptDatasetStats& st = data_.stats_;
    st.prompts = static_cast<int64_t>(data_.prompts_.size());
    const std::string counts =
        fmt::format("{} lines: {} bad, {} longer than max_prompt_len {} tokens", st.lines,
                    st.bad_lines, st.too_long, options_.max_prompt_len);
    if (data_.prompts_.empty()) {
      return Invalid(fmt::format("{}: no prompts ({})", data_.source_, counts));
    }
    if (st.bad_lines + st.too_long > 0) {
      spdlog::warn("prompt dataset {}: {} prompts kept from {}", data_.source_, st.prompts,
                   counts);
    } else {
      spdlog::info("prompt dataset {}: {} prompts", data_.source_, st.prompts);
    }
    return std::move(data_);
  }

 private:
  StatusOr<Prompt> Convert(std::string_view line) const {
    OJson row;
    try {
      row = OJson::parse(line);
    } catch (const nlohmann::json::exception& e) {
      return Invalid(fmt::format("malformed JSON: {}", e.what()));
    }
    if (!row.is_object()) {
      return Invalid(fmt::format("expected a JSON object with \"{}\", got {}",
                                 options_.input_key, row.type_name()));
    }
    Prompt p;
    auto input = row.find(options_.input_key);
    if (input == row.end()) {
      return Invalid(fmt::format("missing \"{}\" (the prompt: a string or a list of messages)",
                                 options_.input_key));
    }
    p.prompt = *input;

    // Metadata first: tools are stored in it.
    if (!options_.metadata_key.empty()) {
      auto it = row.find(options_.metadata_key);
      if (it != row.end() && !it->is_null()) {
        SLIME_ASSIGN_OR_RETURN(OJson meta, MaybeParseString(*it, options_.metadata_key));
        if (!meta.is_object()) {
          return Invalid(fmt::format("\"{}\": expected an object, got {}", options_.metadata_key,
                                     meta.type_name()));
        }
        p.metadata = std::move(meta);
      }
    }
    OJson tools = nullptr;
    if (!options_.tool_key.empty()) {
      auto it = row.find(options_.tool_key);
      if (it != row.end() && !it->is_null()) {
        SLIME_ASSIGN_OR_RETURN(tools, MaybeParseString(*it, options_.tool_key));
        if (!tools.is_array()) {
          return Invalid(fmt::format("\"{}\": expected an array of tool definitions, got {}",
                                     options_.tool_key, tools.type_name()));
        }
        p.metadata["tools"] = tools;
      }
    }

    if (options_.apply_chat_template) {
      OJson messages;
      if (input->is_string()) {
        messages = OJson::array({OJson{{"role", "user"}, {"content", *input}}});
      } else if (input->is_array()) {
        messages = *input;
      } else {
        return Invalid(fmt::format("\"{}\": expected a string or a list of messages, got {}",
                                   options_.input_key, input->type_name()));
      }
      tokenizer::ChatTemplateOptions o;
      o.add_generation_prompt = true;
      o.tools = tools;
      o.kwargs = options_.chat_template_kwargs;
      StatusOr<std::string> text = tok_.ApplyChatTemplate(messages, o);
      if (!text.ok()) {
        return Invalid(fmt::format("\"{}\": chat template: {}", options_.input_key,
                                   std::string(text.status().message())));
      }
      p.text = *std::move(text);
    } else if (input->is_string()) {
      p.text = input->get<std::string>();
    } else if (input->is_array()) {
      return Invalid(fmt::format(
          "\"{}\": a list of messages needs data.apply_chat_template: true to become a prompt",
          options_.input_key));
    } else {
      return Invalid(fmt::format("\"{}\": expected a string, got {}", options_.input_key,
                                 input->type_name()));
    }
    if (p.text.empty()) return Invalid(fmt::format("\"{}\": the prompt is empty", options_.input_key));
    p.tokens = tok_.Encode(p.text, /*add_special_tokens=*/false);

    if (!options_.label_key.empty()) {
      auto it = row.find(options_.label_key);
      if (it == row.end() || it->is_null()) {
        return Invalid(fmt::format("missing \"{}\" (the label)", options_.label_key));
      }
      p.label = it->is_string() ? it->get<std::string>() : it->dump();
    }
    return p;
  }

  const tokenizer::Tokenizer& tok_;
  const PromptDatasetOptions& options_;
  PromptDataset data_;
};

namespace {

Status CheckSetup(std::string_view source, const tokenizer::Tokenizer& tok,
                  const PromptDatasetOptions& options) {
  SLIME_RETURN_IF_ERROR(options.Validate());
  if (options.apply_chat_template && !tok.chat_template().ok()) {
    return Invalid(fmt::format(
        "{}: data.apply_chat_template is set but the tokenizer {} has no usable chat "
        "template: {}",
        std::string(source), tok.source(),
        std::string(tok.chat_template().status().message())));
  }
  return absl::OkStatus();
}

StatusOr<PromptDataset> BuildFromLines(const std::vector<Line>& lines, std::string source,
                                       const tokenizer::Tokenizer& tok,
                                       const PromptDatasetOptions& options) {
  PromptDatasetBuilder builder(std::move(source), tok, options);
  for (const Line& l : lines) SLIME_RETURN_IF_ERROR(builder.Add(l.text, l.number));
  return builder.Finish();
}

// The non-blank lines of `text` with their 1-based numbers ('\r' of CRLF files dropped).
std::vector<Line> SplitLines(std::string_view text) {
  std::vector<Line> lines;
  int64_t number = 0;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    ++number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos) continue;
    lines.push_back({std::string(line), number});
  }
  return lines;
}

}  // namespace

Status PromptDatasetOptions::Validate() const {
  if (input_key.empty()) return Invalid("prompt dataset: input_key is empty");
  if (max_prompt_len < 0) {
    return Invalid(fmt::format("prompt dataset: max_prompt_len is {}, expected >= 0 (0 = no "
                               "limit)",
                               max_prompt_len));
  }
  if (!chat_template_kwargs.is_object()) {
    return Invalid(fmt::format("prompt dataset: chat template kwargs must be an object, got {}",
                               chat_template_kwargs.type_name()));
  }
  return absl::OkStatus();
}

StatusOr<PathSlice> ParsePathSlice(const std::string& path_spec) {
  PathSlice out;
  const size_t at = path_spec.rfind("@[");
  if (at == std::string::npos) {
    out.path = path_spec;
    return out;
  }
  out.path = path_spec.substr(0, at);
  const std::string slice = path_spec.substr(at + 1);
  auto bad = [&] {
    return Invalid(fmt::format("{}: bad row slice \"{}\" (expected @[start:end] with optional, "
                               "possibly negative integers, e.g. @[0:1000] or @[-500:])",
                               path_spec, slice));
  };
  const size_t colon = slice.find(':');
  if (slice.back() != ']' || colon == std::string::npos) return bad();
  auto parse = [](std::string_view s, std::optional<int64_t>* v) {
    if (s.empty()) return true;
    size_t i = (s[0] == '-' || s[0] == '+') ? 1 : 0;
    if (i == s.size()) return false;
    for (size_t k = i; k < s.size(); ++k) {
      if (s[k] < '0' || s[k] > '9') return false;
    }
    if (s.size() > 18) return false;
    *v = std::stoll(std::string(s));
    return true;
  };
  const std::string_view body(slice.data() + 1, slice.size() - 2);
  const size_t c = colon - 1;
  if (!parse(body.substr(0, c), &out.start) || !parse(body.substr(c + 1), &out.end)) {
    return bad();
  }
  if (out.path.empty()) return bad();
  return out;
}

StatusOr<PromptDataset> PromptDataset::Parse(std::string_view text, std::string_view source,
                                             const tokenizer::Tokenizer& tok,
                                             const PromptDatasetOptions& options) {
  SLIME_RETURN_IF_ERROR(CheckSetup(source, tok, options));
  return BuildFromLines(SplitLines(text), std::string(source), tok, options);
}

StatusOr<PromptDataset> PromptDataset::Load(const std::string& path_spec,
                                            const tokenizer::Tokenizer& tok,
                                            const PromptDatasetOptions& options) {
  SLIME_ASSIGN_OR_RETURN(PathSlice ps, ParsePathSlice(path_spec));
  SLIME_RETURN_IF_ERROR(CheckSetup(ps.path, tok, options));
  std::ifstream in(ps.path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        fmt::format("cannot open the prompt dataset {}: {}", ps.path, std::strerror(errno)));
  }
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) {
    return absl::DataLossError(fmt::format("error reading the prompt dataset {}", ps.path));
  }
  std::vector<Line> lines = SplitLines(buf.str());
  if (ps.start || ps.end) {
    const auto [lo, hi] = SliceBounds(static_cast<int64_t>(lines.size()), ps.start, ps.end);
    lines = std::vector<Line>(lines.begin() + lo, lines.begin() + hi);
  }
  return BuildFromLines(lines, ps.path, tok, options);
}

SampleGroup MakeGroup(const Prompt& prompt, int n, int64_t group_index, int64_t first_index) {
  SampleGroup group(static_cast<size_t>(std::max(n, 0)));
  for (int j = 0; j < n; ++j) {
    Sample& s = group[static_cast<size_t>(j)];
    s.group_index = group_index;
    s.index = first_index + j;
    s.prompt = prompt.prompt;
    s.prompt_text = prompt.text;
    s.tokens = prompt.tokens;
    s.label = prompt.label;
    s.metadata = prompt.metadata;
  }
  return group;
}

// ---- PromptDataSource ------------------------------------------------------------------------

Status PromptDataSourceOptions::Validate() const {
  if (n_samples_per_prompt < 1) {
    return Invalid(fmt::format("prompt data source: n_samples_per_prompt is {}, expected >= 1",
                               n_samples_per_prompt));
  }
  return absl::OkStatus();
}

OJson DataSourceState::ToJson() const {
  return OJson{{"format", "slime-cpp data source state"},
               {"version", 1},
               {"epoch_id", epoch},
               {"sample_offset", offset},
               {"sample_group_index", next_group_index},
               {"sample_index", next_sample_index},
               {"num_prompts", num_prompts},
               {"seed", seed},
               {"shuffle", shuffle}};
}

StatusOr<DataSourceState> DataSourceState::FromJson(const nlohmann::json& j,
                                                    std::string_view source) {
  const std::string src(source);
  if (!j.is_object()) {
    return Invalid(fmt::format("{}: expected a JSON object, got {}", src, j.type_name()));
  }
  auto version = j.find("version");
  if (version == j.end() || !version->is_number_integer() || version->get<int64_t>() != 1) {
    return Invalid(fmt::format("{}: unsupported data source state version {} (expected 1)", src,
                               version == j.end() ? "(missing)" : version->dump()));
  }
  auto get_int = [&](const char* key, int64_t* out) -> Status {
    auto it = j.find(key);
    if (it == j.end()) return Invalid(fmt::format("{}: missing \"{}\"", src, key));
    if (!it->is_number_integer()) {
      return Invalid(fmt::format("{}: \"{}\" must be an integer, got {}", src, key, it->dump()));
    }
    *out = it->get<int64_t>();
    return absl::OkStatus();
  };
  DataSourceState s;
  SLIME_RETURN_IF_ERROR(get_int("epoch_id", &s.epoch));
  SLIME_RETURN_IF_ERROR(get_int("sample_offset", &s.offset));
  SLIME_RETURN_IF_ERROR(get_int("sample_group_index", &s.next_group_index));
  SLIME_RETURN_IF_ERROR(get_int("sample_index", &s.next_sample_index));
  SLIME_RETURN_IF_ERROR(get_int("num_prompts", &s.num_prompts));
  auto seed = j.find("seed");
  if (seed == j.end() || !seed->is_number_unsigned()) {
    return Invalid(fmt::format("{}: \"seed\" must be a non-negative integer", src));
  }
  s.seed = seed->get<uint64_t>();
  auto shuffle = j.find("shuffle");
  if (shuffle == j.end() || !shuffle->is_boolean()) {
    return Invalid(fmt::format("{}: \"shuffle\" must be true or false", src));
  }
  s.shuffle = shuffle->get<bool>();
  return s;
}

std::string DataSourceStatePath(const std::string& save_dir, int64_t rollout_id) {
  return fmt::format("{}/rollout/data_source_state_{}.json", save_dir, rollout_id);
}

StatusOr<PromptDataSource> PromptDataSource::Create(std::shared_ptr<const PromptDataset> dataset,
                                                    const PromptDataSourceOptions& options) {
  SLIME_RETURN_IF_ERROR(options.Validate());
  if (dataset == nullptr || dataset->size() == 0) {
    return Invalid("prompt data source: the dataset is empty");
  }
  SLIME_ASSIGN_OR_RETURN(EpochSampler sampler,
                         EpochSampler::Create(dataset->size(), options.seed, options.shuffle));
  return PromptDataSource(std::move(dataset), options, std::move(sampler));
}

std::vector<SampleGroup> PromptDataSource::GetSamples(int64_t num_groups) {
  std::vector<SampleGroup> groups;
  groups.reserve(static_cast<size_t>(std::max<int64_t>(num_groups, 0)));
  const int n = options_.n_samples_per_prompt;
  for (int64_t g = 0; g < num_groups; ++g) {
    groups.push_back(
        MakeGroup(dataset_->prompt(sampler_.Next()), n, next_group_index_, next_sample_index_));
    ++next_group_index_;
    next_sample_index_ += n;
  }
  return groups;
}

DataSourceState PromptDataSource::state() const {
  const EpochSamplerState s = sampler_.state();
  return {s.epoch,       s.offset,      next_group_index_,  next_sample_index_,
          num_prompts(), options_.seed, options_.shuffle};
}

Status PromptDataSource::Restore(const DataSourceState& state) {
  if (state.num_prompts != num_prompts() || state.seed != options_.seed ||
      state.shuffle != options_.shuffle) {
    return absl::FailedPreconditionError(fmt::format(
        "prompt data source: the saved position is for {} prompts, seed {}, shuffle {}, but "
        "this run has {} prompts, seed {}, shuffle {}; resuming would visit prompts in a "
        "different order (restore the dataset and rollout.seed/shuffle of the saved run)",
        state.num_prompts, state.seed, state.shuffle, num_prompts(), options_.seed,
        options_.shuffle));
  }
  if (state.next_group_index < 0 || state.next_sample_index < 0) {
    return Invalid(fmt::format("prompt data source: negative indices in the saved state "
                               "(group {}, sample {})",
                               state.next_group_index, state.next_sample_index));
  }
  SLIME_RETURN_IF_ERROR(sampler_.Restore({state.epoch, state.offset}));
  next_group_index_ = state.next_group_index;
  next_sample_index_ = state.next_sample_index;
  return absl::OkStatus();
}

Status PromptDataSource::Save(const std::string& path) const {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) {
    fs::create_directories(parent, ec);
    if (ec) {
      return absl::InternalError(
          fmt::format("{}: cannot create directory: {}", parent.string(), ec.message()));
    }
  }
  return WriteFileAtomically(path, state().ToJson().dump(2) + "\n");
}

Status PromptDataSource::Load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(fmt::format("cannot open the data source state {}: {}", path,
                                           std::strerror(errno)));
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    return Invalid(fmt::format("{}: malformed JSON: {}", path, e.what()));
  }
  SLIME_ASSIGN_OR_RETURN(DataSourceState s, DataSourceState::FromJson(j, path));
  Status st = Restore(s);
  if (!st.ok()) {
    return Status(st.code(), fmt::format("{}: {}", path, std::string(st.message())));
  }
  return absl::OkStatus();
}

// ---- From the job config ---------------------------------------------------------------------

PromptDatasetOptions PromptDatasetOptionsFromConfig(const config::Config& config) {
  const config::DataConfig& d = config.data;
  PromptDatasetOptions o;
  o.input_key = d.input_key;
  o.label_key = d.label_key.value_or("");
  o.metadata_key = d.metadata_key;
  o.tool_key = d.tool_key;
  o.apply_chat_template = d.apply_chat_template;
  for (const auto& [key, value] : d.apply_chat_template_kwargs) {
    OJson v = OJson::parse(value, nullptr, /*allow_exceptions=*/false);
    o.chat_template_kwargs[key] = (v.is_discarded() || v.is_structured()) ? OJson(value) : v;
  }
  o.max_prompt_len = config.rollout.max_prompt_len.value_or(0);
  o.bad_line = d.on_bad_line == "fail" ? SftBadLinePolicy::kFail : SftBadLinePolicy::kSkip;
  return o;
}

PromptDataSourceOptions PromptDataSourceOptionsFromConfig(const config::Config& config) {
  PromptDataSourceOptions o;
  o.n_samples_per_prompt = config.data.n_samples_per_prompt;
  o.seed = static_cast<uint64_t>(static_cast<int64_t>(config.rollout.seed));
  o.shuffle = config.rollout.shuffle;
  return o;
}

}  // namespace slime::data
