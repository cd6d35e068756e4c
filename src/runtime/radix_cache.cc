#include "runtime/radix_cache.h"

#include <algorithm>
#include <set>
#include <utility>

#include "core/error.h"

namespace basalt {

namespace {

// Length of the common prefix of an edge and the rest of a query.
size_t common_prefix(const std::vector<int32_t>& edge, std::span<const int32_t> query) {
  const size_t n = std::min(edge.size(), query.size());
  size_t i = 0;
  while (i < n && edge[i] == query[i]) ++i;
  return i;
}

}  // namespace

RadixCache::RadixCache(KvPool& pool, RadixCacheOptions options)
    : pool_(pool),
      options_(options),
      page_(pool.page_size()),
      in_tree_(static_cast<size_t>(pool.capacity()), 0) {}

RadixCache::~RadixCache() {
  // Tear the trees down iteratively: a long chain of chunked inserts would
  // otherwise recurse once per node.
  std::vector<std::unique_ptr<RadixNode>> stack;
  for (auto& [ns, r] : roots_) stack.push_back(std::move(r));
  while (!stack.empty()) {
    std::unique_ptr<RadixNode> n = std::move(stack.back());
    stack.pop_back();
    for (auto& [first, c] : n->children_) stack.push_back(std::move(c));
  }
}

RadixNode* RadixCache::root(uint64_t ns) {
  auto [it, inserted] = roots_.try_emplace(ns);
  if (inserted) {
    it->second = std::make_unique<RadixNode>();
    it->second->ns_ = ns;
    it->second->id_ = next_id_++;
  }
  return it->second.get();
}

uint64_t RadixCache::child_key(std::span<const int32_t> tokens) const {
  BASALT_ASSERT(tokens.size() >= static_cast<size_t>(page_));
  if (page_ == 1) return static_cast<uint32_t>(tokens[0]);
  uint64_t h = 0xcbf29ce484222325ull;
  for (int32_t i = 0; i < page_; ++i) {
    h ^= static_cast<uint32_t>(tokens[static_cast<size_t>(i)]);
    h *= 0x100000001b3ull;
  }
  return h;
}

RadixNode* RadixCache::find_child(RadixNode* node, std::span<const int32_t> query) const {
  auto [it, end] = node->children_.equal_range(child_key(query));
  for (; it != end; ++it) {
    const std::vector<int32_t>& t = it->second->tokens_;
    if (page_ == 1 || std::equal(t.begin(), t.begin() + page_, query.begin())) return it->second.get();
  }
  return nullptr;
}

std::unordered_multimap<uint64_t, std::unique_ptr<RadixNode>>::iterator RadixCache::link_of(
    RadixNode* child) {
  auto& siblings = child->parent_->children_;
  auto [it, end] = siblings.equal_range(child_key(child->tokens_));
  for (; it != end; ++it)
    if (it->second.get() == child) return it;
  BASALT_ASSERT(false && "a node is missing from its parent");
  return siblings.end();
}

size_t RadixCache::matched_len(const std::vector<int32_t>& edge,
                               std::span<const int32_t> query) const {
  const size_t c = common_prefix(edge, query);
  return c - c % static_cast<size_t>(page_);
}

RadixNode::EvictKey RadixCache::key_of(const RadixNode* node) const {
  if (options_.policy == EvictionPolicy::kLfu) return {node->hits_, node->last_access_, node->id_};
  return {node->last_access_, 0, node->id_};
}

void RadixCache::update_evictable(RadixNode* node) {
  const bool want = !node->is_root() && node->children_.empty() && node->lock_ == 0;
  if (node->in_evict_set_ && (!want || node->evict_key_ != key_of(node))) {
    evictable_leaves_.erase({node->evict_key_, node});
    node->in_evict_set_ = false;
  }
  if (want && !node->in_evict_set_) {
    node->evict_key_ = key_of(node);
    evictable_leaves_.emplace(node->evict_key_, node);
    node->in_evict_set_ = true;
  }
}

void RadixCache::touch(RadixNode* node) {
  node->last_access_ = ++clock_;
  update_evictable(node);
}

RadixNode* RadixCache::split(RadixNode* node, size_t at) {
  BASALT_ASSERT(at > 0 && at < node->tokens_.size() && at % static_cast<size_t>(page_) == 0);
  const auto link = link_of(node);
  auto mid = std::make_unique<RadixNode>();
  mid->tokens_.assign(node->tokens_.begin(), node->tokens_.begin() + static_cast<ptrdiff_t>(at));
  mid->slots_.assign(node->slots_.begin(), node->slots_.begin() + static_cast<ptrdiff_t>(at));
  node->tokens_.erase(node->tokens_.begin(), node->tokens_.begin() + static_cast<ptrdiff_t>(at));
  node->slots_.erase(node->slots_.begin(), node->slots_.begin() + static_cast<ptrdiff_t>(at));
  mid->parent_ = node->parent_;
  mid->lock_ = node->lock_;
  mid->hits_ = node->hits_;
  mid->last_access_ = node->last_access_;
  mid->ns_ = node->ns_;
  mid->id_ = next_id_++;
  // The upper part keeps the node's first page, hence its key in the parent.
  std::unique_ptr<RadixNode> lower = std::move(link->second);
  lower->parent_ = mid.get();
  mid->children_.emplace(child_key(lower->tokens_), std::move(lower));
  link->second = std::move(mid);
  return link->second.get();
}

PrefixMatch RadixCache::match_prefix(uint64_t ns, std::span<const int32_t> tokens) {
  ++stats_.match_calls;
  stats_.queried_tokens += tokens.size();
  PrefixMatch match;
  if (!options_.enabled) return match;
  tokens = tokens.first(static_cast<size_t>(page_floor(static_cast<int64_t>(tokens.size()))));
  RadixNode* node = root(ns);
  size_t pos = 0;
  while (pos < tokens.size()) {
    RadixNode* child = find_child(node, tokens.subspan(pos));
    if (child == nullptr) break;
    const size_t c = matched_len(child->tokens_, tokens.subspan(pos));
    BASALT_ASSERT(c > 0);
    if (c < child->tokens_.size()) child = split(child, c);
    match.slots.insert(match.slots.end(), child->slots_.begin(), child->slots_.end());
    pos += c;
    node = child;
    ++node->hits_;
    touch(node);
  }
  stats_.matched_tokens += pos;
  match.last_node = node;
  return match;
}

InsertResult RadixCache::insert(uint64_t ns, std::span<const int32_t> tokens,
                                std::span<const int32_t> slots) {
  BASALT_CHECK(tokens.size() == slots.size(), "radix cache: insert of {} tokens with {} slots",
               tokens.size(), slots.size());
  InsertResult result;
  // Whole pages only: the partial last page stays the caller's.
  const auto whole = static_cast<size_t>(page_floor(static_cast<int64_t>(tokens.size())));
  tokens = tokens.first(whole);
  slots = slots.first(whole);
  if (!options_.enabled) {
    result.duplicates.assign(slots.begin(), slots.end());
    return result;
  }
  if (tokens.empty()) return result;
  RadixNode* node = root(ns);
  size_t pos = 0;
  while (pos < tokens.size()) {
    RadixNode* child = find_child(node, tokens.subspan(pos));
    if (child == nullptr) break;
    const size_t c = matched_len(child->tokens_, tokens.subspan(pos));
    BASALT_ASSERT(c > 0);
    if (c < child->tokens_.size()) child = split(child, c);
    for (size_t i = 0; i < c; ++i)
      if (slots[pos + i] != child->slots_[i]) result.duplicates.push_back(slots[pos + i]);
    pos += c;
    node = child;
    touch(node);
  }
  result.cached_before = static_cast<int64_t>(pos);
  result.cached_len = static_cast<int64_t>(tokens.size());
  if (pos == tokens.size()) return result;

  // The new tail: its slots must be held by the caller (allocated, not yet in
  // the tree, not repeated) and, with pages, whole pages at the offsets of
  // their positions (pos is a page boundary). Mark them, undoing the marks on
  // a bad slot.
  const std::span<const int32_t> fresh = slots.subspan(pos);
  if (!pool_.is_page_aligned(fresh)) {
    fail("radix cache: insert of slots that are not whole pages at their positions' offsets");
  }
  for (size_t i = 0; i < fresh.size(); ++i) {
    const int32_t s = fresh[i];
    const bool ok = pool_.is_allocated(s) && in_tree_[static_cast<size_t>(s)] == 0;
    if (!ok) {
      for (size_t j = 0; j < i; ++j) in_tree_[static_cast<size_t>(fresh[j])] = 0;
      fail("radix cache: insert of slot {} that is not held by the caller", s);
    }
    in_tree_[static_cast<size_t>(s)] = 1;
  }
  const auto count = static_cast<int64_t>(fresh.size());
  if (count > held_) {
    for (const int32_t s : fresh) in_tree_[static_cast<size_t>(s)] = 0;
    fail("radix cache: insert of {} new slots but only {} are held", count, held_);
  }
  auto leaf = std::make_unique<RadixNode>();
  leaf->tokens_.assign(tokens.begin() + static_cast<ptrdiff_t>(pos), tokens.end());
  leaf->slots_.assign(fresh.begin(), fresh.end());
  leaf->parent_ = node;
  leaf->ns_ = ns;
  leaf->id_ = next_id_++;
  leaf->last_access_ = ++clock_;
  RadixNode* added = leaf.get();
  node->children_.emplace(child_key(leaf->tokens_), std::move(leaf));
  update_evictable(node);
  update_evictable(added);
  if (event_block_ > 0) blocks_event(KvEvent::Kind::kStored, ns, tokens, pos, tokens.size(), events_);
  held_ -= count;
  evictable_ += count;
  stats_.inserted_tokens += static_cast<uint64_t>(count);
  return result;
}

void RadixCache::lock(RadixNode* node) {
  if (node == nullptr) return;
  for (RadixNode* n = node; n != nullptr; n = n->parent_) {
    if (n->lock_ == 0) {
      const auto size = static_cast<int64_t>(n->slots_.size());
      evictable_ -= size;
      locked_ += size;
    }
    ++n->lock_;
  }
  update_evictable(node);
}

void RadixCache::unlock(RadixNode* node) {
  if (node == nullptr) return;
  BASALT_CHECK(node->lock_ > 0, "radix cache: unlock of a node that is not locked");
  for (RadixNode* n = node; n != nullptr; n = n->parent_) {
    BASALT_ASSERT(n->lock_ > 0);
    if (--n->lock_ == 0) {
      const auto size = static_cast<int64_t>(n->slots_.size());
      locked_ -= size;
      evictable_ += size;
    }
  }
  update_evictable(node);
}

void RadixCache::remove_leaf(RadixNode* leaf) {
  BASALT_ASSERT(leaf->in_evict_set_);
  if (event_block_ > 0) {
    const std::vector<int32_t> path = path_of(leaf);
    blocks_event(KvEvent::Kind::kRemoved, leaf->ns_, path, path.size() - leaf->tokens_.size(), path.size(), events_);
  }
  evictable_leaves_.erase({leaf->evict_key_, leaf});
  pool_.free(leaf->slots_);
  for (const int32_t s : leaf->slots_) in_tree_[static_cast<size_t>(s)] = 0;
  evictable_ -= static_cast<int64_t>(leaf->slots_.size());
  RadixNode* parent = leaf->parent_;
  parent->children_.erase(link_of(leaf));  // destroys leaf
  if (parent->is_root()) {
    if (parent->children_.empty() && parent->lock_ == 0) roots_.erase(parent->ns_);
  } else {
    update_evictable(parent);
  }
}

int64_t RadixCache::evict(int64_t n_tokens) {
  int64_t freed = 0;
  while (freed < n_tokens && !evictable_leaves_.empty()) {
    RadixNode* leaf = evictable_leaves_.begin()->second;
    freed += static_cast<int64_t>(leaf->slots_.size());
    remove_leaf(leaf);
  }
  stats_.evicted_tokens += static_cast<uint64_t>(freed);
  return freed;
}

std::optional<std::vector<int32_t>> RadixCache::allocate(int64_t n) {
  std::vector<int32_t> slots;
  if (!allocate_into(n, slots)) return std::nullopt;
  return slots;
}

bool RadixCache::allocate_into(int64_t n, std::vector<int32_t>& out) {
  BASALT_CHECK(n > 0, "radix cache: cannot allocate {} slots", n);
  const int64_t page = pool_.page_size();
  const int64_t pages = (n + page - 1) / page;
  while (pool_.free_pages() < pages && !evictable_leaves_.empty())
    evict((pages - pool_.free_pages()) * page);
  const size_t before = out.size();
  if (!pool_.allocate_into(n, out)) return false;
  held_ += static_cast<int64_t>(out.size() - before);
  return true;
}

void RadixCache::release(std::span<const int32_t> slots) {
  BASALT_CHECK(static_cast<int64_t>(slots.size()) <= held_,
               "radix cache: release of {} slots but only {} are held", slots.size(), held_);
  for (const int32_t s : slots) {
    BASALT_CHECK(s >= 0 && s < pool_.capacity(), "radix cache: slot {} is not in the pool", s);
    BASALT_CHECK(in_tree_[static_cast<size_t>(s)] == 0,
                 "radix cache: release of slot {} that the tree owns", s);
  }
  pool_.free(slots);
  held_ -= static_cast<int64_t>(slots.size());
}

void RadixCache::check_invariants() const {
  pool_.check_invariants();
  std::vector<uint8_t> seen(in_tree_.size(), 0);
  int64_t evictable = 0, locked = 0;
  size_t leaves = 0;
  std::vector<const RadixNode*> stack;
  for (const auto& [ns, r] : roots_) {
    BASALT_ASSERT(r->parent_ == nullptr && r->tokens_.empty() && r->slots_.empty());
    BASALT_ASSERT(r->ns_ == ns && !r->in_evict_set_ && r->lock_ >= 0);
    stack.push_back(r.get());
    while (!stack.empty()) {
      const RadixNode* n = stack.back();
      stack.pop_back();
      std::set<std::vector<int32_t>> first_pages;  // distinct among siblings
      for (const auto& [key, c] : n->children_) {
        BASALT_ASSERT(c->parent_ == n && c->ns_ == ns);
        BASALT_ASSERT(!c->tokens_.empty() && c->tokens_.size() % static_cast<size_t>(page_) == 0);
        BASALT_ASSERT(child_key(c->tokens_) == key);
        BASALT_ASSERT(first_pages.emplace(c->tokens_.begin(), c->tokens_.begin() + page_).second);
        BASALT_ASSERT(c->tokens_.size() == c->slots_.size());
        // Every edge starts at a page boundary, so its slots are whole pages.
        BASALT_ASSERT(pool_.is_page_aligned(c->slots_));
        BASALT_ASSERT(c->lock_ >= 0 && c->lock_ <= n->lock_);
        for (const int32_t s : c->slots_) {
          BASALT_ASSERT(s >= 0 && static_cast<size_t>(s) < seen.size());
          BASALT_ASSERT(seen[static_cast<size_t>(s)] == 0);
          BASALT_ASSERT(in_tree_[static_cast<size_t>(s)] != 0 && pool_.is_allocated(s));
          seen[static_cast<size_t>(s)] = 1;
        }
        (c->lock_ > 0 ? locked : evictable) += static_cast<int64_t>(c->slots_.size());
        const bool leaf = c->children_.empty() && c->lock_ == 0;
        BASALT_ASSERT(c->in_evict_set_ == leaf);
        if (leaf) {
          BASALT_ASSERT(c->evict_key_ == key_of(c.get()));
          BASALT_ASSERT(evictable_leaves_.count({c->evict_key_, c.get()}) == 1);
          ++leaves;
        }
        stack.push_back(c.get());
      }
    }
  }
  BASALT_ASSERT(leaves == evictable_leaves_.size());
  BASALT_ASSERT(seen == in_tree_);
  BASALT_ASSERT(evictable == evictable_ && locked == locked_ && held_ >= 0);
  BASALT_ASSERT(pool_.free_slots() + evictable_ + locked_ + held_ == pool_.capacity());
}

// --- KV events -------------------------------------------------------------------

void RadixCache::set_event_block_size(int32_t block_size) {
  BASALT_CHECK(block_size >= 0 && block_size % page_ == 0,
               "radix cache: KV event blocks of {} tokens are not a multiple of the page size {}", block_size, page_);
  event_block_ = block_size;
  events_.clear();
}

std::vector<KvEvent> RadixCache::take_events() { return std::exchange(events_, {}); }

std::vector<int32_t> RadixCache::path_of(const RadixNode* node) const {
  std::vector<const RadixNode*> chain;
  size_t length = 0;
  for (const RadixNode* n = node; n != nullptr && !n->is_root(); n = n->parent_) {
    chain.push_back(n);
    length += n->tokens_.size();
  }
  std::vector<int32_t> path;
  path.reserve(length);
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) path.insert(path.end(), (*it)->tokens_.begin(), (*it)->tokens_.end());
  return path;
}

