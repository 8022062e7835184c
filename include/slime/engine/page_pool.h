// KvPagePool: the free list of K/V pages of one engine. Pure bookkeeping, no LibTorch.
//
// The engine keeps K/V for every layer in one flat pool of token slots per layer,
// [num_pages * page_size, kv_heads, head_dim] (PagedKvCache). This class decides which pages are
// free. The slot of position p of a sequence with page table `pages` is
// pages[p / page_size] * page_size + p % page_size.
//
// Page 0 is reserved: it is the padding target of batched attention and is never handed out,
// so a pool of num_pages pages has num_pages - 1 usable pages.
//
// Ownership: the pool owns nothing but the free list. A page that is not free belongs to exactly
// one holder outside the pool (the radix cache or one sequence); the holder returns it with
// Free(). Allocation order is deterministic (lowest page ids first on a fresh pool, then LIFO).
//
// Thread-safety: none. The engine thread owns the pool, the radix cache and the scheduler.
//
// Invariants: num_free() + (pages held outside) == num_usable(); page 0 is never free or held.
#ifndef SLIME_ENGINE_PAGE_POOL_H_
#define SLIME_ENGINE_PAGE_POOL_H_

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace slime::engine {

class KvPagePool {
 public:
  // CHECK-fails unless num_pages >= 2 (page 0 is reserved) and page_size >= 1.
  KvPagePool(int64_t num_pages, int64_t page_size);

  KvPagePool(const KvPagePool&) = delete;
  KvPagePool& operator=(const KvPagePool&) = delete;

  // `n` pages, all or nothing: nullopt (and nothing taken) when fewer than n are free.
  // n == 0 gives an empty vector. CHECK-fails on n < 0.
  std::optional<std::vector<int32_t>> Allocate(int64_t n);

  // Returns pages to the free list. CHECK-fails on page 0, an id out of range, or a page that
  // is already free (double free), naming the page.
  void Free(std::span<const int32_t> pages);

  bool IsFree(int32_t page) const;  // CHECK-fails on an id out of range

  int64_t num_free() const { return static_cast<int64_t>(free_list_.size()); }
  int64_t num_usable() const { return num_pages_ - 1; }
  int64_t num_pages() const { return num_pages_; }
  int64_t page_size() const { return page_size_; }
  int64_t num_slots() const { return num_pages_ * page_size_; }

  // Pages that hold `tokens` tokens: ceil(tokens / page_size). CHECK-fails on tokens < 0.
  int64_t PagesFor(int64_t tokens) const;

 private:
  void CheckRange(int32_t page) const;

  int64_t num_pages_;
  int64_t page_size_;
  std::vector<int32_t> free_list_;  // a stack; back() is handed out next
  std::vector<bool> is_free_;       // [num_pages]
};

}  // namespace slime::engine

#endif  // SLIME_ENGINE_PAGE_POOL_H_
