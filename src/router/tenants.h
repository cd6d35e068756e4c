// Tenants: who a gateway request is from, by its API key, and what it may
// do (docs/ROUTER.md §4). A tenants file (JSON) names each tenant's keys,
// class, rate limits and cache sharing:
//
//   {"classes": {"interactive": {"priority": 2}, "batch": {"priority": 1}},
//    "tenants": {"acme": {"keys": ["sk-acme-1"], "class": "interactive",
//                         "limits": {"rps": 20, "burst": 40, "max_concurrency": 64},
//                         "share_cache": false}}}
//
// Contract:
//  * parse_tenants() checks the whole file: unknown fields, wrong types,
//    a key given twice (also across tenants), an unknown class, limits
//    that are not positive; basalt::Error names the file and the field's
//    path (`tenants.acme.limits.rps`). Keys are never written into errors
//    or logs.
//  * TenantBook::find() gives the tenant a key belongs to, comparing keys
//    in constant time. admit() applies the tenant's limits to one request:
//    a request bucket of capacity `burst` refilled at `rps` per second
//    (SGLang's token bucket), and at most `max_concurrency` at once; a
//    refusal carries the seconds after which a retry can pass. Each
//    admitted request ends with release().
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

struct TenantClass {
  std::string name;
  int priority = 0;
};

struct TenantLimits {
  double rps = 0;              // 0: no rate limit
  double burst = 0;            // the bucket's capacity (default: rps, at least 1)
  int64_t max_concurrency = 0;  // 0: no limit
};

struct Tenant {
  std::string name;
  std::vector<std::string> keys;
  std::string class_name;
  int priority = 0;
  TenantLimits limits;
  bool share_cache = false;
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
    std::string reason;       // "rate" or "concurrency" when refused
    int retry_after_s = 0;    // when refused
  };
  Admission admit(const std::string& tenant, Clock::time_point now);
  void release(const std::string& tenant);

  static std::string cache_salt(const Tenant& tenant, std::string_view client_salt);

  // Per tenant: requests running now (metrics).
  std::map<std::string, int64_t> running() const;

 private:
  struct Counters {
    double tokens = -1;  // the request bucket; -1: full, not yet used
    Clock::time_point refilled{};
    int64_t running = 0;
  };
  mutable std::mutex mu_;
  std::vector<Tenant> tenants_;
  std::map<std::string, Counters> counters_;  // by tenant name, across reloads
};

}  // namespace basalt::router
