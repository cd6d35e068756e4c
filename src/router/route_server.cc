#include "router/route_server.h"

#include <atomic>
#include <chrono>
#include <fmt/format.h>
#include <map>
#include <mutex>
#include <random>

#include <nlohmann/json.hpp>

#include "core/log.h"
#include "server/http_auth.h"
#include "server/openai_protocol.h"
#include "server/prometheus_text.h"

namespace basalt::router {

namespace {

using Clock = std::chrono::steady_clock;

// The path as the gateway names it in metrics and logs.
std::string route_of(const std::string& path) {
  static const char* kKnown[] = {"/v1/completions", "/v1/chat/completions", "/v1/models", "/tokenize", "/detokenize",
                                 "/health",         "/ready",               "/metrics",   "/version"};
  for (const char* k : kKnown)
    if (path == k) return k;
  if (path.rfind("/v1/models/", 0) == 0) return "/v1/models/{id}";
  return "other";
}

bool routed_by_model(const std::string& route) {
  return route == "/v1/completions" || route == "/v1/chat/completions" || route == "/tokenize" ||
         route == "/detokenize";
}

HttpResponse json_error(int status, const std::string& message, const std::string& type, const std::string& param = {}) {
  HttpResponse r;
  r.status = status;
  r.body = error_body(status, message, type, param);
  return r;
}

// A seed for a request that has none: 63 random bits (what JSON and the
// replica's parser take as a non-negative integer).
int64_t random_seed() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return static_cast<int64_t>(rng() >> 1);
}

std::string gateway_request_id() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("route-{:016x}", rng());
}

bool serves(const ReplicaSpec& spec, const std::string& model) {
  return spec.model.empty() || model.empty() || spec.model == model;
}

}  // namespace

// Counters shared with the requests in flight (their callbacks may end
// after the server).
struct RouteServer::Shared {
  bool log_requests = true;
  std::mutex mu;
  std::map<std::pair<std::string, int>, int64_t> requests;                 // (route, status)
  std::map<std::pair<std::string, std::string>, int64_t> attempts;       // (replica, outcome)
  std::map<std::string, uint64_t> round_robin;                             // per model
  std::map<std::pair<std::string, std::string>, int64_t> failovers;       // (replica that failed, reason)
  std::map<std::pair<std::string, int>, int64_t> tenant_requests;         // (tenant, status), forwarded
  std::map<std::pair<std::string, std::string>, int64_t> rejections;      // (tenant, reason)
  std::atomic<int64_t> in_flight{0};

  void count_request(const std::string& route, int status) {
    std::lock_guard<std::mutex> lock(mu);
    ++requests[{route, status}];
  }
  void count_attempt(const std::string& replica, AttemptOutcome outcome) {
    std::lock_guard<std::mutex> lock(mu);
    ++attempts[{replica, attempt_outcome_name(outcome)}];
  }
};

RouteServer::RouteServer(ReplicaRegistry& registry, boost::asio::io_context& client_io, RouteServerOptions options,
                         HttpClientOptions client_options)
    : registry_(registry),
      options_(std::move(options)),
      clients_(client_io, std::move(client_options)),
      shared_(std::make_shared<Shared>()),
      prefixes_(options_.prefix) {
  shared_->log_requests = options_.log_requests;
  if (options_.health_checks) {
    health_ = std::make_unique<HealthChecker>(registry_, client_io, options_.health);
    health_->start();
  }
  if (options_.scrape_metrics) {
    scraper_ = std::make_unique<MetricsScraper>(registry_, client_io, options_.scrape);
    scraper_->start();
  }
}

RouteServer::~RouteServer() {
  if (health_) health_->stop();
  if (scraper_) scraper_->stop();
}

