#include "slime/engine/scheduler.h"


#include "absl/container/flat_hash_set.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <utility>

#include "slime/common/check.h"

namespace slime::engine {
namespace {


template <typename T>
int64_t Size(const std::vector<T>& v) {
  return static_cast<int64_t>(v.size());
}

// In-batch prefix sharing: a waiting sequence whose uncached prompt shares at least this many
// tokens with a prompt still being prefilled waits one step, so it can reuse that prompt's
// pages once they are cached instead of computing the same K/V again (SGLang defers such
// requests the same way; its threshold is 32 tokens).
constexpr int64_t kInBatchShareTokens = 32;

constexpr uint64_t kFnvBasis = 1469598103934665603ULL;
uint64_t HashStep(uint64_t h, int32_t token) {
  h ^= static_cast<uint32_t>(token);
  return h * 1099511628211ULL;
}
uint64_t PrefixKey(uint64_t hash, int64_t length) {
  return hash ^ (static_cast<uint64_t>(length) * 0x9E3779B97F4A7C15ULL);
}

}  // namespace

struct Scheduler::Plan {
  Sequence* seq = nullptr;
  int64_t num_tokens = 0;
  bool decode = false;
};

Status ValidateSchedulerOptions(const SchedulerOptions& options) {
  auto check = [](const char* name, int64_t value) -> Status {
    if (value >= 1) return absl::OkStatus();
    return absl::InvalidArgumentError(
        fmt::format("scheduler option {} must be >= 1, got {}", name, value));
  };
  SLIME_RETURN_IF_ERROR(check("max_running_requests", options.max_running_requests));
  SLIME_RETURN_IF_ERROR(check("max_prefill_tokens", options.max_prefill_tokens));
  SLIME_RETURN_IF_ERROR(check("max_batch_tokens", options.max_batch_tokens));
  SLIME_RETURN_IF_ERROR(check("max_context_tokens", options.max_context_tokens));
  return absl::OkStatus();
}

Scheduler::Scheduler(const SchedulerOptions& options, KvPagePool* pool, RadixCache* cache)
    : options_(options), pool_(pool), cache_(cache), page_size_(pool->page_size()) {
  Status valid = ValidateSchedulerOptions(options);
  SLIME_CHECK(valid.ok(), "{}", std::string(valid.message()));
  SLIME_CHECK(cache->pool() == pool, "the radix cache is built on another page pool");
}

Scheduler::~Scheduler() {
  for (auto& [id, seq] : seqs_) {
    if (seq->state != Sequence::State::kRunning) continue;
    pool_->Free(std::span<const int32_t>(seq->pages).subspan(seq->num_cached_pages));
    cache_->Unlock(seq->prefix_node);
  }
}

Status Scheduler::Add(uint64_t id, std::vector<int32_t> prompt, int64_t max_new_tokens,
                      int64_t prefix_match_limit) {
  if (seqs_.contains(id)) {
    return absl::AlreadyExistsError(
        fmt::format("sequence {} is already queued or running in the scheduler", id));
  }
  const int64_t len = Size(prompt);
  if (len == 0) {
    return absl::InvalidArgumentError(
        fmt::format("sequence {}: empty prompt; a request needs at least one input token", id));
  }
  if (len >= options_.max_context_tokens) {
    return absl::InvalidArgumentError(fmt::format(
        "sequence {}: the prompt has {} tokens but the context length is {} tokens; prompts "
        "must be shorter than that (at most {} tokens)",
        id, len, options_.max_context_tokens, options_.max_context_tokens - 1));
  }
  if (pool_->PagesFor(len) > pool_->num_usable()) {
    return absl::InvalidArgumentError(fmt::format(
        "sequence {}: the prompt has {} tokens but the whole KV cache holds {} tokens ({} pages "
        "of {}); shorten the prompt or give the engine more KV cache memory",
        id, len, pool_->num_usable() * page_size_, pool_->num_usable(), page_size_));
  }
  auto seq = std::make_unique<Sequence>();
  seq->id = id;
  seq->tokens = std::move(prompt);
  seq->prompt_len = len;
  const int64_t room = options_.max_context_tokens - len;
  seq->max_new_tokens = max_new_tokens < 0 ? room : std::min(max_new_tokens, room);
  seq->prefix_match_limit = prefix_match_limit < 0 ? kNoPrefixMatchLimit : prefix_match_limit;
  seq->arrival = next_arrival_++;
  waiting_.push_back(seq.get());
  seqs_.emplace(id, std::move(seq));
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Schedule

Batch Scheduler::Schedule() {
  Batch batch;
  std::vector<Plan> plans;
  int64_t prefill_left = options_.max_prefill_tokens;
  int64_t batch_left = options_.max_batch_tokens;

  // (a) Running sequences, oldest first: decodes, then continued prefill chunks. The victim of
  // a retraction is always the youngest running sequence, so a retraction never undoes an older
  // sequence's item; it may undo a younger decode's item while chunks are planned.
  std::vector<Sequence*> by_arrival = running_;
  std::sort(by_arrival.begin(), by_arrival.end(),
            [](const Sequence* a, const Sequence* b) { return a->arrival < b->arrival; });
  // One eviction for all decodes instead of one per page (Evict scans the tree).
  int64_t decode_pages = 0;
  for (const Sequence* seq : running_) {
    if (seq->prefilled && !seq->out_of_memory && seq->num_computed < Size(seq->tokens)) {
      decode_pages += pool_->PagesFor(seq->num_computed + 1) - Size(seq->pages);
    }
  }
  FreeAfterEviction(decode_pages);
  for (Sequence* seq : by_arrival) {
    if (seq->state != Sequence::State::kRunning || seq->out_of_memory || !seq->prefilled) continue;
    const int64_t pending = Size(seq->tokens) - seq->num_computed;
    if (pending == 0) continue;  // sampled nothing (prefill only): the engine finishes it
    SLIME_CHECK(pending == 1, "sequence {} has {} tokens without K/V after its prefill",
                seq->id, pending);
    if (batch_left < 1) break;
    if (!ReservePages(seq, 1, &plans, &batch, &prefill_left, &batch_left)) continue;
    plans.push_back({seq, 1, true});
    batch_left -= 1;
  }
  for (Sequence* seq : by_arrival) {
    if (seq->state != Sequence::State::kRunning || seq->out_of_memory || seq->prefilled) continue;
    const int64_t pending = Size(seq->tokens) - seq->num_computed;
    int64_t n = std::min({pending, prefill_left, batch_left});
    if (n <= 0) continue;
    // Shrink the chunk to the pages available without preempting anyone; when not even one
    // token fits, ask for one page (which may retract).
    const int64_t room =
        (Size(seq->pages) + pool_->num_free() + cache_->evictable_pages()) * page_size_ -
        seq->num_computed;
    n = room >= 1 ? std::min(n, room)
                  : std::min(n, (Size(seq->pages) + 1) * page_size_ - seq->num_computed);
    if (!ReservePages(seq, n, &plans, &batch, &prefill_left, &batch_left)) continue;
    plans.push_back({seq, n, false});
    prefill_left -= n;
    batch_left -= n;
  }

  // (b) Admission, first come first served. Not in a step that had to retract: the pages a
  // retraction freed are for the survivors, and re-admitting the victim at once would thrash.
  if (batch.retracted.empty()) {
    int64_t reserve = 0;  // one page per sequence that will decode next step
    for (const Sequence* seq : running_) reserve += seq->prefilled && !seq->out_of_memory;
    // Page-aligned prompt prefixes (>= kInBatchShareTokens) of sequences still in prefill.
    absl::flat_hash_set<uint64_t> prefilling;
    auto add_prefixes = [&](const Sequence* s) {
      uint64_t h = kFnvBasis;
      const int64_t n = Size(s->tokens) - 1;
      for (int64_t p = 0; p < n; ++p) {
        h = HashStep(h, s->tokens[p]);
        if ((p + 1) % page_size_ == 0 && p + 1 >= kInBatchShareTokens) {
          prefilling.insert(PrefixKey(h, p + 1));
        }
      }
    };
    for (const Sequence* seq : running_) {
      if (!seq->prefilled && !seq->out_of_memory) add_prefixes(seq);
    }
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      Sequence* seq = *it;
      if (seq->out_of_memory) {
        ++it;
        continue;
      }
      if (num_running() >= options_.max_running_requests || prefill_left <= 0 ||
          batch_left <= 0) {
        break;
      }
      if (pool_->PagesFor(Size(seq->tokens)) > pool_->num_usable()) {
        // A retracted sequence that grew past the whole pool: it can never run again.
        seq->out_of_memory = true;
        batch.out_of_memory.push_back(seq->id);
        ++it;
        continue;
      }
      const Admission a =
          TryAdmit(seq, reserve, prefilling, &plans, &prefill_left, &batch_left);
      if (a == Admission::kNoRoom) break;
      if (a == Admission::kDeferred) {
        ++it;
        continue;
      }
      add_prefixes(seq);
      it = waiting_.erase(it);
      ++reserve;
    }
  }

  // (c) Commit: items in plan order (decodes were planned first), num_computed advances.
  for (const Plan& plan : plans) {
    Sequence* seq = plan.seq;
    BatchItem item;
    item.seq_id = seq->id;
    item.start = seq->num_computed;
    item.num_tokens = plan.num_tokens;
    seq->num_computed += plan.num_tokens;
    item.completes = seq->num_computed == Size(seq->tokens);
    SLIME_CHECK(Size(seq->pages) == pool_->PagesFor(seq->num_computed),
                "sequence {}: {} pages for {} tokens", seq->id, seq->pages.size(),
                seq->num_computed);
    if (item.completes && !seq->prefilled) {
      seq->prefilled = true;
      seq->cache_on_append = true;
    }
    if (plan.decode) {
      SLIME_CHECK(batch.num_decodes == Size(batch.items), "a decode planned after a prefill");
      ++batch.num_decodes;
    }
    batch.num_tokens += plan.num_tokens;
    batch.items.push_back(item);
  }
  return batch;
}

int64_t Scheduler::FreeAfterEviction(int64_t pages) {
  if (pool_->num_free() < pages) cache_->Evict(pages - pool_->num_free());
  return pool_->num_free();
}

bool Scheduler::ReservePages(Sequence* seq, int64_t num_tokens, std::vector<Plan>* plans,
                             Batch* batch, int64_t* prefill_left, int64_t* batch_left) {
  const int64_t needed = pool_->PagesFor(seq->num_computed + num_tokens) - Size(seq->pages);
  while (FreeAfterEviction(needed) < needed) {
    Sequence* victim = RetractionVictim();
    const int64_t candidates = std::count_if(running_.begin(), running_.end(),
                                             [](const Sequence* s) { return !s->out_of_memory; });
    if (candidates <= 1) {
      // Alone with the whole pool (less other out-of-memory sequences awaiting Finish).
      seq->out_of_memory = true;
      batch->out_of_memory.push_back(seq->id);
      return false;
    }
    Retract(victim, plans, batch, prefill_left, batch_left);
    if (victim == seq) return false;
  }
  if (needed > 0) {
    std::optional<std::vector<int32_t>> fresh = pool_->Allocate(needed);
    SLIME_CHECK(fresh.has_value(), "allocation of {} pages failed after they were free", needed);
    seq->pages.insert(seq->pages.end(), fresh->begin(), fresh->end());
  }
  return true;
}

Sequence* Scheduler::RetractionVictim() const {
  Sequence* victim = nullptr;
  for (Sequence* seq : running_) {
    if (seq->out_of_memory) continue;
    if (victim == nullptr || seq->arrival > victim->arrival) victim = seq;
  }
  return victim;
}

void Scheduler::Retract(Sequence* seq, std::vector<Plan>* plans, Batch* batch,
                        int64_t* prefill_left, int64_t* batch_left) {
  auto planned = std::find_if(plans->begin(), plans->end(),
                              [seq](const Plan& p) { return p.seq == seq; });
  if (planned != plans->end()) {
    *batch_left += planned->num_tokens;
    if (!planned->decode) *prefill_left += planned->num_tokens;
    plans->erase(planned);
  }
  MoveToWaiting(seq);
  batch->retracted.push_back(seq->id);
}

void Scheduler::MoveToWaiting(Sequence* seq) {
  ReleasePages(seq);
  seq->num_computed = 0;
  seq->prefilled = false;
  seq->cache_on_append = false;
  ++seq->num_retractions;
  seq->state = Sequence::State::kWaiting;
  RemoveRunning(seq);
  waiting_.push_front(seq);
}

std::vector<uint64_t> Scheduler::RetractAll() {
  std::vector<uint64_t> ids;
  // The last admitted first, so the queue's head keeps the admission order.
  const std::vector<Sequence*> running = running_;
  for (auto it = running.rbegin(); it != running.rend(); ++it) {
    MoveToWaiting(*it);
    ids.push_back((*it)->id);
  }
  std::reverse(ids.begin(), ids.end());
  return ids;
}

Scheduler::Admission Scheduler::TryAdmit(Sequence* seq, int64_t reserve,
                                         const absl::flat_hash_set<uint64_t>& prefilling,
                                         std::vector<Plan>* plans, int64_t* prefill_left,
                                         int64_t* batch_left) {
  const int64_t len = Size(seq->tokens);
  int64_t limit = len - 1;  // the last token is always computed: its logits are sampled
  if (seq->prefix_match_limit >= 0) limit = std::min(limit, seq->prefix_match_limit);
  RadixCache::Match match = cache_->MatchPrefix(seq->tokens, limit);
  const int64_t start = match.num_tokens;
  if (cache_->enabled() && !prefilling.empty()) {
    // Would it share >= kInBatchShareTokens uncached tokens with a prompt still in prefill?
    const int64_t share =
        (start + kInBatchShareTokens + page_size_ - 1) / page_size_ * page_size_;
    if (share <= limit) {
      uint64_t h = kFnvBasis;
      for (int64_t p = 0; p < share; ++p) h = HashStep(h, seq->tokens[p]);
      if (prefilling.contains(PrefixKey(h, share))) return Admission::kDeferred;
    }
  }
  cache_->Lock(match.node);
  const int64_t n = std::min({len - start, *prefill_left, *batch_left});
  const int64_t needed = pool_->PagesFor(start + n) - Size(match.pages);
  if (needed + reserve > pool_->num_free() + cache_->evictable_pages()) {
    cache_->Unlock(match.node);
    return Admission::kNoRoom;
  }
  FreeAfterEviction(needed);
  std::optional<std::vector<int32_t>> fresh = pool_->Allocate(needed);
  SLIME_CHECK(fresh.has_value(), "allocation of {} pages failed after eviction", needed);
  seq->num_cached_pages = Size(match.pages);
  seq->pages = std::move(match.pages);
  seq->pages.insert(seq->pages.end(), fresh->begin(), fresh->end());
  seq->prefix_node = match.node;
  seq->num_computed = start;
  seq->state = Sequence::State::kRunning;
  if (!seq->admitted_before) {
    seq->cached_tokens = start;
    seq->admitted_before = true;
  }
  cache_->RecordLookup(len, start);
  running_.push_back(seq);
  plans->push_back({seq, n, false});
  *prefill_left -= n;
  *batch_left -= n;
  return Admission::kAdmitted;
}

// ---------------------------------------------------------------------------------------------
// Pages and the radix cache

void Scheduler::CacheComputedPages(Sequence* seq) {
  if (!cache_->enabled()) return;
  const int64_t full = seq->num_computed / page_size_;
  if (full <= seq->num_cached_pages) return;
  std::span<const int32_t> tokens(seq->tokens.data(), full * page_size_);
  RadixCache::NodeHandle node =
      cache_->Insert(tokens, std::span<const int32_t>(seq->pages.data(), full));
  // Where the tree already had pages for these tokens it kept its own and freed ours: switch
  // the page table to the tree's pages (same tokens, same K/V).
  RadixCache::Match match = cache_->MatchPrefix(tokens, full * page_size_);
  SLIME_CHECK(match.node == node && Size(match.pages) == full,
              "sequence {}: {} inserted pages do not match back ({} matched)", seq->id, full,
              match.pages.size());
  std::copy(match.pages.begin(), match.pages.end(), seq->pages.begin());
  cache_->Lock(node);
  cache_->Unlock(seq->prefix_node);
  seq->prefix_node = node;
  seq->num_cached_pages = full;
}

void Scheduler::ReleasePages(Sequence* seq) {
  const int64_t full = seq->num_computed / page_size_;
  int64_t private_from = seq->num_cached_pages;
  if (cache_->enabled() && full > seq->num_cached_pages) {
    cache_->Insert(std::span<const int32_t>(seq->tokens.data(), full * page_size_),
                   std::span<const int32_t>(seq->pages.data(), full));
    private_from = full;
  }
  pool_->Free(std::span<const int32_t>(seq->pages).subspan(private_from));
  cache_->Unlock(seq->prefix_node);
  seq->pages.clear();
  seq->num_cached_pages = 0;
  seq->prefix_node = nullptr;
}

void Scheduler::RemoveRunning(Sequence* seq) {
  auto it = std::find(running_.begin(), running_.end(), seq);
  SLIME_CHECK(it != running_.end(), "sequence {} is not running", seq->id);
  running_.erase(it);
}

// ---------------------------------------------------------------------------------------------
// After the forward

Sequence& Scheduler::Get(uint64_t id) {
  auto it = seqs_.find(id);
  SLIME_CHECK(it != seqs_.end(), "unknown sequence {}", id);
  return *it->second;
}

void Scheduler::AppendToken(uint64_t id, int32_t token) {
  Sequence& seq = Get(id);
  SLIME_CHECK(seq.state == Sequence::State::kRunning && seq.num_computed == Size(seq.tokens),
              "AppendToken({}): the sequence has no completed item to sample from "
              "(running: {}, {} of {} tokens computed)",
              id, seq.state == Sequence::State::kRunning, seq.num_computed, seq.tokens.size());
  seq.tokens.push_back(token);
  if (seq.cache_on_append) {
    seq.cache_on_append = false;
    CacheComputedPages(&seq);
  }
}

void Scheduler::Rollback(const Batch& batch) {
  for (size_t i = 0; i < batch.items.size(); ++i) {
    const BatchItem& item = batch.items[i];
    Sequence& seq = Get(item.seq_id);
    SLIME_CHECK(seq.state == Sequence::State::kRunning &&
                    seq.num_computed == item.start + item.num_tokens &&
                    Size(seq.tokens) >= seq.num_computed,
                "Rollback: sequence {} is not as the batch left it ({} computed, item [{}, {}))",
                item.seq_id, seq.num_computed, item.start, item.start + item.num_tokens);
    const int64_t keep = pool_->PagesFor(item.start);
    SLIME_CHECK(keep >= seq.num_cached_pages, "Rollback: sequence {} would drop cached pages",
                item.seq_id);
    pool_->Free(std::span<const int32_t>(seq.pages).subspan(keep));
    seq.pages.resize(keep);
    seq.num_computed = item.start;
    if (static_cast<int64_t>(i) >= batch.num_decodes && item.completes) {
      seq.prefilled = false;  // this item was the one completing the prefill
      seq.cache_on_append = false;
    }
  }
}

bool Scheduler::Finish(uint64_t id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return false;
  Sequence* seq = it->second.get();
  if (seq->state == Sequence::State::kRunning) {
    ReleasePages(seq);
    RemoveRunning(seq);
  } else {
    auto w = std::find(waiting_.begin(), waiting_.end(), seq);
    SLIME_CHECK(w != waiting_.end(), "sequence {} is neither running nor waiting", id);
    waiting_.erase(w);
  }
  seqs_.erase(it);
  return true;
}

// ---------------------------------------------------------------------------------------------
// Accessors and invariants

const Sequence* Scheduler::Find(uint64_t id) const {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? nullptr : it->second.get();
}

std::vector<uint64_t> Scheduler::RunningIds() const {
  std::vector<uint64_t> ids;
  for (const Sequence* seq : running_) ids.push_back(seq->id);
  return ids;
}

std::vector<uint64_t> Scheduler::WaitingIds() const {
  std::vector<uint64_t> ids;
  for (const Sequence* seq : waiting_) ids.push_back(seq->id);
  return ids;
}

int64_t Scheduler::SlotOf(const Sequence& seq, int64_t position) const {
  SLIME_CHECK(position >= 0 && position < Size(seq.pages) * page_size_,
              "sequence {}: position {} is outside its {} pages", seq.id, position,
              seq.pages.size());
  return static_cast<int64_t>(seq.pages[position / page_size_]) * page_size_ +
         position % page_size_;
}

void Scheduler::CheckInvariants() const {
  std::vector<int> owners(pool_->num_pages(), 0);
  for (int32_t p : cache_->AllPages()) ++owners[p];
  std::vector<RadixCache::NodeHandle> locks;
  SLIME_CHECK(Size(running_) + static_cast<int64_t>(waiting_.size()) ==
                  static_cast<int64_t>(seqs_.size()),
              "{} running + {} waiting != {} sequences", running_.size(), waiting_.size(),
              seqs_.size());
  SLIME_CHECK(num_running() <= options_.max_running_requests, "{} running > max {}",
              num_running(), options_.max_running_requests);
  for (const Sequence* seq : waiting_) {
    SLIME_CHECK(seq->state == Sequence::State::kWaiting, "sequence {} queued but not waiting",
                seq->id);
    SLIME_CHECK(seq->pages.empty() && seq->prefix_node == nullptr && seq->num_computed == 0 &&
                    seq->num_cached_pages == 0 && !seq->prefilled,
                "waiting sequence {} holds pages, a lock or computed tokens", seq->id);
  }
  for (const Sequence* seq : running_) {
    SLIME_CHECK(seq->state == Sequence::State::kRunning, "sequence {} listed as running",
                seq->id);
    SLIME_CHECK(seq->prefix_node != nullptr, "running sequence {} holds no lock", seq->id);
    SLIME_CHECK(seq->num_computed <= Size(seq->tokens), "sequence {}: {} computed of {} tokens",
                seq->id, seq->num_computed, seq->tokens.size());
    SLIME_CHECK(Size(seq->pages) == pool_->PagesFor(seq->num_computed),
                "sequence {}: {} pages for {} computed tokens", seq->id, seq->pages.size(),
                seq->num_computed);
    SLIME_CHECK(seq->num_cached_pages * page_size_ <= seq->num_computed,
                "sequence {}: {} cached pages beyond {} computed tokens", seq->id,
                seq->num_cached_pages, seq->num_computed);
    SLIME_CHECK(cache_->enabled() || seq->num_cached_pages == 0,
                "sequence {} holds cached pages with the cache disabled", seq->id);
    std::vector<int32_t> path = cache_->PathPages(seq->prefix_node);
    SLIME_CHECK(Size(path) == seq->num_cached_pages &&
                    std::equal(path.begin(), path.end(), seq->pages.begin()),
                "sequence {}: its first {} pages are not the locked tree path ({} pages)",
                seq->id, seq->num_cached_pages, path.size());
    for (size_t i = seq->num_cached_pages; i < seq->pages.size(); ++i) {
      const int32_t p = seq->pages[i];
      SLIME_CHECK(p > 0 && p < pool_->num_pages(), "sequence {} holds page {} out of range",
                  seq->id, p);
      ++owners[p];
    }
    locks.push_back(seq->prefix_node);
  }
  cache_->CheckInvariants(locks);
  SLIME_CHECK(owners[0] == 0 && !pool_->IsFree(0), "page 0 is handed out or free");
  int64_t free = 0;
  for (int32_t p = 1; p < pool_->num_pages(); ++p) {
    const bool is_free = pool_->IsFree(p);
    free += is_free;
    SLIME_CHECK(owners[p] + (is_free ? 1 : 0) == 1,
                "page {} has {} owners besides {} the free list", p, owners[p],
                is_free ? "" : "not");
  }
  SLIME_CHECK(free == pool_->num_free(), "{} pages marked free but the free list holds {}", free,
              pool_->num_free());
}

}  // namespace slime::engine
