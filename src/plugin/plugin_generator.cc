// The host side of the generate plugin ABI (plugin_generator.h).
#include "slime/plugin/plugin_generator.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <exception>
#include <filesystem>
#include <optional>
#include <utility>
#include <vector>

#include "slime/plugin/generate_plugin.h"
#include "slime/rollout/coordinator.h"

namespace slime::plugin {
namespace {

constexpr size_t kErrLen = 4 * SLIME_GENERATE_ERR_LEN;
// Version 1.0's table ends with `generate`: a smaller table cannot be used.
constexpr size_t kMinTableSize =
    offsetof(slime_generate_plugin, generate) + sizeof(slime_generate_plugin::generate);

std::string AbiString(uint32_t v) {
  return fmt::format("{}.{}", SLIME_GENERATE_ABI_MAJOR(v), SLIME_GENERATE_ABI_MINOR(v));
}

void WriteErr(char* err, size_t err_len, const std::string& message) {
  if (err == nullptr || err_len == 0) return;
  const size_t n = std::min(message.size(), err_len - 1);
  std::memcpy(err, message.data(), n);
  err[n] = '\0';
}

std::string_view View(const char* p, size_t n) {
  return p == nullptr ? std::string_view() : std::string_view(p, n);
}

// Parses a JSON argument; nullopt and *error set when it is not valid JSON.
std::optional<nlohmann::json> ParseJson(std::string_view text, std::string* error) {
  try {
    return nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    *error = e.what();
    return std::nullopt;
  }
}

// ---- engine handle ------------------------------------------------------------------------

// The context behind one Generate call's slime_generate_engine.
struct EngineCall {
  rollout::EngineSession* session = nullptr;
  std::optional<rollout::GenerateTurn> turn;  // the last answer (its memory is lent out)
  Status last_error;                          // the engine's last failure in this call
};

int EngineGenerate(void* ctx, const int32_t* input_ids, size_t input_len,
                   const char* overrides_json, size_t overrides_json_len, slime_generate_turn* turn,
                   char* err, size_t err_len) {
  auto* call = static_cast<EngineCall*>(ctx);
  try {
    if (turn == nullptr) {
      WriteErr(err, err_len, "engine->generate: turn is NULL");
      return SLIME_GENERATE_ERROR;
    }
    if (input_ids == nullptr && input_len > 0) {
      WriteErr(err, err_len, "engine->generate: input_ids is NULL with input_len > 0");
      return SLIME_GENERATE_ERROR;
    }
    nlohmann::json overrides = nlohmann::json::object();
    const std::string_view text = View(overrides_json, overrides_json_len);
    if (!text.empty()) {
      std::string error;
      auto parsed = ParseJson(text, &error);
      if (!parsed || !parsed->is_object()) {
        WriteErr(err, err_len,
                 fmt::format("engine->generate: overrides must be a JSON object, got: {}",
                             parsed ? std::string(text) : error));
        return SLIME_GENERATE_ERROR;
      }
      overrides = std::move(*parsed);
    }
    // The last turn stays alive during the call: input_ids may point into it.
    StatusOr<rollout::GenerateTurn> answer =
        call->session->Generate(std::span<const int32_t>(input_ids, input_len), overrides);
    if (!answer.ok()) {
      call->turn.reset();
      call->last_error = answer.status();
      WriteErr(err, err_len, std::string(answer.status().message()));
      return SLIME_GENERATE_ERROR;
    }
    rollout::GenerateTurn& t = call->turn.emplace(*std::move(answer));
    if (t.log_probs.size() != t.output_ids.size()) {  // the session's contract
      call->last_error =
          absl::InternalError(fmt::format("the engine returned {} log-probs for {} output ids",
                                          t.log_probs.size(), t.output_ids.size()));
      WriteErr(err, err_len, std::string(call->last_error.message()));
      call->turn.reset();
      return SLIME_GENERATE_ERROR;
    }
    *turn = slime_generate_turn{};
    turn->struct_size = sizeof(slime_generate_turn);
    turn->output_ids = t.output_ids.data();
    turn->output_len = t.output_ids.size();
    turn->log_probs = t.log_probs.data();
    turn->text = t.text.c_str();
    turn->text_len = t.text.size();
    turn->finish_reason = t.finish_reason.c_str();
    turn->weight_version = t.weight_version.c_str();
    return SLIME_GENERATE_OK;
  } catch (const std::exception& e) {
    WriteErr(err, err_len, fmt::format("engine->generate: {}", e.what()));
    return SLIME_GENERATE_ERROR;
  }
}

void EngineReleaseTurn(void* ctx) { static_cast<EngineCall*>(ctx)->turn.reset(); }

int EngineAborting(void* ctx) { return static_cast<EngineCall*>(ctx)->session->aborting() ? 1 : 0; }

// ---- output builder -----------------------------------------------------------------------

struct Segment {
  data::Sample sample;
  bool status_set = false;
  bool rewarded = false;
  bool trainable_with_log_probs = false;
  bool trainable_without_log_probs = false;
};

// The context behind one Generate call's slime_generate_output. The first invalid call's
// message is kept in `error`; every later call then fails too.
struct OutputBuild {
  const data::Sample* input = nullptr;
  std::vector<Segment> segments;
  std::string error;

