// KvIndex: the blocks each replica's radix cache holds, as the replica's KV
// events tell them (GET /v1/kv_events, docs/SERVER.md "KV events"): the
// exact mode of cache-aware routing (docs/ROUTER.md §2, step 12). Blocks
// are named by their chained hashes (runtime/kv_events.h), so a prompt the
// gateway tokenizes as the replica does is looked up by hashing its whole
// blocks with the replica's block size.
//
// Contract: a replica is live from reset() (its event stream's snapshot)
// until drop() (the stream ended, showed a gap or was malformed); only a
// live replica has a block size and matches (match() is nullopt
// otherwise, and the caller falls back on the approximate PrefixIndex).
// stored() and removed() apply events to a live replica and are ignored
// for one that is not. A replica holding more than max_blocks_per_replica
// blocks is dropped (a replica cannot make the gateway grow without
// bound); it is subscribed again later. Safe from any thread (one mutex).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>

namespace basalt::router {

class KvIndex {
 public:
  explicit KvIndex(size_t max_blocks_per_replica = size_t{1} << 22) : max_blocks_(max_blocks_per_replica) {}

  void reset(std::string_view replica, int32_t block_size);
  void drop(std::string_view replica);
  // False when the replica was dropped for holding too many blocks.
  bool stored(std::string_view replica, std::span<const uint64_t> hashes);
  void removed(std::string_view replica, std::span<const uint64_t> hashes);

  // The replica's block size; 0 when it is not live.
  int32_t block_size(std::string_view replica) const;
  // Leading blocks of `hashes` (a prompt's chained block hashes at the
  // replica's block size) the replica holds; nullopt when it is not live.
  std::optional<size_t> match(std::string_view replica, std::span<const uint64_t> hashes) const;
  size_t blocks(std::string_view replica) const;

 private:
  struct Held {
    int32_t block_size = 0;
    std::unordered_set<uint64_t> hashes;
  };
  size_t max_blocks_;
  mutable std::mutex mu_;
  std::map<std::string, Held, std::less<>> live_;
};

}  // namespace basalt::router
