// TeacherClient: the teacher of on-policy distillation with algorithm.opd_type "sglang"
// (docs/algorithms.md, "On-policy distillation"). Any server speaking SGLang's /generate API
// (an SGLang server, `slime_train serve`, a router in front of either) scores the response
// tokens of each generated training sample; the rollout coordinator stores the result in
// Sample::teacher_log_probs and the trainer's OPD term reads it.
//
// One request per sample, prefill only:
//   POST <url>  {"input_ids": prompt + response,
//                "sampling_params": {"temperature": T, "max_new_tokens": 0,
//                                    "skip_special_tokens": false},
//                "return_logprob": true, "logprob_start_len": P - 1}
// T is the rollout temperature (the trainer divides the student's logits by it too). SGLang
// returns meta_info.input_token_logprobs = [[logprob | null, token_id, text | null], ...] for the
// positions from logprob_start_len on, and puts null at the first of them whatever its value, so
// the request starts one token before the response (P >= 1 always: the first response token
// needs a context): the last R triples are the log-probs of the R response tokens. The client
// checks that there are at least R of them, that each is a finite number and that their token
// ids are the response's, and fails naming the sample and the URL otherwise.
//
// Errors: a transport error (unreachable, timeout) or an HTTP 408/429/5xx answer is retried up
// to max_attempts times (min(2^k, backoff_max) plus jitter between attempts), then the call
// fails with Unavailable (or the last error's code) naming the URL, the sample and the cause;
// any other HTTP error or a malformed answer fails at once. A failure stops the rollout (a
// sample without teacher log-probs cannot be trained with OPD).
//
// Ownership: owns its connections (kept alive, one per concurrent caller). Thread-safe: the
// coordinator calls it from the callback threads of many groups at once.
#ifndef SLIME_ROLLOUT_TEACHER_H_
#define SLIME_ROLLOUT_TEACHER_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "slime/common/status.h"
#include "slime/data/sample.h"

namespace slime::rollout {

struct TeacherOptions {
  // "http://host:port" (POSTs to /generate) or "http://host:port/path" (POSTs to that path).
  std::string url;
  double temperature = 1.0;                                      // the rollout temperature; >= 0
  std::chrono::milliseconds timeout{std::chrono::seconds(120)};  // per request
  int max_attempts = 10;
  std::chrono::milliseconds backoff_initial{std::chrono::seconds(1)};
  std::chrono::milliseconds backoff_max{std::chrono::seconds(30)};
};

class TeacherClient {
 public:
  // Checks the options (URL shape, positive timeout, max_attempts >= 1); contacts nobody.
  static StatusOr<std::unique_ptr<TeacherClient>> Create(TeacherOptions options);
  ~TeacherClient();
  TeacherClient(const TeacherClient&) = delete;
  TeacherClient& operator=(const TeacherClient&) = delete;

  // The teacher's log-probs of `sample`'s response_length response tokens (empty for an empty
  // response, without a request).
  StatusOr<std::vector<float>> ResponseLogProbs(const data::Sample& sample);

  // Sets teacher_log_probs of every generated (completed or truncated) sample of `group` that
  // has none yet (not response_length of them); others are left as they are. The first failure
  // is returned (the group's remaining samples are not scored).
  Status ScoreGroup(data::SampleGroup* group);

  // The URL requests go to, as given.
  const std::string& url() const;

 private:
  struct Impl;
  explicit TeacherClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace slime::rollout

#endif  // SLIME_ROLLOUT_TEACHER_H_
