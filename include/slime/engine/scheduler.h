// Scheduler: which tokens of which sequences the engine computes in its next forward, and which
// K/V pages they go to. Pure bookkeeping over KvPagePool and RadixCache, no LibTorch.
//
// One step is a few small stages, all inside Schedule():
//   (a) running sequences that need K/V for new tokens get them: a decode (exactly the last
//       sampled token) or the next chunk of a partially prefilled token list. A page shortage
//       is met by evicting cached prefixes, then by retracting (preempting) the most recently
//       arrived running sequence; a lone sequence that still cannot get a page is reported as
//       out of memory.
//   (b) waiting sequences are admitted first come, first served, while the token budgets,
//       max_running_requests and the pages allow: prefix match, lock, and a first chunk (a
//       prompt larger than the remaining prefill budget is split across steps; its first chunk
//       may share a step with decodes). No admission in a step that had to retract. A waiting
//       sequence whose not-yet-cached prompt shares >= 32 tokens (page-aligned) with a prompt
//       still being prefilled is skipped for this step (in-batch prefix sharing: the n samples
//       of one GRPO prompt arrive together; the first is prefilled, the others hit its pages
//       next step instead of computing the same K/V in parallel).
//   (c) every item's pages are allocated, num_computed advances, the Batch is built.
//
// The engine loop drives it strictly in this order, on its one thread:
//   Add()* → Schedule() → run the forward over batch.items (write K/V, sample for `completes`
//   items) → AppendToken() for each sampled token → Finish() for finished or aborted sequences
//   (and every id in batch.out_of_memory) → Schedule() → ...
// If the forward fails, Rollback(batch) before finishing (aborting) its sequences.
// Schedule() assumes the previous batch has been executed: it (and AppendToken/Finish) hand
// computed pages to the radix cache, which other sequences then read.
//
// Retraction. The victim's computed full pages go to the radix cache, the rest is freed, and
// num_computed drops to 0; it waits at the front of the queue. Re-admitted, it is prefilled
// again over its whole token list (prompt and output so far, reusing what is still cached) and
// its completing item samples its next output token. Its prompt positions are computed again,
// so an engine collecting prompt logprobs must not collect them twice.
//
// Page ownership. Every usable page is in exactly one place: the pool's free list, the radix
// tree, or one sequence's private pages. A running sequence's page table `pages` is
// pages[0:num_cached_pages] (tree pages, pinned by a lock on prefix_node) followed by private
// pages. When a sequence's prefill completes (at the AppendToken after it), its computed full
// pages are inserted into the tree, so later requests with the same prompt hit it; on
// retraction and on Finish its computed full pages are inserted as well.
//
// Ownership: the scheduler owns its Sequences; `pool` and `cache` (built on that pool) are
// borrowed and must outlive it. The destructor returns private pages and locks without caching.
// /flush_cache (RadixCache::Reset) is only valid while num_running() == 0.
//
// Thread-safety: none; the engine thread only.
//
// Invariants (CheckInvariants, used by tests): the page ownership above; every running
// sequence holds exactly one lock (on prefix_node) and pages.size() == PagesFor(num_computed);
// waiting sequences hold no pages and no lock and have num_computed == 0.
#ifndef SLIME_ENGINE_SCHEDULER_H_
#define SLIME_ENGINE_SCHEDULER_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "slime/common/status.h"
#include "slime/engine/page_pool.h"
#include "slime/engine/radix_cache.h"

namespace slime::engine {

struct SchedulerOptions {
  int64_t max_running_requests = 256;  // sequences holding K/V at once
  int64_t max_prefill_tokens = 8192;   // prefill tokens per step (the chunk budget)
  int64_t max_batch_tokens = 16384;    // all tokens of one step, decodes included
  int64_t max_context_tokens = 32768;  // prompt + output per sequence (the model's context)
};

// OK, or InvalidArgument naming the field: every limit must be >= 1.
Status ValidateSchedulerOptions(const SchedulerOptions& options);

// No cap on prefix reuse (Add's prefix_match_limit).
inline constexpr int64_t kNoPrefixMatchLimit = -1;

// One generation sequence as the scheduler sees it. Read-only outside the scheduler.
struct Sequence {
  enum class State { kWaiting, kRunning };

