// self_check: an example generate plugin (include/slime/plugin/generate_plugin.h) that answers,
// then checks its answer, in one trained response:
//
//   prompt ─▶ answer (model, trained) ─▶ verify instruction (injected, not trained)
//          ─▶ verification (model, trained)
//
// The model learns to answer and to review its answer; the reward function sees the whole
// response text (e.g. a boxed answer the verification may correct). The verification
// instruction is given as token ids so the plugin needs no tokenizer: tokenize it once with the
// model's tokenizer (slime_train's tokenizer, or HF's) and put the ids in the config.
//
// Config (rollout.custom_generate's config, a JSON object):
//   verify_ids             [int, ...]  required, non-empty: the instruction's token ids
//   verify_text            string      its text, appended to the response text ("" default)
//   answer_max_new_tokens  int         budget of the answer (default: the rollout's)
//   verify_max_new_tokens  int         budget of the verification (default: the rollout's)
//
// Outcome: one segment. An answer that ends on "length" or "abort" is not verified (status
// truncated / aborted); otherwise the status follows the verification's finish reason. The
// segment's metadata gets {"self_check": {"answer_tokens": a, "verify_tokens": v}}. No reward
// is set: the configured reward model scores the sample.
//
// Threads: the state is read-only after init, so concurrent generate calls need no lock.
// Exceptions never leave an entry point (each body is wrapped in try/catch).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "slime/plugin/generate_plugin.h"

namespace {

struct Config {
  std::vector<int32_t> verify_ids;
  std::string verify_text;
  int answer_max_new_tokens = 0;  // 0: the rollout's
  int verify_max_new_tokens = 0;
};

void SetErr(char* err, size_t err_len, const std::string& message) {
  std::snprintf(err, err_len, "%s", message.c_str());
}

int Init(uint32_t host_abi_version, const char* config_json, size_t config_json_len, void** state,
         char* err, size_t err_len) {
  (void)host_abi_version;  // 1.0 uses no field a newer minor added
  try {
    const nlohmann::json c = nlohmann::json::parse(std::string(config_json, config_json_len));
    if (!c.is_object()) {
      SetErr(err, err_len,
             "config must be a JSON object with verify_ids (e.g. {\"verify_ids\": [12, 34]})");
      return SLIME_GENERATE_ERROR;
    }
    auto config = std::make_unique<Config>();
    const auto ids = c.find("verify_ids");
    if (ids == c.end() || !ids->is_array() || ids->empty()) {
      SetErr(err, err_len,
             "config.verify_ids is missing or empty: give the verification instruction's token "
             "ids, e.g. {\"verify_ids\": [12, 34]}");
      return SLIME_GENERATE_ERROR;
    }
    for (const auto& id : *ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0) {
        SetErr(err, err_len, "config.verify_ids must hold non-negative integers, got " + id.dump());
        return SLIME_GENERATE_ERROR;
      }
      config->verify_ids.push_back(id.get<int32_t>());
    }
    config->verify_text = c.value("verify_text", std::string());
    config->answer_max_new_tokens = c.value("answer_max_new_tokens", 0);
    config->verify_max_new_tokens = c.value("verify_max_new_tokens", 0);
    if (config->answer_max_new_tokens < 0 || config->verify_max_new_tokens < 0) {
      SetErr(err, err_len, "config.answer_max_new_tokens / verify_max_new_tokens must be >= 0");
      return SLIME_GENERATE_ERROR;
    }
    *state = config.release();
    return SLIME_GENERATE_OK;
  } catch (const std::exception& e) {
    SetErr(err, err_len, std::string("bad config: ") + e.what());
    return SLIME_GENERATE_ERROR;
  }
}

void Destroy(void* state) { delete static_cast<Config*>(state); }

std::string Overrides(int max_new_tokens) {
  return max_new_tokens > 0 ? nlohmann::json{{"max_new_tokens", max_new_tokens}}.dump() : "";
}

int StatusOf(const char* finish_reason) {
  if (std::strcmp(finish_reason, "stop") == 0) return SLIME_GENERATE_STATUS_COMPLETED;
  if (std::strcmp(finish_reason, "length") == 0) return SLIME_GENERATE_STATUS_TRUNCATED;
  return SLIME_GENERATE_STATUS_ABORTED;
}

