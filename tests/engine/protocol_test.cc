// /generate parsing, validation and response JSON (protocol.h) against SGLang's rules
// (docs/http-api.md §1). Uses the in-memory byte tokenizer: id = byte value.
#include "slime/engine/protocol.h"

#include <gtest/gtest.h>

#include <set>

#include "protocol_test_util.h"

namespace slime::engine {
namespace {

using Json = nlohmann::json;

class GenerateParseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tok_ = testing::ByteTokenizer();
    ASSERT_NE(tok_, nullptr);
    limits_.context_length = 1024;
    limits_.vocab_size = 300;
  }
  StatusOr<ParsedGenerate> Parse(std::string_view body) {
    return ParseGenerateRequest(Json::parse(body), tok_.get(), limits_, &log_);
  }
  ParsedGenerate ParseOk(std::string_view body) {
    auto p = Parse(body);
    EXPECT_TRUE(p.ok()) << body << "\n  -> " << p.status();
    return p.ok() ? std::move(p).value() : ParsedGenerate();
  }

  std::unique_ptr<tokenizer::Tokenizer> tok_;
  ProtocolLimits limits_;
  UnknownFieldLog log_;
};

bool IsHex32(const std::string& s) {
  return s.size() == 32 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

TEST_F(GenerateParseTest, SingleInputIdsGetsSGLangDefaults) {
  const ParsedGenerate p = ParseOk(R"({"input_ids": [1, 2, 3]})");
  ASSERT_EQ(p.inputs.size(), 1u);
  EXPECT_FALSE(p.is_batch);
  EXPECT_FALSE(p.stream);
  EXPECT_EQ(p.n, 1);
  const GenerateInput& in = p.inputs[0];
  EXPECT_EQ(in.input_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_TRUE(IsHex32(in.rid)) << in.rid;
  EXPECT_EQ(in.index, 0);
  EXPECT_FALSE(in.return_logprob);
  EXPECT_EQ(in.logprob_start_len, -1);
  EXPECT_EQ(in.top_logprobs_num, 0);
  const SamplingParams& sp = in.sampling;
  EXPECT_EQ(sp.max_new_tokens, std::optional<int64_t>(128));
  EXPECT_EQ(sp.temperature, 1.0);
  EXPECT_EQ(sp.top_p, 1.0);
  EXPECT_EQ(sp.top_k, -1);
  EXPECT_EQ(sp.min_p, 0.0);
  EXPECT_TRUE(sp.skip_special_tokens);
  EXPECT_TRUE(sp.spaces_between_special_tokens);
  EXPECT_FALSE(sp.no_stop_trim);
  EXPECT_FALSE(sp.sampling_seed.has_value());
}

TEST_F(GenerateParseTest, SlimeRolloutBody) {
  // Exactly what slime's default rollout sends (docs/http-api.md §1.1), with the optional extras.
  const ParsedGenerate p = ParseOk(R"({
    "input_ids": [10, 11, 12, 13],
    "sampling_params": {
      "temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 16,
      "stop": null, "stop_token_ids": null, "skip_special_tokens": false,
      "no_stop_trim": true, "spaces_between_special_tokens": false,
      "custom_params": {"return_top_p_token_ids": true}, "sampling_seed": 1234
    },
    "return_logprob": true, "return_routed_experts": false, "stream": true})");
  ASSERT_EQ(p.inputs.size(), 1u);
  EXPECT_TRUE(p.stream);
  EXPECT_FALSE(p.is_batch);
  const GenerateInput& in = p.inputs[0];
  EXPECT_TRUE(in.stream);
  EXPECT_TRUE(in.return_logprob);
  EXPECT_EQ(in.sampling.max_new_tokens, std::optional<int64_t>(16));
  EXPECT_FALSE(in.sampling.skip_special_tokens);
  EXPECT_FALSE(in.sampling.spaces_between_special_tokens);
  EXPECT_TRUE(in.sampling.no_stop_trim);
  EXPECT_TRUE(in.sampling.stop.empty());
  EXPECT_TRUE(in.sampling.stop_token_ids.empty());
  EXPECT_EQ(in.sampling.sampling_seed, std::optional<uint64_t>(1234));
  EXPECT_EQ(log_.size(), 0u) << "nothing in slime's body is unknown";
}

TEST_F(GenerateParseTest, OpdPrefillScoringBody) {
  const ParsedGenerate p = ParseOk(R"({"input_ids": [1, 2, 3, 4],
      "sampling_params": {"temperature": 0.7, "max_new_tokens": 0, "skip_special_tokens": false},
      "return_logprob": true, "logprob_start_len": 0})");
  ASSERT_EQ(p.inputs.size(), 1u);
  EXPECT_EQ(p.inputs[0].sampling.max_new_tokens, std::optional<int64_t>(0));
  EXPECT_EQ(p.inputs[0].logprob_start_len, 0);
}

TEST_F(GenerateParseTest, TextIsTokenizedWithoutSpecialTokens) {
  const ParsedGenerate p = ParseOk(R"({"text": "ab<|end|>"})");
  ASSERT_EQ(p.inputs.size(), 1u);
  EXPECT_FALSE(p.is_batch);
  // Special tokens written in the text are still matched, none is added.
  EXPECT_EQ(p.inputs[0].input_ids, (std::vector<int32_t>{'a', 'b', 256}));
}

