/* Generate plugins for tests/plugin/plugin_generator_test.cc, one C99 source built several
 * ways (it also proves generate_plugin.h compiles as C):
 *   (default)                  a good plugin; what generate does is picked by the sample's
 *                              metadata "mode" (see Generate below); init refuses a config
 *                              that mentions "refuse"
 *   TEST_PLUGIN_MAJOR=n        reports ABI major n (a plugin from another ABI generation)
 *   TEST_PLUGIN_NEWER_MINOR    reports minor + 1 with a larger table (a newer compatible plugin)
 *   TEST_PLUGIN_SMALL_TABLE    struct_size smaller than ABI 1.0's table
 *   TEST_PLUGIN_NO_ENTRY       exports no entry symbol
 *   TEST_PLUGIN_INIT_FAIL      init always fails */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "slime/plugin/generate_plugin.h"

/* The plugin state: init allocates it, generate checks it is the one init made. */
typedef struct state {
  int magic;
} state;

static int Init(uint32_t host_abi_version, const char* config_json, size_t config_json_len,
                void** out_state, char* err, size_t err_len) {
  (void)config_json_len;
#ifdef TEST_PLUGIN_INIT_FAIL
  (void)host_abi_version;
  (void)config_json;
  (void)out_state;
  snprintf(err, err_len, "model file policy.bin not found");
  return 3;
#else
  if (host_abi_version != SLIME_GENERATE_ABI_VERSION) {
    snprintf(err, err_len, "unexpected host ABI %u", (unsigned)host_abi_version);
    return 1;
  }
  if (strstr(config_json, "refuse") != NULL) {
    snprintf(err, err_len, "config %s refused", config_json);
    return 2;
  }
  state* s = (state*)malloc(sizeof(state));
  s->magic = 42;
  *out_state = s;
  return 0;
#endif
}

static void Destroy(void* s) { free(s); }

static int Has(const slime_generate_input* in, const char* mode) {
  char key[64];
  snprintf(key, sizeof key, "\"mode\":\"%s\"", mode);
  return strstr(in->metadata_json, key) != NULL;
}

/* Modes (metadata {"mode": ...}):
 *   two_turns   engine(prompt) → trainable span; injected ids [7, 8] (not trained, text
 *               "<v>"); engine(prompt + answer + [7, 8], {"max_new_tokens": 2}) → trainable;
 *               status from the last finish reason; metadata {"turns": 2}
 *   segments    two segments: segment 0 = one engine turn, reward 1 with raw {"acc": true};
 *               segment 1 (prompt = the first turn's context) = one more turn, reward 0.5;
 *               statuses completed, truncated
 *   rewards_partial  two segments, a reward only on the first
 *   bad_logprobs     a span of 3 ids with 2 log-probs
 *   no_status        a span but no status
 *   bad_status       set_status(9)
 *   error            returns an error after one engine call
 *   engine_error     engine->generate with overrides "[1]" (not an object), passes its error on
 *   chain            engine(prompt), then engine(the first turn's output ids, read from the
 *                    turn itself) → one trainable span of the second turn; status completed
 *   aborting         reports engine->aborting() into metadata and stops: status aborted
 *   nothing          returns 0 without touching the output */
