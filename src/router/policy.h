// Routing policies (docs/ROUTER.md §2): the order in which a request's
// candidate replicas are tried. The candidates are already filtered (model,
// health, breaker, not tried yet); pick() takes the first whose breaker
// lets the request through. Pure and deterministic given `turn` (a
// per-model counter) and `random`.
//
//  * round-robin: the candidates rotated by `turn`.
//  * least-load: the least loaded first (ties rotated by `turn`). A
//    candidate's load is the caller's: the gateway gives the replica's
//    scraped queue and batch plus what it sent since that scrape, or its
//    own in-flight count without a fresh scrape (router/replica_metrics.h).
//  * power-of-two: two candidates drawn with `random`, the less loaded
//    first, then the other, then the rest by load (SGLang's p2c).
//  * cache-aware (the default): the replica holding the longest cached
//    prefix of the prompt (its `cached` share: the replica's KV events' say
//    where it streams them, else PrefixIndex's, router/route_server.h), when
//    that share is at least cache_threshold; otherwise, and among equal
//    shares, the least loaded. A candidate whose load is both more than
//    balance_abs above the least loaded one's and more than balance_rel
//    times it goes last (SGLang's imbalance rule, applied per candidate
//    rather than switching the whole fleet to shortest-queue).
//  * session: rendezvous hashing of the request's session key over the
//    candidates' ids, so a key stays on its replica while that one is
//    listed and a removed replica moves only its own keys; the next in
//    that order takes over while it is out. No key: round-robin.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace basalt::router {

enum class Policy { kCacheAware, kRoundRobin, kLeastLoad, kPowerOfTwo, kSession };

// "cache-aware", "round-robin", "least-load", "power-of-two" or "session"; throws
// basalt::Error naming `flag` otherwise.
Policy parse_policy(std::string_view name, std::string_view flag = "--policy");
const char* policy_name(Policy policy);

struct Candidate {
  std::string_view id;  // the replica's canonical URL
  int64_t load = 0;     // its requests queued and running (see least-load)
  double cached = 0;    // cache-aware: the share of the prompt's blocks it holds, 0 to 1
};

struct PickInput {
  uint64_t turn = 0;    // the model's request counter
  uint64_t random = 0;  // power-of-two's draw
  std::string_view session;
  double cache_threshold = 0.3;  // SGLang's CLI default
  int64_t balance_abs = 32;
  double balance_rel = 1.5;
};

// Indices into `candidates`, most preferred first (each once).
std::vector<size_t> preference(Policy policy, std::span<const Candidate> candidates, const PickInput& in);

}  // namespace basalt::router
