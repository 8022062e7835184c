// Tests of the RL prompt dataset, PromptDataSource (groups, shuffle, epochs, exact resume) and
// the Sample record.
//
// Two tokenizers: the tiny byte-level BPE of tests/tokenizer/test_util.h (always available; no
// chat template) for the data-source logic, and the real Qwen3 tokenizer from
// scripts/fetch_test_data.sh for the chat-template cases (they skip with a message when it is
// missing, as the other data tests do).
#include "slime/data/prompt_dataset.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "../tokenizer/test_util.h"
#include "slime/config/config.h"
#include "slime/data/sample.h"
#include "slime/tokenizer/tokenizer.h"

namespace slime::data {
namespace {

using OJson = nlohmann::ordered_json;
using tokenizer::Tokenizer;
using tokenizer::testing::TempDir;
using tokenizer::testing::WriteText;

const Tokenizer& Tiny() {
  static std::unique_ptr<Tokenizer> tok = [] {
    auto t = Tokenizer::FromJsonText(tokenizer::testing::TinyByteLevelTokenizerJson().dump(), "",
                                     "tiny");
    EXPECT_TRUE(t.ok()) << t.status();
    return std::move(t).value();
  }();
  return *tok;
}

const Tokenizer* Qwen3(std::string* why) {
  static std::string reason;
  static std::unique_ptr<Tokenizer> tok = []() -> std::unique_ptr<Tokenizer> {
    const std::string dir = tokenizer::testing::RealTokenizerDir("qwen3", &reason);
    if (dir.empty()) return nullptr;
    auto t = Tokenizer::FromDirectory(dir);
    if (!t.ok()) {
      reason = std::string(t.status().message());
      return nullptr;
    }
    return std::move(t).value();
  }();
  *why = reason;
  return tok.get();
}

#define REQUIRE_QWEN3(var)                   \
  std::string qwen3_why_;                    \
  const Tokenizer* var = Qwen3(&qwen3_why_); \
  if (var == nullptr) GTEST_SKIP() << qwen3_why_

PromptDatasetOptions Opts() {
  PromptDatasetOptions o;
  o.input_key = "prompt";
  o.label_key = "label";
  return o;
}

// `n` prompt lines "p<i>" with label "l<i>".
std::string Lines(int n) {
  std::string text;
  for (int i = 0; i < n; ++i) {
    text += OJson{{"prompt", "p" + std::to_string(i)}, {"label", "l" + std::to_string(i)}}.dump() +
            "\n";
  }
  return text;
}

std::shared_ptr<const PromptDataset> Dataset(int n) {
  auto ds = PromptDataset::Parse(Lines(n), "mem.jsonl", Tiny(), Opts());
  EXPECT_TRUE(ds.ok()) << ds.status();
  return std::make_shared<const PromptDataset>(*std::move(ds));
}

PromptDataSource Source(std::shared_ptr<const PromptDataset> ds, int n, uint64_t seed,
                        bool shuffle) {
  auto src = PromptDataSource::Create(std::move(ds), {.n_samples_per_prompt = n, .seed = seed,
                                                      .shuffle = shuffle});
  EXPECT_TRUE(src.ok()) << src.status();
  return *std::move(src);
}

// The prompt texts of the first sample of each group.
std::vector<std::string> Texts(const std::vector<SampleGroup>& groups) {
  std::vector<std::string> out;
  for (const SampleGroup& g : groups) out.push_back(g.at(0).prompt_text);
  return out;
}

// ---- Loading ---------------------------------------------------------------------------------

TEST(PromptDataset, StringPromptIsUsedVerbatim) {
  const std::string text =
      R"({"prompt": "hello world", "label": "42", "metadata": {"rm_type": "math"}})"
      "\n\n"
      R"({"prompt": "abc", "label": 7, "metadata": "{\"source_name\": \"s\"}"})"
      "\n";
  auto ds = PromptDataset::Parse(text, "mem.jsonl", Tiny(), Opts());
  ASSERT_TRUE(ds.ok()) << ds.status();
  ASSERT_EQ(ds->size(), 2);
  const Prompt& p = ds->prompt(0);
  EXPECT_EQ(p.text, "hello world");
  EXPECT_EQ(p.tokens, Tiny().Encode("hello world"));
  EXPECT_EQ(p.label, "42");
  EXPECT_EQ(p.metadata, (OJson{{"rm_type", "math"}}));
  EXPECT_EQ(p.line, 1);
  EXPECT_EQ(ds->prompt(1).label, "7");  // a number label is kept as its JSON text
  EXPECT_EQ(ds->prompt(1).metadata, (OJson{{"source_name", "s"}}));
  EXPECT_EQ(ds->prompt(1).line, 3);  // blank lines count in line numbers
  EXPECT_EQ(ds->stats().lines, 2);
  EXPECT_EQ(ds->stats().prompts, 2);
}

TEST(PromptDataset, Qwen3StringPromptGetsTheChatTemplate) {
  REQUIRE_QWEN3(tok);
  PromptDatasetOptions o = Opts();
  o.apply_chat_template = true;
  auto ds = PromptDataset::Parse(R"({"prompt": "What is 2+3?", "label": "5"})", "mem", *tok, o);
  ASSERT_TRUE(ds.ok()) << ds.status();
  const Prompt& p = ds->prompt(0);
  EXPECT_EQ(p.text, "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(p.tokens, tok->Encode(p.text));
  EXPECT_EQ(p.tokens.front(), *tok->TokenToId("<|im_start|>"));
  EXPECT_EQ(p.prompt, OJson("What is 2+3?"));

  o.chat_template_kwargs = {{"enable_thinking", false}};
  ds = PromptDataset::Parse(R"({"prompt": "Hi", "label": "x"})", "mem", *tok, o);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->prompt(0).text,
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

TEST(PromptDataset, Qwen3MessagePromptWithTools) {
  REQUIRE_QWEN3(tok);
  PromptDatasetOptions o = Opts();
  o.apply_chat_template = true;
  const OJson messages = OJson::array({OJson{{"role", "system"}, {"content", "Be brief."}},
                                       OJson{{"role", "user"}, {"content", "Weather?"}}});
  const OJson tools = OJson::array(
      {OJson{{"type", "function"},
             {"function", OJson{{"name", "weather"}, {"description", "Get the weather"}}}}});
  const std::string line =
      OJson{{"prompt", messages}, {"label", "sunny"}, {"tools", tools}}.dump();
  auto ds = PromptDataset::Parse(line, "mem", *tok, o);
  ASSERT_TRUE(ds.ok()) << ds.status();
  const Prompt& p = ds->prompt(0);
  tokenizer::ChatTemplateOptions t;
  t.add_generation_prompt = true;
  t.tools = tools;
  auto expected = tok->ApplyChatTemplate(messages, t);
  ASSERT_TRUE(expected.ok()) << expected.status();
  EXPECT_EQ(p.text, *expected);
  EXPECT_NE(p.text.find("<tools>"), std::string::npos);
  EXPECT_NE(p.text.find("Be brief."), std::string::npos);
  EXPECT_EQ(p.metadata["tools"], tools);
  EXPECT_EQ(p.tokens, tok->Encode(p.text));

  // Without the template a message list cannot be a prompt.
  o.apply_chat_template = false;
  o.bad_line = SftBadLinePolicy::kFail;
  auto bad = PromptDataset::Parse(line, "mem", *tok, o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("mem:1: \"prompt\": a list of messages needs "
                                        "data.apply_chat_template"),
            std::string::npos)
      << bad.status();
}

TEST(PromptDataset, ApplyChatTemplateWithoutTemplateIsRefused) {
  PromptDatasetOptions o = Opts();
  o.apply_chat_template = true;
  auto ds = PromptDataset::Parse(Lines(1), "mem", Tiny(), o);
  ASSERT_FALSE(ds.ok());
  EXPECT_NE(ds.status().message().find("no usable chat template"), std::string::npos)
      << ds.status();
}

TEST(PromptDataset, BadLinesNameFileAndLine) {
  TempDir dir;
  const std::string path = dir.File("prompts.jsonl");
  WriteText(path,
            R"({"prompt": "ok1", "label": "a"})"
            "\n"
            R"({"prompt": "broken", )"
            "\n"
            R"({"label": "no prompt"})"
            "\n"
            R"({"prompt": "ok2", "label": "b"})"
            "\n"
            R"({"prompt": "x", "label": "c", "metadata": [1]})"
            "\n"
            R"({"prompt": "no label"})"
            "\n"
            R"({"prompt": 5, "label": "d"})"
            "\n");
  PromptDatasetOptions o = Opts();
  o.bad_line = SftBadLinePolicy::kFail;
  auto fail = PromptDataset::Load(path, Tiny(), o);
  ASSERT_FALSE(fail.ok());
  EXPECT_EQ(fail.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(fail.status().message().find(path + ":2: malformed JSON"), std::string::npos)
      << fail.status();

  o.bad_line = SftBadLinePolicy::kSkip;
  auto skip = PromptDataset::Load(path, Tiny(), o);
  ASSERT_TRUE(skip.ok()) << skip.status();
  EXPECT_EQ(skip->stats().lines, 7);
  EXPECT_EQ(skip->stats().bad_lines, 5);
  ASSERT_EQ(skip->size(), 2);
  EXPECT_EQ(skip->prompt(0).line, 1);
  EXPECT_EQ(skip->prompt(1).line, 4);
  EXPECT_EQ(skip->prompt(1).text, "ok2");

  // Each kind of bad line, one at a time, with its message.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"label": "no prompt"})", "mem:1: missing \"prompt\""},
      {R"({"prompt": "x", "label": "c", "metadata": [1]})",
       "mem:1: \"metadata\": expected an object, got array"},
      {R"({"prompt": "no label"})", "mem:1: missing \"label\""},
      {R"({"prompt": 5, "label": "d"})", "mem:1: \"prompt\": expected a string, got number"},
      {R"({"prompt": "", "label": "d"})", "mem:1: \"prompt\": the prompt is empty"},
      {R"({"prompt": "t", "label": "d", "tools": {"a": 1}})",
       "mem:1: \"tools\": expected an array of tool definitions, got object"},
      {R"([1, 2])", "mem:1: expected a JSON object with \"prompt\", got array"},
  };
  o.bad_line = SftBadLinePolicy::kFail;
  for (const auto& [line, message] : cases) {
    auto ds = PromptDataset::Parse(line, "mem", Tiny(), o);
    ASSERT_FALSE(ds.ok()) << line;
    EXPECT_NE(ds.status().message().find(message), std::string::npos)
        << line << " -> " << ds.status();
  }

  // Nothing usable at all: the error gives the counts.
  o.bad_line = SftBadLinePolicy::kSkip;
  auto none = PromptDataset::Parse("{}\n{}\n", "mem", Tiny(), o);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("no prompts (2 lines: 2 bad"), std::string::npos)
      << none.status();
}

TEST(PromptDataset, MissingFileIsNotFound) {
  auto ds = PromptDataset::Load("/nonexistent/prompts.jsonl", Tiny(), Opts());
  ASSERT_FALSE(ds.ok());
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(ds.status().message().find("/nonexistent/prompts.jsonl"), std::string::npos);
}

TEST(PromptDataset, MaxPromptLenDropsLongPromptsAndKeepsOrder) {
  std::string text;
  for (const char* p : {"aaaa", "a", "aaaaaaaa", "aa", "aaaaa"}) {
    text += OJson{{"prompt", p}, {"label", "x"}}.dump() + "\n";
  }
  // Token counts come from the tokenizer (the tiny one merges a+a), not from the text length.
  PromptDatasetOptions o = Opts();
  auto all = PromptDataset::Parse(text, "mem", Tiny(), o);
  ASSERT_TRUE(all.ok()) << all.status();
  std::vector<size_t> lengths;
  for (const Prompt& p : all->prompts()) lengths.push_back(p.tokens.size());
  const int64_t limit = static_cast<int64_t>(lengths[0]);  // "aaaa"
  o.max_prompt_len = limit;
  auto kept = PromptDataset::Parse(text, "mem", Tiny(), o);
  ASSERT_TRUE(kept.ok()) << kept.status();
  std::vector<std::string> texts;
  int64_t dropped = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    if (static_cast<int64_t>(lengths[i]) <= limit) {
      texts.push_back(all->prompt(static_cast<int64_t>(i)).text);
    } else {
      ++dropped;
    }
  }
  ASSERT_GT(dropped, 0);
  EXPECT_EQ(kept->stats().too_long, dropped);
  std::vector<std::string> got;
  for (const Prompt& p : kept->prompts()) got.push_back(p.text);
  EXPECT_EQ(got, texts);

  o.max_prompt_len = -1;
  EXPECT_FALSE(PromptDataset::Parse(text, "mem", Tiny(), o).ok());
}

TEST(PromptDataset, RowSlice) {
  TempDir dir;
  const std::string path = dir.File("p.jsonl");
  WriteText(path, Lines(6));
  auto texts = [&](const std::string& spec) {
    auto ds = PromptDataset::Load(spec, Tiny(), Opts());
    EXPECT_TRUE(ds.ok()) << spec << ": " << ds.status();
    std::vector<std::string> out;
    if (ds.ok()) {
      for (const Prompt& p : ds->prompts()) out.push_back(p.text);
    }
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(texts(path + "@[1:3]"), (V{"p1", "p2"}));
  EXPECT_EQ(texts(path + "@[-2:]"), (V{"p4", "p5"}));
  EXPECT_EQ(texts(path + "@[:2]"), (V{"p0", "p1"}));
  EXPECT_EQ(texts(path + "@[4:100]"), (V{"p4", "p5"}));
  for (const char* bad : {"@[1-3]", "@[a:b]", "@[1:2", "@[1:2]x", "@[-:]"}) {
    auto ds = PromptDataset::Load(path + bad, Tiny(), Opts());
    ASSERT_FALSE(ds.ok()) << bad;
    EXPECT_NE(ds.status().message().find("bad row slice"), std::string::npos) << ds.status();
  }
  auto empty = PromptDataset::Load(path + "@[3:1]", Tiny(), Opts());
  EXPECT_FALSE(empty.ok());
}

// ---- PromptDataSource ------------------------------------------------------------------------

TEST(PromptDataSource, GroupsCarryIndicesAndPromptData) {
  auto src = Source(Dataset(5), /*n=*/4, /*seed=*/1, /*shuffle=*/false);
  const std::vector<SampleGroup> groups = src.GetSamples(3);
  ASSERT_EQ(groups.size(), 3u);
  for (int g = 0; g < 3; ++g) {
    ASSERT_EQ(groups[g].size(), 4u);
    for (int j = 0; j < 4; ++j) {
      const Sample& s = groups[g][j];
      EXPECT_EQ(s.group_index, g);
      EXPECT_EQ(s.index, g * 4 + j);
      EXPECT_EQ(s.prompt_text, "p" + std::to_string(g));
      EXPECT_EQ(s.label, "l" + std::to_string(g));
      EXPECT_EQ(s.tokens, Tiny().Encode(s.prompt_text));
      EXPECT_EQ(s.response_length, 0);
      EXPECT_EQ(s.status, SampleStatus::kPending);
      EXPECT_TRUE(s.Validate().ok()) << s.Validate();
    }
  }
  // Continues where it stopped, into the next epoch (file order without shuffle).
  EXPECT_EQ(Texts(src.GetSamples(4)), (std::vector<std::string>{"p3", "p4", "p0", "p1"}));
  EXPECT_EQ(src.epoch(), 1);
  EXPECT_EQ(src.state().next_group_index, 7);
  EXPECT_EQ(src.state().next_sample_index, 28);
  EXPECT_TRUE(src.GetSamples(0).empty());
}

TEST(PromptDataSource, ShuffleIsDeterministicPerSeedAndDiffersAcrossEpochs) {
  const int n = 20;
  auto ds = Dataset(n);
  auto a = Source(ds, 1, 7, true);
  auto b = Source(ds, 1, 7, true);
  auto c = Source(ds, 1, 8, true);
  const auto a0 = Texts(a.GetSamples(n));
  const auto a1 = Texts(a.GetSamples(n));
  EXPECT_EQ(a0, Texts(b.GetSamples(n)));
  EXPECT_EQ(a1, Texts(b.GetSamples(n)));
  EXPECT_NE(a0, Texts(c.GetSamples(n)));
  EXPECT_NE(a0, a1);  // reshuffled at the epoch rollover
  for (const auto& epoch : {a0, a1}) {  // each epoch visits every prompt once
    EXPECT_EQ(std::set<std::string>(epoch.begin(), epoch.end()).size(), static_cast<size_t>(n));
  }
  // The order is EpochSampler's: permutation of seed + epoch.
  const std::vector<int64_t> order = EpochSampler::EpochOrder(n, 7, 1);
  for (int i = 0; i < n; ++i) EXPECT_EQ(a1[i], "p" + std::to_string(order[i]));
}

TEST(PromptDataSource, ExactResumeFromASavedState) {
  TempDir dir;
  const int n = 7;
  // Uninterrupted run: 6 rollouts of 3 groups (crossing two epoch boundaries).
  auto full = Source(Dataset(n), 2, 123, true);
  std::vector<std::vector<SampleGroup>> expected;
  for (int r = 0; r < 6; ++r) expected.push_back(full.GetSamples(3));

  // Interrupted run: 2 rollouts, save (mid-epoch: 6 of 7 prompts of epoch 0 used), then a new
  // process restores and does the remaining 4.
  const std::string path = DataSourceStatePath(dir.path() + "/ckpt", 1);
  {
    auto first = Source(Dataset(n), 2, 123, true);
    first.GetSamples(3);
    first.GetSamples(3);
    EXPECT_EQ(first.state().epoch, 0);
    EXPECT_EQ(first.state().offset, 6);
    ASSERT_TRUE(first.Save(path).ok());
  }
  EXPECT_EQ(path, dir.path() + "/ckpt/rollout/data_source_state_1.json");
  auto saved = OJson::parse(tokenizer::testing::ReadText(path));
  EXPECT_EQ(saved["epoch_id"], 0);
  EXPECT_EQ(saved["sample_offset"], 6);
  EXPECT_EQ(saved["sample_group_index"], 6);
  EXPECT_EQ(saved["sample_index"], 12);

  auto resumed = Source(Dataset(n), 2, 123, true);
  ASSERT_TRUE(resumed.Load(path).ok());
  for (int r = 2; r < 6; ++r) {
    const std::vector<SampleGroup> got = resumed.GetSamples(3);
    ASSERT_EQ(got.size(), expected[r].size());
    for (size_t g = 0; g < got.size(); ++g) {
      for (size_t j = 0; j < got[g].size(); ++j) {
        EXPECT_EQ(got[g][j].prompt_text, expected[r][g][j].prompt_text) << r << "/" << g;
        EXPECT_EQ(got[g][j].group_index, expected[r][g][j].group_index);
        EXPECT_EQ(got[g][j].index, expected[r][g][j].index);
      }
    }
  }
  EXPECT_EQ(resumed.state(), full.state());
  // No temporary file is left beside the state.
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path() + "/ckpt/rollout")) {
    (void)e;
    ++files;
  }
  EXPECT_EQ(files, 1);
}

