// Tests of the quickstart's demo addition task: correct answers, disjoint eval split, SFT as a
// subset of train, determinism, the committed data/demo files equal to the generator's default
// output, and that the files load as a prompt dataset and as an SFT dataset.
#include "slime/data/demo_task.h"

#include <gtest/gtest.h>

#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "../tokenizer/test_util.h"
#include "slime/data/prompt_dataset.h"
#include "slime/data/sft_dataset.h"
#include "slime/tokenizer/tokenizer.h"

namespace slime::data {
namespace {

using OJson = nlohmann::ordered_json;
using tokenizer::testing::ReadText;
using tokenizer::testing::SourceDir;
using tokenizer::testing::TempDir;

std::vector<OJson> ParseLines(const std::string& text) {
  std::vector<OJson> rows;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) rows.push_back(OJson::parse(line));
  return rows;
}

// "a+b=" → a + b as text.
std::string Sum(const std::string& problem) {
  const size_t plus = problem.find('+');
  EXPECT_NE(plus, std::string::npos);
  EXPECT_EQ(problem.back(), '=');
  const long a = std::stol(problem.substr(0, plus));
  const long b = std::stol(problem.substr(plus + 1, problem.size() - plus - 2));
  return std::to_string(a + b);
}

TEST(DemoTask, AnswersAreCorrectAndSplitsAreDisjoint) {
  DemoTaskOptions o;
  auto files = MakeDemoTask(o);
  ASSERT_TRUE(files.ok()) << files.status();
  const auto train = ParseLines(files->train);
  const auto eval = ParseLines(files->eval);
  const auto sft = ParseLines(files->sft);
  ASSERT_EQ(train.size(), static_cast<size_t>(o.num_train));
  ASSERT_EQ(eval.size(), static_cast<size_t>(o.num_eval));
  ASSERT_EQ(sft.size(), static_cast<size_t>(o.num_sft));
  std::set<std::string> train_set, eval_set;
  int three_digit = 0;
  for (const OJson& r : train) {
    const std::string p = r["input"];
    EXPECT_EQ(r["label"], Sum(p)) << p;
    train_set.insert(p);
    three_digit += r["label"].get<std::string>().size() == 3;
  }
  for (const OJson& r : eval) {
    const std::string p = r["input"];
    EXPECT_EQ(r["label"], Sum(p)) << p;
    eval_set.insert(p);
    EXPECT_EQ(train_set.count(p), 0u) << p << " is in both eval and train";
  }
  EXPECT_EQ(train_set.size(), train.size());  // no duplicates
  EXPECT_EQ(eval_set.size(), eval.size());
  // About half the sums of two 2-digit operands carry into a third digit.
  EXPECT_GT(three_digit, o.num_train / 3);
  for (size_t i = 0; i < sft.size(); ++i) {
    const OJson& m = sft[i]["messages"];
    ASSERT_EQ(m.size(), 2u);
    EXPECT_EQ(m[0]["role"], "user");
    EXPECT_EQ(m[1]["role"], "assistant");
    EXPECT_EQ(m[0]["content"], train[i]["input"]);  // the first num_sft train problems
    EXPECT_EQ(m[1]["content"], Sum(m[0]["content"]));
  }
}

TEST(DemoTask, DeterministicPerSeed) {
  DemoTaskOptions o{.digits = 2, .num_train = 50, .num_eval = 10, .num_sft = 20, .seed = 5};
  auto a = MakeDemoTask(o);
  auto b = MakeDemoTask(o);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->train, b->train);
  EXPECT_EQ(a->eval, b->eval);
  EXPECT_EQ(a->sft, b->sft);
  o.seed = 6;
  auto c = MakeDemoTask(o);
  ASSERT_TRUE(c.ok());
  EXPECT_NE(a->train, c->train);
}

TEST(DemoTask, OptionErrors) {
  auto err = [](DemoTaskOptions o) { return std::string(o.Validate().message()); };
  EXPECT_NE(err({.digits = 4}).find("digits is 4"), std::string::npos);
  EXPECT_NE(err({.num_train = 10, .num_sft = 11}).find("sft count 11 exceeds"), std::string::npos);
  EXPECT_NE(err({.digits = 1, .num_train = 95, .num_eval = 10, .num_sft = 5})
                .find("only 100 distinct problems"),
            std::string::npos);
  EXPECT_NE(err({.num_eval = 0}).find("at least 1"), std::string::npos);
  EXPECT_FALSE(MakeDemoTask({.digits = 0}).ok());
  // The largest 1-digit task fits exactly.
  EXPECT_TRUE(MakeDemoTask({.digits = 1, .num_train = 90, .num_eval = 10, .num_sft = 5}).ok());
}