  uint64_t id = 0;
  std::vector<int32_t> tokens;  // prompt + tokens sampled so far
  int64_t prompt_len = 0;
  int64_t max_new_tokens = 0;   // as given, clipped to max_context_tokens - prompt_len
  // tokens[0:num_computed] have K/V in `pages` (counting the step just scheduled: see
  // Schedule). While running, pages.size() == PagesFor(num_computed); 0 while waiting.
  int64_t num_computed = 0;
  std::vector<int32_t> pages;  // page table: position p lives in slot SlotOf(*this, p)
  int64_t num_cached_pages = 0;  // pages[0:num_cached_pages] belong to the radix tree
  // The locked tree node whose path is exactly those pages (the root for none); null while
  // waiting.
  RadixCache::NodeHandle prefix_node = nullptr;
  int64_t prefix_match_limit = kNoPrefixMatchLimit;  // >= 0: reuse at most this many tokens
  int64_t cached_tokens = 0;     // prompt tokens matched in the cache at the first admission
  int64_t num_retractions = 0;   // times preempted (K/V dropped, recomputed after re-admission)
  uint64_t arrival = 0;          // Add() order
  State state = State::kWaiting;
  bool prefilled = false;        // a `completes` item was scheduled since the last admission:
                                 // the next item is a decode of the last sampled token
  bool out_of_memory = false;    // reported in Batch::out_of_memory; never scheduled again
  bool admitted_before = false;
  bool cache_on_append = false;  // prefill completed: cache its pages at the next AppendToken

  int64_t output_len() const { return static_cast<int64_t>(tokens.size()) - prompt_len; }
};

// A run of new tokens of one sequence in a forward: positions [start, start + num_tokens).
struct BatchItem {
  uint64_t seq_id = 0;
  int64_t start = 0;       // == the sequence's num_computed before this step
  int64_t num_tokens = 0;
  bool completes = false;  // start + num_tokens == tokens.size(): the engine samples after it
};

struct Batch {
  std::vector<BatchItem> items;      // decodes first (num_decodes of them), then prefills
  int64_t num_decodes = 0;
  int64_t num_tokens = 0;            // sum of items' num_tokens
  std::vector<uint64_t> retracted;   // moved back to the front of the waiting queue this step
  std::vector<uint64_t> out_of_memory;  // cannot get pages even alone: the engine aborts them
  // No items. retracted / out_of_memory may still be non-empty.
  bool empty() const { return items.empty(); }
};

class Scheduler {
 public:
  // CHECK-fails on invalid options (validate user input with ValidateSchedulerOptions first)
  // or on a cache built on another pool.
  Scheduler(const SchedulerOptions& options, KvPagePool* pool, RadixCache* cache);
  ~Scheduler();

  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a sequence at the back of the waiting queue. max_new_tokens < 0 means "until the
  // context limit"; it is clipped to max_context_tokens - prompt_len (the engine finishes the
  // sequence; the scheduler only reports it). prefix_match_limit >= 0 caps prefix reuse at
  // that many tokens (the engine needs hidden states from there on for prompt logprobs); it
  // applies to every admission. Whatever the limit, the last token of the list is always
  // computed, so its logits exist.
  // Errors: AlreadyExists for a live id; InvalidArgument for an empty prompt, a prompt of
  // max_context_tokens or more, or one whose K/V cannot fit in the whole pool.
  Status Add(uint64_t id, std::vector<int32_t> prompt, int64_t max_new_tokens,
             int64_t prefix_match_limit = kNoPrefixMatchLimit);

