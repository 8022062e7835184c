#include "slime/engine/radix_cache.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "slime/engine/page_pool.h"

namespace slime::engine {
namespace {

constexpr int64_t kPage = 4;

std::vector<int32_t> Iota(int64_t n, int32_t first) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

class RadixCacheTest : public ::testing::Test {
 protected:
  // Inserts `tokens` (whole pages) with freshly allocated pages; returns those pages.
  std::vector<int32_t> InsertFresh(const std::vector<int32_t>& tokens) {
    auto pages = pool_.Allocate(static_cast<int64_t>(tokens.size()) / kPage);
    EXPECT_TRUE(pages.has_value());
    cache_.Insert(tokens, *pages);
    return *pages;
  }
  void Check(std::vector<RadixCache::NodeHandle> locks = {}) {
    cache_.CheckInvariants(locks);
    EXPECT_EQ(pool_.num_free() + cache_.cached_pages(), pool_.num_usable());
  }

  KvPagePool pool_{33, kPage};
  RadixCache cache_{&pool_, /*enabled=*/true};
};

TEST_F(RadixCacheTest, MatchWholePagesAndSplitAtPageBoundaries) {
  const std::vector<int32_t> a = Iota(12, 100);  // 3 pages
  const std::vector<int32_t> pages = InsertFresh(a);
  EXPECT_EQ(cache_.cached_pages(), 3);
  EXPECT_EQ(cache_.num_nodes(), 1);

  RadixCache::Match full = cache_.MatchPrefix(a, 12);
  EXPECT_EQ(full.num_tokens, 12);
  EXPECT_EQ(full.pages, pages);
  EXPECT_EQ(cache_.PathPages(full.node), pages);

  // Longer query: still 3 pages. A partial last page never matches.
  std::vector<int32_t> longer = Concat(a, {1, 2, 3});
  EXPECT_EQ(cache_.MatchPrefix(longer, 100).num_tokens, 12);
  EXPECT_EQ(cache_.MatchPrefix(std::vector<int32_t>(a.begin(), a.begin() + 11), 100).num_tokens,
            8);

  // A token limit inside the node splits it after 2 pages; the old handle keeps its meaning.
  RadixCache::Match limited = cache_.MatchPrefix(a, 10);
  EXPECT_EQ(limited.num_tokens, 8);
  EXPECT_EQ(limited.pages, std::vector<int32_t>(pages.begin(), pages.begin() + 2));
  EXPECT_EQ(cache_.num_nodes(), 2);
  EXPECT_EQ(cache_.PathPages(full.node), pages);
  EXPECT_EQ(cache_.MatchPrefix(a, 12).node, full.node);

  // A difference inside the second page: only the first page matches (split there).
  std::vector<int32_t> b = a;
  b[6] = -1;
  RadixCache::Match one = cache_.MatchPrefix(b, 12);
  EXPECT_EQ(one.num_tokens, 4);
  EXPECT_EQ(one.pages, std::vector<int32_t>{pages[0]});
  EXPECT_EQ(cache_.num_nodes(), 3);

  // Nothing in common / max_tokens below one page.
  EXPECT_EQ(cache_.MatchPrefix(Iota(8, 0), 8).node, cache_.root());
  EXPECT_EQ(cache_.MatchPrefix(a, 3).num_tokens, 0);
  EXPECT_EQ(cache_.cached_pages(), 3);
  Check();
}

TEST_F(RadixCacheTest, InsertBranchesAndReturnsTheDeepestNode) {
  const std::vector<int32_t> a = Iota(12, 100);
  InsertFresh(a);
  std::vector<int32_t> b = Concat(std::vector<int32_t>(a.begin(), a.begin() + 4), Iota(8, 500));
  auto b_pages = pool_.Allocate(3);
  ASSERT_TRUE(b_pages.has_value());
  const int64_t free_before = pool_.num_free();
  RadixCache::NodeHandle b_node = cache_.Insert(b, *b_pages);
  EXPECT_EQ(pool_.num_free(), free_before + 1);  // b's first page duplicated a's: freed
  EXPECT_EQ(cache_.cached_pages(), 5);
  EXPECT_EQ(cache_.num_nodes(), 3);  // [a0] -> {[a1 a2], [b1 b2]}
  RadixCache::Match mb = cache_.MatchPrefix(b, 12);
  EXPECT_EQ(mb.node, b_node);
  EXPECT_EQ(mb.num_tokens, 12);
  EXPECT_EQ(mb.pages[1], (*b_pages)[1]);
  EXPECT_EQ(mb.pages[2], (*b_pages)[2]);

  // Inserting a strict prefix splits and returns the node ending exactly there.
  RadixCache::Match ma = cache_.MatchPrefix(a, 12);
  std::vector<int32_t> a8(a.begin(), a.begin() + 8);
  std::vector<int32_t> a8_pages(ma.pages.begin(), ma.pages.begin() + 2);
  RadixCache::NodeHandle a8_node = cache_.Insert(a8, a8_pages);
  EXPECT_EQ(cache_.PathPages(a8_node), a8_pages);
  EXPECT_EQ(cache_.MatchPrefix(a8, 8).node, a8_node);
  EXPECT_EQ(cache_.Insert({}, {}), cache_.root());
  Check();
}

TEST_F(RadixCacheTest, DuplicatePagesAreFreedUnlessTheyAreTheTreesOwn) {
  const std::vector<int32_t> a = Iota(8, 7);
  const std::vector<int32_t> tree_pages = InsertFresh(a);
  const int64_t free0 = pool_.num_free();

  // A caller that matched the prefix hands back the tree's pages plus a new one.
  RadixCache::Match m = cache_.MatchPrefix(a, 8);
  auto extra = pool_.Allocate(1);
  ASSERT_TRUE(extra.has_value());
  std::vector<int32_t> pages = Concat(m.pages, *extra);
  cache_.Insert(Concat(a, Iota(4, 900)), pages);
  EXPECT_EQ(pool_.num_free(), free0 - 1);  // nothing freed, the extra page taken over
  EXPECT_EQ(cache_.cached_pages(), 3);

  // A caller that computed the same prefix into its own pages: both are freed.
  auto own = pool_.Allocate(2);
  ASSERT_TRUE(own.has_value());
  cache_.Insert(a, *own);
  EXPECT_EQ(pool_.num_free(), free0 - 1);
  EXPECT_TRUE(pool_.IsFree((*own)[0]));
  EXPECT_TRUE(pool_.IsFree((*own)[1]));
  EXPECT_EQ(cache_.MatchPrefix(a, 8).pages, tree_pages);
  Check();
}

TEST_F(RadixCacheTest, LockedPathsAreNeverEvicted) {
  const std::vector<int32_t> a = Iota(12, 0);
  const std::vector<int32_t> b = Iota(8, 1000);
  InsertFresh(a);
  InsertFresh(b);
  RadixCache::Match ma = cache_.MatchPrefix(a, 8);  // splits a: [a0 a1] -> [a2]
  cache_.Lock(ma.node);
  EXPECT_EQ(cache_.locked_pages(), 2);
  EXPECT_EQ(cache_.evictable_pages(), 3);
  Check({ma.node});

  EXPECT_EQ(cache_.Evict(100), 3);  // a2 and b; a0 a1 are locked
  EXPECT_EQ(cache_.cached_pages(), 2);
  EXPECT_EQ(cache_.evictable_pages(), 0);
  EXPECT_EQ(cache_.Evict(1), 0);
  EXPECT_EQ(cache_.MatchPrefix(a, 12).num_tokens, 8);
  Check({ma.node});

  // Two locks on the same node need two unlocks.
  cache_.Lock(ma.node);
  cache_.Unlock(ma.node);
  EXPECT_EQ(cache_.evictable_pages(), 0);
  cache_.Unlock(ma.node);
  EXPECT_EQ(cache_.evictable_pages(), 2);
  EXPECT_EQ(cache_.Evict(1), 2);  // whole nodes go
  EXPECT_EQ(cache_.cached_pages(), 0);
  EXPECT_EQ(cache_.num_nodes(), 0);
  Check();
}

TEST_F(RadixCacheTest, EvictsLeastRecentlyUsedLeavesFirstThenTheirParents) {
  const std::vector<int32_t> x = Iota(4, 0);
  const std::vector<int32_t> y = Iota(4, 100);
  const std::vector<int32_t> z = Iota(4, 200);
  const std::vector<int32_t> xp = InsertFresh(x);
  const std::vector<int32_t> yp = InsertFresh(y);
  const std::vector<int32_t> zp = InsertFresh(z);
  cache_.MatchPrefix(x, 4);  // x is now the most recently used, y the least

  EXPECT_EQ(cache_.Evict(1), 1);
  EXPECT_TRUE(pool_.IsFree(yp[0]));
  EXPECT_EQ(cache_.MatchPrefix(y, 4).num_tokens, 0);
  EXPECT_EQ(cache_.Evict(1), 1);
  EXPECT_TRUE(pool_.IsFree(zp[0]));
  EXPECT_EQ(cache_.MatchPrefix(x, 4).num_tokens, 4);

  // A parent becomes a leaf once its children are gone: p -> {c1, c2}.
  const std::vector<int32_t> c1 = Concat(Iota(8, 300), Iota(4, 50));
  const std::vector<int32_t> c2 = Concat(Iota(8, 300), Iota(4, 60));
  InsertFresh(c1);
  InsertFresh(c2);  // frees its duplicate of the two shared pages
  EXPECT_EQ(cache_.cached_pages(), 5);
  cache_.MatchPrefix(x, 4);  // x newest again
  EXPECT_EQ(cache_.Evict(3), 4);  // c1 (1), c2 (1), then their parent (2 pages)
  EXPECT_EQ(cache_.cached_pages(), 1);
  EXPECT_EQ(cache_.MatchPrefix(x, 4).pages, xp);
  EXPECT_EQ(cache_.evicted_pages_total(), 6);
  Check();
}

TEST_F(RadixCacheTest, ResetFreesEverything) {
  InsertFresh(Iota(12, 0));
  InsertFresh(Iota(8, 50));
  EXPECT_EQ(cache_.cached_pages(), 5);
  cache_.Reset();
  EXPECT_EQ(cache_.cached_pages(), 0);
  EXPECT_EQ(cache_.num_nodes(), 0);
  EXPECT_EQ(pool_.num_free(), pool_.num_usable());
  EXPECT_EQ(cache_.MatchPrefix(Iota(12, 0), 12).num_tokens, 0);
  InsertFresh(Iota(4, 0));  // usable again
  Check();
}

TEST_F(RadixCacheTest, StatisticsAreRecordedByTheOwner) {
  cache_.RecordLookup(10, 4);
  cache_.RecordLookup(6, 0);
  EXPECT_EQ(cache_.queried_tokens(), 16);
  EXPECT_EQ(cache_.matched_tokens(), 4);
}

TEST(RadixCacheDeathTest, ResetWhileLockedAndUnbalancedUnlock) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  KvPagePool pool(9, 2);
  RadixCache cache(&pool, true);
  auto pages = pool.Allocate(2);
  ASSERT_TRUE(pages.has_value());
  RadixCache::NodeHandle node = cache.Insert(Iota(4, 0), *pages);
  cache.Lock(node);
  EXPECT_DEATH(cache.Reset(), "locked pages");
  cache.Unlock(node);
  EXPECT_DEATH(cache.Unlock(node), "not locked");
}

TEST(RadixCacheDisabledTest, InsertFreesAndMatchFindsNothing) {
  KvPagePool pool(9, 2);
  RadixCache cache(&pool, /*enabled=*/false);
  auto pages = pool.Allocate(3);
  ASSERT_TRUE(pages.has_value());
  const std::vector<int32_t> tokens = Iota(6, 0);
  EXPECT_EQ(cache.Insert(tokens, *pages), cache.root());
  EXPECT_EQ(pool.num_free(), pool.num_usable());
  RadixCache::Match m = cache.MatchPrefix(tokens, 6);
  EXPECT_EQ(m.num_tokens, 0);
  EXPECT_TRUE(m.pages.empty());
  EXPECT_EQ(m.node, cache.root());
  cache.Lock(m.node);  // the root: a no-op
  cache.Unlock(m.node);
  EXPECT_EQ(cache.cached_pages(), 0);
  EXPECT_EQ(cache.Evict(10), 0);
  cache.Reset();
  cache.CheckInvariants({});
}

}  // namespace
}  // namespace slime::engine
