// RadixCache: prefix reuse of KV slots, keyed by token ids within a namespace.
//
// Invariant (check_invariants() recounts it from scratch):
//
//   pool.free_slots() + evictable_tokens() + locked_tokens() + held_tokens()
//       == pool.capacity()
//
//   evictable: slots in tree nodes whose lock count is 0;
//   locked:    slots in tree nodes whose lock count is > 0 (a running request
//              reads them);
//   held:      slots a request allocated through allocate() and that are not
//              in the tree (its own, unshared KV).
//   Every slot appears at most once in the tree; a slot in the tree is
//   allocated in the pool; lock counts are >= 0 and a parent's lock count is
//   >= each child's (locking a node locks its whole path to the root).
//
// Ownership rules:
//   - The scheduler takes slots with allocate() (which evicts unlocked leaves
//     when the pool runs short) and gives back the ones it still holds with
//     release(). It never frees tree slots to the pool itself.
//   - insert(ns, tokens, slots) moves the slots of positions that are new to
//     the tree from "held" into the tree. Where the tree already has a
//     different slot for a position, the caller's slot is a duplicate: it is
//     reported in InsertResult::duplicates, stays held, and the caller
//     releases it (after switching to the tree's slot, found by matching
//     again). A passed slot equal to the tree's slot (the caller's matched
//     prefix) is simply shared.
//   - match_prefix() returns the tree's slots for the longest cached prefix
//     and the node it ends in, splitting an edge matched part way so that
//     exactly the matched part can be locked. The node stays valid while it is
//     locked; an unlocked node may disappear at the next allocate() or
//     evict() (an empty namespace's root goes with its last evicted leaf).
//   - A running request locks the node its cached prefix ends in and unlocks
//     it when it finishes, is cancelled or is preempted; locked nodes are
//     never evicted.
//   - Two namespaces (tenant, LoRA adapter, cache salt) never share a node:
//     each has its own root.
//   - Disabled (Options::enabled = false): match_prefix finds nothing and
//     insert takes nothing (every passed slot of its whole pages comes back as
//     a duplicate), so a finished request frees all its slots; a running
//     request skips its chunk inserts (check enabled()). allocate/release
//     still account held slots.
//
// Pages (the pool's page_size P > 1; SGLang's paged radix cache):
//   - The tree caches whole pages only. Every edge holds a multiple of P
//     tokens, and its slots are whole pages in order: the slot of the token at
//     depth d (counting from the namespace's root) is at offset d % P of its
//     page, and the P tokens of depths [k*P, (k+1)*P) share one page
//     (KvPool::is_page_aligned). Children are keyed by their first page of
//     tokens, so two siblings may start with the same tokens and differ
//     within their first page; an edge is split only at a page boundary.
//   - match_prefix considers only the query's first floor(n/P)*P tokens and
//     matches page by page: a match is always a whole number of pages (a page
//     that differs in any token does not match at all).
//   - insert likewise takes only the first floor(n/P)*P tokens and slots; the
//     slots of the trailing partial page are left alone (neither cached nor
//     reported as duplicates) and stay the caller's: a running request keeps
//     writing into that page, a finished one releases it. The new slots it
//     caches must be whole pages at the offsets of their positions (a request
//     whose slots for positions [k*P, (k+1)*P) are one page, as the engine
//     allocates them); otherwise insert throws and changes nothing. Slots that
//     the tree already has in another page come back as duplicates page by
//     page.
//   - Eviction frees whole leaves, hence whole pages; nothing in the tree
//     ever shares a page with held slots, so a pool used only through the
//     cache never has a partly free page when every request keeps whole pages.
//   With P == 1 all of this is the token-granular tree above.
//
// KV events (runtime/kv_events.h), when enabled: every insert that completes
// blocks reports them stored, every evicted leaf reports the blocks it
// completed removed, and snapshot() lists everything cached as stored events;
// take_events() hands over what accumulated. Off, nothing is computed.
//
// Costs: match_prefix and insert are O(tokens) with child lookup by first
// token in a hash map; evict pops unlocked leaves from an ordered set (LRU by
// last access, or LFU by hit count then last access) in O(log leaves) each.
// Not thread-safe: the scheduler thread owns the cache and its pool.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "runtime/kv_events.h"
#include "runtime/kv_pool.h"

namespace basalt {

class RadixCache;

// One edge of the tree with the node below it: the tokens on the edge and the
// KV slot of each. Callers hold pointers only to pass back to lock/unlock.
class RadixNode {
 public:
  const std::vector<int32_t>& tokens() const { return tokens_; }
  const std::vector<int32_t>& slots() const { return slots_; }
  int32_t lock_count() const { return lock_; }
  uint64_t hit_count() const { return hits_; }
  const RadixNode* parent() const { return parent_; }
  bool is_root() const { return parent_ == nullptr; }

 private:
  friend class RadixCache;
  using EvictKey = std::tuple<uint64_t, uint64_t, uint64_t>;

