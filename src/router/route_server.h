// RouteServer: the HTTP handler of `basalt route` (docs/ROUTER.md §1): the
// OpenAI-compatible endpoints of `basalt serve`, answered by forwarding to
// the replicas of a ReplicaRegistry (router/proxy.h).
//
// Contract:
//  * POST /v1/completions, /v1/chat/completions, /tokenize and /detokenize
//    go to a replica that serves the body's `model` (a replica with a
//    `model` label serves that model only; one without serves any), GET
//    /v1/models, /v1/models/{id} and /version to any replica; the choice is
//    options.policy's (router/policy.h; cache-aware by default, from a
//    PrefixIndex of where this gateway sent each prompt's blocks: the
//    completion's prompt, the chat's messages, scoped by model and
//    cache_salt; for a model with a tokenizer in options.tokenizers, from
//    the replicas' KV events too: the prompt tokenized off the I/O threads
//    before its first pick, router/exact_prompt.h, and looked up in a
//    KvIndex that a KvEventSubscriber keeps)
//    over the replicas not draining, healthy (their
//    /ready probes) and whose circuit breaker lets a request through
//    (router/circuit_breaker.h: each attempt's end is reported to it; a
//    replica that refuses connections is ejected at once). A body that is
//    not a JSON object is answered 400 here; a model no listed replica
//    serves, 404 (model_not_found). Bodies are forwarded as they came.
//  * /health answers 200 while the gateway runs; /ready 200 while some
//    replica is listed, not draining and healthy, else 503; /metrics the gateway's
//    own counters (Prometheus text).
//  * API keys (options.api_keys, and the tenants' keys) are checked as
//    `basalt serve` checks them (server/http_auth.h), before anything is
//    forwarded. A tenant's request over its limits is answered 429 with
//    Retry-After and the reason; its completions and chats get the
//    tenant's cache_salt namespace (unless it shares its cache) and its
//    class's `priority`. The client's
//    Authorization header is never forwarded: replicas get
//    options.upstream_api_key, if set. X-Request-Id (when valid) is
//    forwarded; every request belongs to a W3C trace (the client's valid
//    traceparent, else a new one) and each attempt carries a new parent-id
//    under it, with the client's tracestate as it came
//    (router/trace_context.h).
//  * /metrics has, for answered (2xx) requests, histograms of the seconds
//    to the first byte (by the replica that sent it) and to the end (by the
//    last replica tried), per replica and per tenant.
//  * Completions and chats get a `seed` when the client gave none (a random
//    one), so that a request run again, or resumed elsewhere, draws what
//    the first attempt drew; and an X-Request-Id (the client's, else one of
//    the gateway's), so every attempt names the response alike. Streamed
//    ones fail over mid-stream (FailoverOptions from max_failovers and
//    stall_timeout), unless the body already carries basalt_resume.
//  * A tenant's completions and chats go through the admission queue
//    (router/admission.h, ROUTER.md §4) after its buckets (router/tenants.h)
//    are charged their estimated tokens (the prompt's bytes / 4, plus
//    max_tokens times n; 16 for a completion without max_tokens, 1024 for a
//    chat): a sheddable class's request is refused (429) at once while
//    every replica that could take it is saturated; the others wait until
//    the replica the policy would choose is below saturation
//    (router/replica_metrics.h), checked as they arrive, when an attempt
//    gets its head or a request ends, and every 50 ms. Unused completion
//    tokens (from the answer's usage) are given back to the bucket at the
//    end. Requests under options.api_keys only, and other routes, are not
//    queued.
//  * Placement (router/placement.h, ROUTER.md §5): a request's allowed
//    regions (its tenant's, narrowed by X-Basalt-Region, which is never
//    forwarded; 400 when malformed, 403 when outside the tenant's) filter
//    the replicas of its first attempt, every retry and every failover:
//    with none left inside them it gets 503 (before its head) or its
//    stream's error event, and is never sent elsewhere. Its pools are its
//    home pool (the tenant's `pool`, else options.home_pool; none: every
//    replica) then its tenant's overflow_pools; each attempt takes the
//    pool chosen for the request first, then the others in that order,
//    never a replica of another pool. The chosen pool is the home one
//    unless the home pool overflows for the request's class (its EQT
//    above the class's ttft_slo_ms, until below 0.8 of it): then the
//    overflow pool with the lowest EQT below the objective, if any.
//  * One `request` log line per request (no text), when options.log_requests.
//  * /v1/workflows and what is under it go to options.workflows after the
//    API key check (404 without it).
//  * Autoscaled pools (options.autoscale, router/autoscaler.h; docs/DEPLOY.md
//    §4): every scrape.interval each one's PoolAutoscaler is fed the pool's
//    ready replicas (listed, not draining, healthy), its metric (concurrency:
//    the ready replicas' load as the policies read it, plus the requests
//    queued here for the pool, per ready replica; queue_time: the pool's EQT
//    in seconds; ttft_p95: the 95th percentile of this gateway's times to
//    first byte of the pool's answered requests over the last 60 s, 0
//    without any) and the requests queued for it; its decision is on
//    /metrics (basalt_route_desired_replicas{pool}, _ready_replicas{pool},
//    _autoscale_observed{pool,metric}) and GET /v1/autoscale (JSON per
//    pool: current, desired, observed, target, metric, min, max, waiting,
//    reason). A pool's requests are those whose home pool it is (the pool
//    "" is every replica, the home of requests without one).
//  * Scale from zero: a request whose home pool is autoscaled and has no
//    replica that could take it now waits in the admission queue instead
//    of failing: a tenant's for its class's queue_deadline_ms (its 429
//    after), one without a tenant for options.cold_start_timeout (then 503
//    with Retry-After), and goes as soon as one turns ready (checked every
//    50 ms). Its model is not checked against the replicas while the pool
//    has none listed (a pool scaled to zero lists none).
//  * handle() never blocks and may be called from any I/O thread.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "router/admission.h"
#include "router/autoscaler.h"
#include "router/exact_prompt.h"
#include "router/health.h"
#include "router/kv_events_subscriber.h"
#include "router/kv_index.h"
#include "router/placement.h"
#include "router/policy.h"
#include "router/prefix_index.h"
#include "router/proxy.h"
#include "router/replica_metrics.h"
#include "router/replica_registry.h"
#include "router/tenants.h"
#include "server/http_server.h"

