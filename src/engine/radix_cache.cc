#include "slime/engine/radix_cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <queue>
#include <string>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "slime/common/check.h"

namespace slime::engine {
namespace {


// The key of a child in its parent: its first page of tokens.
using PageKey = std::vector<int32_t>;

PageKey KeyAt(std::span<const int32_t> tokens, int64_t page, int64_t page_size) {
  auto first = tokens.begin() + page * page_size;
  return PageKey(first, first + page_size);
}

}  // namespace

struct RadixCache::Node {
  std::vector<int32_t> key;    // [pages.size() * page_size] token ids
  std::vector<int32_t> pages;  // K/V pages of `key`, owned by the tree
  absl::flat_hash_map<PageKey, std::unique_ptr<Node>> children;  // by first page of tokens
  Node* parent = nullptr;
  int64_t lock_ref = 0;      // held locks at or below this node
  uint64_t last_access = 0;  // RadixCache::clock_ at the last match / insert through here
  uint64_t id = 0;           // creation order; breaks LRU ties deterministically
};

RadixCache::RadixCache(KvPagePool* pool, bool enabled)
    : pool_(pool), enabled_(enabled), page_size_(pool->page_size()),
      root_(std::make_unique<Node>()) {}

RadixCache::~RadixCache() {
  std::vector<int32_t> pages = AllPages();
  pool_->Free(pages);
}

RadixCache::Match RadixCache::MatchPrefix(std::span<const int32_t> tokens, int64_t max_tokens) {
  Match match;
  match.node = root_.get();
  if (!enabled_) return match;
  const int64_t limit_pages =
      std::min<int64_t>(static_cast<int64_t>(tokens.size()), std::max<int64_t>(max_tokens, 0)) /
      page_size_;
  const uint64_t stamp = ++clock_;
  Node* node = root_.get();
  node->last_access = stamp;
  int64_t off = 0;  // pages matched so far
  while (off < limit_pages) {
    auto it = node->children.find(KeyAt(tokens, off, page_size_));
    if (it == node->children.end()) break;
    Node* child = it->second.get();
    const int64_t child_pages = static_cast<int64_t>(child->pages.size());
    int64_t m = 1;  // the first page matched through the key
    while (m < child_pages && off + m < limit_pages &&
           std::equal(child->key.begin() + m * page_size_,
                      child->key.begin() + (m + 1) * page_size_,
                      tokens.begin() + (off + m) * page_size_)) {
      ++m;
    }
    if (m < child_pages) child = Split(child, m);
    match.pages.insert(match.pages.end(), child->pages.begin(), child->pages.end());
    child->last_access = stamp;
    node = child;
    off += m;
  }
  match.num_tokens = off * page_size_;
  match.node = node;
  return match;
}

void RadixCache::Lock(NodeHandle node) {
  SLIME_CHECK(node != nullptr, "RadixCache::Lock of a null handle");
  for (Node* n = node; n != root_.get(); n = n->parent) {
    if (n->lock_ref == 0) evictable_pages_ -= static_cast<int64_t>(n->pages.size());
    ++n->lock_ref;
  }
}

void RadixCache::Unlock(NodeHandle node) {
  SLIME_CHECK(node != nullptr, "RadixCache::Unlock of a null handle");
  for (Node* n = node; n != root_.get(); n = n->parent) {
    SLIME_CHECK(n->lock_ref > 0, "RadixCache::Unlock of node {} that is not locked", n->id);
    --n->lock_ref;
    if (n->lock_ref == 0) evictable_pages_ += static_cast<int64_t>(n->pages.size());
  }
}

RadixCache::NodeHandle RadixCache::Insert(std::span<const int32_t> tokens,
                                          std::span<const int32_t> pages) {
  SLIME_CHECK(static_cast<int64_t>(tokens.size()) ==
                  static_cast<int64_t>(pages.size()) * page_size_,
              "RadixCache::Insert: {} tokens but {} pages of {} tokens", tokens.size(),
              pages.size(), page_size_);
  if (!enabled_) {
    pool_->Free(pages);
    return root_.get();
  }
  const int64_t n = static_cast<int64_t>(pages.size());
  const uint64_t stamp = ++clock_;
  Node* node = root_.get();
  node->last_access = stamp;
  std::vector<int32_t> duplicates;
  int64_t off = 0;
  while (off < n) {
    PageKey key = KeyAt(tokens, off, page_size_);
    auto it = node->children.find(key);
    if (it == node->children.end()) {
      auto leaf = std::make_unique<Node>();
      leaf->key.assign(tokens.begin() + off * page_size_, tokens.end());
      leaf->pages.assign(pages.begin() + off, pages.end());
      leaf->parent = node;
      leaf->last_access = stamp;
      leaf->id = next_node_id_++;
      cached_pages_ += n - off;
      evictable_pages_ += n - off;
      ++num_nodes_;
      Node* parent = node;
      node = leaf.get();
      parent->children.emplace(std::move(key), std::move(leaf));
      off = n;
      break;
    }
    Node* child = it->second.get();
    const int64_t child_pages = static_cast<int64_t>(child->pages.size());
    int64_t m = 1;
    while (m < child_pages && off + m < n &&
           std::equal(child->key.begin() + m * page_size_,
                      child->key.begin() + (m + 1) * page_size_,
                      tokens.begin() + (off + m) * page_size_)) {
      ++m;
    }
    for (int64_t i = 0; i < m; ++i) {
      if (pages[off + i] != child->pages[i]) duplicates.push_back(pages[off + i]);
    }
    if (m < child_pages) child = Split(child, m);
    child->last_access = stamp;
    node = child;
    off += m;
  }
  pool_->Free(duplicates);
  return node;
}

RadixCache::Node* RadixCache::Split(Node* node, int64_t num_pages) {
  Node* parent = node->parent;
  auto it = parent->children.find(KeyAt(node->key, 0, page_size_));
  SLIME_CHECK(it != parent->children.end() && it->second.get() == node,
              "radix node {} missing from its parent", node->id);
  std::unique_ptr<Node> lower = std::move(it->second);

  auto upper = std::make_unique<Node>();
  upper->key.assign(node->key.begin(), node->key.begin() + num_pages * page_size_);
  upper->pages.assign(node->pages.begin(), node->pages.begin() + num_pages);
  upper->parent = parent;
  upper->lock_ref = node->lock_ref;
  upper->last_access = node->last_access;
  upper->id = next_node_id_++;
  node->key.erase(node->key.begin(), node->key.begin() + num_pages * page_size_);
  node->pages.erase(node->pages.begin(), node->pages.begin() + num_pages);
  node->parent = upper.get();
  upper->children.emplace(KeyAt(node->key, 0, page_size_), std::move(lower));
  Node* result = upper.get();
  it->second = std::move(upper);
  ++num_nodes_;
  return result;
}

int64_t RadixCache::Evict(int64_t num_pages) {
  if (num_pages <= 0 || evictable_pages_ == 0) return 0;
  using Entry = std::tuple<uint64_t, uint64_t, Node*>;  // (last_access, id, leaf)
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> leaves;
  std::vector<Node*> stack = {root_.get()};
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    if (n != root_.get() && n->children.empty() && n->lock_ref == 0) {
      leaves.emplace(n->last_access, n->id, n);
    }
    for (auto& [key, child] : n->children) stack.push_back(child.get());
  }
  int64_t freed = 0;
  while (freed < num_pages && !leaves.empty()) {
    Node* leaf = std::get<2>(leaves.top());
    leaves.pop();
    const int64_t k = static_cast<int64_t>(leaf->pages.size());
    pool_->Free(leaf->pages);
    freed += k;
    cached_pages_ -= k;
    evictable_pages_ -= k;
    --num_nodes_;
    Node* parent = leaf->parent;
    parent->children.erase(KeyAt(leaf->key, 0, page_size_));  // destroys leaf
    if (parent != root_.get() && parent->children.empty() && parent->lock_ref == 0) {
      leaves.emplace(parent->last_access, parent->id, parent);
    }
  }
  evicted_pages_total_ += freed;
  return freed;
}