  std::vector<int32_t> tokens_;
  std::vector<int32_t> slots_;
  RadixNode* parent_ = nullptr;
  // By child key: the first token (page size 1) or a hash of the first page,
  // whose tokens are then compared (RadixCache::find_child).
  std::unordered_multimap<uint64_t, std::unique_ptr<RadixNode>> children_;
  int32_t lock_ = 0;
  uint64_t hits_ = 0;
  uint64_t last_access_ = 0;
  uint64_t id_ = 0;
  uint64_t ns_ = 0;
  bool in_evict_set_ = false;
  EvictKey evict_key_{};
};

enum class EvictionPolicy : uint8_t { kLru, kLfu };

struct RadixCacheOptions {
  bool enabled = true;
  EvictionPolicy policy = EvictionPolicy::kLru;
};

struct PrefixMatch {
  std::vector<int32_t> slots;  // one per matched token (whole pages)
  // The node the match ends in: the namespace's root when nothing matched,
  // nullptr when the cache is disabled (lock/unlock accept nullptr).
  RadixNode* last_node = nullptr;
};

struct InsertResult {
  int64_t cached_before = 0;        // leading tokens the tree already had
  int64_t cached_len = 0;           // leading tokens it has now (whole pages)
  std::vector<int32_t> duplicates;  // passed slots the tree did not take
};

struct RadixCacheStats {
  uint64_t match_calls = 0;
  uint64_t queried_tokens = 0;
  uint64_t matched_tokens = 0;  // hit rate = matched_tokens / queried_tokens
  uint64_t inserted_tokens = 0;
  uint64_t evicted_tokens = 0;
};

class RadixCache {
 public:
  explicit RadixCache(KvPool& pool, RadixCacheOptions options = {});
  ~RadixCache();
  RadixCache(const RadixCache&) = delete;
  RadixCache& operator=(const RadixCache&) = delete;

  // Longest cached prefix of tokens in namespace ns, in whole pages; counts as
  // an access (LRU time, LFU hits) of every node on the path.
  PrefixMatch match_prefix(uint64_t ns, std::span<const int32_t> tokens);
  // Caches tokens -> slots (same lengths) in namespace ns: a finished request,
  // or the prefilled part of a running one; with pages, only the whole pages.
  // See the ownership rules above.
  InsertResult insert(uint64_t ns, std::span<const int32_t> tokens,
                      std::span<const int32_t> slots);

  // Lock counts along the path from node to its root.
  void lock(RadixNode* node);
  void unlock(RadixNode* node);

  // Evicts unlocked leaves in policy order until at least n_tokens slots went
  // back to the pool or nothing is evictable; returns the slots freed.
  int64_t evict(int64_t n_tokens);

  // Slots for n tokens (rounded up to pages), evicting when the pool is short;
  // nothing when even a full eviction would not make room. The slots are held.
  std::optional<std::vector<int32_t>> allocate(int64_t n);
  // The same, appended to `out`; false and nothing appended when they cannot be had.
  bool allocate_into(int64_t n, std::vector<int32_t>& out);
  // Gives held slots back to the pool. Throws basalt::Error (changing nothing)
  // for a slot in the tree, not allocated, or more slots than are held.
  void release(std::span<const int32_t> slots);

  bool enabled() const { return options_.enabled; }
  int32_t page_size() const { return page_; }
  // n rounded down to whole pages: what match_prefix and insert consider.
  int64_t page_floor(int64_t n) const { return n - n % page_; }
  int64_t evictable_tokens() const { return evictable_; }
  int64_t locked_tokens() const { return locked_; }
  int64_t held_tokens() const { return held_; }
  int64_t cached_tokens() const { return evictable_ + locked_; }
  const RadixCacheStats& stats() const { return stats_; }
  KvPool& pool() { return pool_; }

  // Recounts everything from the tree and the pool; throws basalt::Error on
  // any violation of the invariant above.
  void check_invariants() const;

  // KV events in blocks of block_size tokens (a positive multiple of the
  // page size); 0 turns them off.
  void set_event_block_size(int32_t block_size);
  int32_t event_block_size() const { return event_block_; }
  std::vector<KvEvent> take_events();
  std::vector<KvEvent> snapshot() const;

 private:
  RadixNode* root(uint64_t ns);
  uint64_t child_key(std::span<const int32_t> tokens) const;
  // The child of node whose first page is query's first page (query holds at
  // least one page), or null.
  RadixNode* find_child(RadixNode* node, std::span<const int32_t> query) const;
  // Where child's parent owns it.
  std::unordered_multimap<uint64_t, std::unique_ptr<RadixNode>>::iterator link_of(RadixNode* child);
  // Common prefix of an edge and a query, in whole pages.
  size_t matched_len(const std::vector<int32_t>& edge, std::span<const int32_t> query) const;
  RadixNode* split(RadixNode* node, size_t at);
  void touch(RadixNode* node);
  void update_evictable(RadixNode* node);
  RadixNode::EvictKey key_of(const RadixNode* node) const;
  void remove_leaf(RadixNode* node);
  // The stored event of the blocks that end in [from, to) along `path`
  // (tokens from the namespace's root), or nothing.
  void blocks_event(KvEvent::Kind kind, uint64_t ns, std::span<const int32_t> path, size_t from, size_t to,
                    std::vector<KvEvent>& out) const;
  // Tokens from the root to the end of node's edge.
  std::vector<int32_t> path_of(const RadixNode* node) const;

  KvPool& pool_;
  RadixCacheOptions options_;
  int32_t page_;
  std::unordered_map<uint64_t, std::unique_ptr<RadixNode>> roots_;
  std::set<std::pair<RadixNode::EvictKey, RadixNode*>> evictable_leaves_;
  std::vector<uint8_t> in_tree_;  // per pool slot
  int64_t evictable_ = 0;
  int64_t locked_ = 0;
  int64_t held_ = 0;
  uint64_t clock_ = 0;
  uint64_t next_id_ = 0;
  RadixCacheStats stats_;
  int32_t event_block_ = 0;  // 0: events off
  std::vector<KvEvent> events_;
};

}  // namespace basalt