TEST_F(GenerateParseTest, TextBatch) {
  const ParsedGenerate p = ParseOk(R"({"text": ["a", "bc"], "sampling_params": {"n": 1}})");
  ASSERT_EQ(p.inputs.size(), 2u);
  EXPECT_TRUE(p.is_batch);
  EXPECT_EQ(p.inputs[0].input_ids, (std::vector<int32_t>{'a'}));
  EXPECT_EQ(p.inputs[1].input_ids, (std::vector<int32_t>{'b', 'c'}));
  EXPECT_EQ(p.inputs[1].index, 1);
}

TEST_F(GenerateParseTest, PerItemFieldsBroadcastOrList) {
  const ParsedGenerate p = ParseOk(R"({"input_ids": [[1, 2, 3], [4, 5]],
      "return_logprob": [true, false], "logprob_start_len": [1, -1], "top_logprobs_num": 2,
      "sampling_params": [{"temperature": 0.5}, {"temperature": 0.0, "max_new_tokens": 3}]})");
  ASSERT_EQ(p.inputs.size(), 2u);
  EXPECT_TRUE(p.is_batch);
  EXPECT_TRUE(p.inputs[0].return_logprob);
  EXPECT_FALSE(p.inputs[1].return_logprob);
  EXPECT_EQ(p.inputs[0].logprob_start_len, 1);
  EXPECT_EQ(p.inputs[1].logprob_start_len, -1);
  EXPECT_EQ(p.inputs[0].top_logprobs_num, 2);
  EXPECT_EQ(p.inputs[1].top_logprobs_num, 2);
  EXPECT_EQ(p.inputs[0].sampling.temperature, 0.5);
  EXPECT_EQ(p.inputs[1].sampling.temperature, 0.0);
  EXPECT_TRUE(p.inputs[1].sampling.greedy());
  EXPECT_EQ(p.inputs[1].sampling.max_new_tokens, std::optional<int64_t>(3));
  EXPECT_EQ(p.inputs[0].sampling.max_new_tokens, std::optional<int64_t>(128));
}

TEST_F(GenerateParseTest, NExpandsPromptMajorWithDerivedRids) {
  // SGLang order: all n samples of prompt 0, then the n of prompt 1.
  const ParsedGenerate p =
      ParseOk(R"({"input_ids": [[1], [2]], "rid": "req", "sampling_params": {"n": 3}})");
  ASSERT_EQ(p.inputs.size(), 6u);
  EXPECT_EQ(p.n, 3);
  EXPECT_TRUE(p.is_batch);
  for (int k = 0; k < 6; ++k) {
    EXPECT_EQ(p.inputs[k].index, k);
    EXPECT_EQ(p.inputs[k].input_ids, (std::vector<int32_t>{k < 3 ? 1 : 2}));
    EXPECT_EQ(p.inputs[k].rid, "req_" + std::to_string(k));
  }
  const ParsedGenerate q =
      ParseOk(R"({"input_ids": [[1], [2]], "rid": ["a", "b"], "sampling_params": {"n": 2}})");
  ASSERT_EQ(q.inputs.size(), 4u);
  EXPECT_EQ(q.inputs[0].rid, "a_0");
  EXPECT_EQ(q.inputs[1].rid, "a_1");
  EXPECT_EQ(q.inputs[2].rid, "b_0");
  EXPECT_EQ(q.inputs[3].rid, "b_1");
  // Per-prompt lists apply to all samples of their prompt.
  const ParsedGenerate r = ParseOk(R"({"input_ids": [[1], [2]], "return_logprob": [true, false],
      "sampling_params": [{"n": 2, "temperature": 0.1}, {"n": 2, "temperature": 0.2}]})");
  ASSERT_EQ(r.inputs.size(), 4u);
  EXPECT_TRUE(r.inputs[1].return_logprob);
  EXPECT_FALSE(r.inputs[2].return_logprob);
  EXPECT_EQ(r.inputs[1].sampling.temperature, 0.1);
  EXPECT_EQ(r.inputs[2].sampling.temperature, 0.2);
}

TEST_F(GenerateParseTest, SinglePromptWithNBecomesABatch) {
  const ParsedGenerate p = ParseOk(R"({"text": "hi", "sampling_params": {"n": 2}})");
  ASSERT_EQ(p.inputs.size(), 2u);
  EXPECT_TRUE(p.is_batch);
  EXPECT_NE(p.inputs[0].rid, p.inputs[1].rid);
  EXPECT_TRUE(IsHex32(p.inputs[0].rid));
  const ParsedGenerate q = ParseOk(R"({"text": "hi", "rid": "x", "sampling_params": {"n": 2}})");
  EXPECT_EQ(q.inputs[0].rid, "x_0");
  EXPECT_EQ(q.inputs[1].rid, "x_1");
}

