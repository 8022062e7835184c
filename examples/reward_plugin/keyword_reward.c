/* Example reward plugin (docs/rewards.md): rewards a response whose final answer line contains
 * the label, with a penalty for long responses.
 *
 *   reward = 1 if the last non-empty line after "</think>" contains the label (ASCII case is
 *            ignored), else 0; minus 0.5 when metadata has "max_chars": N and the response is
 *            longer than N characters.
 *
 * Environment: KEYWORD_REWARD_MISS (a number, default 0) replaces the 0 of a miss; read once in
 * slime_reward_init, which rejects a value that is not a number.
 *
 * The metadata lookup is a plain text search for "max_chars": (enough for an example; a real
 * plugin would use a JSON parser). Build: see CMakeLists.txt next to this file. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "slime/reward/plugin_abi.h"

static double g_miss_reward = 0.0;

SLIME_REWARD_EXPORT int slime_reward_abi_version(void) { return SLIME_REWARD_ABI_VERSION; }

SLIME_REWARD_EXPORT int slime_reward_init(char* err, size_t err_len) {
  const char* miss = getenv("KEYWORD_REWARD_MISS");
  if (miss != NULL && *miss != '\0') {
    char* end = NULL;
    g_miss_reward = strtod(miss, &end);
    if (end == miss || *end != '\0') {
      snprintf(err, err_len, "KEYWORD_REWARD_MISS=\"%s\" is not a number", miss);
      return 1;
    }
  }
  return 0;
}

/* Whether [text, text+len) contains `needle` ignoring ASCII case. */
static int ContainsNoCase(const char* text, size_t len, const char* needle, size_t needle_len) {
  if (needle_len == 0) return 1;
  for (size_t i = 0; i + needle_len <= len; ++i) {
    size_t k = 0;
    while (k < needle_len &&
           tolower((unsigned char)text[i + k]) == tolower((unsigned char)needle[k])) {
      ++k;
    }
    if (k == needle_len) return 1;
  }
  return 0;
}

SLIME_REWARD_EXPORT int slime_reward_v1(const slime_reward_input* in, double* out_reward, char* err,
                                        size_t err_len) {
  if (in->label_len == 0) {
    snprintf(err, err_len, "keyword_reward needs a label (the keyword to find)");
    return 1;
  }
  /* The answer part: after the last "</think>". */
  const char* text = in->response;
  size_t len = in->response_len;
  for (size_t i = len; i >= 8; --i) {
    if (memcmp(in->response + i - 8, "</think>", 8) == 0) {
      text = in->response + i;
      len = in->response_len - i;
      break;
    }
  }
  /* Its last non-empty line. */
  size_t end = len;
  while (end > 0 && isspace((unsigned char)text[end - 1])) --end;
  size_t start = end;
  while (start > 0 && text[start - 1] != '\n') --start;
  double reward =
      ContainsNoCase(text + start, end - start, in->label, in->label_len) ? 1.0 : g_miss_reward;

  const char* key = strstr(in->metadata_json, "\"max_chars\":");
  if (key != NULL) {
    long max_chars = strtol(key + strlen("\"max_chars\":"), NULL, 10);
    if (max_chars > 0 && in->response_len > (size_t)max_chars) reward -= 0.5;
  }
  *out_reward = reward;
  return 0;
}

SLIME_REWARD_EXPORT int slime_reward_batch_v1(const slime_reward_input* inputs, size_t n,
                                              double* out_rewards, char* err, size_t err_len) {
  for (size_t i = 0; i < n; ++i) {
    if (slime_reward_v1(&inputs[i], &out_rewards[i], err, err_len) != 0) return 1;
  }
  return 0;
}