TEST(PromptDataSource, RestoreRefusesADifferentOrderOrACorruptFile) {
  TempDir dir;
  auto src = Source(Dataset(5), 1, 3, true);
  src.GetSamples(2);
  const std::string path = dir.File("state.json");
  ASSERT_TRUE(src.Save(path).ok());

  auto other_seed = Source(Dataset(5), 1, 4, true);
  Status st = other_seed.Load(path);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("seed 3"), std::string::npos) << st;
  EXPECT_EQ(other_seed.state().offset, 0);  // unchanged

  auto other_size = Source(Dataset(6), 1, 3, true);
  st = other_size.Load(path);
  EXPECT_NE(st.message().find("5 prompts"), std::string::npos) << st;

  auto no_shuffle = Source(Dataset(5), 1, 3, false);
  EXPECT_FALSE(no_shuffle.Load(path).ok());

  // Fewer samples per prompt after resume is allowed (slime allows it too).
  auto other_n = Source(Dataset(5), 4, 3, true);
  EXPECT_TRUE(other_n.Load(path).ok());

  auto fresh = Source(Dataset(5), 1, 3, true);
  st = fresh.Load(dir.File("missing.json"));
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;

  WriteText(dir.File("corrupt.json"), "{\"version\": 1, \"epoch_id\": ");
  st = fresh.Load(dir.File("corrupt.json"));
  EXPECT_NE(st.message().find("corrupt.json: malformed JSON"), std::string::npos) << st;

  OJson j = src.state().ToJson();
  j["sample_offset"] = 99;
  WriteText(dir.File("range.json"), j.dump());
  st = fresh.Load(dir.File("range.json"));
  EXPECT_NE(st.message().find("offset 99"), std::string::npos) << st;

  j = src.state().ToJson();
  j.erase("sample_index");
  auto parsed = DataSourceState::FromJson(j, "s.json");
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("s.json: missing \"sample_index\""),
            std::string::npos);
  auto round = DataSourceState::FromJson(src.state().ToJson(), "s.json");
  ASSERT_TRUE(round.ok()) << round.status();
  EXPECT_EQ(*round, src.state());
}