void RadixCache::Reset() {
  SLIME_CHECK(locked_pages() == 0,
              "RadixCache::Reset with {} locked pages (running requests hold prefixes)",
              locked_pages());
  std::vector<int32_t> pages = AllPages();
  pool_->Free(pages);
  root_->children.clear();
  num_nodes_ = 0;
  cached_pages_ = 0;
  evictable_pages_ = 0;
}

std::vector<int32_t> RadixCache::PathPages(NodeHandle node) const {
  SLIME_CHECK(node != nullptr, "RadixCache::PathPages of a null handle");
  std::vector<const Node*> path;
  for (const Node* n = node; n != root_.get(); n = n->parent) path.push_back(n);
  std::vector<int32_t> pages;
  for (auto it = path.rbegin(); it != path.rend(); ++it) {
    pages.insert(pages.end(), (*it)->pages.begin(), (*it)->pages.end());
  }
  return pages;
}

std::vector<int32_t> RadixCache::AllPages() const {
  std::vector<int32_t> pages;
  pages.reserve(cached_pages_);
  std::vector<const Node*> stack = {root_.get()};
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    pages.insert(pages.end(), n->pages.begin(), n->pages.end());
    for (const auto& [key, child] : n->children) stack.push_back(child.get());
  }
  return pages;
}