TEST(DemoTask, CommittedFilesAreTheGeneratorsDefaultOutput) {
  auto files = MakeDemoTask(DemoTaskOptions{});
  ASSERT_TRUE(files.ok()) << files.status();
  const std::string dir = SourceDir() + "/data/demo";
  EXPECT_EQ(ReadText(dir + "/train.jsonl"), files->train)
      << "regenerate with: slime_train make-demo-data --out data/demo";
  EXPECT_EQ(ReadText(dir + "/eval.jsonl"), files->eval);
  EXPECT_EQ(ReadText(dir + "/sft.jsonl"), files->sft);
}

TEST(DemoTask, WriteDemoTaskWritesTheThreeFiles) {
  TempDir dir;
  DemoTaskOptions o{.digits = 2, .num_train = 30, .num_eval = 5, .num_sft = 10, .seed = 2};
  ASSERT_TRUE(WriteDemoTask(dir.path() + "/out", o).ok());
  auto files = MakeDemoTask(o);
  ASSERT_TRUE(files.ok());
  EXPECT_EQ(ReadText(dir.path() + "/out/train.jsonl"), files->train);
  EXPECT_EQ(ReadText(dir.path() + "/out/eval.jsonl"), files->eval);
  EXPECT_EQ(ReadText(dir.path() + "/out/sft.jsonl"), files->sft);
  EXPECT_FALSE(WriteDemoTask("/proc/no/such/dir", o).ok());
}

// The files load with the real Qwen3 tokenizer the way the quickstart uses them: prompts with the
// chat template, SFT conversations with their loss masks; digits are one token each.
TEST(DemoTask, FilesLoadAsPromptAndSftDatasets) {
  std::string why;
  const std::string tok_dir = tokenizer::testing::RealTokenizerDir("qwen3", &why);
  if (tok_dir.empty()) GTEST_SKIP() << why;
  auto tok = tokenizer::Tokenizer::FromDirectory(tok_dir);
  ASSERT_TRUE(tok.ok()) << tok.status();
  TempDir dir;
  DemoTaskOptions o{.digits = 2, .num_train = 40, .num_eval = 8, .num_sft = 16, .seed = 3};
  ASSERT_TRUE(WriteDemoTask(dir.path(), o).ok());

  PromptDatasetOptions po;
  po.input_key = "input";
  po.label_key = "label";
  po.apply_chat_template = true;
  po.bad_line = SftBadLinePolicy::kFail;
  auto prompts = PromptDataset::Load(dir.File("train.jsonl"), **tok, po);
  ASSERT_TRUE(prompts.ok()) << prompts.status();
  ASSERT_EQ(prompts->size(), 40);
  const Prompt& p = prompts->prompt(0);
  EXPECT_EQ(p.text, "<|im_start|>user\n" + p.prompt.get<std::string>() +
                        "<|im_end|>\n<|im_start|>assistant\n");
  for (const Prompt& q : prompts->prompts()) {
    EXPECT_LE(q.tokens.size(), 20u) << q.text;  // short prompts: a tiny model's context is enough
  }

  SftDatasetOptions so;
  so.bad_line = SftBadLinePolicy::kFail;
  auto sft = LoadSftDataset(dir.File("sft.jsonl"), **tok, so);
  ASSERT_TRUE(sft.ok()) << sft.status();
  ASSERT_EQ(sft->samples.size(), 16u);
  // The SFT prompt part is exactly what the RL prompt renders to (same template, same text),
  // so the warm start trains the format the GRPO rollouts sample in.
  const OJson first = ParseLines(ReadText(dir.File("sft.jsonl")))[0];
  const std::string user = first["messages"][0]["content"];
  const std::string answer = first["messages"][1]["content"];
  const SftSample& s = sft->samples[0];
  const std::vector<int32_t> prompt_ids(s.tokens.begin(), s.tokens.begin() + s.PromptLength());
  const std::vector<int32_t> rl_prompt =
      (*tok)->Encode("<|im_start|>user\n" + user + "<|im_end|>\n<|im_start|>assistant\n");
  ASSERT_GE(prompt_ids.size(), rl_prompt.size());
  EXPECT_TRUE(std::equal(rl_prompt.begin(), rl_prompt.end(), prompt_ids.begin()));
  // Each digit of the answer is its own token.
  const std::vector<int32_t> answer_ids = (*tok)->Encode(answer);
  EXPECT_EQ(answer_ids.size(), answer.size());
}

}  // namespace
}  // namespace slime::data
