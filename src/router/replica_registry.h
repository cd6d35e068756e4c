// ReplicaRegistry: the replicas `basalt route` spreads requests over.
//
// Contract:
//  * A replica is written `URL [key=value ...]`, on the command line
//    (--replica) or one per line of a file (--replica-file; blank lines and
//    `#` comments skipped). The URL is a base URL (server/http_client.h's
//    parse_base_url); the keys are labels: `region`, `pool` and `model`
//    (else the gateway asks the replica's /v1/models). Another key, an empty
//    value, a URL given twice or an empty list is an error (basalt::Error)
//    naming the flag, or the file and line.
//  * A replica's identity is its canonical URL (scheme://host:port/prefix,
//    scheme and host lower-cased), so `http://A:80/` and `http://a` are one
//    replica.
//  * set() publishes a new immutable Snapshot; snapshot() returns the
//    current one. Readers hold a snapshot as long as they like (a request in
//    flight keeps the replica it chose), and set() never changes one that
//    was handed out. Both are safe from any thread.
//  * Per-replica mutable state (ReplicaState) is keyed by identity and
//    survives set(): a replica still listed keeps its state (its in-flight
//    count, later its health); one no longer listed is marked draining (no
//    new requests; those in flight finish) and dropped from the next
//    snapshot; listed again, it gets its state back, no longer draining.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "router/circuit_breaker.h"
#include "server/http_client.h"

namespace basalt::router {

struct ReplicaSpec {
  BaseUrl url;
  std::string id;  // the canonical URL
  std::string region, pool, model;  // empty: not given
};

// `text` is "URL [key=value ...]"; `where` names it in errors ("--replica",
// "replicas.txt:3").
ReplicaSpec parse_replica(std::string_view text, std::string_view where);
// The lines of a replica file; `name` names it in errors.
std::vector<ReplicaSpec> parse_replica_file(std::string_view text, std::string_view name);
// The canonical form of a base URL.
std::string canonical_url(const BaseUrl& url);

// What the last scrape of a replica's /metrics said (router/replica_metrics.h).
struct ScrapedLoad {
  bool valid = false;  // the last scrape answered with the numbers below
  std::chrono::steady_clock::time_point at{};
  double waiting = 0;   // requests queued in the replica
  double running = 0;   // requests in its running batch
  double kv_usage = 0;  // used / capacity of its KV cache, 0 to 1
  // basalt_prefill_tokens_total, and its change since the scrape before
  // (none after a restart of the replica or before two scrapes).
  double prefill_tokens = -1;
  double prefill_tokens_delta = -1;
  double prefill_tokens_per_s = -1;
  // The prefill rate measured while the replica had requests waiting (an
  // EWMA over such scrapes; -1 until one): its capacity, where the rate of
  // an idle replica would be only its demand.
  double prefill_capacity_per_s = -1;
  uint64_t failures = 0;  // scrapes that failed, in all
};

// What the gateway keeps per replica between snapshots.
struct ReplicaState {
  explicit ReplicaState(BreakerOptions breaker_options = {}) : breaker(breaker_options) {}

  std::atomic<int64_t> in_flight{0};     // requests sent and not yet answered in full
  std::atomic<bool> draining{false};     // removed from the list: no new requests
  std::atomic<bool> healthy{true};       // its health probes (router/health.h); true until they say
  std::mutex mu;                         // guards what follows
  CircuitBreaker breaker;                // from how its requests ended
  int probe_failures = 0, probe_successes = 0;  // in a row
  ScrapedLoad scraped;
  // Attempts started since the last scrape was recorded and not ended yet:
  // the load the scraped numbers cannot show.
  int64_t sent_since_scrape = 0;
  // Those of them whose replica has not begun answering (no streamed event
  // yet): what the scrape's `waiting` cannot show. A stream that has begun
  // is running at the replica, so it does not count towards saturation.
  int64_t unanswered_since_scrape = 0;
  uint64_t scrape_generation = 0;  // one more per recorded scrape

  // An attempt begins (in_flight and both counts above count it); the
  // value returned goes back to attempt_answering() and attempt_ended().
  uint64_t attempt_started();
  // Its replica began answering (the first event of a stream); at most once
  // per attempt.
  void attempt_answering(uint64_t generation);
  // It ended; `answering`: attempt_answering() was called for it.
  void attempt_ended(uint64_t generation, bool answering = false);
};

struct Replica {
  ReplicaSpec spec;
  std::shared_ptr<ReplicaState> state;
};

struct Snapshot {
  uint64_t generation = 0;  // 1 for the first set(), one more for each after
  std::vector<Replica> replicas;
  // The replica with this canonical URL; null when not listed.
  const Replica* find(std::string_view id) const;
};

class ReplicaRegistry {
 public:
  // Each replica's circuit breaker opens, waits and closes as `breaker` says.
  explicit ReplicaRegistry(BreakerOptions breaker = {}) : breaker_(breaker) {}
  // Throws basalt::Error for an empty list or a replica given twice (the
  // registry is left as it was).
  void set(std::vector<ReplicaSpec> specs);
  // As set(), but an empty list is published too (every replica drains):
  // what DNS discovery finds for a pool scaled to zero (router/dns_discovery.h).
  void set_allowing_none(std::vector<ReplicaSpec> specs);
  std::shared_ptr<const Snapshot> snapshot() const;

 private:
  BreakerOptions breaker_;
  mutable std::mutex mu_;
  std::shared_ptr<const Snapshot> current_ = std::make_shared<const Snapshot>();
  std::map<std::string, std::shared_ptr<ReplicaState>, std::less<>> states_;  // every replica ever listed
};

}  // namespace basalt::router
