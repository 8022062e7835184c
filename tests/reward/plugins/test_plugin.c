/* Reward plugins for tests/reward/plugin_test.cc, one source built several ways:
 *   (default)             a good plugin: reward = response length + 100 if rm_type is "custom"
 *                         + 1000 if the metadata mentions "bonus"; "error..." responses fail;
 *                         the batch entry gives 10 * n + i to sample i of a group of n
 *   TEST_PLUGIN_FAULTS    also segfaults on a response containing "segv", aborts on "abort"
 *                         and never returns on "hang"
 *   TEST_PLUGIN_NO_SCORE  exports the version but not slime_reward_v1
 *   TEST_PLUGIN_VERSION   reports this ABI version instead of SLIME_REWARD_ABI_VERSION
 *   TEST_PLUGIN_INIT_FAIL slime_reward_init fails
 *   TEST_PLUGIN_NO_BATCH  no slime_reward_batch_v1 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "slime/reward/plugin_abi.h"

SLIME_REWARD_EXPORT int slime_reward_abi_version(void) {
#ifdef TEST_PLUGIN_VERSION
  return TEST_PLUGIN_VERSION;
#else
  return SLIME_REWARD_ABI_VERSION;
#endif
}

SLIME_REWARD_EXPORT int slime_reward_init(char* err, size_t err_len) {
#ifdef TEST_PLUGIN_INIT_FAIL
  snprintf(err, err_len, "model file weights.bin not found");
  return 2;
#else
  (void)err;
  (void)err_len;
  return 0;
#endif
}

#ifndef TEST_PLUGIN_NO_SCORE
SLIME_REWARD_EXPORT int slime_reward_v1(const slime_reward_input* in, double* out_reward, char* err,
                                        size_t err_len) {
#ifdef TEST_PLUGIN_FAULTS
  if (strstr(in->response, "segv") != NULL) {
    volatile int* p = NULL;
    *p = 1;
  }
  if (strstr(in->response, "abort") != NULL) abort();
  if (strstr(in->response, "hang") != NULL) {
    for (;;) pause();
  }
#endif
  if (strncmp(in->response, "error", 5) == 0) {
    snprintf(err, err_len, "refusing response \"%s\"", in->response);
    return 3;
  }
  double reward = (double)in->response_len;
  if (strcmp(in->rm_type, "custom") == 0) reward += 100;
  if (strstr(in->metadata_json, "bonus") != NULL) reward += 1000;
  *out_reward = reward;
  return 0;
}
#endif

#if !defined(TEST_PLUGIN_NO_SCORE) && !defined(TEST_PLUGIN_NO_BATCH)
SLIME_REWARD_EXPORT int slime_reward_batch_v1(const slime_reward_input* inputs, size_t n,
                                              double* out_rewards, char* err, size_t err_len) {
  for (size_t i = 0; i < n; ++i) {
#ifdef TEST_PLUGIN_FAULTS
    if (strstr(inputs[i].response, "hang") != NULL) {
      for (;;) pause();
    }
#endif
    if (strncmp(inputs[i].response, "error", 5) == 0) {
      snprintf(err, err_len, "group member %zu refused", i);
      return 4;
    }
    out_rewards[i] = 10.0 * (double)n + (double)i;
  }
  return 0;
}
#endif
