// Replica metrics: what the gateway learns from each replica's /metrics
// (docs/ROUTER.md §1, §2, §4), and what it makes of it.
//
//  * replica_load() picks out, from a replica's text as
//    router/prometheus_reader.h reads it, the numbers the gateway routes by:
//    basalt_requests_waiting, basalt_requests_running,
//    basalt_kv_cache_usage_ratio and basalt_prefill_tokens_total (the
//    vllm:num_requests_waiting / _running and vllm:kv_cache_usage_perc
//    names when basalt's are absent), summed over their label sets (one
//    per model a replica serves; the largest for the usage ratio). A value
//    that cannot be one (negative, not finite, a usage past 1) counts as
//    absent.
//  * MetricsScraper GETs /metrics of every listed replica each `interval`
//    (on the io_context it is given; a replica's scrapes never overlap)
//    and records the result in its ReplicaState: a scrape is good when it
//    answered 200 with waiting, running and usage; anything else (a
//    failed connection, another status, garbage, a missing number) leaves
//    the state invalid until the next good one. Recording a scrape starts
//    a new count of the attempts sent since (ReplicaState).
//  * load_of() and saturated() are how policies and the admission queue
//    read a replica: with a valid scrape younger than stale_after, load is
//    its waiting + running + the attempts sent since the scrape, and it is
//    saturated when waiting + those of the attempts that have not begun
//    answering (no streamed event yet) reach max_waiting (5) or its KV
//    usage reaches max_kv_usage (0.8), GIE's defaults; without one, the
//    load is this gateway's in-flight count and it is never saturated (the
//    gateway has no numbers to hold requests back by).
//  * prefill_estimate() is a replica's share of a pool's EQT
//    (router/placement.h). Replicas do not export the prompt tokens they
//    have yet to prefill, so the pending tokens are its requests not yet
//    running (scraped waiting + attempts sent since that have not begun
//    answering; without a fresh scrape
//    the gateway's in-flight count) times the average prompt the gateway
//    has seen; the rate is the EWMA of basalt_prefill_tokens_total's rate
//    over scrapes that found requests waiting (an idle replica's rate is its
//    demand, not what it can do), `assumed_tokens_per_s` until there is one.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "router/prometheus_reader.h"
#include "router/replica_poller.h"
#include "router/replica_registry.h"

namespace basalt::router {

struct ReplicaLoad {
  std::optional<double> waiting, running, kv_usage, prefill_tokens;
  bool complete() const { return waiting && running && kv_usage; }
};

ReplicaLoad replica_load(const PrometheusRead& read);

struct ScrapeOptions {
  std::chrono::milliseconds interval{1000};
  std::chrono::milliseconds timeout{1000};
  std::chrono::milliseconds stale_after{3000};
  double max_waiting = 5;
  double max_kv_usage = 0.8;
};

// The load policies compare replicas by (see above).
int64_t load_of(ReplicaState& state, std::chrono::steady_clock::time_point now,
                const ScrapeOptions& options);
bool saturated(ReplicaState& state, std::chrono::steady_clock::time_point now,
               const ScrapeOptions& options);

struct PrefillEstimate {
  double pending_tokens = 0;
  double tokens_per_s = 0;
};
PrefillEstimate prefill_estimate(ReplicaState& state, std::chrono::steady_clock::time_point now,
                                 const ScrapeOptions& options, double average_prompt_tokens,
                                 double assumed_tokens_per_s);

class MetricsScraper {
 public:
  MetricsScraper(ReplicaRegistry& registry, boost::asio::io_context& io,
                 ScrapeOptions options = {});
  void start() { poller_.start(); }
  void stop() { poller_.stop(); }

  // The bookkeeping of one scrape: `load` none or incomplete is a failure.
  static void record(ReplicaState& state, const std::optional<ReplicaLoad>& load,
                     std::chrono::steady_clock::time_point now);

 private:
  ReplicaPoller poller_;  // GET /metrics, its rounds (router/replica_poller.h)
};

}  // namespace basalt::router