std::shared_ptr<const Replica> RouteServer::pick(const Routing& routing, const std::vector<std::string>& tried) {
  const std::string& model = routing.model;
  const std::shared_ptr<const Snapshot> snapshot = registry_.snapshot();
  const auto now = Clock::now();
  std::vector<const Replica*> candidates;
  for (const Replica& r : snapshot->replicas) {
    if (r.state->draining.load() || !r.state->healthy.load() || !serves(r.spec, model)) continue;
    if (std::find(tried.begin(), tried.end(), r.spec.id) != tried.end()) continue;
    std::lock_guard<std::mutex> lock(r.state->mu);
    if (r.state->breaker.available(now)) candidates.push_back(&r);
  }
  if (candidates.empty()) return nullptr;
  uint64_t turn = 0;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    turn = shared_->round_robin[model]++;
  }
  std::vector<Candidate> loads;
  for (const Replica* r : candidates) loads.push_back({r->spec.id, load_of(*r->state, now, options_.scrape)});
  if (!routing.blocks.empty()) {
    std::vector<std::string_view> ids;
    for (const Candidate& c : loads) ids.push_back(c.id);
    const std::vector<size_t> matched = prefixes_.match(ids, routing.blocks, now);
    for (size_t i = 0; i < loads.size(); ++i) loads[i].matched = matched[i];
  }
  thread_local std::mt19937_64 rng{std::random_device{}()};
  PickInput in;
  in.turn = turn;
  in.random = rng();
  in.session = routing.session;
  in.blocks = routing.blocks.size();
  for (const size_t k : preference(options_.policy, loads, in)) {
    const Replica* r = candidates[k];
    {
      std::lock_guard<std::mutex> lock(r->state->mu);
      if (!r->state->breaker.acquire(now)) continue;
    }
    // The prompt's blocks are (about to be) in that replica's cache.
    prefixes_.insert(r->spec.id, routing.blocks, now);
    // Shares the snapshot's ownership: the replica stays valid while the
    // request holds it, whatever set() does meanwhile.
    return std::shared_ptr<const Replica>(snapshot, r);
  }
  return nullptr;  // their half-open trials were taken meanwhile
}

namespace {

// An attempt's end, told to its replica's breaker (which pick() acquired).
void report(const Replica& replica, AttemptOutcome outcome) {
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(replica.state->mu);
  CircuitBreaker& b = replica.state->breaker;
  switch (outcome) {
    case AttemptOutcome::kAnswered: b.success(now); break;
    case AttemptOutcome::kBusy:
    case AttemptOutcome::kCancelled: b.release(); break;
    case AttemptOutcome::kUnavailable:
    case AttemptOutcome::kFailed: b.failure(now); break;
    case AttemptOutcome::kUnreachable: b.eject(now); break;
  }
}

}  // namespace