  int Fail(const std::string& what) {
    if (error.empty()) {
      error = segments.empty() ? what : fmt::format("segment {}: {}", segments.size() - 1, what);
    }
    return SLIME_GENERATE_ERROR;
  }
  void Begin(std::span<const int32_t> prompt_ids) {
    Segment& s = segments.emplace_back();
    data::Sample& out = s.sample;
    const data::Sample& in = *input;
    out.group_index = in.group_index;
    out.index = in.index;
    out.rollout_id = in.rollout_id;
    out.prompt = in.prompt;
    out.prompt_text = in.prompt_text;
    out.label = in.label;
    out.metadata = in.metadata;
    out.remove_sample = in.remove_sample;
    out.tokens.assign(prompt_ids.begin(), prompt_ids.end());
  }
  std::span<const int32_t> InputPrompt() const {
    return std::span<const int32_t>(
        input->tokens.data(), static_cast<size_t>(std::max<int64_t>(0, input->PromptLength())));
  }
  Segment& Current() {
    if (segments.empty()) Begin(InputPrompt());
    return segments.back();
  }
};

// Runs a callback body, turning an exception (allocation failure) into an error return.
template <typename F>
int Guarded(void* ctx, const char* name, F&& body) {
  auto* build = static_cast<OutputBuild*>(ctx);
  if (!build->error.empty()) return SLIME_GENERATE_ERROR;  // sticky
  try {
    return body(*build);
  } catch (const std::exception& e) {
    return build->Fail(fmt::format("{}: {}", name, e.what()));
  }
}

int OutputBeginSegment(void* ctx, const int32_t* prompt_ids, size_t prompt_len) {
  return Guarded(ctx, "begin_segment", [&](OutputBuild& b) {
    if (prompt_ids == nullptr) {
      b.Begin(b.InputPrompt());
    } else {
      b.Begin(std::span<const int32_t>(prompt_ids, prompt_len));
    }
    return SLIME_GENERATE_OK;
  });
}

int OutputAppendSpan(void* ctx, const int32_t* ids, size_t n_ids, const float* log_probs,
                     size_t n_log_probs, int trainable, const char* text, size_t text_len,
                     const char* weight_version) {
  return Guarded(ctx, "append_span", [&](OutputBuild& b) {
    Segment& seg = b.Current();
    if (ids == nullptr && n_ids > 0) return b.Fail("append_span: ids is NULL with n_ids > 0");
    if (log_probs == nullptr && n_log_probs > 0) {
      return b.Fail("append_span: log_probs is NULL with n_log_probs > 0");
    }
    if (!trainable && n_log_probs > 0) {
      return b.Fail(fmt::format(
          "append_span: {} log-probs for a span that is not trainable (only model output "
          "carries log-probs)",
          n_log_probs));
    }
    if (n_log_probs > 0 && n_log_probs != n_ids) {
      return b.Fail(fmt::format("append_span: {} log-probs for {} ids", n_log_probs, n_ids));
    }
    const bool with = n_log_probs > 0;
    if (trainable && n_ids > 0) {
      if ((with && seg.trainable_without_log_probs) || (!with && seg.trainable_with_log_probs)) {
        return b.Fail(
            "append_span: trainable spans with and without log-probs in one segment (give the "
            "engine's log-probs for every model span, or for none)");
      }
      (with ? seg.trainable_with_log_probs : seg.trainable_without_log_probs) = true;
    }
    // A span without log-probs gets 0s while the segment may still record log-probs (they
    // are cleared at the end when no trainable span had any).
    std::vector<float> zeros;
    std::span<const float> lp(log_probs, n_log_probs);
    if (!with && !seg.trainable_without_log_probs) {
      zeros.assign(n_ids, 0.0f);
      lp = zeros;
    }
    const std::string_view wv = trainable && weight_version != nullptr
                                    ? std::string_view(weight_version)
                                    : std::string_view();
    Status st = seg.sample.AppendResponse(std::span<const int32_t>(ids, n_ids), lp, trainable != 0,
                                          View(text, text_len), wv);
    if (!st.ok()) return b.Fail(fmt::format("append_span: {}", std::string(st.message())));
    return SLIME_GENERATE_OK;
  });
}

int OutputSetReward(void* ctx, double reward, const char* raw_reward_json,
                    size_t raw_reward_json_len) {
  return Guarded(ctx, "set_reward", [&](OutputBuild& b) {
    Segment& seg = b.Current();
    nlohmann::json raw = reward;
    if (raw_reward_json != nullptr) {
      std::string error;
      auto parsed = ParseJson(View(raw_reward_json, raw_reward_json_len), &error);
      if (!parsed) return b.Fail(fmt::format("set_reward: raw_reward_json is not JSON: {}", error));
      raw = std::move(*parsed);
    }
    seg.sample.reward = reward;
    seg.sample.raw_reward = std::move(raw);
    seg.rewarded = true;
    return SLIME_GENERATE_OK;
  });
}

int OutputSetStatus(void* ctx, int status) {
  return Guarded(ctx, "set_status", [&](OutputBuild& b) {
    Segment& seg = b.Current();
    switch (status) {
      case SLIME_GENERATE_STATUS_COMPLETED:
        seg.sample.status = data::SampleStatus::kCompleted;
        break;
      case SLIME_GENERATE_STATUS_TRUNCATED:
        seg.sample.status = data::SampleStatus::kTruncated;
        break;
      case SLIME_GENERATE_STATUS_ABORTED:
        seg.sample.status = data::SampleStatus::kAborted;
        break;
      case SLIME_GENERATE_STATUS_FAILED:
        seg.sample.status = data::SampleStatus::kFailed;
        break;
      default:
        return b.Fail(fmt::format(
            "set_status: unknown status {} (expected SLIME_GENERATE_STATUS_COMPLETED 1, "
            "TRUNCATED 2, ABORTED 3 or FAILED 4)",
            status));
    }
    seg.status_set = true;
    return SLIME_GENERATE_OK;
  });
}

int OutputSetMetadata(void* ctx, const char* metadata_json, size_t metadata_json_len) {
  return Guarded(ctx, "set_metadata", [&](OutputBuild& b) {
    Segment& seg = b.Current();
    std::string error;
    const std::string_view text = View(metadata_json, metadata_json_len);
    std::optional<nlohmann::ordered_json> parsed;
    try {
      parsed = nlohmann::ordered_json::parse(text);
    } catch (const std::exception& e) {
      error = e.what();
    }
    if (!parsed) return b.Fail(fmt::format("set_metadata: not JSON: {}", error));
    if (!parsed->is_object()) {
      return b.Fail(fmt::format("set_metadata: expected a JSON object, got {}", std::string(text)));
    }
    for (auto it = parsed->begin(); it != parsed->end(); ++it)
      seg.sample.metadata[it.key()] = it.value();
    return SLIME_GENERATE_OK;
  });
}

// ---- the generator ------------------------------------------------------------------------

struct DlClose {
  void operator()(void* handle) const {
    if (handle != nullptr) ::dlclose(handle);
  }
};
using LibraryHandle = std::unique_ptr<void, DlClose>;

class PluginGenerator : public rollout::CustomGenerator {
 public:
  PluginGenerator(std::string who, LibraryHandle library, const slime_generate_plugin& table,
                  void* state)
      : who_(std::move(who)), library_(std::move(library)), table_(table), state_(state) {}
  ~PluginGenerator() override {
    if (table_.destroy != nullptr) table_.destroy(state_);
  }
  PluginGenerator(const PluginGenerator&) = delete;
  PluginGenerator& operator=(const PluginGenerator&) = delete;