void RadixCache::RecordLookup(int64_t queried, int64_t matched) {
  queried_tokens_ += queried;
  matched_tokens_ += matched;
}

void RadixCache::CheckInvariants(std::span<const NodeHandle> held_locks) const {
  absl::flat_hash_map<const Node*, int64_t> expected;
  for (NodeHandle h : held_locks) {
    SLIME_CHECK(h != nullptr, "a held lock is a null handle");
    for (const Node* n = h; n != root_.get(); n = n->parent) {
      SLIME_CHECK(n != nullptr, "a held lock is not in this tree");
      ++expected[n];
    }
  }
  SLIME_CHECK(root_->pages.empty() && root_->key.empty() && root_->lock_ref == 0,
              "the root holds pages or locks");
  absl::flat_hash_set<int32_t> seen;
  int64_t pages = 0, evictable = 0, nodes = 0;
  std::vector<const Node*> stack = {root_.get()};
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    if (n != root_.get()) {
      ++nodes;
      SLIME_CHECK(!n->pages.empty(), "radix node {} holds no pages", n->id);
      SLIME_CHECK(static_cast<int64_t>(n->key.size()) ==
                      static_cast<int64_t>(n->pages.size()) * page_size_,
                  "radix node {}: {} tokens for {} pages", n->id, n->key.size(),
                  n->pages.size());
      auto it = expected.find(n);
      const int64_t want = it == expected.end() ? 0 : it->second;
      SLIME_CHECK(n->lock_ref == want, "radix node {}: lock_ref {} but {} locks held below it",
                  n->id, n->lock_ref, want);
      pages += static_cast<int64_t>(n->pages.size());
      if (n->lock_ref == 0) evictable += static_cast<int64_t>(n->pages.size());
      for (int32_t p : n->pages) {
        SLIME_CHECK(p > 0 && p < pool_->num_pages(), "radix node {} holds page {} out of range",
                    n->id, p);
        SLIME_CHECK(!pool_->IsFree(p), "radix node {} holds page {} which is free", n->id, p);
        SLIME_CHECK(seen.insert(p).second, "page {} appears twice in the radix tree", p);
      }
    }
    for (const auto& [key, child] : n->children) {
      SLIME_CHECK(child->parent == n, "radix node {} has a wrong parent", child->id);
      SLIME_CHECK(static_cast<int64_t>(key.size()) == page_size_ &&
                      std::equal(key.begin(), key.end(), child->key.begin()),
                  "radix node {} is filed under a key that is not its first page", child->id);
      stack.push_back(child.get());
    }
  }
  SLIME_CHECK(pages == cached_pages_, "cached_pages {} but the tree holds {}", cached_pages_,
              pages);
  SLIME_CHECK(evictable == evictable_pages_, "evictable_pages {} but {} pages are unlocked",
              evictable_pages_, evictable);
  SLIME_CHECK(nodes == num_nodes_, "num_nodes {} but the tree has {}", num_nodes_, nodes);
}

}  // namespace slime::engine