namespace boost::asio {
class thread_pool;
}

namespace basalt::router {

struct RouteServerOptions {
  Policy policy = Policy::kCacheAware;
  PrefixIndex::Options prefix;
  // The session policy's key: this header, else the body's `user`.
  std::string session_header = "x-session-id";
  std::vector<std::string> api_keys;
  // Tenants (router/tenants.h), when not null and not empty: their keys
  // are accepted too, and their requests limited, namespaced and given
  // their class's priority. The caller owns it (it reloads it).
  TenantBook* tenants = nullptr;
  std::string upstream_api_key;
  int max_attempts = 3;
  // Streamed completions and chats fail over mid-stream (router/proxy.h).
  int max_failovers = 2;
  std::chrono::milliseconds stall_timeout{10000};
  // Probes of each replica's /ready (router/health.h); off for tests that
  // drive health by hand.
  bool health_checks = true;
  HealthOptions health;
  // Scrapes of each replica's /metrics (router/replica_metrics.h): the
  // load policies compare; off for tests whose fakes answer only what
  // they are asked.
  bool scrape_metrics = true;
  ScrapeOptions scrape;
  bool log_requests = true;
  // The pool of requests whose tenant names none (empty: every replica).
  std::string home_pool;
  // A replica's prefill tokens per second until its scrapes measure one.
  double assumed_prefill_rate = 2000;
  // Exact cache-aware routing (ROUTER.md §2): the tokenizer of each model
  // name (the body's `model`; with one tokenizer, also a body without
  // one). With any, the gateway reads its replicas' KV events
  // (router/kv_events_subscriber.h) and tokenizes those models' prompts
  // on tokenizer_threads threads of its own.
  std::map<std::string, std::shared_ptr<const TokenizerBundle>> tokenizers;
  int tokenizer_threads = 2;
  KvEventsOptions kv_events;
  // How long the PrefixIndex's entries count for a replica whose KV events
  // are read: the time before its events show what was sent to it.
  std::chrono::milliseconds provisional_window{10000};
  // Requests under /v1/workflows, once their API key passed (unset: 404):
  // the workflow runs (workflow/service.h), whose steps come back here.
  std::function<HandlerResult(HttpRequest&)> workflows;
  // Appended to /metrics (the workflow runs' families).
  std::function<std::string()> extra_metrics;
  // Autoscaled pools, at most one per pool (see above), and how long a
  // request without a tenant waits for one of them that has no ready replica.
  std::vector<AutoscaleConfig> autoscale;
  std::chrono::milliseconds cold_start_timeout{300000};
};

class RouteServer {
 public:
  using Clock = std::chrono::steady_clock;

  RouteServer(ReplicaRegistry& registry, boost::asio::io_context& client_io, RouteServerOptions options,
              HttpClientOptions client_options = {});
  ~RouteServer();

  HandlerResult handle(HttpRequest& request);
  // A request the transport answered itself (413, 431, 400, 503).
  void note_rejection(const TransportRejection& rejection);
  std::string metrics_text() const;
  // What the autoscaled pools' last evaluation decided, as GET /v1/autoscale answers it.
  std::string autoscale_json() const;

