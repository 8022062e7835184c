/* The C ABI of a custom generate plugin (rollout.custom_generate: a plugin path), version 1.0.
 *
 * A generate plugin replaces the rollout's single /generate call for a sample with user code
 * (slime's --custom-generate-function-path): multi-pass answers, tool calls the plugin runs
 * itself, several segments per sample. It is a shared library, built by any compiler (C, or C++
 * with extern "C"), that includes this header and exports ONE symbol:
 *
 *   const slime_generate_plugin* slime_generate_plugin_entry(void);
 *
 * returning a pointer to a static table (below) that lives as long as the library is loaded.
 * Export it with SLIME_GENERATE_PLUGIN_EXPORT (needed under -fvisibility=hidden). The host
 * (slime-cpp, plugin/plugin_generator.h) loads the library with dlopen(RTLD_NOW | RTLD_LOCAL),
 * calls the entry once and reads `abi_version`, the table's first field, BEFORE anything else
 * in it. Life of a plugin:
 *
 *   entry()                 once; the table is checked (version, size, required functions)
 *   init(config) → state    once, with rollout.custom_generate's config as a JSON string
 *   generate(state, ...)    once per sample, from several threads at once (see Threads)
 *   destroy(state)          once, after every generate call has returned; then dlclose
 *
 * Versioning (semantic). SLIME_GENERATE_ABI_VERSION = major << 16 | minor.
 *   - Major: any incompatible change (a field removed, reordered or retyped, a meaning
 *     changed). The host refuses a plugin whose major differs from its own, naming both
 *     versions; nothing but `abi_version` is read from such a table.
 *   - Minor: compatible growth only: new fields appended at the END of a struct, new status
 *     codes the other side may ignore. Every struct that crosses the ABI carries its size
 *     (`struct_size`, set by whoever fills it):
 *       * the plugin's table: the host reads only the first min(struct_size, host's sizeof)
 *         bytes and treats missing trailing fields as NULL/0; a table smaller than version 1.0's
 *         is refused;
 *       * host structs (input, engine, turn, builder): a plugin built against a newer minor
 *         must check `struct_size > offsetof(T, new_field)` before using a field it added; a
 *         plugin built against an older minor simply never sees the new fields.
 *     A plugin built for minor m runs on any host of the same major (a newer host fills
 *     everything the plugin knows; an older one is detected by struct_size).
 *
 * Strings. Bulk text and JSON cross as pointer + length and are also NUL-terminated; short
 * identifiers (name, version, finish_reason, weight_version) are NUL-terminated only. All are
 * UTF-8. What the host passes in is valid only during the call it is passed to (engine turns:
 * see slime_generate_engine). What the plugin passes to host callbacks is copied before they
 * return. A NULL pointer with length 0 is an empty string/array everywhere.
 *
 * Errors. Functions return 0 (SLIME_GENERATE_OK) or non-zero; on non-zero they write a
 * NUL-terminated message of at most err_len bytes (err_len >= 1024) into err. Nothing may
 * unwind across this ABI: a C++ plugin catches every exception in its entry points (the host's
 * callbacks never throw). A plugin error fails the sample's rollout with a message naming the
 * plugin and the sample. Write diagnostics to stderr.
 *
 * Threads. generate is called concurrently for different samples with the same state, so state
 * must be read-only after init or locked by the plugin. The engine and builder handles passed to
 * one generate call belong to that call: use them from its thread only, never after it returns.
 * init and destroy never run concurrently with anything else of the plugin. generate may block
 * (engine calls do); it should return promptly once engine->aborting() is true.
 *
 * What generate produces: one or more segments (samples that replace the input sample in its
 * group, sharing its rollout id, group and prompt; the coordinator numbers segments after the
 * first). A segment starts as the sample's prompt (or the prompt ids given to begin_segment)
 * and grows by spans: model output (trainable = 1: loss mask 1, with the engine's log-probs)
 * or injected tokens (trainable = 0: instructions, tool output; loss mask 0, log-probs 0). Each
 * segment needs a status; a reward is optional but, if set, must be set on every segment (then
 * the reward model is skipped for them).
 */
