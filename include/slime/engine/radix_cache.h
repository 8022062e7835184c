// RadixCache: the prefix cache of the engine, a radix tree over token ids whose edges hold whole
// K/V pages (SGLang's RadixCache with page_size > 1). Pure bookkeeping, no LibTorch.
//
// Every node but the root holds a key of k * page_size tokens and the k pages whose slots hold
// the K/V of those tokens, given the tokens on the path above it. Node splits happen only at
// page boundaries, so two children of one node never share their first page of tokens (that
// page of tokens is the child's key in the parent). The K/V of a page depends on everything
// before it, which is why only whole pages along a path from the root are shared.
//
// Handles. NodeHandle is an opaque pointer to a node; the root is a valid handle meaning "no
// prefix". A node stands for the path root → node; splitting a node keeps that meaning (the
// handle keeps pointing at the lower half). A handle stays valid while it is locked; an unlocked
// handle only until the next Evict() or Reset().
//
// Locks. Lock(node) adds one reference to every node on the path root → node; locked nodes are
// never evicted. Each Lock is undone by exactly one Unlock of the same handle.
//
// Ownership. The tree owns the pages in its nodes; they go back to the pool on Evict()/Reset().
// Insert() takes ownership of the caller's pages at positions the tree did not cover and frees
// the caller's duplicates (see Insert).
//
// Disabled mode (enabled = false): MatchPrefix never matches, Insert frees the pages it is given
// and returns the root; the tree stays empty.
//
// Thread-safety: none; the engine thread owns the cache (with the pool and the scheduler).
//
// Invariants (CheckInvariants): key.size() == pages.size() * page_size for every node;
// lock_ref(node) == number of held locks at or below the node; evictable_pages() == pages in
// nodes with lock_ref 0; no page of the tree is free in the pool or held twice.
#ifndef SLIME_ENGINE_RADIX_CACHE_H_
#define SLIME_ENGINE_RADIX_CACHE_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "slime/engine/page_pool.h"

namespace slime::engine {

class RadixCache {
 private:
  struct Node;

 public:
  using NodeHandle = Node*;

  struct Match {
    std::vector<int32_t> pages;  // tree pages of the matched prefix, one per page_size tokens
    int64_t num_tokens = 0;      // pages.size() * page_size
    NodeHandle node = nullptr;   // the node ending exactly at num_tokens (the root for none)
  };

  // `pool` must outlive the cache.
  RadixCache(KvPagePool* pool, bool enabled);
  ~RadixCache();  // returns every cached page to the pool

  RadixCache(const RadixCache&) = delete;
  RadixCache& operator=(const RadixCache&) = delete;

  bool enabled() const { return enabled_; }
  int64_t page_size() const { return page_size_; }
  KvPagePool* pool() const { return pool_; }
  NodeHandle root() const { return root_.get(); }

  // The longest cached prefix of `tokens` of at most max_tokens tokens, whole pages only
  // (num_tokens = floor(min(tokens.size(), max_tokens) / page_size) pages at most). Splits the
  // last node when the match ends inside it, and stamps every node on the path as recently
  // used. Does not lock and does not count statistics (see RecordLookup).
  Match MatchPrefix(std::span<const int32_t> tokens, int64_t max_tokens);

  // Pins / releases the path root → node. Lock/Unlock of the root do nothing.
  // CHECK-fails on a null handle and on an Unlock without a matching Lock.
  void Lock(NodeHandle node);
  void Unlock(NodeHandle node);

  // Adds the path `tokens` (tokens.size() == pages.size() * page_size, CHECKed) with the K/V
  // pages `pages` to the tree and returns the node ending exactly at tokens.size() (splitting
  // one if needed; the root for empty input). At positions the tree already covers the tree
  // keeps its page, and the caller's page is freed to the pool unless it is that very page (the
  // caller got it from MatchPrefix). The tree takes ownership of the remaining pages. The
  // caller may afterwards use MatchPrefix to learn the tree's pages for the whole path.
  // Disabled: frees all `pages` and returns the root.
  NodeHandle Insert(std::span<const int32_t> tokens, std::span<const int32_t> pages);

  // Frees the pages of least-recently-used unlocked leaves, whole nodes at a time (a parent
  // whose last child went becomes a leaf in turn), until at least num_pages pages were freed or
  // nothing is evictable. Returns the number of pages freed.
  int64_t Evict(int64_t num_pages);

  // Frees every cached page and empties the tree (/flush_cache). CHECK-fails while any node is
  // locked. Statistics are kept.
  void Reset();

  int64_t cached_pages() const { return cached_pages_; }
  int64_t evictable_pages() const { return evictable_pages_; }
  int64_t locked_pages() const { return cached_pages_ - evictable_pages_; }
  int64_t num_nodes() const { return num_nodes_; }  // not counting the root

  // Pages on the path root → node, in order (what MatchPrefix returned for that node).
  std::vector<int32_t> PathPages(NodeHandle node) const;
  // Every page the tree holds (any order).
  std::vector<int32_t> AllPages() const;

  // Hit statistics. The owner records one lookup per request admission it acted on:
  // `queried` prompt tokens of which `matched` came from the cache.
  void RecordLookup(int64_t queried, int64_t matched);
  int64_t queried_tokens() const { return queried_tokens_; }
  int64_t matched_tokens() const { return matched_tokens_; }
  int64_t evicted_pages_total() const { return evicted_pages_total_; }

  // CHECK-fails on a broken invariant (see the top of this file). `held_locks` is every lock
  // currently held (one entry per Lock not yet undone; root entries are ignored).
  void CheckInvariants(std::span<const NodeHandle> held_locks) const;

 private:
  Node* Split(Node* node, int64_t num_pages);  // keeps the first num_pages in a new parent

  KvPagePool* pool_;
  bool enabled_;
  int64_t page_size_;
  std::unique_ptr<Node> root_;
  uint64_t clock_ = 0;  // logical time for last_access
  uint64_t next_node_id_ = 1;
  int64_t num_nodes_ = 0;
  int64_t cached_pages_ = 0;
  int64_t evictable_pages_ = 0;
  int64_t queried_tokens_ = 0;
  int64_t matched_tokens_ = 0;
  int64_t evicted_pages_total_ = 0;
};

}  // namespace slime::engine

#endif  // SLIME_ENGINE_RADIX_CACHE_H_
