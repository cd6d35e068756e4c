// Tenants: who a gateway request is from, by its API key, and what it may
// do (docs/ROUTER.md §4). A tenants file (JSON) names the classes and each
// tenant's keys, class, weight, limits and cache sharing:
//
//   {"classes": {"interactive": {"priority": 2, "queue_deadline_ms": 2000, "ttft_slo_ms": 1500},
//                "batch": {"priority": 1}, "spare": {"priority": 0, "sheddable": true}},
//    "tenants": {"acme": {"keys": ["sk-acme-1"], "class": "interactive", "weight": 3,
//                         "limits": {"rps": 20, "burst": 40, "tokens_per_min": 400000,
//                                    "max_concurrency": 64, "max_queued": 256},
//                         "share_cache": false, "regions": ["eu"], "pool": "eu-a",
//                         "overflow_pools": ["eu-b"]}}}
//
// Contract:
//  * parse_tenants() checks the whole file: unknown fields, wrong types,
//    a key given twice (also across tenants), an unknown class, numbers
//    out of their range; basalt::Error names the file and the field's
//    path (`tenants.acme.limits.rps`). Keys are never written into errors
//    or logs.
//  * TenantBook::find() gives the tenant a key belongs to, comparing keys
//    in constant time. admit() applies the tenant's limits to one request:
//    a request bucket of capacity `burst` refilled at `rps` per second
//    (SGLang's token bucket); a token bucket of capacity tokens_per_min
//    refilled at tokens_per_min/60 a second, charged the request's
//    estimated tokens (it passes when they are there, or when the bucket is
//    full, so a request larger than a minute's tokens is not refused
//    forever); and, for requests not queued, at most `max_concurrency` at
//    once. A refusal carries the seconds after which a retry can pass.
//    An admitted request counts as running from admit() (not queued) or
//    started() (queued, once dispatched) until release(); refund() gives
//    back the tokens it was charged and did not use, and all of them when
//    it never ran.
//  * Placement (router/placement.h): `regions` are where the tenant's
//    requests may be served (a non-empty list, none: anywhere), `pool` its
//    home pool, `overflow_pools` the pools its requests may overflow to,
//    in order (the home pool not among them); names as
//    valid_placement_name() takes them, none twice.
//  * cache_salt(): unless the tenant shares its cache, the namespace its
//    requests get in the replicas' radix caches ("t:" + tenant, then "/"
//    and the client's own salt), so tenants never hit each other's
//    prefixes.
//  * A book is replaced whole on reload; tenants keep their counters by
//    name across it. Safe from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace basalt::router {

struct TenantLimits {
  double rps = 0;              // 0: no rate limit
  double burst = 0;            // the bucket's capacity (default: rps, at least 1)
  double tokens_per_min = 0;   // 0: no token limit
  int64_t max_concurrency = 0;  // 0: no limit
  int64_t max_queued = 0;       // 0: no limit
};

struct Tenant {
  std::string name;
  std::vector<std::string> keys;
  // Its class's: name, priority (higher first), how long its requests may
  // wait in the gateway's queue (default 60 s), its time-to-first-token
  // objective (0: none; a class without one never overflows) and whether
  // it is shed while the replicas are saturated.
  std::string class_name;
  int priority = 0;
  int64_t queue_deadline_ms = 60000;
  int64_t ttft_slo_ms = 0;
  bool sheddable = false;
  double weight = 1;  // its share inside its class
  TenantLimits limits;
  bool share_cache = false;
  std::vector<std::string> regions;  // empty: any
  std::string pool;                  // empty: the gateway's --home-pool
  std::vector<std::string> overflow_pools;
};

// `text` is the file's contents; `name` names it in errors.
std::vector<Tenant> parse_tenants(std::string_view text, std::string_view name);

class TenantBook {
 public:
  using Clock = std::chrono::steady_clock;

  void set(std::vector<Tenant> tenants);
  bool empty() const;
  // The tenant of `key`; none for an unknown key.
  std::optional<Tenant> find(std::string_view key) const;

  struct Admission {
    bool admitted = false;
    std::string reason;       // "rate", "tokens" or "concurrency" when refused
    int retry_after_s = 0;    // when refused
  };
  // `tokens`: the request's estimated tokens, charged to the token bucket.
  // `queued`: the admission queue applies the concurrency limit, and the
  // request runs from started().
  Admission admit(const std::string& tenant, Clock::time_point now, int64_t tokens = 0, bool queued = false);
  void started(const std::string& tenant);
  void release(const std::string& tenant);
  void refund(const std::string& tenant, int64_t tokens);

  static std::string cache_salt(const Tenant& tenant, std::string_view client_salt);

  // Per tenant: requests running now (metrics).
  std::map<std::string, int64_t> running() const;

 private:
  struct Counters {
    double tokens = -1;  // the request bucket; -1: full, not yet used
    Clock::time_point refilled{};
    // tokens_per_min's bucket (below 0 after a request larger than it);
    // none: full, not yet used.
    std::optional<double> token_bucket;
    Clock::time_point token_refilled{};
    int64_t running = 0;
  };
  mutable std::mutex mu_;
  std::vector<Tenant> tenants_;
  std::map<std::string, Counters> counters_;  // by tenant name, across reloads
};

}  // namespace basalt::router