TEST(PromptDataSource, CreateErrors) {
  EXPECT_FALSE(PromptDataSource::Create(nullptr, {}).ok());
  EXPECT_FALSE(PromptDataSource::Create(Dataset(2), {.n_samples_per_prompt = 0}).ok());
}

TEST(PromptDataSource, OptionsFromConfig) {
  config::Config c;
  c.data.input_key = "question";
  c.data.label_key = "answer";
  c.data.apply_chat_template = true;
  c.data.apply_chat_template_kwargs = {{"enable_thinking", "false"},
                                       {"date_string", "1 Jan 2025"},
                                       {"n", "3"}};
  c.data.on_bad_line = "fail";
  c.data.n_samples_per_prompt = 8;
  c.rollout.max_prompt_len = 512;
  c.rollout.seed = 9;
  c.rollout.shuffle = true;
  const PromptDatasetOptions o = PromptDatasetOptionsFromConfig(c);
  EXPECT_EQ(o.input_key, "question");
  EXPECT_EQ(o.label_key, "answer");
  EXPECT_TRUE(o.apply_chat_template);
  EXPECT_EQ(o.chat_template_kwargs["enable_thinking"], OJson(false));
  EXPECT_EQ(o.chat_template_kwargs["date_string"], OJson("1 Jan 2025"));
  EXPECT_EQ(o.chat_template_kwargs["n"], OJson(3));
  EXPECT_EQ(o.bad_line, SftBadLinePolicy::kFail);
  EXPECT_EQ(o.max_prompt_len, 512);
  const PromptDataSourceOptions s = PromptDataSourceOptionsFromConfig(c);
  EXPECT_EQ(s.n_samples_per_prompt, 8);
  EXPECT_EQ(s.seed, 9u);
  EXPECT_TRUE(s.shuffle);
  EXPECT_EQ(PromptDatasetOptionsFromConfig(config::Config{}).bad_line, SftBadLinePolicy::kSkip);
}