#ifndef SLIME_PLUGIN_GENERATE_PLUGIN_H_
#define SLIME_PLUGIN_GENERATE_PLUGIN_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SLIME_GENERATE_ABI_VERSION_MAJOR 1
#define SLIME_GENERATE_ABI_VERSION_MINOR 0
#define SLIME_GENERATE_ABI_VERSION \
  ((uint32_t)((SLIME_GENERATE_ABI_VERSION_MAJOR << 16) | SLIME_GENERATE_ABI_VERSION_MINOR))
#define SLIME_GENERATE_ABI_MAJOR(v) ((uint32_t)(v) >> 16)
#define SLIME_GENERATE_ABI_MINOR(v) ((uint32_t)(v)&0xffffu)

/* The one exported symbol, and the attribute that exports it. */
#define SLIME_GENERATE_PLUGIN_ENTRY_SYMBOL "slime_generate_plugin_entry"
#define SLIME_GENERATE_PLUGIN_EXPORT __attribute__((visibility("default")))

/* Smallest err_len the host passes. */
#define SLIME_GENERATE_ERR_LEN 1024

/* Return codes. */
#define SLIME_GENERATE_OK 0
#define SLIME_GENERATE_ERROR 1

/* A segment's outcome (data::SampleStatus). */
typedef enum slime_generate_status {
  SLIME_GENERATE_STATUS_COMPLETED = 1, /* the model stopped on its own ("stop") */
  SLIME_GENERATE_STATUS_TRUNCATED = 2, /* a token budget ran out ("length") */
  SLIME_GENERATE_STATUS_ABORTED = 3,   /* the rollout was cut short ("abort"): dropped */
  SLIME_GENERATE_STATUS_FAILED = 4     /* no usable response (kept, e.g. for a zero reward) */
} slime_generate_status;

/* The sample to generate (read-only, valid during generate). */
typedef struct slime_generate_input {
  uint32_t struct_size;
  const int32_t* prompt_ids; /* [prompt_len] the prompt's token ids */
  size_t prompt_len;
  const char* prompt_text; /* the text the prompt ids encode (chat template applied) */
  size_t prompt_text_len;
  const char* label; /* the reference answer ("" when none) */
  size_t label_len;
  const char* metadata_json; /* the sample's metadata, a JSON object */
  size_t metadata_json_len;
  int64_t sample_index; /* unique across the run */
  int64_t group_index;  /* the prompt group (n samples share it) */
  /* The rollout's sampling params in SGLang's names, a JSON object: temperature, top_p,
   * top_k, skip_special_tokens, and when set max_new_tokens, max_context_len,
   * min_new_tokens, stop, stop_token_ids. engine->generate applies them already. */
  const char* sampling_params_json;
  size_t sampling_params_json_len;
  const char* request_id; /* a request-id prefix unique to this sample (NUL-terminated) */
} slime_generate_input;

/* One engine answer. Memory is the host's: valid until the next generate or release_turn on
 * the same engine handle, or until the plugin's generate returns, whichever comes first. */
typedef struct slime_generate_turn {
  uint32_t struct_size;
  const int32_t* output_ids; /* [output_len] */
  size_t output_len;
  const float* log_probs; /* [output_len] log_softmax(logits / temperature) of each id */
  const char* text;       /* the engine's decoded text of output_ids */
  size_t text_len;
  const char* finish_reason;  /* "stop", "length" or "abort" */
  const char* weight_version; /* the engine's weight version ("" when unknown) */
} slime_generate_turn;