TEST_F(GenerateParseTest, RidRules) {
  EXPECT_EQ(ParseOk(R"({"input_ids": [1], "rid": "abc"})").inputs[0].rid, "abc");
  const ParsedGenerate b = ParseOk(R"({"input_ids": [[1], [2], [3]], "rid": "abc"})");
  EXPECT_EQ(b.inputs[2].rid, "abc_2");
  const ParsedGenerate l = ParseOk(R"({"input_ids": [[1], [2]], "rid": ["x", "y"]})");
  EXPECT_EQ(l.inputs[0].rid, "x");
  EXPECT_EQ(l.inputs[1].rid, "y");
  const ParsedGenerate r = ParseOk(R"({"input_ids": [[1], [2], [3]]})");
  std::set<std::string> rids;
  for (const auto& in : r.inputs) {
    EXPECT_TRUE(IsHex32(in.rid));
    rids.insert(in.rid);
  }
  EXPECT_EQ(rids.size(), 3u);
}

TEST_F(GenerateParseTest, NullMeansDefault) {
  const ParsedGenerate p = ParseOk(R"({"input_ids": [1, 2], "text": null, "rid": null,
      "return_logprob": null, "logprob_start_len": null, "top_logprobs_num": null,
      "stream": null, "input_embeds": null, "image_data": null,
      "sampling_params": {"temperature": null, "top_p": null, "top_k": null, "min_p": null,
        "frequency_penalty": null, "presence_penalty": null, "repetition_penalty": null,
        "min_new_tokens": null, "n": null, "stop": null, "stop_token_ids": null,
        "ignore_eos": null, "skip_special_tokens": null, "no_stop_trim": null,
        "spaces_between_special_tokens": null, "logit_bias": null, "sampling_seed": null,
        "custom_params": null, "json_schema": null, "regex": null}})");
  ASSERT_EQ(p.inputs.size(), 1u);
  const SamplingParams& sp = p.inputs[0].sampling;
  const SamplingParams defaults;
  EXPECT_EQ(sp.temperature, defaults.temperature);
  EXPECT_EQ(sp.top_k, defaults.top_k);
  EXPECT_EQ(sp.repetition_penalty, defaults.repetition_penalty);
  EXPECT_EQ(sp.skip_special_tokens, defaults.skip_special_tokens);
  EXPECT_EQ(sp.max_new_tokens, defaults.max_new_tokens) << "absent max_new_tokens: 128";
  EXPECT_FALSE(p.inputs[0].return_logprob);
  EXPECT_TRUE(IsHex32(p.inputs[0].rid));
  EXPECT_EQ(ParseOk(R"({"input_ids": [1], "sampling_params": null})").inputs[0].sampling.top_p,
            1.0);
}

TEST_F(GenerateParseTest, NullMaxNewTokensMeansUpToTheContext) {
  const ParsedGenerate p =
      ParseOk(R"({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": null}})");
  EXPECT_FALSE(p.inputs[0].sampling.max_new_tokens.has_value());
  limits_.context_length = 64;
  // No context check against a missing max_new_tokens, however long the prompt (< context).
  std::vector<int> ids(63, 5);
  EXPECT_TRUE(
      Parse(Json{{"input_ids", ids}, {"sampling_params", {{"max_new_tokens", nullptr}}}}.dump())
          .ok());
}

TEST_F(GenerateParseTest, StopFields) {
  const ParsedGenerate p = ParseOk(R"({"input_ids": [1], "sampling_params": {
      "stop": ["</a>", "", "</a>", "x"], "stop_token_ids": [7, null, 9, 7],
      "logit_bias": {"5": -1.5, "6": 2}, "ignore_eos": true, "min_new_tokens": 2}})");
  const SamplingParams& sp = p.inputs[0].sampling;
  EXPECT_EQ(sp.stop, (std::vector<std::string>{"</a>", "x"}));
  EXPECT_EQ(sp.stop_token_ids, (std::vector<int32_t>{7, 9}));
  EXPECT_EQ(sp.logit_bias, (std::map<int32_t, double>{{5, -1.5}, {6, 2.0}}));
  EXPECT_TRUE(sp.ignore_eos);
  EXPECT_EQ(sp.min_new_tokens, 2);
  EXPECT_EQ(
      ParseOk(R"({"input_ids": [1], "sampling_params": {"stop": "END"}})").inputs[0].sampling.stop,
      (std::vector<std::string>{"END"}));
}

TEST_F(GenerateParseTest, IntegralFloatsAreIntegers) {
  const ParsedGenerate p =
      ParseOk(R"({"input_ids": [1], "sampling_params": {"max_new_tokens": 5.0, "top_k": 20.0}})");
  EXPECT_EQ(p.inputs[0].sampling.max_new_tokens, std::optional<int64_t>(5));
  EXPECT_EQ(p.inputs[0].sampling.top_k, 20);
}