// Appends one engine turn as a trained span. Returns false when the host refused it.
bool AppendTurn(const slime_generate_output* out, const slime_generate_turn& t) {
  return out->append_span(out->ctx, t.output_ids, t.output_len, t.log_probs, t.output_len, 1,
                          t.text, t.text_len, t.weight_version) == SLIME_GENERATE_OK;
}

int Generate(void* state, const slime_generate_input* in, const slime_generate_engine* engine,
             const slime_generate_output* out, char* err, size_t err_len) {
  try {
    const Config& config = *static_cast<const Config*>(state);
    auto refused = [&](const char* what) {
      SetErr(err, err_len, std::string("the host refused ") + what);
      return SLIME_GENERATE_ERROR;
    };
    if (engine->aborting(engine->ctx)) {
      return out->set_status(out->ctx, SLIME_GENERATE_STATUS_ABORTED) == 0 ? SLIME_GENERATE_OK
                                                                           : refused("set_status");
    }
    // The context cap, when the rollout has one: no verification turn without room for it.
    const nlohmann::json sampling =
        nlohmann::json::parse(std::string(in->sampling_params_json, in->sampling_params_json_len));
    const int64_t max_context = sampling.value("max_context_len", int64_t{0});

    // Pass 1: the answer.
    std::vector<int32_t> context(in->prompt_ids, in->prompt_ids + in->prompt_len);
    std::string overrides = Overrides(config.answer_max_new_tokens);
    slime_generate_turn turn{};
    if (engine->generate(engine->ctx, context.data(), context.size(), overrides.data(),
                         overrides.size(), &turn, err, err_len) != SLIME_GENERATE_OK) {
      return SLIME_GENERATE_ERROR;  // err holds the engine's message
    }
    if (!AppendTurn(out, turn)) return refused("the answer span");
    const size_t answer_tokens = turn.output_len;
    context.insert(context.end(), turn.output_ids, turn.output_ids + turn.output_len);
    int status = StatusOf(turn.finish_reason);
    size_t verify_tokens = 0;
    const bool room = max_context <= 0 ||
                      static_cast<int64_t>(context.size() + config.verify_ids.size()) < max_context;
    if (status == SLIME_GENERATE_STATUS_COMPLETED && !room)
      status = SLIME_GENERATE_STATUS_TRUNCATED;

    if (status == SLIME_GENERATE_STATUS_COMPLETED) {
      // The instruction: injected, not trained.
      if (out->append_span(out->ctx, config.verify_ids.data(), config.verify_ids.size(), nullptr, 0,
                           0, config.verify_text.data(), config.verify_text.size(),
                           nullptr) != SLIME_GENERATE_OK) {
        return refused("the verification instruction span");
      }
      context.insert(context.end(), config.verify_ids.begin(), config.verify_ids.end());
      // Pass 2: the verification.
      overrides = Overrides(config.verify_max_new_tokens);
      if (engine->generate(engine->ctx, context.data(), context.size(), overrides.data(),
                           overrides.size(), &turn, err, err_len) != SLIME_GENERATE_OK) {
        return SLIME_GENERATE_ERROR;
      }
      if (!AppendTurn(out, turn)) return refused("the verification span");
      verify_tokens = turn.output_len;
      status = StatusOf(turn.finish_reason);
    }
    const std::string metadata =
        nlohmann::json{
            {"self_check", {{"answer_tokens", answer_tokens}, {"verify_tokens", verify_tokens}}}}
            .dump();
    if (out->set_metadata(out->ctx, metadata.data(), metadata.size()) != SLIME_GENERATE_OK) {
      return refused("set_metadata");
    }
    if (out->set_status(out->ctx, status) != SLIME_GENERATE_OK) return refused("set_status");
    return SLIME_GENERATE_OK;
  } catch (const std::exception& e) {
    SetErr(err, err_len, std::string("self_check: ") + e.what());
    return SLIME_GENERATE_ERROR;
  }
}

const slime_generate_plugin kPlugin = {
    SLIME_GENERATE_ABI_VERSION,
    sizeof(slime_generate_plugin),
    "self_check",
    "1.0.0",
    &Init,
    &Destroy,
    &Generate,
};

}  // namespace

extern "C" SLIME_GENERATE_PLUGIN_EXPORT const slime_generate_plugin* slime_generate_plugin_entry(
    void) {
  return &kPlugin;
}