  std::string kind() const override { return "plugin"; }

  StatusOr<rollout::CustomGenerateResult> Generate(const data::Sample& sample,
                                                   rollout::EngineSession* session) override;

 private:
  const std::string who_;  // "generate plugin 'name' version (path)"
  LibraryHandle library_;  // destroyed after state_ (declared first)
  const slime_generate_plugin table_;
  void* const state_;
};

StatusOr<rollout::CustomGenerateResult> PluginGenerator::Generate(const data::Sample& sample,
                                                                  rollout::EngineSession* session) {
  auto failure = [&](absl::StatusCode code, const std::string& what) {
    return Status(code, fmt::format("{}: sample {}: {}", who_, sample.index, what));
  };
  if (session == nullptr) return failure(absl::StatusCode::kInvalidArgument, "no engine session");

  const std::string metadata = sample.metadata.dump();
  const std::string sampling = SamplingParamsJson(session->sampling()).dump();
  const std::string request_id = session->request_id();
  const int64_t prompt_len = std::max<int64_t>(0, sample.PromptLength());

  slime_generate_input input{};
  input.struct_size = sizeof(input);
  input.prompt_ids = sample.tokens.data();
  input.prompt_len = static_cast<size_t>(prompt_len);
  input.prompt_text = sample.prompt_text.c_str();
  input.prompt_text_len = sample.prompt_text.size();
  input.label = sample.label.c_str();
  input.label_len = sample.label.size();
  input.metadata_json = metadata.c_str();
  input.metadata_json_len = metadata.size();
  input.sample_index = sample.index;
  input.group_index = sample.group_index;
  input.sampling_params_json = sampling.c_str();
  input.sampling_params_json_len = sampling.size();
  input.request_id = request_id.c_str();

  EngineCall engine_call;
  engine_call.session = session;
  slime_generate_engine engine{};
  engine.struct_size = sizeof(engine);
  engine.ctx = &engine_call;
  engine.generate = &EngineGenerate;
  engine.release_turn = &EngineReleaseTurn;
  engine.aborting = &EngineAborting;

  OutputBuild build;
  build.input = &sample;
  slime_generate_output output{};
  output.struct_size = sizeof(output);
  output.ctx = &build;
  output.begin_segment = &OutputBeginSegment;
  output.append_span = &OutputAppendSpan;
  output.set_reward = &OutputSetReward;
  output.set_status = &OutputSetStatus;
  output.set_metadata = &OutputSetMetadata;

  char err[kErrLen];
  err[0] = '\0';
  const int rc = table_.generate(state_, &input, &engine, &output, err, kErrLen);
  err[kErrLen - 1] = '\0';

  if (!build.error.empty()) {
    return failure(absl::StatusCode::kInvalidArgument, fmt::format("bad output: {}", build.error));
  }
  if (rc != SLIME_GENERATE_OK) {
    std::string message = err[0] != '\0' ? std::string(err) : "(no message)";
    // An engine failure the plugin passed on keeps its code (e.g. Unavailable: a lost engine).
    absl::StatusCode code = absl::StatusCode::kInternal;
    if (!engine_call.last_error.ok()) {
      code = engine_call.last_error.code();
      const std::string cause(engine_call.last_error.message());
      if (message.find(cause) == std::string::npos) {
        message = fmt::format("{} (the engine's last error: {})", message, cause);
      }
    }
    return failure(code, fmt::format("generate returned {}: {}", rc, message));
  }
  if (build.segments.empty()) {
    return failure(absl::StatusCode::kInvalidArgument,
                   "bad output: generate returned without building a segment (append the "
                   "response and call set_status)");
  }
  rollout::CustomGenerateResult result;
  std::vector<size_t> with_reward, without_reward;
  for (size_t k = 0; k < build.segments.size(); ++k) {
    Segment& seg = build.segments[k];
    if (!seg.status_set) {
      return failure(absl::StatusCode::kInvalidArgument,
                     fmt::format("bad output: segment {} has no status (call set_status)", k));
    }
    (seg.rewarded ? with_reward : without_reward).push_back(k);
    if (!seg.trainable_with_log_probs) seg.sample.rollout_log_probs.clear();  // only 0s
    if (Status st = seg.sample.Validate(); !st.ok()) {
      return failure(absl::StatusCode::kInvalidArgument,
                     fmt::format("bad output: segment {}: {}", k, std::string(st.message())));
    }
  }
  if (!with_reward.empty() && !without_reward.empty()) {
    return failure(absl::StatusCode::kInvalidArgument,
                   fmt::format("bad output: a reward was set on segment(s) {} but not on {} (set "
                               "it on every segment, or on none to use the reward model)",
                               fmt::join(with_reward, ", "), fmt::join(without_reward, ", ")));
  }
  result.rewarded = without_reward.empty();
  result.segments.reserve(build.segments.size());
  for (Segment& seg : build.segments) result.segments.push_back(std::move(seg.sample));
  return result;
}

}  // namespace

nlohmann::json SamplingParamsJson(const rollout::SamplingOptions& sampling) {
  nlohmann::json sp = {
      {"temperature", sampling.temperature},
      {"top_p", sampling.top_p},
      {"top_k", sampling.top_k},
      {"skip_special_tokens", sampling.skip_special_tokens},
  };
  if (sampling.max_response_len) sp["max_new_tokens"] = *sampling.max_response_len;
  if (sampling.max_context_len) sp["max_context_len"] = *sampling.max_context_len;
  if (sampling.min_new_tokens) sp["min_new_tokens"] = *sampling.min_new_tokens;
  if (!sampling.stop.empty()) sp["stop"] = sampling.stop;
  if (!sampling.stop_token_ids.empty()) sp["stop_token_ids"] = sampling.stop_token_ids;
  return sp;
}

StatusOr<std::unique_ptr<rollout::CustomGenerator>> LoadGeneratePlugin(
    const PluginOptions& options) {
  if (options.path.empty()) {
    return absl::InvalidArgumentError("generate plugin: no path given (a shared library .so)");
  }
  std::error_code ec;
  const std::filesystem::path path = std::filesystem::absolute(options.path, ec);
  if (ec || !std::filesystem::is_regular_file(path, ec)) {
    return absl::NotFoundError(fmt::format(
        "generate plugin {}: no such file (expected a shared library .so)", options.path));
  }
  const std::string file = path.string();
  const std::string config = options.config_json.empty() ? "null" : options.config_json;
  {
    std::string error;
    if (!ParseJson(config, &error)) {
      return absl::InvalidArgumentError(
          fmt::format("generate plugin {}: its config is not valid JSON: {}", file, error));
    }
  }

  ::dlerror();
  LibraryHandle library(::dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL));
  if (library == nullptr) {
    const char* e = ::dlerror();
    return absl::FailedPreconditionError(fmt::format("generate plugin {}: cannot load it: {}", file,
                                                     e ? e : "unknown dlopen error"));
  }
  auto entry = reinterpret_cast<slime_generate_plugin_entry_fn>(
      ::dlsym(library.get(), SLIME_GENERATE_PLUGIN_ENTRY_SYMBOL));
  if (entry == nullptr) {
    return absl::FailedPreconditionError(fmt::format(
        "generate plugin {}: it does not export {} (a generate plugin exports that one symbol "
        "with SLIME_GENERATE_PLUGIN_EXPORT, see include/slime/plugin/generate_plugin.h)",
        file, SLIME_GENERATE_PLUGIN_ENTRY_SYMBOL));
  }
  const slime_generate_plugin* exported = entry();
  if (exported == nullptr) {
    return absl::FailedPreconditionError(fmt::format("generate plugin {}: {} returned NULL", file,
                                                     SLIME_GENERATE_PLUGIN_ENTRY_SYMBOL));
  }
  // The version is the only field read before it is checked.
  const uint32_t version = exported->abi_version;
  if (SLIME_GENERATE_ABI_MAJOR(version) != SLIME_GENERATE_ABI_VERSION_MAJOR) {
    return absl::FailedPreconditionError(fmt::format(
        "generate plugin {}: it was built for generate plugin ABI {}, this slime-cpp speaks {} "
        "(the major versions must match): rebuild the plugin against this slime-cpp's "
        "include/slime/plugin/generate_plugin.h",
        file, AbiString(version), AbiString(SLIME_GENERATE_ABI_VERSION)));
  }
  if (exported->struct_size < kMinTableSize) {
    return absl::FailedPreconditionError(fmt::format(
        "generate plugin {}: its table (ABI {}) is {} bytes, smaller than ABI {}.0's {}: set "
        "struct_size = sizeof(slime_generate_plugin)",
        file, AbiString(version), exported->struct_size, SLIME_GENERATE_ABI_VERSION_MAJOR,
        kMinTableSize));
  }
  // Only the fields both sides know: a newer minor's extra fields are left unread.
  slime_generate_plugin table{};
  std::memcpy(&table, exported, std::min<size_t>(exported->struct_size, sizeof(table)));
  const std::string name = table.name != nullptr ? table.name : "";
  const std::string plugin_version = table.version != nullptr ? table.version : "";
  std::string who = fmt::format("generate plugin '{}'", name.empty() ? "(unnamed)" : name);
  if (!plugin_version.empty()) who += " " + plugin_version;
  who += fmt::format(" ({})", file);
  if (table.generate == nullptr) {
    return absl::FailedPreconditionError(
        fmt::format("{}: its table has no generate function", who));
  }

  void* state = nullptr;
  if (table.init != nullptr) {
    char err[kErrLen];
    err[0] = '\0';
    const int rc =
        table.init(SLIME_GENERATE_ABI_VERSION, config.c_str(), config.size(), &state, err, kErrLen);
    err[kErrLen - 1] = '\0';
    if (rc != SLIME_GENERATE_OK) {
      return absl::InvalidArgumentError(
          fmt::format("{}: init returned {}: {}", who, rc, err[0] != '\0' ? err : "(no message)"));
    }
  }
  return std::unique_ptr<rollout::CustomGenerator>(
      new PluginGenerator(std::move(who), std::move(library), table, state));
}

}  // namespace slime::plugin
