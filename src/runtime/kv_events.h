// KV events: what a replica's radix cache holds, told as it changes, so that
// a router can keep an exact index of every replica's cached prefixes (vLLM's
// and SGLang's KV events carry the same facts).
//
// The cache is described in blocks of `block_size` tokens counted from the
// start of a sequence (a multiple of the KV page size). A block is cached
// when every one of its tokens is; it is named by a hash chained over the
// blocks before it and the cache namespace (tenant / cache salt):
//
//   h(block k) = mix(h(block k-1) ^ mix(namespace)), then h = mix(h ^ t) for
//                each token id t of block k (as uint32); h(block -1) = 0,
//   mix(x) = splitmix64's finalizer: x += 0x9E3779B97F4A7C15;
//            x = (x ^ x >> 30) * 0xBF58476D1CE4E5B9;
//            x = (x ^ x >> 27) * 0x94D049BB133111EB; x ^ x >> 31.
//
// So a router that tokenizes a request as the replica does can hash its
// prompt's whole blocks and look them up. Events:
//   stored:  blocks that became cached, consecutive, with the hash of the
//            block before the first (0 at the start of a sequence) and their
//            token ids;
//   removed: blocks that stopped being cached (evicted, or the cache was
//            emptied).
// A subscriber first gets a snapshot (stored events for everything cached),
// then every change in order; batches are numbered so that a gap shows.
#pragma once

#include <cstdint>
#include <cstddef>
#include <span>
#include <string_view>
#include <vector>

namespace basalt {

inline uint64_t kv_mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline uint64_t kv_block_hash(uint64_t parent, uint64_t ns, std::span<const int32_t> tokens) {
  uint64_t h = kv_mix64(parent ^ kv_mix64(ns));
  for (int32_t t : tokens) h = kv_mix64(h ^ static_cast<uint32_t>(t));
  return h;
}

// The namespace of a cache salt (docs/SERVER.md): 0 without one, else the
// 64-bit FNV-1a hash of its bytes with the lowest bit set.
inline uint64_t kv_cache_namespace(std::string_view salt) {
  if (salt.empty()) return 0;
  uint64_t h = 1469598103934665603ull;
  for (const unsigned char c : salt) h = (h ^ c) * 1099511628211ull;
  return h | 1;  // never the default namespace 0
}

// The chained hashes of the whole blocks of `tokens` (at most max_blocks).
inline std::vector<uint64_t> kv_block_hashes(uint64_t ns, std::span<const int32_t> tokens, size_t block_size,
                                             size_t max_blocks = SIZE_MAX) {
  std::vector<uint64_t> out;
  if (block_size == 0) return out;
  uint64_t parent = 0;
  for (size_t at = 0; at + block_size <= tokens.size() && out.size() < max_blocks; at += block_size) {
    parent = kv_block_hash(parent, ns, tokens.subspan(at, block_size));
    out.push_back(parent);
  }
  return out;
}

struct KvEvent {
  enum class Kind : uint8_t { kStored, kRemoved };
  Kind kind = Kind::kStored;
  uint64_t ns = 0;
  std::vector<uint64_t> block_hashes;
  uint64_t parent_hash = 0;        // stored: the block before the first (0: none)
  std::vector<int32_t> token_ids;  // stored: block_size tokens per block
};

struct KvEventBatch {
  uint64_t seq = 0;         // 1, 2, 3, ... per subscriber
  bool snapshot = false;    // the subscriber's first batch: everything cached now
  int32_t block_size = 0;
  std::vector<KvEvent> events;
};

}  // namespace basalt