void RadixCache::blocks_event(KvEvent::Kind kind, uint64_t ns, std::span<const int32_t> path, size_t from,
                              size_t to, std::vector<KvEvent>& out) const {
  const auto B = static_cast<size_t>(event_block_);
  // The blocks whose last token lies in [from, to) and that end by `to`:
  // those the edge [from, to) completes. The first holds position `from`.
  size_t k = from / B;
  KvEvent e;
  e.kind = kind;
  e.ns = ns;
  uint64_t h = 0;
  for (size_t j = 0; j < k; ++j) h = kv_block_hash(h, ns, path.subspan(j * B, B));
  e.parent_hash = h;
  for (; (k + 1) * B <= to; ++k) {
    const std::span<const int32_t> block = path.subspan(k * B, B);
    h = kv_block_hash(h, ns, block);
    e.block_hashes.push_back(h);
    if (kind == KvEvent::Kind::kStored) e.token_ids.insert(e.token_ids.end(), block.begin(), block.end());
  }
  if (!e.block_hashes.empty()) out.push_back(std::move(e));
}

std::vector<KvEvent> RadixCache::snapshot() const {
  std::vector<KvEvent> out;
  if (event_block_ == 0) return out;
  // Every node's edge, parents before children, with the path to it.
  struct Item {
    const RadixNode* node;
    std::vector<int32_t> path;  // tokens before the node's edge
  };
  for (const auto& [ns, root] : roots_) {
    std::vector<Item> stack;
    for (const auto& [key, child] : root->children_) stack.push_back({child.get(), {}});
    while (!stack.empty()) {
      Item item = std::move(stack.back());
      stack.pop_back();
      const size_t from = item.path.size();
      item.path.insert(item.path.end(), item.node->tokens_.begin(), item.node->tokens_.end());
      blocks_event(KvEvent::Kind::kStored, ns, item.path, from, item.path.size(), out);
      for (const auto& [key, child] : item.node->children_) stack.push_back({child.get(), item.path});
    }
  }
  return out;
}

}  // namespace basalt