HandlerResult RouteServer::handle(HttpRequest& request) {
  const std::string route = route_of(request.path);
  const auto answer = [&](HttpResponse r) {
    shared_->count_request(route, r.status);
    if (shared_->log_requests && route != "/metrics" && route != "/health" && route != "/ready")
      LogLine("request", r.status >= 500 ? LogLevel::kWarning : LogLevel::kInfo)
          .add("remote", request.remote)
          .add("method", request.method)
          .add("path", route)
          .add("status", r.status)
          .emit();
    return HandlerResult{std::move(r), nullptr};
  };
  const auto need = [&](const char* method) {
    return request.method == method || (std::string_view(method) == "GET" && request.method == "HEAD");
  };
  if (route == "/health") {
    if (!need("GET")) return answer(json_error(405, "use GET or HEAD", "invalid_request_error"));
    HttpResponse r;
    r.body = R"({"status":"ok"})";
    return answer(std::move(r));
  }
  if (route == "/ready") {
    if (!need("GET")) return answer(json_error(405, "use GET or HEAD", "invalid_request_error"));
    const std::shared_ptr<const Snapshot> snapshot = registry_.snapshot();
    const bool any = std::any_of(snapshot->replicas.begin(), snapshot->replicas.end(), [](const Replica& r) {
      return !r.state->draining.load() && r.state->healthy.load();
    });
    HttpResponse r;
    r.status = any ? 200 : 503;
    r.body = any ? R"({"status":"ready"})" : error_body(503, "no listed replica is healthy", "server_error");
    return answer(std::move(r));
  }
  // The tenant, when the key is one of the tenants file's.
  std::optional<Tenant> tenant;
  TenantBook* book = options_.tenants != nullptr && !options_.tenants->empty() ? options_.tenants : nullptr;
  if (book != nullptr) {
    if (const auto h = request.header("authorization"); h && h->substr(0, 7) == "Bearer ")
      tenant = book->find(h->substr(7));
  }
  if (!tenant && (book != nullptr || !options_.api_keys.empty()) &&
      (options_.api_keys.empty() || !bearer_authorized(request, options_.api_keys))) {
    HttpResponse r = json_error(401, "a valid API key is required ('Authorization: Bearer KEY')", "invalid_request_error");
    r.headers.emplace_back("WWW-Authenticate", "Bearer");
    return answer(std::move(r));
  }
  if (route == "/metrics") {
    if (!need("GET")) return answer(json_error(405, "use GET or HEAD", "invalid_request_error"));
    HttpResponse r;
    r.content_type = "text/plain; version=0.0.4";
    r.body = metrics_text();
    return answer(std::move(r));
  }
  if (route == "other") return answer(json_error(404, "no such endpoint: " + request.path, "invalid_request_error"));
  const bool by_model = routed_by_model(route);
  if (by_model ? request.method != "POST" : !need("GET"))
    return answer(json_error(405, by_model ? "use POST" : "use GET or HEAD", "invalid_request_error"));
  Routing routing;
  if (tenant) routing.tenant = tenant->name;
  std::string& model = routing.model;
  std::string& session = routing.session;
  if (auto h = request.header(options_.session_header); h && !options_.session_header.empty())
    session = std::string(h->substr(0, 256));
  bool stream = false;
  if (by_model) {
    try {
      nlohmann::json body = parse_json_object(request.body);
      if (const auto it = body.find("model"); it != body.end() && it->is_string()) model = it->get<std::string>();
      if (const auto it = body.find("user"); session.empty() && it != body.end() && it->is_string())
        session = it->get<std::string>().substr(0, 256);
      if (route == "/v1/completions" || route == "/v1/chat/completions") {
        stream = body.value("stream", false) == true && !body.contains("basalt_resume");
        bool changed = false;
        if (tenant) {
          // The tenant's namespace in the replicas' caches, and its class's
          // priority (the replica's scheduler then agrees with the gateway).
          if (!tenant->share_cache) {
            const auto salt = body.find("cache_salt");
            body["cache_salt"] =
                TenantBook::cache_salt(*tenant, salt != body.end() && salt->is_string() ? salt->get<std::string>() : "");
          }
          body["priority"] = tenant->priority;
          changed = true;
        }
        if (options_.policy == Policy::kCacheAware) {
          const auto salt = body.find("cache_salt");
          const std::string scope =
              model + '\x1f' + (salt != body.end() && salt->is_string() ? salt->get<std::string>() : "");
          const auto prompt = body.find(route == "/v1/completions" ? "prompt" : "messages");
          if (prompt != body.end())
            routing.blocks = prefixes_.blocks(scope, prompt->is_string() ? prompt->get<std::string>() : prompt->dump());
        }
        if (!body.contains("seed") || body["seed"].is_null()) {
          body["seed"] = random_seed();
          changed = true;
        }
        if (changed) request.body = body.dump();
      }
    } catch (const ApiError& e) {
      HttpResponse r;
      r.status = e.status();
      r.body = e.body();
      return answer(std::move(r));
    }
    const std::shared_ptr<const Snapshot> snapshot = registry_.snapshot();
    const bool known = std::any_of(snapshot->replicas.begin(), snapshot->replicas.end(),
                                   [&](const Replica& r) { return serves(r.spec, model); });
    if (!known)
      return answer(json_error(404, "the model '" + model + "' is not served here", "invalid_request_error", "model"));
  }
  if (tenant) {
    const TenantBook::Admission a = book->admit(tenant->name, Clock::now());
    if (!a.admitted) {
      {
        std::lock_guard<std::mutex> lock(shared_->mu);
        ++shared_->rejections[{tenant->name, a.reason}];
      }
      HttpResponse r = json_error(429,
                                  a.reason == "rate" ? "this API key's request rate limit is reached"
                                                     : "this API key has as many requests running as it may",
                                  "rate_limit_error");
      r.headers.emplace_back("Retry-After", std::to_string(a.retry_after_s));
      return answer(std::move(r));
    }
  }
  return forward(request, route, std::move(routing), stream);
}

