// Fleet simulation (docs/DEPLOY.md §6, docs/SCALING.md): requests replayed in
// virtual time against simulated replicas, through the gateway's own policy,
// admission queue, load bookkeeping and autoscaler objects (src/router).
//
// Contract:
//  * simulate() is a discrete-event simulation and deterministic: the same
//    config and requests give the same result, bit for bit. Nothing sleeps;
//    virtual time t seconds is handed to the router objects as a
//    steady_clock time point (a fixed origin plus t).
//  * A replica runs continuous batching as the engine's scheduler does
//    (runtime/scheduler.h), simplified: each step every decoding request
//    takes one token, requests still prefilling take chunks of what is left
//    of step_token_budget, then requests waiting in the replica are admitted
//    first come first served while max_running, the budget and the KV pool
//    allow; a request is admitted only when its whole prompt plus all its
//    output fit in the KV pool's free tokens (no preemption). The step takes
//    table.step_ms(decode batch, prefill tokens). The step that finishes a
//    request's prompt gives its first token; each later step one more; the
//    request ends with its output_tokens-th token.
//  * Prefix caching is approximated per shared-prefix group: a replica
//    holds the groups whose prefix it prefilled, least recently used first
//    out, within the KV tokens its running requests leave free; a request
//    of a held group prefills only prompt_tokens - prefix_tokens. The
//    cache-aware policy sees that share as the replica's `cached`.
//  * The gateway: each arrival is placed by router::preference() over the
//    ready replicas, with load_of() over each replica's ReplicaState (the
//    scrape every scrape.interval through MetricsScraper::record(), plus
//    the attempts sent since, as in the gateway). A request waits in a
//    router::AdmissionQueue while no replica is ready (scale from zero), or
//    always with `saturation_gate` (tenants' requests: it leaves when the
//    replica the policy would choose is not saturated); it is refused after
//    queue_deadline_s and counts as failed (and against the SLO).
//  * Replicas: `replicas` are ready at t = 0. With `autoscale`, a
//    router::PoolAutoscaler is fed every scrape.interval what the gateway
//    feeds it (router/route_server.h: ready replicas, the metric, requests
//    waiting in the gateway) and the fleet follows its desired count: a new
//    replica takes cold_start_s to become ready (a cold start; GPU time
//    counts from its request); one removed stops taking requests (replicas
//    still starting go first, else the least loaded ready one) and its GPU
//    time ends once its requests are done.
//  * Results: TTFT, ITL (every gap between a request's tokens, pooled),
//    E2E, throughput over [0, the last request's end], SLO attainment (the
//    share of all requests whose TTFT is <= slo_ttft_ms, refused ones
//    missing it), GPU-hours (replica lifetimes times gpus_per_replica),
//    cold starts, the largest gateway queue and replica queue, the prefix
//    tokens served from cache over all prompt tokens, the mean decode batch,
//    the busy share of ready replica time, the peak KV reservation, and a
//    timeline (one point per scrape.interval).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "loadgen/report.h"
#include "loadgen/stats.h"
#include "router/autoscaler.h"
#include "router/policy.h"
#include "router/replica_metrics.h"
#include "sim/step_table.h"

namespace basalt::sim {

struct SimRequest {
  double arrival_s = 0;
  int64_t prompt_tokens = 1;
  int64_t output_tokens = 1;
  int64_t prefix_group = -1;  // < 0: no shared prefix
  int64_t prefix_tokens = 0;  // the group's shared leading tokens, < prompt_tokens
};

struct FleetConfig {
  StepTable table;
  router::Policy policy = router::Policy::kCacheAware;
  double cache_threshold = 0.3;
  int64_t balance_abs = 32;
  double balance_rel = 1.5;
  int64_t replicas = 1;  // ready at the start
  std::optional<router::AutoscaleConfig> autoscale;
  double cold_start_s = 60;
  router::ScrapeOptions scrape;
  double assumed_prefill_rate = 2000;  // the gateway's --assumed-prefill-rate (queue_time's EQT)
  bool saturation_gate = false;
  double queue_deadline_s = 300;  // the gateway's --cold-start-timeout, or a class's queue deadline
  double slo_ttft_ms = 1000;
  uint64_t seed = 0;  // power-of-two's draws
  bool timeline = false;
  bool detailed = false;  // SimResult::details
};

// Checks a config (replicas, times, thresholds) and requests (sorted arrivals,
// lengths, prefixes, each fitting one replica's KV pool); throws basalt::Error.
void validate(const FleetConfig& config, const std::vector<SimRequest>& requests);

struct TimelinePoint {
  double t_s = 0;
  int64_t ready = 0, starting = 0, draining = 0, desired = 0;
  int64_t gateway_queued = 0, replica_waiting = 0, running = 0;
};

struct SimResult {
  int64_t requests = 0, completed = 0, failed = 0;
  int64_t input_tokens = 0, output_tokens = 0, cached_prompt_tokens = 0;
  double duration_s = 0;
  double request_throughput = 0, output_throughput = 0;
  double slo_ttft_ms = 0, slo_attainment = 0;
  loadgen::Summary ttft_ms, itl_ms, e2e_ms;
  double gpu_hours = 0;
  int64_t cold_starts = 0, max_replicas = 0, max_gateway_queue = 0, max_replica_queue = 0;
  double prefix_hit_rate = 0;  // cached_prompt_tokens / input_tokens
  // Where the replicas' capacity went: the decode batch averaged over step
  // time, the share of ready replica time spent in steps, and the largest
  // share of one replica's KV pool reserved at once.
  double mean_decode_batch = 0, busy_fraction = 0, max_kv_usage = 0;
  std::vector<TimelinePoint> timeline;
  // With FleetConfig::detailed, every request in arrival order (index k is
  // the trace's k-th, as `basalt bench --save-detailed` numbers them).
  std::vector<loadgen::RequestDetail> details;
};

SimResult simulate(const FleetConfig& config, const std::vector<SimRequest>& requests);

nlohmann::json sim_result_json(const SimResult& result);
std::string sim_result_table(const SimResult& result, const std::string& title);

}  // namespace basalt::sim