TEST_F(GenerateParseTest, UnknownFieldsAreIgnoredAndLoggedOnce) {
  const char* body = R"({"input_ids": [1], "priority_boost": 3, "bootstrap_host": null,
      "sampling_params": {"beam_width": 2, "temperature": 0.5}, "priority": 1})";
  ParseOk(body);
  ParseOk(body);
  EXPECT_EQ(log_.size(), 3u);
  EXPECT_TRUE(log_.Seen("priority_boost"));
  EXPECT_TRUE(log_.Seen("bootstrap_host"));
  EXPECT_TRUE(log_.Seen("sampling_params.beam_width"));
  EXPECT_FALSE(log_.Seen("priority")) << "known SGLang field, harmless: not reported";
  EXPECT_FALSE(log_.Report("priority_boost")) << "second report of a name";
  EXPECT_TRUE(log_.Report("new_one"));
}

TEST(UnknownFieldLogTest, BoundedSize) {
  UnknownFieldLog log;
  for (size_t i = 0; i < UnknownFieldLog::kMaxNames + 10; ++i) {
    EXPECT_EQ(log.Report("k" + std::to_string(i)), i < UnknownFieldLog::kMaxNames);
  }
  EXPECT_EQ(log.size(), UnknownFieldLog::kMaxNames);
}

TEST_F(GenerateParseTest, SupportedFeaturesSetToDefaultsAreAccepted) {
  EXPECT_TRUE(Parse(R"({"input_ids": [1], "return_routed_experts": false, "image_data": [],
                       "lora_path": null, "return_hidden_states": false})")
                  .ok());
}

struct BadCase {
  const char* body;
  const char* field;      // must appear in the message and be the recorded field
  const char* substring;  // must appear in the message too
};