// ---- Sample ----------------------------------------------------------------------------------

TEST(Sample, AppendResponseKeepsMasksAndLogProbsAligned) {
  Sample s;
  s.index = 5;
  s.tokens = {1, 2, 3};
  const std::vector<int32_t> gen = {10, 11};
  const std::vector<float> lp = {-0.5f, -1.0f};
  ASSERT_TRUE(s.AppendResponse(gen, lp, true, "ab", "v1").ok());
  const std::vector<int32_t> tool = {20, 21, 22};
  ASSERT_TRUE(s.AppendResponse(tool, {}, false, "<tool>").ok());
  ASSERT_TRUE(s.AppendResponse(std::vector<int32_t>{12}, std::vector<float>{-0.1f}, true, "c",
                               "v2")
                  .ok());
  EXPECT_EQ(s.tokens, (std::vector<int32_t>{1, 2, 3, 10, 11, 20, 21, 22, 12}));
  EXPECT_EQ(s.PromptLength(), 3);
  EXPECT_EQ(s.response_length, 6);
  EXPECT_EQ(s.loss_mask, (std::vector<uint8_t>{1, 1, 0, 0, 0, 1}));
  EXPECT_EQ(s.rollout_log_probs, (std::vector<float>{-0.5f, -1.0f, 0, 0, 0, -0.1f}));
  EXPECT_EQ(s.response, "ab<tool>c");
  EXPECT_EQ(s.weight_versions, (std::vector<std::string>{"v1", "v2"}));
  EXPECT_EQ(s.weight_version_tokens, (std::vector<int64_t>{2, 1}));  // the tool span has none
  EXPECT_TRUE(s.Validate().ok()) << s.Validate();

  EXPECT_FALSE(s.AppendResponse(gen, std::vector<float>{-1.0f}, true).ok());  // size mismatch
  Sample t;
  ASSERT_TRUE(t.AppendResponse(gen, {}, true).ok());
  EXPECT_EQ(t.AppendResponse(gen, lp, true).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(Sample, StatusFromFinishReasonAndValidate) {
  Sample s;
  ASSERT_TRUE(s.SetStatusFromFinishReason("length").ok());
  EXPECT_EQ(s.status, SampleStatus::kTruncated);
  ASSERT_TRUE(s.SetStatusFromFinishReason("stop").ok());
  EXPECT_EQ(s.status, SampleStatus::kCompleted);
  ASSERT_TRUE(s.SetStatusFromFinishReason("abort").ok());
  EXPECT_EQ(s.status, SampleStatus::kAborted);
  EXPECT_FALSE(s.SetStatusFromFinishReason("eos").ok());
  EXPECT_EQ(s.status, SampleStatus::kAborted);
  for (SampleStatus st : {SampleStatus::kPending, SampleStatus::kCompleted,
                          SampleStatus::kTruncated, SampleStatus::kAborted,
                          SampleStatus::kFailed}) {
    auto parsed = ParseSampleStatus(SampleStatusName(st));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, st);
  }
  EXPECT_FALSE(ParseSampleStatus("done").ok());

  Sample bad;
  bad.index = 3;
  bad.tokens = {1, 2};
  bad.response_length = 3;
  EXPECT_NE(bad.Validate().message().find("sample 3: response_length 3"), std::string::npos);
  bad.response_length = 1;
  EXPECT_NE(bad.Validate().message().find("loss_mask has 0 entries"), std::string::npos);
  bad.loss_mask = {1};
  bad.rollout_log_probs = {0, 0};
  EXPECT_NE(bad.Validate().message().find("rollout_log_probs has 2 entries"),
            std::string::npos);
  bad.rollout_log_probs.clear();
  bad.metadata = OJson::array();
  EXPECT_FALSE(bad.Validate().ok());
  bad.metadata = OJson::object();
  EXPECT_TRUE(bad.Validate().ok());
  bad.weight_versions = {"1", "2"};
  bad.weight_version_tokens = {1};
  EXPECT_NE(bad.Validate().message().find("weight_version_tokens has 1 entries"),
            std::string::npos);
  bad.weight_version_tokens = {1, 1};
  EXPECT_NE(bad.Validate().message().find("weight_version_tokens sum to 2"), std::string::npos);
  bad.weight_version_tokens = {1, 0};
  EXPECT_TRUE(bad.Validate().ok());
}

TEST(Sample, OldestWeightVersionAndClearResponse) {
  Sample s;
  s.index = 2;
  s.tokens = {1, 2, 3};
  s.metadata["rm_type"] = "math";
  s.label = "7";
  EXPECT_FALSE(s.OldestWeightVersion().has_value());
  ASSERT_TRUE(
      s.AppendResponse(std::vector<int32_t>{10, 11}, std::vector<float>{-1, -2}, true, "ab", "5")
          .ok());
  ASSERT_TRUE(
      s.AppendResponse(std::vector<int32_t>{12}, std::vector<float>{-3}, true, "c", "3").ok());
  s.weight_versions.push_back("not-a-number");
  s.weight_version_tokens.push_back(0);
  ASSERT_TRUE(s.AppendRoutedExperts(std::vector<int32_t>(5 * 2, 1), 5, 2).ok());
  s.reward = 1;
  s.status = SampleStatus::kCompleted;
  s.remove_sample = true;
  EXPECT_EQ(s.OldestWeightVersion(), 3);  // the least integer version, wherever it is

  s.ClearResponse();
  EXPECT_EQ(s.tokens, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(s.response_length, 0);
  EXPECT_TRUE(s.response.empty());
  EXPECT_TRUE(s.loss_mask.empty());
  EXPECT_TRUE(s.rollout_log_probs.empty());
  EXPECT_TRUE(s.weight_versions.empty());
  EXPECT_TRUE(s.weight_version_tokens.empty());
  EXPECT_EQ(s.RoutedRows(), 2);  // the prompt's rows stay (tokens − 1)
  EXPECT_EQ(s.reward, 0);
  EXPECT_EQ(s.status, SampleStatus::kPending);
  EXPECT_FALSE(s.remove_sample);
  EXPECT_EQ(s.label, "7");
  EXPECT_EQ(s.metadata["rm_type"], "math");
  EXPECT_TRUE(s.Validate().ok()) << s.Validate();
}

}  // namespace
}  // namespace slime::data