HandlerResult RouteServer::forward(HttpRequest& request, const std::string& route, Routing routing, bool stream) {
  const std::string model = routing.model;
  const std::string tenant = routing.tenant;  // routing itself moves into pick below
  ProxyRequest p;
  p.max_attempts = options_.max_attempts;
  p.failover.enabled = stream;
  p.failover.max_failovers = options_.max_failovers;
  p.failover.stall_timeout = options_.stall_timeout;
  p.upstream.method = request.method == "HEAD" ? "GET" : request.method;
  p.upstream.path = request.target;
  p.upstream.body = std::move(request.body);
  if (!p.upstream.body.empty())
    p.upstream.headers.emplace_back("Content-Type",
                                    std::string(request.header("content-type").value_or("application/json")));
  if (auto id = request.header("x-request-id"); id && valid_client_id(*id)) {
    p.upstream.headers.emplace_back("X-Request-Id", std::string(*id));
  } else if (routed_by_model(route)) {
    p.upstream.headers.emplace_back("X-Request-Id", gateway_request_id());
  }
  for (const char* name : {"traceparent", "tracestate"})
    if (auto v = request.header(name); v && v->size() <= 512) p.upstream.headers.emplace_back(name, std::string(*v));
  if (!options_.upstream_api_key.empty())
    p.upstream.headers.emplace_back("Authorization", "Bearer " + options_.upstream_api_key);
  p.pick = [this, routing = std::move(routing)](const std::vector<std::string>& tried) { return pick(routing, tried); };
  std::shared_ptr<Shared> shared = shared_;
  p.observe.attempt = [shared](const Replica& replica, AttemptOutcome outcome) {
    report(replica, outcome);
    shared->count_attempt(replica.spec.id, outcome);
  };
  p.observe.failover = [shared](const ReplicaSpec& replica, const char* reason) {
    std::lock_guard<std::mutex> lock(shared->mu);
    ++shared->failovers[{replica.id, reason}];
  };
  shared->in_flight.fetch_add(1);
  TenantBook* book = !tenant.empty() ? options_.tenants : nullptr;
  p.observe.finished = [shared, route, remote = request.remote, method = request.method, model, book, tenant,
                        start = Clock::now()](int status, const std::vector<std::string>& tried) {
    shared->in_flight.fetch_sub(1);
    if (book != nullptr) book->release(tenant);
    shared->count_request(route, status);
    if (!tenant.empty()) {
      std::lock_guard<std::mutex> lock(shared->mu);
      ++shared->tenant_requests[{tenant, status}];
    }
    if (!shared->log_requests) return;
    std::string replicas;
    for (const std::string& id : tried) replicas += (replicas.empty() ? "" : ",") + id;
    LogLine("request", status >= 500 ? LogLevel::kWarning : LogLevel::kInfo)
        .add("remote", remote)
        .add("method", method)
        .add("path", route)
        .add("model", model)
        .add("tenant", tenant)
        .add("status", status)
        .add("attempts", static_cast<int64_t>(tried.size()))
        .add("replicas", replicas)
        .add("total_s", std::chrono::duration<double>(Clock::now() - start).count())
        .emit();
  };
  HandlerResult result;
  result.producer = std::make_unique<ProxyProducer>(clients_, std::move(p));
  return result;
}

void RouteServer::note_rejection(const TransportRejection& r) {
  const std::string route = r.path.empty() ? "other" : route_of(r.path);
  shared_->count_request(route, r.status);
  if (shared_->log_requests) transport_rejection_line(r, route).emit();
}

