#include "runtime/engine_group.h"

#include <algorithm>
#include <map>
#include <unordered_set>
#include <utility>

#include "runtime/kv_events.h"

#include "core/error.h"

namespace basalt {

// One subscriber's merged stream: its listener, the numbering, and how many
// engines hold each block (by namespace and hash).
struct EngineGroup::Subscription {
  uint64_t id = 0;
  KvEventListener listener;
  std::vector<uint64_t> engine_ids;  // per engine: its subscription
  std::mutex mu;                     // what follows
  uint64_t seq = 0;
  std::map<std::pair<uint64_t, uint64_t>, int> holders;

  void deliver(const KvEventBatch& batch) {
    std::lock_guard<std::mutex> lock(mu);
    KvEventBatch merged;
    merged.seq = ++seq;
    merged.snapshot = merged.seq == 1;
    merged.block_size = batch.block_size;
    for (const KvEvent& e : batch.events) {
      if (e.kind == KvEvent::Kind::kStored) {
        for (uint64_t h : e.block_hashes) ++holders[{e.ns, h}];
        merged.events.push_back(e);
        continue;
      }
      KvEvent gone = e;
      gone.block_hashes.clear();
      for (uint64_t h : e.block_hashes) {
        const auto it = holders.find({e.ns, h});
        if (it == holders.end()) continue;  // stored before this subscription's snapshot: not ours to remove
        if (--it->second == 0) {
          holders.erase(it);
          gone.block_hashes.push_back(h);
        }
      }
      if (!gone.block_hashes.empty()) merged.events.push_back(std::move(gone));
    }
    if (merged.snapshot || !merged.events.empty()) {
      listener(merged);
    } else {
      --seq;  // nothing to pass on: the numbering stays without gaps
    }
  }
};

// One engine's cached blocks (hashes carry their namespace), kept from its
// KV events on its delivery thread.
struct EngineGroup::CachedBlocks {
  mutable std::mutex mu;  // what follows
  int32_t block_size = 0;
  std::unordered_set<uint64_t> blocks;
  uint64_t subscription = 0;

  void apply(const KvEventBatch& batch) {
    std::lock_guard<std::mutex> lock(mu);
    if (batch.snapshot) blocks.clear();
    block_size = batch.block_size;
    for (const KvEvent& e : batch.events)
      for (uint64_t h : e.block_hashes) {
        if (e.kind == KvEvent::Kind::kStored) {
          blocks.insert(h);
        } else {
          blocks.erase(h);
        }
      }
  }
};

EngineGroup::EngineGroup(std::vector<std::unique_ptr<Engine>> engines) : engines_(std::move(engines)) {
  BASALT_CHECK(!engines_.empty(), "an engine group needs at least one engine");
  for (auto& e : engines_) {
    cached_.push_back(std::make_unique<CachedBlocks>());
    CachedBlocks* c = cached_.back().get();
    c->subscription = e->subscribe_kv_events([c](const KvEventBatch& batch) { c->apply(batch); });
  }
}

EngineGroup::~EngineGroup() {
  std::vector<std::shared_ptr<Subscription>> left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    left.swap(subscriptions_);
  }
  for (const auto& s : left)
    for (size_t i = 0; i < engines_.size(); ++i) engines_[i]->unsubscribe_kv_events(s->engine_ids[i]);
  // The engines stop (and stop calling the listeners) before cached_ goes.
  engines_.clear();
}

size_t EngineGroup::cached_prefix_blocks(int i, uint64_t ns, std::span<const int32_t> prompt) const {
  PromptBlocks blocks;
  return leading_blocks(i, ns, prompt, blocks);
}

size_t EngineGroup::leading_blocks(int i, uint64_t ns, std::span<const int32_t> prompt, PromptBlocks& blocks) const {
  const CachedBlocks& c = *cached_[static_cast<size_t>(i)];
  int32_t size = 0;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    if (c.blocks.empty()) return 0;
    size = c.block_size;
  }
  if (size <= 0) return 0;
  if (blocks.block_size != size) {  // hashed once per block size (the engines share one)
    blocks.block_size = size;
    blocks.hashes = kv_block_hashes(ns, prompt, static_cast<size_t>(size));
  }
  std::lock_guard<std::mutex> lock(c.mu);
  size_t held = 0;
  for (uint64_t h : blocks.hashes) {
    if (c.blocks.count(h) == 0) break;
    ++held;
  }
  return held;
}

Engine& EngineGroup::pick(const EngineRequest& request) {
  const size_t n = engines_.size();
  std::vector<int64_t> load(n);
  for (size_t i = 0; i < n; ++i) load[i] = engines_[i]->load();
  const int64_t least = *std::min_element(load.begin(), load.end());
  const int64_t limit = least + std::max<int64_t>(2, least / 4);
  const size_t first = static_cast<size_t>(turn_.fetch_add(1) % n);
  size_t best = n, best_blocks = 0;
  PromptBlocks prompt;
  for (size_t k = 0; k < n; ++k) {
    const size_t i = (first + k) % n;
    if (load[i] > limit) continue;
    const size_t blocks = leading_blocks(static_cast<int>(i), request.cache_namespace, request.prompt, prompt);
    if (best == n || blocks > best_blocks || (blocks == best_blocks && load[i] < load[best])) {
      best = i;
      best_blocks = blocks;
    }
  }
  return *engines_[best];
}

RequestHandle EngineGroup::submit(EngineRequest request) {
  Engine& e = pick(request);
  return e.submit(std::move(request));
}

std::vector<RequestHandle> EngineGroup::submit_n(EngineRequest request, int n) {
  Engine& e = pick(request);
  return e.submit_n(std::move(request), n);
}

void EngineGroup::cancel(uint64_t id) {
  for (auto& e : engines_) e->cancel(id);
}

EngineMetrics EngineGroup::metrics() const {
  EngineMetrics all = engines_[0]->metrics();
  for (size_t i = 1; i < engines_.size(); ++i) all.merge(engines_[i]->metrics());
  return all;
}

int64_t EngineGroup::kv_capacity() const {
  int64_t slots = 0;
  for (const auto& e : engines_) slots += e->kv_capacity();
  return slots;
}

const ModelConfig& EngineGroup::model_config() const { return engines_[0]->model_config(); }

uint64_t EngineGroup::subscribe_kv_events(KvEventListener listener) {
  auto s = std::make_shared<Subscription>();
  s->listener = std::move(listener);
  {
    std::lock_guard<std::mutex> lock(mu_);
    s->id = next_subscription_++;
    subscriptions_.push_back(s);
  }
  // Each engine's first batch (its snapshot) may come at once, on its own
  // thread; deliver() orders them. The subscription outlives the engines'
  // calls: each holds it.
  for (auto& e : engines_)
    s->engine_ids.push_back(e->subscribe_kv_events([s](const KvEventBatch& batch) { s->deliver(batch); }));
  return s->id;
}

void EngineGroup::unsubscribe_kv_events(uint64_t id) {
  std::shared_ptr<Subscription> s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = subscriptions_.begin(); it != subscriptions_.end(); ++it)
      if ((*it)->id == id) {
        s = *it;
        subscriptions_.erase(it);
        break;
      }
  }
  if (!s) return;
  for (size_t i = 0; i < engines_.size(); ++i) engines_[i]->unsubscribe_kv_events(s->engine_ids[i]);
}

}  // namespace basalt
