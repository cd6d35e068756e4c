// PrefixIndex: which replicas probably hold a prompt's beginning in their
// radix caches, from where the gateway sent earlier prompts (the
// approximate mode of docs/ROUTER.md §2; the exact one, router/kv_index.h,
// reads replicas' KV events, and keeps these entries only as provisional
// ones for the time before a replica's events tell). Prompts are cut into blocks of block_bytes bytes, each
// hashed together with every block before it (the first with the request's
// scope: model and cache namespace), so a block's hash names the whole
// prefix that ends with it (as the Gateway API Inference Extension's
// prefix plugin does; SGLang keeps a character tree for the same).
//
// Contract: match() counts, per replica, the leading blocks it was sent
// within `ttl` (a block past its time, or evicted, ends the match);
// insert() records a prompt's blocks as sent to a replica now. Each
// replica keeps at most max_entries_per_replica blocks, the least recently
// sent evicted first. Safe from any thread (one mutex).
#pragma once

#include <chrono>
#include <cstdint>
#include <list>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace basalt::router {

struct PrefixIndexOptions {
  size_t block_bytes = 64;
  size_t max_blocks = 256;  // of one prompt (16 KiB)
  size_t max_entries_per_replica = 31250;  // GIE's LRU size per server
  std::chrono::seconds ttl{120};           // Dynamo's, for entries no KV event confirms
};

class PrefixIndex {
 public:
  using Clock = std::chrono::steady_clock;
  using Options = PrefixIndexOptions;

  explicit PrefixIndex(Options options = {}) : options_(options) {}

  // The chained hashes of the whole blocks of `text` (at most max_blocks).
  std::vector<uint64_t> blocks(std::string_view scope, std::string_view text) const;
  // Per replica of `replicas`: its leading blocks of `blocks`, each sent
  // within the ttl, or within max_age[i] when given for that replica.
  std::vector<size_t> match(std::span<const std::string_view> replicas, std::span<const uint64_t> blocks,
                            Clock::time_point now, std::span<const Clock::duration> max_age = {}) const;
  void insert(std::string_view replica, std::span<const uint64_t> blocks, Clock::time_point now);
  // Blocks held for `replica` (tests, metrics).
  size_t entries(std::string_view replica) const;

 private:
  struct Held {
    std::list<uint64_t> lru;  // most recent first
    std::unordered_map<uint64_t, std::pair<std::list<uint64_t>::iterator, Clock::time_point>> at;
  };
  Options options_;
  mutable std::mutex mu_;
  std::map<std::string, Held, std::less<>> held_;
};

}  // namespace basalt::router