  // The next step (stages (a)-(c) above). For every returned item, the sequence's
  // num_computed has already advanced to start + num_tokens and its pages cover
  // [0, start + num_tokens): the engine writes the items' K/V into SlotOf(seq, p) for
  // p in [start, start + num_tokens) and attends over [0, start + num_tokens).
  Batch Schedule();

  // The engine could not run `batch` (the forward failed): undoes what Schedule did to its
  // items — num_computed goes back to item.start, pages beyond it return to the pool, a prefill
  // that was to complete is pending again — so Finish() caches only K/V that was written.
  // Retractions and out-of-memory reports of the batch stand. Call before any AppendToken or
  // Finish for the batch's sequences; CHECK-fails on a batch that is not the last scheduled.
  void Rollback(const Batch& batch);

  // After sampling `token` for a `completes` item of a running sequence (CHECKed: the sequence
  // is running and num_computed == tokens.size()). After a completed prefill this inserts the
  // sequence's full computed pages into the radix cache and moves its lock there.
  void AppendToken(uint64_t id, int32_t token);

  // Forgets a sequence, running or waiting (finish, abort, out of memory): its computed full
  // pages go to the radix cache, its lock is released, the partial last page is freed.
  // Returns false for an unknown id. Call between steps only (after the last batch ran).
  bool Finish(uint64_t id);

  // Retracts every running sequence (as a page shortage retracts one: computed full pages to
  // the radix cache, num_computed 0), in admission order at the head of the waiting queue; the
  // ids in that order. Between steps only. The engine's retracting pause.
  std::vector<uint64_t> RetractAll();

  const Sequence* Find(uint64_t id) const;
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  bool idle() const { return seqs_.empty(); }
  std::vector<uint64_t> RunningIds() const;  // admission order
  std::vector<uint64_t> WaitingIds() const;  // queue order (next to admit first)

  // The K/V slot of `position` of `seq`: pages[position / page_size] * page_size +
  // position % page_size. CHECK-fails unless 0 <= position < pages.size() * page_size.
  int64_t SlotOf(const Sequence& seq, int64_t position) const;

  const SchedulerOptions& options() const { return options_; }
  KvPagePool& pool() const { return *pool_; }
  RadixCache& cache() const { return *cache_; }

  // CHECK-fails on a broken invariant (see the top of this file). O(pages + nodes + tokens).
  void CheckInvariants() const;

 private:
  struct Plan;  // one item being built by Schedule

  Sequence& Get(uint64_t id);
  int64_t FreeAfterEviction(int64_t pages);  // evicts toward `pages` free pages
  bool ReservePages(Sequence* seq, int64_t num_tokens, std::vector<Plan>* plans, Batch* batch,
                    int64_t* prefill_left, int64_t* batch_left);
  Sequence* RetractionVictim() const;
  void Retract(Sequence* seq, std::vector<Plan>* plans, Batch* batch, int64_t* prefill_left,
               int64_t* batch_left);
  enum class Admission { kAdmitted, kDeferred, kNoRoom };
  // kDeferred: shares an uncached prefix with a prompt still in prefill (wait one step).
  Admission TryAdmit(Sequence* seq, int64_t reserve,
                     const absl::flat_hash_set<uint64_t>& prefilling, std::vector<Plan>* plans,
                     int64_t* prefill_left,
                int64_t* batch_left);
  void CacheComputedPages(Sequence* seq);  // running, mid-flight: share computed full pages
  void ReleasePages(Sequence* seq);        // cache computed full pages, free the rest, unlock
  void RemoveRunning(Sequence* seq);
  void MoveToWaiting(Sequence* seq);       // a retraction: pages released, head of the queue

  SchedulerOptions options_;
  KvPagePool* pool_;
  RadixCache* cache_;
  int64_t page_size_;
  absl::flat_hash_map<uint64_t, std::unique_ptr<Sequence>> seqs_;
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;  // admission order
  uint64_t next_arrival_ = 0;
};

}  // namespace slime::engine

#endif  // SLIME_ENGINE_SCHEDULER_H_
