#include "slime/engine/page_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace slime::engine {
namespace {

TEST(KvPagePoolTest, PageZeroIsReservedAndAllocationIsAllOrNothing) {
  KvPagePool pool(5, 4);
  EXPECT_EQ(pool.num_usable(), 4);
  EXPECT_EQ(pool.num_free(), 4);
  EXPECT_EQ(pool.page_size(), 4);
  EXPECT_EQ(pool.num_slots(), 20);

  auto three = pool.Allocate(3);
  ASSERT_TRUE(three.has_value());
  EXPECT_EQ(*three, (std::vector<int32_t>{1, 2, 3}));  // deterministic: lowest ids first
  EXPECT_EQ(pool.num_free(), 1);
  EXPECT_FALSE(pool.Allocate(2).has_value());  // only one left: nothing taken
  EXPECT_EQ(pool.num_free(), 1);
  auto last = pool.Allocate(1);
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(*last, (std::vector<int32_t>{4}));
  EXPECT_EQ(pool.num_free(), 0);
  EXPECT_TRUE(pool.Allocate(0).has_value());

  pool.Free(*three);
  EXPECT_EQ(pool.num_free(), 3);
  EXPECT_TRUE(pool.IsFree(2));
  EXPECT_FALSE(pool.IsFree(4));
  EXPECT_FALSE(pool.IsFree(0));
  auto again = pool.Allocate(3);
  ASSERT_TRUE(again.has_value());
  std::vector<int32_t> sorted = *again;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<int32_t>{1, 2, 3}));
}

TEST(KvPagePoolTest, PagesForIsCeilDiv) {
  KvPagePool pool(3, 16);
  EXPECT_EQ(pool.PagesFor(0), 0);
  EXPECT_EQ(pool.PagesFor(1), 1);
  EXPECT_EQ(pool.PagesFor(16), 1);
  EXPECT_EQ(pool.PagesFor(17), 2);
  EXPECT_EQ(pool.PagesFor(32), 2);
}

TEST(KvPagePoolDeathTest, BadFreesCheckFail) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  KvPagePool pool(4, 2);
  auto pages = pool.Allocate(2);
  ASSERT_TRUE(pages.has_value());
  pool.Free(*pages);
  std::vector<int32_t> again = *pages;
  EXPECT_DEATH(pool.Free(again), "double free of page");
  std::vector<int32_t> zero = {0};
  EXPECT_DEATH(pool.Free(zero), "page 0 is reserved");
  std::vector<int32_t> out = {4};
  EXPECT_DEATH(pool.Free(out), "out of range");
  EXPECT_DEATH(KvPagePool(1, 2), "at least 2 pages");
}

}  // namespace
}  // namespace slime::engine
