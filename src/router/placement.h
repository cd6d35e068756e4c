// Placement: where a request may go (its regions) and where it should go
// (its pool), docs/ROUTER.md §5.
//
//  * Regions are a hard filter. A request's allowed regions are its
//    tenant's `regions`, narrowed by an X-Basalt-Region header (a
//    comma-separated list); the header alone restricts a request whose
//    tenant has none. allowed_regions() answers 400 for a malformed header
//    and 403 for a region the tenant may not use (the key is known, the
//    place is refused: what 403 means). A replica is inside the allowed
//    regions only when its `region` label is one of them: an unlabelled
//    replica is outside every region.
//  * EQT (estimated queue time) of a pool, in milliseconds: (tokens queued
//    in the gateway for the pool + its replicas' pending prefill tokens) /
//    their prefill tokens per second; infinite for a pool without a rate
//    (no replica to take the work).
//  * OverflowTracker keeps, per pool and class, whether the pool
//    overflows for that class: it starts when an EQT reading is above the
//    class's TTFT objective and stops only when one is below 0.8 of it
//    (hysteresis, so a pool near its objective does not flap). Safe from
//    any thread.
//  * choose_overflow_pool(): among the overflow pools a request may reach,
//    the one with the lowest EQT that is below the objective (ties: the
//    first listed); none when no pool qualifies (the request stays home).
//  * QueuedTokens: the estimated tokens of the gateway's queued requests,
//    per home pool. Safe from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace basalt::router {

// A region or pool name: 1-64 letters, digits, '-', '_' or '.'.
bool valid_placement_name(std::string_view name);

struct AllowedRegions {
  int status = 0;                    // 0: fine; 400 or 403: the request's answer
  std::string message;               // with the status
  std::vector<std::string> regions;  // empty: anywhere
};
// `tenant_regions`: the tenant's (empty: any); `header`: X-Basalt-Region
// when the request has one.
AllowedRegions allowed_regions(std::span<const std::string> tenant_regions,
                               std::optional<std::string_view> header);
bool region_allowed(std::span<const std::string> allowed, std::string_view region);

struct PoolLoad {
  double queued_tokens = 0;           // in the gateway's queue, homed on the pool
  double pending_prefill_tokens = 0;  // summed over the pool's replicas
  double prefill_tokens_per_s = 0;    // summed over the pool's replicas
};
double estimated_queue_ms(const PoolLoad& load);

class OverflowTracker {
 public:
  // One EQT reading of `pool` for `class_name` (objective `slo_ms` > 0):
  // whether the pool overflows for that class now.
  bool observe(const std::string& pool, const std::string& class_name, double eqt_ms,
               int64_t slo_ms);
  // Per (pool, class) read so far: whether it overflows.
  std::map<std::pair<std::string, std::string>, bool> states() const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, std::string>, bool> overflowing_;
};

struct OverflowOption {
  std::string_view pool;
  double eqt_ms = 0;
  bool reachable = false;  // has a replica the request may use (region, model, health)
};
// Index into `options` (in the tenant's overflow_pools order).
std::optional<size_t> choose_overflow_pool(std::span<const OverflowOption> options, int64_t slo_ms);

class QueuedTokens {
 public:
  void add(const std::string& pool, int64_t tokens);
  void remove(const std::string& pool, int64_t tokens);
  int64_t of(const std::string& pool) const;
  int64_t total() const;  // over every pool

 private:
  mutable std::mutex mu_;
  std::map<std::string, int64_t> tokens_;
};

}  // namespace basalt::router
