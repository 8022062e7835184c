#include "slime/engine/page_pool.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "slime/common/check.h"

namespace slime::engine {

KvPagePool::KvPagePool(int64_t num_pages, int64_t page_size)
    : num_pages_(num_pages), page_size_(page_size) {
  SLIME_CHECK(num_pages >= 2, "KvPagePool needs at least 2 pages (page 0 is reserved), got {}",
              num_pages);
  SLIME_CHECK(num_pages <= (int64_t{1} << 31) - 1, "KvPagePool: {} pages overflow int32 ids",
              num_pages);
  SLIME_CHECK(page_size >= 1, "KvPagePool: page_size must be >= 1, got {}", page_size);
  free_list_.reserve(num_pages - 1);
  for (int64_t p = num_pages - 1; p >= 1; --p) free_list_.push_back(static_cast<int32_t>(p));
  is_free_.assign(num_pages, true);
  is_free_[0] = false;
}

std::optional<std::vector<int32_t>> KvPagePool::Allocate(int64_t n) {
  SLIME_CHECK(n >= 0, "KvPagePool::Allocate({})", n);
  if (n > num_free()) return std::nullopt;
  std::vector<int32_t> pages(free_list_.end() - n, free_list_.end());
  std::reverse(pages.begin(), pages.end());  // hand out the top of the stack first
  free_list_.resize(free_list_.size() - n);
  for (int32_t p : pages) is_free_[p] = false;
  return pages;
}

void KvPagePool::CheckRange(int32_t page) const {
  SLIME_CHECK(page >= 0 && page < num_pages_, "page {} out of range [0, {})", page, num_pages_);
}

void KvPagePool::Free(std::span<const int32_t> pages) {
  for (int32_t p : pages) {
    CheckRange(p);
    SLIME_CHECK(p != 0, "page 0 is reserved and is never handed out, so it cannot be freed");
    SLIME_CHECK(!is_free_[p], "double free of page {}", p);
    is_free_[p] = true;
    free_list_.push_back(p);
  }
}

bool KvPagePool::IsFree(int32_t page) const {
  CheckRange(page);
  return is_free_[page];
}

int64_t KvPagePool::PagesFor(int64_t tokens) const {
  SLIME_CHECK(tokens >= 0, "PagesFor({})", tokens);
  return (tokens + page_size_ - 1) / page_size_;
}

}  // namespace slime::engine