TEST_F(GenerateParseTest, EveryBadInputIsA400NamingTheField) {
  const BadCase cases[] = {
      // sampling_params ranges and types
      {R"({"input_ids": [1], "sampling_params": {"temperature": -0.5}})",
       "sampling_params.temperature", "finite number >= 0"},
      {R"({"input_ids": [1], "sampling_params": {"temperature": "hot"}})",
       "sampling_params.temperature", "must be a number, got string"},
      {R"({"input_ids": [1], "sampling_params": {"temperature": true}})",
       "sampling_params.temperature", "must be a number, got boolean"},
      {R"({"input_ids": [1], "sampling_params": {"top_p": 0}})", "sampling_params.top_p", "(0, 1]"},
      {R"({"input_ids": [1], "sampling_params": {"top_p": 1.5}})", "sampling_params.top_p",
       "got 1.5"},
      {R"({"input_ids": [1], "sampling_params": {"top_k": 0}})", "sampling_params.top_k",
       "-1 (whole vocabulary) or at least 1"},
      {R"({"input_ids": [1], "sampling_params": {"top_k": -2}})", "sampling_params.top_k",
       "got -2"},
      {R"({"input_ids": [1], "sampling_params": {"top_k": 1.5}})", "sampling_params.top_k",
       "must be an integer, got 1.5"},
      {R"({"input_ids": [1], "sampling_params": {"min_p": 1.5}})", "sampling_params.min_p",
       "[0, 1]"},
      {R"({"input_ids": [1], "sampling_params": {"frequency_penalty": 2.5}})",
       "sampling_params.frequency_penalty", "[-2, 2]"},
      {R"({"input_ids": [1], "sampling_params": {"presence_penalty": -3}})",
       "sampling_params.presence_penalty", "[-2, 2]"},
      {R"({"input_ids": [1], "sampling_params": {"repetition_penalty": 0}})",
       "sampling_params.repetition_penalty", "(0, 2]"},
      {R"({"input_ids": [1], "sampling_params": {"repetition_penalty": 2.5}})",
       "sampling_params.repetition_penalty", "(0, 2]"},
      {R"({"input_ids": [1], "sampling_params": {"max_new_tokens": -1}})",
       "sampling_params.max_new_tokens", "at least 0"},
      {R"({"input_ids": [1], "sampling_params": {"max_new_tokens": "10"}})",
       "sampling_params.max_new_tokens", "must be an integer, got string"},
      {R"({"input_ids": [1], "sampling_params": {"min_new_tokens": 5, "max_new_tokens": 3}})",
       "sampling_params.min_new_tokens", "[0, 3]"},
      {R"({"input_ids": [1], "sampling_params": {"min_new_tokens": -1}})",
       "sampling_params.min_new_tokens", "at least 0"},
      {R"({"input_ids": [1], "sampling_params": {"n": 0}})", "sampling_params.n", "in [1, 1024]"},
      {R"({"input_ids": [1], "sampling_params": {"n": 1025}})", "sampling_params.n",
       "in [1, 1024]"},
      {R"({"input_ids": [1], "sampling_params": {"ignore_eos": "yes"}})",
       "sampling_params.ignore_eos", "must be true or false, got string"},
      {R"({"input_ids": [1], "sampling_params": {"stop": 5}})", "sampling_params.stop",
       "a string or a list of strings"},
      {R"({"input_ids": [1], "sampling_params": {"stop": ["a", 1]}})", "sampling_params.stop[1]",
       "must be a string, got number"},
      {R"({"input_ids": [1], "sampling_params": {"stop_token_ids": "7"}})",
       "sampling_params.stop_token_ids", "list of token ids"},
      {R"({"input_ids": [1], "sampling_params": {"stop_token_ids": [3, -1]}})",
       "sampling_params.stop_token_ids[1]", "[0, 300)"},
      {R"({"input_ids": [1], "sampling_params": {"stop_token_ids": [300]}})",
       "sampling_params.stop_token_ids[0]", "[0, 300)"},
      {R"({"input_ids": [1], "sampling_params": {"logit_bias": {"abc": 1}}})",
       "sampling_params.logit_bias", "token ids in [0, 300)"},
      {R"({"input_ids": [1], "sampling_params": {"logit_bias": {"5": "x"}}})",
       "sampling_params.logit_bias[\"5\"]", "must be a number"},
      {R"({"input_ids": [1], "sampling_params": {"logit_bias": [1]}})",
       "sampling_params.logit_bias", "must be an object"},
      {R"({"input_ids": [1], "sampling_params": {"custom_params": 3}})",
       "sampling_params.custom_params", "must be an object"},
      {R"({"input_ids": [1], "sampling_params": {"json_schema": "{}"}})",
       "sampling_params.json_schema", "not supported"},
      {R"({"input_ids": [1], "sampling_params": {"regex": "a+"}})", "sampling_params.regex",
       "not supported"},
      {R"({"input_ids": [1], "sampling_params": {"stop_regex": "a+"}})",
       "sampling_params.stop_regex", "regular expressions are not"},
      {R"({"input_ids": [1], "sampling_params": {"stream_interval": 0}})",
       "sampling_params.stream_interval", "at least 1"},
      {R"({"input_ids": [1], "sampling_params": "greedy"})", "sampling_params",
       "must be an object, got string"},
      {R"({"input_ids": [[1], [2]], "sampling_params": [{}, {}, {}]})", "sampling_params",
       "3 entries but the request has 2 prompts"},
      {R"({"input_ids": [[1], [2]], "sampling_params": [{"top_p": 0.5}, {"top_p": 7}]})",
       "sampling_params[1].top_p", "(0, 1]"},
      {R"({"input_ids": [[1], [2]], "sampling_params": [{"n": 2}, {"n": 3}]})",
       "sampling_params[1].n", "must equal sampling_params[0].n"},
      // prompts
      {R"({"input_embeds": [[0.1, 0.2]]})", "input_embeds", "not supported"},
      {R"({"sampling_params": {}})", "input_ids", "exactly one of text or input_ids"},
      {R"({"text": "a", "input_ids": [1]})", "input_ids", "not both"},
      {R"({"input_ids": []})", "input_ids", "must not be empty"},
      {R"({"input_ids": "abc"})", "input_ids", "list of token ids"},
      {R"({"input_ids": [[1], []]})", "input_ids[1]", "is empty"},
      {R"({"input_ids": [1, "a"]})", "input_ids[1]", "must be an integer token id, got string"},
      {R"({"input_ids": [1, 2.5]})", "input_ids[1]", "must be an integer token id, got 2.5"},
      {R"({"input_ids": [1, -1]})", "input_ids[1]", "must be in [0, 300)"},
      {R"({"input_ids": [[1], [2, 300]]})", "input_ids[1][1]", "= 300 is not a valid token id"},
      {R"({"input_ids": [[1], 2]})", "input_ids[1]", "must be a list of token ids, got number"},
      {R"({"text": 5})", "text", "must be a string, got number"},
      {R"({"text": []})", "text", "must not be an empty list"},
      {R"({"text": ["ok", ""]})", "text[1]", "is empty"},
      {R"({"text": ""})", "text", "is empty"},
      // logprob fields
      {R"({"input_ids": [1, 2, 3], "return_logprob": true, "logprob_start_len": 3})",
       "logprob_start_len", "must be less than the prompt length (3 tokens"},
      {R"({"input_ids": [1], "logprob_start_len": -2})", "logprob_start_len",
       "-1 (output tokens only)"},
      {R"({"input_ids": [[1], [2]], "top_logprobs_num": [0, -1]})", "top_logprobs_num[1]",
       "at least 0"},
      {R"({"input_ids": [[1], [2]], "return_logprob": [true]})", "return_logprob",
       "1 entries but the request has 2 prompts"},
      {R"({"input_ids": [1], "return_logprob": "yes"})", "return_logprob", "must be true or false"},
      {R"({"input_ids": [1], "stream": 1})", "stream", "must be true or false, got number"},
      // rids
      {R"({"input_ids": [[1], [2]], "rid": ["a", "a"]})", "rid", "\"a\" appears more than once"},
      {R"({"input_ids": [[1], [2]], "rid": ["a"]})", "rid", "1 entries but the request has 2"},
      {R"({"input_ids": [1], "rid": ""})", "rid", "must not be empty"},
      {R"({"input_ids": [1], "rid": 7})", "rid", "a string or a list of strings"},
      {R"({"input_ids": [[1], [2]], "rid": ["a", 3]})", "rid[1]", "must be a string, got number"},
      {R"({"input_ids": [[1], [2]], "rid": ["a", ""]})", "rid[1]", "non-empty string"},
      // unsupported SGLang features
      {R"({"input_ids": [1], "image_data": ["data:image/png;base64,AAAA"]})", "image_data",
       "multimodal input is not supported"},
      {R"({"input_ids": [1], "lora_path": "my-lora"})", "lora_path", "LoRA"},
      {R"({"input_ids": [1], "return_routed_experts": true})", "return_routed_experts",
       "needs a mixture-of-experts model"},  // a dense model (the default limits)
      {R"({"input_ids": [1], "routed_experts_start_len": "0"})", "routed_experts_start_len",
       "must be an integer"},
      {R"({"input_ids": [1], "token_ids_logprob": [1, 2]})", "token_ids_logprob", "not supported"},
      {R"({"input_ids": [1], "return_hidden_states": true})", "return_hidden_states",
       "not supported"},
      {R"({"input_ids": [1], "session_params": {"id": "s"}})", "session_params", "sessions"},
      {R"({"input_ids": [1], "custom_logit_processor": "xx"})", "custom_logit_processor",
       "not supported"},
  };
  for (const BadCase& c : cases) {
    auto p = Parse(c.body);
    ASSERT_FALSE(p.ok()) << "accepted: " << c.body;
    const Status& s = p.status();
    const std::string msg(s.message());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.body;
    EXPECT_EQ(HttpStatusFor(s), 400);
    EXPECT_NE(msg.find(c.field), std::string::npos) << c.body << "\n  message: " << msg;
    EXPECT_NE(msg.find(c.substring), std::string::npos) << c.body << "\n  message: " << msg;
    EXPECT_EQ(ErrorField(s), std::optional<std::string>(c.field)) << c.body << ": " << msg;
  }
}

