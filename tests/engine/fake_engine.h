// A stand-in for the engine loop in scheduler tests: a fake K/V store (one int64 per slot,
// holding a hash of the sequence prefix that ends at that position) and a fake model whose
// next token depends only on the tokens so far. Running a batch writes every item's new slots
// and then checks that every context slot of every item holds the right prefix hash, which
// catches wrong page tables, pages shared that should not be, and stale cache hits.
#ifndef SLIME_TESTS_ENGINE_FAKE_ENGINE_H_
#define SLIME_TESTS_ENGINE_FAKE_ENGINE_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <vector>

#include "slime/engine/scheduler.h"

namespace slime::engine::testing {

// h[p] = hash of tokens[0..p].
inline std::vector<uint64_t> PrefixHashes(const std::vector<int32_t>& tokens) {
  std::vector<uint64_t> h(tokens.size());
  uint64_t x = 1469598103934665603ull;
  for (size_t i = 0; i < tokens.size(); ++i) {
    x = (x ^ static_cast<uint32_t>(tokens[i])) * 1099511628211ull;
    x ^= x >> 29;
    h[i] = x;
  }
  return h;
}

// The fake model: the token after `tokens`.
inline int32_t NextToken(const std::vector<int32_t>& tokens) {
  return static_cast<int32_t>(PrefixHashes(tokens).back() % 997);
}

// What a sequence generates alone: `n` tokens after `prompt`.
inline std::vector<int32_t> Generate(std::vector<int32_t> prompt, int64_t n) {
  std::vector<int32_t> out;
  for (int64_t i = 0; i < n; ++i) {
    out.push_back(NextToken(prompt));
    prompt.push_back(out.back());
  }
  return out;
}

class FakeEngine {
 public:
  explicit FakeEngine(Scheduler* scheduler)
      : scheduler_(scheduler), slots_(scheduler->pool().num_slots(), 0) {}

  // Schedule → CheckInvariants → forward → AppendToken / Finish; sequences finish when they
  // reach max_new_tokens (0: right after the prefill). Out-of-memory sequences are finished
  // (aborted) and recorded.
  Batch Step() {
    Batch batch = scheduler_->Schedule();
    scheduler_->CheckInvariants();
    Forward(batch);
    for (const BatchItem& item : batch.items) {
      if (!item.completes) continue;
      const Sequence* seq = scheduler_->Find(item.seq_id);
      if (seq->output_len() < seq->max_new_tokens) {
        scheduler_->AppendToken(seq->id, NextToken(seq->tokens));
      }
      if (seq->output_len() >= seq->max_new_tokens) Complete(seq->id);
    }
    for (uint64_t id : batch.out_of_memory) {
      out_of_memory_.push_back(id);
      const Sequence* seq = scheduler_->Find(id);
      outputs_[id] = std::vector<int32_t>(seq->tokens.begin() + seq->prompt_len, seq->tokens.end());
      EXPECT_TRUE(scheduler_->Finish(id));
    }
    scheduler_->CheckInvariants();
    return batch;
  }

  // Steps until the scheduler is idle; fails after max_steps (a deadlock).
  int64_t RunToCompletion(int64_t max_steps = 100000) {
    int64_t steps = 0;
    while (!scheduler_->idle()) {
      Step();
      if (++steps > max_steps) {
        ADD_FAILURE() << "no completion after " << max_steps << " steps";
        break;
      }
    }
    return steps;
  }

  // Writes the items' K/V, then checks each item's whole context.
  void Forward(const Batch& batch) {
    int64_t total = 0;
    for (const BatchItem& item : batch.items) {
      const Sequence* seq = scheduler_->Find(item.seq_id);
      ASSERT_NE(seq, nullptr);
      EXPECT_EQ(item.start + item.num_tokens, seq->num_computed);
      EXPECT_EQ(item.completes, seq->num_computed == seq->output_len() + seq->prompt_len);
      EXPECT_GE(static_cast<int64_t>(seq->pages.size()) * scheduler_->pool().page_size(),
                seq->num_computed);
      const std::vector<uint64_t> h = PrefixHashes(seq->tokens);
      for (int64_t p = item.start; p < item.start + item.num_tokens; ++p) {
        slots_[scheduler_->SlotOf(*seq, p)] = h[p];
      }
      total += item.num_tokens;
    }
    EXPECT_EQ(total, batch.num_tokens);
    for (const BatchItem& item : batch.items) {
      const Sequence* seq = scheduler_->Find(item.seq_id);
      const std::vector<uint64_t> h = PrefixHashes(seq->tokens);
      for (int64_t p = 0; p < item.start + item.num_tokens; ++p) {
        const int64_t slot = scheduler_->SlotOf(*seq, p);
        EXPECT_GE(slot, scheduler_->pool().page_size()) << "page 0 is reserved";
        if (slots_[slot] != h[p]) {
          ADD_FAILURE() << "sequence " << seq->id << " position " << p << " slot " << slot
                        << " holds the K/V of another prefix";
          return;
        }
      }
    }
  }

  void Complete(uint64_t id) {
    const Sequence* seq = scheduler_->Find(id);
    outputs_[id] = std::vector<int32_t>(seq->tokens.begin() + seq->prompt_len, seq->tokens.end());
    cached_tokens_[id] = seq->cached_tokens;
    retractions_[id] = seq->num_retractions;
    EXPECT_TRUE(scheduler_->Finish(id));
  }

  const std::map<uint64_t, std::vector<int32_t>>& outputs() const { return outputs_; }
  const std::map<uint64_t, int64_t>& cached_tokens() const { return cached_tokens_; }
  const std::map<uint64_t, int64_t>& retractions() const { return retractions_; }
  const std::vector<uint64_t>& out_of_memory() const { return out_of_memory_; }

 private:
  Scheduler* scheduler_;
  std::vector<uint64_t> slots_;  // [num_slots]: prefix hash of the token whose K/V is there
  std::map<uint64_t, std::vector<int32_t>> outputs_;
  std::map<uint64_t, int64_t> cached_tokens_;
  std::map<uint64_t, int64_t> retractions_;
  std::vector<uint64_t> out_of_memory_;
};

}  // namespace slime::engine::testing

#endif  // SLIME_TESTS_ENGINE_FAKE_ENGINE_H_
