// KvManager: a replica's KV slots as requests see them. It owns the pool
// (runtime/kv_pool.h) and the radix cache (runtime/radix_cache.h) and offers
// the request-level calls a scheduler makes: admit with a prefix match,
// allocate for the next positions, commit computed pages to the cache, roll
// back the last positions (rejected draft tokens), release.
//
// Contract: every call takes the request's RequestKv (runtime/request.h) and
// keeps its invariants: slots are whole, page-aligned pages covering the
// computed positions; the leading `cached` positions are the cache's, locked
// through `node`; the rest are held by the request alone. The accounting
// invariant of the cache (free + evictable + locked + held == capacity) holds
// after every call, and check_invariants() recounts it together with the
// requests' own slots. A call that cannot get memory changes nothing and
// says so. Not thread-safe: one scheduler thread owns it. It never touches
// the KV memory itself (the model's KvBuffers), only which slots are whose.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "runtime/kv_pool.h"
#include "runtime/radix_cache.h"
#include "runtime/request.h"

namespace basalt {

class KvManager {
 public:
  // capacity: a positive multiple of page_size.
  KvManager(int64_t capacity, int32_t page_size, RadixCacheOptions cache_options = {});

  int64_t capacity() const { return pool_.capacity(); }
  int32_t page_size() const { return pool_.page_size(); }
  bool cache_enabled() const { return cache_.enabled(); }
  // n rounded up (down) to whole pages.
  int64_t rounded(int64_t n) const { return pool_.rounded(n); }
  int64_t page_floor(int64_t n) const { return cache_.page_floor(n); }
  // Slots a request could still get: free, or evictable from the cache.
  int64_t available() const { return pool_.free_slots() + cache_.evictable_tokens(); }
  int64_t free_slots() const { return pool_.free_slots(); }
  // Slots held by requests (locked in the cache, or their own).
  int64_t used() const { return cache_.locked_tokens() + cache_.held_tokens(); }
  int64_t cached() const { return cache_.cached_tokens(); }

  // How many leading tokens of `tokens` the cache holds (whole pages); counts
  // as a cache access.
  int64_t cached_prefix(uint64_t ns, std::span<const int32_t> tokens);

  // Admission: takes the cached prefix of `prefix` as the request's first
  // computed positions (locked, shared), and returns its length. The request
  // must hold nothing.
  int64_t take_cached_prefix(RequestKv& kv, uint64_t ns, std::span<const int32_t> prefix);
  // Slots for positions [computed, computed + n): the tail of the last page
  // first, then whole new pages, evicting unlocked cache entries when the
  // pool is short. False (nothing taken) when they cannot be had.
  bool allocate(RequestKv& kv, int64_t n);
  // Marks n more positions computed (a launched step writes them); their
  // slots must be allocated.
  void advance(RequestKv& kv, int64_t n);
  // Caches the whole pages of the computed positions whose tokens are known
  // (tokens: the request's known tokens) and moves the lock to their node;
  // the partial last page stays the request's. No-op with the cache off.
  void commit(RequestKv& kv, uint64_t ns, std::span<const int32_t> tokens);
  // Forgets the last n computed positions (rejected draft tokens): whole
  // pages past the new end go back to the pool. Positions in the cache cannot
  // be rolled back (n <= computed - cached).
  void rollback(RequestKv& kv, int64_t n);
  // Gives the request's KV up: with cache_it, the whole pages of its first
  // `settled` positions go into the cache (tokens: at least that many) and the
  // rest back to the pool; otherwise everything it holds goes back. The lock
  // is dropped and kv is empty afterwards.
  void release(RequestKv& kv, uint64_t ns, std::span<const int32_t> tokens, int64_t settled, bool cache_it);
  // Evicts everything evictable from the cache; returns the pool's free slots.
  int64_t clear_cache();

  // Throws basalt::Error unless kv's slots are whole page-aligned pages that
  // cover its computed positions and its cached positions are whole pages.
  void check_request(const RequestKv& kv) const;
  // Recounts the pool and the cache; `held_by_requests` is what the caller's
  // requests hold outside the cache, which must equal the cache's count.
  void check_invariants(int64_t held_by_requests) const;

  // KV events (runtime/kv_events.h): blocks of block_size tokens (rounded up
  // to whole pages; 0 turns them off).
  void set_event_block_size(int32_t block_size) {
    cache_.set_event_block_size(block_size <= 0 ? 0 : static_cast<int32_t>(pool_.rounded(block_size)));
  }
  int32_t event_block_size() const { return cache_.event_block_size(); }
  std::vector<KvEvent> take_events() { return cache_.take_events(); }
  std::vector<KvEvent> snapshot() const { return cache_.snapshot(); }

  RadixCache& cache() { return cache_; }
  const RadixCache& cache() const { return cache_; }

 private:
  KvPool pool_;
  RadixCache cache_;
};

}  // namespace basalt
