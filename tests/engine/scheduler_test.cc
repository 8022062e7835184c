#include "slime/engine/scheduler.h"

#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "fake_engine.h"

namespace slime::engine {
namespace {

using testing::FakeEngine;
using testing::Generate;

std::vector<int32_t> Iota(int64_t n, int32_t first) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

// A pool, a cache and a scheduler over them, plus the fake engine.
struct Rig {
  Rig(int64_t num_pages, int64_t page_size, SchedulerOptions options = {}, bool cache = true)
      : pool(num_pages, page_size), radix(&pool, cache), scheduler(options, &pool, &radix),
        engine(&scheduler) {}

  KvPagePool pool;
  RadixCache radix;
  Scheduler scheduler;
  FakeEngine engine;
};

int64_t PrefillTokens(const Batch& batch) {
  int64_t n = 0;
  for (size_t i = batch.num_decodes; i < batch.items.size(); ++i) n += batch.items[i].num_tokens;
  return n;
}

TEST(SchedulerTest, AddValidatesAndClips) {
  SchedulerOptions options;
  options.max_context_tokens = 32;
  Rig s(5, 4, options);  // 16 usable tokens
  EXPECT_TRUE(s.scheduler.Add(1, Iota(5, 0), 100).ok());
  EXPECT_EQ(s.scheduler.Find(1)->max_new_tokens, 27);  // clipped to the context
  EXPECT_TRUE(s.scheduler.Add(2, Iota(5, 0), -1).ok());
  EXPECT_EQ(s.scheduler.Find(2)->max_new_tokens, 27);
  EXPECT_TRUE(s.scheduler.Add(3, Iota(16, 0), 3).ok());  // exactly the whole pool
  EXPECT_EQ(s.scheduler.Find(3)->max_new_tokens, 3);

  Status dup = s.scheduler.Add(1, Iota(5, 0), 1);
  EXPECT_EQ(dup.code(), absl::StatusCode::kAlreadyExists);
  Status empty = s.scheduler.Add(4, {}, 1);
  EXPECT_EQ(empty.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(empty.message()).find("empty prompt"), std::string::npos);
  Status too_big = s.scheduler.Add(5, Iota(17, 0), 1);
  EXPECT_EQ(too_big.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(too_big.message()).find("whole KV cache holds 16 tokens"),
            std::string::npos)
      << too_big.message();
  Status context = s.scheduler.Add(6, Iota(32, 0), 1);
  EXPECT_EQ(context.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(context.message()).find("context length is 32"), std::string::npos)
      << context.message();

  EXPECT_EQ(s.scheduler.WaitingIds(), (std::vector<uint64_t>{1, 2, 3}));
  s.scheduler.CheckInvariants();

  SchedulerOptions bad;
  bad.max_prefill_tokens = 0;
  Status invalid = ValidateSchedulerOptions(bad);
  EXPECT_EQ(invalid.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(invalid.message()).find("max_prefill_tokens"), std::string::npos);
}

TEST(SchedulerTest, DecodeAndPrefillShareAStep) {
  Rig s(64, 4);
  ASSERT_TRUE(s.scheduler.Add(1, Iota(10, 0), 5).ok());
  Batch b1 = s.engine.Step();
  ASSERT_EQ(b1.items.size(), 1u);
  EXPECT_EQ(b1.num_decodes, 0);
  EXPECT_EQ(b1.items[0].seq_id, 1u);
  EXPECT_EQ(b1.items[0].start, 0);
  EXPECT_EQ(b1.items[0].num_tokens, 10);
  EXPECT_TRUE(b1.items[0].completes);
  const Sequence* a = s.scheduler.Find(1);
  EXPECT_EQ(a->num_computed, 10);
  EXPECT_EQ(a->tokens.size(), 11u);  // the fake engine sampled one token
  EXPECT_EQ(a->pages.size(), 3u);

  ASSERT_TRUE(s.scheduler.Add(2, Iota(6, 50), 2).ok());
  Batch b2 = s.engine.Step();
  ASSERT_EQ(b2.items.size(), 2u);
  EXPECT_EQ(b2.num_decodes, 1);
  EXPECT_EQ(b2.items[0].seq_id, 1u);
  EXPECT_EQ(b2.items[0].start, 10);
  EXPECT_EQ(b2.items[0].num_tokens, 1);
  EXPECT_TRUE(b2.items[0].completes);
  EXPECT_EQ(b2.items[1].seq_id, 2u);
  EXPECT_EQ(b2.items[1].start, 0);
  EXPECT_EQ(b2.items[1].num_tokens, 6);
  EXPECT_EQ(b2.num_tokens, 7);
  EXPECT_EQ(s.scheduler.num_running(), 2);
  EXPECT_EQ(s.scheduler.RunningIds(), (std::vector<uint64_t>{1, 2}));

  s.engine.RunToCompletion();
  EXPECT_EQ(s.engine.outputs().at(1), Generate(Iota(10, 0), 5));
  EXPECT_EQ(s.engine.outputs().at(2), Generate(Iota(6, 50), 2));
}

TEST(SchedulerTest, ChunkedPrefillAcrossStepsSharesStepsWithDecodes) {
  SchedulerOptions options;
  options.max_prefill_tokens = 8;
  Rig s(64, 4, options);
  ASSERT_TRUE(s.scheduler.Add(1, Iota(3, 0), 10).ok());
  s.engine.Step();  // 1 prefilled, decoding from now on
  ASSERT_TRUE(s.scheduler.Add(2, Iota(20, 100), 2).ok());

  const int64_t starts[] = {0, 8, 16};
  const int64_t sizes[] = {8, 8, 4};
  for (int step = 0; step < 3; ++step) {
    Batch b = s.engine.Step();
    ASSERT_EQ(b.items.size(), 2u) << "step " << step;
    EXPECT_EQ(b.num_decodes, 1);
    EXPECT_EQ(b.items[0].seq_id, 1u);
    EXPECT_EQ(b.items[0].num_tokens, 1);
    EXPECT_EQ(b.items[1].seq_id, 2u);
    EXPECT_EQ(b.items[1].start, starts[step]);
    EXPECT_EQ(b.items[1].num_tokens, sizes[step]);
    EXPECT_EQ(b.items[1].completes, step == 2);
    if (step < 2) {
      const Sequence* seq = s.scheduler.Find(2);
      EXPECT_EQ(seq->num_computed, starts[step] + sizes[step]);
      EXPECT_EQ(seq->tokens.size(), 20u);
      EXPECT_EQ(static_cast<int64_t>(seq->pages.size()), s.pool.PagesFor(seq->num_computed));
    }
  }
  EXPECT_EQ(s.scheduler.Find(2)->tokens.size(), 21u);
  s.engine.RunToCompletion();
  EXPECT_EQ(s.engine.outputs().at(2), Generate(Iota(20, 100), 2));
}

TEST(SchedulerTest, TokenBudgetsAndRunningLimitAreRespected) {
  SchedulerOptions options;
  options.max_prefill_tokens = 8;
  options.max_batch_tokens = 10;
  options.max_running_requests = 3;
  Rig s(128, 4, options);
  for (uint64_t id = 0; id < 6; ++id) {
    ASSERT_TRUE(s.scheduler.Add(id, Iota(5 + id, 10 * id), 6).ok());
  }
  int64_t steps = 0;
  while (!s.scheduler.idle()) {
    Batch b = s.engine.Step();
    EXPECT_LE(b.num_tokens, 10);
    EXPECT_LE(PrefillTokens(b), 8);
    EXPECT_LE(s.scheduler.num_running(), 3);
    ASSERT_LT(++steps, 1000);
  }
  for (uint64_t id = 0; id < 6; ++id) {
    EXPECT_EQ(s.engine.outputs().at(id), Generate(Iota(5 + id, 10 * id), 6));
  }
}

// A GRPO group arriving at once (8 samples of one prompt, an unrelated request behind them):
// the first sample prefills the prompt — in chunks when it is over the prefill budget — while
// its siblings wait (they would share >= kInBatchShareTokens of what it is computing) and the
// unrelated request is admitted past them; the step after the first one's prefill completes,
// the siblings join with only the last partial page of the prompt left to compute.
TEST(SchedulerTest, AGroupPrefillsItsPromptOnceAndTheSiblingsWaitOnlyForItsPages) {
  for (const int64_t budget : {int64_t{8192}, int64_t{20}}) {
    SchedulerOptions options;
    options.max_prefill_tokens = budget;
    Rig s(256, 4, options);
    const std::vector<int32_t> prompt = Iota(42, 7);  // 10 full pages + 2 tokens
    const std::vector<int32_t> other = Iota(6, 900);
    for (uint64_t id = 0; id < 8; ++id) ASSERT_TRUE(s.scheduler.Add(id, prompt, 4).ok());
    ASSERT_TRUE(s.scheduler.Add(8, other, 4).ok());

    // The first sample's prefill steps: no sibling is admitted while it is unfinished.
    int64_t leader_done = -1;
    std::vector<Batch> steps;
    for (int step = 0; step < 8 && leader_done < 0; ++step) {
      steps.push_back(s.engine.Step());
      for (const BatchItem& item : steps.back().items) {
        EXPECT_TRUE(item.seq_id == 0 || item.seq_id == 8) << "budget " << budget << " step "
                                                          << step << ": " << item.seq_id;
      }
      if (s.scheduler.Find(0)->prefilled) leader_done = step;
    }
    ASSERT_GE(leader_done, 0) << "budget " << budget;
    EXPECT_EQ(leader_done, budget == 20 ? 2 : 0) << "budget " << budget;  // 42 = 20 + 20 + 2
    // The unrelated request was not held behind the group: admitted with the leader's last
    // chunk, past the seven siblings queued before it.
    EXPECT_EQ(s.scheduler.Find(8)->num_computed, 6) << "budget " << budget;

    // Next step: the seven siblings, each computing only tokens 40..41 over the cached 40.
    Batch join = s.engine.Step();
    int siblings = 0;
    for (size_t i = join.num_decodes; i < join.items.size(); ++i) {
      const BatchItem& item = join.items[i];
      if (item.seq_id == 0 || item.seq_id == 8) continue;
      ++siblings;
      EXPECT_EQ(item.start, 40) << item.seq_id;
      EXPECT_EQ(item.num_tokens, 2) << item.seq_id;
      EXPECT_EQ(s.scheduler.Find(item.seq_id)->cached_tokens, 40);
    }
    EXPECT_EQ(siblings, 7) << "budget " << budget;

    s.engine.RunToCompletion();
    for (uint64_t id = 0; id < 8; ++id) EXPECT_EQ(s.engine.outputs().at(id), Generate(prompt, 4));
    EXPECT_EQ(s.engine.outputs().at(8), Generate(other, 4));
    // The group computed its prompt once plus 7 × 2 tail tokens.
    EXPECT_EQ(s.radix.matched_tokens(), 7 * 40) << "budget " << budget;
    s.radix.Reset();
    EXPECT_EQ(s.pool.num_free(), s.pool.num_usable());
  }
}

TEST(SchedulerTest, IdenticalPromptsHitThePrefixOfTheFirst) {
  SchedulerOptions options;
  options.max_prefill_tokens = 40;  // one whole prompt per step
  Rig s(128, 4, options);
  const std::vector<int32_t> prompt = Iota(40, 7);
  for (uint64_t id = 0; id < 4; ++id) ASSERT_TRUE(s.scheduler.Add(id, prompt, 4).ok());

  Batch b1 = s.engine.Step();
  ASSERT_EQ(b1.items.size(), 1u);  // only the first fits the prefill budget
  EXPECT_EQ(s.radix.cached_pages(), 10);  // its prompt pages were cached after sampling

  // The other three are admitted next step, sharing the first one's 9 pages (the last page
  // always holds the last prompt token, which is computed for its logits).
  Batch b2 = s.engine.Step();
  ASSERT_EQ(b2.items.size(), 4u);
  EXPECT_EQ(b2.num_decodes, 1);
  const Sequence* first = s.scheduler.Find(0);
  for (uint64_t id = 1; id < 4; ++id) {
    EXPECT_EQ(b2.items[id].seq_id, id);
    EXPECT_EQ(b2.items[id].start, 36);
    EXPECT_EQ(b2.items[id].num_tokens, 4);
    const Sequence* seq = s.scheduler.Find(id);
    EXPECT_EQ(seq->cached_tokens, 36);
    // Their prefill completed and was cached too: the page each computed for tokens 36..39
    // duplicated the tree's, was freed, and the page table now points at the tree's page.
    EXPECT_TRUE(std::equal(seq->pages.begin(), seq->pages.begin() + 10, first->pages.begin()));
    EXPECT_EQ(seq->num_cached_pages, 10);
  }
  EXPECT_EQ(s.radix.cached_pages(), 10);
  // All four share 10 pages; only the first has decoded into an 11th.
  EXPECT_EQ(s.pool.num_free(), s.pool.num_usable() - 11);
  EXPECT_EQ(s.radix.matched_tokens(), 3 * 36);
  EXPECT_EQ(s.radix.queried_tokens(), 4 * 40);

  s.engine.RunToCompletion();
  EXPECT_EQ(s.engine.cached_tokens().at(0), 0);
  for (uint64_t id = 0; id < 4; ++id) {
    EXPECT_EQ(s.engine.outputs().at(id), Generate(prompt, 4));
    if (id > 0) {
      EXPECT_EQ(s.engine.cached_tokens().at(id), 36);
    }
  }
  // A later request with the same prompt plus more hits the whole cached prompt.
  std::vector<int32_t> longer = prompt;
  longer.push_back(1);
  ASSERT_TRUE(s.scheduler.Add(9, longer, 1).ok());
  s.engine.Step();
  EXPECT_EQ(s.engine.cached_tokens().at(9), 40);
  s.radix.Reset();
  EXPECT_EQ(s.pool.num_free(), s.pool.num_usable());
}

TEST(SchedulerTest, PrefixMatchLimitIsHonoured) {
  Rig s(64, 4);
  const std::vector<int32_t> prompt = Iota(20, 3);
  ASSERT_TRUE(s.scheduler.Add(0, prompt, 1).ok());
  s.engine.RunToCompletion();  // caches 5 pages of the prompt
  const int64_t limits[] = {kNoPrefixMatchLimit, 19, 10, 3, 0};
  const int64_t expected[] = {16, 16, 8, 0, 0};
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(s.scheduler.Add(1 + i, prompt, 1, limits[i]).ok());
    Batch b = s.engine.Step();
    ASSERT_EQ(b.items.size(), 1u);
    EXPECT_EQ(b.items[0].start, expected[i]) << "limit " << limits[i];
    EXPECT_EQ(s.engine.cached_tokens().at(1 + i), expected[i]);
  }
}

TEST(SchedulerTest, PreemptionUnderATinyPoolKeepsTheOutputs) {
  // 8 usable pages of 2 tokens. Each sequence needs ceil((4 + 8 - 1) / 2) = 6 pages at the
  // end, so both cannot finish together: the younger one is retracted and recomputed.
  Rig s(9, 2);
  ASSERT_TRUE(s.scheduler.Add(1, Iota(4, 0), 8).ok());
  ASSERT_TRUE(s.scheduler.Add(2, Iota(4, 20), 8).ok());
  bool retracted = false;
  int64_t steps = 0;
  while (!s.scheduler.idle()) {
    Batch b = s.engine.Step();
    for (uint64_t id : b.retracted) {
      EXPECT_EQ(id, 2u);  // the most recently arrived
      const Sequence* seq = s.scheduler.Find(id);
      EXPECT_EQ(seq->state, Sequence::State::kWaiting);
      EXPECT_EQ(seq->num_computed, 0);
      EXPECT_TRUE(seq->pages.empty());
      EXPECT_EQ(s.scheduler.WaitingIds().front(), id);
      retracted = true;
    }
    EXPECT_TRUE(b.out_of_memory.empty());
    ASSERT_LT(++steps, 1000);
  }
  EXPECT_TRUE(retracted);
  EXPECT_EQ(s.engine.retractions().at(1), 0);
  EXPECT_GE(s.engine.retractions().at(2), 1);
  EXPECT_EQ(s.engine.outputs().at(1), Generate(Iota(4, 0), 8));
  EXPECT_EQ(s.engine.outputs().at(2), Generate(Iota(4, 20), 8));
  s.radix.Reset();
  EXPECT_EQ(s.pool.num_free(), s.pool.num_usable());
}

TEST(SchedulerTest, RetractedSequenceReusesItsCachedPages) {
  // Retraction caches the computed full pages, so re-admission starts past them (when nothing
  // evicted them in between).
  SchedulerOptions options;
  Rig s(9, 2, options);
  ASSERT_TRUE(s.scheduler.Add(1, Iota(4, 0), 8).ok());
  ASSERT_TRUE(s.scheduler.Add(2, Iota(4, 20), 6).ok());
  int64_t readmit_start = -1;
  bool was_retracted = false;
  while (!s.scheduler.idle()) {
    Batch b = s.engine.Step();
    for (const BatchItem& item : b.items) {
      if (item.seq_id == 2 && was_retracted && readmit_start < 0) readmit_start = item.start;
    }
    if (!b.retracted.empty()) was_retracted = true;
  }
  ASSERT_TRUE(was_retracted);
  EXPECT_GT(readmit_start, 0);
  EXPECT_EQ(s.engine.outputs().at(2), Generate(Iota(4, 20), 6));
}

TEST(SchedulerTest, RetractAllQueuesEveryRunningSequenceFirstInAdmissionOrder) {
  // The engine's retracting pause: three running sequences (one mid-prefill) and one waiting go
  // back to the queue as 1, 2, 3, 4; their full pages stay cached, and they finish with the
  // outputs they would have had.
  SchedulerOptions options;
  options.max_running_requests = 3;
  options.max_prefill_tokens = 16;
  Rig s(64, 2, options);
  ASSERT_TRUE(s.scheduler.Add(1, Iota(6, 0), 8).ok());
  ASSERT_TRUE(s.scheduler.Add(2, Iota(6, 10), 8).ok());
  ASSERT_TRUE(s.scheduler.Add(3, Iota(12, 30), 8).ok());  // its prefill spans two steps
  ASSERT_TRUE(s.scheduler.Add(4, Iota(5, 50), 8).ok());   // over max_running_requests: waits
  s.engine.Step();  // 1 and 2 prefilled (a token each), 3's first 4 prompt tokens
  ASSERT_EQ(s.scheduler.num_running(), 3);
  ASSERT_FALSE(s.scheduler.Find(3)->prefilled);
  const int64_t cached = s.radix.cached_pages();
  EXPECT_EQ(s.scheduler.RetractAll(), (std::vector<uint64_t>{1, 2, 3}));
  s.scheduler.CheckInvariants();
  EXPECT_EQ(s.scheduler.num_running(), 0);
  EXPECT_EQ(s.scheduler.WaitingIds(), (std::vector<uint64_t>{1, 2, 3, 4}));
  for (uint64_t id : {1, 2, 3}) {
    const Sequence* seq = s.scheduler.Find(id);
    EXPECT_EQ(seq->num_computed, 0) << id;
    EXPECT_TRUE(seq->pages.empty()) << id;
    EXPECT_EQ(seq->num_retractions, 1) << id;
  }
  EXPECT_GT(s.radix.cached_pages(), cached);  // the computed full pages went to the cache
  EXPECT_TRUE(s.scheduler.RetractAll().empty());  // nothing running: nothing to do
  s.engine.RunToCompletion();
  EXPECT_EQ(s.engine.outputs().at(1), Generate(Iota(6, 0), 8));
  EXPECT_EQ(s.engine.outputs().at(2), Generate(Iota(6, 10), 8));
  EXPECT_EQ(s.engine.outputs().at(3), Generate(Iota(12, 30), 8));
  EXPECT_EQ(s.engine.outputs().at(4), Generate(Iota(5, 50), 8));
}

TEST(SchedulerTest, LoneSequenceTooLongForThePoolIsOutOfMemory) {
  Rig s(5, 2);  // 8 usable tokens
  ASSERT_TRUE(s.scheduler.Add(1, Iota(6, 0), 10).ok());
  std::vector<uint64_t> oom;
  int64_t steps = 0;
  while (!s.scheduler.idle()) {
    Batch b = s.engine.Step();
    oom.insert(oom.end(), b.out_of_memory.begin(), b.out_of_memory.end());
    EXPECT_TRUE(b.retracted.empty());
    ASSERT_LT(++steps, 100);
  }
  ASSERT_EQ(oom, std::vector<uint64_t>{1});
  // Positions 0..7 fit: the prompt (6) and two decodes; the token sampled after position 7
  // would need a fifth page.
  EXPECT_EQ(s.engine.outputs().at(1), Generate(Iota(6, 0), 3));
  s.radix.Reset();
  EXPECT_EQ(s.pool.num_free(), s.pool.num_usable());
}

TEST(SchedulerTest, FinishAbortsWaitingAndRunningSequences) {
  SchedulerOptions options;
  options.max_running_requests = 1;
  Rig s(64, 4, options);
  ASSERT_TRUE(s.scheduler.Add(1, Iota(9, 0), 5).ok());
  ASSERT_TRUE(s.scheduler.Add(2, Iota(9, 50), 5).ok());
  s.engine.Step();
  EXPECT_EQ(s.scheduler.num_running(), 1);
  EXPECT_EQ(s.scheduler.num_waiting(), 1);
  EXPECT_TRUE(s.scheduler.Finish(2));  // never scheduled
  EXPECT_TRUE(s.scheduler.Finish(1));  // mid-decode: its 2 full pages go to the cache
  EXPECT_FALSE(s.scheduler.Finish(1));
  EXPECT_TRUE(s.scheduler.idle());
  EXPECT_EQ(s.radix.cached_pages(), 2);
  s.scheduler.CheckInvariants();
  s.radix.Reset();
  EXPECT_EQ(s.pool.num_free(), s.pool.num_usable());
}

TEST(SchedulerTest, PrefillOnlySequencesAndDisabledCache) {
  Rig s(32, 4, {}, /*cache=*/false);
  const std::vector<int32_t> prompt = Iota(30, 1);
  for (uint64_t id = 0; id < 3; ++id) ASSERT_TRUE(s.scheduler.Add(id, prompt, id).ok());
  s.engine.RunToCompletion();
  for (uint64_t id = 0; id < 3; ++id) {
    EXPECT_EQ(s.engine.cached_tokens().at(id), 0);
    EXPECT_EQ(s.engine.outputs().at(id), Generate(prompt, id));
  }
  EXPECT_EQ(s.radix.cached_pages(), 0);
  EXPECT_EQ(s.pool.num_free(), s.pool.num_usable());
}

TEST(SchedulerTest, RollbackUndoesAFailedStep) {
  SchedulerOptions options;
  options.max_prefill_tokens = 12;
  Rig s(64, 4, options);
  ASSERT_TRUE(s.scheduler.Add(1, Iota(6, 0), 4).ok());
  s.engine.Step();  // 1 decodes from now on
  ASSERT_TRUE(s.scheduler.Add(2, Iota(9, 40), 4).ok());
  ASSERT_TRUE(s.scheduler.Add(3, Iota(20, 80), 4).ok());
  const int64_t free_before = s.pool.num_free();
  const int64_t cached_before = s.radix.cached_pages();

  Batch failed = s.scheduler.Schedule();  // decode 1, prefill 2 (9), first chunk of 3 (3)
  ASSERT_EQ(failed.items.size(), 3u);
  EXPECT_TRUE(failed.items[1].completes);
  EXPECT_FALSE(failed.items[2].completes);
  s.scheduler.Rollback(failed);
  s.scheduler.CheckInvariants();
  EXPECT_EQ(s.scheduler.Find(1)->num_computed, 6);
  EXPECT_EQ(s.scheduler.Find(2)->num_computed, 0);
  EXPECT_FALSE(s.scheduler.Find(2)->prefilled);
  EXPECT_EQ(s.scheduler.Find(3)->num_computed, 0);
  EXPECT_EQ(s.pool.num_free(), free_before);

  // Aborting them now caches nothing that was never written.
  EXPECT_TRUE(s.scheduler.Finish(2));
  EXPECT_TRUE(s.scheduler.Finish(3));
  EXPECT_EQ(s.radix.cached_pages(), cached_before);
  s.scheduler.CheckInvariants();

  // The survivor is scheduled again exactly as before and finishes normally.
  Batch retry = s.engine.Step();
  ASSERT_EQ(retry.items.size(), 1u);
  EXPECT_EQ(retry.items[0].start, 6);
  s.engine.RunToCompletion();
  EXPECT_EQ(s.engine.outputs().at(1), Generate(Iota(6, 0), 4));
}

TEST(SchedulerTest, SlotOfMapsPositionsThroughThePageTable) {
  Rig s(16, 4);
  ASSERT_TRUE(s.scheduler.Add(1, Iota(10, 0), 2).ok());
  s.scheduler.Schedule();
  const Sequence* seq = s.scheduler.Find(1);
  ASSERT_EQ(seq->pages.size(), 3u);
  for (int64_t p = 0; p < 12; ++p) {
    EXPECT_EQ(s.scheduler.SlotOf(*seq, p), seq->pages[p / 4] * 4 + p % 4);
  }
}

}  // namespace
}  // namespace slime::engine
