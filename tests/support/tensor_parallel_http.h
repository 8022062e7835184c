// Test helper: "a TP=2 server serves what a TP=1 server serves", over HTTP. Shared by the
// in-process engine servers of tests/engine/engine_tp_test.cc and the real `slime_train serve`
// processes of tests/app/serve_test.cc. Header-only; include only from test targets that link
// slime::http and nlohmann_json.
#ifndef SLIME_TESTS_SUPPORT_TENSOR_PARALLEL_HTTP_H_
#define SLIME_TESTS_SUPPORT_TENSOR_PARALLEL_HTTP_H_

#include <gtest/gtest.h>

#include <cstddef>

#include "nlohmann/json.hpp"
#include "slime/http/client.h"

namespace slime::testing {

// `one` talks to a server at TP=1, `two` to the same model at TP=2. Checks: /server_info of
// `two` reports tp_size 2 and num_gpus 2, /get_server_info of `one` tp_size 1; a batched greedy
// /generate of two prompts (6 new tokens each, ignore_eos, with log-probs) returns from both the
// same output ids and 6 log-probs per prompt that agree within `logprob_tol`. Failures are test
// failures; a fatal one returns early.
inline void ExpectTpTwoServesWhatOneServes(http::Client& one, http::Client& two,
                                           double logprob_tol = 2e-4) {
  using json = nlohmann::json;
  auto info = two.Get("/server_info");
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_EQ(info->status, 200) << info->body;
  EXPECT_EQ(info->Json().value("tp_size", 0), 2) << info->body;
  EXPECT_EQ(info->Json().value("num_gpus", 0), 2) << info->body;
  auto info1 = one.Get("/get_server_info");
  ASSERT_TRUE(info1.ok()) << info1.status();
  EXPECT_EQ(info1->Json().value("tp_size", 0), 1) << info1->body;

  constexpr size_t kNewTokens = 6;
  const json req = {{"input_ids", {{11, 22, 33, 44, 55, 66, 77}, {5, 4, 3}}},
                    {"sampling_params",
                     {{"max_new_tokens", kNewTokens}, {"temperature", 0}, {"ignore_eos", true}}},
                    {"return_logprob", true}};
  auto g1 = one.Post("/generate", req.dump());
  auto g2 = two.Post("/generate", req.dump());
  ASSERT_TRUE(g1.ok() && g2.ok()) << g1.status() << " / " << g2.status();
  ASSERT_EQ(g1->status, 200) << g1->body;
  ASSERT_EQ(g2->status, 200) << g2->body;
  const json j1 = g1->Json(), j2 = g2->Json();
  ASSERT_TRUE(j1.is_array() && j2.is_array() && j1.size() == 2 && j2.size() == 2)
      << j1.dump() << "\n"
      << j2.dump();
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(j1[i]["output_ids"], j2[i]["output_ids"]) << "prompt " << i;
    const json& l1 = j1[i]["meta_info"]["output_token_logprobs"];
    const json& l2 = j2[i]["meta_info"]["output_token_logprobs"];
    ASSERT_EQ(l1.size(), kNewTokens) << j1.dump();
    ASSERT_EQ(l2.size(), kNewTokens) << j2.dump();
    for (size_t t = 0; t < kNewTokens; ++t) {
      EXPECT_NEAR(l1[t][0].get<double>(), l2[t][0].get<double>(), logprob_tol)
          << "prompt " << i << ", token " << t;
    }
  }
}

}  // namespace slime::testing

#endif  // SLIME_TESTS_SUPPORT_TENSOR_PARALLEL_HTTP_H_