  struct Shared;

 private:
  // Where a request went, shared by its attempts (and its log line).
  struct Placement {
    std::mutex mu;
    bool decided = false;  // its first attempt chose `pool`
    std::string pool;      // the pool chosen (empty: every replica)
    bool overflowed = false;
    std::string region;    // the region of the replica last picked
    bool ran_out_in_region = false;  // no replica was left inside its regions
  };
  // What a request is routed by.
  struct Routing {
    std::string model;
    std::string tenant;  // empty: none
    std::string session;
    std::vector<uint64_t> blocks;  // cache-aware: the prompt's PrefixIndex blocks
    std::shared_ptr<ExactPrompt> exact;  // cache-aware with the model's tokenizer
    std::vector<std::string> regions;  // allowed (empty: any)
    std::string home_pool;             // empty: every replica
    std::vector<std::string> overflow_pools;
    std::string class_name;
    int64_t ttft_slo_ms = 0;  // 0: never overflows
    std::shared_ptr<Placement> placement = std::make_shared<Placement>();
  };
  // What a tenant's queued request costs, in estimated tokens.
  struct Cost {
    int64_t prompt = 0;
    int64_t completion = 0;  // max_tokens × n
    int64_t total() const { return prompt + completion; }
  };
  // The replicas that may take a request now, as pick() filters them.
  std::vector<const Replica*> candidates(const Snapshot& snapshot, const Routing& routing,
                                         const std::vector<std::string>& tried, Clock::time_point now) const;
  std::shared_ptr<const Replica> pick(const Routing& routing, const std::vector<std::string>& tried);
  // The saturation gate: whether the replica pick() would choose first is
  // saturated, and whether every candidate is (none: neither).
  bool first_choice_saturated(const Routing& routing);
  // The pool a request goes to now (home, or an overflow pool), and
  // whether that is an overflow.
  std::pair<std::string, bool> choose_pool(const Routing& routing, const Snapshot& snapshot,
                                           Clock::time_point now);
  double pool_eqt_ms(const Snapshot& snapshot, const std::string& pool, Clock::time_point now) const;
  // `candidates` grouped by the pools a request tries, in order: `chosen`,
  // then its home pool and overflow pools (one group of all without a home pool).
  static std::vector<std::vector<const Replica*>> by_pool(const Routing& routing, const std::string& chosen,
                                                          const std::vector<const Replica*>& candidates);
  // The share of the prompt `replica` holds (its KV events' say when they
  // are read, and what was sent to it lately), 0 to 1; `exact` tells
  // which.
  double cached_share(const Routing& routing, const Replica& replica, Clock::time_point now, bool* exact) const;
  // The tokenizer of `model` (options.tokenizers), or null.
  std::shared_ptr<const TokenizerBundle> tokenizer_for(const std::string& model) const;
  std::vector<size_t> order(const Routing& routing, const std::vector<const Replica*>& group, uint64_t turn,
                            uint64_t random, Clock::time_point now) const;
  bool pool_saturated(const Routing& routing);
  // Feeds every autoscaled pool's policy one observation (under Autoscaling's lock).
  void evaluate_pools();
  // The autoscaler of `pool`, or null.
  const AutoscaleConfig* autoscaled(const std::string& pool) const;
  // Whether a request must wait for its autoscaled home pool to get a
  // replica it can use (scale from zero).
  bool held_for_zero(const Routing& routing);
  // `queued_tenant`: a tenant's completion or chat, queued; else `held`: a
  // request without one, queued until its pool has a replica.
  HandlerResult forward(HttpRequest& request, const std::string& route, Routing routing, bool stream,
                        const Tenant* queued_tenant, Cost cost, bool held);

  ReplicaRegistry& registry_;
  RouteServerOptions options_;
  ReplicaClients clients_;
  std::shared_ptr<Shared> shared_;
  PrefixIndex prefixes_;
  KvIndex kv_index_;
  std::unique_ptr<KvEventSubscriber> kv_events_;
  std::unique_ptr<HealthChecker> health_;
  std::unique_ptr<MetricsScraper> scraper_;
  struct Admission;
  std::shared_ptr<Admission> admission_;
  OverflowTracker overflow_;
  std::shared_ptr<QueuedTokens> queued_tokens_ = std::make_shared<QueuedTokens>();
  // Requests queued, one each, per home pool (what the autoscaler counts).
  std::shared_ptr<QueuedTokens> queued_requests_ = std::make_shared<QueuedTokens>();
  struct Autoscaling;
  std::shared_ptr<Autoscaling> autoscaling_;
  // Last: joined first, so no tokenization outlives what it starts.
  std::unique_ptr<boost::asio::thread_pool> tokenizer_pool_;
};

}  // namespace basalt::router