std::string RouteServer::metrics_text() const {
  PrometheusText out;
  const std::shared_ptr<const Snapshot> snapshot = registry_.snapshot();
  std::lock_guard<std::mutex> lock(shared_->mu);
  out.family("basalt_route_requests_total", "counter", "Requests the gateway answered, by route and status");
  for (const auto& [key, n] : shared_->requests)
    out.sample("basalt_route_requests_total", static_cast<double>(n),
               {{"route", key.first}, {"status", std::to_string(key.second)}});
  out.gauge("basalt_route_requests_in_flight", "Forwarded requests not yet answered in full",
            static_cast<double>(shared_->in_flight.load()));
  out.family("basalt_route_replica_attempts_total", "counter",
             "Attempts on each replica, by how they ended (answered, retryable, failed, cancelled)");
  for (const auto& [key, n] : shared_->attempts)
    out.sample("basalt_route_replica_attempts_total", static_cast<double>(n),
               {{"replica", key.first}, {"outcome", key.second}});
  out.family("basalt_route_tenant_requests_total", "counter", "Forwarded requests by tenant and status");
  for (const auto& [key, n] : shared_->tenant_requests)
    out.sample("basalt_route_tenant_requests_total", static_cast<double>(n),
               {{"tenant", key.first}, {"status", std::to_string(key.second)}});
  out.family("basalt_route_rejections_total", "counter",
             "Requests answered 429 at the gateway, by tenant and reason (rate, concurrency)");
  for (const auto& [key, n] : shared_->rejections)
    out.sample("basalt_route_rejections_total", static_cast<double>(n), {{"tenant", key.first}, {"reason", key.second}});
  if (options_.tenants != nullptr) {
    out.family("basalt_route_tenant_running", "gauge", "A tenant's requests being forwarded now");
    for (const auto& [name, n] : options_.tenants->running())
      out.sample("basalt_route_tenant_running", static_cast<double>(n), {{"tenant", name}});
  }
  out.family("basalt_route_failovers_total", "counter",
             "Streams resumed on another replica, by the replica that failed them and why (eof, stall, cut)");
  for (const auto& [key, n] : shared_->failovers)
    out.sample("basalt_route_failovers_total", static_cast<double>(n), {{"replica", key.first}, {"reason", key.second}});
  out.family("basalt_route_replica_in_flight", "gauge", "Attempts running on each listed replica");
  for (const Replica& r : snapshot->replicas)
    out.sample("basalt_route_replica_in_flight", static_cast<double>(r.state->in_flight.load()),
               {{"replica", r.spec.id}});
  out.family("basalt_route_replica_draining", "gauge", "1 for a listed replica that takes no new requests");
  for (const Replica& r : snapshot->replicas)
    out.sample("basalt_route_replica_draining", r.state->draining.load() ? 1 : 0, {{"replica", r.spec.id}});
  out.family("basalt_route_replica_healthy", "gauge", "1 while a replica's /ready probes pass");
  for (const Replica& r : snapshot->replicas)
    out.sample("basalt_route_replica_healthy", r.state->healthy.load() ? 1 : 0, {{"replica", r.spec.id}});
  const auto now = Clock::now();
  out.family("basalt_route_replica_breaker_state", "gauge",
             "A replica's circuit breaker: 0 closed, 1 half-open (one trial at a time), 2 open");
  for (const Replica& r : snapshot->replicas) {
    std::lock_guard<std::mutex> state_lock(r.state->mu);
    out.sample("basalt_route_replica_breaker_state", static_cast<double>(r.state->breaker.state(now)),
               {{"replica", r.spec.id}});
  }
  out.family("basalt_route_replica_ejections_total", "counter",
             "Times a replica was taken out at once for refusing or dropping a connection");
  for (const Replica& r : snapshot->replicas) {
    std::lock_guard<std::mutex> state_lock(r.state->mu);
    out.sample("basalt_route_replica_ejections_total", static_cast<double>(r.state->breaker.ejections()),
               {{"replica", r.spec.id}});
  }
  return out.take();
}

}  // namespace basalt::router