static int Generate(void* st, const slime_generate_input* in, const slime_generate_engine* engine,
                    const slime_generate_output* out, char* err, size_t err_len) {
  if (st == NULL || ((state*)st)->magic != 42) {
    snprintf(err, err_len, "bad state");
    return 1;
  }
  slime_generate_turn turn;
  memset(&turn, 0, sizeof turn);
  if (Has(in, "two_turns")) {
    if (engine->generate(engine->ctx, in->prompt_ids, in->prompt_len, NULL, 0, &turn, err,
                         err_len) != 0) {
      return 1;
    }
    if (out->append_span(out->ctx, turn.output_ids, turn.output_len, turn.log_probs,
                         turn.output_len, 1, turn.text, turn.text_len, turn.weight_version) != 0) {
      return 1;
    }
    size_t n = in->prompt_len + turn.output_len + 2;
    int32_t* context = (int32_t*)malloc(n * sizeof(int32_t));
    memcpy(context, in->prompt_ids, in->prompt_len * sizeof(int32_t));
    memcpy(context + in->prompt_len, turn.output_ids, turn.output_len * sizeof(int32_t));
    const int32_t injected[2] = {7, 8};
    context[n - 2] = 7;
    context[n - 1] = 8;
    if (out->append_span(out->ctx, injected, 2, NULL, 0, 0, "<v>", 3, NULL) != 0) {
      free(context);
      return 1;
    }
    const char* overrides = "{\"max_new_tokens\": 2}";
    int rc = engine->generate(engine->ctx, context, n, overrides, strlen(overrides), &turn, err,
                              err_len);
    free(context);
    if (rc != 0) return 1;
    if (out->append_span(out->ctx, turn.output_ids, turn.output_len, turn.log_probs,
                         turn.output_len, 1, turn.text, turn.text_len, turn.weight_version) != 0) {
      return 1;
    }
    int status = strcmp(turn.finish_reason, "stop") == 0 ? SLIME_GENERATE_STATUS_COMPLETED
                                                         : SLIME_GENERATE_STATUS_TRUNCATED;
    out->set_metadata(out->ctx, "{\"turns\": 2}", 12);
    return out->set_status(out->ctx, status);
  }
  if (Has(in, "segments") || Has(in, "rewards_partial")) {
    if (engine->generate(engine->ctx, in->prompt_ids, in->prompt_len, NULL, 0, &turn, err,
                         err_len) != 0) {
      return 1;
    }
    out->append_span(out->ctx, turn.output_ids, turn.output_len, turn.log_probs, turn.output_len, 1,
                     turn.text, turn.text_len, turn.weight_version);
    out->set_reward(out->ctx, 1.0, "{\"acc\": true}", 13);
    out->set_status(out->ctx, SLIME_GENERATE_STATUS_COMPLETED);
    size_t n = in->prompt_len + turn.output_len;
    int32_t* context = (int32_t*)malloc(n * sizeof(int32_t));
    memcpy(context, in->prompt_ids, in->prompt_len * sizeof(int32_t));
    memcpy(context + in->prompt_len, turn.output_ids, turn.output_len * sizeof(int32_t));
    engine->release_turn(engine->ctx);
    out->begin_segment(out->ctx, context, n);
    int rc = engine->generate(engine->ctx, context, n, NULL, 0, &turn, err, err_len);
    free(context);
    if (rc != 0) return 1;
    out->append_span(out->ctx, turn.output_ids, turn.output_len, turn.log_probs, turn.output_len, 1,
                     turn.text, turn.text_len, turn.weight_version);
    if (Has(in, "segments")) out->set_reward(out->ctx, 0.5, NULL, 0);
    return out->set_status(out->ctx, SLIME_GENERATE_STATUS_TRUNCATED);
  }
  if (Has(in, "chain")) {
    if (engine->generate(engine->ctx, in->prompt_ids, in->prompt_len, NULL, 0, &turn, err,
                         err_len) != 0 ||
        engine->generate(engine->ctx, turn.output_ids, turn.output_len, NULL, 0, &turn, err,
                         err_len) != 0) {
      return 1;
    }
    if (out->append_span(out->ctx, turn.output_ids, turn.output_len, turn.log_probs,
                         turn.output_len, 1, turn.text, turn.text_len, turn.weight_version) != 0) {
      return 1;
    }
    return out->set_status(out->ctx, SLIME_GENERATE_STATUS_COMPLETED);
  }
  if (Has(in, "bad_logprobs")) {
    const int32_t ids[3] = {1, 2, 3};
    const float lps[2] = {-0.5f, -0.25f};
    if (out->append_span(out->ctx, ids, 3, lps, 2, 1, "abc", 3, "") != 0) {
      snprintf(err, err_len, "append_span refused");
      return 1;
    }
    return out->set_status(out->ctx, SLIME_GENERATE_STATUS_COMPLETED);
  }
  if (Has(in, "no_status")) {
    const int32_t ids[1] = {5};
    return out->append_span(out->ctx, ids, 1, NULL, 0, 1, "x", 1, NULL);
  }
  if (Has(in, "bad_status")) {
    out->set_status(out->ctx, 9);
    return 0;
  }
  if (Has(in, "error")) {
    engine->generate(engine->ctx, in->prompt_ids, in->prompt_len, NULL, 0, &turn, err, err_len);
    snprintf(err, err_len, "the judge service is down");
    return 5;
  }
  if (Has(in, "engine_error")) {
    return engine->generate(engine->ctx, in->prompt_ids, in->prompt_len, "[1]", 3, &turn, err,
                            err_len) == 0
               ? 0
               : 1;
  }
  if (Has(in, "aborting")) {
    char meta[64];
    snprintf(meta, sizeof meta, "{\"aborting\": %d}", engine->aborting(engine->ctx));
    out->set_metadata(out->ctx, meta, strlen(meta));
    return out->set_status(out->ctx, SLIME_GENERATE_STATUS_ABORTED);
  }
  if (Has(in, "nothing")) return 0;
  snprintf(err, err_len, "unknown mode in metadata %s", in->metadata_json);
  return 1;
}

#ifndef TEST_PLUGIN_NO_ENTRY

#ifdef TEST_PLUGIN_NEWER_MINOR
/* A table from a future 1.x: one more field after generate. */
typedef struct newer_table {
  slime_generate_plugin base;
  void (*future_hook)(void);
} newer_table;
static void FutureHook(void) {}
static const newer_table kNewer = {
    {SLIME_GENERATE_ABI_VERSION + 1, sizeof(newer_table), "newer", "2.0", Init, Destroy, Generate},
    FutureHook};
#endif

static const slime_generate_plugin kPlugin = {
#if defined(TEST_PLUGIN_MAJOR)
    (uint32_t)((TEST_PLUGIN_MAJOR << 16) | 3),
#else
    SLIME_GENERATE_ABI_VERSION,
#endif
#if defined(TEST_PLUGIN_SMALL_TABLE)
    (uint32_t)offsetof(slime_generate_plugin, generate),
#else
    sizeof(slime_generate_plugin),
#endif
    "test",
    "0.1",
    Init,
    Destroy,
    Generate};

SLIME_GENERATE_PLUGIN_EXPORT const slime_generate_plugin* slime_generate_plugin_entry(void) {
#ifdef TEST_PLUGIN_NEWER_MINOR
  (void)kPlugin;
  return &kNewer.base;
#else
  return &kPlugin;
#endif
}

#else
/* A library that forgot the entry: it exports something else. */
SLIME_GENERATE_PLUGIN_EXPORT int slime_generate_plugin_v1(void) { return 0; }
static const slime_generate_plugin kUnused = {0, 0, "x", "x", Init, Destroy, Generate};
SLIME_GENERATE_PLUGIN_EXPORT const void* unused_table(void) { return &kUnused; }
#endif