TEST_F(GenerateParseTest, PromptAndOutputMustFitTheContext) {
  limits_.context_length = 64;
  const BadCase cases[] = {
      {R"({"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 62}})",
       "sampling_params.max_new_tokens",
       "Requested token count exceeds the model's maximum context length of 64 tokens"},
      {R"({"input_ids": [[1], [1, 2, 3]],
           "sampling_params": [{"max_new_tokens": 4}, {"max_new_tokens": 62}]})",
       "sampling_params[1].max_new_tokens", "3 tokens from the input (input_ids[1])"},
  };
  for (const BadCase& c : cases) {
    auto p = Parse(c.body);
    ASSERT_FALSE(p.ok()) << c.body;
    const std::string msg(p.status().message());
    EXPECT_EQ(HttpStatusFor(p.status()), 400);
    EXPECT_NE(msg.find(c.substring), std::string::npos) << msg;
    EXPECT_EQ(ErrorField(p.status()), std::optional<std::string>(c.field)) << msg;
  }
  EXPECT_TRUE(Parse(R"({"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 61}})").ok());
  std::vector<int> ids(64, 5);
  auto p = Parse(Json{{"input_ids", ids}}.dump());
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("longer than the model's context length (64 tokens)"),
            std::string::npos)
      << p.status();
  ids.resize(60);  // 60 + default 128 > 64
  p = Parse(Json{{"input_ids", ids}}.dump());
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("You requested a total of 188 tokens"), std::string::npos)
      << p.status();
  EXPECT_TRUE(
      Parse(Json{{"input_ids", ids}, {"sampling_params", {{"max_new_tokens", 4}}}}.dump()).ok());
}

TEST_F(GenerateParseTest, NoLimitsDisableTheChecks) {
  limits_ = ProtocolLimits{};
  EXPECT_TRUE(
      Parse(R"({"input_ids": [100000], "sampling_params": {"max_new_tokens": 1000000}})").ok());
}

TEST_F(GenerateParseTest, BodyMustBeAnObject) {
  auto p = Parse("[1, 2]");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(HttpStatusFor(p.status()), 400);
  EXPECT_NE(p.status().message().find("must be a JSON object, got array"), std::string::npos);
}

TEST_F(GenerateParseTest, WithoutTokenizerTextAndStopStringsAreRefused) {
  auto p = ParseGenerateRequest(Json::parse(R"({"text": "hi"})"), nullptr, limits_, &log_);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("send input_ids"), std::string::npos);
  p = ParseGenerateRequest(Json::parse(R"({"input_ids": [1], "sampling_params": {"stop": "x"}})"),
                           nullptr, limits_, &log_);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("sampling_params.stop needs a tokenizer"), std::string::npos);
  EXPECT_TRUE(
      ParseGenerateRequest(Json::parse(R"({"input_ids": [1]})"), nullptr, limits_, &log_).ok());
}

// --- Responses --------------------------------------------------------------------------------

GenerateInput Input(bool logprob, int64_t top = 0) {
  GenerateInput in;
  in.rid = "r1";
  in.input_ids = {'h', 'i', '!'};
  in.return_logprob = logprob;
  in.top_logprobs_num = top;
  in.index = 2;
  return in;
}

TEST(GenerateOutputJsonTest, RunningChunkHasNullFinishAndNoLatency) {
  RequestOutput out;
  out.rid = "r1";
  out.output_ids = {'o', 'k'};
  out.text = "ok";
  out.prompt_tokens = 3;
  out.weight_version = "7";
  out.weight_versions = {{"6", 0, 1}, {"7", 1, 2}};
  const Json j = GenerateOutputJson(out, Input(false), nullptr, false);
  const Json want = Json::parse(R"({"text": "ok", "output_ids": [111, 107],
      "meta_info": {"id": "r1", "finish_reason": null, "prompt_tokens": 3,
        "completion_tokens": 2, "cached_tokens": 0, "weight_version": "7",
        "weight_versions": [{"version": "6", "start": 0, "end": 1},
                            {"version": "7", "start": 1, "end": 2}],
        "num_retractions": 0}})");
  EXPECT_EQ(j, want) << j.dump();
}

