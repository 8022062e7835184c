/* The C ABI of a custom reward plugin (reward.custom_rm_path), version 1.
 *
 * A plugin is a shared library (built with any compiler; C or C++ with extern "C") that exports:
 *
 *   int slime_reward_abi_version(void);
 *       Returns SLIME_REWARD_ABI_VERSION of the header it was built against. Required.
 *
 *   int slime_reward_v1(const slime_reward_input* input, double* out_reward,
 *                       char* err, size_t err_len);
 *       Scores one sample. Returns 0 and stores the reward in *out_reward, or returns non-zero
 *       and writes a NUL-terminated message of at most err_len bytes (err_len >= 256) into err.
 *       Required.
 *
 *   int slime_reward_batch_v1(const slime_reward_input* inputs, size_t n, double* out_rewards,
 *                             char* err, size_t err_len);
 *       Scores a group of n samples at once (reward.group_rm: true). Optional; without it
 *       group_rm is refused when the plugin is loaded.
 *
 *   int slime_reward_init(char* err, size_t err_len);
 *       Called once per process after loading, before any score call (load a model, read
 *       environment variables). Returns 0, or non-zero with a message. Optional.
 *
 * Input strings are UTF-8, given as pointer + length and also NUL-terminated; they are valid
 * only during the call. metadata_json is the sample's metadata as a JSON object ("{}" when
 * none); rm_type is the type the sample asked for (metadata.rm_type, else the configured one;
 * may be empty).
 *
 * Process model (what a plugin can rely on): slime-cpp never calls a plugin in its own
 * process. Each worker process is a fork of the caller that loads the library and serves one
 * call at a time, so a plugin needs no locking and may keep global state; several worker
 * processes may run at once. A call that crashes the worker (a signal, abort, exit) or takes
 * longer than reward.plugin_timeout_s is reported as an error and the worker is replaced
 * (slime_reward_init runs again in the new one). Write diagnostics to stderr.
 */
#ifndef SLIME_REWARD_PLUGIN_ABI_H_
#define SLIME_REWARD_PLUGIN_ABI_H_

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SLIME_REWARD_ABI_VERSION 1

/* Marks the exported entry points (needed when building with -fvisibility=hidden). */
#define SLIME_REWARD_EXPORT __attribute__((visibility("default")))

typedef struct slime_reward_input {
  const char* prompt;
  size_t prompt_len;
  const char* response;
  size_t response_len;
  const char* label;
  size_t label_len;
  const char* metadata_json;
  size_t metadata_json_len;
  const char* rm_type;
  size_t rm_type_len;
} slime_reward_input;

typedef int (*slime_reward_abi_version_fn)(void);
typedef int (*slime_reward_v1_fn)(const slime_reward_input* input, double* out_reward, char* err,
                                  size_t err_len);
typedef int (*slime_reward_batch_v1_fn)(const slime_reward_input* inputs, size_t n,
                                        double* out_rewards, char* err, size_t err_len);
typedef int (*slime_reward_init_fn)(char* err, size_t err_len);

#ifdef __cplusplus
}
#endif

#endif /* SLIME_REWARD_PLUGIN_ABI_H_ */