/* Token-in/token-out access to the engine the host picked for this sample's group. */
typedef struct slime_generate_engine {
  uint32_t struct_size;
  void* ctx; /* pass as the first argument of every function below */
  /* POST /generate {input_ids, sampling_params, return_logprob}: the rollout's sampling params
   * with `overrides_json` (a JSON object, e.g. {"max_new_tokens": 64}; NULL or "" for none)
   * merged over them. Fills *turn and returns 0, or returns non-zero with a message (the
   * engine failed, the overrides are not a JSON object). Once the rollout is aborting it
   * returns 0 at once with an empty turn whose finish_reason is "abort"; a call in flight then
   * comes back with finish_reason "abort" and the output made so far. */
  int (*generate)(void* ctx, const int32_t* input_ids, size_t input_len,
                  const char* overrides_json, size_t overrides_json_len,
                  slime_generate_turn* turn, char* err, size_t err_len);
  /* Frees the last turn's memory early (optional to call). */
  void (*release_turn)(void* ctx);
  /* Non-zero once the rollout is being cut short: finish up, status ABORTED. */
  int (*aborting)(void* ctx);
} slime_generate_engine;

/* Builds the output segments. Every function returns 0, or non-zero when the call is invalid
 * (the message is kept by the host and fails the sample even if generate then returns 0; a
 * plugin should return SLIME_GENERATE_ERROR at once). Calls other than begin_segment act on
 * the current segment; the first such call before any begin_segment begins segment 0 with
 * the sample's prompt. */
typedef struct slime_generate_output {
  uint32_t struct_size;
  void* ctx; /* pass as the first argument of every function below */
  /* Begins a new segment whose prompt is `prompt_ids` (NULL: the sample's prompt ids). */
  int (*begin_segment)(void* ctx, const int32_t* prompt_ids, size_t prompt_len);
  /* Appends ids to the current segment's response. trainable != 0: model output, loss mask 1,
   * log_probs has n_log_probs == n_ids entries (or NULL/0 when the rollout records none; a
   * segment must not mix the two). trainable == 0: loss mask 0, log_probs must be NULL/0.
   * `text` is appended to the response text; `weight_version` (NULL or "" for none) is
   * recorded for a trainable span. */
  int (*append_span)(void* ctx, const int32_t* ids, size_t n_ids, const float* log_probs,
                     size_t n_log_probs, int trainable, const char* text, size_t text_len,
                     const char* weight_version);
  /* Sets the current segment's reward; raw_reward_json is the full result as JSON (NULL: the
   * number itself). */
  int (*set_reward)(void* ctx, double reward, const char* raw_reward_json,
                    size_t raw_reward_json_len);
  /* Sets the current segment's status (slime_generate_status). Required for every segment. */
  int (*set_status)(void* ctx, int status);
  /* Merges a JSON object into the current segment's metadata (top-level keys replace). */
  int (*set_metadata)(void* ctx, const char* metadata_json, size_t metadata_json_len);
} slime_generate_output;

/* The plugin's table, returned by slime_generate_plugin_entry. Version 1.0's fields; later
 * minor versions append after `generate`. */
typedef struct slime_generate_plugin {
  uint32_t abi_version; /* SLIME_GENERATE_ABI_VERSION: MUST stay the first field */
  uint32_t struct_size; /* sizeof(slime_generate_plugin) as the plugin was built */
  const char* name;     /* e.g. "self_check" (logs and errors) */
  const char* version;  /* the plugin's own version, e.g. "1.0.0" */
  /* Parses `config_json` (a JSON value, "null" when none was configured) and stores the
   * plugin's state in *state (may be NULL). host_abi_version is the host's
   * SLIME_GENERATE_ABI_VERSION. Optional (NULL: state is NULL). */
  int (*init)(uint32_t host_abi_version, const char* config_json, size_t config_json_len,
              void** state, char* err, size_t err_len);
  /* Frees the state. Optional. */
  void (*destroy)(void* state);
  /* Generates one sample into `output`. Required. */
  int (*generate)(void* state, const slime_generate_input* input,
                  const slime_generate_engine* engine, const slime_generate_output* output,
                  char* err, size_t err_len);
} slime_generate_plugin;

typedef const slime_generate_plugin* (*slime_generate_plugin_entry_fn)(void);

#ifdef __cplusplus
}
#endif

#endif /* SLIME_PLUGIN_GENERATE_PLUGIN_H_ */