TEST(GenerateOutputJsonTest, FinishReasonShapes) {
  EXPECT_EQ(FinishReasonJson(FinishReason()), Json(nullptr));
  EXPECT_EQ(FinishReasonJson(FinishReason::Stop(151645)),
            Json::parse(R"({"type": "stop", "matched": 151645})"));
  EXPECT_EQ(FinishReasonJson(FinishReason::StopString("</answer>")),
            Json::parse(R"({"type": "stop", "matched": "</answer>"})"));
  EXPECT_EQ(FinishReasonJson(FinishReason::Length(16)),
            Json::parse(R"({"type": "length", "length": 16})"));
  EXPECT_EQ(FinishReasonJson(FinishReason::Abort("Abort before prefill")),
            Json::parse(R"({"type": "abort", "message": "Abort before prefill",
                            "status_code": null, "err_type": null})"));
  EXPECT_EQ(FinishReasonJson(FinishReason::Abort("too long", 400)),
            Json::parse(R"({"type": "abort", "message": "too long", "status_code": 400,
                            "err_type": null})"));
}

TEST(GenerateOutputJsonTest, FinishedWithLogprobsGolden) {
  auto tok = testing::ByteTokenizer();
  RequestOutput out;
  out.rid = "r1";
  out.output_ids = {'o', 256};
  out.text = "o";
  out.output_logprobs = {-0.5f, -0.25f};
  out.input_logprob_ids = {'h', 'i', '!'};
  out.input_logprobs = {std::nullopt, -1.5f, -2.0f};
  out.prompt_tokens = 3;
  out.cached_tokens = 2;
  out.finish = FinishReason::Stop(256);
  out.weight_version = "default";
  out.weight_versions = {{"default", 0, 2}};
  out.e2e_latency = 0.125;
  out.num_retractions = 1;
  const Json j = GenerateOutputJson(out, Input(true), tok.get(), false);
  const Json want = Json::parse(R"({"text": "o", "output_ids": [111, 256],
      "meta_info": {"id": "r1", "finish_reason": {"type": "stop", "matched": 256},
        "prompt_tokens": 3, "completion_tokens": 2, "cached_tokens": 2,
        "weight_version": "default",
        "weight_versions": [{"version": "default", "start": 0, "end": 2}],
        "num_retractions": 1, "e2e_latency": 0.125,
        "output_token_logprobs": [[-0.5, 111, null], [-0.25, 256, null]],
        "input_token_logprobs": [[null, 104, null], [-1.5, 105, null], [-2.0, 33, null]],
        "output_token_logprobs_length": 2}})");
  EXPECT_EQ(j, want) << j.dump();

  // return_text_in_logprobs fills the third slot with each token's own text.
  const Json t = GenerateOutputJson(out, Input(true), tok.get(), true);
  EXPECT_EQ(t["meta_info"]["output_token_logprobs"],
            Json::parse(R"([[-0.5, 111, "o"], [-0.25, 256, "<|end|>"]])"));
  EXPECT_EQ(t["meta_info"]["input_token_logprobs"][0], Json::parse(R"([null, 104, "h"])"));
}

TEST(GenerateOutputJsonTest, TopLogprobsAreListsOfTriples) {
  RequestOutput out;
  out.rid = "r1";
  out.output_ids = {'a'};
  out.output_logprobs = {-0.5f};
  out.output_top_logprobs = {{{-0.5f, 'a'}, {-1.0f, 'b'}}};
  out.input_logprob_ids = {'h', 'i'};
  out.input_logprobs = {std::nullopt, -1.0f};
  out.input_top_logprobs = {{}, {{-1.0f, 'i'}, {-2.0f, 'j'}}};
  const Json j = GenerateOutputJson(out, Input(true, 2), nullptr, false);
  EXPECT_EQ(j["meta_info"]["output_top_logprobs"],
            Json::parse(R"([[[-0.5, 97, null], [-1.0, 98, null]]])"));
  EXPECT_EQ(j["meta_info"]["input_top_logprobs"],
            Json::parse(R"([null, [[-1.0, 105, null], [-2.0, 106, null]]])"));
  // Without top_logprobs_num the keys are absent.
  const Json k = GenerateOutputJson(out, Input(true, 0), nullptr, false);
  EXPECT_FALSE(k["meta_info"].contains("output_top_logprobs"));
  EXPECT_FALSE(k["meta_info"].contains("input_top_logprobs"));
}

TEST(GenerateOutputJsonTest, IndexOnlyForStreamedBatches) {
  RequestOutput out;
  out.rid = "r1";
  EXPECT_FALSE(GenerateOutputJson(out, Input(false), nullptr, false).contains("index"));
  EXPECT_EQ(GenerateOutputJson(out, Input(false), nullptr, false, true)["index"], 2);
}

