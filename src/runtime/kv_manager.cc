#include "runtime/kv_manager.h"

#include <algorithm>

#include "core/error.h"

namespace basalt {

KvManager::KvManager(int64_t capacity, int32_t page_size, RadixCacheOptions cache_options)
    : pool_(capacity, page_size), cache_(pool_, cache_options) {}

int64_t KvManager::cached_prefix(uint64_t ns, std::span<const int32_t> tokens) {
  return static_cast<int64_t>(cache_.match_prefix(ns, tokens).slots.size());
}

int64_t KvManager::take_cached_prefix(RequestKv& kv, uint64_t ns, std::span<const int32_t> prefix) {
  BASALT_ASSERT(kv.slots.empty() && kv.node == nullptr);
  PrefixMatch match = cache_.match_prefix(ns, prefix);
  cache_.lock(match.last_node);
  const auto matched = static_cast<int64_t>(match.slots.size());
  kv.node = match.last_node;
  kv.slots = std::move(match.slots);
  kv.computed = matched;
  kv.cached = matched;
  return matched;
}

bool KvManager::allocate(RequestKv& kv, int64_t n) {
  const int64_t need = kv.computed + n - static_cast<int64_t>(kv.slots.size());
  if (need <= 0) return true;
  return cache_.allocate_into(need, kv.slots);
}

void KvManager::advance(RequestKv& kv, int64_t n) {
  BASALT_ASSERT(n >= 0 && kv.computed + n <= static_cast<int64_t>(kv.slots.size()));
  kv.computed += n;
}

void KvManager::commit(RequestKv& kv, uint64_t ns, std::span<const int32_t> tokens) {
  const int64_t whole = cache_.page_floor(std::min(kv.computed, static_cast<int64_t>(tokens.size())));
  if (!cache_.enabled() || whole <= kv.cached) return;
  const std::span<const int32_t> cached_tokens = tokens.first(static_cast<size_t>(whole));
  InsertResult ins =
      cache_.insert(ns, cached_tokens, std::span<const int32_t>(kv.slots.data(), static_cast<size_t>(whole)));
  PrefixMatch match = cache_.match_prefix(ns, cached_tokens);
  BASALT_CHECK(static_cast<int64_t>(match.slots.size()) == whole, "radix cache: {} of {} inserted tokens matched",
               match.slots.size(), whole);
  cache_.lock(match.last_node);
  cache_.unlock(kv.node);
  kv.node = match.last_node;
  // Where the tree already had another slot for a position, the request now
  // reads the tree's and gives its own duplicate back.
  std::copy(match.slots.begin(), match.slots.end(), kv.slots.begin());
  kv.cached = whole;
  if (!ins.duplicates.empty()) cache_.release(ins.duplicates);
}

void KvManager::rollback(RequestKv& kv, int64_t n) {
  BASALT_ASSERT(n >= 0 && n <= kv.computed - kv.cached);
  kv.computed -= n;
  const int64_t keep = std::max(pool_.rounded(kv.computed), kv.cached);
  if (keep < static_cast<int64_t>(kv.slots.size())) {
    cache_.release(std::span<const int32_t>(kv.slots.data() + keep, kv.slots.size() - static_cast<size_t>(keep)));
    kv.slots.resize(static_cast<size_t>(keep));
  }
}

void KvManager::release(RequestKv& kv, uint64_t ns, std::span<const int32_t> tokens, int64_t settled,
                        bool cache_it) {
  std::vector<int32_t> give_back;
  const int64_t whole = cache_.page_floor(std::min(settled, kv.computed));
  if (cache_it && whole > 0) {
    BASALT_ASSERT(static_cast<int64_t>(tokens.size()) >= whole);
    InsertResult ins = cache_.insert(ns, tokens.first(static_cast<size_t>(whole)),
                                     std::span<const int32_t>(kv.slots.data(), static_cast<size_t>(whole)));
    give_back = std::move(ins.duplicates);
    give_back.insert(give_back.end(), kv.slots.begin() + whole, kv.slots.end());
  } else {
    give_back.assign(kv.slots.begin() + kv.cached, kv.slots.end());
  }
  if (!give_back.empty()) cache_.release(give_back);
  cache_.unlock(kv.node);
  kv = RequestKv{};
}

int64_t KvManager::clear_cache() {
  cache_.evict(pool_.capacity());
  return pool_.free_slots();
}

void KvManager::check_request(const RequestKv& kv) const {
  BASALT_CHECK(static_cast<int64_t>(kv.slots.size()) == pool_.rounded(kv.computed),
               "request KV: {} slots for {} computed positions", kv.slots.size(), kv.computed);
  BASALT_CHECK(kv.cached <= kv.computed && kv.cached % pool_.page_size() == 0,
               "request KV: {} cached of {} computed positions", kv.cached, kv.computed);
  BASALT_CHECK(pool_.is_page_aligned(kv.slots), "request KV: slots are not page-aligned");
}

void KvManager::check_invariants(int64_t held_by_requests) const {
  cache_.check_invariants();
  BASALT_CHECK(held_by_requests == cache_.held_tokens(), "requests hold {} slots, the cache counts {}",
               held_by_requests, cache_.held_tokens());
  // Requests and the tree hold whole pages: no page is partly free.
  BASALT_CHECK(pool_.free_slots() == pool_.free_pages() * pool_.page_size(), "a page is partly free");
}

}  // namespace basalt