TEST(GenerateOutputJsonTest, AbortKeepsPartialOutput) {
  RequestOutput out;
  out.rid = "r1";
  out.output_ids = {'a', 'b'};
  out.output_logprobs = {-0.1f, -0.2f};
  out.text = "ab";
  out.finish = FinishReason::Abort("Abort in waiting queue");
  const Json j = GenerateOutputJson(out, Input(true), nullptr, false);
  EXPECT_EQ(j["text"], "ab");
  EXPECT_EQ(j["meta_info"]["finish_reason"]["type"], "abort");
  EXPECT_EQ(j["meta_info"]["output_token_logprobs"].size(), 2u);
  EXPECT_EQ(HttpStatusForFinish(out.finish), 200) << "a user abort is a normal answer";
}

// --- Errors and helpers -----------------------------------------------------------------------

TEST(ProtocolErrorsTest, HttpStatusMapping) {
  EXPECT_EQ(HttpStatusFor(absl::OkStatus()), 200);
  EXPECT_EQ(HttpStatusFor(absl::InvalidArgumentError("x")), 400);
  EXPECT_EQ(HttpStatusFor(absl::OutOfRangeError("x")), 400);
  EXPECT_EQ(HttpStatusFor(absl::FailedPreconditionError("x")), 400);
  EXPECT_EQ(HttpStatusFor(absl::UnauthenticatedError("x")), 401);
  EXPECT_EQ(HttpStatusFor(absl::PermissionDeniedError("x")), 403);
  EXPECT_EQ(HttpStatusFor(absl::NotFoundError("x")), 404);
  EXPECT_EQ(HttpStatusFor(absl::AlreadyExistsError("x")), 409);
  EXPECT_EQ(HttpStatusFor(absl::UnimplementedError("x")), 501);
  EXPECT_EQ(HttpStatusFor(absl::ResourceExhaustedError("x")), 503);
  EXPECT_EQ(HttpStatusFor(absl::UnavailableError("x")), 503);
  EXPECT_EQ(HttpStatusFor(absl::DeadlineExceededError("x")), 504);
  EXPECT_EQ(HttpStatusFor(absl::InternalError("x")), 500);
  EXPECT_EQ(HttpStatusFor(absl::UnknownError("x")), 500);
}

TEST(ProtocolErrorsTest, ErrorBodies) {
  EXPECT_EQ(ErrorJson(absl::InvalidArgumentError("top_p must be in (0, 1], got 2")),
            Json::parse(R"({"error": {"message": "top_p must be in (0, 1], got 2"}})"));
  const Status s = FieldError("sampling_params.top_p", "bad");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ErrorField(s), std::optional<std::string>("sampling_params.top_p"));
  EXPECT_EQ(ErrorField(absl::InvalidArgumentError("bad")), std::nullopt);
}

TEST(ProtocolErrorsTest, AbortStatusCodes) {
  EXPECT_EQ(HttpStatusForFinish(FinishReason::Length(3)), 200);
  EXPECT_EQ(HttpStatusForFinish(FinishReason::Abort("user")), 200);
  EXPECT_EQ(HttpStatusForFinish(FinishReason::Abort("bad input", 400)), 400);
  EXPECT_EQ(HttpStatusForFinish(FinishReason::Abort("oom", 503)), 503);
  std::vector<RequestOutput> outs(3);
  outs[0].finish = FinishReason::Length(3);
  outs[1].finish = FinishReason::Abort("user");
  EXPECT_EQ(HttpStatusForOutputs(outs), 200);
  outs[2].finish = FinishReason::Abort("internal", 500);
  EXPECT_EQ(HttpStatusForOutputs(outs), 500);
}

TEST(ProtocolHelpersTest, SseAndIds) {
  EXPECT_EQ(SseEvent(Json{{"a", 1}}), "data: {\"a\":1}\n\n");
  EXPECT_EQ(kSseDone, "data: [DONE]\n\n");
  // Invalid UTF-8 cannot break serialization.
  EXPECT_EQ(SseEvent(Json{{"t", std::string("\xff")}}), "data: {\"t\":\"\xef\xbf\xbd\"}\n\n");
  const std::string a = RandomHexId(), b = RandomHexId();
  EXPECT_TRUE(IsHex32(a));
  EXPECT_NE(a, b);
}

TEST(ProtocolHelpersTest, Readers) {
  EXPECT_EQ(*ReadInt(Json(5.0), "x"), std::optional<int64_t>(5));
  EXPECT_FALSE(ReadInt(Json(5.5), "x").ok());
  EXPECT_FALSE(ReadInt(Json(18446744073709551615ull), "x").ok());
  EXPECT_EQ(*ReadInt(Json(nullptr), "x"), std::nullopt);
  EXPECT_EQ(*ReadNumber(Json(3), "x"), std::optional<double>(3.0));
  EXPECT_FALSE(ReadBool(Json(1), "x").ok());
  EXPECT_FALSE(ReadString(Json(1), "x").ok());
  EXPECT_TRUE(Member(Json(5), "a").is_null());
}

}  // namespace
}  // namespace slime::engine
